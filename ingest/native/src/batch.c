#include "batch.h"

#include <math.h>

static int64_t epoch_ms(int64_t mono_ns, int64_t offset_ns)
{
    int64_t ms = (mono_ns + offset_ns) / 1000000;
    return ms < 0 ? 0 : ms;
}

bool dsec_record_valid(const dsec_record *record)
{
    if (record->kind == DSEC_REC_EPISODE)
        return isfinite(record->d0) && record->i1 >= 0;
    return record->kind == DSEC_REC_STEP || record->kind == DSEC_REC_GRAD_SYNC;
}

static size_t count_kind(const dsec_batch_input *input, uint8_t kind)
{
    size_t n = 0;
    for (size_t i = 0; i < input->record_count; i++)
        n += input->records[i].kind == kind;
    return n;
}

/* Opens `"name": [` (with a comma before all but the first field of a kind). */
static void open_list(dsec_buf *out, const char *name, bool *first)
{
    if (!*first)
        dsec_buf_putc(out, ',');
    *first = false;
    dsec_buf_json_string(out, name);
    dsec_buf_puts(out, ":[");
}

static void open_kind(dsec_buf *out, const char *kind, bool *first_kind)
{
    if (!*first_kind)
        dsec_buf_putc(out, ',');
    *first_kind = false;
    dsec_buf_json_string(out, kind);
    dsec_buf_puts(out, ":{");
}

typedef enum {
    F_TIME, F_I0, F_I1, F_D0, F_D0_NONFINITE, F_NORM, F_NORM_NONFINITE, F_NORM_SOURCE,
    F_STEP_TIME, F_OK, F_ERROR, F_CONST_TRUE, F_CONST_FALSE, F_OP, F_TIMER
} field;

typedef struct field_spec {
    const char *name;
    field what;
} field_spec;

static const field_spec STEP_FIELDS[] = {
    {"event_time_ms", F_TIME}, {"step", F_I0}, {"loss", F_D0},
    {"loss_nonfinite", F_D0_NONFINITE}, {"grad_norm", F_NORM},
    {"grad_nonfinite", F_NORM_NONFINITE}, {"grad_norm_source", F_NORM_SOURCE},
    {"step_time_ms", F_STEP_TIME},
};
static const field_spec EPISODE_FIELDS[] = {
    {"event_time_ms", F_TIME}, {"episode_index", F_I0}, {"reward", F_D0},
    {"length", F_I1}, {"terminated", F_CONST_TRUE}, {"truncated", F_CONST_FALSE},
};
static const field_spec GRAD_SYNC_FIELDS[] = {
    {"event_time_ms", F_TIME}, {"step", F_I0}, {"bytes", F_I1}, {"latency_ms", F_D0},
    {"ok", F_OK}, {"op", F_OP}, {"timer", F_TIMER}, {"error", F_ERROR},
};

static void put_bool(dsec_buf *out, bool value)
{
    dsec_buf_puts(out, value ? "true" : "false");
}

static void put_field(dsec_buf *out, const dsec_record *r, field what, int64_t offset_ns,
                      double step_time_ms)
{
    /* a grad_norm below zero is "none measured"; NaN/Inf travel as null with a flag */
    bool norm_given = !(r->d1 < 0);
    switch (what) {
    case F_TIME: dsec_buf_int(out, epoch_ms(r->mono_ns, offset_ns)); break;
    case F_I0: dsec_buf_int(out, r->i0); break;
    case F_I1: dsec_buf_int(out, r->i1 < 0 ? 0 : r->i1); break;
    case F_D0: dsec_buf_double(out, r->d0); break;
    case F_D0_NONFINITE: put_bool(out, !isfinite(r->d0)); break;
    case F_NORM: dsec_buf_double(out, norm_given ? r->d1 : NAN); break;
    case F_NORM_NONFINITE: put_bool(out, norm_given && !isfinite(r->d1)); break;
    case F_NORM_SOURCE: dsec_buf_puts(out, norm_given ? "\"trainer\"" : "null"); break;
    case F_STEP_TIME: dsec_buf_double(out, step_time_ms); break;
    case F_OK: put_bool(out, r->code == 0); break;
    case F_CONST_TRUE: put_bool(out, true); break;
    case F_CONST_FALSE: put_bool(out, false); break;
    case F_OP: dsec_buf_puts(out, "\"nccl_all_reduce\""); break;
    case F_TIMER: dsec_buf_puts(out, "\"wall_clock\""); break;
    case F_ERROR:
        if (r->code == 0) {
            dsec_buf_puts(out, "null");
        } else {
            dsec_buf_puts(out, "\"ncclResult ");
            dsec_buf_int(out, r->code);
            dsec_buf_putc(out, '"');
        }
        break;
    }
}

/* The step time of each step record, in order: the time since the previous step divided
 * by the steps between them (so a dropped step does not double the next one's time). */
static double next_step_time_ms(const dsec_record *r, dsec_batch_state *state)
{
    double ms = NAN;
    if (state->last_step_mono_ns != 0 && r->i0 > state->last_step &&
        r->mono_ns >= state->last_step_mono_ns)
        ms = (double)(r->mono_ns - state->last_step_mono_ns) / 1e6 /
             (double)(r->i0 - state->last_step);
    state->last_step = r->i0;
    state->last_step_mono_ns = r->mono_ns;
    return ms;
}

static void put_records(dsec_buf *out, const dsec_batch_input *input, uint8_t kind,
                        const field_spec *fields, size_t field_count, dsec_batch_state *state)
{
    bool first_field = true;
    dsec_batch_state start = *state;
    for (size_t f = 0; f < field_count; f++) {
        open_list(out, fields[f].name, &first_field);
        bool first = true;
        *state = start; /* every field walks the same steps */
        for (size_t i = 0; i < input->record_count; i++) {
            const dsec_record *r = &input->records[i];
            if (r->kind != kind)
                continue;
            double step_time_ms = kind == DSEC_REC_STEP ? next_step_time_ms(r, state) : NAN;
            if (!first)
                dsec_buf_putc(out, ',');
            first = false;
            put_field(out, r, fields[f].what, input->epoch_offset_ns, step_time_ms);
        }
        dsec_buf_putc(out, ']');
    }
    dsec_buf_putc(out, '}');
}

static void put_cuda(dsec_buf *out, const dsec_batch_input *input)
{
    static const char *names[] = {"event_time_ms", "device_index", "allocated_bytes",
                                  "reserved_bytes", "peak_allocated_bytes", "oom_count"};
    bool first_field = true;
    for (size_t f = 0; f < sizeof(names) / sizeof(names[0]); f++) {
        open_list(out, names[f], &first_field);
        for (size_t i = 0; i < input->cuda_count; i++) {
            const dsec_cuda_device_state *d = &input->cuda[i];
            if (i)
                dsec_buf_putc(out, ',');
            switch (f) {
            case 0: dsec_buf_int(out, input->cuda_event_time_ms); break;
            case 1: dsec_buf_int(out, d->device_index); break;
            /* at this level what a process allocates is what it reserves from the driver */
            case 2: case 3: dsec_buf_int(out, d->allocated_bytes); break;
            case 4: dsec_buf_int(out, d->peak_allocated_bytes); break;
            default: dsec_buf_uint(out, d->oom_count); break;
            }
        }
        dsec_buf_putc(out, ']');
    }
    dsec_buf_putc(out, '}');
}

static void put_heartbeat(dsec_buf *out, const dsec_heartbeat *h)
{
    dsec_buf_puts(out, "\"event_time_ms\":[");
    dsec_buf_int(out, h->event_time_ms);
    dsec_buf_puts(out, "],\"interval_s\":[");
    dsec_buf_double(out, h->interval_s);
    dsec_buf_puts(out, "],\"step\":[");
    dsec_buf_int(out, h->step);
    const struct {
        const char *name;
        uint64_t value;
    } counts[] = {
        {"samples_sent", h->samples_sent},         {"samples_buffered", h->samples_buffered},
        {"samples_dropped", h->samples_dropped},   {"samples_recorded", h->samples_recorded},
        {"messages_failed", h->messages_failed},
    };
    for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++) {
        dsec_buf_puts(out, "],\"");
        dsec_buf_puts(out, counts[i].name);
        dsec_buf_puts(out, "\":[");
        dsec_buf_uint(out, counts[i].value);
    }
    dsec_buf_puts(out, "]}");
}

bool dsec_batch_encode(const dsec_batch_input *input, dsec_batch_state *state, dsec_buf *out)
{
    dsec_buf_clear(out);
    dsec_buf_puts(out, "{\"batch_id\":");
    dsec_buf_json_string(out, input->batch_id);
    dsec_buf_puts(out, ",\"columns\":{");
    bool first_kind = true;
    if (count_kind(input, DSEC_REC_STEP)) {
        open_kind(out, "step", &first_kind);
        put_records(out, input, DSEC_REC_STEP, STEP_FIELDS,
                    sizeof(STEP_FIELDS) / sizeof(STEP_FIELDS[0]), state);
    }
    if (count_kind(input, DSEC_REC_EPISODE)) {
        open_kind(out, "episode", &first_kind);
        put_records(out, input, DSEC_REC_EPISODE, EPISODE_FIELDS,
                    sizeof(EPISODE_FIELDS) / sizeof(EPISODE_FIELDS[0]), state);
    }
    if (count_kind(input, DSEC_REC_GRAD_SYNC)) {
        open_kind(out, "grad_sync", &first_kind);
        put_records(out, input, DSEC_REC_GRAD_SYNC, GRAD_SYNC_FIELDS,
                    sizeof(GRAD_SYNC_FIELDS) / sizeof(GRAD_SYNC_FIELDS[0]), state);
    }
    if (input->cuda_count) {
        open_kind(out, "cuda_memory", &first_kind);
        put_cuda(out, input);
    }
    if (input->heartbeat != NULL) {
        open_kind(out, "heartbeat", &first_kind);
        put_heartbeat(out, input->heartbeat);
    }
    dsec_buf_puts(out, "}}");
    return dsec_buf_terminate(out);
}

