//! Engine benchmarks on a null link: the per-core cost of the send path, shared by the criterion target
//! (`cargo bench -p roce-bench --bench engine`) and `rocev2 bench engine` (which times the same functions itself
//! and prints medians, or one JSON object with `--json`).
//!
//! # What is measured
//!
//! * [`SendSide`]: one RC requester ([`roce_proto::Engine`]) in this thread, PMTU 4096, posting `post_list` WRs per
//!   `post_send` call (the last one signaled), then driving the engine as a run-to-completion runtime does:
//!   `poll_transmit` into [`NullLink`] transmit buffers until it has nothing more, one `flush`, the peer's ACK through
//!   `rx_burst` → `handle_frame`, `poll_timeout`, `poll_cq`. Workloads: 64 B SEND (from an MR, not inline) and
//!   4 KiB RDMA WRITE (one WRITE ONLY packet each). Sources rotate over 16 MR slots.
//! * **The peer's ACKs** are pre-built frames, made before each timed sample with `roce_wire::RoceRepr::emit` (ICRC
//!   included) exactly as a responder that receives each flushed burst at once sends them: one coalesced
//!   ACKNOWLEDGE (syndrome 0x1F) per burst, for the burst's last PSN, with the MSN of the messages so far (a real
//!   responder engine does the same, see [`Loopback`]). Building them is not timed (they are built per chunk of
//!   4096 bursts, so they are in cache like a just-received frame); receiving them (parse, ICRC check, retiring
//!   WQEs, completions) is.
//! * [`Loopback`]: both ends in this thread — the same requester, and a responder engine that gets every flushed
//!   frame through `handle_frame` (parse, ICRC check, placement into its MR, receive completions for SENDs, receive
//!   WRs re-posted per burst) and whose own coalesced ACKs go back the same way. Data is verified afterwards (the
//!   responder's MR against the source pattern).
//! * [`Baseline`]: `memcpy` of the same payload bytes from the same source slots into a frame buffer behind a 54-byte
//!   header, then `crc32fast` over them — the floor any software send path pays once per packet today.
//!
//! The null link parses the headers of every frame and fully checks (whole-frame parse, ICRC, payload against the
//! source slot its PSN names) every `check_every`-th frame; tests use 1 (every frame), timed runs a sample so that
//! the link does not double the CRC work it measures. Time is the thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID`) around whole samples, so time slices the scheduler gives other processes on a shared
//! machine do not count (per-core cost); wall-clock time is recorded beside it. The engine's clock is virtual
//! (advanced 100 ns per doorbell).

#![deny(unsafe_code)]

use std::time::{Duration, Instant as WallInstant};

mod cpu_clock;
pub use cpu_clock::ThreadCpu;

use roce_link::{Link, NullLink, NullStats};
use roce_proto::time::Instant;
use roce_proto::*;
use roce_wire::{
    AethRepr, AethSyndrome, BthRepr, EtherType, EthernetAddress, EthernetRepr, ExtRepr, IpRepr,
    Ipv4Repr, Msn, Opcode, ROCE_V2_PORT, RoceRepr, UdpRepr,
};

/// Source slots the WRs rotate over.
pub const SLOTS: u64 = 16;
/// Largest post-list.
pub const MAX_POST_LIST: usize = 32;
/// Link MTU (frame bytes incl. Ethernet) of the null links: a 4 KiB payload plus every header.
pub const LINK_MTU: usize = 4096 + 128;

const MAC: [[u8; 6]; 2] = [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]];
const IP: [[u8; 4]; 2] = [[198, 18, 0, 1], [198, 18, 0, 2]];
const ACCESS: AccessFlags = AccessFlags(AccessFlags::LOCAL_WRITE.0 | AccessFlags::REMOTE_WRITE.0);
/// Virtual time per doorbell.
const TICK_NS: u64 = 100;
/// Peer QPN used by the send-side workload's fake responder.
const PEER_QPN: u32 = 0x99;
/// Stride of the pre-built ACK frames.
const ACK_STRIDE: usize = 64;
/// Bursts per timed chunk of [`SendSide`] (its pre-built ACKs: 256 KiB, cache-resident).
const ACK_CHUNK: u64 = 4096;

/// What each WR does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RC SEND of 64 bytes (SGE from an MR).
    Send64,
    /// RC RDMA WRITE of 4096 bytes (PMTU 4096: one WRITE ONLY packet).
    Write4k,
}

impl Op {
    /// Payload bytes per message.
    pub fn size(self) -> u64 {
        match self {
            Op::Send64 => 64,
            Op::Write4k => 4096,
        }
    }
}

/// Byte `x` of the source pattern.
pub fn pattern(x: u64) -> u8 {
    (x.wrapping_mul(31).wrapping_add(7) % 251) as u8
}

/// One timed sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Messages completed.
    pub msgs: u64,
    /// Payload bytes of those messages.
    pub bytes: u64,
    /// CPU time of this thread during the sample.
    pub elapsed: Duration,
    /// Wall-clock time of the sample.
    pub wall: Duration,
}

impl Sample {
    /// Messages per second.
    pub fn msgs_per_s(&self) -> f64 {
        self.msgs as f64 / self.elapsed.as_secs_f64().max(1e-12)
    }
    /// Payload gigabits per second.
    pub fn gbps(&self) -> f64 {
        self.bytes as f64 * 8.0 / self.elapsed.as_secs_f64().max(1e-12) / 1e9
    }
}

/// Something that can be timed for `n` messages (criterion's `iter_custom` shape).
pub trait Workload {
    /// Untimed preparation for the next `n` messages.
    fn prepare(&mut self, n: u64);
    /// Runs `n` messages (after [`prepare`](Self::prepare)) and returns the thread CPU time it took.
    fn run(&mut self, n: u64) -> Duration;
    /// Payload bytes per message.
    fn msg_bytes(&self) -> u64;

    /// Messages [`run`](Self::run)`(n)` really runs (whole post-lists: `n` rounded up to a multiple).
    fn rounded(&self, n: u64) -> u64 {
        n
    }

    /// Counters of the null link the frames went to, if any.
    fn link_stats(&self) -> Option<NullStats> {
        None
    }

    /// Whether everything run so far checked out: each signaled WR completed once, successfully (completion
    /// errors already panic), and, where both ends run, the responder's memory holds the source bytes.
    fn verified(&self) -> bool {
        true
    }

    /// `prepare` + `run` as a [`Sample`].
    fn sample(&mut self, n: u64) -> Sample {
        self.prepare(n);
        let w = WallInstant::now();
        let elapsed = self.run(n);
        let msgs = self.rounded(n);
        Sample {
            msgs,
            bytes: msgs * self.msg_bytes(),
            elapsed,
            wall: w.elapsed(),
        }
    }
}

fn engine_cfg(p: usize) -> EngineConfig {
    EngineConfig {
        mac: MAC[p],
        gids: vec![Gid::from_ipv4(IP[p])],
        seed: 0x5eed + p as u64,
        ..EngineConfig::default()
    }
}

fn rc_qp(e: &mut Engine, pd: PdHandle, cq: CqHandle) -> Qpn {
    e.create_qp(&QpInitAttr {
        qp_type: QpType::Rc,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    })
    .expect("create_qp")
    .0
}

/// INIT → RTR → RTS towards `peer` at address index `p`, PMTU 4096, PSNs 0.
fn connect(e: &mut Engine, me: Qpn, peer: Qpn, p: usize) {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qp_access_flags: ACCESS,
        ..QpAttr::default()
    };
    let init =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    e.modify_qp(me, &at, init).expect("INIT");
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(IP[p]),
        dmac: MAC[p],
        ..AhAttr::default()
    };
    at.path_mtu = Mtu::Mtu4096;
    at.dest_qp_num = peer;
    let rtr = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    e.modify_qp(me, &at, rtr).expect("RTR");
    at.qp_state = QpState::Rts;
    at.timeout = 14;
    at.retry_cnt = 7;
    at.rnr_retry = 7;
    let rts = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    e.modify_qp(me, &at, rts).expect("RTS");
}

/// The requester side shared by both workloads: engine, QP, CQ, source MR, WR templates.
struct Requester {
    e: Engine,
    qpn: Qpn,
    cq: CqHandle,
    src: MrInfo,
    op: Op,
    post_list: usize,
    /// Remote VA / rkey the WRITEs target.
    remote: (u64, Rkey),
    /// Messages posted so far (selects the source slot).
    posted: u64,
    now: Instant,
    wcs: [Wc; 64],
}

impl Requester {
    fn new(op: Op, post_list: usize, peer: Qpn, peer_idx: usize) -> Requester {
        assert!(
            (1..=MAX_POST_LIST).contains(&post_list),
            "post_list must be 1..={MAX_POST_LIST}"
        );
        let mut e = Engine::new(engine_cfg(0));
        let pd = e.alloc_pd().expect("pd");
        let cq = e.create_cq(1024).expect("cq");
        let len = SLOTS * op.size();
        let src = e
            .reg_mr(pd, (0..len).map(pattern).collect::<Vec<u8>>(), ACCESS)
            .expect("mr");
        let qpn = rc_qp(&mut e, pd, cq);
        connect(&mut e, qpn, peer, peer_idx);
        Requester {
            e,
            qpn,
            cq,
            src,
            op,
            post_list,
            remote: (0x1000_0000, Rkey(0x1234)),
            posted: 0,
            now: Instant::from_micros(1),
            wcs: [Wc::default(); 64],
        }
    }

    /// Posts one post-list (last WR signaled).
    fn post(&mut self) {
        let n = self.post_list;
        // Only the WRs posted are built (a 1-WR post-list builds one, not a 32-entry array).
        let mut sges = [Sge {
            addr: 0,
            length: 0,
            lkey: self.src.lkey,
        }; MAX_POST_LIST];
        let sges = &mut sges[..n];
        for (k, s) in sges.iter_mut().enumerate() {
            *s = self.sge(k);
        }
        if n == 1 {
            let wr = self.wr(0, &sges[0]).signaled();
            self.e
                .post_send(self.qpn, core::slice::from_ref(&wr))
                .expect("post_send");
        } else {
            let mut wrs = [SendWr::new(0, SendOp::Send, &[]); MAX_POST_LIST];
            for (k, sge) in sges.iter().enumerate() {
                wrs[k] = self.wr(k, sge);
            }
            wrs[n - 1] = wrs[n - 1].signaled();
            self.e.post_send(self.qpn, &wrs[..n]).expect("post_send");
        }
        self.posted += n as u64;
        self.now = Instant::from_nanos(self.now.as_nanos() + TICK_NS);
    }

    /// The SGE of the `k`-th WR of the next post-list (source slot by message number).
    fn sge(&self, k: usize) -> Sge {
        let slot = (self.posted + k as u64) % SLOTS;
        Sge {
            addr: self.src.addr + slot * self.op.size(),
            length: self.op.size() as u32,
            lkey: self.src.lkey,
        }
    }

    /// The `k`-th WR of the next post-list over `sge`.
    fn wr<'a>(&self, k: usize, sge: &'a Sge) -> SendWr<'a> {
        let slot = (self.posted + k as u64) % SLOTS;
        let (va, rkey) = self.remote;
        let op = match self.op {
            Op::Send64 => SendOp::Send,
            Op::Write4k => SendOp::RdmaWrite {
                remote_addr: va + slot * self.op.size(),
                rkey,
            },
        };
        SendWr::new(self.posted + k as u64, op, core::slice::from_ref(sge))
    }

    /// `poll_transmit_gather` into the link until the engine has nothing more, then one flush: payloads of at least
    /// [`GATHER_MIN`] bytes stay in the MR and go to the link as pieces (`tx_commit_gather`), as with `UdpLink`.
    fn transmit(&mut self, link: &mut NullLink) {
        let now = self.now;
        let mut segs = [TxSeg::EMPTY; 8];
        loop {
            let buf = link.tx_buf(now).expect("null link tx_buf");
            let Some(m) = self.e.poll_transmit_gather(now, buf, &mut segs) else {
                break;
            };
            match m.gather {
                None => link.tx_commit(now, m.len).expect("null link tx_commit"),
                // SAFETY: the pieces point into this engine's MR memory, which nothing writes or deregisters
                // before the flush below (the engine is not called in between).
                #[allow(unsafe_code)]
                Some(g) => {
                    unsafe { link.tx_commit_gather(now, g, &segs) }.expect("tx_commit_gather")
                }
            }
        }
        link.flush(now).expect("flush");
    }

    /// Receives what the link holds, then reaps completions; returns completions seen.
    fn receive(&mut self, link: &mut NullLink) -> u64 {
        let now = self.now;
        let e = &mut self.e;
        link.rx_burst(now, MAX_POST_LIST, &mut |f| e.handle_frame(now, f))
            .expect("rx_burst");
        let _ = self.e.poll_timeout();
        let mut done = 0;
        loop {
            let n = self.e.poll_cq(self.cq, &mut self.wcs);
            for wc in &self.wcs[..n] {
                assert_eq!(wc.status, WcStatus::Success, "completion {wc:?}");
            }
            done += n as u64;
            if n < self.wcs.len() {
                return done;
            }
        }
    }
}

/// Pre-built ACK frames of a responder that acknowledges each burst as one (see the crate docs).
struct AckMaker {
    repr: RoceRepr,
    frames: Vec<u8>,
    lens: Vec<usize>,
}

impl AckMaker {
    fn new(requester_qpn: Qpn) -> AckMaker {
        let repr = RoceRepr {
            eth: EthernetRepr {
                src_addr: EthernetAddress(MAC[1]),
                dst_addr: EthernetAddress(MAC[0]),
                vlan: None,
                ethertype: EtherType::IPV4,
            },
            ip: IpRepr::Ipv4(Ipv4Repr {
                src_addr: IP[1].into(),
                dst_addr: IP[0].into(),
                dscp: 0,
                ecn: roce_wire::Ecn::NotEct,
                ident: 0,
                dont_frag: true,
                ttl: 64,
                protocol: 17,
            }),
            udp: UdpRepr {
                src_port: roce_wire::udp_sport(Qpn::new(PEER_QPN), requester_qpn, 0),
                dst_port: ROCE_V2_PORT,
            },
            bth: BthRepr {
                opcode: Opcode::RC_ACKNOWLEDGE,
                solicited: false,
                mig_req: true,
                pad_count: 0,
                pkey: 0xFFFF,
                fecn: false,
                becn: false,
                dest_qp: requester_qpn,
                ack_req: false,
                psn: Psn::new(0),
            },
            ext: ExtRepr {
                aeth: Some(AethRepr {
                    syndrome: AethSyndrome::from_byte(0x1F),
                    msn: Msn::new(0),
                }),
                ..ExtRepr::NONE
            },
            payload_len: 0,
        };
        AckMaker {
            repr,
            frames: Vec::new(),
            lens: Vec::new(),
        }
    }

    /// ACK frames for `bursts` bursts of `per_burst` messages, the first message having PSN `psn0` and the
    /// responder's MSN being `msn0` before it.
    fn build(&mut self, psn0: Psn, msn0: u64, bursts: u64, per_burst: u64) {
        self.frames.clear();
        self.frames.resize(bursts as usize * ACK_STRIDE, 0);
        self.lens.clear();
        for b in 0..bursts {
            let done = (b + 1) * per_burst;
            let mut r = self.repr;
            r.bth.psn = psn0 + (done - 1) as u32;
            r.ext.aeth = Some(AethRepr {
                syndrome: AethSyndrome::from_byte(0x1F),
                msn: Msn::new(((msn0 + done) & 0xFF_FFFF) as u32),
            });
            let at = b as usize * ACK_STRIDE;
            let n = r
                .emit(&mut self.frames[at..at + ACK_STRIDE], |_| {})
                .expect("ACK emit");
            self.lens.push(n);
        }
    }

    fn frame(&self, b: usize) -> &[u8] {
        &self.frames[b * ACK_STRIDE..b * ACK_STRIDE + self.lens[b]]
    }
}

/// The send side alone: a requester on a null link, the peer's ACKs pre-built (see the crate docs).
pub struct SendSide {
    req: Requester,
    link: NullLink,
    acks: AckMaker,
    psn0: Psn,
    /// Messages the fake responder has acknowledged.
    acked: u64,
    completed: u64,
}

impl SendSide {
    /// A requester for `op` with `post_list` WRs per `post_send` (1..=32); the null link fully checks every
    /// `check_every`-th frame (0 = headers only).
    pub fn new(op: Op, post_list: usize, check_every: u64) -> SendSide {
        let req = Requester::new(op, post_list, Qpn::new(PEER_QPN), 1);
        let psn0 = req.e.qp_info(req.qpn).expect("qp").next_psn;
        let size = op.size();
        // Frame k carries message k (PSN psn0 + k): its payload is source slot k mod SLOTS.
        let src: Vec<u8> = (0..SLOTS * size).map(pattern).collect();
        let check = move |p: &roce_wire::ParsedFrame<'_>| {
            let k = p.repr.bth.psn.diff(psn0) as u64;
            let base = ((k % SLOTS) * size) as usize;
            p.payload == &src[base..base + size as usize]
        };
        let link =
            NullLink::new(LINK_MTU, MAX_POST_LIST + 1, check_every).with_check(Box::new(check));
        let acks = AckMaker::new(req.qpn);
        SendSide {
            req,
            link,
            acks,
            psn0,
            acked: 0,
            completed: 0,
        }
    }

    /// Signaled completions reaped so far.
    pub fn completions(&self) -> u64 {
        self.completed
    }

    /// Payload bytes the requester's engine copied (or left for the link to gather).
    pub fn payload_copies(&self) -> PayloadCopies {
        self.req.e.payload_copies()
    }

    /// Engine port counters.
    pub fn counters(&self) -> &Counters {
        self.req.e.counters()
    }
}

impl Workload for SendSide {
    fn prepare(&mut self, _n: u64) {}

    /// Runs in chunks of at most [`ACK_CHUNK`] bursts: each chunk's ACK frames are built first (untimed), so they
    /// sit in cache as a received frame would (a sample-sized array of them would stream from memory and charge
    /// the requester a cache miss per ACK that no real receive path has).
    fn run(&mut self, n: u64) -> Duration {
        let pl = self.req.post_list as u64;
        let mut bursts = n.div_ceil(pl);
        let mut el = Duration::ZERO;
        while bursts > 0 {
            let chunk = bursts.min(ACK_CHUNK);
            self.acks
                .build(self.psn0 + self.acked as u32, self.acked, chunk, pl);
            let t = ThreadCpu::now();
            for b in 0..chunk as usize {
                self.req.post();
                self.req.transmit(&mut self.link);
                self.link.inject(self.acks.frame(b)).expect("inject ACK");
                self.completed += self.req.receive(&mut self.link);
            }
            el += t.elapsed();
            self.acked += chunk * pl;
            bursts -= chunk;
        }
        el
    }

    fn msg_bytes(&self) -> u64 {
        self.req.op.size()
    }

    fn rounded(&self, n: u64) -> u64 {
        n.div_ceil(self.req.post_list as u64) * self.req.post_list as u64
    }

    fn link_stats(&self) -> Option<NullStats> {
        Some(self.link.stats())
    }

    fn verified(&self) -> bool {
        self.completed == self.req.posted / self.req.post_list as u64 && self.link.stats().bad == 0
    }
}

/// Both ends in one thread: requester and a real responder engine (see the crate docs).
pub struct Loopback {
    req: Requester,
    resp: Engine,
    resp_qpn: Qpn,
    resp_cq: CqHandle,
    dst: MrInfo,
    link_a: NullLink,
    link_b: NullLink,
    recv_posted: u64,
    recv_done: u64,
    completed: u64,
    wcs: [Wc; 64],
}

impl Loopback {
    /// Requester and responder for `op` with `post_list` WRs per `post_send`; the null links fully check every
    /// `check_every`-th frame (the responder parses and ICRC-checks every frame anyway).
    pub fn new(op: Op, post_list: usize, check_every: u64) -> Loopback {
        let mut resp = Engine::new(engine_cfg(1));
        let pd = resp.alloc_pd().expect("pd");
        let resp_cq = resp.create_cq(1024).expect("cq");
        let dst = resp
            .reg_mr(pd, vec![0u8; (SLOTS * op.size()) as usize], ACCESS)
            .expect("mr");
        let resp_qpn = rc_qp(&mut resp, pd, resp_cq);
        let mut req = Requester::new(op, post_list, resp_qpn, 1);
        connect(&mut resp, resp_qpn, req.qpn, 0);
        req.remote = (dst.addr, dst.rkey);
        let mut lb = Loopback {
            req,
            resp,
            resp_qpn,
            resp_cq,
            dst,
            link_a: NullLink::new(LINK_MTU, MAX_POST_LIST + 1, check_every).linearizing(),
            link_b: NullLink::new(LINK_MTU, MAX_POST_LIST + 1, check_every),
            recv_posted: 0,
            recv_done: 0,
            completed: 0,
            wcs: [Wc::default(); 64],
        };
        if op == Op::Send64 {
            lb.post_recvs(128);
        }
        lb
    }

    fn post_recvs(&mut self, n: u64) {
        let size = self.req.op.size();
        for _ in 0..n {
            let slot = self.recv_posted % SLOTS;
            let sge = [Sge {
                addr: self.dst.addr + slot * size,
                length: size as u32,
                lkey: self.dst.lkey,
            }];
            self.resp
                .post_recv(
                    self.resp_qpn,
                    &[RecvWr {
                        wr_id: self.recv_posted,
                        sg_list: &sge,
                    }],
                )
                .expect("post_recv");
            self.recv_posted += 1;
        }
    }

    /// Whether the responder's MR holds the source pattern in every slot (call after at least `SLOTS` messages).
    pub fn verify(&self) -> bool {
        let size = self.req.op.size();
        self.resp.mr_bytes(self.dst.lkey).is_some_and(|b| {
            b.len() as u64 == SLOTS * size
                && b.iter().enumerate().all(|(x, &v)| v == pattern(x as u64))
        })
    }

    /// Signaled completions reaped at the requester, and receive completions at the responder.
    pub fn completions(&self) -> (u64, u64) {
        (self.completed, self.recv_done)
    }

    /// Payload bytes the requester's and the responder's engines copied (or left for the link to gather).
    pub fn payload_copies(&self) -> (PayloadCopies, PayloadCopies) {
        (self.req.e.payload_copies(), self.resp.payload_copies())
    }

    /// Engine port counters of the requester and the responder.
    pub fn counters(&self) -> (&Counters, &Counters) {
        (self.req.e.counters(), self.resp.counters())
    }
}

impl Workload for Loopback {
    fn prepare(&mut self, _n: u64) {}

    fn run(&mut self, n: u64) -> Duration {
        let pl = self.req.post_list as u64;
        let bursts = n.div_ceil(pl);
        let sends = self.req.op == Op::Send64;
        let t = ThreadCpu::now();
        for _ in 0..bursts {
            self.req.post();
            self.req.transmit(&mut self.link_a);
            let now = self.req.now;
            for f in self.link_a.flushed() {
                self.resp.handle_frame(now, f);
            }
            loop {
                let buf = self.link_b.tx_buf(now).expect("tx_buf");
                let Some(m) = self.resp.poll_transmit(now, buf) else {
                    break;
                };
                self.link_b.tx_commit(now, m.len).expect("tx_commit");
            }
            self.link_b.flush(now).expect("flush");
            for f in self.link_b.flushed() {
                self.req.e.handle_frame(now, f);
            }
            let _ = self.resp.poll_timeout();
            if sends {
                let n = self.resp.poll_cq(self.resp_cq, &mut self.wcs);
                for wc in &self.wcs[..n] {
                    assert_eq!(wc.status, WcStatus::Success, "receive completion {wc:?}");
                }
                self.recv_done += n as u64;
                self.post_recvs(n as u64);
            }
            self.completed += self.req.receive(&mut self.link_a);
        }
        t.elapsed()
    }

    fn msg_bytes(&self) -> u64 {
        self.req.op.size()
    }

    fn rounded(&self, n: u64) -> u64 {
        n.div_ceil(self.req.post_list as u64) * self.req.post_list as u64
    }

    fn link_stats(&self) -> Option<NullStats> {
        Some(self.link_a.stats())
    }

    fn verified(&self) -> bool {
        let sends_ok = self.req.op != Op::Send64 || self.recv_done == self.req.posted;
        self.completed == self.req.posted / self.req.post_list as u64
            && sends_ok
            && self.link_a.stats().bad == 0
            && self.link_b.stats().bad == 0
            && (self.req.posted < SLOTS || self.verify())
    }
}

/// `memcpy` + `crc32fast` of the same payloads (see the crate docs).
pub struct Baseline {
    src: Vec<u8>,
    frame: Vec<u8>,
    size: usize,
    k: u64,
    /// XOR of every CRC (kept so the work is not optimised away).
    pub acc: u32,
}

/// Header bytes in front of the payload in the baseline's frame buffer (Ethernet + IPv4 + UDP + BTH).
pub const BASELINE_HDR: usize = 54;

impl Baseline {
    /// Copies + CRCs of `op.size()` bytes.
    pub fn new(op: Op) -> Baseline {
        let size = op.size() as usize;
        Baseline {
            src: (0..SLOTS * op.size()).map(pattern).collect(),
            frame: vec![0; BASELINE_HDR + size + 8],
            size,
            k: 0,
            acc: 0,
        }
    }
}

impl Workload for Baseline {
    fn prepare(&mut self, _n: u64) {}

    fn run(&mut self, n: u64) -> Duration {
        let t = ThreadCpu::now();
        for _ in 0..n {
            let s = (self.k % SLOTS) as usize * self.size;
            let dst = &mut self.frame[BASELINE_HDR..BASELINE_HDR + self.size];
            dst.copy_from_slice(&self.src[s..s + self.size]);
            self.acc ^= crc32fast::hash(std::hint::black_box(&*dst));
            self.k += 1;
        }
        t.elapsed()
    }

    fn msg_bytes(&self) -> u64 {
        self.size as u64
    }
}
