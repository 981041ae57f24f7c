/* A minimal HTTP/1.1 client on POSIX sockets, for the sender thread only: plain http://,
 * one kept-alive connection, every wait bounded by a timeout, no signal raised on a closed
 * peer. TLS is not here (no library beyond libc): reach a TLS gateway through a local
 * TLS-terminating proxy. */
#ifndef DSEC_HTTP_H
#define DSEC_HTTP_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"

typedef struct dsec_url {
    char host[256];
    char port[8];
    char base_path[256]; /* "" or "/prefix" without a trailing slash */
} dsec_url;

/* `url` as http://host[:port][/prefix]; false (with `error` set) otherwise. */
bool dsec_url_parse(const char *url, dsec_url *out, char *error, size_t error_cap);

typedef struct dsec_http {
    dsec_url url;
    int timeout_ms;
    int fd; /* -1: not connected */
} dsec_http;

void dsec_http_init(dsec_http *http, const dsec_url *url, int timeout_ms);
void dsec_http_close(dsec_http *http);

/* POSTs `body` (JSON) to base_path + `path` with a bearer `token`. Returns the HTTP status
 * with the response body in `response` (NUL-terminated), or -1 when no answer came (with
 * the reason in `error`). A kept-alive connection the server closed while idle is
 * reopened once. */
int dsec_http_post(dsec_http *http, const char *path, const char *token, const char *body,
                   size_t body_len, dsec_buf *response, char *error, size_t error_cap);

#endif
