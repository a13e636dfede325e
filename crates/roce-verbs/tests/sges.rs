//! Work requests with many SGEs (issue #16: rxe offers 32 per WR, UCX's UD QP asks for 6): SEND gathered from 32
//! SGEs into a receive scattered over 32, RDMA WRITE gathered from 32, RDMA READ scattered into 32, each repeated
//! past the depth of the rings (so the per-QP ring of spilled SGEs wraps), in both progress modes; 33 SGEs are
//! refused at `create_qp` and at post time, and the device reports `max_sge` 32.

use std::time::{Duration, Instant};

use roce_verbs::*;

/// `mod $name { caller, thread }`: runs `fn $name(mode)` once per progress mode.
macro_rules! both_modes {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn caller() {
                super::$name(roce_verbs::ProgressMode::Caller);
            }
            #[test]
            fn thread() {
                super::$name(roce_verbs::ProgressMode::Thread);
            }
        }
    )*};
}

both_modes!(
    thirty_two_sges_send_recv_write_read,
    thirty_three_sges_are_refused
);

const MR_LEN: usize = 64 * 1024;
/// Work requests per queue: smaller than the number of rounds, so the rings wrap.
const DEPTH: u32 = 4;
const ROUNDS: usize = 10;

struct End {
    cq: Cq,
    qp: Qp,
    mr: Mr,
    buf: MrBuf,
    _pd: Pd,
}

fn end(ctx: &Context, max_sge: u32) -> End {
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(64, None, Moderation::default()).expect("cq");
    let cap = QpCap {
        max_send_wr: DEPTH,
        max_recv_wr: DEPTH,
        max_send_sge: max_sge,
        max_recv_sge: max_sge,
        max_inline_data: 0,
    };
    let qp = pd
        .create_qp(QpType::Rc, &cq, &cq, cap, false)
        .expect("create_qp with 32 SGEs");
    assert_eq!(
        (qp.cap().max_send_sge, qp.cap().max_recv_sge),
        (max_sge, max_sge)
    );
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let buf = MrBuf::new(MR_LEN).expect("buf");
    let mr = pd.reg_mr(&buf, access).expect("mr");
    End {
        cq,
        qp,
        mr,
        buf,
        _pd: pd,
    }
}

fn pair(mode: ProgressMode) -> (End, End) {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(mode)).expect("pair");
    let (a, b) = (end(&ca, 32), end(&cb, 32));
    let (pa, pb) = (Psn::new(7), Psn::new(9000));
    let o = ConnectOpts::default();
    a.qp.connect(&b.qp.endpoint(pb), pa, &o).expect("connect a");
    b.qp.connect(&a.qp.endpoint(pa), pb, &o).expect("connect b");
    (a, b)
}

fn poll_one(cq: &Cq) -> Wc {
    let t0 = Instant::now();
    let mut wc = [Wc::default(); 1];
    loop {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no completion");
        std::thread::yield_now();
    }
}

/// 32 SGEs of unequal lengths (7, 14, .. 224 bytes; 3696 in all) with gaps between them, from `base`.
fn gather_list(mr: &Mr, base: u64) -> Vec<Sge> {
    (0..32u64)
        .map(|i| mr.sge(base + i * 256, 7 * (i as u32 + 1)))
        .collect()
}

/// 32 SGEs of 120 bytes (3840 in all), 8 bytes apart, from `base`: the boundaries fall elsewhere than the sender's.
fn scatter_list(mr: &Mr, base: u64) -> Vec<Sge> {
    (0..32u64).map(|i| mr.sge(base + i * 128, 120)).collect()
}

/// The bytes an SGE list names, in list order (the message it gathers).
fn gathered(buf: &[u8], mr: &Mr, list: &[Sge]) -> Vec<u8> {
    list.iter()
        .flat_map(|s| {
            let off = (s.addr - mr.addr()) as usize;
            buf[off..off + s.length as usize].iter().copied()
        })
        .collect()
}

/// Writes the test pattern of `seed` into `len` bytes of `buf` at `off` (through `MrBuf`'s copy accessors).
fn fill(buf: &MrBuf, off: usize, len: usize, seed: usize) {
    let v: Vec<u8> = (0..len)
        .map(|i| ((i * 31 + seed * 7) % 251) as u8)
        .collect();
    buf.write(off, &v).expect("write");
}

/// Zeroes `buf` from `off` to its end.
fn zero_from(buf: &MrBuf, off: usize) {
    buf.write(off, &vec![0u8; buf.len() - off]).expect("write");
}

fn thirty_two_sges_send_recv_write_read(mode: ProgressMode) {
    let (a, b) = pair(mode);
    let glist = gather_list(&a.mr, 0);
    let len: usize = glist.iter().map(|s| s.length as usize).sum();
    assert_eq!(len, 3696);
    for round in 0..ROUNDS {
        // SEND: gathered from 32 SGEs of a, scattered into a receive of 32 SGEs at b.
        fill(&a.buf, 0, 8192, round);
        zero_from(&b.buf, 16384);
        let slist = scatter_list(&b.mr, 16384);
        b.qp.post_recv(&[RecvWr {
            wr_id: round as u64,
            sg_list: &slist,
        }])
        .expect("post_recv of 32 SGEs");
        a.qp.post_send(&[SendWr::new(round as u64, SendOp::Send, &glist).signaled()])
            .expect("post_send of 32 SGEs");
        let wc = poll_one(&a.cq);
        assert_eq!((wc.status, wc.wr_id), (WcStatus::Success, round as u64));
        let wc = poll_one(&b.cq);
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (WcStatus::Success, WcOpcode::Recv, len as u32)
        );
        let sent = gathered(&a.buf.to_vec(), &a.mr, &glist);
        let got = gathered(&b.buf.to_vec(), &b.mr, &slist);
        assert_eq!(&got[..len], &sent[..], "SEND round {round}");
        assert!(
            got[len..].iter().all(|&x| x == 0),
            "nothing past the message"
        );

        // RDMA WRITE: gathered from 32 SGEs of a into one range of b.
        fill(&a.buf, 0, 8192, round + 100);
        let op = SendOp::RdmaWrite {
            remote_addr: b.mr.addr() + 40000,
            rkey: b.mr.rkey(),
        };
        a.qp.post_send(&[SendWr::new(1000 + round as u64, op, &glist).signaled()])
            .expect("post RDMA WRITE of 32 SGEs");
        let wc = poll_one(&a.cq);
        assert_eq!(
            (wc.status, wc.wr_id),
            (WcStatus::Success, 1000 + round as u64)
        );
        let sent = gathered(&a.buf.to_vec(), &a.mr, &glist);
        assert_eq!(
            &b.buf.to_vec()[40000..40000 + len],
            &sent[..],
            "WRITE round {round}"
        );

        // RDMA READ: one range of b scattered into 32 SGEs of a.
        fill(&b.buf, 50000, len, round + 200);
        zero_from(&a.buf, 16384);
        let rlist = gather_list(&a.mr, 16384);
        let op = SendOp::RdmaRead {
            remote_addr: b.mr.addr() + 50000,
            rkey: b.mr.rkey(),
        };
        a.qp.post_send(&[SendWr::new(2000 + round as u64, op, &rlist).signaled()])
            .expect("post RDMA READ of 32 SGEs");
        let wc = poll_one(&a.cq);
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len),
            (WcStatus::Success, WcOpcode::RdmaRead, len as u32)
        );
        let got = gathered(&a.buf.to_vec(), &a.mr, &rlist);
        assert_eq!(
            &got[..],
            &b.buf.to_vec()[50000..50000 + len],
            "READ round {round}"
        );
    }
    // A chain of WRs with 32, 1 and 32 SGEs fills the send queue: the spilled and the in-entry lists stay paired.
    fill(&a.buf, 0, 8192, 7);
    let one = [a.mr.sge(0, 16)];
    let mut wrs = Vec::new();
    for (i, list) in [&glist[..], &one[..], &glist[..]].into_iter().enumerate() {
        let op = SendOp::RdmaWrite {
            remote_addr: b.mr.addr() + 20000 * i as u64,
            rkey: b.mr.rkey(),
        };
        wrs.push(SendWr::new(3000 + i as u64, op, list).signaled());
    }
    a.qp.post_send(&wrs).expect("post chain");
    for i in 0..3 {
        assert_eq!(poll_one(&a.cq).status, WcStatus::Success, "chain WR {i}");
    }
    let sent = gathered(&a.buf.to_vec(), &a.mr, &glist);
    assert_eq!(&b.buf.to_vec()[..len], &sent[..]);
    assert_eq!(&b.buf.to_vec()[20000..20016], &a.buf.to_vec()[..16]);
    assert_eq!(&b.buf.to_vec()[40000..40000 + len], &sent[..]);
}

fn thirty_three_sges_are_refused(mode: ProgressMode) {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(mode)).expect("pair");
    assert_eq!(MAX_SGE, 32);
    assert_eq!(ca.query_device().max_sge, 32, "the device offers 32");
    // create_qp asking for 33 is refused, for either queue.
    let pd = ca.alloc_pd().expect("pd");
    let cq = ca.create_cq(16, None, Moderation::default()).expect("cq");
    for (s, r) in [(33, 1), (1, 33)] {
        let cap = QpCap {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: s,
            max_recv_sge: r,
            max_inline_data: 0,
        };
        let e = pd.create_qp(QpType::Rc, &cq, &cq, cap, false);
        assert!(e.is_err(), "33 SGEs granted: {e:?}");
    }
    // A 32-SGE QP: 33 SGEs in a WR are refused at post time, and nothing was posted.
    let (a, _b) = (end(&ca, 32), end(&cb, 32));
    let list: Vec<Sge> = (0..33u64).map(|i| a.mr.sge(i * 8, 8)).collect();
    assert_eq!(
        a.qp.post_send(&[SendWr::new(1, SendOp::Send, &list)]),
        Err(PostError::TooManySges)
    );
    assert_eq!(
        a.qp.post_recv(&[RecvWr {
            wr_id: 2,
            sg_list: &list
        }]),
        Err(PostError::TooManySges)
    );
    // A QP created for 4 SGEs refuses 5 (its ring has no room for spilled SGEs).
    let small = end(&ca, 4);
    assert_eq!(
        small
            .qp
            .post_send(&[SendWr::new(3, SendOp::Send, &list[..5])]),
        Err(PostError::TooManySges)
    );
    let mut wc = [Wc::default(); 4];
    assert_eq!(
        a.cq.poll(&mut wc) + small.cq.poll(&mut wc),
        0,
        "no completion"
    );
}
