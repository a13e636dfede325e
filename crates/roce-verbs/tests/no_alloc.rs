//! The runtime's data path allocates nothing once warm, in both progress modes: the application posts RDMA WRITEs
//! through the QP rings and doorbells, passes drive two simulated ports (run-to-completion: in the posting and
//! polling thread itself, and in `get_event`; Thread mode: in the progress thread), publish completions into the CQ
//! rings (and, with a completion channel, fire moderated events), and the application polls. A counting
//! `#[global_allocator]`, armed for every thread of the process during the measured phase, must see no allocation,
//! reallocation or deallocation. Covers one QP, four QPs sharing one CQ with interleaved posts, and completion-event
//! mode (`req_notify` + `get_event` per event), WRs of 32 SGEs (their SGEs travel through the QP's ring of spilled
//! SGEs), streams of posts on one QP (doorbell batching holds them back and sends them together), and a pair over UDP on loopback, whose idle drivers block on the sockets' readiness.
//!
//! One `#[test]` only, so no other test thread runs while the counter is armed.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use roce_verbs::*;

struct Counting;

static ARMED: AtomicBool = AtomicBool::new(false);
static EVENTS: AtomicU64 = AtomicU64::new(0);

/// The call stack of the first allocator call in the measured phase, for the failure message.
static FIRST: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

thread_local! {
    /// Set while this thread captures `FIRST` (the capture allocates; those calls are not the data path's).
    static CAPTURING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn note() {
    if !ARMED.load(Ordering::Relaxed) || CAPTURING.with(|c| c.get()) {
        return;
    }
    if EVENTS.fetch_add(1, Ordering::Relaxed) == 0 {
        CAPTURING.with(|c| c.set(true));
        let bt = std::backtrace::Backtrace::force_capture().to_string();
        let name = std::thread::current().name().unwrap_or("?").to_owned();
        if let Ok(mut f) = FIRST.lock() {
            *f = Some(format!("thread {name}:\n{bt}"));
        }
        CAPTURING.with(|c| c.set(false));
    }
}

// SAFETY: every method forwards to `System` unchanged; the bookkeeping touches two atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note();
        // SAFETY: forwarded contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

struct Side {
    qps: Vec<Qp>,
    cq: Cq,
    mr: Mr,
    /// SGEs per WRITE.
    nsge: usize,
    _buf: MrBuf,
    _pd: Pd,
}

fn side(ctx: &Context, nqp: usize, chan: Option<&Arc<CompChannel>>, moder: Moderation) -> Side {
    side_sges(ctx, nqp, chan, moder, 1)
}

/// [`side`] whose WRITEs gather their 64 bytes from `nsge` SGEs (at most 32; more than 4 travel through the QP's
/// ring of spilled SGEs).
fn side_sges(
    ctx: &Context,
    nqp: usize,
    chan: Option<&Arc<CompChannel>>,
    moder: Moderation,
    nsge: usize,
) -> Side {
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(512, chan, moder).expect("cq");
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 1,
        max_send_sge: nsge as u32,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qps = (0..nqp)
        .map(|_| pd.create_qp(QpType::Rc, &cq, &cq, cap, false).expect("qp"))
        .collect();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let buf = MrBuf::new(4096).expect("buf");
    let mr = pd.reg_mr(&buf, access).expect("mr");
    Side {
        qps,
        cq,
        mr,
        nsge,
        _buf: buf,
        _pd: pd,
    }
}

/// Runs `rounds` rounds of `burst` 64-byte WRITEs per QP, one per post, the last of each QP signaled (posts
/// interleaved across QPs), waiting for all completions of a round before the next; with `chan`, each round also
/// arms the CQ and waits for its event.
fn run(a: &Side, b: &Side, rounds: usize, burst: usize, chan: Option<&CompChannel>) {
    let mut wcs = [Wc::default(); 16];
    let n = a.qps.len();
    for r in 0..rounds {
        if chan.is_some() {
            a.cq.req_notify();
        }
        for k in 0..burst {
            for qp in &a.qps {
                let piece = (64 / a.nsge) as u32;
                let mut sges = [a.mr.sge(0, piece); 32];
                for (i, s) in sges.iter_mut().enumerate() {
                    *s = a.mr.sge(i as u64 * u64::from(piece), piece);
                }
                let mut wr = SendWr::new(
                    r as u64,
                    SendOp::RdmaWrite {
                        remote_addr: b.mr.addr(),
                        rkey: b.mr.rkey(),
                    },
                    &sges[..a.nsge],
                );
                if k + 1 == burst {
                    wr = wr.signaled();
                }
                qp.post_send(&[wr]).expect("post");
            }
        }
        if let Some(c) = chan {
            let ev = c.get_event(Duration::from_secs(5));
            assert_eq!(ev, Some(a.cq.id()), "event of round {r}");
        }
        let t0 = Instant::now();
        let mut got = 0;
        while got < n {
            let k = a.cq.poll(&mut wcs);
            for wc in &wcs[..k] {
                assert_eq!(wc.status, WcStatus::Success);
            }
            got += k;
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "round {r}: {got}/{n}"
            );
            if k == 0 {
                std::thread::yield_now();
            }
        }
    }
}

fn connect(a: &Side, b: &Side) {
    let o = ConnectOpts::default();
    for (i, (qa, qb)) in a.qps.iter().zip(&b.qps).enumerate() {
        let (pa, pb) = (Psn::new(100 + i as u32), Psn::new(9000 + i as u32));
        qa.connect(&qb.endpoint(pb), pa, &o).expect("connect a");
        qb.connect(&qa.endpoint(pa), pb, &o).expect("connect b");
    }
}

/// Warm up, then count allocations over the measured rounds.
fn measure(name: &str, a: &Side, b: &Side, burst: usize, chan: Option<&CompChannel>) {
    let name = format!("{:?} progress, {name}", a.cq.context().progress_mode());
    run(a, b, 300, burst, chan);
    EVENTS.store(0, Ordering::SeqCst);
    ARMED.store(true, Ordering::SeqCst);
    run(a, b, 1000, burst, chan);
    ARMED.store(false, Ordering::SeqCst);
    let events = EVENTS.load(Ordering::SeqCst);
    let first = FIRST.lock().map(|mut f| f.take()).unwrap_or(None);
    assert_eq!(
        events,
        0,
        "{name}: {events} allocator calls in the steady state; the first from {}",
        first.unwrap_or_default()
    );
}

#[test]
fn runtime_data_path_allocates_nothing_once_warm() {
    for mode in [ProgressMode::Caller, ProgressMode::Thread] {
        both_paths(mode);
    }
}

fn both_paths(mode: ProgressMode) {
    // Long spin/yield phases so no driver parks between rounds (parking is not the data path and the doorbell wake is
    // covered by the runtime tests).
    let rt = RuntimeConfig {
        yield_for: Duration::from_secs(60),
        ..RuntimeConfig::with_mode(mode)
    };
    let (ca, cb) = Context::sim_pair(rt.clone()).expect("pair");

    let (a, b) = (
        side(&ca, 1, None, Moderation::default()),
        side(&cb, 1, None, Moderation::default()),
    );
    connect(&a, &b);
    measure("one QP", &a, &b, 1, None);

    let (a4, b4) = (
        side(&ca, 4, None, Moderation::default()),
        side(&cb, 4, None, Moderation::default()),
    );
    connect(&a4, &b4);
    measure("four QPs", &a4, &b4, 1, None);

    let (a32, b32) = (
        side_sges(&ca, 2, None, Moderation::default(), 32),
        side_sges(&cb, 2, None, Moderation::default(), 32),
    );
    connect(&a32, &b32);
    measure("two QPs, 32 SGEs per WR", &a32, &b32, 4, None);

    let chan = Arc::new(CompChannel::new());
    let moder = Moderation {
        count: 4,
        period: Duration::from_millis(50),
        adaptive: false,
    };
    let (ae, be) = (
        side(&ca, 4, Some(&chan), moder),
        side(&cb, 4, None, Moderation::default()),
    );
    connect(&ae, &be);
    measure("completion events", &ae, &be, 1, Some(&chan));
    let st = ca.runtime_stats();
    let passes = match mode {
        ProgressMode::Caller => &st.caller_passes,
        ProgressMode::Thread => &st.thread_passes,
    };
    assert!(passes.load(Ordering::Relaxed) > 1000, "{mode:?}: {st:?}");

    // Doorbell batching: streams of 16 posts on one QP; over a segment with 100 µs of propagation the batching
    // window is 50 µs, so Caller mode holds posts back and sends them together.
    let sim = roce_link::SimConfig {
        propagation: Duration::from_micros(100),
        ..roce_link::SimConfig::default()
    };
    let (cs, ds) = Context::sim_pair_with(rt.clone(), sim, Ok).expect("pair");
    let (a_s, b_s) = (
        side(&cs, 1, None, Moderation::default()),
        side(&ds, 1, None, Moderation::default()),
    );
    connect(&a_s, &b_s);
    measure("streams of posts", &a_s, &b_s, 16, None);
    let held = cs.runtime_stats().batched_posts.load(Ordering::Relaxed);
    if mode == ProgressMode::Caller {
        assert!(held > 1000, "the batching path ran: {held} posts held back");
    }

    // UDP on loopback: every link has a receive descriptor, so idle drivers block in `ppoll` on the sockets and their
    // eventfd (the target's progress / auto-progress thread; in Caller mode also `get_event`) between frames.
    let net = match mode {
        ProgressMode::Caller => 70,
        ProgressMode::Thread => 71,
    };
    let (cu, du) = (udp_ctx(&rt, net, 1), udp_ctx(&rt, net, 2));
    let chan = Arc::new(CompChannel::new());
    let (au, bu) = (
        side(&cu, 1, Some(&chan), Moderation::default()),
        side(&du, 1, None, Moderation::default()),
    );
    connect(&au, &bu);
    let waits = |c: &Context| c.runtime_stats().readiness_waits.load(Ordering::Relaxed);
    let before = waits(&du);
    measure("UDP loopback, completion events", &au, &bu, 1, Some(&chan));
    assert!(
        waits(&du) > before,
        "the target's thread waited on readiness: {:?}",
        du.runtime_stats()
    );
}

/// Device `last` (127.0.`net`.`last`) of a pair over UDP on loopback.
fn udp_ctx(rt: &RuntimeConfig, net: u8, last: u8) -> Context {
    let ip = std::net::Ipv4Addr::new(127, 0, net, last);
    let mac = [2, 0, 0, 0, 0x11, last];
    let cfg = EngineConfig {
        mac,
        gids: vec![Gid::from_ipv4(ip.octets())],
        seed: u64::from(last),
        ..EngineConfig::default()
    };
    Context::open(cfg, rt.clone(), move || {
        let mut u = roce_link::UdpConfig::new(std::net::IpAddr::V4(ip));
        u.local_mac = mac;
        u.peer_mac = [2, 0, 0, 0, 0x11, 3 - last];
        Ok(Box::new(roce_link::UdpLink::bind(u)?) as SendLink)
    })
    .expect("open udp device")
}
