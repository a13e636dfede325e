//! The event loop, the hosts, the links and the switch.
//!
//! * **Events** sit in one [`EventQueue`] ordered by (virtual time in ns, insertion sequence), so two events of the
//!   same instant run in the order they were scheduled and a run is a pure function of the scenario and its seed.
//! * **Hosts** are real [`roce_proto::Engine`]s. A host's NIC link is polled ([`Engine::poll_transmit`]) only when it
//!   is free, so the link serialises frames and the engine's scheduler (CNPs and ACKs first, then per-QP shapers at
//!   the DCQCN rate RC) decides what goes next. A host's engine timer is one queue entry, re-armed from
//!   [`Engine::poll_timeout`] after every input (stale entries are skipped on pop).
//! * **Links** have a rate and a propagation delay. A frame occupies a link for (frame + overhead)·8 / rate; busy
//!   periods are kept in picoseconds so back-to-back frames keep the exact line rate (events are rounded up to ns).
//! * **The switch** is output-queued with one shared buffer: per egress port a strict-priority queue for CNPs
//!   (DSCP = the NP's `cnp_dscp`, never marked) and a data FIFO that marks CE on ECN-capable frames with the
//!   RED-like ramp of `DCQCN.md` §2.1 (at enqueue or dequeue) and tail-drops a frame the buffer cannot hold.
//!   Marking rewrites the IPv4 ECN bits and the header checksum; the ICRC does not cover the ECN bits (it masks the
//!   TOS byte, `ROCEV2.md §3`), so the frame stays valid. With `switch.pfc` it pauses a sender whose ingress port
//!   holds more than XOFF bytes and resumes it below XON ([`crate::scenario::PfcSpec`]).
//!
//! Frames live in a pool of buffers of the largest frame the path MTU allows, recycled through a free list: the steady
//! state allocates nothing per frame.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use roce_proto::cc::{DcqcnConfig, Profile};
use roce_proto::sched::MAX_FRAME_OVERHEAD;
use roce_proto::{
    AccessFlags, AhAttr, CqHandle, Engine, EngineConfig, Gid, Instant, MemoryFault, MrInfo,
    MrMemory, Mtu, PdHandle, QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType, Qpn,
    SchedConfig, SendOp, SendWr, Sge, Wc, WcStatus,
};

use crate::queue::{Entry, EventQueue};
use crate::scenario::{MarkAt, Scenario, ScenarioError};
use crate::stats::Recorder;

/// IPv4 DSCP of CNPs (`EngineConfig::cnp_dscp` default, `DCQCN.md` §2.2 N4).
const CNP_DSCP: u8 = 48;
/// BTH opcode of a CNP (RoCEv2 Annex A17).
const OP_CNP: u8 = 0x81;
/// Offsets in an untagged IPv4 RoCE v2 frame: IP header, BTH.
const IP_OFF: usize = 14;
const BTH_OFF: usize = 14 + 20 + 8;

/// MAC address of host `i`.
pub fn host_mac(i: usize) -> [u8; 6] {
    [2, 0, 0, 0, (i >> 8) as u8, i as u8]
}

/// IPv4 address of host `i` (198.18.0.0/15, the benchmarking range).
pub fn host_ip(i: usize) -> [u8; 4] {
    [198, 18, (i >> 8) as u8, i as u8 + 1]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ev {
    /// The host's engine timer (valid only if it is still the armed instant).
    HostTimer(u32),
    /// The host's NIC finished serialising a frame.
    HostTxDone(u32),
    /// A frame's last bit reached the switch.
    SwitchArrive(u32),
    /// An egress port finished serialising a frame.
    PortTxDone(u32),
    /// A frame's last bit reached host `.0`.
    HostArrive(u32, u32),
    /// A flow starts posting.
    FlowStart(u32),
    /// A flow stops posting.
    FlowStop(u32),
    /// End of a time-series bin.
    Bin,
    /// An RC sample instant.
    RcSample,
    /// A PFC pause (true) or resume (false) reaches host `.0`.
    Pfc(u32, bool),
    /// Flow `.0` gets its next data packet CE-marked.
    ForceCe(u32),
}

/// A link's serialiser: exact busy-until time in picoseconds.
#[derive(Clone, Copy, Debug, Default)]
struct Wire {
    busy: bool,
    free_ps: u64,
}

impl Wire {
    /// Starts a frame of `bits` at `now_ns` (or where the previous one ended, if that was less than 1 ns ago: the
    /// event that freed the link was rounded up). Returns (end of serialisation, arrival at the far end) in ps.
    fn start(&mut self, now_ns: u64, bits: u64, rate_bps: f64, delay_ps: u64) -> (u64, u64) {
        let now_ps = now_ns * 1000;
        let start = if self.free_ps <= now_ps && now_ps - self.free_ps < 1000 {
            self.free_ps
        } else {
            now_ps.max(self.free_ps)
        };
        let ser = (bits as f64 * 1e12 / rate_bps).round() as u64;
        self.free_ps = start + ser;
        self.busy = true;
        (self.free_ps, self.free_ps + delay_ps)
    }
}

fn ps_to_ns_ceil(ps: u64) -> u64 {
    ps.div_ceil(1000)
}

struct Host {
    engine: Engine,
    wire: Wire,
    timer_at: Option<u64>,
    last_timeout_at: Option<u64>,
    cq: CqHandle,
    /// The one PD of the host's QPs and MRs (the engine allows `max_pd` = 1,024 per device; a receiver may hold
    /// 1,024 QPs).
    pd: PdHandle,
    /// Flow index by the local QPN's place in the engine's range (`Engine::qpn_range`, `QpnRange::index`: the QP's
    /// creation order, whatever the seeded offset its numbering starts at).
    flow_of: Vec<u32>,
    /// The host's one MR (all its QPs' WRs read from it, or peers write into it), registered at its first flow.
    mr: Option<MrInfo>,
    /// PFC: the switch has paused this host's link.
    paused: bool,
}

/// One flow's live state.
struct Flow {
    sender: usize,
    send_qpn: Qpn,
    src: MrInfo,
    dst_addr: u64,
    dst_rkey: roce_proto::Rkey,
    active: bool,
    posted_bytes: u64,
    outstanding: u32,
    completed_bytes: u64,
    limit: Option<u64>,
    finished_at: Option<u64>,
    errors: u64,
}

struct Port {
    wire: Wire,
    hi: VecDeque<u32>,
    lo: VecDeque<u32>,
    lo_bytes: u64,
    hi_bytes: u64,
}

/// Counters of the switch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SwitchCounters {
    /// Frames tail-dropped (shared buffer full).
    pub drops: u64,
    /// Frames received whose destination MAC is no host (dropped).
    pub unroutable: u64,
    /// CE marks applied.
    pub marks: u64,
    /// PFC pauses sent (XOFF transitions).
    pub pauses: u64,
    /// ECN-capable data frames that went through a marking decision.
    pub ect_frames: u64,
}

/// A simulation: build with [`Sim::new`], run with [`Sim::run`] (or [`Sim::run_until`] in steps, for a progress
/// display), then read [`Sim::recorder`].
pub struct Sim {
    now: u64,
    queue: EventQueue<Ev>,
    hosts: Vec<Host>,
    flows: Vec<Flow>,
    ports: Vec<Port>,
    bufs: Vec<Box<[u8]>>,
    /// Size of a pool buffer: the largest frame a QP of the scenario's path MTU sends (MTU +
    /// `sched::MAX_FRAME_OVERHEAD`).
    frame_max: usize,
    lens: Vec<u32>,
    free: Vec<u32>,
    buffer_used: u64,
    /// Per buffer: the ingress port (sending host) of the frame it holds, for PFC accounting.
    ingress: Vec<u32>,
    /// PFC: bytes held per ingress port; whether that port is paused (as the switch last signalled).
    ingress_bytes: Vec<u64>,
    ingress_paused: Vec<bool>,
    pfc: Option<crate::scenario::PfcSpec>,
    rng: ChaCha8Rng,
    rate_bps: f64,
    delay_ps: u64,
    overhead: u64,
    kmin: u64,
    kmax: u64,
    pmax: f64,
    buffer_bytes: u64,
    mark_at: MarkAt,
    receiver: usize,
    end: u64,
    bin_ns: u64,
    wr_depth: u32,
    rc_sample_ns: u64,
    /// Per flow: forced CE marks pending (`FlowSpec::ce_at_us`); `forced` = their sum.
    force_ce: Vec<u32>,
    forced: u32,
    /// Per-flow, per-bin and queue statistics.
    pub recorder: Recorder,
    /// Switch counters.
    pub switch: SwitchCounters,
    /// Events handled so far (frames finishing serialisation or arriving, engine timers, flow starts and stops,
    /// bins, samples).
    pub events: u64,
    /// Engine-timer entries skipped because the host had re-armed its timer earlier since (not counted in
    /// `events`).
    pub stale_timers: u64,
    /// Per host, when [`Sim::log_tx`] enabled it: (ns, frame bytes) of every request frame (opcode ≤ 0x1f) its NIC
    /// put on the link — the transmissions its QPs' DCQCN byte counters count (`DCQCN.md` R4, TB7), for the oracle's
    /// `--tx-json`.
    pub tx_log: Option<Vec<Vec<(u64, u32)>>>,
}

fn ms_to_ns(ms: f64) -> u64 {
    (ms * 1e6).round() as u64
}

impl Sim {
    /// Builds the hosts (one engine each, DCQCN per `cc`), connects one RC QP pair per flow and schedules flow
    /// starts/stops and bins.
    ///
    /// # Errors
    /// An invalid scenario, an unknown CC profile or parameter, or an engine refusing a verb (reported with it).
    pub fn new(sc: &Scenario) -> Result<Sim, ScenarioError> {
        sc.validate()?;
        let err = |m: String| ScenarioError(m);
        let rate_bps = sc.link.rate_gbps * 1e9;
        let dcqcn = match sc.cc.profile.as_str() {
            "none" => None,
            p => {
                let profile = Profile::from_name(p).ok_or_else(|| {
                    err(format!(
                        "cc.profile `{p}`: expected paper, ns3_mlx, nvidia or none"
                    ))
                })?;
                let mut c = DcqcnConfig::new(profile, rate_bps);
                for (k, v) in &sc.cc.set {
                    c.set(k, v).map_err(|e| err(format!("cc.set: {e}")))?;
                }
                c.validate().map_err(|e| err(format!("cc: {e}")))?;
                Some(c)
            }
        };
        let senders = sc.sender_count();
        let receiver = senders;
        let mtu = match sc.host.mtu {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            _ => Mtu::Mtu4096,
        };
        let mut hosts = Vec::with_capacity(senders + 1);
        for i in 0..=senders {
            let cfg = EngineConfig {
                mac: host_mac(i),
                gids: vec![Gid::from_ipv4(host_ip(i))],
                seed: sc
                    .seed
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    .wrapping_add(i as u64),
                max_unacked_psns: sc.host.max_unacked_psns,
                cnp_interval: Duration::from_nanos((sc.cc.np_interval_us * 1000.0).round() as u64),
                cnp_dscp: CNP_DSCP,
                dcqcn: dcqcn.clone(),
                sched: SchedConfig {
                    line_rate_bps: rate_bps as u64,
                    ..SchedConfig::default()
                },
                ..EngineConfig::default()
            };
            let mut engine = Engine::new(cfg);
            let cq = engine
                .create_cq(1 << 16)
                .map_err(|e| err(format!("host {i}: create_cq: {e}")))?;
            let pd = engine
                .alloc_pd()
                .map_err(|e| err(format!("host {i}: alloc_pd: {e}")))?;
            hosts.push(Host {
                engine,
                wire: Wire::default(),
                timer_at: None,
                last_timeout_at: None,
                cq,
                pd,
                flow_of: Vec::new(),
                mr: None,
                paused: false,
            });
        }
        let mut flows = Vec::with_capacity(sc.flows.len());
        let msg = sc.host.message_bytes as usize;
        // One send buffer for every sender (its content is never read by anything but the engines' gather).
        let payload: Arc<[u8]> = vec![0u8; msg].into();
        for (fi, f) in sc.flows.iter().enumerate() {
            let (sq, src) = make_qp(
                &mut hosts[f.sender],
                Buffer::Send(&payload),
                sc.host.wr_depth,
                fi,
            )
            .map_err(|e| err(format!("flow {fi}: {e}")))?;
            let (rq, dst) = make_qp(
                &mut hosts[receiver],
                Buffer::Receive(msg),
                sc.host.wr_depth,
                fi,
            )
            .map_err(|e| err(format!("flow {fi}: {e}")))?;
            let spsn = hosts[f.sender].engine.random_psn();
            let rpsn = hosts[receiver].engine.random_psn();
            bring_up(
                &mut hosts[f.sender].engine,
                sq,
                rq,
                receiver,
                spsn,
                rpsn,
                mtu,
            )
            .map_err(|e| err(format!("flow {fi}: sender QP: {e}")))?;
            bring_up(
                &mut hosts[receiver].engine,
                rq,
                sq,
                f.sender,
                rpsn,
                spsn,
                mtu,
            )
            .map_err(|e| err(format!("flow {fi}: receiver QP: {e}")))?;
            flows.push(Flow {
                sender: f.sender,
                send_qpn: sq,
                src,
                dst_addr: dst.addr,
                dst_rkey: dst.rkey,
                active: false,
                posted_bytes: 0,
                outstanding: 0,
                completed_bytes: 0,
                limit: f.bytes,
                finished_at: None,
                errors: 0,
            });
        }
        let ports = (0..=senders)
            .map(|_| Port {
                wire: Wire::default(),
                hi: VecDeque::new(),
                lo: VecDeque::new(),
                lo_bytes: 0,
                hi_bytes: 0,
            })
            .collect();
        let end = ms_to_ns(sc.duration_ms);
        let bin_ns = ms_to_ns(sc.bin_ms).max(1);
        let mut sim = Sim {
            now: 0,
            queue: EventQueue::new(),
            hosts,
            flows,
            ports,
            bufs: Vec::new(),
            frame_max: (sc.host.mtu + MAX_FRAME_OVERHEAD) as usize,
            lens: Vec::new(),
            free: Vec::new(),
            buffer_used: 0,
            ingress: Vec::new(),
            ingress_bytes: vec![0; senders + 1],
            ingress_paused: vec![false; senders + 1],
            pfc: sc.switch.pfc,
            rng: ChaCha8Rng::seed_from_u64(sc.seed),
            rate_bps,
            delay_ps: (sc.link.delay_us * 1e6).round() as u64,
            overhead: u64::from(sc.link.overhead_bytes),
            kmin: sc.switch.kmin_bytes,
            kmax: sc.switch.kmax_bytes,
            pmax: sc.switch.pmax,
            buffer_bytes: sc.switch.buffer_bytes,
            mark_at: sc.switch.mark,
            receiver,
            end,
            bin_ns,
            wr_depth: sc.host.wr_depth,
            rc_sample_ns: sc
                .rc_sample_us
                .map_or(0, |u| ((u * 1e3).round() as u64).max(1)),
            force_ce: vec![0; sc.flows.len()],
            forced: 0,
            recorder: Recorder::new(sc, ms_to_ns(sc.measure_from_ms), end, bin_ns),
            switch: SwitchCounters::default(),
            events: 0,
            stale_timers: 0,
            tx_log: None,
        };
        for (fi, f) in sc.flows.iter().enumerate() {
            sim.push(ms_to_ns(f.start_ms), Ev::FlowStart(fi as u32));
            if let Some(s) = f.stop_ms {
                sim.push(ms_to_ns(s), Ev::FlowStop(fi as u32));
            }
        }
        for (fi, f) in sc.flows.iter().enumerate() {
            for &t in &f.ce_at_us {
                sim.push((t * 1e3).round() as u64, Ev::ForceCe(fi as u32));
            }
        }
        sim.push(bin_ns.min(end), Ev::Bin);
        if sim.rc_sample_ns > 0 {
            sim.push(0, Ev::RcSample);
        }
        Ok(sim)
    }

    /// Records every host's request frames from now on into [`Sim::tx_log`].
    pub fn log_tx(&mut self) {
        self.tx_log
            .get_or_insert_with(|| vec![Vec::new(); self.hosts.len()]);
    }

    /// Virtual time now, ns.
    pub fn now_ns(&self) -> u64 {
        self.now
    }

    /// End of the run, ns.
    pub fn end_ns(&self) -> u64 {
        self.end
    }

    /// Index of the receiver host.
    pub fn receiver(&self) -> usize {
        self.receiver
    }

    /// The engine of host `i` (senders `0..receiver`, then the receiver).
    pub fn engine(&self, i: usize) -> &Engine {
        &self.hosts[i].engine
    }

    /// Flow `f`'s bytes completed (acknowledged WRs), the instant (ns) it completed all of its `bytes`, and its
    /// failed WRs (completions in error or a refused `post_send`).
    pub fn flow_done(&self, f: usize) -> (u64, Option<u64>, u64) {
        let fl = &self.flows[f];
        (fl.completed_bytes, fl.finished_at, fl.errors)
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.queue.push(at, ev);
    }

    /// Runs to the scenario's end.
    pub fn run(&mut self) {
        self.run_until(self.end);
    }

    /// Runs every event before or at `t` ns (capped at the end). Returns whether the end has been reached.
    pub fn run_until(&mut self, t: u64) -> bool {
        let t = t.min(self.end);
        while let Some(e) = self.queue.pop_due(t) {
            self.now = e.at;
            if let Ev::HostTimer(h) = e.ev
                && self.hosts[h as usize].timer_at != Some(e.at)
            {
                // Superseded by an earlier re-arm: not an event.
                self.stale_timers += 1;
                continue;
            }
            self.events += 1;
            self.handle(e);
        }
        self.now = self.now.max(t);
        if t >= self.end {
            self.recorder.finish(self.end);
        }
        t >= self.end
    }

    fn ports_q(&self) -> u64 {
        self.ports[self.receiver].lo_bytes
    }

    fn handle(&mut self, e: Entry<Ev>) {
        match e.ev {
            Ev::HostTimer(h) => {
                let h = h as usize;
                if self.hosts[h].timer_at != Some(e.at) {
                    return;
                }
                self.hosts[h].timer_at = None;
                let now = Instant::from_nanos(self.now);
                let host = &mut self.hosts[h];
                if host.engine.poll_timeout().is_some_and(|t| t <= now) {
                    host.engine.handle_timeout(now);
                    host.last_timeout_at = Some(self.now);
                }
                self.host_after(h);
            }
            Ev::HostTxDone(h) => {
                self.hosts[h as usize].wire.busy = false;
                self.host_after(h as usize);
            }
            Ev::HostArrive(h, b) => {
                let h = h as usize;
                self.observe_host_rx(h, b);
                let len = self.lens[b as usize] as usize;
                let now = Instant::from_nanos(self.now);
                let (bufs, hosts) = (&mut self.bufs, &mut self.hosts);
                hosts[h].engine.handle_frame(now, &bufs[b as usize][..len]);
                self.free.push(b);
                self.host_after(h);
            }
            Ev::SwitchArrive(b) => self.switch_arrive(b),
            Ev::PortTxDone(p) => {
                self.ports[p as usize].wire.busy = false;
                self.port_start(p as usize);
            }
            Ev::FlowStart(f) => {
                let fl = &mut self.flows[f as usize];
                fl.active = true;
                let h = fl.sender;
                self.refill(f as usize);
                self.host_after(h);
            }
            Ev::FlowStop(f) => self.flows[f as usize].active = false,
            Ev::Pfc(h, pause) => {
                let h = h as usize;
                self.hosts[h].paused = pause;
                if !pause {
                    self.host_after(h);
                }
            }
            Ev::ForceCe(f) => {
                self.force_ce[f as usize] += 1;
                self.forced += 1;
            }
            Ev::RcSample => {
                let rc = self.rates();
                let now = Instant::from_nanos(self.now);
                let state = self
                    .flows
                    .iter()
                    .map(|f| {
                        let m = self.hosts[f.sender].engine.qp_rate(f.send_qpn, now);
                        m.map_or((None, None), |m| (m.target_bps, m.alpha))
                    })
                    .collect();
                self.recorder.rc_samples.push((self.now, rc));
                self.recorder.rp_samples.push(state);
                if self.now + self.rc_sample_ns <= self.end {
                    self.push(self.now + self.rc_sample_ns, Ev::RcSample);
                }
            }
            Ev::Bin => {
                let rc = self.rates();
                let q = self.ports_q();
                self.recorder.close_bin(self.now, q, &rc);
                if self.now < self.end {
                    self.push((self.now + self.bin_ns).min(self.end), Ev::Bin);
                }
            }
        }
    }

    /// RC of every flow's sender QP now, bit/s (line rate when the controller does not limit).
    fn rates(&self) -> Vec<f64> {
        let now = Instant::from_nanos(self.now);
        self.flows
            .iter()
            .map(|f| {
                self.hosts[f.sender]
                    .engine
                    .qp_rate(f.send_qpn, now)
                    .and_then(|m| m.rate_bps)
                    .map_or(self.rate_bps, |r| r as f64)
            })
            .collect()
    }

    /// After any input to host `h`: reap completions and repost, transmit if the NIC is free, re-arm the timer.
    fn host_after(&mut self, h: usize) {
        if h != self.receiver && self.hosts[h].engine.cq_len(self.hosts[h].cq) > 0 {
            self.reap(h);
        }
        if !self.hosts[h].wire.busy && !self.hosts[h].paused {
            self.host_tx(h);
        }
        let host = &mut self.hosts[h];
        let Some(t) = host.engine.poll_timeout() else {
            return;
        };
        let mut at = t.as_nanos().max(self.now);
        if at == self.now && host.last_timeout_at == Some(self.now) {
            // Due now although handled at this instant: let a nanosecond pass instead of spinning.
            at += 1;
        }
        if host.timer_at.is_some_and(|a| a <= at) {
            return;
        }
        host.timer_at = Some(at);
        self.push(at, Ev::HostTimer(h as u32));
    }

    fn reap(&mut self, h: usize) {
        let mut wcs = [Wc::default(); 32];
        loop {
            let host = &mut self.hosts[h];
            let n = host.engine.poll_cq(host.cq, &mut wcs);
            if n == 0 {
                break;
            }
            for wc in &wcs[..n] {
                let Some(f) = self.hosts[h].flow(wc.qp_num.value()) else {
                    continue;
                };
                let fl = &mut self.flows[f as usize];
                fl.outstanding = fl.outstanding.saturating_sub(1);
                if wc.status == WcStatus::Success {
                    // wr_id = the WR's offset in the flow (send completions carry no byte count).
                    let msg = fl.src.length;
                    fl.completed_bytes += fl
                        .limit
                        .map_or(msg, |l| l.saturating_sub(wc.wr_id).min(msg));
                    if fl.limit.is_some_and(|l| fl.completed_bytes >= l) && fl.finished_at.is_none()
                    {
                        fl.finished_at = Some(self.now);
                    }
                } else {
                    fl.errors += 1;
                }
                self.refill(f as usize);
            }
        }
    }

    /// Posts RDMA WRITE WRs on flow `f` up to its depth while it is active and has bytes left.
    fn refill(&mut self, f: usize) {
        let depth = self.wr_depth;
        let fl = &mut self.flows[f];
        let msg = fl.src.length;
        while fl.active && fl.outstanding < depth && fl.errors == 0 {
            let left = fl
                .limit
                .map_or(msg, |l| l.saturating_sub(fl.posted_bytes).min(msg));
            if left == 0 {
                break;
            }
            let sge = [Sge {
                addr: fl.src.addr,
                length: left as u32,
                lkey: fl.src.lkey,
            }];
            let wr = SendWr::new(
                fl.posted_bytes,
                SendOp::RdmaWrite {
                    remote_addr: fl.dst_addr,
                    rkey: fl.dst_rkey,
                },
                &sge,
            )
            .signaled();
            if self.hosts[fl.sender]
                .engine
                .post_send(fl.send_qpn, &[wr])
                .is_err()
            {
                fl.errors += 1;
                break;
            }
            fl.outstanding += 1;
            fl.posted_bytes += left;
        }
    }

    fn alloc(&mut self) -> u32 {
        if let Some(b) = self.free.pop() {
            return b;
        }
        self.bufs.push(vec![0u8; self.frame_max].into_boxed_slice());
        self.lens.push(0);
        self.ingress.push(0);
        (self.bufs.len() - 1) as u32
    }

    fn host_tx(&mut self, h: usize) {
        let b = self.alloc();
        let now = Instant::from_nanos(self.now);
        let meta = self.hosts[h]
            .engine
            .poll_transmit(now, &mut self.bufs[b as usize]);
        let Some(meta) = meta else {
            self.free.push(b);
            return;
        };
        self.lens[b as usize] = meta.len as u32;
        if h == self.receiver {
            self.observe_cnp_sent(b);
        }
        if let Some(log) = self.tx_log.as_mut()
            && meta.len > BTH_OFF
            && self.bufs[b as usize][BTH_OFF] <= 0x1f
        {
            log[h].push((self.now, meta.len as u32));
        }
        let bits = (meta.len as u64 + self.overhead) * 8;
        let (done, arrive) = self.hosts[h]
            .wire
            .start(self.now, bits, self.rate_bps, self.delay_ps);
        self.push(ps_to_ns_ceil(done), Ev::HostTxDone(h as u32));
        self.push(ps_to_ns_ceil(arrive), Ev::SwitchArrive(b));
    }

    /// p(q) of `DCQCN.md` §2.1, drawn with the seeded RNG.
    fn mark_decision(&mut self, q: u64) -> bool {
        if q <= self.kmin {
            false
        } else if q > self.kmax {
            true
        } else {
            let p = self.pmax * (q - self.kmin) as f64 / (self.kmax - self.kmin).max(1) as f64;
            self.rng.random::<f64>() < p
        }
    }

    fn switch_arrive(&mut self, b: u32) {
        let len = self.lens[b as usize] as usize;
        let f = &self.bufs[b as usize][..len];
        let dst = if f[0..4] == [2, 0, 0, 0] {
            (usize::from(f[4]) << 8) | usize::from(f[5])
        } else {
            usize::MAX
        };
        if dst >= self.ports.len() {
            self.switch.unroutable += 1;
            self.free.push(b);
            return;
        }
        // The sending host (ingress port), for PFC; frames from elsewhere count on port 0.
        let src = (usize::from(f[10]) << 8) | usize::from(f[11]);
        let src = if f[6..10] == [2, 0, 0, 0] && src < self.ingress_bytes.len() {
            src
        } else {
            0
        };
        let ipv4 = len > BTH_OFF + 12 && f[12..14] == [0x08, 0x00];
        let dscp = if ipv4 { f[IP_OFF + 1] >> 2 } else { 0 };
        let hi = dscp == CNP_DSCP;
        if self.buffer_used + len as u64 > self.buffer_bytes {
            self.switch.drops += 1;
            self.recorder.on_drop(self.now);
            self.free.push(b);
            return;
        }
        if !hi && ipv4 && self.mark_at == MarkAt::Enqueue {
            let q = self.ports[dst].lo_bytes;
            self.maybe_mark(b, q);
        }
        self.buffer_used += len as u64;
        if let Some(pfc) = self.pfc {
            self.ingress[b as usize] = src as u32;
            self.ingress_bytes[src] += len as u64;
            if !self.ingress_paused[src] && self.ingress_bytes[src] > pfc.xoff_bytes {
                self.ingress_paused[src] = true;
                self.switch.pauses += 1;
                self.push(
                    self.now + self.delay_ps.div_ceil(1000),
                    Ev::Pfc(src as u32, true),
                );
            }
        }
        let port = &mut self.ports[dst];
        if hi {
            port.hi.push_back(b);
            port.hi_bytes += len as u64;
        } else {
            port.lo.push_back(b);
            port.lo_bytes += len as u64;
            if dst == self.receiver {
                self.recorder.on_queue(self.now, port.lo_bytes);
            }
        }
        if !self.ports[dst].wire.busy {
            self.port_start(dst);
        }
    }

    /// The flow a data frame to the receiver belongs to, if one has a forced CE mark pending: takes it.
    fn take_forced(&mut self, b: u32) -> bool {
        let f = &self.bufs[b as usize];
        if f[BTH_OFF] > 0x1f {
            return false;
        }
        let qpn = u32::from_be_bytes([0, f[BTH_OFF + 5], f[BTH_OFF + 6], f[BTH_OFF + 7]]);
        let dst = (usize::from(f[4]) << 8) | usize::from(f[5]);
        let Some(fi) = self.hosts.get(dst).and_then(|h| h.flow(qpn)) else {
            return false;
        };
        let pending = &mut self.force_ce[fi as usize];
        if *pending == 0 {
            return false;
        }
        *pending -= 1;
        self.forced -= 1;
        true
    }

    fn maybe_mark(&mut self, b: u32, q: u64) {
        let ecn = self.bufs[b as usize][IP_OFF + 1] & 3;
        if ecn == 1 || ecn == 2 {
            self.switch.ect_frames += 1;
            self.recorder.on_ect(self.now);
            let forced = self.forced > 0 && self.take_forced(b);
            if forced || self.mark_decision(q) {
                let f = &mut self.bufs[b as usize];
                f[IP_OFF + 1] |= 3;
                fix_ipv4_checksum(&mut f[IP_OFF..IP_OFF + 20]);
                self.switch.marks += 1;
                self.recorder.on_mark(self.now);
            }
        }
    }

    fn port_start(&mut self, p: usize) {
        let port = &mut self.ports[p];
        let (b, hi) = if let Some(b) = port.hi.pop_front() {
            (b, true)
        } else if let Some(b) = port.lo.pop_front() {
            (b, false)
        } else {
            return;
        };
        let len = u64::from(self.lens[b as usize]);
        if hi {
            port.hi_bytes -= len;
        } else {
            port.lo_bytes -= len;
        }
        let left = port.lo_bytes;
        self.buffer_used -= len;
        if let Some(pfc) = self.pfc {
            let src = self.ingress[b as usize] as usize;
            self.ingress_bytes[src] -= len;
            if self.ingress_paused[src] && self.ingress_bytes[src] < pfc.xon_bytes {
                self.ingress_paused[src] = false;
                self.push(
                    self.now + self.delay_ps.div_ceil(1000),
                    Ev::Pfc(src as u32, false),
                );
            }
        }
        if !hi {
            if p == self.receiver {
                self.recorder.on_queue(self.now, left);
            }
            let ipv4 = self.bufs[b as usize][12..14] == [0x08, 0x00];
            if ipv4 && self.mark_at == MarkAt::Dequeue {
                self.maybe_mark(b, left);
            }
        }
        let bits = (len + self.overhead) * 8;
        let (done, arrive) = self.ports[p]
            .wire
            .start(self.now, bits, self.rate_bps, self.delay_ps);
        self.push(ps_to_ns_ceil(done), Ev::PortTxDone(p as u32));
        self.push(ps_to_ns_ceil(arrive), Ev::HostArrive(p as u32, b));
    }

    /// Per-flow accounting of a frame reaching host `h`: data at the receiver (wire bytes, CE marks), CNPs at a
    /// sender. Reads the BTH of an untagged IPv4 frame by offset; anything else is not a flow's frame.
    fn observe_host_rx(&mut self, h: usize, b: u32) {
        let len = self.lens[b as usize] as usize;
        let f = &self.bufs[b as usize][..len];
        if len < BTH_OFF + 12 || f[12..14] != [0x08, 0x00] {
            return;
        }
        let op = f[BTH_OFF];
        let qpn = u32::from_be_bytes([0, f[BTH_OFF + 5], f[BTH_OFF + 6], f[BTH_OFF + 7]]);
        let Some(fi) = self.hosts[h].flow(qpn) else {
            return;
        };
        if h == self.receiver {
            // Requests (RC opcodes 0x00..=0x1f): the flow's data.
            if op <= 0x1f {
                let ce = f[IP_OFF + 1] & 3 == 3;
                self.recorder
                    .on_data(self.now, fi as usize, len as u64 + self.overhead, ce);
            }
        } else if op == OP_CNP {
            self.recorder.on_cnp(self.now, fi as usize);
        }
    }

    /// A CNP leaving the receiver (the NP): its spacing per flow, at the NP (`DCQCN.md` §2.2 N3).
    fn observe_cnp_sent(&mut self, b: u32) {
        let len = self.lens[b as usize] as usize;
        let f = &self.bufs[b as usize][..len];
        if len < BTH_OFF + 12
            || f[12..14] != [0x08, 0x00]
            || f[BTH_OFF] != OP_CNP
            || f[0..4] != [2, 0, 0, 0]
        {
            return;
        }
        let dst = (usize::from(f[4]) << 8) | usize::from(f[5]);
        let qpn = u32::from_be_bytes([0, f[BTH_OFF + 5], f[BTH_OFF + 6], f[BTH_OFF + 7]]);
        let Some(fi) = self.hosts.get(dst).and_then(|h| h.flow(qpn)) else {
            return;
        };
        self.recorder.on_cnp_sent(self.now, fi as usize);
    }
}

impl Host {
    /// The flow of local QPN `qpn` (O(1): its index in the engine's QPN range), `None` for QPNs of no flow.
    fn flow(&self, qpn: u32) -> Option<u32> {
        let i = self.engine.qpn_range().index(qpn)?;
        self.flow_of
            .get(i as usize)
            .copied()
            .filter(|&f| f != u32::MAX)
    }
}

fn fix_ipv4_checksum(h: &mut [u8]) {
    h[10] = 0;
    h[11] = 0;
    let mut sum = 0u32;
    for w in h.chunks_exact(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let c = !(sum as u16);
    h[10..12].copy_from_slice(&c.to_be_bytes());
}

/// A sender's MR: the simulation's one read-only send buffer, shared by every sender host's engine (each engine
/// registers it as its own MR). Sharing keeps the senders' gathers in one cache-resident buffer instead of one per
/// host; the frames' bytes are the same (zeros). The engine never writes a send buffer (its MR has no write access);
/// a write would be a [`MemoryFault`].
struct SendBuffer(Arc<[u8]>);

impl MrMemory for SendBuffer {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryFault> {
        let src = self.0.get(offset..offset + dst.len()).ok_or(MemoryFault)?;
        dst.copy_from_slice(src);
        Ok(())
    }
    fn write_at(&mut self, _offset: usize, _src: &[u8]) -> Result<(), MemoryFault> {
        Err(MemoryFault)
    }
    fn base_ptr(&self) -> Option<*const u8> {
        Some(self.0.as_ptr())
    }
}

/// The MR a flow's QP uses on its host.
enum Buffer<'a> {
    /// The shared send buffer (sender side).
    Send(&'a Arc<[u8]>),
    /// A receive buffer of this many bytes, one per host shared by its QPs (peers RDMA WRITE into it).
    Receive(usize),
}

/// A QP for `flow` on `host` with room for `depth` WRs, and the host's MR (registered at its first flow).
fn make_qp(host: &mut Host, buf: Buffer, depth: u32, flow: usize) -> Result<(Qpn, MrInfo), String> {
    let pd = host.pd;
    let e = &mut host.engine;
    let mr = match (host.mr, buf) {
        (Some(mr), _) => mr,
        (None, Buffer::Send(p)) => e
            .reg_mr(pd, SendBuffer(p.clone()), AccessFlags::EMPTY)
            .map_err(|x| format!("reg_mr: {x}"))?,
        (None, Buffer::Receive(n)) => e
            .reg_mr(
                pd,
                vec![0u8; n],
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
            )
            .map_err(|x| format!("reg_mr: {x}"))?,
    };
    host.mr = Some(mr);
    let (qpn, _) = e
        .create_qp(&QpInitAttr {
            qp_type: QpType::Rc,
            pd,
            send_cq: host.cq,
            recv_cq: host.cq,
            cap: QpCap {
                max_send_wr: depth.max(1),
                max_recv_wr: 1,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: true,
        })
        .map_err(|x| format!("create_qp: {x}"))?;
    let Some(i) = host.engine.qpn_range().index(qpn.value()) else {
        return Err(format!("create_qp: {qpn} outside the engine's QPN range"));
    };
    let i = i as usize;
    if host.flow_of.len() <= i {
        host.flow_of.resize(i + 1, u32::MAX);
    }
    host.flow_of[i] = flow as u32;
    Ok((qpn, mr))
}

/// RESET→INIT→RTR→RTS towards `peer_qpn` on host `peer` (`ROCEV2.md §4.6` masks for RC).
fn bring_up(
    e: &mut Engine,
    me: Qpn,
    peer_qpn: Qpn,
    peer: usize,
    my_psn: roce_proto::Psn,
    peer_psn: roce_proto::Psn,
    mtu: Mtu,
) -> Result<(), String> {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        ..QpAttr::default()
    };
    let m = |x| format!("{x}");
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .map_err(m)?;
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(host_ip(peer)),
        dmac: host_mac(peer),
        traffic_class: 26 << 2,
        ..AhAttr::default()
    };
    at.path_mtu = mtu;
    at.dest_qp_num = peer_qpn;
    at.rq_psn = peer_psn;
    at.max_dest_rd_atomic = 1;
    at.min_rnr_timer = 12;
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::AV
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER,
    )
    .map_err(m)?;
    at.qp_state = QpState::Rts;
    at.sq_psn = my_psn;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    at.max_rd_atomic = 1;
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE
            | QpAttrMask::SQ_PSN
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC,
    )
    .map_err(m)
}
