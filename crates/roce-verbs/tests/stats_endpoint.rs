//! The stats endpoint (`roce_verbs::endpoint`): a runtime serves its devices' live counters on a Unix socket for
//! `rocev2 stat`, and removes the socket when its last device goes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use roce_verbs::endpoint::{self, PROTO};
use roce_verbs::*;
use serde_json::{Value, json};

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn ask(path: &Path, req: Value) -> Value {
    let v = endpoint::query(path, &req, Duration::from_secs(5)).expect("query");
    assert_eq!(v["proto"], PROTO, "{v}");
    assert_eq!(v["v"], 1, "{v}");
    assert_eq!(v["pid"], std::process::id(), "{v}");
    v
}

#[test]
fn endpoint_serves_live_counters_and_qp_dumps_then_goes() {
    let dir = scratch("endpoint");
    let rt = RuntimeConfig {
        stats_endpoint: StatsEndpoint::Dir(dir.clone()),
        ..RuntimeConfig::default()
    };
    let (ca, cb) = Context::sim_pair(rt).expect("pair");
    let path = ca.stats_endpoint().expect("an endpoint");
    assert_eq!(cb.stats_endpoint(), Some(path.clone()), "one per runtime");
    assert!(path.starts_with(&dir), "{}", path.display());

    // Two connected RC QPs; 20 SENDs of 1000 bytes from a to b, in chains of 4 (5 doorbells).
    let cap = QpCap {
        max_send_wr: 32,
        max_recv_wr: 32,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let side = |c: &Context| {
        let pd = c.alloc_pd().expect("pd");
        let cq = c.create_cq(64, None, Moderation::default()).expect("cq");
        let qp = pd.create_qp(QpType::Rc, &cq, &cq, cap, false).expect("qp");
        let buf = MrBuf::new(4096).expect("buf");
        let mr = pd.reg_mr(&buf, AccessFlags::LOCAL_WRITE).expect("mr");
        (pd, cq, qp, buf, mr)
    };
    let (a, b) = (side(&ca), side(&cb));
    let o = ConnectOpts::default();
    a.2.connect(&b.2.endpoint(Psn::new(7)), Psn::new(1), &o)
        .expect("connect");
    b.2.connect(&a.2.endpoint(Psn::new(1)), Psn::new(7), &o)
        .expect("connect");
    let rsge = [b.4.sge(0, 1000)];
    for i in 0..20 {
        b.2.post_recv(&[RecvWr {
            wr_id: i,
            sg_list: &rsge,
        }])
        .expect("recv");
    }
    let ssge = [a.4.sge(0, 1000)];
    for c in 0..5u64 {
        let wrs: Vec<SendWr<'_>> = (0..4)
            .map(|i| SendWr::new(c * 4 + i, SendOp::Send, &ssge).signaled())
            .collect();
        a.2.post_send(&wrs).expect("send");
    }
    let mut got = 0;
    let mut wcs = [Wc::default(); 32];
    let t0 = Instant::now();
    while got < 40 {
        got += a.1.poll(&mut wcs) + b.1.poll(&mut wcs);
        assert!(t0.elapsed() < Duration::from_secs(10), "{got} completions");
    }

    let v = ask(&path, json!({"get": "stats"}));
    let devs = v["devices"].as_array().expect("devices");
    assert_eq!(devs.len(), 2, "{v}");
    let (da, db) = (&devs[0], &devs[1]);
    assert_eq!(da["index"], 0);
    assert_eq!(da["gids"][0], "::ffff:192.0.2.1");
    assert!(da["counters"]["sent_pkts"].as_u64() >= Some(20), "{da}");
    assert_eq!(db["counters"]["rdma_recvs"], 20, "{db}");
    // The runtime's doorbells and WQEs: 5 send chains of 4 + 20 single receives at least.
    let rt = &da["runtime"];
    assert!(rt["doorbells"].as_u64() >= Some(25), "{rt}");
    assert!(rt["wqes"].as_u64() >= Some(40), "{rt}");
    assert!(rt["max_pass_gap_us"].is_u64(), "{rt}");
    // Every runtime counter is there (poll_yields was left out of the hand-written list).
    assert!(rt["poll_yields"].is_u64(), "{rt}");
    for (name, _) in RuntimeStats::default().counters() {
        assert!(rt[name].is_u64(), "{name} missing: {rt}");
    }
    // QP 1 (the GSI) is listed too: look the test's QP up by number.
    let qp_of = |d: &Value, qpn: u32| {
        d["qps"]
            .as_array()
            .and_then(|v| v.iter().find(|q| q["qpn"] == qpn).cloned())
            .unwrap_or_default()
    };
    assert_eq!(da["qps"][0]["qpn"], 1, "{da}");
    let qa = &qp_of(da, a.2.qpn().value());
    assert_eq!(qa["qpn"], a.2.qpn().value());
    assert_eq!(qa["type"], "RC");
    assert_eq!(qa["state"], "RTS");
    assert_eq!(qa["sq_outstanding"], 0, "{qa}");
    assert_eq!(
        qa["counters"]["sent_pkts"], da["counters"]["sent_pkts"],
        "{qa}"
    );
    assert_eq!(qp_of(db, b.2.qpn().value())["epsn"], 1 + 20, "{db}");

    // A query by QPN is answered by every device that has that QP, each with its own QP's state (each device numbers
    // its QPs from an offset of its own, `roce_proto::QpnRange`: here usually one device per QPN).
    let dumps = |qpn: u32| -> Vec<String> {
        let v = ask(&path, json!({"get": "qp", "qpn": qpn}));
        let hits = v["devices"].as_array().expect("devices").clone();
        assert!(!hits.is_empty(), "{v}");
        hits.iter()
            .map(|h| h["qp"]["dump"].as_str().expect("dump").to_owned())
            .collect()
    };
    let da_dumps = dumps(a.2.qpn().value());
    assert!(
        da_dumps
            .iter()
            .any(|d| d.contains("state=RTS") && d.contains("next_psn=0x15")),
        "{da_dumps:?}"
    );
    let db_dumps = dumps(b.2.qpn().value());
    assert!(
        db_dumps
            .iter()
            .any(|d| d.contains("epsn=0x15") && d.contains("rdma_recvs=20")),
        "{db_dumps:?}"
    );
    let v = ask(&path, json!({"get": "qp", "qpn": 0x999}));
    assert_eq!(v["devices"], json!([]), "{v}");

    let v = ask(&path, json!({"get": "nonsense"}));
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("unknown request")),
        "{v}"
    );

    // Gone with the last device of the runtime.
    drop((a, b));
    drop(ca);
    assert!(path.exists());
    drop(cb);
    // The runtime may finish stopping on its engine thread (a handle's last cleanup command holds it).
    let t0 = Instant::now();
    while path.exists() && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!path.exists(), "{} left behind", path.display());
}

#[test]
fn endpoint_can_be_turned_off() {
    let rt = RuntimeConfig {
        stats_endpoint: StatsEndpoint::Off,
        ..RuntimeConfig::default()
    };
    let (ca, _cb) = Context::sim_pair(rt).expect("pair");
    assert_eq!(ca.stats_endpoint(), None);
}

/// A hostile local client that trickles its request (one byte every 300 ms, each inside the per-read timeout) must
/// neither keep other readers out for longer than one request's time bound nor hold up the application's teardown
/// (dropping the last device joins the endpoint thread).
#[test]
fn a_trickling_client_neither_starves_readers_nor_holds_up_teardown() {
    use std::io::Write;
    let dir = scratch("trickle");
    let rt = RuntimeConfig {
        stats_endpoint: StatsEndpoint::Dir(dir.clone()),
        ..RuntimeConfig::default()
    };
    let (ca, cb) = Context::sim_pair(rt).expect("pair");
    let path = ca.stats_endpoint().expect("an endpoint");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A client that sends one byte every 300 ms, at most 30 (9 s) so that a failing run ends.
    let trickle = || {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut s = std::os::unix::net::UnixStream::connect(&path).expect("connect");
            for _ in 0..30 {
                if stop.load(std::sync::atomic::Ordering::Relaxed) || s.write_all(b" ").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        })
    };
    let trickler = trickle();
    std::thread::sleep(Duration::from_millis(200));
    // A well-behaved reader behind it is answered within a few request bounds (2 s each).
    let t0 = Instant::now();
    let v = endpoint::query(&path, &json!({"get": "stats"}), Duration::from_secs(8));
    assert!(
        v.is_ok(),
        "reader starved by a trickling client for {:?}: {v:?}",
        t0.elapsed()
    );
    // Another trickler, then teardown: dropping the devices returns promptly.
    let trickler2 = trickle();
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    drop((ca, cb));
    let took = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    trickler.join().expect("trickler");
    trickler2.join().expect("trickler");
    assert!(
        took < Duration::from_secs(3),
        "dropping the last device took {took:?} behind a trickling stats client"
    );
}

/// Four clients that connect and trickle their requests at once (slowloris, issue #21) do not delay a reader: the
/// endpoint serves clients concurrently, each bounded in time, so the reader is answered at once (one at a time it
/// waited for each one's 2 s bound: about 8 s); then teardown is still prompt.
#[test]
fn slow_clients_at_once_do_not_delay_a_reader() {
    use std::io::Write;
    let dir = scratch("slowloris");
    let rt = RuntimeConfig {
        stats_endpoint: StatsEndpoint::Dir(dir.clone()),
        ..RuntimeConfig::default()
    };
    let (ca, cb) = Context::sim_pair(rt).expect("pair");
    let path = ca.stats_endpoint().expect("an endpoint");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut s = std::os::unix::net::UnixStream::connect(&path).expect("connect");
                for _ in 0..30 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) || s.write_all(b" ").is_err()
                    {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(300));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let v = endpoint::query(&path, &json!({"get": "stats"}), Duration::from_secs(10));
    let took = t0.elapsed();
    assert!(v.is_ok(), "{v:?}");
    assert!(
        took < Duration::from_secs(1),
        "a reader behind 4 slow clients was answered after {took:?}"
    );
    let t0 = Instant::now();
    drop((ca, cb));
    let took = t0.elapsed();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in slow {
        t.join().expect("slow client");
    }
    assert!(took < Duration::from_secs(3), "teardown took {took:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `endpoint::query` (what `rocev2 stat` reads with) against a hostile socket: an answer trickled a byte at a time
/// and an endless answer both end in an error within the timeout, with a bounded buffer.
#[test]
fn query_bounds_a_trickling_or_endless_answer() {
    use std::io::{Read, Write};
    let dir = scratch("hostile-answer");
    std::fs::create_dir_all(&dir).expect("dir");
    // Named after this process, which serves it (`query` checks the serving pid against the name).
    let path = dir.join(format!("{}.0.sock", std::process::id()));
    let l = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let server = std::thread::spawn(move || {
        // 1: a byte every 100 ms for 5 s; 2: 256 MiB without a newline.
        for endless in [false, true] {
            let (mut s, _) = l.accept().expect("accept");
            let mut b = [0u8; 256];
            let _ = s.read(&mut b);
            if endless {
                let chunk = vec![b'1'; 1 << 20];
                for _ in 0..256 {
                    if s.write_all(&chunk).is_err() {
                        break;
                    }
                }
            } else {
                for _ in 0..50 {
                    if s.write_all(b" ").is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    });
    let t0 = Instant::now();
    let r = endpoint::query(&path, &json!({"get": "stats"}), Duration::from_secs(1));
    let took = t0.elapsed();
    assert!(
        r.is_err() && took < Duration::from_secs(3),
        "trickled answer: {r:?} after {took:?}"
    );
    let r = endpoint::query(&path, &json!({"get": "stats"}), Duration::from_secs(20));
    let e = r.expect_err("an endless answer");
    assert!(e.to_string().contains("longer than"), "{e}");
    server.join().expect("server");
}

/// `endpoint::query` against a socket whose listen queue is full (its process does not accept: stopped, or its
/// endpoint thread stuck): connecting is bounded by the timeout too, with a clear error. It used to block in
/// connect() for as long as the queue stayed full.
#[test]
fn query_gives_up_on_a_full_listen_queue() {
    use socket2::{Domain, SockAddr, Socket, Type};
    let dir = scratch("full-queue");
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("1.0.sock");
    let _l = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let addr = SockAddr::unix(&path).expect("address");
    let mut held = Vec::new();
    loop {
        let s = Socket::new(Domain::UNIX, Type::STREAM, None).expect("socket");
        s.set_nonblocking(true).expect("nonblocking");
        match s.connect(&addr) {
            Ok(()) => held.push(s),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the listen queue: {e}"),
        }
        assert!(held.len() < 100_000, "the listen queue never filled");
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let _ = tx.send(endpoint::query(
            &p,
            &json!({"get": "stats"}),
            Duration::from_millis(500),
        ));
    });
    let r = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("query did not return: connect() blocked on the full listen queue");
    let e = r.expect_err("no answer from a full queue");
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    assert!(e.to_string().contains("listen queue"), "{e}");
}

/// A stats answer is one instant of each device: its counters are the sum over its QPs (no traffic here belongs to
/// no QP and no QP was destroyed), also while traffic flows. The device's counters and its QPs' used to be read in
/// two engine calls, with packets in between: a QP's rcvd_bytes could be ahead of its device's.
#[test]
fn device_counters_and_qp_counters_are_one_snapshot() {
    let dir = scratch("snapshot");
    let rt = RuntimeConfig {
        stats_endpoint: StatsEndpoint::Dir(dir.clone()),
        progress: ProgressMode::Thread,
        ..RuntimeConfig::default()
    };
    let (ca, cb) = Context::sim_pair(rt).expect("pair");
    let path = ca.stats_endpoint().expect("an endpoint");
    let cap = QpCap {
        max_send_wr: 64,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let side = |c: &Context| {
        let pd = c.alloc_pd().expect("pd");
        let cq = c.create_cq(128, None, Moderation::default()).expect("cq");
        let qp = pd.create_qp(QpType::Rc, &cq, &cq, cap, false).expect("qp");
        let buf = MrBuf::new(4096).expect("buf");
        let mr = pd
            .reg_mr(&buf, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .expect("mr");
        (pd, cq, qp, buf, mr)
    };
    let (a, b) = (side(&ca), side(&cb));
    let o = ConnectOpts::default();
    a.2.connect(&b.2.endpoint(Psn::new(7)), Psn::new(1), &o)
        .expect("connect");
    b.2.connect(&a.2.endpoint(Psn::new(1)), Psn::new(7), &o)
        .expect("connect");
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // WRITEs of 1000 bytes, 16 at a time, until told to stop.
            let sge = [a.4.sge(0, 1000)];
            let op = SendOp::RdmaWrite {
                remote_addr: b.4.addr(),
                rkey: b.4.rkey(),
            };
            let mut wcs = [Wc::default(); 32];
            let mut id = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let wrs: Vec<SendWr<'_>> = (0..16)
                    .map(|i| SendWr::new(id + i, op, &sge).signaled())
                    .collect();
                id += 16;
                a.2.post_send(&wrs).expect("write");
                let mut got = 0;
                let t0 = Instant::now();
                while got < 16 {
                    got += a.1.poll(&mut wcs);
                    assert!(t0.elapsed() < Duration::from_secs(10), "{got} completions");
                }
            }
        });
        let mut mismatches = Vec::new();
        for _ in 0..100 {
            let v = ask(&path, json!({"get": "stats"}));
            for d in v["devices"].as_array().expect("devices") {
                for k in ["sent_pkts", "sent_bytes", "rcvd_pkts", "rcvd_bytes"] {
                    let dev = d["counters"][k].as_u64().expect("counter");
                    let qps: u64 = d["qps"]
                        .as_array()
                        .expect("qps")
                        .iter()
                        .map(|q| q["counters"][k].as_u64().expect("qp counter"))
                        .sum();
                    if dev != qps {
                        mismatches.push(format!("device {} {k}: {dev} vs QPs {qps}", d["index"]));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(
            mismatches.is_empty(),
            "{} of 800 sums differ: {:?}",
            mismatches.len(),
            &mismatches[..mismatches.len().min(5)]
        );
    });
    let v = ask(&path, json!({"get": "stats"}));
    assert!(
        v["devices"][0]["counters"]["sent_pkts"].as_u64() > Some(100),
        "no traffic: {v}"
    );
}

/// Datagrams the link drops before the engine sees them (garbage at UDP 4791: no room for BTH + ICRC, or a wrong
/// ICRC) are counted where `rocev2 stat` reads: the device's `link` counters. Binds UDP 4791 on 127.0.71.1 (network
/// lock, as the other loopback tests).
#[test]
fn datagrams_the_link_drops_are_counted_in_the_endpoint() {
    use roce_link::{UdpConfig, UdpLink};
    use std::net::{IpAddr, Ipv4Addr, UdpSocket};
    let dir = scratch("link-drops");
    let ip = Ipv4Addr::new(127, 0, 71, 1);
    let rt = RuntimeConfig {
        stats_endpoint: StatsEndpoint::Dir(dir.clone()),
        ..RuntimeConfig::default()
    };
    let cfg = EngineConfig {
        gids: vec![Gid::from_ipv4(ip.octets())],
        ..EngineConfig::default()
    };
    let ctx = Context::open(cfg, rt, move || {
        Ok(Box::new(UdpLink::bind(UdpConfig::new(IpAddr::V4(ip)))?) as SendLink)
    })
    .expect("open udp device");
    let path = ctx.stats_endpoint().expect("an endpoint");
    let tx = UdpSocket::bind((Ipv4Addr::new(127, 0, 71, 2), 0)).expect("sender");
    // Three too short for BTH + ICRC, two long enough with a wrong ICRC.
    for len in [0usize, 1, 15, 40, 300] {
        tx.send_to(&vec![0x5a; len], (ip, 4791)).expect("send");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        ctx.progress();
        let v = ask(&path, json!({"get": "stats"}));
        let d = &v["devices"][0];
        let link = &d["link"];
        let bad = link["rx_icrc_bad"].as_u64().unwrap_or(0);
        if bad == 5 {
            assert_eq!(d["counters"]["rcvd_pkts"], 0, "{d}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "5 dropped datagrams not counted in the device's link counters: {d}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(ctx);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #21: a stats client that sends its request and never reads the answer kept the runtime it asked about
/// alive (the endpoint thread held the devices while its write blocked, up to the 2 s request bound), so a program
/// that closed its device still had it — and its UDP port — for that long. The answer here is larger than the
/// socket buffer (hundreds of QPs), so the write blocks; once the application drops its handles, the runtime must
/// stop at once (its endpoint socket is removed when it stops).
#[test]
fn a_client_that_does_not_read_its_answer_does_not_keep_the_runtime_alive() {
    use std::io::Write;
    let dir = scratch("noread");
    let rt = RuntimeConfig {
        stats_endpoint: StatsEndpoint::Dir(dir.clone()),
        ..RuntimeConfig::default()
    };
    let (ca, cb) = Context::sim_pair(rt).expect("pair");
    let path = ca.stats_endpoint().expect("an endpoint");
    let pd = ca.alloc_pd().expect("pd");
    let cq = ca.create_cq(16, None, Moderation::default()).expect("cq");
    let cap = QpCap {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qps: Vec<Qp> = (0..600)
        .map(|_| pd.create_qp(QpType::Rc, &cq, &cq, cap, false).expect("qp"))
        .collect();
    let mut s = std::os::unix::net::UnixStream::connect(&path).expect("connect");
    s.write_all(b"{\"get\":\"stats\"}\n").expect("request");
    // Let the endpoint build its answer and block writing it.
    std::thread::sleep(Duration::from_millis(700));
    drop((qps, cq, pd, ca, cb));
    // The runtime stops (and removes its socket) within the endpoint's 50 ms slice, not after the 2 s bound. Timed
    // from the end of the drop (destroying 600 QPs is not the endpoint's wait, and takes long under ASan or load).
    let t0 = Instant::now();
    while path.exists() {
        assert!(
            t0.elapsed() < Duration::from_millis(1000),
            "the runtime outlived its last handle for {:?} behind a client that does not read",
            t0.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(s);
}

/// Issue #21: the run directory must be this user's alone. A directory someone else could write to (or owned by
/// someone else) is refused for serving — a local attacker who pre-creates it cannot capture or replace the
/// endpoint — and skipped when reading; a socket is mode 0600 whatever the umask.
#[test]
fn run_directories_others_control_are_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch("lax");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let rt = RuntimeConfig {
        stats_endpoint: StatsEndpoint::Dir(dir.clone()),
        ..RuntimeConfig::default()
    };
    let (ca, _cb) = Context::sim_pair(rt.clone()).expect("pair");
    assert_eq!(
        ca.stats_endpoint(),
        None,
        "served from a world-writable directory"
    );
    assert!(endpoint::dir_trusted(&dir, &[0, 1000]).is_err());
    // A symlink to a good directory is refused too (it could be re-pointed).
    let good = scratch("good");
    std::fs::create_dir_all(&good).expect("dir");
    std::fs::set_permissions(&good, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let link = scratch("link");
    std::os::unix::fs::symlink(&good, &link).expect("symlink");
    assert!(endpoint::dir_trusted(&link, &[0, 1000, 65534]).is_err());
    // The good directory: served, socket mode 0600.
    let rt = RuntimeConfig {
        stats_endpoint: StatsEndpoint::Dir(good.clone()),
        ..RuntimeConfig::default()
    };
    let (cg, _cg2) = Context::sim_pair(rt).expect("pair");
    let sock = cg
        .stats_endpoint()
        .expect("an endpoint in a directory of this user's");
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "{}", sock.display());
    // A socket named after another process (here pid 1) but served by this one is not read: it is forged.
    let forged = good.join("1.0.sock");
    let _l = std::os::unix::net::UnixListener::bind(&forged).expect("bind");
    let e = endpoint::query(&forged, &json!({"get": "stats"}), Duration::from_secs(1))
        .expect_err("a forged endpoint");
    assert!(e.to_string().contains("not by pid 1"), "{e}");
}
