#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../src/http.h"
#include "http_stub.h"
#include "runner.h"

static http_stub stub;

static dsec_http connect_to_stub(void)
{
    char endpoint[64], error[256];
    snprintf(endpoint, sizeof(endpoint), "http://127.0.0.1:%d", stub.port);
    dsec_url url;
    dsec_url_parse(endpoint, &url, error, sizeof(error));
    dsec_http http;
    dsec_http_init(&http, &url, 2000);
    return http;
}

TEST(post_reads_the_status_and_body_and_keeps_the_connection)
{
    dsec_http http = connect_to_stub();
    dsec_buf response = {0};
    char error[256];
    int status = dsec_http_post(&http, "/v1/runtimes", "t", "{}", 2, &response, error,
                                sizeof(error));
    CHECK(status == 201);
    CHECK(strstr(response.data, "stub-runtime-token") != NULL);
    const char *body = "{\"columns\":{\"step\":{\"event_time_ms\":[1,2,3]}}}";
    status = dsec_http_post(&http, "/v1/runtimes/w/metrics", "t", body, strlen(body),
                            &response, error, sizeof(error));
    CHECK(status == 202);
    CHECK(atomic_load(&stub.connections) == 1); /* kept alive */
    CHECK(atomic_load(&stub.samples) == 3);
    dsec_http_close(&http);
    dsec_buf_free(&response);
}

TEST(a_connection_the_server_closed_is_opened_again)
{
    int before = atomic_load(&stub.connections);
    atomic_store(&stub.close_each, true);
    atomic_store(&stub.chunked, true);
    dsec_http http = connect_to_stub();
    dsec_buf response = {0};
    char error[256];
    for (int i = 0; i < 3; i++) {
        int status = dsec_http_post(&http, "/v1/runtimes", "t", "{}", 2, &response, error,
                                    sizeof(error));
        CHECK(status == 201);
        CHECK(strstr(response.data, "stub-runtime-token") != NULL); /* chunked, decoded */
    }
    CHECK(atomic_load(&stub.connections) - before == 3);
    atomic_store(&stub.close_each, false);
    atomic_store(&stub.chunked, false);
    dsec_http_close(&http);
    dsec_buf_free(&response);
}

TEST(nobody_listening_is_an_error_with_the_reason)
{
    char error[256];
    dsec_url url;
    dsec_url_parse("http://127.0.0.1:1", &url, error, sizeof(error));
    dsec_http http;
    dsec_http_init(&http, &url, 500);
    dsec_buf response = {0};
    error[0] = '\0';
    CHECK(dsec_http_post(&http, "/x", NULL, "{}", 2, &response, error, sizeof(error)) == -1);
    CHECK(strstr(error, "connect") != NULL);
    dsec_buf_free(&response);
}

void http_tests(void)
{
    if (!http_stub_start(&stub)) {
        printf("FAIL http stub did not start\n");
        tests_failed++;
        return;
    }
    RUN(post_reads_the_status_and_body_and_keeps_the_connection);
    RUN(a_connection_the_server_closed_is_opened_again);
    RUN(nobody_listening_is_an_error_with_the_reason);
    http_stub_stop(&stub);
}
