/* A connection whose server process ends without rdma_disconnect (run by tests/c_edge.rs, two processes on two
 * loopback addresses, each with its device on its own address in ROCEV2_IBV_IP):
 *
 *   exitpeer server ADDR PORT exit|return   listens on ADDR:PORT, prints "listening", accepts one connection
 *                                           (with a QP), and after ESTABLISHED ends by exit(0) from a function,
 *                                           by returning from main, or by SIGTERM (default action; `term`),
 *                                           without rdma_disconnect or rdma_destroy_id: as with Linux's kernel
 *                                           rdma_cm, the library must send the DREQ for the connected id when the
 *                                           process ends;
 *   exitpeer client SRC DST PORT            connects from SRC to DST:PORT and must see RDMA_CM_EVENT_DISCONNECTED
 *                                           within 1 s of ESTABLISHED; prints "ok <ms>".
 * Exits 1 on a failed check. */
#define CHECK_EXIT_ON_FAIL
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include "check.h"

/* The next event of `ch` within `ms`, which must be `type`; acknowledged. */
static struct rdma_cm_id *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type type, int ms)
{
	struct pollfd p = {.fd = ch->fd, .events = POLLIN};
	struct rdma_cm_event *ev = NULL;
	int n = poll(&p, 1, ms);
	if (n != 1)
		fprintf(stderr, "no %s within %d ms\n", rdma_event_str(type), ms);
	CHECK(n == 1);
	CHECK(rdma_get_cm_event(ch, &ev) == 0 && ev);
	if (ev->event != type)
		fprintf(stderr, "expected %s, got %s (status %d)\n", rdma_event_str(type), rdma_event_str(ev->event),
			ev->status);
	CHECK(ev->event == type);
	struct rdma_cm_id *id = ev->id;
	CHECK(rdma_ack_cm_event(ev) == 0);
	return id;
}

static void sockaddr_of(struct sockaddr_in *a, const char *ip, const char *port)
{
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_port = htons((uint16_t)atoi(port));
	CHECK(inet_pton(AF_INET, ip, &a->sin_addr) == 1);
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
					      .max_recv_sge = 1}};
	CHECK(rdma_create_qp(id, NULL, &qa) == 0);
}

static void end_by_exit(void)
{
	exit(0);
}

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = NULL;
	struct sockaddr_in a, b;
	CHECK(ch != NULL);
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
				     .rnr_retry_count = 7};
	if (argc == 5 && strcmp(argv[1], "server") == 0) {
		sockaddr_of(&a, argv[2], argv[3]);
		CHECK(rdma_bind_addr(id, (struct sockaddr *)&a) == 0);
		CHECK(rdma_listen(id, 1) == 0);
		printf("listening\n");
		fflush(stdout);
		struct rdma_cm_id *conn = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 20000);
		make_qp(conn);
		CHECK(rdma_accept(conn, &cp) == 0);
		expect(ch, RDMA_CM_EVENT_ESTABLISHED, 5000);
		if (strcmp(argv[4], "exit") == 0)
			end_by_exit();
		if (strcmp(argv[4], "term") == 0) {
			/* SIGTERM's default action, as `kill PID` sends it; the program installs no handler. */
			kill(getpid(), SIGTERM);
			for (;;)
				pause();
		}
		return 0;
	}
	if (argc == 5 && strcmp(argv[1], "client") == 0) {
		sockaddr_of(&a, argv[2], "0");
		sockaddr_of(&b, argv[3], argv[4]);
		CHECK(rdma_resolve_addr(id, (struct sockaddr *)&a, (struct sockaddr *)&b, 2000) == 0);
		expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 5000);
		CHECK(rdma_resolve_route(id, 2000) == 0);
		expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 5000);
		make_qp(id);
		CHECK(rdma_connect(id, &cp) == 0);
		expect(ch, RDMA_CM_EVENT_ESTABLISHED, 5000);
		double t0 = now_ms();
		expect(ch, RDMA_CM_EVENT_DISCONNECTED, 1000);
		printf("ok %.0f\n", now_ms() - t0);
		CHECK(rdma_disconnect(id) == 0);
		rdma_destroy_qp(id);
		CHECK(rdma_destroy_id(id) == 0);
		rdma_destroy_event_channel(ch);
		return 0;
	}
	fprintf(stderr, "usage: exitpeer server ADDR PORT exit|return|term | exitpeer client SRC DST PORT\n");
	return 2;
}
