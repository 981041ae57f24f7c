#include <stdlib.h>

#include "runner.h"

int tests_run;
int tests_failed;
int current_failed;

int main(void)
{
    /* the library logs to stderr; the tests' own failures are what matters here */
    setenv("DSEC_ENDPOINT_TOKEN", "stub-enrolment-token", 1);
    ring_tests();
    cuda_memory_tests();
    encoding_tests();
    http_tests();
    probe_tests();
    printf("%d tests, %d failed\n", tests_run, tests_failed);
    return tests_failed ? 1 : 0;
}
