/*
 * dsec_inject: the dsec probe for programs that are not Python, and for Python through
 * ctypes. Three lines:
 *
 *     dsec_init("http://dsec-control-plane:8080", "agent-7");
 *     dsec_report_episode_end(reward, length);
 *     dsec_shutdown();
 *
 * No call blocks: a report is a clock read and a slot in a bounded lock-free ring; a
 * background thread sends batches to the dsec ingest gateway over HTTP/1.1. A full ring
 * drops the sample and counts it; the counts travel in heartbeat samples.
 *
 * Preloaded (LD_PRELOAD=libdsec_inject.so), the library also reports cudaMalloc/cudaFree
 * (bytes in use, peak, out-of-memory failures) and ncclAllReduce (bytes, latency) of an
 * unchanged program, configured by the environment: DSEC_ENDPOINT, DSEC_ENDPOINT_TOKEN,
 * DSEC_WORKER_ID (or DSEC_SANDBOX_ID). docs/integrations.md has every setting.
 */
#ifndef DSEC_INJECT_H
#define DSEC_INJECT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DSEC_OK 0
#define DSEC_ERR_CONFIG (-1)  /* a bad endpoint or id, or no token: see dsec_last_error() */
#define DSEC_ERR_RUNNING (-2) /* dsec_init was called already: dsec_shutdown() first */
#define DSEC_ERR_SYSTEM (-3)  /* no memory, or the background thread did not start */

typedef struct dsec_counters {
    uint64_t samples_recorded; /* == sent + buffered + dropped */
    uint64_t samples_sent;     /* the gateway accepted them */
    uint64_t samples_buffered; /* in the ring, or in the batch being sent */
    uint64_t samples_dropped;  /* ring full, refused by the gateway, or invalid */
    uint64_t messages_failed;  /* batches the gateway refused or that were lost */
} dsec_counters;

/* Starts reporting as worker `agent_id` (NULL: DSEC_WORKER_ID, DSEC_SANDBOX_ID, else
 * host-rank$RANK or host-pid) to the gateway at `endpoint` (NULL: DSEC_ENDPOINT), an
 * http:// URL. The bearer token comes from DSEC_ENDPOINT_TOKEN: the gateway's enrolment
 * token, or this worker's own runtime token. Returns DSEC_OK or a DSEC_ERR_* code; on an
 * error the report calls do nothing. */
int dsec_init(const char *endpoint, const char *agent_id);

/* One finished episode: its return and its length in steps. */
void dsec_report_episode_end(double reward, int64_t length);

/* One training step: its loss and gradient norm. A NaN or infinite value is reported as
 * such (a flag beside a null); a negative grad_norm means "none measured". */
void dsec_report_step(double loss, double grad_norm);

/* Sends what is left (bounded by DSEC_PROBE_SHUTDOWN_FLUSH_TIMEOUT_S) and stops the
 * background thread; safe to call twice. Also runs at exit. */
void dsec_shutdown(void);

/* The counts so far (any thread, any time). */
void dsec_get_counters(dsec_counters *out);

/* What the last failed dsec_init said; "" when nothing failed. */
const char *dsec_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* DSEC_INJECT_H */
