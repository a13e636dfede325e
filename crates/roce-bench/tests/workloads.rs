//! Every workload runs briefly with every frame fully checked (whole-frame parse, ICRC, payload) and its data
//! verified. No timing is asserted.

use roce_bench::{Baseline, Loopback, Op, SendSide, Workload};

#[test]
fn send_side_every_post_list_checks_every_frame() {
    for op in [Op::Send64, Op::Write4k] {
        for pl in [1usize, 4, 8, 16, 32] {
            let mut w = SendSide::new(op, pl, 1);
            let msgs = w.sample(200).msgs + w.sample(300).msgs;
            assert_eq!(
                msgs,
                200u64.div_ceil(pl as u64) * pl as u64 + 300u64.div_ceil(pl as u64) * pl as u64
            );
            let s = w.link_stats().expect("null link");
            assert_eq!(s.tx_frames, msgs, "{op:?} pl {pl}: one frame per message");
            assert_eq!(s.full_checks, msgs, "{op:?} pl {pl}");
            assert_eq!(s.bad, 0, "{op:?} pl {pl}");
            assert_eq!(
                w.completions(),
                msgs / pl as u64,
                "{op:?} pl {pl}: one completion per post-list"
            );
            assert!(w.verified());
            assert_eq!(w.counters().retransmitted_pkts, 0);
        }
    }
}

#[test]
fn loopback_places_the_data() {
    for op in [Op::Send64, Op::Write4k] {
        for pl in [1usize, 16] {
            let mut w = Loopback::new(op, pl, 1);
            let s = w.sample(320);
            assert_eq!(s.msgs, 320);
            assert!(
                w.verify(),
                "{op:?} pl {pl}: responder MR holds the source pattern"
            );
            assert!(w.verified(), "{op:?} pl {pl}");
            let (req, resp) = w.counters();
            assert_eq!(req.retransmitted_pkts, 0);
            assert_eq!(resp.rcvd_pkts, 320, "{op:?} pl {pl}");
        }
    }
}

#[test]
fn baseline_runs() {
    let mut b = Baseline::new(Op::Write4k);
    let s = b.sample(100);
    assert_eq!(s.bytes, 409_600);
}
