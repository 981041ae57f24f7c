#include "cuda_memory.h"

#include <stdatomic.h>
#include <string.h>

#define TABLE_BITS 16
#define TABLE_SIZE (1u << TABLE_BITS)
#define EMPTY ((uintptr_t)0)
#define TOMBSTONE ((uintptr_t)1)

typedef struct slot {
    _Atomic uintptr_t ptr;
    _Atomic uint64_t size_bytes;
    _Atomic int32_t device;
} slot;

typedef struct device_counters {
    _Atomic int64_t allocated_bytes;
    _Atomic int64_t peak_allocated_bytes;
    _Atomic uint64_t oom_count;
    _Atomic uint64_t version; /* bumped on every change */
    _Atomic bool used;
} device_counters;

/* Zero pages until used: the table costs nothing in a process that never allocates. */
static slot table[TABLE_SIZE];
static device_counters devices[DSEC_CUDA_MAX_DEVICES];
static uint64_t reported_version[DSEC_CUDA_MAX_DEVICES]; /* the sender's own */
static _Atomic uint64_t untracked;
static _Atomic bool oom_pending;

static size_t slot_of(uintptr_t ptr)
{
    /* device pointers are at least 256-byte aligned: hash the bits that vary */
    return (size_t)(((uint64_t)(ptr >> 8) * 0x9E3779B97F4A7C15ull) >> (64 - TABLE_BITS));
}

static int clamp_device(int device)
{
    return device < 0 || device >= DSEC_CUDA_MAX_DEVICES ? 0 : device;
}

static void add_bytes(int device, int64_t delta)
{
    device_counters *counters = &devices[clamp_device(device)];
    int64_t now = atomic_fetch_add_explicit(&counters->allocated_bytes, delta,
                                            memory_order_relaxed) + delta;
    int64_t peak = atomic_load_explicit(&counters->peak_allocated_bytes, memory_order_relaxed);
    while (now > peak &&
           !atomic_compare_exchange_weak_explicit(&counters->peak_allocated_bytes, &peak, now,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
    atomic_store_explicit(&counters->used, true, memory_order_relaxed);
    atomic_fetch_add_explicit(&counters->version, 1, memory_order_release);
}

static bool table_insert(uintptr_t ptr, uint64_t size_bytes, int32_t device)
{
    size_t index = slot_of(ptr);
    for (size_t probes = 0; probes < TABLE_SIZE; probes++) {
        slot *s = &table[index];
        uintptr_t seen = atomic_load_explicit(&s->ptr, memory_order_acquire);
        while (seen == EMPTY || seen == TOMBSTONE) {
            if (atomic_compare_exchange_weak_explicit(&s->ptr, &seen, ptr, memory_order_acq_rel,
                                                      memory_order_acquire)) {
                atomic_store_explicit(&s->size_bytes, size_bytes, memory_order_release);
                atomic_store_explicit(&s->device, device, memory_order_release);
                return true;
            }
        }
        index = (index + 1) & (TABLE_SIZE - 1);
    }
    return false;
}

static bool table_remove(uintptr_t ptr, dsec_cuda_allocation *out)
{
    size_t index = slot_of(ptr);
    for (size_t probes = 0; probes < TABLE_SIZE; probes++) {
        slot *s = &table[index];
        uintptr_t seen = atomic_load_explicit(&s->ptr, memory_order_acquire);
        if (seen == EMPTY)
            return false;
        if (seen == ptr) {
            out->ptr = ptr;
            out->size_bytes = atomic_load_explicit(&s->size_bytes, memory_order_acquire);
            out->device = atomic_load_explicit(&s->device, memory_order_acquire);
            atomic_store_explicit(&s->ptr, TOMBSTONE, memory_order_release);
            return true;
        }
        index = (index + 1) & (TABLE_SIZE - 1);
    }
    return false;
}

void dsec_cuda_note_malloc(int error, void *ptr, size_t size_bytes, int device)
{
    device = clamp_device(device);
    if (error != 0) {
        if (error == DSEC_CUDA_ERROR_MEMORY_ALLOCATION) {
            device_counters *counters = &devices[device];
            atomic_fetch_add_explicit(&counters->oom_count, 1, memory_order_relaxed);
            atomic_store_explicit(&counters->used, true, memory_order_relaxed);
            atomic_fetch_add_explicit(&counters->version, 1, memory_order_release);
            atomic_store_explicit(&oom_pending, true, memory_order_release);
        }
        return;
    }
    if (ptr == NULL)
        return;
    if (!table_insert((uintptr_t)ptr, size_bytes, device)) {
        atomic_fetch_add_explicit(&untracked, 1, memory_order_relaxed);
        return;
    }
    add_bytes(device, (int64_t)size_bytes);
}

bool dsec_cuda_note_free(void *ptr, dsec_cuda_allocation *out)
{
    if (ptr == NULL || !table_remove((uintptr_t)ptr, out))
        return false;
    add_bytes(out->device, -(int64_t)out->size_bytes);
    return true;
}

void dsec_cuda_note_restore(const dsec_cuda_allocation *allocation)
{
    if (!table_insert(allocation->ptr, allocation->size_bytes, allocation->device)) {
        atomic_fetch_add_explicit(&untracked, 1, memory_order_relaxed);
        return;
    }
    add_bytes(allocation->device, (int64_t)allocation->size_bytes);
}

int dsec_cuda_changed(dsec_cuda_device_state *out, int max, bool all)
{
    int count = 0;
    for (int device = 0; device < DSEC_CUDA_MAX_DEVICES && count < max; device++) {
        device_counters *counters = &devices[device];
        if (!atomic_load_explicit(&counters->used, memory_order_relaxed))
            continue;
        uint64_t version = atomic_load_explicit(&counters->version, memory_order_acquire);
        if (!all && version == reported_version[device])
            continue;
        reported_version[device] = version;
        out[count].device_index = device;
        out[count].allocated_bytes =
            atomic_load_explicit(&counters->allocated_bytes, memory_order_relaxed);
        out[count].peak_allocated_bytes =
            atomic_load_explicit(&counters->peak_allocated_bytes, memory_order_relaxed);
        out[count].oom_count = atomic_load_explicit(&counters->oom_count, memory_order_relaxed);
        count++;
    }
    return count;
}

bool dsec_cuda_take_oom_pending(void)
{
    return atomic_exchange_explicit(&oom_pending, false, memory_order_acq_rel);
}

uint64_t dsec_cuda_untracked(void)
{
    return atomic_load_explicit(&untracked, memory_order_relaxed);
}

void dsec_cuda_reset(void)
{
    for (size_t i = 0; i < TABLE_SIZE; i++)
        atomic_store(&table[i].ptr, EMPTY);
    for (int d = 0; d < DSEC_CUDA_MAX_DEVICES; d++) {
        atomic_store(&devices[d].allocated_bytes, 0);
        atomic_store(&devices[d].peak_allocated_bytes, 0);
        atomic_store(&devices[d].oom_count, 0);
        atomic_store(&devices[d].version, 0);
        atomic_store(&devices[d].used, false);
        reported_version[d] = 0;
    }
    atomic_store(&untracked, 0);
    atomic_store(&oom_pending, false);
}
