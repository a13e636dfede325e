//! `librdmacm.so.1` for rocev2: the rdma_cm C ABI of rdma-core 44 (Debian 12) over the IB connection manager that
//! runs on QP 1 inside rocev2's runtime, so unmodified rdma_cm programs (`rping`, `ucmatose`, perftest `-R`,
//! `rdma_server` / `rdma_client`) connect without the kernel's rdma_cm (`docs/RDMACM.md`, issue #17).
//! `rocev2 run -- PROGRAM` puts it beside rocev2's `libibverbs.so.1`.
//!
//! * SONAME `librdmacm.so.1`, the four version nodes `RDMACM_1.0`–`1.3` and all 68 symbols of Debian's library at
//!   their versions (`librdmacm.map`; the implementations are `rocev2_<name>`, attached with `.symver` by
//!   `versioned!`); a `DT_NEEDED` on `libibverbs.so.1` (`build.rs`). `tests/exports.rs` compares the export table
//!   with Debian's. The `<rdma/rdma_cma.h>` structures (module `abi`) and the
//!   `<infiniband/verbs.h>` ones (crate `roce-abi`, shared with roce-ibverbs) have their layouts asserted at compile time.
//! * One runtime per process: this library links no runtime of its own; it reaches the one of rocev2's libibverbs
//!   through the ordinary `ibv_*` calls and its private table `rocev2_private_v1@ROCEV2_PRIVATE` (module `bridge`; the table and its
//!   versioning rule are declared once for both libraries in `roce_abi::bridge`).
//!   `id->verbs` is a context of that libibverbs.
//! * rdma_cm semantics (module `cma`): event channels whose fd polls, per-id event routing, address resolution from
//!   the kernel's route (module `route`), route records for RoCE, listen on an address or the wildcard, connect /
//!   accept / reject with private data / establish / disconnect, the QP moved INIT→RTR→RTS at the events librdmacm
//!   moves it, `rdma_init_qp_attr`, `rdma_set_option` (TOS, REUSEADDR, AFONLY, ACK timeout), `rdma_migrate_id`;
//!   `rdma_create_ep` / `rdma_get_request` / `rdma_destroy_ep` (module `exports`); `rdma_getaddrinfo` (module
//!   `addrinfo`); UD ids of `RDMA_PS_UDP` over SIDR (`udaddy`: `rdma_connect` → ESTABLISHED with `param.ud`,
//!   CONNECT_REQUEST / `rdma_accept` / `rdma_reject` on the listener's side).
//! * Multicast of `RDMA_PS_UDP` ids (module `mcast`: `rdma_join_multicast(_ex)`, `rdma_leave_multicast`, the local
//!   join Linux's cma makes on RoCE).
//! * Not implemented (`ENOSYS`): the IPoIB port space's SIDR and multicast, ECE, `rdma_notify`, SRQs on an id.
//! * rsockets (module `rsocket`): stream sockets with librdmacm's wire protocol; datagram rsockets and the iomap
//!   calls are not implemented (`ENOTSUP` / `ENOSYS`).

/// Default versions: `.symver rocev2_<name>, <name>@@<node>` for each listed symbol.
macro_rules! versioned {
    ($($node:literal: [$($name:ident),* $(,)?])*) => {
        std::arch::global_asm!(concat!(
            $($(".symver rocev2_", stringify!($name), ", ", stringify!($name), "@@", $node, "\n",)*)*
        ));
    };
}

mod abi;
mod addrinfo;
mod bridge;
mod cma;
mod exports;
mod mcast;
mod route;
mod rsocket;

versioned! {
    "RDMACM_1.0": [rdma_create_event_channel, rdma_destroy_event_channel, rdma_create_id, rdma_destroy_id,
        rdma_migrate_id, rdma_get_cm_event, rdma_ack_cm_event, rdma_event_str, rdma_notify,
        rdma_bind_addr, rdma_resolve_addr, rdma_resolve_route, rdma_getaddrinfo, rdma_freeaddrinfo,
        rdma_get_src_port, rdma_get_dst_port, rdma_get_devices, rdma_free_devices,
        rdma_listen, rdma_connect, rdma_accept, rdma_reject, rdma_disconnect, rdma_set_option, rdma_get_request,
        rdma_create_qp, rdma_create_qp_ex, rdma_destroy_qp, rdma_create_srq, rdma_create_srq_ex, rdma_destroy_srq,
        rdma_create_ep, rdma_destroy_ep, rdma_join_multicast, rdma_leave_multicast,
        rsocket, rbind, rlisten, raccept, rconnect, rshutdown, rclose, rrecv, rrecvfrom, rrecvmsg, rsend, rsendto,
        rsendmsg, rread, rreadv, rwrite, rwritev, rpoll, rselect, rgetpeername, rgetsockname, rsetsockopt,
        rgetsockopt, rfcntl, riomap, riounmap, riowrite]
    "RDMACM_1.1": [rdma_join_multicast_ex]
    "RDMACM_1.2": [rdma_establish, rdma_init_qp_attr]
    "RDMACM_1.3": [rdma_get_remote_ece, rdma_set_local_ece, rdma_reject_ece]
}
