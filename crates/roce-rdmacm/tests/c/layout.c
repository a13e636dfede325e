/* The structure layouts src/abi.rs asserts (docs/spec/LIBRDMACM-ABI.md §4), checked against the installed
 * <rdma/rdma_cma.h> at compile time: tests/c_edge.rs compiles this file; a mismatch is a compile error. The
 * <infiniband/verbs.h> structures this library uses are crate roce-abi's, checked by its tests/c_header.rs. */
#include <stddef.h>
#include <rdma/rdma_cma.h>

#define AT(t, f, n) _Static_assert(offsetof(struct t, f) == (n), #t "." #f)
#define SIZE(t, n) _Static_assert(sizeof(struct t) == (n), "sizeof " #t)

SIZE(rdma_event_channel, 4);
SIZE(rdma_ib_addr, 40);
SIZE(rdma_addr, 296);
AT(rdma_addr, dst_addr, 128);
AT(rdma_addr, addr, 256);
SIZE(ibv_sa_path_rec, 64);
AT(ibv_sa_path_rec, raw_traffic, 36);
AT(ibv_sa_path_rec, flow_label, 40);
AT(ibv_sa_path_rec, reversible, 48);
AT(ibv_sa_path_rec, pkey, 54);
AT(ibv_sa_path_rec, mtu, 58);
AT(ibv_sa_path_rec, packet_life_time, 62);
SIZE(rdma_route, 312);
AT(rdma_route, path_rec, 296);
AT(rdma_route, num_paths, 304);
SIZE(rdma_cm_id, 416);
AT(rdma_cm_id, route, 32);
AT(rdma_cm_id, ps, 344);
AT(rdma_cm_id, port_num, 348);
AT(rdma_cm_id, event, 352);
AT(rdma_cm_id, send_cq_channel, 360);
AT(rdma_cm_id, recv_cq, 384);
AT(rdma_cm_id, pd, 400);
AT(rdma_cm_id, qp_type, 408);
SIZE(rdma_conn_param, 24);
AT(rdma_conn_param, qp_num, 16);
SIZE(rdma_cm_event, 80);
AT(rdma_cm_event, param, 24);
SIZE(rdma_ud_param, 56);
AT(rdma_ud_param, ah_attr, 16);
AT(rdma_ud_param, qp_num, 48);
AT(rdma_ud_param, qkey, 52);
SIZE(rdma_addrinfo, 96);
AT(rdma_addrinfo, ai_src_addr, 24);
AT(rdma_addrinfo, ai_route, 64);
AT(rdma_addrinfo, ai_next, 88);
_Static_assert(RDMA_OPTION_ID == 0 && RDMA_OPTION_ID_TOS == 0 && RDMA_OPTION_ID_REUSEADDR == 1 &&
		       RDMA_OPTION_ID_AFONLY == 2 && RDMA_OPTION_ID_ACK_TIMEOUT == 3,
	       "rdma_set_option names");
_Static_assert(RDMA_UDP_QKEY == 0x01234567, "the Q_Key of rdma_cm UD ids (cma.rs RDMA_UDP_QKEY)");
_Static_assert(RAI_PASSIVE == 1 && RAI_NUMERICHOST == 2, "rdma_addrinfo flags");
_Static_assert(RDMA_CM_EVENT_TIMEWAIT_EXIT == 15 && RDMA_CM_EVENT_CONNECT_RESPONSE == 5, "event numbers");

int main(void)
{
	return 0;
}
