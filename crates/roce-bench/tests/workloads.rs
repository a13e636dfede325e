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
fn gathered_frames_pass_the_header_check_unlinearised() {
    for op in [Op::Send64, Op::Write4k] {
        let mut w = SendSide::new(op, 16, 0);
        w.sample(256);
        let s = w.link_stats().expect("null link");
        assert_eq!((s.tx_frames, s.full_checks, s.bad), (256, 0, 0), "{op:?}");
        let gathered = if op == Op::Write4k { 256 } else { 0 };
        assert_eq!(
            s.gathered_frames, gathered,
            "{op:?}: payloads >= GATHER_MIN stay in the MR"
        );
        assert_eq!(s.linearized_bytes, 0, "{op:?}");
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

/// User-space payload copies per message, both ends (issue #9: zero copies on transmit where the link gathers, at
/// most one on receive). A 4 KiB WRITE's payload is gathered from the requester's MR (0 bytes read), crosses the
/// null link's "wire" (the one copy a kernel makes on a real link: the null link linearises to hand the frame to
/// the responder) and is written once, at its final offset, into the responder's MR. A 64 B SEND is below
/// `GATHER_MIN`: copied once into the frame, once into the receive buffer.
#[test]
fn payload_copies_per_message() {
    let msgs = 320u64;
    let mut w = Loopback::new(Op::Write4k, 16, 1);
    w.sample(msgs);
    let (req, resp) = w.payload_copies();
    assert_eq!(req.read_from_mr, 0, "transmit copies from the MR: {req:?}");
    assert_eq!(req.gathered, msgs * 4096, "{req:?}");
    assert_eq!(
        resp.written_to_mr,
        msgs * 4096,
        "one receive copy per byte: {resp:?}"
    );
    assert_eq!(resp.read_from_mr, 0, "{resp:?}");
    let link = w.link_stats().expect("null link");
    assert_eq!(link.linearized_bytes, msgs * 4096, "the wire's copy");

    let mut w = Loopback::new(Op::Send64, 16, 1);
    w.sample(msgs);
    let (req, resp) = w.payload_copies();
    assert_eq!((req.read_from_mr, req.gathered), (msgs * 64, 0), "{req:?}");
    assert_eq!(resp.written_to_mr, msgs * 64, "{resp:?}");
}
