/* One running probe: its configuration, ring, counts and sender thread. A probe is never
 * freed: a caller that read the active probe just before dsec_shutdown may still push into
 * its ring, so it stays valid (a few MB once per dsec_init). */
#ifndef DSEC_PROBE_H
#define DSEC_PROBE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "ring.h"

typedef struct dsec_probe {
    dsec_config config;
    dsec_ring *ring;
    /* the callers' */
    _Atomic uint64_t ring_dropped; /* the ring was full */
    _Atomic int64_t steps;         /* the next step's index */
    _Atomic int64_t episodes;      /* the next episode's index */
    /* the sender's (read by dsec_get_counters) */
    _Atomic uint64_t own_recorded; /* samples the sender made: heartbeats, CUDA memory */
    _Atomic uint64_t sent;
    _Atomic uint64_t sender_dropped; /* refused by the gateway, invalid, or left at shutdown */
    _Atomic uint64_t messages_failed;
    _Atomic uint64_t pending; /* in the batch being sent */
    /* the sender thread and how to stop it */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stop; /* under lock */
    struct dsec_probe *retired_next; /* stopped probes stay listed, never freed */
} dsec_probe;

/* Starts the sender thread; false when it could not. */
bool dsec_sender_start(dsec_probe *probe);
/* Asks the sender for a last flush (bounded by the shutdown timeout) and waits for it. */
void dsec_sender_stop(dsec_probe *probe);

/* The probe to record into (started on first use when preloaded), or NULL. */
dsec_probe *dsec_active_probe(void);
/* Keeps `record`, or counts it dropped when the ring is full. */
void dsec_record_push(dsec_probe *probe, const dsec_record *record);

/* CLOCK_MONOTONIC in ns: the one clock read on the caller's path. */
int64_t dsec_mono_ns(void);

/* Writes "dsec: ..." to stderr. */
void dsec_log(const char *format, ...) __attribute__((format(printf, 1, 2)));

#endif
