//! `EngineConfig::first_qpn..=last_qpn` (issue #16, `docs/MULTIPROCESS.md` "QPN range"): QPs are numbered inside
//! it, consecutively from an offset drawn from the seed and wrapping at its end (`roce_proto::QpnRange`); it is
//! clamped so that QP0/QP1 stay special and every QPN of the device fits in 24 bits below 0xFFFFFF (the multicast
//! DestQP).

use roce_proto::*;

fn engine(first_qpn: u32, last: u8) -> Engine {
    Engine::new(EngineConfig {
        mac: [2, 0, 0, 0, 0, last],
        gids: vec![Gid::from_ipv4([192, 0, 2, last])],
        first_qpn,
        ..EngineConfig::default()
    })
}

/// A UD QP's attributes on `pd` and `cq` with `depth` WRs per queue.
fn ud_attr(pd: PdHandle, cq: CqHandle, depth: u32) -> QpInitAttr {
    QpInitAttr {
        qp_type: QpType::Ud,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    }
}

fn qp(e: &mut Engine) -> Qpn {
    let pd = e.alloc_pd().expect("pd");
    let cq = e.create_cq(16).expect("cq");
    let init = ud_attr(pd, cq, 4);
    e.create_qp(&init).expect("qp").0
}

#[test]
fn qps_are_numbered_inside_the_range_from_the_seeded_offset() {
    let mut e = engine(0x3_0000, 1);
    let r = e.qpn_range();
    assert_eq!((r.first(), r.last()), (0x3_0000, MAX_QPN));
    assert_eq!(
        (e.config().first_qpn, e.config().last_qpn),
        (0x3_0000, MAX_QPN)
    );
    let (a, b) = (qp(&mut e), qp(&mut e));
    assert_eq!((a, b), (r.nth(0), r.nth(1)));
    assert_eq!(a.value(), r.first() + r.offset());
    assert_eq!(r.index(b.value()), Some(1));
    // QP0/QP1 stay special, and every QPN fits in 24 bits (0xFFFFFF, the multicast DestQP, excluded).
    let mut low = engine(0, 3);
    assert_eq!(low.qpn_range().first(), 2);
    assert!(qp(&mut low).value() >= 2);
    let high = engine(u32::MAX, 4);
    let max_qp = high.config().device.max_qp;
    assert_eq!(high.config().first_qpn, MAX_QPN + 1 - max_qp);
    assert_eq!(high.qpn_range().last(), MAX_QPN);
}

/// A range exactly `max_qp` long (the tightest the clamp allows): numbering wraps from its last QPN to its first,
/// every QP gets its own QPN, each is found again by its number (packets, `query_qp`), and one more is refused.
#[test]
fn numbering_wraps_inside_a_range_of_max_qp() {
    let mut e = Engine::new(EngineConfig {
        seed: 3,
        first_qpn: 0x100,
        last_qpn: 0x100,
        device: DeviceAttr {
            max_qp: 8,
            ..DeviceAttr::default()
        },
        ..EngineConfig::default()
    });
    let r = e.qpn_range();
    assert_eq!(
        (r.first(), r.last()),
        (0x100, 0x107),
        "raised to hold max_qp QPNs"
    );
    let mut qpns: Vec<u32> = (0..8).map(|_| qp(&mut e).value()).collect();
    for (n, q) in qpns.iter().enumerate() {
        assert_eq!(
            e.query_qp(Qpn::new(*q)).map(|a| a.qp_state),
            Some(QpState::Reset),
            "QP {n} ({q:#x})"
        );
    }
    qpns.sort_unstable();
    assert_eq!(qpns, (0x100..=0x107).collect::<Vec<_>>());
    let pd = e.alloc_pd().expect("pd");
    let cq = e.create_cq(4).expect("cq");
    let init = ud_attr(pd, cq, 1);
    assert!(matches!(
        e.create_qp(&init),
        Err(CreateQpError::Resource(ResourceError::Exhausted("max_qp")))
    ));
}

/// A destroyed QP's number is not handed out again at once: fresh numbers come first, then the one freed longest
/// ago (rxe allocates QPNs cyclically too). The IB CM rejects a REQ from a QPN that a live connection at the peer
/// still uses as stale (IBTA Vol 1 ch. 12; Linux `cm_req_handler`), so a program that closes a connection and at
/// once opens the next one to the same peer (librdmacm's `rstream`: latency run, then bandwidth run) was refused
/// whenever its peer had not yet torn the first connection down.
#[test]
fn a_destroyed_qpn_is_not_reused_at_once() {
    let mut e = engine(0x3_0000, 5);
    let pd = e.alloc_pd().expect("pd");
    let cq = e.create_cq(16).expect("cq");
    let init = ud_attr(pd, cq, 1);
    let new = |e: &mut Engine| e.create_qp(&init).expect("qp").0;
    let a = new(&mut e);
    e.destroy_qp(a).expect("destroy");
    let b = new(&mut e);
    assert_ne!(a, b, "the freed QPN came back at once");
    assert_eq!(b, e.qpn_range().nth(1));
    // Once every fresh number is used (all but `a`'s are live), the slots freed longest ago come back first.
    let max_qp = e.config().device.max_qp;
    let mut live = vec![b];
    while live.len() < max_qp as usize - 1 {
        live.push(new(&mut e));
    }
    e.destroy_qp(live[5]).expect("destroy");
    e.destroy_qp(live[3]).expect("destroy");
    assert_eq!(new(&mut e), a);
    assert_eq!(new(&mut e), live[5]);
    assert_eq!(new(&mut e), live[3]);
}

fn seeded(seed: u64, first_qpn: u32, last_qpn: u32) -> Engine {
    Engine::new(EngineConfig {
        seed,
        first_qpn,
        last_qpn,
        ..EngineConfig::default()
    })
}

/// The user's problem (a crashed client restarted on the same address was rejected by its server's CM as a stale
/// connection, REJ reason 10, because it numbered its QPs from the same QPN as the dead one): engines of
/// successive processes, which differ in their seed, start their numbering at different QPNs, unshared (the whole
/// 24-bit space from 0x11) and inside one 65,536-QPN slot of a shared address. 64 seeds (64 processes one after
/// the other) give 64 different first QPNs; the same seed gives the same QPNs (simulations replay).
#[test]
fn engines_with_different_seeds_start_at_different_qpns() {
    for (first, last) in [
        (FIRST_QPN, MAX_QPN),
        (FIRST_QPN, 0xFFFF),
        (0x7_0000, 0x7_FFFF),
    ] {
        let mut firsts = Vec::new();
        for seed in 0..64 {
            let mut e = seeded(seed, first, last);
            let q = qp(&mut e).value();
            assert!(
                (first..=last).contains(&q),
                "{q:#x} outside {first:#x}..={last:#x}"
            );
            assert!((2..=MAX_QPN).contains(&q));
            let mut again = seeded(seed, first, last);
            assert_eq!(qp(&mut again).value(), q, "same seed, same first QPN");
            firsts.push(q);
        }
        firsts.sort_unstable();
        firsts.dedup();
        assert_eq!(
            firsts.len(),
            64,
            "first QPNs of 64 seeds in {first:#x}..={last:#x}"
        );
    }
}
