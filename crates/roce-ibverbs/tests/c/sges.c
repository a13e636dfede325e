/* 32 SGEs per WR through rocev2's libibverbs.so.1 (issue #16; rxe offers 32, UCX's UD QP asks for 6), run by
 * tests/c_api.rs with the device on $ROCEV2_IBV_IP: ibv_query_device reports max_sge 32; a QP asking for 33 SGEs is
 * refused (NULL + EINVAL); two RC QPs of one context with 32 SGEs each: a SEND gathered from 32 SGEs into a receive
 * scattered over 32, an RDMA WRITE gathered from 32, an RDMA READ scattered into 32, chains of three 32-SGE receives
 * and SENDs (more SGEs than one post chunk of the library holds), each byte checked; a WR with 33
 * SGEs is refused (EINVAL, *bad_wr = it) and nothing completes for it. Prints "ok" and exits 0 when every check passes. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_EXIT_ON_FAIL
#include "check.h"

#define N 32
#define LEN 8192

/* Completions (in any order) of the `n` WRs `ids`, each successful; a receive or READ's byte count is `byte_len`. */
static void poll_ok(struct ibv_cq *cq, int n, const uint64_t *ids, uint32_t byte_len)
{
	struct ibv_wc wc;
	int seen = 0;
	for (long i = 0; i < 100000000 && seen < n; i++) {
		int k = ibv_poll_cq(cq, 1, &wc);
		CHECK(k >= 0);
		if (k == 0)
			continue;
		if (wc.status != IBV_WC_SUCCESS)
			fprintf(stderr, "wr_id %llu: %s\n", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
		CHECK(wc.status == IBV_WC_SUCCESS);
		int known = 0;
		for (int j = 0; j < n; j++)
			known |= wc.wr_id == ids[j];
		CHECK(known);
		if (wc.opcode == IBV_WC_RECV || wc.opcode == IBV_WC_RDMA_READ)
			CHECK(wc.byte_len == byte_len);
		seen++;
	}
	CHECK(seen == n);
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

/* 32 SGEs of unequal lengths (3, 6, .. 96 bytes: 1584 in all) with gaps, from `base` of `mr`. */
static size_t gather(struct ibv_sge *s, struct ibv_mr *mr, size_t base)
{
	size_t total = 0;
	for (int i = 0; i < N; i++) {
		s[i].addr = (uintptr_t)mr->addr + base + (size_t)i * 128;
		s[i].length = 3 * (i + 1);
		s[i].lkey = mr->lkey;
		total += s[i].length;
	}
	return total;
}

/* The bytes `s` names, concatenated into `out`. */
static size_t flatten(const struct ibv_sge *s, int n, unsigned char *out)
{
	size_t k = 0;
	for (int i = 0; i < n; i++) {
		memcpy(out + k, (void *)(uintptr_t)s[i].addr, s[i].length);
		k += s[i].length;
	}
	return k;
}

int main(void)
{
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list != NULL && num == 1);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0);
	CHECK(da.max_sge == N);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	unsigned char *abuf = calloc(1, LEN), *bbuf = calloc(1, LEN);
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
	struct ibv_mr *amr = ibv_reg_mr(pd, abuf, LEN, acc), *bmr = ibv_reg_mr(pd, bbuf, LEN, acc);
	CHECK(amr != NULL && bmr != NULL);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq != NULL);

	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = N + 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	errno = 0;
	CHECK(ibv_create_qp(pd, &ia) == NULL && errno == EINVAL);
	ia.cap.max_send_sge = N;
	ia.cap.max_recv_sge = N;
	struct ibv_qp *a = ibv_create_qp(pd, &ia);
	CHECK(a != NULL && ia.cap.max_send_sge >= N && ia.cap.max_recv_sge >= N);
	struct ibv_qp *b = ibv_create_qp(pd, &ia);
	CHECK(b != NULL);
	connect_qp(a, b->qp_num, gid);
	connect_qp(b, a->qp_num, gid);

	for (int i = 0; i < LEN; i++)
		abuf[i] = (unsigned char)(i * 7 + 1);
	struct ibv_sge as[N + 1], bs[N];
	size_t total = gather(as, amr, 0);
	static unsigned char want[LEN], got[LEN];

	/* SEND: 32 SGEs of a into a receive of 32 SGEs (60 bytes each, other boundaries) at b. */
	for (int i = 0; i < N; i++) {
		bs[i].addr = (uintptr_t)bbuf + 4096 + (size_t)i * 64;
		bs[i].length = 60;
		bs[i].lkey = bmr->lkey;
	}
	struct ibv_recv_wr rwr = {.wr_id = 1, .sg_list = bs, .num_sge = N}, *bad_r;
	CHECK(ibv_post_recv(b, &rwr, &bad_r) == 0);
	struct ibv_send_wr swr = {.wr_id = 2, .sg_list = as, .num_sge = N, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED}, *bad_s;
	CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
	poll_ok(cq, 2, (uint64_t[]){1, 2}, (uint32_t)total);
	flatten(as, N, want);
	flatten(bs, N, got);
	CHECK(memcmp(want, got, total) == 0);

	/* RDMA WRITE: 32 SGEs of a to one range of b. */
	memset(bbuf, 0, 4096);
	swr.wr_id = 3;
	swr.opcode = IBV_WR_RDMA_WRITE;
	swr.wr.rdma.remote_addr = (uintptr_t)bbuf + 100;
	swr.wr.rdma.rkey = bmr->rkey;
	CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
	poll_ok(cq, 1, (uint64_t[]){3}, 0);
	CHECK(memcmp(want, bbuf + 100, total) == 0);

	/* RDMA READ: one range of b scattered into 32 SGEs of a (at 4096..). */
	for (int i = 0; i < LEN; i++)
		bbuf[i] = (unsigned char)(i * 13 + 5);
	memset(abuf + 4096, 0, 4096);
	gather(as, amr, 4096);
	swr.wr_id = 4;
	swr.opcode = IBV_WR_RDMA_READ;
	swr.wr.rdma.remote_addr = (uintptr_t)bbuf + 300;
	CHECK(ibv_post_send(a, &swr, &bad_s) == 0);
	poll_ok(cq, 1, (uint64_t[]){4}, (uint32_t)total);
	flatten(as, N, got);
	CHECK(memcmp(got, bbuf + 300, total) == 0);

	/* Chains of three 32-SGE WRs (more SGEs than one post chunk holds): three receives, three SENDs, each
	 * message landing whole. */
	struct ibv_sge rs3[3][N], ss3[3][N];
	struct ibv_recv_wr r3[3];
	struct ibv_send_wr s3[3];
	memset(bbuf, 0, LEN);
	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < N; i++) {
			rs3[k][i].addr = (uintptr_t)bbuf + (size_t)k * 2048 + (size_t)i * 64;
			rs3[k][i].length = 60;
			rs3[k][i].lkey = bmr->lkey;
		}
		gather(ss3[k], amr, (size_t)k * 64);
		r3[k] = (struct ibv_recv_wr){.wr_id = 10 + k, .sg_list = rs3[k], .num_sge = N, .next = k < 2 ? &r3[k + 1] : NULL};
		s3[k] = (struct ibv_send_wr){.wr_id = 20 + k, .sg_list = ss3[k], .num_sge = N, .opcode = IBV_WR_SEND,
					     .send_flags = IBV_SEND_SIGNALED, .next = k < 2 ? &s3[k + 1] : NULL};
	}
	CHECK(ibv_post_recv(b, &r3[0], &bad_r) == 0);
	CHECK(ibv_post_send(a, &s3[0], &bad_s) == 0);
	poll_ok(cq, 6, (uint64_t[]){10, 11, 12, 20, 21, 22}, (uint32_t)total);
	for (int k = 0; k < 3; k++) {
		flatten(ss3[k], N, want);
		flatten(rs3[k], N, got);
		CHECK(memcmp(want, got, total) == 0);
	}

	/* 33 SGEs: refused at post, *bad_wr names the WR, nothing completes for it. */
	as[N] = as[0];
	swr.wr_id = 5;
	swr.num_sge = N + 1;
	swr.opcode = IBV_WR_SEND;
	bad_s = NULL;
	CHECK(ibv_post_send(a, &swr, &bad_s) == EINVAL && bad_s == &swr);
	rwr.num_sge = N + 1;
	bad_r = NULL;
	CHECK(ibv_post_recv(b, &rwr, &bad_r) == EINVAL && bad_r == &rwr);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0);

	CHECK(ibv_destroy_qp(a) == 0 && ibv_destroy_qp(b) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dereg_mr(amr) == 0 && ibv_dereg_mr(bmr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	puts("ok");
	return 0;
}
