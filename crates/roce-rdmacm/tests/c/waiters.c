/* A thread waiting in a synchronous rdma_cm call (an id made without a channel: rdma_get_request, rdma_connect)
 * while another thread destroys or migrates that id (run by tests/c_edge.rs with the device on the address in
 * ROCEV2_IBV_IP, argv[1]). The waiter must return -1 (errno ECANCELED: the id's private channel went away) within a
 * bounded time, not block for ever on the destroyed channel; the other thread's call succeeds:
 *
 *  - rdma_get_request on a listening synchronous id, then rdma_destroy_id of that id;
 *  - rdma_get_request, then rdma_migrate_id of the id to a channel of the program;
 *  - rdma_connect towards an address where nothing answers (argv[2]), then rdma_destroy_id.
 * Prints "ok" and exits 0 when every check passed. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include "check.h"

struct waiter {
	struct rdma_cm_id *id;
	int connect; /* 0: rdma_get_request, 1: rdma_connect */
	volatile int done;
	int rc, err;
	pthread_t thread;
};

static void *wait_body(void *arg)
{
	struct waiter *w = arg;
	struct rdma_cm_id *req = NULL;
	if (w->connect)
		w->rc = rdma_connect(w->id, NULL);
	else
		w->rc = rdma_get_request(w->id, &req);
	w->err = errno;
	__atomic_store_n(&w->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

static void start(struct waiter *w)
{
	CHECK(pthread_create(&w->thread, NULL, wait_body, w) == 0);
	usleep(300 * 1000);
	CHECK(!__atomic_load_n(&w->done, __ATOMIC_SEQ_CST)); /* it really waits */
}

/* Joins the waiter if it finishes within 5 s; 0 when it did not (the thread is left behind). */
static int finish(struct waiter *w)
{
	for (int i = 0; i < 500 && !__atomic_load_n(&w->done, __ATOMIC_SEQ_CST); i++)
		usleep(10 * 1000);
	if (!__atomic_load_n(&w->done, __ATOMIC_SEQ_CST))
		return 0;
	pthread_join(w->thread, NULL);
	return 1;
}

static struct rdma_cm_id *sync_listener(const char *ip, int port)
{
	struct rdma_cm_id *id = NULL;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, ip, &a.sin_addr);
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&a) == 0);
	CHECK(rdma_listen(id, 1) == 0);
	return id;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;

	/* 1. destroy under a waiting rdma_get_request */
	struct waiter w1 = {.id = sync_listener(argv[1], 7471)};
	start(&w1);
	CHECK(rdma_destroy_id(w1.id) == 0);
	CHECK(finish(&w1));
	CHECK(w1.rc == -1 && w1.err == ECANCELED);

	/* 2. migrate under a waiting rdma_get_request */
	struct waiter w2 = {.id = sync_listener(argv[1], 7472)};
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch != NULL);
	start(&w2);
	CHECK(rdma_migrate_id(w2.id, ch) == 0);
	CHECK(finish(&w2));
	CHECK(w2.rc == -1 && w2.err == ECANCELED);
	CHECK(w2.id->channel == ch);
	CHECK(rdma_destroy_id(w2.id) == 0);
	rdma_destroy_event_channel(ch);

	/* 3. destroy under a waiting rdma_connect to a silent address */
	struct waiter w3 = {.connect = 1};
	struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(7473)};
	inet_pton(AF_INET, argv[2], &dst.sin_addr);
	CHECK(rdma_create_id(NULL, &w3.id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(w3.id, NULL, (struct sockaddr *)&dst, 2000) == 0);
	CHECK(rdma_resolve_route(w3.id, 2000) == 0);
	struct ibv_qp_init_attr attr = {.qp_type = IBV_QPT_RC,
					.cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	CHECK(rdma_create_qp(w3.id, NULL, &attr) == 0);
	start(&w3);
	CHECK(rdma_destroy_id(w3.id) == 0);
	CHECK(finish(&w3));
	CHECK(w3.rc == -1 && w3.err == ECANCELED);

	if (fails)
		return 1;
	printf("ok\n");
	return 0;
}
