/* Shared receive queues through rocev2's libibverbs.so.1, compiled against the system <infiniband/verbs.h> and run
 * by tests/c_api.rs with the device on $ROCEV2_IBV_IP. One context; every pair of QPs is connected to each other over
 * UDP on that address:
 *  - device limits and create/modify/query errors (EINVAL as the kernel gives them), ibv_create_srq_ex (basic SRQ);
 *  - two RC QPs and a UD QP receiving from one SRQ (posted with ibv_post_srq_recv, 2 SGEs per WR): data verified,
 *    WRs consumed in post order, wc.qp_num naming the QP that took each one; ibv_post_recv on a QP on an SRQ: EINVAL;
 *  - RNR: an RC SEND to a QP on an empty SRQ from a requester with rnr_retry 0 completes with
 *    IBV_WC_RNR_RETRY_EXC_ERR; with rnr_retry 7 the SEND waits and completes once a WR is posted on the SRQ;
 *  - the limit: armed with ibv_modify_srq, it disarms (ibv_query_srq reads 0) once a WR taken leaves fewer WRs;
 *  - ibv_destroy_srq while QPs use it: EBUSY; after the QPs are gone: 0.
 * Prints "ok" and exits 0 when every check passes; otherwise prints the failed check and exits 1. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_EXIT_ON_FAIL
#include "check.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static union ibv_gid gid;

static void poll_n(struct ibv_wc *wc, int n)
{
	int got = 0;
	for (long i = 0; i < 200000000 && got < n; i++) {
		int k = ibv_poll_cq(cq, n - got, wc + got);
		CHECK(k >= 0);
		got += k;
	}
	CHECK(got == n);
}

static void to_rts(struct ibv_qp *qp, uint32_t dest, uint8_t rnr_retry)
{
	struct ibv_qp_attr a = {0};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 100;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 1;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 100;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = rnr_retry;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static struct ibv_qp *make_qp(enum ibv_qp_type type, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.srq = srq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = type,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp != NULL && qp->srq == srq);
	if (srq)
		CHECK(ia.cap.max_recv_wr == 0 && ia.cap.max_recv_sge == 0);
	return qp;
}

/* Posts SRQ WR `id`: buf[4096*id ..] as two SGEs of 1024 and 3072 bytes. */
static void post_srq(struct ibv_srq *srq, struct ibv_mr *mr, char *buf, uint64_t id)
{
	struct ibv_sge sg[2] = {
		{.addr = (uintptr_t)(buf + 4096 * id), .length = 1024, .lkey = mr->lkey},
		{.addr = (uintptr_t)(buf + 4096 * id + 1024), .length = 3072, .lkey = mr->lkey},
	};
	struct ibv_recv_wr wr = {.wr_id = id, .sg_list = sg, .num_sge = 2}, *bad = NULL;
	CHECK(ibv_post_srq_recv(srq, &wr, &bad) == 0);
}

static void send(struct ibv_qp *qp, struct ibv_mr *mr, char *src, uint32_t len, uint64_t id, struct ibv_ah *ah,
		 uint32_t remote_qpn)
{
	struct ibv_sge sg = {.addr = (uintptr_t)src, .length = len, .lkey = mr->lkey};
	struct ibv_send_wr wr = {.wr_id = id, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED}, *bad = NULL;
	if (ah) {
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = remote_qpn;
		wr.wr.ud.remote_qkey = 0x11;
	}
	CHECK(ibv_post_send(qp, &wr, &bad) == 0);
}

int main(void)
{
	int num = -1;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list != NULL && num == 1);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL);
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0);
	CHECK(da.max_srq > 0 && da.max_srq_wr >= 1024 && da.max_srq_sge >= 2);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	CHECK(cq != NULL);
	const size_t len = 64 * 4096;
	char *rx = calloc(1, len), *tx = calloc(1, len);
	CHECK(rx && tx);
	struct ibv_mr *rmr = ibv_reg_mr(pd, rx, len, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *tmr = ibv_reg_mr(pd, tx, len, IBV_ACCESS_LOCAL_WRITE);
	CHECK(rmr && tmr);
	for (size_t i = 0; i < len; i++)
		tx[i] = (char)(i * 7 + 3);

	/* Limits: what query_device reports is what create_srq enforces; granted values are written back. */
	struct ibv_srq_init_attr sa = {.srq_context = (void *)0x5,
				       .attr = {.max_wr = da.max_srq_wr + 1, .max_sge = 1}};
	errno = 0;
	CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EINVAL);
	sa.attr.max_wr = 8;
	sa.attr.max_sge = da.max_srq_sge + 1;
	errno = 0;
	CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EINVAL);
	sa.attr.max_wr = 0;
	sa.attr.max_sge = 1;
	errno = 0;
	CHECK(ibv_create_srq(pd, &sa) == NULL && errno == EINVAL);
	sa.attr.max_wr = 32;
	sa.attr.max_sge = 2;
	sa.attr.srq_limit = 7; /* ignored at creation */
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	CHECK(srq != NULL && srq->context == ctx && srq->pd == pd && srq->srq_context == (void *)0x5);
	CHECK(sa.attr.max_wr == 32 && sa.attr.max_sge == 2);
	struct ibv_srq_attr q;
	CHECK(ibv_query_srq(srq, &q) == 0 && q.max_wr == 32 && q.max_sge == 2 && q.srq_limit == 0);
	q.srq_limit = 33;
	CHECK(ibv_modify_srq(srq, &q, IBV_SRQ_LIMIT) == EINVAL); /* above max_wr */
	CHECK(ibv_modify_srq(srq, &q, 0x80) == EINVAL);          /* unknown mask bit */
	CHECK(ibv_dealloc_pd(pd) == EBUSY);                      /* the SRQ uses it */

	/* ibv_create_srq_ex (inline): a basic SRQ with a PD goes through ibv_create_srq. */
	struct ibv_srq_init_attr_ex sx = {.attr = {.max_wr = 4, .max_sge = 1},
					  .comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE,
					  .srq_type = IBV_SRQT_BASIC,
					  .pd = pd};
	struct ibv_srq *srq2 = ibv_create_srq_ex(ctx, &sx);
	CHECK(srq2 != NULL && sx.attr.max_wr == 4);
	CHECK(ibv_destroy_srq(srq2) == 0);

	/* RC: a0 -> b0 and a1 -> b1, b0 and b1 on the SRQ; UD: ua -> ub, ub on the SRQ. */
	struct ibv_qp *a0 = make_qp(IBV_QPT_RC, NULL), *b0 = make_qp(IBV_QPT_RC, srq);
	struct ibv_qp *a1 = make_qp(IBV_QPT_RC, NULL), *b1 = make_qp(IBV_QPT_RC, srq);
	to_rts(a0, b0->qp_num, 7);
	to_rts(b0, a0->qp_num, 7);
	to_rts(a1, b1->qp_num, 7);
	to_rts(b1, a1->qp_num, 7);
	struct ibv_qp *ua = make_qp(IBV_QPT_UD, NULL), *ub = make_qp(IBV_QPT_UD, srq);
	for (int k = 0; k < 2; k++) {
		struct ibv_qp *u = k ? ub : ua;
		struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11};
		CHECK(ibv_modify_qp(u, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
		a.qp_state = IBV_QPS_RTR;
		CHECK(ibv_modify_qp(u, &a, IBV_QP_STATE) == 0);
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 1;
		CHECK(ibv_modify_qp(u, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
	}
	struct ibv_ah_attr aha = {.is_global = 1, .grh = {.dgid = gid, .hop_limit = 1}, .port_num = 1};
	struct ibv_ah *ah = ibv_create_ah(pd, &aha);
	CHECK(ah != NULL);

	/* A QP on an SRQ has no receive queue of its own. */
	struct ibv_sge one = {.addr = (uintptr_t)rx, .length = 16, .lkey = rmr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 99, .sg_list = &one, .num_sge = 1}, *rbad = NULL;
	CHECK(ibv_post_recv(b0, &rwr, &rbad) == EINVAL && rbad == &rwr);

	/* A chain of 4 SRQ WRs, then 4 messages, one from each sender in turn (RC 3000 B = 3 packets, UD 900 B). */
	struct ibv_sge sg[4][2];
	struct ibv_recv_wr chain[4];
	for (int i = 0; i < 4; i++) {
		sg[i][0] = (struct ibv_sge){.addr = (uintptr_t)(rx + 4096 * i), .length = 1024, .lkey = rmr->lkey};
		sg[i][1] = (struct ibv_sge){.addr = (uintptr_t)(rx + 4096 * i + 1024), .length = 3072,
					    .lkey = rmr->lkey};
		chain[i] = (struct ibv_recv_wr){.wr_id = i, .sg_list = sg[i], .num_sge = 2,
						.next = i < 3 ? &chain[i + 1] : NULL};
	}
	CHECK(ibv_post_srq_recv(srq, chain, &rbad) == 0);
	struct ibv_qp *from[4] = {a0, ua, a1, a0};
	struct ibv_qp *to[4] = {b0, ub, b1, b0};
	struct ibv_wc wc[8];
	for (int i = 0; i < 4; i++) {
		int ud = from[i] == ua;
		send(from[i], tmr, tx + 8192 * i, ud ? 900 : 3000, 100 + i, ud ? ah : NULL, ub->qp_num);
		poll_n(wc, 2); /* the send's and the receive's completion, in either order */
		struct ibv_wc *r = wc[0].opcode == IBV_WC_RECV ? &wc[0] : &wc[1];
		struct ibv_wc *s = r == &wc[0] ? &wc[1] : &wc[0];
		CHECK(s->status == IBV_WC_SUCCESS && s->wr_id == (uint64_t)(100 + i) && s->opcode == IBV_WC_SEND);
		CHECK(r->status == IBV_WC_SUCCESS && r->opcode == IBV_WC_RECV && r->wr_id == (uint64_t)i);
		CHECK(r->qp_num == to[i]->qp_num);
		if (ud) {
			CHECK(r->byte_len == 940 && (r->wc_flags & IBV_WC_GRH) && r->src_qp == ua->qp_num);
			CHECK(memcmp(rx + 4096 * i + 40, tx + 8192 * i, 900) == 0);
		} else {
			CHECK(r->byte_len == 3000 && r->src_qp == from[i]->qp_num);
			CHECK(memcmp(rx + 4096 * i, tx + 8192 * i, 3000) == 0);
		}
	}

	/* The limit: 4 WRs posted, armed at 3. Taking one leaves 3 (still armed), the next leaves 2 (fired). */
	for (int i = 4; i < 8; i++)
		post_srq(srq, rmr, rx, i);
	q.srq_limit = 3;
	CHECK(ibv_modify_srq(srq, &q, IBV_SRQ_LIMIT) == 0);
	CHECK(ibv_query_srq(srq, &q) == 0 && q.srq_limit == 3);
	send(a0, tmr, tx, 64, 200, NULL, 0);
	poll_n(wc, 2);
	CHECK(ibv_query_srq(srq, &q) == 0 && q.srq_limit == 3);
	send(a0, tmr, tx, 64, 201, NULL, 0);
	poll_n(wc, 2);
	CHECK(ibv_query_srq(srq, &q) == 0 && q.srq_limit == 0);
	/* Resize keeps the 2 still posted; not below them. */
	q.max_wr = 1;
	CHECK(ibv_modify_srq(srq, &q, IBV_SRQ_MAX_WR) == EINVAL);
	q.max_wr = 64;
	CHECK(ibv_modify_srq(srq, &q, IBV_SRQ_MAX_WR) == 0);
	CHECK(ibv_query_srq(srq, &q) == 0 && q.max_wr == 64);
	for (int i = 0; i < 2; i++) {
		send(a1, tmr, tx, 64, 300 + i, NULL, 0);
		poll_n(wc, 2);
		struct ibv_wc *r = wc[0].opcode == IBV_WC_RECV ? &wc[0] : &wc[1];
		CHECK(r->status == IBV_WC_SUCCESS && r->wr_id == (uint64_t)(6 + i) && r->qp_num == b1->qp_num);
	}

	/* RNR: the SRQ is empty now. rnr_retry 0: the SEND fails with RNR_RETRY_EXC_ERR. */
	struct ibv_qp *c = make_qp(IBV_QPT_RC, NULL), *d = make_qp(IBV_QPT_RC, srq);
	to_rts(c, d->qp_num, 0);
	to_rts(d, c->qp_num, 7);
	send(c, tmr, tx, 64, 400, NULL, 0);
	poll_n(wc, 1);
	CHECK(wc[0].wr_id == 400 && wc[0].status == IBV_WC_RNR_RETRY_EXC_ERR);
	/* rnr_retry 7: the SEND waits for the RNR timer and retries until a WR is posted. */
	send(a0, tmr, tx + 100, 500, 401, NULL, 0);
	struct ibv_wc none;
	for (int i = 0; i < 1000; i++)
		CHECK(ibv_poll_cq(cq, 1, &none) == 0);
	post_srq(srq, rmr, rx, 9);
	poll_n(wc, 2);
	struct ibv_wc *r = wc[0].opcode == IBV_WC_RECV ? &wc[0] : &wc[1];
	struct ibv_wc *s = r == &wc[0] ? &wc[1] : &wc[0];
	CHECK(s->wr_id == 401 && s->status == IBV_WC_SUCCESS);
	CHECK(r->wr_id == 9 && r->status == IBV_WC_SUCCESS && r->byte_len == 500 && r->qp_num == b0->qp_num);
	CHECK(memcmp(rx + 4096 * 9, tx + 100, 500) == 0);

	/* Teardown: the SRQ is busy while QPs use it. */
	CHECK(ibv_destroy_srq(srq) == EBUSY);
	struct ibv_qp *qps[] = {a0, b0, a1, b1, ua, ub, c, d};
	for (size_t i = 0; i < sizeof qps / sizeof qps[0]; i++)
		CHECK(ibv_destroy_qp(qps[i]) == 0);
	CHECK(ibv_destroy_srq(srq) == 0);
	CHECK(ibv_destroy_ah(ah) == 0);
	CHECK(ibv_dereg_mr(rmr) == 0 && ibv_dereg_mr(tmr) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	free(rx);
	free(tx);
	puts("ok");
	return 0;
}
