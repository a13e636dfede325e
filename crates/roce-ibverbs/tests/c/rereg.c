/* ibv_rereg_mr in place, as rdma-core's tests/test_mr.py (test_mr_rereg_*) use it on mlx5 and rxe, compiled
 * against the system <infiniband/verbs.h> and run by tests/c_api.rs with the device on $ROCEV2_IBV_IP (issue #16):
 *  - the MR keeps its lkey and rkey through a change of access, PD and translation (a peer keeps the R_Key it
 *    learned before);
 *  - a change of access applies to the next packet: without REMOTE_WRITE an RDMA WRITE with the old R_Key
 *    completes with REM_ACCESS_ERR, with it again the WRITE lands;
 *  - a change of PD succeeds while a posted receive names the MR; that receive (checked against the old PD) then
 *    fails when a SEND lands in it (receiver LOC_PROT_ERR, sender REM_OP_ERR), and so does one posted afterwards
 *    on a QP of the old PD; back in the QP's PD the traffic works again;
 *  - a change of translation succeeds while a posted receive names the old memory; that receive fails the same
 *    way; after the QPs are reset and reconnected, SENDs and RDMA WRITEs land in the new memory, the old memory is
 *    never written again;
 *  - moving a QP to RESET removes its completions still queued on its CQ (as mlx5's mlx5_cq_clean; pyverbs'
 *    test_mr_rereg_* reset the QPs after a failure and must not poll the flushes of before);
 *  - ibv_resize_cq with completions queued: below their number it is EINVAL, at it and above it keeps them all, in
 *    order, and cq->cqe follows (rxe rxe_cq_chk_attr; rdma-core tests/test_cq.py test_resize_cq).
 * Prints every failed check, "ok" and exits 0 when all pass. */
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
	case IBV_QPS_RESET:
		return ibv_modify_qp(qp, &a, IBV_QP_STATE);
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
		a.timeout = 10;
		a.retry_cnt = 2;
		a.rnr_retry = 1;
		a.max_rd_atomic = 1;
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
	}
}

/* RESET (from any state) to RTS, both QPs, connected to each other. */
static int connect_pair(struct ibv_qp *a, struct ibv_qp *b, union ibv_gid gid)
{
	return modify(a, IBV_QPS_RESET, 0, gid) || modify(b, IBV_QPS_RESET, 0, gid) ||
	       modify(a, IBV_QPS_INIT, 0, gid) || modify(b, IBV_QPS_INIT, 0, gid) ||
	       modify(a, IBV_QPS_RTR, b->qp_num, gid) || modify(b, IBV_QPS_RTR, a->qp_num, gid) ||
	       modify(a, IBV_QPS_RTS, 0, gid) || modify(b, IBV_QPS_RTS, 0, gid);
}

static int post_recv(struct ibv_qp *q, void *addr, uint32_t lkey)
{
	struct ibv_sge s = {.addr = (uintptr_t)addr, .length = 64, .lkey = lkey};
	struct ibv_recv_wr w = {.wr_id = 2, .sg_list = &s, .num_sge = 1}, *bad;
	return ibv_post_recv(q, &w, &bad);
}

static int post_send(struct ibv_qp *q, enum ibv_wr_opcode op, void *addr, uint32_t lkey, uint64_t raddr,
		     uint32_t rkey)
{
	struct ibv_sge s = {.addr = (uintptr_t)addr, .length = 64, .lkey = lkey};
	struct ibv_send_wr w = {.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = op,
				.send_flags = IBV_SEND_SIGNALED},
			   *bad;
	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = rkey;
	return ibv_post_send(q, &w, &bad);
}

/* The status of the completion of wr_id `id` (others are skipped), or -1 after a few seconds without one. */
static int status_of(struct ibv_cq *cq, uint64_t id)
{
	struct ibv_wc wc;
	for (long i = 0; i < 50000000; i++) {
		if (ibv_poll_cq(cq, 1, &wc) == 1 && wc.wr_id == id)
			return wc.status;
	}
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
	struct ibv_pd *pd = ibv_alloc_pd(ctx), *pd2 = ibv_alloc_pd(ctx);
	struct ibv_cq *acq = ibv_create_cq(ctx, 64, NULL, NULL, 0), *bcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	char *src = calloc(1, 4096), *buf = calloc(1, 4096), *buf2 = calloc(1, 4096);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(pd && pd2 && acq && bcq && src && buf && buf2 && smr && mr);
	struct ibv_qp_init_attr ia = {
		.send_cq = acq,
		.recv_cq = acq,
		.cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	ia.send_cq = ia.recv_cq = bcq;
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	CHECK(a && b);
	CHECK(connect_pair(a, b, gid) == 0);
	uint32_t lkey = mr->lkey, rkey = mr->rkey;

	/* Access: without REMOTE_WRITE the WRITE is refused, with it again it lands; the keys stay. */
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, IBV_ACCESS_LOCAL_WRITE) == 0);
	CHECK(mr->lkey == lkey && mr->rkey == rkey);
	memset(src, 'w', 64);
	CHECK(post_send(a, IBV_WR_RDMA_WRITE, src, smr->lkey, (uintptr_t)buf, rkey) == 0);
	CHECK(status_of(acq, 1) == IBV_WC_REM_ACCESS_ERR);
	CHECK(buf[0] == 0);
	CHECK(connect_pair(a, b, gid) == 0);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == 0);
	CHECK(mr->lkey == lkey && mr->rkey == rkey);
	CHECK(post_send(a, IBV_WR_RDMA_WRITE, src, smr->lkey, (uintptr_t)buf, rkey) == 0);
	CHECK(status_of(acq, 1) == IBV_WC_SUCCESS);
	CHECK(buf[0] == 'w' && buf[63] == 'w');

	/* PD, with a receive posted that names the MR. */
	CHECK(post_recv(b, buf, lkey) == 0);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd2, NULL, 0, 0) == 0);
	CHECK(mr->lkey == lkey && mr->rkey == rkey && mr->pd == pd2);
	memset(src, 's', 64);
	CHECK(post_send(a, IBV_WR_SEND, src, smr->lkey, 0, 0) == 0);
	CHECK(status_of(acq, 1) == IBV_WC_REM_OP_ERR);
	CHECK(status_of(bcq, 2) == IBV_WC_LOC_PROT_ERR);
	CHECK(buf[0] == 'w');
	CHECK(ibv_dealloc_pd(pd2) == EBUSY);
	CHECK(connect_pair(a, b, gid) == 0);
	/* Posted after the change, on a QP of the old PD: fails too. */
	CHECK(post_recv(b, buf, lkey) == 0);
	CHECK(post_send(a, IBV_WR_SEND, src, smr->lkey, 0, 0) == 0);
	CHECK(status_of(acq, 1) == IBV_WC_REM_OP_ERR);
	CHECK(status_of(bcq, 2) == IBV_WC_LOC_PROT_ERR);
	CHECK(connect_pair(a, b, gid) == 0);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_PD, pd, NULL, 0, 0) == 0);
	CHECK(mr->pd == pd);
	CHECK(post_recv(b, buf, lkey) == 0);
	CHECK(post_send(a, IBV_WR_SEND, src, smr->lkey, 0, 0) == 0);
	CHECK(status_of(acq, 1) == IBV_WC_SUCCESS);
	CHECK(status_of(bcq, 2) == IBV_WC_SUCCESS);
	CHECK(buf[0] == 's' && buf[63] == 's');

	/* Translation, with a receive posted into the old memory. */
	CHECK(post_recv(b, buf, lkey) == 0);
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf2, 4096, 0) == 0);
	CHECK(mr->lkey == lkey && mr->rkey == rkey && mr->addr == buf2 && mr->length == 4096);
	memset(src, 't', 64);
	CHECK(post_send(a, IBV_WR_SEND, src, smr->lkey, 0, 0) == 0);
	CHECK(status_of(acq, 1) == IBV_WC_REM_OP_ERR);
	CHECK(status_of(bcq, 2) == IBV_WC_LOC_PROT_ERR);
	CHECK(connect_pair(a, b, gid) == 0);
	CHECK(post_recv(b, buf2, lkey) == 0);
	CHECK(post_send(a, IBV_WR_SEND, src, smr->lkey, 0, 0) == 0);
	CHECK(status_of(acq, 1) == IBV_WC_SUCCESS);
	CHECK(status_of(bcq, 2) == IBV_WC_SUCCESS);
	CHECK(buf2[0] == 't' && buf2[63] == 't');
	memset(src, 'x', 64);
	CHECK(post_send(a, IBV_WR_RDMA_WRITE, src, smr->lkey, (uintptr_t)buf2 + 64, rkey) == 0);
	CHECK(status_of(acq, 1) == IBV_WC_SUCCESS);
	CHECK(buf2[64] == 'x' && buf2[127] == 'x');
	/* The old address is outside the MR now. */
	CHECK(post_send(a, IBV_WR_RDMA_WRITE, src, smr->lkey, (uintptr_t)buf, rkey) == 0);
	CHECK(status_of(acq, 1) == IBV_WC_REM_ACCESS_ERR);
	CHECK(buf[0] == 's');

	/* RESET cleans the QP's completions off its CQ. */
	CHECK(post_recv(b, buf2, lkey) == 0 && post_recv(b, buf2, lkey) == 0);
	struct ibv_qp_attr err = {.qp_state = IBV_QPS_ERR};
	CHECK(ibv_modify_qp(b, &err, IBV_QP_STATE) == 0);
	usleep(200 * 1000);
	CHECK(modify(b, IBV_QPS_RESET, 0, gid) == 0);
	struct ibv_wc none;
	CHECK(ibv_poll_cq(bcq, 1, &none) == 0);

	/* ibv_resize_cq with five completions queued (after the refused WRITE the QPs are in ERR: reconnect). */
	CHECK(connect_pair(a, b, gid) == 0);
	for (int i = 0; i < 5; i++)
		CHECK(post_send(a, IBV_WR_RDMA_WRITE, src, smr->lkey, (uintptr_t)buf2, rkey) == 0 || i < 0);
	usleep(500 * 1000); /* the five complete (over loopback, in well under a millisecond) */
	CHECK(ibv_resize_cq(acq, 4) == EINVAL && acq->cqe == 64);
	CHECK(ibv_resize_cq(acq, 5) == 0 && acq->cqe == 5);
	CHECK(ibv_resize_cq(acq, 4) == EINVAL && acq->cqe == 5);
	struct ibv_wc wc[8];
	CHECK(ibv_poll_cq(acq, 8, wc) == 5);
	CHECK(wc[0].status == IBV_WC_SUCCESS && wc[4].status == IBV_WC_SUCCESS && wc[4].opcode == IBV_WC_RDMA_WRITE);
	CHECK(ibv_resize_cq(acq, 4) == 0 && acq->cqe == 4);
	CHECK(ibv_resize_cq(acq, 100000000) == EINVAL && acq->cqe == 4);

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_dereg_mr(mr) == 0 && ibv_dereg_mr(smr) == 0);
	CHECK(ibv_destroy_cq(acq) == 0 && ibv_destroy_cq(bcq) == 0);
	CHECK(ibv_dealloc_pd(pd2) == 0 && ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	free(src);
	free(buf);
	free(buf2);
	if (fails)
		return 1;
	printf("ok\n");
	return 0;
}
