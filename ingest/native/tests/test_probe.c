/* The library as a program uses it: dsec_init, reports, dsec_shutdown against the stub
 * gateway; a gateway that is not there; and the intercepted CUDA and NCCL calls (this test
 * binary defines them, as the preloaded library does, before the test doubles). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/cuda_memory.h"
#include "../src/probe.h"
#include "dsec_inject.h"
#include "doubles/gpu_api.h"
#include "http_stub.h"
#include "runner.h"

static http_stub stub;

static void stub_endpoint(char *out, size_t cap)
{
    snprintf(out, cap, "http://127.0.0.1:%d", stub.port);
}

static bool counts_balance(const dsec_counters *c)
{
    return c->samples_recorded == c->samples_sent + c->samples_buffered + c->samples_dropped;
}

TEST(reports_reach_the_gateway_and_every_sample_is_accounted_for)
{
    char endpoint[64];
    stub_endpoint(endpoint, sizeof(endpoint));
    long samples_before = atomic_load(&stub.samples);
    CHECK(dsec_init(endpoint, "agent-7") == DSEC_OK);
    CHECK(dsec_init(endpoint, "agent-7") == DSEC_ERR_RUNNING);
    for (int i = 0; i < 1000; i++)
        dsec_report_step(1.0 / (i + 1), i % 7 ? 0.5 : NAN);
    for (int i = 0; i < 10; i++)
        dsec_report_episode_end(i * 1.5, 100 + i);
    dsec_report_episode_end(NAN, 3); /* refused by the schema: dropped, counted */
    dsec_shutdown();
    dsec_shutdown(); /* twice is fine */
    dsec_counters c;
    dsec_get_counters(&c);
    CHECK(counts_balance(&c));
    CHECK(c.samples_dropped == 1 && c.samples_buffered == 0 && c.messages_failed == 0);
    CHECK(c.samples_recorded >= 1000 + 11 + 1); /* and the heartbeats, the last at least */
    CHECK(atomic_load(&stub.samples) - samples_before == (long)c.samples_sent);
    CHECK(atomic_load(&stub.registrations) >= 1);
    CHECK(atomic_load(&stub.last_had_heartbeat)); /* the last batch: the final counts */
}

static double elapsed_ns(struct timespec a, struct timespec b)
{
    return (double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec);
}

TEST(a_gateway_away_costs_samples_not_time)
{
    setenv("DSEC_PROBE_BUFFER_MAX_SAMPLES", "1024", 1);
    setenv("DSEC_PROBE_SHUTDOWN_FLUSH_TIMEOUT_S", "0.5", 1);
    CHECK(dsec_init("http://127.0.0.1:1", "agent-away") == DSEC_OK);
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (int i = 0; i < 100000; i++)
        dsec_report_step(1.0, 1.0);
    clock_gettime(CLOCK_MONOTONIC, &end);
    dsec_shutdown();
    unsetenv("DSEC_PROBE_BUFFER_MAX_SAMPLES");
    unsetenv("DSEC_PROBE_SHUTDOWN_FLUSH_TIMEOUT_S");
    dsec_counters c;
    dsec_get_counters(&c);
    CHECK(counts_balance(&c));
    CHECK(c.samples_sent == 0);
    CHECK(c.samples_dropped >= 100000 - 1024);
    /* generous: the calls never wait for the network (sanitizers slow them ~10x) */
    CHECK(elapsed_ns(start, end) / 100000 < 5000);
}

TEST(bad_configuration_is_refused_and_reports_do_nothing)
{
    CHECK(dsec_init("https://gateway:8443", "agent-7") == DSEC_ERR_CONFIG);
    CHECK(strstr(dsec_last_error(), "http://") != NULL);
    dsec_report_step(1.0, 1.0); /* nothing running: no effect, no crash */
    CHECK(dsec_init("http://gateway:8080", "not an id") == DSEC_ERR_CONFIG);
}

TEST(intercepted_calls_are_reported_and_answered_by_the_real_functions)
{
    char endpoint[64];
    stub_endpoint(endpoint, sizeof(endpoint));
    dsec_cuda_reset();
    long all_reduces_before = atomic_load(&stub.all_reduce_samples);
    setenv("DSEC_PROBE_CUDA_MEMORY_INTERVAL_S", "0.001", 1);
    CHECK(dsec_init(endpoint, "agent-gpu") == DSEC_OK);
    unsetenv("DSEC_PROBE_CUDA_MEMORY_INTERVAL_S");
    void *a = NULL, *b = NULL, *huge = (void *)1;
    CHECK(cudaSetDevice(2) == cudaSuccess);
    CHECK(cudaMalloc(&a, 1 << 20) == cudaSuccess && a != NULL);
    CHECK(cudaMalloc(&b, 1 << 10) == cudaSuccess);
    CHECK(cudaMalloc(&huge, (size_t)1 << 50) == cudaErrorMemoryAllocation && huge == NULL);
    CHECK(cudaFree(a) == cudaSuccess);
    ncclComm_t comm;
    int devices[1] = {2};
    CHECK(ncclCommInitAll(&comm, 1, devices) == ncclSuccess);
    CHECK(ncclAllReduce(b, b, 256, ncclFloat32, ncclSum, comm, NULL) == ncclSuccess);
    CHECK(ncclAllReduce(b, b, 256, ncclFloat32, ncclSum, NULL, NULL) == ncclInvalidArgument);
    dsec_cuda_device_state states[DSEC_CUDA_MAX_DEVICES];
    CHECK(dsec_cuda_changed(states, DSEC_CUDA_MAX_DEVICES, true) == 1);
    CHECK(states[0].device_index == 2 && states[0].allocated_bytes == 1 << 10);
    CHECK(states[0].peak_allocated_bytes == (1 << 20) + (1 << 10) && states[0].oom_count == 1);
    dsec_shutdown();
    dsec_counters c;
    dsec_get_counters(&c);
    CHECK(counts_balance(&c) && c.samples_dropped == 0);
    CHECK(atomic_load(&stub.all_reduce_samples) - all_reduces_before == 2);
    CHECK(atomic_load(&stub.last_had_heartbeat));
    CHECK(cudaFree(b) == cudaSuccess);
    dsec_cuda_reset();
}

void probe_tests(void)
{
    if (!http_stub_start(&stub)) {
        printf("FAIL http stub did not start\n");
        tests_failed++;
        return;
    }
    setenv("DSEC_PROBE_FLUSH_INTERVAL_S", "0.01", 1);
    RUN(reports_reach_the_gateway_and_every_sample_is_accounted_for);
    RUN(a_gateway_away_costs_samples_not_time);
    RUN(bad_configuration_is_refused_and_reports_do_nothing);
    RUN(intercepted_calls_are_reported_and_answered_by_the_real_functions);
    unsetenv("DSEC_PROBE_FLUSH_INTERVAL_S");
    http_stub_stop(&stub);
}
