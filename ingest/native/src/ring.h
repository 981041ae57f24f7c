/* A bounded multi-producer single-consumer ring of fixed-size records (Vyukov's bounded
 * queue): a producer claims a slot with one compare-and-swap and never waits; a full ring
 * refuses the record, and the caller counts it as dropped. */
#ifndef DSEC_RING_H
#define DSEC_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum dsec_record_kind { DSEC_REC_STEP = 1, DSEC_REC_EPISODE = 2, DSEC_REC_GRAD_SYNC = 3 };

/* One sample as the caller's thread records it: no formatting, no allocation.
 *   step:      i0 step, d0 loss, d1 grad_norm
 *   episode:   i0 episode index, i1 length, d0 reward
 *   grad_sync: i0 step, i1 bytes, d0 latency_ms, code the NCCL result (0: ok) */
typedef struct dsec_record {
    int64_t mono_ns; /* CLOCK_MONOTONIC; the sender turns it into epoch ms */
    int64_t i0;
    int64_t i1;
    double d0;
    double d1;
    int32_t code;
    uint8_t kind;
} dsec_record;

typedef struct dsec_ring_cell {
    _Atomic size_t seq;
    dsec_record record;
} dsec_ring_cell;

typedef struct dsec_ring {
    dsec_ring_cell *cells;
    size_t mask;
    /* apart, so that producers and the consumer do not share a cache line */
    _Alignas(64) _Atomic size_t head; /* records pushed, ever */
    _Alignas(64) _Atomic size_t tail; /* records popped, ever */
} dsec_ring;

/* A ring of at least `min_capacity` records (a power of two); NULL when out of memory. */
dsec_ring *dsec_ring_new(size_t min_capacity);
void dsec_ring_free(dsec_ring *ring);

/* Any thread; false when the ring is full (the record is not kept). */
static inline bool dsec_ring_push(dsec_ring *ring, const dsec_record *record)
{
    size_t pos = atomic_load_explicit(&ring->head, memory_order_relaxed);
    dsec_ring_cell *cell;
    for (;;) {
        cell = &ring->cells[pos & ring->mask];
        size_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        intptr_t dif = (intptr_t)seq - (intptr_t)pos;
        if (dif == 0) {
            if (atomic_compare_exchange_weak_explicit(&ring->head, &pos, pos + 1,
                                                      memory_order_relaxed,
                                                      memory_order_relaxed))
                break;
        } else if (dif < 0) {
            return false;
        } else {
            pos = atomic_load_explicit(&ring->head, memory_order_relaxed);
        }
    }
    cell->record = *record;
    atomic_store_explicit(&cell->seq, pos + 1, memory_order_release);
    return true;
}

/* The one consumer thread; false when nothing is ready (empty, or the oldest slot is
 * claimed but not yet written). */
bool dsec_ring_pop(dsec_ring *ring, dsec_record *out);

/* Records pushed and not yet popped (a moment's view). */
size_t dsec_ring_size(dsec_ring *ring);

#endif
