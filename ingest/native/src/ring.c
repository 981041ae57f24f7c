#include "ring.h"

#include <stdlib.h>

dsec_ring *dsec_ring_new(size_t min_capacity)
{
    size_t capacity = 2;
    while (capacity < min_capacity)
        capacity <<= 1;
    dsec_ring *ring = aligned_alloc(64, sizeof(dsec_ring));
    if (ring == NULL)
        return NULL;
    ring->cells = calloc(capacity, sizeof(dsec_ring_cell));
    if (ring->cells == NULL) {
        free(ring);
        return NULL;
    }
    ring->mask = capacity - 1;
    for (size_t i = 0; i < capacity; i++)
        atomic_init(&ring->cells[i].seq, i);
    atomic_init(&ring->head, 0);
    atomic_init(&ring->tail, 0);
    return ring;
}

void dsec_ring_free(dsec_ring *ring)
{
    if (ring == NULL)
        return;
    free(ring->cells);
    free(ring);
}

bool dsec_ring_pop(dsec_ring *ring, dsec_record *out)
{
    size_t pos = atomic_load_explicit(&ring->tail, memory_order_relaxed);
    dsec_ring_cell *cell = &ring->cells[pos & ring->mask];
    size_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
    if (seq != pos + 1)
        return false;
    *out = cell->record;
    atomic_store_explicit(&cell->seq, pos + ring->mask + 1, memory_order_release);
    atomic_store_explicit(&ring->tail, pos + 1, memory_order_relaxed);
    return true;
}

size_t dsec_ring_size(dsec_ring *ring)
{
    size_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
    size_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    return head > tail ? head - tail : 0;
}
