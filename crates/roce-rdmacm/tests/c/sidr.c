/* SIDR through rocev2's librdmacm.so.1 (RDMA_PS_UDP ids; run by crates/roce-cli/tests/rdmacm.rs under
 * `rocev2 run` in a network namespace, the device's address in argv[1]): a UD listener and UD clients in this one
 * process, each side on its own channel.
 *
 *  - accepted: the listener's CONNECT_REQUEST is on a new UD id and carries the client's private data after the
 *    36-byte address header (180 bytes offered; 181 is EINVAL); rdma_create_qp brought both UD QPs to RTS with
 *    Q_Key RDMA_UDP_QKEY; rdma_accept answers at once and the passive side gets no further event; the client's
 *    ESTABLISHED carries param.ud: the server QP's number, RDMA_UDP_QKEY, the accept's private data (136 bytes)
 *    and AH attributes ibv_create_ah takes, and a datagram sent with them arrives (GRH first);
 *  - rejected: rdma_reject's private data and SIDR status 2 reach the client as UNREACHABLE (Linux
 *    cma_sidr_rep_handler), rdma_reject with more than 136 bytes is EINVAL;
 *  - a port nobody listens on: UNREACHABLE with SIDR status 1 (service ID not supported);
 *  - rdma_destroy_id of a request not answered: UNREACHABLE with status 2;
 *  - synchronous ids (rdma_getaddrinfo with RDMA_PS_UDP, rdma_create_ep, rdma_get_request in a thread): the
 *    client's rdma_connect returns once resolved and leaves the ESTABLISHED event with param.ud in id->event (as
 *    librdmacm's ucma_complete); towards a port nobody listens on it fails with errno 1, the SIDR status.
 * Prints "ok" and exits 0 when every check passed. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

#include "check.h"
#define CM_EVENT_TIMEOUT_MS 10000 /* a SIDR_REQ's answer, or the CM's first retry */
#include "cm_event.h"

/* A UD client id on `ch` resolved to `dst`. */
static struct rdma_cm_id *client(struct rdma_event_channel *ch, struct sockaddr_in *dst)
{
	struct rdma_cm_id *id = NULL;
	CHECK(rdma_create_id(ch, &id, NULL, RDMA_PS_UDP) == 0);
	CHECK(id && id->qp_type == IBV_QPT_UD && id->ps == RDMA_PS_UDP);
	CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)dst, 2000) == 0);
	expect_ack(ch, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	expect_ack(ch, RDMA_CM_EVENT_ROUTE_RESOLVED);
	return id;
}

/* A UD QP on `id` (PD `pd`, one CQ for both queues) and checks that rdma_create_qp left it in RTS with the
 * rdma_cm Q_Key. */
static struct ibv_cq *ud_qp(struct rdma_cm_id *id, struct ibv_pd *pd)
{
	struct ibv_cq *cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	CHECK(cq != NULL);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
					      .max_recv_sge = 1},
				      .qp_type = IBV_QPT_UD, .sq_sig_all = 1};
	CHECK(rdma_create_qp(id, pd, &qa) == 0);
	if (!id->qp)
		return cq;
	struct ibv_qp_attr at;
	struct ibv_qp_init_attr ia;
	CHECK(ibv_query_qp(id->qp, &at, IBV_QP_STATE | IBV_QP_QKEY, &ia) == 0);
	CHECK(at.qp_state == IBV_QPS_RTS);
	CHECK(at.qkey == RDMA_UDP_QKEY);
	return cq;
}

/* One completion of `cq` within 5 s. */
static int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	for (int i = 0; i < 5000000; i++) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n)
			return n;
	}
	return 0;
}

/* Sends a SIDR_REQ from a new client and returns the listener's CONNECT_REQUEST id (its event acknowledged). */
static struct rdma_cm_id *request(struct rdma_event_channel *cch, struct rdma_event_channel *sch,
				  struct sockaddr_in *dst, struct rdma_cm_id **c)
{
	*c = client(cch, dst);
	struct rdma_conn_param cp = {.private_data = "req", .private_data_len = 4};
	CHECK(rdma_connect(*c, &cp) == 0);
	struct rdma_cm_event *ev = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *s = ev ? ev->id : NULL;
	if (ev)
		CHECK(rdma_ack_cm_event(ev) == 0);
	return s;
}

/* The server thread of the synchronous part: one request, accepted (rdma_create_ep's QP attributes made its QP). */
static void *ep_server(void *listen)
{
	struct rdma_cm_id *id = NULL;
	CHECK(rdma_get_request(listen, &id) == 0);
	if (id) {
		CHECK(id->qp != NULL && id->qp_type == IBV_QPT_UD);
		CHECK(rdma_accept(id, NULL) == 0);
	}
	return id;
}

/* rdma_create_ep endpoints on port 7176 (`node` the device's address). */
static void synchronous(const char *node)
{
	struct rdma_addrinfo hints = {.ai_flags = RAI_PASSIVE, .ai_port_space = RDMA_PS_UDP,
				      .ai_qp_type = IBV_QPT_UD},
			     *sres = NULL, *cres = NULL, *nres = NULL;
	struct ibv_qp_init_attr qa = {.cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1,
					      .max_recv_sge = 1},
				      .qp_type = IBV_QPT_UD, .sq_sig_all = 1};
	CHECK(rdma_getaddrinfo(node, "7176", &hints, &sres) == 0);
	struct rdma_cm_id *listen = NULL, *c = NULL, *n = NULL;
	struct ibv_qp_init_attr sa = qa, ca = qa;
	CHECK(sres && rdma_create_ep(&listen, sres, NULL, &sa) == 0);
	if (!listen)
		return;
	CHECK(rdma_listen(listen, 1) == 0);
	pthread_t th;
	CHECK(pthread_create(&th, NULL, ep_server, listen) == 0);
	hints.ai_flags = 0;
	CHECK(rdma_getaddrinfo(node, "7176", &hints, &cres) == 0);
	CHECK(cres && rdma_create_ep(&c, cres, NULL, &ca) == 0);
	CHECK(c && c->qp && c->ps == RDMA_PS_UDP);
	if (c)
		CHECK(rdma_connect(c, NULL) == 0);
	void *sid = NULL;
	CHECK(pthread_join(th, &sid) == 0);
	struct rdma_cm_id *s = sid;
	if (c && s) {
		struct rdma_cm_event *ev = c->event;
		CHECK(ev && ev->event == RDMA_CM_EVENT_ESTABLISHED && ev->id == c);
		CHECK(ev && ev->param.ud.qp_num == s->qp->qp_num && ev->param.ud.qkey == RDMA_UDP_QKEY);
		CHECK(ev && ev->param.ud.ah_attr.is_global == 1);
	}
	CHECK(rdma_getaddrinfo(node, "7177", &hints, &nres) == 0);
	CHECK(nres && rdma_create_ep(&n, nres, NULL, NULL) == 0);
	if (n) {
		errno = 0;
		CHECK(rdma_connect(n, NULL) == -1 && errno == 1);
		CHECK(n->event && n->event->event == RDMA_CM_EVENT_UNREACHABLE && n->event->status == 1);
		rdma_destroy_ep(n);
	}
	if (s)
		rdma_destroy_ep(s);
	if (c)
		rdma_destroy_ep(c);
	rdma_destroy_ep(listen);
	rdma_freeaddrinfo(sres);
	rdma_freeaddrinfo(cres);
	rdma_freeaddrinfo(nres);
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(7174)};
	CHECK(inet_pton(AF_INET, argv[1], &addr.sin_addr) == 1);
	struct rdma_event_channel *sch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
	CHECK(sch && cch);
	if (!sch || !cch)
		return 1;

	struct rdma_cm_id *listener = NULL;
	CHECK(rdma_create_id(sch, &listener, (void *)0x5157, RDMA_PS_UDP) == 0);
	CHECK(rdma_bind_addr(listener, (struct sockaddr *)&addr) == 0);
	CHECK(rdma_listen(listener, 4) == 0);

	/* Accepted. */
	struct rdma_cm_id *c1 = client(cch, &addr);
	struct ibv_pd *cpd = ibv_alloc_pd(c1->verbs);
	CHECK(cpd != NULL);
	struct ibv_cq *ccq = ud_qp(c1, cpd);
	char big[181];
	for (int i = 0; i < (int)sizeof(big); i++)
		big[i] = (char)(i + 1);
	struct rdma_conn_param cp = {.private_data = big, .private_data_len = 181};
	errno = 0;
	CHECK(rdma_connect(c1, &cp) == -1 && errno == EINVAL); /* 216 - 36 = 180 bytes at most */
	cp.private_data_len = 180;
	CHECK(rdma_connect(c1, &cp) == 0);
	struct rdma_cm_event *ev = expect(sch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *s1 = NULL;
	if (ev) {
		s1 = ev->id;
		CHECK(ev->listen_id == listener);
		CHECK(s1->context == (void *)0x5157);
		CHECK(s1->ps == RDMA_PS_UDP && s1->qp_type == IBV_QPT_UD);
		CHECK(s1->verbs == c1->verbs);
		CHECK(rdma_get_dst_port(s1) == rdma_get_src_port(c1));
		CHECK(ev->param.ud.private_data_len == 180);
		CHECK(ev->param.ud.private_data && memcmp(ev->param.ud.private_data, big, 180) == 0);
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	struct ibv_pd *spd = NULL;
	struct ibv_cq *scq = NULL;
	struct ibv_mr *smr = NULL;
	char sbuf[40 + 64] = {0};
	if (s1) {
		spd = ibv_alloc_pd(s1->verbs);
		CHECK(spd != NULL);
		scq = ud_qp(s1, spd);
		smr = ibv_reg_mr(spd, sbuf, sizeof(sbuf), IBV_ACCESS_LOCAL_WRITE);
		CHECK(smr != NULL);
		struct ibv_sge sge = {.addr = (uintptr_t)sbuf, .length = sizeof(sbuf), .lkey = smr ? smr->lkey : 0};
		struct ibv_recv_wr rw = {.wr_id = 7, .sg_list = &sge, .num_sge = 1}, *bad;
		CHECK(s1->qp && ibv_post_recv(s1->qp, &rw, &bad) == 0);
		errno = 0;
		CHECK(rdma_reject(s1, big, 137) == -1 && errno == EINVAL); /* SIDR_REP private data: 136 bytes */
		struct rdma_conn_param ap = {.private_data = "welcome", .private_data_len = 8};
		CHECK(rdma_accept(s1, &ap) == 0);
	}
	ev = expect(cch, RDMA_CM_EVENT_ESTABLISHED);
	struct ibv_ah *ah = NULL;
	uint32_t rqpn = 0, rqkey = 0;
	if (ev) {
		CHECK(ev->id == c1 && ev->status == 0);
		CHECK(s1 && s1->qp && ev->param.ud.qp_num == s1->qp->qp_num);
		CHECK(ev->param.ud.qkey == RDMA_UDP_QKEY);
		CHECK(ev->param.ud.private_data_len == 136);
		CHECK(ev->param.ud.private_data && memcmp(ev->param.ud.private_data, "welcome", 8) == 0);
		CHECK(ev->param.ud.ah_attr.is_global == 1 && ev->param.ud.ah_attr.port_num == 1);
		CHECK(memcmp(ev->param.ud.ah_attr.grh.dgid.raw, c1->route.addr.addr.ibaddr.dgid.raw, 16) == 0);
		rqpn = ev->param.ud.qp_num;
		rqkey = ev->param.ud.qkey;
		ah = ibv_create_ah(cpd, &ev->param.ud.ah_attr);
		CHECK(ah != NULL);
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	/* No ESTABLISHED (or anything else) for the passive side of a UD id. */
	struct pollfd p = {.fd = sch->fd, .events = POLLIN};
	CHECK(poll(&p, 1, 300) == 0);
	if (ah && smr) {
		char msg[64] = "a datagram to the SIDR-resolved QP";
		struct ibv_mr *cmr = ibv_reg_mr(cpd, msg, sizeof(msg), 0);
		CHECK(cmr != NULL);
		struct ibv_sge sge = {.addr = (uintptr_t)msg, .length = sizeof(msg), .lkey = cmr ? cmr->lkey : 0};
		struct ibv_send_wr sw = {.wr_id = 9, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED},
				   *bad;
		sw.wr.ud.ah = ah;
		sw.wr.ud.remote_qpn = rqpn;
		sw.wr.ud.remote_qkey = rqkey;
		CHECK(ibv_post_send(c1->qp, &sw, &bad) == 0);
		struct ibv_wc wc;
		CHECK(poll_one(ccq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 9);
		CHECK(poll_one(scq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 7);
		CHECK(wc.byte_len == 40 + sizeof(msg) && (wc.wc_flags & IBV_WC_GRH));
		CHECK(wc.src_qp == c1->qp->qp_num);
		CHECK(strcmp(sbuf + 40, msg) == 0);
		if (cmr)
			ibv_dereg_mr(cmr);
	}

	/* Rejected, with private data. */
	struct rdma_cm_id *c2 = NULL;
	struct rdma_cm_id *s2 = request(cch, sch, &addr, &c2);
	if (s2)
		CHECK(rdma_reject(s2, "nope-data", 10) == 0);
	ev = expect(cch, RDMA_CM_EVENT_UNREACHABLE);
	if (ev) {
		CHECK(ev->id == c2);
		CHECK(ev->status == 2); /* IB_SIDR_REJECT */
		CHECK(ev->param.ud.private_data && memcmp(ev->param.ud.private_data, "nope-data", 10) == 0);
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	if (s2)
		CHECK(rdma_destroy_id(s2) == 0);
	CHECK(rdma_destroy_id(c2) == 0);

	/* A port nobody listens on. */
	struct sockaddr_in none = addr;
	none.sin_port = htons(7175);
	struct rdma_cm_id *c3 = client(cch, &none);
	CHECK(rdma_connect(c3, NULL) == 0);
	ev = expect(cch, RDMA_CM_EVENT_UNREACHABLE);
	if (ev) {
		CHECK(ev->id == c3);
		CHECK(ev->status == 1); /* IB_SIDR_UNSUPPORTED: no such service ID */
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	CHECK(rdma_destroy_id(c3) == 0);

	/* A request destroyed unanswered. */
	struct rdma_cm_id *c4 = NULL;
	struct rdma_cm_id *s4 = request(cch, sch, &addr, &c4);
	if (s4)
		CHECK(rdma_destroy_id(s4) == 0);
	ev = expect(cch, RDMA_CM_EVENT_UNREACHABLE);
	if (ev) {
		CHECK(ev->id == c4 && ev->status == 2);
		CHECK(rdma_ack_cm_event(ev) == 0);
	}
	CHECK(rdma_destroy_id(c4) == 0);

	if (ah)
		ibv_destroy_ah(ah);
	rdma_destroy_qp(c1);
	ibv_destroy_cq(ccq);
	ibv_dealloc_pd(cpd);
	CHECK(rdma_destroy_id(c1) == 0);
	if (s1) {
		if (smr)
			ibv_dereg_mr(smr);
		rdma_destroy_qp(s1);
		if (scq)
			ibv_destroy_cq(scq);
		if (spd)
			ibv_dealloc_pd(spd);
		CHECK(rdma_destroy_id(s1) == 0);
	}
	CHECK(rdma_destroy_id(listener) == 0);
	rdma_destroy_event_channel(sch);
	rdma_destroy_event_channel(cch);

	synchronous(argv[1]);

	if (fails) {
		fprintf(stderr, "%d check(s) failed\n", fails);
		return 1;
	}
	printf("ok\n");
	return 0;
}
