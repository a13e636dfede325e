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
//! Version 2 added SIDR (UD port spaces, IBTA Vol 1 §12.11): `sidr_resolve` / `sidr_accept` / `sidr_reject` at
//! the end of the table, the event kinds `SIDR_REQUEST` / `SIDR_RESOLVED` / `SIDR_REJECTED`, `CmEventC::qkey`,
//! and `destroy`. Version 3 added `flush` (librdmacm's exit handler: its DREQs leave before the process ends) and
//! `set_cm_ids` (the library's ids in the stats endpoint's answer, `rocev2 stat`).
//!
//! Connections and listens are named by `u64` handles (never reused within the process); every function answers
//! `0` or a negative errno (`-EINVAL` for a context this library did not open or a stale handle), never panics.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use libc::c_int;
use roce_proto::{Psn, Qpn};
use roce_verbs::cm::{CmEvent, ConnId, ConnectionManager, ListenId};
use roce_verbs::{ConnectOpts, Error, Gid, Mtu, QpType};

use super::{IbvContext, ctx_block};
use crate::guard::guard;

/// Version of [`PrivateV1`]'s layout and meaning.
pub const PRIVATE_VERSION: u32 = 3;

/// Longest private data an event carries (DREP: 224 bytes, IBTA Vol 1 §12.6).
pub const EVENT_PRIVATE_MAX: usize = 224;

/// Event kinds of [`CmEventC::kind`].
pub mod kind {
    /// A REQ matched a listen.
    pub const CONNECT_REQUEST: u32 = 0;
    /// A REP for a connection made by `connect`.
    pub const CONNECT_RESPONSE: u32 = 1;
    /// RTU received (passive) or sent (active).
    pub const ESTABLISHED: u32 = 2;
    /// REJ received; `status` is the reason.
    pub const REJECTED: u32 = 3;
    /// DREQ/DREP exchange done (or gave up).
    pub const DISCONNECTED: u32 = 4;
    /// Timewait over.
    pub const TIMEWAIT_EXIT: u32 = 5;
    /// REQ or REP (or SIDR_REQ) unanswered after all retries.
    pub const UNREACHABLE: u32 = 6;
    /// A SIDR_REQ matched a listen: `conn` names the exchange (answer with `sidr_accept` / `sidr_reject`),
    /// `listen`, `peer_gid` and the SIDR_REQ's private data (216 bytes) are filled.
    pub const SIDR_REQUEST: u32 = 7;
    /// Our SIDR_REQ was answered with status success: `remote_qpn` and `qkey` name the service's UD QP,
    /// `peer_gid` / `traffic_class` the address handle towards it, private data the SIDR_REP's (136 bytes).
    pub const SIDR_RESOLVED: u32 = 8;
    /// Our SIDR_REQ was answered with another status (`status`: IBTA Vol 1 Table 120, 1 unsupported service ID,
    /// 2 rejected, ...); private data the SIDR_REP's.
    pub const SIDR_REJECTED: u32 = 9;
}

/// One CM event as the table hands it out.
#[repr(C)]
pub struct CmEventC {
    /// One of [`kind`].
    pub kind: u32,
    /// REJ reason (IBTA Vol 1 Table 112) for `REJECTED`, SIDR status for `SIDR_REJECTED`, else 0.
    pub status: u32,
    /// The connection's handle.
    pub conn: u64,
    /// `CONNECT_REQUEST`: the listen's handle.
    pub listen: u64,
    /// `CONNECT_REQUEST` / `CONNECT_RESPONSE`: the peer's QPN and starting PSN.
    pub remote_qpn: u32,
    /// See `remote_qpn`.
    pub remote_psn: u32,
    /// `CONNECT_REQUEST`: the requester's GID.
    pub peer_gid: [u8; 16],
    /// The REQ's / REP's responder resources.
    pub responder_resources: u8,
    /// The REQ's / REP's initiator depth.
    pub initiator_depth: u8,
    /// `CONNECT_REQUEST`: retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// `CONNECT_REQUEST`: path MTU (IBTA encoding, 1..=5).
    pub path_mtu: u8,
    /// `CONNECT_REQUEST`: the REQ's Local ACK Timeout of the path; `CONNECT_RESPONSE`: the ACK timeout the
    /// active QP takes at RTS (from the REP's TargetACKDelay, Linux `cm.c` `cm_rep_handler`). 4.096 µs · 2^n.
    pub local_ack_timeout: u8,
    /// `CONNECT_REQUEST`: traffic class of the path.
    pub traffic_class: u8,
    /// Padding.
    pub reserved: u8,
    /// Bytes of `private_data` that are valid.
    pub private_len: u32,
    /// The message's private data.
    pub private_data: [u8; EVENT_PRIVATE_MAX],
    /// `SIDR_RESOLVED`: the service's Q_Key (version 2).
    pub qkey: u32,
}

/// What `connect` sends (`rdma_connect`).
#[repr(C)]
pub struct ConnectC {
    /// The QP offered.
    pub qpn: u32,
    /// `ibv_qp_type`: 2 RC, 3 UC.
    pub qp_type: u32,
    /// The destination port's GID.
    pub dgid: [u8; 16],
    /// `ps << 16 | port`.
    pub service_id: u64,
    /// Private data (rdma_cm: the 36-byte `cma_hdr` first), at most 92 bytes.
    pub private_data: *const u8,
    /// Its length.
    pub private_len: u32,
    /// `ibv_mtu` 1..=5.
    pub mtu: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// Responder resources / initiator depth offered.
    pub rd_atomic: u8,
    /// The program's ACK timeout (`RDMA_OPTION_ID_ACK_TIMEOUT`, 4.096 µs · 2^n), or 0 for none: when set, the
    /// REQ's Local ACK Timeout is computed from a packet lifetime of `timeout - 1` (Linux `cma.c`
    /// `cma_resolve_iboe_route`), else from the CM's.
    pub timeout: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// The table (`rocev2_private_v1`). Every function returns 0 (or 1 for an event taken) or a negative errno.
#[repr(C)]
pub struct PrivateV1 {
    /// [`PRIVATE_VERSION`].
    pub version: u32,
    /// `size_of::<PrivateV1>()`.
    pub size: u32,
    /// Starts the device's runtime and CM; returns the CM's event fd (readable while events wait) or `-errno`.
    pub open: unsafe extern "C" fn(ctx: *mut IbvContext) -> c_int,
    /// Listens on a service ID (starting the device's runtime and CM if `open` was not called: in one step, so a
    /// REQ that arrived first meets the listen); writes the listen's handle.
    pub listen: unsafe extern "C" fn(ctx: *mut IbvContext, service_id: u64, out: *mut u64) -> c_int,
    /// Stops a listen.
    pub stop_listen: unsafe extern "C" fn(ctx: *mut IbvContext, listen: u64) -> c_int,
    /// Sends a REQ; writes the connection's handle and the starting PSN offered (the QP's SQ PSN).
    pub connect: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        req: *const ConnectC,
        out: *mut u64,
        out_psn: *mut u32,
    ) -> c_int,
    /// Sends the REP for a request (QP `qpn` already in RTR, its RQ PSN `psn`: the REP's Starting PSN).
    pub accept: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        conn: u64,
        qpn: u32,
        psn: u32,
        private_data: *const u8,
        private_len: u32,
        rd_atomic: u8,
        rnr_retry_count: u8,
    ) -> c_int,
    /// Sends a REJ (consumer reject, 28) with private data (at most 148 bytes).
    pub reject: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        conn: u64,
        private_data: *const u8,
        private_len: u32,
    ) -> c_int,
    /// Sends the RTU after `CONNECT_RESPONSE`.
    pub establish: unsafe extern "C" fn(ctx: *mut IbvContext, conn: u64) -> c_int,
    /// Sends a DREQ.
    pub disconnect: unsafe extern "C" fn(ctx: *mut IbvContext, conn: u64) -> c_int,
    /// Takes one event: 1 and `*out` filled, 0 when none waits, or `-errno`.
    pub poll_event: unsafe extern "C" fn(ctx: *mut IbvContext, out: *mut CmEventC) -> c_int,
    /// Sends a SIDR_REQ for `service_id` to the port with GID `*dgid` (private data at most 216 bytes, rdma_cm's
    /// `cma_hdr` first), re-sent after the CM response timeout like a REQ; writes the exchange's handle. The
    /// answer is `SIDR_RESOLVED`, `SIDR_REJECTED` or, after all retries, `UNREACHABLE`.
    pub sidr_resolve: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        dgid: *const [u8; 16],
        service_id: u64,
        private_data: *const u8,
        private_len: u32,
        out: *mut u64,
    ) -> c_int,
    /// Answers a `SIDR_REQUEST` with status success naming UD QP `qpn` (already in RTS with Q_Key `qkey`) and
    /// `qkey`, private data at most 136 bytes. The exchange is over.
    pub sidr_accept: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        conn: u64,
        qpn: u32,
        qkey: u32,
        private_data: *const u8,
        private_len: u32,
    ) -> c_int,
    /// Answers a `SIDR_REQUEST` with status 2 (rejected; Linux `cma.c` for `rdma_reject` on a UD id), private
    /// data at most 136 bytes. The exchange is over.
    pub sidr_reject: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        conn: u64,
        private_data: *const u8,
        private_len: u32,
    ) -> c_int,
    /// Forgets a connection or SIDR exchange as its id is destroyed (`ConnectionManager::destroy`: what Linux
    /// `cm_destroy_id` sends; our unanswered SIDR_REQ stops being re-sent); the handle is stale afterwards.
    pub destroy: unsafe extern "C" fn(ctx: *mut IbvContext, conn: u64) -> c_int,
    /// Drives the device until the CM's queued MADs have left through QP 1, at most `timeout_ms`
    /// (`ConnectionManager::flush`): 1 when they have, 0 when the time ran out. For librdmacm's exit handler.
    pub flush: unsafe extern "C" fn(ctx: *mut IbvContext, timeout_ms: u32) -> c_int,
    /// Registers the library's list of rdma_cm ids for the stats endpoint (`roce_verbs::endpoint::set_cm_id_source`):
    /// `cb(out, cap)` writes the ids as a JSON array (UTF-8, no NUL) into `out` when it fits in `cap` bytes and
    /// returns the length it needs either way. Answers 0.
    pub set_cm_ids: unsafe extern "C" fn(cb: CmIdsFn) -> c_int,
}

/// The callback of `set_cm_ids`.
pub type CmIdsFn = unsafe extern "C" fn(out: *mut u8, cap: usize) -> usize;

#[derive(Default)]
struct Handles {
    next: u64,
    cms: HashMap<usize, ConnectionManager>,
    conns: HashMap<u64, ConnId>,
    conn_handles: HashMap<ConnId, u64>,
    listens: HashMap<u64, ListenId>,
    listen_handles: HashMap<ListenId, u64>,
}

static HANDLES: Mutex<Option<Handles>> = Mutex::new(None);

fn handles() -> MutexGuard<'static, Option<Handles>> {
    HANDLES.lock().unwrap_or_else(|p| p.into_inner())
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
    guard(
        "rocev2_private_v1.stop_listen",
        || -libc::EIO,
        || {
            let cm = match cm(ctx) {
                Ok(c) => c,
                Err(e) => return e,
            };
            let Some(l) = with(|t| {
                let l = t.listens.remove(&listen)?;
                t.listen_handles.remove(&l);
                Some(l)
            }) else {
                return -libc::EINVAL;
            };
            cm.stop_listen(l).map_or_else(|e| err(&e), |()| 0)
        },
    )
}

unsafe extern "C" fn bridge_connect(
    ctx: *mut IbvContext,
    req: *const ConnectC,
    out: *mut u64,
    out_psn: *mut u32,
) -> c_int {
    guard(
        "rocev2_private_v1.connect",
        || -libc::EIO,
        || {
            let cm = match cm(ctx) {
                Ok(c) => c,
                Err(e) => return e,
            };
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
        },
    )
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
    guard(
        "rocev2_private_v1.accept",
        || -libc::EIO,
        || {
            let (cm, id) = match (cm(ctx), conn(conn_h)) {
                (Ok(c), Ok(i)) => (c, i),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            let opts = ConnectOpts {
                rd_atomic,
                rnr_retry: rnr_retry_count,
                ..ConnectOpts::default()
            };
            // SAFETY: the caller's private data is `private_len` readable bytes.
            let pd = unsafe { bytes(private_data, private_len) };
            cm.accept_qpn(id, Qpn::new(qpn), Psn::new(psn), pd, &opts)
                .map_or_else(|e| err(&e), |()| 0)
        },
    )
}

unsafe extern "C" fn bridge_reject(
    ctx: *mut IbvContext,
    conn_h: u64,
    private_data: *const u8,
    private_len: u32,
) -> c_int {
    guard(
        "rocev2_private_v1.reject",
        || -libc::EIO,
        || {
            let (cm, id) = match (cm(ctx), conn(conn_h)) {
                (Ok(c), Ok(i)) => (c, i),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            // SAFETY: the caller's private data is `private_len` readable bytes.
            let pd = unsafe { bytes(private_data, private_len) };
            match cm.reject(id, pd) {
                Ok(()) => {
                    forget_conn(id);
                    0
                }
                Err(e) => err(&e),
            }
        },
    )
}

unsafe extern "C" fn bridge_establish(ctx: *mut IbvContext, conn_h: u64) -> c_int {
    guard(
        "rocev2_private_v1.establish",
        || -libc::EIO,
        || {
            let (cm, id) = match (cm(ctx), conn(conn_h)) {
                (Ok(c), Ok(i)) => (c, i),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            cm.establish(id).map_or_else(|e| err(&e), |()| 0)
        },
    )
}

unsafe extern "C" fn bridge_disconnect(ctx: *mut IbvContext, conn_h: u64) -> c_int {
    guard(
        "rocev2_private_v1.disconnect",
        || -libc::EIO,
        || {
            let (cm, id) = match (cm(ctx), conn(conn_h)) {
                (Ok(c), Ok(i)) => (c, i),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            cm.disconnect(id).map_or_else(|e| err(&e), |()| 0)
        },
    )
}

unsafe extern "C" fn bridge_sidr_resolve(
    ctx: *mut IbvContext,
    dgid: *const [u8; 16],
    service_id: u64,
    private_data: *const u8,
    private_len: u32,
    out: *mut u64,
) -> c_int {
    guard(
        "rocev2_private_v1.sidr_resolve",
        || -libc::EIO,
        || {
            let cm = match cm(ctx) {
                Ok(c) => c,
                Err(e) => return e,
            };
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
        },
    )
}

unsafe extern "C" fn bridge_sidr_accept(
    ctx: *mut IbvContext,
    conn_h: u64,
    qpn: u32,
    qkey: u32,
    private_data: *const u8,
    private_len: u32,
) -> c_int {
    guard(
        "rocev2_private_v1.sidr_accept",
        || -libc::EIO,
        || {
            let (cm, id) = match (cm(ctx), conn(conn_h)) {
                (Ok(c), Ok(i)) => (c, i),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            // SAFETY: the caller's private data is `private_len` readable bytes.
            let pd = unsafe { bytes(private_data, private_len) };
            match cm.sidr_accept_qpn(id, Qpn::new(qpn), qkey, pd) {
                Ok(()) => {
                    forget_conn(id);
                    0
                }
                Err(e) => err(&e),
            }
        },
    )
}

unsafe extern "C" fn bridge_sidr_reject(
    ctx: *mut IbvContext,
    conn_h: u64,
    private_data: *const u8,
    private_len: u32,
) -> c_int {
    guard(
        "rocev2_private_v1.sidr_reject",
        || -libc::EIO,
        || {
            let (cm, id) = match (cm(ctx), conn(conn_h)) {
                (Ok(c), Ok(i)) => (c, i),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            // SAFETY: the caller's private data is `private_len` readable bytes.
            let pd = unsafe { bytes(private_data, private_len) };
            match cm.sidr_reject(id, pd) {
                Ok(()) => {
                    forget_conn(id);
                    0
                }
                Err(e) => err(&e),
            }
        },
    )
}

unsafe extern "C" fn bridge_destroy(ctx: *mut IbvContext, conn_h: u64) -> c_int {
    guard(
        "rocev2_private_v1.destroy",
        || -libc::EIO,
        || {
            let (cm, id) = match (cm(ctx), conn(conn_h)) {
                (Ok(c), Ok(i)) => (c, i),
                (Err(e), _) | (_, Err(e)) => return e,
            };
            forget_conn(id);
            cm.destroy(id).map_or_else(|e| err(&e), |()| 0)
        },
    )
}

unsafe extern "C" fn bridge_flush(ctx: *mut IbvContext, timeout_ms: u32) -> c_int {
    guard(
        "rocev2_private_v1.flush",
        || -libc::EIO,
        || match cm(ctx) {
            Ok(cm) => cm
                .flush(std::time::Duration::from_millis(u64::from(timeout_ms)))
                .map_or_else(|e| err(&e), c_int::from),
            Err(e) => e,
        },
    )
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

fn fill(out: &mut CmEventC, pd: &[u8]) {
    let n = pd.len().min(EVENT_PRIVATE_MAX);
    out.private_data[..n].copy_from_slice(&pd[..n]);
    out.private_len = n as u32;
}

unsafe extern "C" fn bridge_poll_event(ctx: *mut IbvContext, out: *mut CmEventC) -> c_int {
    guard(
        "rocev2_private_v1.poll_event",
        || -libc::EIO,
        || {
            let cm = match cm(ctx) {
                Ok(c) => c,
                Err(e) => return e,
            };
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
                    fill(out, &private_data);
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
                    fill(out, &private_data);
                }
                CmEvent::Established { id, private_data } => {
                    out.kind = kind::ESTABLISHED;
                    out.conn = conn_handle(id);
                    fill(out, &private_data);
                }
                CmEvent::Rejected {
                    id,
                    reason,
                    private_data,
                } => {
                    out.kind = kind::REJECTED;
                    out.conn = conn_handle(id);
                    out.status = u32::from(reason);
                    fill(out, &private_data);
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
                    fill(out, &private_data);
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
                    fill(out, &private_data);
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
                    fill(out, &private_data);
                    forget_conn(id);
                }
            }
            1
        },
    )
}

static TABLE: PrivateV1 = PrivateV1 {
    version: PRIVATE_VERSION,
    size: size_of::<PrivateV1>() as u32,
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
