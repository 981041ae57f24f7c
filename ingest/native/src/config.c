#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *env(const char *name)
{
    const char *value = getenv(name);
    return value != NULL && value[0] != '\0' ? value : NULL;
}

static bool number(const char *name, double fallback, double low, double high, double *out,
                   char *error, size_t error_cap)
{
    const char *text = env(name);
    if (text == NULL) {
        *out = fallback;
        return true;
    }
    char *end;
    double value = strtod(text, &end);
    if (*end != '\0' || !(value >= low && value <= high)) {
        snprintf(error, error_cap, "%s=%s: expected a number from %g to %g", name, text, low,
                 high);
        return false;
    }
    *out = value;
    return true;
}

static bool copy(char *dst, size_t cap, const char *src, const char *what, char *error,
                 size_t error_cap)
{
    if (strlen(src) >= cap) {
        snprintf(error, error_cap, "%s is too long (at most %zu characters)", what, cap - 1);
        return false;
    }
    strcpy(dst, src);
    return true;
}

bool dsec_valid_id(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n > DSEC_ID_MAX)
        return false;
    for (const char *c = id; *c; c++) {
        bool ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || strchr("_.:-/", *c) != NULL;
        if (!ok)
            return false;
    }
    return true;
}

static void hostname(char *out, size_t cap)
{
    if (gethostname(out, cap) != 0 || out[0] == '\0')
        snprintf(out, cap, "localhost");
    out[cap - 1] = '\0';
}

/* As the Python probe names a worker: host-rank$RANK, else host-pid. */
static void default_worker_id(char *out, size_t cap)
{
    char host[DSEC_ID_MAX - 24];
    hostname(host, sizeof(host));
    const char *rank = env("RANK");
    if (rank != NULL)
        snprintf(out, cap, "%s-rank%.16s", host, rank);
    else
        snprintf(out, cap, "%s-%ld", host, (long)getpid());
}

bool dsec_config_resolve(dsec_config *out, const char *endpoint, const char *agent_id,
                         char *error, size_t error_cap)
{
    memset(out, 0, sizeof(*out));
    if (endpoint == NULL || endpoint[0] == '\0')
        endpoint = env("DSEC_ENDPOINT");
    if (endpoint == NULL) {
        snprintf(error, error_cap, "no endpoint: pass one to dsec_init or set DSEC_ENDPOINT");
        return false;
    }
    if (!copy(out->endpoint, sizeof(out->endpoint), endpoint, "the endpoint", error, error_cap) ||
        !dsec_url_parse(endpoint, &out->url, error, error_cap))
        return false;
    const char *token = env("DSEC_ENDPOINT_TOKEN");
    if (token == NULL) {
        snprintf(error, error_cap, "DSEC_ENDPOINT_TOKEN is not set: the gateway's enrolment "
                                   "token, or this worker's runtime token");
        return false;
    }
    if (!copy(out->token, sizeof(out->token), token, "DSEC_ENDPOINT_TOKEN", error, error_cap))
        return false;
    if (agent_id == NULL || agent_id[0] == '\0')
        agent_id = env("DSEC_WORKER_ID");
    if (agent_id == NULL)
        agent_id = env("DSEC_SANDBOX_ID");
    if (agent_id != NULL) {
        if (!copy(out->worker_id, sizeof(out->worker_id), agent_id, "the agent id", error,
                  error_cap))
            return false;
    } else {
        default_worker_id(out->worker_id, sizeof(out->worker_id));
    }
    const char *job = env("DSEC_JOB_ID");
    if (job != NULL && !copy(out->job_id, sizeof(out->job_id), job, "DSEC_JOB_ID", error,
                             error_cap))
        return false;
    const char *node = env("DSEC_NODE_ID");
    if (node != NULL) {
        if (!copy(out->node_id, sizeof(out->node_id), node, "DSEC_NODE_ID", error, error_cap))
            return false;
    } else {
        hostname(out->node_id, sizeof(out->node_id));
    }
    const char *ids[][2] = {{"the agent id", out->worker_id}, {"DSEC_NODE_ID", out->node_id},
                            {"DSEC_JOB_ID", out->job_id}};
    for (size_t i = 0; i < 3; i++) {
        if (ids[i][1][0] != '\0' && !dsec_valid_id(ids[i][1])) {
            snprintf(error, error_cap, "%s \"%s\": use 1-128 of A-Z a-z 0-9 _ . : - /",
                     ids[i][0], ids[i][1]);
            return false;
        }
    }
    double buffer_max = 0, per_message = 0;
    if (!number("DSEC_PROBE_FLUSH_INTERVAL_S", 0.25, 0.001, 60, &out->flush_interval_s, error,
                error_cap) ||
        !number("DSEC_PROBE_HEARTBEAT_INTERVAL_S", 5.0, 0.001, 3600, &out->heartbeat_interval_s,
                error, error_cap) ||
        !number("DSEC_PROBE_CUDA_MEMORY_INTERVAL_S", 1.0, 0, 3600, &out->cuda_memory_interval_s,
                error, error_cap) ||
        !number("DSEC_PROBE_SHUTDOWN_FLUSH_TIMEOUT_S", 5.0, 0, 600,
                &out->shutdown_flush_timeout_s, error, error_cap) ||
        !number("DSEC_PROBE_HTTP_TIMEOUT_S", 5.0, 0.01, 600, &out->http_timeout_s, error,
                error_cap) ||
        !number("DSEC_PROBE_BUFFER_MAX_SAMPLES", 65536, 2, 1 << 26, &buffer_max, error,
                error_cap) ||
        !number("DSEC_PROBE_MAX_SAMPLES_PER_MESSAGE", 2000, 8, 10000, &per_message, error,
                error_cap))
        return false;
    out->buffer_max_samples = (size_t)buffer_max;
    out->max_samples_per_message = (size_t)per_message;
    return true;
}
