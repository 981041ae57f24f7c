#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../src/batch.h"
#include "../src/buf.h"
#include "../src/config.h"
#include "../src/http.h"
#include "runner.h"

TEST(doubles_round_trip_and_nonfinite_is_null)
{
    dsec_buf buf = {0};
    double values[] = {0.1, -2.5e-300, 1.0 / 3.0, 123456789.125};
    for (size_t i = 0; i < 4; i++) {
        dsec_buf_clear(&buf);
        dsec_buf_double(&buf, values[i]);
        CHECK(dsec_buf_terminate(&buf));
        CHECK(strtod(buf.data, NULL) == values[i]);
    }
    dsec_buf_clear(&buf);
    dsec_buf_double(&buf, NAN);
    dsec_buf_putc(&buf, ',');
    dsec_buf_double(&buf, -INFINITY);
    dsec_buf_terminate(&buf);
    CHECK(strcmp(buf.data, "null,null") == 0);
    dsec_buf_free(&buf);
}

TEST(strings_are_escaped_and_found_again)
{
    dsec_buf buf = {0};
    dsec_buf_puts(&buf, "{\"detail\": \"token\", \"token\" : ");
    dsec_buf_json_string(&buf, "a\"b\\c\n");
    dsec_buf_putc(&buf, '}');
    dsec_buf_terminate(&buf);
    CHECK(strstr(buf.data, "\"a\\\"b\\\\c\\u000a\"") != NULL);
    char out[32];
    CHECK(dsec_json_find_string("{\"runtime_id\":\"w\",\"token\":\"abc-_1\"}", "token", out,
                                sizeof(out)));
    CHECK(strcmp(out, "abc-_1") == 0);
    CHECK(!dsec_json_find_string("{\"detail\":\"token\"}", "token", out, sizeof(out)));
    CHECK(!dsec_json_find_string("{\"token\":\"far too long for the room\"}", "token", out, 8));
    dsec_buf_free(&buf);
}

TEST(endpoints_parse_and_https_is_refused_with_a_reason)
{
    dsec_url url;
    char error[256];
    CHECK(dsec_url_parse("http://dsec-control-plane:8080", &url, error, sizeof(error)));
    CHECK(strcmp(url.host, "dsec-control-plane") == 0 && strcmp(url.port, "8080") == 0);
    CHECK(url.base_path[0] == '\0');
    CHECK(dsec_url_parse("http://10.0.0.1/dsec/", &url, error, sizeof(error)));
    CHECK(strcmp(url.port, "80") == 0 && strcmp(url.base_path, "/dsec") == 0);
    CHECK(dsec_url_parse("http://[::1]:9000/x", &url, error, sizeof(error)));
    CHECK(strcmp(url.host, "::1") == 0 && strcmp(url.port, "9000") == 0);
    CHECK(!dsec_url_parse("https://gateway:443", &url, error, sizeof(error)));
    CHECK(strstr(error, "http://") != NULL);
    CHECK(!dsec_url_parse("http://gateway:99999", &url, error, sizeof(error)));
    CHECK(!dsec_url_parse("http://:80", &url, error, sizeof(error)));
    CHECK(!dsec_url_parse(NULL, &url, error, sizeof(error)));
}

TEST(ids_follow_the_schema)
{
    CHECK(dsec_valid_id("agent-7") && dsec_valid_id("job/a:b_c.d"));
    CHECK(!dsec_valid_id("") && !dsec_valid_id("has space") && !dsec_valid_id("é"));
}

TEST(config_needs_a_token_and_reads_the_environment)
{
    dsec_config config;
    char error[512];
    unsetenv("DSEC_ENDPOINT_TOKEN");
    CHECK(!dsec_config_resolve(&config, "http://g:1", "w", error, sizeof(error)));
    CHECK(strstr(error, "DSEC_ENDPOINT_TOKEN") != NULL);
    setenv("DSEC_ENDPOINT_TOKEN", "stub-enrolment-token", 1);
    setenv("DSEC_SANDBOX_ID", "sandbox-9", 1);
    setenv("DSEC_PROBE_FLUSH_INTERVAL_S", "0.5", 1);
    CHECK(dsec_config_resolve(&config, "http://g:1", NULL, error, sizeof(error)));
    CHECK(strcmp(config.worker_id, "sandbox-9") == 0 && config.flush_interval_s == 0.5);
    CHECK(config.max_samples_per_message == 2000 && config.buffer_max_samples == 65536);
    setenv("DSEC_PROBE_FLUSH_INTERVAL_S", "soon", 1);
    CHECK(!dsec_config_resolve(&config, "http://g:1", NULL, error, sizeof(error)));
    CHECK(strstr(error, "DSEC_PROBE_FLUSH_INTERVAL_S") != NULL);
    unsetenv("DSEC_PROBE_FLUSH_INTERVAL_S");
    CHECK(!dsec_config_resolve(&config, "http://g:1", "bad id", error, sizeof(error)));
    unsetenv("DSEC_SANDBOX_ID");
}

TEST(a_batch_is_the_gateways_columns_form)
{
    dsec_record records[] = {
        {.kind = DSEC_REC_STEP, .mono_ns = 1000000000, .i0 = 0, .d0 = 0.5, .d1 = 2.0},
        {.kind = DSEC_REC_EPISODE, .mono_ns = 1001000000, .i0 = 0, .i1 = 200, .d0 = 12.5},
        {.kind = DSEC_REC_STEP, .mono_ns = 1021000000, .i0 = 2, .d0 = NAN, .d1 = -1},
        {.kind = DSEC_REC_GRAD_SYNC, .mono_ns = 1022000000, .i0 = 2, .i1 = 4096, .d0 = 0.25,
         .code = 3},
    };
    dsec_cuda_device_state cuda = {.device_index = 1, .allocated_bytes = 10,
                                   .peak_allocated_bytes = 30, .oom_count = 2};
    dsec_heartbeat heartbeat = {.event_time_ms = 5, .interval_s = 5, .step = 3,
                                .samples_sent = 1, .samples_buffered = 6,
                                .samples_dropped = 2, .samples_recorded = 9,
                                .messages_failed = 1};
    dsec_batch_input input = {.records = records, .record_count = 4, .cuda = &cuda,
                              .cuda_count = 1, .cuda_event_time_ms = 4,
                              .heartbeat = &heartbeat, .epoch_offset_ns = 1000000000000,
                              .batch_id = "abcdef0123456789"};
    dsec_batch_state state = {0};
    dsec_buf out = {0};
    CHECK(dsec_batch_encode(&input, &state, &out));
    const char *expected =
        "{\"batch_id\":\"abcdef0123456789\",\"columns\":{"
        "\"step\":{\"event_time_ms\":[1001000,1001021],\"step\":[0,2],\"loss\":[0.5,null],"
        "\"loss_nonfinite\":[false,true],\"grad_norm\":[2,null],"
        "\"grad_nonfinite\":[false,false],\"grad_norm_source\":[\"trainer\",null],"
        "\"step_time_ms\":[null,10.5]},"
        "\"episode\":{\"event_time_ms\":[1001001],\"episode_index\":[0],\"reward\":[12.5],"
        "\"length\":[200],\"terminated\":[true],\"truncated\":[false]},"
        "\"grad_sync\":{\"event_time_ms\":[1001022],\"step\":[2],\"bytes\":[4096],"
        "\"latency_ms\":[0.25],\"ok\":[false],\"op\":[\"nccl_all_reduce\"],"
        "\"timer\":[\"wall_clock\"],\"error\":[\"ncclResult 3\"]},"
        "\"cuda_memory\":{\"event_time_ms\":[4],\"device_index\":[1],\"allocated_bytes\":[10],"
        "\"reserved_bytes\":[10],\"peak_allocated_bytes\":[30],\"oom_count\":[2]},"
        "\"heartbeat\":{\"event_time_ms\":[5],\"interval_s\":[5],\"step\":[3],"
        "\"samples_sent\":[1],\"samples_buffered\":[6],\"samples_dropped\":[2],"
        "\"samples_recorded\":[9],\"messages_failed\":[1]}}}";
    if (strcmp(out.data, expected) != 0)
        fprintf(stderr, "  got      %s\n  expected %s\n", out.data, expected);
    CHECK(strcmp(out.data, expected) == 0);
    /* the step time carries over to the next batch */
    CHECK(state.last_step == 2 && state.last_step_mono_ns == 1021000000);
    dsec_buf_free(&out);
}

TEST(invalid_episodes_are_not_sent)
{
    dsec_record nan_reward = {.kind = DSEC_REC_EPISODE, .d0 = NAN, .i1 = 3};
    dsec_record negative_length = {.kind = DSEC_REC_EPISODE, .d0 = 1, .i1 = -1};
    dsec_record fine = {.kind = DSEC_REC_EPISODE, .d0 = -4, .i1 = 0};
    CHECK(!dsec_record_valid(&nan_reward) && !dsec_record_valid(&negative_length));
    CHECK(dsec_record_valid(&fine));
}

void encoding_tests(void)
{
    RUN(doubles_round_trip_and_nonfinite_is_null);
    RUN(strings_are_escaped_and_found_again);
    RUN(endpoints_parse_and_https_is_refused_with_a_reason);
    RUN(ids_follow_the_schema);
    RUN(config_needs_a_token_and_reads_the_environment);
    RUN(a_batch_is_the_gateways_columns_form);
    RUN(invalid_episodes_are_not_sent);
}
