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
