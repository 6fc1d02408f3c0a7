/* The node's gather budget: tokens every rank's pool draws on.
 *
 * engramd creates the budget as a sealed memfd (it can neither shrink nor grow, so no peer can
 * truncate it under a rank's mapping) and hands it to each rank over a unix socket; the rank
 * reopens it (its own open file description) and maps it.  engram_client/core/budget_file.py
 * draws the same layout for the daemon.  A pool attached to a budget gathers a block only while
 * one of its threads holds a token of its group (one group per NUMA node with budget CPUs):
 *
 *     offset      0        header        magic, version, file_bytes, groups, slots, small_rows, flags,
 *                                       tokens per group, decode CPUs per group (0 in a budget of an
 *                                       older daemon: none)
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
 * Scheduling, decided under the group's lock word (held for a few hundred ns; a waiter that has not
 * had it for NB_GLOCK_BREAK_NS takes it over, whatever it holds, and then decides without it for a
 * while: what it guards is advisory):
 *   - work-conserving: with nobody else wanting, a slot takes every free token;
 *   - small first: a prefill worker takes a token only if more are free than slots wait with a
 *     decode-size job (at most small_rows rows), and yields at the next block boundary while one waits;
 *   - but no starvation: in a group of NB_FLOOR_MIN_TOKENS tokens or more, a slot with a prefill-size
 *     job keeps one token (its floor) while decode-size jobs wait, and one that holds none may take
 *     a free one and is the first woken by a release (seven decoding ranks on 15 tokens otherwise
 *     held a prefill at 1.3 M rows/s on the H200 machine: docs/history/benchmarks-2026-12.md, "the host stage alone");
 *   - fair: fair = ceil(tokens / active slots); a slot at its fair share takes no token while a slot
 *     below it waits, and one above it yields at a block boundary;
 *   - round robin: among waiting slots, the one served least recently goes first; once per
 *     quantum in the group (nb_quantum_ns: NB_TOKEN_TURN_NS / tokens, never below NB_QUANTUM_MIN_NS),
 *     one holder yields to a slot holding fewer tokens (so the odd token of an uneven split goes
 *     round without every holder letting go at once).
 *   - decode CPUs: where the header names D of a group's tokens for decode-size jobs (engramd
 *     --decode-cpus), a prefill-size job takes no token that would leave fewer than D free, so that
 *     many tokens are always there for a decode call.  Its CPUs go with them: each pool runs its
 *     prefill-size jobs on a crew of threads kept off the group's D decode CPUs (crew.c),
 *     so a decode call's woken workers find idle CPUs there instead of queueing behind prefill
 *     holders of equal priority (docs/history/benchmarks-2026-12.md, "Decode beside prefill ... where the wait is");
 *   - quiet spares: every decode-size job start is stamped in the group (decode_at), and the crews'
 *     spares on the decode CPUs gather nothing while the stamp is under NB_DECODE_QUIET_NS old
 *     (header flag NB_FLAG_SPARES_QUIET; budget_pool.c says why);
 * Waiters sleep on their slot's futex word (bounded: NB_WAIT_NS) and a release wakes the slot
 * that is next.  A slot that has waited NB_STARVE_NS holding nothing (a peer keeps the tokens
 * locked) gathers without a token for NB_OVERDRAFT_NS, counted: no peer stalls a rank for longer.
 * A decode-size waiter does not wait that long for a token held by a prefill crew thread
 * (crew.c) that is off its CPU: a thread at SCHED_IDLE gets almost no CPU time beside a
 * busy thread of normal priority, so it may hold its token for seconds without gathering.  Once
 * no crew thread of the holder's slot has been seen running for NB_CREW_STALL_NS, the waiter
 * gathers its job in that token's place (a stand-in, counted): no more threads run gathers than
 * there are tokens, since the one it stands in for is not running.
 *
 * The budget's units, lowest first (this header draws the layout they share): budget.c (the decision
 * lock, reading the group and deciding who is next), budget_tokens.c (taking a token and giving it
 * back), budget_open.c (mapping it, claiming a slot, forks), budget_pool.c (the pool's worker loop
 * and waiter on tokens).
 */
#ifndef ENGRAM_ENGINE_BUDGET_H
#define ENGRAM_ENGINE_BUDGET_H
#include "common.h"

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
#define NB_SWEEP_NS 2000000LL          /* ... and looks for dead slots after waiting this long */
#define NB_WAITER_SPIN_NS 100000LL     /* the job's own thread polls this long (once a chunk) before it sleeps */
#define NB_WAITER_NAP_NS 500000LL      /* ... and, asleep, looks for a free token to help on this often */
#define NB_STARVE_NS 1000000000LL      /* holding nothing this long: the tokens are kept from us */
#define NB_OVERDRAFT_NS 10000000000LL  /* then gather without tokens this long before trying again */
#define NB_GLOCK_BREAK_NS 50000000LL      /* a decision lock not had in this long is taken over, whatever it holds */
#define NB_GLOCK_BYPASS_NS 1000000000LL  /* ... and the process then decides without it this long */
#define NB_FOREIGN_NS 10000000LL       /* a token locked outside the hints is skipped this long */
#define NB_TOKEN_TURN_NS 20000000LL    /* a group of T tokens rotates one per this / T (nb_quantum_ns) */
#define NB_QUANTUM_MIN_NS 1000000LL    /* ... and never more often than this */
#define NB_QUANTUM_MIN_BLOCKS 8
#define NB_FLOOR_MIN_TOKENS 4          /* from this many tokens a group keeps one for each slot's prefill job */
#define NB_CREW_STALL_NS 3000000LL      /* a crew thread holding a token, not seen running this long, is off its CPU */
#define NB_CREW_SEEN_NS 100000LL       /* a running crew thread holding a token says so this often */
#define NB_FLAG_PREFILL_IDLE 1u        /* the header's flags: prefill-size jobs go to the pools' crews (crew.c) */
#define NB_FLAG_NO_SPARES 2u           /* ... and no crew has spares on the decode CPUs (engramd --decode-spares off) */
#define NB_FLAG_SPARES_QUIET 4u        /* ... and the spares stand aside while a rank decodes (--decode-spares quiet) */
#define NB_DECODE_QUIET_NS 100000000LL  /* a group where no decode-size job started this long is not decoding */
#define NB_DECODE_STAMP_NS 1000000LL   /* a job start moves the group's decode_at at most this often */
#define NB_NONE (-2)
#define NB_OVERDRAFT (-1)
#define NB_STAND_IN (-3)               /* a decode-size job gathered in place of a crew thread off its CPU */
#define NB_SPARE (-4)                  /* a spare of the crew, at SCHED_IDLE on the decode CPUs: gathers without a token */

typedef struct {
    uint64_t magic;
    uint32_t version, file_bytes, groups, slots, small_rows, flags;  /* flags: NB_FLAG_*, a hint to ranks, which
                                                                          take the rest from the daemon's announcement */
    uint32_t tokens[NB_MAX_GROUPS];
    uint32_t decode[NB_MAX_GROUPS];        /* of each group's tokens, those kept for decode-size jobs */
} NbHeader;

typedef struct {
    _Atomic uint32_t seq, sleepers;        /* futex word: bumped to wake this slot's waiting workers */
    _Atomic int32_t want, want_small, held, group, pid;
    _Atomic int32_t crew_held;             /* of `held`, the tokens its prefill crew holds */
    _Atomic uint64_t last_grant;           /* the group's grant number at this slot's last grant */
    _Atomic uint64_t rows, wait_ns, acquired, yields, overdraft, small_waits, small_wait_blocks_max;
    _Atomic int64_t crew_seen_at;          /* when a crew thread of it holding a token was last seen running */
    _Atomic uint64_t stand_ins;            /* its jobs gathered in place of a crew thread off its CPU */
    _Atomic int32_t standing_in;           /* ... of which gathering now */
} NbSlot;

typedef struct {
    uint64_t seq, want_mask, small_mask;   /* seq = grant number (0: never written) */
    uint16_t slot, token, held_after;
    uint8_t small, how;                    /* how: 0 a token, 1 overdraft, 2 refused by the kernel, 3 a stand-in */
} NbGrant;

typedef struct {
    _Atomic uint64_t lock, lock_count, breaks;
    _Atomic uint64_t want_mask, small_mask, holding_mask;
    _Atomic uint64_t grants, big_blocks, sweeps;
    _Atomic int32_t gathering, peak;
    _Atomic int64_t rotate_at;             /* the next quantum rotation may happen from then on */
    _Atomic int64_t decode_at;             /* CLOCK_MONOTONIC ns of the group's latest decode-size job start (0:
                                              none; zero in an older rank's pool, which never writes it) */
    uint8_t pad[256 - 9 * 8 - 8 - 8 - 8];
    _Atomic uint32_t owner[NB_MAX_TOKENS]; /* slot + 1 holding the token, 0 free (a hint) */
    NbGrant log[NB_LOG];
} NbGroup;

_Static_assert(sizeof(NbGrant) == 32, "grant record is 32 bytes");
_Static_assert(sizeof(NbSlot) <= NB_SLOT_BYTES, "slot record too large");
_Static_assert(sizeof(NbGroup) <= NB_GROUP_BYTES, "group record too large");
_Static_assert(offsetof(NbGroup, decode_at) == 88, "decode_at where budget_file.py and older ranks expect it");
_Static_assert(offsetof(NbGroup, owner) == 256, "owner hints where every rank of version 1 expects them");

typedef struct NodeBudget {
    uint8_t *map;
    int fd, group, slot, tokens, slots, small_rows;
    int decode;                            /* the header's decode tokens of our group, read at open, < tokens */
    uint32_t flags;                        /* the header's, as read at open (a peer cannot change them after) */
    uint64_t bit;
    NbGroup *g;
    NbSlot *s;
    atomic_ulong mine[NB_MAX_TOKENS / 64];  /* tokens this process holds: private, so no peer can forge it */
    _Atomic int64_t foreign_until[NB_MAX_TOKENS];
    _Atomic int64_t last_sweep, overdraft_until;
    _Atomic int64_t glock_bypass_until;    /* deciding without the group's lock until then (nb_glock_group) */
    _Atomic uint64_t glock_breaks;         /* decision locks this process took over or passed by */
    _Atomic int overdraft_now;
    _Atomic int held_here, want_here, small_here;  /* this process's own counts: what its slot should say */
    _Atomic int crew_held_here, standing_in_here;
    _Atomic int yielding;                  /* holders of this process giving a token back now */
    atomic_uint cursor;
    atomic_uint done_seq;                  /* waiters sleep on it (process-private futex) */
    atomic_int done_sleepers;
    long generation;
    atomic_int refs;
    struct NodeBudget *next_all;
} NodeBudget;

static inline NbSlot *nb_slot(const NodeBudget *b, int s) {
    return (NbSlot *)(b->map + NB_SLOTS_AT + (size_t)s * NB_SLOT_BYTES);
}

static inline long nb_futex(_Atomic uint32_t *addr, int op, uint32_t val, int64_t timeout_ns) {
    struct timespec ts = {timeout_ns / 1000000000, timeout_ns % 1000000000};
    return syscall(SYS_futex, addr, op, val, timeout_ns > 0 ? &ts : NULL, NULL, 0);
}

static inline int nb_usable(const NodeBudget *b) {
    return b->fd >= 0 && b->generation == atomic_load(&fork_generation);
}

static inline int nb_ceil_div(int a, int b) { return b > 0 ? (a + b - 1) / b : a; }
/* The bits of the budget's slots: a peer may set any bit of a mask, and those beyond `slots` are no rank's. */
static inline uint64_t nb_slots_mask(const NodeBudget *b) { return b->slots < 64 ? (1ULL << b->slots) - 1 : ~0ULL; }

int nb_ofd(int fd, int cmd, short type, off_t at);  /* a lock byte: set, cleared or tested (F_OFD_*) */

/* The group's decision lock (budget.c says when it is taken over): a key to give back, 0 without it. */
uint64_t nb_glock_group(NodeBudget *b, NbGroup *g);
void nb_gunlock_group(NbGroup *g, uint64_t mine);
static inline uint64_t nb_glock(NodeBudget *b) { return nb_glock_group(b, b->g); }
static inline void nb_gunlock(NodeBudget *b, uint64_t key) { nb_gunlock_group(b->g, key); }

/* Reading the group, and deciding (the lock held where marked in budget.c). */
int nb_held_total(const NodeBudget *b);
uint64_t nb_others_wanting(const NodeBudget *b);  /* want bits of the group's other slots (within `slots`) */
int nb_fair(const NodeBudget *b);
int64_t nb_quantum_ns(const NodeBudget *b);  /* how often the group rotates one token among waiting slots */
int nb_stalled_crew(const NodeBudget *b, int64_t now);
void nb_note_decode(NodeBudget *b, int64_t now);
int64_t nb_decode_window_end(const NodeBudget *b, int64_t now);  /* 0: no rank of the group decodes lately */
int nb_eligible(const NodeBudget *b, int small, int uncontended_only);
int nb_next_waiter(const NodeBudget *b);
void nb_wake_slot(NodeBudget *b, int s);
void nb_log(NodeBudget *b, uint64_t seq, int token, int small, int how);

/* Dead slots. */
int nb_slot_alive(const NodeBudget *b, int s);
void nb_clear_slot(NodeBudget *b, NbGroup *g, int s);

#endif
