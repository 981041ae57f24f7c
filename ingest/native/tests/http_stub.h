/* A stand-in ingest gateway for the C tests and the benchmark: one thread serving HTTP/1.1
 * on a loopback port. POST /v1/runtimes answers 201 with a token; POST .../metrics answers
 * 202 and counts the samples (the values of every "event_time_ms" list). The Python tests
 * run the library against the real gateway. */
#ifndef DSEC_HTTP_STUB_H
#define DSEC_HTTP_STUB_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

typedef struct http_stub {
    int listen_fd;
    int port;
    pthread_t thread;
    _Atomic bool stop;
    /* behaviour */
    _Atomic int metrics_status;  /* what POST .../metrics answers (default 202) */
    _Atomic bool close_each;     /* answer "Connection: close" and close */
    _Atomic bool chunked;        /* answer with a chunked body */
    /* what arrived */
    _Atomic int registrations;
    _Atomic int posts;
    _Atomic long samples;
    _Atomic long all_reduce_samples; /* "nccl_all_reduce" values */
    _Atomic int connections;
    _Atomic bool last_had_heartbeat;
    char last_body[65536]; /* its start */
    pthread_mutex_t lock; /* for last_body */
} http_stub;

bool http_stub_start(http_stub *stub);
void http_stub_stop(http_stub *stub);

#endif
