/* The library's configuration: dsec_init's arguments, then the environment (the names the
 * Python probe reads), then defaults; checked once. */
#ifndef DSEC_CONFIG_H
#define DSEC_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "http.h"

#define DSEC_ID_MAX 128

typedef struct dsec_config {
    dsec_url url;
    char endpoint[512];
    char token[512];                 /* DSEC_ENDPOINT_TOKEN */
    char worker_id[DSEC_ID_MAX + 1]; /* the agent id: the gateway's runtime id */
    char job_id[DSEC_ID_MAX + 1];    /* "" : the gateway's job */
    char node_id[DSEC_ID_MAX + 1];
    double flush_interval_s;
    double heartbeat_interval_s;
    double cuda_memory_interval_s; /* 0: CUDA memory samples off */
    double shutdown_flush_timeout_s;
    double http_timeout_s;
    size_t buffer_max_samples;
    size_t max_samples_per_message;
} dsec_config;

/* Fills `out`; false with the reason in `error` when something is missing or invalid. */
bool dsec_config_resolve(dsec_config *out, const char *endpoint, const char *agent_id,
                         char *error, size_t error_cap);

/* What the dsec schemas accept as an id: 1-128 of [A-Za-z0-9_.:-/]. */
bool dsec_valid_id(const char *id);

#endif
