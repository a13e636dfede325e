/* A panic inside the library never unwinds into C nor aborts the program: run by tests/c_api.rs with
 * ROCEV2_IBVERBS_INJECT_PANIC naming one entry point (src/guard.rs), which then panics on every call. The
 * program checks that the named verb answers with its error return and EIO, and that the verbs around it keep
 * working. Prints every failed check, "ok" and exits 0 when all pass. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int main(void)
{
	const char *which = getenv("ROCEV2_IBVERBS_INJECT_PANIC");
	if (!which) {
		fprintf(stderr, "ROCEV2_IBVERBS_INJECT_PANIC not set\n");
		return 1;
	}
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	struct ibv_context *ctx = list && num == 1 ? ibv_open_device(list[0]) : NULL;
	if (!ctx) {
		fprintf(stderr, "no device\n");
		return 1;
	}
	errno = 0;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!strcmp(which, "ibv_alloc_pd")) {
		CHECK(pd == NULL && errno == EIO);
		struct ibv_device_attr da;
		CHECK(ibv_query_device(ctx, &da) == 0); /* the library is still usable */
		CHECK(ibv_close_device(ctx) == 0);
		goto out;
	}
	CHECK(pd != NULL);
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	CHECK(cq != NULL);
	struct ibv_wc wc;
	int n = ibv_poll_cq(cq, 1, &wc);
	if (!strcmp(which, "ibv_poll_cq"))
		CHECK(n < 0);
	else
		CHECK(n == 0);
	int r = ibv_destroy_cq(cq);
	if (!strcmp(which, "ibv_destroy_cq"))
		CHECK(r == EIO);
	else
		CHECK(r == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
out:
	ibv_free_device_list(list);
	if (fails)
		return 1;
	printf("ok\n");
	return 0;
}
