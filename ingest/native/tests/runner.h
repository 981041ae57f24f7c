/* A tiny test runner: TEST(name) defines a test, CHECK fails it with the line, RUN runs it
 * and prints "ok name" or "FAIL name". main() in test_main.c runs every group. */
#ifndef DSEC_TEST_RUNNER_H
#define DSEC_TEST_RUNNER_H

#include <stdio.h>

extern int tests_run;
extern int tests_failed;
extern int current_failed;

#define TEST(name) static void name(void)

#define CHECK(condition)                                                                     \
    do {                                                                                     \
        if (!(condition)) {                                                                  \
            fprintf(stderr, "  %s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #condition);  \
            current_failed = 1;                                                              \
            return;                                                                          \
        }                                                                                    \
    } while (0)

#define RUN(name)                                                                            \
    do {                                                                                     \
        current_failed = 0;                                                                  \
        name();                                                                              \
        tests_run++;                                                                         \
        tests_failed += current_failed;                                                      \
        printf("%s %s\n", current_failed ? "FAIL" : "ok", #name);                            \
        fflush(stdout);                                                                      \
    } while (0)

void ring_tests(void);
void cuda_memory_tests(void);
void encoding_tests(void);
void http_tests(void);
void probe_tests(void);

#endif
