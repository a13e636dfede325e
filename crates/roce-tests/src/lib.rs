//! roce-tests: the integration suite's harness. Real [`roce_proto::Engine`]s talk over roce-link's
//! deterministic [`SimNet`], each behind a [`Faulty`] decorator (and a [`Pcap`] recorder), on a virtual clock.
//!
//! The shape follows quinn-proto's `tests/util.rs` `Pair` (`STYLE.md` T4): [`Pair::step`] runs one round of
//! "receive → timers → transmit" on every node at the current instant and, when nothing is left to do now,
//! advances virtual time to the next event (`min(engine poll_timeout, link poll_at)`); [`Pair::drive`] repeats
//! that until the network is idle, and panics on a livelock (too many steps). Every transmitted frame can be
//! captured for assertions and decoded with [`Pkt::parse`] (roce-wire views).
//!
//! The driver loop is the one a real runner uses (`STYLE.md` D1): `rx_burst → handle_frame*`,
//! `handle_timeout` if due, `tx_buf → poll_transmit → tx_commit` up to a budget, `flush`.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

use std::io::Write;
use std::time::Duration;

pub use roce_link::{Fault, FaultConfig, FaultStats, Faulty, GilbertElliott, Link, LinkError};
pub use roce_link::{Pcap, PcapMode, SimConfig, SimNet, SimPort};
use roce_proto::*;
pub use roce_proto::{Instant, Psn, Qpn};

/// MAC address of node `i`.
pub const fn mac(i: usize) -> [u8; 6] {
    [2, 0, 0, 0, 0, i as u8 + 1]
}

/// IPv4 address of node `i`.
pub const fn ip(i: usize) -> [u8; 4] {
    [10, 0, 0, i as u8 + 1]
}

/// The link stack of one node: engine ⇄ pcap recorder ⇄ fault injector ⇄ simulated port.
pub type NodeLink = Pcap<Faulty<SimPort>, Box<dyn Write>>;

/// One engine and its link.
pub struct Node {
    /// The engine under test.
    pub engine: Engine,
    /// Its link stack.
    pub link: NodeLink,
}

impl Node {
    /// The fault injector of this node's link (transmit side = frames this node sends).
    pub fn faults(&mut self) -> &mut Faulty<SimPort> {
        self.link.inner_mut()
    }
}

/// A frame captured when a node transmitted it (before faults were applied).
#[derive(Clone, Debug)]
pub struct Captured {
    /// Virtual time of transmission.
    pub at: Instant,
    /// Index of the sending node.
    pub from: usize,
    /// The engine's metadata for the frame.
    pub meta: TxMeta,
    /// The frame bytes.
    pub frame: Vec<u8>,
}

/// Harness options.
#[derive(Clone, Debug)]
pub struct PairConfig {
    /// Number of engines.
    pub nodes: usize,
    /// Simulated segment.
    pub sim: SimConfig,
    /// Engine configuration template (MAC, GID and seed are set per node).
    pub engine: EngineConfig,
    /// Seed for the fault injectors (node `i` uses `seed + i`).
    pub fault_seed: u64,
    /// Capture every transmitted frame into [`Pair::captured`].
    pub capture: bool,
    /// Frames a node may transmit per step (the doorbell batch, `STYLE.md` E8).
    pub tx_budget: usize,
    /// Frames a node may receive per step.
    pub rx_budget: usize,
}

impl Default for PairConfig {
    fn default() -> Self {
        PairConfig {
            nodes: 2,
            sim: SimConfig {
                bandwidth_bps: 100_000_000_000,
                propagation: Duration::from_micros(1),
                ..SimConfig::default()
            },
            engine: EngineConfig::default(),
            fault_seed: 0x5eed,
            capture: true,
            tx_budget: 32,
            rx_budget: 64,
        }
    }
}

/// The network did not go idle within the step bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Livelock {
    /// Steps taken.
    pub steps: u64,
    /// Virtual time reached.
    pub now: Instant,
}

/// N engines on one simulated segment, driven on a virtual clock.
pub struct Pair {
    /// The nodes (node 0 = "a", node 1 = "b").
    pub nodes: Vec<Node>,
    /// The simulated segment.
    pub sim: SimNet,
    /// Current virtual time.
    pub now: Instant,
    /// Captured transmitted frames (if enabled).
    pub captured: Vec<Captured>,
    /// Capture switch.
    pub capture: bool,
    /// Steps taken so far.
    pub steps: u64,
    /// `poll_transmit` calls to answer with a zero-length buffer per node (engine-level back-pressure, S05).
    pub refuse_tx: Vec<u32>,
    tx_budget: usize,
    rx_budget: usize,
    stalls: u32,
}

impl Pair {
    /// Two nodes with default options.
    pub fn new() -> Pair {
        Pair::with_config(PairConfig::default())
    }

    /// Nodes per `cfg`; pcap output goes nowhere (see [`Pair::with_pcap`]).
    pub fn with_config(cfg: PairConfig) -> Pair {
        let sinks = (0..cfg.nodes)
            .map(|_| Box::new(std::io::sink()) as Box<dyn Write>)
            .collect();
        Pair::with_pcap(cfg, sinks, PcapMode::TxOnly)
    }

    /// Nodes per `cfg`, node `i` recording into `sinks[i]` with `mode`.
    pub fn with_pcap(cfg: PairConfig, sinks: Vec<Box<dyn Write>>, mode: PcapMode) -> Pair {
        let sim = SimNet::new(cfg.sim);
        let mut nodes = Vec::new();
        for (i, sink) in sinks.into_iter().enumerate().take(cfg.nodes) {
            let ecfg = EngineConfig {
                mac: mac(i),
                gids: vec![Gid::from_ipv4(ip(i))],
                seed: cfg.engine.seed.wrapping_add(i as u64 + 1),
                ..cfg.engine.clone()
            };
            let port = sim.add_port(mac(i));
            let faulty = Faulty::new(
                port,
                FaultConfig::default(),
                FaultConfig::default(),
                cfg.fault_seed + i as u64,
            );
            let link = Pcap::new(faulty, sink, mode).expect("pcap header");
            nodes.push(Node {
                engine: Engine::new(ecfg),
                link,
            });
        }
        let n = nodes.len();
        Pair {
            nodes,
            sim,
            now: Instant::from_micros(1),
            captured: Vec::new(),
            capture: cfg.capture,
            steps: 0,
            refuse_tx: vec![0; n],
            tx_budget: cfg.tx_budget,
            rx_budget: cfg.rx_budget,
            stalls: 0,
        }
    }

    /// Engine of node 0.
    pub fn a(&mut self) -> &mut Engine {
        &mut self.nodes[0].engine
    }

    /// Engine of node 1.
    pub fn b(&mut self) -> &mut Engine {
        &mut self.nodes[1].engine
    }

    /// Engine of node `i`.
    pub fn e(&mut self, i: usize) -> &mut Engine {
        &mut self.nodes[i].engine
    }

    /// A copy of node `i`'s port counters.
    pub fn counters(&self, i: usize) -> Counters {
        self.nodes[i].engine.counters().clone()
    }

    /// Fault injector on the transmit path of node `i`.
    pub fn faults(&mut self, i: usize) -> &mut Faulty<SimPort> {
        self.nodes[i].faults()
    }

    /// Sets random transmit faults for every node.
    pub fn set_faults_all(&mut self, cfg: FaultConfig) {
        for n in &mut self.nodes {
            n.faults().set_tx_faults(cfg);
        }
    }

    /// One round at the current instant; if nothing happened, advances time to the next event.
    /// Returns false when nothing can ever happen again (idle: no frames in flight, no timers).
    pub fn step(&mut self) -> bool {
        self.step_within(None, false)
    }

    /// [`Pair::step`] whose clock never passes `horizon`, and moves to it over an idle network if
    /// `idle_passes_time` (the rule of [`roce_proto::time::next_virtual_instant`]); false once nothing is left to do
    /// before it.
    pub fn step_within(&mut self, horizon: Option<Instant>, idle_passes_time: bool) -> bool {
        self.steps += 1;
        let now = self.now;
        let mut progress = false;
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let Node { engine, link } = node;
            let mut rx = 0usize;
            link.rx_burst(now, self.rx_budget, &mut |f: &mut [u8]| {
                engine.handle_frame(now, f);
                rx += 1;
            })
            .expect("rx_burst");
            progress |= rx > 0;
            if engine.poll_timeout().is_some_and(|t| t <= now) {
                engine.handle_timeout(now);
                progress = true;
            }
            for _ in 0..self.tx_budget {
                if self.refuse_tx[i] > 0 {
                    // Engine-level back-pressure: a buffer too small for any frame must consume nothing.
                    let mut empty = [0u8; 0];
                    if engine.poll_transmit(now, &mut empty).is_some() {
                        panic!("poll_transmit produced a frame into a zero-length buffer");
                    }
                    self.refuse_tx[i] -= 1;
                    progress = true;
                    break;
                }
                let buf = match link.tx_buf(now) {
                    Ok(b) => b,
                    Err(LinkError::Busy) => {
                        progress = true;
                        break;
                    }
                    Err(e) => panic!("tx_buf: {e}"),
                };
                let Some(meta) = engine.poll_transmit(now, buf) else {
                    break;
                };
                if self.capture {
                    self.captured.push(Captured {
                        at: now,
                        from: i,
                        meta,
                        frame: buf[..meta.len].to_vec(),
                    });
                }
                link.tx_commit(now, meta.len).expect("tx_commit");
                progress = true;
            }
            link.flush(now).expect("flush");
        }
        if progress {
            return true;
        }
        let next = self.next_event();
        if let Some(t) = time::next_virtual_instant(now, next, horizon, idle_passes_time) {
            self.now = t;
            self.stalls = 0;
            return true;
        }
        match next {
            // The horizon is reached.
            Some(t) if t > now || horizon.is_some_and(|h| h <= now) => false,
            Some(t) => {
                // Something claims to be due but did nothing: a stuck engine timer or link. Nudge the clock,
                // and fail loudly if it persists (a silent 1-ns crawl would look like a livelock much later).
                self.stalls += 1;
                assert!(
                    self.stalls < 1000,
                    "stuck: event due at {t} does nothing (now {now})"
                );
                self.now = now + Duration::from_nanos(1);
                true
            }
            None => false,
        }
    }

    /// The earliest pending event over all engines and links.
    pub fn next_event(&mut self) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        for n in &mut self.nodes {
            next = roce_link::min_instant(next, n.engine.poll_timeout());
            next = roce_link::min_instant(next, n.link.poll_at());
        }
        next
    }

    /// Steps until idle, at most `max_steps` steps.
    pub fn drive_bounded(&mut self, max_steps: u64) -> Result<(), Livelock> {
        for _ in 0..max_steps {
            if !self.step() {
                return Ok(());
            }
        }
        Err(Livelock {
            steps: self.steps,
            now: self.now,
        })
    }

    /// Steps until idle; panics on a livelock (10 million steps).
    pub fn drive(&mut self) {
        if let Err(l) = self.drive_bounded(10_000_000) {
            panic!("livelock: {l:?}");
        }
    }

    /// Steps until `cond` holds (checked after every step), the network goes idle, or `limit` of virtual time has
    /// passed. The clock never passes `now + limit`: it stops there even when the next timer is later, which then
    /// has neither fired nor been jumped over ([`Pair::step_within`]). Returns whether `cond` held.
    pub fn drive_until(&mut self, limit: Duration, cond: impl FnMut(&mut Pair) -> bool) -> bool {
        self.run_to(self.now + limit, false, cond)
    }

    fn run_to(
        &mut self,
        end: Instant,
        idle_passes_time: bool,
        mut cond: impl FnMut(&mut Pair) -> bool,
    ) -> bool {
        let mut guard = 0u64;
        loop {
            if cond(self) {
                return true;
            }
            if !self.step_within(Some(end), idle_passes_time) {
                return cond(self);
            }
            guard += 1;
            assert!(
                guard < 50_000_000,
                "livelock in drive_until at {}",
                self.now
            );
        }
    }

    /// Steps for `d` of virtual time or until the network goes idle, whichever comes first. The clock never passes
    /// `now + d`: a timer due after it has neither fired nor been jumped over, so a test can observe the state just
    /// before a retransmission ([`Pair::drive`] instead runs until idle, timers included).
    pub fn drive_for(&mut self, d: Duration) {
        self.drive_until(d, |_| false);
    }

    /// Lets exactly `d` of virtual time pass (a real-time step): every frame and timer due within it is handled on
    /// time, and the clock ends at `now + d` even if the network goes idle earlier (time passing on an idle
    /// network, e.g. to let a CNP interval elapse).
    pub fn advance(&mut self, d: Duration) {
        self.run_to(self.now + d, true, |_| false);
    }

    /// The last `n` captured frames, one line each (`time node→ frame`), pretty-printed by roce-wire
    /// ([`roce_wire::PrettyFrame`]) — for assertion messages.
    pub fn dump(&self, n: usize) -> String {
        let mut out = String::new();
        for c in self
            .captured
            .iter()
            .rev()
            .take(n)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            out.push_str(&format!(
                "{} node{}→ {}\n",
                c.at,
                c.from,
                roce_wire::PrettyFrame(&c.frame)
            ));
        }
        out
    }

    /// Captured frames sent by node `from`, decoded (non-RoCE frames skipped).
    pub fn sent_by(&self, from: usize) -> Vec<Pkt> {
        self.captured
            .iter()
            .filter(|c| c.from == from)
            .filter_map(|c| Pkt::parse(&c.frame))
            .collect()
    }
}

impl Default for Pair {
    fn default() -> Self {
        Pair::new()
    }
}

// ------------------------------------------------------------------------------------------------ connections

/// Options of a connected QP pair (defaults = rc_pingpong-like values, `ROCEV2.md §4.7`).
#[derive(Clone, Copy, Debug)]
pub struct ConnOpts {
    /// Transport.
    pub qp_type: QpType,
    /// Path MTU.
    pub mtu: Mtu,
    /// Requested queue sizes.
    pub cap: QpCap,
    /// Responder permissions of both QPs.
    pub access: AccessFlags,
    /// Initial send PSN of the QP on node a (= the expected PSN of the QP on node b).
    pub a_psn: Psn,
    /// Initial send PSN of the QP on node b.
    pub b_psn: Psn,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// RNR timer code the responder advertises.
    pub min_rnr_timer: u8,
    /// Initiator depth.
    pub max_rd_atomic: u8,
    /// Responder resources.
    pub max_dest_rd_atomic: u8,
    /// Signal every WR.
    pub sq_sig_all: bool,
    /// CQ depth.
    pub cq_depth: u32,
    /// Q_Key (UD).
    pub qkey: u32,
}

impl Default for ConnOpts {
    fn default() -> Self {
        ConnOpts {
            qp_type: QpType::Rc,
            mtu: Mtu::Mtu1024,
            cap: QpCap {
                max_send_wr: 256,
                max_recv_wr: 256,
                max_send_sge: 16,
                max_recv_sge: 16,
                max_inline_data: 256,
            },
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            a_psn: Psn::new(100),
            b_psn: Psn::new(9000),
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            sq_sig_all: false,
            cq_depth: 65536,
            qkey: 0x1111_1111,
        }
    }
}

/// One end of a connection: the objects created on its node.
#[derive(Clone, Copy, Debug)]
pub struct End {
    /// Node index.
    pub node: usize,
    /// Protection domain.
    pub pd: PdHandle,
    /// CQ for both queues.
    pub cq: CqHandle,
    /// The QP.
    pub qpn: Qpn,
    /// Capabilities granted.
    pub cap: QpCap,
}

/// Creates PD, CQ and QP on node `node` (state RESET).
pub fn make_qp(p: &mut Pair, node: usize, o: &ConnOpts) -> End {
    let e = p.e(node);
    let pd = e.alloc_pd().expect("alloc_pd");
    let cq = e.create_cq(o.cq_depth).expect("create_cq");
    let (qpn, cap) = e
        .create_qp(&QpInitAttr {
            qp_type: o.qp_type,
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap: o.cap,
            sq_sig_all: o.sq_sig_all,
        })
        .expect("create_qp");
    End {
        node,
        pd,
        cq,
        qpn,
        cap,
    }
}

/// RESET→INIT→RTR→RTS of `me` towards `peer` with the masks `ROCEV2.md §4.6` requires for its type.
pub fn bring_up(
    p: &mut Pair,
    me: End,
    peer: End,
    my_psn: Psn,
    peer_psn: Psn,
    o: &ConnOpts,
) -> Result<(), ModifyQpError> {
    let e = p.e(me.node);
    let mut at = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: o.access,
        qkey: o.qkey,
        ..QpAttr::default()
    };
    let base = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    let init = if o.qp_type == QpType::Ud {
        base | QpAttrMask::QKEY
    } else {
        base | QpAttrMask::ACCESS_FLAGS
    };
    e.modify_qp(me.qpn, &at, init)?;
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(ip(peer.node)),
        dmac: mac(peer.node),
        traffic_class: 26 << 2,
        ..AhAttr::default()
    };
    at.path_mtu = o.mtu;
    at.dest_qp_num = peer.qpn;
    at.rq_psn = peer_psn;
    at.max_dest_rd_atomic = o.max_dest_rd_atomic;
    at.min_rnr_timer = o.min_rnr_timer;
    let rtr = match o.qp_type {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
                | QpAttrMask::MAX_DEST_RD_ATOMIC
                | QpAttrMask::MIN_RNR_TIMER
        }
        QpType::Uc => {
            QpAttrMask::STATE
                | QpAttrMask::AV
                | QpAttrMask::PATH_MTU
                | QpAttrMask::DEST_QPN
                | QpAttrMask::RQ_PSN
        }
        QpType::Ud => QpAttrMask::STATE,
    };
    e.modify_qp(me.qpn, &at, rtr)?;
    at.qp_state = QpState::Rts;
    at.sq_psn = my_psn;
    at.timeout = o.timeout;
    at.retry_cnt = o.retry_cnt;
    at.rnr_retry = o.rnr_retry;
    at.max_rd_atomic = o.max_rd_atomic;
    let rts = match o.qp_type {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::SQ_PSN
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::MAX_QP_RD_ATOMIC
        }
        _ => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    };
    e.modify_qp(me.qpn, &at, rts)
}

/// Creates and connects a QP pair between nodes 0 and 1 (UD: both QPs in RTS; address them per WR with
/// [`ud_dest`]).
pub fn connect(p: &mut Pair, o: &ConnOpts) -> (End, End) {
    connect_nodes(p, 0, 1, o)
}

/// Creates and connects a QP pair between nodes `x` and `y`.
pub fn connect_nodes(p: &mut Pair, x: usize, y: usize, o: &ConnOpts) -> (End, End) {
    let a = make_qp(p, x, o);
    let b = make_qp(p, y, o);
    bring_up(p, a, b, o.a_psn, o.b_psn, o).expect("bring up a");
    bring_up(p, b, a, o.b_psn, o.a_psn, o).expect("bring up b");
    (a, b)
}

/// An address handle on `from`'s node towards `to` plus the UD destination for a send WR.
pub fn ud_dest(p: &mut Pair, from: End, to: End, qkey: u32) -> UdDest {
    let attr = AhAttr {
        dgid: Gid::from_ipv4(ip(to.node)),
        dmac: mac(to.node),
        traffic_class: 26 << 2,
        ..AhAttr::default()
    };
    let ah = p.e(from.node).create_ah(from.pd, &attr).expect("create_ah");
    UdDest {
        ah,
        remote_qpn: to.qpn,
        remote_qkey: qkey,
    }
}

/// All MR permissions.
pub const ALL_ACCESS: AccessFlags = AccessFlags(1 | 2 | 4 | 8);

/// Registers an MR of `len` bytes filled with `fill(i)` on `end`'s node and PD.
pub fn reg(p: &mut Pair, end: End, len: usize, fill: impl Fn(usize) -> u8) -> MrInfo {
    let buf: Vec<u8> = (0..len).map(fill).collect();
    p.e(end.node)
        .reg_mr(end.pd, buf, ALL_ACCESS)
        .expect("reg_mr")
}

/// An SGE of `len` bytes at offset `off` of `m`.
pub fn sge(m: &MrInfo, off: u64, len: u32) -> Sge {
    Sge {
        addr: m.addr + off,
        length: len,
        lkey: m.lkey,
    }
}

/// Drains a CQ.
pub fn poll_all(e: &mut Engine, cq: CqHandle) -> Vec<Wc> {
    let mut out = Vec::new();
    let mut buf = [Wc::default(); 64];
    loop {
        let n = e.poll_cq(cq, &mut buf);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
    }
}

// ------------------------------------------------------------------------------------------------ decoding

/// The fields of a captured RoCE v2 frame the suite asserts on (decoded with roce-wire views).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pkt {
    /// BTH opcode byte.
    pub opcode: u8,
    /// BTH PSN.
    pub psn: u32,
    /// BTH DestQP.
    pub dest_qp: u32,
    /// BTH AckReq.
    pub ack_req: bool,
    /// BTH SE.
    pub solicited: bool,
    /// BTH MigReq.
    pub mig_req: bool,
    /// BTH PadCnt.
    pub pad: u8,
    /// BTH P_Key.
    pub pkey: u16,
    /// BTH BECN.
    pub becn: bool,
    /// BTH TVer.
    pub tver: u8,
    /// UDP source port.
    pub sport: u16,
    /// UDP destination port.
    pub dport: u16,
    /// IP DSCP.
    pub dscp: u8,
    /// IP ECN bits.
    pub ecn: u8,
    /// RETH (VA, R_Key, DMA length).
    pub reth: Option<(u64, u32, u32)>,
    /// AtomicETH (VA, R_Key, swap/add, compare).
    pub atomic: Option<(u64, u32, u64, u64)>,
    /// AETH (syndrome byte, MSN).
    pub aeth: Option<(u8, u32)>,
    /// DETH (Q_Key, source QPN).
    pub deth: Option<(u32, u32)>,
    /// Immediate data.
    pub imm: Option<u32>,
    /// IETH R_Key.
    pub ieth: Option<u32>,
    /// Payload bytes (without pad).
    pub payload: Vec<u8>,
    /// Pad bytes as on the wire.
    pub pad_bytes: Vec<u8>,
    /// Transport bytes from the BTH up to (excluding) the ICRC.
    pub transport_len: usize,
    /// roce-wire's verdict on the stored ICRC.
    pub icrc_ok: bool,
}

impl Pkt {
    /// Decodes a RoCE v2 frame with roce-wire's whole-frame parser ([`roce_wire::RoceRepr::parse`]); `None` if
    /// it rejects the frame.
    pub fn parse(f: &[u8]) -> Option<Pkt> {
        let pf = roce_wire::RoceRepr::parse(f).ok()?;
        let r = pf.repr;
        let e = r.ext;
        let pad = usize::from(r.bth.pad_count);
        let pad_at = pf.payload_offset + pf.payload.len();
        let bth_off = roce_wire::RoceFrame::new(f).ok()?.bth_offset();
        let tver = roce_wire::RoceFrame::new(f).ok()?.bth().tver();
        Some(Pkt {
            opcode: r.bth.opcode.0,
            psn: r.bth.psn.value(),
            dest_qp: r.bth.dest_qp.value(),
            ack_req: r.bth.ack_req,
            solicited: r.bth.solicited,
            mig_req: r.bth.mig_req,
            pad: r.bth.pad_count,
            pkey: r.bth.pkey,
            becn: r.bth.becn,
            tver,
            sport: r.udp.src_port,
            dport: r.udp.dst_port,
            dscp: r.ip.dscp(),
            ecn: r.ip.ecn().bits(),
            reth: e.reth.map(|x| (x.va, x.rkey, x.dma_len)),
            atomic: e.atomic_eth.map(|x| (x.va, x.rkey, x.swap_add, x.compare)),
            aeth: e.aeth.map(|x| (x.syndrome.to_byte(), x.msn.value())),
            deth: e.deth.map(|x| (x.qkey, x.src_qp.value())),
            imm: e.immdt.map(|x| x.imm_data),
            ieth: e.ieth.map(|x| x.rkey),
            payload: pf.payload.to_vec(),
            pad_bytes: f.get(pad_at..pad_at + pad)?.to_vec(),
            transport_len: pad_at + pad - bth_off,
            icrc_ok: pf.icrc_ok,
        })
    }

    /// True for requester packets (opcode table direction).
    pub fn is_request(&self) -> bool {
        roce_wire::Opcode(self.opcode)
            .info()
            .is_some_and(|i| i.is_request())
    }
}

// ------------------------------------------------------------------------------------------------ frames

/// CRC-32 (IEEE 802.3, reflected, init and final XOR all-ones), bitwise: an implementation independent of the
/// engine's and roce-wire's table/`crc32fast` code, for cross-checking ICRCs.
pub fn crc32_ieee(data: &[u8]) -> u32 {
    let mut c = 0xFFFF_FFFFu32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0xEDB8_8320
            } else {
                c >> 1
            };
        }
    }
    !c
}

/// Offsets of an untagged IPv4/IPv6 RoCE frame: (L3 offset, UDP offset, ICRC offset).
fn layout(f: &[u8]) -> Option<(usize, usize, usize)> {
    let ethertype = u16::from_be_bytes([*f.get(12)?, *f.get(13)?]);
    let udp = match ethertype {
        0x0800 => 14 + usize::from(*f.get(14)? & 0x0f) * 4,
        0x86dd => 54,
        _ => return None,
    };
    let udp_len = usize::from(u16::from_be_bytes([*f.get(udp + 4)?, *f.get(udp + 5)?]));
    let icrc = (udp + udp_len).checked_sub(4)?;
    (icrc + 4 <= f.len() && icrc >= udp + 20).then_some((14, udp, icrc))
}

/// The ICRC of a frame computed independently (`ROCEV2.md §3`): CRC-32 over 8 bytes of 0xFF, the IP header
/// with TOS/TTL/checksum (IPv6: traffic class, flow label, hop limit) set to ones, the UDP header with its
/// checksum set to ones, the BTH with byte 4 set to ones, then everything up to the ICRC.
pub fn icrc_compute(f: &[u8]) -> Option<u32> {
    let (l3, udp, icrc) = layout(f)?;
    let mut m = vec![0xFFu8; 8];
    m.extend_from_slice(&f[l3..icrc]);
    let ip = 8;
    if f[12] == 0x08 {
        m[ip + 1] = 0xFF;
        m[ip + 8] = 0xFF;
        m[ip + 10] = 0xFF;
        m[ip + 11] = 0xFF;
    } else {
        m[ip] |= 0x0F;
        m[ip + 1] = 0xFF;
        m[ip + 2] = 0xFF;
        m[ip + 3] = 0xFF;
        m[ip + 7] = 0xFF;
    }
    let u = 8 + (udp - l3);
    m[u + 6] = 0xFF;
    m[u + 7] = 0xFF;
    m[u + 8 + 4] = 0xFF;
    Some(crc32_ieee(&m))
}

/// True if the frame's stored ICRC (little-endian, `ROCEV2.md §3` step 4) matches [`icrc_compute`].
pub fn icrc_ok(f: &[u8]) -> bool {
    match (layout(f), icrc_compute(f)) {
        (Some((_, _, at)), Some(v)) => f[at..at + 4] == v.to_le_bytes(),
        _ => false,
    }
}

/// RFC 791 header checksum of `h` (checksum field included as found).
pub fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut s = 0u32;
    for w in h.chunks(2) {
        s += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while s > 0xFFFF {
        s = (s & 0xFFFF) + (s >> 16);
    }
    !(s as u16)
}

/// Recomputes the IPv4 header checksum of an untagged IPv4 frame.
pub fn fix_ipv4_checksum(f: &mut [u8]) {
    let ihl = usize::from(f[14] & 0x0f) * 4;
    f[24] = 0;
    f[25] = 0;
    let c = ipv4_checksum(&f[14..14 + ihl]);
    f[24..26].copy_from_slice(&c.to_be_bytes());
}

/// Builds a frame from `template`'s Ethernet/IPv4/UDP headers and new `transport` bytes (BTH .. pad): fixes the
/// IP total length, UDP length, IPv4 checksum and appends a correct ICRC. For injecting crafted requests.
pub fn craft(template: &[u8], transport: &[u8]) -> Vec<u8> {
    let (_, udp, _) = layout(template).expect("template is a RoCE frame");
    let mut f = template[..udp + 8].to_vec();
    f.extend_from_slice(transport);
    f.extend_from_slice(&[0; 4]);
    let udp_len = (8 + transport.len() + 4) as u16;
    f[udp + 4..udp + 6].copy_from_slice(&udp_len.to_be_bytes());
    let ip_len = (udp - 14) as u16 + udp_len;
    f[16..18].copy_from_slice(&ip_len.to_be_bytes());
    fix_ipv4_checksum(&mut f);
    refill_icrc(&mut f);
    f
}

/// Recomputes and stores the ICRC of a frame.
pub fn refill_icrc(f: &mut [u8]) {
    let (_, _, at) = layout(f).expect("RoCE frame");
    let v = icrc_compute(f).expect("RoCE frame");
    f[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

/// The transport bytes (BTH .. pad, without the ICRC) of a RoCE frame.
pub fn transport_of(f: &[u8]) -> &[u8] {
    let (_, udp, at) = layout(f).expect("RoCE frame");
    &f[udp + 8..at]
}

/// Path of the reference data directory (`<checkout>/testdata`, provenance in `testdata/README.md`).
pub fn testdata_dir() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata")
}

/// Writes `frames` (time, bytes) as a nanosecond pcap file through roce-link's [`Pcap`] decorator over a
/// scratch simulated port.
pub fn write_pcap(path: &std::path::Path, frames: &[(Instant, &[u8])]) {
    let net = SimNet::new(SimConfig {
        bandwidth_bps: 0,
        ..SimConfig::default()
    });
    let port = net.add_port([2, 0, 0, 0, 0, 0xfe]);
    let file = std::fs::File::create(path).expect("create pcap");
    let mut rec = Pcap::new(port, std::io::BufWriter::new(file), PcapMode::TxOnly).expect("pcap");
    for (t, f) in frames {
        rec.transmit(*t, f).expect("record");
    }
    let (_, mut w) = rec.into_parts();
    w.flush().expect("flush pcap");
}

/// Runs `check_pcap.py` on `path`: `None` if python3 is unavailable, else `(passed, final line)`.
pub fn check_pcap(path: &std::path::Path) -> Option<(bool, String)> {
    let out = std::process::Command::new("python3")
        .arg(testdata_dir().join("tools/check_pcap.py"))
        .arg("--quiet")
        .arg(path)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Some((
        out.status.success(),
        text.lines().last().unwrap_or("").to_owned(),
    ))
}

/// Captured frames of a pair written to a temporary pcap and checked with `check_pcap.py`; panics on failure.
pub fn assert_capture_valid(p: &Pair, name: &str) {
    let path = std::env::temp_dir().join(format!("roce-tests-{}-{name}.pcap", std::process::id()));
    let frames: Vec<(Instant, &[u8])> = p.captured.iter().map(|c| (c.at, &c.frame[..])).collect();
    write_pcap(&path, &frames);
    if let Some((ok, last)) = check_pcap(&path) {
        assert!(
            ok,
            "{name}: check_pcap.py failed: {last} (file kept at {})",
            path.display()
        );
    }
    let _ = std::fs::remove_file(&path);
}
