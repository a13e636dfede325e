/* rsockets at the ends of a connection (issue #17), run by tests/c_edge.rs with rocev2's libraries first on
 * LD_LIBRARY_PATH and the device on ADDR; one process, the peer in a second thread:
 *   rsclose listen|norecv|abort ADDR PORT
 * listen: rpoll on a listening rsocket reports nothing before a request, POLLOUT when asked (rsocket.c polls its
 *   accept queue, a socket pair, which is writable), and POLLIN once an rsocket client's request is pending (the
 *   client waits in a blocking rconnect meanwhile); the accepted socket reads the client's 1000 bytes and then
 *   the end of the stream (0) after the client's rclose.
 * norecv: the peer is a plain rdma_cm client with a QP that connects with rsocket connection data and never posts
 *   a receive, so every message the server's rsocket sends it (credits, the disconnect of rclose) meets RNR NAKs
 *   retried for ever (rnr_retry 7). rclose must still return (within 30 s) and the peer must then see
 *   RDMA_CM_EVENT_DISCONNECTED. Before the fix rclose waited for those sends for ever.
 * abort: the same kind of peer sends one data message longer than the buffer half it was given (RS_OP_DATA with
 *   100000 bytes, a zero-length RDMA WRITE WITH IMMEDIATE). rrecv must return -1 with EPROTO (an abort is not the
 *   end of the stream), SO_ERROR reads EPROTO, rpoll reports POLLERR and rsend ECONNRESET. Before the fix rrecv
 *   returned 0 as after an orderly close.
 * Prints "ok" and exits 0 when every check holds; otherwise names the failed check and exits 1. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "check failed at line %d: %s (errno %d %s)\n", __LINE__, #c, \
	errno, strerror(errno)); exit(1); } } while (0)

#define LEN 1000

static struct sockaddr_in addr;
static const char *step = "start";

static void on_alarm(int sig)
{
	(void) sig;
	static char m[200];
	int n = snprintf(m, sizeof m, "timed out in step: %s\n", step);
	if (write(2, m, n) < 0)
		_exit(1);
	_exit(1);
}

static double now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void fill(char *b, int n) { for (int i = 0; i < n; i++) b[i] = (char)(i * 11 + 3); }
static int same(const char *b, int n) { for (int i = 0; i < n; i++) if (b[i] != (char)(i * 11 + 3)) return 0; return 1; }

static void *honest_client(void *arg)
{
	(void) arg;
	int s = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(s >= 0);
	CHECK(rconnect(s, (struct sockaddr *) &addr, sizeof addr) == 0);
	char b[LEN];
	fill(b, LEN);
	CHECK(rsend(s, b, LEN, 0) == LEN);
	CHECK(rclose(s) == 0);
	return NULL;
}

/* A plain rdma_cm peer: a QP on its own CQ, a registered target list and buffer, rsocket connection data. */
struct raw {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *tmr, *bmr;
	unsigned char tgt[32];
	unsigned char buf[4096];
};

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

static void raw_connect(struct raw *r, int recvs)
{
	CHECK((r->ch = rdma_create_event_channel()) != NULL);
	CHECK(rdma_create_id(r->ch, &r->id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(r->id, NULL, (struct sockaddr *) &addr, 2000) == 0);
	wait_event(r->ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(rdma_resolve_route(r->id, 2000) == 0);
	wait_event(r->ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	CHECK((r->pd = ibv_alloc_pd(r->id->verbs)) != NULL);
	CHECK((r->cq = ibv_create_cq(r->id->verbs, 64, NULL, NULL, 0)) != NULL);
	struct ibv_qp_init_attr qa = {
		.send_cq = r->cq, .recv_cq = r->cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	CHECK(rdma_create_qp(r->id, r->pd, &qa) == 0);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	CHECK((r->tmr = ibv_reg_mr(r->pd, r->tgt, sizeof r->tgt, acc)) != NULL);
	CHECK((r->bmr = ibv_reg_mr(r->pd, r->buf, sizeof r->buf, acc)) != NULL);
	for (int i = 0; i < recvs; i++) {
		struct ibv_recv_wr wr = { .wr_id = i }, *bad;
		CHECK(ibv_post_recv(r->id->qp, &wr, &bad) == 0);
	}
	/* struct rs_conn_data: version 1, network byte order, 16 credits, our target list (2 entries) and buffer. */
	unsigned char cd[40] = { 1, 1 };
	put_be(cd + 2, 16, 2);
	put_be(cd + 8, (uintptr_t) r->tgt, 8);
	put_be(cd + 16, r->tmr->rkey, 4);
	put_be(cd + 20, 2, 4);
	put_be(cd + 24, (uintptr_t) r->buf, 8);
	put_be(cd + 32, r->bmr->rkey, 4);
	put_be(cd + 36, sizeof r->buf, 4);
	struct rdma_conn_param p = {
		.private_data = cd, .private_data_len = sizeof cd, .flow_control = 1, .retry_count = 7,
		.rnr_retry_count = 7,
	};
	CHECK(rdma_connect(r->id, &p) == 0);
	wait_event(r->ch, RDMA_CM_EVENT_ESTABLISHED);
}

static int raw_recvs;
static volatile int raw_ready;

/* Connects, optionally sends the oversized data message, then waits for the server's disconnect. */
static void *raw_client(void *arg)
{
	int abort_ = *(int *) arg;
	static struct raw r;
	raw_connect(&r, raw_recvs);
	if (abort_) {
		struct ibv_send_wr wr = {
			.wr_id = 1, .opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .num_sge = 0,
			.imm_data = htonl(100000), /* RS_OP_DATA (0) << 29 | 100000 bytes */
		}, *bad;
		CHECK(ibv_post_send(r.id->qp, &wr, &bad) == 0);
		struct ibv_wc wc;
		int n;
		double t0 = now_ms();
		do {
			n = ibv_poll_cq(r.cq, 1, &wc);
			CHECK(n >= 0);
			if (n == 1 && wc.wr_id != 1)
				n = 0; /* a receive: the server's credits */
			if (n == 0)
				usleep(1000);
		} while (n == 0 && now_ms() - t0 < 20000);
		CHECK(n == 1 && wc.status == IBV_WC_SUCCESS);
	}
	raw_ready = 1;
	double t0 = now_ms();
	wait_event(r.ch, RDMA_CM_EVENT_DISCONNECTED);
	fprintf(stderr, "peer: DISCONNECTED %.0f ms after it was ready\n", now_ms() - t0);
	rdma_destroy_qp(r.id);
	CHECK(rdma_destroy_id(r.id) == 0);
	return NULL;
}

static int listener(void)
{
	int l = rsocket(AF_INET, SOCK_STREAM, 0), one = 1;
	CHECK(l >= 0);
	CHECK(rsetsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
	CHECK(rbind(l, (struct sockaddr *) &addr, sizeof addr) == 0);
	CHECK(rlisten(l, 4) == 0);
	return l;
}

static void test_listen(void)
{
	int l = listener();
	step = "rpoll on a listener with nothing pending";
	struct pollfd f = { l, POLLIN, 0 };
	CHECK(rpoll(&f, 1, 0) == 0 && f.revents == 0);
	CHECK(rpoll(&f, 1, 200) == 0 && f.revents == 0);
	f.events = POLLOUT;
	CHECK(rpoll(&f, 1, 0) == 1 && f.revents == POLLOUT);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, honest_client, NULL) == 0);
	step = "rpoll on a listener with a request pending";
	f.events = POLLIN;
	f.revents = 0;
	CHECK(rpoll(&f, 1, 20000) == 1 && f.revents == POLLIN);
	int s = raccept(l, NULL, NULL);
	CHECK(s >= 0);
	step = "data, then the end of the stream";
	char b[LEN];
	CHECK(rrecv(s, b, LEN, MSG_WAITALL) == LEN && same(b, LEN));
	CHECK(rrecv(s, b, LEN, 0) == 0);
	CHECK(pthread_join(t, NULL) == 0);
	CHECK(rclose(s) == 0);
	f.events = POLLIN;
	CHECK(rpoll(&f, 1, 0) == 0);
	CHECK(rclose(l) == 0);
}

static void test_norecv(void)
{
	int l = listener();
	pthread_t t;
	int abort_ = 0;
	raw_recvs = 0;
	CHECK(pthread_create(&t, NULL, raw_client, &abort_) == 0);
	step = "raccept of the peer that posts no receives";
	int s = raccept(l, NULL, NULL);
	CHECK(s >= 0);
	while (!raw_ready)
		usleep(1000);
	/* A non-blocking look grants the peer credits (a message it cannot take). */
	char b[16];
	CHECK(rrecv(s, b, sizeof b, MSG_DONTWAIT) == -1 && errno == EAGAIN);
	step = "rclose with sends the peer never takes";
	double t0 = now_ms();
	CHECK(rclose(s) == 0);
	double dt = now_ms() - t0;
	fprintf(stderr, "rclose returned in %.0f ms\n", dt);
	CHECK(dt < 30000);
	step = "the peer's DISCONNECTED";
	CHECK(pthread_join(t, NULL) == 0);
	CHECK(rclose(l) == 0);
}

static void test_abort(void)
{
	int l = listener();
	pthread_t t;
	int abort_ = 1;
	raw_recvs = 16;
	CHECK(pthread_create(&t, NULL, raw_client, &abort_) == 0);
	step = "raccept of the peer that sends an oversized message";
	int s = raccept(l, NULL, NULL);
	CHECK(s >= 0);
	step = "rrecv after the peer's protocol violation";
	char b[LEN];
	ssize_t n = rrecv(s, b, sizeof b, 0);
	if (n != -1)
		fprintf(stderr, "rrecv returned %zd\n", n);
	CHECK(n == -1 && errno == EPROTO);
	int err = 0;
	socklen_t el = sizeof err;
	CHECK(rgetsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == EPROTO);
	struct pollfd f = { s, POLLIN, 0 };
	CHECK(rpoll(&f, 1, 0) == 1 && (f.revents & POLLERR));
	CHECK(rsend(s, b, 1, 0) == -1 && errno == ECONNRESET);
	step = "rclose of the aborted socket";
	CHECK(rclose(s) == 0);
	step = "the peer's DISCONNECTED";
	CHECK(pthread_join(t, NULL) == 0);
	CHECK(rclose(l) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: %s listen|norecv|abort ADDR PORT\n", argv[0]);
		return 2;
	}
	addr.sin_family = AF_INET;
	addr.sin_port = htons(atoi(argv[3]));
	if (inet_pton(AF_INET, argv[2], &addr.sin_addr) != 1)
		return 2;
	signal(SIGALRM, on_alarm);
	alarm(60);
	if (!strcmp(argv[1], "listen"))
		test_listen();
	else if (!strcmp(argv[1], "norecv"))
		test_norecv();
	else if (!strcmp(argv[1], "abort"))
		test_abort();
	else
		return 2;
	printf("ok\n");
	return 0;
}
