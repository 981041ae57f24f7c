/* The CUDA runtime and NCCL calls the test program makes, with their real signatures (as
 * cuda_runtime_api.h and nccl.h declare them): what the test doubles export and what
 * libdsec_inject.so intercepts. */
#ifndef DSEC_TESTDOUBLE_GPU_API_H
#define DSEC_TESTDOUBLE_GPU_API_H

#include <stddef.h>

typedef int cudaError_t; /* enum cudaError */
#define cudaSuccess 0
#define cudaErrorMemoryAllocation 2

cudaError_t cudaMalloc(void **devPtr, size_t size);
cudaError_t cudaFree(void *devPtr);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);

typedef struct ncclComm *ncclComm_t;
typedef struct CUstream_st *cudaStream_t;
typedef enum { ncclSuccess = 0, ncclInvalidArgument = 4 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclInt32 = 2, ncclFloat16 = 6, ncclFloat32 = 7,
               ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0 } ncclRedOp_t;

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);

#endif
