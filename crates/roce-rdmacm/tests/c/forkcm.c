/* Processes forked from a program that opened the device (issue #16/#17 finding: pyverbs' test_rdmacm forks a
 * passive and an active process from a parent that has already opened and used the device; both children waited
 * until they were killed). The parent opens the device, allocates a PD (which starts its runtime), registers
 * memory and listens with rdma_cm on PARENT_PORT; then it forks a passive child (rdma_create_ep, rdma_listen,
 * rdma_get_request, rdma_accept on PORT) and an active child (rdma_create_ep, rdma_connect) on the same address,
 * which exchange one SEND each way and disconnect (16 such pairs, one after another). As with rdma-core on an
 * RNIC, each child opens the device and uses rdma_cm afresh and never touches the parent's objects. After both exit 0, the parent is undisturbed: a third
 * child connects to the listener the parent made before forking and the parent serves it; its PD and context
 * still work (a new MR, a CQ) and close cleanly.
 * Usage: forkcm IP PORT PARENT_PORT. Prints every failed check, "ok" and exits 0 when all pass; a child that
 * hangs is killed after 20 s and counted as a failure; every child ends by SIGALRM after 30 s, the parent after
 * 60 s. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK_EXIT_ON_FAIL
#include "check.h"

/* Passive/active child pairs forked one after another. */
#define ROUNDS 16

static const char *ip;

static void init_attr(struct ibv_qp_init_attr *attr)
{
	memset(attr, 0, sizeof *attr);
	attr->cap.max_send_wr = attr->cap.max_recv_wr = 4;
	attr->cap.max_send_sge = attr->cap.max_recv_sge = 1;
	attr->sq_sig_all = 1;
}

/* The side of one connection on `id` (CHECK exits 1 on failure): a receive posted, accepted when `passive`, one
 * SEND each way with the text compared, disconnected and destroyed. */
static void exchange(struct rdma_cm_id *id, int passive)
{
	char send_buf[64], recv_buf[64];
	snprintf(send_buf, sizeof send_buf, "from the %s side %d", passive ? "passive" : "active", (int)getpid());
	struct ibv_mr *rmr = rdma_reg_msgs(id, recv_buf, sizeof recv_buf);
	struct ibv_mr *smr = rdma_reg_msgs(id, send_buf, sizeof send_buf);
	CHECK(rmr && smr);
	CHECK(rdma_post_recv(id, NULL, recv_buf, sizeof recv_buf, rmr) == 0);
	if (passive)
		CHECK(rdma_accept(id, NULL) == 0);
	struct ibv_wc wc;
	CHECK(rdma_post_send(id, NULL, send_buf, sizeof send_buf, smr, 0) == 0);
	CHECK(rdma_get_send_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS);
	CHECK(rdma_get_recv_comp(id, &wc) == 1 && wc.status == IBV_WC_SUCCESS);
	CHECK(strncmp(recv_buf, passive ? "from the active side" : "from the passive side", 20) == 0);
	rdma_disconnect(id);
	rdma_dereg_mr(rmr);
	rdma_dereg_mr(smr);
	rdma_destroy_ep(id);
}

static struct rdma_addrinfo *addr(const char *port, int passive)
{
	struct rdma_addrinfo hints, *res = NULL;
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (passive)
		hints.ai_flags = RAI_PASSIVE;
	CHECK(rdma_getaddrinfo(ip, port, &hints, &res) == 0);
	return res;
}

/* A synchronous listening endpoint on `port`. */
static struct rdma_cm_id *listen_on(const char *port)
{
	struct rdma_addrinfo *res = addr(port, 1);
	struct ibv_qp_init_attr attr;
	init_attr(&attr);
	struct rdma_cm_id *listen_id = NULL;
	CHECK(rdma_create_ep(&listen_id, res, NULL, &attr) == 0);
	CHECK(rdma_listen(listen_id, 1) == 0);
	rdma_freeaddrinfo(res);
	return listen_id;
}

/* Accepts one connection on `listen_id` and exchanges over it. */
static void serve(struct rdma_cm_id *listen_id)
{
	struct rdma_cm_id *id = NULL;
	CHECK(rdma_get_request(listen_id, &id) == 0);
	exchange(id, 1);
}

/* Connects to `port` (retrying a refused connect for up to 10 s: the listener may not be there yet) and exchanges. */
static void connect_to(const char *port)
{
	struct rdma_addrinfo *res = addr(port, 0);
	struct ibv_qp_init_attr attr;
	struct rdma_cm_id *id = NULL;
	for (int i = 0;; i++) {
		init_attr(&attr);
		CHECK(rdma_create_ep(&id, res, NULL, &attr) == 0);
		if (rdma_connect(id, NULL) == 0)
			break;
		CHECK(i < 100);
		/* rdma_create_qp wrote this id's CQs into `attr` (as librdmacm does): made afresh above. */
		rdma_destroy_ep(id);
		usleep(100 * 1000);
	}
	exchange(id, 0);
	rdma_freeaddrinfo(res);
}

/* The passive (listens on `port`) or active child. */
static void side(int passive, const char *port)
{
	if (passive) {
		struct rdma_cm_id *listen_id = listen_on(port);
		serve(listen_id);
		rdma_destroy_ep(listen_id);
	} else {
		connect_to(port);
	}
}

static pid_t spawn(int passive, const char *port)
{
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		/* Never outlives the test: a stuck child ends by SIGALRM. */
		alarm(30);
		side(passive, port);
		_exit(0);
	}
	return pid;
}

/* Waits up to 20 s for child `pid` (killed then); 1 when it did not exit 0. */
static int reap(pid_t pid, const char *what)
{
	int status = 0, waited = 0;
	pid_t r;
	while ((r = waitpid(pid, &status, WNOHANG)) == 0 && waited < 200) {
		usleep(100 * 1000);
		waited++;
	}
	if (r == 0) {
		fprintf(stderr, "FAILED: the %s child is stuck, killed\n", what);
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		return 1;
	}
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "FAILED: the %s child ended with status %#x\n", what, status);
		return 1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	CHECK(argc == 4);
	ip = argv[1];
	const char *port = argv[2], *parent_port = argv[3];
	/* A parent that never gets its connection below is killed (SIGALRM) rather than hanging the test. */
	alarm(60);
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num == 1);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0);
	/* A PD starts the parent's runtime; a listening rdma_cm id its connection manager and rdma_cm state. */
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);
	struct rdma_cm_id *parent_listen = listen_on(parent_port);

	/* Two children connect to each other, as pyverbs' two_nodes_rdmacm_traffic does; ROUNDS times, since a child
	 * forked while one of the parent's threads held a lock of the library inherited it held (CI finding: both
	 * children stuck in rdma_create_id in about 1 round in 10 to 20). */
	int fails = 0;
	for (int round = 0; round < ROUNDS && !fails; round++) {
		pid_t passive = spawn(1, port), active = spawn(0, port);
		fails += reap(passive, "passive") + reap(active, "active");
		if (fails)
			fprintf(stderr, "FAILED in round %d of %d\n", round + 1, ROUNDS);
	}

	/* The parent still works after its children used the device and exited: a third child connects to the
	 * listener the parent made before any fork, and the parent serves it. */
	pid_t client = spawn(0, parent_port);
	serve(parent_listen);
	fails += reap(client, "third");
	rdma_destroy_ep(parent_listen);
	struct ibv_mr *mr2 = ibv_reg_mr(pd, buf + 2048, 2048, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr2 != NULL);
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	CHECK(cq != NULL);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dereg_mr(mr2) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	CHECK(ibv_close_device(ctx) == 0);
	ibv_free_device_list(list);
	if (fails)
		return 1;
	puts("ok");
	return 0;
}
