/* UD multicast through rocev2's librdmacm.so.1 and libibverbs.so.1 (run by tests/c_edge.rs): three processes on one
 * device address (argv[1]) and the group argv[2]. Two forked receivers each bind, resolve the group, create a UD QP,
 * rdma_join_multicast and post receives; the parent sends MSGS datagrams to the group (a send-only join with
 * rdma_join_multicast_ex). Checked:
 *
 *  - every receiver gets every message exactly once: payload, byte_len (GRH + payload), the GRH's IPv4 destination
 *    is the group, src_qp the sender's QP;
 *  - the MULTICAST_JOIN event: param.ud.qp_num 0xFFFFFF, qkey RDMA_UDP_QKEY, the AH's DGID the group's IPv4-mapped
 *    GID, is_global, private_data the join's context (librdmacm cma.c, Linux cma.c cma_iboe_join_multicast);
 *  - ibv_query_device: max_mcast_grp, max_mcast_qp_attach, max_total_mcast_qp_attach non-zero;
 *  - errors: rdma_join_multicast on an id neither bound nor resolved, of a unicast address, twice (EINVAL, EINVAL,
 *    EADDRINUSE); rdma_join_multicast_ex without the join flags or with a reserved one (EINVAL) or a reserved
 *    comp_mask bit (ENOTSUP); rdma_leave_multicast of a group not joined (EADDRNOTAVAIL); ibv_attach_mcast of an
 *    RC QP or a unicast GID (EINVAL), ibv_detach_mcast of a group not attached (EINVAL), ibv_destroy_qp of an
 *    attached QP (EBUSY, rxe), and after ibv_detach_mcast it succeeds;
 *  - after rdma_leave_multicast a receiver gets nothing more.
 * Prints "ok" and exits 0 when every check passed. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include "check.h"
#define CM_EVENT_TIMEOUT_MS 10000
#include "cm_event.h"

#define MSGS 20
#define LEN 64
#define GRH 40
#define QKEY 0x01234567u

static struct sockaddr_in dev_addr, group;

static int64_t now_ms(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* A UD id on `ch`, bound to the device, its address resolved towards the group, with a QP. */
static struct rdma_cm_id *ud_id(struct rdma_event_channel *ch)
{
	struct rdma_cm_id *id = NULL;
	struct ibv_qp_init_attr qa = {
		.qp_type = IBV_QPT_UD,
		.cap = {.max_send_wr = MSGS, .max_recv_wr = MSGS + 4, .max_send_sge = 1, .max_recv_sge = 1},
	};
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) == 0);
	if (!id)
		exit(1);
	CHECK(rdma_bind_addr(id, (struct sockaddr *)&dev_addr) == 0);
	CHECK(rdma_resolve_addr(id, (struct sockaddr *)&dev_addr, (struct sockaddr *)&group, 2000) == 0);
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (ev)
		rdma_ack_cm_event(ev);
	CHECK(rdma_create_qp(id, NULL, &qa) == 0);
	return id;
}

/* Joins `id` to the group (full member with `rdma_join_multicast`, else send-only with the _ex call) and checks the
 * JOIN event; its param.ud in `*ud`. */
static void join(struct rdma_event_channel *ch, struct rdma_cm_id *id, int send_only, struct rdma_ud_param *ud)
{
	void *ctx = (void *)(uintptr_t)(send_only ? 0x5e1d : 0xcafe);
	if (send_only) {
		struct rdma_cm_join_mc_attr_ex a = {
			.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
			.join_flags = RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER,
			.addr = (struct sockaddr *)&group,
		};
		CHECK(rdma_join_multicast_ex(id, &a, ctx) == 0);
	} else {
		CHECK(rdma_join_multicast(id, (struct sockaddr *)&group, ctx) == 0);
	}
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_MULTICAST_JOIN);
	if (!ev)
		exit(1);
	*ud = ev->param.ud;
	uint8_t mgid[16] = {[10] = 0xff, [11] = 0xff};
	memcpy(mgid + 12, &group.sin_addr, 4);
	CHECK(ev->status == 0);
	CHECK(ud->qp_num == 0xffffff);
	CHECK(ud->qkey == QKEY);
	CHECK(ud->ah_attr.is_global == 1);
	CHECK(memcmp(ud->ah_attr.grh.dgid.raw, mgid, 16) == 0);
	CHECK(ud->private_data == ctx);
	CHECK(ev->id == id);
	CHECK(rdma_ack_cm_event(ev) == 0);
}

static int receiver(int ready_fd, int go_fd)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch != NULL);
	if (!ch)
		return 1;
	struct rdma_cm_id *id = ud_id(ch);
	struct rdma_ud_param ud;
	join(ch, id, 0, &ud);
	char *buf = calloc(MSGS + 4, GRH + LEN);
	struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, (MSGS + 4) * (GRH + LEN), IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL);
	if (!mr)
		return 1;
	for (int i = 0; i < MSGS + 4; i++) {
		struct ibv_sge sge = {.addr = (uintptr_t)buf + i * (GRH + LEN), .length = GRH + LEN, .lkey = mr->lkey};
		struct ibv_recv_wr wr = {.wr_id = i, .sg_list = &sge, .num_sge = 1}, *bad;
		CHECK(ibv_post_recv(id->qp, &wr, &bad) == 0);
	}
	CHECK(write(ready_fd, "r", 1) == 1);
	int seen[MSGS] = {0}, got = 0;
	int64_t end = now_ms() + 10000;
	while (got < MSGS && now_ms() < end) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(id->recv_cq, 1, &wc);
		CHECK(n >= 0);
		if (n <= 0) {
			usleep(200);
			continue;
		}
		CHECK(wc.status == IBV_WC_SUCCESS);
		CHECK(wc.byte_len == GRH + LEN);
		CHECK(wc.wc_flags & IBV_WC_GRH);
		char *m = buf + wc.wr_id * (GRH + LEN);
		/* The GRH area holds the IPv4 header in its last 20 bytes: destination at 20 + 16. */
		CHECK(memcmp(m + 20 + 16, &group.sin_addr, 4) == 0);
		int seq = (unsigned char)m[GRH];
		CHECK(seq < MSGS);
		if (seq < MSGS) {
			CHECK(seen[seq] == 0);
			seen[seq]++;
			for (int k = 1; k < LEN; k++)
				CHECK(m[GRH + k] == (char)(seq * 7 + k));
		}
		got++;
	}
	CHECK(got == MSGS);
	/* Left: the sender's next datagram does not arrive. */
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == 0);
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == -1 && errno == EADDRNOTAVAIL);
	CHECK(write(ready_fd, "l", 1) == 1);
	char c;
	CHECK(read(go_fd, &c, 1) == 1);
	struct ibv_wc wc;
	end = now_ms() + 300;
	int late = 0;
	while (now_ms() < end)
		late += ibv_poll_cq(id->recv_cq, 1, &wc) > 0;
	CHECK(late == 0);
	rdma_destroy_qp(id);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(ch);
	free(buf);
	return fails ? 1 : 0;
}

/* The checks of the error cases, in the parent (a UD id `id` with a QP on `ch`). */
static void errors(struct rdma_event_channel *ch, struct rdma_cm_id *ud)
{
	struct rdma_cm_id *fresh = NULL;
	struct sockaddr_in uni = dev_addr;
	CHECK(rdma_create_id(ch, &fresh, NULL, RDMA_PS_UDP) == 0);
	CHECK(rdma_join_multicast(fresh, (struct sockaddr *)&group, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_destroy_id(fresh) == 0);
	CHECK(rdma_join_multicast(ud, (struct sockaddr *)&uni, NULL) == -1 && errno == EINVAL);
	struct rdma_cm_join_mc_attr_ex a = {.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS,
					    .addr = (struct sockaddr *)&group};
	CHECK(rdma_join_multicast_ex(ud, &a, NULL) == -1 && errno == EINVAL);
	a.comp_mask |= RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
	a.join_flags = RDMA_MC_JOIN_FLAG_RESERVED;
	CHECK(rdma_join_multicast_ex(ud, &a, NULL) == -1 && errno == EINVAL);
	a.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
	a.comp_mask |= RDMA_CM_JOIN_MC_ATTR_RESERVED;
	CHECK(rdma_join_multicast_ex(ud, &a, NULL) == -1 && errno == ENOTSUP);
	CHECK(rdma_leave_multicast(ud, (struct sockaddr *)&group) == -1 && errno == EADDRNOTAVAIL);

	/* ibv_attach_mcast / ibv_detach_mcast directly. */
	union ibv_gid mgid = {.raw = {[10] = 0xff, [11] = 0xff}}, ugid = mgid;
	memcpy(mgid.raw + 12, &group.sin_addr, 4);
	mgid.raw[15] ^= 1; /* another group of the same range */
	memcpy(ugid.raw + 12, &dev_addr.sin_addr, 4);
	struct ibv_cq *cq = ibv_create_cq(ud->verbs, 4, NULL, NULL, 0);
	CHECK(cq != NULL);
	struct ibv_qp_init_attr rc = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *rcqp = ibv_create_qp(ud->pd, &rc);
	CHECK(rcqp != NULL);
	struct ibv_qp_init_attr uq = rc;
	uq.qp_type = IBV_QPT_UD;
	struct ibv_qp *udqp = ibv_create_qp(ud->pd, &uq);
	CHECK(udqp != NULL);
	if (!rcqp || !udqp)
		return;
	CHECK(ibv_attach_mcast(rcqp, &mgid, 0) == EINVAL);
	CHECK(ibv_attach_mcast(udqp, &ugid, 0) == EINVAL);
	CHECK(ibv_detach_mcast(udqp, &mgid, 0) == EINVAL);
	CHECK(ibv_attach_mcast(udqp, &mgid, 0) == 0);
	CHECK(ibv_attach_mcast(udqp, &mgid, 0) == 0); /* again: nothing changes (rxe) */
	CHECK(ibv_destroy_qp(udqp) == EBUSY);
	CHECK(ibv_detach_mcast(udqp, &mgid, 0) == 0);
	CHECK(ibv_detach_mcast(udqp, &mgid, 0) == EINVAL);
	CHECK(ibv_destroy_qp(udqp) == 0);
	CHECK(ibv_destroy_qp(rcqp) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s DEVICE-IPv4 GROUP-IPv4\n", argv[0]);
		return 2;
	}
	dev_addr.sin_family = AF_INET;
	group.sin_family = AF_INET;
	if (inet_pton(AF_INET, argv[1], &dev_addr.sin_addr) != 1 || inet_pton(AF_INET, argv[2], &group.sin_addr) != 1)
		return 2;
	int ready[2], go[2];
	if (pipe(ready) || pipe(go))
		return 2;
	pid_t kids[2];
	for (int k = 0; k < 2; k++) {
		kids[k] = fork();
		if (kids[k] == 0) {
			alarm(60);
			_exit(receiver(ready[1], go[0]));
		}
	}
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch != NULL);
	if (!ch)
		return 1;
	struct rdma_cm_id *id = ud_id(ch);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(id->verbs, &da) == 0);
	CHECK(da.max_mcast_grp > 0 && da.max_mcast_qp_attach > 0 && da.max_total_mcast_qp_attach > 0);
	errors(ch, id);
	struct rdma_ud_param ud;
	join(ch, id, 1, &ud);
	char c;
	for (int k = 0; k < 2; k++)
		CHECK(read(ready[0], &c, 1) == 1 && c == 'r');
	char *buf = calloc(1, LEN);
	struct ibv_mr *mr = ibv_reg_mr(id->pd, buf, LEN, 0);
	struct ibv_ah *ah = ibv_create_ah(id->pd, &ud.ah_attr);
	CHECK(mr != NULL && ah != NULL);
	if (!mr || !ah)
		return 1;
	for (int seq = 0; seq <= MSGS; seq++) {
		if (seq == MSGS) {
			/* One more, after both receivers left. */
			for (int k = 0; k < 2; k++)
				CHECK(read(ready[0], &c, 1) == 1 && c == 'l');
		}
		buf[0] = (char)seq;
		for (int k = 1; k < LEN; k++)
			buf[k] = (char)(seq * 7 + k);
		struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = LEN, .lkey = mr->lkey};
		struct ibv_send_wr wr = {.wr_id = seq, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED,
					 .wr.ud = {.ah = ah, .remote_qpn = ud.qp_num, .remote_qkey = ud.qkey}},
				   *bad;
		CHECK(ibv_post_send(id->qp, &wr, &bad) == 0);
		struct ibv_wc wc;
		int64_t end = now_ms() + 10000;
		int n = 0;
		while (n == 0 && now_ms() < end)
			n = ibv_poll_cq(id->send_cq, 1, &wc);
		CHECK(n == 1 && wc.status == IBV_WC_SUCCESS);
		/* Paced: the receivers' socket queues never fill. */
		usleep(1000);
	}
	for (int k = 0; k < 2; k++)
		CHECK(write(go[1], "g", 1) == 1);
	for (int k = 0; k < 2; k++) {
		int status = 0;
		CHECK(waitpid(kids[k], &status, 0) == kids[k]);
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	}
	CHECK(ibv_destroy_ah(ah) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(rdma_leave_multicast(id, (struct sockaddr *)&group) == 0);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(ch);
	free(buf);
	if (fails)
		return 1;
	printf("ok\n");
	return 0;
}
