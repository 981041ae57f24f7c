/* ns per dsec_report_step call: the library against its no-op build (the same calls with
 * empty bodies), both loaded into this process and both reporting to a stub gateway, in
 * alternating blocks so that both see the same machine. Prints one JSON object.
 *
 *     bench_report LIBRARY NOOP_LIBRARY [CALLS_PER_BLOCK [BLOCKS]] */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../tests/http_stub.h"
#include "dsec_inject.h"

typedef int (*init_fn)(const char *, const char *);
typedef void (*step_fn)(double, double);
typedef void (*shutdown_fn)(void);
typedef void (*counters_fn)(dsec_counters *);

typedef struct library {
    init_fn init;
    step_fn report_step;
    shutdown_fn shutdown;
    counters_fn counters;
} library;

static int load(const char *path, library *out)
{
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        fprintf(stderr, "cannot load %s: %s\n", path, dlerror());
        return 0;
    }
    void *symbols[4] = {dlsym(handle, "dsec_init"), dlsym(handle, "dsec_report_step"),
                        dlsym(handle, "dsec_shutdown"), dlsym(handle, "dsec_get_counters")};
    for (int i = 0; i < 4; i++)
        if (symbols[i] == NULL)
            return 0;
    memcpy(&out->init, &symbols[0], sizeof(void *));
    memcpy(&out->report_step, &symbols[1], sizeof(void *));
    memcpy(&out->shutdown, &symbols[2], sizeof(void *));
    memcpy(&out->counters, &symbols[3], sizeof(void *));
    return 1;
}

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static double block_ns_per_call(step_fn report_step, long calls)
{
    double start = now_ns();
    for (long i = 0; i < calls; i++)
        report_step((double)i * 1e-3, 1.0);
    return (now_ns() - start) / (double)calls;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int n)
{
    qsort(values, (size_t)n, sizeof(double), by_value);
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_report LIBRARY NOOP_LIBRARY [CALLS [BLOCKS]]\n");
        return 2;
    }
    long calls = argc > 3 ? atol(argv[3]) : 100000;
    int blocks = argc > 4 ? atoi(argv[4]) : 21;
    if (calls < 1 || blocks < 1 || blocks > 1000)
        return 2;
    library real, noop;
    if (!load(argv[1], &real) || !load(argv[2], &noop))
        return 1;
    http_stub stub;
    if (!http_stub_start(&stub))
        return 1;
    char endpoint[64];
    snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%d", stub.port);
    setenv("DSEC_ENDPOINT_TOKEN", "bench-token", 1);
    if (real.init(endpoint, "bench-real") != 0 || noop.init(endpoint, "bench-noop") != 0)
        return 1;
    double *real_ns = calloc((size_t)blocks, sizeof(double));
    double *noop_ns = calloc((size_t)blocks, sizeof(double));
    block_ns_per_call(real.report_step, calls / 10 + 1); /* warm both */
    block_ns_per_call(noop.report_step, calls / 10 + 1);
    for (int b = 0; b < blocks; b++) {
        if (b % 2) {
            real_ns[b] = block_ns_per_call(real.report_step, calls);
            noop_ns[b] = block_ns_per_call(noop.report_step, calls);
        } else {
            noop_ns[b] = block_ns_per_call(noop.report_step, calls);
            real_ns[b] = block_ns_per_call(real.report_step, calls);
        }
    }
    real.shutdown();
    noop.shutdown();
    dsec_counters counters;
    real.counters(&counters);
    http_stub_stop(&stub);
    double real_median = median(real_ns, blocks), noop_median = median(noop_ns, blocks);
    printf("{\"calls_per_block\": %ld, \"blocks\": %d, \"report_step_ns\": %.1f, "
           "\"noop_ns\": %.1f, \"cost_ns\": %.1f, \"report_step_ns_min\": %.1f, "
           "\"noop_ns_min\": %.1f, \"samples_recorded\": %llu, \"samples_sent\": %llu, "
           "\"samples_dropped\": %llu}\n",
           calls, blocks, real_median, noop_median, real_median - noop_median, real_ns[0],
           noop_ns[0], (unsigned long long)counters.samples_recorded,
           (unsigned long long)counters.samples_sent,
           (unsigned long long)counters.samples_dropped);
    free(real_ns);
    free(noop_ns);
    return 0;
}
