/* Closing a device under waiting threads (issue #21 finding), run by tests/c_api.rs with the device on
 * $ROCEV2_IBV_IP: one thread blocks in ibv_get_cq_event on a completion channel (its CQ armed, no traffic), another
 * in ibv_get_async_event; the main thread closes the device without destroying anything first (the library releases
 * what the context still owns). Both waiters return -1 with errno EIO within 2 s, as a read of a closed device's
 * uverbs event files does, instead of blocking for ever or touching freed memory. The completion channel outlives
 * the context, as in rdma-core: ibv_get_cq_event on it still fails with EIO and ibv_destroy_comp_channel frees it
 * (0); a second destroy is EINVAL. A watchdog (alarm) ends the program if a waiter hangs. Prints "ok" and exits 0
 * when every check passes. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK_EXIT_ON_FAIL
#include "check.h"

static struct ibv_comp_channel *ch;
static struct ibv_context *ctx;
static int cq_ret, cq_errno, async_ret, async_errno;

static void *cq_waiter(void *arg)
{
	(void)arg;
	struct ibv_cq *cq = NULL;
	void *cq_ctx = NULL;
	cq_ret = ibv_get_cq_event(ch, &cq, &cq_ctx);
	cq_errno = errno;
	return NULL;
}

static void *async_waiter(void *arg)
{
	(void)arg;
	struct ibv_async_event ev;
	async_ret = ibv_get_async_event(ctx, &ev);
	async_errno = errno;
	return NULL;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(void)
{
	alarm(20);
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list != NULL && num == 1);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL);
	ch = ibv_create_comp_channel(ctx);
	CHECK(ch != NULL);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
	CHECK(cq != NULL);
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);

	pthread_t t1, t2;
	CHECK(pthread_create(&t1, NULL, cq_waiter, NULL) == 0);
	CHECK(pthread_create(&t2, NULL, async_waiter, NULL) == 0);
	usleep(300 * 1000);
	double t0 = now();
	CHECK(ibv_close_device(ctx) == 0);
	CHECK(pthread_join(t1, NULL) == 0);
	CHECK(pthread_join(t2, NULL) == 0);
	double took = now() - t0;
	if (took >= 2.0)
		fprintf(stderr, "waiters returned %.3f s after the close\n", took);
	CHECK(took < 2.0);
	CHECK(cq_ret == -1 && cq_errno == EIO);
	CHECK(async_ret == -1 && async_errno == EIO);

	/* The channel is still the program's: no event, then destroyed once. */
	struct ibv_cq *c2 = NULL;
	void *x = NULL;
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &c2, &x) == -1 && errno == EIO);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == EINVAL);
	ibv_free_device_list(list);
	printf("ok\n");
	return 0;
}
