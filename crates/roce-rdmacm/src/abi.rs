//! The C structures of `<rdma/rdma_cma.h>`, with the sizes and offsets measured on Debian 12 x86_64
//! (`docs/spec/LIBRDMACM-ABI.md` §4); every size and the offsets programs read are
//! asserted at compile time. The `<infiniband/verbs.h>` structures this library reads or fills (`ibv_qp`,
//! `ibv_qp_attr`, `union ibv_gid`, ...) are roce-ibverbs' own declarations, re-exported from `roce_abi::verbs`
//! (one declaration, layouts asserted there against `docs/spec/LIBIBVERBS-ABI.md`).
#![allow(dead_code)]

use core::ffi::c_void;
use core::mem::{offset_of, size_of};
use libc::{c_char, c_int, sockaddr_storage};
pub use roce_abi::verbs::*;

/// `struct rdma_event_channel` (4 bytes): the descriptor programs poll.
#[repr(C)]
pub struct RdmaEventChannel {
    pub fd: c_int,
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

/// `RDMA_MAX_RESP_RES` / `RDMA_MAX_INIT_DEPTH` (`<rdma/rdma_cma.h>`): a `rdma_conn_param` value asking for the
/// device's maximum (`rdma_connect`) or the smaller of the peer's request and the device's maximum (`rdma_accept`).
pub const RDMA_MAX_RD: u8 = 0xff;

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
};
