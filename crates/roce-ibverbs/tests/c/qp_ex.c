/* Extended QPs and the new post-send API (ibv_wr_*), compiled against the system <infiniband/verbs.h> and run by
 * tests/c_api.rs with the device on $ROCEV2_IBV_IP (issue #16; rdma-core tests/test_qpex.py):
 *  - ibv_create_qp_ex answers as rxe: send_ops_flags outside the QP type's set (TSO, or RDMA or memory windows on
 *    UD), create_flags and unknown comp_mask bits are EOPNOTSUPP, a missing PD EINVAL;
 *    ibv_qp_to_qp_ex is NULL for a QP made without send_ops_flags;
 *  - between two RC QPs made with send_ops_flags: ibv_wr_send with an SGE, ibv_wr_send_imm with inline data (the
 *    buffer overwritten right after ibv_wr_set_inline_data), ibv_wr_rdma_write and ibv_wr_rdma_read with SGE
 *    lists, ibv_wr_atomic_fetch_add and ibv_wr_atomic_cmp_swp, several WRs in one ibv_wr_start …
 *    ibv_wr_complete, each completing with the wr_id and flags set in the ibv_qp_ex;
 *  - an operation outside the QP's send_ops_flags makes ibv_wr_complete return EOPNOTSUPP and posts nothing;
 *    ibv_wr_abort posts nothing; a second ibv_wr_start inside a batch never hangs: ibv_wr_complete answers EINVAL
 *    and posts nothing; without ibv_wr_start, builders do nothing and ibv_wr_complete is EINVAL; a UD QP's
 *    ibv_wr_set_ud_addr reaches the peer;
 *  - a receive queue takes exactly max_recv_wr receives, the next ibv_post_recv is ENOMEM.
 * Prints every failed check, "ok" and exits 0 when all pass. */
#include <arpa/inet.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static int modify(struct ibv_qp *qp, enum ibv_qp_state s, uint32_t dest, union ibv_gid gid)
{
	struct ibv_qp_attr a = {0};
	a.qp_state = s;
	switch (s) {
	case IBV_QPS_INIT:
		a.port_num = 1;
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
	case IBV_QPS_RTR:
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = dest;
		a.max_dest_rd_atomic = 4;
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
		a.max_rd_atomic = 4;
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
	}
}

static int post_recv(struct ibv_qp *q, void *addr, uint32_t len, uint32_t lkey, uint64_t id)
{
	struct ibv_sge s = {.addr = (uintptr_t)addr, .length = len, .lkey = lkey};
	struct ibv_recv_wr w = {.wr_id = id, .sg_list = &s, .num_sge = 1}, *bad;
	return ibv_post_recv(q, &w, &bad);
}

/* The next completion (status and opcode in *wc), or -1 after a few seconds without one. */
static int next(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long i = 0; i < 50000000; i++)
		if (ibv_poll_cq(cq, 1, wc) == 1)
			return 0;
	return -1;
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
	struct ibv_cq *acq = ibv_create_cq(ctx, 64, NULL, NULL, 0), *bcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	uint64_t *abuf = calloc(1, 4096), *bbuf = calloc(1, 4096);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
	struct ibv_mr *amr = ibv_reg_mr(pd, abuf, 4096, acc), *bmr = ibv_reg_mr(pd, bbuf, 4096, acc);
	CHECK(pd && acq && bcq && amr && bmr);

	/* Refusals. */
	struct ibv_qp_init_attr_ex ia = {
		.send_cq = acq,
		.recv_cq = acq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 1,
			.max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
	};
	uint64_t bad_ops[] = {IBV_QP_EX_WITH_TSO};
	for (unsigned i = 0; i < sizeof bad_ops / sizeof bad_ops[0]; i++) {
		ia.send_ops_flags = IBV_QP_EX_WITH_SEND | bad_ops[i];
		errno = 0;
		CHECK(ibv_create_qp_ex(ctx, &ia) == NULL && errno == EOPNOTSUPP);
	}
	ia.qp_type = IBV_QPT_UD;
	ia.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &ia) == NULL && errno == EOPNOTSUPP);
	ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW; /* windows: RC and UC only */
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &ia) == NULL && errno == EOPNOTSUPP);
	ia.qp_type = IBV_QPT_RC;
	ia.send_ops_flags = IBV_QP_EX_WITH_SEND;
	ia.comp_mask |= IBV_QP_INIT_ATTR_CREATE_FLAGS;
	ia.create_flags = IBV_QP_CREATE_SCATTER_FCS;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &ia) == NULL && errno == EOPNOTSUPP);
	ia.comp_mask = IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	errno = 0;
	CHECK(ibv_create_qp_ex(ctx, &ia) == NULL && errno == EINVAL);
	ia.comp_mask = IBV_QP_INIT_ATTR_PD;
	struct ibv_qp *plain = ibv_create_qp_ex(ctx, &ia);
	CHECK(plain && ibv_qp_to_qp_ex(plain) == NULL);
	CHECK(plain && ibv_destroy_qp(plain) == 0);

	/* Two RC QPs with the new post-send API (a without atomics, to see a refused operation). */
	ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_WRITE |
			    IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD |
			    IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP;
	struct ibv_qp *a = ibv_create_qp_ex(ctx, &ia);
	ia.send_cq = ia.recv_cq = bcq;
	ia.send_ops_flags = IBV_QP_EX_WITH_SEND;
	struct ibv_qp *b = ibv_create_qp_ex(ctx, &ia);
	CHECK(a && b);
	if (!a || !b)
		return 1;
	CHECK(modify(a, IBV_QPS_INIT, 0, gid) == 0 && modify(b, IBV_QPS_INIT, 0, gid) == 0 &&
	      modify(a, IBV_QPS_RTR, b->qp_num, gid) == 0 && modify(b, IBV_QPS_RTR, a->qp_num, gid) == 0 &&
	      modify(a, IBV_QPS_RTS, 0, gid) == 0 && modify(b, IBV_QPS_RTS, 0, gid) == 0);
	struct ibv_qp_ex *ax = ibv_qp_to_qp_ex(a), *bx = ibv_qp_to_qp_ex(b);
	CHECK(ax && bx && (void *)ax == (void *)a);
	struct ibv_wc wc;

	/* SEND with an SGE and SEND_WITH_IMM with inline data, in one batch. */
	char *abytes = (char *)abuf, *bbytes = (char *)bbuf;
	memset(abytes, 'a', 64);
	CHECK(post_recv(b, bbytes, 64, bmr->lkey, 21) == 0 && post_recv(b, bbytes + 64, 64, bmr->lkey, 22) == 0);
	char tmp[16];
	memset(tmp, 'i', sizeof tmp);
	ibv_wr_start(ax);
	ax->wr_id = 1;
	ax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(ax);
	ibv_wr_set_sge(ax, amr->lkey, (uintptr_t)abytes, 64);
	ax->wr_id = 2;
	ibv_wr_send_imm(ax, htonl(0x1234));
	ibv_wr_set_inline_data(ax, tmp, sizeof tmp);
	memset(tmp, 'x', sizeof tmp); /* copied already */
	CHECK(ibv_wr_complete(ax) == 0);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 1 && wc.opcode == IBV_WC_SEND);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 2);
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 21 && wc.byte_len == 64);
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 22 && wc.byte_len == 16 &&
	      (wc.wc_flags & IBV_WC_WITH_IMM) && wc.imm_data == htonl(0x1234));
	CHECK(bbytes[0] == 'a' && bbytes[63] == 'a' && bbytes[64] == 'i' && bbytes[79] == 'i');

	/* RDMA WRITE from two SGEs, RDMA READ back, then the atomics. */
	memset(abytes + 128, 'w', 32);
	memset(abytes + 256, 'v', 32);
	struct ibv_sge two[2] = {{(uintptr_t)(abytes + 128), 32, amr->lkey}, {(uintptr_t)(abytes + 256), 32, amr->lkey}};
	ibv_wr_start(ax);
	ax->wr_id = 3;
	ibv_wr_rdma_write(ax, bmr->rkey, (uintptr_t)(bbytes + 512));
	ibv_wr_set_sge_list(ax, 2, two);
	CHECK(ibv_wr_complete(ax) == 0);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 3 && wc.opcode == IBV_WC_RDMA_WRITE);
	CHECK(bbytes[512] == 'w' && bbytes[543] == 'w' && bbytes[544] == 'v' && bbytes[575] == 'v');
	ibv_wr_start(ax);
	ax->wr_id = 4;
	ibv_wr_rdma_read(ax, bmr->rkey, (uintptr_t)(bbytes + 512));
	ibv_wr_set_sge(ax, amr->lkey, (uintptr_t)(abytes + 1024), 64);
	CHECK(ibv_wr_complete(ax) == 0);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 4 && wc.opcode == IBV_WC_RDMA_READ);
	CHECK(abytes[1024] == 'w' && abytes[1087] == 'v');
	bbuf[256] = 40;
	ibv_wr_start(ax);
	ax->wr_id = 5;
	ibv_wr_atomic_fetch_add(ax, bmr->rkey, (uintptr_t)&bbuf[256], 2);
	ibv_wr_set_sge(ax, amr->lkey, (uintptr_t)&abuf[300], 8);
	ax->wr_id = 6;
	ibv_wr_atomic_cmp_swp(ax, bmr->rkey, (uintptr_t)&bbuf[256], 42, 7);
	ibv_wr_set_sge(ax, amr->lkey, (uintptr_t)&abuf[301], 8);
	CHECK(ibv_wr_complete(ax) == 0);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 5);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 6);
	CHECK(abuf[300] == 40 && abuf[301] == 42 && bbuf[256] == 7);

	/* b has only SEND: an RDMA WRITE in its batch fails the whole batch; abort posts nothing. */
	CHECK(post_recv(a, abytes, 64, amr->lkey, 31) == 0);
	ibv_wr_start(bx);
	bx->wr_id = 7;
	bx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(bx);
	ibv_wr_set_sge(bx, bmr->lkey, (uintptr_t)bbytes, 8);
	ibv_wr_rdma_write(bx, amr->rkey, (uintptr_t)abytes);
	ibv_wr_set_sge(bx, bmr->lkey, (uintptr_t)bbytes, 8);
	CHECK(ibv_wr_complete(bx) == EOPNOTSUPP);
	ibv_wr_start(bx);
	ibv_wr_send(bx);
	ibv_wr_set_sge(bx, bmr->lkey, (uintptr_t)bbytes, 8);
	ibv_wr_abort(bx);
	CHECK(ibv_poll_cq(bcq, 1, &wc) == 0 && ibv_poll_cq(acq, 1, &wc) == 0);
	/* A second ibv_wr_start before ibv_wr_complete / ibv_wr_abort (issue #21): rxe and mlx5 spin on the QP's lock
	 * for ever there (mlx5's single-threaded mode aborts). Here it never hangs and posts nothing unasked: the
	 * misuse is EINVAL at ibv_wr_complete, nothing of the batch is posted (the next batch's completions below come
	 * first), and the QP takes the next batch. alarm() turns a hang into a failure. */
	alarm(20);
	ibv_wr_start(bx);
	bx->wr_id = 10;
	ibv_wr_send(bx);
	ibv_wr_set_sge(bx, bmr->lkey, (uintptr_t)bbytes, 8);
	ibv_wr_start(bx);
	bx->wr_id = 11;
	ibv_wr_send(bx);
	ibv_wr_set_sge(bx, bmr->lkey, (uintptr_t)bbytes, 8);
	CHECK(ibv_wr_complete(bx) == EINVAL);
	/* Twice then abort: the lock is released as well. */
	ibv_wr_start(bx);
	ibv_wr_start(bx);
	ibv_wr_abort(bx);
	alarm(0);
	/* Builder calls and ibv_wr_complete without ibv_wr_start: nothing is built or posted, complete is EINVAL. */
	bx->wr_id = 12;
	ibv_wr_send(bx);
	ibv_wr_set_sge(bx, bmr->lkey, (uintptr_t)bbytes, 8);
	CHECK(ibv_wr_complete(bx) == EINVAL);
	ibv_wr_abort(bx);
	CHECK(ibv_poll_cq(bcq, 1, &wc) == 0 && ibv_poll_cq(acq, 1, &wc) == 0);
	ibv_wr_start(bx);
	bx->wr_id = 8;
	ibv_wr_send(bx);
	ibv_wr_set_sge(bx, bmr->lkey, (uintptr_t)bbytes, 8);
	CHECK(ibv_wr_complete(bx) == 0);
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 8);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 31 && wc.byte_len == 8);

	/* UD: ibv_wr_set_ud_addr. */
	struct ibv_qp_init_attr_ex ua = {
		.send_cq = acq,
		.recv_cq = bcq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_UD,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_SEND,
	};
	struct ibv_qp *u = ibv_create_qp_ex(ctx, &ua);
	CHECK(u != NULL);
	if (u) {
		struct ibv_qp_attr qa = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11};
		CHECK(ibv_modify_qp(u, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
		qa.qp_state = IBV_QPS_RTR;
		CHECK(ibv_modify_qp(u, &qa, IBV_QP_STATE) == 0);
		qa.qp_state = IBV_QPS_RTS;
		CHECK(ibv_modify_qp(u, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
		struct ibv_ah_attr ah_attr = {.is_global = 1, .grh = {.dgid = gid, .hop_limit = 1}, .port_num = 1};
		struct ibv_ah *ah = ibv_create_ah(pd, &ah_attr);
		CHECK(ah != NULL);
		CHECK(post_recv(u, bbytes + 2048, 40 + 64, bmr->lkey, 41) == 0);
		struct ibv_qp_ex *ux = ibv_qp_to_qp_ex(u);
		ibv_wr_start(ux);
		ux->wr_id = 9;
		ux->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(ux);
		ibv_wr_set_ud_addr(ux, ah, u->qp_num, 0x11);
		ibv_wr_set_sge(ux, amr->lkey, (uintptr_t)abytes, 64);
		CHECK(ibv_wr_complete(ux) == 0);
		CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 9);
		CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 41 && wc.byte_len == 40 + 64);
		CHECK(ibv_destroy_qp(u) == 0 && ibv_destroy_ah(ah) == 0);
	}

	/* A full receive queue: exactly max_recv_wr receives are taken, the next is ENOMEM (test_full_rq_bad_flow). */
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	CHECK(ibv_query_qp(b, &qa, IBV_QP_CAP, &qia) == 0);
	unsigned taken = 0;
	int r = 0;
	while (taken <= qa.cap.max_recv_wr + 8 && (r = post_recv(b, bbytes, 8, bmr->lkey, 50)) == 0)
		taken++;
	CHECK(taken == qa.cap.max_recv_wr && r == ENOMEM);

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_dereg_mr(amr) == 0 && ibv_dereg_mr(bmr) == 0);
	CHECK(ibv_destroy_cq(acq) == 0 && ibv_destroy_cq(bcq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	free(abuf);
	free(bbuf);
	if (fails)
		return 1;
	printf("ok\n");
	return 0;
}
