/* Device memory as cudaMalloc/cudaFree see it: bytes in use and their peak per device,
 * and the allocations that failed for lack of memory. cudaFree names only a pointer, so
 * every live allocation's size is kept in a lock-free open-addressing table (a pointer is
 * live at most once, which is what makes insert-or-reuse and find-then-tombstone safe). */
#ifndef DSEC_CUDA_MEMORY_H
#define DSEC_CUDA_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DSEC_CUDA_MAX_DEVICES 16
#define DSEC_CUDA_ERROR_MEMORY_ALLOCATION 2 /* cudaErrorMemoryAllocation */

typedef struct dsec_cuda_allocation {
    uintptr_t ptr;
    uint64_t size_bytes;
    int32_t device;
} dsec_cuda_allocation;

typedef struct dsec_cuda_device_state {
    int32_t device_index;
    int64_t allocated_bytes;
    int64_t peak_allocated_bytes;
    uint64_t oom_count;
} dsec_cuda_device_state;

/* A cudaMalloc's outcome (`error` is its cudaError_t; 0: `ptr` of `size_bytes` is live). */
void dsec_cuda_note_malloc(int error, void *ptr, size_t size_bytes, int device);

/* Before the real cudaFree: forgets `ptr`; true (and the allocation) when it was known, so
 * that a cudaFree that fails can put it back with dsec_cuda_note_restore. */
bool dsec_cuda_note_free(void *ptr, dsec_cuda_allocation *out);
void dsec_cuda_note_restore(const dsec_cuda_allocation *allocation);

/* The devices whose state changed since the last call (all that ever allocated with
 * `all`), into `out`; returns how many. One caller: the sender. */
int dsec_cuda_changed(dsec_cuda_device_state *out, int max, bool all);

/* True once after an out-of-memory failure: the sender reports it without waiting. */
bool dsec_cuda_take_oom_pending(void);

/* Allocations the table had no room for (their frees are not seen). */
uint64_t dsec_cuda_untracked(void);

/* Test support: forgets everything. */
void dsec_cuda_reset(void);

#endif
