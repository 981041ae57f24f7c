/* libcudart_testdouble.so: a test double of the CUDA runtime's allocator for a machine
 * without a GPU. "Device" memory is host memory; the device has
 * CUDART_TESTDOUBLE_CAPACITY_BYTES (default 1 GiB), and an allocation beyond it fails with
 * cudaErrorMemoryAllocation, as a full GPU does. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_api.h"

#define HEADER_BYTES 256 /* device pointers are 256-byte aligned */

static _Atomic size_t used_bytes;
static _Thread_local int current_device;

static size_t capacity_bytes(void)
{
    const char *text = getenv("CUDART_TESTDOUBLE_CAPACITY_BYTES");
    return text != NULL ? (size_t)strtoull(text, NULL, 10) : (size_t)1 << 30;
}

cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    if (devPtr == NULL)
        return 1; /* cudaErrorInvalidValue */
    size_t before = atomic_fetch_add(&used_bytes, size);
    if (before + size > capacity_bytes()) {
        atomic_fetch_sub(&used_bytes, size);
        *devPtr = NULL;
        return cudaErrorMemoryAllocation;
    }
    void *base = NULL;
    if (posix_memalign(&base, HEADER_BYTES, HEADER_BYTES + size) != 0) {
        atomic_fetch_sub(&used_bytes, size);
        return cudaErrorMemoryAllocation;
    }
    memcpy(base, &size, sizeof(size));
    *devPtr = (char *)base + HEADER_BYTES;
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr)
{
    if (devPtr == NULL)
        return cudaSuccess;
    char *base = (char *)devPtr - HEADER_BYTES;
    size_t size;
    memcpy(&size, base, sizeof(size));
    atomic_fetch_sub(&used_bytes, size);
    free(base);
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device > 7)
        return 101; /* cudaErrorInvalidDevice */
    current_device = device;
    return cudaSuccess;
}
