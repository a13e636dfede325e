//! rsockets (`<rdma/rsocket.h>`): the socket-like calls of librdmacm over this library's own rdma_cm ids and
//! rocev2's libibverbs, with librdmacm's stream protocol on the wire (module `stream`, formats in
//! `roce_wire::rsocket`), so an rsocket here talks to an rsocket of rdma-core's librdmacm (`docs/RDMACM.md`).
//!
//! * An rsocket's number is the descriptor of its id's event channel (as in rsocket.c), so it never collides
//!   with the program's other descriptors and `rpoll` / `rselect` take both kinds in one set.
//! * Stream sockets (`SOCK_STREAM`, IPv4/IPv6): `rsocket`, `rbind`, `rlisten`, `raccept`, `rconnect`,
//!   `rsend`/`rwrite`/`rsendto`/`rsendmsg`/`rwritev`, `rrecv`/`rread`/`rrecvfrom`/`rrecvmsg`/`rreadv`
//!   (`MSG_DONTWAIT`, `MSG_PEEK`, `MSG_WAITALL`), `rpoll`, `rselect`, `rshutdown`, `rclose`, `rgetpeername`,
//!   `rgetsockname`, `rfcntl` (`F_GETFL`/`F_SETFL` `O_NONBLOCK`, `F_GETFD`/`F_SETFD`), `rsetsockopt` /
//!   `rgetsockopt` (`SO_REUSEADDR`, `SO_RCVBUF`, `SO_SNDBUF`, `SO_KEEPALIVE`, `SO_LINGER`, `SO_OOBINLINE`,
//!   `SO_ERROR`, `TCP_NODELAY`, `TCP_KEEPIDLE`/`KEEPCNT`/`KEEPINTVL`, `TCP_MAXSEG`, `IP_TOS`, `IPV6_V6ONLY`,
//!   `SOL_RDMA` `RDMA_SQSIZE`/`RDMA_RQSIZE`/`RDMA_INLINE`/`RDMA_IOMAPSIZE`).
//! * Differences from rsocket.c: `raccept` accepts a waiting request in the caller's thread (rsocket.c uses a
//!   service thread, so there a connect to a listener of the same thread completes); keepalive is recorded but no
//!   `RS_CTRL_KEEPALIVE` is sent (the RC transport's own retries detect a dead peer); `rpoll` reports a peer's
//!   disconnect (`POLLHUP`) only once the data received before it is read. A blocking `rsend`/`rrecv` waits
//!   without holding its socket, so another thread may use it meanwhile (an `rclose` from another thread wakes it:
//!   it returns `-1`/`EBADF`); a blocking `rconnect` and `rshutdown`
//!   hold it while they wait. `raccept` holds the listener only while it takes and answers a request: on a
//!   non-blocking listener it returns the new socket at once (its connection completes with the RTU, as
//!   rsocket.c's accepting state), a blocking one waits for the RTU without the listener. `rshutdown` / `rclose`
//!   wait for their sends at most `stream::SHUTDOWN_IDLE` (5 s) without a completion (rsocket.c waits for ever,
//!   so a peer that posts no receives held the close for ever). `rrecv` after an abort (a refused message, a
//!   failed completion) is `-1` with the error (`SO_ERROR`'s value, e.g. `EPROTO`) once the data before it is
//!   read; rsocket.c returns 0 as at an orderly end, which reads as a complete stream.
//! * Not implemented (`-1` with `errno`): datagram rsockets (`SOCK_DGRAM`: `ENOTSUP` from `rsocket`), the iomap
//!   calls `riomap` / `riounmap` / `riowrite` (`ENOSYS`; the connection data advertises no iomap), `RDMA_ROUTE`
//!   (`ENOTSUP`), `AF_IB`.

mod stream;
mod verbs;

use core::ffi::c_void;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use libc::{c_int, size_t, sockaddr, socklen_t, ssize_t};
use roce_wire::rsocket::{CONN_DATA_LEN, ConnData};

use crate::abi::*;
use crate::cma::{self, R};
use stream::{Rs, st};

/// `SOL_RDMA` and its options (`<rdma/rsocket.h>`).
const SOL_RDMA: c_int = 0x10000;
const RDMA_SQSIZE: c_int = 0;
const RDMA_RQSIZE: c_int = 1;
const RDMA_INLINE: c_int = 2;
const RDMA_IOMAPSIZE: c_int = 3;
const RDMA_ROUTE: c_int = 4;

/// An rsocket and whether a thread waits for its completion events in `ibv_get_cq_event` (the one that drives
/// the device meanwhile; others poll the channel and look again every millisecond).
struct SockInner {
    rs: Mutex<Rs>,
    leader: AtomicBool,
    /// `rclose` began (set under the lock): blocking calls return `EBADF` at their next look.
    closing: AtomicBool,
    /// Threads of [`blocking`] waiting on the connection's completion channel outside the lock (counted under
    /// it): `rclose` wakes them and waits for them to leave before it destroys the channel and the CQ.
    waiters: AtomicUsize,
}

type Sock = Arc<SockInner>;

static TABLE: Mutex<Option<HashMap<c_int, Sock>>> = Mutex::new(None);

fn lookup(fd: c_int) -> Option<Sock> {
    let t = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    t.as_ref()?.get(&fd).cloned()
}

fn insert(fd: c_int, rs: Rs) {
    let mut t = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    t.get_or_insert_with(HashMap::new).insert(
        fd,
        Arc::new(SockInner {
            rs: Mutex::new(rs),
            leader: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
        }),
    );
}

fn remove(fd: c_int) -> Option<Sock> {
    let mut t = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    t.as_mut()?.remove(&fd)
}

fn lock(s: &Sock) -> std::sync::MutexGuard<'_, Rs> {
    s.rs.lock().unwrap_or_else(|p| p.into_inner())
}

fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// `0`/value, or `-1` with `errno`; a panic is `-1`/`EIO` and never crosses the C boundary.
fn c_ret<T: Into<i64>>(body: impl FnOnce() -> R<T>) -> i64 {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(v)) => v.into(),
        Ok(Err(e)) => {
            set_errno(e);
            -1
        }
        Err(_) => {
            set_errno(libc::EIO);
            -1
        }
    }
}

fn sock(fd: c_int) -> R<Sock> {
    lookup(fd).ok_or(libc::EBADF)
}

fn chan_fd(id: *mut RdmaCmId) -> c_int {
    // SAFETY: a live id; its channel is live while the id is.
    unsafe { (*(*id).channel).fd }
}

fn set_fd_nonblock(fd: c_int, on: bool) {
    // SAFETY: fcntl on a descriptor of this library.
    unsafe {
        let f = libc::fcntl(fd, libc::F_GETFL);
        let f = if on {
            f | libc::O_NONBLOCK
        } else {
            f & !libc::O_NONBLOCK
        };
        libc::fcntl(fd, libc::F_SETFL, f);
    }
}

/// Waits on the id's channel for `want` (the id is synchronous: only its events are there) and returns that
/// event's private data; another outcome is `ECONNREFUSED` (a reject) or the event's error.
fn wait_cm(id: *mut RdmaCmId, want: c_int) -> R<Vec<u8>> {
    // SAFETY: a live id.
    let ch = unsafe { (*id).channel };
    loop {
        let ev = cma::get_event(ch)?;
        // SAFETY: an event handed out by get_event; its private data is `private_data_len` bytes.
        let (eid, kind, status, pdata) = unsafe {
            let e = &*ev;
            let p = if e.conn.private_data.is_null() {
                Vec::new()
            } else {
                core::slice::from_raw_parts(
                    e.conn.private_data.cast::<u8>(),
                    usize::from(e.conn.private_data_len),
                )
                .to_vec()
            };
            (e.id, e.event, e.status, p)
        };
        cma::ack_event(ev)?;
        if eid != id {
            continue;
        }
        if kind == want {
            return Ok(pdata);
        }
        return Err(match kind {
            EV_REJECTED => libc::ECONNREFUSED,
            EV_UNREACHABLE => libc::ETIMEDOUT,
            _ if status < 0 => -status,
            _ => libc::ECONNABORTED,
        });
    }
}

fn rs_socket(domain: c_int, ty: c_int, proto: c_int) -> R<c_int> {
    let base = ty & !(libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK);
    if (domain != libc::AF_INET && domain != libc::AF_INET6)
        || base != libc::SOCK_STREAM
        || (proto != 0 && proto != libc::IPPROTO_TCP)
    {
        // Datagram rsockets and AF_IB are not offered (module docs).
        return Err(libc::ENOTSUP);
    }
    let mut id: *mut RdmaCmId = core::ptr::null_mut();
    // SAFETY: `id` is writable; a synchronous id (its own channel).
    if unsafe {
        crate::exports::rocev2_rdma_create_id(
            core::ptr::null_mut(),
            &mut id,
            core::ptr::null_mut(),
            RDMA_PS_TCP,
        )
    } != 0
    {
        return Err(errno());
    }
    // SAFETY: the id just made; the family of its (still empty) source address, as rsocket.c records it.
    unsafe { (*id).route.addr.src.ss_family = domain as libc::sa_family_t };
    let mut rs = Rs::new(id, None);
    if ty & libc::SOCK_NONBLOCK != 0 {
        rs.fs_flags |= libc::O_NONBLOCK;
    }
    if ty & libc::SOCK_CLOEXEC != 0 {
        rs.fd_flags |= libc::FD_CLOEXEC;
    }
    let fd = chan_fd(id);
    insert(fd, rs);
    Ok(fd)
}

fn rs_bind(fd: c_int, addr: *const sockaddr) -> R<()> {
    let s = sock(fd)?;
    let mut rs = lock(&s);
    // SAFETY: the program's address (checked by rdma_bind_addr).
    if unsafe { crate::exports::rocev2_rdma_bind_addr(rs.id, addr.cast_mut()) } != 0 {
        return Err(errno());
    }
    rs.state = st::BOUND;
    Ok(())
}

fn rs_listen(fd: c_int, backlog: c_int) -> R<()> {
    let s = sock(fd)?;
    let mut rs = lock(&s);
    if rs.state == st::LISTENING {
        return Ok(());
    }
    // SAFETY: a live id.
    if unsafe { crate::exports::rocev2_rdma_listen(rs.id, backlog) } != 0 {
        return Err(errno());
    }
    set_fd_nonblock(fd, rs.fs_flags & libc::O_NONBLOCK != 0);
    rs.state = st::LISTENING;
    Ok(())
}

/// The connection parameters rsocket.c connects with: its connection data, flow control, 7 retries.
fn conn_param(data: &[u8; CONN_DATA_LEN]) -> RdmaConnParam {
    RdmaConnParam {
        private_data: data.as_ptr().cast(),
        private_data_len: CONN_DATA_LEN as u8,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

/// `rconnect`: resolves the address and route, creates the QP and buffers and sends the REQ with our connection
/// data; a blocking socket then waits for the REP, a non-blocking one answers `EINPROGRESS` and completes in a
/// later call ([`finish_connect`]: `rpoll`, `rsend`, `rrecv`, `rconnect`), as rsocket.c's `rs_do_connect`.
fn rs_connect(fd: c_int, addr: *const sockaddr) -> R<()> {
    let s = sock(fd)?;
    let mut rs = lock(&s);
    if rs.state & st::CONNECTED != 0 {
        return Err(libc::EISCONN);
    }
    if rs.state & st::OPENING != 0 {
        let block = rs.fs_flags & libc::O_NONBLOCK == 0;
        return finish_connect(&mut rs, block).map_err(|e| {
            if e == libc::EAGAIN {
                libc::EINPROGRESS
            } else {
                e
            }
        });
    }
    if rs.state & st::LISTENING != 0 || rs.conn.is_some() {
        return Err(libc::EINVAL);
    }
    let id = rs.id;
    let r = (|| -> R<()> {
        // SAFETY: the program's address (checked by rdma_resolve_addr); a live id.
        unsafe {
            if crate::exports::rocev2_rdma_resolve_addr(
                id,
                core::ptr::null_mut(),
                addr.cast_mut(),
                2000,
            ) != 0
                || crate::exports::rocev2_rdma_resolve_route(id, 2000) != 0
            {
                return Err(errno());
            }
        }
        rs.create_ep()?;
        let mut data = [0u8; CONN_DATA_LEN];
        rs.conn_data()
            .ok_or(libc::EINVAL)?
            .emit(&mut data)
            .map_err(|_| libc::EINVAL)?;
        let param = conn_param(&data);
        let mut c = cma::lock();
        cma::check_id(&c, id)?;
        cma::connect(&mut c, id as usize, Some(&param))
    })();
    if let Err(e) = r {
        rs.state = st::CONNECT_ERROR;
        rs.err = e;
        return Err(e);
    }
    rs.state = st::CONNECTING;
    let block = rs.fs_flags & libc::O_NONBLOCK == 0;
    finish_connect(&mut rs, block).map_err(|e| {
        if e == libc::EAGAIN {
            libc::EINPROGRESS
        } else {
            e
        }
    })
}

/// Completes a connection in progress: a connecting socket with the REP's connection data, an accepting one
/// (a non-blocking `raccept` answered the REQ) once the RTU came. `EAGAIN` while it has not come (when not
/// `block`); a refusal, a bad REP or a missing RTU leaves the socket in the connect-error state with `SO_ERROR`
/// set (rsocket.c `rs_do_connect`, its `rs_connecting` and `rs_accepting` steps).
fn finish_connect(rs: &mut Rs, block: bool) -> R<()> {
    if rs.state != st::CONNECTING && rs.state != st::ACCEPTING {
        return if rs.state & st::CONNECTED != 0 {
            Ok(())
        } else {
            Err(libc::ENOTCONN)
        };
    }
    let id = rs.id;
    if !block && !chan_ready(chan_fd(id), 0) {
        return Err(libc::EAGAIN);
    }
    let r = if rs.state == st::ACCEPTING {
        // The peer's connection data came with the REQ (saved by `raccept`); the RTU carries none.
        wait_cm(id, EV_ESTABLISHED).map(|_| None)
    } else {
        wait_cm(id, EV_ESTABLISHED)
            .and_then(|rep| ConnData::parse(&rep).map(Some).map_err(|_| libc::ENOTSUP))
    };
    match r {
        Ok(peer) => {
            if let Some(peer) = peer {
                rs.save_conn_data(&peer);
            }
            rs.state = st::CONNECT_RDWR;
            Ok(())
        }
        Err(e) => {
            rs.state = st::CONNECT_ERROR;
            rs.err = e;
            Err(e)
        }
    }
}

/// Whether `fd` is readable within `ms` milliseconds (an event channel with an event queued).
fn chan_ready(fd: c_int, ms: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd.
    unsafe { libc::poll(&mut p, 1, ms) == 1 && p.revents & libc::POLLIN != 0 }
}

/// Takes the next connection request of the listening socket and accepts it with our connection data (sends
/// the REP); the new rsocket's number. The listener is held only while a request is taken and answered, never
/// while waiting (rsocket.c: `rdma_get_request` then `rdma_accept`):
/// * non-blocking listener: `EAGAIN` when no request is pending; otherwise the new socket is returned at once in
///   the accepting state, its connection completing when the RTU comes (`rpoll`, `rsend`, `rrecv` on it wait or
///   answer `EAGAIN` as on a connecting socket; a missing RTU is its `SO_ERROR`);
/// * blocking listener: waits for a request (other threads may accept meanwhile), then for the RTU without the
///   listener; a failed handshake is the call's error (`ETIMEDOUT` when the RTU never came).
///
/// Requests that are not rsockets' (no or bad connection data) are rejected, as rsocket.c does.
fn rs_accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> R<c_int> {
    let s = sock(fd)?;
    let refuse = |nid: *mut RdmaCmId| {
        {
            let mut c = cma::lock();
            let _ = cma::reject(&mut c, nid as usize, core::ptr::null(), 0);
        }
        let _ = cma::destroy_id(nid);
    };
    let (nid, mut rs, nonblock) = loop {
        let parent = lock(&s);
        if parent.id.is_null() || parent.state != st::LISTENING {
            return Err(libc::EINVAL);
        }
        let nonblock = parent.fs_flags & libc::O_NONBLOCK != 0;
        let lfd = chan_fd(parent.id);
        if !chan_ready(lfd, 0) {
            if nonblock {
                return Err(libc::EAGAIN);
            }
            drop(parent);
            chan_ready(lfd, 100);
            continue;
        }
        // SAFETY: a live listening id.
        let ch = unsafe { (*parent.id).channel };
        let ev = cma::get_event(ch)?;
        // SAFETY: an event handed out by get_event.
        let (nid, kind, pdata) = unsafe {
            let e = &*ev;
            let p = if e.conn.private_data.is_null() {
                Vec::new()
            } else {
                core::slice::from_raw_parts(
                    e.conn.private_data.cast::<u8>(),
                    usize::from(e.conn.private_data_len),
                )
                .to_vec()
            };
            (e.id, e.event, p)
        };
        cma::ack_event(ev)?;
        if kind != EV_CONNECT_REQUEST {
            continue;
        }
        let Ok(peer) = ConnData::parse(&pdata) else {
            // Not an rsocket (or another version): rsocket.c rejects it too.
            refuse(nid);
            continue;
        };
        // SAFETY: the request's id: give it its own channel (a synchronous id, as rdma_get_request does).
        if unsafe { crate::exports::rocev2_rdma_migrate_id(nid, core::ptr::null_mut()) } != 0 {
            let e = errno();
            refuse(nid);
            return Err(e);
        }
        let mut rs = Rs::new(nid, Some(&parent));
        drop(parent);
        let r = (|| -> R<()> {
            rs.create_ep()?;
            rs.save_conn_data(&peer);
            let mut data = [0u8; CONN_DATA_LEN];
            rs.conn_data()
                .ok_or(libc::EINVAL)?
                .emit(&mut data)
                .map_err(|_| libc::EINVAL)?;
            let param = conn_param(&data);
            let mut c = cma::lock();
            cma::accept(&mut c, nid as usize, Some(&param))
        })();
        if let Err(e) = r {
            rs.conn = None;
            refuse(nid);
            return Err(if e == libc::EAGAIN {
                libc::ECONNABORTED
            } else {
                e
            });
        }
        break (nid, rs, nonblock);
    };
    rs.state = st::ACCEPTING;
    if !nonblock && let Err(e) = finish_connect(&mut rs, true) {
        rs.conn = None;
        refuse(nid);
        return Err(if e == libc::EAGAIN {
            libc::ECONNABORTED
        } else {
            e
        });
    }
    let nfd = chan_fd(nid);
    insert(nfd, rs);
    if !addr.is_null() && !len.is_null() {
        let _ = name(nfd, addr, len, true);
    }
    Ok(nfd)
}

fn name(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, peer: bool) -> R<()> {
    let s = sock(fd)?;
    let rs = lock(&s);
    if addr.is_null() || len.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: a live id block.
    let a = unsafe {
        if peer {
            (*rs.id).route.addr.dst
        } else {
            (*rs.id).route.addr.src
        }
    };
    let full = match c_int::from(a.ss_family) {
        libc::AF_INET => size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => size_of::<libc::sockaddr_in6>(),
        _ => size_of::<libc::sockaddr_storage>(),
    };
    // SAFETY: the program's buffer of `*len` bytes; at most that many written.
    unsafe {
        let n = full.min(*len as usize);
        core::ptr::copy_nonoverlapping((&raw const a).cast::<u8>(), addr.cast::<u8>(), n);
        *len = full as socklen_t;
    }
    Ok(())
}

/// What one attempt of a blocking call found.
enum Step<T> {
    Done(R<T>),
    Wait,
}

/// Runs `attempt` (never blocking, under the socket's lock) until it is done; between attempts the socket's lock
/// is released while the thread waits for a completion event, so another thread can use the socket meanwhile
/// (rsocket.c: its `cq_lock` / `cq_wait_lock` pair). One waiter sits in `ibv_get_cq_event` (rocev2's libibverbs
/// drives the device while a thread waits there); the others poll the channel and look again after 1 ms.
///
/// `rclose` from another thread meanwhile: the waiters are woken (see [`rs_close`]) and this returns `EBADF` (as
/// the next call on a closed descriptor; a TCP socket closed under a reader also ends its read).
fn blocking<T>(s: &Sock, mut attempt: impl FnMut(&mut Rs) -> Step<T>) -> R<T> {
    loop {
        let ((chan, cq), lead) = {
            let mut rs = lock(s);
            if s.closing.load(Ordering::SeqCst) {
                return Err(libc::EBADF);
            }
            if let Step::Done(r) = attempt(&mut rs) {
                return r;
            }
            if rs.state & st::OPENING != 0 {
                // A connection in progress: its REP comes on the id's channel (left for `finish_connect`).
                let mut p = libc::pollfd {
                    fd: chan_fd(rs.id),
                    events: libc::POLLIN,
                    revents: 0,
                };
                drop(rs);
                // SAFETY: one pollfd.
                unsafe { libc::poll(&mut p, 1, 100) };
                continue;
            }
            rs.drain_cm();
            if !rs.arm() {
                // Armed just now: completions that came before are looked at first.
                continue;
            }
            let Some(c) = rs.wait_chan() else {
                return Err(libc::ENOTCONN);
            };
            // Counted under the lock, where `rclose` marks the socket closing: it waits for this thread.
            s.waiters.fetch_add(1, Ordering::SeqCst);
            let lead = s
                .leader
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
            if lead {
                // Under the lock, where the others look at the channel without blocking: they leave its events
                // to this thread while the descriptor is blocking (`Conn::get_cq_event`).
                stream::set_chan_blocking(c.0, true);
            }
            (c, lead)
        };
        if lead {
            let took = stream::take_cq_event(chan);
            if took {
                // Acknowledged here, without the lock: `rclose` destroys the CQ (which waits for every event's
                // acknowledgement) once this thread left, holding no lock this one needs.
                // SAFETY: the connection's CQ, live while this thread counts as a waiter.
                unsafe { verbs::ibv_ack_cq_events(cq, 1) };
            }
            {
                let mut rs = lock(s);
                stream::set_chan_blocking(chan, false);
                s.leader.store(false, Ordering::Release);
                if took {
                    rs.took_event();
                }
            }
            s.waiters.fetch_sub(1, Ordering::SeqCst);
        } else {
            let mut p = libc::pollfd {
                // SAFETY: the connection's channel, live while this thread counts as a waiter.
                fd: unsafe { (*chan).fd },
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd.
            unsafe { libc::poll(&mut p, 1, 1) };
            s.waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

fn rs_send(fd: c_int, buf: *const u8, len: usize, flags: c_int) -> R<isize> {
    let s = sock(fd)?;
    if len > 0 && buf.is_null() {
        return Err(libc::EFAULT);
    }
    let mut done = 0usize;
    blocking(&s, |rs| {
        let nonblock = rs.nonblocking(flags);
        if rs.state & st::OPENING != 0 {
            match finish_connect(rs, false) {
                Ok(()) => {}
                Err(libc::EAGAIN) if !nonblock => return Step::Wait,
                Err(e) => return Step::Done(Err(e)),
            }
        }
        // SAFETY: `done <= len`: within the caller's buffer.
        let at = unsafe { buf.add(done) };
        match rs.send(at, len - done, flags | libc::MSG_DONTWAIT) {
            Ok(n) => {
                done += n;
                if done == len || nonblock {
                    Step::Done(Ok(done as isize))
                } else {
                    Step::Wait
                }
            }
            Err(libc::EWOULDBLOCK) if !nonblock => Step::Wait,
            Err(e) if done > 0 => {
                let _ = e;
                Step::Done(Ok(done as isize))
            }
            Err(e) => Step::Done(Err(e)),
        }
    })
}

fn rs_recv(fd: c_int, buf: *mut u8, len: usize, flags: c_int) -> R<isize> {
    let s = sock(fd)?;
    if len > 0 && buf.is_null() {
        return Err(libc::EFAULT);
    }
    let mut done = 0usize;
    blocking(&s, |rs| {
        let nonblock = rs.nonblocking(flags);
        if rs.state & st::OPENING != 0 {
            match finish_connect(rs, false) {
                Ok(()) => {}
                Err(libc::EAGAIN) if !nonblock => return Step::Wait,
                Err(e) => return Step::Done(Err(e)),
            }
        }
        // SAFETY: `done <= len`: within the caller's buffer.
        let at = unsafe { buf.add(done) };
        match rs.recv(at, len - done, flags | libc::MSG_DONTWAIT) {
            Ok(0) => Step::Done(Ok(done as isize)),
            Ok(n) => {
                done += n;
                let more = flags & libc::MSG_WAITALL != 0
                    && flags & libc::MSG_PEEK == 0
                    && done < len
                    && rs.state & st::READABLE != 0;
                if more && !nonblock {
                    Step::Wait
                } else {
                    Step::Done(Ok(done as isize))
                }
            }
            Err(libc::EWOULDBLOCK) if !nonblock => Step::Wait,
            Err(_) if done > 0 => Step::Done(Ok(done as isize)),
            Err(e) => Step::Done(Err(e)),
        }
    })
}

/// # Safety
/// `iov` is NULL or `n` valid iovecs.
unsafe fn iovecs<'a>(iov: *const libc::iovec, n: c_int) -> R<&'a [libc::iovec]> {
    if n < 0 || (n > 0 && iov.is_null()) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: per the contract.
    Ok(unsafe { core::slice::from_raw_parts(iov, n as usize) })
}

/// Gather-send: the vectors are copied into one buffer and sent as one `rsend` (rsocket.c copies them into its
/// staging buffer likewise).
fn rs_sendv(fd: c_int, iov: &[libc::iovec], flags: c_int) -> R<isize> {
    let mut all = Vec::new();
    for v in iov {
        if v.iov_len > 0 {
            // SAFETY: the program's vector.
            all.extend_from_slice(unsafe {
                core::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len)
            });
        }
    }
    rs_send(fd, all.as_ptr(), all.len(), flags)
}

/// Scatter-receive: straight into each vector in turn (the first waits as `flags` say, the later ones take only
/// what is there unless `MSG_WAITALL`), stopping at a short read; no buffer of the vectors' total size (breaker
/// finding: two 1 TiB vectors made a 2 TiB allocation and aborted the process). `MSG_PEEK` must not consume
/// between vectors, so it peeks once into a buffer of at most the receive buffer's size, then copies out.
/// The most `rrecvmsg`/`rreadv` with `MSG_PEEK` look at (64 MiB: 512 times the default receive buffer; a peek
/// may return less than is queued, as `recvmsg` may).
const PEEK_MAX: usize = 1 << 26;

fn rs_recvv(fd: c_int, iov: &[libc::iovec], flags: c_int) -> R<isize> {
    if let [v] = iov {
        return rs_recv(fd, v.iov_base.cast(), v.iov_len, flags);
    }
    if flags & libc::MSG_PEEK == 0 {
        let mut got = 0usize;
        for v in iov.iter().filter(|v| v.iov_len > 0) {
            let f = if got == 0 || flags & libc::MSG_WAITALL != 0 {
                flags
            } else {
                flags | libc::MSG_DONTWAIT
            };
            match rs_recv(fd, v.iov_base.cast(), v.iov_len, f) {
                Ok(n) => {
                    got += n as usize;
                    if (n as usize) < v.iov_len {
                        break;
                    }
                }
                Err(_) if got > 0 => break,
                Err(e) => return Err(e),
            }
        }
        return Ok(got as isize);
    }
    let total: usize = iov
        .iter()
        .map(|v| v.iov_len)
        .fold(0usize, usize::saturating_add)
        .min(PEEK_MAX);
    let mut tmp = vec![0u8; total];
    let n = rs_recv(fd, tmp.as_mut_ptr(), total, flags)?;
    let mut off = 0usize;
    for v in iov {
        let k = v.iov_len.min(n as usize - off);
        // SAFETY: the program's vector has `iov_len >= k` bytes.
        unsafe { core::ptr::copy_nonoverlapping(tmp.as_ptr().add(off), v.iov_base.cast(), k) };
        off += k;
    }
    Ok(n)
}

fn rs_shutdown(fd: c_int, how: c_int) -> R<()> {
    let s = sock(fd)?;
    let mut rs = lock(&s);
    if rs.state & st::LISTENING != 0 && rs.conn.is_none() {
        return Err(libc::ENOTCONN);
    }
    rs.shutdown(how)
}

/// How long `rclose` waits for the threads blocked on the socket to leave once woken; past it the connection's
/// verbs resources are left allocated (a leak, never a free under a thread still using them).
const CLOSE_WAITERS_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// `rclose`: shuts the connection down (`SHUT_RDWR`), then frees it. Threads blocked in `rsend`/`rrecv` on the
/// socket meanwhile (a program may close under its reader, as with TCP) see it closing (`EBADF`): they are woken
/// ([`stream::Conn::wake_waiters`]) and the channel and the CQ are destroyed only once none waits on them, without
/// the socket's lock (a waiter acknowledges the event it took without it).
fn rs_close(fd: c_int) -> R<()> {
    let s = remove(fd).ok_or(libc::EBADF)?;
    let mut rs = lock(&s);
    s.closing.store(true, Ordering::SeqCst);
    if rs.state & st::CONNECTED != 0 {
        let _ = rs.shutdown(libc::SHUT_RDWR);
    }
    let mut conn = rs.conn.take();
    let id = rs.id;
    rs.id = core::ptr::null_mut();
    drop(rs);
    if let Some(c) = conn.as_mut() {
        let start = Instant::now();
        while s.waiters.load(Ordering::SeqCst) > 0 {
            if start.elapsed() > CLOSE_WAITERS_MAX {
                std::mem::forget(conn.take());
                break;
            }
            c.wake_waiters();
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    drop(conn);
    cma::destroy_id(id)
}

/// Readiness of one rsocket for `events` (rsocket.c `rs_poll_rs`), progressing it without blocking.
fn poll_rs(rs: &mut Rs, events: i16) -> i16 {
    let mut rev = 0i16;
    if rs.state & st::OPENING != 0 {
        let _ = finish_connect(rs, false);
    }
    if rs.conn.is_some()
        && (rs.state & st::CONNECTED != 0 || rs.state & (st::DISCONNECTED | st::ERROR) != 0)
    {
        rs.drain_cm();
        let _ = rs.process_cq(true, |_| true);
        if events & libc::POLLIN != 0 && rs.conn_have_rdata() {
            rev |= libc::POLLIN;
        }
        if events & libc::POLLOUT != 0 && rs.can_send() {
            rev |= libc::POLLOUT;
        }
        // The hangup is reported once the data that came before it is read (rsocket.c reports both at once,
        // so a reader that treats POLLHUP as an error, as rstream's `do_poll`, loses the race with the peer's
        // shutdown; TCP reports no POLLHUP for a peer's FIN either).
        if rs.state & st::CONNECTED == 0 && !rs.have_rdata() {
            rev |= if rs.state == st::DISCONNECTED {
                libc::POLLHUP
            } else {
                libc::POLLERR
            };
        }
        return rev;
    }
    if rs.state == st::LISTENING {
        let mut p = libc::pollfd {
            fd: chan_fd(rs.id),
            events,
            revents: 0,
        };
        // SAFETY: one pollfd.
        unsafe { libc::poll(&mut p, 1, 0) };
        return p.revents;
    }
    if rs.state == st::CONNECT_ERROR {
        return (events & (libc::POLLIN | libc::POLLOUT)) | libc::POLLERR;
    }
    0
}

/// rsocket.c `rpoll`: rsockets and plain descriptors in one set. Ready rsockets are found by progressing them;
/// otherwise the CQs are armed and the completion channels (listening sockets: their event channels) are
/// polled with the plain descriptors, at most 100 ms at a time, then everything is checked again.
fn rs_poll(fds: &mut [libc::pollfd], timeout: c_int) -> R<c_int> {
    let start = Instant::now();
    let mut rfds: Vec<libc::pollfd> = Vec::with_capacity(fds.len());
    loop {
        let mut cnt = 0;
        for f in fds.iter_mut() {
            f.revents = match lookup(f.fd) {
                Some(s) => poll_rs(&mut lock(&s), f.events),
                None => {
                    let mut p = *f;
                    // SAFETY: one pollfd.
                    unsafe { libc::poll(&mut p, 1, 0) };
                    p.revents
                }
            };
            if f.revents != 0 {
                cnt += 1;
            }
        }
        if cnt > 0 || timeout == 0 {
            return Ok(cnt);
        }
        let wait = if timeout < 0 {
            100
        } else {
            let left = i64::from(timeout) - start.elapsed().as_millis() as i64;
            if left <= 0 {
                return Ok(0);
            }
            left.min(100) as c_int
        };
        rfds.clear();
        let mut ready = false;
        for f in fds.iter() {
            let (fd, ev) = match lookup(f.fd) {
                Some(s) => {
                    let mut rs = lock(&s);
                    if rs.state & st::OPENING != 0 {
                        // A connection in progress: its REP arrives on the id's channel.
                        (chan_fd(rs.id), libc::POLLIN)
                    } else if let Some(c) = rs.conn.as_mut() {
                        if !c.cq_armed {
                            // SAFETY: the connection's CQ.
                            unsafe { verbs::req_notify_cq(c.cq) };
                            c.cq_armed = true;
                        }
                        let cfd = c.chan_fd();
                        // Completions that came before the arming.
                        ready |= poll_rs(&mut rs, f.events) != 0;
                        (cfd, libc::POLLIN)
                    } else {
                        (chan_fd(rs.id), libc::POLLIN)
                    }
                }
                None => (f.fd, f.events),
            };
            rfds.push(libc::pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
        if ready {
            continue;
        }
        // SAFETY: `rfds.len()` pollfds.
        let n = unsafe { libc::poll(rfds.as_mut_ptr(), rfds.len() as libc::nfds_t, wait) };
        if n < 0 {
            return Err(errno());
        }
        for (f, r) in fds.iter().zip(&rfds) {
            if r.revents != 0
                && let Some(s) = lookup(f.fd)
                && let Some(c) = lock(&s).conn.as_mut()
            {
                c.get_cq_event();
            }
        }
    }
}

/// Whether bit `fd` is set in the program's `fd_set` (as `FD_ISSET`, which panics beyond `FD_SETSIZE`: a
/// program may pass larger sets with a larger `nfds`, as glibc's `select` allows).
///
/// # Safety
/// `set` holds at least `fd + 1` bits (the caller's `nfds` contract).
unsafe fn fd_isset(fd: c_int, set: *const libc::fd_set) -> bool {
    let (word, bit) = (fd as usize / 64, fd as usize % 64);
    // SAFETY: the caller's contract; `fd_set` is an array of longs (8 bytes on x86_64 Linux).
    unsafe { (*set.cast::<u64>().add(word) >> bit) & 1 != 0 }
}

/// Sets bit `fd` of the program's `fd_set` (as `FD_SET`, without its `FD_SETSIZE` panic).
///
/// # Safety
/// As [`fd_isset`].
unsafe fn fd_set(fd: c_int, set: *mut libc::fd_set) {
    let (word, bit) = (fd as usize / 64, fd as usize % 64);
    // SAFETY: as `fd_isset`.
    unsafe { *set.cast::<u64>().add(word) |= 1 << bit };
}

fn rs_select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> R<c_int> {
    if nfds < 0 {
        return Err(libc::EINVAL);
    }
    let ms = if timeout.is_null() {
        -1
    } else {
        // SAFETY: the program's timeout.
        let t = unsafe { *timeout };
        if t.tv_sec < 0 || t.tv_usec < 0 {
            // select(2): a negative timeout is EINVAL.
            return Err(libc::EINVAL);
        }
        t.tv_sec
            .saturating_mul(1000)
            .saturating_add(t.tv_usec / 1000)
            .min(c_int::MAX as libc::time_t) as c_int
    };
    let mut fds = Vec::new();
    for fd in 0..nfds {
        let mut ev = 0i16;
        // SAFETY: the program's sets (NULL or `nfds` bits).
        unsafe {
            if !r.is_null() && fd_isset(fd, r) {
                ev |= libc::POLLIN;
            }
            if !w.is_null() && fd_isset(fd, w) {
                ev |= libc::POLLOUT;
            }
            if !e.is_null() && fd_isset(fd, e) {
                ev |= libc::POLLPRI;
            }
        }
        if ev != 0 {
            fds.push(libc::pollfd {
                fd,
                events: ev,
                revents: 0,
            });
        }
    }
    rs_poll(&mut fds, ms)?;
    let mut n = 0;
    // SAFETY: the program's sets (NULL or `nfds` bits); cleared over their `nfds` bits only.
    unsafe {
        for set in [r, w, e] {
            if !set.is_null() {
                let words = (nfds as usize).div_ceil(64);
                core::ptr::write_bytes(set.cast::<u64>(), 0, words);
            }
        }
        for f in &fds {
            if !r.is_null() && f.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                fd_set(f.fd, r);
                n += 1;
            }
            if !w.is_null() && f.revents & (libc::POLLOUT | libc::POLLERR) != 0 {
                fd_set(f.fd, w);
                n += 1;
            }
            if !e.is_null() && f.revents & libc::POLLPRI != 0 {
                fd_set(f.fd, e);
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Reads an `int` option value.
///
/// # Safety
/// `val` is NULL or `len` readable bytes.
unsafe fn int_opt(val: *const c_void, len: socklen_t) -> R<c_int> {
    if val.is_null() || (len as usize) < size_of::<c_int>() {
        return Err(libc::EINVAL);
    }
    // SAFETY: per the contract.
    Ok(unsafe { val.cast::<c_int>().read_unaligned() })
}

fn bit(opts: &mut u64, name: c_int, on: bool) {
    let b = 1u64 << (name as u32 & 63);
    if on {
        *opts |= b;
    } else {
        *opts &= !b;
    }
}

fn rs_setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> R<()> {
    let s = sock(fd)?;
    let mut rs = lock(&s);
    // SAFETY (every `int_opt`): the program's option value of `len` bytes.
    let int = || unsafe { int_opt(val, len) };
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR) => {
            let v = int()?;
            let mut st = cma::lock();
            cma::check_id(&st, rs.id)?;
            if let Some(i) = st.ids.get_mut(&(rs.id as usize)) {
                i.reuseaddr = v != 0;
            }
            drop(st);
            bit(&mut rs.so_opts, name, v != 0);
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => {
            let v = int()? as u32;
            if rs.conn.is_none() {
                rs.rbuf_size = v.saturating_mul(2).max(stream::SNDLOWAT << 1);
            }
        }
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => {
            let v = int()? as u32;
            if rs.conn.is_none() {
                rs.sbuf_size = v.saturating_mul(2).max(stream::SNDLOWAT << 1);
            }
        }
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            if val.is_null() || (len as usize) < size_of::<libc::linger>() {
                return Err(libc::EINVAL);
            }
            // SAFETY: checked size.
            let l = unsafe { val.cast::<libc::linger>().read_unaligned() };
            // Inverted, as rsocket.c keeps it (the default, 0, is "on").
            bit(&mut rs.so_opts, name, l.l_onoff == 0);
        }
        (libc::SOL_SOCKET, libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
            let v = int()?;
            bit(&mut rs.so_opts, name, v != 0);
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => {
            let v = int()?;
            bit(&mut rs.tcp_opts, name, v != 0);
        }
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => {
            let v = int()?;
            if v <= 0 {
                return Err(libc::EINVAL);
            }
            rs.keepalive_time = v;
        }
        (
            libc::IPPROTO_TCP,
            libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL | libc::TCP_MAXSEG | libc::TCP_CONGESTION,
        ) => {}
        (libc::IPPROTO_IP, libc::IP_TOS) => {
            let v = int()?;
            let mut b = v as u8;
            // SAFETY: a live id; one byte.
            if unsafe {
                crate::exports::rocev2_rdma_set_option(
                    rs.id,
                    RDMA_OPTION_ID,
                    RDMA_OPTION_ID_TOS,
                    (&raw mut b).cast(),
                    1,
                )
            } != 0
            {
                return Err(errno());
            }
            rs.ip_tos = v;
        }
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => {
            let v = int()?;
            bit(&mut rs.ipv6_opts, name, v != 0);
        }
        (SOL_RDMA, RDMA_SQSIZE | RDMA_RQSIZE | RDMA_INLINE | RDMA_IOMAPSIZE) => {
            if rs.state >= st::OPENING {
                return Err(libc::EINVAL);
            }
            let v = (int()? as u32).min(u32::from(stream::QP_MAX_SIZE)) as u16;
            match name {
                RDMA_SQSIZE => rs.sq_size = v,
                RDMA_RQSIZE => rs.rq_size = v,
                RDMA_INLINE => rs.sq_inline = v,
                _ => rs.iomap_size = v,
            }
        }
        (SOL_RDMA, RDMA_ROUTE) => return Err(libc::ENOTSUP),
        _ => return Err(libc::ENOTSUP),
    }
    Ok(())
}

fn rs_getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> R<()> {
    let s = sock(fd)?;
    let mut rs = lock(&s);
    if val.is_null() || len.is_null() {
        return Err(libc::EFAULT);
    }
    let has = |o: u64| c_int::from(o & (1u64 << (name as u32 & 63)) != 0);
    let v: c_int = match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEADDR | libc::SO_KEEPALIVE | libc::SO_OOBINLINE) => {
            has(rs.so_opts)
        }
        (libc::SOL_SOCKET, libc::SO_RCVBUF) => rs.rbuf_size as c_int,
        (libc::SOL_SOCKET, libc::SO_SNDBUF) => rs.sbuf_size as c_int,
        (libc::SOL_SOCKET, libc::SO_ERROR) => core::mem::take(&mut rs.err),
        (libc::SOL_SOCKET, libc::SO_LINGER) => {
            // SAFETY: `*len` bytes of the program's buffer.
            unsafe {
                if (*len as usize) < size_of::<libc::linger>() {
                    return Err(libc::EINVAL);
                }
                val.cast::<libc::linger>().write_unaligned(libc::linger {
                    l_onoff: 1 - has(rs.so_opts),
                    l_linger: 0,
                });
                *len = size_of::<libc::linger>() as socklen_t;
            }
            return Ok(());
        }
        (libc::IPPROTO_TCP, libc::TCP_NODELAY) => has(rs.tcp_opts),
        (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE) => rs.keepalive_time,
        (libc::IPPROTO_TCP, libc::TCP_KEEPCNT | libc::TCP_KEEPINTVL) => 1,
        (libc::IPPROTO_TCP, libc::TCP_MAXSEG) => 2048,
        (libc::IPPROTO_IP, libc::IP_TOS) => rs.ip_tos,
        (libc::IPPROTO_IPV6, libc::IPV6_V6ONLY) => has(rs.ipv6_opts),
        (SOL_RDMA, RDMA_SQSIZE) => c_int::from(rs.sq_size),
        (SOL_RDMA, RDMA_RQSIZE) => c_int::from(rs.rq_size),
        (SOL_RDMA, RDMA_INLINE) => c_int::from(rs.sq_inline),
        (SOL_RDMA, RDMA_IOMAPSIZE) => c_int::from(rs.iomap_size),
        _ => return Err(libc::ENOTSUP),
    };
    // SAFETY: `*len` bytes of the program's buffer, checked to hold an int.
    unsafe {
        if (*len as usize) < size_of::<c_int>() {
            return Err(libc::EINVAL);
        }
        val.cast::<c_int>().write_unaligned(v);
        *len = size_of::<c_int>() as socklen_t;
    }
    Ok(())
}

fn rs_fcntl(fd: c_int, cmd: c_int, arg: c_int) -> R<c_int> {
    let s = sock(fd)?;
    let mut rs = lock(&s);
    match cmd {
        libc::F_GETFL => Ok(rs.fs_flags),
        libc::F_SETFL => {
            if rs.state == st::LISTENING {
                set_fd_nonblock(fd, arg & libc::O_NONBLOCK != 0);
            }
            rs.fs_flags = arg;
            Ok(0)
        }
        libc::F_GETFD => Ok(rs.fd_flags),
        libc::F_SETFD => {
            rs.fd_flags = arg;
            Ok(0)
        }
        _ => Err(libc::ENOTSUP),
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The C entry points (attached to their names by `versioned!` in lib.rs).

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rsocket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    c_ret(|| rs_socket(domain, ty, proto)) as c_int
}

/// # Safety
/// `addr` is a sockaddr of its family's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rbind(s: c_int, addr: *const sockaddr, _len: socklen_t) -> c_int {
    c_ret(|| rs_bind(s, addr).map(|()| 0)) as c_int
}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rlisten(s: c_int, backlog: c_int) -> c_int {
    c_ret(|| rs_listen(s, backlog).map(|()| 0)) as c_int
}

/// # Safety
/// `addr`/`len` are NULL or writable (`*len` bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_raccept(
    s: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    c_ret(|| rs_accept(s, addr, len)) as c_int
}

/// # Safety
/// `addr` is a sockaddr of its family's size.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rconnect(
    s: c_int,
    addr: *const sockaddr,
    _len: socklen_t,
) -> c_int {
    c_ret(|| rs_connect(s, addr).map(|()| 0)) as c_int
}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rshutdown(s: c_int, how: c_int) -> c_int {
    c_ret(|| rs_shutdown(s, how).map(|()| 0)) as c_int
}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rclose(s: c_int) -> c_int {
    c_ret(|| rs_close(s).map(|()| 0)) as c_int
}

/// # Safety
/// `buf` has `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rrecv(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    c_ret(|| rs_recv(s, buf.cast(), len, flags).map(|n| n as i64)) as ssize_t
}

/// # Safety
/// `buf` has `len` writable bytes; `src`/`alen` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rrecvfrom(
    s: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    src: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    c_ret(|| {
        let n = rs_recv(s, buf.cast(), len, flags)?;
        if n > 0 && !src.is_null() && !alen.is_null() {
            let _ = name(s, src, alen, true);
        }
        Ok(n as i64)
    }) as ssize_t
}

/// # Safety
/// `msg` is a valid msghdr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rrecvmsg(
    s: c_int,
    msg: *mut libc::msghdr,
    flags: c_int,
) -> ssize_t {
    c_ret(|| {
        // SAFETY: per the contract.
        let m = unsafe { msg.as_ref() }.ok_or(libc::EFAULT)?;
        // SAFETY: the message's vectors.
        let v = unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) }?;
        rs_recvv(s, v, flags).map(|n| n as i64)
    }) as ssize_t
}

/// # Safety
/// `buf` has `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rsend(
    s: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
) -> ssize_t {
    c_ret(|| rs_send(s, buf.cast(), len, flags).map(|n| n as i64)) as ssize_t
}

/// # Safety
/// `buf` has `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rsendto(
    s: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    dst: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    c_ret(|| {
        if !dst.is_null() || alen != 0 {
            return Err(libc::EISCONN);
        }
        rs_send(s, buf.cast(), len, flags).map(|n| n as i64)
    }) as ssize_t
}

/// # Safety
/// `msg` is a valid msghdr.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rsendmsg(
    s: c_int,
    msg: *const libc::msghdr,
    flags: c_int,
) -> ssize_t {
    c_ret(|| {
        // SAFETY: per the contract.
        let m = unsafe { msg.as_ref() }.ok_or(libc::EFAULT)?;
        // SAFETY: the message's vectors.
        let v = unsafe { iovecs(m.msg_iov, m.msg_iovlen as c_int) }?;
        rs_sendv(s, v, flags).map(|n| n as i64)
    }) as ssize_t
}

/// # Safety
/// `buf` has `count` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rread(s: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    c_ret(|| rs_recv(s, buf.cast(), count, 0).map(|n| n as i64)) as ssize_t
}

/// # Safety
/// `iov` is `n` valid iovecs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rreadv(s: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    c_ret(|| {
        // SAFETY: per the contract.
        let v = unsafe { iovecs(iov, n) }?;
        rs_recvv(s, v, 0).map(|n| n as i64)
    }) as ssize_t
}

/// # Safety
/// `buf` has `count` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rwrite(s: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    c_ret(|| rs_send(s, buf.cast(), count, 0).map(|n| n as i64)) as ssize_t
}

/// # Safety
/// `iov` is `n` valid iovecs.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rwritev(s: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    c_ret(|| {
        // SAFETY: per the contract.
        let v = unsafe { iovecs(iov, n) }?;
        rs_sendv(s, v, 0).map(|n| n as i64)
    }) as ssize_t
}

/// # Safety
/// `fds` is NULL or `nfds` pollfds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rpoll(
    fds: *mut libc::pollfd,
    nfds: libc::nfds_t,
    timeout: c_int,
) -> c_int {
    c_ret(|| {
        if nfds > 0 && fds.is_null() {
            return Err(libc::EFAULT);
        }
        let f = if nfds == 0 {
            &mut [][..]
        } else {
            // SAFETY: per the contract.
            unsafe { core::slice::from_raw_parts_mut(fds, nfds as usize) }
        };
        rs_poll(f, timeout)
    }) as c_int
}

/// # Safety
/// The sets are NULL or valid `fd_set`s; `timeout` NULL or valid.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    timeout: *mut libc::timeval,
) -> c_int {
    c_ret(|| rs_select(nfds, r, w, e, timeout)) as c_int
}

/// # Safety
/// `addr`/`len` writable (`*len` bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rgetpeername(
    s: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    c_ret(|| name(s, addr, len, true).map(|()| 0)) as c_int
}

/// # Safety
/// `addr`/`len` writable (`*len` bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rgetsockname(
    s: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> c_int {
    c_ret(|| name(s, addr, len, false).map(|()| 0)) as c_int
}

/// # Safety
/// `val` is `len` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rsetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    c_ret(|| rs_setsockopt(s, level, name, val, len).map(|()| 0)) as c_int
}

/// # Safety
/// `val`/`len` writable (`*len` bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rgetsockopt(
    s: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    c_ret(|| rs_getsockopt(s, level, name, val, len).map(|()| 0)) as c_int
}

/// `int rfcntl(int socket, int cmd, ... /* arg */)`: the one variadic `int` argument of `F_SETFL`/`F_SETFD`
/// arrives in the third integer register under the x86-64 SysV convention, where this signature reads it (for
/// the other commands it is not read).
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_rfcntl(s: c_int, cmd: c_int, arg: c_int) -> c_int {
    c_ret(|| rs_fcntl(s, cmd, arg)) as c_int
}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_riomap(
    _s: c_int,
    _buf: *mut c_void,
    _len: size_t,
    _prot: c_int,
    _flags: c_int,
    _offset: libc::off_t,
) -> libc::off_t {
    set_errno(libc::ENOSYS);
    -1
}

#[unsafe(no_mangle)]
pub extern "C" fn rocev2_riounmap(_s: c_int, _buf: *mut c_void, _len: size_t) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

/// Returns `(size_t)-1` with `ENOSYS`.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_riowrite(
    _s: c_int,
    _buf: *const c_void,
    _count: size_t,
    _offset: libc::off_t,
    _flags: c_int,
) -> size_t {
    set_errno(libc::ENOSYS);
    size_t::MAX
}
