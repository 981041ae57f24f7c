/* LD_PRELOAD mode: cudaMalloc, cudaFree and ncclAllReduce of an unchanged program, reported
 * and then handed to the real functions with the same arguments and result.
 *
 * The real function is the next definition after this library (dlsym RTLD_NEXT). A library
 * that was dlopen'ed with RTLD_LOCAL (as Python extension modules load libcudart and
 * libnccl) is not in that search, so the loaded objects are searched one by one too. */
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuda_memory.h"
#include "probe.h"
#include "ring.h"

#define API __attribute__((visibility("default")))

typedef int cudaError_t;
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef void *ncclComm_t;
typedef void *cudaStream_t;

#define CUDA_ERROR_UNKNOWN 999
#define NCCL_INTERNAL_ERROR 3

typedef struct search {
    const char *symbol;
    void *self;
    void *found;
} search;

static int search_object(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    search *wanted = arg;
    if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0')
        return 0;
    void *handle = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL)
        return 0;
    void *found = dlsym(handle, wanted->symbol);
    dlclose(handle);
    if (found == NULL || found == wanted->self)
        return 0;
    wanted->found = found;
    return 1;
}

/* The real `symbol`: not this library's own (`self`). NULL when there is none. */
static void *resolve(const char *symbol, void *self)
{
    void *found = dlsym(RTLD_NEXT, symbol);
    if (found != NULL && found != self)
        return found;
    search wanted = {.symbol = symbol, .self = self, .found = NULL};
    dl_iterate_phdr(search_object, &wanted);
    return wanted.found;
}

typedef cudaError_t (*cuda_malloc_fn)(void **, size_t);
typedef cudaError_t (*cuda_free_fn)(void *);
typedef cudaError_t (*cuda_get_device_fn)(int *);
typedef ncclResult_t (*nccl_all_reduce_fn)(const void *, void *, size_t, ncclDataType_t,
                                           ncclRedOp_t, ncclComm_t, cudaStream_t);

static void *_Atomic real_cuda_malloc;
static void *_Atomic real_cuda_free;
static void *_Atomic real_cuda_get_device;
static void *_Atomic real_nccl_all_reduce;
static _Atomic bool get_device_looked_up;

/* The real function behind `cache`, looked up once (two threads racing both find the
 * same one). */
static void *real_function(void *_Atomic *cache, const char *symbol, void *self)
{
    void *fn = atomic_load_explicit(cache, memory_order_acquire);
    if (fn == NULL) {
        fn = resolve(symbol, self);
        atomic_store_explicit(cache, fn, memory_order_release);
    }
    return fn;
}

/* Where a function of ours is, as dlsym would say (POSIX: function and object pointers
 * convert). */
#define SELF(function) ((void *)(uintptr_t)(function))

static int current_device(void)
{
    if (!atomic_load_explicit(&get_device_looked_up, memory_order_acquire)) {
        atomic_store(&real_cuda_get_device, resolve("cudaGetDevice", NULL));
        atomic_store_explicit(&get_device_looked_up, true, memory_order_release);
    }
    void *fn = atomic_load_explicit(&real_cuda_get_device, memory_order_acquire);
    if (fn == NULL)
        return 0;
    cuda_get_device_fn get_device;
    memcpy(&get_device, &fn, sizeof(get_device));
    int device = 0;
    return get_device(&device) == 0 ? device : 0;
}

API cudaError_t cudaMalloc(void **dev_ptr, size_t size)
{
    void *fn = real_function(&real_cuda_malloc, "cudaMalloc", SELF(cudaMalloc));
    if (fn == NULL)
        return CUDA_ERROR_UNKNOWN;
    cuda_malloc_fn real;
    memcpy(&real, &fn, sizeof(real));
    cudaError_t error = real(dev_ptr, size);
    if (dsec_active_probe() != NULL)
        dsec_cuda_note_malloc(error, dev_ptr != NULL ? *dev_ptr : NULL, size, current_device());
    return error;
}

API cudaError_t cudaFree(void *dev_ptr)
{
    void *fn = real_function(&real_cuda_free, "cudaFree", SELF(cudaFree));
    if (fn == NULL)
        return CUDA_ERROR_UNKNOWN;
    cuda_free_fn real;
    memcpy(&real, &fn, sizeof(real));
    /* forgotten before the real free: once freed, the same address may be handed out again
     * by another thread's cudaMalloc */
    dsec_cuda_allocation allocation;
    bool known = dsec_cuda_note_free(dev_ptr, &allocation);
    cudaError_t error = real(dev_ptr);
    if (error != 0 && known)
        dsec_cuda_note_restore(&allocation);
    return error;
}

static size_t nccl_type_bytes(ncclDataType_t type)
{
    /* ncclInt8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16,
     * Float8e4m3, Float8e5m2 */
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
    return type >= 0 && (size_t)type < sizeof(sizes) / sizeof(sizes[0]) ? sizes[type] : 0;
}

API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream)
{
    void *fn = real_function(&real_nccl_all_reduce, "ncclAllReduce", SELF(ncclAllReduce));
    if (fn == NULL)
        return NCCL_INTERNAL_ERROR;
    nccl_all_reduce_fn real;
    memcpy(&real, &fn, sizeof(real));
    dsec_probe *probe = dsec_active_probe();
    if (probe == NULL)
        return real(sendbuff, recvbuff, count, datatype, op, comm, stream);
    int64_t start_ns = dsec_mono_ns();
    ncclResult_t result = real(sendbuff, recvbuff, count, datatype, op, comm, stream);
    int64_t end_ns = dsec_mono_ns();
    dsec_record record = {
        .mono_ns = end_ns,
        .i0 = atomic_load_explicit(&probe->steps, memory_order_relaxed),
        .i1 = (int64_t)(count * nccl_type_bytes(datatype)),
        .d0 = (double)(end_ns - start_ns) / 1e6,
        .code = result,
        .kind = DSEC_REC_GRAD_SYNC,
    };
    dsec_record_push(probe, &record);
    return result;
}
