/* The check macro of the C test programs run by tests/c_api.rs: `CHECK(cond)` prints
 * "FAILED line N: cond (errno E)" on stderr when `cond` is false, then counts the failure in `fails` (the program
 * reports them all and exits 1 at its end) or, with CHECK_EXIT_ON_FAIL defined before the include, exits 1 at once. */
#ifndef ROCEV2_TEST_CHECK_H
#define ROCEV2_TEST_CHECK_H
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef CHECK_EXIT_ON_FAIL
#define CHECK_FAILED() exit(1)
#else
static int fails;
#define CHECK_FAILED() fails++
#endif

#define CHECK(cond)                                                                                    \
	do {                                                                                           \
		if (!(cond)) {                                                                         \
			fprintf(stderr, "FAILED line %d: %s (errno %d)\n", __LINE__, #cond, errno);    \
			CHECK_FAILED();                                                                \
		}                                                                                      \
	} while (0)
#endif
