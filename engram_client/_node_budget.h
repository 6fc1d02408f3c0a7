/* The node's gather budget: tokens every rank's pool draws on (included by _host_gather.c).
 *
 * engramd creates the budget as a sealed memfd (it can neither shrink nor grow, so no peer can
 * truncate it under a rank's mapping) and hands it to each rank over a unix socket; the rank
 * reopens it (its own open file description) and maps it.  engram_client/core/budget_file.py
 * draws the same layout for the daemon.  A pool attached to a budget gathers a block only while
 * one of its threads holds a token of its group (one group per NUMA node with budget CPUs):
 *
 *     offset      0        header        magic, version, groups, slots, small_rows, tokens per group
 *                 4096     slots[64]     one per rank process: want/held counts, futex word, counters
 *                 16384 +  group[g]      decision lock, want/small/holding masks, token owner hints,
 *                   g*40960              the gathering counter and its peak, the grant log
 *     lock bytes  1 GiB + s             slot s: held (F_OFD_SETLK, write) by its process while it lives
 *                 2 GiB + g*1024 + t    token t of group g: held by the thread that gathers on it
 *
 * The kernel locks are the truth, everything in the mapping is a hint.  A token is held exactly
 * when its lock byte is locked; a rank that dies (SIGKILL mid-lookup included, in any pid
 * namespace) loses its locks at once.  Its hints (held counts, owner words, mask bits) stay until
 * a waiter or a new slot owner sweeps them: a slot whose liveness byte nobody locks is dead.
 * A peer that scribbles over the mapping can only mislead the scheduling, never make two threads
 * hold one token: within a process a private bitmap claims a token before its lock is taken (one
 * open file description per process, so the kernel alone would not tell our own threads apart).
 *
 * Scheduling, decided under the group's lock word (held for a few hundred ns; a holder that keeps
 * it NB_GLOCK_BREAK_NS is taken over: what it guards is advisory):
 *   - work-conserving: with nobody else wanting, a slot takes every free token;
 *   - small first: a prefill worker takes a token only if more are free than slots wait with a
 *     decode-size job (at most small_rows rows), and yields at the next block boundary while one waits;
 *   - fair: fair = ceil(tokens / active slots); a slot at its fair share takes no token while a slot
 *     below it waits, and one above it yields at a block boundary;
 *   - round robin: among waiting slots, the one served least recently goes first; once per
 *     NB_QUANTUM_NS in the group, one holder yields to a slot holding fewer tokens (so the odd
 *     token of an uneven split goes round without every holder letting go at once).
 * Waiters sleep on their slot's futex word (bounded: NB_WAIT_NS) and a release wakes the slot
 * that is next.  A slot that has waited NB_STARVE_NS holding nothing (a peer keeps the tokens
 * locked) gathers without a token for NB_OVERDRAFT_NS, counted: no peer stalls a rank for longer.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#define NB_MAGIC 0x3147445542474e45ULL  /* "ENGBUDG1" */
#define NB_VERSION 1
#define NB_MAX_SLOTS 64
#define NB_MAX_GROUPS 8
#define NB_MAX_TOKENS 1024
#define NB_LOG 1024
#define NB_SLOTS_AT 4096
#define NB_SLOT_BYTES 128
#define NB_GROUPS_AT 16384
#define NB_GROUP_BYTES 40960
#define NB_FILE_BYTES (NB_GROUPS_AT + NB_MAX_GROUPS * NB_GROUP_BYTES)
#define NB_SLOT_LOCK(s) ((off_t)1 << 30 | (off_t)(s))
#define NB_TOKEN_LOCK(g, t) (((off_t)2 << 30) + (off_t)(g) * NB_MAX_TOKENS + (t))
#define NB_WAIT_NS 2000000LL           /* a waiter re-checks at least this often (wake-ups are targeted) */
#define NB_WAITER_SPIN_NS 100000LL     /* the job's own thread polls this long before it sleeps */
#define NB_SWEEP_NS 2000000LL          /* ... and looks for dead slots after waiting this long */
#define NB_STARVE_NS 1000000000LL      /* holding nothing this long: the tokens are kept from us */
#define NB_OVERDRAFT_NS 10000000000LL  /* then gather without tokens this long before trying again */
#define NB_GLOCK_BREAK_NS 50000000LL
#define NB_FOREIGN_NS 10000000LL       /* a token locked outside the hints is skipped this long */
#define NB_QUANTUM_NS 1000000LL        /* the group rotates one token this often, at most */
#define NB_QUANTUM_MIN_BLOCKS 8
#define NB_NONE (-2)
#define NB_OVERDRAFT (-1)

typedef struct {
    uint64_t magic;
    uint32_t version, file_bytes, groups, slots, small_rows, reserved;
    uint32_t tokens[NB_MAX_GROUPS];
} NbHeader;

typedef struct {
    _Atomic uint32_t seq, sleepers;        /* futex word: bumped to wake this slot's waiting workers */
    _Atomic int32_t want, want_small, held, group, pid, reserved;
    _Atomic uint64_t last_grant;           /* the group's grant number at this slot's last grant */
    _Atomic uint64_t rows, wait_ns, acquired, yields, overdraft, small_waits, small_wait_blocks_max;
} NbSlot;

typedef struct {
    uint64_t seq, want_mask, small_mask;   /* seq = grant number (0: never written) */
    uint16_t slot, token, held_after;
    uint8_t small, how;                    /* how: 0 a token, 1 overdraft, 2 refused by the kernel */
} NbGrant;

typedef struct {
    _Atomic uint64_t lock, lock_count, breaks;
    _Atomic uint64_t want_mask, small_mask, holding_mask;
    _Atomic uint64_t grants, big_blocks, sweeps;
    _Atomic int32_t gathering, peak;
    _Atomic int64_t rotate_at;             /* the next quantum rotation may happen from then on */
    uint8_t pad[256 - 9 * 8 - 8 - 8];
    _Atomic uint32_t owner[NB_MAX_TOKENS]; /* slot + 1 holding the token, 0 free (a hint) */
    NbGrant log[NB_LOG];
} NbGroup;

_Static_assert(sizeof(NbGrant) == 32, "grant record is 32 bytes");
_Static_assert(sizeof(NbSlot) <= NB_SLOT_BYTES, "slot record too large");
_Static_assert(sizeof(NbGroup) <= NB_GROUP_BYTES, "group record too large");

typedef struct NodeBudget {
    uint8_t *map;
    int fd, group, slot, tokens, slots, small_rows;
    uint64_t bit;
    NbGroup *g;
    NbSlot *s;
    atomic_ulong mine[NB_MAX_TOKENS / 64];  /* tokens this process holds: private, so no peer can forge it */
    _Atomic int64_t foreign_until[NB_MAX_TOKENS];
    _Atomic int64_t last_sweep, overdraft_until;
    _Atomic int overdraft_now;
    _Atomic int held_here, want_here, small_here;  /* this process's own counts: what its slot should say */
    _Atomic int yielding;                  /* holders of this process giving a token back now */
    atomic_uint cursor;
    atomic_uint done_seq;                  /* waiters sleep on it (process-private futex) */
    atomic_int done_sleepers;
    long generation;
    atomic_int refs;
    struct NodeBudget *next_all;
} NodeBudget;

static NodeBudget *nb_all;                 /* every budget of this process, for the fork handler */
static pthread_mutex_t nb_all_lock = PTHREAD_MUTEX_INITIALIZER;

static inline NbSlot *nb_slot(const NodeBudget *b, int s) {
    return (NbSlot *)(b->map + NB_SLOTS_AT + (size_t)s * NB_SLOT_BYTES);
}

static long nb_futex(_Atomic uint32_t *addr, int op, uint32_t val, int64_t timeout_ns) {
    struct timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
    return syscall(SYS_futex, addr, op, val, timeout_ns > 0 ? &ts : NULL, NULL, 0);
}

static int nb_ofd(int fd, int cmd, short type, off_t at) {
    struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = at, .l_len = 1, .l_pid = 0};
    if (fcntl(fd, cmd, &fl) != 0) return -1;
    return cmd == F_OFD_GETLK ? fl.l_type : 0;
}

static inline int nb_usable(const NodeBudget *b) {
    return b->fd >= 0 && b->generation == atomic_load(&fork_generation);
}

static inline int nb_ceil_div(int a, int b) { return b > 0 ? (a + b - 1) / b : a; }

/* ---- the decision lock ------------------------------------------------------------------------ */
static uint64_t nb_glock_group(NbGroup *g, int slot) {
    uint64_t mine = (atomic_fetch_add(&g->lock_count, 1) + 1) << 8 | (uint64_t)(slot + 1);
    uint64_t seen = 0;
    int64_t seen_at = 0;
    for (int spins = 0;; spins++) {
        uint64_t expected = 0;
        if (atomic_compare_exchange_weak(&g->lock, &expected, mine)) return mine;
        if (expected != seen) {
            seen = expected, seen_at = now_ns();
        } else if (spins % 64 == 0 && now_ns() - seen_at > NB_GLOCK_BREAK_NS &&
                   atomic_compare_exchange_strong(&g->lock, &expected, mine)) {
            atomic_fetch_add(&g->breaks, 1);  /* its holder died or never lets go: take it over */
            return mine;
        }
        if (spins < 256) cpu_relax(); else sched_yield();
    }
}

static void nb_gunlock_group(NbGroup *g, uint64_t mine) {
    uint64_t expected = mine;
    atomic_compare_exchange_strong(&g->lock, &expected, 0);  /* not ours any more: taken over */
}

static inline uint64_t nb_glock(NodeBudget *b) { return nb_glock_group(b->g, b->slot); }
static inline void nb_gunlock(NodeBudget *b, uint64_t key) { nb_gunlock_group(b->g, key); }

/* ---- reading the group ------------------------------------------------------------------------ */
static int nb_held_total(const NodeBudget *b) {
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

static int nb_fair(const NodeBudget *b) {
    uint64_t active = atomic_load(&b->g->want_mask) | atomic_load(&b->g->holding_mask) | b->bit;
    if (b->slots < 64) active &= (1ULL << b->slots) - 1;
    return nb_ceil_div(b->tokens, __builtin_popcountll(active));
}

/* Whether this slot may take a free token now (lock held). */
static int nb_eligible(const NodeBudget *b, int small, int uncontended_only) {
    NbGroup *g = b->g;
    int free = b->tokens - nb_held_total(b);
    if (free <= 0) return 0;
    uint64_t others = atomic_load(&g->want_mask) & ~b->bit;
    if (b->slots < 64) others &= (1ULL << b->slots) - 1;
    if (!others) return 1;
    if (uncontended_only) return 0;
    uint64_t smalls = atomic_load(&g->small_mask) & others;
    if (!small && free <= __builtin_popcountll(smalls)) return 0;
    uint64_t rivals = small ? smalls : others;
    int fair = nb_fair(b), held = atomic_load(&b->held_here), older = 0, below = 0;
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
static int nb_next_waiter(const NodeBudget *b) {
    NbGroup *g = b->g;
    uint64_t want = atomic_load(&g->want_mask), small = atomic_load(&g->small_mask) & want;
    uint64_t pool = small ? small : want;
    if (b->slots < 64) pool &= (1ULL << b->slots) - 1;
    int best = -1;
    uint64_t best_last = UINT64_MAX;
    for (uint64_t m = pool; m; m &= m - 1) {
        int i = __builtin_ctzll(m);
        uint64_t last = atomic_load(&nb_slot(b, i)->last_grant);
        if (last < best_last) best = i, best_last = last;
    }
    return best;
}

static void nb_wake_slot(NodeBudget *b, int s) {
    NbSlot *x = nb_slot(b, s);
    atomic_fetch_add(&x->seq, 1);
    if (atomic_load(&x->sleepers)) nb_futex(&x->seq, FUTEX_WAKE, 1, 0);
}

static void nb_log(NodeBudget *b, uint64_t seq, int token, int small, int how) {
    NbGrant *e = &b->g->log[seq % NB_LOG];
    e->want_mask = atomic_load(&b->g->want_mask);
    e->small_mask = atomic_load(&b->g->small_mask);
    e->slot = (uint16_t)b->slot, e->token = (uint16_t)(token < 0 ? 0xFFFF : token);
    e->held_after = (uint16_t)atomic_load(&b->s->held), e->small = (uint8_t)small, e->how = (uint8_t)how;
    __atomic_store_n(&e->seq, seq, __ATOMIC_RELEASE);
}

/* ---- dead slots --------------------------------------------------------------------------------- */
static int nb_slot_alive(const NodeBudget *b, int s) {
    int type = nb_ofd(b->fd, F_OFD_GETLK, F_WRLCK, NB_SLOT_LOCK(s));
    return type != F_UNLCK;  /* an error counts as alive: never clear what we cannot judge */
}

/* Forget slot s's hints in group g (lock of g held). */
static void nb_clear_slot(NodeBudget *b, NbGroup *g, int s) {
    uint64_t bit = 1ULL << s;
    NbSlot *x = nb_slot(b, s);
    atomic_store(&x->held, 0), atomic_store(&x->want, 0), atomic_store(&x->want_small, 0);
    atomic_fetch_and(&g->want_mask, ~bit), atomic_fetch_and(&g->small_mask, ~bit);
    atomic_fetch_and(&g->holding_mask, ~bit);
    for (int t = 0; t < NB_MAX_TOKENS; t++) {
        uint32_t expected = (uint32_t)s + 1;
        atomic_compare_exchange_strong(&g->owner[t], &expected, 0);
    }
}

static void nb_sweep(NodeBudget *b) {
    int64_t now = now_ns(), last = atomic_load(&b->last_sweep);
    if (now - last < NB_SWEEP_NS || !atomic_compare_exchange_strong(&b->last_sweep, &last, now)) return;
    NbGroup *g = b->g;
    uint64_t marked = atomic_load(&g->want_mask) | atomic_load(&g->small_mask) | atomic_load(&g->holding_mask);
    for (int s = 0; s < b->slots; s++) {
        if (s == b->slot || !(marked >> s & 1) || nb_slot_alive(b, s)) continue;
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
    held ? atomic_fetch_or(&g->holding_mask, b->bit) : atomic_fetch_and(&g->holding_mask, ~b->bit);
    want ? atomic_fetch_or(&g->want_mask, b->bit) : atomic_fetch_and(&g->want_mask, ~b->bit);
    small ? atomic_fetch_or(&g->small_mask, b->bit) : atomic_fetch_and(&g->small_mask, ~b->bit);
    if (b->slots < 64) {
        uint64_t beyond = ~((1ULL << b->slots) - 1);
        atomic_fetch_and(&g->want_mask, ~beyond), atomic_fetch_and(&g->small_mask, ~beyond);
        atomic_fetch_and(&g->holding_mask, ~beyond);
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
static int nb_try(NodeBudget *b, int small, int uncontended_only) {
    if (!nb_usable(b)) return NB_NONE;
    if (uncontended_only && (atomic_load(&b->g->want_mask) & ~b->bit)) return NB_NONE;
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

static void nb_release(NodeBudget *b, int t, int yielded) {
    if (yielded == 2) atomic_fetch_sub(&b->yielding, 1);
    if (t == NB_OVERDRAFT) {
        atomic_fetch_sub(&b->overdraft_now, 1);
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

/* Wait (bounded) for a token; NB_NONE once `needed(arg)` says the work is gone, NB_OVERDRAFT when
 * the tokens are kept from this slot (see NB_STARVE_NS). */
static int nb_acquire(NodeBudget *b, int small, int (*needed)(void *), void *arg) {
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
static int nb_should_yield(NodeBudget *b, int t, int small, int64_t blocks) {
    if (t < 0) return 0;
    NbGroup *g = b->g;
    uint64_t others = atomic_load_explicit(&g->want_mask, memory_order_relaxed) & ~b->bit;
    if (b->slots < 64) others &= (1ULL << b->slots) - 1;
    if (small) others &= atomic_load(&g->small_mask);  /* a decode-size job gives way to its peers only */
    if (!others) return 0;  /* work-conserving: nobody else waits */
    if (!small && (atomic_load(&g->small_mask) & others)) return 1;  /* a decode-size job waits */
    int held = atomic_load(&b->held_here), fair = nb_fair(b);
    if (held - atomic_load(&b->yielding) > fair) {  /* above its share: one holder per token too many */
        atomic_fetch_add(&b->yielding, 1);
        return 2;
    }
    if (blocks < NB_QUANTUM_MIN_BLOCKS) return 0;
    int64_t now = now_ns(), at = atomic_load(&g->rotate_at);
    if (now < at) return 0;
    for (uint64_t m = others; m; m &= m - 1)
        if (atomic_load(&nb_slot(b, __builtin_ctzll(m))->held) < held)  /* round robin: one token per quantum */
            return atomic_compare_exchange_strong(&g->rotate_at, &at, now + NB_QUANTUM_NS);
    return 0;
}

/* take_block with the budget's accounting: the gathering count (never above the tokens), rows,
 * blocks of prefill jobs, and a wake-up for a waiter whose chunk this block completed. */
static int budget_take_block(NodeBudget *b, Job *job, int counted, int small) {
    int64_t block = atomic_fetch_add(&job->next_block, 1);
    if (block >= job->nblocks) return 0;
    if (block == job->nblocks - 1 && atomic_load(&b->s->sleepers)) {
        /* The job's last block is handed out: our workers still waiting for a token for it may go. */
        atomic_fetch_add(&b->s->seq, 1);
        nb_futex(&b->s->seq, FUTEX_WAKE, INT32_MAX, 0);
    }
    if (counted) {
        int now = atomic_fetch_add(&b->g->gathering, 1) + 1, peak = atomic_load(&b->g->peak);
        while (now > peak && !atomic_compare_exchange_weak(&b->g->peak, &peak, now)) {}
    }
    gather_block(job, block);
    if (counted) atomic_fetch_sub(&b->g->gathering, 1);
    int64_t lo = block * job->block_rows;
    atomic_fetch_add_explicit(&b->s->rows, (uint64_t)(job->n - lo < job->block_rows ? job->n - lo : job->block_rows),
                              memory_order_relaxed);
    if (!small) atomic_fetch_add_explicit(&b->g->big_blocks, 1, memory_order_relaxed);
    int64_t chunk = block / job->chunk_blocks;
    atomic_thread_fence(memory_order_seq_cst);  /* the block's count before the sleeper check (see budget_wait_chunk) */
    if (atomic_load(&b->done_sleepers) && atomic_load(&job->chunk_done[chunk]) >= chunk_blocks(job, chunk)) {
        atomic_fetch_add(&b->done_seq, 1);
        nb_futex((_Atomic uint32_t *)&b->done_seq, FUTEX_WAKE_PRIVATE, INT32_MAX, 0);
    }
    return 1;
}

static int nb_pool_has_work(void *arg) {  /* a listed job with blocks left (exhausted ones are unlisted) */
    Pool *pool = arg;
    if (!atomic_load(&pool->listed_jobs) || atomic_load(&pool->stop)) return 0;
    pthread_mutex_lock(&pool->lock);
    int work = job_with_work(pool) != NULL;
    pthread_mutex_unlock(&pool->lock);
    return work;
}

static int nb_job_has_blocks(void *arg) {
    Job *job = arg;
    return atomic_load(&job->next_block) < job->nblocks;
}

/* The worker loop of a pool on a budget (the hook in worker_main).  A worker without a token
 * sleeps; it takes one when jobs are listed (or, to answer a pre-wake, when nobody else wants
 * one), gathers while it holds it, yields it at block boundaries when the budget says so, and
 * after its last job lingers, holding it, only while nobody else waits. */
static void *budget_worker_main(Pool *pool) {
    NodeBudget *b = pool->budget;
    int tok = NB_NONE;
    int64_t linger_until = 0, answered = 0;
    while (!atomic_load(&pool->stop)) {
        if (tok == NB_NONE) {
            b = atomic_load(&pool->budget);  /* a new daemon's budget (set_budget) from the next token on */
            pthread_mutex_lock(&pool->lock);
            while (!atomic_load(&pool->stop) && !atomic_load(&pool->listed_jobs)) {
                int64_t spin = atomic_load(&pool->spin_until);
                if (spin != answered && spin > now_ns()) break;
                pool->sleepers++;
                pthread_cond_wait(&pool->wake, &pool->lock);
                pool->sleepers--;
            }
            int listed = atomic_load(&pool->listed_jobs);
            int small = pool->head == NULL || pool->head->n <= b->small_rows;
            pthread_mutex_unlock(&pool->lock);
            if (atomic_load(&pool->stop)) break;
            if (!listed) {  /* a pre-wake: be awake for the job, but only on a token nobody else wants */
                answered = atomic_load(&pool->spin_until);
                linger_until = answered;
                if ((tok = nb_try(b, 1, 1)) == NB_NONE) continue;
            } else if ((tok = nb_acquire(b, small, nb_pool_has_work, pool)) == NB_NONE) {
                continue;
            }
        }
        if (atomic_load(&pool->listed_jobs)) {
            pthread_mutex_lock(&pool->lock);
            Job *job = job_with_work(pool);
            if (job) atomic_fetch_add(&job->users, 1);
            pthread_mutex_unlock(&pool->lock);
            if (job) {
                int small = job->n <= b->small_rows, yielded = 0;
                int64_t blocks = 0;
                while (budget_take_block(b, job, tok >= 0, small))
                    if ((yielded = nb_should_yield(b, tok, small, ++blocks))) break;
                atomic_fetch_sub(&job->users, 1);
                if (yielded) {
                    nb_release(b, tok, yielded);
                    tok = NB_NONE;
                }
                linger_until = now_ns() + IDLE_SPIN_NS;
                continue;
            }
        }
        int64_t now = now_ns(), spin = atomic_load(&pool->spin_until);
        if (tok >= 0 && (now < linger_until || now < spin) && !(atomic_load(&b->g->want_mask) & ~b->bit)) {
            for (int i = 0; i < 32; i++) cpu_relax();
            continue;
        }
        nb_release(b, tok, 0);
        tok = NB_NONE;
    }
    if (tok != NB_NONE) nb_release(b, tok, 0);
    return NULL;
}

/* The waiter's part on a budget (the hook in job_wait_chunk): it gathers only on a token it can
 * get at once (the pool's workers wait for theirs), and otherwise sleeps until a block completes
 * its chunk.  Where no worker will help (one thread, a closed pool, a one-block job that is never
 * listed) it waits for a token itself. */
static void budget_wait_chunk(Job *job, int64_t chunk) {
    Pool *pool = job->pool;
    NodeBudget *b = pool->budget;
    const int64_t need = chunk_blocks(job, chunk);
    const int small = job->n <= b->small_rows;
    int tok = NB_NONE;
    int64_t blocks = 0;
    while (atomic_load_explicit(&job->chunk_done[chunk], memory_order_acquire) < need) {
        /* No worker will help with a job that was never listed (one block), nor in a pool without them. */
        int alone = pool->nthreads == 0 || !pool_usable(pool) || !job->listed;
        if (tok == NB_NONE && atomic_load(&job->next_block) < job->nblocks)
            tok = alone ? nb_acquire(b, small, nb_job_has_blocks, job) : nb_try(b, small, 0);
        if (tok != NB_NONE) {
            if (budget_take_block(b, job, tok >= 0, small)) {
                int why = nb_should_yield(b, tok, small, ++blocks);
                if (why) {
                    nb_release(b, tok, why);
                    tok = NB_NONE, blocks = 0;
                }
                continue;
            }
            nb_release(b, tok, 0);
            tok = NB_NONE;
        }
        /* Poll a little first: a wake-up through the kernel costs tens of microseconds in a VM,
         * as much as a decode-size call's gather. */
        int64_t spin_until = now_ns() + NB_WAITER_SPIN_NS;
        while (atomic_load_explicit(&job->chunk_done[chunk], memory_order_acquire) < need && now_ns() < spin_until)
            for (int i = 0; i < 32; i++) cpu_relax();
        if (atomic_load_explicit(&job->chunk_done[chunk], memory_order_acquire) >= need) break;
        uint32_t seen = atomic_load(&b->done_seq);
        atomic_fetch_add(&b->done_sleepers, 1);
        if (atomic_load_explicit(&job->chunk_done[chunk], memory_order_acquire) < need)
            nb_futex((_Atomic uint32_t *)&b->done_seq, FUTEX_WAIT_PRIVATE, seen, alone ? NB_WAIT_NS : 100000);
        atomic_fetch_sub(&b->done_sleepers, 1);
    }
    if (tok != NB_NONE) nb_release(b, tok, 0);
}

/* ---- opening, forks, closing ------------------------------------------------------------------------ */
static void nb_after_fork_in_child(void) {
    /* The child must not keep the parent's open file description (its locks) alive: close it here,
     * where the child runs alone.  Its mapping stays, unused (the child's pools refuse to run). */
    for (NodeBudget *b = nb_all; b; b = b->next_all)
        if (b->fd >= 0) {
            close(b->fd);
            b->fd = -1;
        }
}

static void nb_unref(NodeBudget *b) {
    if (atomic_fetch_sub(&b->refs, 1) != 1) return;
    pthread_mutex_lock(&nb_all_lock);
    for (NodeBudget **link = &nb_all; *link; link = &(*link)->next_all)
        if (*link == b) {
            *link = b->next_all;
            break;
        }
    pthread_mutex_unlock(&nb_all_lock);
    if (b->fd >= 0) close(b->fd);  /* our locks (tokens, slot) go with it */
    munmap(b->map, NB_FILE_BYTES);
    free(b);
}

/* Map the budget behind fd (a descriptor of its own, duplicated here) and claim a slot. */
static NodeBudget *nb_open(int fd_in, int group, int tokens, int slots) {
    static int atfork_done;
    int fd = fcntl(fd_in, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return (NodeBudget *)PyErr_SetFromErrno(PyExc_OSError);
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    const char *why = NULL;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size < NB_FILE_BYTES) why = "is not a budget of the right size";
    else if (seals < 0 || !(seals & F_SEAL_SHRINK)) why = "is not sealed against shrinking (a peer could truncate it under us)";
    void *map = why ? MAP_FAILED : mmap(NULL, NB_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!why && map == MAP_FAILED) why = "cannot be mapped";
    const NbHeader *h = map == MAP_FAILED ? NULL : map;
    if (!why && (h->magic != NB_MAGIC || h->version != NB_VERSION || h->file_bytes != NB_FILE_BYTES))
        why = "has no budget header of this version";
    if (!why && (group < 0 || group >= (int)h->groups || h->groups > NB_MAX_GROUPS || slots != (int)h->slots ||
                 slots < 1 || slots > NB_MAX_SLOTS || tokens != (int)h->tokens[group] || tokens < 1 ||
                 tokens > NB_MAX_TOKENS || h->small_rows < 1))
        why = "does not match what the daemon announced (group, tokens or slots)";
    if (why) {
        if (map != MAP_FAILED) munmap(map, NB_FILE_BYTES);
        close(fd);
        PyErr_Format(err_class(), "the gather budget the daemon handed over %s", why);
        return NULL;
    }
    NodeBudget *b = calloc(1, sizeof(NodeBudget));
    if (!b) {
        munmap(map, NB_FILE_BYTES);
        close(fd);
        return (NodeBudget *)PyErr_NoMemory();
    }
    b->map = map, b->fd = fd, b->group = group, b->tokens = tokens, b->slots = slots;
    b->small_rows = (int)h->small_rows;
    b->g = (NbGroup *)(b->map + NB_GROUPS_AT + (size_t)group * NB_GROUP_BYTES);
    b->generation = atomic_load(&fork_generation);
    atomic_store(&b->refs, 1);
    b->slot = -1;
    for (int s = 0; s < slots && b->slot < 0; s++)
        if (nb_ofd(fd, F_OFD_SETLK, F_WRLCK, NB_SLOT_LOCK(s)) == 0) b->slot = s;
    if (b->slot < 0) {
        munmap(map, NB_FILE_BYTES);
        close(fd);
        free(b);
        PyErr_Format(err_class(), "every one of the budget's %d slots is held by a live rank", slots);
        return NULL;
    }
    b->bit = 1ULL << b->slot;
    b->s = nb_slot(b, b->slot);
    int previous = atomic_load(&b->s->group);  /* a dead owner's hints, in whichever group it was */
    for (int g = 0; g < (int)h->groups; g++)
        if (g == previous || g == group) {
            NbGroup *other = (NbGroup *)(b->map + NB_GROUPS_AT + (size_t)g * NB_GROUP_BYTES);
            uint64_t key = nb_glock_group(other, b->slot);
            nb_clear_slot(b, other, b->slot);
            nb_gunlock_group(other, key);
        }
    atomic_store(&b->s->group, group), atomic_store(&b->s->pid, getpid()), atomic_store(&b->s->last_grant, 0);
    atomic_store(&b->s->rows, 0), atomic_store(&b->s->wait_ns, 0), atomic_store(&b->s->acquired, 0);
    atomic_store(&b->s->yields, 0), atomic_store(&b->s->overdraft, 0), atomic_store(&b->s->small_waits, 0);
    atomic_store(&b->s->small_wait_blocks_max, 0);
    pthread_mutex_lock(&nb_all_lock);
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, nb_after_fork_in_child);
        atfork_done = 1;
    }
    b->next_all = nb_all;
    nb_all = b;
    pthread_mutex_unlock(&nb_all_lock);
    return b;
}

/* ---- NodeBudget, the Python object ----------------------------------------------------------------- */
typedef struct {
    PyObject_HEAD
    NodeBudget *b;
} NodeBudgetObject;

static int budget_init(NodeBudgetObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"fd", "group", "tokens", "slots", NULL};
    int fd, group, tokens, slots;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "iiii", names, &fd, &group, &tokens, &slots)) return -1;
    if (self->b) return 0;
    self->b = nb_open(fd, group, tokens, slots);
    return self->b ? 0 : -1;
}

static void budget_dealloc(NodeBudgetObject *self) {
    if (self->b) nb_unref(self->b);
    self->b = NULL;
    Py_TYPE(self)->tp_free((PyObject *)self);
}

#define NB_ITEM(dict, key, value) do { PyObject *v_ = (value); \
        if (!v_ || PyDict_SetItemString(dict, key, v_) < 0) { Py_XDECREF(v_); Py_DECREF(dict); return NULL; } \
        Py_DECREF(v_); } while (0)

static PyObject *budget_stats(NodeBudgetObject *self, PyObject *unused) {
    NodeBudget *b = self->b;
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    NbSlot *s = b->s;
    NB_ITEM(d, "slot", PyLong_FromLong(b->slot));
    NB_ITEM(d, "group", PyLong_FromLong(b->group));
    NB_ITEM(d, "tokens", PyLong_FromLong(b->tokens));
    NB_ITEM(d, "held", PyLong_FromLong(atomic_load(&s->held)));
    NB_ITEM(d, "rows", PyLong_FromUnsignedLongLong(atomic_load(&s->rows)));
    NB_ITEM(d, "wait_s", PyFloat_FromDouble((double)atomic_load(&s->wait_ns) * 1e-9));
    NB_ITEM(d, "acquired", PyLong_FromUnsignedLongLong(atomic_load(&s->acquired)));
    NB_ITEM(d, "yields", PyLong_FromUnsignedLongLong(atomic_load(&s->yields)));
    NB_ITEM(d, "overdraft", PyLong_FromUnsignedLongLong(atomic_load(&s->overdraft)));
    NB_ITEM(d, "small_waits", PyLong_FromUnsignedLongLong(atomic_load(&s->small_waits)));
    NB_ITEM(d, "small_wait_blocks_max", PyLong_FromUnsignedLongLong(atomic_load(&s->small_wait_blocks_max)));
    return d;
}

/* The group as every rank sees it, and how many of its token bytes the kernel says are locked. */
static PyObject *budget_group_state(NodeBudgetObject *self, PyObject *unused) {
    NodeBudget *b = self->b;
    NbGroup *g = b->g;
    int locked = 0;
    for (int t = 0; t < b->tokens; t++)  /* our own locks do not conflict with our descriptor: counted apart */
        locked += (atomic_load(&b->mine[t / 64]) >> (t % 64) & 1) ||
                  (b->fd >= 0 && nb_ofd(b->fd, F_OFD_GETLK, F_WRLCK, NB_TOKEN_LOCK(b->group, t)) != F_UNLCK);
    PyObject *d = PyDict_New();
    if (!d) return NULL;
    NB_ITEM(d, "held", PyLong_FromLong(nb_held_total(b)));
    NB_ITEM(d, "locked", PyLong_FromLong(locked));
    NB_ITEM(d, "want_mask", PyLong_FromUnsignedLongLong(atomic_load(&g->want_mask)));
    NB_ITEM(d, "small_mask", PyLong_FromUnsignedLongLong(atomic_load(&g->small_mask)));
    NB_ITEM(d, "holding_mask", PyLong_FromUnsignedLongLong(atomic_load(&g->holding_mask)));
    NB_ITEM(d, "gathering", PyLong_FromLong(atomic_load(&g->gathering)));
    NB_ITEM(d, "peak", PyLong_FromLong(atomic_load(&g->peak)));
    NB_ITEM(d, "grants", PyLong_FromUnsignedLongLong(atomic_load(&g->grants)));
    NB_ITEM(d, "big_blocks", PyLong_FromUnsignedLongLong(atomic_load(&g->big_blocks)));
    NB_ITEM(d, "sweeps", PyLong_FromUnsignedLongLong(atomic_load(&g->sweeps)));
    NB_ITEM(d, "breaks", PyLong_FromUnsignedLongLong(atomic_load(&g->breaks)));
    return d;
}

/* The grant log, oldest first: (seq, slot, token or -1, small, how, held_after, want_mask, small_mask). */
static PyObject *budget_grant_log(NodeBudgetObject *self, PyObject *unused) {
    NodeBudget *b = self->b;
    uint64_t last = atomic_load(&b->g->grants), first = last > NB_LOG ? last - NB_LOG + 1 : 1;
    PyObject *out = PyList_New(0);
    for (uint64_t seq = first; out && seq <= last; seq++) {
        NbGrant e = b->g->log[seq % NB_LOG];
        if (__atomic_load_n(&b->g->log[seq % NB_LOG].seq, __ATOMIC_ACQUIRE) != seq || e.seq != seq) continue;
        PyObject *item = Py_BuildValue("(KiiiiiKK)", (unsigned long long)seq, (int)e.slot,
                                       e.token == 0xFFFF ? -1 : (int)e.token, (int)e.small, (int)e.how,
                                       (int)e.held_after, (unsigned long long)e.want_mask,
                                       (unsigned long long)e.small_mask);
        if (!item || PyList_Append(out, item) < 0) Py_CLEAR(out);
        Py_XDECREF(item);
    }
    return out;
}

/* What the budget's system calls cost here, in ns per call (medians are for the caller to take). */
static PyObject *budget_syscall_costs(NodeBudgetObject *self, PyObject *arg) {
    NodeBudget *b = self->b;
    long n = PyLong_AsLong(arg);
    if (PyErr_Occurred()) return NULL;
    if (n < 1 || b->fd < 0) {
        PyErr_SetString(PyExc_ValueError, "syscall_costs(n) needs n >= 1 and an open budget");
        return NULL;
    }
    const off_t scratch = (off_t)3 << 30;
    int64_t t0 = now_ns();
    for (long i = 0; i < n; i++) {
        nb_ofd(b->fd, F_OFD_SETLK, F_WRLCK, scratch);
        nb_ofd(b->fd, F_OFD_SETLK, F_UNLCK, scratch);
    }
    int64_t t1 = now_ns();
    for (long i = 0; i < n; i++) nb_ofd(b->fd, F_OFD_GETLK, F_WRLCK, scratch);
    int64_t t2 = now_ns();
    _Atomic uint32_t word = 0;
    for (long i = 0; i < n; i++) nb_futex(&word, FUTEX_WAKE, 1, 0);
    int64_t t3 = now_ns();
    for (long i = 0; i < n; i++) nb_gunlock(b, nb_glock(b));
    int64_t t4 = now_ns();
    return Py_BuildValue("{s:d,s:d,s:d,s:d}", "lock_and_unlock_ns", (double)(t1 - t0) / n,
                         "test_lock_ns", (double)(t2 - t1) / n, "futex_wake_ns", (double)(t3 - t2) / n,
                         "decision_lock_ns", (double)(t4 - t3) / n);
}

static PyObject *budget_get_slot(NodeBudgetObject *self, void *unused) { return PyLong_FromLong(self->b ? self->b->slot : -1); }
static PyObject *budget_get_group(NodeBudgetObject *self, void *unused) { return PyLong_FromLong(self->b ? self->b->group : -1); }
static PyObject *budget_get_tokens(NodeBudgetObject *self, void *unused) { return PyLong_FromLong(self->b ? self->b->tokens : 0); }
static PyObject *budget_get_small_rows(NodeBudgetObject *self, void *unused) {
    return PyLong_FromLong(self->b ? self->b->small_rows : 0);
}

static PyObject *budget_require(NodeBudgetObject *self, PyCFunction fn, PyObject *arg) {
    if (!self->b) {
        PyErr_SetString(err_class(), "this NodeBudget was never opened");
        return NULL;
    }
    return fn((PyObject *)self, arg);
}
#define NB_METHOD(name) static PyObject *name##_checked(NodeBudgetObject *self, PyObject *arg) { \
        return budget_require(self, (PyCFunction)name, arg); }
NB_METHOD(budget_stats)
NB_METHOD(budget_group_state)
NB_METHOD(budget_grant_log)
NB_METHOD(budget_syscall_costs)

static PyMethodDef budget_methods[] = {
    {"stats", (PyCFunction)budget_stats_checked, METH_NOARGS, "This process's slot: held, rows, waits, yields, overdraft."},
    {"group_state", (PyCFunction)budget_group_state_checked, METH_NOARGS,
     "The group: tokens held (hints) and locked (the kernel), masks, gathering and its peak, grants."},
    {"grant_log", (PyCFunction)budget_grant_log_checked, METH_NOARGS,
     "The last grants, oldest first: (seq, slot, token, small, how, held_after, want_mask, small_mask)."},
    {"syscall_costs", (PyCFunction)budget_syscall_costs_checked, METH_O,
     "syscall_costs(n) -> ns per lock+unlock, test, futex wake, decision lock (n of each)."},
    {NULL}};

static PyGetSetDef budget_getset[] = {
    {"slot", (getter)budget_get_slot, NULL, "this process's slot in the budget", NULL},
    {"group", (getter)budget_get_group, NULL, "the group (NUMA node's CPUs) it draws on", NULL},
    {"tokens", (getter)budget_get_tokens, NULL, "tokens of that group", NULL},
    {"small_rows", (getter)budget_get_small_rows, NULL, "jobs of at most this many rows go first", NULL},
    {NULL}};

static PyTypeObject NodeBudgetType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "engram_client._host_gather.NodeBudget",
    .tp_basicsize = sizeof(NodeBudgetObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "NodeBudget(fd, group, tokens, slots): this process's slot in the node's gather budget",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)budget_init,
    .tp_dealloc = (destructor)budget_dealloc,
    .tp_methods = budget_methods,
    .tp_getset = budget_getset,
};
