/* A training program that knows nothing of dsec: it allocates device memory, all-reduces
 * its gradients each step, runs out of memory once on an oversized activation buffer and
 * carries on, as a program on a full GPU does. Linked against the CUDA runtime and NCCL
 * (here their test doubles); run under LD_PRELOAD=libdsec_inject.so it is reported with
 * no change.
 *
 *     train_program STEPS GRADIENT_FLOATS OOM_BYTES
 *
 * Prints one JSON line: what it did, for the test to compare with what dsec stored. */
#include <stdio.h>
#include <stdlib.h>

#include "doubles/gpu_api.h"

int main(int argc, char **argv)
{
    int steps = argc > 1 ? atoi(argv[1]) : 20;
    size_t gradient_floats = argc > 2 ? (size_t)strtoull(argv[2], NULL, 10) : 1 << 20;
    size_t oom_bytes = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : (size_t)1 << 40;
    ncclComm_t comm;
    int devices[1] = {0};
    if (cudaSetDevice(0) != cudaSuccess || ncclCommInitAll(&comm, 1, devices) != ncclSuccess)
        return 2;
    void *weights = NULL;
    void *gradients = NULL;
    size_t gradient_bytes = gradient_floats * sizeof(float);
    if (cudaMalloc(&weights, gradient_bytes) != cudaSuccess ||
        cudaMalloc(&gradients, gradient_bytes) != cudaSuccess)
        return 3;
    int ooms = 0, all_reduces = 0, allocations = 2;
    for (int step = 0; step < steps; step++) {
        void *activations = NULL;
        size_t activation_bytes = (size_t)(step + 1) << 16;
        if (step == steps / 2)
            activation_bytes = oom_bytes; /* an oversized batch */
        cudaError_t error = cudaMalloc(&activations, activation_bytes);
        if (error == cudaErrorMemoryAllocation) {
            ooms++;
            fprintf(stderr, "step %d: out of memory, skipping the batch\n", step);
            continue;
        }
        allocations++;
        if (ncclAllReduce(gradients, gradients, gradient_floats, ncclFloat32, ncclSum, comm,
                          NULL) != ncclSuccess)
            return 4;
        all_reduces++;
        cudaFree(activations);
    }
    cudaFree(gradients);
    printf("{\"steps\": %d, \"allocations\": %d, \"ooms\": %d, \"all_reduces\": %d, "
           "\"all_reduce_bytes\": %zu, \"weights_bytes\": %zu}\n",
           steps, allocations, ooms, all_reduces, gradient_bytes, gradient_bytes);
    fflush(stdout);
    ncclCommDestroy(comm);
    /* the weights stay allocated to the end, as a model's do */
    (void)weights;
    return 0;
}
