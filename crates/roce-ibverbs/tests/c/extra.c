/* The rest of Debian 12's libibverbs export table, compiled against the system <infiniband/verbs.h> and run by
 * tests/c_api.rs with the device on $ROCEV2_IBV_IP:
 *  - the string and rate helpers answer exactly as Debian's own libibverbs (loaded beside ours with dlopen by its
 *    file path) for every input around their ranges;
 *  - a UD receive reports wc.sl = 2 over IPv4, 1 over IPv6 (the network header type, where mlx5 puts it);
 *  - fork support, the GID table, ibv_query_qp_data_in_order, ibv_reg_mr_iova, ibv_rereg_mr, ibv_resize_cq,
 *    ibv_init_ah_from_wc / ibv_create_ah_from_wc, a non-blocking ibv_get_async_event, and the refusals of what this
 *    RNIC has no equivalent of (the IBVERBS_1.0 ABI, import of another process's objects, dma-buf MRs), each as its
 *    man page says.
 * Prints every failed check, "ok" and exits 0 when all pass. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

#include "check.h"

/* The IBVERBS_1.0 twin of ibv_get_device_list (the ABI of libibverbs 1.0). */
struct ibv_device **get_device_list_1_0(int *num);
__asm__(".symver get_device_list_1_0, ibv_get_device_list@IBVERBS_1.0");

typedef const char *(*str_fn)(int);
typedef int (*int_fn)(int);

static void compare_with_debian(void)
{
	void *real = dlopen("/usr/lib/x86_64-linux-gnu/libibverbs.so.1.14.44.0", RTLD_NOW | RTLD_LOCAL);
	if (!real) {
		fprintf(stderr, "FAILED: cannot load Debian's libibverbs: %s\n", dlerror());
		fails++;
		return;
	}
	static const char *strs[] = {"ibv_node_type_str", "ibv_port_state_str", "ibv_event_type_str",
				     "ibv_wc_status_str"};
	str_fn ours_s[] = {(str_fn)ibv_node_type_str, (str_fn)ibv_port_state_str, (str_fn)ibv_event_type_str,
			   (str_fn)ibv_wc_status_str};
	/* ibv_wc_status_str is rocev2's own spelling (the enumerator names), checked elsewhere: skip it here. */
	for (int f = 0; f < 3; f++) {
		str_fn theirs = (str_fn)dlsym(real, strs[f]);
		CHECK(theirs != NULL && theirs != ours_s[f]);
		for (int i = -3; i < 40 && theirs; i++)
			if (strcmp(theirs(i), ours_s[f](i)) != 0) {
				fprintf(stderr, "FAILED %s(%d): Debian \"%s\", ours \"%s\"\n", strs[f], i, theirs(i),
					ours_s[f](i));
				fails++;
			}
	}
	static const char *ints[] = {"ibv_rate_to_mult", "mult_to_ibv_rate", "ibv_rate_to_mbps", "mbps_to_ibv_rate"};
	int_fn ours_i[] = {(int_fn)ibv_rate_to_mult, (int_fn)mult_to_ibv_rate, (int_fn)ibv_rate_to_mbps,
			   (int_fn)mbps_to_ibv_rate};
	int probes = 0;
	for (int f = 0; f < 4; f++) {
		int_fn theirs = (int_fn)dlsym(real, ints[f]);
		CHECK(theirs != NULL && theirs != ours_i[f]);
		/* Every rate, every multiple and every Mb/s value any rate maps to, and their neighbours. */
		for (int i = -2; i < 1400000 && theirs; i = i < 600 ? i + 1 : i + 1 + i / 1000) {
			probes++;
			if (theirs(i) != ours_i[f](i)) {
				fprintf(stderr, "FAILED %s(%d): Debian %d, ours %d\n", ints[f], i, theirs(i),
					ours_i[f](i));
				fails++;
			}
		}
		for (int r = 0; r < 30 && theirs; r++) {
			int m = ibv_rate_to_mult(r), b = ibv_rate_to_mbps(r);
			CHECK(theirs(m) == ours_i[f](m) && theirs(b) == ours_i[f](b));
		}
	}
	CHECK(probes > 1000);
	dlclose(real);
}

int main(void)
{
	compare_with_debian();

	CHECK(ibv_fork_init() == 0);
	CHECK(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED);

	int n10 = 5;
	errno = 0;
	CHECK(get_device_list_1_0(&n10) == NULL && errno == EOPNOTSUPP && n10 == 0);
	errno = 0;
	CHECK(ibv_import_device(-1) == NULL && errno == EBADF); /* tests/c/mw.c: the rest */

	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || num != 1) {
		fprintf(stderr, "no device\n");
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL);
	if (!ctx)
		return 1;

	/* The GID table: the same GID as ibv_query_gid, RoCE v2; too little room is -EINVAL. */
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(ctx, 1, &pa) == 0);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	struct ibv_gid_entry tab[8];
	memset(tab, 0xee, sizeof tab);
	CHECK(ibv_query_gid_table(ctx, tab, 8, 0) == pa.gid_tbl_len);
	CHECK(memcmp(&tab[0].gid, &gid, 16) == 0 && tab[0].gid_index == 0 && tab[0].port_num == 1 &&
	      tab[0].gid_type == IBV_GID_TYPE_ROCE_V2);
	CHECK(ibv_query_gid_table(ctx, tab, 0, 0) == -EINVAL);
	CHECK(ibv_query_gid_table(ctx, tab, 8, 1) == -EINVAL);

	/* Non-blocking async fd with nothing pending: EAGAIN. */
	CHECK(fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK) == 0);
	struct ibv_async_event ae;
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ae) == -1 && errno == EAGAIN);

	struct ibv_pd *pd = ibv_alloc_pd(ctx), *pd2 = ibv_alloc_pd(ctx);
	CHECK(pd != NULL && pd2 != NULL);
	char *buf = aligned_alloc(4096, 3 * 4096);
	memset(buf, 0, 3 * 4096);
	errno = 0;
	CHECK(ibv_reg_dmabuf_mr(pd, 0, 4096, 0, 0, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EOPNOTSUPP);

	/* ibv_reg_mr_iova (IBVERBS_1.7) at the buffer's own address. */
	struct ibv_mr *m1 = ibv_reg_mr_iova(pd, buf, 4096, (uintptr_t)buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(m1 != NULL && m1->addr == buf && m1->length == 4096);
	if (m1)
		CHECK(ibv_dereg_mr(m1) == 0);

	/* ibv_rereg_mr: access, translation and PD; the MR's fields follow; bad flags are IBV_REREG_MR_ERR_INPUT. */
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);
	if (mr) {
		CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT);
		CHECK(ibv_rereg_mr(mr, 1 << 5, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT);
		CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == 0);
		CHECK(mr->rkey != 0 && mr->addr == buf);
		CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD, pd2, buf + 4096,
				   8192, 0) == 0);
		CHECK(mr->addr == buf + 4096 && mr->length == 8192 && mr->pd == pd2);
		CHECK(ibv_dealloc_pd(pd) == 0);	    /* no longer the MR's PD */
		CHECK(ibv_dealloc_pd(pd2) == EBUSY); /* now it is */
		CHECK(ibv_dereg_mr(mr) == 0);
	}
	CHECK(ibv_dealloc_pd(pd2) == 0);
	pd = ibv_alloc_pd(ctx);

	/* ibv_resize_cq: shrinks and grows, cq->cqe follows; 0 is EINVAL (tests/c/rereg.c: with completions queued). */
	struct ibv_cq *cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	CHECK(cq != NULL);
	CHECK(ibv_resize_cq(cq, 8) == 0 && cq->cqe == 8);
	CHECK(ibv_resize_cq(cq, 4096) == 0 && cq->cqe == 4096);
	CHECK(ibv_resize_cq(cq, 0) == EINVAL && cq->cqe == 4096);

	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_UD,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp != NULL);
	CHECK(ibv_query_qp_data_in_order(qp, IBV_WR_RDMA_WRITE, 0) == 0);

	/* An address vector back to the sender of a UD receive (over IPv4 the GRH area holds the IPv4 header in its
	 * last 20 bytes, over IPv6 the IPv6 header): destination = the packet's source, source GID = the GID it was
	 * sent to, traffic class from the header. */
	static const unsigned char v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	int v4 = memcmp(gid.raw, v4mapped, 12) == 0;
	struct ibv_wc wc = {.wc_flags = IBV_WC_GRH, .qp_num = qp ? qp->qp_num : 0};
	unsigned char grh[40] = {0};
	unsigned char peer[16] = {0};
	if (v4) {
		grh[20] = 0x45;
		grh[21] = 0x68; /* TOS */
		grh[28] = 64;
		grh[29] = 17;
		inet_pton(AF_INET, "127.0.0.9", grh + 32);
		memcpy(grh + 36, gid.raw + 12, 4);
		memcpy(peer, v4mapped, 12);
		memcpy(peer + 12, grh + 32, 4);
	} else {
		grh[0] = 0x66; /* version 6, traffic class 0x68 */
		grh[1] = 0x80;
		grh[6] = 17;
		grh[7] = 64;
		inet_pton(AF_INET6, "fd00::9", grh + 8);
		memcpy(grh + 24, gid.raw, 16);
		memcpy(peer, grh + 8, 16);
	}
	struct ibv_ah_attr ah;
	memset(&ah, 0xee, sizeof ah);
	CHECK(ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)grh, &ah) == 0);
	CHECK(ah.is_global == 1 && ah.port_num == 1 && ah.grh.sgid_index == 0 && ah.grh.hop_limit == 0xff &&
	      ah.grh.traffic_class == 0x68);
	CHECK(memcmp(ah.grh.dgid.raw, peer, 16) == 0);
	struct ibv_ah *h = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)grh, 1);
	CHECK(h != NULL);
	if (h)
		CHECK(ibv_destroy_ah(h) == 0);
	wc.wc_flags = 0; /* no GRH: nothing to answer */
	CHECK(ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)grh, &ah) == EINVAL);
	wc.wc_flags = IBV_WC_GRH;
	grh[39] ^= 1; /* sent to an address that is not ours */
	CHECK(ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)grh, &ah) == EINVAL);

	/* A UD receive reports the network header type where mlx5 does: wc.sl = 2 for IPv4, 1 for IPv6 (UCX relies on it). */
	struct ibv_qp *qp2 = ibv_create_qp(pd, &ia);
	CHECK(qp && qp2);
	char *ubuf = calloc(1, 4096);
	struct ibv_mr *umr = ibv_reg_mr(pd, ubuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(umr != NULL);
	for (int i = 0; qp && qp2 && umr && i < 2; i++) {
		struct ibv_qp *q = i ? qp2 : qp;
		struct ibv_qp_attr qa = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111};
		CHECK(ibv_modify_qp(q, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY) == 0);
		qa.qp_state = IBV_QPS_RTR;
		CHECK(ibv_modify_qp(q, &qa, IBV_QP_STATE) == 0);
		qa.qp_state = IBV_QPS_RTS;
		CHECK(ibv_modify_qp(q, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0);
	}
	if (qp && qp2 && umr) {
		struct ibv_sge rs = {.addr = (uintptr_t)ubuf + 1024, .length = 40 + 64, .lkey = umr->lkey};
		struct ibv_recv_wr rw = {.wr_id = 3, .sg_list = &rs, .num_sge = 1}, *bad_r;
		CHECK(ibv_post_recv(qp2, &rw, &bad_r) == 0);
		struct ibv_ah_attr aa = {.is_global = 1, .grh = {.dgid = gid, .hop_limit = 64}, .port_num = 1};
		struct ibv_ah *uah = ibv_create_ah(pd, &aa);
		CHECK(uah != NULL);
		struct ibv_sge ss = {.addr = (uintptr_t)ubuf, .length = 64, .lkey = umr->lkey};
		struct ibv_send_wr sw = {.wr_id = 4, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED,
					 .wr.ud = {.ah = uah, .remote_qpn = qp2->qp_num, .remote_qkey = 0x11111111}},
				   *bad_s;
		CHECK(ibv_post_send(qp, &sw, &bad_s) == 0);
		int got = 0;
		for (long i = 0; i < 50000000 && got < 2; i++) {
			struct ibv_wc w;
			if (ibv_poll_cq(cq, 1, &w) != 1)
				continue;
			got++;
			CHECK(w.status == IBV_WC_SUCCESS);
			if (w.opcode == IBV_WC_RECV)
				CHECK(w.wr_id == 3 && (w.wc_flags & IBV_WC_GRH) && w.sl == (v4 ? 2 : 1) &&
				      w.byte_len == 40 + 64);
		}
		CHECK(got == 2);
		CHECK(ibv_destroy_ah(uah) == 0);
	}
	if (qp2)
		CHECK(ibv_destroy_qp(qp2) == 0);
	if (umr)
		CHECK(ibv_dereg_mr(umr) == 0);
	free(ubuf);
	if (qp)
		CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	free(buf);
	if (fails)
		return 1;
	printf("ok\n");
	return 0;
}
