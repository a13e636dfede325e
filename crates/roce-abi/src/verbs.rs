//! The C structures of libibverbs that cross the boundary, `#[repr(C)]` with the sizes and offsets measured on
//! Debian 12 (`docs/spec/LIBIBVERBS-ABI.md` §4, rdma-core 44 `verbs.h`). Every size and the offsets programs read
//! are checked at compile time below (`layout!`): a field that moves fails the build.
//!
//! One declaration for both of rocev2's C libraries: roce-ibverbs hands these structures to programs and reads
//! them from programs; roce-rdmacm (`rdma_create_qp`, the rsocket data path, `rdma_cm_id.route`'s GIDs) builds and
//! reads the same structures when it calls libibverbs as a C program would.
//!
//! The layouts are those of x86_64 Linux with glibc (LP64, glibc's 40-byte `pthread_mutex_t` and 48-byte
//! `pthread_cond_t`, the SysV calling convention roce-ibverbs' `compat` relies on): any other target refuses to
//! build rather than hand C programs structures of the wrong shape.

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
compile_error!(
    "rocev2 implements the libibverbs ABI of x86_64 Linux glibc only (roce-abi src/verbs.rs, ABI.md §4)"
);

use core::ffi::{c_char, c_int, c_void};
use core::mem::{offset_of, size_of};

/// `pthread_mutex_t` (40 bytes on x86_64 glibc; all-zero is `PTHREAD_MUTEX_INITIALIZER`).
pub type PthreadMutex = [u64; 5];
/// `pthread_cond_t` (48 bytes; all-zero is `PTHREAD_COND_INITIALIZER`).
pub type PthreadCond = [u64; 6];

/// A slot of `struct ibv_context_ops` (never called by us; `None` = NULL).
pub type OpsSlot = Option<unsafe extern "C" fn()>;
/// `ops.poll_cq`.
pub type PollCqFn = unsafe extern "C" fn(*mut IbvCq, c_int, *mut IbvWc) -> c_int;
/// `ops.req_notify_cq`.
pub type ReqNotifyFn = unsafe extern "C" fn(*mut IbvCq, c_int) -> c_int;
/// `ops.post_send`.
pub type PostSendFn =
    unsafe extern "C" fn(*mut IbvQp, *mut IbvSendWr, *mut *mut IbvSendWr) -> c_int;
/// `ops.post_recv`.
pub type PostRecvFn =
    unsafe extern "C" fn(*mut IbvQp, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;
/// `ops.post_srq_recv`.
pub type PostSrqRecvFn =
    unsafe extern "C" fn(*mut c_void, *mut IbvRecvWr, *mut *mut IbvRecvWr) -> c_int;

/// `ops.alloc_mw`.
pub type AllocMwFn = unsafe extern "C" fn(*mut IbvPd, c_int) -> *mut IbvMw;
/// `ops.bind_mw`.
pub type BindMwFn = unsafe extern "C" fn(*mut IbvQp, *mut IbvMw, *mut IbvMwBind) -> c_int;
/// `ops.dealloc_mw`.
pub type DeallocMwFn = unsafe extern "C" fn(*mut IbvMw) -> c_int;

/// `struct ibv_context_ops` (32 pointers; the five data-path slots and the three memory-window slots are called by
/// inline functions compiled into the application, `ABI.md` §3.1, §4.1).
#[repr(C)]
pub struct IbvContextOps {
    pub compat_before_mw: [OpsSlot; 7],
    pub alloc_mw: AllocMwFn,
    pub bind_mw: BindMwFn,
    pub dealloc_mw: DeallocMwFn,
    pub compat_create_cq: [OpsSlot; 1],
    pub poll_cq: PollCqFn,
    pub req_notify_cq: ReqNotifyFn,
    pub compat_cq_to_srq: [OpsSlot; 7],
    pub post_srq_recv: PostSrqRecvFn,
    pub compat_qp: [OpsSlot; 4],
    pub post_send: PostSendFn,
    pub post_recv: PostRecvFn,
    pub compat_tail: [OpsSlot; 5],
}

/// `struct ibv_device` (664 bytes).
#[repr(C)]
pub struct IbvDevice {
    pub ops: [*mut c_void; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; 64],
    pub dev_name: [c_char; 64],
    pub dev_path: [c_char; 256],
    pub ibdev_path: [c_char; 256],
}

/// `struct ibv_context` (328 bytes).
#[repr(C)]
pub struct IbvContext {
    pub device: *mut IbvDevice,
    pub ops: IbvContextOps,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: PthreadMutex,
    pub abi_compat: *mut c_void,
}

/// The members of `struct verbs_context` before its `struct ibv_context` (`ABI.md` §4.2): 39 operation slots
/// (offsets 0..312, NULL = not supported; the inline functions of `verbs.h` test each for NULL) and `sz` at 312.
/// An extended context is this head followed by the `ibv_context` the program sees, whose `abi_compat` is
/// `UINTPTR_MAX` (`ABI.md` §3).
#[repr(C)]
pub struct VerbsContextHead {
    pub slots: [usize; 39],
    pub sz: usize,
}

/// Slot index of `verbs_context.query_port` (offset 0) and `.query_device_ex` (offset 216).
pub const VCTX_QUERY_PORT: usize = 0;
pub const VCTX_QUERY_DEVICE_EX: usize = 216 / 8;
/// `verbs_context.create_cq_ex` (vctx offset 200, `ABI.md` §4.2).
pub const VCTX_CREATE_CQ_EX: usize = 200 / 8;
/// `verbs_context.create_qp_ex` (vctx offset 264).
pub const VCTX_CREATE_QP_EX: usize = 264 / 8;
/// `sizeof(struct verbs_context)`, the `sz` of a context that offers every slot it sets.
pub const VERBS_CONTEXT_SIZE: usize = 648;
/// `__VERBS_ABI_IS_EXTENDED`, the `abi_compat` value of an extended context.
pub const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;
/// `sizeof(struct ibv_port_attr)` (52) and `sizeof(struct ibv_device_attr_ex)` (400); offset of
/// `ibv_device_attr_ex.phys_port_cnt_ex` (396).
pub const PORT_ATTR_SIZE: usize = 52;
pub const DEVICE_ATTR_EX_SIZE: usize = 400;
pub const PHYS_PORT_CNT_EX_OFFSET: usize = 396;

/// `struct ibv_pd`.
#[repr(C)]
pub struct IbvPd {
    pub context: *mut IbvContext,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_mw` (32 bytes).
#[repr(C)]
pub struct IbvMw {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub rkey: u32,
    pub handle: u32,
    pub mw_type: c_int,
}

/// `struct ibv_mw_bind_info` (32 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvMwBindInfo {
    pub mr: *mut IbvMr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: u32,
}

/// `struct ibv_mw_bind` (48 bytes).
#[repr(C)]
pub struct IbvMwBind {
    pub wr_id: u64,
    pub send_flags: u32,
    pub bind_info: IbvMwBindInfo,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct IbvCompChannel {
    pub context: *mut IbvContext,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_cq` (128 bytes).
#[repr(C)]
pub struct IbvCq {
    pub context: *mut IbvContext,
    pub channel: *mut IbvCompChannel,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp` (160 bytes).
#[repr(C)]
pub struct IbvQp {
    pub context: *mut IbvContext,
    pub qp_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub events_completed: u32,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct IbvAh {
    pub context: *mut IbvContext,
    pub pd: *mut IbvPd,
    pub handle: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvSge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` (128 bytes). `wr` is the 32-byte union `wr.rdma` / `wr.atomic` / `wr.ud`, read through
/// the accessors of [`SendWrUnion`].
#[repr(C)]
pub struct IbvSendWr {
    pub wr_id: u64,
    pub next: *mut IbvSendWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
    pub opcode: c_int,
    pub send_flags: u32,
    /// `imm_data` (network byte order) / `invalidate_rkey`.
    pub imm_data: u32,
    pub wr: SendWrUnion,
    pub qp_type_xrc_remote_srqn: u32,
    pub bind_mw_tso: [u64; 6],
}

/// The `wr` union of `ibv_send_wr`: `rdma {remote_addr u64, rkey u32}`, `atomic {remote_addr, compare_add, swap
/// u64, rkey u32}`, `ud {ah ptr, remote_qpn u32, remote_qkey u32}`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SendWrUnion {
    pub w0: u64,
    pub w1: u64,
    pub w2: u64,
    pub w3: u64,
}

impl SendWrUnion {
    /// `wr.rdma = { remote_addr, rkey }` (the rest 0).
    pub const fn rdma(remote_addr: u64, rkey: u32) -> Self {
        Self {
            w0: remote_addr,
            w1: rkey as u64,
            w2: 0,
            w3: 0,
        }
    }
    /// `wr.rdma.remote_addr` / `wr.atomic.remote_addr`.
    pub fn remote_addr(&self) -> u64 {
        self.w0
    }
    /// `wr.rdma.rkey` (offset 8 in the union).
    pub fn rdma_rkey(&self) -> u32 {
        self.w1 as u32
    }
    /// `wr.atomic.compare_add`.
    pub fn compare_add(&self) -> u64 {
        self.w1
    }
    /// `wr.atomic.swap`.
    pub fn swap(&self) -> u64 {
        self.w2
    }
    /// `wr.atomic.rkey` (offset 24).
    pub fn atomic_rkey(&self) -> u32 {
        self.w3 as u32
    }
    /// `wr.ud.ah`.
    pub fn ud_ah(&self) -> *mut IbvAh {
        self.w0 as usize as *mut IbvAh
    }
    /// `wr.ud.remote_qpn`.
    pub fn ud_remote_qpn(&self) -> u32 {
        self.w1 as u32
    }
    /// `wr.ud.remote_qkey`.
    pub fn ud_remote_qkey(&self) -> u32 {
        (self.w1 >> 32) as u32
    }
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct IbvRecvWr {
    pub wr_id: u64,
    pub next: *mut IbvRecvWr,
    pub sg_list: *mut IbvSge,
    pub num_sge: c_int,
}

/// `struct ibv_wc` (48 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvWc {
    pub wr_id: u64,
    pub status: c_int,
    pub opcode: c_int,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` (network byte order) / `invalidated_rkey`.
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_global_route` (8-byte aligned: `union ibv_gid` has 64-bit members).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvAhAttr {
    pub grh: IbvGlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr` (144 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpAttr {
    pub qp_state: c_int,
    pub cur_qp_state: c_int,
    pub path_mtu: c_int,
    pub path_mig_state: c_int,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_int,
    pub cap: IbvQpCap,
    pub ah_attr: IbvAhAttr,
    pub alt_ah_attr: IbvAhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_qp_init_attr` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvQpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// The 48 bytes of `struct ibv_port_attr` the exported `ibv_query_port` writes (`_compat_ibv_port_attr`,
/// `ABI.md` §4.3 and §7 item 5).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvPortAttr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
}

/// `struct ibv_device_attr` (232 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvDeviceAttr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: c_int,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

/// `struct ibv_gid_entry` (32 bytes, 8-byte aligned like `union ibv_gid`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct IbvGidEntry {
    pub gid: [u8; 16],
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
    pub ndev_ifindex: u32,
}

/// `struct ibv_srq` (128 bytes).
#[repr(C)]
pub struct IbvSrq {
    pub context: *mut IbvContext,
    pub srq_context: *mut c_void,
    pub pd: *mut IbvPd,
    pub handle: u32,
    pub mutex: PthreadMutex,
    pub cond: PthreadCond,
    pub events_completed: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvSrqAttr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct IbvSrqInitAttr {
    pub srq_context: *mut c_void,
    pub attr: IbvSrqAttr,
}

/// `union ibv_gid` (16 bytes, 8-byte aligned through its `global { subnet_prefix, interface_id }` member).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// `struct ibv_qp_init_attr_ex` (136 bytes): `struct ibv_qp_init_attr`'s members (`comp_mask` then sits at
/// offset 60, in what is that struct's tail padding), then the extension.
#[repr(C)]
pub struct IbvQpInitAttrEx {
    pub qp_context: *mut c_void,
    pub send_cq: *mut IbvCq,
    pub recv_cq: *mut IbvCq,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut IbvPd,
    pub xrcd: *mut c_void,
    pub create_flags: u32,
    pub max_tso_header: u16,
    pub rwq_ind_tbl: *mut c_void,
    pub rx_hash_conf: [u64; 3],
    pub source_qpn: u32,
    pub send_ops_flags: u64,
}

macro_rules! layout {
    ($t:ty, $size:expr $(, $field:ident @ $off:expr)*) => {
        const _: () = assert!(size_of::<$t>() == $size);
        $(const _: () = assert!(offset_of!($t, $field) == $off);)*
    };
}

// ABI.md §4.2.
layout!(VerbsContextHead, 320, sz @ 312);
// ABI.md §4.1.
layout!(IbvMw, 32, context @ 0, pd @ 8, rkey @ 16, handle @ 20, mw_type @ 24);
layout!(IbvMwBindInfo, 32, mr @ 0, addr @ 8, length @ 16, mw_access_flags @ 24);
layout!(IbvMwBind, 48, wr_id @ 0, send_flags @ 8, bind_info @ 16);
layout!(IbvContextOps, 256, alloc_mw @ 56, bind_mw @ 64, dealloc_mw @ 72, poll_cq @ 88, req_notify_cq @ 96, post_srq_recv @ 160, post_send @ 200,
    post_recv @ 208);
layout!(IbvContext, 328, device @ 0, ops @ 8, cmd_fd @ 264, async_fd @ 268, num_comp_vectors @ 272, mutex @ 280,
    abi_compat @ 320);
// ABI.md §4.3.
layout!(IbvDevice, 664, node_type @ 16, transport_type @ 20, name @ 24, dev_name @ 88, dev_path @ 152,
    ibdev_path @ 408);
layout!(IbvPd, 16, context @ 0, handle @ 8);
layout!(IbvMr, 48, context @ 0, pd @ 8, addr @ 16, length @ 24, handle @ 32, lkey @ 36, rkey @ 40);
layout!(IbvCq, 128, context @ 0, channel @ 8, cq_context @ 16, handle @ 24, cqe @ 28, mutex @ 32, cond @ 72,
    comp_events_completed @ 120, async_events_completed @ 124);
layout!(IbvCompChannel, 16, context @ 0, fd @ 8, refcnt @ 12);
layout!(IbvQp, 160, context @ 0, qp_context @ 8, pd @ 16, send_cq @ 24, recv_cq @ 32, srq @ 40, handle @ 48,
    qp_num @ 52, state @ 56, qp_type @ 60, mutex @ 64, cond @ 104, events_completed @ 152);
layout!(IbvAh, 24, context @ 0, pd @ 8, handle @ 16);
layout!(IbvSge, 16, addr @ 0, length @ 8, lkey @ 12);
layout!(IbvSendWr, 128, wr_id @ 0, next @ 8, sg_list @ 16, num_sge @ 24, opcode @ 28, send_flags @ 32,
    imm_data @ 36, wr @ 40, qp_type_xrc_remote_srqn @ 72, bind_mw_tso @ 80);
layout!(IbvRecvWr, 32, wr_id @ 0, next @ 8, sg_list @ 16, num_sge @ 24);
layout!(IbvWc, 48, wr_id @ 0, status @ 8, opcode @ 12, vendor_err @ 16, byte_len @ 20, imm_data @ 24,
    qp_num @ 28, src_qp @ 32, wc_flags @ 36, pkey_index @ 40, slid @ 42, sl @ 44, dlid_path_bits @ 45);
layout!(IbvQpCap, 20, max_send_wr @ 0, max_recv_wr @ 4, max_send_sge @ 8, max_recv_sge @ 12,
    max_inline_data @ 16);
layout!(IbvGlobalRoute, 24, dgid @ 0, flow_label @ 16, sgid_index @ 20, hop_limit @ 21, traffic_class @ 22);
layout!(IbvAhAttr, 32, grh @ 0, dlid @ 24, sl @ 26, src_path_bits @ 27, static_rate @ 28, is_global @ 29,
    port_num @ 30);
layout!(IbvQpAttr, 144, qp_state @ 0, cur_qp_state @ 4, path_mtu @ 8, path_mig_state @ 12, qkey @ 16,
    rq_psn @ 20, sq_psn @ 24, dest_qp_num @ 28, qp_access_flags @ 32, cap @ 36, ah_attr @ 56, alt_ah_attr @ 88,
    pkey_index @ 120, alt_pkey_index @ 122, en_sqd_async_notify @ 124, sq_draining @ 125, max_rd_atomic @ 126,
    max_dest_rd_atomic @ 127, min_rnr_timer @ 128, port_num @ 129, timeout @ 130, retry_cnt @ 131,
    rnr_retry @ 132, alt_port_num @ 133, alt_timeout @ 134, rate_limit @ 136);
layout!(IbvQpInitAttr, 64, qp_context @ 0, send_cq @ 8, recv_cq @ 16, srq @ 24, cap @ 32, qp_type @ 52,
    sq_sig_all @ 56);
layout!(IbvPortAttr, 48, state @ 0, max_mtu @ 4, active_mtu @ 8, gid_tbl_len @ 12, port_cap_flags @ 16,
    max_msg_sz @ 20, bad_pkey_cntr @ 24, qkey_viol_cntr @ 28, pkey_tbl_len @ 32, lid @ 34, sm_lid @ 36, lmc @ 38,
    max_vl_num @ 39, sm_sl @ 40, subnet_timeout @ 41, init_type_reply @ 42, active_width @ 43, active_speed @ 44,
    phys_state @ 45, link_layer @ 46, flags @ 47);
layout!(IbvDeviceAttr, 232, fw_ver @ 0, node_guid @ 64, sys_image_guid @ 72, max_mr_size @ 80,
    page_size_cap @ 88, vendor_id @ 96, vendor_part_id @ 100, hw_ver @ 104, max_qp @ 108, max_qp_wr @ 112,
    device_cap_flags @ 116, max_sge @ 120, max_sge_rd @ 124, max_cq @ 128, max_cqe @ 132, max_mr @ 136,
    max_pd @ 140, max_qp_rd_atom @ 144, max_ee_rd_atom @ 148, max_res_rd_atom @ 152, max_qp_init_rd_atom @ 156,
    max_ee_init_rd_atom @ 160, atomic_cap @ 164, max_ee @ 168, max_rdd @ 172, max_mw @ 176, max_raw_ipv6_qp @ 180,
    max_raw_ethy_qp @ 184, max_mcast_grp @ 188, max_mcast_qp_attach @ 192, max_total_mcast_qp_attach @ 196,
    max_ah @ 200, max_fmr @ 204, max_map_per_fmr @ 208, max_srq @ 212, max_srq_wr @ 216, max_srq_sge @ 220,
    max_pkeys @ 224, local_ca_ack_delay @ 226, phys_port_cnt @ 227);
layout!(IbvSrq, 128, context @ 0, srq_context @ 8, pd @ 16, handle @ 24, mutex @ 32, cond @ 72,
    events_completed @ 120);
layout!(IbvSrqInitAttr, 24, srq_context @ 0, attr @ 8);
layout!(IbvSrqAttr, 12, max_wr @ 0, max_sge @ 4, srq_limit @ 8);
layout!(IbvGidEntry, 32, gid @ 0, gid_index @ 16, port_num @ 20, gid_type @ 24, ndev_ifindex @ 28);
layout!(IbvGid, 16, raw @ 0);
const _: () = assert!(align_of::<IbvGid>() == 8);
layout!(IbvQpInitAttrEx, 136, qp_context @ 0, send_cq @ 8, recv_cq @ 16, srq @ 24, cap @ 32, qp_type @ 52,
    sq_sig_all @ 56, comp_mask @ 60, pd @ 64, xrcd @ 72, create_flags @ 80, max_tso_header @ 84, rwq_ind_tbl @ 88,
    rx_hash_conf @ 96, source_qpn @ 120, send_ops_flags @ 128);

// Enum values (ABI.md §4.4).
pub const IBV_NODE_CA: c_int = 1;
pub const IBV_TRANSPORT_IB: c_int = 0;
pub const IBV_PORT_DOWN: c_int = 1;
pub const IBV_PORT_ACTIVE: c_int = 4;
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub const IBV_GID_TYPE_ROCE_V2: u32 = 2;
/// `ibv_gid_type_sysfs` value of RoCE v2 (private `ibv_query_gid_type` out-parameter).
pub const IBV_GID_TYPE_SYSFS_ROCE_V2: c_int = 1;
pub const IBV_ATOMIC_HCA: c_int = 1;
/// `ibv_srq_attr_mask`: IBV_SRQ_MAX_WR, IBV_SRQ_LIMIT.
pub const IBV_SRQ_MAX_WR: c_int = 1;
pub const IBV_SRQ_LIMIT: c_int = 2;
pub const IBV_QPT_RC: c_int = 2;
pub const IBV_QPT_UC: c_int = 3;
pub const IBV_QPT_UD: c_int = 4;
pub const IBV_WR_RDMA_WRITE: c_int = 0;
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_int = 1;
pub const IBV_WR_SEND: c_int = 2;
pub const IBV_WR_SEND_WITH_IMM: c_int = 3;
pub const IBV_WR_RDMA_READ: c_int = 4;
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_int = 5;
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_int = 6;
pub const IBV_WR_LOCAL_INV: c_int = 7;
pub const IBV_WR_BIND_MW: c_int = 8;
pub const IBV_WR_SEND_WITH_INV: c_int = 9;
pub const IBV_WR_ATOMIC_WRITE: c_int = 15;
pub const IBV_SEND_INLINE: u32 = 0x8;
/// `IBV_ACCESS_OPTIONAL_RANGE`: bits a library may ignore when it does not support them.
pub const IBV_ACCESS_OPTIONAL_RANGE: u32 = 0x3ff0_0000;
/// IBV_ACCESS_MW_BIND.
pub const IBV_ACCESS_MW_BIND: u32 = 0x10;
/// LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC.
pub const IBV_ACCESS_SUPPORTED: u32 = 0xf;

/// `IBV_QP_INIT_ATTR_PD` (`ibv_qp_init_attr_ex.comp_mask`, ABI.md §4.4).
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;
/// `IBV_WC_SUCCESS` (`enum ibv_wc_status`).
pub const IBV_WC_SUCCESS: c_int = 0;
/// `IBV_WC_WITH_IMM` (`enum ibv_wc_flags`).
pub const IBV_WC_WITH_IMM: u32 = 1 << 1;

// `enum ibv_qp_state`.
pub const IBV_QPS_RESET: c_int = 0;
pub const IBV_QPS_INIT: c_int = 1;
pub const IBV_QPS_RTR: c_int = 2;
pub const IBV_QPS_RTS: c_int = 3;
pub const IBV_QPS_ERR: c_int = 6;

// `enum ibv_qp_attr_mask`.
pub const IBV_QP_STATE: c_int = 1;
pub const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub const IBV_QP_PORT: c_int = 1 << 5;
pub const IBV_QP_QKEY: c_int = 1 << 6;
pub const IBV_QP_AV: c_int = 1 << 7;
pub const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;

// `enum ibv_access_flags` (the `int access` of `ibv_reg_mr`, `ibv_qp_attr.qp_access_flags`).
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_int = 8;
