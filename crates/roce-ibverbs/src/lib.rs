//! `libibverbs.so.1` for rocev2: the libibverbs C ABI of rdma-core 44 (Debian 12) over the rocev2 runtime
//! ([`roce_verbs`]), so that unmodified ibverbs programs (`ibv_devices`, `ibv_devinfo`, `ibv_rc_pingpong`,
//! `ibv_ud_pingpong`, perftest) run on the software RNIC without RDMA hardware or kernel module:
//! `rocev2 run [--ip ADDR] -- PROGRAM ARGS` puts this library first on `LD_LIBRARY_PATH` and names the device's
//! address in the environment ([`roce_link::device`]).
//!
//! # The ABI honoured (source: `docs/spec/LIBIBVERBS-ABI.md`, measured on Debian 12)
//!
//! * SONAME `libibverbs.so.1`; the 13 version nodes of the real library (`ibverbs.map`) and every symbol Debian
//!   12's `libibverbs.so.1` exports, each at its version, the 33 `IBVERBS_1.0` twins and
//!   `ibv_register_driver@IBVERBS_1.1` included (ABI.md §1.3; the dynamic loader binds every import before `main`,
//!   §1.2). The versions are attached
//!   with `.symver` (macros `versioned!` / `versioned_compat!` here): the implementations are `rocev2_<name>`,
//!   exported as `<name>@@<node>`, and the twins `rocev2_v10_<name>` as `<name>@IBVERBS_1.0`.
//! * Structures with the measured sizes and offsets (module `abi`, crate `roce-abi`'s `verbs`; every size and offset is asserted at compile
//!   time against ABI.md §4). `tests/exports.rs` checks the built library's export table against Debian's own and
//!   against the imports of the Debian binaries and provider libraries (`readelf`); `tests/c_api.rs` builds a C program against the system
//!   `<infiniband/verbs.h>` and runs it on this library (queries, the data path, and the error contracts below).
//! * Contexts are **extended** (`struct verbs_context`: `abi_compat` = `UINTPTR_MAX`, `sz` = 648, ABI.md §3;
//!   module `exports::extended`): the `query_port` and `query_device_ex` slots are set (`phys_port_cnt_ex` 1),
//!   every other slot is NULL, so the inline functions that need one answer `EOPNOTSUPP` or use their exported
//!   fallback; the five data-path slots of `ibv_context.ops` (`poll_cq`, `req_notify_cq`, `post_send`,
//!   `post_recv`, `post_srq_recv`) are always set.
//!
//! # Implemented
//!
//! Device discovery (one device, from [`roce_link::device::ENV_IP`]; none without it), `ibv_open_device` /
//! `close_device`, `query_device`, `query_port`, `query_gid`, `_ibv_query_gid_ex`, `ibv_query_gid_type`,
//! `query_pkey`, `get_pkey_index`, PD, MR (`ibv_reg_mr`, `ibv_reg_mr_iova2` with any iova; the optional
//! access bits are ignored, as the real library does when unsupported), CQ with completion channels
//! (`ibv_create_comp_channel`, `ibv_get_cq_event` — blocking, or `EAGAIN` when the channel fd is `O_NONBLOCK` —,
//! `ibv_ack_cq_events`, `req_notify_cq`; the channel's `fd` is readable while an event waits, for programs that
//! `poll`/`epoll` it), QP (RC, UC, UD: create, modify with the IPv4-mapped or IPv6 GID of
//! `ah_attr.grh.dgid`, query, destroy), AH, and `post_send` / `post_recv` / `poll_cq` mapped onto [`roce_verbs`]'s
//! `Qp` / `Cq` in the calling thread (no extra thread hop; an auto-progress thread serves a process that stops
//! calling). Shared receive queues (module `exports::srq`): `ibv_create_srq` / `modify_srq` (resize, limit) / `query_srq` /
//! `destroy_srq`, `ibv_post_srq_recv`, RC/UC/UD QPs created with `ibv_qp_init_attr.srq`, `ibv_create_srq_ex` for
//! basic SRQs (its inline wrapper calls `ibv_create_srq`). The runtime opens the UDP link (port 4791 on the address) when the first PD or CQ is created, so
//! `ibv_devinfo` works while another program uses the address.
//!
//! Besides (modules `strings`, `exports::misc_verbs`, `exports::async_events`): `ibv_node_type_str`,
//! `ibv_port_state_str`, `ibv_event_type_str` and the rate conversions (answers equal to Debian's, tested),
//! `ibv_fork_init` / `ibv_is_fork_initialized` (`IBV_FORK_UNNEEDED`: no pinned pages), `ibv_query_gid_table`,
//! `ibv_query_qp_data_in_order` (0: byte order within a packet's copy is not guaranteed), `ibv_reg_mr_iova`,
//! `ibv_rereg_mr` (translation, PD and access, in place: the keys stay), `ibv_resize_cq` (grows and shrinks, keeping
//! queued completions), extended CQs (`ibv_create_cq_ex` and the `ibv_cq_ex` polling API, module `exports::cq_ex`)
//! and QPs (`ibv_create_qp_ex` with `send_ops_flags`, `ibv_qp_to_qp_ex` and the `ibv_wr_*` post-send API, module
//! `exports::qp_ex`; perftest still uses the old API because the `vendor_part_id` is not a Mellanox/EFA one, ABI.md
//! §6.3), `ibv_init_ah_from_wc` / `ibv_create_ah_from_wc` (IPv4 and IPv6 GRH areas),
//! and asynchronous events: the engine's QP fatal / request / access errors, COMM_EST, SQ_DRAINED, CQ error and
//! port events reach `ibv_get_async_event` of the context that owns the object (port events: every context), the
//! context's `async_fd` is readable while one waits (`O_NONBLOCK`: `EAGAIN`; a handler without `SA_RESTART`:
//! `EINTR`), `ibv_ack_async_event` counts the acknowledgement, and `ibv_destroy_qp` / `ibv_destroy_cq` wait for the
//! acknowledgement of every event handed out for them.
//!
//! The checks a real provider and the kernel make on the program's mistakes are made here too: posting to a QP
//! before RTS (send queue) or INIT (receive queue) is `EINVAL` with `*bad_wr` = the first WR (rxe_post_send /
//! rxe_post_recv); `ibv_destroy_cq` of a CQ a QP uses and `ibv_dealloc_pd` of a PD with MRs, QPs or AHs are `EBUSY`
//! (the kernel's use counts); `ibv_reg_mr` of memory that is not mapped, or not writable for a writable MR, is NULL
//! with `EFAULT` (the kernel cannot pin it; here the engine would fault when it copies).
//!
//! `ibv_dereg_mr` succeeds while posted WRs name the MR, as the kernel's does: the key is dead at once, the QPs
//! with such WRs go to the error state (the first of those WRs completes with `IBV_WC_LOC_PROT_ERR`, the rest are
//! flushed) and the engine never touches the memory after the call returns (`roce_verbs::Mr::dereg_invalidate`).
//! It is `EINVAL` while a memory window is bound to the MR, as rxe's (`rxe_dereg_mr` checks the MR's `num_mw`).
//! `ibv_create_cq` refuses a `comp_vector` ≥ `num_comp_vectors` (`EINVAL`, the kernel's check).
//!
//! Object lifetimes follow the kernel's handles (module `exports::live`): the library keeps its own table of live
//! objects; every destroy, dealloc, dereg and close looks its pointer up there, so a second destroy or a foreign
//! pointer is `EINVAL`, never a double free; `ibv_destroy_qp` / `ibv_destroy_ah` release the PD and CQs of the
//! library's own record, not the program-writable struct fields; `ibv_close_device` releases everything the
//! context still owns (QPs, AHs, MRs, CQs, PDs — the runtime and its UDP port go with the last context) and closes
//! its completion channels, which outlive it as in rdma-core (freed by `ibv_destroy_comp_channel`); threads blocked
//! in `ibv_get_cq_event` / `ibv_get_async_event` on it return -1 with `EIO`; a second close is `EINVAL`; `ibv_destroy_cq` waits until every event `ibv_get_cq_event` handed out has been
//! acknowledged (ibv_get_cq_event(3)); a blocking `ibv_get_cq_event` / `ibv_get_async_event` fails with `EINTR`
//! when a signal handler without `SA_RESTART` runs (module `exports::signals`). The C structs the program or
//! other entry points write (`ibv_cq`, `ibv_qp`, `ibv_mr`) are `UnsafeCell`s in the library's blocks. The runtime's
//! threads run with every signal blocked, so the program's handlers run on the program's threads. No panic
//! crosses the C boundary (module `guard`): a verb whose body panics answers with its error return and `EIO`.
//!
//! # Not implemented (clean errors: `NULL` + `errno = EOPNOTSUPP`, or the `EOPNOTSUPP` return each man page gives)
//!
//! XRC and tag-matching SRQs (`ibv_create_srq_ex` beyond a basic SRQ answers `EOPNOTSUPP`), multicast
//! attach/detach through the `IBVERBS_1.0` ABI (`ibv_attach_mcast` of `IBVERBS_1.1` works: `exports/mcast.rs`), the
//! `IBVERBS_1.0` ABI (module `compat`: its device list is NULL + `EOPNOTSUPP`), importing
//! from another process (`ibv_import_device` of a descriptor that is no context of this process; within the
//! process it works, `exports/import.rs`) and `ibv_import_dm`, `ibv_reg_dmabuf_mr`, completion time stamps in `ibv_create_cq_ex`, ECE, on-demand paging,
//! `ibv_resolve_eth_l2_from_gid`, every private `ibv_cmd_*` / `verbs_*` provider entry point (providers are never
//! used: `verbs_register_driver_34` accepts and ignores their registration, ABI.md §1.4). `ibv_req_notify_cq` with `solicited_only` arms for every completion
//! (more events than asked, never fewer). One device per process; the kernel's rdma_cm (perftest `-R`) cannot
//! work without the kernel.

/// Default versions: `.symver rocev2_<name>, <name>@@<node>` for each listed symbol (the implementations are
/// `rocev2_<name>`; `ibverbs.map` lists the names in their nodes).
macro_rules! versioned {
    ($($node:literal: [$($name:ident),* $(,)?])*) => {
        std::arch::global_asm!(concat!(
            $($(".symver rocev2_", stringify!($name), ", ", stringify!($name), "@@", $node, "\n",)*)*
        ));
    };
}

/// Compatibility (non-default) versions: `.symver <prefix><name>, <name>@<node>`, for the old twins the real library
/// keeps beside the default symbol of the same name (e.g. `ibv_get_device_list@IBVERBS_1.0`).
macro_rules! versioned_compat {
    ($($node:literal, $prefix:ident: [$($name:ident),* $(,)?])*) => {
        std::arch::global_asm!(concat!(
            $($(".symver ", stringify!($prefix), stringify!($name), ", ", stringify!($name), "@", $node, "\n",)*)*
        ));
    };
}

/// The libibverbs structures, declared once for both C libraries in crate `roce-abi`.
use roce_abi::verbs as abi;
mod compat;
mod exports;
mod guard;
mod strings;
