//! `EngineConfig::first_qpn` (issue #16, `docs/MULTIPROCESS.md`): QPs are numbered from it; it is clamped so that
//! QP0/QP1 stay special and every QPN of the device fits in 24 bits.

use roce_proto::*;

fn engine(first_qpn: u32, last: u8) -> Engine {
    Engine::new(EngineConfig {
        mac: [2, 0, 0, 0, 0, last],
        gids: vec![Gid::from_ipv4([192, 0, 2, last])],
        first_qpn,
        ..EngineConfig::default()
    })
}

fn qp(e: &mut Engine) -> Qpn {
    let pd = e.alloc_pd().expect("pd");
    let cq = e.create_cq(16).expect("cq");
    let init = QpInitAttr {
        qp_type: QpType::Ud,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    e.create_qp(&init).expect("qp").0
}

#[test]
fn qps_are_numbered_from_first_qpn() {
    let mut e = engine(0x3_0000, 1);
    assert_eq!(qp(&mut e), Qpn::new(0x3_0000));
    assert_eq!(qp(&mut e), Qpn::new(0x3_0001));
    let mut d = engine(FIRST_QPN, 2);
    assert_eq!(qp(&mut d), Qpn::new(FIRST_QPN));
    // QP0/QP1 stay special, and every QPN fits in 24 bits.
    let mut low = engine(0, 3);
    assert_eq!(qp(&mut low), Qpn::new(2));
    let high = engine(u32::MAX, 4);
    let max_qp = high.config().device.max_qp;
    assert_eq!(high.config().first_qpn, (1 << 24) - max_qp);
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
    let init = QpInitAttr {
        qp_type: QpType::Ud,
        pd,
        send_cq: cq,
        recv_cq: cq,
        cap: QpCap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        sq_sig_all: false,
    };
    let new = |e: &mut Engine| e.create_qp(&init).expect("qp").0;
    let a = new(&mut e);
    e.destroy_qp(a).expect("destroy");
    let b = new(&mut e);
    assert_ne!(a, b, "the freed QPN came back at once");
    assert_eq!(b, Qpn::new(0x3_0001));
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
