//! Harness of the fuzz target `engine_frames` (issue #21), shared by `fuzz/fuzz_targets/engine_frames.rs` and the
//! replay test `crates/roce-proto/tests/fuzz_engine_frames.rs` (which runs it in the README's test command).
//!
//! Two sans-IO engines (roce-proto), each with a live RC, UC and UD QP (RC and UC connected to the other engine's),
//! one CQ, and three MRs:
//! * `rw` (64 KiB, all remote access): the target of the peer's WRITE / READ / atomics;
//! * `guard` (8 KiB, LOCAL_WRITE only, no remote access): receive and READ/atomic result SGEs point into its first
//!   4 KiB only, so its second 4 KiB must keep the canary byte [`CANARY`] whatever arrives;
//! * `src` (4 KiB, no access flags at all: the engine may only read it): the source of SENDs and WRITEs; it must
//!   never change.
//!
//! The input is a program of one-byte opcodes with their operand bytes ([`run`] reads it front to back; a missing
//! operand reads as 0). Operations: post a send WR of any kind (SEND, SEND with immediate, WRITE, WRITE with
//! immediate, READ, CMP_AND_SWP, FETCH_AND_ADD; signaled or not, into `rw` or, to provoke NAKs, at the `guard` MR's
//! R_Key or a wrong one), post receives, deliver the next frame one engine sent (as sent, dropped, duplicated, or
//! with fuzzer-chosen bytes overwritten and the ICRC and IPv4 checksum refreshed so it passes the checks also when
//! not built under `cfg(fuzzing)`), forge a frame from a captured one through `RoceRepr` with a fuzzer-chosen
//! opcode, PSN offset, RETH/AtomicETH VA offset, R_Key, DMA length, AETH syndrome and payload length, hand raw
//! bytes to an engine, move the clock and fire timers, and run the wire until quiet.
//!
//! Invariants checked (a violation panics, which libFuzzer reports as a crash):
//! * no panic in the engine;
//! * every work completion names a WR that was posted and has not completed yet (at most once), and at the end,
//!   after every QP is moved to ERR and the engines are flushed, every signaled send WR and every receive WR has
//!   completed (never a lost completion);
//! * the `guard` MR's second half still holds [`CANARY`] and `src` its original bytes (checked after every
//!   operation that delivers a frame and at the end).

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use roce_proto::*;
use roce_wire::{
    AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, DethRepr, ExtHeader, ExtRepr,
    IethRepr, ImmDtRepr, Ipv4Packet, Opcode, RethRepr, RoceRepr,
};

/// The byte the `guard` MR's second half holds.
pub const CANARY: u8 = 0xA5;
const MAC: [[u8; 6]; 2] = [[2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2]];
const IP: [[u8; 4]; 2] = [[198, 18, 207, 1], [198, 18, 207, 2]];
const QKEY: u32 = 0x1111_1111;
const RW_LEN: usize = 64 * 1024;
const GUARD_LEN: usize = 8 * 1024;
const GUARD_OPEN: usize = 4 * 1024;
const SRC_LEN: usize = 4 * 1024;
const CAP: QpCap = QpCap {
    max_send_wr: 32,
    max_recv_wr: 32,
    max_send_sge: 2,
    max_recv_sge: 2,
    max_inline_data: 64,
};
/// Frames kept per direction (older ones are dropped: the wire is lossy anyway).
const WIRE_CAP: usize = 256;
/// Bound on `drive` steps per operation.
const DRIVE_STEPS: usize = 400;

/// One engine's objects.
struct Side {
    e: Engine,
    cq: CqHandle,
    rc: Qpn,
    uc: Qpn,
    ud: Qpn,
    rw: MrInfo,
    guard: MrInfo,
    src: MrInfo,
    ah: AhHandle,
    /// Signaled send WRs and receive WRs posted and not completed yet: each must complete exactly once.
    must: HashSet<u64>,
    /// Unsignaled send WRs posted: complete at most once (only if they fail).
    may: HashSet<u64>,
    /// Frames this engine sent and nobody has taken yet.
    out: VecDeque<Vec<u8>>,
    /// The last frame of each kind this engine sent (templates for forging).
    templates: Vec<Vec<u8>>,
}

fn src_byte(i: usize) -> u8 {
    (i as u8).wrapping_mul(7).wrapping_add(3)
}

fn side(k: usize) -> Side {
    let mut e = Engine::new(EngineConfig {
        mac: MAC[k],
        gids: vec![Gid::from_ipv4(IP[k])],
        seed: 1 + k as u64,
        ..EngineConfig::default()
    });
    let pd = e.alloc_pd().unwrap();
    let cq = e.create_cq(4096).unwrap();
    let all = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let rw = e.reg_mr(pd, vec![0u8; RW_LEN], all).unwrap();
    let mut g = vec![0u8; GUARD_LEN];
    g[GUARD_OPEN..].fill(CANARY);
    let guard = e.reg_mr(pd, g, AccessFlags::LOCAL_WRITE).unwrap();
    let src = e
        .reg_mr(
            pd,
            (0..SRC_LEN).map(src_byte).collect::<Vec<u8>>(),
            AccessFlags::EMPTY,
        )
        .unwrap();
    let qp = |e: &mut Engine, qp_type| {
        e.create_qp(&QpInitAttr {
            qp_type,
            pd,
            send_cq: cq,
            recv_cq: cq,
            cap: CAP,
            sq_sig_all: false,
        })
        .unwrap()
        .0
    };
    let rc = qp(&mut e, QpType::Rc);
    let uc = qp(&mut e, QpType::Uc);
    let ud = qp(&mut e, QpType::Ud);
    let peer = 1 - k;
    let av = AhAttr {
        dgid: Gid::from_ipv4(IP[peer]),
        dmac: MAC[peer],
        ..AhAttr::default()
    };
    let ah = e.create_ah(pd, &av).unwrap();
    Side {
        e,
        cq,
        rc,
        uc,
        ud,
        rw,
        guard,
        src,
        ah,
        must: HashSet::new(),
        may: HashSet::new(),
        out: VecDeque::new(),
        templates: Vec::new(),
    }
}

/// RESET → INIT → RTR → RTS of a connected QP (RC or UC) towards `peer` on the other engine.
fn bring_up(e: &mut Engine, me: Qpn, peer: Qpn, k: usize, rc: bool) {
    let p = 1 - k;
    let mut at = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS,
    )
    .unwrap();
    at.qp_state = QpState::Rtr;
    at.ah_attr = AhAttr {
        dgid: Gid::from_ipv4(IP[p]),
        dmac: MAC[p],
        ..AhAttr::default()
    };
    at.path_mtu = Mtu::Mtu1024;
    at.dest_qp_num = peer;
    // Near the wrap, so PSN arithmetic wraps during a run.
    at.rq_psn = Psn::new(0xFF_FFF0);
    at.max_dest_rd_atomic = 4;
    at.min_rnr_timer = 1;
    let mut mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN;
    if rc {
        mask |= QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER;
    }
    e.modify_qp(me, &at, mask).unwrap();
    at.qp_state = QpState::Rts;
    at.sq_psn = Psn::new(0xFF_FFF0);
    at.timeout = 4;
    at.retry_cnt = 3;
    at.rnr_retry = 3;
    at.max_rd_atomic = 4;
    let mut mask = QpAttrMask::STATE | QpAttrMask::SQ_PSN;
    if rc {
        mask |= QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::MAX_QP_RD_ATOMIC;
    }
    e.modify_qp(me, &at, mask).unwrap();
}

fn bring_up_ud(e: &mut Engine, me: Qpn) {
    let mut at = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey: QKEY,
        ..QpAttr::default()
    };
    e.modify_qp(
        me,
        &at,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    at.qp_state = QpState::Rtr;
    e.modify_qp(me, &at, QpAttrMask::STATE).unwrap();
    at.qp_state = QpState::Rts;
    at.sq_psn = Psn::new(5);
    e.modify_qp(me, &at, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
}

/// Reads the fuzzer's program: a byte at a time, 0 once it is used up.
struct Input<'a> {
    data: &'a [u8],
}

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn bytes(&mut self, n: usize) -> &[u8] {
        let (h, t) = self.data.split_at(n.min(self.data.len()));
        self.data = t;
        h
    }
}

struct World {
    s: [Side; 2],
    now: Instant,
    next_id: u64,
    stats: Stats,
}

/// What one run did (the replay test checks that its seeds reach the engine's paths).
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Work completions polled (both engines).
    pub completions: u64,
    /// Frames handed to `handle_frame` (both engines).
    pub delivered: u64,
    /// Completions with an error status (flushes included).
    pub errors: u64,
}

impl World {
    fn new() -> World {
        let mut s = [side(0), side(1)];
        let (rc0, rc1, uc0, uc1) = (s[0].rc, s[1].rc, s[0].uc, s[1].uc);
        bring_up(&mut s[0].e, rc0, rc1, 0, true);
        bring_up(&mut s[1].e, rc1, rc0, 1, true);
        bring_up(&mut s[0].e, uc0, uc1, 0, false);
        bring_up(&mut s[1].e, uc1, uc0, 1, false);
        for x in &mut s {
            let ud = x.ud;
            bring_up_ud(&mut x.e, ud);
        }
        World {
            s,
            now: Instant::from_micros(1),
            next_id: 1,
            stats: Stats::default(),
        }
    }

    /// Moves every frame both engines have ready into their `out` queues.
    fn transmit(&mut self) {
        let mut buf = [0u8; 9216];
        let now = self.now;
        for x in &mut self.s {
            while let Some(meta) = x.e.poll_transmit(now, &mut buf) {
                let f = buf[..meta.len].to_vec();
                // Keep one template per BTH opcode (byte 42 with an untagged IPv4 frame; any byte will do).
                let op = f.get(42).copied();
                if let Some(t) = x.templates.iter_mut().find(|t| t.get(42).copied() == op) {
                    t.clone_from(&f);
                } else if x.templates.len() < 32 {
                    x.templates.push(f.clone());
                }
                if x.out.len() == WIRE_CAP {
                    x.out.pop_front();
                }
                x.out.push_back(f);
            }
        }
    }

    /// Polls both CQs, checking that every completion is for a WR that is still owed one.
    fn poll(&mut self) {
        let mut wc = [Wc::default(); 16];
        for (k, x) in self.s.iter_mut().enumerate() {
            loop {
                let n = x.e.poll_cq(x.cq, &mut wc);
                for w in &wc[..n] {
                    self.stats.completions += 1;
                    self.stats.errors += u64::from(w.status != WcStatus::Success);
                    assert!(
                        x.must.remove(&w.wr_id) || x.may.remove(&w.wr_id),
                        "engine {k}: completion for WR {} that was not posted or already completed: {w:?}",
                        w.wr_id
                    );
                }
                if n == 0 {
                    break;
                }
            }
            while x.e.poll_async_event().is_some() {}
        }
    }

    fn deliver(&mut self, to: usize, f: &[u8]) {
        let now = self.now;
        self.stats.delivered += 1;
        self.s[to].e.handle_frame(now, f);
        self.check_canaries();
    }

    fn check_canaries(&self) {
        for (k, x) in self.s.iter().enumerate() {
            let mut g = [0u8; GUARD_LEN - GUARD_OPEN];
            x.e.mr_read(x.guard.lkey, GUARD_OPEN, &mut g).unwrap();
            assert!(
                g.iter().all(|&b| b == CANARY),
                "engine {k}: guard MR written outside every SGE"
            );
            let mut s = [0u8; SRC_LEN];
            x.e.mr_read(x.src.lkey, 0, &mut s).unwrap();
            assert!(
                s.iter().enumerate().all(|(i, &b)| b == src_byte(i)),
                "engine {k}: MR without LOCAL_WRITE written"
            );
        }
    }

    /// Runs the wire (every frame delivered in order) and the timers until nothing moves, at most `steps` rounds.
    fn drive(&mut self, steps: usize) {
        for _ in 0..steps {
            self.transmit();
            let mut moved = false;
            for from in 0..2 {
                while let Some(f) = self.s[from].out.pop_front() {
                    self.deliver(1 - from, &f);
                    moved = true;
                }
            }
            self.poll();
            if moved {
                continue;
            }
            let next = [self.s[0].e.poll_timeout(), self.s[1].e.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) => {
                    self.now = self.now.max(t);
                    self.tick();
                }
                None => break,
            }
        }
    }

    fn tick(&mut self) {
        let now = self.now;
        for x in &mut self.s {
            x.e.handle_timeout(now);
        }
        self.transmit();
        self.poll();
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Posts one send WR chosen by the input on engine `k`.
    fn post_send(&mut self, k: usize, inp: &mut Input<'_>) {
        let kind = inp.u8();
        let len = u32::from(inp.u16()) % 5000;
        let off = u64::from(inp.u16());
        let flags = inp.u8();
        let id = self.id();
        let peer_rw = self.s[1 - k].rw;
        let peer_guard = self.s[1 - k].guard;
        let x = &mut self.s[k];
        let (rkey, raddr) = match flags >> 5 {
            0 => (peer_guard.rkey, peer_guard.addr + off % GUARD_LEN as u64),
            1 => (Rkey(peer_rw.rkey.0 ^ 0x100), peer_rw.addr + off),
            _ => (peer_rw.rkey, peer_rw.addr + off % RW_LEN as u64),
        };
        let signaled = flags & 1 != 0;
        let qpn = match (flags >> 1) & 3 {
            0 | 1 => x.rc,
            2 => x.uc,
            _ => x.ud,
        };
        let src_len = len.min(SRC_LEN as u32);
        let src = [Sge {
            addr: x.src.addr,
            length: src_len,
            lkey: x.src.lkey,
        }];
        // READ / atomic results land in the guard's open half.
        let dst_len = len.min(GUARD_OPEN as u32);
        let dst = [Sge {
            addr: x.guard.addr + u64::from(off as u32 % (GUARD_OPEN as u32 - dst_len + 1)),
            length: dst_len,
            lkey: x.guard.lkey,
        }];
        let dst8 = [Sge {
            addr: x.guard.addr + (off % (GUARD_OPEN as u64 / 8)) * 8,
            length: 8,
            lkey: x.guard.lkey,
        }];
        let (op, sges): (SendOp, &[Sge]) = match kind % 7 {
            0 => (SendOp::Send, &src),
            1 => (SendOp::SendWithImm { imm: id as u32 }, &src),
            2 => (
                SendOp::RdmaWrite {
                    remote_addr: raddr,
                    rkey,
                },
                &src,
            ),
            3 => (
                SendOp::RdmaWriteWithImm {
                    remote_addr: raddr,
                    rkey,
                    imm: 7,
                },
                &src,
            ),
            4 => (
                SendOp::RdmaRead {
                    remote_addr: raddr,
                    rkey,
                },
                &dst,
            ),
            5 => (
                SendOp::AtomicCmpAndSwp {
                    remote_addr: raddr & !7,
                    rkey,
                    compare: 0,
                    swap: id,
                },
                &dst8,
            ),
            _ => (
                SendOp::AtomicFetchAndAdd {
                    remote_addr: raddr & !7,
                    rkey,
                    add: 1,
                },
                &dst8,
            ),
        };
        let mut wr = SendWr::new(id, op, sges);
        if signaled {
            wr = wr.signaled();
        }
        if flags & 0x10 != 0 {
            wr = wr.flags(SendFlags::FENCE);
        }
        if qpn == x.ud {
            wr = wr.ud(UdDest {
                ah: x.ah,
                remote_qpn: peer_ud_qpn(&self.s, k),
                remote_qkey: if flags & 8 != 0 { QKEY } else { 0x1234 },
            });
        }
        let x = &mut self.s[k];
        if x.e.post_send(qpn, &[wr]).is_ok() {
            if signaled {
                x.must.insert(id);
            } else {
                x.may.insert(id);
            }
        }
    }

    fn post_recv(&mut self, k: usize, inp: &mut Input<'_>) {
        let which = inp.u8();
        let len = u32::from(inp.u16()) % (GUARD_OPEN as u32 + 1);
        let off = u32::from(inp.u16()) % (GUARD_OPEN as u32 - len + 1);
        let id = self.id();
        let x = &mut self.s[k];
        let qpn = [x.rc, x.uc, x.ud][usize::from(which % 3)];
        let sge = [Sge {
            addr: x.guard.addr + u64::from(off),
            length: len,
            lkey: x.guard.lkey,
        }];
        if x.e
            .post_recv(
                qpn,
                &[RecvWr {
                    wr_id: id,
                    sg_list: &sge,
                }],
            )
            .is_ok()
        {
            x.must.insert(id);
        }
    }

    /// Forges a frame for engine `to` from one the other engine sent, with fuzzer-chosen fields.
    fn forge(&mut self, to: usize, inp: &mut Input<'_>) {
        let pick = usize::from(inp.u8());
        let opcode = inp.u8();
        let psn_off = i32::from(inp.u8() as i8);
        let va_off = i64::from(inp.u16() as i16);
        let flags = inp.u8();
        let dma_len = match flags & 3 {
            0 => u32::from(inp.u16()),
            1 => u32::MAX - u32::from(inp.u8()),
            2 => (1 << 31) + u32::from(inp.u8()),
            _ => u32::from(inp.u8()),
        };
        let aeth = inp.u8();
        let payload = usize::from(inp.u16()) % 2100;
        self.transmit();
        let from = &self.s[1 - to];
        if from.templates.is_empty() {
            return;
        }
        let tmpl = &from.templates[pick % from.templates.len()];
        let Ok(parsed) = RoceRepr::parse(tmpl) else {
            return;
        };
        let target = &self.s[to];
        let qpn = parsed.repr.bth.dest_qp;
        let info = target.e.qp_info(qpn);
        let base = match info {
            Some(i) if flags & 4 != 0 => i.una_psn,
            Some(i) => i.epsn,
            None => Psn::new(0),
        };
        let psn = (i64::from(base.value()) + i64::from(psn_off)).rem_euclid(1 << 24) as u32;
        let mr = if flags & 8 != 0 {
            target.guard
        } else {
            target.rw
        };
        let va = (mr.addr as i64).wrapping_add(va_off) as u64;
        let rkey = if flags & 0x10 != 0 {
            mr.rkey.0
        } else {
            mr.rkey.0 ^ (u32::from(aeth) << 8)
        };
        let op = Opcode(opcode);
        let hs = op.ext_headers();
        if hs.contains(ExtHeader::Feth) {
            return;
        }
        let ext = ExtRepr {
            deth: hs.contains(ExtHeader::Deth).then_some(DethRepr {
                qkey: if flags & 0x20 != 0 { QKEY } else { 0x4242 },
                src_qp: parsed.repr.bth.dest_qp,
            }),
            feth: None,
            reth: hs
                .contains(ExtHeader::Reth)
                .then_some(RethRepr { va, rkey, dma_len }),
            atomic_eth: hs.contains(ExtHeader::AtomicEth).then_some(AtomicEthRepr {
                va,
                rkey,
                swap_add: 5,
                compare: 0,
            }),
            aeth: hs.contains(ExtHeader::Aeth).then_some(AethRepr {
                syndrome: AethSyndrome::from_byte(aeth),
                msn: Msn::new(u32::from(flags)),
            }),
            atomic_ack_eth: hs
                .contains(ExtHeader::AtomicAckEth)
                .then_some(AtomicAckEthRepr { orig_value: 9 }),
            immdt: hs
                .contains(ExtHeader::ImmDt)
                .then_some(ImmDtRepr { imm_data: 1 }),
            ieth: hs.contains(ExtHeader::Ieth).then_some(IethRepr { rkey }),
            cnp: hs
                .contains(ExtHeader::CnpBody)
                .then_some(roce_wire::CnpRepr),
        };
        let payload = if op.info().is_some_and(|i| !i.has_payload()) {
            0
        } else {
            payload
        };
        let mut r = parsed.repr;
        r.bth.opcode = op;
        r.bth.psn = Psn::new(psn);
        r.bth.ack_req = flags & 0x40 != 0;
        r.bth.solicited = flags & 0x80 != 0;
        r.bth.pad_count = if op.is_known() {
            ((4 - payload % 4) % 4) as u8
        } else {
            0
        };
        r.ext = ext;
        r.payload_len = payload;
        let mut out = vec![0u8; r.buffer_len()];
        if r.emit(&mut out, |b| b.fill(0xC3)).is_ok() {
            self.deliver(to, &out);
        }
    }

    /// Takes the next frame engine `from` sent and does with it what the input says.
    fn wire_op(&mut self, from: usize, inp: &mut Input<'_>) {
        let how = inp.u8();
        self.transmit();
        let Some(mut f) = self.s[from].out.pop_front() else {
            return;
        };
        match how % 5 {
            // Delivered as sent.
            0 | 1 => self.deliver(1 - from, &f),
            // Dropped.
            2 => {}
            // Delivered twice.
            3 => {
                self.deliver(1 - from, &f);
                self.deliver(1 - from, &f);
            }
            // Bytes overwritten (1 .. 8 of them), mostly from the BTH on; checksums refreshed.
            _ => {
                let n = 1 + usize::from(how >> 5);
                for _ in 0..n {
                    let at = usize::from(inp.u16());
                    let v = inp.u8();
                    let at = if at & 0x8000 != 0 {
                        at & 0x7fff
                    } else {
                        42 + (at & 0x3f)
                    };
                    if let Some(b) = f.get_mut(at) {
                        *b = v;
                    }
                }
                if how & 0x10 == 0 {
                    refresh_checksums(&mut f);
                }
                self.deliver(1 - from, &f);
            }
        }
    }

    /// The end of a run: every QP to ERR, timers and the wire flushed; no WR that is owed a completion may be left.
    fn finish(&mut self) {
        self.drive(DRIVE_STEPS);
        for x in &mut self.s {
            for qpn in [x.rc, x.uc, x.ud] {
                let at = QpAttr {
                    qp_state: QpState::Err,
                    ..QpAttr::default()
                };
                x.e.modify_qp(qpn, &at, QpAttrMask::STATE).unwrap();
            }
        }
        self.now += Duration::from_secs(1);
        self.tick();
        self.drive(DRIVE_STEPS);
        self.poll();
        self.check_canaries();
        for (k, x) in self.s.iter().enumerate() {
            assert!(
                x.must.is_empty(),
                "engine {k}: WRs without a completion after the QPs were flushed: {:?}",
                x.must
            );
        }
    }
}

fn peer_ud_qpn(s: &[Side; 2], k: usize) -> Qpn {
    s[1 - k].ud
}

/// Recomputes the IPv4 header checksum and the ICRC of an untagged IPv4 RoCE frame (after bytes were overwritten),
/// so the mutation reaches the transport also in a build without `cfg(fuzzing)`. Frames whose lengths no longer
/// agree are left as they are (the engine must drop them).
fn refresh_checksums(f: &mut [u8]) {
    if f.len() < 34 {
        return;
    }
    let ip = &mut f[14..];
    if let Ok(mut p) = Ipv4Packet::new_checked(&mut *ip) {
        p.fill_checksum();
    }
    let _ = roce_wire::icrc::fill(ip);
}

/// Runs one input (see the module documentation). Panics when an invariant breaks.
pub fn run(data: &[u8]) {
    run_stats(data);
}

/// [`run`], returning what the run did.
pub fn run_stats(data: &[u8]) -> Stats {
    let mut w = World::new();
    let mut inp = Input { data };
    // Each engine has something posted from the start, so responses and ACKs have work to hit.
    for k in 0..2 {
        for n in 0..12 {
            let id = w.id();
            let x = &mut w.s[k];
            let sge = [Sge {
                addr: x.guard.addr,
                length: 2048,
                lkey: x.guard.lkey,
            }];
            let qpn = [x.rc, x.uc, x.ud][n % 3];
            x.e.post_recv(
                qpn,
                &[RecvWr {
                    wr_id: id,
                    sg_list: &sge,
                }],
            )
            .unwrap();
            x.must.insert(id);
        }
    }
    let mut ops = 0;
    while !inp.data.is_empty() && ops < 2048 {
        ops += 1;
        let op = inp.u8();
        let k = usize::from(op >> 7);
        match op & 0x7f {
            0..=23 => w.post_send(k, &mut inp),
            24..=35 => w.post_recv(k, &mut inp),
            36..=71 => w.wire_op(k, &mut inp),
            72..=87 => w.forge(k, &mut inp),
            88..=95 => {
                let n = usize::from(inp.u8());
                let raw = inp.bytes(n).to_vec();
                w.deliver(k, &raw);
            }
            96..=111 => {
                w.now += Duration::from_micros(u64::from(inp.u16()) * 16);
                w.tick();
            }
            _ => w.drive(usize::from(inp.u8() % 32) + 1),
        }
        w.poll();
    }
    w.finish();
    w.stats
}
