//! The private entry point through which rocev2's `librdmacm.so.1` (crate `roce-rdmacm`) reaches the connection
//! manager of this library's runtime (`docs/RDMACM.md` §1): one runtime per process, whichever library the program
//! calls first. `rocev2_private_v1@@ROCEV2_PRIVATE` returns a `#[repr(C)]` table of C functions over
//! [`roce_verbs::cm::ConnectionManager`] on the device of an `ibv_context *` this library opened; the other
//! library checks `version` and `size` and refuses a mismatched pair with a message.
//!
//! The table is the CM only: QPs, PDs and queries go through the ordinary libibverbs calls (as rdma-core's
//! librdmacm does), and the CM never touches a QP here (`connect_qpn` / `accept_qpn`: the caller moves its QP with
//! `ibv_modify_qp`, so the library's recorded QP state stays right for the post checks).
//!
//! The table's layout, its version and the versioning rule (any change of a field's layout or meaning bumps
//! `PRIVATE_VERSION`; the other library refuses a table of another version) are declared once, in crate
//! `roce-abi` (`roce_abi::bridge`), for both libraries; this module fills the table.
//!
//! Connections and listens are named by `u64` handles (never reused within the process); every function answers
//! `0` or a negative errno (`-EINVAL` for a context this library did not open or a stale handle), never panics.

use std::collections::HashMap;
use std::sync::MutexGuard;

use libc::c_int;
use roce_abi::bridge::{CmEventC, CmIdsFn, ConnectC, PrivateV1, kind};
use roce_proto::{Psn, Qpn};
use roce_verbs::cm::{CmEvent, ConnId, ConnectionManager, ListenId};
use roce_verbs::{ConnectOpts, Error, Gid, Mtu, QpType};

use super::{IbvContext, ctx_block};
use crate::guard::guard;

#[derive(Default)]
struct Handles {
    next: u64,
    cms: HashMap<usize, ConnectionManager>,
    conns: HashMap<u64, ConnId>,
    conn_handles: HashMap<ConnId, u64>,
    listens: HashMap<u64, ListenId>,
    listen_handles: HashMap<ListenId, u64>,
}

/// Each process has its own (`roce_fork`): a child forked while another thread held this lock would otherwise wait
/// for ever at its first rdma_cm call, and the parent's connection managers are not the child's.
static HANDLES: roce_fork::ForkLocal<Option<Handles>> = roce_fork::ForkLocal::new(|| None);

fn handles() -> MutexGuard<'static, Option<Handles>> {
    HANDLES.lock()
}

fn with<R>(f: impl FnOnce(&mut Handles) -> R) -> R {
    f(handles().get_or_insert_with(Handles::default))
}

fn err(e: &Error) -> c_int {
    -e.errno()
}

/// The CM of `ctx` (opened by [`open`](bridge_open)).
fn cm(ctx: *mut IbvContext) -> Result<ConnectionManager, c_int> {
    with(|h| h.cms.get(&(ctx as usize)).cloned()).ok_or(-libc::EINVAL)
}

fn conn(h: u64) -> Result<ConnId, c_int> {
    with(|t| t.conns.get(&h).copied()).ok_or(-libc::EINVAL)
}

/// The body every table function of an opened device shares: `f` on the CM of `ctx`, inside the panic guard of
/// table function `name` (`-EIO` when `f` panics); `-EINVAL` when the context has no CM (not opened by this
/// library, or `open` / `listen` not called yet).
fn on_cm(name: &str, ctx: *mut IbvContext, f: impl FnOnce(&ConnectionManager) -> c_int) -> c_int {
    guard(
        name,
        || -libc::EIO,
        || match cm(ctx) {
            Ok(cm) => f(&cm),
            Err(e) => e,
        },
    )
}

/// The body every table function that names a connection shares: `f` on the CM of `ctx` and the connection
/// behind handle `conn_h`, inside the panic guard of table function `name` (`-EIO` when `f` panics). `-EINVAL`
/// when the context has no CM or the handle is stale.
fn on_conn(
    name: &str,
    ctx: *mut IbvContext,
    conn_h: u64,
    f: impl FnOnce(&ConnectionManager, ConnId) -> c_int,
) -> c_int {
    on_cm(name, ctx, |cm| match conn(conn_h) {
        Ok(id) => f(cm, id),
        Err(e) => e,
    })
}

/// 0, or the error's `-errno`.
fn answer(r: Result<(), Error>) -> c_int {
    r.map_or_else(|e| err(&e), |()| 0)
}

/// [`answer`] of a call that ends the exchange of `id`: its handle is forgotten when the call succeeded.
fn answer_ending(r: Result<(), Error>, id: ConnId) -> c_int {
    if r.is_ok() {
        forget_conn(id);
    }
    answer(r)
}

fn conn_handle(id: ConnId) -> u64 {
    with(|t| {
        if let Some(&h) = t.conn_handles.get(&id) {
            return h;
        }
        t.next += 1;
        let h = t.next;
        t.conns.insert(h, id);
        t.conn_handles.insert(id, h);
        h
    })
}

fn forget_conn(id: ConnId) {
    with(|t| {
        if let Some(h) = t.conn_handles.remove(&id) {
            t.conns.remove(&h);
        }
    });
}

fn mtu(v: u8) -> Mtu {
    match v {
        1 => Mtu::Mtu256,
        2 => Mtu::Mtu512,
        4 => Mtu::Mtu2048,
        5 => Mtu::Mtu4096,
        _ => Mtu::Mtu1024,
    }
}

/// # Safety
/// `p` is NULL or points at `len` readable bytes.
unsafe fn bytes<'a>(p: *const u8, len: u32) -> &'a [u8] {
    if p.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(p, len as usize) }
}

/// Starts the connection manager of a device whose runtime just opened (`CtxBlock::runtime`): every rocev2
/// process answers CM MADs from its first verbs object on, as Linux's always-on CM (in the kernel) does, so a REQ
/// for a service nobody listens on is rejected at once with reason 8 (invalid service ID; IBTA Vol 1 §12.6.7,
/// Linux `cm.c` `cm_req_handler`) instead of waiting unanswered in QP 1's receive queue until the requester's
/// retries run out (issue #17 finding). The CM then lives in the device; later `open`s share it. A failure (no
/// eventfd) is said once and leaves the CM to start on the first rdma_cm call, as before.
pub(crate) fn start(rt: &roce_verbs::Context) {
    if let Err(e) = ConnectionManager::open(rt) {
        eprintln!("rocev2 libibverbs: the connection manager did not start: {e}");
    }
}

unsafe extern "C" fn bridge_open(ctx: *mut IbvContext) -> c_int {
    guard(
        "rocev2_private_v1.open",
        || -libc::EIO,
        || {
            // SAFETY: `ctx_block` looks the pointer up in the live table before using it.
            let Some(b) = (unsafe { ctx_block(ctx) }) else {
                return -libc::EINVAL;
            };
            if let Ok(cm) = cm(ctx) {
                return cm.fd();
            }
            let rt = match b.runtime() {
                Ok(rt) => rt,
                Err(e) => return -e,
            };
            match ConnectionManager::open(rt) {
                Ok(cm) => {
                    let fd = cm.fd();
                    with(|h| h.cms.insert(ctx as usize, cm));
                    fd
                }
                Err(e) => err(&e),
            }
        },
    )
}

unsafe extern "C" fn bridge_listen(ctx: *mut IbvContext, sid: u64, out: *mut u64) -> c_int {
    guard(
        "rocev2_private_v1.listen",
        || -libc::EIO,
        || {
            if out.is_null() {
                return -libc::EINVAL;
            }
            let listened = match cm(ctx) {
                Ok(cm) => cm.listen(sid),
                // The device's first CM use: start it listening in one step
                // (`ConnectionManager::open_listening`), so a REQ that arrived first meets the listen.
                Err(_) => {
                    // SAFETY: `ctx_block` looks the pointer up in the live table before using it.
                    let Some(b) = (unsafe { ctx_block(ctx) }) else {
                        return -libc::EINVAL;
                    };
                    let rt = match b.runtime() {
                        Ok(rt) => rt,
                        Err(e) => return -e,
                    };
                    ConnectionManager::open_listening(rt, sid).map(|(cm, l)| {
                        with(|h| h.cms.insert(ctx as usize, cm));
                        l
                    })
                }
            };
            match listened {
                Ok(l) => {
                    let h = with(|t| {
                        t.next += 1;
                        t.listens.insert(t.next, l);
                        t.listen_handles.insert(l, t.next);
                        t.next
                    });
                    // SAFETY: checked non-NULL; the caller passes a writable u64.
                    unsafe { out.write(h) };
                    0
                }
                Err(e) => err(&e),
            }
        },
    )
}

unsafe extern "C" fn bridge_stop_listen(ctx: *mut IbvContext, listen: u64) -> c_int {
    on_cm("rocev2_private_v1.stop_listen", ctx, |cm| {
        let Some(l) = with(|t| {
            let l = t.listens.remove(&listen)?;
            t.listen_handles.remove(&l);
            Some(l)
        }) else {
            return -libc::EINVAL;
        };
        answer(cm.stop_listen(l))
    })
}

unsafe extern "C" fn bridge_connect(
    ctx: *mut IbvContext,
    req: *const ConnectC,
    out: *mut u64,
    out_psn: *mut u32,
) -> c_int {
    on_cm("rocev2_private_v1.connect", ctx, |cm| {
        // SAFETY: the caller passes a valid request or NULL.
        let Some(r) = (unsafe { req.as_ref() }) else {
            return -libc::EINVAL;
        };
        if out.is_null() || out_psn.is_null() {
            return -libc::EINVAL;
        }
        let qp_type = match r.qp_type {
            2 => QpType::Rc,
            3 => QpType::Uc,
            _ => return -libc::EINVAL,
        };
        let opts = ConnectOpts {
            mtu: mtu(r.mtu),
            timeout: if r.timeout == 0 {
                ConnectOpts::default().timeout
            } else {
                r.timeout
            },
            retry_cnt: r.retry_count,
            rnr_retry: r.rnr_retry_count,
            rd_atomic: r.rd_atomic,
            traffic_class: r.traffic_class,
            ..ConnectOpts::default()
        };
        // SAFETY: the caller's private data is `private_len` readable bytes.
        let pd = unsafe { bytes(r.private_data, r.private_len) };
        let dgid = Gid(r.dgid);
        // UDP links route by IP: the MAC is only a placeholder there (module docs of `roce_verbs::cm`).
        match cm.connect_qpn_with_lifetime(
            Qpn::new(r.qpn),
            qp_type,
            dgid,
            [0xff; 6],
            r.service_id,
            pd,
            &opts,
            r.timeout.checked_sub(1).map(|t| t.min(31)),
        ) {
            Ok((id, psn)) => {
                let h = conn_handle(id);
                // SAFETY: checked non-NULL; the caller passes writable outputs.
                unsafe {
                    out.write(h);
                    out_psn.write(psn.value());
                }
                0
            }
            Err(e) => err(&e),
        }
    })
}

#[allow(clippy::too_many_arguments)]
unsafe extern "C" fn bridge_accept(
    ctx: *mut IbvContext,
    conn_h: u64,
    qpn: u32,
    psn: u32,
    private_data: *const u8,
    private_len: u32,
    rd_atomic: u8,
    rnr_retry_count: u8,
) -> c_int {
    on_conn("rocev2_private_v1.accept", ctx, conn_h, |cm, id| {
        let opts = ConnectOpts {
            rd_atomic,
            rnr_retry: rnr_retry_count,
            ..ConnectOpts::default()
        };
        // SAFETY: the caller's private data is `private_len` readable bytes.
        let pd = unsafe { bytes(private_data, private_len) };
        answer(cm.accept_qpn(id, Qpn::new(qpn), Psn::new(psn), pd, &opts))
    })
}

unsafe extern "C" fn bridge_reject(
    ctx: *mut IbvContext,
    conn_h: u64,
    private_data: *const u8,
    private_len: u32,
) -> c_int {
    on_conn("rocev2_private_v1.reject", ctx, conn_h, |cm, id| {
        // SAFETY: the caller's private data is `private_len` readable bytes.
        let pd = unsafe { bytes(private_data, private_len) };
        answer_ending(cm.reject(id, pd), id)
    })
}

unsafe extern "C" fn bridge_establish(ctx: *mut IbvContext, conn_h: u64) -> c_int {
    on_conn("rocev2_private_v1.establish", ctx, conn_h, |cm, id| {
        answer(cm.establish(id))
    })
}

unsafe extern "C" fn bridge_disconnect(ctx: *mut IbvContext, conn_h: u64) -> c_int {
    on_conn("rocev2_private_v1.disconnect", ctx, conn_h, |cm, id| {
        answer(cm.disconnect(id))
    })
}

unsafe extern "C" fn bridge_sidr_resolve(
    ctx: *mut IbvContext,
    dgid: *const [u8; 16],
    service_id: u64,
    private_data: *const u8,
    private_len: u32,
    out: *mut u64,
) -> c_int {
    on_cm("rocev2_private_v1.sidr_resolve", ctx, |cm| {
        // SAFETY: the caller passes a readable GID or NULL.
        let Some(&dgid) = (unsafe { dgid.as_ref() }) else {
            return -libc::EINVAL;
        };
        if out.is_null() {
            return -libc::EINVAL;
        }
        // SAFETY: the caller's private data is `private_len` readable bytes.
        let pd = unsafe { bytes(private_data, private_len) };
        // UDP links route by IP: the MAC is only a placeholder there (module docs of `roce_verbs::cm`).
        match cm.sidr_resolve(Gid(dgid), [0xff; 6], service_id, pd, 0) {
            Ok(id) => {
                // SAFETY: checked non-NULL; the caller passes a writable u64.
                unsafe { out.write(conn_handle(id)) };
                0
            }
            Err(e) => err(&e),
        }
    })
}

unsafe extern "C" fn bridge_sidr_accept(
    ctx: *mut IbvContext,
    conn_h: u64,
    qpn: u32,
    qkey: u32,
    private_data: *const u8,
    private_len: u32,
) -> c_int {
    on_conn("rocev2_private_v1.sidr_accept", ctx, conn_h, |cm, id| {
        // SAFETY: the caller's private data is `private_len` readable bytes.
        let pd = unsafe { bytes(private_data, private_len) };
        answer_ending(cm.sidr_accept_qpn(id, Qpn::new(qpn), qkey, pd), id)
    })
}

unsafe extern "C" fn bridge_sidr_reject(
    ctx: *mut IbvContext,
    conn_h: u64,
    private_data: *const u8,
    private_len: u32,
) -> c_int {
    on_conn("rocev2_private_v1.sidr_reject", ctx, conn_h, |cm, id| {
        // SAFETY: the caller's private data is `private_len` readable bytes.
        let pd = unsafe { bytes(private_data, private_len) };
        answer_ending(cm.sidr_reject(id, pd), id)
    })
}

unsafe extern "C" fn bridge_destroy(ctx: *mut IbvContext, conn_h: u64) -> c_int {
    on_conn("rocev2_private_v1.destroy", ctx, conn_h, |cm, id| {
        forget_conn(id);
        answer(cm.destroy(id))
    })
}

unsafe extern "C" fn bridge_flush(ctx: *mut IbvContext, timeout_ms: u32) -> c_int {
    on_cm("rocev2_private_v1.flush", ctx, |cm| {
        cm.flush(std::time::Duration::from_millis(u64::from(timeout_ms)))
            .map_or_else(|e| err(&e), c_int::from)
    })
}

unsafe extern "C" fn bridge_set_cm_ids(cb: CmIdsFn) -> c_int {
    guard(
        "rocev2_private_v1.set_cm_ids",
        || -libc::EIO,
        || {
            roce_verbs::endpoint::set_cm_id_source(Box::new(move || {
                let mut buf = vec![0u8; 4096];
                // Twice at most: the list may grow between the calls; a third size is not chased.
                for _ in 0..2 {
                    // SAFETY: `buf` is writable for its length; the callback writes at most `cap` bytes.
                    let n = unsafe { cb(buf.as_mut_ptr(), buf.len()) };
                    if n <= buf.len() {
                        buf.truncate(n);
                        return String::from_utf8(buf).ok();
                    }
                    buf.resize(n, 0);
                }
                None
            }));
            0
        },
    )
}

unsafe extern "C" fn bridge_poll_event(ctx: *mut IbvContext, out: *mut CmEventC) -> c_int {
    on_cm("rocev2_private_v1.poll_event", ctx, |cm| {
        // SAFETY: the caller passes a writable event or NULL.
        let Some(out) = (unsafe { out.as_mut() }) else {
            return -libc::EINVAL;
        };
        let ev = match cm.poll_event() {
            Ok(Some(ev)) => ev,
            Ok(None) => return 0,
            Err(e) => return err(&e),
        };
        out.status = 0;
        out.listen = 0;
        out.private_len = 0;
        out.qkey = 0;
        match ev {
            CmEvent::ConnectRequest {
                id,
                listen,
                peer,
                remote_qpn,
                remote_psn,
                private_data,
                ..
            } => {
                out.kind = kind::CONNECT_REQUEST;
                out.conn = conn_handle(id);
                out.listen = with(|t| t.listen_handles.get(&listen).copied().unwrap_or(0));
                out.remote_qpn = remote_qpn.value();
                out.remote_psn = remote_psn.value();
                out.peer_gid = peer.0;
                if let Some(p) = cm.request_params(id) {
                    out.responder_resources = p.responder_resources;
                    out.initiator_depth = p.initiator_depth;
                    out.retry_count = p.retry_count;
                    out.rnr_retry_count = p.rnr_retry_count;
                    out.path_mtu = p.path_mtu;
                    out.local_ack_timeout = p.local_ack_timeout;
                    out.traffic_class = p.traffic_class;
                }
                out.set_private(&private_data);
            }
            CmEvent::ConnectResponse {
                id,
                remote_qpn,
                remote_psn,
                responder_resources,
                initiator_depth,
                rnr_retry_count,
                local_ack_timeout,
                private_data,
            } => {
                out.kind = kind::CONNECT_RESPONSE;
                out.local_ack_timeout = local_ack_timeout;
                out.conn = conn_handle(id);
                out.remote_qpn = remote_qpn.value();
                out.remote_psn = remote_psn.value();
                out.responder_resources = responder_resources;
                out.initiator_depth = initiator_depth;
                out.rnr_retry_count = rnr_retry_count;
                out.set_private(&private_data);
            }
            CmEvent::Established { id, private_data } => {
                out.kind = kind::ESTABLISHED;
                out.conn = conn_handle(id);
                out.set_private(&private_data);
            }
            CmEvent::Rejected {
                id,
                reason,
                private_data,
            } => {
                out.kind = kind::REJECTED;
                out.conn = conn_handle(id);
                out.status = u32::from(reason);
                out.set_private(&private_data);
                forget_conn(id);
            }
            CmEvent::Disconnected { id } => {
                out.kind = kind::DISCONNECTED;
                out.conn = conn_handle(id);
            }
            CmEvent::TimewaitExit { id } => {
                out.kind = kind::TIMEWAIT_EXIT;
                out.conn = conn_handle(id);
                forget_conn(id);
            }
            CmEvent::Unreachable { id } => {
                out.kind = kind::UNREACHABLE;
                out.conn = conn_handle(id);
                forget_conn(id);
            }
            CmEvent::SidrRequest {
                id,
                listen,
                peer,
                private_data,
                ..
            } => {
                out.kind = kind::SIDR_REQUEST;
                out.conn = conn_handle(id);
                out.listen = with(|t| t.listen_handles.get(&listen).copied().unwrap_or(0));
                out.peer_gid = peer.0;
                out.set_private(&private_data);
            }
            CmEvent::SidrResolved {
                id,
                ah,
                qpn,
                qkey,
                private_data,
            } => {
                out.kind = kind::SIDR_RESOLVED;
                out.conn = conn_handle(id);
                out.remote_qpn = qpn.value();
                out.qkey = qkey;
                out.peer_gid = ah.dgid.0;
                out.traffic_class = ah.traffic_class;
                out.set_private(&private_data);
                forget_conn(id);
            }
            CmEvent::SidrRejected {
                id,
                status,
                private_data,
            } => {
                out.kind = kind::SIDR_REJECTED;
                out.conn = conn_handle(id);
                out.status = u32::from(status);
                out.set_private(&private_data);
                forget_conn(id);
            }
        }
        1
    })
}

static TABLE: PrivateV1 = PrivateV1 {
    version: PrivateV1::HEADER_VERSION,
    size: PrivateV1::HEADER_SIZE,
    open: bridge_open,
    listen: bridge_listen,
    stop_listen: bridge_stop_listen,
    connect: bridge_connect,
    accept: bridge_accept,
    reject: bridge_reject,
    establish: bridge_establish,
    disconnect: bridge_disconnect,
    poll_event: bridge_poll_event,
    sidr_resolve: bridge_sidr_resolve,
    sidr_accept: bridge_sidr_accept,
    sidr_reject: bridge_sidr_reject,
    destroy: bridge_destroy,
    flush: bridge_flush,
    set_cm_ids: bridge_set_cm_ids,
};

/// `rocev2_private_v1@@ROCEV2_PRIVATE`: the table (module docs). For rocev2's own `librdmacm.so.1` only.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rocev2_private_v1() -> *const PrivateV1 {
    &TABLE
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exporter's half of the versioning rule (`roce_abi::bridge`): the table carries this build's version and
    /// size, so librdmacm's `check` accepts it exactly when it was built from the same declarations.
    #[test]
    fn exported_table_carries_this_builds_version_and_size() {
        // SAFETY: the entry point returns a pointer to the static table.
        let t = unsafe { &*rocev2_rocev2_private_v1() };
        assert_eq!(t.version, roce_abi::bridge::PRIVATE_VERSION);
        assert_eq!(t.check(), Ok(()));
    }

    /// Every function answers `-EINVAL` for a context this library did not open (no CM), before it looks at its
    /// other arguments: the shared `on_cm` / `on_conn` bodies.
    #[test]
    fn functions_answer_einval_for_a_context_without_cm() {
        let t = &TABLE;
        let ctx = core::ptr::null_mut();
        let mut ev = CmEventC::zeroed();
        let (mut h, mut psn) = (0u64, 0u32);
        // SAFETY: each function checks the context before it reads any pointer argument.
        unsafe {
            assert_eq!((t.stop_listen)(ctx, 1), -libc::EINVAL);
            assert_eq!(
                (t.connect)(ctx, core::ptr::null(), &mut h, &mut psn),
                -libc::EINVAL
            );
            assert_eq!(
                (t.accept)(ctx, 1, 1, 1, core::ptr::null(), 0, 1, 7),
                -libc::EINVAL
            );
            assert_eq!((t.reject)(ctx, 1, core::ptr::null(), 0), -libc::EINVAL);
            assert_eq!((t.establish)(ctx, 1), -libc::EINVAL);
            assert_eq!((t.disconnect)(ctx, 1), -libc::EINVAL);
            assert_eq!((t.poll_event)(ctx, &mut ev), -libc::EINVAL);
            assert_eq!(
                (t.sidr_resolve)(ctx, core::ptr::null(), 1, core::ptr::null(), 0, &mut h),
                -libc::EINVAL
            );
            assert_eq!(
                (t.sidr_accept)(ctx, 1, 1, 1, core::ptr::null(), 0),
                -libc::EINVAL
            );
            assert_eq!((t.sidr_reject)(ctx, 1, core::ptr::null(), 0), -libc::EINVAL);
            assert_eq!((t.destroy)(ctx, 1), -libc::EINVAL);
            assert_eq!((t.flush)(ctx, 0), -libc::EINVAL);
        }
    }
}
