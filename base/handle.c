/* Registries of live handles: one open-addressing hash set of pointer values
 * per kind, written under one lock, read without any (base/handle.h).
 *
 * A slot holds 0 (never used), 1 (a tombstone: its handle was removed) or a
 * live handle's address. An insert takes the first empty or tombstone slot of
 * its probe sequence; a lookup walks the sequence until it finds the handle
 * or an empty slot. Slots never become empty again, so a lookup never stops
 * before a handle that is there; reusing tombstones keeps a table of constant
 * size under any churn of creations and destructions, and it only grows (to
 * twice its size, rehashed) when three quarters of it hold live handles.
 *
 * Memory ordering: the insert's release store of the address publishes the
 * slot; a reader's acquire load of the table pointer and then of the slot
 * sees it. A table replaced by a larger one is kept (tables only grow, so
 * what is kept is less than the live table's size), because a reader may
 * still be walking it; the new table is complete before its pointer is
 * published. A removal (a release store of the tombstone) that happened
 * before a lookup began is seen by it, in the table that was current then. */
#define _GNU_SOURCE
#include "base/handle.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define SLOT_EMPTY ((uintptr_t)0)
#define SLOT_TOMB ((uintptr_t)1)
#define MIN_SLOTS 64
/* Destroyed objects kept before they are freed, per queue (a kind of
 * handle): a destroyed handle's address comes back only after this many more
 * objects of its queue have been destroyed, whatever else is destroyed
 * meanwhile (a program destroying an event per step does not flush its
 * destroyed communicators). */
#define QUARANTINE 64

struct plait_handle_table *plait_handle_tables[PLAIT_HANDLE_KINDS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct plait_handle_table *retired;
static void *quarantine[PLAIT_RETIRE_QUEUES][QUARANTINE];
static size_t quarantine_next[PLAIT_RETIRE_QUEUES];

/* A forked child inherits the tables (its copies of the parent's handles stay
 * live there, for the owner checks to refuse them and destroy to free them);
 * the lock is held across fork so that the child never inherits it taken. */
static void lock_prefork(void)
{
    pthread_mutex_lock(&lock);
}

static void lock_postfork(void)
{
    pthread_mutex_unlock(&lock);
}

static void register_atfork(void)
{
    pthread_atfork(lock_prefork, lock_postfork, lock_postfork);
}

/* Into a table with a free slot (live < cap); under the lock, or before the
 * table is published. */
static void put(struct plait_handle_table *t, uintptr_t key)
{
    const size_t mask = t->cap - 1;
    size_t i = plait_handle_slot(t, key);
    while (t->slots[i] != SLOT_EMPTY && t->slots[i] != SLOT_TOMB)
        i = (i + 1) & mask;
    __atomic_store_n(&t->slots[i], key, __ATOMIC_RELEASE);
    t->live++;
}

static struct plait_handle_table *table_new(size_t cap)
{
    struct plait_handle_table *t = calloc(1, sizeof(*t) + cap * sizeof(uintptr_t));
    if (!t)
        return NULL;
    t->cap = cap;
    unsigned bits = 0;
    while (((size_t)1 << bits) < cap)
        bits++;
    t->shift = 64u - bits;
    return t;
}

int plait_handle_add(int kind, const void *h)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, register_atfork);
    const uintptr_t key = (uintptr_t)h;
    if (kind < 0 || kind >= PLAIT_HANDLE_KINDS || key <= SLOT_TOMB)
        return -1;
    pthread_mutex_lock(&lock);
    struct plait_handle_table *t = plait_handle_tables[kind];
    if (!t || (t->live + 1) * 4 > t->cap * 3) {
        struct plait_handle_table *n = table_new(t ? t->cap * 2 : MIN_SLOTS);
        if (!n) {
            pthread_mutex_unlock(&lock);
            return -1;
        }
        for (size_t i = 0; t && i < t->cap; i++)
            if (t->slots[i] > SLOT_TOMB)
                put(n, t->slots[i]);
        __atomic_store_n(&plait_handle_tables[kind], n, __ATOMIC_RELEASE);
        if (t) {
            t->retired_next = retired;
            retired = t;
        }
        t = n;
    }
    put(t, key);
    pthread_mutex_unlock(&lock);
    return 0;
}

/* The slot index of key in t, or -1; walks at most the whole table. */
static long find(const struct plait_handle_table *t, uintptr_t key)
{
    const size_t mask = t->cap - 1;
    size_t i = plait_handle_slot(t, key);
    for (size_t n = 0; n < t->cap; n++, i = (i + 1) & mask) {
        const uintptr_t k = __atomic_load_n(&t->slots[i], __ATOMIC_ACQUIRE);
        if (k == key)
            return (long)i;
        if (k == SLOT_EMPTY)
            return -1;
    }
    return -1;
}

bool plait_handle_remove(int kind, const void *h)
{
    const uintptr_t key = (uintptr_t)h;
    if (kind < 0 || kind >= PLAIT_HANDLE_KINDS || key <= SLOT_TOMB)
        return false;
    pthread_mutex_lock(&lock);
    struct plait_handle_table *t = plait_handle_tables[kind];
    long i = t ? find(t, key) : -1;
    if (i >= 0) {
        __atomic_store_n(&t->slots[i], SLOT_TOMB, __ATOMIC_RELEASE);
        t->live--;
    }
    pthread_mutex_unlock(&lock);
    return i >= 0;
}

bool plait_handle_live_probe(const struct plait_handle_table *t, uintptr_t key, size_t i)
{
    const size_t mask = t->cap - 1;
    for (size_t n = 1; n < t->cap; n++) {
        i = (i + 1) & mask;
        const uintptr_t k = __atomic_load_n(&t->slots[i], __ATOMIC_ACQUIRE);
        if (k == key)
            return true;
        if (k == SLOT_EMPTY)
            return false;
    }
    return false;
}

void plait_handle_retire(int queue, void *p)
{
    if (!p)
        return;
    if (queue < 0 || queue >= PLAIT_RETIRE_QUEUES)
        queue = PLAIT_RETIRE_OTHER;
    pthread_mutex_lock(&lock);
    void *oldest = quarantine[queue][quarantine_next[queue]];
    quarantine[queue][quarantine_next[queue]] = p;
    quarantine_next[queue] = (quarantine_next[queue] + 1) % QUARANTINE;
    pthread_mutex_unlock(&lock);
    free(oldest);
}
