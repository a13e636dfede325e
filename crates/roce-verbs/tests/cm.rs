//! The connection manager over QP 1 (`roce_verbs::cm`), end to end: two devices on the simulated pair and two over
//! real UDP on 127.0.0.x connect RC QPs through REQ/REP/RTU, then move verified data with SEND and RDMA WRITE;
//! a rejected connect carries its private data back; a connect to a service nobody listens on is rejected with
//! reason 8 (invalid service ID); a disconnect reaches both ends; the connected QPs take the local ACK timeout the
//! CM exchanged; a client killed with its connection up and started again on the same address connects to the same
//! server (before QPN offsets its server rejected it as a stale connection, REJ 10).

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use roce_link::{UdpConfig, UdpLink};
use roce_verbs::cm::{CmConfig, CmEvent, ConnectionManager};
use roce_verbs::*;

const WAIT: Duration = Duration::from_secs(10);

struct End {
    ctx: Context,
    cm: ConnectionManager,
    _pd: Pd,
    cq: Cq,
    qp: Qp,
    buf: MrBuf,
    mr: Mr,
}

fn end(ctx: &Context) -> End {
    end_with(ctx, CmConfig::default())
}

fn end_with(ctx: &Context, cfg: CmConfig) -> End {
    let cm = ConnectionManager::open_with(ctx, cfg).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64, None, Moderation::default()).unwrap();
    let cap = QpCap {
        max_send_wr: 16,
        max_recv_wr: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 64,
    };
    let qp = pd.create_qp(QpType::Rc, &cq, &cq, cap, true).unwrap();
    let buf = MrBuf::new(8192).unwrap();
    let mr = pd
        .reg_mr(
            &buf,
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        )
        .unwrap();
    End {
        ctx: ctx.clone(),
        cm,
        _pd: pd,
        cq,
        qp,
        buf,
        mr,
    }
}

fn event(e: &End) -> CmEvent {
    e.cm.get_event(WAIT)
        .unwrap()
        .expect("a CM event within the wait")
}

fn poll_one(cq: &Cq) -> Wc {
    let mut wc = [Wc::default(); 1];
    let end = std::time::Instant::now() + WAIT;
    while std::time::Instant::now() < end {
        if cq.poll(&mut wc) == 1 {
            return wc[0];
        }
        std::thread::yield_now();
    }
    panic!("no completion");
}

/// The active side's MR address and rkey in the REQ's private data (what rdma_cm programs such as rping do).
fn mr_blob(e: &End) -> Vec<u8> {
    let mut v = e.mr.addr().to_be_bytes().to_vec();
    v.extend_from_slice(&e.mr.rkey().0.to_be_bytes());
    v
}

/// Connects `a` to `b` through the CM and checks the QPs, then a SEND and an RDMA WRITE with verified bytes, then
/// a disconnect seen by both ends.
fn connect_send_write_disconnect(a: &End, b: &End) {
    // rdma_cm's service ID for TCP port space, port 20001 (0x0106_4e21).
    let service = roce_wire::cm::service_id(roce_wire::cm::PortSpace::Tcp, 20001);
    b.cm.listen(service).unwrap();
    let b_gid = b.ctx.gid(0).unwrap();
    let a_gid = a.ctx.gid(0).unwrap();
    let opts = ConnectOpts::default();
    let mut hello = b"hello from A ".to_vec();
    hello.extend_from_slice(&mr_blob(a));
    let id_a =
        a.cm.connect(&a.qp, b_gid, b.ctx.config().mac, service, &hello, &opts)
            .unwrap();
    let (id_b, req_qpn) = match event(b) {
        CmEvent::ConnectRequest {
            id,
            service_id,
            peer,
            remote_qpn,
            private_data,
            ..
        } => {
            assert_eq!(service_id, service);
            assert_eq!(peer, a_gid);
            assert_eq!(&private_data[..hello.len()], &hello[..]);
            assert_eq!(private_data.len(), 92);
            (id, remote_qpn)
        }
        e => panic!("expected a connect request, got {e:?}"),
    };
    assert_eq!(req_qpn, a.qp.qpn());
    b.cm.accept(id_b, &b.qp, &mr_blob(b), &opts).unwrap();
    let rep_private = match event(a) {
        CmEvent::Established { id, private_data } => {
            assert_eq!(id, id_a);
            private_data
        }
        e => panic!("expected established on A, got {e:?}"),
    };
    assert_eq!(&rep_private[..12], &mr_blob(b)[..]);
    match event(b) {
        CmEvent::Established { id, .. } => assert_eq!(id, id_b),
        e => panic!("expected established on B, got {e:?}"),
    }
    // Both QPs in RTS, each towards the other's QPN.
    let (qa, qb) = (a.qp.query().unwrap(), b.qp.query().unwrap());
    assert_eq!((qa.qp_state, qb.qp_state), (QpState::Rts, QpState::Rts));
    assert_eq!(qa.dest_qp_num, b.qp.qpn());
    assert_eq!(qb.dest_qp_num, a.qp.qpn());
    // SEND A → B, verified.
    let msg = b"a SEND over a CM connection";
    b.qp.post_recv(&[RecvWr {
        wr_id: 7,
        sg_list: &[b.mr.sge(0, 256)],
    }])
    .unwrap();
    let data = [&msg[..]];
    a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[]).inline(&data).signaled()])
        .unwrap();
    let wc = poll_one(&b.cq);
    assert_eq!(
        (wc.status, wc.wr_id, wc.byte_len),
        (WcStatus::Success, 7, msg.len() as u32)
    );
    assert_eq!(&b.buf.to_vec()[..msg.len()], msg);
    assert_eq!(poll_one(&a.cq).status, WcStatus::Success);
    // RDMA WRITE B → A with the address and rkey A put in the REQ's private data.
    let off = hello.len() - 12;
    let raddr = u64::from_be_bytes(hello[off..off + 8].try_into().unwrap());
    let rkey = u32::from_be_bytes(hello[off + 8..off + 12].try_into().unwrap());
    let pattern: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
    b.mr.write(4096, &pattern).unwrap();
    b.qp.post_send(&[SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote_addr: raddr + 1000,
            rkey: Rkey(rkey),
        },
        &[b.mr.sge(4096, 1000)],
    )
    .signaled()])
        .unwrap();
    assert_eq!(poll_one(&b.cq).status, WcStatus::Success);
    assert_eq!(&a.buf.to_vec()[1000..2000], &pattern[..]);
    // Disconnect from A: both ends hear of it, A's QP is in ERR.
    a.cm.disconnect(id_a).unwrap();
    match event(b) {
        CmEvent::Disconnected { id } => assert_eq!(id, id_b),
        e => panic!("expected disconnected on B, got {e:?}"),
    }
    match event(a) {
        CmEvent::Disconnected { id } => assert_eq!(id, id_a),
        e => panic!("expected disconnected on A, got {e:?}"),
    }
    assert_eq!(a.qp.query().unwrap().qp_state, QpState::Err);
    assert_eq!(b.qp.query().unwrap().qp_state, QpState::Err);
}

/// A rejected connect (private data back) and a connect nobody listens for (REJ reason 8).
fn rejects(a: &End, b: &End) {
    let b_gid = b.ctx.gid(0).unwrap();
    let mac = b.ctx.config().mac;
    let opts = ConnectOpts::default();
    b.cm.listen(0x99).unwrap();
    let id =
        a.cm.connect(&a.qp, b_gid, mac, 0x99, b"let me in", &opts)
            .unwrap();
    let id_b = match event(b) {
        CmEvent::ConnectRequest { id, .. } => id,
        e => panic!("expected a connect request, got {e:?}"),
    };
    b.cm.reject(id_b, b"not today").unwrap();
    match event(a) {
        CmEvent::Rejected {
            id: rid,
            reason,
            private_data,
        } => {
            assert_eq!(rid, id);
            assert_eq!(reason, 28, "consumer reject");
            assert_eq!(&private_data[..9], b"not today");
        }
        e => panic!("expected rejected, got {e:?}"),
    }
    // Nobody listens on 0x777.
    let qp2 = a
        ._pd
        .create_qp(QpType::Rc, &a.cq, &a.cq, a.qp.cap(), true)
        .unwrap();
    let id =
        a.cm.connect(&qp2, b_gid, mac, 0x777, b"anyone?", &opts)
            .unwrap();
    match event(a) {
        CmEvent::Rejected {
            id: rid, reason, ..
        } => {
            assert_eq!(rid, id);
            assert_eq!(reason, 8, "invalid service ID");
        }
        e => panic!("expected rejected, got {e:?}"),
    }
    assert!(
        b.cm.poll_event().unwrap().is_none(),
        "B's application saw nothing"
    );
}

#[test]
fn sim_pair_connect_send_write_disconnect() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, b) = (end(&ca), end(&cb));
    connect_send_write_disconnect(&a, &b);
}

#[test]
fn sim_pair_connect_with_a_progress_thread() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(ProgressMode::Thread)).unwrap();
    let (a, b) = (end(&ca), end(&cb));
    connect_send_write_disconnect(&a, &b);
}

/// 20 % loss, duplicates and reordering on both ports: the CM's retries (short timeouts here) and duplicate
/// handling still connect, and the data verifies.
#[test]
fn lossy_sim_pair_connects_through_retries() {
    use roce_link::{FaultConfig, Faulty};
    let mut seed = 0;
    let wrap = move |l: SendLink| -> Result<SendLink, roce_link::LinkError> {
        seed += 1;
        let f = FaultConfig {
            loss: 0.2,
            duplicate: 0.1,
            reorder: 0.1,
            ..FaultConfig::default()
        };
        Ok(Box::new(Faulty::new(l, f, FaultConfig::default(), seed)))
    };
    let (ca, cb) = Context::sim_pair_with(
        RuntimeConfig::default(),
        roce_link::sim::SimConfig::default(),
        wrap,
    )
    .unwrap();
    let cfg = CmConfig {
        packet_life_time: 6,
        cm_response_timeout: 8,
        ..CmConfig::default()
    };
    let (a, b) = (end_with(&ca, cfg), end_with(&cb, cfg));
    connect_send_write_disconnect(&a, &b);
    let retried = a.cm.stats().unwrap().retransmits + b.cm.stats().unwrap().retransmits;
    assert!(retried > 0, "the loss made the CMs retry");
}

/// The QPs that `connect` and `accept` bring to RTS take the local ACK timeout the CM exchanged, as Linux's do
/// (`cm.c`: the active side `cm_ack_timeout(REP TargetACKDelay, packet lifetime)` in `cm_rep_handler`, the
/// passive side the REQ's Local ACK Timeout in `cm_req_handler`) and as the C library's QPs (`tests/c/acktmo.c`
/// of roce-rdmacm), not `ConnectOpts::timeout` (14): 17 on both sides with rdma_cm's values (ACK delay 15, packet
/// lifetime 16); with A's packet lifetime 10 and ACK delay 20, A takes `ack_timeout(15, 10)` = 15 and B the REQ's
/// `ack_timeout(20, 10)` = 20.
#[test]
fn connected_qps_take_the_ack_timeout_the_cm_exchanged() {
    let short = CmConfig {
        packet_life_time: 10,
        ack_delay: 20,
        ..CmConfig::default()
    };
    for (cfg_a, want) in [(CmConfig::default(), (17, 17)), (short, (15, 20))] {
        let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
        let (a, b) = (end_with(&ca, cfg_a), end(&cb));
        let service = 0x4242;
        b.cm.listen(service).unwrap();
        let opts = ConnectOpts::default();
        let id_a =
            a.cm.connect(
                &a.qp,
                cb.gid(0).unwrap(),
                cb.config().mac,
                service,
                b"",
                &opts,
            )
            .unwrap();
        let id_b = match event(&b) {
            CmEvent::ConnectRequest { id, .. } => id,
            e => panic!("expected a connect request, got {e:?}"),
        };
        b.cm.accept(id_b, &b.qp, b"", &opts).unwrap();
        match event(&a) {
            CmEvent::Established { id, .. } => assert_eq!(id, id_a),
            e => panic!("expected established on A, got {e:?}"),
        }
        match event(&b) {
            CmEvent::Established { id, .. } => assert_eq!(id, id_b),
            e => panic!("expected established on B, got {e:?}"),
        }
        let (qa, qb) = (a.qp.query().unwrap(), b.qp.query().unwrap());
        assert_eq!(
            (qa.timeout, qb.timeout),
            want,
            "ConnectOpts::timeout is {}",
            opts.timeout
        );
    }
}

#[test]
fn sim_pair_rejects() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, b) = (end(&ca), end(&cb));
    rejects(&a, &b);
}

#[test]
fn cm_fd_is_readable_while_events_wait() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, b) = (end(&ca), end(&cb));
    let id =
        a.cm.connect(
            &a.qp,
            cb.gid(0).unwrap(),
            cb.config().mac,
            5,
            b"",
            &ConnectOpts::default(),
        )
        .unwrap();
    // Drive until A's CM queued the REJ (nobody listens on 5), without taking it: the fd becomes readable.
    let w = roce_link::wait::Waiter::new().unwrap();
    let end = std::time::Instant::now() + WAIT;
    let mut readable = false;
    while !readable && std::time::Instant::now() < end {
        ca.progress();
        cb.progress();
        readable = w
            .wait(&[a.cm.fd()], Duration::from_millis(1))
            .unwrap()
            .readable;
    }
    assert!(readable, "fd readable while an event waits");
    match a.cm.poll_event().unwrap() {
        Some(CmEvent::Rejected {
            id: rid, reason: 8, ..
        }) => assert_eq!(rid, id),
        e => panic!("{e:?}"),
    }
    let w2 = w.wait(&[a.cm.fd()], Duration::ZERO).unwrap();
    assert!(!w2.readable, "not readable once the event was taken");
    drop(b);
}

fn udp_ctx(last: u8, ip: Ipv4Addr) -> Context {
    let mac = [2, 0, 0, 0, 0x20, last];
    let cfg = EngineConfig {
        mac,
        gids: vec![Gid::from_ipv4(ip.octets())],
        seed: u64::from(last),
        ..EngineConfig::default()
    };
    Context::open(cfg, RuntimeConfig::default(), move || {
        let mut u = UdpConfig::new(IpAddr::V4(ip));
        u.local_mac = mac;
        Ok(Box::new(UdpLink::bind(u)?) as SendLink)
    })
    .expect("open udp device")
}

#[test]
fn udp_loopback_connect_send_write_disconnect_and_rejects() {
    let ca = udp_ctx(1, Ipv4Addr::new(127, 0, 77, 1));
    let cb = udp_ctx(2, Ipv4Addr::new(127, 0, 77, 2));
    let (a, b) = (end(&ca), end(&cb));
    connect_send_write_disconnect(&a, &b);
    let (a2, b2) = (end(&ca), end(&cb));
    rejects(&a2, &b2);
}

/// The Starting PSN of a REQ is the PSN the *passive* side sends from, and the REP's is the PSN the *active* side
/// sends from: Linux `drivers/infiniband/core/cm.c` sets the active side's `rq_psn` from its own REQ
/// (`ib_send_cm_req`) and its `sq_psn` from the REP (`cm_rep_handler`), the passive side the other way round.
/// Found against rdma_server/rdma_client on rxe (`crates/roce-interop/tests/rdmacm.rs`): with the opposite reading
/// every SEND was taken for a duplicate and never completed.
#[test]
fn starting_psns_as_linux_reads_them() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, b) = (end(&ca), end(&cb));
    b.cm.listen(0x4242).unwrap();
    let opts = ConnectOpts::default();
    a.cm.connect(
        &a.qp,
        cb.gid(0).unwrap(),
        cb.config().mac,
        0x4242,
        b"",
        &opts,
    )
    .unwrap();
    let (id_b, req_psn) = match event(&b) {
        CmEvent::ConnectRequest { id, remote_psn, .. } => (id, remote_psn),
        e => panic!("expected a connect request, got {e:?}"),
    };
    b.cm.accept(id_b, &b.qp, b"", &opts).unwrap();
    assert!(matches!(event(&a), CmEvent::Established { .. }));
    let (qa, qb) = (a.qp.query().unwrap(), b.qp.query().unwrap());
    assert_eq!(
        qb.sq_psn, req_psn,
        "the passive side sends from the REQ's PSN"
    );
    assert_eq!(qa.rq_psn, req_psn, "the active side expects the REQ's PSN");
    assert_eq!(
        qa.sq_psn, qb.rq_psn,
        "the REP's PSN: active sends, passive expects"
    );
}

/// The passive side connects its QP with at most the REQ's path MTU (Linux `cm.c` gives the responder's QP the
/// REQ's `path_mtu`, `cm_init_qp_rtr_attr`): a responder that asked for 4096 towards a requester whose path is
/// 1024 (rxe on a 1500-byte link) would send packets the path drops.
#[test]
fn accept_uses_at_most_the_req_path_mtu() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).unwrap();
    let (a, b) = (end(&ca), end(&cb));
    b.cm.listen(0x4343).unwrap();
    let small = ConnectOpts {
        mtu: Mtu::Mtu1024,
        ..ConnectOpts::default()
    };
    a.cm.connect(
        &a.qp,
        cb.gid(0).unwrap(),
        cb.config().mac,
        0x4343,
        b"",
        &small,
    )
    .unwrap();
    let id_b = match event(&b) {
        CmEvent::ConnectRequest { id, .. } => id,
        e => panic!("expected a connect request, got {e:?}"),
    };
    let big = ConnectOpts {
        mtu: Mtu::Mtu4096,
        ..ConnectOpts::default()
    };
    b.cm.accept(id_b, &b.qp, b"", &big).unwrap();
    assert!(matches!(event(&a), CmEvent::Established { .. }));
    assert_eq!(b.qp.query().unwrap().path_mtu, Mtu::Mtu1024);
    assert_eq!(a.qp.query().unwrap().path_mtu, Mtu::Mtu1024);
}

/// A device on real UDP at `ip` whose engine has `seed` (a process's: `rocev2 run` draws one per process).
fn udp_ctx_seeded(last: u8, ip: Ipv4Addr, seed: u64) -> Context {
    let mac = seeded_mac(last);
    let cfg = EngineConfig {
        mac,
        gids: vec![Gid::from_ipv4(ip.octets())],
        seed,
        ..EngineConfig::default()
    };
    Context::open(cfg, RuntimeConfig::default(), move || {
        let mut u = UdpConfig::new(IpAddr::V4(ip));
        u.local_mac = mac;
        Ok(Box::new(UdpLink::bind(u)?) as SendLink)
    })
    .expect("open udp device")
}

fn seeded_mac(last: u8) -> [u8; 6] {
    [2, 0, 0, 0, 0x22, last]
}

/// The restart test's addresses (127.0.223.0/24 is this test's) and service.
const RESTART_SERVER: Ipv4Addr = Ipv4Addr::new(127, 0, 223, 1);
const RESTART_CLIENT: Ipv4Addr = Ipv4Addr::new(127, 0, 223, 2);
const RESTART_SERVICE: u64 = roce_wire::cm::service_id(roce_wire::cm::PortSpace::Tcp, 20223);
/// Set in a child process of the restart test: `<engine seed>,<send 0|1>` (the child is the client).
const RESTART_ENV: &str = "ROCE_VERBS_TEST_RESTART_CLIENT";
const RESTART_TEST: &str = "a_client_restarted_after_a_crash_connects_to_the_same_server_again";

/// The client of the restart test, in a process of its own: connects to the server, prints `client: established
/// <QPN>` (or `client: rejected <reason>`), with `send` SENDs a message and prints `client: sent`, then waits to be killed — its crash:
/// the process ends with the connection up, no DREQ leaves it. Bounded: every wait ends within 10 s or 60 s.
fn restart_client(seed: u64, send: bool) -> ! {
    let ctx = udp_ctx_seeded(2, RESTART_CLIENT, seed);
    let a = end(&ctx);
    let opts = ConnectOpts::default();
    let server = Gid::from_ipv4(RESTART_SERVER.octets());
    let id =
        a.cm.connect(&a.qp, server, seeded_mac(1), RESTART_SERVICE, b"hi", &opts)
            .unwrap();
    match event(&a) {
        CmEvent::Established { id: e, .. } if e == id => {
            println!("client: established {}", a.qp.qpn().value());
        }
        CmEvent::Rejected { reason, .. } => {
            println!("client: rejected {reason}");
            std::process::exit(0);
        }
        e => panic!("expected established, got {e:?}"),
    }
    if send {
        // The server posts its receive first, then says so on stdin (EOF: it is gone).
        let mut go = String::new();
        let _ = std::io::stdin().read_line(&mut go);
        let msg = b"after the restart";
        a.qp.post_send(&[SendWr::new(1, SendOp::Send, &[])
            .inline(&[&msg[..]])
            .signaled()])
            .unwrap();
        assert_eq!(poll_one(&a.cq).status, WcStatus::Success);
        println!("client: sent");
    }
    std::thread::sleep(Duration::from_secs(60));
    std::process::exit(1)
}

/// A client process of the restart test and the lines it printed (read by a thread, so every wait is bounded).
struct ClientProc {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl ClientProc {
    fn spawn(seed: u64, send: bool) -> ClientProc {
        use std::io::BufRead;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", RESTART_TEST, "--nocapture", "--test-threads=1"])
            .env(RESTART_ENV, format!("{seed},{}", u8::from(send)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the client process");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        ClientProc {
            child,
            stdin,
            lines,
        }
    }

    /// Tells a sending client that the server's receive is posted.
    fn go(&mut self) {
        use std::io::Write;
        let mut i = self.stdin.take().expect("stdin");
        i.write_all(b"go\n").expect("write to the client");
    }

    /// The rest of the first line of the client's that starts with `prefix` (after `client: `); panics on
    /// `client: rejected <reason>`, on the process ending, or after the wait.
    fn line(&self, prefix: &str) -> String {
        loop {
            match self.lines.recv_timeout(WAIT) {
                // libtest's "test NAME ... " may precede a line of the client's.
                Ok(l) => {
                    if let Some((_, r)) = l.split_once("client: rejected ") {
                        panic!("the client was rejected with reason {r}");
                    }
                    if let Some((_, rest)) = l.split_once(&format!("client: {prefix}")) {
                        return rest.to_string();
                    }
                }
                Err(e) => panic!("no '{prefix}' line from the client: {e}"),
            }
        }
    }

    /// The client's rejection reason, if it printed one (without waiting).
    fn rejected(&self) -> Option<String> {
        self.lines.try_iter().find_map(|l| {
            l.split_once("client: rejected ")
                .map(|(_, r)| r.to_string())
        })
    }
}

impl Drop for ClientProc {
    /// The crash: SIGKILL, then reaped.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server's side of one connection: the REQ reaches its application (unless its CM rejects it by itself, as a
/// stale connection: the client then reports the reason), it accepts with `b`'s QP, and it is established. Returns
/// the client's QPN from the REQ.
fn serve_one(b: &End, client: &ClientProc) -> roce_wire::Qpn {
    let opts = ConnectOpts::default();
    let end = std::time::Instant::now() + WAIT;
    let (id, qpn) = loop {
        if let Some(reason) = client.rejected() {
            panic!("the client was rejected with reason {reason}");
        }
        if let Some(e) = b.cm.poll_event().unwrap() {
            match e {
                CmEvent::ConnectRequest { id, remote_qpn, .. } => break (id, remote_qpn),
                e => panic!("expected a connect request at the server, got {e:?}"),
            }
        }
        assert!(
            std::time::Instant::now() < end,
            "no connect request within the wait"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    b.cm.accept(id, &b.qp, b"welcome", &opts).unwrap();
    match event(b) {
        CmEvent::Established { id: e, .. } => assert_eq!(e, id),
        e => panic!("expected established at the server, got {e:?}"),
    }
    qpn
}

/// The user's problem: a client connected to a server and crashed (killed: no DREQ, the server's CM still holds the
/// connection), then the program was started again on the same address — same MAC, so the same CA GUID
/// (`local_ca_guid` from the port MAC, fixed per device as on a real RNIC). Every engine numbered its QPs from
/// 0x11, so the new client's REQ named the (GID, CA GUID, QPN) of the server's live connection and the server's CM
/// rejected it as a stale connection (REJ reason 10, IBTA Vol 1 §12.9.8.3, Linux `cm_req_handler`) until the server
/// was restarted too. Now each engine enters its QPN range at an offset drawn from its seed (`roce_proto::QpnRange`,
/// `docs/MULTIPROCESS.md` "QPN range"): the restarted client (another process, another seed) connects and a SEND
/// crosses. The clients are child processes of this test (real process ends); their seeds are pinned, so the QPNs
/// and the outcome are the same on every run. 127.0.223.1 (server) and 127.0.223.2 (both clients).
#[test]
fn a_client_restarted_after_a_crash_connects_to_the_same_server_again() {
    if let Ok(v) = std::env::var(RESTART_ENV) {
        let (seed, send) = v.split_once(',').expect("seed,send");
        restart_client(seed.parse().expect("seed"), send == "1");
    }
    let server = udp_ctx_seeded(1, RESTART_SERVER, 0x5e7e);
    let s1 = end(&server);
    s1.cm.listen(RESTART_SERVICE).unwrap();

    let c1 = ClientProc::spawn(0xc11e_0001, false);
    let q1 = serve_one(&s1, &c1);
    assert_eq!(c1.line("established "), q1.value().to_string());
    drop(c1);
    assert!(
        s1.cm.poll_event().unwrap().is_none(),
        "the server heard nothing of the crash"
    );
    assert_eq!(s1.qp.query().unwrap().qp_state, QpState::Rts);

    // The same program started again on the same address.
    let s2 = end(&server);
    let mut c2 = ClientProc::spawn(0xc11e_0002, true);
    let q2 = serve_one(&s2, &c2);
    assert_ne!(q2, q1, "the restarted client's QPN");
    assert_eq!(c2.line("established "), q2.value().to_string());
    s2.qp
        .post_recv(&[RecvWr {
            wr_id: 9,
            sg_list: &[s2.mr.sge(0, 64)],
        }])
        .unwrap();
    c2.go();
    let wc = poll_one(&s2.cq);
    let msg = b"after the restart";
    assert_eq!(
        (wc.status, wc.wr_id, wc.byte_len),
        (WcStatus::Success, 9, msg.len() as u32)
    );
    assert_eq!(&s2.buf.to_vec()[..msg.len()], msg);
    c2.line("sent");
}

/// A peer's DREQ that the CM has taken but whose event the program has not read yet, then the program's own
/// disconnect (perftest's `-R` client and server both call `rdma_disconnect` at the end of a run): the program's
/// disconnect answers the DREQ with the DREP (timewait), and the Disconnected event must still come. Before the
/// fix the event's handling tried to answer the DREQ a second time, got the CM's "invalid state" and lost the
/// event: `get_event` failed, and rocev2's librdmacm never reported RDMA_CM_EVENT_DISCONNECTED (perftest's client,
/// waiting for it in `rdma_cm_disconnect_nodes`, hung after printing its result: 3 of 232 README pairs).
#[test]
fn own_disconnect_after_the_peers_dreq_still_reports_disconnected() {
    let (ca, cb) = Context::sim_pair(RuntimeConfig::with_mode(ProgressMode::Thread)).unwrap();
    let (a, b) = (end(&ca), end(&cb));
    let service = roce_wire::cm::service_id(roce_wire::cm::PortSpace::Tcp, 20002);
    b.cm.listen(service).unwrap();
    let opts = ConnectOpts::default();
    let id_a =
        a.cm.connect(
            &a.qp,
            cb.gid(0).unwrap(),
            cb.config().mac,
            service,
            &[],
            &opts,
        )
        .unwrap();
    let id_b = match event(&b) {
        CmEvent::ConnectRequest { id, .. } => id,
        e => panic!("expected a connect request, got {e:?}"),
    };
    b.cm.accept(id_b, &b.qp, &[], &opts).unwrap();
    assert!(matches!(event(&a), CmEvent::Established { id, .. } if id == id_a));
    assert!(matches!(event(&b), CmEvent::Established { id, .. } if id == id_b));
    // B's DREQ reaches A's CM (A's progress thread takes it); A reads no event meanwhile.
    let before = a.cm.stats().unwrap().rx_mads;
    b.cm.disconnect(id_b).unwrap();
    let t0 = std::time::Instant::now();
    while a.cm.stats().unwrap().rx_mads == before {
        assert!(t0.elapsed() < WAIT, "A's CM never received B's DREQ");
        std::thread::sleep(Duration::from_millis(1));
    }
    // A's own disconnect now answers that DREQ (Linux `rdma_disconnect` sends the DREP in DREQ_RCVD).
    a.cm.disconnect(id_a).unwrap();
    match a.cm.get_event(WAIT) {
        Ok(Some(CmEvent::Disconnected { id })) => assert_eq!(id, id_a),
        other => panic!("expected Disconnected on A, got {other:?}"),
    }
    match event(&b) {
        CmEvent::Disconnected { id } => assert_eq!(id, id_b),
        e => panic!("expected Disconnected on B (A's DREP), got {e:?}"),
    }
}
