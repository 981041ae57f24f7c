#include "http.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define MAX_HEADER_BYTES 16384
#define MAX_BODY_BYTES 65536

bool dsec_url_parse(const char *url, dsec_url *out, char *error, size_t error_cap)
{
    memset(out, 0, sizeof(*out));
    if (url == NULL || strncmp(url, "http://", 7) != 0) {
        snprintf(error, error_cap, "endpoint must be an http:// URL, got %s%s%s",
                 url ? "\"" : "", url ? url : "nothing", url ? "\"" : "");
        return false;
    }
    const char *host = url + 7;
    const char *path = strchr(host, '/');
    size_t authority_len = path ? (size_t)(path - host) : strlen(host);
    const char *colon = NULL;
    if (host[0] == '[') { /* [IPv6]:port */
        const char *close = memchr(host, ']', authority_len);
        if (close == NULL) {
            snprintf(error, error_cap, "endpoint %s: unclosed [", url);
            return false;
        }
        size_t n = (size_t)(close - host - 1);
        if (n == 0 || n >= sizeof(out->host))
            goto bad_host;
        memcpy(out->host, host + 1, n);
        if (close + 1 < host + authority_len && close[1] == ':')
            colon = close + 1;
    } else {
        colon = memchr(host, ':', authority_len);
        size_t n = colon ? (size_t)(colon - host) : authority_len;
        if (n == 0 || n >= sizeof(out->host))
            goto bad_host;
        memcpy(out->host, host, n);
    }
    if (colon != NULL) {
        size_t n = (size_t)(host + authority_len - colon - 1);
        if (n == 0 || n >= sizeof(out->port))
            goto bad_port;
        memcpy(out->port, colon + 1, n);
        char *end;
        long port = strtol(out->port, &end, 10);
        if (*end != '\0' || port < 1 || port > 65535)
            goto bad_port;
    } else {
        strcpy(out->port, "80");
    }
    if (path != NULL) {
        size_t n = strlen(path);
        while (n > 0 && path[n - 1] == '/')
            n--;
        if (n >= sizeof(out->base_path)) {
            snprintf(error, error_cap, "endpoint %s: path too long", url);
            return false;
        }
        memcpy(out->base_path, path, n);
    }
    return true;
bad_host:
    snprintf(error, error_cap, "endpoint %s: no host, or one too long", url);
    return false;
bad_port:
    snprintf(error, error_cap, "endpoint %s: the port is not a number from 1 to 65535", url);
    return false;
}

void dsec_http_init(dsec_http *http, const dsec_url *url, int timeout_ms)
{
    http->url = *url;
    http->timeout_ms = timeout_ms;
    http->fd = -1;
}

void dsec_http_close(dsec_http *http)
{
    if (http->fd >= 0)
        close(http->fd);
    http->fd = -1;
}

static int connect_with_timeout(const dsec_http *http, char *error, size_t error_cap)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *found = NULL;
    int rc = getaddrinfo(http->url.host, http->url.port, &hints, &found);
    if (rc != 0) {
        snprintf(error, error_cap, "cannot resolve %s: %s", http->url.host, gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    int last_errno = 0;
    for (struct addrinfo *ai = found; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        if (errno == EINPROGRESS) {
            struct pollfd waiting = {.fd = fd, .events = POLLOUT};
            int ready = poll(&waiting, 1, http->timeout_ms);
            int so_error = 0;
            socklen_t len = sizeof(so_error);
            if (ready == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) == 0 &&
                so_error == 0)
                break;
            last_errno = ready == 0 ? ETIMEDOUT : (so_error ? so_error : errno);
        } else {
            last_errno = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(found);
    if (fd < 0) {
        snprintf(error, error_cap, "cannot connect to %s:%s: %s", http->url.host,
                 http->url.port, strerror(last_errno));
        return -1;
    }
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    struct timeval timeout = {.tv_sec = http->timeout_ms / 1000,
                              .tv_usec = (http->timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static bool send_all(int fd, const char *data, size_t len)
{
    while (len > 0) {
        ssize_t n = send(fd, data, len, MSG_NOSIGNAL); /* no SIGPIPE in the host program */
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        data += n;
        len -= (size_t)n;
    }
    return true;
}

/* Reads into `in` until it holds at least `want` bytes; false on EOF, error or timeout. */
static bool read_until(int fd, dsec_buf *in, size_t want)
{
    char chunk[8192];
    while (in->len < want) {
        ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        dsec_buf_put(in, chunk, (size_t)n);
        if (in->failed)
            return false;
    }
    return true;
}

static const char *find_header_end(const dsec_buf *in)
{
    for (size_t i = 3; i < in->len; i++)
        if (memcmp(in->data + i - 3, "\r\n\r\n", 4) == 0)
            return in->data + i + 1;
    return NULL;
}

/* The value of header `name` in the header block [start, end), or NULL. */
static const char *header_value(const char *start, const char *end, const char *name,
                                size_t *value_len)
{
    size_t name_len = strlen(name);
    for (const char *line = start; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL)
            eol = end;
        if ((size_t)(eol - line) > name_len && strncasecmp(line, name, name_len) == 0 &&
            line[name_len] == ':') {
            const char *value = line + name_len + 1;
            while (value < eol && (*value == ' ' || *value == '\t'))
                value++;
            const char *value_end = eol;
            while (value_end > value && (value_end[-1] == '\r' || value_end[-1] == ' '))
                value_end--;
            *value_len = (size_t)(value_end - value);
            return value;
        }
        line = eol + 1;
    }
    return NULL;
}

/* A chunked body from `in` at `offset` into `body`; reads more as needed. */
static bool read_chunked(int fd, dsec_buf *in, size_t offset, dsec_buf *body)
{
    for (;;) {
        const char *line_end;
        while ((line_end = memchr(in->data + offset, '\n', in->len - offset)) == NULL)
            if (!read_until(fd, in, in->len + 1) || in->len - offset > 1024)
                return false;
        char *end;
        unsigned long size = strtoul(in->data + offset, &end, 16);
        size_t data_start = (size_t)(line_end - in->data) + 1;
        if (end == in->data + offset || size > MAX_BODY_BYTES)
            return false;
        if (!read_until(fd, in, data_start + size + 2))
            return false;
        if (size == 0) /* trailers are not used by the gateway: the last CRLF ends it */
            return true;
        if (body->len + size > MAX_BODY_BYTES)
            return false;
        dsec_buf_put(body, in->data + data_start, size);
        offset = data_start + size + 2;
    }
}

/* One request on the open connection. Returns the status, -1 on failure; `fresh_failure`
 * says nothing of an answer arrived (a kept-alive connection closed by the server). */
static int exchange(dsec_http *http, const char *path, const char *token, const char *body,
                    size_t body_len, dsec_buf *response, bool *nothing_received, char *error,
                    size_t error_cap)
{
    dsec_buf request = {0};
    dsec_buf_puts(&request, "POST ");
    dsec_buf_puts(&request, http->url.base_path);
    dsec_buf_puts(&request, path);
    dsec_buf_puts(&request, " HTTP/1.1\r\nHost: ");
    dsec_buf_puts(&request, http->url.host);
    dsec_buf_putc(&request, ':');
    dsec_buf_puts(&request, http->url.port);
    dsec_buf_puts(&request, "\r\nUser-Agent: libdsec_inject\r\nContent-Type: application/json"
                            "\r\nAccept: application/json\r\n");
    if (token != NULL && token[0] != '\0') {
        dsec_buf_puts(&request, "Authorization: Bearer ");
        dsec_buf_puts(&request, token);
        dsec_buf_puts(&request, "\r\n");
    }
    dsec_buf_puts(&request, "Content-Length: ");
    dsec_buf_uint(&request, body_len);
    dsec_buf_puts(&request, "\r\n\r\n");
    *nothing_received = true;
    bool sent = !request.failed && send_all(http->fd, request.data, request.len) &&
                send_all(http->fd, body, body_len);
    dsec_buf_free(&request);
    if (!sent) {
        snprintf(error, error_cap, "sending to %s:%s failed: %s", http->url.host,
                 http->url.port, strerror(errno));
        return -1;
    }
    dsec_buf in = {0};
    int status = -1;
    const char *header_end;
    while ((header_end = find_header_end(&in)) == NULL) {
        if (in.len > MAX_HEADER_BYTES || !read_until(http->fd, &in, in.len + 1)) {
            snprintf(error, error_cap, "no answer from %s:%s: %s", http->url.host,
                     http->url.port, in.len ? "headers cut short" : strerror(errno));
            goto done;
        }
        *nothing_received = false;
    }
    *nothing_received = false;
    if (sscanf(in.data, "HTTP/1.%*d %d", &status) != 1 || status < 100 || status > 599) {
        snprintf(error, error_cap, "not an HTTP answer from %s:%s", http->url.host,
                 http->url.port);
        status = -1;
        goto done;
    }
    size_t header_len = (size_t)(header_end - in.data);
    size_t value_len = 0;
    const char *value = header_value(in.data, header_end, "transfer-encoding", &value_len);
    bool chunked = value != NULL && value_len >= 7 &&
                   strncasecmp(value + value_len - 7, "chunked", 7) == 0;
    value = header_value(in.data, header_end, "connection", &value_len);
    bool keep = !(value != NULL && value_len == 5 && strncasecmp(value, "close", 5) == 0);
    dsec_buf_clear(response);
    if (chunked) {
        if (!read_chunked(http->fd, &in, header_len, response)) {
            snprintf(error, error_cap, "bad chunked answer from %s:%s", http->url.host,
                     http->url.port);
            status = -1;
            goto done;
        }
    } else {
        value = header_value(in.data, header_end, "content-length", &value_len);
        size_t length = 0;
        if (value != NULL) {
            length = (size_t)strtoull(value, NULL, 10);
        } else if (status >= 200 && status != 204 && status != 304) {
            keep = false; /* the body runs to the end of the connection */
            length = MAX_BODY_BYTES;
        }
        if (length > MAX_BODY_BYTES) {
            snprintf(error, error_cap, "answer from %s:%s too large", http->url.host,
                     http->url.port);
            status = -1;
            goto done;
        }
        bool complete = read_until(http->fd, &in, header_len + length);
        if (!complete && value != NULL) {
            snprintf(error, error_cap, "answer from %s:%s cut short", http->url.host,
                     http->url.port);
            status = -1;
            goto done;
        }
        size_t got = in.len - header_len < length ? in.len - header_len : length;
        dsec_buf_put(response, in.data + header_len, got);
    }
    dsec_buf_terminate(response);
    if (!keep)
        dsec_http_close(http);
done:
    dsec_buf_free(&in);
    if (status < 0)
        dsec_http_close(http);
    return status;
}

int dsec_http_post(dsec_http *http, const char *path, const char *token, const char *body,
                   size_t body_len, dsec_buf *response, char *error, size_t error_cap)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        bool reused = http->fd >= 0;
        if (!reused && (http->fd = connect_with_timeout(http, error, error_cap)) < 0)
            return -1;
        bool nothing_received = false;
        int status = exchange(http, path, token, body, body_len, response, &nothing_received,
                              error, error_cap);
        if (status >= 0 || !(reused && nothing_received))
            return status;
    }
    return -1;
}
