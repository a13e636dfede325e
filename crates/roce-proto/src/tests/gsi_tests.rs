//! QP 1 (the GSI, `crate::gsi`) on the simulated pair: MADs both ways through the ordinary UD path, the verbs that
//! must not reach it, the controlled Q_Key rule and the drops.

use roce_wire::mad::{GSI_QKEY, MAD_LEN};

use super::util::*;
use crate::*;

const GSI: Qpn = Qpn::new(1);

fn dest(ip: [u8; 4], mac: [u8; 6]) -> MadDest {
    MadDest {
        dgid: Gid::from_ipv4(ip),
        dmac: mac,
        qpn: GSI,
        sgid_index: 0,
    }
}

fn mad(seed: u8) -> [u8; MAD_LEN] {
    core::array::from_fn(|i| (i as u8).wrapping_mul(7) ^ seed)
}

#[test]
fn mads_travel_both_ways_as_ud_sends_on_qp1() {
    let mut p = Pair::new();
    let m = mad(0x3c);
    p.a.send_mad(&dest(IP_B, MAC_B), &m).unwrap();
    p.drive();
    // On the wire: one UD_SEND_ONLY to QP 1 with DETH Q_Key 0x8001_0000 and source QP 1.
    assert_eq!(p.captured.len(), 1);
    let f = &p.captured[0].2;
    let r = roce_wire::RoceRepr::parse(f).unwrap().repr;
    assert_eq!(r.bth.opcode.0, 0x64, "UD SEND only");
    assert_eq!(r.bth.dest_qp, GSI);
    assert_eq!(r.bth.pkey, 0xffff, "default P_Key");
    let deth = r.ext.deth.unwrap();
    assert_eq!((deth.qkey, deth.src_qp), (GSI_QKEY, GSI));
    let mut out = [0u8; MAD_LEN];
    let got = p.b.poll_mad(&mut out).expect("a MAD on B");
    assert_eq!(out, m);
    assert_eq!(got.src_gid, Gid::from_ipv4(IP_A));
    assert_eq!(got.src_qp, GSI);
    assert!(p.b.poll_mad(&mut out).is_none());
    // QP 1 is a QP like the others: listed and counted.
    assert!(p.b.qpns().any(|q| q == GSI));
    assert_eq!(p.b.qp_counters(GSI).unwrap().rdma_recvs, 1);
    assert_eq!(p.a.qp_counters(GSI).unwrap().rdma_sends, 1);
    assert_eq!(p.b.gsi_stats().unwrap().mads_received, 1);
    // More MADs than receive slots, drained in between: every slot is re-posted.
    for k in 0..100u8 {
        p.b.send_mad(&dest(IP_A, MAC_A), &mad(k)).unwrap();
        p.drive();
        let got = p.a.poll_mad(&mut out).expect("reply");
        assert_eq!((out, got.src_gid), (mad(k), Gid::from_ipv4(IP_B)));
    }
    assert_counters_add_up(&p.a);
    assert_counters_add_up(&p.b);
    // The GSI's CQ is not reported to the driver as one of its own.
    assert!(p.a.poll_ready_cq().is_none());
}

#[test]
fn qp1_belongs_to_the_engine_not_to_verbs() {
    let mut p = Pair::new();
    let at = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    assert_eq!(
        p.a.modify_qp(GSI, &at, QpAttrMask::STATE),
        Err(ModifyQpError::UnknownQp(GSI))
    );
    assert!(p.a.destroy_qp(GSI).is_err());
    assert_eq!(
        p.a.post_recv(GSI, &[]).unwrap_err().kind,
        PostErrorKind::UnknownQp
    );
    assert_eq!(
        p.a.post_send(GSI, &[]).unwrap_err().kind,
        PostErrorKind::UnknownQp
    );
    // The first QP a consumer creates keeps its number: the first of the engine's range, not QP 1's slot.
    let e = make_qp(&mut p.a, &ConnOpts::default());
    assert_eq!(e.qpn, p.a.qpn_range().nth(0));
    assert!(e.qpn.value() >= FIRST_QPN);
    // A MAD is 256 bytes.
    assert_eq!(
        p.a.send_mad(&dest(IP_B, MAC_B), &[0u8; 100]),
        Err(GsiError::BadLength(100))
    );
}

#[test]
fn an_engine_without_gsi_has_no_qp1() {
    let mut c = cfg(MAC_A, IP_A, 1);
    c.gsi = None;
    let mut e = Engine::new(c);
    assert_eq!(
        e.send_mad(&dest(IP_B, MAC_B), &[0u8; MAD_LEN]),
        Err(GsiError::NoGsi)
    );
    assert!(e.poll_mad(&mut [0u8; MAD_LEN]).is_none());
    assert!(e.qpns().next().is_none());
    assert_eq!(
        make_qp(&mut e, &ConnOpts::default()).qpn,
        e.qpn_range().nth(0)
    );
}

#[test]
fn controlled_qkeys_are_refused_to_ordinary_ud_qps() {
    let o = ConnOpts {
        qp_type: QpType::Ud,
        ..ConnOpts::default()
    };
    let mut p = Pair::new();
    let a = make_qp(&mut p.a, &o);
    let mut at = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qkey: GSI_QKEY,
        ..QpAttr::default()
    };
    let m = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY;
    assert!(matches!(
        p.a.modify_qp(a.qpn, &at, m),
        Err(ModifyQpError::InvalidValue { attr: "qkey", .. })
    ));
    assert_eq!(p.a.qp_info(a.qpn).unwrap().state, QpState::Reset);
    at.qkey = 0x1234;
    p.a.modify_qp(a.qpn, &at, m).unwrap();
    at.qp_state = QpState::Rtr;
    p.a.modify_qp(a.qpn, &at, QpAttrMask::STATE).unwrap();
    at.qp_state = QpState::Rts;
    p.a.modify_qp(a.qpn, &at, QpAttrMask::STATE | QpAttrMask::SQ_PSN)
        .unwrap();
    // Nor later (RTS→RTS with a Q_Key).
    at.qkey = 0x8000_0000;
    assert!(p.a.modify_qp(a.qpn, &at, QpAttrMask::QKEY).is_err());
    // A WR naming the GSI Q_Key goes out with the QP's own (0x1234): QP 1 drops it as a Q_Key mismatch.
    let mr = mr(&mut p.a, a.pd, 4096, |i| i as u8);
    let ah =
        p.a.create_ah(
            a.pd,
            &AhAttr {
                dgid: Gid::from_ipv4(IP_B),
                dmac: MAC_B,
                ..AhAttr::default()
            },
        )
        .unwrap();
    let sg = [sge(&mr, 0, MAD_LEN as u32)];
    let wr = SendWr::new(1, SendOp::Send, &sg).ud(UdDest {
        ah,
        remote_qpn: GSI,
        remote_qkey: GSI_QKEY,
    });
    p.a.post_send(a.qpn, &[wr]).unwrap();
    p.drive();
    assert_eq!(p.b.qp_counters(GSI).unwrap().drop_qkey_mismatch, 1);
    assert!(p.b.poll_mad(&mut [0u8; MAD_LEN]).is_none());
}

#[test]
fn datagrams_to_qp1_that_are_not_mads_are_counted_drops() {
    let mut p = Pair::new();
    p.a.send_mad(&dest(IP_B, MAC_B), &mad(1)).unwrap();
    p.transmit();
    let template = p.captured[0].2.clone();
    let ext = roce_wire::RoceRepr::parse(&template).unwrap().repr.ext;
    for len in [0usize, 100, 255, 257] {
        let f = craft(&template, 0x64, 0, ext, &vec![0xee; len]);
        p.b.handle_frame(p.now, &f);
    }
    p.drive();
    let mut out = [0u8; MAD_LEN];
    // Only the real MAD comes out; the short ones are counted, the long one is dropped by the UD responder.
    assert_eq!(p.b.poll_mad(&mut out).map(|r| r.src_qp), Some(GSI));
    assert_eq!(out, mad(1));
    assert!(p.b.poll_mad(&mut out).is_none());
    assert_eq!(p.b.gsi_stats().unwrap().drop_bad_len, 3);
    assert_eq!(p.b.qp_counters(GSI).unwrap().drop_ud_too_long, 1);
}
