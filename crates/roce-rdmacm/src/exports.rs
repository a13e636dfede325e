//! The 68 entry points of `librdmacm.so.1` (`docs/spec/LIBRDMACM-ABI.md` §2) with the signatures of
//! `<rdma/rdma_cma.h>` / `<rdma/rsocket.h>`. Errors follow librdmacm: `-1` with `errno` (NULL with `errno` for the
//! calls that return pointers). No panic crosses the C boundary ([`guard`]: `-1`/`EIO`).
//!
//! Not implemented (`-1`/`ENOSYS`, NULL/`ENOSYS`; `docs/RDMACM.md` §2): multicast in the IPoIB port space
//! (multicast of `RDMA_PS_UDP` ids is module `mcast`), `rdma_reject_ece`, `rdma_notify`,
//! SRQs on an id, `rdma_connect` / `rdma_accept` in the IPoIB port space (its Q_Key is a multicast group's);
//! `rdma_get_remote_ece` / `rdma_set_local_ece` are `-1`/`EOPNOTSUPP` (no ECE). The rsocket calls are in module
//! `rsocket`.

use core::ffi::c_void;
use libc::{c_char, c_int, size_t, sockaddr};

use crate::abi::*;
use crate::cma::{self, R, lock};

fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// `0`, or `-1` with `errno`.
fn ret(r: R<()>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn guard<T>(on_panic: T, body: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(_) => {
            set_errno(libc::EIO);
            on_panic
        }
    }
}

fn nosys<T>(v: T) -> T {
    set_errno(libc::ENOSYS);
    v
}

/// Waits on the id's own channel (a synchronous id) for the event that completes an operation: `want`, or an error
/// event (its status, or `ECONNREFUSED` for a reject).
fn wait_sync(id: *mut RdmaCmId, want: c_int) -> R<()> {
    let ch = {
        let st = lock();
        match st.ids.get(&(id as usize)) {
            Some(i) if i.sync => i.chan as *mut RdmaEventChannel,
            Some(_) => return Ok(()),
            None => return Err(libc::EINVAL),
        }
    };
    loop {
        let ev = cma::get_event(ch)?;
        // SAFETY: an event handed out by get_event.
        let (eid, kind, status) = unsafe { ((*ev).id, (*ev).event, (*ev).status) };
        if eid != id {
            cma::ack_event(ev)?;
            continue;
        }
        cma::hold_event(id, ev);
        if kind == want {
            return Ok(());
        }
        // librdmacm `ucma_complete`: ECONNREFUSED for a REJ, else the status (negated errno, or a positive one as
        // the SIDR status of a UD id's UNREACHABLE).
        return Err(match kind {
            EV_REJECTED => libc::ECONNREFUSED,
            _ if status < 0 => -status,
            _ if status > 0 => status,
            _ => libc::ECONNABORTED,
        });
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rdma_create_event_channel() -> *mut RdmaEventChannel {
    guard(core::ptr::null_mut(), || {
        match cma::create_channel(&mut lock()) {
            Ok(p) => p,
            Err(e) => {
                set_errno(e);
                core::ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `ch` is NULL or a channel this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_destroy_event_channel(ch: *mut RdmaEventChannel) {
    guard((), || cma::destroy_channel(&mut lock(), ch, false))
}

/// # Safety
/// `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_create_id(
    ch: *mut RdmaEventChannel,
    out: *mut *mut RdmaCmId,
    context: *mut c_void,
    ps: c_int,
) -> c_int {
    guard(-1, || {
        ret((|| {
            if out.is_null() || ![RDMA_PS_TCP, RDMA_PS_UDP, RDMA_PS_IB, RDMA_PS_IPOIB].contains(&ps)
            {
                return Err(libc::EINVAL);
            }
            let mut st = lock();
            let (chan, sync) = if ch.is_null() {
                (cma::create_channel(&mut st)? as usize, true)
            } else if st.chans.contains_key(&(ch as usize)) {
                (ch as usize, false)
            } else {
                return Err(libc::EINVAL);
            };
            let id = cma::new_id(&mut st, chan, sync, context, ps);
            // SAFETY: checked non-NULL.
            unsafe { out.write(id as *mut RdmaCmId) };
            Ok(())
        })())
    })
}

/// # Safety
/// `id` is NULL or an id this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_destroy_id(id: *mut RdmaCmId) -> c_int {
    guard(-1, || ret(cma::destroy_id(id)))
}

/// # Safety
/// `addr` is NULL or a sockaddr of its family's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_bind_addr(id: *mut RdmaCmId, addr: *mut sockaddr) -> c_int {
    guard(-1, || {
        ret((|| {
            // SAFETY: per the contract.
            let a = unsafe { cma::parse_sockaddr(addr) }?;
            let mut st = lock();
            cma::check_id(&st, id)?;
            cma::bind(&mut st, id as usize, a)
        })())
    })
}

/// # Safety
/// The addresses are NULL or sockaddrs of their family's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_resolve_addr(
    id: *mut RdmaCmId,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        ret((|| {
            // SAFETY: per the contract.
            let d = unsafe { cma::parse_sockaddr(dst) }?;
            let s = if src.is_null() {
                None
            } else {
                // SAFETY: per the contract.
                Some(unsafe { cma::parse_sockaddr(src) }?)
            };
            {
                let mut st = lock();
                cma::check_id(&st, id)?;
                cma::resolve_addr(&mut st, id as usize, s, d)?;
            }
            wait_sync(id, EV_ADDR_RESOLVED)
        })())
    })
}

/// # Safety
/// `id` is NULL or an id this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_resolve_route(id: *mut RdmaCmId, _timeout_ms: c_int) -> c_int {
    guard(-1, || {
        ret((|| {
            {
                let mut st = lock();
                cma::check_id(&st, id)?;
                cma::resolve_route(&mut st, id as usize)?;
            }
            wait_sync(id, EV_ROUTE_RESOLVED)
        })())
    })
}

/// # Safety
/// `id` is NULL or an id this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_listen(id: *mut RdmaCmId, _backlog: c_int) -> c_int {
    guard(-1, || {
        ret((|| {
            let mut st = lock();
            cma::check_id(&st, id)?;
            cma::listen(&mut st, id as usize)
        })())
    })
}

/// # Safety
/// `param` is NULL or a valid `rdma_conn_param` whose private data is readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_connect(
    id: *mut RdmaCmId,
    param: *mut RdmaConnParam,
) -> c_int {
    guard(-1, || {
        ret((|| {
            {
                let mut st = lock();
                cma::check_id(&st, id)?;
                // SAFETY: per the contract.
                cma::connect(&mut st, id as usize, unsafe { param.as_ref() })?;
            }
            wait_sync(id, EV_ESTABLISHED)
        })())
    })
}

/// # Safety
/// `param` is NULL or a valid `rdma_conn_param` whose private data is readable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_accept(id: *mut RdmaCmId, param: *mut RdmaConnParam) -> c_int {
    guard(-1, || {
        ret((|| {
            {
                let mut st = lock();
                cma::check_id(&st, id)?;
                // SAFETY: per the contract.
                cma::accept(&mut st, id as usize, unsafe { param.as_ref() })?;
                // A UD accept (SIDR_REP) is complete when sent: no ESTABLISHED follows on this side.
                if st.ids[&(id as usize)].ud() {
                    return Ok(());
                }
            }
            wait_sync(id, EV_ESTABLISHED)
        })())
    })
}

/// # Safety
/// `pdata` is NULL or `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_reject(
    id: *mut RdmaCmId,
    pdata: *const c_void,
    len: u8,
) -> c_int {
    guard(-1, || {
        ret((|| {
            let mut st = lock();
            cma::check_id(&st, id)?;
            cma::reject(&mut st, id as usize, pdata.cast(), len)
        })())
    })
}

/// # Safety
/// `id` is NULL or an id this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_establish(id: *mut RdmaCmId) -> c_int {
    guard(-1, || {
        ret((|| {
            let mut st = lock();
            cma::check_id(&st, id)?;
            cma::establish(&mut st, id as usize)
        })())
    })
}

/// # Safety
/// `id` is NULL or an id this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_disconnect(id: *mut RdmaCmId) -> c_int {
    guard(-1, || {
        ret((|| {
            let mut st = lock();
            cma::check_id(&st, id)?;
            cma::disconnect(&mut st, id as usize)
        })())
    })
}

/// # Safety
/// `attr` and `mask` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_init_qp_attr(
    id: *mut RdmaCmId,
    attr: *mut IbvQpAttr,
    mask: *mut c_int,
) -> c_int {
    guard(-1, || {
        ret((|| {
            if attr.is_null() || mask.is_null() {
                return Err(libc::EINVAL);
            }
            let st = lock();
            cma::check_id(&st, id)?;
            // SAFETY: checked non-NULL; the program's attribute block.
            let want = unsafe { (*attr).qp_state };
            let (a, m) = cma::qp_attr(&st, id as usize, want)?;
            // SAFETY: checked non-NULL.
            unsafe {
                attr.write(a);
                mask.write(m);
            }
            Ok(())
        })())
    })
}

/// # Safety
/// `optval` is NULL or `optlen` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_set_option(
    id: *mut RdmaCmId,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: size_t,
) -> c_int {
    guard(-1, || {
        ret((|| {
            let mut st = lock();
            cma::check_id(&st, id)?;
            if optval.is_null() {
                return Err(libc::EINVAL);
            }
            let i = st.ids.get_mut(&(id as usize)).expect("checked");
            // SAFETY: `optval` is `optlen` readable bytes (checked per option below).
            let byte = || unsafe { *optval.cast::<u8>() };
            // SAFETY: as above, for an int.
            let int = || unsafe { optval.cast::<c_int>().read_unaligned() };
            match (level, optname) {
                (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS) if optlen == 1 => i.tos = byte(),
                (RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR) if optlen == 4 => {
                    i.reuseaddr = int() != 0
                }
                // One device per address family here: the AF_INET6 socket never also takes IPv4, nothing to store.
                (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY) if optlen == 4 => {}
                (RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT) if optlen == 1 => {
                    i.ack_timeout = Some(byte().min(31))
                }
                (RDMA_OPTION_ID, RDMA_OPTION_ID_TOS | RDMA_OPTION_ID_REUSEADDR)
                | (RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY | RDMA_OPTION_ID_ACK_TIMEOUT) => {
                    return Err(libc::EINVAL);
                }
                _ => return Err(libc::ENOSYS),
            }
            Ok(())
        })())
    })
}

/// # Safety
/// `ch` is NULL or a channel this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_migrate_id(
    id: *mut RdmaCmId,
    ch: *mut RdmaEventChannel,
) -> c_int {
    guard(-1, || {
        ret((|| {
            let mut st = lock();
            cma::check_id(&st, id)?;
            let (new, sync) = if ch.is_null() {
                (cma::create_channel(&mut st)? as usize, true)
            } else if st.chans.contains_key(&(ch as usize)) {
                (ch as usize, false)
            } else {
                return Err(libc::EINVAL);
            };
            let i = st.ids.get_mut(&(id as usize)).expect("checked");
            let (old, old_sync) = (i.chan, i.sync);
            i.chan = new;
            i.sync = sync;
            // SAFETY: a live id block.
            unsafe { (*id).channel = new as *mut RdmaEventChannel };
            if old_sync && old != new {
                cma::destroy_channel(&mut st, old as *mut RdmaEventChannel, true);
            }
            Ok(())
        })())
    })
}

/// # Safety
/// `ch` is NULL or a channel this library made; `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_get_cm_event(
    ch: *mut RdmaEventChannel,
    out: *mut *mut RdmaCmEvent,
) -> c_int {
    guard(-1, || {
        ret((|| {
            if out.is_null() {
                return Err(libc::EINVAL);
            }
            let ev = cma::get_event(ch)?;
            // SAFETY: checked non-NULL.
            unsafe { out.write(ev) };
            Ok(())
        })())
    })
}

/// # Safety
/// `ev` is NULL or an event this library handed out.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_ack_cm_event(ev: *mut RdmaCmEvent) -> c_int {
    guard(-1, || ret(cma::ack_event(ev)))
}

/// The names librdmacm gives (`rdma_event_str(3)`).
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rdma_event_str(event: c_int) -> *const c_char {
    let s: &'static core::ffi::CStr = match event {
        0 => c"RDMA_CM_EVENT_ADDR_RESOLVED",
        1 => c"RDMA_CM_EVENT_ADDR_ERROR",
        2 => c"RDMA_CM_EVENT_ROUTE_RESOLVED",
        3 => c"RDMA_CM_EVENT_ROUTE_ERROR",
        4 => c"RDMA_CM_EVENT_CONNECT_REQUEST",
        5 => c"RDMA_CM_EVENT_CONNECT_RESPONSE",
        6 => c"RDMA_CM_EVENT_CONNECT_ERROR",
        7 => c"RDMA_CM_EVENT_UNREACHABLE",
        8 => c"RDMA_CM_EVENT_REJECTED",
        9 => c"RDMA_CM_EVENT_ESTABLISHED",
        10 => c"RDMA_CM_EVENT_DISCONNECTED",
        11 => c"RDMA_CM_EVENT_DEVICE_REMOVAL",
        12 => c"RDMA_CM_EVENT_MULTICAST_JOIN",
        13 => c"RDMA_CM_EVENT_MULTICAST_ERROR",
        14 => c"RDMA_CM_EVENT_ADDR_CHANGE",
        15 => c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => c"UNKNOWN EVENT",
    };
    s.as_ptr()
}

/// # Safety
/// `attr` is NULL or a valid `ibv_qp_init_attr`; `pd` NULL or a PD of the id's device.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_create_qp(
    id: *mut RdmaCmId,
    pd: *mut c_void,
    attr: *mut IbvQpInitAttr,
) -> c_int {
    guard(-1, || {
        ret((|| {
            let mut st = lock();
            cma::check_id(&st, id)?;
            // SAFETY: per the contract.
            let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
            cma::create_qp(&mut st, id as usize, pd, a)
        })())
    })
}

/// # Safety
/// `attr` is NULL or a valid `ibv_qp_init_attr_ex`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_create_qp_ex(
    id: *mut RdmaCmId,
    attr: *mut IbvQpInitAttrEx,
) -> c_int {
    guard(-1, || {
        ret((|| {
            let mut st = lock();
            cma::check_id(&st, id)?;
            // SAFETY: per the contract.
            let a = unsafe { attr.as_mut() }.ok_or(libc::EINVAL)?;
            let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
                a.pd
            } else {
                core::ptr::null_mut()
            };
            let mut base = IbvQpInitAttr {
                qp_context: a.qp_context,
                send_cq: a.send_cq,
                recv_cq: a.recv_cq,
                srq: a.srq,
                cap: a.cap,
                qp_type: a.qp_type,
                sq_sig_all: a.sq_sig_all,
            };
            cma::create_qp(&mut st, id as usize, pd.cast(), &mut base)?;
            (a.send_cq, a.recv_cq, a.cap) = (base.send_cq, base.recv_cq, base.cap);
            Ok(())
        })())
    })
}

/// # Safety
/// `id` is NULL or an id this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_destroy_qp(id: *mut RdmaCmId) {
    guard((), || {
        let mut st = lock();
        if cma::check_id(&st, id).is_ok() {
            cma::destroy_qp(&mut st, id as usize);
        }
    })
}

/// # Safety
/// `num` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_get_devices(num: *mut c_int) -> *mut *mut c_void {
    guard(core::ptr::null_mut(), || {
        let mut st = lock();
        cma::load_devices(&mut st);
        let n = st.devs.len();
        // SAFETY: calloc of n + 1 pointers (NULL-terminated list, freed by rdma_free_devices).
        let list = unsafe { libc::calloc(n + 1, size_of::<*mut c_void>()) }.cast::<*mut c_void>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return core::ptr::null_mut();
        }
        for (k, d) in st.devs.iter().enumerate() {
            // SAFETY: within the n + 1 slots.
            unsafe { list.add(k).write(d.ctx as *mut c_void) };
        }
        if !num.is_null() {
            // SAFETY: checked non-NULL.
            unsafe { num.write(n as c_int) };
        }
        list
    })
}

/// # Safety
/// `list` is NULL or came from `rdma_get_devices`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_free_devices(list: *mut *mut c_void) {
    // SAFETY: per the contract (calloc'd in rdma_get_devices).
    unsafe { libc::free(list.cast()) }
}

fn port_of(id: *mut RdmaCmId, dst: bool) -> u16 {
    let st = lock();
    if cma::check_id(&st, id).is_err() {
        return 0;
    }
    // SAFETY: a live id block; `sin_port` and `sin6_port` are at the same offset.
    unsafe {
        let a = if dst {
            &(*id).route.addr.dst
        } else {
            &(*id).route.addr.src
        };
        (*(a as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>()).sin_port
    }
}

/// The source port in network byte order (0 for an unknown id).
///
/// # Safety
/// `id` is NULL or an id this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_get_src_port(id: *mut RdmaCmId) -> u16 {
    guard(0, || port_of(id, false))
}

/// The destination port in network byte order (0 for an unknown id).
///
/// # Safety
/// `id` is NULL or an id this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_get_dst_port(id: *mut RdmaCmId) -> u16 {
    guard(0, || port_of(id, true))
}

/// `rdma_create_ep`: a synchronous id bound (passive) or resolved to its destination (active), with a QP when
/// `qp_init_attr` is given (passive: one per `rdma_get_request`).
///
/// # Safety
/// `out` NULL or writable; `res` NULL or a valid `rdma_addrinfo`; `qp_init_attr` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_create_ep(
    out: *mut *mut RdmaCmId,
    res: *mut RdmaAddrinfo,
    pd: *mut c_void,
    qp_init_attr: *mut IbvQpInitAttr,
) -> c_int {
    guard(-1, || {
        ret((|| {
            if out.is_null() || res.is_null() {
                return Err(libc::EINVAL);
            }
            // SAFETY: per the contract.
            let r = unsafe { &*res };
            let ps = if r.ai_port_space == 0 {
                RDMA_PS_TCP
            } else {
                r.ai_port_space
            };
            let mut id: *mut RdmaCmId = core::ptr::null_mut();
            // SAFETY: `id` is writable.
            if unsafe {
                rocev2_rdma_create_id(core::ptr::null_mut(), &mut id, core::ptr::null_mut(), ps)
            } != 0
            {
                return Err(errno());
            }
            // The QP type is the address's (rdma_client leaves `qp_init_attr->qp_type` zero).
            let qp_type = if r.ai_qp_type != 0 {
                r.ai_qp_type
            } else {
                IBV_QPT_RC
            };
            // SAFETY: a live id block; the program's attributes when given.
            unsafe {
                (*id).qp_type = qp_type;
                if let Some(a) = qp_init_attr.as_mut() {
                    a.qp_type = qp_type;
                }
            }
            let made = (|| {
                if r.ai_flags & RAI_PASSIVE != 0 {
                    // SAFETY: the addrinfo's address.
                    let a = unsafe { cma::parse_sockaddr(r.ai_src_addr) }?;
                    let mut st = lock();
                    cma::bind(&mut st, id as usize, a)?;
                    if !qp_init_attr.is_null() {
                        // SAFETY: per the contract.
                        let attr = unsafe { *qp_init_attr };
                        st.ids.get_mut(&(id as usize)).expect("just made").ep_qp =
                            Some(cma::EpQp(attr, pd as usize));
                    }
                    return Ok(());
                }
                // SAFETY: the addrinfo's addresses.
                if unsafe { rocev2_rdma_resolve_addr(id, r.ai_src_addr, r.ai_dst_addr, 2000) } != 0
                    // SAFETY: a live id.
                    || unsafe { rocev2_rdma_resolve_route(id, 2000) } != 0
                {
                    return Err(errno());
                }
                if !qp_init_attr.is_null() {
                    // SAFETY: per the contract.
                    if unsafe { rocev2_rdma_create_qp(id, pd, qp_init_attr) } != 0 {
                        return Err(errno());
                    }
                }
                Ok(())
            })();
            if let Err(e) = made {
                let _ = cma::destroy_id(id);
                return Err(e);
            }
            // SAFETY: checked non-NULL.
            unsafe { out.write(id) };
            Ok(())
        })())
    })
}

/// # Safety
/// `id` is NULL or an id this library made.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_destroy_ep(id: *mut RdmaCmId) {
    guard((), || {
        // SAFETY: per the contract.
        unsafe { rocev2_rdma_destroy_qp(id) };
        let _ = cma::destroy_id(id);
    })
}

/// `rdma_get_request`: the next connection request of a synchronous listening id, as a synchronous id (with the
/// QP of `rdma_create_ep`'s attributes, if it had some).
///
/// # Safety
/// `out` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_get_request(
    listen: *mut RdmaCmId,
    out: *mut *mut RdmaCmId,
) -> c_int {
    guard(-1, || {
        ret((|| {
            if out.is_null() {
                return Err(libc::EINVAL);
            }
            let (ch, ep_qp) = {
                let st = lock();
                match st.ids.get(&(listen as usize)) {
                    Some(i) if i.sync && i.st == cma::St::Listening => {
                        (i.chan as *mut RdmaEventChannel, i.ep_qp)
                    }
                    _ => return Err(libc::EINVAL),
                }
            };
            loop {
                let ev = cma::get_event(ch)?;
                // SAFETY: an event handed out by get_event.
                let (kind, nid) = unsafe { ((*ev).event, (*ev).id) };
                cma::ack_event(ev)?;
                if kind != EV_CONNECT_REQUEST {
                    continue;
                }
                // SAFETY: `nid` is the new id of the request.
                if unsafe { rocev2_rdma_migrate_id(nid, core::ptr::null_mut()) } != 0 {
                    let e = errno();
                    let _ = cma::destroy_id(nid);
                    return Err(e);
                }
                if let Some(cma::EpQp(mut attr, pd)) = ep_qp {
                    // SAFETY: a live id; `attr` is a local copy.
                    if unsafe { rocev2_rdma_create_qp(nid, pd as *mut c_void, &mut attr) } != 0 {
                        let e = errno();
                        let _ = cma::destroy_id(nid);
                        return Err(e);
                    }
                }
                // SAFETY: checked non-NULL.
                unsafe { out.write(nid) };
                return Ok(());
            }
        })())
    })
}

// ---------------------------------------------------------------------------------------------------------------
// Not implemented: -1 / NULL with ENOSYS (module docs), each with its C signature.

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rdma_notify(_id: *mut RdmaCmId, _event: c_int) -> c_int {
    nosys(-1)
}
/// `rdma_join_multicast_ex(id, attr, context)` (`crate::mcast`): 0, or -1 with `errno` (`EINVAL` without
/// `RDMA_CM_JOIN_MC_ATTR_ADDRESS`, without `RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS` or with a reserved flag; `ENOTSUP` for
/// a reserved `comp_mask` bit, as librdmacm; the join's own errors). A synchronous id waits for its JOIN event.
///
/// # Safety
/// `id` is NULL or an id this library made; `attr` NULL or a `struct rdma_cm_join_mc_attr_ex` whose `addr` is a
/// sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_join_multicast_ex(
    id: *mut RdmaCmId,
    attr: *mut crate::mcast::RdmaCmJoinMcAttrEx,
    ctx: *mut c_void,
) -> c_int {
    use crate::mcast::*;
    guard(-1, || {
        ret((|| {
            // SAFETY: per the contract.
            let a = unsafe { attr.as_ref() }.ok_or(libc::EINVAL)?;
            if a.comp_mask & RDMA_CM_JOIN_MC_ATTR_ADDRESS == 0
                || a.comp_mask & RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS == 0
                || a.join_flags > RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER
            {
                return Err(libc::EINVAL);
            }
            if a.comp_mask >= RDMA_CM_JOIN_MC_ATTR_RESERVED {
                return Err(libc::ENOTSUP);
            }
            // SAFETY: per the contract.
            let addr = unsafe { cma::parse_sockaddr(a.addr) }?;
            {
                let mut st = lock();
                cma::check_id(&st, id)?;
                join(&mut st, id as usize, addr, a.join_flags, ctx as usize)?;
            }
            wait_sync(id, EV_MULTICAST_JOIN)
        })())
    })
}

/// `rdma_join_multicast(id, addr, context)`: [`rocev2_rdma_join_multicast_ex`] as a full member.
///
/// # Safety
/// `id` is NULL or an id this library made; `addr` NULL or a sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_join_multicast(
    id: *mut RdmaCmId,
    addr: *mut sockaddr,
    ctx: *mut c_void,
) -> c_int {
    use crate::mcast::*;
    let mut a = RdmaCmJoinMcAttrEx {
        comp_mask: RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS,
        join_flags: RDMA_MC_JOIN_FLAG_FULLMEMBER,
        addr,
    };
    // SAFETY: forwarded under the caller's contract; `a` lives for the call.
    unsafe { rocev2_rdma_join_multicast_ex(id, &mut a, ctx) }
}

/// `rdma_leave_multicast(id, addr)` (`crate::mcast`): 0, or -1 with `errno` (`EINVAL` for a bad id or address,
/// `EADDRNOTAVAIL` for a group the id has not joined).
///
/// # Safety
/// `id` is NULL or an id this library made; `addr` NULL or a sockaddr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_leave_multicast(
    id: *mut RdmaCmId,
    addr: *mut sockaddr,
) -> c_int {
    guard(-1, || {
        ret((|| {
            // SAFETY: per the contract.
            let addr = unsafe { cma::parse_sockaddr(addr) }?;
            let mut st = lock();
            cma::check_id(&st, id)?;
            crate::mcast::leave(&mut st, id as usize, addr)
        })())
    })
}
/// ECE (Enhanced Connection Establishment) is not carried in our REQ/REP, and the device has none
/// (`ibv_query_ece` / `ibv_set_ece` answer `EOPNOTSUPP`): `-1` with `errno = EOPNOTSUPP`, the errno programs test
/// for "no ECE" (pyverbs `rdmacm_utils.py` `set_cmids_qp_ece`); rdma-core's librdmacm answers 0 with the ECE
/// the kernel's CM received.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rdma_get_remote_ece(_id: *mut RdmaCmId, _ece: *mut c_void) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1
}
/// As [`rocev2_rdma_get_remote_ece`]: `-1` with `errno = EOPNOTSUPP`.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rdma_set_local_ece(_id: *mut RdmaCmId, _ece: *mut c_void) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1
}
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rdma_reject_ece(
    _id: *mut RdmaCmId,
    _pdata: *const c_void,
    _len: u8,
) -> c_int {
    nosys(-1)
}
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rdma_create_srq(
    _id: *mut RdmaCmId,
    _pd: *mut c_void,
    _attr: *mut c_void,
) -> c_int {
    nosys(-1)
}
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rdma_create_srq_ex(_id: *mut RdmaCmId, _attr: *mut c_void) -> c_int {
    nosys(-1)
}
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rdma_destroy_srq(_id: *mut RdmaCmId) {
    set_errno(libc::ENOSYS);
}
fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}
