//! The test loops of `rocev2 perf`, for both sides.
//!
//! # Memory layout (both sides)
//!
//! One MR of `R · (1 + K)` bytes: a transmit region (`R` bytes at offset 0, filled with this side's pattern) and `K`
//! receive slots of `R` bytes (zeroed before each size). `R` = the largest size + 40 (UD GRH area), rounded up to
//! 64; `K` = up to 16 slots (fewer for large sizes, at most 64 MiB of slots). Remote operations target the peer's
//! slots (WRITE: slot `i mod K`; atomics: slot 0) or its transmit region (READ), by VA from the exchange.
//!
//! # Receive WRs
//!
//! A side that receives (the server of SEND and the ping-pong tests, the client of the ping-pong tests) posts its
//! receive ring once, before the run: each receive covers a whole slot (`R` bytes, so it fits every size of a
//! `-a` sweep) and is posted again into the same slot when it completes. The ring thus stays exactly as deep across
//! sizes; receives posted for an earlier, smaller size never meet a larger message (which would be a length error,
//! NAK invalid request on RC and a silent drop on UC/UD).
//!
//! # Verification
//!
//! The two sides use different byte patterns. After each size: WRITE → the server checks the slots the client
//! wrote; SEND → the server checks every slot a successful receive completed into (and, for RC, that it received
//! every message the client completed); READ → the client checks its slots against the server's pattern;
//! atomics → the server's 8-byte counter must equal the number of completed FETCH_ADDs; latency ping-pongs check
//! the slot each side received into. The server reports its result in its answer to `done`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use roce_proto::{Mtu, Qpn, WcOpcode};
use roce_verbs::{
    AccessFlags, Ah, AhAttr, CompChannel, ConnectOpts, Context, Cq, HugePagePolicy, Mr, MrBuf, Pd,
    PostError, ProgressMode, Psn, Qp, QpCap, QpEndpoint, RecvWr, SendFlags, SendOp, SendWr, UdDest,
    Wc, WcStatus,
};
use serde_json::{Value, json};

use super::report::{self, BwResult, LatStats};
use super::{Conn, Output, OutputLevel, Params, Test};
use crate::oob::{Exchange, Oob, PeerInfo, QpRecord};

/// Q_Key of the UD tests (perftest's).
const QKEY: u32 = 0x1111_1111;
/// UD receive buffers start with the 40-byte GRH area.
const GRH: u64 = 40;
/// Receive WRs kept posted per QP by SEND receivers.
const RX_DEPTH: u32 = 256;
/// Receive slots at most.
const MAX_SLOTS: u64 = 16;
/// Bytes of receive slots at most.
const SLOT_BYTES: u64 = 64 << 20;
/// How long a passive server waits for the client's `done`.
const PASSIVE_WAIT: Duration = Duration::from_secs(3600);
/// A run that completes nothing for this long is aborted (a lost message on UC/UD, a dead peer).
const STALL: Duration = Duration::from_secs(10);

fn pattern(side: u8, i: u64) -> u8 {
    (i.wrapping_mul(31).wrapping_add(u64::from(side) * 101 + 7) % 251) as u8
}

fn pattern_buf(side: u8, len: u64) -> Vec<u8> {
    (0..len).map(|i| pattern(side, i)).collect()
}

const CLIENT: u8 = 1;
const SERVER: u8 = 2;

struct Session {
    pd: Pd,
    cq: Cq,
    chan: Option<Arc<CompChannel>>,
    qps: Vec<Qp>,
    mr: Mr,
    /// The registered memory: the test fills and checks it in place (RNIC contract: only bytes no WR is using).
    buf: MrBuf,
    ah: Option<Ah>,
    remote: PeerInfo,
    /// This side's QP records (as sent to the peer).
    local: Vec<QpRecord>,
    r: u64,
    k: u64,
    p: Params,
    wcs: Vec<Wc>,
    /// SEND receives of this size (bidirectional runs, where the sending loop also receives).
    rx: RxTally,
}

/// What the receives of one size brought: the slots that received, how many, the first bad length.
#[derive(Debug, Default)]
struct RxTally {
    used: Vec<bool>,
    received: u64,
    error: Option<String>,
}

impl Session {
    fn slot_off(&self, s: u64) -> u64 {
        self.r * (1 + s % self.k)
    }

    /// perftest's address block: the rule, then per QP a `local address:` and a `remote address:` line (LID, QPN,
    /// PSN; READ also the outstanding READs; READ and WRITE the RKey and VAddr) each followed by its GID in decimal
    /// bytes, as perftest's `ctx_print_pingpong_data` prints them (the table header's rule closes it).
    fn address_block(&self) -> String {
        let verb_rdma = matches!(
            self.p.test,
            Test::ReadBw | Test::ReadLat | Test::WriteBw | Test::WriteLat
        );
        let is_read = matches!(self.p.test, Test::ReadBw | Test::ReadLat);
        let line = |side: &str, q: &QpRecord, rkey: u32, va: u64, gid: &[u8; 16]| {
            let mut l = format!(
                " {side} address: LID 0000 QPN {:#06x} PSN {:#06x}",
                q.qpn, q.psn
            );
            if is_read {
                // The outstanding READs each QP is connected with (`ConnectOpts` default, as `setup` uses).
                l.push_str(&format!(" OUT {:#04x}", ConnectOpts::default().rd_atomic));
            }
            if verb_rdma {
                l.push_str(&format!(" RKey {rkey:#08x} VAddr {va:#016x}"));
            }
            let g: Vec<String> = gid.iter().map(|b| format!("{b:02}")).collect();
            format!("{l}\n GID: {}\n", g.join(":"))
        };
        let cfg = self.pd.context().config();
        let my_gid = cfg.gids.first().copied().unwrap_or_default().0;
        let mut out = format!("{}\n", report::footer());
        for (i, q) in self.local.iter().enumerate() {
            out.push_str(&line("local", q, self.mr.rkey().0, self.mr.addr(), &my_gid));
            if let Some(r) = self.remote.qps.get(i) {
                out.push_str(&line(
                    "remote",
                    r,
                    self.remote.rkey,
                    self.remote.va,
                    &self.remote.gid,
                ));
            }
        }
        out
    }

    fn remote_qpn(&self, i: usize) -> Qpn {
        Qpn::new(self.remote.qps.get(i).map_or(0, |q| q.qpn))
    }

    /// Polls the CQ into `self.wcs`; with events, sleeps on the channel when empty.
    fn poll(&mut self) -> usize {
        let n = self.cq.poll(&mut self.wcs);
        if n > 0 {
            return n;
        }
        if let Some(ch) = &self.chan {
            self.cq.req_notify();
            let n = self.cq.poll(&mut self.wcs);
            if n > 0 {
                return n;
            }
            let _ = ch.get_event(Duration::from_millis(10));
            return self.cq.poll(&mut self.wcs);
        }
        // Caller progress: the empty poll ran a pass in this thread; poll again at once. Thread progress: give the
        // CPU away, the progress threads share the cores on small machines.
        if self.cq.context().progress_mode() == ProgressMode::Thread {
            std::thread::yield_now();
        }
        0
    }

    fn recv_len(&self, size: u64) -> u32 {
        (if self.p.conn == Conn::Ud {
            size + GRH
        } else {
            size
        }) as u32
    }

    /// Posts one receive covering all of slot `slot mod K` (see "Receive WRs" above).
    fn post_recv(&self, qp: usize, slot: u64) -> Result<(), PostError> {
        let sge = [self.mr.sge(self.slot_off(slot), self.r as u32)];
        self.qps[qp].post_recv(&[RecvWr {
            wr_id: ((qp as u64) << 32) | (slot % self.k),
            sg_list: &sge,
        }])
    }

    fn ud(&self, i: usize) -> Option<UdDest> {
        self.ah.as_ref().map(|ah| UdDest {
            ah: ah.handle(),
            remote_qpn: self.remote_qpn(i),
            remote_qkey: QKEY,
        })
    }

    fn inline_flag(&self, size: u64) -> SendFlags {
        if size <= u64::from(self.p.inline) {
            SendFlags::INLINE
        } else {
            SendFlags::EMPTY
        }
    }

    /// Zeroes the receive slots and fills the transmit region with `side`'s pattern.
    fn prepare(&mut self, side: u8, size: u64) -> Result<(), String> {
        let (r, used) = (self.r as usize, (self.k * self.r) as usize);
        self.buf
            .write(0, &pattern_buf(side, size))
            .map_err(|_| "preparing buffers: size exceeds the buffer")?;
        self.buf
            .write(r, &vec![0; used])
            .map_err(|_| "preparing buffers: receive slots exceed the buffer")?;
        self.rx = RxTally {
            used: vec![false; self.k as usize],
            ..RxTally::default()
        };
        Ok(())
    }

    /// A receive completion of a bidirectional SEND run: counts it, checks its length, marks its slot and posts
    /// the receive again into that slot.
    fn on_recv(&mut self, wc: &Wc, size: u64) {
        self.rx.received += 1;
        let (q, slot) = ((wc.wr_id >> 32) as usize, wc.wr_id & 0xFFFF_FFFF);
        if let Some(u) = self.rx.used.get_mut(slot as usize) {
            *u = true;
        }
        let want = self.recv_len(size);
        if wc.byte_len != want && self.rx.error.is_none() {
            self.rx.error = Some(format!("received {} bytes, expected {want}", wc.byte_len));
        }
        if let Err(e) = self.post_recv(q, slot) {
            self.rx
                .error
                .get_or_insert_with(|| format!("post_recv: {e}"));
        }
    }

    /// `--debug-corrupt-before-verify`: flips byte 0 of slot `slot` (after the UD GRH area) or bumps the atomic
    /// counter (slot 0), so that the verification that follows must fail.
    fn sabotage(&mut self, slot: u64) -> Result<(), String> {
        if !self.p.debug_corrupt {
            return Ok(());
        }
        let off = self.slot_off(slot) as usize;
        let skip = if self.p.conn == Conn::Ud {
            GRH as usize
        } else {
            0
        };
        let atomic = self.p.test.is_atomic();
        let mut cell = [0u8; 8];
        self.buf
            .read(off + skip, &mut cell)
            .map_err(|_| "sabotage: slot outside the buffer")?;
        if atomic {
            cell = u64::from_le_bytes(cell).wrapping_add(1).to_le_bytes();
        } else {
            cell[0] ^= 0xff;
        }
        self.buf
            .write(off + skip, &cell)
            .map_err(|_| "sabotage: slot outside the buffer".into())
    }

    /// A copy of `len` bytes of the registered memory at `off`.
    fn bytes(&self, off: u64, len: u64) -> Result<Vec<u8>, String> {
        let mut v = vec![0u8; len as usize];
        self.buf
            .read(off as usize, &mut v)
            .map_err(|_| format!("{len} bytes at {off} are outside the buffer"))?;
        Ok(v)
    }

    /// Checks that slot `s` holds `side`'s pattern for `size` bytes (UD: after the GRH area).
    fn check_slot(&self, side: u8, s: u64, size: u64) -> Result<(), String> {
        let skip = if self.p.conn == Conn::Ud && matches!(self.p.test, Test::SendBw | Test::SendLat)
        {
            GRH
        } else {
            0
        };
        let got = self
            .bytes(self.slot_off(s) + skip, size)
            .map_err(|e| format!("reading slot {s}: {e}"))?;
        if let Some(i) = (0..size).find(|&i| got[i as usize] != pattern(side, i)) {
            return Err(format!(
                "data mismatch in receive slot {s} at byte {i}: got {:#04x}, expected {:#04x}",
                got[i as usize],
                pattern(side, i)
            ));
        }
        Ok(())
    }

    /// UC WRITE: checks that slot `s` holds `side`'s pattern for `size` bytes, or a prefix of it followed by zeros
    /// (the slot was zeroed before the size): a UC message that lost a packet is dropped from that packet on, with
    /// nothing retransmitted (roce-proto `Responder::on_uc_request`: a PSN gap drops the partial message). Returns
    /// whether the slot is complete; an error for any other byte.
    fn check_slot_uc(&self, side: u8, s: u64, size: u64) -> Result<bool, String> {
        let got = self
            .bytes(self.slot_off(s), size)
            .map_err(|e| format!("reading slot {s}: {e}"))?;
        let Some(cut) = (0..size).find(|&i| got[i as usize] != pattern(side, i)) else {
            return Ok(true);
        };
        match (cut..size).find(|&i| got[i as usize] != 0) {
            None => Ok(false),
            Some(i) => Err(format!(
                "data mismatch in receive slot {s} at byte {i}: got {:#04x}, expected {:#04x} (or 0 after a loss \
                 from byte {cut})",
                got[i as usize],
                pattern(side, i)
            )),
        }
    }
}

fn wc_error(wc: &Wc) -> String {
    format!(
        "work completion error: {} (wr_id {:#x}, QP {}, opcode {:?})",
        wc.status, wc.wr_id, wc.qp_num, wc.opcode
    )
}

/// Sets up resources, exchanges and connects, then runs every size. `is_client` chooses the role.
pub fn run_side(
    ctx: &Context,
    p: &Params,
    o: &mut Oob,
    is_client: bool,
    out: &Output,
) -> Result<(), String> {
    let r = match setup(ctx, p, o, is_client, out) {
        Ok(s) => s,
        Err(e) => {
            o.send_error(&e);
            return Err(e);
        }
    };
    let mut s = r;
    // --output prints the numbers only, as perftest's.
    let tables = out.print && !out.json && out.level.is_none();
    let with_progress;
    let out = if is_client {
        with_progress = Output {
            progress: super::progress::Progress::for_run(&s.p, tables),
            ..out.clone()
        };
        &with_progress
    } else {
        out
    };
    if tables {
        super::print_banner(&s.p, ctx, o, &out.link);
        print!("{}", s.address_block());
    }
    if tables {
        println!(
            "{}",
            if p.test.is_bw() {
                report::bw_header(out.gbits)
            } else {
                report::lat_header()
            }
        );
    }
    let sizes = s.p.sizes.clone();
    for (index, &size) in sizes.iter().enumerate() {
        if let Some(pr) = &out.progress {
            pr.start_size(index, size, s.p.iters * u64::from(s.p.qps));
        }
        let res = if is_client {
            client_size(&mut s, o, size, out)
        } else {
            server_size(&mut s, o, out)
        };
        if let Err(e) = res {
            o.send_error(&e);
            return Err(e);
        }
    }
    if let Some(pr) = &out.progress {
        pr.finish();
    }
    if tables {
        println!("{}", report::footer());
    }
    o.sync("bye", json!({}), Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Receive WRs kept posted per QP by this side (0: it receives nothing); `-b`: both sides of SEND.
fn rx_ring(test: Test, is_client: bool, bidir: bool) -> u32 {
    match (test, is_client) {
        (Test::SendBw, false) => RX_DEPTH,
        (Test::SendBw, true) if bidir => RX_DEPTH,
        (Test::SendLat | Test::WriteLat, _) => 16,
        _ => 0,
    }
}

/// How deep this side's CQ is and how many receives each QP keeps posted. The CQ holds every completion that can be
/// queued at once, so it never overruns (an overrun is a CQ error that takes its QPs to the error state, issue
/// #21): per QP, the signalled send WRs in flight plus the posted receives. The bandwidth loop signals
/// one WR in `cq_mod` ([`client_bw`]: at most `tx_depth / cq_mod + 2` signalled WRs among the `tx_depth` in flight,
/// the `+ 2` for a window straddling two multiples and the run's last WR); the other loops signal every WR (at
/// most the send queue, `tx_depth` but 16 at least). When `-q` QPs with [`RX_DEPTH`] receives each would need more
/// than the device's `max_cqe`, the receive ring shrinks to fit (as moderation shrinks the send side, perftest's
/// way of sizing one CQ for many QPs); a RC sender meets a short ring with RNR NAKs and retries, UC/UD lose what
/// finds no receive (counted as loss, as always).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CqPlan {
    /// CQ entries to create (within `max_cqe`).
    depth: u32,
    /// Receive WRs each QP keeps posted (0: this side receives nothing).
    rx_ring: u32,
}

impl CqPlan {
    /// The plan for `p` on this side (`is_client`) of a device with `max_cqe` entries per CQ.
    ///
    /// # Errors
    /// When even one receive per QP (or none, for a side that does not receive) does not fit: the message names
    /// `-q`, `-t` and `-Q`.
    fn new(p: &Params, is_client: bool, max_cqe: u32) -> Result<CqPlan, String> {
        const SLACK: u64 = 64;
        let sq = u64::from(p.tx_depth.max(16));
        let send = if p.test.is_bw() {
            (u64::from(p.tx_depth) / u64::from(p.cq_mod.max(1)) + 2).min(sq)
        } else {
            sq
        };
        let qps = u64::from(p.qps.max(1));
        let want = u64::from(rx_ring(p.test, is_client, p.bidir));
        let room = u64::from(max_cqe).saturating_sub(SLACK) / qps;
        let rx = want.min(room.saturating_sub(send));
        if room < send || (want > 0 && rx == 0) {
            return Err(format!(
                "-q {} with -t {} and -Q {}: {} completions per QP do not fit one CQ of the device's max_cqe {max_cqe}",
                p.qps,
                p.tx_depth,
                p.cq_mod,
                send + want.min(1)
            ));
        }
        Ok(CqPlan {
            depth: (qps * (send + rx) + SLACK) as u32,
            rx_ring: rx as u32,
        })
    }
}

fn setup(
    ctx: &Context,
    p: &Params,
    o: &mut Oob,
    is_client: bool,
    out: &Output,
) -> Result<Session, String> {
    let e = |what: &str| {
        let what = what.to_owned();
        move |e: roce_verbs::Error| format!("{what}: {e}")
    };
    // UD at the MTU: room for the largest MTU on both sides, so the two buffers match whatever the path MTU.
    let max = if p.ud_size_mtu {
        u64::from(Mtu::Mtu4096.bytes())
    } else {
        p.sizes.iter().copied().max().unwrap_or(8)
    };
    let r = (max + GRH).div_ceil(64) * 64;
    let k = (SLOT_BYTES / r).clamp(1, MAX_SLOTS);
    let pd = ctx.alloc_pd().map_err(e("alloc_pd"))?;
    let plan = CqPlan::new(p, is_client, ctx.query_device().max_cqe)?;
    let rx_depth = plan.rx_ring.max(1);
    let depth = plan.depth;
    let chan = out.events.map(|_| Arc::new(CompChannel::new()));
    let cq = ctx
        .create_cq(depth, chan.as_ref(), out.events.unwrap_or_default())
        .map_err(e("create_cq"))?;
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let len = (r * (1 + k)) as usize;
    let buf = if out.hugepages {
        MrBuf::hugepages(len, HugePagePolicy::Prefer)
    } else {
        MrBuf::new(len)
    }
    .map_err(|e| format!("allocating the {len}-byte test buffer: {e}"))?;
    let mr = pd.reg_mr(&buf, access).map_err(e("reg_mr"))?;
    if out.hugepages && !mr.is_huge() && out.print {
        eprintln!(
            "rocev2 perf: warning: --use_hugepages: no free 2 MiB huge pages (see /proc/sys/vm/nr_hugepages); \
             the {len}-byte test buffer uses normal pages"
        );
    }
    let cap = QpCap {
        max_send_wr: p.tx_depth.max(16),
        max_recv_wr: rx_depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: p.inline,
    };
    let mut qps = Vec::new();
    let mut recs = Vec::new();
    for _ in 0..p.qps {
        let qp = pd
            .create_qp(p.conn.qp_type(), &cq, &cq, cap, false)
            .map_err(e("create_qp"))?;
        let psn = ctx.random_psn().map_err(e("random_psn"))?;
        recs.push(QpRecord {
            qpn: qp.qpn().value(),
            psn: psn.value(),
        });
        qps.push(qp);
    }
    let cfg = ctx.config();
    let mine = PeerInfo {
        qps: recs.clone(),
        gid: cfg.gids.first().copied().unwrap_or_default().0,
        mac: cfg.mac,
        rkey: mr.rkey().0,
        va: mr.addr(),
        len: mr.length(),
        mtu: p.mtu.bytes(),
        params: Value::Null,
    };
    let remote = o.exchange(&mine).map_err(|e| e.to_string())?;
    if remote.qps.len() != qps.len() {
        return Err(format!(
            "the peer has {} QPs, this side {}",
            remote.qps.len(),
            qps.len()
        ));
    }
    if remote.len < r * (1 + k) {
        return Err(format!(
            "the peer's buffer ({} bytes) is smaller than needed ({})",
            remote.len,
            r * (1 + k)
        ));
    }
    // Each side has capped its own MTU by its active MTU (`super::apply_port_mtu`); the path uses the smaller.
    let mtu = if remote.mtu < p.mtu.bytes() {
        super::mtu_of(remote.mtu).unwrap_or(p.mtu)
    } else {
        p.mtu
    };
    // UD without -s sends messages of the MTU: the path MTU, now that both sides' are known (both compute it).
    let sizes = if p.ud_size_mtu {
        vec![u64::from(mtu.bytes())]
    } else {
        p.sizes.clone()
    };
    let opts = ConnectOpts {
        mtu,
        traffic_class: p.tclass,
        timeout: p.qp_timeout,
        ..ConnectOpts::default()
    };
    let gid = roce_proto::Gid(remote.gid);
    let mut ah = None;
    for (i, qp) in qps.iter().enumerate() {
        let rq = remote.qps[i];
        if p.conn == Conn::Ud {
            qp.ready_ud(QKEY, Psn::new(recs[i].psn))
                .map_err(e("UD QP to RTS"))?;
        } else {
            let ep = QpEndpoint {
                qpn: Qpn::new(rq.qpn),
                psn: Psn::new(rq.psn),
                gid,
                mac: remote.mac,
            };
            qp.connect(&ep, Psn::new(recs[i].psn), &opts)
                .map_err(e("connecting the QP"))?;
        }
    }
    if p.conn == Conn::Ud {
        let attr = AhAttr {
            dgid: gid,
            hop_limit: 64,
            traffic_class: p.tclass,
            dmac: remote.mac,
            ..AhAttr::default()
        };
        ah = Some(pd.create_ah(&attr).map_err(e("create_ah"))?);
    }
    let s = Session {
        pd,
        cq,
        chan,
        qps,
        mr,
        buf,
        ah,
        remote,
        local: recs,
        r,
        k,
        // The path MTU both sides use from here on (the banner shows it).
        p: Params {
            mtu,
            sizes,
            ..p.clone()
        },
        wcs: vec![Wc::default(); 64],
        rx: RxTally::default(),
    };
    // The receive ring, once for the whole run (module docs, "Receive WRs"), before the peer may send.
    for q in 0..s.qps.len() {
        for slot in 0..u64::from(plan.rx_ring) {
            s.post_recv(q, slot)
                .map_err(|e| format!("post_recv: {e}"))?;
        }
        s.qps[q]
            .sync()
            .map_err(|e| format!("handing receives to the engine: {e}"))?;
    }
    o.sync("connected", json!({}), Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    Ok(s)
}

// ------------------------------------------------------------------------------------------------ client

fn client_size(s: &mut Session, o: &mut Oob, size: u64, out: &Output) -> Result<(), String> {
    o.sync("size", json!({ "size": size }), Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    s.prepare(CLIENT, size)?;
    o.sync("ready", json!({}), Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    let test = s.p.test;
    let conn = s.p.conn.name();
    if test.is_bw() {
        let (res, min_posted) = client_bw(s, size, out)?;
        // Local verification (READ) before the server's.
        let mut local = Ok(());
        if s.p.verify && test == Test::ReadBw {
            s.sabotage(0)?;
            local = (0..min_posted.min(s.k)).try_for_each(|slot| s.check_slot(SERVER, slot, size));
        }
        if s.p.bidir {
            return client_bidir_done(s, o, size, (res, min_posted), local, out);
        }
        let reply = o
            .sync(
                "done",
                json!({
                    "completed": res.iterations,
                    "min_posted": min_posted,
                    "line": report::bw_line(&res, out.gbits),
                    "json": report::bw_json(test.name(), conn, &res, None),
                }),
                PASSIVE_WAIT,
            )
            .map_err(|e| e.to_string())?;
        let verified = verdict(s, local, &reply, res.iterations)?;
        emit(
            out,
            s.p.mtu,
            report::bw_line(&res, out.gbits),
            report::bw_json(test.name(), conn, &res, verified),
        );
    } else {
        let (stats, slot) = client_lat(s, size, out)?;
        let mut local = Ok(());
        if s.p.verify
            && matches!(test, Test::SendLat | Test::WriteLat | Test::ReadLat)
            && stats.count() > 0
        {
            s.sabotage(slot)?;
            local = s.check_slot(SERVER, slot, size);
        }
        let reply = o
            .sync(
                "done",
                json!({
                    "completed": stats.count(),
                    "min_posted": stats.count(),
                    "line": report::lat_line(size, &stats),
                    "json": report::lat_json(test.name(), conn, size, &stats, None),
                }),
                PASSIVE_WAIT,
            )
            .map_err(|e| e.to_string())?;
        let verified = verdict(s, local, &reply, stats.count())?;
        emit(
            out,
            s.p.mtu,
            report::lat_line(size, &stats),
            report::lat_json(test.name(), conn, size, &stats, verified),
        );
    }
    Ok(())
}

/// Combines the local check and the server's answer; an error if verification failed.
fn verdict(
    s: &Session,
    local: Result<(), String>,
    reply: &Value,
    completed: u64,
) -> Result<Option<bool>, String> {
    if !s.p.verify {
        return Ok(None);
    }
    local.map_err(|e| format!("verification failed (client side): {e}"))?;
    if let Some(false) = reply.get("verified").and_then(Value::as_bool) {
        let d = reply.get("detail").and_then(Value::as_str).unwrap_or("?");
        return Err(format!("verification failed (server side): {d}"));
    }
    if s.p.test.is_atomic() {
        let v = reply.get("atomic_value").and_then(Value::as_u64);
        if v != Some(completed) {
            return Err(format!(
                "verification failed: the server's counter is {v:?} after {completed} completed FETCH_ADDs"
            ));
        }
    }
    Ok(Some(true))
}

/// Prints one result: the table line, or the JSON object with the path MTU in use (`mtu`, bytes) added.
fn emit(out: &Output, mtu: Mtu, line: String, mut j: Value) {
    if !out.print {
        return;
    }
    if let (Some(level), false) = (out.level, out.json) {
        // perftest's --output: the one number, "%lf".
        let key = match (level, out.gbits) {
            (OutputLevel::Bandwidth, true) => "bw_avg_gbps",
            (OutputLevel::Bandwidth, false) => "bw_avg_mbps",
            (OutputLevel::MessageRate, _) => "msg_rate_mpps",
            (OutputLevel::Latency, _) => "t_avg_us",
        };
        println!("{:.6}", j[key].as_f64().unwrap_or(0.0));
        return;
    }
    if out.json {
        if j.is_object() {
            j["mtu"] = json!(mtu.bytes());
        }
        println!("{j}");
    } else if let Some(pr) = &out.progress {
        pr.println(&line);
    } else {
        println!("{line}");
    }
}

/// The bandwidth loop: keeps `tx_depth` WRs in flight per QP, `post_list` per post, a signaled WR every `cq_mod`.
/// Returns the result and the smallest number of WRs posted on any QP.
fn client_bw(s: &mut Session, size: u64, out: &Output) -> Result<(BwResult, u64), String> {
    let p = s.p.clone();
    let nq = s.qps.len();
    let mut target = vec![
        if p.duration.is_some() || p.infinite {
            u64::MAX
        } else {
            p.iters
        };
        nq
    ];
    let mut posted = vec![0u64; nq];
    let mut sig_end = vec![0u64; nq];
    let mut completed = vec![0u64; nq];
    let depth = u64::from(p.tx_depth);
    let list = u64::from(p.post_list);
    let cq_mod = u64::from(p.cq_mod);
    let flags = s.inline_flag(size)
        & if matches!(p.test, Test::SendBw | Test::WriteBw) {
            SendFlags::INLINE
        } else {
            SendFlags::EMPTY
        };
    let rkey = roce_proto::Rkey(s.remote.rkey);
    let t0 = Instant::now();
    let mut samples: Vec<(Duration, u64)> = vec![(Duration::ZERO, 0)];
    let mut last_sample = t0;
    let mut last_progress = t0;
    let mut stopping = false;
    let mut total_done = 0u64;
    // Infinite mode: per-second lines.
    let mut sec_start = t0;
    let mut sec_done = 0u64;
    let mut sges = Vec::with_capacity(list as usize);
    loop {
        let now = Instant::now();
        if !stopping && p.duration.is_some_and(|d| now.duration_since(t0) >= d) {
            stopping = true;
            for q in 0..nq {
                // One more (signaled) WR if unsignaled ones are pending, so every posted WR is accounted for.
                target[q] = if posted[q] > sig_end[q] {
                    posted[q] + 1
                } else {
                    posted[q]
                };
            }
        }
        for q in 0..nq {
            while posted[q] < target[q] && posted[q] - completed[q] < depth {
                let n = list
                    .min(target[q] - posted[q])
                    .min(depth - (posted[q] - completed[q]));
                sges.clear();
                for k in 0..n {
                    let i = posted[q] + k;
                    let sge = match p.test {
                        Test::SendBw | Test::WriteBw => s.mr.sge(0, size as u32),
                        Test::ReadBw => s.mr.sge(s.slot_off(i), size as u32),
                        // The fetched value goes to the transmit region (unused by atomics): slot 0 is this
                        // side's own counter, which the peer increments in a -b run.
                        _ => s.mr.sge(0, 8),
                    };
                    sges.push([sge]);
                }
                let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(n as usize);
                let mut sig = sig_end[q];
                for k in 0..n {
                    let i = posted[q] + k;
                    let op = match p.test {
                        Test::SendBw => SendOp::Send,
                        Test::WriteBw => SendOp::RdmaWrite {
                            remote_addr: s.remote.va.wrapping_add(s.slot_off(i)),
                            rkey,
                        },
                        Test::ReadBw => SendOp::RdmaRead {
                            remote_addr: s.remote.va,
                            rkey,
                        },
                        _ => SendOp::AtomicFetchAndAdd {
                            remote_addr: s.remote.va.wrapping_add(s.slot_off(0)),
                            rkey,
                            add: 1,
                        },
                    };
                    let signaled = (i + 1).is_multiple_of(cq_mod) || i + 1 == target[q];
                    let covered = i + 1 - sig;
                    let mut wr = SendWr::new(((q as u64) << 48) | covered, op, &sges[k as usize])
                        .flags(flags);
                    if signaled {
                        wr = wr.signaled();
                        sig = i + 1;
                    }
                    if let Some(d) = s.ud(q) {
                        wr = wr.ud(d);
                    }
                    wrs.push(wr);
                }
                match s.qps[q].post_send(&wrs) {
                    Ok(()) => {
                        posted[q] += n;
                        sig_end[q] = sig;
                    }
                    Err(PostError::QueueFull { .. }) => break,
                    Err(e) => return Err(format!("post_send: {e}")),
                }
            }
        }
        let n = s.poll();
        for idx in 0..n {
            let wc = s.wcs[idx];
            if wc.status != WcStatus::Success {
                return Err(wc_error(&wc));
            }
            if wc.opcode == WcOpcode::Recv {
                // -b: the peer's SENDs to this side.
                s.on_recv(&wc, size);
                continue;
            }
            let q = (wc.wr_id >> 48) as usize;
            let covered = wc.wr_id & 0xFFFF_FFFF_FFFF;
            if let Some(c) = completed.get_mut(q) {
                *c += covered;
                total_done += covered;
                sec_done += covered;
            }
        }
        let now = Instant::now();
        if n > 0 {
            last_progress = now;
            if now.duration_since(last_sample) >= Duration::from_micros(500) {
                samples.push((now.duration_since(t0), total_done));
                last_sample = now;
                if let Some(pr) = &out.progress {
                    pr.at(total_done, now.duration_since(t0));
                }
            }
        } else if now.duration_since(last_progress) > STALL {
            return Err(format!(
                "no completion for {STALL:?} ({total_done} of the posted WRs completed){}",
                if p.conn == Conn::Rc {
                    ""
                } else {
                    "; a message may have been lost (unreliable transport)"
                }
            ));
        }
        if p.infinite && now.duration_since(sec_start) >= p.report_every {
            let r = BwResult {
                size,
                iterations: sec_done,
                elapsed: now.duration_since(sec_start),
                peak_bps: 0.0,
            };
            let r = BwResult {
                peak_bps: r.avg_bytes_per_sec(),
                ..r
            };
            emit(
                out,
                p.mtu,
                report::bw_line(&r, out.gbits),
                report::bw_json(p.test.name(), p.conn.name(), &r, None),
            );
            sec_start = now;
            sec_done = 0;
        }
        if (0..nq).all(|q| posted[q] == target[q] && completed[q] >= posted[q]) {
            break;
        }
    }
    let elapsed = t0.elapsed();
    samples.push((elapsed, total_done));
    let res = BwResult {
        size,
        iterations: total_done,
        elapsed,
        peak_bps: 0.0,
    };
    let peak = peak_bps(&samples, size, elapsed).max(res.avg_bytes_per_sec());
    let min_posted = posted.iter().copied().min().unwrap_or(0);
    Ok((
        BwResult {
            peak_bps: peak,
            ..res
        },
        min_posted,
    ))
}

/// Best bandwidth over windows of at least `max(1 ms, elapsed / 20)` between completion samples.
pub(super) fn peak_bps(samples: &[(Duration, u64)], size: u64, elapsed: Duration) -> f64 {
    let w = (elapsed / 20).max(Duration::from_millis(1));
    let mut best = 0.0f64;
    let mut j = 0;
    for i in 0..samples.len() {
        if j < i {
            j = i;
        }
        while j < samples.len() && samples[j].0 - samples[i].0 < w {
            j += 1;
        }
        let Some(&(tj, cj)) = samples.get(j) else {
            break;
        };
        let dt = (tj - samples[i].0).as_secs_f64();
        if dt > 0.0 {
            best = best.max((cj - samples[i].1) as f64 * size as f64 / dt);
        }
    }
    best
}

/// The latency loop (one QP, one message in flight). Returns the statistics and the receive slot that holds the
/// server's data (SEND: the slot of the last reply; WRITE and READ: slot 0, their target).
///
/// `--run_infinitely`: never returns; prints the statistics of each report interval (percentiles included) and
/// starts the next.
fn client_lat(s: &mut Session, size: u64, out: &Output) -> Result<(LatStats, u64), String> {
    let p = s.p.clone();
    let mut stats = LatStats::new();
    let mut interval_start = Instant::now();
    let rkey = roce_proto::Rkey(s.remote.rkey);
    let flags = if matches!(p.test, Test::SendLat | Test::WriteLat) {
        s.inline_flag(size)
    } else {
        SendFlags::EMPTY
    };
    let t_start = Instant::now();
    let mut i = 0u64;
    let mut data_slot = 0u64;
    loop {
        if p.infinite {
            if interval_start.elapsed() >= p.report_every {
                emit(
                    out,
                    p.mtu,
                    report::lat_line(size, &stats),
                    report::lat_json(p.test.name(), p.conn.name(), size, &stats, None),
                );
                stats = LatStats::new();
                interval_start = Instant::now();
            }
        } else if let Some(d) = p.duration {
            if t_start.elapsed() >= d {
                break;
            }
        } else if i >= p.iters {
            break;
        }
        let sge = match p.test {
            Test::ReadLat => [s.mr.sge(s.slot_off(0), size as u32)],
            Test::AtomicLat => [s.mr.sge(s.slot_off(0), 8)],
            _ => [s.mr.sge(0, size as u32)],
        };
        let op = match p.test {
            Test::SendLat => SendOp::Send,
            Test::WriteLat => SendOp::RdmaWriteWithImm {
                remote_addr: s.remote.va.wrapping_add(s.slot_off(0)),
                rkey,
                imm: i as u32,
            },
            Test::ReadLat => SendOp::RdmaRead {
                remote_addr: s.remote.va,
                rkey,
            },
            _ => SendOp::AtomicFetchAndAdd {
                remote_addr: s.remote.va.wrapping_add(s.slot_off(0)),
                rkey,
                add: 1,
            },
        };
        let mut wr = SendWr::new(i, op, &sge).flags(flags).signaled();
        if let Some(d) = s.ud(0) {
            wr = wr.ud(d);
        }
        let t0 = Instant::now();
        s.qps[0]
            .post_send(&[wr])
            .map_err(|e| format!("post_send: {e}"))?;
        // Ping-pong tests wait for the peer's reply (a receive); READ/atomic for their own completion.
        let want_recv = matches!(p.test, Test::SendLat | Test::WriteLat);
        let mut send_done = false;
        let mut recv_done = !want_recv;
        while !(send_done && recv_done) {
            let n = s.poll();
            for idx in 0..n {
                let wc = s.wcs[idx];
                if wc.status != WcStatus::Success {
                    return Err(wc_error(&wc));
                }
                match wc.opcode {
                    WcOpcode::Recv | WcOpcode::RecvRdmaWithImm => {
                        if !recv_done {
                            let dt = t0.elapsed();
                            stats.record((dt.as_nanos() / 2) as u64);
                            recv_done = true;
                        }
                        // The same slot again: the ring stays as deep as it was posted.
                        let slot = wc.wr_id & 0xFFFF_FFFF;
                        if wc.opcode == WcOpcode::Recv {
                            data_slot = slot;
                        }
                        s.post_recv(0, slot)
                            .map_err(|e| format!("post_recv: {e}"))?;
                    }
                    _ => {
                        if !want_recv && !send_done {
                            stats.record(t0.elapsed().as_nanos() as u64);
                        }
                        send_done = true;
                    }
                }
            }
            if t0.elapsed() > STALL {
                return Err(format!(
                    "iteration {i}: no reply within {STALL:?}{}",
                    if p.conn == Conn::Rc {
                        ""
                    } else {
                        " (a message was lost on an unreliable transport)"
                    }
                ));
            }
        }
        i += 1;
        if i.is_multiple_of(64)
            && let Some(pr) = &out.progress
        {
            pr.at(i, t_start.elapsed());
        }
    }
    Ok((stats, data_slot))
}

// ------------------------------------------------------------------------------------------------ server

fn server_size(s: &mut Session, o: &mut Oob, out: &Output) -> Result<(), String> {
    let v = o
        .sync("size", json!({}), Duration::from_secs(3600))
        .map_err(|e| e.to_string())?;
    let size = v
        .get("size")
        .and_then(Value::as_u64)
        .filter(|&x| x > 0 && x <= super::MAX_SIZE)
        .ok_or("bad size from the client")?;
    s.prepare(SERVER, size)?;
    let active = rx_ring(s.p.test, false, false) > 0;
    // Packets this side accepted before the client may send this size's (the passive UC wait below counts from here).
    let rx_before = rcvd_pkts(s);
    o.sync("ready", json!({}), Duration::from_secs(30))
        .map_err(|e| e.to_string())?;
    if s.p.bidir {
        return server_bidir(s, o, size, out);
    }
    let Served {
        done,
        used,
        received,
    } = if active {
        serve_active(s, o, size)?
    } else {
        let d = o
            .recv_msg("done", PASSIVE_WAIT)
            .map_err(|e| e.to_string())?;
        if s.p.conn != Conn::Rc {
            // UC: the client's completions only mean "sent"; let in-flight packets land before verifying: every
            // packet of every message the client sent, or (a loss) until the packets stop coming.
            let sent = d.get("completed").and_then(Value::as_u64).unwrap_or(0);
            let per_msg = size.div_ceil(u64::from(s.p.mtu.bytes())).max(1);
            settle_rx(s, rx_before, sent.saturating_mul(per_msg));
        }
        Served {
            done: d,
            used: Vec::new(),
            received: 0,
        }
    };
    let completed = done.get("completed").and_then(Value::as_u64).unwrap_or(0);
    let min_posted = done.get("min_posted").and_then(Value::as_u64).unwrap_or(0);
    // Verify, then answer.
    let mut answer = json!({ "verified": Value::Null, "received": received });
    if s.p.verify {
        let r = check_incoming(
            s,
            size,
            CLIENT,
            (&used, received),
            (completed, min_posted),
            &mut answer,
        );
        match r {
            Ok(()) => answer["verified"] = json!(true),
            Err(d) => {
                answer["verified"] = json!(false);
                answer["detail"] = json!(d);
            }
        }
    }
    o.send_msg("done", answer.clone())
        .map_err(|e| e.to_string())?;
    // Print the client's measurement, as perftest's server does, with this side's verification outcome.
    if let Some(line) = done.get("line").and_then(Value::as_str) {
        let mut j = done.get("json").cloned().unwrap_or(Value::Null);
        if j.is_object() {
            j["verified"] = answer["verified"].clone();
            j["side"] = json!("server");
        }
        emit(out, s.p.mtu, line.to_owned(), j);
    }
    match answer.get("detail").and_then(Value::as_str) {
        Some(d) => Err(format!("verification failed: {d}")),
        None => Ok(()),
    }
}

// ------------------------------------------------------------------------------------------------ -b

/// `-b`, client side, after its own sending loop: sends `done` with its result while still taking the server's SENDs,
/// verifies what the server sent to this side, and prints both directions summed (perftest's duplex report).
fn client_bidir_done(
    s: &mut Session,
    o: &mut Oob,
    size: u64,
    (res, min_posted): (BwResult, u64),
    mut local: Result<(), String>,
    out: &Output,
) -> Result<(), String> {
    let payload = json!({
        "completed": res.iterations,
        "min_posted": min_posted,
        "result": res.to_json(),
    });
    let reply = service_during(s, o, size, move |o| o.sync("done", payload, PASSIVE_WAIT))?;
    let peer = BwResult::from_json(&reply["result"]).ok_or("the server's result is missing")?;
    let completed = reply.get("completed").and_then(Value::as_u64).unwrap_or(0);
    let their_min = reply.get("min_posted").and_then(Value::as_u64).unwrap_or(0);
    if s.p.verify && local.is_ok() {
        let mut mine = json!({});
        let (used, received) = (s.rx.used.clone(), s.rx.received);
        local = match s.rx.error.clone() {
            Some(e) => Err(e),
            None => check_incoming(
                s,
                size,
                SERVER,
                (&used, received),
                (completed, their_min),
                &mut mine,
            ),
        };
        if let (Ok(()), Some(v)) = (&local, mine["atomic_value"].as_u64())
            && v != completed
        {
            local = Err(format!(
                "this side's counter is {v} after {completed} FETCH_ADDs completed by the server"
            ));
        }
    }
    let verified = verdict(s, local, &reply, res.iterations)?;
    let (test, conn) = (s.p.test.name(), s.p.conn.name());
    emit(
        out,
        s.p.mtu,
        report::bw_line_sum(&res, &peer, out.gbits),
        report::bw_json_sum(test, conn, &res, &peer, verified),
    );
    report_both(out, &res, &peer);
    Ok(())
}

/// `-b`, server side of one size: the same sending loop as the client's, toward the client (taking its SENDs as they
/// come); then waits for the client's `done` while still receiving, verifies what the client sent to this side (and,
/// for READ, what this side read), answers with its verdict and its own result, and prints both directions summed.
fn server_bidir(s: &mut Session, o: &mut Oob, size: u64, out: &Output) -> Result<(), String> {
    let (res, min_posted) = client_bw(s, size, out)?;
    let mut local = Ok(());
    if s.p.verify && s.p.test == Test::ReadBw {
        s.sabotage(0)?;
        local = (0..min_posted.min(s.k)).try_for_each(|slot| s.check_slot(CLIENT, slot, size));
    }
    let done = service_during(s, o, size, |o| o.recv_msg("done", PASSIVE_WAIT))?;
    let completed = done.get("completed").and_then(Value::as_u64).unwrap_or(0);
    let their_min = done.get("min_posted").and_then(Value::as_u64).unwrap_or(0);
    let mut answer = json!({
        "verified": Value::Null,
        "received": s.rx.received,
        "completed": res.iterations,
        "min_posted": min_posted,
        "result": res.to_json(),
    });
    if s.p.verify {
        let (used, received) = (s.rx.used.clone(), s.rx.received);
        let r = local
            .and_then(|()| s.rx.error.clone().map_or(Ok(()), Err))
            .and_then(|()| {
                check_incoming(
                    s,
                    size,
                    CLIENT,
                    (&used, received),
                    (completed, their_min),
                    &mut answer,
                )
            });
        match r {
            Ok(()) => answer["verified"] = json!(true),
            Err(d) => {
                answer["verified"] = json!(false);
                answer["detail"] = json!(d);
            }
        }
    }
    o.send_msg("done", answer.clone())
        .map_err(|e| e.to_string())?;
    if let Some(peer) = BwResult::from_json(&done["result"]) {
        let mut j = report::bw_json_sum(
            s.p.test.name(),
            s.p.conn.name(),
            &res,
            &peer,
            answer["verified"].as_bool(),
        );
        j["side"] = json!("server");
        emit(out, s.p.mtu, report::bw_line_sum(&res, &peer, out.gbits), j);
        report_both(out, &res, &peer);
    }
    match answer.get("detail").and_then(Value::as_str) {
        Some(d) => Err(format!("verification failed: {d}")),
        None => Ok(()),
    }
}

/// `--report-both` (perftest's): under a `-b` table's summed line, each direction's own line, labelled.
fn report_both(out: &Output, own: &BwResult, peer: &BwResult) {
    if out.report_both && out.print && !out.json && out.level.is_none() {
        println!("{}   (sent by this side)", report::bw_line(own, out.gbits));
        println!("{}   (sent by the peer)", report::bw_line(peer, out.gbits));
    }
}

/// `-b`: runs `talk` (an out-of-band step that waits for the peer) on a second thread while this thread keeps taking
/// receive completions and posting the receives again, so the peer's SENDs never stall on this side's ring; then
/// waits until every message the peer reports completed (`completed` of the message `talk` returns) has been
/// received (SEND: at once when they all arrived; RC at most 5 s more), or, on UC/UD where a message may be lost,
/// until the CQ has been quiet for 200 ms (20 ms for the other RC tests).
fn service_during(
    s: &mut Session,
    o: &mut Oob,
    size: u64,
    talk: impl FnOnce(&mut Oob) -> Result<Value, crate::oob::OobError> + Send,
) -> Result<Value, String> {
    let send = s.p.test == Test::SendBw;
    let rc_send = send && s.p.conn == Conn::Rc;
    let settle = if s.p.conn == Conn::Rc {
        Duration::from_millis(20)
    } else {
        Duration::from_millis(200)
    };
    let flag = AtomicBool::new(false);
    let peer_completed = AtomicU64::new(0);
    let (v, err) = std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let r = talk(o);
            let n = r
                .as_ref()
                .ok()
                .and_then(|v| v.get("completed"))
                .and_then(Value::as_u64);
            peer_completed.store(n.unwrap_or(0), Ordering::Relaxed);
            // Release: the count above is visible to whoever sees the flag.
            flag.store(true, Ordering::Release);
            r
        });
        let mut err: Option<String> = None;
        let mut quiet = Instant::now();
        let mut done_at: Option<Instant> = None;
        loop {
            let n = s.poll();
            if n > 0 {
                quiet = Instant::now();
            }
            for idx in 0..n {
                let wc = s.wcs[idx];
                if wc.status != WcStatus::Success {
                    err.get_or_insert_with(|| wc_error(&wc));
                } else if wc.opcode == WcOpcode::Recv {
                    s.on_recv(&wc, size);
                }
            }
            if flag.load(Ordering::Acquire) {
                let t = *done_at.get_or_insert_with(Instant::now);
                let all_in = send && s.rx.received >= peer_completed.load(Ordering::Relaxed);
                if all_in
                    || (!rc_send && quiet.elapsed() >= settle)
                    || t.elapsed() >= Duration::from_secs(5)
                {
                    break;
                }
            }
        }
        let v = h.join().unwrap_or_else(|_| {
            Err(crate::oob::OobError::Protocol(
                "the out-of-band thread panicked".into(),
            ))
        });
        (v, err)
    });
    let v = v.map_err(|e| e.to_string())?;
    match err {
        Some(e) => Err(e),
        None => Ok(v),
    }
}

/// Verifies what the peer (`from`, its pattern) sent to this side during one size: WRITE the slots it wrote
/// (`min_posted` of them at most; UC tolerates a lost tail), SEND every slot a receive completed into and (RC) that
/// `received` reaches the peer's `completed`, the ping-pong WRITE slot 0; atomics report this side's counter as
/// `answer["atomic_value"]` (the peer compares it with its completed count); READ has nothing to check here (the
/// reader checks its own slots). `--debug-corrupt-before-verify` alters a received slot first.
fn check_incoming(
    s: &mut Session,
    size: u64,
    from: u8,
    (used, received): (&[bool], u64),
    (completed, min_posted): (u64, u64),
    answer: &mut Value,
) -> Result<(), String> {
    if !matches!(s.p.test, Test::ReadBw | Test::ReadLat) {
        // SEND lands in whichever slot the ring offers: alter one that received.
        let slot = used.iter().position(|&u| u).unwrap_or(0) as u64;
        s.sabotage(slot)?;
    }
    match s.p.test {
        Test::WriteBw if s.p.conn == Conn::Uc => {
            let slots = min_posted.min(s.k);
            (0..slots)
                .map(|slot| s.check_slot_uc(from, slot, size))
                .collect::<Result<Vec<bool>, String>>()
                .and_then(|c| match c.iter().filter(|&&x| x).count() {
                    0 if slots > 0 => {
                        Err("no WRITE arrived complete (all lost: UC retransmits nothing)".into())
                    }
                    _ => Ok(()),
                })
        }
        Test::WriteBw => {
            (0..min_posted.min(s.k)).try_for_each(|slot| s.check_slot(from, slot, size))
        }
        Test::SendBw | Test::SendLat => check_send(s, from, used, received, size, completed),
        Test::WriteLat => {
            if completed > 0 {
                s.check_slot(from, 0, size)
            } else {
                Ok(())
            }
        }
        Test::AtomicBw | Test::AtomicLat => match s.bytes(s.slot_off(0), 8) {
            Ok(b) => {
                let v = u64::from_le_bytes(b.as_slice().try_into().unwrap_or_default());
                answer["atomic_value"] = json!(v);
                Ok(())
            }
            Err(e) => Err(format!("reading the counter: {e}")),
        },
        Test::ReadBw | Test::ReadLat => Ok(()),
    }
}

fn check_send(
    s: &Session,
    from: u8,
    used: &[bool],
    received: u64,
    size: u64,
    completed: u64,
) -> Result<(), String> {
    if s.p.conn == Conn::Rc && received < completed {
        return Err(format!(
            "received {received} messages, the peer completed {completed}"
        ));
    }
    if received == 0 && completed > 0 {
        return Err("no message was received".into());
    }
    for (slot, &u) in used.iter().enumerate() {
        if u {
            s.check_slot(from, slot as u64, size)?;
        }
    }
    Ok(())
}

/// Packets this side's device received and accepted so far (`rcvd_pkts`).
fn rcvd_pkts(s: &Session) -> u64 {
    s.pd.context().counters().map(|c| c.rcvd_pkts).unwrap_or(0)
}

/// Waits until this side has accepted `want` packets since the counter read `since` (every packet the peer sent
/// has landed: no wait at all in the common case), or — some were lost, which UC allows — until the counter has not
/// moved for 100 ms (at most 2 s).
fn settle_rx(s: &Session, since: u64, want: u64) {
    let t0 = Instant::now();
    let mut last = rcvd_pkts(s);
    let mut still = Instant::now();
    while last.wrapping_sub(since) < want
        && t0.elapsed() < Duration::from_secs(2)
        && still.elapsed() < Duration::from_millis(100)
    {
        std::thread::sleep(Duration::from_micros(200));
        let now = rcvd_pkts(s);
        if now != last {
            last = now;
            still = Instant::now();
        }
    }
}

/// What the active server loop saw.
struct Served {
    done: Value,
    used: Vec<bool>,
    received: u64,
}

/// Services receives (reposting them; ping-pong tests also reply) until the client's `done` has arrived and the
/// CQ has then stayed quiet for a settle time (RC: an acknowledged message's receive completion is already in the
/// engine CQ when the client sees its ACK, so a short settle suffices; UC/UD: a longer one for stragglers) — or at
/// once, on any transport, when as many messages were received as the client completed (nothing is in flight).
fn serve_active(s: &mut Session, o: &mut Oob, size: u64) -> Result<Served, String> {
    let flag = AtomicBool::new(false);
    let client_completed = AtomicU64::new(0);
    let mut used = vec![false; s.k as usize];
    let mut received = 0u64;
    let rkey = roce_proto::Rkey(s.remote.rkey);
    let test = s.p.test;
    let flags = if test == Test::SendBw {
        SendFlags::EMPTY
    } else {
        s.inline_flag(size)
    };
    let settle = if s.p.conn == Conn::Rc {
        Duration::from_millis(20)
    } else {
        Duration::from_millis(200)
    };
    let (done, loop_err) = std::thread::scope(|sc| {
        let waiter = sc.spawn(|| {
            let r = o.recv_msg("done", PASSIVE_WAIT);
            let n = r
                .as_ref()
                .ok()
                .and_then(|v| v.get("completed"))
                .and_then(Value::as_u64);
            client_completed.store(n.unwrap_or(u64::MAX), Ordering::Relaxed);
            // Release: the count above is visible to whoever sees the flag.
            flag.store(true, Ordering::Release);
            r
        });
        let mut loop_err: Option<String> = None;
        let mut reply_id = 0u64;
        let mut replies_done = 0u64;
        let mut quiet_since = Instant::now();
        let mut done_at: Option<Instant> = None;
        loop {
            let n = s.poll();
            if n > 0 {
                quiet_since = Instant::now();
            }
            for idx in 0..n {
                let wc = s.wcs[idx];
                if wc.status != WcStatus::Success {
                    loop_err.get_or_insert_with(|| wc_error(&wc));
                    continue;
                }
                if !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    // A reply of ours completed (RC: acknowledged by the client).
                    replies_done += 1;
                    continue;
                }
                received += 1;
                let q = (wc.wr_id >> 32) as usize;
                let slot = wc.wr_id & 0xFFFF_FFFF;
                if wc.opcode == WcOpcode::Recv {
                    if let Some(u) = used.get_mut(slot as usize) {
                        *u = true;
                    }
                    let want = s.recv_len(size);
                    if wc.byte_len != want {
                        loop_err.get_or_insert_with(|| {
                            format!("received {} bytes, expected {want}", wc.byte_len)
                        });
                    }
                }
                if let Err(e) = s.post_recv(q, slot) {
                    loop_err.get_or_insert_with(|| format!("post_recv: {e}"));
                }
                if test != Test::SendBw {
                    let sge = [s.mr.sge(0, size as u32)];
                    let op = if test == Test::WriteLat {
                        SendOp::RdmaWriteWithImm {
                            remote_addr: s.remote.va.wrapping_add(s.slot_off(0)),
                            rkey,
                            imm: reply_id as u32,
                        }
                    } else {
                        SendOp::Send
                    };
                    let mut wr = SendWr::new(reply_id, op, &sge).flags(flags).signaled();
                    if let Some(d) = s.ud(q) {
                        wr = wr.ud(d);
                    }
                    reply_id += 1;
                    if let Err(e) = s.qps[q].post_send(&[wr]) {
                        loop_err.get_or_insert_with(|| format!("post_send: {e}"));
                    }
                }
            }
            if flag.load(Ordering::Acquire) {
                let t = *done_at.get_or_insert_with(Instant::now);
                // Every message the client completed has been received (RC SEND: wait for that, bounded; UC/UD
                // completions mean "sent", so equality means nothing is in flight): stop. Otherwise (a loss on an
                // unreliable transport, or a test whose receives the client does not count): stop once the CQ has
                // been quiet for `settle`.
                // And every reply of ours has completed, so the client's last packet (RC: its ACK of our last reply)
                // is in before this side stops and its counters are read.
                let all_in = received >= client_completed.load(Ordering::Relaxed)
                    && replies_done >= reply_id;
                if all_in
                    || (quiet_since.elapsed() >= settle
                        && (test != Test::SendBw || s.p.conn != Conn::Rc))
                    || t.elapsed() >= Duration::from_secs(5)
                {
                    break;
                }
            }
        }
        let done = waiter.join().unwrap_or_else(|_| {
            Err(crate::oob::OobError::Protocol(
                "the out-of-band reader panicked".into(),
            ))
        });
        (done, loop_err)
    });
    let done = done.map_err(|e| e.to_string())?;
    if let Some(e) = loop_err {
        return Err(e);
    }
    Ok(Served {
        done,
        used,
        received,
    })
}
