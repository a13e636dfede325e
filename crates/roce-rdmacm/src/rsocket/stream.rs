//! One stream rsocket: its rdma_cm id, options and, once connected, the data path of librdmacm's rsockets
//! (rdma-core `librdmacm/rsocket.c`, read for the protocol facts; wire formats in `roce_wire::rsocket`).
//!
//! Each side registers a receive buffer (`rbuf`, two halves), a send staging buffer (`sbuf`, plus four 16-byte
//! control slots when the inline threshold is below 16) and a two-entry target list the peer RDMA-writes
//! [`Sge`]s into. Data goes out as RDMA WRITE WITH IMMEDIATE into the region at the current target entry with an
//! `OP_DATA` message (transfers start at 2 KiB and double up to 64 KiB while more is queued; up to the inline
//! threshold they are sent inline, else staged in `sbuf`); the receiver queues each message's byte count in a
//! ring (`rmsg`) and reads the bytes from `rbuf` in order. Credits: a send needs a free send WQE, 2 KiB of staging
//! space (`RS_SNDLOWAT`), a send sequence number different from the peer's limit (`sseq_comp`) and room in the
//! target entry; the receiver grants more with `OP_SGL` (a new buffer half when one is free, new receive
//! credits always), at most four control messages in flight (`RS_QP_CTRL_SIZE`). Every WQE is signalled.

use core::ffi::c_void;
use std::alloc::Layout;

use libc::c_int;
use roce_wire::rsocket::{
    CONN_VERSION, CTRL_DISCONNECT, CTRL_SHUTDOWN, ConnData, FLAG_IOMAP, FLAG_NET, Msg, OP_CTRL,
    OP_DATA, OP_IOMAP_SGL, OP_SGL, OP_WRITE, SGE_LEN, SGL_SIZE, Sge, credit_limit,
};

use super::verbs;
use crate::abi::*;
use crate::bridge;
use crate::cma::{self, R};

/// rsocket.c `RS_OLAP_START_SIZE`: the first transfer of a send.
pub const OLAP_START_SIZE: u32 = 2048;
/// rsocket.c `RS_MAX_TRANSFER`: the largest single RDMA WRITE of a send.
pub const MAX_TRANSFER: u32 = 65536;
/// rsocket.c `RS_SNDLOWAT`: staging space a send needs free.
pub const SNDLOWAT: u32 = 2048;
/// rsocket.c `RS_QP_MIN_SIZE` / `RS_QP_MAX_SIZE`.
pub const QP_MIN_SIZE: u16 = 16;
pub const QP_MAX_SIZE: u16 = 0xfffe;
/// rsocket.c `RS_QP_CTRL_SIZE`: control messages in flight.
pub const QP_CTRL_SIZE: u32 = 4;
/// rsocket.c defaults (`def_inline`, `def_sqsize`, `def_rqsize`, `def_mem`, `def_wmem`).
pub const DEF_INLINE: u16 = 64;
pub const DEF_SQSIZE: u16 = 384;
pub const DEF_RQSIZE: u16 = 384;
pub const DEF_MEM: u32 = 1 << 17;
pub const DEF_WMEM: u32 = 1 << 17;

/// How long `rshutdown` / `rclose` wait for their sends (the disconnect or shutdown message and what was queued
/// before it) while none of them completes; then they go on: `rshutdown` returns (0 as rsocket.c, which ignores
/// the outcome of that wait; `ETIMEDOUT` when no control message could be posted at all) and `rclose` destroys the
/// id, whose DREQ tells the peer. rsocket.c waits for ever, so a peer that posts no receives (every
/// message then meets RNR NAKs, retried for ever with `rnr_retry` 7) blocked the close for ever. A peer that is
/// gone makes the sends fail instead: 7 retries of the 67 ms local ACK timeout (`cma::DEFAULT_ACK_TIMEOUT` 14),
/// well inside this bound.
pub const SHUTDOWN_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// Work request ids: bit 63 marks a receive; a send's id is its message's immediate value.
const WR_ID_RECV: u64 = 1 << 63;

/// State bits, ordered as rsocket.c's `enum rs_state`.
pub mod st {
    pub const INIT: u32 = 0;
    pub const BOUND: u32 = 0x1;
    pub const LISTENING: u32 = 0x2;
    pub const OPENING: u32 = 0x4;
    /// REQ sent, waiting for the REP (rsocket.c `rs_connecting`).
    pub const CONNECTING: u32 = OPENING | 0x40;
    /// REP sent by a non-blocking `raccept`, waiting for the RTU (rsocket.c `rs_accepting`).
    pub const ACCEPTING: u32 = OPENING | 0x80;
    pub const CONNECTED: u32 = 0x100;
    pub const WRITABLE: u32 = 0x200;
    pub const READABLE: u32 = 0x400;
    pub const CONNECT_RDWR: u32 = CONNECTED | WRITABLE | READABLE;
    pub const CONNECT_ERROR: u32 = 0x800;
    pub const DISCONNECTED: u32 = 0x1000;
    pub const ERROR: u32 = 0x2000;
}

/// Page-aligned zeroed memory the peer's RDMA writes may reach (never behind a Rust reference).
pub(crate) struct Region {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Region {
    fn new(len: usize) -> R<Self> {
        let layout = Layout::from_size_align(len.max(1), 4096).map_err(|_| libc::EINVAL)?;
        // SAFETY: a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(libc::ENOMEM);
        }
        Ok(Region { ptr, len })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe {
            std::alloc::dealloc(
                self.ptr,
                Layout::from_size_align_unchecked(self.len.max(1), 4096),
            )
        };
    }
}

/// The verbs resources and flow-control state of a connected rsocket.
pub(crate) struct Conn {
    id: *mut RdmaCmId,
    torn: bool,
    pub qp: *mut IbvQp,
    pub cq: *mut c_void,
    pub chan: *mut IbvCompChannel,
    sbuf: Region,
    smr: *mut IbvMr,
    rbuf: Region,
    rmr: *mut IbvMr,
    tgt: Region,
    tmr: *mut IbvMr,
    rmsg: Vec<u32>,
    rmsg_head: usize,
    rmsg_tail: usize,
    ctrl_seqno: u32,
    ctrl_max_seqno: u32,
    sseq_no: u16,
    sseq_comp: u16,
    rseq_no: u16,
    rseq_comp: u16,
    remote_sgl: Sge,
    remote_sge: u32,
    swap: bool,
    target_sge: usize,
    rbuf_bytes_avail: u32,
    rbuf_free_offset: u32,
    rbuf_offset: u32,
    sbuf_bytes_avail: u32,
    /// Offset in `sbuf` of the next staged byte (`ssgl[0].addr`).
    ssgl_off: u32,
    sqe_avail: u32,
    pub cq_armed: bool,
    unack_cqe: u32,
    sbuf_size: u32,
    rbuf_size: u32,
    sq_size: u16,
    rq_size: u16,
    sq_inline: u16,
    /// Messages refused from the peer (data beyond the receive buffer, a full message ring): each one ends the
    /// connection with `EPROTO`.
    pub bad_msgs: u64,
    /// Work completions taken so far (progress, for [`SHUTDOWN_IDLE`]).
    completions: u64,
}

/// A stream rsocket.
pub(crate) struct Rs {
    pub id: *mut RdmaCmId,
    pub state: u32,
    pub fs_flags: c_int,
    pub fd_flags: c_int,
    pub err: c_int,
    pub sbuf_size: u32,
    pub rbuf_size: u32,
    pub sq_size: u16,
    pub rq_size: u16,
    pub sq_inline: u16,
    pub iomap_size: u16,
    pub so_opts: u64,
    pub tcp_opts: u64,
    pub ipv6_opts: u64,
    pub ip_tos: c_int,
    pub keepalive_time: c_int,
    /// `rshutdown` closed our sending side.
    pub wr_shut: bool,
    pub conn: Option<Box<Conn>>,
}

// SAFETY: the raw pointers are libibverbs / librdmacm objects usable from any thread; an Rs is only reached
// through its Mutex.
unsafe impl Send for Rs {}

fn errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

impl Rs {
    /// A new rsocket on `id`, with the defaults of rsocket.c or the sizes of the listening `parent`.
    pub fn new(id: *mut RdmaCmId, parent: Option<&Rs>) -> Rs {
        let mut r = Rs {
            id,
            state: st::INIT,
            fs_flags: 0,
            fd_flags: 0,
            err: 0,
            sbuf_size: DEF_WMEM,
            rbuf_size: DEF_MEM,
            sq_size: DEF_SQSIZE,
            rq_size: DEF_RQSIZE,
            sq_inline: DEF_INLINE,
            iomap_size: 0,
            so_opts: 0,
            tcp_opts: 0,
            ipv6_opts: 0,
            ip_tos: 0,
            keepalive_time: 0,
            wr_shut: false,
            conn: None,
        };
        if let Some(p) = parent {
            (r.sbuf_size, r.rbuf_size) = (p.sbuf_size, p.rbuf_size);
            (r.sq_size, r.rq_size, r.sq_inline) = (p.sq_size, p.rq_size, p.sq_inline);
            (r.fs_flags, r.fd_flags) = (p.fs_flags, p.fd_flags);
            (r.so_opts, r.tcp_opts) = (p.so_opts, p.tcp_opts);
        }
        r
    }

    pub fn nonblocking(&self, flags: c_int) -> bool {
        self.fs_flags & libc::O_NONBLOCK != 0 || flags & libc::MSG_DONTWAIT != 0
    }

    /// rsocket.c `rs_create_ep`: CQ and completion channel, the RC QP (every WQE signalled, two send SGEs, no
    /// receive SGE), the three registered buffers, and `rq_size` posted receives.
    pub fn create_ep(&mut self) -> R<()> {
        self.sq_size = self.sq_size.clamp(QP_MIN_SIZE, QP_MAX_SIZE);
        self.rq_size = self.rq_size.clamp(QP_MIN_SIZE, QP_MAX_SIZE);
        let id = self.id;
        // SAFETY: a live id of this library with its device resolved.
        let verbs_ctx = unsafe { (*id).verbs };
        if verbs_ctx.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: libibverbs calls on the id's context; every result is checked.
        let chan = unsafe { bridge::ibv_create_comp_channel(verbs_ctx) }.cast::<IbvCompChannel>();
        if chan.is_null() {
            return Err(errno());
        }
        // SAFETY: as above.
        let cq = unsafe {
            bridge::ibv_create_cq(
                verbs_ctx,
                c_int::from(self.sq_size) + c_int::from(self.rq_size),
                id.cast(),
                chan.cast(),
                0,
            )
        };
        if cq.is_null() {
            let e = errno();
            // SAFETY: the channel just made.
            unsafe { bridge::ibv_destroy_comp_channel(chan.cast()) };
            return Err(e);
        }
        // SAFETY: the channel's descriptor: waits go through poll(), reads never block.
        unsafe {
            let fd = (*chan).fd;
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            );
        }
        let mut attr = IbvQpInitAttr {
            qp_context: core::ptr::null_mut(),
            send_cq: cq.cast(),
            recv_cq: cq.cast(),
            srq: core::ptr::null_mut(),
            cap: IbvQpCap {
                max_send_wr: u32::from(self.sq_size),
                max_recv_wr: u32::from(self.rq_size),
                max_send_sge: 2,
                max_recv_sge: 1,
                max_inline_data: u32::from(self.sq_inline),
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 1,
        };
        // SAFETY: a live id block.
        unsafe {
            (*id).send_cq_channel = chan.cast();
            (*id).recv_cq_channel = chan.cast();
            (*id).send_cq = cq;
            (*id).recv_cq = cq;
        }
        let made = {
            let mut s = cma::lock();
            cma::create_qp(&mut s, id as usize, core::ptr::null_mut(), &mut attr)
        };
        let undo_cq = || {
            // SAFETY: the CQ and channel made above, unused by any QP.
            unsafe {
                bridge::ibv_destroy_cq(cq);
                bridge::ibv_destroy_comp_channel(chan.cast());
                (*id).send_cq_channel = core::ptr::null_mut();
                (*id).recv_cq_channel = core::ptr::null_mut();
                (*id).send_cq = core::ptr::null_mut();
                (*id).recv_cq = core::ptr::null_mut();
            }
        };
        if let Err(e) = made {
            undo_cq();
            return Err(e);
        }
        self.sq_inline = attr.cap.max_inline_data.min(u32::from(u16::MAX)) as u16;
        // SAFETY: the QP just made.
        let qp = unsafe { (*id).qp };
        // SAFETY: as above.
        let pd = unsafe { (*qp).pd };
        let ctrl = if usize::from(self.sq_inline) < SGE_LEN {
            SGE_LEN as u32 * QP_CTRL_SIZE
        } else {
            0
        };
        let bufs = (|| -> R<_> {
            let sbuf = Region::new((self.sbuf_size + ctrl) as usize)?;
            let rbuf = Region::new(self.rbuf_size as usize)?;
            let tgt = Region::new(SGE_LEN * SGL_SIZE as usize)?;
            Ok((sbuf, rbuf, tgt))
        })();
        let (sbuf, rbuf, tgt) = match bufs {
            Ok(b) => b,
            Err(e) => {
                let mut s = cma::lock();
                cma::destroy_qp(&mut s, id as usize);
                drop(s);
                undo_cq();
                return Err(e);
            }
        };
        let reg = |r: &Region, access: c_int| {
            // SAFETY: the region is ours and outlives the MR (deregistered in `teardown` before it is freed).
            unsafe { verbs::ibv_reg_mr(pd.cast(), r.ptr.cast(), r.len, access) }
        };
        let smr = reg(&sbuf, IBV_ACCESS_LOCAL_WRITE);
        let rmr = reg(&rbuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        let tmr = reg(&tgt, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
        let mut c = Box::new(Conn {
            id,
            torn: false,
            qp,
            cq,
            chan,
            sbuf,
            smr,
            rbuf,
            rmr,
            tgt,
            tmr,
            rmsg: vec![0; usize::from(self.rq_size) + 1],
            rmsg_head: 0,
            rmsg_tail: 0,
            ctrl_seqno: 0,
            ctrl_max_seqno: QP_CTRL_SIZE,
            sseq_no: 0,
            sseq_comp: 0,
            rseq_no: 0,
            rseq_comp: self.rq_size >> 1,
            remote_sgl: Sge::default(),
            remote_sge: 0,
            swap: false,
            target_sge: 0,
            rbuf_bytes_avail: self.rbuf_size >> 1,
            rbuf_free_offset: self.rbuf_size >> 1,
            rbuf_offset: 0,
            sbuf_bytes_avail: self.sbuf_size,
            ssgl_off: 0,
            sqe_avail: u32::from(self.sq_size) - QP_CTRL_SIZE,
            cq_armed: false,
            unack_cqe: 0,
            sbuf_size: self.sbuf_size,
            rbuf_size: self.rbuf_size,
            sq_size: self.sq_size,
            rq_size: self.rq_size,
            sq_inline: self.sq_inline,
            bad_msgs: 0,
            completions: 0,
        });
        if smr.is_null() || rmr.is_null() || tmr.is_null() {
            let e = errno();
            drop(c);
            return Err(e);
        }
        for _ in 0..self.rq_size {
            if let Err(e) = c.post_recv() {
                drop(c);
                return Err(e);
            }
        }
        self.conn = Some(c);
        Ok(())
    }

    /// rsocket.c `rs_format_conn_data`: our half of the connection data.
    pub fn conn_data(&self) -> Option<ConnData> {
        let c = self.conn.as_ref()?;
        // SAFETY: registered MRs of this connection.
        let (tkey, rkey) = unsafe { ((*c.tmr).rkey, (*c.rmr).rkey) };
        Some(ConnData {
            version: CONN_VERSION,
            flags: FLAG_IOMAP
                | if cfg!(target_endian = "big") {
                    FLAG_NET
                } else {
                    0
                },
            credits: c.rq_size,
            target_iomap_size: 0,
            target_sgl: Sge {
                addr: c.tgt.ptr as u64,
                key: tkey,
                length: SGL_SIZE,
            },
            data_buf: Sge {
                addr: c.rbuf.ptr as u64,
                key: rkey,
                length: c.rbuf_size >> 1,
            },
        })
    }

    /// rsocket.c `rs_save_conn_data`: the peer's target list, its first buffer half and initial credits.
    pub fn save_conn_data(&mut self, d: &ConnData) {
        let Some(c) = self.conn.as_mut() else { return };
        c.remote_sgl = d.target_sgl;
        c.remote_sge = 1;
        c.swap = (d.flags & FLAG_NET != 0) != cfg!(target_endian = "big");
        c.set_target(0, d.data_buf);
        c.sseq_comp = d.credits;
    }

    /// rsocket.c `rs_can_send`.
    pub fn can_send(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| c.can_send())
    }

    pub fn have_rdata(&self) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|c| c.rmsg_head != c.rmsg_tail)
    }

    pub fn conn_have_rdata(&self) -> bool {
        self.have_rdata() || self.state & st::READABLE == 0
    }

    pub fn conn_can_send(&self) -> bool {
        self.can_send() || self.state & st::WRITABLE == 0
    }

    fn ctrl_avail(&self) -> bool {
        self.conn
            .as_ref()
            .is_some_and(|c| c.ctrl_seqno != c.ctrl_max_seqno)
    }

    pub fn conn_can_send_ctrl(&self) -> bool {
        self.ctrl_avail() || self.state & st::CONNECTED == 0
    }

    pub fn conn_all_sends_done(&self) -> bool {
        self.state & st::CONNECTED == 0
            || self.conn.as_ref().is_none_or(|c| {
                c.ctrl_max_seqno.wrapping_sub(c.ctrl_seqno) + c.sqe_avail == u32::from(c.sq_size)
            })
    }

    /// rsocket.c `rs_give_credits` / `rs_send_credits`.
    fn update_credits(&mut self) {
        let connected = self.state & st::CONNECTED != 0;
        let Some(c) = self.conn.as_mut() else { return };
        let half = c.rbuf_size >> 1;
        let give = (c.rbuf_bytes_avail >= half || c.rseq_no.wrapping_sub(c.rseq_comp) as i16 >= 0)
            && c.ctrl_seqno != c.ctrl_max_seqno
            && connected;
        if give && let Err(e) = c.send_credits() {
            self.state = st::ERROR;
            self.err = e;
        }
    }

    /// rsocket.c `rs_poll_cq`: takes every completion; receives queue data messages and apply credit and control
    /// messages, sends return their WQE and staging space.
    fn poll_cq(&mut self) -> R<()> {
        let Some(c) = self.conn.as_mut() else {
            return Err(libc::ENOTCONN);
        };
        let mut rcnt = 0u32;
        // One completion at a time, as rsocket.c: a disconnect message ends the loop and leaves the rest queued.
        let mut wcs = [IbvWc::default(); 1];
        loop {
            // SAFETY: the connection's CQ; one entry.
            let n = unsafe { verbs::poll_cq(c.cq, 1, wcs.as_mut_ptr()) };
            if n < 0 {
                self.state = st::ERROR;
                self.err = libc::EIO;
                return Err(libc::EIO);
            }
            if n == 0 {
                break;
            }
            for wc in &wcs[..n as usize] {
                c.completions += 1;
                if wc.wr_id & WR_ID_RECV != 0 {
                    if wc.status != IBV_WC_SUCCESS {
                        continue;
                    }
                    rcnt += 1;
                    if wc.wc_flags & IBV_WC_WITH_IMM == 0 {
                        // rsocket messages always carry immediate data here (no RS_OPT_MSG_SEND).
                        c.bad_msgs += 1;
                        continue;
                    }
                    let m = Msg::from_imm(u32::from_be(wc.imm_data));
                    match m.op {
                        OP_SGL => c.sseq_comp = m.data as u16,
                        OP_IOMAP_SGL | OP_WRITE => {}
                        OP_CTRL if m.data == CTRL_DISCONNECT => {
                            self.state = st::DISCONNECTED;
                            return Ok(());
                        }
                        OP_CTRL if m.data == CTRL_SHUTDOWN => {
                            if self.state & st::WRITABLE != 0 {
                                self.state &= !st::READABLE;
                            } else {
                                self.state = st::DISCONNECTED;
                                return Ok(());
                            }
                        }
                        OP_CTRL => {}
                        _ => {
                            // Data: the bytes must fit the half the peer was given, the ring must have room.
                            let next = (c.rmsg_tail + 1) % c.rmsg.len();
                            if m.data > c.rbuf_size >> 1 || next == c.rmsg_head {
                                c.bad_msgs += 1;
                                self.state = st::ERROR;
                                self.err = libc::EPROTO;
                                return Err(libc::EPROTO);
                            }
                            c.rmsg[c.rmsg_tail] = m.imm();
                            c.rmsg_tail = next;
                        }
                    }
                } else {
                    let m = Msg::from_imm(wc.wr_id as u32);
                    match m.op {
                        OP_SGL => c.ctrl_max_seqno = c.ctrl_max_seqno.wrapping_add(1),
                        OP_CTRL => {
                            c.ctrl_max_seqno = c.ctrl_max_seqno.wrapping_add(1);
                            if m.data == CTRL_DISCONNECT {
                                self.state = st::DISCONNECTED;
                            }
                        }
                        _ => {
                            c.sqe_avail += 1;
                            c.sbuf_bytes_avail += m.data;
                        }
                    }
                    if wc.status != IBV_WC_SUCCESS && self.state & st::CONNECTED != 0 {
                        self.state = st::ERROR;
                        self.err = libc::EIO;
                    }
                }
            }
        }
        if self.state & st::CONNECTED != 0 {
            for _ in 0..rcnt {
                if let Err(e) = c.post_recv() {
                    self.state = st::ERROR;
                    self.err = e;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Connection manager events of a connected rsocket (rsocket.c's `cm_svc` thread): a DREQ from the peer
    /// ends the connection as a disconnect message would.
    pub fn drain_cm(&mut self) {
        // SAFETY: a live id; its channel is live while the id is.
        let ch = unsafe { (*self.id).channel };
        // SAFETY: as above.
        let fd = unsafe { (*ch).fd };
        loop {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd.
            if unsafe { libc::poll(&mut p, 1, 0) } != 1 {
                return;
            }
            let Ok(ev) = cma::get_event(ch) else { return };
            // SAFETY: an event handed out by get_event.
            let kind = unsafe { (*ev).event };
            let _ = cma::ack_event(ev);
            if kind == EV_DISCONNECTED && self.state & st::CONNECTED != 0 {
                self.state = st::DISCONNECTED;
            }
        }
    }

    /// Waits for the next completion event in `ibv_get_cq_event` (blocking: rocev2's libibverbs drives the
    /// device while a caller waits there, where a plain `poll` of the channel would leave the frames to the
    /// runtime's auto-progress thread), after taking any connection manager event.
    fn wait_event(&mut self) -> R<()> {
        self.drain_cm();
        if self.state & st::CONNECTED == 0 {
            return Ok(());
        }
        let Some(c) = self.conn.as_mut() else {
            return Err(libc::ENOTCONN);
        };
        c.wait_cq_event()
    }

    /// Arms the CQ for a waiter outside the lock: `false` when it was armed just now (look at the CQ once more
    /// before waiting), `true` when it already was.
    pub fn arm(&mut self) -> bool {
        let Some(c) = self.conn.as_mut() else {
            return true;
        };
        if c.cq_armed {
            return true;
        }
        // SAFETY: the connection's CQ.
        unsafe { verbs::req_notify_cq(c.cq) };
        c.cq_armed = true;
        false
    }

    /// The completion channel a waiter waits on and the CQ whose events come there.
    pub fn wait_chan(&self) -> Option<(*mut IbvCompChannel, *mut c_void)> {
        self.conn.as_ref().map(|c| (c.chan, c.cq))
    }

    /// A waiter took one completion event outside the lock (and acknowledged it there, so that `rclose`, which
    /// destroys the CQ without the lock, never waits for an acknowledgement that needs it): the CQ is disarmed,
    /// and events that came meanwhile are taken.
    pub fn took_event(&mut self) {
        if let Some(c) = self.conn.as_mut() {
            c.cq_armed = false;
            c.get_cq_event();
        }
    }

    /// rsocket.c `rs_process_cq`: takes completions and grants credits until `test` holds, or `EWOULDBLOCK`
    /// when `nonblock`; blocking waits on the completion channel (armed first).
    pub fn process_cq(&mut self, nonblock: bool, test: fn(&Rs) -> bool) -> R<()> {
        loop {
            self.update_credits();
            let r = self.poll_cq();
            if test(self) {
                break;
            }
            r?;
            if nonblock {
                self.update_credits();
                return Err(libc::EWOULDBLOCK);
            }
            let c = self.conn.as_mut().ok_or(libc::ENOTCONN)?;
            if !c.cq_armed {
                // SAFETY: the connection's CQ.
                unsafe { verbs::req_notify_cq(c.cq) };
                c.cq_armed = true;
                continue;
            }
            self.update_credits();
            self.wait_event()?;
        }
        self.update_credits();
        Ok(())
    }

    /// rsocket.c `rsend` for a stream socket.
    pub fn send(&mut self, buf: *const u8, len: usize, flags: c_int) -> R<usize> {
        if self.conn.is_none() {
            return Err(libc::ENOTCONN);
        }
        // Not after our own shutdown of the sending side (EPIPE) or the peer's disconnect (ECONNRESET), as TCP
        // answers: rsocket.c would still send while credits last, though the stream has ended.
        if self.wr_shut {
            return Err(libc::EPIPE);
        }
        if self.state & (st::DISCONNECTED | st::ERROR) != 0 {
            return Err(libc::ECONNRESET);
        }
        let mut left = len;
        let mut off = 0usize;
        let mut olen = OLAP_START_SIZE;
        let mut ret = Ok(());
        while left > 0 {
            if !self.can_send() {
                ret = self.process_cq(self.nonblocking(flags), Rs::conn_can_send);
                if ret.is_err() {
                    break;
                }
                if self.state & st::WRITABLE == 0 {
                    ret = Err(libc::ECONNRESET);
                    break;
                }
            }
            let c = self.conn.as_mut().expect("checked");
            let mut xfer = if (olen as usize) < left {
                let x = olen;
                if olen < MAX_TRANSFER {
                    olen <<= 1;
                }
                x
            } else {
                left as u32
            };
            xfer = xfer
                .min(c.sbuf_bytes_avail)
                .min(c.target(c.target_sge).length);
            // SAFETY: `buf + off` has `left >= xfer` readable bytes (the caller's contract).
            let src = unsafe { buf.add(off) };
            let r = if xfer <= u32::from(c.sq_inline) {
                let mut sge = [IbvSge {
                    addr: src as u64,
                    length: xfer,
                    lkey: 0,
                }];
                c.write_data(&mut sge, xfer, IBV_SEND_INLINE)
            } else {
                let left_in = c.sbuf_size - c.ssgl_off;
                // SAFETY: the smr is live.
                let lkey = unsafe { (*c.smr).lkey };
                let base = c.sbuf.ptr as u64;
                if xfer <= left_in {
                    // SAFETY: `xfer` bytes fit in sbuf from `ssgl_off`; the source has them.
                    unsafe {
                        core::ptr::copy_nonoverlapping(
                            src,
                            c.sbuf.ptr.add(c.ssgl_off as usize),
                            xfer as usize,
                        )
                    };
                    let mut sge = [IbvSge {
                        addr: base + u64::from(c.ssgl_off),
                        length: xfer,
                        lkey,
                    }];
                    let r = c.write_data(&mut sge, xfer, 0);
                    c.ssgl_off = if xfer < left_in { c.ssgl_off + xfer } else { 0 };
                    r
                } else {
                    let second = xfer - left_in;
                    // SAFETY: the tail of sbuf takes `left_in` bytes, its head `second` (< sbuf_size).
                    unsafe {
                        core::ptr::copy_nonoverlapping(
                            src,
                            c.sbuf.ptr.add(c.ssgl_off as usize),
                            left_in as usize,
                        );
                        core::ptr::copy_nonoverlapping(
                            src.add(left_in as usize),
                            c.sbuf.ptr,
                            second as usize,
                        );
                    }
                    let mut sge = [
                        IbvSge {
                            addr: base + u64::from(c.ssgl_off),
                            length: left_in,
                            lkey,
                        },
                        IbvSge {
                            addr: base,
                            length: second,
                            lkey,
                        },
                    ];
                    let r = c.write_data(&mut sge, xfer, 0);
                    c.ssgl_off = second;
                    r
                }
            };
            if let Err(e) = r {
                ret = Err(e);
                break;
            }
            left -= xfer as usize;
            off += xfer as usize;
        }
        match ret {
            Err(e) if left == len => Err(e),
            _ => Ok(len - left),
        }
    }

    /// rsocket.c `rrecv` for a stream socket (`MSG_PEEK`, `MSG_WAITALL`, `MSG_DONTWAIT`); 0 at the end of the
    /// stream.
    pub fn recv(&mut self, buf: *mut u8, len: usize, flags: c_int) -> R<usize> {
        if self.conn.is_none() {
            return Err(libc::ENOTCONN);
        }
        let mut left = len;
        let mut ret = Ok(());
        loop {
            if !self.have_rdata() {
                ret = self.process_cq(self.nonblocking(flags), Rs::conn_have_rdata);
                if ret.is_err() {
                    break;
                }
                if self.state & st::ERROR != 0 && !self.have_rdata() {
                    // An abort (a refused message, a failed completion) is an error once the data before it
                    // is read, never the end of the stream an orderly disconnect gives (rsocket.c returns 0
                    // for both; TCP's recv answers ECONNRESET after a reset).
                    ret = Err(if self.err != 0 {
                        self.err
                    } else {
                        libc::ECONNRESET
                    });
                    break;
                }
            }
            let c = self.conn.as_mut().expect("checked");
            let peek = flags & libc::MSG_PEEK != 0;
            let (mut head, mut roff) = (c.rmsg_head, c.rbuf_offset);
            while left > 0 && head != c.rmsg_tail {
                let avail = c.rmsg[head] & roce_wire::rsocket::MSG_DATA_MAX;
                // `left` is the caller's usize length: compared as usize (breaker finding: `left as u32` made a
                // length of 2^32 a 0-byte read that looped for ever); below `avail` it fits in a u32.
                let rsize = if left < avail as usize {
                    if !peek {
                        c.rmsg[head] = Msg::new(OP_DATA, avail - left as u32).imm();
                    }
                    left as u32
                } else {
                    if !peek {
                        c.rseq_no = c.rseq_no.wrapping_add(1);
                    }
                    head = (head + 1) % c.rmsg.len();
                    avail
                };
                let dst = len - left;
                let end = c.rbuf_size - roff;
                let first = rsize.min(end);
                // SAFETY: `first` bytes from `roff` lie in rbuf (roff < rbuf_size, first <= rbuf_size - roff);
                // the rest, `rsize - first` <= rbuf_size / 2 (checked when queued), from its start; the caller's
                // buffer has `left >= rsize` bytes from `dst`.
                unsafe {
                    core::ptr::copy_nonoverlapping(
                        c.rbuf.ptr.add(roff as usize),
                        buf.add(dst),
                        first as usize,
                    );
                    if rsize > first {
                        core::ptr::copy_nonoverlapping(
                            c.rbuf.ptr,
                            buf.add(dst + first as usize),
                            (rsize - first) as usize,
                        );
                    }
                }
                roff = if rsize >= end {
                    rsize - end
                } else {
                    roff + rsize
                };
                if !peek {
                    c.rbuf_bytes_avail += rsize;
                }
                left -= rsize as usize;
            }
            if peek {
                break;
            }
            (c.rmsg_head, c.rbuf_offset) = (head, roff);
            if !(left > 0 && flags & libc::MSG_WAITALL != 0 && self.state & st::READABLE != 0) {
                break;
            }
        }
        match ret {
            Err(e) if left == len => Err(e),
            _ => Ok(len - left),
        }
    }

    /// rsocket.c `rshutdown` for a connected stream socket.
    pub fn shutdown(&mut self, how: c_int) -> R<()> {
        if self.state & st::CONNECTED != 0 {
            if how == libc::SHUT_RDWR || how == libc::SHUT_WR {
                self.wr_shut = true;
            }
            let ctrl = if how == libc::SHUT_RDWR {
                self.state &= !(st::READABLE | st::WRITABLE);
                CTRL_DISCONNECT
            } else if how == libc::SHUT_WR {
                self.state &= !st::WRITABLE;
                if self.state & st::READABLE != 0 {
                    CTRL_SHUTDOWN
                } else {
                    CTRL_DISCONNECT
                }
            } else if how == libc::SHUT_RD {
                self.state &= !st::READABLE;
                if self.state & st::WRITABLE != 0 {
                    return Ok(());
                }
                CTRL_DISCONNECT
            } else {
                return Err(libc::EINVAL);
            };
            if !self.ctrl_avail() {
                self.process_cq_bounded(Rs::conn_can_send_ctrl)?;
            }
            if self.state & st::CONNECTED != 0 && self.ctrl_avail() {
                let c = self.conn.as_mut().expect("connected");
                c.ctrl_seqno = c.ctrl_seqno.wrapping_add(1);
                c.post_msg(Msg::new(OP_CTRL, ctrl).imm())?;
            }
        }
        if self.state & st::CONNECTED != 0 {
            let _ = self.process_cq_bounded(Rs::conn_all_sends_done);
        }
        Ok(())
    }

    /// [`Rs::process_cq`] blocking until `test` holds, for `rshutdown` / `rclose`: `ETIMEDOUT` once
    /// [`SHUTDOWN_IDLE`] passes without a completion. Waits on the completion channel (armed first) at most 100 ms
    /// at a time and takes the connection manager's events meanwhile (a DREQ from the peer ends the wait, as
    /// rsocket.c's `cm_svc` thread does).
    fn process_cq_bounded(&mut self, test: fn(&Rs) -> bool) -> R<()> {
        let mut seen = self.conn.as_ref().map_or(0, |c| c.completions);
        let mut since = std::time::Instant::now();
        loop {
            match self.process_cq(true, test) {
                Err(libc::EWOULDBLOCK) => {}
                r => return r,
            }
            let c = self.conn.as_mut().ok_or(libc::ENOTCONN)?;
            if c.completions != seen {
                (seen, since) = (c.completions, std::time::Instant::now());
            }
            let left = SHUTDOWN_IDLE.saturating_sub(since.elapsed());
            if left.is_zero() {
                return Err(libc::ETIMEDOUT);
            }
            if !c.cq_armed {
                // SAFETY: the connection's CQ.
                unsafe { verbs::req_notify_cq(c.cq) };
                c.cq_armed = true;
                continue;
            }
            let mut p = libc::pollfd {
                fd: c.chan_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd.
            unsafe { libc::poll(&mut p, 1, left.as_millis().clamp(1, 100) as c_int) };
            c.get_cq_event();
            self.drain_cm();
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl Conn {
    fn target_ptr(&self, i: usize) -> *mut u8 {
        // SAFETY: `i < SGL_SIZE`: within the target list.
        unsafe { self.tgt.ptr.add(i * SGE_LEN) }
    }

    /// Target entry `i` (the peer RDMA-writes these: read volatile, in host order).
    fn target(&self, i: usize) -> Sge {
        let p = self.target_ptr(i);
        // SAFETY: 16 bytes of the target list; 8-byte aligned (page-aligned region, 16-byte entries).
        unsafe {
            Sge {
                addr: core::ptr::read_volatile(p.cast::<u64>()),
                key: core::ptr::read_volatile(p.add(8).cast::<u32>()),
                length: core::ptr::read_volatile(p.add(12).cast::<u32>()),
            }
        }
    }

    fn set_target(&mut self, i: usize, s: Sge) {
        let p = self.target_ptr(i);
        // SAFETY: as in `target`.
        unsafe {
            core::ptr::write_volatile(p.cast::<u64>(), s.addr);
            core::ptr::write_volatile(p.add(8).cast::<u32>(), s.key);
            core::ptr::write_volatile(p.add(12).cast::<u32>(), s.length);
        }
    }

    fn can_send(&self) -> bool {
        self.sqe_avail > 0
            && self.sbuf_bytes_avail >= SNDLOWAT
            && self.sseq_no != self.sseq_comp
            && self.target(self.target_sge).length != 0
    }

    fn post_recv(&mut self) -> R<()> {
        let mut wr = IbvRecvWr {
            wr_id: WR_ID_RECV,
            next: core::ptr::null_mut(),
            sg_list: core::ptr::null_mut(),
            num_sge: 0,
        };
        // SAFETY: the connection's QP.
        match unsafe { verbs::post_recv(self.qp.cast(), &mut wr) } {
            0 => Ok(()),
            e => Err(e.abs()),
        }
    }

    /// RDMA WRITE WITH IMMEDIATE of `sgl` to `addr`/`rkey` carrying `msg` (rsocket.c `rs_post_write_msg`), or a
    /// zero-length one when `sgl` is empty (`rs_post_msg`).
    fn post_write_msg(
        &mut self,
        sgl: &mut [IbvSge],
        msg: u32,
        flags: u32,
        addr: u64,
        rkey: u32,
    ) -> R<()> {
        let mut wr = IbvSendWr {
            wr_id: u64::from(msg),
            next: core::ptr::null_mut(),
            sg_list: if sgl.is_empty() {
                core::ptr::null_mut()
            } else {
                sgl.as_mut_ptr()
            },
            num_sge: sgl.len() as c_int,
            opcode: IBV_WR_RDMA_WRITE_WITH_IMM,
            send_flags: flags,
            imm_data: msg.to_be(),
            wr: SendWrUnion::rdma(addr, rkey),
            qp_type_xrc_remote_srqn: 0,
            bind_mw_tso: [0; 6],
        };
        // SAFETY: the connection's QP; the SGEs are registered staging memory or inline data that is read
        // during the call.
        match unsafe { verbs::post_send(self.qp.cast(), &mut wr) } {
            0 => Ok(()),
            e => Err(e.abs()),
        }
    }

    fn post_msg(&mut self, msg: u32) -> R<()> {
        self.post_write_msg(&mut [], msg, 0, 0, 0)
    }

    /// rsocket.c `rs_write_data`: takes the target entry's space before the write.
    fn write_data(&mut self, sgl: &mut [IbvSge], len: u32, flags: u32) -> R<()> {
        self.sseq_no = self.sseq_no.wrapping_add(1);
        self.sqe_avail -= 1;
        self.sbuf_bytes_avail -= len;
        let i = self.target_sge;
        let mut t = self.target(i);
        let (addr, rkey) = (t.addr, t.key);
        t.addr = t.addr.wrapping_add(u64::from(len));
        t.length -= len;
        self.set_target(i, t);
        if t.length == 0 {
            self.target_sge = (self.target_sge + 1) % SGL_SIZE as usize;
        }
        self.post_write_msg(sgl, Msg::new(OP_DATA, len).imm(), flags, addr, rkey)
    }

    /// rsocket.c `rs_send_credits`: new credits, with the next free buffer half when there is one.
    fn send_credits(&mut self) -> R<()> {
        self.ctrl_seqno = self.ctrl_seqno.wrapping_add(1);
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size >> 1);
        let msg = Msg::new(OP_SGL, credit_limit(self.rseq_no, self.rq_size)).imm();
        let half = self.rbuf_size >> 1;
        if self.rbuf_bytes_avail < half {
            return self.post_msg(msg);
        }
        // SAFETY: the rmr is live.
        let rkey = unsafe { (*self.rmr).rkey };
        let sge = Sge {
            addr: self.rbuf.ptr as u64 + u64::from(self.rbuf_free_offset),
            key: rkey,
            length: half,
        };
        let big = cfg!(target_endian = "big") != self.swap;
        let mut bytes = [0u8; SGE_LEN];
        sge.emit(&mut bytes, big).map_err(|_| libc::EINVAL)?;
        let dst = self.remote_sgl.addr + u64::from(self.remote_sge) * SGE_LEN as u64;
        let rkey_t = self.remote_sgl.key;
        let r = if usize::from(self.sq_inline) >= SGE_LEN {
            let mut s = [IbvSge {
                addr: bytes.as_ptr() as u64,
                length: SGE_LEN as u32,
                lkey: 0,
            }];
            self.post_write_msg(&mut s, msg, IBV_SEND_INLINE, dst, rkey_t)
        } else {
            let slot =
                self.sbuf_size as usize + SGE_LEN * (self.ctrl_seqno & (QP_CTRL_SIZE - 1)) as usize;
            // SAFETY: the four control slots follow the staging area (allocated when sq_inline < 16).
            unsafe {
                core::ptr::copy_nonoverlapping(bytes.as_ptr(), self.sbuf.ptr.add(slot), SGE_LEN)
            };
            // SAFETY: the smr is live.
            let lkey = unsafe { (*self.smr).lkey };
            let mut s = [IbvSge {
                addr: self.sbuf.ptr as u64 + slot as u64,
                length: SGE_LEN as u32,
                lkey,
            }];
            self.post_write_msg(&mut s, msg, 0, dst, rkey_t)
        };
        self.rbuf_bytes_avail -= half;
        self.rbuf_free_offset += half;
        if self.rbuf_free_offset >= self.rbuf_size {
            self.rbuf_free_offset = 0;
        }
        self.remote_sge += 1;
        if self.remote_sge >= self.remote_sgl.length {
            self.remote_sge = 0;
        }
        r
    }

    pub fn chan_fd(&self) -> c_int {
        // SAFETY: the connection's live channel.
        unsafe { (*self.chan).fd }
    }

    /// Blocks in `ibv_get_cq_event` for the next completion event.
    fn wait_cq_event(&mut self) -> R<()> {
        if wait_cq_event(self.chan) {
            self.cq_armed = false;
            self.unack_cqe += 1;
            // Others that came meanwhile, and the batched acknowledgement.
            self.get_cq_event();
        }
        Ok(())
    }

    /// Takes a completion channel event without blocking (the fd is non-blocking), acknowledging in batches.
    pub fn get_cq_event(&mut self) {
        if chan_blocking(self.chan) {
            // A thread of `blocking` waits in `ibv_get_cq_event` outside the lock and takes the events: a call
            // here would block too (the descriptor's mode is what makes `ibv_get_cq_event` wait or not).
            return;
        }
        let (mut cq, mut ctx) = (core::ptr::null_mut(), core::ptr::null_mut());
        // SAFETY: the connection's channel (non-blocking).
        while unsafe { verbs::ibv_get_cq_event(self.chan, &mut cq, &mut ctx) } == 0 {
            self.cq_armed = false;
            self.unack_cqe += 1;
            if self.unack_cqe >= u32::from(self.sq_size) + u32::from(self.rq_size) {
                // SAFETY: the connection's CQ; events taken above.
                unsafe { verbs::ibv_ack_cq_events(self.cq, self.unack_cqe) };
                self.unack_cqe = 0;
            }
        }
    }

    /// Wakes the threads waiting on this connection's completion channel for `rclose` (they then see the socket
    /// closing and leave): arms the CQ and moves the QP to the Error state, whose posted receives then complete
    /// flushed (`IBV_WC_WR_FLUSH_ERR`, as rxe `rxe_resp.c` `flush_recv_queue`; roce-proto `Engine::post_recv`), so
    /// an event fires; one more
    /// zero-length receive is posted, which an Error-state QP completes flushed at once, for a QP already in Error
    /// with nothing left to flush. The CQ is then emptied (nothing in it is wanted any more). Called repeatedly
    /// until the waiters left (each call raises at most one event and one completion).
    pub fn wake_waiters(&mut self) {
        // SAFETY: the connection's CQ and QP, live until `teardown`.
        unsafe { verbs::req_notify_cq(self.cq) };
        self.cq_armed = true;
        cma::qp_to_err(self.qp);
        let _ = self.post_recv();
        let mut wcs = [IbvWc::default(); 16];
        // SAFETY: the connection's CQ; 16 entries.
        while unsafe { verbs::poll_cq(self.cq, wcs.len() as c_int, wcs.as_mut_ptr()) } > 0 {}
    }

    /// Frees the QP, the CQ and its channel and the MRs (then the buffers, when dropped).
    fn teardown(&mut self) {
        if self.torn {
            return;
        }
        self.torn = true;
        let id = self.id;
        {
            let mut s = cma::lock();
            if cma::check_id(&s, id).is_ok() {
                cma::destroy_qp(&mut s, id as usize);
            }
        }
        // SAFETY: the CQ, channel and MRs of this connection; the QP using them is gone.
        unsafe {
            verbs::ibv_ack_cq_events(self.cq, self.unack_cqe);
            self.unack_cqe = 0;
            for mr in [self.smr, self.rmr, self.tmr] {
                if !mr.is_null() {
                    verbs::ibv_dereg_mr(mr);
                }
            }
            (self.smr, self.rmr, self.tmr) = (
                core::ptr::null_mut(),
                core::ptr::null_mut(),
                core::ptr::null_mut(),
            );
            bridge::ibv_destroy_cq(self.cq);
            bridge::ibv_destroy_comp_channel(self.chan.cast());
            (*id).send_cq_channel = core::ptr::null_mut();
            (*id).recv_cq_channel = core::ptr::null_mut();
            (*id).send_cq = core::ptr::null_mut();
            (*id).recv_cq = core::ptr::null_mut();
        }
    }
}

/// Whether `chan`'s descriptor is in blocking mode (a waiter of [`set_chan_blocking`] is in `ibv_get_cq_event`).
fn chan_blocking(chan: *mut IbvCompChannel) -> bool {
    // SAFETY: a live completion channel of an rsocket; fcntl on its descriptor.
    unsafe { libc::fcntl((*chan).fd, libc::F_GETFL) & libc::O_NONBLOCK == 0 }
}

/// Puts `chan`'s descriptor in blocking mode (`on`) for one waiter's [`take_cq_event`], or back (non-blocking, as
/// it is otherwise). Called under the socket's lock, where the others look at the channel.
pub(crate) fn set_chan_blocking(chan: *mut IbvCompChannel, on: bool) {
    // SAFETY: a live completion channel of an rsocket; fcntl on its descriptor.
    unsafe {
        let fd = (*chan).fd;
        let f = libc::fcntl(fd, libc::F_GETFL);
        let f = if on {
            f & !libc::O_NONBLOCK
        } else {
            f | libc::O_NONBLOCK
        };
        libc::fcntl(fd, libc::F_SETFL, f);
    }
}

/// `ibv_get_cq_event` on `chan` as its descriptor's mode says (blocking after [`set_chan_blocking`]): `true` when
/// an event was taken (the caller acknowledges it), `false` after a signal, an error or (non-blocking) none.
pub(crate) fn take_cq_event(chan: *mut IbvCompChannel) -> bool {
    let (mut cq, mut ctx) = (core::ptr::null_mut(), core::ptr::null_mut());
    // SAFETY: a live completion channel of an rsocket.
    unsafe { verbs::ibv_get_cq_event(chan, &mut cq, &mut ctx) == 0 }
}

/// Blocks in `ibv_get_cq_event` on `chan` (made blocking for the call; it is non-blocking otherwise) for one
/// completion event; `true` when one was taken (the caller counts it for `ibv_ack_cq_events`), `false` after a
/// signal or an error.
pub(crate) fn wait_cq_event(chan: *mut IbvCompChannel) -> bool {
    let (mut cq, mut ctx) = (core::ptr::null_mut(), core::ptr::null_mut());
    // SAFETY: a live completion channel of an rsocket; fcntl on its descriptor.
    unsafe {
        let fd = (*chan).fd;
        let f = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, f & !libc::O_NONBLOCK);
        let r = verbs::ibv_get_cq_event(chan, &mut cq, &mut ctx);
        libc::fcntl(fd, libc::F_SETFL, f | libc::O_NONBLOCK);
        r == 0
    }
}
