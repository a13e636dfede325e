/* rdma_cm edge semantics on rocev2's librdmacm.so.1 (run by tests/c_edge.rs with the device on an address given in
 * ROCEV2_IBV_IP, argv[1]; a listener and a client in this one process, each id on its own channel):
 *
 *  - with the device on a loopback address, another loopback address binds to it too; an id bound to a device has
 *    the library's PD of it in id->pd (a UD QP can be made on it, as UCX does);
 *  - invalid pointers and arguments are EINVAL (NULL out-pointers, foreign ids and events, a NULL channel for
 *    rdma_get_cm_event), an AF_UNIX address is EAFNOSUPPORT, an unknown option ENOSYS, the ECE calls EOPNOTSUPP;
 *  - a channel whose fd the program made O_NONBLOCK answers rdma_get_cm_event with EAGAIN when empty, and its fd
 *    polls readable once an event waits (address and route resolution answer through events);
 *  - rdma_migrate_id moves an id's later events to another channel;
 *  - a connect request carries the program's private data after the 36-byte address header (56 bytes offered),
 *    names the listener as listen_id, and rdma_reject's private data and reason (28, consumer reject) reach the
 *    requester's REJECTED event;
 *  - responder resources / initiator depth 0xff (RDMA_MAX_RESP_RES / RDMA_MAX_INIT_DEPTH) in rdma_connect and
 *    rdma_accept stand for the device's maximum (accept: the smaller of it and the peer's), a larger value than the
 *    device's maximum is EINVAL;
 *  - rdma_accept with library-made CQs (rdma_create_qp with none given) and private data: ESTABLISHED on both sides
 *    (the REP's private data on the active one), rdma_init_qp_attr names the peer's QP, a SEND carries data;
 *  - rdma_disconnect: DISCONNECTED on both sides;
 *  - rdma_destroy_id of an id with an event handed out and not acknowledged returns (after a bounded wait), and
 *    the late acknowledgement still works.
 * Prints "ok" and exits 0 when every check passed. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

#include "check.h"
#include "cm_event.h"

static void set_nonblock(int fd)
{
	CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0);
}

/* A client id on `ch` resolved to `dst`. */
static struct rdma_cm_id *client(struct rdma_event_channel *ch, struct sockaddr_in *dst)
{
	struct rdma_cm_id *id = NULL;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)dst, 2000) == 0);
	expect_ack(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(id->verbs != NULL);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	expect_ack(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	CHECK(id->route.num_paths == 1 && id->route.path_rec != NULL);
	return id;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(7471)};
	CHECK(inet_pton(AF_INET, argv[1], &addr.sin_addr) == 1);

	/* Invalid pointers and arguments. */
	struct rdma_event_channel *sch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
	CHECK(sch && cch);
	struct rdma_cm_event *ev = NULL;
	errno = 0;
	CHECK(rdma_get_cm_event(NULL, &ev) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_create_id(sch, NULL, NULL, RDMA_PS_TCP) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_create_id(sch, &(struct rdma_cm_id *){0}, NULL, 0x4242) == -1 && errno == EINVAL);
	struct rdma_cm_id *fake = calloc(1, sizeof(*fake));
	errno = 0;
	CHECK(rdma_destroy_id(fake) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_listen(fake, 1) == -1 && errno == EINVAL);
	struct rdma_cm_event *fake_ev = calloc(1, sizeof(*fake_ev));
	errno = 0;
	CHECK(rdma_ack_cm_event(fake_ev) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_get_cm_event(sch, NULL) == -1 && errno == EINVAL);
	free(fake);
	free(fake_ev);

	/* A loopback address that is not the device's own, with the device on a loopback address (argv[1]): the
	 * loopback interface's addresses are the device's (as an rxe device on lo has them), so the id is bound to it;
	 * pyverbs' rdmacm tests bind 127.0.0.1, the netdev's first address. (With the device on another interface it
	 * binds without a device: crates/roce-cli/tests/rdmacm.rs, libfabric's fi_pingpong.) */
	if (strcmp(argv[1], "127.0.0.1") != 0 && strncmp(argv[1], "127.", 4) == 0) {
		struct rdma_cm_id *lo = NULL;
		struct sockaddr_in loa = {.sin_family = AF_INET};
		CHECK(inet_pton(AF_INET, "127.0.0.1", &loa.sin_addr) == 1);
		CHECK(rdma_create_id(sch, &lo, NULL, RDMA_PS_TCP) == 0);
		if (lo) {
			CHECK(rdma_bind_addr(lo, (struct sockaddr *)&loa) == 0);
			CHECK(lo->verbs != NULL && lo->pd != NULL);
			CHECK(rdma_destroy_id(lo) == 0);
		}
	}

	/* The listener. */
	struct rdma_cm_id *listener = NULL;
	CHECK(rdma_create_id(sch, &listener, (void *)0x5157, RDMA_PS_TCP) == 0);
	struct sockaddr_un un = {.sun_family = AF_UNIX};
	errno = 0;
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&un) == -1 && errno == EAFNOSUPPORT);
	errno = 0;
	CHECK(rdma_bind_addr(listener, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&addr) == 0);
	CHECK(rdma_get_src_port(listener) == htons(7471));
	/* An id bound to a device has the library's PD of that device (id->pd), as librdmacm's ucma_get_device sets
	 * it: UCX's rdmacm CM creates a "dummy" UD QP on id->pd for the QP number of its REQ. */
	CHECK(listener->verbs && listener->pd && listener->pd->context == listener->verbs);
	if (listener->verbs && listener->pd) {
		struct ibv_cq *dcq = ibv_create_cq(listener->verbs, 4, NULL, NULL, 0);
		struct ibv_qp_init_attr dqa = {.send_cq = dcq, .recv_cq = dcq, .qp_type = IBV_QPT_UD,
					       .cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1,
						       .max_recv_sge = 1}};
		struct ibv_qp *dqp = dcq ? ibv_create_qp(listener->pd, &dqa) : NULL;
		CHECK(dqp != NULL);
		if (dqp)
			CHECK(ibv_destroy_qp(dqp) == 0);
		if (dcq)
			CHECK(ibv_destroy_cq(dcq) == 0);
	}
	CHECK(rdma_listen(listener, 4) == 0);
	uint8_t tos = 32;
	CHECK(rdma_set_option(listener, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, 1) == 0);
	errno = 0;
	CHECK(rdma_set_option(listener, 42, 42, &tos, 1) == -1 && errno == ENOSYS);
	/* No ECE (not carried in REQ/REP; ibv_query_ece is EOPNOTSUPP): EOPNOTSUPP, which pyverbs' test_rdmacm takes
	 * for "no ECE" (ENOSYS made its external-QP test fail). */
	struct ibv_ece ece = {.vendor_id = 0x15b3};
	errno = 0;
	CHECK(rdma_get_remote_ece(listener, &ece) == -1 && errno == EOPNOTSUPP);
	errno = 0;
	CHECK(rdma_set_local_ece(listener, &ece) == -1 && errno == EOPNOTSUPP);
	CHECK(strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED") == 0);

	/* Non-blocking empty channels; migrate. */
	set_nonblock(sch->fd);
	set_nonblock(cch->fd);
	errno = 0;
	CHECK(rdma_get_cm_event(sch, &ev) == -1 && errno == EAGAIN);
	struct rdma_event_channel *other = rdma_create_event_channel();
	struct rdma_cm_id *mig = NULL;
	CHECK(rdma_create_id(cch, &mig, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_migrate_id(mig, other) == 0);
	CHECK(mig->channel == other);
	CHECK(rdma_resolve_addr(mig, NULL, (struct sockaddr *)&addr, 2000) == 0);
	expect_ack(other, RDMA_CM_EVENT_ADDR_RESOLVED);
	errno = 0;
	CHECK(rdma_get_cm_event(cch, &ev) == -1 && errno == EAGAIN);
	CHECK(rdma_destroy_id(mig) == 0);
	rdma_destroy_event_channel(other);

	/* A request rejected with private data. */
	struct rdma_cm_id *c1 = client(cch, &addr);
	struct rdma_conn_param cp = {.private_data = "hello", .private_data_len = 6, .responder_resources = 1,
				     .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7, .qp_num = 0x123};
	char big[57] = {0};
	cp.private_data = big;
	cp.private_data_len = 57;
	errno = 0;
	CHECK(rdma_connect(c1, &cp) == -1 && errno == EINVAL); /* 56 bytes after the address header at most */
	cp.private_data = "hello";
	cp.private_data_len = 6;
	CHECK(rdma_connect(c1, &cp) == 0);
	ev = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *s1 = NULL;
	if (ev) {
		s1 = ev->id;
		CHECK(ev->listen_id == listener);
		CHECK(s1->context == (void *)0x5157);
		CHECK(s1->verbs == c1->verbs);
		CHECK(ev->param.conn.private_data_len == 56);
		CHECK(ev->param.conn.private_data && memcmp(ev->param.conn.private_data, "hello", 6) == 0);
		CHECK(ev->param.conn.qp_num == 0x123);
		CHECK(rdma_get_dst_port(s1) == rdma_get_src_port(c1));
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	if (s1) {
		errno = 0;
		CHECK(rdma_reject(s1, big, 149) == -1 && errno == EINVAL); /* REJ private data: 148 bytes */
		CHECK(rdma_reject(s1, "nope-data", 10) == 0);
	}
	ev = expect(cch, RDMA_CM_EVENT_REJECTED);
	if (ev) {
		CHECK(ev->id == c1);
		CHECK(ev->status == 28);
		CHECK(ev->param.conn.private_data && memcmp(ev->param.conn.private_data, "nope-data", 10) == 0);
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	if (s1)
		CHECK(rdma_destroy_id(s1) == 0);
	CHECK(rdma_destroy_id(c1) == 0);

	/* An accepted connection with library-made CQs. */
	struct rdma_cm_id *c2 = client(cch, &addr);
	struct ibv_qp_init_attr qa = {.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
					      .max_recv_sge = 1},
				      .qp_type = IBV_QPT_RC, .sq_sig_all = 1};
	CHECK(rdma_create_qp(c2, NULL, &qa) == 0);
	CHECK(c2->qp && c2->send_cq && c2->recv_cq && c2->recv_cq_channel);
	cp.qp_num = 0;
	/* The largest the device allows, as libfabric's verbs provider asks (RDMA_MAX_RESP_RES, RDMA_MAX_INIT_DEPTH). */
	cp.responder_resources = RDMA_MAX_RESP_RES;
	cp.initiator_depth = RDMA_MAX_INIT_DEPTH;
	CHECK(rdma_connect(c2, &cp) == 0);
	ev = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *s2 = ev ? ev->id : NULL;
	if (ev)
		CHECK(rdma_ack_cm_event(ev) == 0);
	char rbuf[64] = {0}, sbuf[64] = "data over an rdma_cm connection";
	struct ibv_mr *rmr = NULL, *smr = NULL;
	if (s2) {
		/* A fresh copy: rdma_create_qp wrote c2's CQs into qa, as librdmacm does. */
		struct ibv_qp_init_attr sa = qa;
		CHECK(qa.send_cq == c2->send_cq && qa.recv_cq == c2->recv_cq);
		sa.send_cq = sa.recv_cq = NULL;
		CHECK(rdma_create_qp(s2, NULL, &sa) == 0);
		rmr = rdma_reg_msgs(s2, rbuf, sizeof(rbuf));
		CHECK(rmr != NULL);
		CHECK(rdma_post_recv(s2, NULL, rbuf, sizeof(rbuf), rmr) == 0);
		struct ibv_device_attr da;
		CHECK(ibv_query_device(s2->verbs, &da) == 0);
		/* Above the device's maximum: EINVAL, and the request can still be accepted. */
		struct rdma_conn_param ap = {.private_data = "welcome", .private_data_len = 8,
					     .responder_resources = 200, .initiator_depth = 1, .rnr_retry_count = 7};
		if (da.max_qp_rd_atom < 200) {
			errno = 0;
			CHECK(rdma_accept(s2, &ap) == -1 && errno == EINVAL);
		}
		ap.responder_resources = RDMA_MAX_RESP_RES;
		ap.initiator_depth = RDMA_MAX_INIT_DEPTH;
		CHECK(rdma_accept(s2, &ap) == 0);
		/* 0xff: the smaller of the peer's request (the device's maximum here) and the device's maximum. */
		struct ibv_qp_attr qattr;
		struct ibv_qp_init_attr qinit;
		CHECK(ibv_query_qp(s2->qp, &qattr, IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MAX_QP_RD_ATOMIC, &qinit) == 0);
		CHECK(qattr.max_dest_rd_atomic == (da.max_qp_rd_atom < da.max_qp_init_rd_atom ? da.max_qp_rd_atom
											: da.max_qp_init_rd_atom));
		CHECK(qattr.max_rd_atomic == (da.max_qp_rd_atom < da.max_qp_init_rd_atom ? da.max_qp_rd_atom
										     : da.max_qp_init_rd_atom));
	}
	ev = expect(cch, RDMA_CM_EVENT_ESTABLISHED);
	if (ev) {
		CHECK(ev->id == c2);
		CHECK(ev->param.conn.private_data && memcmp(ev->param.conn.private_data, "welcome", 8) == 0);
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	expect_ack(sch, RDMA_CM_EVENT_ESTABLISHED);
	struct ibv_qp_attr at = {.qp_state = IBV_QPS_RTR};
	int mask = 0;
	CHECK(rdma_init_qp_attr(c2, &at, &mask) == 0);
	CHECK(s2 && at.dest_qp_num == s2->qp->qp_num && (mask & IBV_QP_DEST_QPN));
	errno = 0;
	CHECK(rdma_init_qp_attr(c2, NULL, &mask) == -1 && errno == EINVAL);
	smr = rdma_reg_msgs(c2, sbuf, sizeof(sbuf));
	CHECK(smr != NULL);
	CHECK(rdma_post_send(c2, NULL, sbuf, sizeof(sbuf), smr, 0) == 0);
	struct ibv_wc wc;
	CHECK(rdma_get_send_comp(c2, &wc) == 1 && wc.status == IBV_WC_SUCCESS);
	if (s2) {
		CHECK(rdma_get_recv_comp(s2, &wc) == 1 && wc.status == IBV_WC_SUCCESS);
		CHECK(strcmp(rbuf, sbuf) == 0);
	}

	/* Disconnect: both sides hear of it. */
	CHECK(rdma_disconnect(c2) == 0);
	expect_ack(cch, RDMA_CM_EVENT_DISCONNECTED);
	ev = expect(sch, RDMA_CM_EVENT_DISCONNECTED);
	/* Destroy the server's id with that event not acknowledged: returns (bounded wait), the late ack works. */
	if (s2) {
		CHECK(rdma_disconnect(s2) == 0); /* after the peer's: 0, as Linux */
		rdma_dereg_mr(rmr);
		rdma_destroy_qp(s2);
		CHECK(rdma_destroy_id(s2) == 0);
	}
	if (ev)
		CHECK(rdma_ack_cm_event(ev) == 0);
	rdma_dereg_mr(smr);
	rdma_destroy_qp(c2);
	CHECK(rdma_destroy_id(c2) == 0);
	errno = 0;
	CHECK(rdma_destroy_id(c2) == -1 && errno == EINVAL); /* a second destroy */
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(sch);
	rdma_destroy_event_channel(cch);

	if (fails) {
		fprintf(stderr, "%d check(s) failed\n", fails);
		return 1;
	}
	printf("ok\n");
	return 0;
}
