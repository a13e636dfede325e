/* Memory windows, RDMA atomic write and the import verbs, compiled against the system <infiniband/verbs.h> and run by
 * tests/c_api.rs with the device on $ROCEV2_IBV_IP (issue #16; rdma-core tests/test_mr.py MWTest, test_qpex.py,
 * test_shared_pd.py):
 *  - ibv_query_device offers windows (max_mw, IBV_DEVICE_MEM_WINDOW and _TYPE_2B); ibv_alloc_mw of type 3 is
 *    EINVAL; a PD with a window cannot be deallocated (EBUSY);
 *  - between two RC QPs of one context: a type 1 window bound with ibv_bind_mw (the library advances mw->rkey's key
 *    byte) and a type 2 window bound with an IBV_WR_BIND_MW WR carry RDMA WRITEs into an MR that has no remote
 *    rights of its own (LOCAL_WRITE | MW_BIND), exactly inside their range;
 *  - SEND_WITH_INV of the type 2 key completes the receive with IBV_WC_WITH_INV and the key; the window is bound
 *    again and IBV_WR_LOCAL_INV frees it (IBV_WC_LOCAL_INV); a zero-length ibv_bind_mw unbinds the type 1 window;
 *  - IBV_WR_ATOMIC_WRITE through ibv_post_send puts its SGE's 8 bytes at the remote address;
 *  - on extended QPs: ibv_wr_bind_mw binds the freed type 2 window again, ibv_wr_atomic_write writes 8 bytes
 *    through it (copied at the call), ibv_wr_local_inv frees it;
 *  - ibv_import_device(dup(ctx->cmd_fd)) opens a second context, ibv_import_pd / ibv_import_mr give handles onto
 *    the PD and MR (same keys), a QP of the imported context on the imported PD writes with the imported MR;
 *    unknown handles are EINVAL, a descriptor that is no context's EOPNOTSUPP, a closed one EBADF;
 *  - ibv_dereg_mr of the MR while windows are bound to it is EINVAL (rxe rxe_dereg_mr), and the MR stays usable;
 *  - finally an RDMA WRITE through the invalidated type 2 key completes with IBV_WC_REM_ACCESS_ERR.
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

static int connect_pair(struct ibv_qp *a, struct ibv_qp *b, union ibv_gid gid)
{
	return modify(a, IBV_QPS_INIT, 0, gid) || modify(b, IBV_QPS_INIT, 0, gid) ||
	       modify(a, IBV_QPS_RTR, b->qp_num, gid) || modify(b, IBV_QPS_RTR, a->qp_num, gid) ||
	       modify(a, IBV_QPS_RTS, 0, gid) || modify(b, IBV_QPS_RTS, 0, gid);
}

/* The next completion, or -1 after a few seconds without one. */
static int next(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long i = 0; i < 50000000; i++)
		if (ibv_poll_cq(cq, 1, wc) == 1)
			return 0;
	return -1;
}

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	return ibv_create_qp(pd, &ia);
}

/* One signaled WR of `opcode` from `q` with one SGE (or none when len is 0). */
static int post(struct ibv_qp *q, uint64_t id, enum ibv_wr_opcode opcode, void *addr, uint32_t len, uint32_t lkey,
		uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge s = {.addr = (uintptr_t)addr, .length = len, .lkey = lkey};
	struct ibv_send_wr w = {.wr_id = id, .sg_list = &s, .num_sge = len ? 1 : 0, .opcode = opcode,
				.send_flags = IBV_SEND_SIGNALED}, *bad;
	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = rkey;
	if (opcode == IBV_WR_SEND_WITH_INV || opcode == IBV_WR_LOCAL_INV)
		w.invalidate_rkey = rkey;
	return ibv_post_send(q, &w, &bad);
}

static int bind2(struct ibv_qp *q, uint64_t id, struct ibv_mw *mw, uint32_t rkey, struct ibv_mr *mr, void *addr,
		 uint64_t len)
{
	struct ibv_send_wr w = {.wr_id = id, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED}, *bad;
	w.bind_mw.mw = mw;
	w.bind_mw.rkey = rkey;
	w.bind_mw.bind_info = (struct ibv_mw_bind_info){
		.mr = mr, .addr = (uintptr_t)addr, .length = len, .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};
	return ibv_post_send(q, &w, &bad);
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
	struct ibv_device_attr da;
	if (!ctx || ibv_query_gid(ctx, 1, 0, &gid) || ibv_query_device(ctx, &da)) {
		fprintf(stderr, "open/query failed\n");
		return 1;
	}
	CHECK(da.max_mw > 0 && (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
	      (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B));
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *acq = ibv_create_cq(ctx, 64, NULL, NULL, 0), *bcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	char *abuf = calloc(1, 4096), *bbuf = calloc(1, 4096), *cbuf = calloc(1, 4096);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
	struct ibv_mr *amr = ibv_reg_mr(pd, abuf, 4096, acc);
	struct ibv_mr *bmr = ibv_reg_mr(pd, bbuf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
	struct ibv_mr *cmr = ibv_reg_mr(pd, cbuf, 4096, acc);
	CHECK(pd && acq && bcq && amr && bmr && cmr);

	errno = 0;
	CHECK(ibv_alloc_mw(pd, 3) == NULL && errno == EINVAL);
	struct ibv_mw *mw1 = ibv_alloc_mw(pd, IBV_MW_TYPE_1), *mw2 = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
	CHECK(mw1 && mw2 && mw1->pd == pd && mw1->type == IBV_MW_TYPE_1 && mw2->type == IBV_MW_TYPE_2);
	if (!mw1 || !mw2)
		return 1;
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	struct ibv_mw *mw3 = ibv_alloc_mw(pd2, IBV_MW_TYPE_2);
	CHECK(ibv_dealloc_pd(pd2) == EBUSY);
	CHECK(ibv_dealloc_mw(mw3) == 0 && ibv_dealloc_pd(pd2) == 0);

	struct ibv_qp *a = rc_qp(pd, acq), *b = rc_qp(pd, bcq);
	CHECK(a && b && connect_pair(a, b, gid) == 0);
	struct ibv_wc wc;

	/* Type 1: ibv_bind_mw on b's send queue, 128 bytes at bbuf + 64. */
	uint32_t k1_old = mw1->rkey;
	struct ibv_mw_bind mb = {.wr_id = 10, .send_flags = IBV_SEND_SIGNALED,
				 .bind_info = {.mr = bmr, .addr = (uintptr_t)(bbuf + 64), .length = 128,
					       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE}};
	CHECK(ibv_bind_mw(b, mw1, &mb) == 0 && mw1->rkey == ibv_inc_rkey(k1_old));
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 10 && wc.opcode == IBV_WC_BIND_MW);
	memset(abuf, 'w', 128);
	CHECK(post(a, 1, IBV_WR_RDMA_WRITE, abuf, 128, amr->lkey, (uintptr_t)(bbuf + 64), mw1->rkey) == 0);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 1);
	CHECK(bbuf[63] == 0 && bbuf[64] == 'w' && bbuf[191] == 'w' && bbuf[192] == 0);

	/* Type 2: a BIND_MW WR with a key of our choosing, 256 bytes at bbuf + 1024. */
	uint32_t k2 = ibv_inc_rkey(mw2->rkey);
	CHECK(bind2(b, 11, mw2, k2, bmr, bbuf + 1024, 256) == 0);
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 11 && wc.opcode == IBV_WC_BIND_MW);
	memset(abuf, 'x', 256);
	CHECK(post(a, 2, IBV_WR_RDMA_WRITE, abuf, 256, amr->lkey, (uintptr_t)(bbuf + 1024), k2) == 0);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 2);
	CHECK(bbuf[1023] == 0 && bbuf[1024] == 'x' && bbuf[1279] == 'x' && bbuf[1280] == 0);

	/* Windows are bound to bmr: ibv_dereg_mr fails with EINVAL (rxe rxe_dereg_mr while num_mw > 0) and bmr stays
	 * registered (used below, deregistered at the end once its windows are unbound). */
	CHECK(ibv_dereg_mr(bmr) == EINVAL);

	/* SEND_WITH_INV of the type 2 key: the receive reports it. */
	struct ibv_sge rs = {.addr = (uintptr_t)(bbuf + 3072), .length = 64, .lkey = bmr->lkey};
	struct ibv_recv_wr rw = {.wr_id = 20, .sg_list = &rs, .num_sge = 1}, *rbad;
	CHECK(ibv_post_recv(b, &rw, &rbad) == 0);
	CHECK(post(a, 3, IBV_WR_SEND_WITH_INV, abuf, 8, amr->lkey, 0, k2) == 0);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 3);
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 20 &&
	      (wc.wc_flags & IBV_WC_WITH_INV) && wc.invalidated_rkey == k2);

	/* Bound again (it is free now), then freed by LOCAL_INV. */
	uint32_t k3 = ibv_inc_rkey(k2);
	CHECK(bind2(b, 12, mw2, k3, bmr, bbuf + 1024, 256) == 0);
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 12);
	CHECK(post(b, 13, IBV_WR_LOCAL_INV, NULL, 0, 0, 0, k3) == 0);
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 13 && wc.opcode == IBV_WC_LOCAL_INV);

	/* A zero-length bind unbinds the type 1 window. */
	mb.wr_id = 14;
	mb.bind_info.length = 0;
	mb.bind_info.addr = 0;
	CHECK(ibv_bind_mw(b, mw1, &mb) == 0);
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 14);

	/* ATOMIC_WRITE through ibv_post_send: the SGE's 8 bytes land at the remote address. */
	memcpy(abuf + 512, "atomic!!", 8);
	CHECK(post(a, 4, IBV_WR_ATOMIC_WRITE, abuf + 512, 8, amr->lkey, (uintptr_t)(cbuf + 64), cmr->rkey) == 0);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 4 && wc.opcode == IBV_WC_ATOMIC_WRITE);
	CHECK(memcmp(cbuf + 64, "atomic!!", 8) == 0 && cbuf[63] == 0 && cbuf[72] == 0);

	/* The same through the new post-send API: ibv_wr_bind_mw and ibv_wr_local_inv on an extended QP, then
	 * ibv_wr_atomic_write from its peer through the window. */
	struct ibv_qp_init_attr_ex xia = {
		.send_cq = bcq,
		.recv_cq = bcq,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV,
	};
	struct ibv_qp *xb = ibv_create_qp_ex(ctx, &xia);
	xia.send_cq = xia.recv_cq = acq;
	xia.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE;
	struct ibv_qp *xa = ibv_create_qp_ex(ctx, &xia);
	CHECK(xa && xb && connect_pair(xa, xb, gid) == 0);
	struct ibv_qp_ex *xax = ibv_qp_to_qp_ex(xa), *xbx = ibv_qp_to_qp_ex(xb);
	uint32_t k4 = ibv_inc_rkey(k3);
	struct ibv_mw_bind_info bi = {
		.mr = bmr, .addr = (uintptr_t)(bbuf + 2048), .length = 64, .mw_access_flags = IBV_ACCESS_REMOTE_WRITE};
	ibv_wr_start(xbx);
	xbx->wr_id = 15;
	xbx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_bind_mw(xbx, mw2, k4, &bi);
	CHECK(ibv_wr_complete(xbx) == 0);
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 15 && wc.opcode == IBV_WC_BIND_MW);
	uint64_t v = 0x1122334455667788ull;
	ibv_wr_start(xax);
	xax->wr_id = 16;
	xax->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(xax, k4, (uintptr_t)(bbuf + 2048 + 56), &v);
	v = 0; /* copied already */
	CHECK(ibv_wr_complete(xax) == 0);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 16 && wc.opcode == IBV_WC_ATOMIC_WRITE);
	uint64_t got;
	memcpy(&got, bbuf + 2048 + 56, 8);
	CHECK(got == 0x1122334455667788ull && bbuf[2048 + 55] == 0 && bbuf[2048 + 64] == 0);
	ibv_wr_start(xbx);
	xbx->wr_id = 17;
	ibv_wr_local_inv(xbx, k4);
	CHECK(ibv_wr_complete(xbx) == 0);
	CHECK(next(bcq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 17 && wc.opcode == IBV_WC_LOCAL_INV);
	CHECK(ibv_destroy_qp(xa) == 0 && ibv_destroy_qp(xb) == 0);

	/* Import: a second context on the same command file, the PD and the MR by handle. */
	errno = 0;
	CHECK(ibv_import_device(-1) == NULL && errno == EBADF);
	int pfd[2];
	CHECK(pipe(pfd) == 0);
	errno = 0;
	CHECK(ibv_import_device(pfd[0]) == NULL && errno == EOPNOTSUPP);
	close(pfd[0]);
	close(pfd[1]);
	struct ibv_context *ictx = ibv_import_device(dup(ctx->cmd_fd));
	CHECK(ictx != NULL && ictx != ctx);
	if (!ictx)
		return 1;
	errno = 0;
	CHECK(ibv_import_pd(ictx, 0xfffffff) == NULL && errno == EINVAL);
	struct ibv_pd *ipd = ibv_import_pd(ictx, pd->handle);
	CHECK(ipd && ipd->context == ictx && ipd->handle == pd->handle);
	errno = 0;
	CHECK(ibv_import_mr(ipd, 0xfffffff) == NULL && errno == EINVAL);
	struct ibv_mr *imr = ibv_import_mr(ipd, cmr->handle);
	CHECK(imr && imr->lkey == cmr->lkey && imr->rkey == cmr->rkey && imr->length == 4096 && imr->pd == ipd);
	struct ibv_cq *icq = ibv_create_cq(ictx, 16, NULL, NULL, 0);
	struct ibv_qp *iq = rc_qp(ipd, icq), *c = rc_qp(pd, acq);
	CHECK(icq && iq && c && connect_pair(iq, c, gid) == 0);
	memcpy(cbuf + 1024, "imported", 8);
	CHECK(post(iq, 5, IBV_WR_RDMA_WRITE, cbuf + 1024, 8, imr->lkey, (uintptr_t)(abuf + 2048), amr->rkey) == 0);
	CHECK(next(icq, &wc) == 0 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 5);
	CHECK(memcmp(abuf + 2048, "imported", 8) == 0);
	ibv_unimport_mr(imr);
	ibv_unimport_pd(ipd); /* still used by iq: goes with it */
	CHECK(ibv_destroy_qp(iq) == 0 && ibv_destroy_qp(c) == 0 && ibv_destroy_cq(icq) == 0);
	CHECK(ibv_close_device(ictx) == 0);

	/* Through the invalidated type 2 key: remote access error. */
	CHECK(post(a, 6, IBV_WR_RDMA_WRITE, abuf, 8, amr->lkey, (uintptr_t)(bbuf + 1024), k3) == 0);
	CHECK(next(acq, &wc) == 0 && wc.status == IBV_WC_REM_ACCESS_ERR && wc.wr_id == 6);

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_dealloc_mw(mw1) == 0 && ibv_dealloc_mw(mw2) == 0);
	CHECK(ibv_dereg_mr(amr) == 0 && ibv_dereg_mr(bmr) == 0 && ibv_dereg_mr(cmr) == 0);
	CHECK(ibv_destroy_cq(acq) == 0 && ibv_destroy_cq(bcq) == 0 && ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	if (fails)
		return 1;
	printf("ok\n");
	return 0;
}
