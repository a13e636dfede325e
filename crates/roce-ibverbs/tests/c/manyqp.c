/* Scale through rocev2's libibverbs.so.1 (issue #21), run by tests/c_api.rs with the device on $ROCEV2_IBV_IP:
 * ibv_query_device reports max_qp 16384 and the context creates that many QPs (the next one is refused with
 * ENOMEM), then 1,024 RC QP pairs of the one context, connected to each other over UDP, carry 4 rounds of one 4 KiB
 * RDMA WRITE per pair, all 1,024 posted before any is polled (1,024 QPs active at once), each completion checked and
 * every byte of the target compared with the source. Prints "ok" and exits 0 when every check passes. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK_EXIT_ON_FAIL
#include "check.h"

#define PAIRS 1024
#define LEN 4096
#define ROUNDS 4

static void connect_qp(struct ibv_qp *qp, uint32_t dest, union ibv_gid gid)
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
	a.rq_psn = 7;
	a.min_rnr_timer = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.hop_limit = 1;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
					     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 7;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					     IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) == 0);
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
	CHECK(da.max_qp == 16384);
	union ibv_gid gid;
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * PAIRS, NULL, NULL, 0);
	CHECK(cq != NULL);

	/* max_qp QPs at once, then one more is refused. */
	struct ibv_qp_init_attr small = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp **all = calloc((size_t)da.max_qp, sizeof *all);
	CHECK(all != NULL);
	for (int i = 0; i < da.max_qp; i++) {
		all[i] = ibv_create_qp(pd, &small);
		if (all[i] == NULL)
			fprintf(stderr, "QP %d of %d: errno %d\n", i, da.max_qp, errno);
		CHECK(all[i] != NULL);
	}
	errno = 0;
	CHECK(ibv_create_qp(pd, &small) == NULL && errno == ENOMEM);
	for (int i = 0; i < da.max_qp; i++)
		CHECK(ibv_destroy_qp(all[i]) == 0);
	free(all);

	/* 1,024 pairs a[i] -> b[i], one WRITE on each per round, all posted before polling. */
	char *src = calloc(PAIRS, LEN), *dst = calloc(PAIRS, LEN);
	CHECK(src != NULL && dst != NULL);
	struct ibv_mr *smr = ibv_reg_mr(pd, src, (size_t)PAIRS * LEN, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_mr *dmr =
		ibv_reg_mr(pd, dst, (size_t)PAIRS * LEN, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(smr != NULL && dmr != NULL);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = {.max_send_wr = 4, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	static struct ibv_qp *a[PAIRS], *b[PAIRS];
	for (int i = 0; i < PAIRS; i++) {
		a[i] = ibv_create_qp(pd, &ia);
		b[i] = ibv_create_qp(pd, &ia);
		CHECK(a[i] != NULL && b[i] != NULL);
	}
	for (int i = 0; i < PAIRS; i++) {
		connect_qp(a[i], b[i]->qp_num, gid);
		connect_qp(b[i], a[i]->qp_num, gid);
	}
	for (int r = 0; r < ROUNDS; r++) {
		for (size_t k = 0; k < (size_t)PAIRS * LEN; k++)
			src[k] = (char)(k * 13 + (size_t)r * 101 + k / LEN);
		for (int i = 0; i < PAIRS; i++) {
			struct ibv_sge s = {.addr = (uintptr_t)src + (size_t)i * LEN, .length = LEN, .lkey = smr->lkey};
			struct ibv_send_wr wr = {0}, *bad = NULL;
			wr.wr_id = (uint64_t)r * PAIRS + (uint64_t)i;
			wr.sg_list = &s;
			wr.num_sge = 1;
			wr.opcode = IBV_WR_RDMA_WRITE;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.wr.rdma.remote_addr = (uintptr_t)dst + (size_t)i * LEN;
			wr.wr.rdma.rkey = dmr->rkey;
			CHECK(ibv_post_send(a[i], &wr, &bad) == 0);
		}
		static char seen[PAIRS];
		memset(seen, 0, sizeof seen);
		int got = 0;
		for (long spin = 0; got < PAIRS && spin < 2000000000L; spin++) {
			struct ibv_wc wc[64];
			int n = ibv_poll_cq(cq, 64, wc);
			CHECK(n >= 0);
			for (int j = 0; j < n; j++) {
				if (wc[j].status != IBV_WC_SUCCESS)
					fprintf(stderr, "wr_id %llu: %s\n", (unsigned long long)wc[j].wr_id,
						ibv_wc_status_str(wc[j].status));
				CHECK(wc[j].status == IBV_WC_SUCCESS && wc[j].opcode == IBV_WC_RDMA_WRITE);
				CHECK(wc[j].wr_id / PAIRS == (uint64_t)r);
				int i = (int)(wc[j].wr_id % PAIRS);
				CHECK(!seen[i]);
				seen[i] = 1;
				got++;
			}
		}
		CHECK(got == PAIRS);
		CHECK(memcmp(src, dst, (size_t)PAIRS * LEN) == 0);
	}
	for (int i = 0; i < PAIRS; i++)
		CHECK(ibv_destroy_qp(a[i]) == 0 && ibv_destroy_qp(b[i]) == 0);
	CHECK(ibv_dereg_mr(smr) == 0 && ibv_dereg_mr(dmr) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	free(src);
	free(dst);
	printf("ok\n");
	return 0;
}
