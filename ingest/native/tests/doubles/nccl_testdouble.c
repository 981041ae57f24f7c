/* libnccl_testdouble.so: a test double of NCCL's all-reduce for one process: the result is
 * the input (a world of one), after NCCL_TESTDOUBLE_LATENCY_US (default 200) of wire time.
 * A null communicator is ncclInvalidArgument, as in NCCL. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_api.h"

struct ncclComm {
    int device;
};

static struct ncclComm comms_made[8];

static size_t type_bytes(ncclDataType_t type)
{
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    return (size_t)type < sizeof(sizes) / sizeof(sizes[0]) ? sizes[type] : 0;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (comms == NULL || ndev < 1 || ndev > 8)
        return ncclInvalidArgument;
    for (int i = 0; i < ndev; i++) {
        comms_made[i].device = devlist != NULL ? devlist[i] : i;
        comms[i] = &comms_made[i];
    }
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    return comm == NULL ? ncclInvalidArgument : ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    (void)op;
    (void)stream;
    if (comm == NULL || sendbuff == NULL || recvbuff == NULL)
        return ncclInvalidArgument;
    if (sendbuff != recvbuff)
        memmove(recvbuff, sendbuff, count * type_bytes(datatype));
    const char *text = getenv("NCCL_TESTDOUBLE_LATENCY_US");
    long latency_us = text != NULL ? strtol(text, NULL, 10) : 200;
    struct timespec wire = {.tv_sec = latency_us / 1000000,
                            .tv_nsec = (latency_us % 1000000) * 1000};
    nanosleep(&wire, NULL);
    return ncclSuccess;
}
