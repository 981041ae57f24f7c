#include <pthread.h>
#include <stdint.h>

#include "../src/cuda_memory.h"
#include "runner.h"

static dsec_cuda_device_state state_of(int device)
{
    dsec_cuda_device_state states[DSEC_CUDA_MAX_DEVICES];
    int n = dsec_cuda_changed(states, DSEC_CUDA_MAX_DEVICES, true);
    for (int i = 0; i < n; i++)
        if (states[i].device_index == device)
            return states[i];
    return (dsec_cuda_device_state){.device_index = -1};
}

TEST(allocations_frees_and_peak_per_device)
{
    dsec_cuda_reset();
    dsec_cuda_note_malloc(0, (void *)0x10000, 1000, 0);
    dsec_cuda_note_malloc(0, (void *)0x20000, 500, 0);
    dsec_cuda_note_malloc(0, (void *)0x30000, 7, 3);
    dsec_cuda_allocation freed;
    CHECK(dsec_cuda_note_free((void *)0x10000, &freed) && freed.size_bytes == 1000);
    CHECK(!dsec_cuda_note_free((void *)0x10000, &freed)); /* twice: unknown now */
    CHECK(!dsec_cuda_note_free((void *)0x99900, &freed)); /* never seen */
    dsec_cuda_device_state states[DSEC_CUDA_MAX_DEVICES];
    CHECK(dsec_cuda_changed(states, DSEC_CUDA_MAX_DEVICES, false) == 2);
    CHECK(dsec_cuda_changed(states, DSEC_CUDA_MAX_DEVICES, false) == 0); /* nothing new */
    dsec_cuda_device_state zero = state_of(0);
    CHECK(zero.allocated_bytes == 500 && zero.peak_allocated_bytes == 1500);
    CHECK(state_of(3).allocated_bytes == 7);
}

TEST(out_of_memory_is_counted_and_flagged_once)
{
    dsec_cuda_reset();
    CHECK(!dsec_cuda_take_oom_pending());
    dsec_cuda_note_malloc(DSEC_CUDA_ERROR_MEMORY_ALLOCATION, NULL, 1ull << 40, 1);
    dsec_cuda_note_malloc(1 /* invalid value: not an OOM */, NULL, 8, 1);
    CHECK(dsec_cuda_take_oom_pending());
    CHECK(!dsec_cuda_take_oom_pending());
    dsec_cuda_device_state one = state_of(1);
    CHECK(one.oom_count == 1 && one.allocated_bytes == 0);
}

TEST(a_failed_free_puts_the_allocation_back)
{
    dsec_cuda_reset();
    dsec_cuda_note_malloc(0, (void *)0x40000, 4096, 0);
    dsec_cuda_allocation freed;
    CHECK(dsec_cuda_note_free((void *)0x40000, &freed));
    dsec_cuda_note_restore(&freed);
    CHECK(state_of(0).allocated_bytes == 4096);
    CHECK(dsec_cuda_note_free((void *)0x40000, &freed));
    CHECK(state_of(0).allocated_bytes == 0);
}

#define THREADS 4
#define ROUNDS 20000

static void *churn(void *arg)
{
    uintptr_t base = (uintptr_t)arg;
    dsec_cuda_allocation freed;
    for (uintptr_t i = 0; i < ROUNDS; i++) {
        void *ptr = (void *)(base + (i % 64) * 512);
        dsec_cuda_note_malloc(0, ptr, 512, 0);
        dsec_cuda_note_free(ptr, &freed);
    }
    return NULL;
}

TEST(concurrent_allocations_balance_out)
{
    dsec_cuda_reset();
    pthread_t threads[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        pthread_create(&threads[i], NULL, churn, (void *)((i + 1) << 24));
    for (int i = 0; i < THREADS; i++)
        pthread_join(threads[i], NULL);
    dsec_cuda_device_state zero = state_of(0);
    CHECK(zero.allocated_bytes == 0);
    CHECK(zero.peak_allocated_bytes >= 512 && zero.peak_allocated_bytes <= THREADS * 512);
    CHECK(dsec_cuda_untracked() == 0);
}

void cuda_memory_tests(void)
{
    RUN(allocations_frees_and_peak_per_device);
    RUN(out_of_memory_is_counted_and_flagged_once);
    RUN(a_failed_free_puts_the_allocation_back);
    RUN(concurrent_allocations_balance_out);
    dsec_cuda_reset();
}
