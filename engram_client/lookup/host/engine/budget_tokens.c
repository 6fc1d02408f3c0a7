/* The node budget's tokens: sweeping dead slots, taking a token and giving it back, yielding at a
 * block boundary, overdraft and stand-ins (budget.h draws the layout and the rules).
 *
 * Owns: a token's life in this process (the private bitmap `mine` claims it before its kernel lock is
 * taken), the slot's want/held counts and the waits on its futex word.  May call: budget.c.  Must
 * never: block on a lock while holding a token (the kernel locks are taken with F_OFD_SETLK, never
 * SETLKW), wait without a bound (NB_WAIT_NS), or touch Python objects (gather threads run it off the GIL).
 */
#include "budget_tokens.h"

static void nb_sweep(NodeBudget *b) {
    int64_t now = now_ns(), last = atomic_load(&b->last_sweep);
    if (now - last < NB_SWEEP_NS || !atomic_compare_exchange_strong(&b->last_sweep, &last, now)) return;
    NbGroup *g = b->g;
    uint64_t marked = atomic_load(&g->want_mask) | atomic_load(&g->small_mask) | atomic_load(&g->holding_mask);
    for (int s = 0; s < b->slots; s++) {  /* a stand-in holds no token and wants none: its slot is marked apart */
        int standing = atomic_load(&nb_slot(b, s)->standing_in) != 0 && atomic_load(&nb_slot(b, s)->group) == b->group;
        if (s == b->slot || !(marked >> s & 1 || standing) || nb_slot_alive(b, s)) continue;
        uint64_t key = nb_glock(b);
        nb_clear_slot(b, g, s);
        nb_gunlock(b, key);
        atomic_fetch_add(&g->sweeps, 1);
    }
    /* Our own slot says what this process knows (a peer may have written over it), and an owner
     * hint the kernel contradicts (the token's lock is free) goes: the lock is the truth. */
    uint64_t key = nb_glock(b);
    int held = atomic_load(&b->held_here), want = atomic_load(&b->want_here), small = atomic_load(&b->small_here);
    atomic_store(&b->s->held, held), atomic_store(&b->s->want, want), atomic_store(&b->s->want_small, small);
    atomic_store(&b->s->crew_held, atomic_load(&b->crew_held_here));
    atomic_store(&b->s->standing_in, atomic_load(&b->standing_in_here));
    held ? atomic_fetch_or(&g->holding_mask, b->bit) : atomic_fetch_and(&g->holding_mask, ~b->bit);
    want ? atomic_fetch_or(&g->want_mask, b->bit) : atomic_fetch_and(&g->want_mask, ~b->bit);
    small ? atomic_fetch_or(&g->small_mask, b->bit) : atomic_fetch_and(&g->small_mask, ~b->bit);
    if (b->slots < 64) {
        uint64_t within = nb_slots_mask(b);
        atomic_fetch_and(&g->want_mask, within), atomic_fetch_and(&g->small_mask, within);
        atomic_fetch_and(&g->holding_mask, within);
    }
    nb_gunlock(b, key);
    for (int t = 0; t < b->tokens; t++) {
        uint32_t owner = atomic_load(&g->owner[t]);
        if (!owner || (atomic_load(&b->mine[t / 64]) >> (t % 64) & 1)) continue;
        if (nb_ofd(b->fd, F_OFD_GETLK, F_WRLCK, NB_TOKEN_LOCK(b->group, t)) == F_UNLCK)
            atomic_compare_exchange_strong(&g->owner[t], &owner, 0);
    }
}


/* ---- taking and giving back ---------------------------------------------------------------------- */
static void nb_register(NodeBudget *b, int small, int delta) {
    int want = atomic_fetch_add(&b->want_here, delta) + delta;
    atomic_store(&b->s->want, want);
    if (want == (delta > 0 ? 1 : 0))
        delta > 0 ? atomic_fetch_or(&b->g->want_mask, b->bit) : atomic_fetch_and(&b->g->want_mask, ~b->bit);
    if (!small) return;
    want = atomic_fetch_add(&b->small_here, delta) + delta;
    atomic_store(&b->s->want_small, want);
    if (want == (delta > 0 ? 1 : 0))
        delta > 0 ? atomic_fetch_or(&b->g->small_mask, b->bit) : atomic_fetch_and(&b->g->small_mask, ~b->bit);
}

static int nb_pick(NodeBudget *b) {
    int64_t now = now_ns();
    unsigned start = atomic_fetch_add(&b->cursor, 1);
    for (int i = 0; i < b->tokens; i++) {
        int t = (int)((start + (unsigned)i) % (unsigned)b->tokens);
        unsigned long bit = 1UL << (t % 64);
        if (atomic_load(&b->g->owner[t]) || atomic_load(&b->foreign_until[t]) > now) continue;
        if (atomic_fetch_or(&b->mine[t / 64], bit) & bit) continue;
        return t;
    }
    return NB_NONE;
}

/* One attempt: decide under the group's lock, then take the kernel lock. */
int nb_try(NodeBudget *b, int small, int uncontended_only) {
    if (!nb_usable(b)) return NB_NONE;
    if (uncontended_only && nb_others_wanting(b)) return NB_NONE;
    uint64_t key = nb_glock(b);
    int t = nb_eligible(b, small, uncontended_only) ? nb_pick(b) : NB_NONE;
    uint64_t seq = 0;
    if (t >= 0) {
        atomic_store(&b->g->owner[t], (uint32_t)b->slot + 1);
        atomic_store(&b->s->held, atomic_fetch_add(&b->held_here, 1) + 1);
        atomic_fetch_or(&b->g->holding_mask, b->bit);
        seq = atomic_fetch_add(&b->g->grants, 1) + 1;
        atomic_store(&b->s->last_grant, seq);
        nb_log(b, seq, t, small, 0);
    }
    nb_gunlock(b, key);
    if (t < 0) return NB_NONE;
    if (nb_ofd(b->fd, F_OFD_SETLK, F_WRLCK, NB_TOKEN_LOCK(b->group, t)) == 0) {
        atomic_fetch_add(&b->s->acquired, 1);
        return t;
    }
    /* Locked by someone outside the hints: a peer that took it without asking, or one that is gone
     * and left its hint.  Undo, and leave that token alone for a while. */
    atomic_store(&b->foreign_until[t], now_ns() + NB_FOREIGN_NS);
    key = nb_glock(b);
    uint32_t expected = (uint32_t)b->slot + 1;
    atomic_compare_exchange_strong(&b->g->owner[t], &expected, 0);
    int held = atomic_fetch_sub(&b->held_here, 1) - 1;
    atomic_store(&b->s->held, held);
    if (!held) atomic_fetch_and(&b->g->holding_mask, ~b->bit);
    if (b->g->log[seq % NB_LOG].seq == seq) b->g->log[seq % NB_LOG].how = 2;
    nb_gunlock(b, key);
    atomic_fetch_and(&b->mine[t / 64], ~(1UL << (t % 64)));
    return NB_NONE;
}

void nb_release(NodeBudget *b, int t, int yielded) {
    if (yielded == 2) atomic_fetch_sub(&b->yielding, 1);
    if (t == NB_OVERDRAFT) {
        atomic_fetch_sub(&b->overdraft_now, 1);
        return;
    }
    if (t == NB_STAND_IN) {
        atomic_store(&b->s->standing_in, atomic_fetch_sub(&b->standing_in_here, 1) - 1);
        return;
    }
    if (t < 0) return;
    if (nb_usable(b)) nb_ofd(b->fd, F_OFD_SETLK, F_UNLCK, NB_TOKEN_LOCK(b->group, t));
    atomic_fetch_and(&b->mine[t / 64], ~(1UL << (t % 64)));
    uint64_t key = nb_glock(b);
    uint32_t expected = (uint32_t)b->slot + 1;
    atomic_compare_exchange_strong(&b->g->owner[t], &expected, 0);
    int held = atomic_fetch_sub(&b->held_here, 1) - 1;
    atomic_store(&b->s->held, held);
    if (!held) atomic_fetch_and(&b->g->holding_mask, ~b->bit);
    int next = nb_next_waiter(b);
    nb_gunlock(b, key);
    if (yielded) atomic_fetch_add(&b->s->yields, 1);  /* 1: to a decode-size job or a quantum, 2: above its share */
    if (next >= 0) nb_wake_slot(b, next);
}

/* Whether a decode-size job that has waited NB_CREW_STALL_NS may gather in place of a crew thread
 * off its CPU: one is stalled that nobody stands in for yet, and this process's stand-ins are below
 * its fair share.  Decided under the group's lock, so two waiters never take one stalled token. */
static int nb_stand_in(NodeBudget *b, int64_t now) {
    uint64_t key = nb_glock(b);
    int yes = nb_stalled_crew(b, now) > 0 && atomic_load(&b->standing_in_here) < nb_fair(b);
    if (yes) {
        atomic_store(&b->s->standing_in, atomic_fetch_add(&b->standing_in_here, 1) + 1);
        atomic_fetch_add(&b->s->stand_ins, 1);
        nb_log(b, atomic_fetch_add(&b->g->grants, 1) + 1, NB_STAND_IN, 1, 3);
    }
    nb_gunlock(b, key);
    return yes;
}

/* A crew thread took (+1) or gives back (-1) a token: its slot counts those its crew holds. */
void nb_crew_hold(NodeBudget *b, int t, int delta) {
    if (t < 0) return;
    if (delta > 0) atomic_store(&b->s->crew_seen_at, now_ns());  /* seen before counted: never stalled at once */
    atomic_store(&b->s->crew_held, atomic_fetch_add(&b->crew_held_here, delta) + delta);
}

/* Wait (bounded) for a token; NB_NONE once `needed(arg)` says the work is gone, NB_OVERDRAFT when
 * the tokens are kept from this slot (see NB_STARVE_NS), NB_STAND_IN for a decode-size job whose
 * token a crew thread off its CPU holds (nb_stand_in). */
int nb_acquire(NodeBudget *b, int small, int (*needed)(void *), void *arg) {
    if (!nb_usable(b)) {  /* closed under a job still in flight: its own thread finishes it, unbudgeted */
        atomic_fetch_add(&b->overdraft_now, 1);
        return NB_OVERDRAFT;
    }
    int t = nb_try(b, small, 0);
    if (t >= 0) return t;
    int64_t start = now_ns();
    uint64_t big_before = atomic_load(&b->g->big_blocks);
    nb_register(b, small, 1);
    for (;;) {
        uint32_t seen = atomic_load(&b->s->seq);
        if (!needed(arg)) {
            t = NB_NONE;
            break;
        }
        if ((t = nb_try(b, small, 0)) >= 0) break;
        int64_t now = now_ns();
        int64_t until = atomic_load(&b->overdraft_until);
        if (until > now || (now - start > NB_STARVE_NS && atomic_load(&b->held_here) == 0)) {
            if (until <= now) atomic_store(&b->overdraft_until, now + NB_OVERDRAFT_NS);
            if (atomic_fetch_add(&b->overdraft_now, 1) < nb_fair(b)) {
                atomic_fetch_add(&b->s->overdraft, 1);
                uint64_t key = nb_glock(b);
                nb_log(b, atomic_fetch_add(&b->g->grants, 1) + 1, NB_OVERDRAFT, small, 1);
                nb_gunlock(b, key);
                t = NB_OVERDRAFT;
                break;
            }
            atomic_fetch_sub(&b->overdraft_now, 1);
        }
        if (small && now - start > NB_CREW_STALL_NS && nb_stand_in(b, now)) {
            t = NB_STAND_IN;
            break;
        }
        if (now - start > NB_SWEEP_NS) nb_sweep(b);
        atomic_fetch_add(&b->s->sleepers, 1);
        nb_futex(&b->s->seq, FUTEX_WAIT, seen, NB_WAIT_NS);
        atomic_fetch_sub(&b->s->sleepers, 1);
    }
    nb_register(b, small, -1);
    atomic_fetch_add(&b->s->wait_ns, (uint64_t)(now_ns() - start));
    if (t == NB_NONE) {  /* a release may have woken us for a token we no longer want: pass it on */
        int next = nb_next_waiter(b);
        if (next >= 0) nb_wake_slot(b, next);
    } else if (small) {
        uint64_t passed = atomic_load(&b->g->big_blocks) - big_before, most = atomic_load(&b->s->small_wait_blocks_max);
        atomic_fetch_add(&b->s->small_waits, 1);
        while (passed > most && !atomic_compare_exchange_weak(&b->s->small_wait_blocks_max, &most, passed)) {}
    }
    return t;
}

/* At a block boundary: whether the holder of token t should give it back now. */
int nb_should_yield(NodeBudget *b, int t, int small, int64_t blocks) {
    if (t < 0) return 0;
    NbGroup *g = b->g;
    uint64_t others = nb_others_wanting(b);
    if (small) others &= atomic_load(&g->small_mask);  /* a decode-size job gives way to its peers only */
    if (!others) return 0;  /* work-conserving: nobody else waits */
    if (!small && (atomic_load(&g->small_mask) & others)) {  /* a decode-size job waits */
        if (b->tokens < NB_FLOOR_MIN_TOKENS) return 1;
        if (atomic_load(&b->held_here) - atomic_load(&b->yielding) > 1) {  /* all but the prefill's floor */
            atomic_fetch_add(&b->yielding, 1);
            return 2;
        }
        return 0;
    }
    int held = atomic_load(&b->held_here), fair = nb_fair(b);
    if (held - atomic_load(&b->yielding) > fair) {  /* above its share: one holder per token too many */
        atomic_fetch_add(&b->yielding, 1);
        return 2;
    }
    if (blocks < NB_QUANTUM_MIN_BLOCKS) return 0;
    int64_t now = now_ns(), at = atomic_load(&g->rotate_at);
    if (now < at && at - now <= NB_TOKEN_TURN_NS) return 0;  /* further ahead than any quantum: a peer wrote it */
    for (uint64_t m = others; m; m &= m - 1)
        if (atomic_load(&nb_slot(b, __builtin_ctzll(m))->held) < held)  /* round robin: one token per quantum */
            return atomic_compare_exchange_strong(&g->rotate_at, &at, now + nb_quantum_ns(b));
    return 0;
}
