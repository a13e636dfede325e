//! Property test: random mixes of work requests (every RC opcode, 0 B to 1 MiB, 1–16 SGEs, inline, unsignaled)
//! over random fault schedules (loss, Gilbert–Elliott burst loss, reorder, delay, duplication, corruption).
//! For every case:
//!
//! * every signaled send WR completes exactly once, in post order, with SUCCESS and the right opcode (and READ
//!   byte_len); every receive completes in order with the right length / immediate / invalidated R_Key;
//! * the responder's memory and the requester's READ/atomic destinations equal a sequential model's;
//! * no request on the wire names memory outside the remote MR its R_Key belongs to.
//!
//! Memory is partitioned so the model is exact under go-back-N (re-reads of sources, re-executed duplicate
//! READs): send sources are never written, READ sources are never written, atomic targets are used only by
//! atomics, and every READ/atomic has its own local destination.

use std::collections::HashMap;
use std::time::Duration;

use proptest::prelude::*;
use roce_proto::*;
use roce_tests::*;

const MIB: u64 = 1 << 20;
/// A: [0, SRC_END) send sources; [SRC_END, ..) READ/atomic destinations.
const SRC_END: u64 = MIB + 64 * 1024;
const A_LEN: u64 = SRC_END + 14 * MIB;
/// B: [0, 1 MiB) WRITE/SEND destinations; [1 MiB, 2 MiB) READ sources; atomic targets after.
const B_READ: u64 = MIB;
const B_ATOMIC: u64 = 2 * MIB;
const ATOMIC_SLOTS: u64 = 6;
const B_LEN: u64 = B_ATOMIC + 8 * ATOMIC_SLOTS;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Send,
    SendImm,
    SendInv,
    Write,
    WriteImm,
    Read,
    CmpSwap,
    FetchAdd,
}

#[derive(Clone, Debug)]
struct WrSpec {
    kind: Kind,
    len: u32,
    sges: usize,
    inline: bool,
    signaled: bool,
    /// Random bits for offsets and operands.
    r: u64,
    /// Whether a compare-and-swap uses the current value as its compare operand.
    cmp_hits: bool,
}

#[derive(Clone, Debug)]
struct Case {
    mtu: Mtu,
    /// Initiator depth (outstanding READ/atomic requests).
    max_rd_atomic: u8,
    wrs: Vec<WrSpec>,
    faults: FaultConfig,
    seed: u64,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Send),
        Just(Kind::SendImm),
        Just(Kind::SendInv),
        Just(Kind::Write),
        Just(Kind::WriteImm),
        Just(Kind::Read),
        Just(Kind::CmpSwap),
        Just(Kind::FetchAdd),
    ]
}

fn size() -> impl Strategy<Value = u32> {
    prop_oneof![
        6 => 0u32..300,
        3 => 300u32..8192,
        2 => 8192u32..131_072,
        1 => 131_072u32..=(1 << 20),
    ]
}

fn wr() -> impl Strategy<Value = WrSpec> {
    (
        kind(),
        size(),
        1usize..=16,
        any::<bool>(),
        any::<bool>(),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(kind, len, sges, inline, signaled, r, cmp_hits)| {
            let atomic = matches!(kind, Kind::CmpSwap | Kind::FetchAdd);
            let len = if atomic { 8 } else { len };
            let sges = if atomic {
                1
            } else {
                sges.min(len.max(1) as usize)
            };
            // Inline only for SEND/WRITE payloads that fit the device maximum.
            let inline = inline
                && len <= 256
                && !matches!(kind, Kind::Read | Kind::CmpSwap | Kind::FetchAdd);
            WrSpec {
                kind,
                len,
                sges,
                inline,
                signaled,
                r,
                cmp_hits,
            }
        })
}

fn faults() -> impl Strategy<Value = FaultConfig> {
    // Bursts are kept short (mean ≤ 2 frames, half lost): the Gilbert–Elliott state advances per frame, so on a
    // quiet QP a long burst spans many ACK timeouts and legitimately exhausts retry_cnt (IBTA: RETRY_EXC_ERR,
    // covered by S15) — a property test that expects success must not generate such schedules.
    let burst =
        prop::option::of(
            (0.001f64..0.02, 0.5f64..0.9).prop_map(|(gb, bg)| GilbertElliott {
                p_good_to_bad: gb,
                p_bad_to_good: bg,
                loss_good: 0.0,
                loss_bad: 0.5,
            }),
        );
    (
        (0.0f64..0.08, 0.0f64..0.08, 1u32..4),
        (0.0f64..0.04, 0.0f64..0.04, 0.0f64..0.03),
        burst,
    )
        .prop_map(
            |((loss, reorder, depth), (duplicate, corrupt, delay), burst_loss)| FaultConfig {
                loss,
                burst_loss,
                reorder,
                reorder_depth: depth,
                reorder_max_hold: Duration::from_micros(20),
                delay,
                delay_time: Duration::from_micros(30),
                duplicate,
                corrupt,
                ..FaultConfig::default()
            },
        )
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop_oneof![Just(Mtu::Mtu256), Just(Mtu::Mtu1024), Just(Mtu::Mtu4096)],
        prop::collection::vec(wr(), 1..10),
        faults(),
        any::<u64>(),
        prop_oneof![Just(1u8), Just(2), Just(16)],
    )
        .prop_map(|(mtu, wrs, faults, seed, max_rd_atomic)| Case {
            mtu,
            max_rd_atomic,
            wrs,
            faults,
            seed,
        })
}

/// Splits `[0, len)` into `n` consecutive non-empty pieces (one empty piece for len 0).
fn split(len: u32, n: usize, r: u64) -> Vec<u32> {
    if len == 0 {
        return vec![0];
    }
    let n = n.min(len as usize).max(1);
    let mut cuts: Vec<u32> = (1..n as u64)
        .map(|i| {
            1 + ((r.rotate_left(i as u32 * 7) ^ (i * 0x9E37)) % u64::from(len - 1).max(1)) as u32
        })
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    let mut prev = 0;
    for c in cuts.into_iter().chain([len]) {
        if c > prev {
            out.push(c - prev);
            prev = c;
        }
    }
    out
}

/// An expected receive completion: (wr_id, opcode, byte_len, immediate, invalidated R_Key).
type RecvExpect = (u64, WcOpcode, u32, Option<u32>, Option<Rkey>);

struct Expect {
    /// (wr_id, opcode, READ byte_len) of signaled send WRs in order.
    send_wcs: Vec<(u64, WcOpcode, Option<u32>)>,
    /// (wr_id, opcode, byte_len, imm, invalidated rkey) of receive completions in order.
    recv_wcs: Vec<RecvExpect>,
}

/// A type 2 memory window of `b`'s PD bound by `b`'s QP to 64 bytes of a fresh MR (remote write), before any
/// fault is set: its key, for a SEND with invalidate to name. The bind's completion is taken here.
fn bound_window(p: &mut Pair, b: End) -> Rkey {
    let target = p
        .e(1)
        .reg_mr(
            b.pd,
            vec![0u8; 64],
            AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND,
        )
        .unwrap();
    let mw = p.e(1).alloc_mw(b.pd, MwType::Type2).unwrap();
    let key = Rkey((mw.0 & !0xff) | ((mw.0 + 1) & 0xff));
    let bind = SendOp::BindMw {
        mw,
        rkey: key,
        mr: target.lkey,
        addr: target.addr,
        length: 64,
        access: AccessFlags::REMOTE_WRITE,
    };
    p.e(1)
        .post_send(b.qpn, &[SendWr::new(u64::MAX, bind, &[]).signaled()])
        .unwrap();
    p.drive();
    let w = poll_all(p.e(1), b.cq);
    assert_eq!(
        w.iter().map(|w| (w.wr_id, w.status)).collect::<Vec<_>>(),
        [(u64::MAX, WcStatus::Success)],
        "binding the window"
    );
    key
}

fn run(c: &Case) -> Result<(), TestCaseError> {
    let o = ConnOpts {
        mtu: c.mtu,
        max_rd_atomic: c.max_rd_atomic,
        sq_sig_all: false,
        ..ConnOpts::default()
    };
    let cfg = PairConfig {
        fault_seed: c.seed,
        ..PairConfig::default()
    };
    let mut p = Pair::with_config(cfg);
    let (a, b) = connect(&mut p, &o);
    let mut rng = c.seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let a_init: Vec<u8> = (0..A_LEN)
        .map(|i| if i < SRC_END { (next() >> 24) as u8 } else { 0 })
        .collect();
    let b_init: Vec<u8> = (0..B_LEN).map(|i| (i as u8) ^ 0xA5).collect();
    let ma = p.e(0).reg_mr(a.pd, a_init.clone(), ALL_ACCESS).unwrap();
    let mb = p.e(1).reg_mr(b.pd, b_init.clone(), ALL_ACCESS).unwrap();
    let mut remote: HashMap<u32, (u64, u64)> = HashMap::new();
    remote.insert(mb.rkey.0, (mb.addr, mb.length));
    let mut ma_model = a_init;
    let mut mb_model = b_init;
    let mut exp = Expect {
        send_wcs: Vec::new(),
        recv_wcs: Vec::new(),
    };
    let mut read_dst = SRC_END;

    // Build every WR (SGE lists first, they must outlive the post).
    let mut sg_lists: Vec<Vec<Sge>> = Vec::new();
    let mut ops: Vec<(SendOp, SendFlags)> = Vec::new();
    let mut recvs: Vec<(u64, Vec<Sge>)> = Vec::new();
    for (i, w) in c.wrs.iter().enumerate() {
        let id = i as u64 + 1;
        let len = w.len;
        let pieces = split(len, w.sges, w.r);
        let mut flags = SendFlags::EMPTY;
        if w.signaled {
            flags |= SendFlags::SIGNALED;
        }
        if w.inline {
            flags |= SendFlags::INLINE;
        }
        // Fence and solicited do not change the outcome; they exercise their paths.
        if (w.r >> 60) & 1 == 1 {
            flags |= SendFlags::FENCE;
        }
        if (w.r >> 61) & 1 == 1 {
            flags |= SendFlags::SOLICITED;
        }
        // Gather list from random places of the source region (for SEND/WRITE), and the bytes it names.
        let gather = |pieces: &[u32]| -> (Vec<Sge>, Vec<u8>) {
            let mut sg = Vec::new();
            let mut bytes = Vec::new();
            for (k, &pl) in pieces.iter().enumerate() {
                let off = (w.r.rotate_right(k as u32 * 5) ^ (k as u64 * 0x51_7CC1))
                    % (SRC_END - u64::from(pl));
                sg.push(sge(&ma, off, pl));
                bytes.extend_from_slice(&ma_model[off as usize..(off + u64::from(pl)) as usize]);
            }
            (sg, bytes)
        };
        let dst_off = (w.r >> 11) % (MIB - u64::from(len) + 1);
        let imm = (w.r >> 32) as u32;
        match w.kind {
            Kind::Send | Kind::SendImm | Kind::SendInv => {
                let (sg, bytes) = gather(&pieces);
                // The receive buffer: 1..3 SGEs over [dst_off, dst_off + len + slack).
                let slack = 16u64.min(MIB - dst_off - u64::from(len));
                let rpieces = split(len + slack as u32, 1 + (w.r % 3) as usize, w.r >> 3);
                let mut rsg = Vec::new();
                let mut at = dst_off;
                for pl in rpieces {
                    rsg.push(sge(&mb, at, pl));
                    at += u64::from(pl);
                }
                recvs.push((1000 + id, rsg));
                mb_model[dst_off as usize..dst_off as usize + len as usize].copy_from_slice(&bytes);
                let (op, wimm, inv) = match w.kind {
                    Kind::Send => (SendOp::Send, None, None),
                    Kind::SendImm => (SendOp::SendWithImm { imm }, Some(imm), None),
                    _ => {
                        // A fresh type 2 window at the responder, bound by its QP, whose key the SEND
                        // invalidates (only windows can be invalidated, IBTA Vol 1 §10.6.7).
                        let victim = bound_window(&mut p, b);
                        (
                            SendOp::SendWithInv {
                                invalidate_rkey: victim,
                            },
                            None,
                            Some(victim),
                        )
                    }
                };
                exp.recv_wcs
                    .push((1000 + id, WcOpcode::Recv, len, wimm, inv));
                sg_lists.push(sg);
                ops.push((op, flags));
                if w.signaled {
                    exp.send_wcs.push((id, WcOpcode::Send, None));
                }
            }
            Kind::Write | Kind::WriteImm => {
                let (sg, bytes) = gather(&pieces);
                mb_model[dst_off as usize..dst_off as usize + len as usize].copy_from_slice(&bytes);
                let op = if w.kind == Kind::Write {
                    SendOp::RdmaWrite {
                        remote_addr: mb.addr + dst_off,
                        rkey: mb.rkey,
                    }
                } else {
                    recvs.push((1000 + id, Vec::new()));
                    exp.recv_wcs
                        .push((1000 + id, WcOpcode::RecvRdmaWithImm, len, Some(imm), None));
                    SendOp::RdmaWriteWithImm {
                        remote_addr: mb.addr + dst_off,
                        rkey: mb.rkey,
                        imm,
                    }
                };
                sg_lists.push(sg);
                ops.push((op, flags));
                if w.signaled {
                    exp.send_wcs.push((id, WcOpcode::RdmaWrite, None));
                }
            }
            Kind::Read => {
                let src = B_READ + (w.r >> 13) % (MIB - u64::from(len) + 1);
                let mut sg = Vec::new();
                let mut at = read_dst;
                for pl in &pieces {
                    sg.push(sge(&ma, at, *pl));
                    at += u64::from(*pl) + 3; // discontiguous destination pieces
                }
                let mut s = src as usize;
                for (k, pl) in pieces.iter().enumerate() {
                    let d = sg[k].addr - ma.addr;
                    let v = mb_model[s..s + *pl as usize].to_vec();
                    ma_model[d as usize..d as usize + *pl as usize].copy_from_slice(&v);
                    s += *pl as usize;
                }
                read_dst = at + 8;
                sg_lists.push(sg);
                ops.push((
                    SendOp::RdmaRead {
                        remote_addr: mb.addr + src,
                        rkey: mb.rkey,
                    },
                    flags,
                ));
                if w.signaled {
                    exp.send_wcs.push((id, WcOpcode::RdmaRead, Some(len)));
                }
            }
            Kind::CmpSwap | Kind::FetchAdd => {
                let slot = B_ATOMIC + 8 * ((w.r >> 5) % ATOMIC_SLOTS);
                let s = slot as usize;
                let cur = u64::from_le_bytes(mb_model[s..s + 8].try_into().unwrap());
                let operand = w.r.rotate_left(17);
                let (op, new) = if w.kind == Kind::FetchAdd {
                    (
                        SendOp::AtomicFetchAndAdd {
                            remote_addr: mb.addr + slot,
                            rkey: mb.rkey,
                            add: operand,
                        },
                        cur.wrapping_add(operand),
                    )
                } else {
                    let compare = if w.cmp_hits { cur } else { cur ^ 1 };
                    let new = if compare == cur { operand } else { cur };
                    (
                        SendOp::AtomicCmpAndSwp {
                            remote_addr: mb.addr + slot,
                            rkey: mb.rkey,
                            compare,
                            swap: operand,
                        },
                        new,
                    )
                };
                mb_model[s..s + 8].copy_from_slice(&new.to_le_bytes());
                let d = read_dst as usize;
                ma_model[d..d + 8].copy_from_slice(&cur.to_le_bytes());
                sg_lists.push(vec![sge(&ma, read_dst, 8)]);
                read_dst += 16;
                ops.push((op, flags));
                if w.signaled {
                    exp.send_wcs.push((
                        id,
                        if w.kind == Kind::FetchAdd {
                            WcOpcode::FetchAdd
                        } else {
                            WcOpcode::CompSwap
                        },
                        None,
                    ));
                }
            }
        }
    }
    assert!(read_dst <= A_LEN);
    for (id, sg) in &recvs {
        p.e(1)
            .post_recv(
                b.qpn,
                &[RecvWr {
                    wr_id: *id,
                    sg_list: sg,
                }],
            )
            .unwrap();
    }
    let wrs: Vec<SendWr> = ops
        .iter()
        .zip(&sg_lists)
        .enumerate()
        .map(|(i, ((op, fl), sg))| SendWr::new(i as u64 + 1, *op, sg).flags(*fl))
        .collect();
    p.set_faults_all(c.faults);
    p.a().post_send(a.qpn, &wrs).unwrap();
    let done = p.drive_until(Duration::from_secs(120), |p| {
        p.a().qp_info(a.qpn).is_some_and(|i| i.sq_outstanding == 0)
    });
    p.drive();
    prop_assert!(done, "send queue never drained: {:?}", p.a().qp_info(a.qpn));

    // Completions.
    let wa = poll_all(p.a(), a.cq);
    let got: Vec<(u64, WcStatus, WcOpcode)> =
        wa.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
    let want: Vec<(u64, WcStatus, WcOpcode)> = exp
        .send_wcs
        .iter()
        .map(|(id, op, _)| (*id, WcStatus::Success, *op))
        .collect();
    prop_assert_eq!(
        got,
        want,
        "send completions; a counters {:?}; faults a {:?} b {:?}; last frames:\n{}",
        p.counters(0),
        p.nodes[0].link.inner().tx_stats(),
        p.nodes[1].link.inner().tx_stats(),
        p.dump(40)
    );
    for (w, (_, _, rl)) in wa.iter().zip(&exp.send_wcs) {
        if let Some(l) = rl {
            prop_assert_eq!(w.byte_len, *l, "READ byte_len");
        }
    }
    let wb = poll_all(p.b(), b.cq);
    let got: Vec<_> = wb
        .iter()
        .map(|w| {
            let imm = w.wc_flags.contains(WcFlags::WITH_IMM).then_some(w.imm_data);
            let inv = w
                .wc_flags
                .contains(WcFlags::WITH_INV)
                .then_some(w.invalidated_rkey);
            (w.wr_id, w.status, w.opcode, w.byte_len, imm, inv)
        })
        .collect();
    let want: Vec<_> = exp
        .recv_wcs
        .iter()
        .map(|(id, op, l, imm, inv)| (*id, WcStatus::Success, *op, *l, *imm, *inv))
        .collect();
    prop_assert_eq!(got, want, "receive completions");

    // Memory.
    let b_mem = p.e(1).mr_bytes(mb.lkey).unwrap().to_vec();
    let a_mem = p.e(0).mr_bytes(ma.lkey).unwrap().to_vec();
    if let Some(i) = (0..b_mem.len()).find(|&i| b_mem[i] != mb_model[i]) {
        return Err(TestCaseError::fail(format!(
            "responder memory differs from the model at offset {i}"
        )));
    }
    if let Some(i) = (0..a_mem.len()).find(|&i| a_mem[i] != ma_model[i]) {
        return Err(TestCaseError::fail(format!(
            "requester memory differs from the model at offset {i}"
        )));
    }

    // Bounds of every request on the wire.
    for c in &p.captured {
        prop_assert!(
            Pkt::parse(&c.frame).is_some_and(|k| k.icrc_ok),
            "every emitted frame parses with a valid ICRC"
        );
    }
    for k in p.sent_by(0).iter().filter(|k| k.is_request()) {
        let range = k
            .reth
            .map(|(va, rkey, len)| (va, rkey, u64::from(len)))
            .or(k.atomic.map(|(va, rkey, _, _)| (va, rkey, 8)));
        if let Some((va, rkey, len)) = range {
            let Some(&(addr, mlen)) = remote.get(&rkey) else {
                return Err(TestCaseError::fail(format!(
                    "request names unknown rkey {rkey:#x}"
                )));
            };
            prop_assert!(
                va >= addr && va + len <= addr + mlen,
                "request [{va:#x}, +{len}) outside MR [{addr:#x}, +{mlen})"
            );
        }
    }
    prop_assert_eq!(p.a().qp_info(a.qpn).unwrap().state, QpState::Rts);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        // 24 cases keep the debug suite fast; PROPTEST_CASES=N runs more.
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(24),
        max_shrink_iters: 64,
        ..ProptestConfig::default()
    })]

    #[test]
    fn random_work_requests_under_faults(c in case()) {
        run(&c)?;
    }
}

/// One hand-written case with every opcode and heavy faults, so a regression shows without proptest noise.
#[test]
fn every_opcode_under_heavy_faults() {
    let kinds = [
        Kind::Send,
        Kind::SendImm,
        Kind::SendInv,
        Kind::Write,
        Kind::WriteImm,
        Kind::Read,
        Kind::CmpSwap,
        Kind::FetchAdd,
    ];
    let wrs = kinds
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let atomic = matches!(kind, Kind::CmpSwap | Kind::FetchAdd);
            WrSpec {
                kind,
                len: if atomic {
                    8
                } else {
                    [70_001, 13, 0, 300_000, 4097, 250_000, 8, 8][i]
                },
                sges: if atomic { 1 } else { 1 + i * 2 },
                inline: kind == Kind::SendImm,
                signaled: i % 3 != 1,
                r: 0x1234_5678_9abc_def0u64.rotate_left(i as u32 * 9),
                cmp_hits: true,
            }
        })
        .collect();
    let faults = FaultConfig {
        loss: 0.08,
        reorder: 0.05,
        reorder_depth: 3,
        reorder_max_hold: Duration::from_micros(20),
        duplicate: 0.05,
        corrupt: 0.03,
        ..FaultConfig::default()
    };
    run(&Case {
        mtu: Mtu::Mtu1024,
        max_rd_atomic: 2,
        wrs,
        faults,
        seed: 77,
    })
    .unwrap();
}
