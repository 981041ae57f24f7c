#include <pthread.h>
#include <stdlib.h>

#include "../src/ring.h"
#include "runner.h"

TEST(ring_keeps_order_and_refuses_when_full)
{
    dsec_ring *ring = dsec_ring_new(5); /* rounded up to 8 */
    CHECK(ring != NULL && ring->mask == 7);
    dsec_record record = {.kind = DSEC_REC_STEP};
    for (int i = 0; i < 8; i++) {
        record.i0 = i;
        CHECK(dsec_ring_push(ring, &record));
    }
    record.i0 = 8;
    CHECK(!dsec_ring_push(ring, &record));
    CHECK(dsec_ring_size(ring) == 8);
    dsec_record out;
    for (int i = 0; i < 8; i++) {
        CHECK(dsec_ring_pop(ring, &out));
        CHECK(out.i0 == i);
    }
    CHECK(!dsec_ring_pop(ring, &out));
    CHECK(dsec_ring_push(ring, &record)); /* room again after the pops */
    dsec_ring_free(ring);
}

#define PRODUCERS 4
#define PER_PRODUCER 200000

typedef struct producer {
    dsec_ring *ring;
    int id;
    long dropped;
} producer;

static _Atomic int finished;

static void *produce(void *arg)
{
    producer *p = arg;
    dsec_record record = {.kind = DSEC_REC_STEP, .code = p->id};
    for (long i = 0; i < PER_PRODUCER; i++) {
        record.i0 = i;
        if (!dsec_ring_push(p->ring, &record))
            p->dropped++;
    }
    atomic_fetch_add(&finished, 1);
    return NULL;
}

TEST(ring_under_concurrent_producers_loses_nothing_it_accepted)
{
    dsec_ring *ring = dsec_ring_new(1024);
    atomic_store(&finished, 0);
    pthread_t threads[PRODUCERS];
    producer producers[PRODUCERS];
    for (int i = 0; i < PRODUCERS; i++) {
        producers[i] = (producer){.ring = ring, .id = i};
        pthread_create(&threads[i], NULL, produce, &producers[i]);
    }
    long popped = 0;
    long last[PRODUCERS] = {-1, -1, -1, -1};
    int out_of_order = 0;
    dsec_record out;
    for (;;) {
        bool done = atomic_load(&finished) == PRODUCERS; /* read before the last pop */
        if (dsec_ring_pop(ring, &out)) {
            popped++;
            out_of_order += out.i0 <= last[out.code];
            last[out.code] = out.i0;
        } else if (done) {
            break;
        }
    }
    for (int i = 0; i < PRODUCERS; i++)
        pthread_join(threads[i], NULL);
    long dropped = 0;
    for (int i = 0; i < PRODUCERS; i++)
        dropped += producers[i].dropped;
    CHECK(out_of_order == 0); /* each producer's records come out in its order */
    CHECK(popped + dropped == (long)PRODUCERS * PER_PRODUCER);
    CHECK(popped == (long)atomic_load(&ring->head));
    dsec_ring_free(ring);
}

void ring_tests(void)
{
    RUN(ring_keeps_order_and_refuses_when_full);
    RUN(ring_under_concurrent_producers_loses_nothing_it_accepted);
}
