//! The way into rocev2's runtime: the libibverbs calls (through the `DT_NEEDED` `libibverbs.so.1`, rocev2's under
//! `rocev2 run`) and the connection manager through the private table `rocev2_private_v1@ROCEV2_PRIVATE` that
//! rocev2's libibverbs exports (`crates/roce-ibverbs/src/exports/cm_bridge.rs`; `docs/RDMACM.md` §1). The table,
//! its event and request structures and its version are declared once for both libraries in `roce_abi::bridge`
//! (re-exported here). One runtime per process: both libraries reach the same one.
//!
//! The table is looked up once with `dlvsym`; with another `libibverbs.so.1` (Debian's, say) it is missing and
//! every call that needs the CM fails with `ENODEV` after one line on stderr naming the reason. A table of another
//! version or size is refused the same way (`roce_abi::bridge::check`: never called with a layout or meaning it
//! does not have).

use core::ffi::c_void;
use std::sync::OnceLock;

use libc::c_int;

pub use roce_abi::bridge::{CmEventC, ConnectC, EVENT_PRIVATE_MAX, PrivateV1, kind};
use roce_abi::bridge::{EntryFn, SYMBOL, SYMBOL_VERSION};

use crate::abi::{IbvDeviceAttr, IbvPortAttr, IbvQp, IbvQpAttr, IbvQpInitAttr};

type Ctx = *mut c_void;

/// The table, or `None` (said once on stderr) when the loaded libibverbs is not rocev2's or not of this version.
pub fn table() -> Option<&'static PrivateV1> {
    static T: OnceLock<Option<usize>> = OnceLock::new();
    let p = *T.get_or_init(|| {
        // SAFETY: dlvsym with NUL-terminated names; RTLD_DEFAULT searches the loaded objects.
        let sym = unsafe { libc::dlvsym(libc::RTLD_DEFAULT, SYMBOL.as_ptr(), SYMBOL_VERSION.as_ptr()) };
        if sym.is_null() {
            eprintln!(
                "rocev2 librdmacm: the libibverbs.so.1 loaded is not rocev2's (no rocev2_private_v1@ROCEV2_PRIVATE): \
                 run the program with `rocev2 run -- PROGRAM`"
            );
            return None;
        }
        // SAFETY: the symbol is an `EntryFn` in rocev2's libibverbs (`roce_abi::bridge::SYMBOL`).
        let f: EntryFn = unsafe { core::mem::transmute(sym) };
        let t = f();
        // SAFETY: a pointer to a static table; `version` and `size` are its first two fields in every version, so
        // they are read on their own before the table is taken as this version's layout.
        let (v, s) = unsafe { ((*t).version, (*t).size) };
        if let Err(e) = roce_abi::bridge::check(v, s) {
            eprintln!("rocev2 librdmacm: {e}");
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
