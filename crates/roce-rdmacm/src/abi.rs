//! The C structures of `<rdma/rdma_cma.h>` and the few of `<infiniband/verbs.h>` this library reads or fills, with
//! the sizes and offsets measured on Debian 12 x86_64 (`docs/spec/LIBRDMACM-ABI.md` §4; the verbs ones from the
//! same headers). Every size and the offsets programs read are asserted at compile time; `tests/abi.rs` checks
//! them against the installed headers with a C compiler.
#![allow(dead_code)]

use core::ffi::c_void;
use core::mem::{offset_of, size_of};
use libc::{c_char, c_int, sockaddr_storage};

/// `struct rdma_event_channel` (4 bytes): the descriptor programs poll.
#[repr(C)]
pub struct RdmaEventChannel {
    pub fd: c_int,
}

/// `union ibv_gid` (16 bytes; 8-byte aligned through its `global` member).
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub struct IbvGid {
    pub raw: [u8; 16],
}

/// `struct rdma_ib_addr` (40 bytes with its padding).
#[repr(C)]
pub struct RdmaIbAddr {
    pub sgid: IbvGid,
    pub dgid: IbvGid,
    pub pkey: u16,
}

/// `struct rdma_addr` (296 bytes): source and destination as `sockaddr_storage`, then the GIDs.
#[repr(C)]
pub struct RdmaAddr {
    pub src: sockaddr_storage,
    pub dst: sockaddr_storage,
    pub ib: RdmaIbAddr,
}

/// `struct ibv_sa_path_rec` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSaPathRec {
    pub dgid: IbvGid,
    pub sgid: IbvGid,
    pub dlid: u16,
    pub slid: u16,
    pub raw_traffic: c_int,
    pub flow_label: u32,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub reversible: c_int,
    pub numb_path: u8,
    pub pkey: u16,
    pub sl: u8,
    pub mtu_selector: u8,
    pub mtu: u8,
    pub rate_selector: u8,
    pub rate: u8,
    pub packet_life_time_selector: u8,
    pub packet_life_time: u8,
    pub preference: u8,
}

/// `struct rdma_route` (312 bytes).
#[repr(C)]
pub struct RdmaRoute {
    pub addr: RdmaAddr,
    pub path_rec: *mut IbvSaPathRec,
    pub num_paths: c_int,
}

/// `struct rdma_cm_id` (416 bytes).
#[repr(C)]
pub struct RdmaCmId {
    pub verbs: *mut c_void,
    pub channel: *mut RdmaEventChannel,
    pub context: *mut c_void,
    pub qp: *mut IbvQp,
    pub route: RdmaRoute,
    pub ps: c_int,
    pub port_num: u8,
    pub event: *mut RdmaCmEvent,
    pub send_cq_channel: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq_channel: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub pd: *mut c_void,
    pub qp_type: c_int,
}

/// `struct rdma_conn_param` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaConnParam {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_cm_event` (80 bytes): `param` is the 56-byte union of `rdma_conn_param` and `rdma_ud_param`.
#[repr(C)]
pub struct RdmaCmEvent {
    pub id: *mut RdmaCmId,
    pub listen_id: *mut RdmaCmId,
    pub event: c_int,
    pub status: c_int,
    pub conn: RdmaConnParam,
    pub ud_rest: [u8; 32],
}

/// `struct rdma_ud_param` (56 bytes): the `param.ud` of an event on a UD id (`RDMA_PS_UDP`): the private data,
/// the address handle attributes towards the peer's QP, its number and Q_Key.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaUdParam {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub ah_attr: IbvAhAttr,
    pub qp_num: u32,
    pub qkey: u32,
}

impl RdmaCmEvent {
    /// `param.ud`: the same 56 bytes as `param.conn` (the C union), read as `struct rdma_ud_param`.
    pub fn ud_mut(&mut self) -> &mut RdmaUdParam {
        // SAFETY: `conn` and `ud_rest` are the 56 contiguous bytes of the C union at offset 24 (asserted below), 8-byte
        // aligned like `RdmaUdParam`; every bit pattern of its fields is valid (a pointer only handed to C).
        unsafe { &mut *(&raw mut self.conn).cast::<RdmaUdParam>() }
    }
}

/// `struct rdma_addrinfo` (96 bytes).
#[repr(C)]
pub struct RdmaAddrinfo {
    pub ai_flags: c_int,
    pub ai_family: c_int,
    pub ai_qp_type: c_int,
    pub ai_port_space: c_int,
    pub ai_src_len: u32,
    pub ai_dst_len: u32,
    pub ai_src_addr: *mut libc::sockaddr,
    pub ai_dst_addr: *mut libc::sockaddr,
    pub ai_src_canonname: *mut c_char,
    pub ai_dst_canonname: *mut c_char,
    pub ai_route_len: usize,
    pub ai_route: *mut c_void,
    pub ai_connect_len: usize,
    pub ai_connect: *mut c_void,
    pub ai_next: *mut RdmaAddrinfo,
}

/// The start of `struct ibv_qp` (160 bytes): what this library reads.
#[repr(C)]
pub struct IbvQp {
    pub context: *mut c_void,
    pub qp_context: *mut c_void,
    pub pd: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_int,
    pub qp_type: c_int,
}

/// `struct ibv_qp_cap` (20 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvQpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_global_route` (24 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvGlobalRoute {
    pub dgid: IbvGid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr` (32 bytes).
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
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
}

/// The start of `struct ibv_qp_init_attr_ex` (136 bytes): the `ibv_qp_init_attr` fields, `comp_mask`, `pd`.
#[repr(C)]
pub struct IbvQpInitAttrEx {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: IbvQpCap,
    pub qp_type: c_int,
    pub sq_sig_all: c_int,
    pub comp_mask: u32,
    pub pd: *mut c_void,
}

/// `IBV_QP_INIT_ATTR_PD`.
pub const IBV_QP_INIT_ATTR_PD: u32 = 1;

/// `struct ibv_port_attr` (52 bytes); only `active_mtu` is read.
#[repr(C)]
pub struct IbvPortAttr {
    pub state: c_int,
    pub max_mtu: c_int,
    pub active_mtu: c_int,
    pub rest: [u8; 40],
}

/// `struct ibv_device_attr` (232 bytes); only `max_qp_rd_atom` and `max_qp_init_rd_atom` are read.
#[repr(C)]
pub struct IbvDeviceAttr {
    pub head: [u8; 144],
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub rest: [u64; 9],
}

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH` (`<rdma/rdma_cma.h>`): a `rdma_conn_param` value asking for the
/// device's maximum (`rdma_connect`) or the smaller of the peer's request and the device's maximum (`rdma_accept`).
pub const RDMA_MAX_RD: u8 = 0xff;

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

// `enum ibv_access_flags`.
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 2;
pub const IBV_ACCESS_REMOTE_READ: c_int = 4;
pub const IBV_ACCESS_REMOTE_ATOMIC: c_int = 8;

// `enum ibv_qp_type`.
pub const IBV_QPT_RC: c_int = 2;
pub const IBV_QPT_UC: c_int = 3;
pub const IBV_QPT_UD: c_int = 4;

// `enum rdma_port_space`.
pub const RDMA_PS_IPOIB: c_int = 0x0002;
pub const RDMA_PS_TCP: c_int = 0x0106;
pub const RDMA_PS_UDP: c_int = 0x0111;
pub const RDMA_PS_IB: c_int = 0x013f;

// `enum rdma_cm_event_type`.
pub const EV_ADDR_RESOLVED: c_int = 0;
pub const EV_ADDR_ERROR: c_int = 1;
pub const EV_ROUTE_RESOLVED: c_int = 2;
pub const EV_ROUTE_ERROR: c_int = 3;
pub const EV_CONNECT_REQUEST: c_int = 4;
pub const EV_CONNECT_RESPONSE: c_int = 5;
pub const EV_CONNECT_ERROR: c_int = 6;
pub const EV_UNREACHABLE: c_int = 7;
pub const EV_REJECTED: c_int = 8;
pub const EV_ESTABLISHED: c_int = 9;
pub const EV_DISCONNECTED: c_int = 10;
pub const EV_TIMEWAIT_EXIT: c_int = 15;

// `rdma_set_option` levels and names (`<rdma/rdma_cma.h>`).
pub const RDMA_OPTION_ID: c_int = 0;
pub const RDMA_OPTION_IB: c_int = 1;
pub const RDMA_OPTION_ID_TOS: c_int = 0;
pub const RDMA_OPTION_ID_REUSEADDR: c_int = 1;
pub const RDMA_OPTION_ID_AFONLY: c_int = 2;
pub const RDMA_OPTION_ID_ACK_TIMEOUT: c_int = 3;

// `rdma_addrinfo.ai_flags`.
pub const RAI_PASSIVE: c_int = 1;
pub const RAI_NUMERICHOST: c_int = 2;
pub const RAI_NOROUTE: c_int = 4;
pub const RAI_FAMILY: c_int = 8;

const _: () = {
    assert!(size_of::<RdmaEventChannel>() == 4);
    assert!(size_of::<RdmaIbAddr>() == 40);
    assert!(size_of::<RdmaAddr>() == 296);
    assert!(offset_of!(RdmaAddr, dst) == 128);
    assert!(offset_of!(RdmaAddr, ib) == 256);
    assert!(size_of::<IbvSaPathRec>() == 64);
    assert!(offset_of!(IbvSaPathRec, raw_traffic) == 36);
    assert!(offset_of!(IbvSaPathRec, flow_label) == 40);
    assert!(offset_of!(IbvSaPathRec, reversible) == 48);
    assert!(offset_of!(IbvSaPathRec, pkey) == 54);
    assert!(offset_of!(IbvSaPathRec, mtu) == 58);
    assert!(offset_of!(IbvSaPathRec, packet_life_time) == 62);
    assert!(size_of::<RdmaRoute>() == 312);
    assert!(offset_of!(RdmaRoute, path_rec) == 296);
    assert!(offset_of!(RdmaRoute, num_paths) == 304);
    assert!(size_of::<RdmaCmId>() == 416);
    assert!(offset_of!(RdmaCmId, route) == 32);
    assert!(offset_of!(RdmaCmId, ps) == 344);
    assert!(offset_of!(RdmaCmId, port_num) == 348);
    assert!(offset_of!(RdmaCmId, event) == 352);
    assert!(offset_of!(RdmaCmId, send_cq_channel) == 360);
    assert!(offset_of!(RdmaCmId, recv_cq) == 384);
    assert!(offset_of!(RdmaCmId, pd) == 400);
    assert!(offset_of!(RdmaCmId, qp_type) == 408);
    assert!(size_of::<RdmaConnParam>() == 24);
    assert!(offset_of!(RdmaConnParam, qp_num) == 16);
    assert!(size_of::<RdmaCmEvent>() == 80);
    assert!(offset_of!(RdmaCmEvent, conn) == 24);
    assert!(size_of::<RdmaUdParam>() == 56);
    assert!(offset_of!(RdmaUdParam, ah_attr) == 16);
    assert!(offset_of!(RdmaUdParam, qp_num) == 48);
    assert!(offset_of!(RdmaUdParam, qkey) == 52);
    assert!(offset_of!(RdmaCmEvent, ud_rest) + 32 == size_of::<RdmaCmEvent>());
    assert!(size_of::<RdmaConnParam>() + 32 == size_of::<RdmaUdParam>());
    assert!(align_of::<RdmaUdParam>() <= align_of::<RdmaConnParam>());
    assert!(size_of::<RdmaAddrinfo>() == 96);
    assert!(offset_of!(RdmaAddrinfo, ai_src_addr) == 24);
    assert!(offset_of!(RdmaAddrinfo, ai_route) == 64);
    assert!(offset_of!(RdmaAddrinfo, ai_next) == 88);
    assert!(offset_of!(IbvQp, qp_num) == 52);
    assert!(offset_of!(IbvQp, state) == 56);
    assert!(offset_of!(IbvQp, qp_type) == 60);
    assert!(size_of::<IbvQpAttr>() == 144);
    assert!(offset_of!(IbvQpAttr, ah_attr) == 56);
    assert!(offset_of!(IbvQpAttr, pkey_index) == 120);
    assert!(offset_of!(IbvQpAttr, max_rd_atomic) == 126);
    assert!(offset_of!(IbvQpAttr, timeout) == 130);
    assert!(offset_of!(IbvQpAttr, rate_limit) == 136);
    assert!(size_of::<IbvAhAttr>() == 32);
    assert!(offset_of!(IbvAhAttr, is_global) == 29);
    assert!(size_of::<IbvQpInitAttr>() == 64);
    assert!(offset_of!(IbvQpInitAttr, qp_type) == 52);
    assert!(offset_of!(IbvQpInitAttrEx, comp_mask) == 60);
    assert!(offset_of!(IbvQpInitAttrEx, pd) == 64);
    assert!(size_of::<IbvPortAttr>() == 52);
    assert!(size_of::<IbvDeviceAttr>() == 232);
    assert!(offset_of!(IbvDeviceAttr, max_qp_rd_atom) == 144);
    assert!(offset_of!(IbvDeviceAttr, max_qp_init_rd_atom) == 156);
    assert!(offset_of!(IbvPortAttr, active_mtu) == 8);
};
