#include "buf.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool reserve(dsec_buf *buf, size_t more)
{
    if (buf->failed)
        return false;
    if (buf->len + more + 1 <= buf->cap)
        return true;
    size_t cap = buf->cap ? buf->cap : 1024;
    while (cap < buf->len + more + 1)
        cap *= 2;
    char *data = realloc(buf->data, cap);
    if (data == NULL) {
        buf->failed = true;
        return false;
    }
    buf->data = data;
    buf->cap = cap;
    return true;
}

void dsec_buf_free(dsec_buf *buf)
{
    free(buf->data);
    memset(buf, 0, sizeof(*buf));
}

void dsec_buf_clear(dsec_buf *buf)
{
    buf->len = 0;
    buf->failed = false;
}

void dsec_buf_put(dsec_buf *buf, const char *bytes, size_t n)
{
    if (!reserve(buf, n))
        return;
    memcpy(buf->data + buf->len, bytes, n);
    buf->len += n;
}

void dsec_buf_puts(dsec_buf *buf, const char *text)
{
    dsec_buf_put(buf, text, strlen(text));
}

void dsec_buf_putc(dsec_buf *buf, char c)
{
    dsec_buf_put(buf, &c, 1);
}

void dsec_buf_int(dsec_buf *buf, int64_t value)
{
    char text[24];
    int n = snprintf(text, sizeof(text), "%" PRId64, value);
    dsec_buf_put(buf, text, (size_t)n);
}

void dsec_buf_uint(dsec_buf *buf, uint64_t value)
{
    char text[24];
    int n = snprintf(text, sizeof(text), "%" PRIu64, value);
    dsec_buf_put(buf, text, (size_t)n);
}

void dsec_buf_double(dsec_buf *buf, double value)
{
    if (!isfinite(value)) {
        dsec_buf_put(buf, "null", 4);
        return;
    }
    char text[32];
    int n = snprintf(text, sizeof(text), "%.17g", value);
    dsec_buf_put(buf, text, (size_t)n);
}

void dsec_buf_json_string(dsec_buf *buf, const char *text)
{
    static const char hex[] = "0123456789abcdef";
    dsec_buf_putc(buf, '"');
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\') {
            dsec_buf_putc(buf, '\\');
            dsec_buf_putc(buf, (char)*c);
        } else if (*c < 0x20) {
            char escaped[6] = {'\\', 'u', '0', '0', hex[*c >> 4], hex[*c & 15]};
            dsec_buf_put(buf, escaped, sizeof(escaped));
        } else {
            dsec_buf_putc(buf, (char)*c);
        }
    }
    dsec_buf_putc(buf, '"');
}

bool dsec_buf_terminate(dsec_buf *buf)
{
    if (!reserve(buf, 0))
        return false;
    buf->data[buf->len] = '\0';
    return true;
}

bool dsec_json_find_string(const char *json, const char *key, char *out, size_t cap)
{
    size_t key_len = strlen(key);
    for (const char *at = strchr(json, '"'); at != NULL; at = strchr(at + 1, '"')) {
        if (strncmp(at + 1, key, key_len) != 0 || at[1 + key_len] != '"')
            continue;
        const char *c = at + 2 + key_len;
        while (*c == ' ' || *c == '\t' || *c == '\r' || *c == '\n')
            c++;
        if (*c++ != ':')
            continue;
        while (*c == ' ' || *c == '\t' || *c == '\r' || *c == '\n')
            c++;
        if (*c++ != '"')
            continue;
        size_t n = 0;
        for (; *c && *c != '"'; c++) {
            char value = *c;
            if (value == '\\') {
                c++;
                /* the gateway's strings need no more than these */
                value = *c == 'n' ? '\n' : *c == 't' ? '\t' : *c;
                if (value == '\0')
                    return false;
            }
            if (n + 1 >= cap)
                return false;
            out[n++] = value;
        }
        if (*c != '"')
            return false;
        out[n] = '\0';
        return true;
    }
    return false;
}
