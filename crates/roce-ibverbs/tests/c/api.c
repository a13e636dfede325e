/* Checks of rocev2's libibverbs.so.1 from C, compiled against the system <infiniband/verbs.h> (libibverbs-dev) and
 * run by tests/c_api.rs. Mode "none": no device configured. Mode "loop": device on $ROCEV2_IBV_IP; two RC QPs of
 * one context connected to each other over UDP, exercising the data path and the error contracts the crate docs
 * list. Prints "ok" and exits 0 when every check passes; otherwise prints the failed check and exits 1. */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#define CHECK_EXIT_ON_FAIL
#include "check.h"

static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long i = 0; i < 50000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
	}
	return 0;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid gid)
{
	struct ibv_qp_attr a = {0};
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 100;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.port_num = 1;
	/* Without the GRH a RoCE address vector has no destination: refused. */
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == EINVAL);
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
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

int main(int argc, char **argv)
{
	int num = -1;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list != NULL);
	if (argc > 1 && strcmp(argv[1], "none") == 0) {
		/* No device: an empty, NULL-terminated list. */
		CHECK(num == 0 && list[0] == NULL);
		ibv_free_device_list(list);
		puts("ok");
		return 0;
	}
	CHECK(num == 1 && list[1] == NULL);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL);
	CHECK(ctx->device == list[0] && ctx->num_comp_vectors >= 1);

	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	CHECK(ibv_query_gid(ctx, 1, 1, &gid) == -1); /* beyond gid_tbl_len */
	CHECK(ibv_query_gid(ctx, 2, 0, &gid) == -1); /* one port */
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	CHECK(gid.raw[10] == 0xff && gid.raw[11] == 0xff); /* IPv4-mapped */
	struct ibv_gid_entry ent;
	CHECK(ibv_query_gid_ex(ctx, 1, 0, &ent, 0) == 0);
	CHECK(ent.gid_type == IBV_GID_TYPE_ROCE_V2 && ent.gid_index == 0 && ent.port_num == 1);
	CHECK(memcmp(&ent.gid, &gid, 16) == 0);
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0);
	CHECK(pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.gid_tbl_len == 1);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0);
	CHECK(da.phys_port_cnt == 1 && da.max_qp > 0 && da.max_cqe > 0);

	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	/* Not supported: clean errors, never fake objects. (SRQs are checked by tests/c/srq.c.) */
	char *buf = calloc(1, 8192);
	/* Any iova: the MR over buf2 is named by 0x10000 + offset (used by the RDMA WRITEs below). */
	char *buf2 = calloc(1, 4096);
	struct ibv_mr *imr = ibv_reg_mr_iova2(pd, buf2, 4096, 0x10000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(imr != NULL && imr->addr == buf2 && imr->length == 4096);
	errno = 0;
	CHECK(ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_ON_DEMAND) == NULL && errno == EOPNOTSUPP);

	/* perftest's registration: iova = address, relaxed ordering (an optional bit, ignored). */
	struct ibv_mr *mr = ibv_reg_mr_iova2(pd, buf, 8192, (uintptr_t)buf,
					     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	CHECK(mr != NULL && mr->addr == buf && mr->length == 8192 && mr->lkey != 0);

	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	CHECK(ch != NULL && ch->fd >= 0);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, (void *)0x1234, ch, 0);
	CHECK(cq != NULL && cq->context == ctx && cq->channel == ch && cq->cq_context == (void *)0x1234);
	/* Nothing happened yet: a non-blocking channel says EAGAIN. */
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN);
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) & ~O_NONBLOCK) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY); /* a CQ still uses it */

	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1,
			.max_inline_data = 64},
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	CHECK(a != NULL && a->context == ctx && a->qp_num != 0 && a->state == IBV_QPS_RESET);
	CHECK(ia.cap.max_inline_data >= 64 && ia.cap.max_send_wr >= 8);
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	CHECK(b != NULL);
	connect_qp(a, b->qp_num, gid);
	connect_qp(b, a->qp_num, gid);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(ibv_query_qp(a, &qa, IBV_QP_STATE | IBV_QP_CAP, &qi) == 0);
	CHECK(qa.qp_state == IBV_QPS_RTS && qa.dest_qp_num == b->qp_num && qi.qp_type == IBV_QPT_RC);
	CHECK(a->state == IBV_QPS_RTS);

	/* b receives into buf[4096..]; a sends inline with immediate data, then writes buf[0..5] to buf[6000..]. */
	struct ibv_sge rs = {.addr = (uintptr_t)buf + 4096, .length = 1024, .lkey = mr->lkey};
	struct ibv_recv_wr rwr = {.wr_id = 7, .sg_list = &rs, .num_sge = 1}, *bad_r;
	CHECK(ibv_post_recv(b, &rwr, &bad_r) == 0);
	char msg[] = "inline hello";
	struct ibv_sge ss = {.addr = (uintptr_t)msg, .length = sizeof msg, .lkey = 0};
	struct ibv_send_wr swr = {.wr_id = 9, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
				  .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE, .imm_data = htonl(0xabcd0102)};
	struct ibv_send_wr *bad_s;
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
	memset(msg, 0, sizeof msg); /* inline: copied at post time */
	/* Blocking wait on the channel: the event names our CQ and its context. */
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq && ev_ctx == (void *)0x1234);
	ibv_ack_cq_events(cq, 1);
	CHECK(cq->comp_events_completed == 1);
	int got_send = 0, got_recv = 0;
	while (!(got_send && got_recv)) {
		struct ibv_wc wc;
		CHECK(poll_one(cq, &wc) == 1);
		CHECK(wc.status == IBV_WC_SUCCESS);
		if (wc.opcode == IBV_WC_SEND) {
			CHECK(wc.wr_id == 9 && wc.qp_num == a->qp_num);
			got_send = 1;
		} else {
			CHECK(wc.opcode == IBV_WC_RECV && wc.wr_id == 7 && wc.qp_num == b->qp_num);
			CHECK(wc.byte_len == sizeof msg && (wc.wc_flags & IBV_WC_WITH_IMM));
			CHECK(ntohl(wc.imm_data) == 0xabcd0102);
			CHECK(strcmp(buf + 4096, "inline hello") == 0);
			got_recv = 1;
		}
	}

	memcpy(buf, "write", 5);
	struct ibv_sge ws = {.addr = (uintptr_t)buf, .length = 5, .lkey = mr->lkey};
	struct ibv_send_wr wwr = {.wr_id = 11, .sg_list = &ws, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED,
				  .wr.rdma = {.remote_addr = (uintptr_t)buf + 6000, .rkey = mr->rkey}};
	/* A chain whose second WR has an unknown opcode: the first is posted, *bad is the second. */
	struct ibv_send_wr badop = wwr;
	badop.opcode = 77;
	wwr.next = &badop;
	CHECK(ibv_post_send(a, &wwr, &bad_s) == EINVAL && bad_s == &badop);
	struct ibv_wc wc;
	CHECK(poll_one(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 11 &&
	      wc.opcode == IBV_WC_RDMA_WRITE);
	CHECK(memcmp(buf + 6000, "write", 5) == 0);
	/* Into the iova MR by its iova, then out of it by its iova (local SGE) into buf[7000..]. */
	wwr.next = NULL;
	wwr.wr.rdma.remote_addr = 0x10000 + 100;
	wwr.wr.rdma.rkey = imr->rkey;
	CHECK(ibv_post_send(a, &wwr, &bad_s) == 0);
	CHECK(poll_one(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 11);
	CHECK(memcmp(buf2 + 100, "write", 5) == 0);
	struct ibv_sge is = {.addr = 0x10000 + 100, .length = 5, .lkey = imr->lkey};
	wwr.sg_list = &is;
	wwr.wr.rdma.remote_addr = (uintptr_t)buf + 7000;
	wwr.wr.rdma.rkey = mr->rkey;
	CHECK(ibv_post_send(a, &wwr, &bad_s) == 0);
	CHECK(poll_one(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 11);
	CHECK(memcmp(buf + 7000, "write", 5) == 0);
	CHECK(strcmp(ibv_wc_status_str(IBV_WC_SUCCESS), "IBV_WC_SUCCESS") == 0);

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dereg_mr(imr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	puts("ok");
	return 0;
}
