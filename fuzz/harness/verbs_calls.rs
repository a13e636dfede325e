//! Harness of the fuzz target `verbs_calls` (issue #21), shared by `fuzz/fuzz_targets/verbs_calls.rs` and the replay
//! test `crates/roce-verbs/tests/fuzz_verbs_calls.rs`.
//!
//! Arbitrary sequences of verbs calls through roce-verbs' Rust API on a simulated pair of devices
//! (`Context::sim_pair`, caller progress mode without a thread, so every run is deterministic): alloc / drop PD,
//! create / resize / drop CQ, register / deregister (also with invalidation) MRs, create / connect / `ready_ud` /
//! modify (any state, any mask) / drop QPs, post sends of every kind and receives on any QP naming any MR (of
//! another PD, deregistered, out of range, a wrong R_Key included), poll any CQ, drive progress — in any order, on
//! objects of either device. The input is a program of one-byte opcodes with operand bytes; a missing byte reads
//! as 0.
//!
//! Invariants (a violation panics): no panic in the library; errors come back as `Err`, never as a crash; every
//! work completion names a WR whose post returned `Ok` and that has not completed before (exactly once at most; a
//! QP that is destroyed may take its uncompleted WRs with it, as in libibverbs).

use std::collections::HashSet;

use roce_proto::{Lkey, Qpn};
use roce_verbs::*;

const MAX_OBJS: usize = 6;

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
    /// An index into a list of `n` (None if empty).
    fn pick(&mut self, n: usize) -> Option<usize> {
        let b = usize::from(self.u8());
        (n > 0).then(|| b % n)
    }
}

struct MrEnt {
    mr: Mr,
    buf: MrBuf,
    ctx: usize,
}

struct QpEnt {
    qp: Qp,
    ctx: usize,
    pd: Pd,
}

/// What one run did (the replay test checks that its seeds reach the library's paths).
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Calls that returned `Ok`.
    pub ok: u64,
    /// Calls that returned an error.
    pub err: u64,
    /// Work completions polled.
    pub completions: u64,
    /// Completions with an error status.
    pub wc_errors: u64,
}

struct World {
    ctx: [Context; 2],
    pds: Vec<(Pd, usize)>,
    cqs: Vec<(Cq, usize)>,
    mrs: Vec<MrEnt>,
    qps: Vec<QpEnt>,
    ahs: Vec<(Ah, usize)>,
    /// WRs posted (post returned Ok) and not completed yet.
    owed: HashSet<u64>,
    /// WRs that have completed.
    done: HashSet<u64>,
    next_id: u64,
    stats: Stats,
}

impl World {
    fn count<T, E>(&mut self, r: Result<T, E>) -> Option<T> {
        match r {
            Ok(v) => {
                self.stats.ok += 1;
                Some(v)
            }
            Err(_) => {
                self.stats.err += 1;
                None
            }
        }
    }

    fn poll(&mut self, i: usize) {
        let mut wc = [Wc::default(); 8];
        loop {
            let n = self.cqs[i].0.poll(&mut wc);
            for w in &wc[..n] {
                self.stats.completions += 1;
                self.stats.wc_errors += u64::from(w.status != WcStatus::Success);
                assert!(
                    !self.done.contains(&w.wr_id),
                    "WR {} completed twice: {w:?}",
                    w.wr_id
                );
                assert!(
                    self.owed.remove(&w.wr_id),
                    "completion for WR {} that was never posted: {w:?}",
                    w.wr_id
                );
                self.done.insert(w.wr_id);
            }
            if n < wc.len() {
                break;
            }
        }
    }

    fn step(&mut self, inp: &mut Input<'_>) {
        let op = inp.u8();
        let c = usize::from(op >> 7);
        match op & 0x7f {
            0..=3 => {
                if self.pds.len() < MAX_OBJS {
                    let r = self.ctx[c].alloc_pd();
                    if let Some(pd) = self.count(r) {
                        self.pds.push((pd, c));
                    }
                }
            }
            4..=7 => {
                let depth = u32::from(inp.u8()) % 80;
                if self.cqs.len() < MAX_OBJS {
                    let r = self.ctx[c].create_cq(depth, None, Moderation::default());
                    if let Some(cq) = self.count(r) {
                        self.cqs.push((cq, c));
                    }
                }
            }
            8..=11 => {
                let Some(p) = inp.pick(self.pds.len()) else {
                    return;
                };
                let len = usize::from(inp.u16()) % 20000;
                let access = AccessFlags(u32::from(inp.u8() & 0x1f));
                if self.mrs.len() < MAX_OBJS
                    && let Ok(buf) = MrBuf::new(len)
                {
                    let r = self.pds[p].0.reg_mr(&buf, access);
                    if let Some(mr) = self.count(r) {
                        let ctx = self.pds[p].1;
                        self.mrs.push(MrEnt { mr, buf, ctx });
                    }
                }
            }
            12..=17 => {
                let p = inp.pick(self.pds.len());
                let s = inp.pick(self.cqs.len());
                let r = inp.pick(self.cqs.len());
                let t = inp.u8();
                let cap = QpCap {
                    max_send_wr: u32::from(inp.u8() % 40),
                    max_recv_wr: u32::from(inp.u8() % 40),
                    max_send_sge: u32::from(t >> 6),
                    max_recv_sge: u32::from((t >> 4) & 3),
                    max_inline_data: u32::from(inp.u8()),
                };
                let (Some(p), Some(s), Some(r)) = (p, s, r) else {
                    return;
                };
                let qp_type = [QpType::Rc, QpType::Uc, QpType::Ud][usize::from(t & 3) % 3];
                if self.qps.len() < MAX_OBJS {
                    let pd = self.pds[p].0.clone();
                    let res =
                        pd.create_qp(qp_type, &self.cqs[s].0, &self.cqs[r].0, cap, t & 8 != 0);
                    if let Some(qp) = self.count(res) {
                        let ctx = self.pds[p].1;
                        self.qps.push(QpEnt { qp, ctx, pd });
                    }
                }
            }
            18..=23 => {
                // Connect two QPs to each other (RC/UC), or make a UD QP ready; any pair, misuse included.
                let (Some(i), Some(j)) = (inp.pick(self.qps.len()), inp.pick(self.qps.len()))
                else {
                    return;
                };
                let psn = Psn::new(u32::from(inp.u16()) << 8);
                let o = ConnectOpts::default();
                let ep = self.qps[j].qp.endpoint(psn);
                let r = if self.qps[i].qp.qp_type() == QpType::Ud {
                    self.qps[i].qp.ready_ud(0x11, psn)
                } else {
                    self.qps[i].qp.connect(&ep, psn, &o)
                };
                self.count(r);
            }
            24..=27 => {
                let Some(i) = inp.pick(self.qps.len()) else {
                    return;
                };
                let st = inp.u8();
                let mask = QpAttrMask(u32::from(inp.u16()) | u32::from(inp.u8()) << 16);
                let attr = QpAttr {
                    qp_state: [
                        QpState::Reset,
                        QpState::Init,
                        QpState::Rtr,
                        QpState::Rts,
                        QpState::Sqd,
                        QpState::Sqe,
                        QpState::Err,
                    ][usize::from(st % 7)],
                    port_num: st >> 6,
                    path_mtu: Mtu::Mtu1024,
                    dest_qp_num: Qpn::new(u32::from(inp.u16())),
                    qkey: 0x11,
                    timeout: st & 31,
                    max_rd_atomic: st & 7,
                    max_dest_rd_atomic: st & 15,
                    ..QpAttr::default()
                };
                let r = self.qps[i].qp.modify(&attr, mask);
                self.count(r);
            }
            28..=47 => self.post_send(inp),
            48..=59 => self.post_recv(inp),
            60..=79 => {
                if let Some(i) = inp.pick(self.cqs.len()) {
                    self.poll(i);
                }
            }
            80..=83 => {
                if let Some(i) = inp.pick(self.qps.len()) {
                    self.qps.swap_remove(i);
                }
            }
            84..=86 => {
                if let Some(i) = inp.pick(self.cqs.len()) {
                    self.poll(i);
                    self.cqs.swap_remove(i);
                }
            }
            87..=90 => {
                let Some(i) = inp.pick(self.mrs.len()) else {
                    return;
                };
                let how = inp.u8();
                let e = self.mrs.swap_remove(i);
                let r = if how & 1 == 0 {
                    e.mr.dereg()
                } else {
                    e.mr.dereg_invalidate()
                };
                if let Err((mr, _)) = r {
                    self.stats.err += 1;
                    self.mrs.push(MrEnt {
                        mr,
                        buf: e.buf,
                        ctx: e.ctx,
                    });
                } else {
                    self.stats.ok += 1;
                }
            }
            91..=92 => {
                if let Some(i) = inp.pick(self.pds.len()) {
                    self.pds.swap_remove(i);
                }
            }
            93..=95 => {
                let Some(i) = inp.pick(self.cqs.len()) else {
                    return;
                };
                let depth = u32::from(inp.u8());
                let r = self.cqs[i].0.resize(depth);
                self.count(r);
            }
            96..=99 => {
                let (Some(p), Some(q)) = (inp.pick(self.pds.len()), inp.pick(self.qps.len()))
                else {
                    return;
                };
                let ep = self.qps[q].qp.endpoint(Psn::new(0));
                let attr = AhAttr {
                    dgid: ep.gid,
                    dmac: ep.mac,
                    ..AhAttr::default()
                };
                let r = self.pds[p].0.create_ah(&attr);
                if let Some(ah) = self.count(r) {
                    let ctx = self.pds[p].1;
                    if self.ahs.len() == MAX_OBJS {
                        self.ahs.remove(0);
                    }
                    self.ahs.push((ah, ctx));
                }
            }
            100..=101 => {
                if let Some(i) = inp.pick(self.ahs.len()) {
                    self.ahs.swap_remove(i);
                }
            }
            _ => {
                for _ in 0..=(inp.u8() % 8) {
                    self.ctx[0].progress();
                    self.ctx[1].progress();
                }
            }
        }
    }

    fn sge(&mut self, inp: &mut Input<'_>) -> Sge {
        let m = inp.pick(self.mrs.len());
        let off = u64::from(inp.u16());
        let len = u32::from(inp.u16());
        match m {
            Some(m) => {
                let mr = &self.mrs[m].mr;
                let mut s = mr.sge(0, 0);
                s.addr = s.addr.wrapping_add(off % (mr.length() + 64));
                s.length = len % (mr.length() as u32 + 64).max(1);
                s
            }
            None => Sge {
                addr: off,
                length: len,
                lkey: Lkey(len),
            },
        }
    }

    fn post_send(&mut self, inp: &mut Input<'_>) {
        let Some(q) = inp.pick(self.qps.len()) else {
            return;
        };
        let kind = inp.u8();
        let flags = inp.u8();
        let sge = self.sge(inp);
        let (raddr, rkey) = match inp.pick(self.mrs.len()) {
            Some(m) => {
                let mr = &self.mrs[m].mr;
                let off = u64::from(inp.u16());
                (
                    mr.addr().wrapping_add(off),
                    if flags & 0x80 != 0 {
                        Rkey(mr.rkey().0 ^ 0x10)
                    } else {
                        mr.rkey()
                    },
                )
            }
            None => (u64::from(inp.u16()), Rkey(0)),
        };
        let id = self.next_id;
        self.next_id += 1;
        let op = match kind % 9 {
            0 => SendOp::Send,
            1 => SendOp::SendWithImm { imm: 1 },
            2 => SendOp::RdmaWrite {
                remote_addr: raddr,
                rkey,
            },
            3 => SendOp::RdmaWriteWithImm {
                remote_addr: raddr,
                rkey,
                imm: 2,
            },
            4 => SendOp::RdmaRead {
                remote_addr: raddr,
                rkey,
            },
            5 => SendOp::AtomicCmpAndSwp {
                remote_addr: raddr,
                rkey,
                compare: 0,
                swap: 1,
            },
            6 => SendOp::AtomicFetchAndAdd {
                remote_addr: raddr,
                rkey,
                add: 1,
            },
            7 => SendOp::SendWithInv {
                invalidate_rkey: rkey,
            },
            _ => SendOp::Send,
        };
        let sges = [sge];
        let inline: [&[u8]; 1] = [&[0x5a; 40]];
        let mut wr = SendWr::new(id, op, &sges[..usize::from(kind >> 7)]);
        wr.send_flags = SendFlags(u32::from(flags & 0x0f) & !SendFlags::INLINE.0);
        if flags & 0x10 != 0 {
            wr = wr.inline(&inline);
        }
        if let Some(a) = inp.pick(self.ahs.len()) {
            let remote = inp
                .pick(self.qps.len())
                .map_or(Qpn::new(0x11), |r| self.qps[r].qp.qpn());
            wr = wr.ud(UdDest {
                ah: self.ahs[a].0.handle(),
                remote_qpn: remote,
                remote_qkey: 0x11,
            });
        }
        let r = self.qps[q].qp.post_send(&[wr]);
        if self.count(r).is_some() {
            self.owed.insert(id);
        }
    }

    fn post_recv(&mut self, inp: &mut Input<'_>) {
        let Some(q) = inp.pick(self.qps.len()) else {
            return;
        };
        let n = usize::from(inp.u8() % 3);
        let sges = [self.sge(inp), self.sge(inp)];
        let id = self.next_id;
        self.next_id += 1;
        let r = self.qps[q].qp.post_recv(&[RecvWr {
            wr_id: id,
            sg_list: &sges[..n],
        }]);
        if self.count(r).is_some() {
            self.owed.insert(id);
        }
    }
}

/// Runs one input (see the module documentation). Panics when an invariant breaks.
pub fn run(data: &[u8]) {
    run_stats(data);
}

/// [`run`], returning what the run did.
pub fn run_stats(data: &[u8]) -> Stats {
    // Caller mode, no auto-progress thread, no stats endpoint: only the harness's calls move the devices.
    let rt = RuntimeConfig {
        auto_progress: None,
        stats_endpoint: StatsEndpoint::Off,
        ..RuntimeConfig::with_mode(ProgressMode::Caller)
    };
    let (a, b) = Context::sim_pair(rt).expect("sim pair");
    let mut w = World {
        ctx: [a, b],
        pds: Vec::new(),
        cqs: Vec::new(),
        mrs: Vec::new(),
        qps: Vec::new(),
        ahs: Vec::new(),
        owed: HashSet::new(),
        done: HashSet::new(),
        next_id: 1,
        stats: Stats::default(),
    };
    let mut inp = Input { data };
    let mut ops = 0;
    while !inp.data.is_empty() && ops < 1024 {
        ops += 1;
        w.step(&mut inp);
    }
    // Drain: progress and poll every CQ that is left.
    for _ in 0..64 {
        w.ctx[0].progress();
        w.ctx[1].progress();
        for i in 0..w.cqs.len() {
            w.poll(i);
        }
    }
    // Unused fields are part of what the harness keeps alive (QPs hold their PD; MRs their buffers).
    for q in &w.qps {
        let _ = (&q.pd, q.ctx);
    }
    for m in &w.mrs {
        let _ = (&m.buf, m.ctx);
    }
    for a in &w.ahs {
        let _ = a.1;
    }
    for c in &w.cqs {
        let _ = c.1;
    }
    w.stats
}
