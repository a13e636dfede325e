/* raccept on a non-blocking listener never blocks (breaker finding, issue #17), run by
 * crates/roce-cli/tests/rdmacm.rs under `rocev2 run` in two namespaces:
 *   rsocket_accept server ADDR PORT [blocking]   |   rsocket_accept client ADDR PORT [blocking]
 * Client: first a request that never completes: a plain rdma_cm id without a QP sends a REQ carrying rsocket
 * connection data (rdma_connect), sees the server's REP (RDMA_CM_EVENT_CONNECT_RESPONSE) and never answers it
 * (no rdma_establish, so no RTU; the id is left as it is). Then an honest rsocket connects and exchanges 1000
 * bytes, which must finish within 10 s.
 * Server: a SOCK_NONBLOCK listener; raccept with nothing pending is EAGAIN; otherwise it waits in rpoll and each
 * raccept returns within 100 ms (before the fix the first one waited ~77 s for the RTU that never came, and the
 * honest client could not connect meanwhile). Both requests are accepted; the honest socket's data is echoed;
 * the stalled socket is still connecting: rrecv on it is EAGAIN and rpoll does not report it. The client stays
 * until the server closes the honest socket (its exit would end the stalled request: a REJ).
 * With `blocking` the listener is blocking and two threads call raccept: the one that took the stalled request
 * waits for its RTU without holding the listener, so the other accepts the honest client within 20 s (before
 * the fix the first held the listener while it waited, and the second could not take the next request).
 * Prints "ok" and exits 0 when every check holds; otherwise names the failed check and exits 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "check failed at line %d: %s (errno %d %s)\n", __LINE__, #c, \
	errno, strerror(errno)); exit(1); } } while (0)

#define LEN 1000

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void fill(char *b, int n) { for (int i = 0; i < n; i++) b[i] = (char)(i * 13 + 5); }
static int same(const char *b, int n) { for (int i = 0; i < n; i++) if (b[i] != (char)(i * 13 + 5)) return 0; return 1; }

static void server(struct sockaddr_in *a)
{
	alarm(60);
	int l = rsocket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
	CHECK(l >= 0);
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
	CHECK(rbind(l, (struct sockaddr *) a, sizeof *a) == 0);
	CHECK(rlisten(l, 4) == 0);
	printf("listening\n");
	fflush(stdout);
	CHECK(raccept(l, NULL, NULL) == -1 && errno == EAGAIN);

	int acc[2], n = 0, honest = -1, got = 0;
	char b[LEN];
	while (honest < 0) {
		struct pollfd f[3] = { { l, POLLIN, 0 } };
		for (int i = 0; i < n; i++)
			f[1 + i] = (struct pollfd) { acc[i], POLLIN, 0 };
		CHECK(rpoll(f, 1 + n, 30000) >= 1);
		if (f[0].revents & POLLIN) {
			double t0 = now_ms();
			int s = raccept(l, NULL, NULL);
			double dt = now_ms() - t0;
			printf("raccept: %d in %.1f ms\n", s, dt);
			fflush(stdout);
			CHECK(dt < 100);
			if (s >= 0) {
				CHECK(n < 2);
				acc[n++] = s;
			} else {
				CHECK(errno == EAGAIN);
			}
		}
		for (int i = 0; i < n; i++) {
			if (!f[1 + i].revents)
				continue;
			CHECK(f[1 + i].revents == POLLIN);
			int r = rrecv(acc[i], b + got, LEN - got, 0);
			CHECK(r > 0);
			got += r;
			if (got == LEN)
				honest = i;
		}
	}
	CHECK(same(b, LEN));
	CHECK(rsend(acc[honest], b, LEN, 0) == LEN);
	/* Both requests were accepted at once; the other one is still waiting for its RTU. */
	CHECK(n == 2);
	int stalled = acc[1 - honest];
	CHECK(rrecv(stalled, b, 1, 0) == -1 && errno == EAGAIN);
	struct pollfd sp = { stalled, POLLIN | POLLOUT, 0 };
	int pr = rpoll(&sp, 1, 200);
	if (pr != 0) { /* names what ended it */
		int err = 0;
		socklen_t el = sizeof err;
		rgetsockopt(stalled, SOL_SOCKET, SO_ERROR, &err, &el);
		fprintf(stderr, "stalled socket: rpoll %d revents %#x SO_ERROR %d\n", pr, sp.revents, err);
	}
	CHECK(pr == 0);
	/* The client waits for this close (its exit would end the stalled request too). */
	CHECK(rclose(acc[honest]) == 0);
	CHECK(rclose(stalled) == 0);
	CHECK(rclose(l) == 0);
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int accepted[2], naccepted;

static void *acceptor(void *arg)
{
	int s = raccept(*(int *) arg, NULL, NULL);
	pthread_mutex_lock(&mu);
	accepted[naccepted++] = s;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
	return NULL;
}

static void server_blocking(struct sockaddr_in *a)
{
	alarm(60);
	static int l;
	int one = 1;
	l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0);
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
	CHECK(rbind(l, (struct sockaddr *) a, sizeof *a) == 0);
	CHECK(rlisten(l, 4) == 0);
	printf("listening\n");
	fflush(stdout);
	pthread_t t[2];
	for (int i = 0; i < 2; i++) {
		CHECK(pthread_create(&t[i], NULL, acceptor, &l) == 0);
		CHECK(pthread_detach(t[i]) == 0);
	}
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 20;
	pthread_mutex_lock(&mu);
	while (naccepted == 0)
		CHECK(pthread_cond_timedwait(&cv, &mu, &until) == 0);
	int s = accepted[0];
	pthread_mutex_unlock(&mu);
	CHECK(s >= 0);
	char b[LEN];
	CHECK(rrecv(s, b, LEN, MSG_WAITALL) == LEN && same(b, LEN));
	CHECK(rsend(s, b, LEN, 0) == LEN);
	/* The other thread still waits for the stalled request's RTU. */
	pthread_mutex_lock(&mu);
	CHECK(naccepted == 1);
	pthread_mutex_unlock(&mu);
	CHECK(rclose(s) == 0);
	/* The listener stays open: the waiting thread ends with the process. */
}

static void wait_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;
	CHECK(rdma_get_cm_event(ch, &e) == 0);
	if (e->event != want)
		fprintf(stderr, "event %s, wanted %s\n", rdma_event_str(e->event), rdma_event_str(want));
	CHECK(e->event == want);
	CHECK(rdma_ack_cm_event(e) == 0);
}

static void put_be(unsigned char *p, unsigned long long v, int n)
{
	for (int i = n - 1; i >= 0; i--, v >>= 8)
		p[i] = (unsigned char) v;
}

static void client(struct sockaddr_in *a)
{
	alarm(30);
	/* The request that never completes. */
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch != NULL);
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *) a, 2000) == 0);
	wait_event(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	wait_event(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	/* rsocket connection data (struct rs_conn_data, 40 bytes): version 1, network byte order, 64 credits,
	 * a target list of one entry and a data buffer of 4096 bytes; nothing is ever written there. */
	unsigned char cd[40] = { 1, 1 };
	put_be(cd + 2, 64, 2);
	put_be(cd + 8, 0x10000, 8);
	put_be(cd + 16, 0x1234, 4);
	put_be(cd + 20, 16, 4);
	put_be(cd + 24, 0x20000, 8);
	put_be(cd + 32, 0x5678, 4);
	put_be(cd + 36, 4096, 4);
	struct rdma_conn_param p = {
		.private_data = cd, .private_data_len = sizeof cd, .flow_control = 1, .retry_count = 7,
		.rnr_retry_count = 7, .qp_num = 0x4242,
	};
	CHECK(rdma_connect(id, &p) == 0);
	wait_event(ch, RDMA_CM_EVENT_CONNECT_RESPONSE);
	printf("stalled request answered by a REP; no RTU follows\n");
	fflush(stdout);

	/* An honest rsocket client meanwhile. */
	double t0 = now_ms();
	int s = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	CHECK(rconnect(s, (struct sockaddr *) a, sizeof *a) == 0);
	char b[LEN];
	fill(b, LEN);
	CHECK(rsend(s, b, LEN, 0) == LEN);
	memset(b, 0, LEN);
	CHECK(rrecv(s, b, LEN, MSG_WAITALL) == LEN && same(b, LEN));
	double dt = now_ms() - t0;
	printf("honest client: connected and echoed in %.1f ms\n", dt);
	CHECK(dt < 10000);
	/* Stay until the server has checked the stalled socket and closes this one. */
	CHECK(rrecv(s, b, 1, 0) == 0);
	CHECK(rclose(s) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 4 && !(argc == 5 && !strcmp(argv[4], "blocking"))) {
		fprintf(stderr, "usage: %s server|client ADDR PORT [blocking]\n", argv[0]);
		return 2;
	}
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[3])) };
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1)
		return 2;
	if (!strcmp(argv[1], "server") && argc == 5)
		server_blocking(&a);
	else if (!strcmp(argv[1], "server"))
		server(&a);
	else
		client(&a);
	printf("ok\n");
	return 0;
}
