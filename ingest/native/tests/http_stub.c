#include "http_stub.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

static long count_samples(const char *body)
{
    long samples = 0;
    const char *key = "\"event_time_ms\":[";
    for (const char *at = strstr(body, key); at != NULL; at = strstr(at + 1, key)) {
        const char *c = at + strlen(key);
        if (*c == ']')
            continue;
        samples++;
        for (; *c && *c != ']'; c++)
            samples += *c == ',';
    }
    return samples;
}

static long count_of(const char *body, const char *what)
{
    long n = 0;
    for (const char *at = strstr(body, what); at != NULL; at = strstr(at + 1, what))
        n++;
    return n;
}

static void answer(http_stub *stub, int fd, int status, const char *body)
{
    char head[512];
    bool close_each = atomic_load(&stub->close_each);
    if (atomic_load(&stub->chunked)) {
        snprintf(head, sizeof(head),
                 "HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\n%s\r\n%zx\r\n%s\r\n0\r\n\r\n",
                 status, close_each ? "Connection: close\r\n" : "", strlen(body), body);
        send(fd, head, strlen(head), MSG_NOSIGNAL);
        return;
    }
    snprintf(head, sizeof(head),
             "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n%s\r\n",
             status, strlen(body), close_each ? "Connection: close\r\n" : "");
    send(fd, head, strlen(head), MSG_NOSIGNAL);
    send(fd, body, strlen(body), MSG_NOSIGNAL);
}

/* Serves requests on one connection until the client or the stub closes it. */
static void serve_with(http_stub *stub, int fd, char *in, size_t cap)
{
    size_t len = 0;
    in[0] = '\0';
    for (;;) {
        char *header_end = NULL;
        while ((header_end = len ? strstr(in, "\r\n\r\n") : NULL) == NULL) {
            struct pollfd ready = {.fd = fd, .events = POLLIN};
            if (poll(&ready, 1, 100) == 0) {
                if (atomic_load(&stub->stop))
                    return;
                continue;
            }
            ssize_t n = recv(fd, in + len, cap - 1 - len, 0);
            if (n <= 0)
                return;
            len += (size_t)n;
            in[len] = '\0';
        }
        size_t header_len = (size_t)(header_end + 4 - in);
        const char *length_at = strcasestr(in, "content-length:");
        size_t body_len = length_at ? strtoul(length_at + 15, NULL, 10) : 0;
        while (len < header_len + body_len) {
            ssize_t n = recv(fd, in + len, cap - 1 - len, 0);
            if (n <= 0)
                return;
            len += (size_t)n;
        }
        char saved = in[header_len + body_len];
        in[header_len + body_len] = '\0';
        const char *body = in + header_len;
        if (strncmp(in, "POST ", 5) == 0 && strstr(in, "/metrics HTTP/1.1") != NULL) {
            atomic_fetch_add(&stub->posts, 1);
            atomic_fetch_add(&stub->samples, count_samples(body));
            atomic_fetch_add(&stub->all_reduce_samples, count_of(body, "\"nccl_all_reduce\""));
            atomic_store(&stub->last_had_heartbeat, strstr(body, "\"heartbeat\"") != NULL);
            pthread_mutex_lock(&stub->lock);
            snprintf(stub->last_body, sizeof(stub->last_body), "%s", body);
            pthread_mutex_unlock(&stub->lock);
            int status = atomic_load(&stub->metrics_status);
            answer(stub, fd, status, status == 202 ? "{\"accepted\":1}" : "{\"error\":\"x\"}");
        } else if (strncmp(in, "POST /v1/runtimes HTTP/1.1", 26) == 0) {
            atomic_fetch_add(&stub->registrations, 1);
            answer(stub, fd, 201, "{\"runtime_id\":\"w\",\"registered\":true,"
                                  "\"token\":\"stub-runtime-token\"}");
        } else {
            answer(stub, fd, 404, "{\"error\":\"not_found\"}");
        }
        in[header_len + body_len] = saved;
        memmove(in, in + header_len + body_len, len - header_len - body_len);
        len -= header_len + body_len;
        in[len] = '\0';
        if (atomic_load(&stub->close_each))
            return;
    }
}

static void serve(http_stub *stub, int fd)
{
    size_t cap = 1 << 20;
    char *in = malloc(cap);
    if (in != NULL)
        serve_with(stub, fd, in, cap);
    free(in);
}

static void *run(void *arg)
{
    http_stub *stub = arg;
    while (!atomic_load(&stub->stop)) {
        struct pollfd ready = {.fd = stub->listen_fd, .events = POLLIN};
        if (poll(&ready, 1, 100) <= 0)
            continue;
        int fd = accept(stub->listen_fd, NULL, NULL);
        if (fd < 0)
            continue;
        atomic_fetch_add(&stub->connections, 1);
        serve(stub, fd);
        close(fd);
    }
    return NULL;
}

bool http_stub_start(http_stub *stub)
{
    memset(stub, 0, sizeof(*stub));
    atomic_store(&stub->metrics_status, 202);
    pthread_mutex_init(&stub->lock, NULL);
    stub->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = 0,
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t size = sizeof(address);
    if (stub->listen_fd < 0 || bind(stub->listen_fd, (struct sockaddr *)&address, size) != 0 ||
        listen(stub->listen_fd, 16) != 0 ||
        getsockname(stub->listen_fd, (struct sockaddr *)&address, &size) != 0)
        return false;
    stub->port = ntohs(address.sin_port);
    return pthread_create(&stub->thread, NULL, run, stub) == 0;
}

void http_stub_stop(http_stub *stub)
{
    atomic_store(&stub->stop, true);
    pthread_join(stub->thread, NULL);
    close(stub->listen_fd);
}
