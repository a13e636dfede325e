/* Object lifetimes as rdma-core's kernel handles give them, compiled against the system <infiniband/verbs.h> and
 * run by tests/c_api.rs with the device on $ROCEV2_IBV_IP (issues #21, #22):
 *  - a second destroy / dealloc / dereg / close of the same pointer, or a pointer the library never made, is
 *    EINVAL (not a double free);
 *  - ibv_destroy_qp releases the PD and CQs it was created with even when the program overwrote qp->pd and
 *    qp->send_cq;
 *  - ibv_dereg_mr succeeds while a posted receive names the MR; the receive completes with LOC_PROT_ERR, the QP
 *    raises IBV_EVENT_QP_FATAL through ibv_get_async_event (async_fd readable), and ibv_destroy_qp waits until
 *    another thread acknowledges it;
 *  - ibv_destroy_cq waits until every event ibv_get_cq_event handed out is acknowledged (another thread acks late);
 *  - a zero-length inline SGE with address 0 posts and completes;
 *  - a blocking ibv_get_cq_event returns -1/EINTR when a signal handler without SA_RESTART runs, and keeps
 *    waiting (then gets its event) when the handler has SA_RESTART;
 *  - ibv_close_device releases what the context still owns, its UDP port 4791 included (the port can be bound
 *    again at once), and the device opens again.
 * Prints every failed check, "ok" and exits 0 when all pass. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"

static int modify(struct ibv_qp *qp, enum ibv_qp_state s, uint32_t dest, union ibv_gid gid)
{
	struct ibv_qp_attr a = {0};
	a.qp_state = s;
	switch (s) {
	case IBV_QPS_INIT:
		a.port_num = 1;
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	case IBV_QPS_RTR:
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = dest;
		a.max_dest_rd_atomic = 1;
		a.min_rnr_timer = 1;
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		a.ah_attr.port_num = 1;
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
						     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	default:
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
	}
}

static int connect_pair(struct ibv_qp *a, struct ibv_qp *b, union ibv_gid gid)
{
	return modify(a, IBV_QPS_INIT, 0, gid) || modify(b, IBV_QPS_INIT, 0, gid) ||
	       modify(a, IBV_QPS_RTR, b->qp_num, gid) || modify(b, IBV_QPS_RTR, a->qp_num, gid) ||
	       modify(a, IBV_QPS_RTS, 0, gid) || modify(b, IBV_QPS_RTS, 0, gid);
}

/* A signalled inline SEND of `len` bytes at `addr` from a to b (b has a receive posted). */
static int send_inline(struct ibv_qp *a, void *addr, uint32_t len, uint64_t id)
{
	struct ibv_sge s = {.addr = (uintptr_t)addr, .length = len, .lkey = 0};
	struct ibv_send_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE},
			   *bad;
	return ibv_post_send(a, &w, &bad);
}

static int post_recv(struct ibv_qp *b, struct ibv_mr *mr)
{
	struct ibv_sge s = {.addr = (uintptr_t)mr->addr, .length = 64, .lkey = mr->lkey};
	struct ibv_recv_wr w = {.wr_id = 1, .sg_list = &s, .num_sge = 1}, *bad;
	return ibv_post_recv(b, &w, &bad);
}

/* n completions within a few seconds, all successful. */
static int drain(struct ibv_cq *cq, int n)
{
	struct ibv_wc wc;
	for (long i = 0; i < 50000000 && n > 0; i++) {
		int k = ibv_poll_cq(cq, 1, &wc);
		if (k == 1) {
			if (wc.status != IBV_WC_SUCCESS) {
				fprintf(stderr, "completion status %d\n", wc.status);
				return -1;
			}
			n--;
		}
	}
	return n;
}

static atomic_int acked;
static struct ibv_cq *late_cq;

static void *ack_late(void *arg)
{
	(void)arg;
	usleep(300 * 1000);
	atomic_store(&acked, 1);
	ibv_ack_cq_events(late_cq, 1);
	return NULL;
}

static atomic_int async_acked;
static struct ibv_async_event fatal;

static void *ack_async_late(void *arg)
{
	(void)arg;
	usleep(300 * 1000);
	atomic_store(&async_acked, 1);
	ibv_ack_async_event(&fatal);
	return NULL;
}

static struct ibv_qp *sig_a;
static void *send_later(void *arg)
{
	usleep(600 * 1000);
	send_inline(sig_a, arg, 4, 99);
	return NULL;
}

static void on_alarm(int sig)
{
	(void)sig;
}

static void arm_timer(int restart)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sa.sa_flags = restart ? SA_RESTART : 0;
	sigaction(SIGALRM, &sa, NULL);
	/* Repeating: a signal that lands while the waiting thread is between two blocking waits (driving a pass) is
	 * not seen by that wait (CompChannel::get_event_interruptible); the next one is. */
	struct itimerval t = {.it_value = {.tv_sec = 0, .tv_usec = 200 * 1000},
			      .it_interval = {.tv_sec = 0, .tv_usec = 100 * 1000}};
	setitimer(ITIMER_REAL, &t, NULL);
}

static void disarm_timer(void)
{
	struct itimerval t = {0};
	setitimer(ITIMER_REAL, &t, NULL);
}

int main(void)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || num != 1) {
		fprintf(stderr, "no device\n");
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	union ibv_gid gid;
	if (!ctx || ibv_query_gid(ctx, 1, 0, &gid)) {
		fprintf(stderr, "open/query failed\n");
		return 1;
	}
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, ch, 0);
	struct ibv_cq *cq2 = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(pd && mr && ch && cq && cq2);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1,
			.max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
	CHECK(a && b);
	CHECK(connect_pair(a, b, gid) == 0);

	/* A zero-length inline SGE at address 0. */
	CHECK(post_recv(b, mr) == 0);
	CHECK(send_inline(a, NULL, 0, 5) == 0);
	CHECK(drain(cq, 2) == 0);

	/* EINTR from a handler without SA_RESTART; none from one with it (the event then arrives). */
	arm_timer(0);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EINTR);
	disarm_timer();
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(post_recv(b, mr) == 0);
	sig_a = a;
	pthread_t sender;
	pthread_create(&sender, NULL, send_later, buf + 100);
	arm_timer(1);
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq);
	disarm_timer();
	pthread_join(sender, NULL);
	signal(SIGALRM, SIG_DFL);
	CHECK(drain(cq, 2) == 0);

	/* ibv_dereg_mr succeeds while a posted receive names the MR (the kernel's semantics, issue #16): the
	 * receive completes with a protection error and its QP goes to the error state. */
	struct ibv_mr *mr2 = ibv_reg_mr(pd, buf + 2048, 1024, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr2 != NULL);
	if (mr2) {
		struct ibv_sge rs = {.addr = (uintptr_t)mr2->addr, .length = 64, .lkey = mr2->lkey};
		struct ibv_recv_wr rw = {.wr_id = 77, .sg_list = &rs, .num_sge = 1}, *bad_r;
		CHECK(ibv_post_recv(b, &rw, &bad_r) == 0);
		CHECK(ibv_dereg_mr(mr2) == 0);
		struct ibv_wc wc;
		int n = 0;
		for (long i = 0; i < 50000000 && n == 0; i++)
			n = ibv_poll_cq(cq, 1, &wc);
		CHECK(n == 1 && wc.wr_id == 77 && wc.status == IBV_WC_LOC_PROT_ERR);
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;
		CHECK(ibv_query_qp(b, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_ERR);
		/* ... and raises IBV_EVENT_QP_FATAL on b, which async_fd announces. */
		struct pollfd pf = {.fd = ctx->async_fd, .events = POLLIN};
		CHECK(poll(&pf, 1, 5000) == 1);
		CHECK(ibv_get_async_event(ctx, &fatal) == 0 && fatal.event_type == IBV_EVENT_QP_FATAL &&
		      fatal.element.qp == b);
		CHECK(poll(&pf, 1, 0) == 0); /* nothing else pending */
	}
	/* Acknowledged late by another thread: ibv_destroy_qp(b) waits for it. */
	pthread_t async_acker;
	pthread_create(&async_acker, NULL, ack_async_late, NULL);

	/* The event just taken is acknowledged by another thread, late: destroy_cq waits for it. */
	late_cq = cq;
	pthread_t acker;
	pthread_create(&acker, NULL, ack_late, NULL);

	/* destroy_qp takes the PD and CQs from the library's record, not from fields the program overwrote. */
	a->pd = NULL;
	a->send_cq = cq2;
	a->recv_cq = cq2;
	CHECK(ibv_destroy_qp(a) == 0);
	CHECK(ibv_destroy_qp(a) == EINVAL);
	CHECK(ibv_destroy_qp(b) == 0);
	CHECK(atomic_load(&async_acked) == 1); /* not before the acknowledgement */
	pthread_join(async_acker, NULL);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(atomic_load(&acked) == 1); /* not before the acknowledgement */
	pthread_join(acker, NULL);
	CHECK(ibv_destroy_cq(cq) == EINVAL);
	CHECK(ibv_destroy_cq(cq2) == 0);
	CHECK(ibv_destroy_cq(cq2) == EINVAL);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == EINVAL);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dereg_mr(mr) == EINVAL);
	CHECK(ibv_dealloc_pd(pd) == 0); /* a's PD was released although a->pd was NULL */
	CHECK(ibv_dealloc_pd(pd) == EINVAL);
	struct ibv_pd fake = {.context = ctx};
	CHECK(ibv_dealloc_pd(&fake) == EINVAL);

	/* Leave objects behind, close: everything goes, the UDP port too. */
	pd = ibv_alloc_pd(ctx);
	mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	ch = ibv_create_comp_channel(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, ch, 0);
	ia.send_cq = ia.recv_cq = cq;
	a = ibv_create_qp(pd, &ia);
	CHECK(pd && mr && ch && cq && a);
	struct ibv_ah_attr aa = {.is_global = 1, .grh = {.dgid = gid}, .port_num = 1};
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah != NULL);
	CHECK(ibv_destroy_ah(ah) == 0 && ibv_destroy_ah(ah) == EINVAL);
	ah = ibv_create_ah(pd, &aa);
	CHECK(ibv_close_device(ctx) == 0);
	CHECK(ibv_close_device(ctx) == EINVAL);
	int s = socket(AF_INET, SOCK_DGRAM, 0);
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(4791)};
	memcpy(&sin.sin_addr, gid.raw + 12, 4);
	CHECK(bind(s, (struct sockaddr *)&sin, sizeof sin) == 0);
	close(s);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	CHECK(pd != NULL);
	CHECK(pd && ibv_dealloc_pd(pd) == 0);
	CHECK(ctx && ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	ibv_free_device_list(list); /* a second free is ignored, not a double free */
	free(buf);
	if (fails)
		return 1;
	printf("ok\n");
	return 0;
}
