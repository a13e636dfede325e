//! rdma_cm semantics over the runtime's IB CM (`docs/RDMACM.md` §3–§8; rdma-core `librdmacm/cma.c` and Linux
//! `drivers/infiniband/core/cma.c` read for the behaviour, not copied): event channels, identifiers, addresses and
//! routes, listen / connect / accept / reject / establish / disconnect, the QP moved through INIT/RTR/RTS at the
//! events librdmacm moves it, `rdma_init_qp_attr`, options and `rdma_migrate_id`.
//!
//! # UD ids (`RDMA_PS_UDP`)
//!
//! They do not connect: `rdma_connect` asks the destination port for the service's UD QP with a SIDR_REQ (IBTA
//! Vol 1 §12.11; the `cma_hdr` first in its private data), retried by the runtime's CM like a REQ. A SIDR_REP with
//! status success is ESTABLISHED with `param.ud` (AH attributes towards the peer, its QPN and Q_Key); another
//! status is UNREACHABLE with that status, no answer after the retries UNREACHABLE with `-ETIMEDOUT` (Linux
//! `cma_sidr_rep_handler`). On the listener's side a SIDR_REQ is a CONNECT_REQUEST on a new UD id; `rdma_accept`
//! answers with the id's QPN and [`RDMA_UDP_QKEY`] (no event follows), `rdma_reject` and `rdma_destroy_id` with
//! status 2. `rdma_create_qp` brings a UD QP to RTS at once (rdma-core `ucma_init_ud_qp`).
//!
//! # Events
//!
//! The runtime's CM has one event queue per device (`roce_verbs::cm`); a dispatcher thread of this library (started
//! with the first device's CM, every signal blocked) waits on its eventfd, takes each event, does what it implies
//! (the active side's RTR/RTS and RTU on a REP when the id has a QP, as librdmacm's `ucma_process_conn_resp`) and
//! queues the rdma_cm event on the channel of the id it belongs to (per-id routing: the connection and listen
//! handles map to ids; `rdma_migrate_id` changes the id's channel, events already queued stay where they are).
//! A channel's `fd` is an eventfd in semaphore mode: one count per queued event, so `poll`/`epoll`/`rpoll` see it
//! readable while an event waits, and a program's `O_NONBLOCK` makes `rdma_get_cm_event` fail with `EAGAIN`.
//! Address and route resolution answer at once but always through an event, as the kernel does.
//!
//! Events are allocated here and freed by `rdma_ack_cm_event`; private data lives in the same block.
//! `rdma_destroy_id` waits (at most [`DESTROY_WAIT`], then says so on stderr) for the acknowledgement of every event
//! `rdma_get_cm_event` handed out for the id; events still queued for it are dropped when a reader reaches them.
//!
//! # Process exit
//!
//! Linux's kernel destroys the rdma_cm ids of a process whose `/dev/infiniband/rdma_cm` descriptor closes (`ucma_close`
//! → `rdma_destroy_id` → `cm_destroy_id` in `drivers/infiniband/core/{ucma,cma,cm}.c`): an established connection
//! sends its DREQ, a request not yet answered or our own pending REQ a REJ, a listen stops. Here the ids live in
//! the process, so the library registers an `atexit` handler when it starts a device's CM ([`at_exit`]): on
//! `exit()` or a return from `main` it does that for every live id (the runtime's `destroy`, as `rdma_destroy_id`
//! without the wait for acknowledgements) and drives the devices until those MADs have left through QP 1, at most
//! [`EXIT_FLUSH`] in all. SIGTERM, SIGINT and SIGHUP, when the program left their default action, get a handler
//! that does the same on a thread of this library and then lets the signal end the process as it would have
//! ([`install_signal_ends`]). SIGKILL runs no code: the peer learns of the end when its own DREQ goes unanswered
//! after the CM's retries (DISCONNECTED, as Linux `cma.c` reports `IB_CM_DREQ_ERROR`) or when its QP's transport
//! retries run out.
//!
//! # State
//!
//! One table under one lock (control path only): ids, channels, outstanding events, connection and listen handles,
//! bound ports. A pointer not in the table is `EINVAL`, never dereferenced.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::MutexGuard;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use core::ffi::c_void;
use libc::{c_int, sockaddr, sockaddr_storage};
use roce_wire::cm::{CMA_HDR_LEN, CmaHdr, PortSpace, service_id};

use crate::abi::*;
use crate::bridge::{self, CmEventC, ConnectC, PrivateV1, kind, table};
use crate::route;

/// How long the exit handler ([`at_exit`]) waits in all for the lock and for its MADs to leave.
pub const EXIT_FLUSH: Duration = Duration::from_millis(100);
/// How long `rdma_destroy_id` waits for unacknowledged events of the id.
pub const DESTROY_WAIT: Duration = Duration::from_secs(2);
/// Private data a REQ leaves the program after the 36-byte `cma_hdr` (92 − 36; Linux `cma.c`).
pub const REQ_PRIVATE_MAX: usize = 92 - CMA_HDR_LEN;
/// REP private data (IBTA Vol 1 §12.6.8).
pub const REP_PRIVATE_MAX: usize = 196;
/// REJ private data (IBTA Vol 1 §12.6.7).
pub const REJ_PRIVATE_MAX: usize = 148;
/// Local ACK timeout of a connected QP when neither `RDMA_OPTION_ID_ACK_TIMEOUT` nor the CM gave one (a REQ with
/// Local ACK Timeout 0; 4.096 µs · 2^14 ≈ 67 ms, the runtime's `ConnectOpts` default). Otherwise the QP takes what
/// the CM exchanged, as Linux `cm.c` does: the passive side the REQ's Local ACK Timeout (`cm_req_handler`), the
/// active side the value computed from the REP's TargetACKDelay and the REQ's packet lifetime (`cm_rep_handler`);
/// both 17 between rocev2 devices and with rxe (ACK delay 15, packet lifetime 16). docs/RDMACM.md §6.
pub const DEFAULT_ACK_TIMEOUT: u8 = 14;
/// RNR NAK timer code put in RTR (12: 0.64 ms, IBTA Vol 1 Table 45).
pub const MIN_RNR_TIMER: u8 = 12;
/// `CMA_IBOE_PACKET_LIFETIME` (Linux `cma.c`): the packet lifetime of a RoCE path record.
pub const IBOE_PACKET_LIFETIME: u8 = 16;
/// Responder resources / initiator depth when the program passes no `rdma_conn_param`.
pub const DEFAULT_RD_ATOMIC: u8 = 16;
/// `RDMA_UDP_QKEY` (`<rdma/rdma_cma.h>`, Linux `cma.c` `cma_set_qkey`): the Q_Key of rdma_cm UD QPs, announced
/// in the SIDR_REP of an `RDMA_PS_UDP` id.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;
/// Private data a SIDR_REQ leaves the program after the `cma_hdr` (216 − 36; IBTA Vol 1 §12.11.1, Linux `cma.c`).
pub const SIDR_REQ_PRIVATE_MAX: usize = 216 - CMA_HDR_LEN;
/// SIDR_REP private data (IBTA Vol 1 §12.11.2): `rdma_accept` / `rdma_reject` on a UD id.
pub const SIDR_REP_PRIVATE_MAX: usize = 136;
/// Hop limit of the address handle an `RDMA_PS_UDP` ESTABLISHED event carries (the IP TTL on RoCE v2, as the
/// path record `rdma_resolve_route` fills).
pub const UD_HOP_LIMIT: u8 = 64;

/// A device as this library uses it: one `ibv_context` per device, shared by all ids (`id->verbs`).
pub(crate) struct Dev {
    pub ctx: usize,
    pub gid: [u8; 16],
    pub ip: IpAddr,
    /// `ibv_mtu` of the port (1..=5).
    pub mtu: u8,
    /// The CM's event fd, or -1 before the CM is opened.
    pub cm_fd: c_int,
    /// The PD `rdma_create_qp` uses when given none (made on first use).
    pub pd: usize,
    /// `max_qp_rd_atom` / `max_qp_init_rd_atom` of `ibv_query_device` (at most 255): what `RDMA_MAX_RESP_RES` /
    /// `RDMA_MAX_INIT_DEPTH` stand for, and the bounds of other values (rdma-core `librdmacm/cma.c`).
    pub max_rd: u8,
    pub max_init_rd: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum St {
    Idle,
    Bound,
    AddrResolved,
    RouteResolved,
    Listening,
    Connecting,
    ConnectResponse,
    ReqRcvd,
    Accepting,
    Connected,
    Disconnected,
    Rejected,
    Failed,
}

/// What the library keeps of an id beside its public `struct rdma_cm_id`.
pub(crate) struct Id {
    pub chan: usize,
    /// The channel was made for this id (`rdma_create_id` with NULL, `rdma_create_ep`): its calls wait for their
    /// events, and the channel goes with the id.
    pub sync: bool,
    pub ps: c_int,
    pub dev: Option<usize>,
    pub st: St,
    pub src: Option<SocketAddr>,
    pub dst: Option<SocketAddr>,
    pub listen: Option<u64>,
    pub conn: Option<u64>,
    pub active: bool,
    pub local_psn: u32,
    pub remote_qpn: u32,
    pub remote_psn: u32,
    pub mtu: u8,
    /// Our responder resources (the QP's `max_dest_rd_atomic`).
    pub responder_resources: u8,
    /// Our initiator depth (the QP's `max_rd_atomic`).
    pub initiator_depth: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub timeout: u8,
    pub tos: u8,
    pub ack_timeout: Option<u8>,
    pub reuseaddr: bool,
    pub unacked: u32,
    pub path: Box<IbvSaPathRec>,
    /// The CQs and channels were made by `rdma_create_qp` (destroyed by `rdma_destroy_qp`).
    pub own_cqs: bool,
    /// `rdma_create_ep` on a passive endpoint: the QP attributes (and PD) for each `rdma_get_request`.
    pub ep_qp: Option<EpQp>,
    /// The QPN of the id's QP (`rdma_create_qp`) or of the one its `rdma_connect` / `rdma_accept` named: what
    /// `rocev2 stat` shows as lqpn (recorded, so the stats reader never reads a QP the program may have freed).
    pub lqpn: Option<u32>,
}

impl Id {
    /// A UD id (`RDMA_PS_UDP`, `RDMA_PS_IPOIB`): it resolves the peer's QP with SIDR instead of connecting.
    pub(crate) fn ud(&self) -> bool {
        is_ud(self.ps)
    }

    /// Whether the peer's QPN and PSN are known (a request received, or a REP): RTR and RTS attributes exist.
    fn knows_peer(&self) -> bool {
        matches!(
            self.st,
            St::ConnectResponse | St::ReqRcvd | St::Accepting | St::Connected
        )
    }
}

/// The QP attributes and PD (`ibv_pd *`) a passive `rdma_create_ep` keeps for `rdma_get_request`.
#[derive(Clone, Copy)]
pub(crate) struct EpQp(pub IbvQpInitAttr, pub usize);

// SAFETY: the pointers in the attributes (CQs, SRQ, context) are the program's handles, only passed back to
// libibverbs (whose objects are thread-safe), never dereferenced here.
unsafe impl Send for EpQp {}

#[repr(C)]
pub(crate) struct EventBlock {
    pub ev: RdmaCmEvent,
    pub pdata: [u8; bridge::EVENT_PRIVATE_MAX],
}

#[derive(Default)]
pub(crate) struct State {
    pub devs: Vec<Dev>,
    pub devs_loaded: bool,
    pub ids: HashMap<usize, Id>,
    pub chans: HashMap<usize, VecDeque<usize>>,
    pub events: HashSet<usize>,
    /// Queued events of destroyed ids, freed when a reader reaches them.
    pub dead: HashSet<usize>,
    pub conns: HashMap<u64, usize>,
    pub listens: HashMap<u64, usize>,
    pub ports: HashSet<(c_int, u16)>,
    pub dispatcher: bool,
    /// Threads inside [`get_event`] per channel (a blocking read of its eventfd).
    pub waiters: HashMap<usize, u32>,
    /// Channels destroyed while threads waited on them: their fd and block are released by the last waiter to
    /// leave (closing the fd under a blocked `read` would not wake it, and a freed block's address could name a
    /// new channel).
    pub closing: HashSet<usize>,
    /// Of `closing`, the channels destroyed with `wake` (a synchronous id's private channel): their waiters return
    /// `ECANCELED`; the waiters of a channel the program destroyed stay blocked ([`destroy_channel`]).
    pub cancelled: HashSet<usize>,
    /// The multicast joins of each id (`crate::mcast`).
    pub mcast: HashMap<usize, Vec<crate::mcast::Mc>>,
}

/// Each process has its own (`roce_fork`): the dispatcher thread takes this lock, and a child forked while it held
/// it would otherwise wait for ever at its first rdma_cm call.
static STATE: roce_fork::ForkLocal<Option<State>> = roce_fork::ForkLocal::new(|| None);

pub(crate) struct Guard(MutexGuard<'static, Option<State>>);

impl core::ops::Deref for Guard {
    type Target = State;
    fn deref(&self) -> &State {
        self.0.as_ref().expect("initialised in lock()")
    }
}

impl core::ops::DerefMut for Guard {
    fn deref_mut(&mut self) -> &mut State {
        self.0.as_mut().expect("initialised in lock()")
    }
}

pub(crate) fn lock() -> Guard {
    // A forked child starts from `None` (the parent's ids, channels and contexts are leaked with the parent's lock,
    // never freed or closed: their teardown would wait for the parent's threads, which do not exist here).
    let mut g = STATE.lock();
    if g.is_none() {
        *g = Some(State::default());
    }
    Guard(g)
}

pub(crate) type R<T> = Result<T, c_int>;

/// The port spaces whose ids are UD (librdmacm `rdma_create_id`: `RDMA_PS_UDP` and `RDMA_PS_IPOIB`).
pub(crate) fn is_ud(ps: c_int) -> bool {
    ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

pub(crate) fn random_u32() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: writes at most 4 bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 4, 0) };
    if n != 4 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        return t ^ std::process::id().rotate_left(16);
    }
    u32::from_ne_bytes(b)
}

// ---------------------------------------------------------------------------------------------------------------
// Addresses

/// The address a program passed (`AF_INET` / `AF_INET6`).
///
/// # Safety
/// `p` is NULL or points at a `sockaddr` of its family's size.
pub(crate) unsafe fn parse_sockaddr(p: *const sockaddr) -> R<SocketAddr> {
    if p.is_null() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract, the family field is readable.
    let family = c_int::from(unsafe { (*p).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let s = unsafe { &*p.cast::<libc::sockaddr_in>() };
            Ok(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr))),
                u16::from_be(s.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let s = unsafe { &*p.cast::<libc::sockaddr_in6>() };
            Ok(SocketAddr::new(
                IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
                u16::from_be(s.sin6_port),
            ))
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// Writes `a` as a `sockaddr_in` / `sockaddr_in6` into `out`; returns its length.
pub(crate) fn write_sockaddr(out: &mut sockaddr_storage, a: SocketAddr) -> u32 {
    // SAFETY: all-zero is a valid sockaddr_storage.
    *out = unsafe { core::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let s = unsafe { &mut *(out as *mut sockaddr_storage).cast::<libc::sockaddr_in>() };
            s.sin_family = libc::AF_INET as libc::sa_family_t;
            s.sin_port = v4.port().to_be();
            s.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            size_of::<libc::sockaddr_in>() as u32
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let s = unsafe { &mut *(out as *mut sockaddr_storage).cast::<libc::sockaddr_in6>() };
            s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            s.sin6_port = v6.port().to_be();
            s.sin6_addr.s6_addr = v6.ip().octets();
            size_of::<libc::sockaddr_in6>() as u32
        }
    }
}

/// The GID of an IP address (IPv4-mapped for IPv4; `docs/spec/ROCEV2.md`, RoCE v2 GIDs).
pub(crate) fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// The GID a path towards `ip` carries from device `dev`: the GID of `ip`, except for the loopback alias. The
/// loopback netdev's own address, 127.0.0.1 (`::1` for IPv6), stands for a device on another loopback address,
/// as it stands for an rxe device on `lo` whose GID table holds it (pyverbs' rdmacm tests connect through it, issues
/// #16/#17): towards it, the DGID is the device's own GID, so the REQ, the other CM MADs and the data path go to
/// the device's own address, where QP 1 steering (`docs/MULTIPROCESS.md`) hands the REQ to the process that
/// listens. The alias holds only while no other device owns the address: when a socket of this network namespace
/// is bound to UDP 4791 on 127.0.0.1 (`::1`) — another rocev2 process's device there (`route::udp_bound`) — the
/// address is that device's, a remote peer like any other (issue #17: `rping -c -a 127.0.0.1` under
/// `rocev2 run --ip 127.0.0.2` towards a server under `--ip 127.0.0.1`, README's one-host layout). A device that
/// is itself on 127.0.0.1 (or whose process also opened a device there) takes the address as is. `cma_hdr` and
/// the `rdma_cm_id` addresses keep what the program named (Linux `cma.c` puts the program's addresses there).
fn path_gid(st: &State, dev: usize, ip: IpAddr) -> [u8; 16] {
    let d = &st.devs[dev];
    let alias = match ip {
        IpAddr::V4(v4) => v4 == Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => v6 == Ipv6Addr::LOCALHOST,
    };
    if alias
        && d.ip.is_loopback()
        && !st.devs.iter().any(|o| o.ip == ip)
        && !route::udp_bound(SocketAddr::new(ip, roce_wire::udp::ROCE_V2_PORT))
    {
        d.gid
    } else {
        gid_of(ip)
    }
}

fn ip_of_gid(g: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(g);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Devices

/// Opens every device once (`ibv_get_device_list` / `ibv_open_device` of the loaded libibverbs).
pub(crate) fn load_devices(st: &mut State) {
    if st.devs_loaded {
        return;
    }
    st.devs_loaded = true;
    let mut n: c_int = 0;
    // SAFETY: libibverbs calls with valid out-pointers; the list is freed after the contexts are opened.
    unsafe {
        let list = bridge::ibv_get_device_list(&mut n);
        if list.is_null() {
            return;
        }
        for i in 0..usize::try_from(n).unwrap_or(0) {
            let ctx = bridge::ibv_open_device(*list.add(i));
            if ctx.is_null() {
                continue;
            }
            let mut gid = [0u8; 16];
            if bridge::ibv_query_gid(ctx, 1, 0, &mut gid) != 0 {
                continue;
            }
            let mut pa: IbvPortAttr = core::mem::zeroed();
            let mtu = if bridge::ibv_query_port(ctx, 1, &mut pa) == 0
                && (1..=5).contains(&pa.active_mtu)
            {
                pa.active_mtu as u8
            } else {
                3
            };
            let mut da: IbvDeviceAttr = core::mem::zeroed();
            let (max_rd, max_init_rd) = if bridge::ibv_query_device(ctx, &mut da) == 0 {
                let clamp = |v: c_int| v.clamp(0, 255) as u8;
                (clamp(da.max_qp_rd_atom), clamp(da.max_qp_init_rd_atom))
            } else {
                (DEFAULT_RD_ATOMIC, DEFAULT_RD_ATOMIC)
            };
            st.devs.push(Dev {
                ctx: ctx as usize,
                gid,
                ip: ip_of_gid(gid),
                mtu,
                cm_fd: -1,
                pd: 0,
                max_rd,
                max_init_rd,
            });
        }
        bridge::ibv_free_device_list(list);
    }
}

/// The device with address `ip`; with one device, an unknown `ip` also names it when `fallback`.
fn find_dev(st: &mut State, ip: IpAddr, fallback: bool) -> R<usize> {
    load_devices(st);
    if let Some(i) = st.devs.iter().position(|d| d.ip == ip) {
        return Ok(i);
    }
    if st.devs.len() == 1 && fallback {
        return Ok(0);
    }
    Err(if st.devs.is_empty() {
        libc::ENODEV
    } else {
        libc::EADDRNOTAVAIL
    })
}

/// Opens the device's CM (starting the runtime) and the dispatcher thread.
pub(crate) fn ensure_cm(st: &mut State, dev: usize) -> R<&'static PrivateV1> {
    let t = table().ok_or(libc::ENODEV)?;
    if st.devs[dev].cm_fd < 0 {
        // SAFETY: a context this library opened.
        let fd = unsafe { (t.open)(st.devs[dev].ctx as *mut IbvContext) };
        if fd < 0 {
            return Err(-fd);
        }
        st.devs[dev].cm_fd = fd;
    }
    if !st.dispatcher {
        start_dispatcher()?;
        st.dispatcher = true;
        // SAFETY: registers a handler with C linkage that takes no arguments; it runs once, at `exit`.
        if unsafe { libc::atexit(at_exit) } != 0 {
            eprintln!(
                "rocev2 librdmacm: atexit failed: connected ids send no DREQ at process exit"
            );
        }
        install_signal_ends();
        // SAFETY: `cm_ids_json` writes at most `cap` bytes to `out`, as the table's contract says.
        unsafe { (t.set_cm_ids)(cm_ids_json) };
    }
    Ok(t)
}

/// The rdma_cm state name of an id as Linux's `enum rdma_cm_state` (`cma_priv.h`) and `rdma resource show cm_id`
/// (iproute2 `rdma/res-cmid.c`) spell it: a connection is CONNECT from the request until a disconnect.
fn state_name(st: St) -> &'static str {
    match st {
        St::Idle => "IDLE",
        St::Bound => "ADDR_BOUND",
        St::AddrResolved => "ADDR_RESOLVED",
        St::RouteResolved => "ROUTE_RESOLVED",
        St::Listening => "LISTEN",
        St::Connecting
        | St::ConnectResponse
        | St::ReqRcvd
        | St::Accepting
        | St::Connected
        | St::Rejected
        | St::Failed => "CONNECT",
        St::Disconnected => "DISCONNECT",
    }
}

fn ps_name(ps: c_int) -> &'static str {
    match ps {
        RDMA_PS_TCP => "TCP",
        RDMA_PS_UDP => "UDP",
        RDMA_PS_IB => "IB",
        RDMA_PS_IPOIB => "IPOIB",
        _ => "?",
    }
}

/// The ids of this process as a JSON array (`roce_verbs::endpoint`'s `cm_ids`: dev, state, ps, qp_type, lqpn, src,
/// dst), in the order the ids were made.
pub(crate) fn cm_ids_text(st: &State) -> String {
    use std::fmt::Write as _;
    let addr = |a: Option<SocketAddr>| a.map_or_else(|| "null".to_owned(), |a| format!("\"{a}\""));
    let mut ids: Vec<(&usize, &Id)> = st.ids.iter().collect();
    ids.sort_by_key(|(k, _)| **k);
    let mut o = String::from("[");
    for (n, (&key, i)) in ids.into_iter().enumerate() {
        // SAFETY: an id in the table is a live block (this library's allocation).
        let qp_type = unsafe { (*(key as *const RdmaCmId)).qp_type };
        let lqpn = i.lqpn.map_or_else(|| "null".to_owned(), |q| q.to_string());
        let qt = match qp_type {
            2 => "\"RC\"",
            3 => "\"UC\"",
            4 => "\"UD\"",
            _ => "null",
        };
        let _ = write!(
            o,
            "{}{{\"dev\":{},\"state\":\"{}\",\"ps\":\"{}\",\"qp_type\":{qt},\"lqpn\":{lqpn},\"src\":{},\"dst\":{}}}",
            if n > 0 { "," } else { "" },
            i.dev.map_or_else(|| "null".to_owned(), |d| d.to_string()),
            state_name(i.st),
            ps_name(i.ps),
            addr(i.src),
            addr(i.dst),
        );
    }
    o.push(']');
    o
}

/// `rocev2_private_v1.set_cm_ids`' callback (called on the stats endpoint's thread): [`cm_ids_text`] into `out` when
/// it fits in `cap` bytes; the length it needs either way (0 after a panic: an empty answer, which is left out).
unsafe extern "C" fn cm_ids_json(out: *mut u8, cap: usize) -> usize {
    std::panic::catch_unwind(|| {
        let text = cm_ids_text(&lock());
        if text.len() <= cap && !out.is_null() {
            // SAFETY: the caller gives `cap` writable bytes at `out`.
            unsafe { core::ptr::copy_nonoverlapping(text.as_ptr(), out, text.len()) };
        }
        text.len()
    })
    .unwrap_or(0)
}

/// The signals whose default action ends the process and that a program commonly gets (`kill`, Ctrl-C, a closed
/// terminal): [`install_signal_ends`] handles those the program left at the default.
const ENDING_SIGNALS: [c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// The pipe a signal handler writes to (the ender thread reads it), the one the ender answers on, and the pid that
/// installed them (a forked child has neither the thread nor the ids: its handler only re-raises).
static END_REQ_W: AtomicI32 = AtomicI32::new(-1);
static END_DONE_R: AtomicI32 = AtomicI32::new(-1);
static END_PID: AtomicI32 = AtomicI32::new(0);

/// For each of [`ENDING_SIGNALS`] still at its default action (the program installed no handler and does not
/// ignore it): a handler that has a thread of this library end every id as the `atexit` handler does (at most
/// [`EXIT_FLUSH`], waited for at most 300 ms), then restores the default action and raises the signal again, so the
/// process still ends by that signal (its exit status unchanged). A handler the program installs later replaces
/// ours, as it would replace the default. Installed once, when the library starts its first CM.
fn install_signal_ends() {
    let mut req = [0 as c_int; 2];
    let mut done = [0 as c_int; 2];
    // SAFETY: `pipe2` writes two descriptors into each array.
    if unsafe { libc::pipe2(req.as_mut_ptr(), libc::O_CLOEXEC) } != 0
        || unsafe { libc::pipe2(done.as_mut_ptr(), libc::O_CLOEXEC) } != 0
    {
        return;
    }
    let (req_r, done_w) = (req[0], done[1]);
    if spawn_quiet("rocev2-rdmacm-end", move || ender(req_r, done_w)).is_err() {
        return;
    }
    END_REQ_W.store(req[1], Ordering::SeqCst);
    END_DONE_R.store(done[0], Ordering::SeqCst);
    // SAFETY: getpid has no preconditions.
    END_PID.store(unsafe { libc::getpid() }, Ordering::SeqCst);
    for sig in ENDING_SIGNALS {
        // SAFETY: sigaction with a zeroed (valid) struct; the handler is an `extern "C" fn(c_int)`.
        unsafe {
            let mut old: libc::sigaction = core::mem::zeroed();
            if libc::sigaction(sig, core::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                continue;
            }
            let mut sa: libc::sigaction = core::mem::zeroed();
            sa.sa_sigaction = on_ending_signal as extern "C" fn(c_int) as usize;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigfillset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, core::ptr::null_mut());
        }
    }
}

/// The thread that ends the ids for a signal handler: one byte in on `req_r` per signal, one byte out on `done_w`
/// when the ids are ended.
fn ender(req_r: c_int, done_w: c_int) {
    let mut b = [0u8; 1];
    // SAFETY (both): a one-byte buffer on descriptors `install_signal_ends` made and never closes.
    while unsafe { libc::read(req_r, b.as_mut_ptr().cast(), 1) } == 1 {
        let _ = std::panic::catch_unwind(|| end_all_ids(EXIT_FLUSH));
        unsafe { libc::write(done_w, b.as_ptr().cast(), 1) };
    }
}

/// The handler of [`install_signal_ends`]: only async-signal-safe calls (`write`, `poll`, `read`, `sigaction`,
/// `raise`, `getpid`). The raised signal stays pending while the handler runs (it is blocked in it) and ends the
/// process with the default action as the handler returns.
extern "C" fn on_ending_signal(sig: c_int) {
    // SAFETY: async-signal-safe calls on descriptors made by `install_signal_ends` (or -1, then skipped); errno is
    // saved and restored around them.
    unsafe {
        let errno = *libc::__errno_location();
        let (w, r) = (
            END_REQ_W.load(Ordering::SeqCst),
            END_DONE_R.load(Ordering::SeqCst),
        );
        if w >= 0 && r >= 0 && libc::getpid() == END_PID.load(Ordering::SeqCst) {
            let b = [sig as u8];
            if libc::write(w, b.as_ptr().cast(), 1) == 1 {
                let mut p = libc::pollfd {
                    fd: r,
                    events: libc::POLLIN,
                    revents: 0,
                };
                if libc::poll(&mut p, 1, 300) == 1 {
                    let mut d = [0u8; 1];
                    libc::read(r, d.as_mut_ptr().cast(), 1);
                }
            }
        }
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &sa, core::ptr::null_mut());
        libc::raise(sig);
        *libc::__errno_location() = errno;
    }
}

/// The `atexit` handler (module docs, "Process exit"): every live id ends as `rdma_destroy_id` would end it —
/// listens stop, connections send what Linux `cm_destroy_id` sends (DREQ, REJ) — and each device is driven until
/// those MADs have left, at most [`EXIT_FLUSH`] in all. The ids themselves are not freed (the process is ending;
/// other threads may still hold them). Never unwinds into C.
extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| end_all_ids(EXIT_FLUSH));
}

fn end_all_ids(budget: Duration) {
    let deadline = Instant::now() + budget;
    let Some(t) = table() else { return };
    // Another thread may hold the lock (a program thread in a call): wait for it within the budget only.
    let mut guard = loop {
        match STATE.get().try_lock() {
            Ok(g) => break g,
            Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(std::sync::TryLockError::WouldBlock) => return,
        }
    };
    let Some(st) = guard.as_mut() else { return };
    let mut used = HashSet::new();
    for i in st.ids.values_mut() {
        let Some(dev) = i.dev.or(if st.devs.is_empty() { None } else { Some(0) }) else {
            continue;
        };
        let ctx = st.devs[dev].ctx as *mut IbvContext;
        // SAFETY (both): a context this library opened; the handles are this library's.
        if let Some(h) = i.listen.take() {
            unsafe { (t.stop_listen)(ctx, h) };
        }
        if let Some(h) = i.conn.take() {
            unsafe { (t.destroy)(ctx, h) };
            used.insert(st.devs[dev].ctx);
        }
    }
    st.listens.clear();
    st.conns.clear();
    // The dispatcher thread may need the lock while the devices are driven.
    drop(guard);
    for ctx in used {
        let left = deadline.saturating_duration_since(Instant::now());
        // SAFETY: a context this library opened.
        unsafe { (t.flush)(ctx as *mut IbvContext, left.as_millis() as u32) };
    }
}

fn start_dispatcher() -> R<()> {
    spawn_quiet("rocev2-rdmacm", dispatch_loop)
        .map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))
}

/// Spawns one of the library's threads with every asynchronous signal blocked, so the program's handlers run on the
/// program's own threads (as with the kernel's librdmacm, which starts none). The synchronous signals (SIGSEGV,
/// SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) stay unblocked: a thread that faults with its signal blocked ends the
/// process whatever handler is installed (signal(7)); libibverbs' runtime threads follow the same rule.
fn spawn_quiet(name: &str, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    // SAFETY: sigset operations on local, initialised sets (`sigfillset` initialises `all`; `old` is written by
    // `pthread_sigmask` before it is read back).
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
            libc::SIGSYS,
        ] {
            libc::sigdelset(&mut all, sig);
        }
        // SIG_SETMASK, not SIG_BLOCK: the synchronous signals are unblocked even when the calling thread blocks them.
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let r = std::thread::Builder::new().name(name.into()).spawn(f);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut());
        r.map(|_| ())
    }
}

fn dispatch_loop() {
    let Some(t) = table() else { return };
    loop {
        let devs: Vec<(usize, usize, c_int)> = lock()
            .devs
            .iter()
            .enumerate()
            .filter(|(_, d)| d.cm_fd >= 0)
            .map(|(i, d)| (i, d.ctx, d.cm_fd))
            .collect();
        let mut pfds: Vec<libc::pollfd> = devs
            .iter()
            .map(|&(_, _, fd)| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `pfds` is a valid array of its length. A timeout bounds the wait for devices opened meanwhile.
        unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, 50) };
        for &(dev, ctx, _) in &devs {
            loop {
                let mut ev = CmEventC::zeroed();
                // SAFETY: a context this library opened; `ev` is writable.
                let r = unsafe { (t.poll_event)(ctx as *mut IbvContext, &mut ev) };
                if r != 1 {
                    break;
                }
                let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    handle(&mut lock(), t, dev, &ev);
                }));
                if res.is_err() {
                    eprintln!(
                        "rocev2 librdmacm: an event could not be handled (kind {})",
                        ev.kind
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Events

/// Queues an event for `id` on its channel (one eventfd count).
pub(crate) fn push_event(
    st: &mut State,
    id: usize,
    listen: usize,
    event: c_int,
    status: c_int,
    param: Option<RdmaConnParam>,
    pdata: &[u8],
) {
    push_event_with(st, id, listen, event, status, param, pdata, |_| {});
}

/// [`push_event`], then `more` fills the rest of the event (the `param.ud` of a UD id).
#[allow(clippy::too_many_arguments)]
pub(crate) fn push_event_with(
    st: &mut State,
    id: usize,
    listen: usize,
    event: c_int,
    status: c_int,
    param: Option<RdmaConnParam>,
    pdata: &[u8],
    more: impl FnOnce(&mut RdmaCmEvent),
) {
    let Some(chan) = st.ids.get(&id).map(|i| i.chan) else {
        return;
    };
    // SAFETY: zero is a valid value of every field (NULL pointers, zero integers).
    let mut b: Box<EventBlock> = Box::new(unsafe { core::mem::zeroed() });
    b.ev.id = id as *mut RdmaCmId;
    b.ev.listen_id = listen as *mut RdmaCmId;
    b.ev.event = event;
    b.ev.status = status;
    if let Some(p) = param {
        b.ev.conn = p;
    }
    let n = pdata.len().min(b.pdata.len());
    b.pdata[..n].copy_from_slice(&pdata[..n]);
    b.ev.conn.private_data_len = n as u8;
    b.ev.conn.private_data = if n > 0 {
        b.pdata.as_ptr().cast()
    } else {
        core::ptr::null()
    };
    more(&mut b.ev);
    let p = Box::into_raw(b) as usize;
    let Some(q) = st.chans.get_mut(&chan) else {
        // SAFETY: just made by Box::into_raw.
        drop(unsafe { Box::from_raw(p as *mut EventBlock) });
        return;
    };
    q.push_back(p);
    let one: u64 = 1;
    // SAFETY: `chan` is a live channel block; writing 8 bytes to its eventfd.
    unsafe {
        let fd = (*(chan as *mut RdmaEventChannel)).fd;
        libc::write(fd, (&raw const one).cast(), 8);
    }
}

fn conn_param(
    responder_resources: u8,
    initiator_depth: u8,
    ev: &CmEventC,
    qpn: u32,
) -> RdmaConnParam {
    RdmaConnParam {
        private_data: core::ptr::null(),
        private_data_len: 0,
        responder_resources,
        initiator_depth,
        flow_control: 1,
        retry_count: ev.retry_count,
        rnr_retry_count: ev.rnr_retry_count,
        srq: 0,
        qp_num: qpn & 0x00ff_ffff,
    }
}

/// One CM event from the runtime into the rdma_cm event of its id (module docs).
fn handle(st: &mut State, t: &PrivateV1, dev: usize, ev: &CmEventC) {
    let ctx = st.devs[dev].ctx as *mut IbvContext;
    // SAFETY (every call of `t` below): `ctx` is a context this library opened; buffers are valid for their lengths.
    let reject = |conn: u64| unsafe {
        (t.reject)(ctx, conn, core::ptr::null(), 0);
    };
    let sidr_reject = |conn: u64| unsafe {
        (t.sidr_reject)(ctx, conn, core::ptr::null(), 0);
    };
    match ev.kind {
        kind::CONNECT_REQUEST => {
            let Some(&lid) = st.listens.get(&ev.listen) else {
                return reject(ev.conn);
            };
            // A REQ connects RC/UC QPs: a UD listener refuses it (Linux `cma_ib_check_req_qp_type`).
            if st.ids[&lid].ud() {
                return reject(ev.conn);
            }
            let pd = ev.private();
            let Ok(hdr) = CmaHdr::parse(pd) else {
                return reject(ev.conn);
            };
            let (lchan, lps, lsrc) = {
                let l = &st.ids[&lid];
                (l.chan, l.ps, l.src)
            };
            // A listen on an address takes only requests for it (Linux `cma_find_listener`).
            if let Some(src) = lsrc
                && !src.ip().is_unspecified()
                && src.ip() != hdr.dst_addr
            {
                return reject(ev.conn);
            }
            let lport = lsrc.map_or(0, |s| s.port());
            // SAFETY: `lid` is a live id.
            let lctx = unsafe { (*(lid as *mut RdmaCmId)).context };
            let child = new_id(st, lchan, false, lctx, lps);
            let d = &st.devs[dev];
            let (dgid, mtu) = (ev.peer_gid, d.mtu.min(ev.path_mtu.max(1)));
            let src = SocketAddr::new(hdr.dst_addr, lport);
            let dst = SocketAddr::new(hdr.src_addr, hdr.src_port);
            {
                let c = st.ids.get_mut(&child).expect("just made");
                c.dev = Some(dev);
                c.src = Some(src);
                c.dst = Some(dst);
                c.st = St::ReqRcvd;
                c.conn = Some(ev.conn);
                c.remote_qpn = ev.remote_qpn;
                c.remote_psn = ev.remote_psn;
                c.mtu = mtu;
                // What the requester offers as responder is our initiator depth at most, and the reverse (the
                // event's parameters are the receiver's view: Linux `cm_format_req_event`).
                c.responder_resources = ev.initiator_depth;
                c.initiator_depth = ev.responder_resources;
                c.retry_count = ev.retry_count;
                c.rnr_retry_count = ev.rnr_retry_count;
                c.timeout = if ev.local_ack_timeout == 0 {
                    DEFAULT_ACK_TIMEOUT
                } else {
                    ev.local_ack_timeout
                };
                c.tos = ev.traffic_class;
                c.local_psn = random_u32() & 0x00ff_ffff;
            }
            fill_route(st, child, dev, Some(src), Some(dst), Some(dgid));
            st.conns.insert(ev.conn, child);
            let p = conn_param(
                ev.initiator_depth,
                ev.responder_resources,
                ev,
                ev.remote_qpn,
            );
            let app = pd.get(CMA_HDR_LEN..).unwrap_or(&[]);
            push_event(st, child, lid, EV_CONNECT_REQUEST, 0, Some(p), app);
        }
        kind::SIDR_REQUEST => sidr_request(st, dev, ev).unwrap_or_else(|()| sidr_reject(ev.conn)),
        kind::SIDR_RESOLVED => {
            let Some(id) = st.conns.remove(&ev.conn) else {
                return;
            };
            let i = st.ids.get_mut(&id).expect("mapped ids are live");
            i.st = St::Connected;
            i.conn = None;
            i.remote_qpn = ev.remote_qpn & 0x00ff_ffff;
            // Linux `cma_sidr_rep_handler`: the AH from the id's path (`ib_init_ah_attr_from_path`), the REP's
            // QPN and Q_Key. The AH attributes are what our `ibv_create_ah` takes (global, port 1).
            let ah = IbvAhAttr {
                grh: IbvGlobalRoute {
                    dgid: ev.peer_gid,
                    flow_label: 0,
                    sgid_index: 0,
                    hop_limit: UD_HOP_LIMIT,
                    traffic_class: i.tos,
                },
                is_global: 1,
                port_num: 1,
                ..IbvAhAttr::default()
            };
            let (qpn, qkey) = (ev.remote_qpn & 0x00ff_ffff, ev.qkey);
            push_event_with(st, id, 0, EV_ESTABLISHED, 0, None, ev.private(), |e| {
                let ud = e.ud_mut();
                ud.ah_attr = ah;
                ud.qp_num = qpn;
                ud.qkey = qkey;
            });
        }
        kind::SIDR_REJECTED => {
            let Some(id) = st.conns.remove(&ev.conn) else {
                return;
            };
            let i = st.ids.get_mut(&id).expect("mapped ids are live");
            i.st = St::Failed;
            i.conn = None;
            // Linux `cma_sidr_rep_handler`: UNREACHABLE with the SIDR_REP's status (1 no such service, 2
            // rejected, ...), its private data in `param.ud`.
            push_event(
                st,
                id,
                0,
                EV_UNREACHABLE,
                ev.status as c_int,
                None,
                ev.private(),
            );
        }
        kind::CONNECT_RESPONSE => {
            let Some(&id) = st.conns.get(&ev.conn) else {
                return;
            };
            let qp = {
                let i = st.ids.get_mut(&id).expect("mapped ids are live");
                i.remote_qpn = ev.remote_qpn;
                i.remote_psn = ev.remote_psn;
                i.initiator_depth = i.initiator_depth.min(ev.responder_resources);
                i.rnr_retry_count = ev.rnr_retry_count;
                // The QP's ACK timeout from the REP (Linux `cm_rep_handler`); the option still overrides it at RTS.
                if ev.local_ack_timeout != 0 {
                    i.timeout = ev.local_ack_timeout;
                }
                // SAFETY: `id` is a live id.
                unsafe { (*(id as *mut RdmaCmId)).qp }
            };
            let p = conn_param(
                ev.initiator_depth,
                ev.responder_resources,
                ev,
                ev.remote_qpn,
            );
            if qp.is_null() {
                st.ids.get_mut(&id).expect("live").st = St::ConnectResponse;
                push_event(st, id, 0, EV_CONNECT_RESPONSE, 0, Some(p), ev.private());
                return;
            }
            // The peer is known from here on (RTR/RTS attributes exist).
            st.ids.get_mut(&id).expect("live").st = St::ConnectResponse;
            let r = modify_to_rts(st, id, qp);
            let r = r.and_then(|()| {
                // SAFETY: see above.
                let e = unsafe { (t.establish)(ctx, ev.conn) };
                if e < 0 { Err(-e) } else { Ok(()) }
            });
            match r {
                Ok(()) => {
                    st.ids.get_mut(&id).expect("live").st = St::Connected;
                    push_event(st, id, 0, EV_ESTABLISHED, 0, Some(p), ev.private());
                }
                Err(e) => {
                    reject(ev.conn);
                    st.conns.remove(&ev.conn);
                    let i = st.ids.get_mut(&id).expect("live");
                    i.st = St::Failed;
                    i.conn = None;
                    push_event(st, id, 0, EV_CONNECT_ERROR, -e, None, &[]);
                }
            }
        }
        kind::ESTABLISHED => {
            let Some(&id) = st.conns.get(&ev.conn) else {
                return;
            };
            let i = st.ids.get_mut(&id).expect("live");
            // The active side reported its ESTABLISHED (or CONNECT_RESPONSE) when it sent the RTU.
            if i.active {
                return;
            }
            i.st = St::Connected;
            let p = RdmaConnParam {
                responder_resources: i.responder_resources,
                initiator_depth: i.initiator_depth,
                ..conn_param(0, 0, ev, i.remote_qpn)
            };
            push_event(st, id, 0, EV_ESTABLISHED, 0, Some(p), &[]);
        }
        kind::REJECTED => {
            let Some(id) = st.conns.remove(&ev.conn) else {
                return;
            };
            let i = st.ids.get_mut(&id).expect("live");
            i.st = St::Rejected;
            i.conn = None;
            let p = conn_param(0, 0, ev, 0);
            push_event(
                st,
                id,
                0,
                EV_REJECTED,
                ev.status as c_int,
                Some(p),
                ev.private(),
            );
        }
        kind::DISCONNECTED => {
            let Some(&id) = st.conns.get(&ev.conn) else {
                return;
            };
            st.ids.get_mut(&id).expect("live").st = St::Disconnected;
            push_event(st, id, 0, EV_DISCONNECTED, 0, None, &[]);
        }
        kind::TIMEWAIT_EXIT => {
            let Some(id) = st.conns.remove(&ev.conn) else {
                return;
            };
            st.ids.get_mut(&id).expect("live").conn = None;
            push_event(st, id, 0, EV_TIMEWAIT_EXIT, 0, None, &[]);
        }
        kind::UNREACHABLE => {
            let Some(id) = st.conns.remove(&ev.conn) else {
                return;
            };
            let i = st.ids.get_mut(&id).expect("live");
            i.st = St::Failed;
            i.conn = None;
            push_event(st, id, 0, EV_UNREACHABLE, -libc::ETIMEDOUT, None, &[]);
        }
        _ => {}
    }
}

/// A SIDR_REQ that matched a listen: a new UD id gets `RDMA_CM_EVENT_CONNECT_REQUEST` with the program's part of
/// the private data in `param.ud` (Linux `cma_ib_req_handler` for `IB_CM_SIDR_REQ_RECEIVED`). `Err` when the
/// request is to be answered with SIDR status 2 (rejected): unknown listen, a listener that is not UD (Linux
/// `cma_ib_check_req_qp_type`), a `cma_hdr` that does not parse or names another address than the listen's.
fn sidr_request(st: &mut State, dev: usize, ev: &CmEventC) -> Result<(), ()> {
    let &lid = st.listens.get(&ev.listen).ok_or(())?;
    let (lchan, lps, lsrc) = {
        let l = &st.ids[&lid];
        (l.chan, l.ps, l.src)
    };
    if !is_ud(lps) {
        return Err(());
    }
    let pd = ev.private();
    let hdr = CmaHdr::parse(pd).map_err(|_| ())?;
    if let Some(src) = lsrc
        && !src.ip().is_unspecified()
        && src.ip() != hdr.dst_addr
    {
        return Err(());
    }
    let lport = lsrc.map_or(0, |s| s.port());
    // SAFETY: `lid` is a live id.
    let lctx = unsafe { (*(lid as *mut RdmaCmId)).context };
    let child = new_id(st, lchan, false, lctx, lps);
    let src = SocketAddr::new(hdr.dst_addr, lport);
    let dst = SocketAddr::new(hdr.src_addr, hdr.src_port);
    let mtu = st.devs[dev].mtu;
    {
        let c = st.ids.get_mut(&child).expect("just made");
        c.dev = Some(dev);
        c.src = Some(src);
        c.dst = Some(dst);
        c.st = St::ReqRcvd;
        c.conn = Some(ev.conn);
        c.mtu = mtu;
    }
    fill_route(st, child, dev, Some(src), Some(dst), Some(ev.peer_gid));
    st.conns.insert(ev.conn, child);
    let app = pd.get(CMA_HDR_LEN..).unwrap_or(&[]);
    push_event(st, child, lid, EV_CONNECT_REQUEST, 0, None, app);
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// Channels

pub(crate) fn create_channel(st: &mut State) -> R<*mut RdmaEventChannel> {
    // SAFETY: plain eventfd creation.
    let fd = unsafe { libc::eventfd(0, libc::EFD_SEMAPHORE | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(errno());
    }
    let p = Box::into_raw(Box::new(RdmaEventChannel { fd }));
    st.chans.insert(p as usize, VecDeque::new());
    Ok(p)
}

/// Destroys a channel: its queued events are freed. Threads waiting in [`get_event`] on it keep the fd and block
/// open (the last of them to leave closes and frees them); with `wake` they are woken (one eventfd count each) and
/// return `ECANCELED` — for the private channel of a synchronous id, destroyed with the id or by its migration,
/// whose waiter is the library's own call. The program's `rdma_destroy_event_channel` does not wake them: as with
/// Linux's librdmacm (a `read` of the closed rdma_cm fd stays blocked), a thread of the program left waiting on it
/// stays blocked, and programs rely on that (rping's event thread exits the process on an error from
/// `rdma_get_cm_event` while its main thread tears down).
pub(crate) fn destroy_channel(st: &mut State, ch: *mut RdmaEventChannel, wake: bool) {
    let Some(q) = st.chans.remove(&(ch as usize)) else {
        return;
    };
    for e in q {
        st.dead.remove(&e);
        // SAFETY: queued blocks were made by Box::into_raw in push_event and not handed out.
        drop(unsafe { Box::from_raw(e as *mut EventBlock) });
    }
    let waiting = st.waiters.get(&(ch as usize)).copied().unwrap_or(0);
    if waiting > 0 {
        st.closing.insert(ch as usize);
        if wake {
            st.cancelled.insert(ch as usize);
            let n = u64::from(waiting);
            // SAFETY: `ch` is still a live block (freed by the last waiter); writes 8 bytes to its eventfd.
            unsafe { libc::write((*ch).fd, (&raw const n).cast(), 8) };
        }
        return;
    }
    // SAFETY: a live channel block of ours, removed from the table above, with no thread waiting on its fd.
    unsafe {
        libc::close((*ch).fd);
        drop(Box::from_raw(ch));
    }
}

/// A thread leaves [`get_event`] on `ch` (under the lock): the last one out of a destroyed channel releases it.
fn leave(st: &mut State, ch: usize) {
    let left = match st.waiters.get_mut(&ch) {
        Some(n) => {
            *n -= 1;
            *n
        }
        None => return,
    };
    if left == 0 {
        st.waiters.remove(&ch);
        st.cancelled.remove(&ch);
        if st.closing.remove(&ch) {
            let ch = ch as *mut RdmaEventChannel;
            // SAFETY: a destroyed channel's block, kept for its waiters; this was the last of them.
            unsafe {
                libc::close((*ch).fd);
                drop(Box::from_raw(ch));
            }
        }
    }
}

/// `rdma_get_cm_event`: waits on the channel's fd (or `EAGAIN` when the program made it non-blocking). The private
/// channel of a synchronous id destroyed meanwhile (with the id by `rdma_destroy_id`, or by `rdma_migrate_id`) ends
/// the wait with `ECANCELED` (issue #17 finding: the waiter blocked for ever on the closed eventfd); see
/// [`destroy_channel`] for the program's own channels.
pub(crate) fn get_event(ch: *mut RdmaEventChannel) -> R<*mut RdmaCmEvent> {
    let key = ch as usize;
    let fd = {
        let mut st = lock();
        if !st.chans.contains_key(&key) {
            return Err(libc::EINVAL);
        }
        *st.waiters.entry(key).or_insert(0) += 1;
        // SAFETY: a live channel.
        unsafe { (*ch).fd }
    };
    loop {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into `v`; the fd stays open while this thread counts as a waiter.
        let n = unsafe { libc::read(fd, (&raw mut v).cast(), 8) };
        let mut st = lock();
        if n < 0 {
            let e = errno();
            leave(&mut st, key);
            return Err(e);
        }
        let Some(q) = st.chans.get_mut(&key) else {
            if st.cancelled.contains(&key) {
                leave(&mut st, key);
                return Err(libc::ECANCELED);
            }
            // The program destroyed its channel after an event was counted (breaker-style finding: rping's event
            // thread got ECANCELED for its DISCONNECTED event as the main thread tore down, and rping exited 255):
            // as with Linux's rdma_cm fd, the waiter stays blocked (module docs of `destroy_channel`).
            continue;
        };
        let Some(e) = q.pop_front() else {
            continue;
        };
        if st.dead.remove(&e) {
            // SAFETY: a queued block of a destroyed id, never handed out.
            drop(unsafe { Box::from_raw(e as *mut EventBlock) });
            continue;
        }
        // A MULTICAST_JOIN attaches the id's QP now, as librdmacm's `ucma_process_join` (`crate::mcast`).
        crate::mcast::on_event(&mut st, e);
        st.events.insert(e);
        // SAFETY: a queued block is a live EventBlock.
        let owner = unsafe { (*(e as *const EventBlock)).ev.id } as usize;
        if let Some(i) = st.ids.get_mut(&owner) {
            i.unacked += 1;
        }
        leave(&mut st, key);
        return Ok(e as *mut RdmaCmEvent);
    }
}

/// Keeps `ev` (an event of `id` that `get_event` handed out) in `id->event`, acknowledging the one held before,
/// as librdmacm's `ucma_complete` does for the calls of a synchronous id: the program reads, say, the `param.ud`
/// of a UD id's ESTABLISHED there after `rdma_connect`. Held until the id's next synchronous call or its
/// destruction. For an id already gone the event is acknowledged at once.
pub(crate) fn hold_event(id: *mut RdmaCmId, ev: *mut RdmaCmEvent) {
    let old = {
        let st = lock();
        if check_id(&st, id).is_err() {
            Some(ev)
        } else {
            // SAFETY: a live id block.
            let o = unsafe { core::mem::replace(&mut (*id).event, ev) };
            (!o.is_null()).then_some(o)
        }
    };
    if let Some(o) = old {
        let _ = ack_event(o);
    }
}

pub(crate) fn ack_event(ev: *mut RdmaCmEvent) -> R<()> {
    let mut st = lock();
    if !st.events.remove(&(ev as usize)) {
        return Err(libc::EINVAL);
    }
    // SAFETY: an event block handed out by get_event and not yet acknowledged.
    let b = unsafe { Box::from_raw(ev.cast::<EventBlock>()) };
    if let Some(i) = st.ids.get_mut(&(b.ev.id as usize)) {
        i.unacked = i.unacked.saturating_sub(1);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// Ids

pub(crate) fn new_id(
    st: &mut State,
    chan: usize,
    sync: bool,
    context: *mut c_void,
    ps: c_int,
) -> usize {
    // SAFETY: zero is a valid value of every field of rdma_cm_id (NULL pointers, zero integers, zeroed sockaddrs).
    let mut b: Box<RdmaCmId> = Box::new(unsafe { core::mem::zeroed() });
    b.channel = chan as *mut RdmaEventChannel;
    b.context = context;
    b.ps = ps;
    b.port_num = 1;
    b.qp_type = if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    };
    let p = Box::into_raw(b) as usize;
    // SAFETY: zero is a valid path record.
    let path: Box<IbvSaPathRec> = Box::new(unsafe { core::mem::zeroed() });
    st.ids.insert(
        p,
        Id {
            chan,
            sync,
            ps,
            dev: None,
            st: St::Idle,
            src: None,
            dst: None,
            listen: None,
            conn: None,
            active: false,
            local_psn: 0,
            remote_qpn: 0,
            remote_psn: 0,
            mtu: 3,
            responder_resources: DEFAULT_RD_ATOMIC,
            initiator_depth: DEFAULT_RD_ATOMIC,
            retry_count: 7,
            rnr_retry_count: 7,
            timeout: DEFAULT_ACK_TIMEOUT,
            tos: 0,
            ack_timeout: None,
            reuseaddr: false,
            unacked: 0,
            path,
            own_cqs: false,
            ep_qp: None,
            lqpn: None,
        },
    );
    p
}

pub(crate) fn check_id(st: &State, id: *mut RdmaCmId) -> R<()> {
    if st.ids.contains_key(&(id as usize)) {
        Ok(())
    } else {
        Err(libc::EINVAL)
    }
}

/// The library's PD of device `dev`, allocated on first use and kept while the process runs: every id bound to the
/// device shows it in `id->pd` and `rdma_create_qp` without a PD uses it (rdma-core `librdmacm/cma.c`
/// `ucma_get_device`; UCX's rdmacm CM makes a UD QP on `id->pd`). Errors: `ibv_alloc_pd`'s errno.
fn device_pd(st: &mut State, dev: usize) -> R<*mut c_void> {
    if st.devs[dev].pd == 0 {
        // SAFETY: a context this library opened.
        let p = unsafe { bridge::ibv_alloc_pd(st.devs[dev].ctx as *mut c_void) };
        if p.is_null() {
            return Err(errno());
        }
        st.devs[dev].pd = p as usize;
    }
    Ok(st.devs[dev].pd as *mut c_void)
}

/// Writes the addresses, GIDs and path record of `id` (`id->route`, Linux `cma_resolve_iboe_route` for the path).
fn fill_route(
    st: &mut State,
    id: usize,
    dev: usize,
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    dgid: Option<[u8; 16]>,
) {
    let (ctx, sgid, dmtu) = {
        let d = &st.devs[dev];
        (d.ctx, d.gid, d.mtu)
    };
    let dgid = dgid.or_else(|| dst.map(|d| path_gid(st, dev, d.ip())));
    let pd = device_pd(st, dev).unwrap_or(core::ptr::null_mut());
    let i = st.ids.get_mut(&id).expect("live");
    // SAFETY: `id` is a live id block.
    let c = unsafe { &mut *(id as *mut RdmaCmId) };
    c.verbs = ctx as *mut c_void;
    if c.pd.is_null() {
        c.pd = pd;
    }
    if let Some(s) = src {
        write_sockaddr(&mut c.route.addr.src, s);
    }
    if let Some(d) = dst {
        write_sockaddr(&mut c.route.addr.dst, d);
    }
    c.route.addr.ib.sgid.raw = sgid;
    if let Some(g) = dgid {
        c.route.addr.ib.dgid.raw = g;
    }
    c.route.addr.ib.pkey = 0xffffu16.to_be();
    let p = &mut *i.path;
    p.sgid.raw = sgid;
    p.dgid = c.route.addr.ib.dgid;
    p.hop_limit = 64;
    p.traffic_class = i.tos;
    p.reversible = 1;
    p.numb_path = 1;
    p.pkey = 0xffffu16.to_be();
    p.mtu_selector = 2;
    p.mtu = if i.mtu == 0 { dmtu } else { i.mtu.min(dmtu) };
    p.rate_selector = 2;
    p.rate = 3;
    p.packet_life_time_selector = 2;
    // With `RDMA_OPTION_ID_ACK_TIMEOUT` set (and not 0): timeout - 1 (Linux `cma_resolve_iboe_route`).
    p.packet_life_time = match i.ack_timeout {
        Some(t) if t > 0 => t - 1,
        _ => IBOE_PACKET_LIFETIME,
    };
}

fn publish_path(st: &mut State, id: usize) {
    let i = st.ids.get_mut(&id).expect("live");
    // SAFETY: `id` is a live id block; the path record lives in its `Id` until the id is destroyed.
    let c = unsafe { &mut *(id as *mut RdmaCmId) };
    c.route.path_rec = &mut *i.path;
    c.route.num_paths = 1;
}

/// A free port of the ephemeral range 32768..=60999 (Linux's default) in port space `ps`: a random start, then
/// the next free one. Errors: `EADDRNOTAVAIL` when every port of the range is bound (breaker finding: the old
/// random retry loop never ended, holding the library's lock).
fn ephemeral_port(st: &State, ps: c_int) -> R<u16> {
    const FIRST: u32 = 32768;
    const COUNT: u32 = 28232;
    let start = random_u32() % COUNT;
    (0..COUNT)
        .map(|k| (FIRST + (start + k) % COUNT) as u16)
        .find(|&p| !st.ports.contains(&(ps, p)))
        .ok_or(libc::EADDRNOTAVAIL)
}

/// `rdma_bind_addr` under the lock. The wildcard binds without a device (`id->verbs` stays NULL). A loopback
/// address names the device that has it, else a device on a loopback address (the loopback interface's addresses
/// are all that device's, as an rxe device on `lo` has them in its GID table: pyverbs' rdmacm tests bind the
/// netdev's first address, 127.0.0.1, for a device on 127.0.203.1), else no device: libfabric's verbs provider
/// binds "localhost" for a passive endpoint without an address and then takes the devices' own addresses when
/// `id->verbs` is NULL (`prov/verbs/src/verbs_info.c` `vrb_fill_addr`); binding it to a device on another
/// interface made libfabric advertise 127.0.0.1 to its peer.
pub(crate) fn bind(st: &mut State, id: usize, a: SocketAddr) -> R<()> {
    let i = &st.ids[&id];
    if i.st != St::Idle {
        return Err(libc::EINVAL);
    }
    let (ps, reuse) = (i.ps, i.reuseaddr);
    let dev = if a.ip().is_unspecified() {
        None
    } else if a.ip().is_loopback() {
        load_devices(st);
        st.devs
            .iter()
            .position(|d| d.ip == a.ip())
            .or_else(|| st.devs.iter().position(|d| d.ip.is_loopback()))
    } else {
        Some(find_dev(st, a.ip(), false)?)
    };
    let port = if a.port() == 0 {
        ephemeral_port(st, ps)?
    } else if st.ports.contains(&(ps, a.port())) && !reuse {
        return Err(libc::EADDRINUSE);
    } else {
        a.port()
    };
    st.ports.insert((ps, port));
    let src = SocketAddr::new(a.ip(), port);
    let i = st.ids.get_mut(&id).expect("live");
    i.src = Some(src);
    i.dev = dev;
    i.st = St::Bound;
    match dev {
        Some(d) => fill_route(st, id, d, Some(src), None, None),
        None => {
            // SAFETY: a live id block.
            let c = unsafe { &mut *(id as *mut RdmaCmId) };
            write_sockaddr(&mut c.route.addr.src, src);
        }
    }
    Ok(())
}

pub(crate) fn resolve_addr(
    st: &mut State,
    id: usize,
    src: Option<SocketAddr>,
    dst: SocketAddr,
) -> R<()> {
    if let Some(s) = src
        && st.ids[&id].st == St::Idle
    {
        bind(st, id, s)?;
    }
    let i = &st.ids[&id];
    let dev = match (i.st, i.dev) {
        (St::Idle, _) | (St::Bound, None) => {
            let from = route::source_for(dst.ip()).ok();
            let d = find_dev(st, from.unwrap_or(dst.ip()), true)?;
            let port = st.ids[&id].src.map_or(0, |s| s.port());
            if st.ids[&id].st == St::Idle {
                bind(st, id, SocketAddr::new(st.devs[d].ip, port))?;
            } else {
                let ip = st.devs[d].ip;
                let i = st.ids.get_mut(&id).expect("live");
                i.src = Some(SocketAddr::new(ip, port));
                i.dev = Some(d);
            }
            d
        }
        (St::Bound, Some(d)) => d,
        _ => return Err(libc::EINVAL),
    };
    let src = st.ids[&id].src;
    let i = st.ids.get_mut(&id).expect("live");
    i.dst = Some(dst);
    i.mtu = 0;
    fill_route(st, id, dev, src, Some(dst), None);
    let i = st.ids.get_mut(&id).expect("live");
    i.mtu = st.devs[dev].mtu;
    i.st = St::AddrResolved;
    push_event(st, id, 0, EV_ADDR_RESOLVED, 0, None, &[]);
    Ok(())
}

pub(crate) fn resolve_route(st: &mut State, id: usize) -> R<()> {
    let i = &st.ids[&id];
    if i.st != St::AddrResolved {
        return Err(libc::EINVAL);
    }
    let (dev, src, dst) = (i.dev.ok_or(libc::EINVAL)?, i.src, i.dst);
    fill_route(st, id, dev, src, dst, None);
    publish_path(st, id);
    st.ids.get_mut(&id).expect("live").st = St::RouteResolved;
    push_event(st, id, 0, EV_ROUTE_RESOLVED, 0, None, &[]);
    Ok(())
}

fn port_space(ps: c_int) -> R<PortSpace> {
    PortSpace::from_value(u16::try_from(ps).map_err(|_| libc::EINVAL)?).ok_or(libc::EINVAL)
}

pub(crate) fn listen(st: &mut State, id: usize) -> R<()> {
    if st.ids[&id].st == St::Idle {
        bind(st, id, SocketAddr::new(IpAddr::from([0u8; 4]), 0))?;
    }
    let i = &st.ids[&id];
    if i.st != St::Bound {
        return Err(libc::EINVAL);
    }
    let ps = port_space(i.ps)?;
    let port = i.src.map_or(0, |s| s.port());
    load_devices(st);
    let dev = match st.ids[&id].dev {
        Some(d) => d,
        None if !st.devs.is_empty() => 0,
        None => return Err(libc::ENODEV),
    };
    let t = table().ok_or(libc::ENODEV)?;
    let mut h = 0u64;
    // Listen first: the table starts the device's CM listening in one step when this is its first use (a REQ
    // already waiting at the GSI then meets the listen, not a REJ); `ensure_cm` then only takes its fd.
    // SAFETY: a context this library opened; `h` is writable.
    let r = unsafe {
        (t.listen)(
            st.devs[dev].ctx as *mut IbvContext,
            service_id(ps, port),
            &mut h,
        )
    };
    if r < 0 {
        return Err(-r);
    }
    ensure_cm(st, dev)?;
    st.listens.insert(h, id);
    let i = st.ids.get_mut(&id).expect("live");
    i.listen = Some(h);
    i.st = St::Listening;
    Ok(())
}

/// The QP attributes for moving the id's QP to `state` (`rdma_init_qp_attr`; the values Linux `cm.c`
/// `cm_init_qp_{init,rtr,rts}_attr` gives, with the RoCE path of `cma_resolve_iboe_route`).
pub(crate) fn qp_attr(st: &State, id: usize, state: c_int) -> R<(IbvQpAttr, c_int)> {
    let i = &st.ids[&id];
    let mut a = IbvQpAttr {
        qp_state: state,
        ..IbvQpAttr::default()
    };
    let ud = i.ps == RDMA_PS_UDP || i.ps == RDMA_PS_IPOIB;
    match state {
        IBV_QPS_INIT => {
            a.pkey_index = 0;
            a.port_num = 1;
            if ud {
                a.qkey = RDMA_UDP_QKEY;
                return Ok((
                    a,
                    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
                ));
            }
            a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
            if i.responder_resources > 0 {
                a.qp_access_flags |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
            }
            Ok((
                a,
                IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
            ))
        }
        IBV_QPS_RTR => {
            if ud {
                return Ok((a, IBV_QP_STATE));
            }
            if !i.knows_peer() {
                return Err(libc::EINVAL);
            }
            // SAFETY: a live id block.
            let c = unsafe { &*(id as *mut RdmaCmId) };
            a.path_mtu = c_int::from(i.mtu.clamp(1, 5));
            a.dest_qp_num = i.remote_qpn;
            // Each side's Starting PSN in its REQ/REP is the PSN it expects (Linux cm.c; rxe interop,
            // `roce-verbs/tests/cm.rs` `starting_psns_as_linux_reads_them`): receive from our own, send from the peer's.
            a.rq_psn = i.local_psn;
            a.ah_attr.grh.dgid = c.route.addr.ib.dgid.raw;
            a.ah_attr.grh.sgid_index = 0;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.grh.traffic_class = i.tos;
            a.ah_attr.is_global = 1;
            a.ah_attr.port_num = 1;
            a.max_dest_rd_atomic = i.responder_resources;
            a.min_rnr_timer = MIN_RNR_TIMER;
            Ok((
                a,
                IBV_QP_STATE
                    | IBV_QP_AV
                    | IBV_QP_PATH_MTU
                    | IBV_QP_DEST_QPN
                    | IBV_QP_RQ_PSN
                    | IBV_QP_MAX_DEST_RD_ATOMIC
                    | IBV_QP_MIN_RNR_TIMER,
            ))
        }
        IBV_QPS_RTS => {
            if ud {
                // rdma-core `ucma_init_ud_qp`: SQ PSN 0.
                a.sq_psn = 0;
                return Ok((a, IBV_QP_STATE | IBV_QP_SQ_PSN));
            }
            if !i.knows_peer() {
                return Err(libc::EINVAL);
            }
            a.sq_psn = i.remote_psn;
            a.timeout = i.ack_timeout.unwrap_or(i.timeout);
            a.retry_cnt = i.retry_count.min(7);
            a.rnr_retry = i.rnr_retry_count.min(7);
            a.max_rd_atomic = i.initiator_depth;
            Ok((
                a,
                IBV_QP_STATE
                    | IBV_QP_TIMEOUT
                    | IBV_QP_RETRY_CNT
                    | IBV_QP_RNR_RETRY
                    | IBV_QP_SQ_PSN
                    | IBV_QP_MAX_QP_RD_ATOMIC,
            ))
        }
        _ => Err(libc::EINVAL),
    }
}

/// Moves the id's QP INIT → INIT (the negotiated access) → RTR → RTS, as librdmacm's `ucma_modify_qp_rtr` /
/// `ucma_modify_qp_rts` do through `ibv_modify_qp`.
pub(crate) fn modify_to_rts(st: &State, id: usize, qp: *mut IbvQp) -> R<()> {
    for s in [IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS] {
        let (mut a, mask) = qp_attr(st, id, s)?;
        // SAFETY: `qp` is the id's QP (made by rdma_create_qp); `a` is a valid attribute block.
        let r = unsafe { bridge::ibv_modify_qp(qp, &mut a, mask) };
        if r != 0 {
            return Err(r);
        }
    }
    Ok(())
}

pub(crate) fn qp_to_err(qp: *mut IbvQp) {
    if qp.is_null() {
        return;
    }
    let mut a = IbvQpAttr {
        qp_state: IBV_QPS_ERR,
        ..IbvQpAttr::default()
    };
    // SAFETY: the id's QP; a valid attribute block.
    unsafe { bridge::ibv_modify_qp(qp, &mut a, IBV_QP_STATE) };
}

/// `rdma_connect` under the lock. `param` is the program's (or NULL).
pub(crate) fn connect(st: &mut State, id: usize, param: Option<&RdmaConnParam>) -> R<()> {
    let i = &st.ids[&id];
    if i.st != St::RouteResolved {
        return Err(libc::EINVAL);
    }
    if i.ps == RDMA_PS_IPOIB {
        // The IPoIB port space's Q_Key comes from the IPoIB broadcast group (Linux `cma_set_qkey`): no multicast
        // groups here (docs/RDMACM.md).
        return Err(libc::ENOSYS);
    }
    if i.ud() {
        return sidr_connect(st, id, param);
    }
    let ps = port_space(i.ps)?;
    let dev = i.dev.ok_or(libc::EINVAL)?;
    // SAFETY: a live id block.
    let c = unsafe { &*(id as *mut RdmaCmId) };
    let (qpn, qp_type) = if !c.qp.is_null() {
        // SAFETY: the id's QP.
        unsafe { ((*c.qp).qp_num, (*c.qp).qp_type) }
    } else if let Some(p) = param {
        (p.qp_num, IBV_QPT_RC)
    } else {
        return Err(libc::EINVAL);
    };
    let (pdata, plen) = match param {
        Some(p) => (p.private_data.cast::<u8>(), usize::from(p.private_data_len)),
        None => (core::ptr::null(), 0),
    };
    if plen > REQ_PRIVATE_MAX || (plen > 0 && pdata.is_null()) {
        return Err(libc::EINVAL);
    }
    let (src, dst) = (i.src.ok_or(libc::EINVAL)?, i.dst.ok_or(libc::EINVAL)?);
    let mut req = [0u8; 92];
    let hdr = CmaHdr {
        src_port: src.port(),
        src_addr: src.ip(),
        dst_addr: dst.ip(),
    };
    hdr.emit(&mut req).map_err(|_| libc::EAFNOSUPPORT)?;
    if plen > 0 {
        // SAFETY: the program's private data is `plen` readable bytes.
        req[CMA_HDR_LEN..CMA_HDR_LEN + plen]
            .copy_from_slice(unsafe { core::slice::from_raw_parts(pdata, plen) });
    }
    let (max_rd, max_init_rd) = (st.devs[dev].max_rd, st.devs[dev].max_init_rd);
    let (rr, idepth, retry, rnr) = match param {
        Some(p) => (
            rd_param(p.responder_resources, max_rd, max_rd)?,
            rd_param(p.initiator_depth, max_init_rd, max_init_rd)?,
            p.retry_count,
            p.rnr_retry_count,
        ),
        None => (DEFAULT_RD_ATOMIC, DEFAULT_RD_ATOMIC, 7, 7),
    };
    let t = ensure_cm(st, dev)?;
    let i = &st.ids[&id];
    // The option (0: none) sets the REQ's packet lifetime to timeout - 1 (Linux `cma_resolve_iboe_route`).
    let timeout = i.ack_timeout.unwrap_or(0);
    let r = ConnectC {
        qpn,
        qp_type: qp_type as u32,
        dgid: c.route.addr.ib.dgid.raw,
        service_id: service_id(ps, dst.port()),
        private_data: req.as_ptr(),
        private_len: (CMA_HDR_LEN + plen) as u32,
        mtu: i.mtu,
        retry_count: retry.min(7),
        rnr_retry_count: rnr.min(7),
        rd_atomic: rr,
        timeout,
        traffic_class: i.tos,
    };
    let (mut h, mut psn) = (0u64, 0u32);
    // SAFETY: a context this library opened; `r` and the outputs are valid.
    let e = unsafe { (t.connect)(st.devs[dev].ctx as *mut IbvContext, &r, &mut h, &mut psn) };
    if e < 0 {
        return Err(-e);
    }
    st.conns.insert(h, id);
    let i = st.ids.get_mut(&id).expect("live");
    i.conn = Some(h);
    i.active = true;
    i.local_psn = psn & 0x00ff_ffff;
    i.responder_resources = rr;
    i.initiator_depth = idepth;
    i.retry_count = retry;
    i.st = St::Connecting;
    i.lqpn = Some(qpn);
    Ok(())
}

/// `rdma_connect` of a UD id: a SIDR_REQ carrying the `cma_hdr` and the program's private data (at most
/// [`SIDR_REQ_PRIVATE_MAX`] bytes) for the service ID of the destination port; the answer arrives as ESTABLISHED
/// with `param.ud` (or UNREACHABLE with the SIDR status, or `-ETIMEDOUT` after the CM's retries), as Linux
/// `cma_resolve_ib_udp` / `cma_sidr_rep_handler` report it.
fn sidr_connect(st: &mut State, id: usize, param: Option<&RdmaConnParam>) -> R<()> {
    let i = &st.ids[&id];
    let ps = port_space(i.ps)?;
    let dev = i.dev.ok_or(libc::EINVAL)?;
    let (pdata, plen) = match param {
        Some(p) => (p.private_data.cast::<u8>(), usize::from(p.private_data_len)),
        None => (core::ptr::null(), 0),
    };
    if plen > SIDR_REQ_PRIVATE_MAX || (plen > 0 && pdata.is_null()) {
        return Err(libc::EINVAL);
    }
    let (src, dst) = (i.src.ok_or(libc::EINVAL)?, i.dst.ok_or(libc::EINVAL)?);
    let mut req = [0u8; 216];
    let hdr = CmaHdr {
        src_port: src.port(),
        src_addr: src.ip(),
        dst_addr: dst.ip(),
    };
    hdr.emit(&mut req).map_err(|_| libc::EAFNOSUPPORT)?;
    if plen > 0 {
        // SAFETY: the program's private data is `plen` readable bytes.
        req[CMA_HDR_LEN..CMA_HDR_LEN + plen]
            .copy_from_slice(unsafe { core::slice::from_raw_parts(pdata, plen) });
    }
    let t = ensure_cm(st, dev)?;
    // SAFETY: a live id block.
    let dgid = unsafe { (*(id as *mut RdmaCmId)).route.addr.ib.dgid.raw };
    let mut h = 0u64;
    // SAFETY: a context this library opened; the GID, private data and output are valid.
    let e = unsafe {
        (t.sidr_resolve)(
            st.devs[dev].ctx as *mut IbvContext,
            &dgid,
            service_id(ps, dst.port()),
            req.as_ptr(),
            (CMA_HDR_LEN + plen) as u32,
            &mut h,
        )
    };
    if e < 0 {
        return Err(-e);
    }
    st.conns.insert(h, id);
    let i = st.ids.get_mut(&id).expect("live");
    i.conn = Some(h);
    i.active = true;
    i.st = St::Connecting;
    Ok(())
}

/// A `rdma_conn_param` responder-resources or initiator-depth value (rdma-core `librdmacm/cma.c`
/// `ucma_valid_param`, `rdma_connect`, `rdma_accept`, read for facts): `RDMA_MAX_RD` (0xff) stands for `max_value`;
/// another value is taken as is when at most the device's `max`, else `EINVAL`.
fn rd_param(v: u8, max: u8, max_value: u8) -> R<u8> {
    match v {
        RDMA_MAX_RD => Ok(max_value),
        v if v <= max => Ok(v),
        _ => Err(libc::EINVAL),
    }
}

/// `rdma_accept` under the lock.
pub(crate) fn accept(st: &mut State, id: usize, param: Option<&RdmaConnParam>) -> R<()> {
    let i = &st.ids[&id];
    if i.st != St::ReqRcvd {
        return Err(libc::EINVAL);
    }
    let (dev, conn) = (i.dev.ok_or(libc::EINVAL)?, i.conn.ok_or(libc::EINVAL)?);
    let t = table().ok_or(libc::ENODEV)?;
    if i.ud() {
        return sidr_accept(st, id, t, (dev, conn), param);
    }
    let (pdata, plen, rnr) = match param {
        Some(p) => (
            p.private_data.cast::<u8>(),
            usize::from(p.private_data_len),
            p.rnr_retry_count,
        ),
        None => (core::ptr::null(), 0, 7),
    };
    if plen > REP_PRIVATE_MAX || (plen > 0 && pdata.is_null()) {
        return Err(libc::EINVAL);
    }
    if let Some(p) = param {
        let (max_rd, max_init_rd) = (st.devs[dev].max_rd, st.devs[dev].max_init_rd);
        let i = &st.ids[&id];
        let rr = rd_param(
            p.responder_resources,
            max_rd,
            i.responder_resources.min(max_rd),
        )?;
        let idepth = rd_param(
            p.initiator_depth,
            max_init_rd,
            i.initiator_depth.min(max_init_rd),
        )?;
        let i = st.ids.get_mut(&id).expect("live");
        i.responder_resources = rr;
        i.initiator_depth = idepth;
    }
    // SAFETY: a live id block.
    let qp = unsafe { (*(id as *mut RdmaCmId)).qp };
    let qpn = if !qp.is_null() {
        modify_to_rts(st, id, qp)?;
        // SAFETY: the id's QP.
        unsafe { (*qp).qp_num }
    } else if let Some(p) = param {
        p.qp_num
    } else {
        return Err(libc::EINVAL);
    };
    st.ids.get_mut(&id).expect("live").lqpn = Some(qpn);
    let i = &st.ids[&id];
    // SAFETY: a context this library opened; the private data is `plen` readable bytes.
    let e = unsafe {
        (t.accept)(
            st.devs[dev].ctx as *mut IbvContext,
            conn,
            qpn,
            i.local_psn,
            pdata,
            plen as u32,
            i.responder_resources,
            rnr.min(7),
        )
    };
    if e < 0 {
        return Err(-e);
    }
    st.ids.get_mut(&id).expect("live").st = St::Accepting;
    Ok(())
}

/// `rdma_accept` of a UD id: the SIDR_REP (status success) naming the id's QP (or `param->qp_num`) and
/// [`RDMA_UDP_QKEY`] (Linux `cma_send_sidr_rep`; `rdma_create_qp` brought the QP to RTS with that Q_Key). No
/// ESTABLISHED follows on this side (Linux reports none for a UD accept). `ENOSYS` in the IPoIB port space, whose
/// Q_Key is the IPoIB broadcast group's (no multicast groups here).
fn sidr_accept(
    st: &mut State,
    id: usize,
    t: &PrivateV1,
    (dev, conn): (usize, u64),
    param: Option<&RdmaConnParam>,
) -> R<()> {
    if st.ids[&id].ps == RDMA_PS_IPOIB {
        return Err(libc::ENOSYS);
    }
    let (pdata, plen) = match param {
        Some(p) => (p.private_data.cast::<u8>(), usize::from(p.private_data_len)),
        None => (core::ptr::null(), 0),
    };
    if plen > SIDR_REP_PRIVATE_MAX || (plen > 0 && pdata.is_null()) {
        return Err(libc::EINVAL);
    }
    // SAFETY: a live id block.
    let qp = unsafe { (*(id as *mut RdmaCmId)).qp };
    let qpn = if !qp.is_null() {
        // SAFETY: the id's QP.
        unsafe { (*qp).qp_num }
    } else if let Some(p) = param {
        p.qp_num
    } else {
        return Err(libc::EINVAL);
    };
    st.ids.get_mut(&id).expect("live").lqpn = Some(qpn);
    // SAFETY: a context this library opened; the private data is `plen` readable bytes.
    let e = unsafe {
        (t.sidr_accept)(
            st.devs[dev].ctx as *mut IbvContext,
            conn,
            qpn,
            RDMA_UDP_QKEY,
            pdata,
            plen as u32,
        )
    };
    if e < 0 {
        return Err(-e);
    }
    st.conns.remove(&conn);
    let i = st.ids.get_mut(&id).expect("live");
    i.conn = None;
    i.st = St::Connected;
    Ok(())
}

/// `rdma_reject` under the lock: a REJ (consumer reject, 28) or, for a UD id, a SIDR_REP with status 2
/// (rejected; Linux `rdma_reject` → `cma_send_sidr_rep(IB_SIDR_REJECT)`), each with the private data.
pub(crate) fn reject(st: &mut State, id: usize, pdata: *const u8, len: u8) -> R<()> {
    let i = &st.ids[&id];
    if i.st != St::ReqRcvd {
        return Err(libc::EINVAL);
    }
    let max = if i.ud() {
        SIDR_REP_PRIVATE_MAX
    } else {
        REJ_PRIVATE_MAX
    };
    if usize::from(len) > max || (len > 0 && pdata.is_null()) {
        return Err(libc::EINVAL);
    }
    let (dev, conn) = (i.dev.ok_or(libc::EINVAL)?, i.conn.ok_or(libc::EINVAL)?);
    let t = table().ok_or(libc::ENODEV)?;
    let f = if i.ud() { t.sidr_reject } else { t.reject };
    // SAFETY: a context this library opened; the private data is `len` readable bytes.
    let e = unsafe {
        f(
            st.devs[dev].ctx as *mut IbvContext,
            conn,
            pdata,
            u32::from(len),
        )
    };
    if e < 0 {
        return Err(-e);
    }
    st.conns.remove(&conn);
    let i = st.ids.get_mut(&id).expect("live");
    i.conn = None;
    i.st = St::Rejected;
    Ok(())
}

pub(crate) fn establish(st: &mut State, id: usize) -> R<()> {
    let i = &st.ids[&id];
    if i.st != St::ConnectResponse {
        return Err(libc::EINVAL);
    }
    let (dev, conn) = (i.dev.ok_or(libc::EINVAL)?, i.conn.ok_or(libc::EINVAL)?);
    let t = table().ok_or(libc::ENODEV)?;
    // SAFETY: a context this library opened.
    let e = unsafe { (t.establish)(st.devs[dev].ctx as *mut IbvContext, conn) };
    if e < 0 {
        return Err(-e);
    }
    st.ids.get_mut(&id).expect("live").st = St::Connected;
    Ok(())
}

pub(crate) fn disconnect(st: &mut State, id: usize) -> R<()> {
    // SAFETY: a live id block.
    let qp = unsafe { (*(id as *mut RdmaCmId)).qp };
    let i = &st.ids[&id];
    let (state, dev, conn) = (i.st, i.dev, i.conn);
    match state {
        St::Connected | St::Accepting | St::ConnectResponse => {}
        // The peer disconnected first: our DREP was sent; the QP still goes to ERR (Linux answers 0).
        St::Disconnected => {
            qp_to_err(qp);
            return Ok(());
        }
        _ => return Err(libc::EINVAL),
    }
    qp_to_err(qp);
    let (Some(dev), Some(conn)) = (dev, conn) else {
        return Err(libc::EINVAL);
    };
    let t = table().ok_or(libc::ENODEV)?;
    // SAFETY: a context this library opened.
    let e = unsafe { (t.disconnect)(st.devs[dev].ctx as *mut IbvContext, conn) };
    // EINVAL: the connection is past the states that send a DREQ or DREP. The peer's DREQ arrived first and the
    // runtime answered it (`roce_verbs::cm` sends the DREP itself) before this library took the DISCONNECTED
    // event, or DREQs crossed; or the REP is unanswered. Linux `rdma_disconnect` answers 0 then (it tries
    // `ib_send_cm_dreq`, then `ib_send_cm_drep`, and ignores their errors). pyverbs' test_rdmacm disconnects both
    // sides at once and failed here with EINVAL.
    if e < 0 && e != -libc::EINVAL && st.ids[&id].st != St::Disconnected {
        return Err(-e);
    }
    Ok(())
}

/// `rdma_destroy_id`: stops what the id does (listen, request: REJ, connection: DREQ), waits for its events'
/// acknowledgements, frees it.
pub(crate) fn destroy_id(id: *mut RdmaCmId) -> R<()> {
    let key = id as usize;
    // The event a synchronous call left in `id->event` is acknowledged first (librdmacm `rdma_destroy_id`).
    let held = {
        let st = lock();
        check_id(&st, id)?;
        // SAFETY: a live id block.
        unsafe { core::mem::replace(&mut (*id).event, core::ptr::null_mut()) }
    };
    if !held.is_null() {
        let _ = ack_event(held);
    }
    {
        let mut st = lock();
        check_id(&st, id)?;
        // Its multicast groups are left (Linux `cma_leave_mc_groups`).
        crate::mcast::leave_all(&mut st, key);
        let i = &st.ids[&key];
        let (dev, listen, conn, state, ud) = (i.dev, i.listen, i.conn, i.st, i.ud());
        let t = table();
        let ctx = dev.or(if st.devs.is_empty() { None } else { Some(0) });
        if let (Some(t), Some(d)) = (t, ctx) {
            let ctx = st.devs[d].ctx as *mut IbvContext;
            // SAFETY (all three): a context this library opened.
            if let Some(h) = listen {
                unsafe { (t.stop_listen)(ctx, h) };
                st.listens.remove(&h);
            }
            if let Some(h) = conn {
                match state {
                    // A SIDR_REQ not answered: SIDR status 2 (Linux `cm_destroy_id`); our own SIDR_REQ still
                    // pending: not re-sent any more, a late answer is dropped.
                    St::ReqRcvd if ud => unsafe {
                        (t.sidr_reject)(ctx, h, core::ptr::null(), 0);
                    },
                    _ if ud => unsafe {
                        (t.destroy)(ctx, h);
                    },
                    St::ReqRcvd => unsafe {
                        (t.reject)(ctx, h, core::ptr::null(), 0);
                    },
                    St::Connected | St::Accepting | St::ConnectResponse | St::Connecting => unsafe {
                        (t.disconnect)(ctx, h);
                    },
                    _ => {}
                }
                st.conns.remove(&h);
            }
        }
        let i = st.ids.get_mut(&key).expect("live");
        i.listen = None;
        i.conn = None;
    }
    let t0 = Instant::now();
    loop {
        let n = lock().ids.get(&key).map_or(0, |i| i.unacked);
        if n == 0 {
            break;
        }
        if t0.elapsed() > DESTROY_WAIT {
            eprintln!(
                "rocev2 librdmacm: rdma_destroy_id: {n} event(s) of the id were never acknowledged \
                 (rdma_ack_cm_event); destroying it anyway after {DESTROY_WAIT:?}"
            );
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut st = lock();
    let Some(i) = st.ids.remove(&key) else {
        return Err(libc::EINVAL);
    };
    // Queued, not yet taken events of this id are dropped when a reader reaches them.
    let mut dead = Vec::new();
    for q in st.chans.values() {
        for &e in q {
            // SAFETY: queued blocks are live EventBlocks.
            let ev = unsafe { &*(e as *const EventBlock) };
            if ev.ev.id as usize == key {
                dead.push(e);
            }
        }
    }
    st.dead.extend(dead);
    if let Some(s) = i.src {
        st.ports.remove(&(i.ps, s.port()));
    }
    if i.sync {
        destroy_channel(&mut st, i.chan as *mut RdmaEventChannel, true);
    }
    // SAFETY: the id block was made by Box::into_raw in new_id and is no longer in the table.
    drop(unsafe { Box::from_raw(id) });
    Ok(())
}

/// `rdma_create_qp` under the lock: PD (given, the id's, or the device's default), CQs with completion channels
/// when the attributes name none (librdmacm's `ucma_create_cqs`), the QP, then INIT.
pub(crate) fn create_qp(
    st: &mut State,
    id: usize,
    pd: *mut c_void,
    attr: &mut IbvQpInitAttr,
) -> R<()> {
    // SAFETY: a live id block.
    let c = unsafe { &mut *(id as *mut RdmaCmId) };
    if c.verbs.is_null() {
        return Err(libc::EINVAL);
    }
    let dev = st.ids[&id].dev.ok_or(libc::EINVAL)?;
    let pd = if !pd.is_null() {
        pd
    } else if !c.pd.is_null() {
        c.pd
    } else {
        device_pd(st, dev)?
    };
    let mut own = false;
    if attr.send_cq.is_null() || attr.recv_cq.is_null() {
        // SAFETY: libibverbs calls on the id's context; results checked.
        unsafe {
            let rch = bridge::ibv_create_comp_channel(c.verbs);
            let sch = bridge::ibv_create_comp_channel(c.verbs);
            let rcq = if rch.is_null() {
                core::ptr::null_mut()
            } else {
                bridge::ibv_create_cq(
                    c.verbs,
                    attr.cap.max_recv_wr.max(1) as c_int,
                    id as *mut c_void,
                    rch,
                    0,
                )
            };
            let scq = if sch.is_null() {
                core::ptr::null_mut()
            } else {
                bridge::ibv_create_cq(
                    c.verbs,
                    attr.cap.max_send_wr.max(1) as c_int,
                    id as *mut c_void,
                    sch,
                    0,
                )
            };
            if rcq.is_null() || scq.is_null() {
                let e = errno();
                for cq in [rcq, scq] {
                    if !cq.is_null() {
                        bridge::ibv_destroy_cq(cq);
                    }
                }
                for ch in [rch, sch] {
                    if !ch.is_null() {
                        bridge::ibv_destroy_comp_channel(ch);
                    }
                }
                return Err(e);
            }
            c.recv_cq_channel = rch;
            c.recv_cq = rcq;
            c.send_cq_channel = sch;
            c.send_cq = scq;
        }
        if attr.send_cq.is_null() {
            attr.send_cq = c.send_cq.cast();
        }
        if attr.recv_cq.is_null() {
            attr.recv_cq = c.recv_cq.cast();
        }
        own = true;
    }
    // SAFETY: a PD of the id's context; a valid attribute block.
    let qp = unsafe { bridge::ibv_create_qp(pd, attr) };
    if qp.is_null() {
        let e = errno();
        if own {
            destroy_cqs(c);
        }
        return Err(e);
    }
    // INIT; a UD QP goes on to RTR and RTS at once (it needs no peer: rdma-core `cma.c` `ucma_init_ud_qp`).
    let states: &[c_int] = if st.ids[&id].ud() {
        &[IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS]
    } else {
        &[IBV_QPS_INIT]
    };
    let mut r = 0;
    for &s in states {
        let (mut a, mask) = qp_attr(st, id, s)?;
        // SAFETY: the QP just made; a valid attribute block.
        r = unsafe { bridge::ibv_modify_qp(qp, &mut a, mask) };
        if r != 0 {
            break;
        }
    }
    if r != 0 {
        // SAFETY: the QP just made.
        unsafe { bridge::ibv_destroy_qp(qp) };
        if own {
            destroy_cqs(c);
        }
        return Err(r);
    }
    c.qp = qp;
    c.pd = pd;
    let i = st.ids.get_mut(&id).expect("live");
    i.own_cqs = own;
    // SAFETY: the QP just made.
    i.lqpn = Some(unsafe { (*qp).qp_num });
    Ok(())
}

fn destroy_cqs(c: &mut RdmaCmId) {
    // SAFETY: CQs and channels made by create_qp for this id.
    unsafe {
        for cq in [c.send_cq, c.recv_cq] {
            if !cq.is_null() {
                bridge::ibv_destroy_cq(cq);
            }
        }
        for ch in [c.send_cq_channel, c.recv_cq_channel] {
            if !ch.is_null() {
                bridge::ibv_destroy_comp_channel(ch);
            }
        }
    }
    c.send_cq = core::ptr::null_mut();
    c.recv_cq = core::ptr::null_mut();
    c.send_cq_channel = core::ptr::null_mut();
    c.recv_cq_channel = core::ptr::null_mut();
}

pub(crate) fn destroy_qp(st: &mut State, id: usize) {
    // SAFETY: a live id block.
    let c = unsafe { &mut *(id as *mut RdmaCmId) };
    if !c.qp.is_null() {
        // Attached to the id's groups: detached first (an attached QP cannot be destroyed, `crate::mcast`).
        crate::mcast::detach_qp(st, id, c.qp);
        // SAFETY: the id's QP.
        unsafe { bridge::ibv_destroy_qp(c.qp) };
        c.qp = core::ptr::null_mut();
    }
    let i = st.ids.get_mut(&id).expect("live");
    i.lqpn = None;
    if i.own_cqs {
        i.own_cqs = false;
        destroy_cqs(c);
    }
}
