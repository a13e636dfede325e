/* The QP's local ACK timeout after rdma_cm connects (issue #17, rxe interop: our REQ announced Local ACK Timeout 17
 * while the QP librdmacm made retransmitted after 4.096 us * 2^14 = 67 ms). Run by tests/c_edge.rs with the device
 * on argv[1] (ROCEV2_IBV_IP); a listener and a client in this one process. As Linux drivers/infiniband/core/cm.c and
 * cma.c (read for facts) do:
 *
 *  - without RDMA_OPTION_ID_ACK_TIMEOUT the passive QP gets the REQ's Local ACK Timeout (cm_req_handler: packet
 *    lifetime = the REQ's timeout - 1, av.timeout = lifetime + 1) and the active QP cm_ack_timeout(the REP's
 *    TargetACKDelay, packet lifetime 16 = CMA_IBOE_PACKET_LIFETIME) (cm_rep_handler); both are 17 between two
 *    rocev2 devices (ACK delay 15), and rdma_init_qp_attr for RTS names that value (cm_init_qp_rts_attr);
 *  - RDMA_OPTION_ID_ACK_TIMEOUT on the active id (set before rdma_resolve_route, as Linux reads it there) is its
 *    QP's timeout (cma_modify_qp_rts) and sets the path's packet lifetime to timeout - 1
 *    (cma_resolve_iboe_route), so the REQ announces cm_ack_timeout(15, timeout - 1): 20 for 20, which the
 *    passive QP takes;
 *  - the option on the passive id is its QP's timeout; the active QP is not affected.
 * Prints "ok" and exits 0 when every check passed. */
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "check.h"
#include "cm_event.h"

static int qp_timeout(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	memset(&a, 0, sizeof(a));
	if (ibv_query_qp(qp, &a, IBV_QP_TIMEOUT, &ia) != 0)
		return -1;
	return a.timeout;
}

/* One connection: `copt` / `sopt` (0: none) as RDMA_OPTION_ID_ACK_TIMEOUT on the client / accepted id; checks
 * the QPs' timeouts against `cwant` / `swant` after ESTABLISHED. */
static void one(struct rdma_event_channel *sch, struct rdma_event_channel *cch, struct sockaddr_in *dst,
		uint8_t copt, uint8_t sopt, int cwant, int swant)
{
	struct ibv_qp_init_attr qa = {.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
					      .max_recv_sge = 1},
				      .qp_type = IBV_QPT_RC, .sq_sig_all = 1};
	struct rdma_cm_id *c = NULL;
	CHECK(rdma_create_id(cch, &c, NULL, RDMA_PS_TCP) == 0);
	if (!c)
		return;
	CHECK(rdma_resolve_addr(c, NULL, (struct sockaddr *)dst, 2000) == 0);
	expect_ack(cch, RDMA_CM_EVENT_ADDR_RESOLVED);
	if (copt)
		CHECK(rdma_set_option(c, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &copt, sizeof(copt)) == 0);
	CHECK(rdma_resolve_route(c, 2000) == 0);
	expect_ack(cch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	struct ibv_qp_init_attr ca = qa;
	CHECK(rdma_create_qp(c, NULL, &ca) == 0);
	struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
				     .rnr_retry_count = 7};
	CHECK(rdma_connect(c, &cp) == 0);
	struct rdma_cm_event *ev = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *s = ev ? ev->id : NULL;
	if (ev)
		CHECK(rdma_ack_cm_event(ev) == 0);
	if (s) {
		if (sopt)
			CHECK(rdma_set_option(s, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &sopt, sizeof(sopt)) ==
			      0);
		struct ibv_qp_init_attr sa = qa;
		CHECK(rdma_create_qp(s, NULL, &sa) == 0);
		struct rdma_conn_param ap = {.responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7};
		CHECK(rdma_accept(s, &ap) == 0);
	}
	expect_ack(cch, RDMA_CM_EVENT_ESTABLISHED);
	expect_ack(sch, RDMA_CM_EVENT_ESTABLISHED);
	int ct = c->qp ? qp_timeout(c->qp) : -1;
	if (ct != cwant)
		fprintf(stderr, "options %u/%u: active QP timeout %d, want %d\n", copt, sopt, ct, cwant);
	CHECK(ct == cwant);
	struct ibv_qp_attr rts = {.qp_state = IBV_QPS_RTS};
	int mask = 0;
	CHECK(rdma_init_qp_attr(c, &rts, &mask) == 0 && (mask & IBV_QP_TIMEOUT) && rts.timeout == cwant);
	if (s) {
		int st = s->qp ? qp_timeout(s->qp) : -1;
		if (st != swant)
			fprintf(stderr, "options %u/%u: passive QP timeout %d, want %d\n", copt, sopt, st, swant);
		CHECK(st == swant);
		rts.qp_state = IBV_QPS_RTS;
		mask = 0;
		CHECK(rdma_init_qp_attr(s, &rts, &mask) == 0 && (mask & IBV_QP_TIMEOUT) && rts.timeout == swant);
	}
	CHECK(rdma_disconnect(c) == 0);
	expect_ack(cch, RDMA_CM_EVENT_DISCONNECTED);
	expect_ack(sch, RDMA_CM_EVENT_DISCONNECTED);
	if (s) {
		rdma_destroy_qp(s);
		CHECK(rdma_destroy_id(s) == 0);
	}
	rdma_destroy_qp(c);
	CHECK(rdma_destroy_id(c) == 0);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(7491)};
	CHECK(inet_pton(AF_INET, argv[1], &addr.sin_addr) == 1);
	struct rdma_event_channel *sch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
	CHECK(sch && cch);
	if (!sch || !cch)
		return 1;
	struct rdma_cm_id *listener = NULL;
	CHECK(rdma_create_id(sch, &listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&addr) == 0);
	CHECK(rdma_listen(listener, 4) == 0);

	one(sch, cch, &addr, 0, 0, 17, 17);
	one(sch, cch, &addr, 20, 0, 20, 20);
	one(sch, cch, &addr, 0, 12, 17, 12);

	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(cch);
	rdma_destroy_event_channel(sch);
	if (fails)
		return 1;
	printf("ok\n");
	return 0;
}
