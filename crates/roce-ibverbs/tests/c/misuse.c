/* Mistakes real ibverbs programs make, compiled against the system <infiniband/verbs.h> and run by tests/c_api.rs
 * with the device on $ROCEV2_IBV_IP. Each check is the return libibverbs gives on a real provider (rxe, mlx5; the
 * kernel refuses what the provider does not): posting to a QP that is not ready (EINVAL, *bad_wr = the first WR;
 * ibv_post_send(3), rxe_post_send / rxe_post_recv), destroying a CQ a QP still uses and deallocating a PD that
 * still has MRs, QPs or AHs (EBUSY: the kernel's use counts), registering memory that is not mapped or, for a
 * writable MR, not writable (EFAULT: the kernel cannot pin it); a second context of the same device works beside the
 * first (ibv_open_device may be called more than once); a program waiting in poll() on a completion channel's fd wakes
 * when the event comes. Prints every failed check, "ok" and exits 0 when all
 * pass. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>

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
	case IBV_QPS_RTS:
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
	default:
		return ibv_modify_qp(qp, &a, IBV_QP_STATE);
	}
}

/* One completion within a few seconds of spinning, or 0. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long i = 0; i < 20000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
	}
	return 0;
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
		fprintf(stderr, "open/query_gid failed\n");
		return 1;
	}
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_comp_channel *chan = ibv_create_comp_channel(ctx);
	/* comp_vector must be below num_comp_vectors (the kernel's check): EINVAL, as negative ones. */
	errno = 0;
	CHECK(ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_cq(ctx, 16, NULL, NULL, -1) == NULL && errno == EINVAL);
	errno = 0;
	CHECK(ibv_create_cq(ctx, 0, NULL, NULL, 0) == NULL && errno == EINVAL);
	struct ibv_cq *cq = chan ? ibv_create_cq(ctx, 16, NULL, chan, 0) : NULL;
	char *buf = calloc(1, 4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!pd || !cq || !mr) {
		fprintf(stderr, "set-up failed\n");
		return 1;
	}

	/* A second context on the same device (a library and the program each open it): it works beside the first,
	 * and closing it leaves the first working (the rest of this program runs on the first). */
	struct ibv_context *ctx2 = ibv_open_device(list[0]);
	CHECK(ctx2 != NULL);
	if (ctx2) {
		struct ibv_pd *pd2 = ibv_alloc_pd(ctx2);
		struct ibv_cq *cq2 = ibv_create_cq(ctx2, 4, NULL, NULL, 0);
		CHECK(pd2 != NULL && cq2 != NULL);
		CHECK(cq2 == NULL || ibv_destroy_cq(cq2) == 0);
		CHECK(pd2 == NULL || ibv_dealloc_pd(pd2) == 0);
		CHECK(ibv_close_device(ctx2) == 0);
	}

	/* Memory the kernel could not pin: EFAULT, no MR (a later access would fault inside the library). */
	char *gone = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	char *ro = mmap(NULL, 8192, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(gone != MAP_FAILED && ro != MAP_FAILED && munmap(gone, 8192) == 0);
	errno = 0;
	CHECK(ibv_reg_mr(pd, gone, 8192, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EFAULT);
	errno = 0;
	CHECK(ibv_reg_mr(pd, gone, 8192, 0) == NULL && errno == EFAULT);
	errno = 0;
	CHECK(ibv_reg_mr(pd, ro, 8192, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == NULL && errno == EFAULT);
	errno = 0;
	CHECK(ibv_reg_mr(pd, ro, 8192, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EFAULT);
	/* Partly mapped: the range's last page is a hole. */
	char *part = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(part != MAP_FAILED && munmap(part + 2 * 4096, 4096) == 0);
	errno = 0;
	CHECK(ibv_reg_mr(pd, part + 4096, 2 * 4096, 0) == NULL && errno == EFAULT);
	/* Read-only memory for a read-only MR (remote READ) is fine. */
	struct ibv_mr *ro_mr = ibv_reg_mr(pd, ro, 8192, IBV_ACCESS_REMOTE_READ);
	CHECK(ro_mr != NULL);

	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
				      .qp_type = IBV_QPT_RC};
	struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = ibv_create_qp(pd, &ia);
	CHECK(a != NULL && b != NULL);
	if (!a || !b)
		return 1;
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 8, .lkey = mr->lkey};
	struct ibv_send_wr s2 = {.wr_id = 2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND};
	struct ibv_send_wr s1 = {.wr_id = 1, .next = &s2, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED};
	struct ibv_recv_wr r1 = {.wr_id = 3, .sg_list = &sge, .num_sge = 1}, *bad_r = NULL;
	struct ibv_send_wr *bad_s = NULL;

	/* RESET: neither queue takes work. */
	CHECK(ibv_post_recv(a, &r1, &bad_r) == EINVAL && bad_r == &r1);
	CHECK(ibv_post_send(a, &s1, &bad_s) == EINVAL && bad_s == &s1);
	/* INIT and RTR: receives only. */
	CHECK(modify(a, IBV_QPS_INIT, 0, gid) == 0 && modify(b, IBV_QPS_INIT, 0, gid) == 0);
	bad_s = NULL;
	CHECK(ibv_post_send(a, &s1, &bad_s) == EINVAL && bad_s == &s1);
	CHECK(ibv_post_recv(b, &r1, &bad_r) == 0);
	CHECK(modify(a, IBV_QPS_RTR, b->qp_num, gid) == 0 && modify(b, IBV_QPS_RTR, a->qp_num, gid) == 0);
	bad_s = NULL;
	CHECK(ibv_post_send(a, &s1, &bad_s) == EINVAL && bad_s == &s1);
	/* Nothing refused above may surface later as a completion. */
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0);
	/* RTS: the SEND lands in b's receive (posted in INIT); exactly the two completions, nothing else. */
	CHECK(modify(a, IBV_QPS_RTS, 0, gid) == 0 && modify(b, IBV_QPS_RTS, 0, gid) == 0);
	s1.next = NULL;
	/* An event-driven program that waits in poll() on the channel's fd, then takes the event without blocking. */
	CHECK(fcntl(chan->fd, F_SETFL, fcntl(chan->fd, F_GETFL) | O_NONBLOCK) == 0);
	struct pollfd pfd = {.fd = chan->fd, .events = POLLIN};
	CHECK(poll(&pfd, 1, 0) == 0);
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(ibv_post_send(a, &s1, &bad_s) == 0);
	CHECK(poll(&pfd, 1, 5000) == 1 && (pfd.revents & POLLIN));
	struct ibv_cq *ev_cq = NULL;
	void *ev_ctx;
	CHECK(ibv_get_cq_event(chan, &ev_cq, &ev_ctx) == 0 && ev_cq == cq);
	ibv_ack_cq_events(cq, 1);
	CHECK(poll(&pfd, 1, 0) == 0); /* taken: no longer readable */
	int got = 0;
	while (got < 2 && poll_one(cq, &wc) == 1) {
		CHECK(wc.status == IBV_WC_SUCCESS && (wc.wr_id == 1 || wc.wr_id == 3));
		got++;
	}
	CHECK(got == 2);
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0);
	/* Back to RESET: posting is refused again. */
	CHECK(modify(a, IBV_QPS_RESET, 0, gid) == 0);
	bad_s = NULL;
	CHECK(ibv_post_send(a, &s1, &bad_s) == EINVAL && bad_s == &s1);

	/* Port 2 does not exist: an address vector or a QP naming it is EINVAL (the kernel's port check). */
	struct ibv_ah_attr bad_port = {.is_global = 1, .grh = {.dgid = gid}, .port_num = 2};
	errno = 0;
	CHECK(ibv_create_ah(pd, &bad_port) == NULL && errno == EINVAL);
	struct ibv_qp *c = ibv_create_qp(pd, &ia);
	CHECK(c != NULL);
	if (c) {
		struct ibv_qp_attr pattr = {.qp_state = IBV_QPS_INIT, .port_num = 2};
		int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
		CHECK(ibv_modify_qp(c, &pattr, mask) == EINVAL);
		pattr.port_num = 1; /* the same transition on port 1 is fine */
		CHECK(ibv_modify_qp(c, &pattr, mask) == 0);
		CHECK(ibv_destroy_qp(c) == 0);
	}

	/* Teardown in the wrong order: refused while in use, then allowed. */
	struct ibv_ah_attr aa = {.is_global = 1, .grh = {.dgid = gid}, .port_num = 1};
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	CHECK(ah != NULL);
	CHECK(ibv_destroy_cq(cq) == EBUSY);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	CHECK(ibv_destroy_qp(a) == 0);
	CHECK(ibv_destroy_cq(cq) == EBUSY); /* b still uses it */
	CHECK(ibv_destroy_qp(b) == 0);
	CHECK(ibv_dealloc_pd(pd) == EBUSY); /* MRs and the AH */
	CHECK(ibv_destroy_ah(ah) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ro_mr == NULL || ibv_dereg_mr(ro_mr) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(chan) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	if (fails)
		return 1;
	puts("ok");
	return 0;
}
