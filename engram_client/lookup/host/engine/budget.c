/* The node budget's shared memory read and decided on: the group's decision lock, what the group
 * says (held tokens, fair share, stalled crews), who may take a free token and who is next, and dead
 * slots.  budget.h draws the layout and the rules.
 *
 * Owns: who may take a free token and who is next (nb_eligible, nb_next_waiter) and the decision
 * lock; yields, overdrafts and stand-ins are budget_tokens.c's.  May call: nothing of the
 * engine but common.h.  Must never: trust a count in the mapping beyond what bounds it (any peer may
 * write there), take a kernel lock while holding the decision lock for longer than a look, or touch
 * Python objects (gather threads run it off the GIL).
 */
#include "budget.h"

int nb_ofd(int fd, int cmd, short type, off_t at) {
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1, .l_pid = 0};
    if (fcntl(fd, cmd, &fl) != 0) return -1;
    return cmd == F_OFD_GETLK ? fl.l_type : 0;
}

/* ---- the decision lock ------------------------------------------------------------------------ */
/* The group's lock word, or 0 where this process decides without it.  A waiter that has not had it
 * for NB_GLOCK_BREAK_NS takes it over whatever the word holds: a holder that died or never lets go
 * leaves one value there, a peer storing a new one every millisecond leaves none for long, and
 * either way what the lock guards is advisory.  A word that changed between the look and the swap
 * is passed by.  A lock broken once is likely to need it again, so the process then decides
 * without it for NB_GLOCK_BYPASS_NS: a hostile peer costs it one wait a second at most. */
uint64_t nb_glock_group(NodeBudget *b, NbGroup *g) {
    int64_t bypass = atomic_load_explicit(&b->glock_bypass_until, memory_order_relaxed);
    if (bypass) {
        if (now_ns() < bypass) return 0;
        atomic_compare_exchange_strong(&b->glock_bypass_until, &bypass, 0);
    }
    uint64_t mine = (atomic_fetch_add(&g->lock_count, 1) + 1) << 8 | (uint64_t)(b->slot + 1);
    int64_t since = 0;
    for (int spins = 0;; spins++) {
        uint64_t expected = 0;
        if (atomic_compare_exchange_weak(&g->lock, &expected, mine)) return mine;
        if (spins % 64 == 0) {
            int64_t now = now_ns();
            if (!since) {
                since = now;
            } else if (now - since > NB_GLOCK_BREAK_NS) {
                atomic_store(&b->glock_bypass_until, now + NB_GLOCK_BYPASS_NS);
                atomic_fetch_add(&b->glock_breaks, 1);
                atomic_fetch_add(&g->breaks, 1);
                return atomic_compare_exchange_strong(&g->lock, &expected, mine) ? mine : 0;
            }
        }
        if (spins < 256) cpu_relax(); else sched_yield();
    }
}

void nb_gunlock_group(NbGroup *g, uint64_t mine) {
    uint64_t expected = mine;
    if (mine) atomic_compare_exchange_strong(&g->lock, &expected, 0);  /* not ours any more: taken over */
}

/* ---- reading the group ------------------------------------------------------------------------ */
int nb_held_total(const NodeBudget *b) {
    uint64_t mask = atomic_load(&b->g->holding_mask);
    int total = 0;
    while (mask) {
        int i = __builtin_ctzll(mask);
        mask &= mask - 1;
        if (i < b->slots) {
            int h = atomic_load(&nb_slot(b, i)->held);
            total += h > 0 && h <= b->tokens ? h : 0;
        }
    }
    return total;
}

uint64_t nb_others_wanting(const NodeBudget *b) {
    return atomic_load(&b->g->want_mask) & ~b->bit & nb_slots_mask(b);
}

/* Slots of the group that want or hold tokens, this one included (within `slots`). */
static int nb_active_slots(const NodeBudget *b) {
    uint64_t active = atomic_load(&b->g->want_mask) | atomic_load(&b->g->holding_mask) | b->bit;
    return __builtin_popcountll(active & nb_slots_mask(b));
}

/* A rotation hands a token's thread over to another process, whose rows then start cold (its own
 * page tables, its caches); on the two-CPU development machine, one token shared by four prefilling
 * ranks gathered 4.7-7.3 M rows/s rotating every 1 ms and 8.1-9.5 M every 20 ms, one rank alone
 * 5.6-10.9 M (docs/history/benchmarks-2026-12.md, "The busy node on one token").  So a group of T
 * tokens rotates one per NB_TOKEN_TURN_NS / T (each token changes hands about once per 20 ms; the
 * 15 tokens of the H200 machine: 1.33 ms, where it was 1 ms for every group), never more often
 * than every NB_QUANTUM_MIN_NS, and short enough that with every active slot waiting its turn each
 * is served well inside NB_STARVE_NS (after which a slot holding nothing gathers without tokens):
 * at most NB_STARVE_NS / (4 x active slots), 3.9 ms with all 64. */
int64_t nb_quantum_ns(const NodeBudget *b) {
    int64_t quantum = NB_TOKEN_TURN_NS / b->tokens;  /* 1 .. NB_MAX_TOKENS, checked at open */
    int64_t turn = NB_STARVE_NS / (4 * nb_active_slots(b));
    if (quantum > turn) quantum = turn;
    return quantum > NB_QUANTUM_MIN_NS ? quantum : NB_QUANTUM_MIN_NS;
}

int nb_fair(const NodeBudget *b) {
    return nb_ceil_div(b->tokens, nb_active_slots(b));
}

/* Tokens of the group held by crew threads that no slot has seen running for NB_CREW_STALL_NS, less
 * the stand-ins gathering for them now (lock held).  Every count is a hint a peer could forge; each
 * is bounded by what it counts in (a slot's crew by its held tokens), and a stand-in is only ever
 * one decode-size job of a slot that waited. */
int nb_stalled_crew(const NodeBudget *b, int64_t now) {
    uint64_t holding = atomic_load(&b->g->holding_mask);
    int stalled = 0, standing = 0;
    for (int i = 0; i < b->slots; i++) {
        NbSlot *x = nb_slot(b, i);
        if (atomic_load(&x->group) != b->group) continue;
        int in = atomic_load(&x->standing_in);
        standing += in > 0 && in <= b->tokens ? in : 0;
        int crew = atomic_load(&x->crew_held), held = atomic_load(&x->held);
        if (!(holding >> i & 1) || crew <= 0) continue;
        if (now - atomic_load(&x->crew_seen_at) > NB_CREW_STALL_NS) stalled += crew < held ? crew : held;
    }
    return stalled - standing;
}

/* A decode-size job starts in this process: the group's decode_at says when (no lock; a hint).  Stored
 * at most once per NB_DECODE_STAMP_NS, so that ranks decoding back to back do not pass its cache line
 * between them on every call. */
void nb_note_decode(NodeBudget *b, int64_t now) {
    _Atomic int64_t *at = &b->g->decode_at;
    int64_t seen = atomic_load_explicit(at, memory_order_relaxed);
    /* Tested in this order so that no subtraction overflows on a value a peer wrote. */
    if (seen <= 0 || seen > now || now - seen >= NB_DECODE_STAMP_NS) atomic_store_explicit(at, now, memory_order_relaxed);
}

/* While a rank of the group has started a decode-size job in the last NB_DECODE_QUIET_NS (the spares
 * of --decode-spares quiet stand aside meanwhile): when that window closes; 0 when it is closed.
 * Every rank reads the one CLOCK_MONOTONIC of the machine.  A time ahead of ours is no rank's (a rank
 * in a time namespace with another offset, or a peer writing the field): it counts as no decoding,
 * so it cannot keep the spares off for good; a peer that writes the present over and over keeps
 * them off, which costs the node what --decode-spares off costs and nothing more. */
int64_t nb_decode_window_end(const NodeBudget *b, int64_t now) {
    int64_t at = atomic_load_explicit(&b->g->decode_at, memory_order_relaxed);
    return at > 0 && at <= now && now - at < NB_DECODE_QUIET_NS ? at + NB_DECODE_QUIET_NS : 0;
}

/* Whether this slot may take a free token now (lock held). */
int nb_eligible(const NodeBudget *b, int small, int uncontended_only) {
    NbGroup *g = b->g;
    int free = b->tokens - nb_held_total(b);
    if (free <= 0) return 0;
    if (!small && free <= b->decode) return 0;  /* the decode tokens: never taken by a prefill-size job */
    uint64_t others = nb_others_wanting(b);
    if (!others) return 1;
    if (uncontended_only) return 0;
    uint64_t smalls = atomic_load(&g->small_mask) & others;
    int held = atomic_load(&b->held_here);
    if (!small && smalls && held == 0 && b->tokens >= NB_FLOOR_MIN_TOKENS) return 1;  /* the prefill's floor */
    if (!small && free <= __builtin_popcountll(smalls)) return 0;
    uint64_t rivals = small ? smalls : others;
    int fair = nb_fair(b), older = 0, below = 0;
    uint64_t last = atomic_load(&b->s->last_grant);
    for (uint64_t m = rivals; m; m &= m - 1) {
        NbSlot *x = nb_slot(b, __builtin_ctzll(m));
        int xh = atomic_load(&x->held);
        below |= xh < fair;
        older += xh <= held && atomic_load(&x->last_grant) < last;
    }
    if (held >= fair && below) return 0;
    return free > older;
}

/* The waiting slot a released token should go to: small jobs first, then the least recently served. */
int nb_next_waiter(const NodeBudget *b) {
    NbGroup *g = b->g;
    uint64_t want = atomic_load(&g->want_mask), small = atomic_load(&g->small_mask) & want;
    uint64_t pool = (small ? small : want) & nb_slots_mask(b);
    /* A prefill holding nothing: its floor first, unless what is free is the decode tokens (it could
     * not take one, and the decode-size waiter would sleep until its next look). */
    if (small && b->tokens >= NB_FLOOR_MIN_TOKENS && b->tokens - nb_held_total(b) > b->decode)
        for (uint64_t m = want & ~small; m; m &= m - 1) {
            int i = __builtin_ctzll(m);
            if (i < b->slots && atomic_load(&nb_slot(b, i)->held) == 0) return i;
        }
    int best = -1;
    uint64_t best_last = UINT64_MAX;
    for (uint64_t m = pool; m; m &= m - 1) {
        int i = __builtin_ctzll(m);
        uint64_t last = atomic_load(&nb_slot(b, i)->last_grant);
        if (last < best_last) best = i, best_last = last;
    }
    return best;
}

void nb_wake_slot(NodeBudget *b, int s) {
    NbSlot *x = nb_slot(b, s);
    atomic_fetch_add(&x->seq, 1);
    if (atomic_load(&x->sleepers)) nb_futex(&x->seq, FUTEX_WAKE, 1, 0);
}

void nb_log(NodeBudget *b, uint64_t seq, int token, int small, int how) {
    NbGrant *e = &b->g->log[seq % NB_LOG];
    e->want_mask = atomic_load(&b->g->want_mask);
    e->small_mask = atomic_load(&b->g->small_mask);
    e->slot = (uint16_t)b->slot, e->token = (uint16_t)(token < 0 ? 0xFFFF : token);
    e->held_after = (uint16_t)atomic_load(&b->s->held), e->small = (uint8_t)small, e->how = (uint8_t)how;
    __atomic_store_n(&e->seq, seq, __ATOMIC_RELEASE);
}

/* ---- dead slots --------------------------------------------------------------------------------- */
int nb_slot_alive(const NodeBudget *b, int s) {
    int type = nb_ofd(b->fd, F_OFD_GETLK, F_WRLCK, NB_SLOT_LOCK(s));
    return type != F_UNLCK;  /* an error counts as alive: never clear what we cannot judge */
}

/* Forget slot s's hints in group g (lock of g held). */
void nb_clear_slot(NodeBudget *b, NbGroup *g, int s) {
    uint64_t bit = 1ULL << s;
    NbSlot *x = nb_slot(b, s);
    atomic_store(&x->held, 0), atomic_store(&x->want, 0), atomic_store(&x->want_small, 0);
    atomic_store(&x->crew_held, 0), atomic_store(&x->standing_in, 0);
    atomic_fetch_and(&g->want_mask, ~bit), atomic_fetch_and(&g->small_mask, ~bit);
    atomic_fetch_and(&g->holding_mask, ~bit);
    for (int t = 0; t < NB_MAX_TOKENS; t++) {
        uint32_t expected = (uint32_t)s + 1;
        atomic_compare_exchange_strong(&g->owner[t], &expected, 0);
    }
}
