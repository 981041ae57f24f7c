/* The background thread: every flush interval it drains the ring into batches, adds CUDA
 * memory and heartbeat samples when due, and posts each batch to the ingest gateway. The
 * batch being sent is kept until the gateway takes it (so a gateway away for a while costs
 * samples only once the ring is full, and those are counted); a batch the gateway refuses
 * for its content is dropped and counted. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "batch.h"
#include "buf.h"
#include "cuda_memory.h"
#include "http.h"
#include "probe.h"

#define BACKOFF_MIN_S 0.1
#define BACKOFF_MAX_S 5.0
#define REGISTRATION_REFUSED_RETRY_S 30.0

int64_t dsec_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t epoch_offset_ns(void)
{
    struct timespec real;
    clock_gettime(CLOCK_REALTIME, &real);
    return (int64_t)real.tv_sec * 1000000000 + real.tv_nsec - dsec_mono_ns();
}

void dsec_log(const char *format, ...)
{
    char line[768];
    va_list args;
    va_start(args, format);
    vsnprintf(line, sizeof(line), format, args);
    va_end(args);
    fprintf(stderr, "dsec: %s\n", line);
}

typedef struct sender {
    dsec_probe *probe;
    dsec_http http;
    char token[512];
    bool registered;
    char problem[1024]; /* the last failure logged, so that a lasting one is logged once */
    double backoff_s;
    int64_t retry_at_ns;
    int64_t next_heartbeat_ns;
    bool heartbeat_forced;
    int64_t next_cuda_ns;
    char id_prefix[17];
    uint64_t batches;
    /* the batch being sent */
    dsec_record *records;
    size_t record_count;
    size_t sample_count; /* records + the sender's own samples */
    char batch_id[40];
    bool pending;
    dsec_batch_state batch_state;
    dsec_buf body;
    dsec_buf response;
    char metrics_path[DSEC_ID_MAX + 32];
} sender;

static void note_problem(sender *s, const char *problem)
{
    if (strcmp(s->problem, problem) != 0) {
        dsec_log("%s", problem);
        snprintf(s->problem, sizeof(s->problem), "%s", problem);
    }
}

static void note_recovery(sender *s)
{
    if (s->problem[0] != '\0') {
        dsec_log("reporting to %s again", s->probe->config.endpoint);
        s->problem[0] = '\0';
    }
    s->backoff_s = 0;
}

static void back_off(sender *s, double at_least_s)
{
    s->backoff_s = s->backoff_s <= 0 ? BACKOFF_MIN_S : s->backoff_s * 2;
    if (s->backoff_s > BACKOFF_MAX_S)
        s->backoff_s = BACKOFF_MAX_S;
    double wait_s = s->backoff_s > at_least_s ? s->backoff_s : at_least_s;
    s->retry_at_ns = dsec_mono_ns() + (int64_t)(wait_s * 1e9);
}

static bool do_register(sender *s)
{
    const dsec_config *config = &s->probe->config;
    dsec_buf body = {0};
    dsec_buf_puts(&body, "{\"runtime_id\":");
    dsec_buf_json_string(&body, config->worker_id);
    dsec_buf_puts(&body, ",\"runtime_type\":\"dsec-native\",\"concurrency\":1,"
                         "\"mean_call_latency_ms\":0,\"function_calling\":false,\"node_id\":");
    dsec_buf_json_string(&body, config->node_id);
    if (config->job_id[0] != '\0') {
        dsec_buf_puts(&body, ",\"job_id\":");
        dsec_buf_json_string(&body, config->job_id);
    }
    dsec_buf_putc(&body, '}');
    char error[256] = "";
    int status = body.failed ? -1
                             : dsec_http_post(&s->http, "/v1/runtimes", s->token, body.data,
                                              body.len, &s->response, error, sizeof(error));
    dsec_buf_free(&body);
    char problem[1024];
    if (status == 201) {
        if (!dsec_json_find_string(s->response.data, "token", s->token, sizeof(s->token))) {
            note_problem(s, "the gateway registered this worker but sent no token");
            back_off(s, REGISTRATION_REFUSED_RETRY_S);
            return false;
        }
        s->registered = true;
        return true;
    }
    if (status == 200) { /* the token was this runtime's own: keep it */
        s->registered = true;
        return true;
    }
    if (status < 0) {
        snprintf(problem, sizeof(problem), "gateway %.256s unreachable: %s", config->endpoint,
                 error);
        note_problem(s, problem);
        back_off(s, 0);
        return false;
    }
    if (status == 409)
        snprintf(problem, sizeof(problem),
                 "worker %s is registered already: give it its own runtime token in "
                 "DSEC_ENDPOINT_TOKEN (the enrolment token registers a new worker only)",
                 config->worker_id);
    else
        snprintf(problem, sizeof(problem), "the gateway refused to register worker %s: HTTP %d %.200s",
                 config->worker_id, status, s->response.data ? s->response.data : "");
    note_problem(s, problem);
    back_off(s, status == 429 || status >= 500 ? 0 : REGISTRATION_REFUSED_RETRY_S);
    return false;
}

static bool build_batch(sender *s)
{
    dsec_probe *probe = s->probe;
    const dsec_config *config = &probe->config;
    int64_t now_ns = dsec_mono_ns();
    int64_t offset_ns = epoch_offset_ns();
    dsec_cuda_device_state cuda[DSEC_CUDA_MAX_DEVICES];
    size_t cuda_count = 0;
    bool oom = dsec_cuda_take_oom_pending();
    if (config->cuda_memory_interval_s > 0 && (oom || now_ns >= s->next_cuda_ns)) {
        cuda_count = (size_t)dsec_cuda_changed(cuda, DSEC_CUDA_MAX_DEVICES, false);
        s->next_cuda_ns = now_ns + (int64_t)(config->cuda_memory_interval_s * 1e9);
    }
    bool heartbeat_due = s->heartbeat_forced || now_ns >= s->next_heartbeat_ns;
    size_t room = config->max_samples_per_message - cuda_count - (heartbeat_due ? 1 : 0);
    size_t count = 0;
    dsec_record record;
    while (count < room && dsec_ring_pop(probe->ring, &record)) {
        if (!dsec_record_valid(&record)) {
            atomic_fetch_add(&probe->sender_dropped, 1);
            continue;
        }
        s->records[count++] = record;
    }
    /* The heartbeat goes after the backlog, with the counts as they are then; a backlog
     * that never ends (a loop recording faster than the gateway takes) still gets one
     * every two intervals. */
    int64_t overdue_ns = (int64_t)(config->heartbeat_interval_s * 1e9);
    if (heartbeat_due && count == room && !s->heartbeat_forced &&
        now_ns < s->next_heartbeat_ns + overdue_ns)
        heartbeat_due = false;
    size_t own = cuda_count + (heartbeat_due ? 1 : 0);
    if (count == 0 && own == 0)
        return false;
    atomic_fetch_add(&probe->own_recorded, own);
    atomic_store(&probe->pending, count + own);
    dsec_heartbeat heartbeat;
    if (heartbeat_due) {
        s->heartbeat_forced = false;
        s->next_heartbeat_ns = now_ns + (int64_t)(config->heartbeat_interval_s * 1e9);
        /* the heartbeat is in this batch: recorded and buffered count it */
        size_t pushed = atomic_load(&probe->ring->head);
        size_t popped = atomic_load(&probe->ring->tail);
        heartbeat = (dsec_heartbeat){
            .event_time_ms = (now_ns + offset_ns) / 1000000,
            .interval_s = config->heartbeat_interval_s,
            .step = atomic_load_explicit(&probe->steps, memory_order_relaxed),
            .samples_sent = atomic_load(&probe->sent),
            .samples_buffered = pushed - popped + count + own,
            .samples_dropped =
                atomic_load(&probe->ring_dropped) + atomic_load(&probe->sender_dropped),
            .samples_recorded =
                pushed + atomic_load(&probe->ring_dropped) + atomic_load(&probe->own_recorded),
            .messages_failed = atomic_load(&probe->messages_failed),
        };
    }
    s->batches++;
    snprintf(s->batch_id, sizeof(s->batch_id), "%s%016llx", s->id_prefix,
             (unsigned long long)s->batches);
    dsec_batch_input input = {
        .records = s->records, .record_count = count, .cuda = cuda, .cuda_count = cuda_count,
        .cuda_event_time_ms = (now_ns + offset_ns) / 1000000,
        .heartbeat = heartbeat_due ? &heartbeat : NULL, .epoch_offset_ns = offset_ns,
        .batch_id = s->batch_id,
    };
    s->record_count = count;
    s->sample_count = count + own;
    s->pending = true;
    if (!dsec_batch_encode(&input, &s->batch_state, &s->body)) {
        note_problem(s, "out of memory encoding a batch: dropped");
        atomic_fetch_add(&probe->sender_dropped, s->sample_count);
        atomic_fetch_add(&probe->messages_failed, 1);
        atomic_store(&probe->pending, 0);
        s->pending = false;
    }
    return true;
}

static void settle(sender *s, bool sent)
{
    dsec_probe *probe = s->probe;
    if (sent) {
        atomic_fetch_add(&probe->sent, s->sample_count);
    } else {
        atomic_fetch_add(&probe->sender_dropped, s->sample_count);
        atomic_fetch_add(&probe->messages_failed, 1);
    }
    atomic_store(&probe->pending, 0);
    s->pending = false;
}

/* Sends the pending batch; true when the next one may follow now. */
static bool post_pending(sender *s)
{
    char error[256] = "";
    int status = dsec_http_post(&s->http, s->metrics_path, s->token, s->body.data, s->body.len,
                                &s->response, error, sizeof(error));
    char problem[1024];
    if (status >= 200 && status < 300) {
        settle(s, true);
        note_recovery(s);
        return true;
    }
    if (status < 0) {
        snprintf(problem, sizeof(problem), "gateway %.256s unreachable, samples kept: %s",
                 s->probe->config.endpoint, error);
        note_problem(s, problem);
        back_off(s, 0);
        return false;
    }
    if (status == 401 || status == 403 || status == 404) {
        /* the token was revoked or the gateway forgot this worker: register again */
        snprintf(problem, sizeof(problem), "the gateway answered HTTP %d: registering again",
                 status);
        note_problem(s, problem);
        s->registered = false;
        snprintf(s->token, sizeof(s->token), "%s", s->probe->config.token);
        back_off(s, 0);
        return false;
    }
    if (status == 408 || status == 429 || status >= 500) {
        snprintf(problem, sizeof(problem), "the gateway answered HTTP %d, samples kept", status);
        note_problem(s, problem);
        back_off(s, 0);
        return false;
    }
    snprintf(problem, sizeof(problem), "the gateway refused a batch of %zu samples: HTTP %d %.300s",
             s->sample_count, status, s->response.data ? s->response.data : "");
    note_problem(s, problem);
    settle(s, false);
    return true;
}

/* One flush: everything the gateway takes now. */
static void flush(sender *s, bool final)
{
    if (!final && dsec_mono_ns() < s->retry_at_ns)
        return;
    if (!s->registered && !do_register(s))
        return;
    for (;;) {
        if (!s->pending && !build_batch(s))
            return;
        if (!s->pending) /* could not be encoded: counted, go on */
            continue;
        if (!post_pending(s))
            return;
    }
}

static bool wait_for_tick(dsec_probe *probe, double interval_s)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    int64_t ns = until.tv_nsec + (int64_t)(interval_s * 1e9);
    until.tv_sec += ns / 1000000000;
    until.tv_nsec = ns % 1000000000;
    pthread_mutex_lock(&probe->lock);
    while (!probe->stop) {
        if (pthread_cond_timedwait(&probe->wake, &probe->lock, &until) == ETIMEDOUT)
            break;
    }
    bool stop = probe->stop;
    pthread_mutex_unlock(&probe->lock);
    return !stop;
}

static void final_flush(sender *s)
{
    dsec_probe *probe = s->probe;
    const dsec_config *config = &probe->config;
    int64_t deadline_ns = dsec_mono_ns() + (int64_t)(config->shutdown_flush_timeout_s * 1e9);
    int remaining_ms = (int)((deadline_ns - dsec_mono_ns()) / 1000000);
    if (remaining_ms > 0) {
        if (remaining_ms < s->http.timeout_ms)
            s->http.timeout_ms = remaining_ms;
        s->heartbeat_forced = true; /* the last word: the final counts */
        flush(s, true);
    }
    /* what could not be sent by now is lost: counted as dropped */
    size_t left = 0;
    dsec_record record;
    while (dsec_ring_pop(probe->ring, &record))
        left++;
    if (s->pending) {
        left += s->sample_count;
        atomic_fetch_add(&probe->messages_failed, 1);
        atomic_store(&probe->pending, 0);
    }
    if (left > 0) {
        atomic_fetch_add(&probe->sender_dropped, left);
        dsec_log("%zu samples not sent by shutdown: counted as dropped", left);
    }
}

static void *run(void *arg)
{
    sender *s = arg;
    dsec_probe *probe = s->probe;
    while (wait_for_tick(probe, probe->config.flush_interval_s))
        flush(s, false);
    final_flush(s);
    dsec_http_close(&s->http);
    dsec_buf_free(&s->body);
    dsec_buf_free(&s->response);
    free(s->records);
    free(s);
    return NULL;
}

static void random_prefix(char out[17])
{
    uint64_t bits = 0;
    if (getrandom(&bits, sizeof(bits), GRND_NONBLOCK) != (ssize_t)sizeof(bits))
        bits = (uint64_t)dsec_mono_ns() ^ ((uint64_t)getpid() << 32);
    snprintf(out, 17, "%016llx", (unsigned long long)bits);
}

bool dsec_sender_start(dsec_probe *probe)
{
    sender *s = calloc(1, sizeof(sender));
    if (s == NULL)
        return false;
    s->probe = probe;
    s->records = calloc(probe->config.max_samples_per_message, sizeof(dsec_record));
    if (s->records == NULL) {
        free(s);
        return false;
    }
    dsec_http_init(&s->http, &probe->config.url, (int)(probe->config.http_timeout_s * 1000));
    snprintf(s->token, sizeof(s->token), "%s", probe->config.token);
    snprintf(s->metrics_path, sizeof(s->metrics_path), "/v1/runtimes/%s/metrics",
             probe->config.worker_id);
    random_prefix(s->id_prefix);
    /* the first flush says the worker is here (a heartbeat), as the Python probe's does */
    s->next_heartbeat_ns = dsec_mono_ns();
    s->next_cuda_ns = dsec_mono_ns();
    pthread_mutex_init(&probe->lock, NULL);
    pthread_condattr_t attributes;
    pthread_condattr_init(&attributes);
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC);
    pthread_cond_init(&probe->wake, &attributes);
    pthread_condattr_destroy(&attributes);
    /* the sender must not take the host's signals (a SIGINT for the training loop) */
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    int rc = pthread_create(&probe->thread, NULL, run, s);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    if (rc != 0) {
        free(s->records);
        free(s);
        return false;
    }
    return true;
}

void dsec_sender_stop(dsec_probe *probe)
{
    pthread_mutex_lock(&probe->lock);
    probe->stop = true;
    pthread_cond_signal(&probe->wake);
    pthread_mutex_unlock(&probe->lock);
    pthread_join(probe->thread, NULL);
}
