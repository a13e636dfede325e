//! Two-engine tests: happy paths for every opcode and QP type, segmentation, retransmission, errors, counters.

use super::util::*;
use crate::*;

#[test]
fn rc_send_happy_path_multi_packet() {
    let mut p = Pair::new();
    let o = ConnOpts::default();
    let (a, b) = connect(&mut p, &o);
    let src = mr(&mut p.a, a.pd, 6000, |i| (i * 7) as u8);
    let dst = mr(&mut p.b, b.pd, 8192, |_| 0);
    p.b.post_recv(
        b.qpn,
        &[RecvWr {
            wr_id: 9,
            sg_list: &[sge(&dst, 0, 8192)],
        }],
    )
    .unwrap();
    let sg = [sge(&src, 0, 3000), sge(&src, 3000, 3000)];
    p.a.post_send(a.qpn, &[SendWr::new(1, SendOp::Send, &sg).signaled()])
        .unwrap();
    p.drive();
    let wa = poll_all(&mut p.a, a.cq);
    let wb = poll_all(&mut p.b, b.cq);
    assert_eq!(wa.len(), 1, "{wa:?}");
    assert_eq!(
        (wa[0].wr_id, wa[0].status, wa[0].opcode, wa[0].byte_len),
        (1, WcStatus::Success, WcOpcode::Send, 6000)
    );
    assert_eq!(wb.len(), 1);
    assert_eq!(
        (wb[0].wr_id, wb[0].status, wb[0].opcode, wb[0].byte_len),
        (9, WcStatus::Success, WcOpcode::Recv, 6000)
    );
    let got = p.b.mr_bytes(dst.lkey).unwrap();
    let want = p.a.mr_bytes(src.lkey).unwrap();
    assert_eq!(&got[..6000], want);
    // 6 packets at PMTU 1024: FIRST, 4×MIDDLE, LAST with consecutive PSNs from 100, AckReq on the last.
    let data: Vec<_> = p
        .captured
        .iter()
        .filter(|c| c.1 == Dir::AtoB)
        .map(|c| bth_of(&c.2))
        .collect();
    assert_eq!(
        data.iter().map(|d| d.0).collect::<Vec<_>>(),
        vec![0, 1, 1, 1, 1, 2]
    );
    assert_eq!(
        data.iter().map(|d| d.1).collect::<Vec<_>>(),
        (100..106).collect::<Vec<_>>()
    );
    assert_eq!(
        data.iter().map(|d| d.2).collect::<Vec<_>>(),
        vec![false, false, false, false, false, true]
    );
    assert_eq!(p.a.qp_info(a.qpn).unwrap().next_psn, Psn::new(106));
    assert_eq!(p.b.qp_info(b.qpn).unwrap().epsn, Psn::new(106));
    assert_eq!(p.b.counters().rdma_sends, 1);
}
