//! Issue #22 (soundness of the application's view of registered memory): each test here failed before its fix.
//! Run item 1 in release mode too (`cargo test -p roce-verbs --release --test soundness`): the stale read it guards
//! against appeared only with optimisation.

use std::time::{Duration, Instant};

use roce_verbs::*;

struct End {
    _ctx: Context,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
    buf: MrBuf,
}

fn end(ctx: &Context, len: usize) -> End {
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(64, None, Moderation::default()).expect("cq");
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(QpType::Rc, &cq, &cq, cap, false).expect("qp");
    let buf = MrBuf::new(len).expect("buf");
    let mr = pd
        .reg_mr(&buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
        .expect("mr");
    End {
        _ctx: ctx.clone(),
        _pd: pd,
        cq,
        qp,
        mr,
        buf,
    }
}

fn pair(mode: ProgressMode) -> (End, End) {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(mode)).expect("pair");
    let (a, b) = (end(&ca, 64), end(&cb, 64));
    let o = ConnectOpts::default();
    let (pa, pb) = (Psn::new(1), Psn::new(7000));
    a.qp.connect(&b.qp.endpoint(pb), pa, &o).expect("connect a");
    b.qp.connect(&a.qp.endpoint(pa), pb, &o).expect("connect b");
    (a, b)
}

fn wait_one(cq: &Cq) -> Wc {
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

/// Posts a receive of `rx`'s byte 0, has `tx` send one byte 0x5a into it, and waits for both completions.
fn receive_0x5a(tx: &End, rx: &End) {
    let rsge = [rx.mr.sge(0, 1)];
    rx.qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &rsge,
        }])
        .expect("post_recv");
    let data = [0x5au8];
    let parts: [&[u8]; 1] = [&data];
    let wr = SendWr::new(2, SendOp::Send, &[]).inline(&parts).signaled();
    tx.qp.post_send(&[wr]).expect("post_send");
    assert_eq!(wait_one(&tx.cq).status, WcStatus::Success);
    let wc = wait_one(&rx.cq);
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Recv));
}

fn byte0(buf: &MrBuf) -> u8 {
    let mut b = [0u8; 1];
    buf.read(0, &mut b).expect("in range");
    b[0]
}

/// Item 1, the scenario: a function that holds the application's view of the buffer across a receive into
/// it reads byte 0, posts the receive, waits for its `Success` and reads byte 0 again. Before the fix the view was
/// `&[u8]` (`MrBuf: Deref`), and in release builds the second read returned the stale 0x00 while memory held 0x5a
/// (the compiler may assume bytes behind a live `&[u8]` do not change). Now a safe view is the `MrBuf` itself, whose
/// reads are copies that read memory afresh; taking a `&[u8]` needs `unsafe` (compile_fail doctests on `MrBuf`).
#[inline(never)]
fn byte0_across_a_receive(view: &MrBuf, tx: &End, rx: &End) -> (u8, u8) {
    let before = byte0(view);
    receive_0x5a(tx, rx);
    (before, byte0(view))
}

#[test]
fn item1_the_view_reads_what_the_receive_wrote() {
    for mode in [ProgressMode::Caller, ProgressMode::Thread] {
        let (a, b) = pair(mode);
        let (before, after) = byte0_across_a_receive(&b.buf, &a, &b);
        assert_eq!(before, 0);
        assert_eq!(
            after, 0x5a,
            "{mode:?}: stale read of a byte the receive wrote"
        );
    }
}

/// Item 1 with an exclusive view: the same scenario through `&mut MrBuf` (before the fix `&mut [u8]` from the
/// then-safe `as_mut_slice`, which read the stale 0x00 in release builds as well).
#[inline(never)]
fn byte0_across_a_receive_mut(view: &mut MrBuf, tx: &End, rx: &End) -> (u8, u8) {
    let before = byte0(view);
    receive_0x5a(tx, rx);
    (before, byte0(view))
}

#[test]
fn item1_the_exclusive_view_reads_what_the_receive_wrote() {
    for mode in [ProgressMode::Caller, ProgressMode::Thread] {
        let (a, mut b) = pair(mode);
        // The buffer leaves `b` so that `b` can be shared while the view is exclusive (the MR keeps the memory).
        let mut buf = std::mem::replace(&mut b.buf, MrBuf::new(0).expect("empty"));
        let (before, after) = byte0_across_a_receive_mut(&mut buf, &a, &b);
        assert_eq!(before, 0);
        assert_eq!(
            after, 0x5a,
            "{mode:?}: stale read of a byte the receive wrote"
        );
    }
}

/// Item 2: `Mr` is `Clone + Send + Sync`, so threads may copy into and out of one MR at once without any engine
/// involvement. Each `Mr::write` / `Mr::read` is one copy that never interleaves with another on the same MR: a
/// reader sees a whole pattern, never a mix of two writers' bytes (before the fix the copies raced).
#[test]
fn item2_concurrent_mr_copies_do_not_interleave() {
    const LEN: usize = 1 << 16;
    let (ctx, _) = Context::sim_pair(RuntimeConfig::default()).expect("pair");
    let pd = ctx.alloc_pd().expect("pd");
    let buf = MrBuf::new(LEN).expect("buf");
    let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).expect("mr");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = [0x11u8, 0x22]
        .into_iter()
        .map(|b| {
            let (mr, stop) = (mr.clone(), stop.clone());
            std::thread::spawn(move || {
                let pattern = vec![b; LEN];
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    mr.write(0, &pattern).expect("write");
                }
            })
        })
        .collect();
    let t0 = Instant::now();
    let mut mixed = 0;
    while t0.elapsed() < Duration::from_millis(500) {
        let v = mr.read(0, LEN).expect("read");
        if v.iter().any(|&x| x != v[0]) {
            mixed += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.join().expect("writer");
    }
    assert_eq!(mixed, 0, "reads that saw two writers' bytes at once");
}

/// Item 3: after a successful `dereg` no clone of the `Mr` reaches the memory (for `reg_mr_raw` the caller may have
/// freed it already); before the fix `read` and `write` kept working.
#[test]
fn item3_no_copies_through_a_deregistered_mr() {
    let (ctx, _) = Context::sim_pair(RuntimeConfig::default()).expect("pair");
    let pd = ctx.alloc_pd().expect("pd");
    let buf = MrBuf::new(64).expect("buf");
    let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).expect("mr");
    let clone = mr.clone();
    clone.write(0, b"abc").expect("write while registered");
    assert_eq!(clone.read(0, 3).expect("read while registered"), b"abc");
    mr.dereg().map_err(|(_, e)| e).expect("dereg");
    assert!(matches!(clone.read(0, 3), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        clone.write(0, b"x"),
        Err(Error::InvalidArgument(_))
    ));
}

/// Item 3: `Mr::write` needs LOCAL_WRITE (a raw registration without it may be read-only memory).
#[test]
fn item3_mr_write_needs_local_write() {
    let (ctx, _) = Context::sim_pair(RuntimeConfig::default()).expect("pair");
    let pd = ctx.alloc_pd().expect("pd");
    let buf = MrBuf::new(64).expect("buf");
    let mr = pd.reg_mr(&buf, AccessFlags::REMOTE_READ).expect("mr");
    assert!(matches!(mr.write(0, b"x"), Err(Error::InvalidArgument(_))));
    assert_eq!(mr.read(0, 1).expect("reading is allowed"), [0]);
}
