/* Issue #21: a program that unmaps or protects memory it registered, then has the RNIC touch it, must not die with
 * SIGSEGV (a hardware RNIC pins the pages; rocev2's engine copies with fault-tolerant routines instead). Run by
 * tests/c_api.rs with the device on $ROCEV2_IBV_IP; two RC QPs of one context connected over UDP, a fresh pair per
 * case (each case ends its QPs in the error state):
 *  1. the responder's MR (REMOTE_WRITE) is unmapped, the requester RDMA WRITEs 4 KiB into it: the WRITE completes
 *     IBV_WC_REM_ACCESS_ERR (NAK remote access error);
 *  2. the requester's send buffer is unmapped before an 8 KiB SEND (8 packets at PMTU 1024, each gathered with its
 *     ICRC read from the buffer): IBV_WC_LOC_PROT_ERR;
 *  3. the responder's MR (REMOTE_READ) is mprotect'ed PROT_NONE, the requester READs it: IBV_WC_REM_ACCESS_ERR;
 *  4. the requester's READ target is mprotect'ed PROT_READ: IBV_WC_LOC_PROT_ERR.
 * The program survives all four, then a fresh pair still moves data. Before the cases, no thread of the process
 * (the library's runtime threads included) may block SIGSEGV or SIGBUS: a fault taken with its signal blocked ends
 * the process whatever handler is installed, so a copy on such a thread died at random (whichever thread moved the
 * READ response). The program blocks every signal before opening the device and unblocks SIGSEGV/SIGBUS on its own
 * thread afterwards: the runtime's threads must not inherit the blocked synchronous signals. Prints "ok" and exits 0 when every check passes. */
#include <dirent.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define CHECK_EXIT_ON_FAIL
#include "check.h"

#define PAGE 4096

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid;

static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (long i = 0; i < 50000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
	}
	return 0;
}

static void to_rts(struct ibv_qp *qp, uint32_t dest)
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

struct pair {
	struct ibv_cq *cq;
	struct ibv_qp *a, *b;
};

static struct pair new_pair(void)
{
	struct pair p;
	p.cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	CHECK(p.cq != NULL);
	struct ibv_qp_init_attr ia = {0};
	ia.send_cq = p.cq;
	ia.recv_cq = p.cq;
	ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = 8;
	ia.cap.max_recv_wr = 8;
	ia.cap.max_send_sge = 1;
	ia.cap.max_recv_sge = 1;
	p.a = ibv_create_qp(pd, &ia);
	p.b = ibv_create_qp(pd, &ia);
	CHECK(p.a != NULL && p.b != NULL);
	to_rts(p.a, p.b->qp_num);
	to_rts(p.b, p.a->qp_num);
	return p;
}

static void free_pair(struct pair p)
{
	CHECK(ibv_destroy_qp(p.a) == 0);
	CHECK(ibv_destroy_qp(p.b) == 0);
	CHECK(ibv_destroy_cq(p.cq) == 0);
}

static char *map(size_t len)
{
	char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(m != MAP_FAILED);
	memset(m, 0x33, len);
	return m;
}

static struct ibv_mr *reg(void *addr, size_t len)
{
	struct ibv_mr *mr = ibv_reg_mr(pd, addr, len,
				       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	CHECK(mr != NULL);
	return mr;
}

/* Posts one signalled WR of `op` from/to `mr` (len bytes at its start) on `qp` and returns its completion. */
static struct ibv_wc post_one(struct pair p, enum ibv_wr_opcode op, struct ibv_mr *mr, uint32_t len,
			      struct ibv_mr *remote)
{
	struct ibv_sge sge = {.addr = (uintptr_t)mr->addr, .length = len, .lkey = mr->lkey};
	struct ibv_send_wr wr = {0}, *bad = NULL;
	wr.wr_id = 42;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (remote) {
		wr.wr.rdma.remote_addr = (uintptr_t)remote->addr;
		wr.wr.rdma.rkey = remote->rkey;
	}
	CHECK(ibv_post_send(p.a, &wr, &bad) == 0);
	struct ibv_wc wc;
	CHECK(poll_one(p.cq, &wc) == 1);
	return wc;
}

/* Every thread's SigBlk (/proc/self/task/TID/status) leaves SIGSEGV and SIGBUS unblocked; returns the threads seen. */
static int threads_take_faults(void)
{
	DIR *d = opendir("/proc/self/task");
	CHECK(d != NULL);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		char path[320];
		snprintf(path, sizeof path, "/proc/self/task/%s/status", e->d_name);
		FILE *f = fopen(path, "r");
		if (f == NULL)
			continue; /* the thread ended meanwhile */
		char line[256];
		unsigned long long blk = ~0ULL;
		while (fgets(line, sizeof line, f) != NULL)
			if (sscanf(line, "SigBlk: %llx", &blk) == 1)
				break;
		fclose(f);
		CHECK(blk != ~0ULL);
		if (blk & ((1ULL << (SIGSEGV - 1)) | (1ULL << (SIGBUS - 1)))) {
			fprintf(stderr, "thread %s blocks SIGSEGV/SIGBUS (SigBlk %016llx)\n", e->d_name, blk);
			CHECK(0);
		}
		n++;
	}
	closedir(d);
	return n;
}

int main(void)
{
	/* The signal-thread pattern: every signal blocked before the device is opened, the synchronous ones unblocked
	 * again on this thread only. The runtime's threads must not inherit SIGSEGV/SIGBUS blocked from it. */
	sigset_t all, sync;
	sigfillset(&all);
	CHECK(pthread_sigmask(SIG_BLOCK, &all, NULL) == 0);
	int num = -1;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list != NULL && num == 1);
	ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL);
	CHECK(ibv_query_gid(ctx, 1, 0, &gid) == 0);
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	char *local = map(4 * PAGE);
	struct ibv_mr *lmr = reg(local, 4 * PAGE);
	sigemptyset(&sync);
	sigaddset(&sync, SIGSEGV);
	sigaddset(&sync, SIGBUS);
	CHECK(pthread_sigmask(SIG_UNBLOCK, &sync, NULL) == 0);

	/* 1. RDMA WRITE into the peer's unmapped MR. */
	{
		struct pair p = new_pair();
		char *m = map(2 * PAGE);
		struct ibv_mr *mr = reg(m, 2 * PAGE);
		CHECK(munmap(m, 2 * PAGE) == 0);
		struct ibv_wc wc = post_one(p, IBV_WR_RDMA_WRITE, lmr, PAGE, mr);
		CHECK(wc.wr_id == 42 && wc.status == IBV_WC_REM_ACCESS_ERR);
		CHECK(threads_take_faults() >= 2); /* the program's thread and the runtime's, started by now */
		CHECK(ibv_dereg_mr(mr) == 0);
		free_pair(p);
	}
	/* 2. SEND from an unmapped buffer. */
	{
		struct pair p = new_pair();
		struct ibv_sge rs = {.addr = (uintptr_t)local, .length = 4 * PAGE, .lkey = lmr->lkey};
		struct ibv_recv_wr rw = {.wr_id = 7, .sg_list = &rs, .num_sge = 1}, *rbad = NULL;
		CHECK(ibv_post_recv(p.b, &rw, &rbad) == 0);
		char *m = map(2 * PAGE);
		struct ibv_mr *mr = reg(m, 2 * PAGE);
		CHECK(munmap(m, 2 * PAGE) == 0);
		struct ibv_wc wc = post_one(p, IBV_WR_SEND, mr, 2 * PAGE, NULL);
		CHECK(wc.wr_id == 42 && wc.status == IBV_WC_LOC_PROT_ERR);
		CHECK(ibv_dereg_mr(mr) == 0);
		free_pair(p);
	}
	/* 3. RDMA READ of the peer's PROT_NONE MR. */
	{
		struct pair p = new_pair();
		char *m = map(PAGE);
		struct ibv_mr *mr = reg(m, PAGE);
		CHECK(mprotect(m, PAGE, PROT_NONE) == 0);
		struct ibv_wc wc = post_one(p, IBV_WR_RDMA_READ, lmr, PAGE, mr);
		CHECK(wc.wr_id == 42 && wc.status == IBV_WC_REM_ACCESS_ERR);
		CHECK(ibv_dereg_mr(mr) == 0);
		CHECK(munmap(m, PAGE) == 0);
		free_pair(p);
	}
	/* 4. RDMA READ into a local target protected read-only. */
	{
		struct pair p = new_pair();
		char *m = map(PAGE);
		struct ibv_mr *mr = reg(m, PAGE);
		CHECK(mprotect(m, PAGE, PROT_READ) == 0);
		struct ibv_wc wc = post_one(p, IBV_WR_RDMA_READ, mr, PAGE, lmr);
		CHECK(wc.wr_id == 42 && wc.status == IBV_WC_LOC_PROT_ERR);
		CHECK(m[0] == 0x33); /* nothing landed */
		CHECK(ibv_dereg_mr(mr) == 0);
		CHECK(munmap(m, PAGE) == 0);
		free_pair(p);
	}
	/* Still alive and working: a WRITE between healthy MRs. */
	{
		struct pair p = new_pair();
		char *m = map(PAGE);
		struct ibv_mr *mr = reg(m, PAGE);
		memset(local, 0x5a, PAGE);
		struct ibv_wc wc = post_one(p, IBV_WR_RDMA_WRITE, lmr, PAGE, mr);
		CHECK(wc.wr_id == 42 && wc.status == IBV_WC_SUCCESS);
		CHECK(m[0] == 0x5a && m[PAGE - 1] == 0x5a);
		CHECK(ibv_dereg_mr(mr) == 0);
		CHECK(munmap(m, PAGE) == 0);
		free_pair(p);
	}
	CHECK(ibv_dereg_mr(lmr) == 0);
	CHECK(munmap(local, 4 * PAGE) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	puts("ok");
	return 0;
}
