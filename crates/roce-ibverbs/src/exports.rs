//! The exported C functions and the objects behind the pointers they hand out (the SRQ ones are in `srq`, which
//! uses the helpers below). All `unsafe` of the crate is here and in `srq`:
//! every pointer a program passes is one this library returned (or a caller-owned struct of the documented
//! layout), as the libibverbs man pages require of callers.
//!
//! Each object is a `#[repr(C)]` block whose first member is the C struct the program sees (`IbvCq` …), followed
//! by the Rust state; a program's pointer to the C struct is therefore also a pointer to the block.
#![allow(non_camel_case_types, clippy::missing_safety_doc)]

use core::cell::UnsafeCell;
use core::ffi::{c_char, c_int, c_void};
use core::ptr::{self, null_mut};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use roce_link::device::{
    DeviceSpec, PAGE_SIZE_CAP, UVERBS_NAME, VENDOR_ID, VENDOR_PART_ID, in_use_hint, mac_of,
};
use roce_verbs::{
    AccessFlags, AhAttr, CompChannel, Context, Gid, MAX_INLINE, MAX_SGE, Moderation, Mtu,
    PostError, QpAttr, QpAttrMask, QpCap, QpState, QpType, RecvWr, Rkey, RuntimeConfig, SendFlags,
    SendOp, SendWr, Sge, UdDest, Wc,
};

use crate::abi::*;

mod async_events;
mod cm_bridge;
mod cq_ex;
mod extended;
mod import;
mod link;
mod live;
mod mcast;
mod misc_verbs;
mod mw;
mod qp_ex;
mod signals;
mod srq;

use live::Kind;

// ---------------------------------------------------------------------------------------------------------------
// errno helpers

fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = e };
}

/// NULL with `errno = e` (the pointer-returning verbs' error contract).
pub(crate) fn null_errno<T>(e: c_int) -> *mut T {
    set_errno(e);
    null_mut()
}

fn copy_cstr(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len().saturating_sub(1));
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

// ---------------------------------------------------------------------------------------------------------------
// Objects

/// A device of the list: `ibv_device` plus its configuration. Created once per process and never freed (the real
/// library also keeps devices for the process's life once opened).
#[repr(C)]
struct DeviceBlock {
    dev: IbvDevice,
    spec: DeviceSpec,
    index: c_int,
    /// The runtime (engine + UDP link on port 4791 of the address) shared by the device's open contexts: a process
    /// may open the device more than once (a library and the program each do), and one address has one port 4791.
    /// Each process has its own (`roce_fork`): a `fork`ed child starts without a runtime and never waits on this
    /// lock, which the parent holds across `Context::open` (sockets, threads) and may have held at the fork.
    shared: roce_fork::ForkLocal<SharedRuntime>,
}

/// The runtime of a device and how many open contexts use it; the device keeps it only while one does (the objects
/// made on it hold their own reference).
#[derive(Default)]
struct SharedRuntime {
    rt: Option<Context>,
    contexts: usize,
}

// SAFETY: the C part holds only NULL pointers and byte arrays, written once before the block is shared.
unsafe impl Send for DeviceBlock {}
// SAFETY: as above; the block is never written after creation.
unsafe impl Sync for DeviceBlock {}

/// The devices of this process, from the environment (`roce_link::device::ENV_IP`), built on first use.
fn devices() -> &'static [DeviceBlock] {
    static DEVICES: OnceLock<Vec<DeviceBlock>> = OnceLock::new();
    DEVICES.get_or_init(|| match DeviceSpec::from_env() {
        Ok(Some(spec)) => {
            let mut dev = IbvDevice {
                ops: [null_mut(); 2],
                node_type: IBV_NODE_CA,
                transport_type: IBV_TRANSPORT_IB,
                name: [0; 64],
                dev_name: [0; 64],
                dev_path: [0; 256],
                ibdev_path: [0; 256],
            };
            let name = spec.name();
            copy_cstr(&mut dev.name, &name);
            copy_cstr(&mut dev.dev_name, UVERBS_NAME);
            copy_cstr(
                &mut dev.dev_path,
                &format!("/sys/class/infiniband_verbs/{UVERBS_NAME}"),
            );
            copy_cstr(
                &mut dev.ibdev_path,
                &format!("/sys/class/infiniband/{name}"),
            );
            vec![DeviceBlock {
                dev,
                spec,
                index: 0,
                shared: roce_fork::ForkLocal::new(SharedRuntime::default),
            }]
        }
        Ok(None) => Vec::new(),
        Err(e) => {
            eprintln!("rocev2 libibverbs: no device: {e}");
            Vec::new()
        }
    })
}

/// An opened device. The runtime (engine + UDP link) starts with the first PD or CQ of the device's first context;
/// later contexts of the device share it ([`DeviceBlock::shared`]).
///
/// The context is extended (`ABI.md` §3): `head` is the `verbs_context` part before the `ibv_context` the program
/// holds (module `extended`), so a context pointer is `head`'s address + 320, not the block's.
#[repr(C)]
struct CtxBlock {
    head: VerbsContextHead,
    ctx: IbvContext,
    dev: &'static DeviceBlock,
    rt: OnceLock<Result<Context, c_int>>,
    /// The process whose runtime `rt` holds (0 until it is set): only that process counts this context in
    /// [`SharedRuntime::contexts`], so a forked child closing an inherited context leaves its own runtime alone.
    rt_pid: AtomicU32,
}

impl CtxBlock {
    fn runtime(&self) -> Result<&Context, c_int> {
        self.rt
            .get_or_init(|| {
                let mut shared = self.dev.shared.lock();
                let pid = std::process::id();
                self.rt_pid.store(pid, Ordering::Relaxed);
                // A `fork`ed child's `shared` starts empty (`roce_fork`): its first context starts a runtime of its
                // own (rdma-core: a child opens devices afresh and may not use the parent's resources).
                if let Some(rt) = &shared.rt {
                    let rt = rt.clone();
                    shared.contexts += 1;
                    return Ok(rt);
                }
                let spec = &self.dev.spec;
                let seed = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
                    ^ (u64::from(std::process::id()) << 32);
                // Every process on the address shares it when the kernel steers by QPN (docs/MULTIPROCESS.md).
                let mut ucfg = spec.udp_config();
                ucfg.share = true;
                let link_spec = spec.clone();
                // The runtime's threads start with every signal blocked (module `signals`).
                signals::with_signals_blocked(|| {
                    Context::open(
                        spec.engine_config(seed),
                        RuntimeConfig::default(),
                        move || link::open(&link_spec, ucfg),
                    )
                })
                .map_err(|e| {
                    let mut msg = e.to_string();
                    let mut src = std::error::Error::source(&e);
                    while let Some(s) = src {
                        msg.push_str(": ");
                        msg.push_str(&s.to_string());
                        src = s.source();
                    }
                    // Said once per process: a program retrying (or opening a second context) fails the same way.
                    static SAID: AtomicBool = AtomicBool::new(false);
                    if !SAID.swap(true, Ordering::Relaxed) {
                        let hint = if msg.contains("in use") {
                            let argv: Vec<String> = std::env::args().collect();
                            format!(" ({})", in_use_hint(spec.ip, Some(&argv.join(" "))))
                        } else {
                            String::new()
                        };
                        eprintln!(
                            "rocev2 libibverbs: opening {} on {} (UDP 4791): {msg}{hint}",
                            spec.name(),
                            spec.ip
                        );
                    }
                    e.errno()
                })
                .inspect(|rt| {
                    // Engine events reach `ibv_get_async_event` (module `async_events`).
                    let _ = rt.set_async_handler(Box::new(async_events::deliver));
                    // The device's connection manager answers on QP 1 from the start, as the kernel's does.
                    cm_bridge::start(rt);
                    shared.rt = Some(rt.clone());
                    shared.contexts = 1;
                })
            })
            .as_ref()
            .map_err(|e| *e)
    }
}

#[repr(C)]
pub(crate) struct PdBlock {
    pub(crate) pd: IbvPd,
    pub(crate) rust: roce_verbs::Pd,
    /// MRs, QPs, AHs and SRQs made on this PD and not yet destroyed: `ibv_dealloc_pd` refuses with `EBUSY` while
    /// any remain (the kernel's use count; the Rust handles would otherwise keep the PD alive silently).
    pub(crate) users: AtomicU32,
}

#[repr(C)]
struct MrBlock {
    /// Written by `ibv_rereg_mr` (under `state`'s lock) while the program may hold a pointer to it.
    mr: UnsafeCell<IbvMr>,
    state: Mutex<MrState>,
}

/// What `ibv_rereg_mr` replaces: the registration, the PD it counts as a user of (its `ibv_pd *`, from the
/// library's own record, not the program-writable `ibv_mr.pd`) and the access it was made with.
struct MrState {
    rust: roce_verbs::Mr,
    pd: usize,
    access: u32,
}

#[repr(C)]
struct ChannelBlock {
    ch: IbvCompChannel,
    rust: Arc<CompChannel>,
    /// `(CQ id, ibv_cq address)` of the CQs attached, to turn an event into the program's `ibv_cq *`.
    cqs: Mutex<Vec<(u32, usize)>>,
}

#[repr(C)]
struct CqBlock {
    /// The program writes `cq_context`, and `ibv_ack_cq_events` the mutex, condition and event count, behind any
    /// reference the library holds.
    cq: UnsafeCell<IbvCq>,
    /// The rest of `struct ibv_cq_ex` (right after `cq`: the C struct continues here; `exports/cq_ex.rs`).
    ex: UnsafeCell<cq_ex::CqExTail>,
    /// The completion an `ibv_cq_ex` poll took last (read by `ibv_wc_read_*`), under `polling`.
    cur: UnsafeCell<IbvWc>,
    /// The `ibv_cq_ex` poll lock: held from a successful `ibv_start_poll` to `ibv_end_poll`; the holding thread's
    /// token (`qp_ex::thread_token`), 0 when free.
    polling: std::sync::atomic::AtomicUsize,
    rust: roce_verbs::Cq,
    /// Completion events `ibv_get_cq_event` handed out for this CQ (counted under the channel's `cqs` lock):
    /// `ibv_destroy_cq` waits until `comp_events_completed` has caught up (ibv_get_cq_event(3)).
    events_handed: AtomicU32,
    /// Async events (CQ error) handed out for this CQ: `ibv_destroy_cq` waits for `async_events_completed`.
    async_handed: AtomicU32,
    /// QPs whose send or receive CQ this is (counted once per role): `ibv_destroy_cq` refuses with `EBUSY` while
    /// any remain.
    users: AtomicU32,
}

#[repr(C)]
struct QpBlock {
    /// `ibv_modify_qp` writes `state`, the program `qp_context`, behind any reference the library holds.
    qp: UnsafeCell<IbvQp>,
    /// The rest of `struct ibv_qp_ex` (right after `qp`: the C struct continues here; `exports/qp_ex.rs`).
    ex: UnsafeCell<qp_ex::QpExTail>,
    /// The WRs of an `ibv_wr_start` … `ibv_wr_complete` sequence, under `building`.
    batch: UnsafeCell<qp_ex::WrBatch>,
    /// The `ibv_qp_ex` builder lock: held from `ibv_wr_start` to `ibv_wr_complete` / `ibv_wr_abort`; the holding
    /// thread's token (`qp_ex::thread_token`), 0 when free.
    building: std::sync::atomic::AtomicUsize,
    rust: roce_verbs::Qp,
    sq_sig_all: bool,
    /// The PD and CQs (`ibv_pd *` / `ibv_cq *`) this QP counts as a user of: the library's own record, not the
    /// program-writable `ibv_qp` fields, so `ibv_destroy_qp` releases exactly what `ibv_create_qp` took.
    pd: usize,
    send_cq: usize,
    recv_cq: usize,
    /// Async events handed out for this QP: `ibv_destroy_qp` waits until `events_completed` catches up.
    async_handed: AtomicU32,
    /// The state of the last successful `ibv_modify_qp` (RESET at creation), as libibverbs keeps `ibv_qp.state`:
    /// posting needs RTS or later for the send queue and INIT or later for the receive queue (rxe_post_send /
    /// rxe_post_recv); a QP the engine moved to ERR meanwhile still accepts WRs, which are flushed.
    state: AtomicI32,
}

/// One more (`true`) or one fewer user of the PD or CQ block at `obj` (NULL: nothing).
///
/// # Safety
/// `obj` is NULL or the C struct of a live block of type `T` (`PdBlock` / `CqBlock`).
unsafe fn count_user<T: HasUsers, C>(obj: *mut C, more: bool) {
    // SAFETY: per the contract.
    if let Some(b) = unsafe { block::<T, C>(obj) } {
        if more {
            b.users().fetch_add(1, Ordering::AcqRel);
        } else {
            b.users().fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Blocks whose destruction waits for their users.
trait HasUsers {
    fn users(&self) -> &AtomicU32;
}

impl HasUsers for PdBlock {
    fn users(&self) -> &AtomicU32 {
        &self.users
    }
}

impl HasUsers for CqBlock {
    fn users(&self) -> &AtomicU32 {
        &self.users
    }
}

/// Whether the kernel could pin `[addr, addr + len)` for an MR: every byte in a mapping of this process that is
/// readable and, when `write`, writable (ib_umem_get pins with FOLL_WRITE for writable access; an unmapped or
/// protected page makes `ibv_reg_mr` fail with `EFAULT`). Read from `/proc/self/maps`; if that cannot be read the
/// range is assumed usable. An empty range is usable.
fn pinnable(addr: usize, len: usize, write: bool) -> bool {
    if len == 0 {
        return true;
    }
    let Some(end) = addr.checked_add(len) else {
        return false;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return true;
    };
    let mut cur = addr;
    // Mappings are listed in ascending address order and do not overlap.
    for line in maps.lines() {
        let mut f = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if hi <= cur {
            continue;
        }
        let p = perms.as_bytes();
        if lo > cur || p.first() != Some(&b'r') || (write && p.get(1) != Some(&b'w')) {
            return false;
        }
        cur = hi;
        if cur >= end {
            return true;
        }
    }
    false
}

#[repr(C)]
struct AhBlock {
    ah: IbvAh,
    rust: roce_verbs::Ah,
    /// The `ibv_pd *` this AH counts as a user of (the library's record, not `ibv_ah.pd`).
    pd: usize,
}

/// The block behind a context pointer this library returned.
///
/// # Safety
/// `ctx` is NULL or was returned by `ibv_open_device` and not yet closed.
unsafe fn ctx_block<'a>(ctx: *mut IbvContext) -> Option<&'a CtxBlock> {
    if !live::is(ctx, Kind::Ctx) {
        return None;
    }
    // SAFETY: a live context of ours: the `ctx` member of a live `CtxBlock`.
    unsafe { block_of_ctx(ctx).as_ref() }
}

/// The `CtxBlock` whose `ctx` member is at `ctx` (pointer arithmetic only).
fn block_of_ctx(ctx: *mut IbvContext) -> *mut CtxBlock {
    ctx.wrapping_byte_sub(core::mem::offset_of!(CtxBlock, ctx))
        .cast::<CtxBlock>()
}

const _: () = assert!(core::mem::offset_of!(CtxBlock, ctx) == 320);

/// The block of type `T` behind `obj` if it is a live object of `kind` in the library's table ([`live`]); `None`
/// for NULL, a destroyed object or a foreign pointer.
///
/// # Safety
/// `kind` is the kind of the blocks of type `T`.
unsafe fn live_block<'a, T, C>(obj: *mut C, kind: Kind) -> Option<&'a T> {
    if !live::is(obj, kind) {
        return None;
    }
    // SAFETY: a live object of `kind`, whose blocks are `T`.
    unsafe { block::<T, C>(obj) }
}

/// # Safety
/// `obj` is NULL or a pointer to the first member of a live block of type `T` made by this library.
pub(crate) unsafe fn block<'a, T, C>(obj: *mut C) -> Option<&'a T> {
    // SAFETY: per the contract.
    unsafe { obj.cast::<T>().as_ref() }
}

pub(crate) fn into_raw<T>(b: T) -> *mut T {
    Box::into_raw(Box::new(b))
}

/// # Safety
/// `p` came from [`into_raw`] with the same `T` and is not used afterwards.
pub(crate) unsafe fn free<T, C>(p: *mut C) {
    // SAFETY: per the contract.
    drop(unsafe { Box::from_raw(p.cast::<T>()) });
}

// ---------------------------------------------------------------------------------------------------------------
// Export table: `.symver rocev2_<name>, <name>@@<node>` for every symbol of ABI.md §2.1–§2.2.

versioned! {
    "ROCEV2_PRIVATE": [rocev2_private_v1]
    "IBVERBS_1.0": [ibv_create_comp_channel, ibv_destroy_comp_channel, ibv_read_sysfs_file, ibv_get_sysfs_path,
        ibv_copy_path_rec_from_kern, ibv_copy_qp_attr_from_kern]
    "IBVERBS_1.1": [ibv_ack_cq_events, ibv_alloc_pd, ibv_attach_mcast, ibv_close_device, ibv_create_ah,
        ibv_create_cq, ibv_create_qp, ibv_dealloc_pd, ibv_dereg_mr,
        ibv_destroy_ah, ibv_destroy_cq, ibv_destroy_qp, ibv_detach_mcast, ibv_free_device_list,
        ibv_get_cq_event, ibv_get_device_guid, ibv_get_device_list, ibv_get_device_name, ibv_modify_qp,
        ibv_open_device, ibv_query_device, ibv_query_gid, ibv_query_pkey, ibv_query_port, ibv_query_qp, ibv_reg_mr,
        ibv_wc_status_str, ibv_copy_ah_attr_from_kern, ibv_dofork_range, ibv_dontfork_range,
        ibv_resolve_eth_l2_from_gid]
    "IBVERBS_1.5": [ibv_get_pkey_index]
    "IBVERBS_1.6": [ibv_qp_to_qp_ex]
    "IBVERBS_1.8": [ibv_reg_mr_iova2]
    "IBVERBS_1.9": [ibv_get_device_index]
    "IBVERBS_1.10": [ibv_query_ece, ibv_set_ece]
    "IBVERBS_1.11": [_ibv_query_gid_ex]
    "IBVERBS_PRIVATE_34": [ibv_query_gid_type, verbs_allow_disassociate_destroy, verbs_register_driver_34,
        __verbs_log, _verbs_init_and_alloc_context, verbs_open_device, verbs_init_cq, verbs_set_ops,
        verbs_uninit_context, execute_ioctl, ibv_cmd_advise_mr, ibv_cmd_alloc_dm, ibv_cmd_alloc_mw,
        ibv_cmd_alloc_pd, ibv_cmd_attach_mcast, ibv_cmd_close_xrcd, ibv_cmd_create_ah, ibv_cmd_create_counters,
        ibv_cmd_create_cq_ex, ibv_cmd_create_flow, ibv_cmd_create_flow_action_esp, ibv_cmd_create_qp_ex,
        ibv_cmd_create_qp_ex2, ibv_cmd_create_rwq_ind_table, ibv_cmd_create_srq, ibv_cmd_create_srq_ex,
        ibv_cmd_create_wq, ibv_cmd_dealloc_mw, ibv_cmd_dealloc_pd, ibv_cmd_dereg_mr, ibv_cmd_destroy_ah,
        ibv_cmd_destroy_counters, ibv_cmd_destroy_cq, ibv_cmd_destroy_flow, ibv_cmd_destroy_flow_action,
        ibv_cmd_destroy_qp, ibv_cmd_destroy_rwq_ind_table, ibv_cmd_destroy_srq, ibv_cmd_destroy_wq,
        ibv_cmd_detach_mcast, ibv_cmd_free_dm, ibv_cmd_get_context, ibv_cmd_modify_cq,
        ibv_cmd_modify_flow_action_esp, ibv_cmd_modify_qp, ibv_cmd_modify_qp_ex, ibv_cmd_modify_srq,
        ibv_cmd_modify_wq, ibv_cmd_open_qp, ibv_cmd_open_xrcd, ibv_cmd_query_context, ibv_cmd_query_device_any,
        ibv_cmd_query_mr, ibv_cmd_query_port, ibv_cmd_query_qp, ibv_cmd_query_srq, ibv_cmd_read_counters,
        ibv_cmd_reg_dm_mr, ibv_cmd_reg_dmabuf_mr, ibv_cmd_reg_mr, ibv_cmd_rereg_mr, ibv_cmd_resize_cq]
}

/// Entry points that exist only so the loader can bind them (BIND_NOW, ABI.md §1.2) and fail cleanly when called:
/// the provider-facing `ibv_cmd_*` calls and `execute_ioctl` return `EOPNOTSUPP` (their callers, rdma-core
/// providers, treat a non-zero return as the errno).
macro_rules! unsupported_int {
    ($($name:ident),* $(,)?) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> c_int {
                libc::EOPNOTSUPP
            }
        )*
    };
}

unsupported_int!(
    rocev2_execute_ioctl,
    rocev2_ibv_cmd_advise_mr,
    rocev2_ibv_cmd_alloc_dm,
    rocev2_ibv_cmd_alloc_mw,
    rocev2_ibv_cmd_alloc_pd,
    rocev2_ibv_cmd_attach_mcast,
    rocev2_ibv_cmd_close_xrcd,
    rocev2_ibv_cmd_create_ah,
    rocev2_ibv_cmd_create_counters,
    rocev2_ibv_cmd_create_cq_ex,
    rocev2_ibv_cmd_create_flow,
    rocev2_ibv_cmd_create_flow_action_esp,
    rocev2_ibv_cmd_create_qp_ex,
    rocev2_ibv_cmd_create_qp_ex2,
    rocev2_ibv_cmd_create_rwq_ind_table,
    rocev2_ibv_cmd_create_srq,
    rocev2_ibv_cmd_create_srq_ex,
    rocev2_ibv_cmd_create_wq,
    rocev2_ibv_cmd_dealloc_mw,
    rocev2_ibv_cmd_dealloc_pd,
    rocev2_ibv_cmd_dereg_mr,
    rocev2_ibv_cmd_destroy_ah,
    rocev2_ibv_cmd_destroy_counters,
    rocev2_ibv_cmd_destroy_cq,
    rocev2_ibv_cmd_destroy_flow,
    rocev2_ibv_cmd_destroy_flow_action,
    rocev2_ibv_cmd_destroy_qp,
    rocev2_ibv_cmd_destroy_rwq_ind_table,
    rocev2_ibv_cmd_destroy_srq,
    rocev2_ibv_cmd_destroy_wq,
    rocev2_ibv_cmd_detach_mcast,
    rocev2_ibv_cmd_free_dm,
    rocev2_ibv_cmd_get_context,
    rocev2_ibv_cmd_modify_cq,
    rocev2_ibv_cmd_modify_flow_action_esp,
    rocev2_ibv_cmd_modify_qp,
    rocev2_ibv_cmd_modify_qp_ex,
    rocev2_ibv_cmd_modify_srq,
    rocev2_ibv_cmd_modify_wq,
    rocev2_ibv_cmd_open_qp,
    rocev2_ibv_cmd_open_xrcd,
    rocev2_ibv_cmd_query_context,
    rocev2_ibv_cmd_query_device_any,
    rocev2_ibv_cmd_query_mr,
    rocev2_ibv_cmd_query_port,
    rocev2_ibv_cmd_query_qp,
    rocev2_ibv_cmd_query_srq,
    rocev2_ibv_cmd_read_counters,
    rocev2_ibv_cmd_reg_dm_mr,
    rocev2_ibv_cmd_reg_dmabuf_mr,
    rocev2_ibv_cmd_reg_mr,
    rocev2_ibv_cmd_rereg_mr,
    rocev2_ibv_cmd_resize_cq,
    rocev2_verbs_init_cq,
    // `ibv_query_ece` / `ibv_set_ece` / `ibv_resolve_eth_l2_from_gid` return 0 or an errno value.
    rocev2_ibv_query_ece,
    rocev2_ibv_set_ece,
    rocev2_ibv_resolve_eth_l2_from_gid,
);

/// Pointer-returning entry points that are not supported: NULL with `errno = EOPNOTSUPP`.
macro_rules! unsupported_ptr {
    ($($name:ident),* $(,)?) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> *mut c_void {
                null_errno(libc::EOPNOTSUPP)
            }
        )*
    };
}

unsupported_ptr!(
    rocev2__verbs_init_and_alloc_context,
    rocev2_verbs_open_device,
);

/// `verbs_allow_disassociate_destroy` (a 1-byte data object read by libmlx5).
#[unsafe(no_mangle)]
pub static mut rocev2_verbs_allow_disassociate_destroy: bool = false;

/// Provider registration (the constructors of libmlx5/libefa call it before `main`): accepted and ignored, no
/// provider is ever used.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_verbs_register_driver_34(_ops: *const c_void) {}

/// `__verbs_log` (variadic in C; the extra arguments are ignored): providers' debug log, never reached.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2___verbs_log(_ctx: *mut c_void, _level: u32, _fmt: *const c_char) {}

/// `verbs_set_ops` / `verbs_uninit_context`: provider context set-up and tear-down, never reached (no provider
/// context is ever made); nothing to do.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_verbs_set_ops(_vctx: *mut c_void, _ops: *const c_void) {}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_verbs_uninit_context(_vctx: *mut c_void) {}

/// The `ibv_copy_*_from_kern` helpers convert kernel rdma_cm structures for librdmacm, which cannot reach them
/// without the kernel's rdma_cm device (ABI.md §5.2). They return nothing, so a call is reported on stderr and the
/// destination is left untouched.
fn from_kern_unsupported(what: &str) {
    eprintln!("rocev2 libibverbs: {what} is not supported (it needs the kernel rdma_cm)");
}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_copy_path_rec_from_kern(_dst: *mut c_void, _src: *const c_void) {
    crate::guard::guard(
        "ibv_copy_path_rec_from_kern",
        || (),
        || rocev2_ibv_copy_path_rec_from_kern_inner(_dst, _src),
    )
}

fn rocev2_ibv_copy_path_rec_from_kern_inner(_dst: *mut c_void, _src: *const c_void) {
    from_kern_unsupported("ibv_copy_path_rec_from_kern");
}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_copy_qp_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {
    crate::guard::guard(
        "ibv_copy_qp_attr_from_kern",
        || (),
        || rocev2_ibv_copy_qp_attr_from_kern_inner(_dst, _src),
    )
}

fn rocev2_ibv_copy_qp_attr_from_kern_inner(_dst: *mut c_void, _src: *const c_void) {
    from_kern_unsupported("ibv_copy_qp_attr_from_kern");
}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_copy_ah_attr_from_kern(_dst: *mut c_void, _src: *const c_void) {
    crate::guard::guard(
        "ibv_copy_ah_attr_from_kern",
        || (),
        || rocev2_ibv_copy_ah_attr_from_kern_inner(_dst, _src),
    )
}

fn rocev2_ibv_copy_ah_attr_from_kern_inner(_dst: *mut c_void, _src: *const c_void) {
    from_kern_unsupported("ibv_copy_ah_attr_from_kern");
}

/// `ibv_dontfork_range` / `ibv_dofork_range`: the engine copies through the process's own mappings (no DMA, no
/// pinning), so a child after `fork` cannot corrupt a registration: nothing to do, success.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

// ---------------------------------------------------------------------------------------------------------------
// sysfs helpers

/// `ibv_get_sysfs_path`: `$SYSFS_PATH` or `/sys`.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_get_sysfs_path() -> *const c_char {
    crate::guard::guard(
        "ibv_get_sysfs_path",
        || null_errno::<c_char>(libc::EIO).cast_const(),
        rocev2_ibv_get_sysfs_path_inner,
    )
}

fn rocev2_ibv_get_sysfs_path_inner() -> *const c_char {
    static PATH: OnceLock<std::ffi::CString> = OnceLock::new();
    PATH.get_or_init(|| {
        let p = std::env::var("SYSFS_PATH").unwrap_or_else(|_| "/sys".into());
        std::ffi::CString::new(p.trim_end_matches('/')).unwrap_or_else(|_| c"/sys".to_owned())
    })
    .as_ptr()
}

/// `ibv_read_sysfs_file(dir, file, buf, size)`: the file's first `size - 1` bytes without the trailing newline,
/// NUL-terminated; the length, or -1 when it cannot be read (our devices have no sysfs directory, so
/// `ibv_devinfo`'s `board_id` line is skipped).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_read_sysfs_file",
        || {
            set_errno(libc::EIO);
            -1
        },
        || unsafe { rocev2_ibv_read_sysfs_file_inner(dir, file, buf, size) },
    )
}

unsafe fn rocev2_ibv_read_sysfs_file_inner(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() || size == 0 {
        return -1;
    }
    // SAFETY: the caller passes NUL-terminated strings.
    let (d, f) = unsafe {
        (
            std::ffi::CStr::from_ptr(dir),
            std::ffi::CStr::from_ptr(file),
        )
    };
    let path = format!("{}/{}", d.to_string_lossy(), f.to_string_lossy());
    let Ok(mut bytes) = std::fs::read(path) else {
        return -1;
    };
    bytes.truncate(size - 1);
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
    }
    // SAFETY: `buf` has room for `size` bytes (the caller's contract); we write at most `size - 1` + NUL.
    unsafe {
        ptr::copy_nonoverlapping(bytes.as_ptr(), buf.cast::<u8>(), bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    bytes.len() as c_int
}

// ---------------------------------------------------------------------------------------------------------------
// Devices and contexts

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_get_device_list(num: *mut c_int) -> *mut *mut IbvDevice {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_get_device_list",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_get_device_list_inner(num) },
    )
}

unsafe fn rocev2_ibv_get_device_list_inner(num: *mut c_int) -> *mut *mut IbvDevice {
    let devs = devices();
    let mut v: Vec<*mut IbvDevice> = devs
        .iter()
        .map(|d| ptr::from_ref(&d.dev).cast_mut())
        .collect();
    if !num.is_null() {
        // SAFETY: the caller's out-parameter.
        unsafe { *num = v.len() as c_int };
    }
    v.push(null_mut());
    let list = Box::into_raw(v.into_boxed_slice()).cast::<*mut IbvDevice>();
    live::insert(list, Kind::DeviceList, 0);
    list
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_free_device_list(list: *mut *mut IbvDevice) {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_free_device_list",
        || (),
        || unsafe { rocev2_ibv_free_device_list_inner(list) },
    )
}

unsafe fn rocev2_ibv_free_device_list_inner(list: *mut *mut IbvDevice) {
    // A list this library did not hand out, or already freed: nothing to free (the function returns nothing).
    if live::take(list, Kind::DeviceList, || Ok(())).is_err() {
        return;
    }
    let mut n = 0;
    // SAFETY: `list` came from `ibv_get_device_list`: NULL-terminated.
    while unsafe { !(*list.add(n)).is_null() } {
        n += 1;
    }
    // SAFETY: it was a boxed slice of `n + 1` pointers.
    drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(list, n + 1)) });
}

/// # Safety
/// `dev` is NULL or one of the devices of `ibv_get_device_list`.
unsafe fn dev_block<'a>(dev: *mut IbvDevice) -> Option<&'a DeviceBlock> {
    // SAFETY: our devices are `DeviceBlock`s that live for the process.
    unsafe { dev.cast::<DeviceBlock>().as_ref() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_get_device_name(dev: *mut IbvDevice) -> *const c_char {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_get_device_name",
        || null_errno::<c_char>(libc::EIO).cast_const(),
        || unsafe { rocev2_ibv_get_device_name_inner(dev) },
    )
}

unsafe fn rocev2_ibv_get_device_name_inner(dev: *mut IbvDevice) -> *const c_char {
    // SAFETY: the caller passes a listed device.
    match unsafe { dev_block(dev) } {
        Some(d) => d.dev.name.as_ptr(),
        None => null_errno(libc::EINVAL),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_get_device_guid(dev: *mut IbvDevice) -> u64 {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_get_device_guid",
        || 0,
        || unsafe { rocev2_ibv_get_device_guid_inner(dev) },
    )
}

unsafe fn rocev2_ibv_get_device_guid_inner(dev: *mut IbvDevice) -> u64 {
    // SAFETY: the caller passes a listed device.
    match unsafe { dev_block(dev) } {
        // `__be64`: the GUID's bytes in memory order.
        Some(d) => u64::from_ne_bytes(d.spec.node_guid()),
        None => 0,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_get_device_index(dev: *mut IbvDevice) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_get_device_index",
        || {
            set_errno(libc::EIO);
            -1
        },
        || unsafe { rocev2_ibv_get_device_index_inner(dev) },
    )
}

unsafe fn rocev2_ibv_get_device_index_inner(dev: *mut IbvDevice) -> c_int {
    // SAFETY: the caller passes a listed device.
    unsafe { dev_block(dev) }.map_or(-1, |d| d.index)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_open_device(dev: *mut IbvDevice) -> *mut IbvContext {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_open_device",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_open_device_inner(dev) },
    )
}

unsafe fn rocev2_ibv_open_device_inner(dev: *mut IbvDevice) -> *mut IbvContext {
    // SAFETY: the caller passes a listed device.
    let Some(d) = (unsafe { dev_block(dev) }) else {
        return null_errno(libc::EINVAL);
    };
    // `cmd_fd` / `async_fd`: real descriptors (closed with the context), never readable (no async events); the
    // `cmd_fd` is a file of its own, which `ibv_import_device` recognises (`exports/import.rs`).
    let cmd_fd = import::new_cmd_fd();
    // SAFETY: a plain system call.
    let async_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    let b = into_raw(CtxBlock {
        head: extended::head(),
        ctx: IbvContext {
            device: dev,
            ops: IbvContextOps {
                compat_before_mw: [None; 7],
                alloc_mw: mw::alloc_mw,
                bind_mw: mw::bind_mw,
                dealloc_mw: mw::dealloc_mw,
                compat_create_cq: [None; 1],
                poll_cq,
                req_notify_cq,
                compat_cq_to_srq: [None; 7],
                post_srq_recv: srq::post_srq_recv,
                compat_qp: [None; 4],
                post_send,
                post_recv,
                compat_tail: [None; 5],
            },
            cmd_fd,
            async_fd,
            num_comp_vectors: 1,
            mutex: [0; 5],
            abi_compat: VERBS_ABI_IS_EXTENDED as *mut c_void,
        },
        dev: d,
        rt: OnceLock::new(),
        rt_pid: AtomicU32::new(0),
    });
    // SAFETY: `b` is the block just made; the program gets its `ctx` member.
    let c = unsafe { ptr::addr_of_mut!((*b).ctx) };
    live::insert(c, Kind::Ctx, c as usize);
    async_events::register_ctx(c as usize, async_fd);
    c
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_close_device(ctx: *mut IbvContext) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_close_device",
        || libc::EIO,
        || unsafe { rocev2_ibv_close_device_inner(ctx) },
    )
}

unsafe fn rocev2_ibv_close_device_inner(ctx: *mut IbvContext) -> c_int {
    match live::take(ctx, Kind::Ctx, || Ok(())) {
        Ok(()) => {}
        Err(live::INHERITED) => {
            // A `fork`ed child closing its parent's context (module `live`): its objects leave the child's table and
            // are left alone with it — their teardown would act on the parent's runtime, channels and eventfds.
            // The child's own copies of the context's descriptors are closed (the parent's stay open).
            let _ = live::drain_context(ctx as usize);
            // SAFETY: the context block is the child's copy, valid (never freed here); the descriptors are this
            // process's own duplicates.
            unsafe {
                libc::close((*ctx).cmd_fd);
                libc::close((*ctx).async_fd);
            }
            return 0;
        }
        Err(_) => return libc::EINVAL,
    }
    // Its queued async events and routes go first: nothing is delivered to it any more.
    async_events::unregister_ctx(ctx as usize);
    // SAFETY: it was a live context of ours, and no other call takes it now.
    let c = unsafe { &*block_of_ctx(ctx) };
    // What the program left behind goes first (the kernel's destroy-on-close of the uverbs fd): their runtime
    // references go with them, so the last context below really lets the runtime and its UDP port go.
    for (p, kind) in live::drain_context(ctx as usize) {
        // SAFETY: each was a live object of this context and is no longer in the table.
        unsafe { release(p, kind) };
    }
    // SAFETY: our descriptors.
    unsafe {
        libc::close(c.ctx.cmd_fd);
        libc::close(c.ctx.async_fd);
    }
    // The last open context of the device lets the runtime go (once its objects are gone too); dropped outside the
    // lock, since the last reference joins the runtime's threads.
    let last = match c.rt.get() {
        // Not when a forked child closes a context of its parent (`rt_pid`): that runtime is not counted here.
        Some(Ok(_)) if c.rt_pid.load(Ordering::Relaxed) == std::process::id() => {
            let mut shared = c.dev.shared.lock();
            shared.contexts = shared.contexts.saturating_sub(1);
            if shared.contexts == 0 {
                shared.rt.take()
            } else {
                None
            }
        }
        _ => None,
    };
    drop(last);
    // SAFETY: the context is not used after close (caller's contract).
    unsafe { free::<CtxBlock, _>(block_of_ctx(ctx)) };
    0
}

/// Frees an object `ibv_close_device` found still alive (no use counts to check: everything of the context goes).
///
/// # Safety
/// `p` is an object of `kind` just removed from the live table, not used afterwards.
unsafe fn release(p: usize, kind: Kind) {
    // SAFETY: per the contract.
    unsafe {
        match kind {
            Kind::Qp => free::<QpBlock, _>(p as *mut IbvQp),
            Kind::Srq => srq::release(p as *mut IbvSrq),
            Kind::Ah => free::<AhBlock, _>(p as *mut IbvAh),
            Kind::Mr => free::<MrBlock, _>(p as *mut IbvMr),
            Kind::Mw => mw::release(p as *mut IbvMw),
            Kind::Cq => {
                detach_cq(p as *mut IbvCq);
                free::<CqBlock, _>(p as *mut IbvCq);
            }
            Kind::Channel => orphan_channel(p as *mut IbvCompChannel),
            Kind::Pd => free::<PdBlock, _>(p as *mut IbvPd),
            Kind::Ctx | Kind::DeviceList => {}
        }
    }
}

/// A completion channel outlives the context it was made on, as in rdma-core (its memory and `fd` are the
/// program's until `ibv_destroy_comp_channel`; the uverbs event file of a closed device stays open): closing the
/// context closes the channel instead of freeing it — a thread blocked in `ibv_get_cq_event` on it returns -1 with
/// `EIO` (the kernel's closed event queue) and never touches freed memory, later calls fail the same way — and the
/// channel stays a live object of no context, so `ibv_destroy_comp_channel` frees it later (issue #21 finding: it
/// was freed under a waiting thread).
///
/// # Safety
/// `ch` is a channel block of ours just removed from the live table by `ibv_close_device`; its CQs are gone.
unsafe fn orphan_channel(ch: *mut IbvCompChannel) {
    // SAFETY: per the contract.
    let c = unsafe { &*ch.cast::<ChannelBlock>() };
    c.cqs.lock().unwrap_or_else(|p| p.into_inner()).clear();
    c.rust.close();
    live::insert(ch, Kind::Channel, 0);
}

fn be64(b: [u8; 8]) -> u64 {
    u64::from_ne_bytes(b)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_query_device(
    ctx: *mut IbvContext,
    attr: *mut IbvDeviceAttr,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_query_device",
        || libc::EIO,
        || unsafe { rocev2_ibv_query_device_inner(ctx, attr) },
    )
}

unsafe fn rocev2_ibv_query_device_inner(ctx: *mut IbvContext, attr: *mut IbvDeviceAttr) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { ctx_block(ctx) }) else {
        return libc::EINVAL;
    };
    if attr.is_null() {
        return libc::EINVAL;
    }
    let a = roce_verbs::device_attr(&c.dev.spec.engine_config(0));
    let i = |v: u32| v.min(i32::MAX as u32) as c_int;
    let mut fw = [0 as c_char; 64];
    copy_cstr(&mut fw, env!("CARGO_PKG_VERSION"));
    let guid = be64(c.dev.spec.node_guid());
    let out = IbvDeviceAttr {
        fw_ver: fw,
        node_guid: guid,
        sys_image_guid: guid,
        max_mr_size: a.max_mr_size,
        page_size_cap: PAGE_SIZE_CAP,
        vendor_id: VENDOR_ID,
        vendor_part_id: VENDOR_PART_ID,
        hw_ver: 0,
        max_qp: i(a.max_qp),
        max_qp_wr: i(a.max_qp_wr),
        // IBV_DEVICE_MEM_WINDOW | IBV_DEVICE_MEM_WINDOW_TYPE_2B (memory windows, `exports/mw.rs`).
        device_cap_flags: roce_verbs::DEVICE_CAP_FLAGS,
        max_sge: i(a.max_sge),
        max_sge_rd: i(a.max_sge),
        max_cq: i(a.max_cq),
        max_cqe: i(a.max_cqe),
        max_mr: i(a.max_mr),
        max_pd: i(a.max_pd),
        max_qp_rd_atom: i(a.max_qp_rd_atom),
        max_ee_rd_atom: 0,
        max_res_rd_atom: i(a.max_qp_rd_atom.saturating_mul(a.max_qp)),
        max_qp_init_rd_atom: i(a.max_qp_init_rd_atom),
        max_ee_init_rd_atom: 0,
        atomic_cap: IBV_ATOMIC_HCA,
        max_ee: 0,
        max_rdd: 0,
        max_mw: i(a.max_mw),
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: i(a.max_mcast_grp),
        max_mcast_qp_attach: i(a.max_mcast_qp_attach),
        max_total_mcast_qp_attach: i(a.max_total_mcast_qp_attach),
        max_ah: i(a.max_ah),
        max_fmr: 0,
        max_map_per_fmr: 0,
        max_srq: i(a.max_srq),
        max_srq_wr: i(a.max_srq_wr),
        max_srq_sge: i(a.max_srq_sge.min(MAX_SGE as u32)),
        max_pkeys: 1,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
    };
    // SAFETY: the caller's out-parameter of this type.
    unsafe { attr.write(out) };
    0
}

/// `ibv_query_port` (exported path: writes the 48-byte compat layout, ABI.md §3.2, §7 item 5).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_query_port(
    ctx: *mut IbvContext,
    port: u8,
    attr: *mut IbvPortAttr,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_query_port",
        || libc::EIO,
        || unsafe { rocev2_ibv_query_port_inner(ctx, port, attr) },
    )
}

unsafe fn rocev2_ibv_query_port_inner(
    ctx: *mut IbvContext,
    port: u8,
    attr: *mut IbvPortAttr,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { ctx_block(ctx) }) else {
        return libc::EINVAL;
    };
    if port != 1 || attr.is_null() {
        return libc::EINVAL;
    }
    let s = &c.dev.spec;
    let a = roce_verbs::device_attr(&s.engine_config(0));
    let (active_width, active_speed) = s.width_and_speed();
    let out = IbvPortAttr {
        state: if s.running {
            IBV_PORT_ACTIVE
        } else {
            IBV_PORT_DOWN
        },
        max_mtu: a.max_mtu as c_int,
        active_mtu: s.active_mtu() as c_int,
        gid_tbl_len: s.gids().len() as c_int,
        port_cap_flags: 0,
        max_msg_sz: a.max_msg_sz,
        bad_pkey_cntr: 0,
        qkey_viol_cntr: 0,
        pkey_tbl_len: 1,
        lid: 0,
        sm_lid: 0,
        lmc: 0,
        max_vl_num: 1,
        sm_sl: 0,
        subnet_timeout: 0,
        init_type_reply: 0,
        // The facts `rocev2 run`'s sysfs tree shows too (roce_link::devfs).
        active_width,
        active_speed,
        phys_state: s.phys_state(),
        link_layer: IBV_LINK_LAYER_ETHERNET,
        flags: 0,
    };
    // SAFETY: the caller's struct is at least 48 bytes (the compat layout or the current 52-byte one).
    unsafe { attr.write(out) };
    0
}

/// The GID at `index` of port 1 of `ctx`, or None.
///
/// # Safety
/// As [`ctx_block`].
unsafe fn gid_at(
    ctx: *mut IbvContext,
    port: u32,
    index: c_int,
) -> Option<(Gid, &'static DeviceBlock)> {
    // SAFETY: the caller's contract.
    let c = unsafe { ctx_block(ctx) }?;
    if port != 1 || index < 0 {
        return None;
    }
    Some((*c.dev.spec.gids().get(index as usize)?, c.dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_query_gid(
    ctx: *mut IbvContext,
    port: u8,
    index: c_int,
    gid: *mut [u8; 16],
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_query_gid",
        || {
            set_errno(libc::EIO);
            -1
        },
        || unsafe { rocev2_ibv_query_gid_inner(ctx, port, index, gid) },
    )
}

unsafe fn rocev2_ibv_query_gid_inner(
    ctx: *mut IbvContext,
    port: u8,
    index: c_int,
    gid: *mut [u8; 16],
) -> c_int {
    // SAFETY: the caller passes an open context.
    match unsafe { gid_at(ctx, u32::from(port), index) } {
        Some((g, _)) if !gid.is_null() => {
            // SAFETY: the caller's `union ibv_gid`.
            unsafe { gid.write(g.0) };
            0
        }
        _ => -1,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2__ibv_query_gid_ex(
    ctx: *mut IbvContext,
    port: u32,
    index: u32,
    entry: *mut IbvGidEntry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "_ibv_query_gid_ex",
        || libc::EIO,
        || unsafe { rocev2_ibv_query_gid_ex_inner(ctx, port, index, entry, flags, entry_size) },
    )
}

unsafe fn rocev2_ibv_query_gid_ex_inner(
    ctx: *mut IbvContext,
    port: u32,
    index: u32,
    entry: *mut IbvGidEntry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    if flags != 0 || entry.is_null() || entry_size < size_of::<IbvGidEntry>() {
        return libc::EINVAL;
    }
    let Ok(idx) = c_int::try_from(index) else {
        return libc::EINVAL;
    };
    // SAFETY: the caller passes an open context.
    match unsafe { gid_at(ctx, port, idx) } {
        Some((g, d)) => {
            // SAFETY: the caller's entry of at least `entry_size` ≥ 32 bytes.
            unsafe {
                entry.write(IbvGidEntry {
                    gid: g.0,
                    gid_index: index,
                    port_num: port,
                    gid_type: IBV_GID_TYPE_ROCE_V2,
                    ndev_ifindex: d.spec.ifindex,
                })
            };
            0
        }
        None => libc::ENODATA,
    }
}

/// Private `ibv_query_gid_type` (ibv_devinfo -v): `*type = 1` (RoCE v2 in `ibv_gid_type_sysfs`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_query_gid_type(
    ctx: *mut IbvContext,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_query_gid_type",
        || {
            set_errno(libc::EIO);
            -1
        },
        || unsafe { rocev2_ibv_query_gid_type_inner(ctx, port, index, ty) },
    )
}

unsafe fn rocev2_ibv_query_gid_type_inner(
    ctx: *mut IbvContext,
    port: u8,
    index: u32,
    ty: *mut c_int,
) -> c_int {
    let Ok(idx) = c_int::try_from(index) else {
        return -1;
    };
    // SAFETY: the caller passes an open context.
    match unsafe { gid_at(ctx, u32::from(port), idx) } {
        Some(_) if !ty.is_null() => {
            // SAFETY: the caller's out-parameter.
            unsafe { *ty = IBV_GID_TYPE_SYSFS_ROCE_V2 };
            0
        }
        _ => -1,
    }
}

/// The one P_Key, the default 0xFFFF.
const DEFAULT_PKEY_BE: u16 = 0xffff;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_query_pkey(
    ctx: *mut IbvContext,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_query_pkey",
        || {
            set_errno(libc::EIO);
            -1
        },
        || unsafe { rocev2_ibv_query_pkey_inner(ctx, port, index, pkey) },
    )
}

unsafe fn rocev2_ibv_query_pkey_inner(
    ctx: *mut IbvContext,
    port: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    // SAFETY: the caller passes an open context.
    if unsafe { ctx_block(ctx) }.is_none() || port != 1 || index != 0 || pkey.is_null() {
        return -1;
    }
    // SAFETY: the caller's out-parameter.
    unsafe { *pkey = DEFAULT_PKEY_BE };
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_get_pkey_index(
    ctx: *mut IbvContext,
    port: u8,
    pkey: u16,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_get_pkey_index",
        || {
            set_errno(libc::EIO);
            -1
        },
        || unsafe { rocev2_ibv_get_pkey_index_inner(ctx, port, pkey) },
    )
}

unsafe fn rocev2_ibv_get_pkey_index_inner(ctx: *mut IbvContext, port: u8, pkey: u16) -> c_int {
    // SAFETY: the caller passes an open context.
    if unsafe { ctx_block(ctx) }.is_some() && port == 1 && pkey == DEFAULT_PKEY_BE {
        0
    } else {
        -1
    }
}

// ---------------------------------------------------------------------------------------------------------------
// PD and MR

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_alloc_pd(ctx: *mut IbvContext) -> *mut IbvPd {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_alloc_pd",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_alloc_pd_inner(ctx) },
    )
}

unsafe fn rocev2_ibv_alloc_pd_inner(ctx: *mut IbvContext) -> *mut IbvPd {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { ctx_block(ctx) }) else {
        return null_errno(libc::EINVAL);
    };
    let rt = match c.runtime() {
        Ok(rt) => rt,
        Err(e) => return null_errno(e),
    };
    match rt.alloc_pd() {
        Ok(pd) => {
            let b = into_raw(PdBlock {
                pd: IbvPd {
                    context: ctx,
                    handle: import::next_handle(),
                },
                rust: pd,
                users: AtomicU32::new(0),
            });
            live::insert(b, Kind::Pd, ctx as usize);
            b.cast()
        }
        Err(e) => null_errno(e.errno()),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_dealloc_pd",
        || libc::EIO,
        || unsafe { rocev2_ibv_dealloc_pd_inner(pd) },
    )
}

unsafe fn rocev2_ibv_dealloc_pd_inner(pd: *mut IbvPd) -> c_int {
    let r = live::take(pd, Kind::Pd, || {
        // SAFETY: a live PD of ours (checked by `take` under its lock).
        let p = unsafe { &*pd.cast::<PdBlock>() };
        if p.users.load(Ordering::Acquire) != 0 {
            return Err(libc::EBUSY);
        }
        Ok(())
    });
    if let Err(e) = r {
        return e;
    }
    // SAFETY: a PD of ours without users, not used after this call.
    unsafe { free::<PdBlock, _>(pd) };
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_reg_mr",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_reg_mr_inner(pd, addr, length, access) },
    )
}

unsafe fn rocev2_ibv_reg_mr_inner(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: forwarded under the same contract.
    unsafe { rocev2_ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as u32) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_reg_mr_iova2(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_reg_mr_iova2",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_reg_mr_iova2_inner(pd, addr, length, iova, access) },
    )
}

unsafe fn rocev2_ibv_reg_mr_iova2_inner(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    // SAFETY: PD blocks are `PdBlock`s.
    let Some(p) = (unsafe { live_block::<PdBlock, _>(pd, Kind::Pd) }) else {
        return null_errno(libc::EINVAL);
    };
    // SAFETY: `ibv_reg_mr`'s contract (the memory stays valid until `ibv_dereg_mr`).
    match unsafe { reg_checked(p, addr, length, iova, access) } {
        Ok(mr) => {
            p.users.fetch_add(1, Ordering::AcqRel);
            let b = into_raw(MrBlock {
                mr: UnsafeCell::new(IbvMr {
                    context: p.pd.context,
                    pd,
                    addr,
                    length,
                    handle: import::next_handle(),
                    lkey: mr.lkey().0,
                    rkey: mr.rkey().0,
                }),
                state: Mutex::new(MrState {
                    rust: mr,
                    pd: pd as usize,
                    access,
                }),
            });
            live::insert(b, Kind::Mr, p.pd.context as usize);
            b.cast()
        }
        Err(e) => null_errno(e),
    }
}

/// The access bits of `ibv_reg_mr` / `ibv_rereg_mr` the engine keeps, for memory `addr..addr + length`: the
/// optional range (relaxed ordering …) may be ignored; MW_BIND (0x10) is kept (memory windows, `exports/mw.rs`); HUGETLB (0x80) is
/// a hint. Errors: `EOPNOTSUPP` (ZERO_BASED, ON_DEMAND or unknown bits), `EFAULT` (the memory is not mapped, or not
/// writable for an access the engine writes with). Any `iova` is fine: SGEs and peers then name the memory by
/// `iova + offset` (ibv_reg_mr(3)).
pub(crate) fn mr_access_checked(
    addr: *mut c_void,
    length: usize,
    access: u32,
) -> Result<u32, c_int> {
    let access = access & !IBV_ACCESS_OPTIONAL_RANGE & !0x80;
    if access & !(IBV_ACCESS_SUPPORTED | IBV_ACCESS_MW_BIND) != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    // LOCAL_WRITE | REMOTE_WRITE | REMOTE_ATOMIC: the engine writes into the memory (ib_access_writable).
    if !pinnable(addr as usize, length, access & 0xb != 0) {
        return Err(libc::EFAULT);
    }
    Ok(access)
}

/// Registers `[addr, addr + length)` on `p` with the checks of `ibv_reg_mr` (an errno on failure).
///
/// # Safety
/// `ibv_reg_mr`'s contract is `reg_mr_raw`'s: the program's memory stays valid until `ibv_dereg_mr` and it does
/// not race in-flight work (ibv_reg_mr(3), ibv_post_send(3)).
unsafe fn reg_checked(
    p: &PdBlock,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> Result<roce_verbs::Mr, c_int> {
    let access = mr_access_checked(addr, length, access)?;
    // SAFETY: per the contract.
    unsafe {
        p.rust
            .reg_mr_raw_iova(addr.cast::<u8>(), length, AccessFlags(access), iova)
    }
    .map_err(|e| e.errno())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_dereg_mr",
        || libc::EIO,
        || unsafe { rocev2_ibv_dereg_mr_inner(mr) },
    )
}

unsafe fn rocev2_ibv_dereg_mr_inner(mr: *mut IbvMr) -> c_int {
    let mut pd = 0;
    let r = live::take(mr, Kind::Mr, || {
        // SAFETY: a live MR of ours (checked by `take` under its lock).
        let m = unsafe { &*mr.cast::<MrBlock>() };
        let st = m.state.lock().unwrap_or_else(|p| p.into_inner());
        pd = st.pd;
        st.rust
            .clone()
            .dereg_invalidate()
            .map_err(|(_, e)| e.errno())
    });
    if let Err(e) = r {
        return e;
    }
    // SAFETY: deregistered and out of the table; the caller does not use `mr` again. Its PD is live (it has this
    // user).
    unsafe {
        count_user::<PdBlock, _>(pd as *mut IbvPd, false);
        free::<MrBlock, _>(mr);
    }
    0
}

// ---------------------------------------------------------------------------------------------------------------
// Completion channels and CQs

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_create_comp_channel(
    ctx: *mut IbvContext,
) -> *mut IbvCompChannel {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_create_comp_channel",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_create_comp_channel_inner(ctx) },
    )
}

unsafe fn rocev2_ibv_create_comp_channel_inner(ctx: *mut IbvContext) -> *mut IbvCompChannel {
    // SAFETY: the caller passes an open context.
    if unsafe { ctx_block(ctx) }.is_none() {
        return null_errno(libc::EINVAL);
    }
    // `fd`: the channel's, readable while an event waits (a program may poll it, then call ibv_get_cq_event), and
    // blocking unless the program sets O_NONBLOCK on it (then ibv_get_cq_event does not wait).
    let rust = Arc::new(CompChannel::new());
    let Some(fd) = rust.fd() else {
        return null_errno(libc::EMFILE);
    };
    let b = into_raw(ChannelBlock {
        ch: IbvCompChannel {
            context: ctx,
            fd,
            refcnt: 0,
        },
        rust,
        cqs: Mutex::new(Vec::new()),
    });
    live::insert(b, Kind::Channel, ctx as usize);
    b.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_destroy_comp_channel(ch: *mut IbvCompChannel) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_destroy_comp_channel",
        || libc::EIO,
        || unsafe { rocev2_ibv_destroy_comp_channel_inner(ch) },
    )
}

unsafe fn rocev2_ibv_destroy_comp_channel_inner(ch: *mut IbvCompChannel) -> c_int {
    let r = live::take(ch, Kind::Channel, || {
        // SAFETY: a live channel of ours (checked by `take` under its lock).
        let c = unsafe { &*ch.cast::<ChannelBlock>() };
        if c.cqs.lock().map_or(true, |v| !v.is_empty()) {
            return Err(libc::EBUSY);
        }
        Ok(())
    });
    if let Err(e) = r {
        return e;
    }
    // SAFETY: the channel is not used after this call (its descriptor goes with the Rust channel).
    unsafe { free::<ChannelBlock, _>(ch) };
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_create_cq(
    ctx: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
) -> *mut IbvCq {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_create_cq",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_create_cq_inner(ctx, cqe, cq_context, channel, comp_vector) },
    )
}

unsafe fn rocev2_ibv_create_cq_inner(
    ctx: *mut IbvContext,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    comp_vector: c_int,
) -> *mut IbvCq {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { ctx_block(ctx) }) else {
        return null_errno(libc::EINVAL);
    };
    // SAFETY: channel blocks are `ChannelBlock`s.
    let ch = unsafe { live_block::<ChannelBlock, _>(channel, Kind::Channel) };
    if ch.is_none() && !channel.is_null() {
        return null_errno(libc::EINVAL);
    }
    let Ok(depth) = u32::try_from(cqe) else {
        return null_errno(libc::EINVAL);
    };
    // The kernel's check (ib_uverbs create_cq): the vector, taken as unsigned, below
    // `num_comp_vectors`.
    if comp_vector as u32 >= c.ctx.num_comp_vectors as u32 {
        return null_errno(libc::EINVAL);
    }
    let rt = match c.runtime() {
        Ok(rt) => rt,
        Err(e) => return null_errno(e),
    };
    let cq = match rt.create_cq(depth, ch.map(|c| &c.rust), Moderation::default()) {
        Ok(cq) => cq,
        Err(e) => return null_errno(e.errno()),
    };
    let id = cq.id();
    let b = into_raw(CqBlock {
        cq: UnsafeCell::new(IbvCq {
            context: ctx,
            channel,
            cq_context,
            handle: id,
            cqe,
            mutex: [0; 5],
            cond: [0; 6],
            comp_events_completed: 0,
            async_events_completed: 0,
        }),
        ex: UnsafeCell::new(cq_ex::CqExTail::NONE),
        cur: UnsafeCell::new(IbvWc::default()),
        polling: std::sync::atomic::AtomicUsize::new(0),
        rust: cq,
        users: AtomicU32::new(0),
        events_handed: AtomicU32::new(0),
        async_handed: AtomicU32::new(0),
    });
    live::insert(b, Kind::Cq, ctx as usize);
    async_events::register_cq(id, ctx as usize, b as usize);
    if let Some(ch) = ch
        && let Ok(mut v) = ch.cqs.lock()
    {
        v.push((id, b as usize));
    }
    b.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_destroy_cq(cq: *mut IbvCq) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_destroy_cq",
        || libc::EIO,
        || unsafe { rocev2_ibv_destroy_cq_inner(cq) },
    )
}

unsafe fn rocev2_ibv_destroy_cq_inner(cq: *mut IbvCq) -> c_int {
    let r = live::take(cq, Kind::Cq, || {
        // SAFETY: a live CQ of ours (checked by `take` under its lock).
        let c = unsafe { &*cq.cast::<CqBlock>() };
        if c.users.load(Ordering::Acquire) != 0 {
            return Err(libc::EBUSY);
        }
        Ok(())
    });
    if let Err(e) = r {
        return e;
    }
    // SAFETY: out of the table: no other destroy reaches it; `ibv_get_cq_event` stops handing out its events once
    // it is detached.
    unsafe {
        detach_cq(cq);
        wait_acked(cq);
        let b = &*cq.cast::<CqBlock>();
        async_events::unregister_cq(b.rust.id(), cq as usize);
        async_events::wait_count(
            ptr::addr_of_mut!((*cq).mutex),
            ptr::addr_of_mut!((*cq).cond),
            ptr::addr_of!((*cq).async_events_completed),
            b.async_handed.load(Ordering::Acquire),
        );
        free::<CqBlock, _>(cq);
    }
    0
}

/// Takes the CQ off its channel's list (under the list's lock, which `ibv_get_cq_event` holds while it hands out an
/// event and reads the CQ): no event of it is handed out afterwards.
///
/// # Safety
/// `cq` is a CQ block of ours, not yet freed; its channel outlives it (`ibv_destroy_comp_channel` refuses while
/// CQs are attached; `ibv_close_device` releases CQs before channels).
unsafe fn detach_cq(cq: *mut IbvCq) {
    // SAFETY: per the contract; `channel` is written only at creation.
    let ch = unsafe { (*cq.cast::<CqBlock>()).cq.get().read().channel };
    // SAFETY: NULL or the CQ's channel (live per the contract).
    if let Some(ch) = unsafe { block::<ChannelBlock, _>(ch) } {
        ch.cqs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|&(_, p)| p != cq as usize);
    }
}

/// Waits until every completion event handed out for `cq` has been acknowledged with `ibv_ack_cq_events`
/// (ibv_get_cq_event(3): "ibv_destroy_cq() will wait for all completion events to be acknowledged"), on the CQ's
/// own mutex and condition variable, which `ibv_ack_cq_events` signals.
///
/// # Safety
/// `cq` is a CQ block of ours, detached ([`detach_cq`]), not yet freed.
unsafe fn wait_acked(cq: *mut IbvCq) {
    // SAFETY: per the contract; the C part is reached through raw pointers only (the program and
    // `ibv_ack_cq_events` write it).
    unsafe {
        let handed = (*cq.cast::<CqBlock>())
            .events_handed
            .load(Ordering::Acquire);
        let m = ptr::addr_of_mut!((*cq).mutex).cast::<libc::pthread_mutex_t>();
        let cv = ptr::addr_of_mut!((*cq).cond).cast::<libc::pthread_cond_t>();
        libc::pthread_mutex_lock(m);
        // Wrapping comparison: acknowledged - handed < 0 means events are outstanding.
        while (ptr::addr_of!((*cq).comp_events_completed)
            .read_volatile()
            .wrapping_sub(handed) as i32)
            < 0
        {
            libc::pthread_cond_wait(cv, m);
        }
        libc::pthread_mutex_unlock(m);
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_get_cq_event(
    ch: *mut IbvCompChannel,
    cq_out: *mut *mut IbvCq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_get_cq_event",
        || {
            set_errno(libc::EIO);
            -1
        },
        || unsafe { rocev2_ibv_get_cq_event_inner(ch, cq_out, cq_context) },
    )
}

unsafe fn rocev2_ibv_get_cq_event_inner(
    ch: *mut IbvCompChannel,
    cq_out: *mut *mut IbvCq,
    cq_context: *mut *mut c_void,
) -> c_int {
    // SAFETY: channel blocks are `ChannelBlock`s.
    let Some(c) = (unsafe { live_block::<ChannelBlock, _>(ch, Kind::Channel) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: fcntl on our descriptor.
    let nonblock = unsafe { libc::fcntl(c.ch.fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
    loop {
        // The context was closed (`orphan_channel`): no event can come, as the kernel's closed queue answers EIO.
        if c.rust.is_closed() {
            set_errno(libc::EIO);
            return -1;
        }
        let wait = if nonblock {
            Duration::ZERO
        } else {
            Duration::from_secs(3600)
        };
        // A signal handler interrupting the wait ends it with EINTR unless the handler asked for restarts
        // (module `signals`), as rdma-core's blocking read() of the channel fd.
        let id = match c.rust.get_event_interruptible(wait) {
            Ok(Some(id)) => id,
            Ok(None) if nonblock => {
                set_errno(libc::EAGAIN);
                return -1;
            }
            Ok(None) => continue,
            Err(_) if signals::all_handlers_restart() => continue,
            Err(_) => {
                set_errno(libc::EINTR);
                return -1;
            }
        };
        // Found, counted and read under the list's lock: `ibv_destroy_cq` detaches the CQ under the same lock
        // before it waits for the acknowledgements and frees it.
        let found = {
            let v = c.cqs.lock().unwrap_or_else(|p| p.into_inner());
            v.iter().find(|&&(i, _)| i == id).map(|&(_, p)| {
                // SAFETY: an attached CQ is live (detached before it is freed); its C part is read through a
                // raw pointer (the program may write `cq_context`).
                unsafe {
                    let b = &*(p as *const CqBlock);
                    b.events_handed.fetch_add(1, Ordering::AcqRel);
                    (
                        p as *mut IbvCq,
                        ptr::addr_of!((*b.cq.get()).cq_context).read_volatile(),
                    )
                }
            })
        };
        // An event of a CQ destroyed meanwhile is dropped.
        let Some((cq, ctx_ptr)) = found else { continue };
        // SAFETY: the caller's out-parameters.
        unsafe {
            if !cq_out.is_null() {
                *cq_out = cq;
            }
            if !cq_context.is_null() {
                *cq_context = ctx_ptr;
            }
        }
        return 0;
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_ack_cq_events(cq: *mut IbvCq, nevents: u32) {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_ack_cq_events",
        || (),
        || unsafe { rocev2_ibv_ack_cq_events_inner(cq, nevents) },
    )
}

unsafe fn rocev2_ibv_ack_cq_events_inner(cq: *mut IbvCq, nevents: u32) {
    if cq.is_null() {
        return;
    }
    // SAFETY: a CQ of ours; its mutex was zero-initialised (PTHREAD_MUTEX_INITIALIZER) and lives in the block.
    unsafe {
        let m = ptr::addr_of_mut!((*cq).mutex).cast::<libc::pthread_mutex_t>();
        libc::pthread_mutex_lock(m);
        (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents);
        libc::pthread_cond_broadcast(ptr::addr_of_mut!((*cq).cond).cast::<libc::pthread_cond_t>());
        libc::pthread_mutex_unlock(m);
    }
}

/// `ops.req_notify_cq`.
unsafe extern "C" fn req_notify_cq(cq: *mut IbvCq, _solicited_only: c_int) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_req_notify_cq",
        || libc::EIO,
        || unsafe { req_notify_cq_inner(cq, _solicited_only) },
    )
}

unsafe fn req_notify_cq_inner(cq: *mut IbvCq, _solicited_only: c_int) -> c_int {
    // SAFETY: the inline `ibv_req_notify_cq` passes one of our CQs.
    match unsafe { block::<CqBlock, _>(cq) } {
        Some(c) => {
            c.rust.req_notify();
            0
        }
        None => libc::EINVAL,
    }
}

fn wc_to_c(w: &Wc) -> IbvWc {
    let imm = if w.wc_flags.contains(roce_proto::WcFlags::WITH_INV) {
        w.invalidated_rkey.0
    } else {
        w.imm_data.to_be()
    };
    IbvWc {
        wr_id: w.wr_id,
        status: w.status as c_int,
        opcode: w.opcode as c_int,
        vendor_err: 0,
        byte_len: w.byte_len,
        imm_data: imm,
        qp_num: w.qp_num.value(),
        src_qp: w.src_qp.value(),
        wc_flags: w.wc_flags.bits(),
        pkey_index: 0,
        slid: 0,
        // On RoCE, mlx5 reports a UD receive's network header type here (2 IPv4, 1 IPv6), and UCX relies on it.
        sl: w.network_hdr_type,
        dlid_path_bits: 0,
    }
}

/// `ops.poll_cq`: up to `n` completions into `wc`, in batches of 32 through the runtime's CQ ring.
unsafe extern "C" fn poll_cq(cq: *mut IbvCq, n: c_int, wc: *mut IbvWc) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard("ibv_poll_cq", || -1, || unsafe { poll_cq_inner(cq, n, wc) })
}

unsafe fn poll_cq_inner(cq: *mut IbvCq, n: c_int, wc: *mut IbvWc) -> c_int {
    // SAFETY: the inline `ibv_poll_cq` passes one of our CQs.
    let Some(c) = (unsafe { block::<CqBlock, _>(cq) }) else {
        return -libc::EINVAL;
    };
    if n <= 0 {
        return 0;
    }
    if wc.is_null() {
        return -libc::EINVAL;
    }
    let mut buf = [Wc::default(); 32];
    let mut got = 0usize;
    let want = n as usize;
    while got < want {
        let k = c.rust.poll(&mut buf[..(want - got).min(32)]);
        for w in &buf[..k] {
            // SAFETY: the caller's array has room for `n` entries.
            unsafe { wc.add(got).write(wc_to_c(w)) };
            got += 1;
        }
        if k < 32 {
            break;
        }
    }
    got as c_int
}

// ---------------------------------------------------------------------------------------------------------------
// QPs and AHs

fn qp_type_from_c(t: c_int) -> Option<QpType> {
    match t {
        IBV_QPT_RC => Some(QpType::Rc),
        IBV_QPT_UC => Some(QpType::Uc),
        IBV_QPT_UD => Some(QpType::Ud),
        _ => None,
    }
}

fn qp_type_to_c(t: QpType) -> c_int {
    match t {
        QpType::Rc => IBV_QPT_RC,
        QpType::Uc => IBV_QPT_UC,
        QpType::Ud => IBV_QPT_UD,
    }
}

fn cap_from_c(c: &IbvQpCap) -> QpCap {
    QpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

fn cap_to_c(c: &QpCap) -> IbvQpCap {
    IbvQpCap {
        max_send_wr: c.max_send_wr,
        max_recv_wr: c.max_recv_wr,
        max_send_sge: c.max_send_sge,
        max_recv_sge: c.max_recv_sge,
        max_inline_data: c.max_inline_data,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_create_qp(
    pd: *mut IbvPd,
    attr: *mut IbvQpInitAttr,
) -> *mut IbvQp {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_create_qp",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_create_qp_inner(pd, attr) },
    )
}

unsafe fn rocev2_ibv_create_qp_inner(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp {
    // SAFETY: PD blocks are `PdBlock`s; the caller passes its init attributes.
    let (Some(p), Some(a)) = (unsafe { live_block::<PdBlock, _>(pd, Kind::Pd) }, unsafe {
        attr.as_mut()
    }) else {
        return null_errno(libc::EINVAL);
    };
    // SAFETY: the caller passes NULL or an SRQ of ours.
    let srq = match unsafe { srq::srq_of(a.srq) } {
        Ok(s) => s,
        Err(e) => return null_errno(e),
    };
    let Some(ty) = qp_type_from_c(a.qp_type) else {
        return null_errno(libc::EOPNOTSUPP);
    };
    // SAFETY: CQ blocks are `CqBlock`s.
    let (Some(scq), Some(rcq)) = (
        unsafe { live_block::<CqBlock, _>(a.send_cq, Kind::Cq) },
        unsafe { live_block::<CqBlock, _>(a.recv_cq, Kind::Cq) },
    ) else {
        return null_errno(libc::EINVAL);
    };
    let mut cap = cap_from_c(&a.cap);
    cap.max_send_sge = cap.max_send_sge.max(1);
    cap.max_recv_sge = cap.max_recv_sge.max(1);
    let qp = match p
        .rust
        .create_qp_with_srq(ty, &scq.rust, &rcq.rust, cap, a.sq_sig_all != 0, srq)
    {
        Ok(q) => q,
        Err(e) => return null_errno(e.errno()),
    };
    let mut granted = qp.cap();
    granted.max_inline_data = granted.max_inline_data.min(MAX_INLINE as u32);
    a.cap = cap_to_c(&granted);
    let qpn = qp.qpn().value();
    let b = into_raw(QpBlock {
        qp: UnsafeCell::new(IbvQp {
            context: p.pd.context,
            qp_context: a.qp_context,
            pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: qp.qpn().value(),
            qp_num: qp.qpn().value(),
            state: QpState::Reset as c_int,
            qp_type: a.qp_type,
            mutex: [0; 5],
            cond: [0; 6],
            events_completed: 0,
        }),
        ex: UnsafeCell::new(qp_ex::QpExTail::NONE),
        batch: UnsafeCell::new(qp_ex::WrBatch::default()),
        building: std::sync::atomic::AtomicUsize::new(0),
        rust: qp,
        sq_sig_all: a.sq_sig_all != 0,
        pd: pd as usize,
        send_cq: a.send_cq as usize,
        recv_cq: a.recv_cq as usize,
        state: AtomicI32::new(QpState::Reset as c_int),
        async_handed: AtomicU32::new(0),
    });
    live::insert(b, Kind::Qp, p.pd.context as usize);
    async_events::register_qp(qpn, p.pd.context as usize, b as usize);
    p.users.fetch_add(1, Ordering::AcqRel);
    scq.users.fetch_add(1, Ordering::AcqRel);
    rcq.users.fetch_add(1, Ordering::AcqRel);
    b.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_destroy_qp",
        || libc::EIO,
        || unsafe { rocev2_ibv_destroy_qp_inner(qp) },
    )
}

unsafe fn rocev2_ibv_destroy_qp_inner(qp: *mut IbvQp) -> c_int {
    // Attached to a multicast group: EBUSY, the QP stays (rxe `rxe_qp_chk_destroy`; `exports/mcast.rs`).
    // SAFETY: checked to be a live QP of ours first.
    if let Some(q) = unsafe { live_block::<QpBlock, _>(qp, Kind::Qp) }
        && mcast::attached(q)
    {
        return libc::EBUSY;
    }
    if let Err(e) = live::take(qp, Kind::Qp, || Ok(())) {
        return e;
    }
    // SAFETY: a QP of ours, out of the table and not used after this call; the PD and CQs of its own record are
    // live (it is one of their users).
    unsafe {
        let q = &*qp.cast::<QpBlock>();
        // No event names it from now on; those handed out must be acknowledged first
        // (ibv_get_async_event(3)).
        async_events::unregister_qp((*q.qp.get()).qp_num, qp as usize);
        async_events::wait_count(
            ptr::addr_of_mut!((*qp).mutex),
            ptr::addr_of_mut!((*qp).cond),
            ptr::addr_of!((*qp).events_completed),
            q.async_handed.load(Ordering::Acquire),
        );
        count_user::<PdBlock, _>(q.pd as *mut IbvPd, false);
        count_user::<CqBlock, _>(q.send_cq as *mut IbvCq, false);
        count_user::<CqBlock, _>(q.recv_cq as *mut IbvCq, false);
        free::<QpBlock, _>(qp);
    }
    0
}

fn state_from_c(s: c_int) -> Option<QpState> {
    Some(match s {
        0 => QpState::Reset,
        1 => QpState::Init,
        2 => QpState::Rtr,
        3 => QpState::Rts,
        4 => QpState::Sqd,
        5 => QpState::Sqe,
        6 => QpState::Err,
        _ => return None,
    })
}

fn mtu_from_c(m: c_int) -> Option<Mtu> {
    Some(match m {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        3 => Mtu::Mtu1024,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => return None,
    })
}

fn ip_of_gid(g: &Gid) -> IpAddr {
    match g.as_ipv4() {
        Some(v4) => IpAddr::V4(Ipv4Addr::from(v4)),
        None => IpAddr::V6(Ipv6Addr::from(g.0)),
    }
}

/// An address vector from `ibv_ah_attr`: RoCE needs the GRH (`is_global`), whose GID names the peer's address.
fn ah_from_c(a: &IbvAhAttr) -> Option<AhAttr> {
    if a.is_global == 0 {
        return None;
    }
    let dgid = Gid(a.grh.dgid);
    Some(AhAttr {
        dgid,
        sgid_index: a.grh.sgid_index,
        traffic_class: a.grh.traffic_class,
        hop_limit: if a.grh.hop_limit == 0 {
            64
        } else {
            a.grh.hop_limit
        },
        flow_label: a.grh.flow_label,
        dmac: mac_of(ip_of_gid(&dgid)),
    })
}

fn ah_to_c(a: &AhAttr) -> IbvAhAttr {
    IbvAhAttr {
        grh: IbvGlobalRoute {
            dgid: a.dgid.0,
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        is_global: 1,
        port_num: 1,
        ..IbvAhAttr::default()
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_modify_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    mask: c_int,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_modify_qp",
        || libc::EIO,
        || unsafe { rocev2_ibv_modify_qp_inner(qp, attr, mask) },
    )
}

unsafe fn rocev2_ibv_modify_qp_inner(qp: *mut IbvQp, attr: *mut IbvQpAttr, mask: c_int) -> c_int {
    // SAFETY: the caller passes a QP of ours and its attributes.
    let (Some(q), Some(a)) = (unsafe { block::<QpBlock, _>(qp) }, unsafe { attr.as_ref() }) else {
        return libc::EINVAL;
    };
    let m = QpAttrMask(mask as u32);
    let mut r = QpAttr::default();
    if m.contains(QpAttrMask::STATE) {
        let Some(s) = state_from_c(a.qp_state) else {
            return libc::EINVAL;
        };
        r.qp_state = s;
    }
    if m.contains(QpAttrMask::CUR_STATE) {
        let Some(s) = state_from_c(a.cur_qp_state) else {
            return libc::EINVAL;
        };
        r.cur_qp_state = s;
    }
    if m.contains(QpAttrMask::PATH_MTU) {
        let Some(mtu) = mtu_from_c(a.path_mtu) else {
            return libc::EINVAL;
        };
        r.path_mtu = mtu;
    }
    // The kernel checks the port (uverbs modify_qp: rdma_is_port_valid); this device has port 1 only.
    if m.contains(QpAttrMask::PORT) && a.port_num != 1 {
        return libc::EINVAL;
    }
    if m.contains(QpAttrMask::AV) {
        let Some(ah) = ah_from_c(&a.ah_attr) else {
            return libc::EINVAL;
        };
        r.ah_attr = ah;
    }
    r.qp_access_flags = AccessFlags(a.qp_access_flags as u32 & IBV_ACCESS_SUPPORTED);
    r.pkey_index = a.pkey_index;
    r.port_num = a.port_num;
    r.qkey = a.qkey;
    r.timeout = a.timeout;
    r.retry_cnt = a.retry_cnt;
    r.rnr_retry = a.rnr_retry;
    r.rq_psn = roce_proto::Psn::new(a.rq_psn & 0xff_ffff);
    r.sq_psn = roce_proto::Psn::new(a.sq_psn & 0xff_ffff);
    r.max_rd_atomic = a.max_rd_atomic;
    r.max_dest_rd_atomic = a.max_dest_rd_atomic;
    r.min_rnr_timer = a.min_rnr_timer;
    r.dest_qp_num = roce_proto::Qpn::new(a.dest_qp_num & 0xff_ffff);
    r.en_sqd_async_notify = a.en_sqd_async_notify != 0;
    r.cap = cap_from_c(&a.cap);
    match q.rust.modify(&r, m) {
        Ok(()) => {
            if m.contains(QpAttrMask::STATE) {
                q.state.store(a.qp_state, Ordering::Release);
                // SAFETY: our QP's C part (UnsafeCell); `state` is informational for the program.
                unsafe { (*q.qp.get()).state = a.qp_state };
            }
            0
        }
        Err(e) => e.errno(),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_query_qp(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    _mask: c_int,
    init: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_query_qp",
        || libc::EIO,
        || unsafe { rocev2_ibv_query_qp_inner(qp, attr, _mask, init) },
    )
}

unsafe fn rocev2_ibv_query_qp_inner(
    qp: *mut IbvQp,
    attr: *mut IbvQpAttr,
    _mask: c_int,
    init: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: the caller passes a QP of ours.
    let Some(q) = (unsafe { block::<QpBlock, _>(qp) }) else {
        return libc::EINVAL;
    };
    let r = match q.rust.query() {
        Ok(r) => r,
        Err(e) => return e.errno(),
    };
    let cap = cap_to_c(&q.rust.cap());
    let out = IbvQpAttr {
        qp_state: r.qp_state as c_int,
        cur_qp_state: r.qp_state as c_int,
        path_mtu: r.path_mtu as c_int,
        path_mig_state: 0,
        qkey: r.qkey,
        rq_psn: r.rq_psn.value(),
        sq_psn: r.sq_psn.value(),
        dest_qp_num: r.dest_qp_num.value(),
        qp_access_flags: r.qp_access_flags.bits() as c_int,
        cap,
        ah_attr: ah_to_c(&r.ah_attr),
        alt_ah_attr: IbvAhAttr::default(),
        pkey_index: r.pkey_index,
        alt_pkey_index: 0,
        en_sqd_async_notify: u8::from(r.en_sqd_async_notify),
        sq_draining: 0,
        max_rd_atomic: r.max_rd_atomic,
        max_dest_rd_atomic: r.max_dest_rd_atomic,
        min_rnr_timer: r.min_rnr_timer,
        port_num: 1,
        timeout: r.timeout,
        retry_cnt: r.retry_cnt,
        rnr_retry: r.rnr_retry,
        alt_port_num: 0,
        alt_timeout: 0,
        rate_limit: 0,
    };
    // SAFETY: the caller's out-parameters (either may be NULL).
    unsafe {
        if !attr.is_null() {
            attr.write(out);
        }
        if !init.is_null() {
            init.write(IbvQpInitAttr {
                qp_context: ptr::addr_of!((*q.qp.get()).qp_context).read_volatile(),
                send_cq: q.send_cq as *mut IbvCq,
                recv_cq: q.recv_cq as *mut IbvCq,
                srq: null_mut(),
                cap,
                qp_type: qp_type_to_c(q.rust.qp_type()),
                sq_sig_all: c_int::from(q.sq_sig_all),
            });
        }
    }
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_create_ah(pd: *mut IbvPd, attr: *mut IbvAhAttr) -> *mut IbvAh {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_create_ah",
        || null_errno(libc::EIO),
        || unsafe { rocev2_ibv_create_ah_inner(pd, attr) },
    )
}

unsafe fn rocev2_ibv_create_ah_inner(pd: *mut IbvPd, attr: *mut IbvAhAttr) -> *mut IbvAh {
    // SAFETY: PD blocks are `PdBlock`s; the caller passes the attributes.
    let (Some(p), Some(a)) = (unsafe { live_block::<PdBlock, _>(pd, Kind::Pd) }, unsafe {
        attr.as_ref()
    }) else {
        return null_errno(libc::EINVAL);
    };
    // The kernel checks the port (uverbs create_ah: rdma_is_port_valid); this device has port 1 only.
    if a.port_num != 1 {
        return null_errno(libc::EINVAL);
    }
    let Some(ah) = ah_from_c(a) else {
        return null_errno(libc::EINVAL);
    };
    match p.rust.create_ah(&ah) {
        Ok(h) => {
            p.users.fetch_add(1, Ordering::AcqRel);
            let b = into_raw(AhBlock {
                ah: IbvAh {
                    context: p.pd.context,
                    pd,
                    handle: h.handle().0,
                },
                rust: h,
                pd: pd as usize,
            });
            live::insert(b, Kind::Ah, p.pd.context as usize);
            b.cast()
        }
        Err(e) => null_errno(e.errno()),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_destroy_ah(ah: *mut IbvAh) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_destroy_ah",
        || libc::EIO,
        || unsafe { rocev2_ibv_destroy_ah_inner(ah) },
    )
}

unsafe fn rocev2_ibv_destroy_ah_inner(ah: *mut IbvAh) -> c_int {
    if let Err(e) = live::take(ah, Kind::Ah, || Ok(())) {
        return e;
    }
    // SAFETY: an AH of ours, out of the table and not used after this call; the PD of its own record is live (it
    // is one of its users).
    unsafe {
        count_user::<PdBlock, _>((*ah.cast::<AhBlock>()).pd as *mut IbvPd, false);
        free::<AhBlock, _>(ah);
    }
    0
}

// ---------------------------------------------------------------------------------------------------------------
// Data path (ops slots)

pub(crate) fn post_errno(e: &PostError) -> c_int {
    match e {
        PostError::QueueFull { .. } => libc::ENOMEM,
        _ => libc::EINVAL,
    }
}

/// WRs converted per runtime call (each chunk is one doorbell).
pub(crate) const BATCH: usize = 16;
/// SGEs of one chunk of [`BATCH`] WRs, in one pool on the stack: a chunk ends early when the next WR's SGEs do not
/// fit (any one WR fits: at most [`MAX_SGE`]). Not `MAX_SGE` per WR: zeroing 16 x 32 SGEs and inline slices on every
/// post cost ~0.7 µs per call (measured), 64 cost what 16 x 4 did.
const SGE_POOL: usize = 64;
const _: () = assert!(SGE_POOL >= MAX_SGE);

/// One converted send WR (what [`SendWr`] needs besides its slices).
#[derive(Clone, Copy)]
struct SendMeta {
    wr_id: u64,
    op: SendOp,
    flags: SendFlags,
    ud: Option<UdDest>,
    nsge: usize,
    inline: bool,
}

/// Converts `w` into `sges` / `inl` (its first `num_sge` entries; EINVAL if they are shorter) and its meta; `None`
/// for an opcode or argument we cannot carry (EINVAL).
///
/// # Safety
/// `w` is a valid `ibv_send_wr` whose `sg_list` has `num_sge` entries; inline SGEs name readable memory, and when
/// `ud` (the QP is UD) `wr.ud.ah` is an AH of ours. (On RC/UC the union holds `wr.rdma`/`wr.atomic`: it is never
/// read as an AH pointer.)
unsafe fn convert_send(
    w: &IbvSendWr,
    ud: bool,
    sges: &mut [Sge],
    inl: &mut [&[u8]],
) -> Result<SendMeta, c_int> {
    let nsge = usize::try_from(w.num_sge).map_err(|_| libc::EINVAL)?;
    if nsge > MAX_SGE || nsge > sges.len() || nsge > inl.len() || (nsge > 0 && w.sg_list.is_null())
    {
        return Err(libc::EINVAL);
    }
    let inline = w.send_flags & IBV_SEND_INLINE != 0;
    for i in 0..nsge {
        // SAFETY: `sg_list` has `num_sge` entries.
        let s = unsafe { *w.sg_list.add(i) };
        if inline {
            inl[i] = if s.length == 0 {
                // No bytes: the address is not looked at (it may be 0, which no slice may start at).
                &[]
            } else if s.addr == 0 {
                return Err(libc::EINVAL);
            } else {
                // SAFETY: inline SGEs name memory the program lets us read during the call (the bytes are copied
                // into the WQE before post returns); non-NULL, checked above.
                unsafe {
                    std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                }
            };
        } else {
            sges[i] = Sge {
                addr: s.addr,
                length: s.length,
                lkey: roce_proto::Lkey(s.lkey),
            };
        }
    }
    let u = &w.wr;
    let rkey = Rkey(u.rdma_rkey());
    let imm = u32::from_be(w.imm_data);
    let op = match w.opcode {
        IBV_WR_SEND => SendOp::Send,
        IBV_WR_SEND_WITH_IMM => SendOp::SendWithImm { imm },
        IBV_WR_SEND_WITH_INV => SendOp::SendWithInv {
            invalidate_rkey: Rkey(w.imm_data),
        },
        IBV_WR_RDMA_WRITE => SendOp::RdmaWrite {
            remote_addr: u.remote_addr(),
            rkey,
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => SendOp::RdmaWriteWithImm {
            remote_addr: u.remote_addr(),
            rkey,
            imm,
        },
        IBV_WR_RDMA_READ => SendOp::RdmaRead {
            remote_addr: u.remote_addr(),
            rkey,
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => SendOp::AtomicCmpAndSwp {
            remote_addr: u.remote_addr(),
            rkey: Rkey(u.atomic_rkey()),
            compare: u.compare_add(),
            swap: u.swap(),
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => SendOp::AtomicFetchAndAdd {
            remote_addr: u.remote_addr(),
            rkey: Rkey(u.atomic_rkey()),
            add: u.compare_add(),
        },
        // SAFETY: the caller's WR (its SGE names the 8 bytes, read now as inline data is).
        IBV_WR_ATOMIC_WRITE => unsafe { mw::atomic_write_op(w) }?,
        // SAFETY: the caller's WR (its `bind_mw` names a window and an MR of ours).
        IBV_WR_BIND_MW => unsafe { mw::bind_op(w) }?,
        IBV_WR_LOCAL_INV => SendOp::LocalInv {
            rkey: Rkey(w.imm_data),
        },
        _ => return Err(libc::EINVAL),
    };
    // Operations without a gather list: their operands are in the WR itself (the 8 bytes of an ATOMIC WRITE were
    // read above), so no SGE is handed on and IBV_SEND_INLINE means nothing.
    let (nsge, inline, send_flags) = if matches!(
        op,
        SendOp::AtomicWrite { .. } | SendOp::BindMw { .. } | SendOp::LocalInv { .. }
    ) {
        (0, false, w.send_flags & !IBV_SEND_INLINE)
    } else {
        (nsge, inline, w.send_flags)
    };
    let ud = if ud {
        // SAFETY: a UD WR names an AH of ours (or NULL, refused).
        let ah = unsafe { block::<AhBlock, _>(u.ud_ah()) }.ok_or(libc::EINVAL)?;
        Some(UdDest {
            ah: ah.rust.handle(),
            remote_qpn: roce_proto::Qpn::new(u.ud_remote_qpn() & 0xff_ffff),
            remote_qkey: u.ud_remote_qkey(),
        })
    } else {
        None
    };
    Ok(SendMeta {
        wr_id: w.wr_id,
        op,
        flags: SendFlags(send_flags & 0xf),
        ud,
        nsge,
        inline,
    })
}

/// `ops.post_send`: the chain in chunks of [`BATCH`] WRs, one runtime post (one doorbell) per chunk. On error
/// `*bad_wr` is the first WR not posted (the ones before it are).
unsafe extern "C" fn post_send(
    qp: *mut IbvQp,
    wr: *mut IbvSendWr,
    bad: *mut *mut IbvSendWr,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_post_send",
        || libc::EIO,
        || unsafe { post_send_inner(qp, wr, bad) },
    )
}

unsafe fn post_send_inner(qp: *mut IbvQp, wr: *mut IbvSendWr, bad: *mut *mut IbvSendWr) -> c_int {
    // SAFETY: the inline `ibv_post_send` passes one of our QPs.
    let Some(q) = (unsafe { block::<QpBlock, _>(qp) }) else {
        return libc::EINVAL;
    };
    let ud = q.rust.qp_type() == QpType::Ud;
    let mut cur = wr;
    let fail = |at: *mut IbvSendWr, e: c_int| {
        if !bad.is_null() {
            // SAFETY: the caller's out-parameter.
            unsafe { *bad = at };
        }
        e
    };
    if !wr.is_null() && q.state.load(Ordering::Acquire) < IBV_QPS_RTS {
        return fail(wr, libc::EINVAL);
    }
    while !cur.is_null() {
        let mut sges = [Sge::default(); SGE_POOL];
        let mut inl: [&[u8]; SGE_POOL] = [&[]; SGE_POOL];
        let mut offs = [0usize; BATCH];
        let mut used = 0;
        let mut metas = [None::<SendMeta>; BATCH];
        let mut ptrs = [null_mut::<IbvSendWr>(); BATCH];
        let mut n = 0;
        let mut err = None;
        while n < BATCH && !cur.is_null() {
            // SAFETY: a WR of the caller's chain.
            let w = unsafe { &*cur };
            let want = usize::try_from(w.num_sge).unwrap_or(usize::MAX);
            if n > 0 && want <= MAX_SGE && used + want > SGE_POOL {
                break; // the next chunk takes it
            }
            // SAFETY: as `convert_send` requires (the caller's WR).
            match unsafe { convert_send(w, ud, &mut sges[used..], &mut inl[used..]) } {
                Ok(m) => {
                    offs[n] = used;
                    used += m.nsge;
                    metas[n] = Some(m);
                }
                Err(e) => {
                    err = Some((cur, e));
                    break;
                }
            }
            ptrs[n] = cur;
            n += 1;
            cur = w.next;
        }
        if n > 0 {
            let wrs: [SendWr<'_>; BATCH] = core::array::from_fn(|i| {
                let m = metas[i].unwrap_or(SendMeta {
                    wr_id: 0,
                    op: SendOp::Send,
                    flags: SendFlags::EMPTY,
                    ud: None,
                    nsge: 0,
                    inline: false,
                });
                let range = offs[i]..offs[i] + m.nsge;
                let mut wr = if m.inline {
                    SendWr::new(m.wr_id, m.op, &[])
                } else {
                    SendWr::new(m.wr_id, m.op, &sges[range.clone()])
                };
                if m.inline {
                    wr.inline_data = &inl[range];
                }
                wr.send_flags = m.flags;
                wr.ud = m.ud;
                wr
            });
            if let Err(e) = q.rust.post_send(&wrs[..n]) {
                return fail(ptrs[0], post_errno(&e));
            }
        }
        if let Some((at, e)) = err {
            return fail(at, e);
        }
    }
    0
}

/// `ops.post_recv`, chunked like [`post_send`].
unsafe extern "C" fn post_recv(
    qp: *mut IbvQp,
    wr: *mut IbvRecvWr,
    bad: *mut *mut IbvRecvWr,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_post_recv",
        || libc::EIO,
        || unsafe { post_recv_inner(qp, wr, bad) },
    )
}

unsafe fn post_recv_inner(qp: *mut IbvQp, wr: *mut IbvRecvWr, bad: *mut *mut IbvRecvWr) -> c_int {
    // SAFETY: the inline `ibv_post_recv` passes one of our QPs.
    let Some(q) = (unsafe { block::<QpBlock, _>(qp) }) else {
        return libc::EINVAL;
    };
    let mut cur = wr;
    let fail = |at: *mut IbvRecvWr, e: c_int| {
        if !bad.is_null() {
            // SAFETY: the caller's out-parameter.
            unsafe { *bad = at };
        }
        e
    };
    if !wr.is_null() && q.state.load(Ordering::Acquire) < IBV_QPS_INIT {
        return fail(wr, libc::EINVAL);
    }
    while !cur.is_null() {
        let mut sges = [Sge::default(); SGE_POOL];
        let mut used = 0;
        let mut meta = [(0u64, 0usize, 0usize); BATCH];
        let mut ptrs = [null_mut::<IbvRecvWr>(); BATCH];
        let mut n = 0;
        let mut err = None;
        while n < BATCH && !cur.is_null() {
            // SAFETY: a WR of the caller's chain.
            let w = unsafe { &*cur };
            let Ok(nsge) = usize::try_from(w.num_sge) else {
                err = Some((cur, libc::EINVAL));
                break;
            };
            if nsge > MAX_SGE || (nsge > 0 && w.sg_list.is_null()) {
                err = Some((cur, libc::EINVAL));
                break;
            }
            if used + nsge > SGE_POOL {
                break; // the next chunk takes it (n > 0: one WR always fits)
            }
            for (i, s) in sges[used..used + nsge].iter_mut().enumerate() {
                // SAFETY: `sg_list` has `num_sge` entries.
                let c = unsafe { *w.sg_list.add(i) };
                *s = Sge {
                    addr: c.addr,
                    length: c.length,
                    lkey: roce_proto::Lkey(c.lkey),
                };
            }
            meta[n] = (w.wr_id, used, nsge);
            used += nsge;
            ptrs[n] = cur;
            n += 1;
            cur = w.next;
        }
        if n > 0 {
            let wrs: [RecvWr<'_>; BATCH] = core::array::from_fn(|i| RecvWr {
                wr_id: meta[i].0,
                sg_list: &sges[meta[i].1..meta[i].1 + meta[i].2],
            });
            if let Err(e) = q.rust.post_recv(&wrs[..n]) {
                return fail(ptrs[0], post_errno(&e));
            }
        }
        if let Some((at, e)) = err {
            return fail(at, e);
        }
    }
    0
}

// ---------------------------------------------------------------------------------------------------------------
// Strings

/// `ibv_wc_status_str`: the status's enumerator name (`IBV_WC_SUCCESS` …), `IBV_WC_UNKNOWN` out of range.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_wc_status_str(status: c_int) -> *const c_char {
    const NAMES: [&std::ffi::CStr; 22] = [
        c"IBV_WC_SUCCESS",
        c"IBV_WC_LOC_LEN_ERR",
        c"IBV_WC_LOC_QP_OP_ERR",
        c"IBV_WC_LOC_EEC_OP_ERR",
        c"IBV_WC_LOC_PROT_ERR",
        c"IBV_WC_WR_FLUSH_ERR",
        c"IBV_WC_MW_BIND_ERR",
        c"IBV_WC_BAD_RESP_ERR",
        c"IBV_WC_LOC_ACCESS_ERR",
        c"IBV_WC_REM_INV_REQ_ERR",
        c"IBV_WC_REM_ACCESS_ERR",
        c"IBV_WC_REM_OP_ERR",
        c"IBV_WC_RETRY_EXC_ERR",
        c"IBV_WC_RNR_RETRY_EXC_ERR",
        c"IBV_WC_LOC_RDD_VIOL_ERR",
        c"IBV_WC_REM_INV_RD_REQ_ERR",
        c"IBV_WC_REM_ABORT_ERR",
        c"IBV_WC_INV_EECN_ERR",
        c"IBV_WC_INV_EEC_STATE_ERR",
        c"IBV_WC_FATAL_ERR",
        c"IBV_WC_RESP_TIMEOUT_ERR",
        c"IBV_WC_GENERAL_ERR",
    ];
    usize::try_from(status)
        .ok()
        .and_then(|i| NAMES.get(i))
        .map_or(c"IBV_WC_UNKNOWN".as_ptr(), |s| s.as_ptr())
}
