/* The node budget in a process: mapping it, claiming a slot, forks, letting go (budget.h draws
 * the layout and the rules).
 *
 * Owns: every budget this process opened (nb_all, for the fork handler) and its descriptor, whose
 * locks are its tokens and its slot.  May call: budget.c.  Must never: let a forked child keep the
 * parent's open file description (its locks would outlive the parent), or believe the header over
 * what the daemon announced.  nb_open runs with the GIL held and raises; nb_unref may run off it.
 */
#include "budget_open.h"

static NodeBudget *nb_all;                 /* every budget of this process, for the fork handler */
static pthread_mutex_t nb_all_lock = PTHREAD_MUTEX_INITIALIZER;

static void nb_after_fork_in_child(void) {
    /* The child must not keep the parent's open file description (its locks) alive: close it here,
     * where the child runs alone.  Its mapping stays, unused (the child's pools refuse to run). */
    for (NodeBudget *b = nb_all; b; b = b->next_all)
        if (b->fd >= 0) {
            close(b->fd);
            b->fd = -1;
        }
}

void nb_unref(NodeBudget *b) {
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

/* Map the budget behind fd (a descriptor of its own, duplicated here) and claim a slot.  What the
 * daemon announced (group, tokens, slots, small_rows; 0: the header's) is the truth: the header lies
 * in memory every rank may write, so only what the kernel says of the file (size, seals) refuses
 * it, and a peer's write over the header changes no rank's seat.  Its flags are read as a hint. */
NodeBudget *nb_open(int fd_in, int group, int tokens, int slots, int small_rows) {
    static int atfork_done;
    int fd = fcntl(fd_in, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return (NodeBudget *)PyErr_SetFromErrno(PyExc_OSError);
    struct stat st;
    int seals = fcntl(fd, F_GET_SEALS);
    const char *why = NULL;
    if (fstat(fd, &st) || !S_ISREG(st.st_mode) || st.st_size < NB_FILE_BYTES) why = "is not a budget of the right size";
    else if (seals < 0 || !(seals & F_SEAL_SHRINK)) why = "is not sealed against shrinking (a peer could truncate it under us)";
    else if (group < 0 || group >= NB_MAX_GROUPS || slots < 1 || slots > NB_MAX_SLOTS || tokens < 1 ||
             tokens > NB_MAX_TOKENS || small_rows < 0)
        why = "was announced with a group, tokens, slots or small rows out of range";
    void *map = why ? MAP_FAILED : mmap(NULL, NB_FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!why && map == MAP_FAILED) why = "cannot be mapped";
    const NbHeader *h = map == MAP_FAILED ? NULL : map;
    if (!why && !small_rows && (small_rows = (int)h->small_rows) < 1)
        why = "has no size of a decode-size job in its header (pass the one the daemon announced)";
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
    b->small_rows = small_rows;
    b->flags = h->flags;
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
        PyErr_Format(err_class(), "every one of the budget's %d slots is locked (by live ranks, or by a peer "
                     "holding their lock bytes)", slots);
        return NULL;
    }
    b->bit = 1ULL << b->slot;
    b->s = nb_slot(b, b->slot);
    int previous = atomic_load(&b->s->group);  /* a dead owner's hints, in whichever group it was */
    for (int g = 0; g < NB_MAX_GROUPS; g++)
        if (g == previous || g == group) {
            NbGroup *other = (NbGroup *)(b->map + NB_GROUPS_AT + (size_t)g * NB_GROUP_BYTES);
            uint64_t key = nb_glock_group(b, other);
            nb_clear_slot(b, other, b->slot);
            nb_gunlock_group(other, key);
        }
    atomic_store(&b->s->group, group), atomic_store(&b->s->pid, getpid()), atomic_store(&b->s->last_grant, 0);
    atomic_store(&b->s->rows, 0), atomic_store(&b->s->wait_ns, 0), atomic_store(&b->s->acquired, 0);
    atomic_store(&b->s->yields, 0), atomic_store(&b->s->overdraft, 0), atomic_store(&b->s->small_waits, 0);
    atomic_store(&b->s->small_wait_blocks_max, 0), atomic_store(&b->s->stand_ins, 0);
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
