/* A growable byte buffer for the sender's JSON and HTTP text. Once an allocation fails the
 * buffer stays failed (`failed`), so a writer checks once at the end. */
#ifndef DSEC_BUF_H
#define DSEC_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct dsec_buf {
    char *data;
    size_t len;
    size_t cap;
    bool failed;
} dsec_buf;

void dsec_buf_free(dsec_buf *buf);
void dsec_buf_clear(dsec_buf *buf);
void dsec_buf_put(dsec_buf *buf, const char *bytes, size_t n);
void dsec_buf_puts(dsec_buf *buf, const char *text);
void dsec_buf_putc(dsec_buf *buf, char c);
void dsec_buf_int(dsec_buf *buf, int64_t value);
void dsec_buf_uint(dsec_buf *buf, uint64_t value);
/* A finite double exactly (17 significant digits); JSON null for NaN and infinities. */
void dsec_buf_double(dsec_buf *buf, double value);
/* A JSON string literal, quotes and escapes included. */
void dsec_buf_json_string(dsec_buf *buf, const char *text);
/* Keeps the data NUL-terminated (not counted in len); false when the buffer failed. */
bool dsec_buf_terminate(dsec_buf *buf);

/* The string value of the first `"key": "..."` in `json`, unescaped into `out` (at most
 * `cap` - 1 bytes); false when there is none or it does not fit. Enough for the gateway's
 * own answers, not a JSON parser. */
bool dsec_json_find_string(const char *json, const char *key, char *out, size_t cap);

#endif
