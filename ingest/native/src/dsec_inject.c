/* The public calls and the probe's life: dsec_init, the report calls, dsec_shutdown, and
 * the start on first use when preloaded with DSEC_ENDPOINT set. */
#include "dsec_inject.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_memory.h"
#include "probe.h"
#include "ring.h"

#define API __attribute__((visibility("default")))

static dsec_probe *_Atomic active; /* non-NULL while reporting */
static dsec_probe *_Atomic latest; /* the last probe started: its counts outlive it */
/* Preloaded with DSEC_ENDPOINT set: start on the first report or intercepted call, so
 * that the program's child processes that never use CUDA (a shell, a compiler) inherit
 * LD_PRELOAD without registering a worker of their own. */
static _Atomic bool start_on_first_use;
static pthread_mutex_t lifecycle = PTHREAD_MUTEX_INITIALIZER;
static char last_error[512];
static dsec_probe *retired; /* under lifecycle: stopped probes, kept (see probe.h) */

static int start_locked(const char *endpoint, const char *agent_id)
{
    dsec_probe *probe = calloc(1, sizeof(dsec_probe));
    if (probe == NULL) {
        snprintf(last_error, sizeof(last_error), "out of memory");
        return DSEC_ERR_SYSTEM;
    }
    if (!dsec_config_resolve(&probe->config, endpoint, agent_id, last_error,
                             sizeof(last_error))) {
        free(probe);
        dsec_log("not reporting: %s", last_error);
        return DSEC_ERR_CONFIG;
    }
    probe->ring = dsec_ring_new(probe->config.buffer_max_samples);
    if (probe->ring == NULL || !dsec_sender_start(probe)) {
        dsec_ring_free(probe->ring);
        free(probe);
        snprintf(last_error, sizeof(last_error), "out of memory, or no thread for the sender");
        dsec_log("not reporting: %s", last_error);
        return DSEC_ERR_SYSTEM;
    }
    last_error[0] = '\0';
    atomic_store_explicit(&latest, probe, memory_order_release);
    atomic_store_explicit(&active, probe, memory_order_release);
    return DSEC_OK;
}

static dsec_probe *start_on_use(void)
{
    if (!atomic_load_explicit(&start_on_first_use, memory_order_relaxed))
        return NULL;
    pthread_mutex_lock(&lifecycle);
    if (atomic_exchange(&start_on_first_use, false))
        start_locked(NULL, NULL);
    pthread_mutex_unlock(&lifecycle);
    return atomic_load_explicit(&active, memory_order_acquire);
}

/* The probe to record into, or NULL: one load when running. Used by intercept.c too. */
dsec_probe *dsec_active_probe(void)
{
    dsec_probe *probe = atomic_load_explicit(&active, memory_order_acquire);
    if (__builtin_expect(probe != NULL, 1))
        return probe;
    return start_on_use();
}

void dsec_record_push(dsec_probe *probe, const dsec_record *record)
{
    if (!dsec_ring_push(probe->ring, record))
        atomic_fetch_add_explicit(&probe->ring_dropped, 1, memory_order_relaxed);
}

API int dsec_init(const char *endpoint, const char *agent_id)
{
    pthread_mutex_lock(&lifecycle);
    int rc = DSEC_ERR_RUNNING;
    if (atomic_load(&active) == NULL) {
        atomic_store(&start_on_first_use, false);
        rc = start_locked(endpoint, agent_id);
    } else {
        snprintf(last_error, sizeof(last_error),
                 "dsec_init was called already: dsec_shutdown() first");
    }
    pthread_mutex_unlock(&lifecycle);
    return rc;
}

#ifndef DSEC_NOOP_REPORTS
API void dsec_report_step(double loss, double grad_norm)
{
    dsec_probe *probe = dsec_active_probe();
    if (probe == NULL)
        return;
    dsec_record record = {
        .mono_ns = dsec_mono_ns(),
        .i0 = atomic_fetch_add_explicit(&probe->steps, 1, memory_order_relaxed),
        .d0 = loss,
        .d1 = grad_norm,
        .kind = DSEC_REC_STEP,
    };
    dsec_record_push(probe, &record);
}

API void dsec_report_episode_end(double reward, int64_t length)
{
    dsec_probe *probe = dsec_active_probe();
    if (probe == NULL)
        return;
    dsec_record record = {
        .mono_ns = dsec_mono_ns(),
        .i0 = atomic_fetch_add_explicit(&probe->episodes, 1, memory_order_relaxed),
        .i1 = length,
        .d0 = reward,
        .kind = DSEC_REC_EPISODE,
    };
    dsec_record_push(probe, &record);
}
#else
/* The no-op build (libdsec_inject_noop.so): the same calls doing nothing, the baseline of
 * the per-call cost benchmark. */
API void dsec_report_step(double loss, double grad_norm)
{
    (void)loss;
    (void)grad_norm;
}

API void dsec_report_episode_end(double reward, int64_t length)
{
    (void)reward;
    (void)length;
}
#endif

API void dsec_shutdown(void)
{
    pthread_mutex_lock(&lifecycle);
    atomic_store(&start_on_first_use, false);
    dsec_probe *probe = atomic_exchange(&active, NULL);
    if (probe != NULL) {
        dsec_sender_stop(probe);
        probe->retired_next = retired;
        retired = probe;
    }
    pthread_mutex_unlock(&lifecycle);
}

API void dsec_get_counters(dsec_counters *out)
{
    memset(out, 0, sizeof(*out));
    dsec_probe *probe = atomic_load_explicit(&latest, memory_order_acquire);
    if (probe == NULL)
        return;
    uint64_t popped = atomic_load(&probe->ring->tail);
    uint64_t pushed = atomic_load(&probe->ring->head);
    uint64_t ring_dropped = atomic_load(&probe->ring_dropped);
    out->samples_sent = atomic_load(&probe->sent);
    out->samples_dropped = ring_dropped + atomic_load(&probe->sender_dropped);
    out->samples_buffered = (pushed > popped ? pushed - popped : 0) + atomic_load(&probe->pending);
    out->samples_recorded = pushed + ring_dropped + atomic_load(&probe->own_recorded);
    out->messages_failed = atomic_load(&probe->messages_failed);
}

API const char *dsec_last_error(void)
{
    return last_error;
}

/* A forked child is not this worker, and the sender thread did not come with it. */
static void in_child_after_fork(void)
{
    atomic_store(&active, NULL);
    atomic_store(&start_on_first_use, false);
    pthread_mutex_init(&lifecycle, NULL);
}

__attribute__((constructor)) static void on_load(void)
{
    pthread_atfork(NULL, NULL, in_child_after_fork);
    const char *endpoint = getenv("DSEC_ENDPOINT");
    if (endpoint != NULL && endpoint[0] != '\0')
        atomic_store(&start_on_first_use, true);
}

__attribute__((destructor)) static void on_unload(void)
{
    dsec_shutdown();
}
