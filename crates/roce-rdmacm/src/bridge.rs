//! The way into rocev2's runtime: the libibverbs calls (through the `DT_NEEDED` `libibverbs.so.1`, rocev2's under
//! `rocev2 run`) and the connection manager through the private table `rocev2_private_v1@ROCEV2_PRIVATE` that
//! rocev2's libibverbs exports (`crates/roce-ibverbs/src/exports/cm_bridge.rs`, whose `#[repr(C)]` types these
//! mirror field for field; `docs/RDMACM.md` §1). One runtime per process: both libraries reach the same one.
//!
//! The table is looked up once with `dlvsym`; with another `libibverbs.so.1` (Debian's, say) it is missing and
//! every call that needs the CM fails with `ENODEV` after one line on stderr naming the reason. A table of another
//! version or size is refused the same way (never called with a layout it does not have).

use core::ffi::c_void;
use std::sync::OnceLock;

use libc::c_int;

use crate::abi::{IbvDeviceAttr, IbvPortAttr, IbvQp, IbvQpAttr, IbvQpInitAttr};

/// `PRIVATE_VERSION` of the table this library was built for.
pub const PRIVATE_VERSION: u32 = 3;
/// Longest private data an event carries.
pub const EVENT_PRIVATE_MAX: usize = 224;

/// `cm_bridge::kind`.
pub mod kind {
    pub const CONNECT_REQUEST: u32 = 0;
    pub const CONNECT_RESPONSE: u32 = 1;
    pub const ESTABLISHED: u32 = 2;
    pub const REJECTED: u32 = 3;
    pub const DISCONNECTED: u32 = 4;
    pub const TIMEWAIT_EXIT: u32 = 5;
    pub const UNREACHABLE: u32 = 6;
    pub const SIDR_REQUEST: u32 = 7;
    pub const SIDR_RESOLVED: u32 = 8;
    pub const SIDR_REJECTED: u32 = 9;
}

/// `cm_bridge::CmEventC`.
#[repr(C)]
pub struct CmEventC {
    pub kind: u32,
    pub status: u32,
    pub conn: u64,
    pub listen: u64,
    pub remote_qpn: u32,
    pub remote_psn: u32,
    pub peer_gid: [u8; 16],
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub path_mtu: u8,
    pub local_ack_timeout: u8,
    pub traffic_class: u8,
    pub reserved: u8,
    pub private_len: u32,
    pub private_data: [u8; EVENT_PRIVATE_MAX],
    pub qkey: u32,
}

impl CmEventC {
    pub fn zeroed() -> Self {
        // SAFETY: plain integers and byte arrays: all-zero is a valid value.
        unsafe { core::mem::zeroed() }
    }

    pub fn private(&self) -> &[u8] {
        &self.private_data[..(self.private_len as usize).min(EVENT_PRIVATE_MAX)]
    }
}

/// `cm_bridge::ConnectC`.
#[repr(C)]
pub struct ConnectC {
    pub qpn: u32,
    pub qp_type: u32,
    pub dgid: [u8; 16],
    pub service_id: u64,
    pub private_data: *const u8,
    pub private_len: u32,
    pub mtu: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub rd_atomic: u8,
    pub timeout: u8,
    pub traffic_class: u8,
}

type Ctx = *mut c_void;

/// `cm_bridge::PrivateV1`.
#[repr(C)]
pub struct PrivateV1 {
    pub version: u32,
    pub size: u32,
    pub open: unsafe extern "C" fn(ctx: Ctx) -> c_int,
    pub listen: unsafe extern "C" fn(ctx: Ctx, service_id: u64, out: *mut u64) -> c_int,
    pub stop_listen: unsafe extern "C" fn(ctx: Ctx, listen: u64) -> c_int,
    pub connect: unsafe extern "C" fn(
        ctx: Ctx,
        req: *const ConnectC,
        out: *mut u64,
        out_psn: *mut u32,
    ) -> c_int,
    pub accept: unsafe extern "C" fn(
        ctx: Ctx,
        conn: u64,
        qpn: u32,
        psn: u32,
        private_data: *const u8,
        private_len: u32,
        rd_atomic: u8,
        rnr_retry_count: u8,
    ) -> c_int,
    pub reject: unsafe extern "C" fn(
        ctx: Ctx,
        conn: u64,
        private_data: *const u8,
        private_len: u32,
    ) -> c_int,
    pub establish: unsafe extern "C" fn(ctx: Ctx, conn: u64) -> c_int,
    pub disconnect: unsafe extern "C" fn(ctx: Ctx, conn: u64) -> c_int,
    pub poll_event: unsafe extern "C" fn(ctx: Ctx, out: *mut CmEventC) -> c_int,
    pub sidr_resolve: unsafe extern "C" fn(
        ctx: Ctx,
        dgid: *const [u8; 16],
        service_id: u64,
        private_data: *const u8,
        private_len: u32,
        out: *mut u64,
    ) -> c_int,
    pub sidr_accept: unsafe extern "C" fn(
        ctx: Ctx,
        conn: u64,
        qpn: u32,
        qkey: u32,
        private_data: *const u8,
        private_len: u32,
    ) -> c_int,
    pub sidr_reject: unsafe extern "C" fn(
        ctx: Ctx,
        conn: u64,
        private_data: *const u8,
        private_len: u32,
    ) -> c_int,
    pub destroy: unsafe extern "C" fn(ctx: Ctx, conn: u64) -> c_int,
    pub flush: unsafe extern "C" fn(ctx: Ctx, timeout_ms: u32) -> c_int,
    pub set_cm_ids:
        unsafe extern "C" fn(cb: unsafe extern "C" fn(out: *mut u8, cap: usize) -> usize) -> c_int,
}

/// The table, or `None` (said once on stderr) when the loaded libibverbs is not rocev2's or not of this version.
pub fn table() -> Option<&'static PrivateV1> {
    static T: OnceLock<Option<usize>> = OnceLock::new();
    let p = *T.get_or_init(|| {
        // SAFETY: dlvsym with NUL-terminated names; RTLD_DEFAULT searches the loaded objects.
        let sym = unsafe {
            libc::dlvsym(
                libc::RTLD_DEFAULT,
                c"rocev2_private_v1".as_ptr(),
                c"ROCEV2_PRIVATE".as_ptr(),
            )
        };
        if sym.is_null() {
            eprintln!(
                "rocev2 librdmacm: the libibverbs.so.1 loaded is not rocev2's (no rocev2_private_v1@ROCEV2_PRIVATE): \
                 run the program with `rocev2 run -- PROGRAM`"
            );
            return None;
        }
        // SAFETY: the symbol is `extern "C" fn() -> *const PrivateV1` in rocev2's libibverbs.
        let f: extern "C" fn() -> *const PrivateV1 = unsafe { core::mem::transmute(sym) };
        let t = f();
        // SAFETY: a pointer to a static table; `version` and `size` are its first two fields in every version.
        let (v, s) = unsafe { ((*t).version, (*t).size) };
        if v != PRIVATE_VERSION || s as usize != size_of::<PrivateV1>() {
            eprintln!(
                "rocev2 librdmacm: rocev2's libibverbs.so.1 offers private table version {v} ({s} bytes), this \
                 librdmacm needs version {PRIVATE_VERSION}: use the two libraries of one build"
            );
            return None;
        }
        Some(t as usize)
    });
    // SAFETY: checked above: a static table of the expected layout.
    p.map(|p| unsafe { &*(p as *const PrivateV1) })
}

#[allow(non_camel_case_types)]
pub type ibv_device = c_void;

unsafe extern "C" {
    pub fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device;
    pub fn ibv_free_device_list(list: *mut *mut ibv_device);
    pub fn ibv_open_device(dev: *mut ibv_device) -> Ctx;
    pub fn ibv_query_gid(ctx: Ctx, port: u8, index: c_int, gid: *mut [u8; 16]) -> c_int;
    pub fn ibv_query_port(ctx: Ctx, port: u8, attr: *mut IbvPortAttr) -> c_int;
    pub fn ibv_query_device(ctx: Ctx, attr: *mut IbvDeviceAttr) -> c_int;
    pub fn ibv_alloc_pd(ctx: Ctx) -> *mut c_void;
    pub fn ibv_create_comp_channel(ctx: Ctx) -> *mut c_void;
    pub fn ibv_destroy_comp_channel(ch: *mut c_void) -> c_int;
    pub fn ibv_create_cq(
        ctx: Ctx,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut c_void,
        comp_vector: c_int,
    ) -> *mut c_void;
    pub fn ibv_destroy_cq(cq: *mut c_void) -> c_int;
    pub fn ibv_create_qp(pd: *mut c_void, attr: *mut IbvQpInitAttr) -> *mut IbvQp;
    pub fn ibv_destroy_qp(qp: *mut IbvQp) -> c_int;
    pub fn ibv_modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, mask: c_int) -> c_int;
    pub fn ibv_attach_mcast(qp: *mut IbvQp, gid: *const [u8; 16], lid: u16) -> c_int;
    pub fn ibv_detach_mcast(qp: *mut IbvQp, gid: *const [u8; 16], lid: u16) -> c_int;
}
