//! Robustness: arbitrary (ICRC-valid) frames aimed at live QPs never panic, never write outside registered memory
//! and leave the engines usable (STYLE: "a clear error or a counted drop — never a panic").

use proptest::prelude::*;

use super::util::*;
use crate::*;

#[derive(Clone, Debug)]
struct Shot {
    to_b: bool,
    opcode: u8,
    psn_off: i32,
    va_off: i64,
    rkey_ok: bool,
    dma_len: u32,
    aeth: u8,
    payload: usize,
    ack_req: bool,
}

fn shot() -> impl Strategy<Value = Shot> {
    (
        any::<bool>(),
        prop_oneof![
            0u8..0x18,
            0x20u8..0x2c,
            Just(0x64u8),
            Just(0x65u8),
            Just(0x81u8),
            any::<u8>()
        ],
        -4i32..8,
        prop_oneof![Just(0i64), -64i64..64, 65000i64..66000],
        any::<bool>(),
        prop_oneof![0u32..5000, Just(u32::MAX), Just((1 << 31) + 1)],
        prop_oneof![
            Just(0x1fu8),
            Just(0x60u8),
            Just(0x61u8),
            Just(0x62u8),
            Just(0x63u8),
            0x20u8..0x40,
            any::<u8>()
        ],
        prop_oneof![0usize..8, 1020usize..1030, 0usize..2100],
        any::<bool>(),
    )
        .prop_map(
            |(to_b, opcode, psn_off, va_off, rkey_ok, dma_len, aeth, payload, ack_req)| Shot {
                to_b,
                opcode,
                psn_off,
                va_off,
                rkey_ok,
                dma_len,
                aeth,
                payload,
                ack_req,
            },
        )
}

fn build(tmpl: &[u8], s: &Shot, psn: u32, va: u64, rkey: u32) -> Option<Vec<u8>> {
    use roce_wire::{
        AethRepr, AethSyndrome, AtomicAckEthRepr, AtomicEthRepr, DethRepr, ExtRepr, IethRepr,
        ImmDtRepr, Msn, Opcode, RethRepr,
    };
    let op = Opcode(s.opcode);
    let hs = op.ext_headers();
    let ext = ExtRepr {
        deth: hs.contains(roce_wire::ExtHeader::Deth).then_some(DethRepr {
            qkey: 0x1111_1111,
            src_qp: Qpn::new(0x11),
        }),
        feth: None,
        reth: hs.contains(roce_wire::ExtHeader::Reth).then_some(RethRepr {
            va,
            rkey,
            dma_len: s.dma_len,
        }),
        atomic_eth: hs
            .contains(roce_wire::ExtHeader::AtomicEth)
            .then_some(AtomicEthRepr {
                va,
                rkey,
                swap_add: 5,
                compare: 0,
            }),
        aeth: hs.contains(roce_wire::ExtHeader::Aeth).then_some(AethRepr {
            syndrome: AethSyndrome::from_byte(s.aeth),
            msn: Msn::new(1),
        }),
        atomic_ack_eth: hs
            .contains(roce_wire::ExtHeader::AtomicAckEth)
            .then_some(AtomicAckEthRepr { orig_value: 9 }),
        immdt: hs
            .contains(roce_wire::ExtHeader::ImmDt)
            .then_some(ImmDtRepr { imm_data: 1 }),
        ieth: hs
            .contains(roce_wire::ExtHeader::Ieth)
            .then_some(IethRepr { rkey }),
        cnp: hs
            .contains(roce_wire::ExtHeader::CnpBody)
            .then_some(roce_wire::CnpRepr),
    };
    if hs.contains(roce_wire::ExtHeader::Feth) {
        return None;
    }
    let payload = if op.info().is_some_and(|i| !i.has_payload()) {
        0
    } else {
        s.payload
    };
    let p = roce_wire::RoceRepr::parse(tmpl).ok()?;
    let mut r = p.repr;
    r.bth.opcode = op;
    r.bth.psn = Psn::new(psn);
    r.bth.ack_req = s.ack_req;
    r.bth.pad_count = if op.is_known() {
        ((4 - payload % 4) % 4) as u8
    } else {
        0
    };
    r.ext = ext;
    r.payload_len = payload;
    let mut out = vec![0u8; r.buffer_len()];
    r.emit(&mut out, |b| b.fill(0xC3)).ok()?;
    Some(out)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]
    #[test]
    fn arbitrary_valid_frames_never_panic_or_escape_mrs(shots in prop::collection::vec(shot(), 1..60)) {
        let mut p = Pair::new();
        let (a, b) = connect(&mut p, &ConnOpts { timeout: 8, ..ConnOpts::default() });
        let ma = mr(&mut p.a, a.pd, 65536, |_| 0);
        let mb = mr(&mut p.b, b.pd, 65536, |_| 0);
        // Guard MRs right behind: they must never change.
        let ga = mr(&mut p.a, a.pd, 4096, |_| 0x5A);
        let gb = mr(&mut p.b, b.pd, 4096, |_| 0x5A);
        for k in 0..4 {
            p.b.post_recv(b.qpn, &[RecvWr { wr_id: k, sg_list: &[sge(&mb, 0, 3000)] }]).unwrap();
        }
        // Some real traffic so the requester has outstanding work for responses to hit.
        let s = [sge(&ma, 0, 3000)];
        let s8 = [sge(&ma, 4000, 8)];
        p.a.post_send(a.qpn, &[
            SendWr::new(1, SendOp::Send, &s),
            SendWr::new(2, SendOp::RdmaRead { remote_addr: mb.addr, rkey: mb.rkey }, &s),
            SendWr::new(3, SendOp::AtomicFetchAndAdd { remote_addr: mb.addr + 8, rkey: mb.rkey, add: 1 }, &s8),
        ]).unwrap();
        p.drive();
        let ta = p.captured.iter().find(|c| c.1 == Dir::AtoB).unwrap().2.clone();
        let tb = p.captured.iter().find(|c| c.1 == Dir::BtoA).unwrap().2.clone();
        // More outstanding work for the shots to interfere with.
        p.a.post_send(a.qpn, &[
            SendWr::new(4, SendOp::RdmaRead { remote_addr: mb.addr, rkey: mb.rkey }, &s),
            SendWr::new(5, SendOp::Send, &s),
        ]).unwrap();
        p.transmit();
        for s in &shots {
            let (tmpl, epsn, m) = if s.to_b {
                (&ta, p.b.qp_info(b.qpn).unwrap().epsn, mb)
            } else {
                (&tb, p.a.qp_info(a.qpn).unwrap().una_psn, ma)
            };
            let psn = (epsn.value() as i64 + i64::from(s.psn_off)).rem_euclid(1 << 24) as u32;
            let va = (m.addr as i64 + s.va_off) as u64;
            let rkey = if s.rkey_ok { m.rkey.0 } else { m.rkey.0 ^ 0x100 };
            if let Some(f) = build(tmpl, s, psn, va, rkey) {
                if s.to_b { p.b.handle_frame(p.now, &f) } else { p.a.handle_frame(p.now, &f) }
            }
            p.drive_for(std::time::Duration::from_micros(50));
        }
        p.drive_for(std::time::Duration::from_secs(1));
        prop_assert!(p.a.mr_bytes(ga.lkey).unwrap().iter().all(|&x| x == 0x5A));
        prop_assert!(p.b.mr_bytes(gb.lkey).unwrap().iter().all(|&x| x == 0x5A));
        // Every posted send WR completed exactly once (success or error/flush).
        let wa = poll_all(&mut p.a, a.cq);
        let mut ids: Vec<u64> = wa.iter().filter(|w| w.opcode != WcOpcode::Recv).map(|w| w.wr_id).collect();
        ids.sort();
        prop_assert!(ids.windows(2).all(|w| w[0] != w[1]), "{:?}", wa);
        assert_counters_add_up(&p.a);
        assert_counters_add_up(&p.b);
    }
}
