/* One batch of records as the gateway's columns form:
 * {"batch_id": ..., "columns": {"step": {"event_time_ms": [...], ...}, "episode": ...}},
 * one list per field and sample kind (schemas/metrics.py), numbers as JSON numbers. Pure
 * formatting: the sender decides what goes in. */
#ifndef DSEC_BATCH_H
#define DSEC_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "cuda_memory.h"
#include "ring.h"

typedef struct dsec_heartbeat {
    int64_t event_time_ms;
    double interval_s;
    int64_t step;
    uint64_t samples_sent;
    uint64_t samples_buffered;
    uint64_t samples_dropped;
    uint64_t samples_recorded;
    uint64_t messages_failed;
} dsec_heartbeat;

/* What carries over from one batch to the next: the previous step, for step times. */
typedef struct dsec_batch_state {
    int64_t last_step;
    int64_t last_step_mono_ns; /* 0: no step seen yet */
} dsec_batch_state;

typedef struct dsec_batch_input {
    const dsec_record *records;
    size_t record_count;
    const dsec_cuda_device_state *cuda;
    size_t cuda_count;
    int64_t cuda_event_time_ms;
    const dsec_heartbeat *heartbeat; /* NULL: none in this batch */
    int64_t epoch_offset_ns;         /* epoch ns = mono_ns + this */
    const char *batch_id;
} dsec_batch_input;

/* True when a record can be sent: an episode's reward finite and its length >= 0 (the
 * gateway refuses the whole batch otherwise). */
bool dsec_record_valid(const dsec_record *record);

/* Writes the batch to `out` (cleared first); false when out of memory. Invalid records
 * must have been left out. */
bool dsec_batch_encode(const dsec_batch_input *input, dsec_batch_state *state, dsec_buf *out);

#endif
