//! rdma_cm robustness under `rocev2 run` (issues #17 and #16): what happens to a connection request that meets a
//! process whose connection manager has nothing for it, and to a server that rejected one. Linux's CM is always on
//! (in the kernel): a REQ for a service nobody listens on is answered at once with a REJ, reason 8 (invalid service
//! ID; Linux `cm.c` `cm_req_handler`), and the requester's rdma_cm reports `RDMA_CM_EVENT_REJECTED` with status 8
//! (`cma.c` `cma_ib_handler`). Debian's unmodified tools, between two namespaces on 198.18.25.0/24; needs root,
//! `ip netns`, `ibverbs-utils` and `rdmacm-utils`, otherwise skipped with the reason.

mod common;

use std::time::{Duration, Instant};

use common::{NetnsPair, Proc, scratch, serial, wait_socket};

const IP_A: &str = "198.18.25.1";
const IP_B: &str = "198.18.25.2";

/// The namespaces, or `None` (with the reason printed) when this machine cannot run the test.
fn setup(tag: &str, programs: &[(&str, &str)]) -> Option<NetnsPair> {
    common::rdmacm_setup(tag, IP_A, IP_B, programs)
}

/// Finding (issue #17, "connect to a process whose CM hasn't started is never answered"): a process on the address
/// that runs rocev2 but has no connection manager yet (here `ibv_rc_pingpong`, waiting for its TCP peer, which never
/// uses rdma_cm) left a REQ unanswered in its QP 1 queue, and `rping -c` waited for the CM's 15 retries (more than a
/// minute). Every rocev2 process now runs its device's CM from the start, so the REQ is rejected at once with
/// reason 8, as Linux's always-on CM does, and rping reports `RDMA_CM_EVENT_REJECTED` and exits.
#[test]
fn a_request_to_a_process_without_listener_is_rejected_at_once() {
    let _turn = serial();
    let Some(ns) = setup(
        "cmrej",
        &[
            ("rping", "rdmacm-utils"),
            ("ibv_rc_pingpong", "ibverbs-utils"),
        ],
    ) else {
        return;
    };
    let dir = scratch("rdmacm-no-listener");
    let mut s = Proc::spawn(
        "verbs-only",
        &dir,
        &common::run_argv(&ns.a, IP_A, &["ibv_rc_pingpong", "-g", "0", "-p", "18525"]),
    );
    wait_socket(&mut s, "udp", ns.octets_a(), 4791, Duration::from_secs(60));
    let t0 = Instant::now();
    let mut c = Proc::spawn(
        "client",
        &dir,
        &common::run_argv(&ns.b, IP_B, &["rping", "-c", "-a", IP_A, "-C", "1", "-v"]),
    );
    let cf = c.wait(Duration::from_secs(40));
    let took = t0.elapsed();
    let out = format!("{}{}", cf.stdout, cf.stderr);
    assert!(
        !cf.status.success() && out.contains("RDMA_CM_EVENT_REJECTED") && out.contains("error 8"),
        "rping should be rejected with reason 8:\n{cf}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the REJ should come at once, not after retries: {took:?}"
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #16/#17 finding: two rdma_cm programs could not share an address — the kernel's steering handed every QP 1
/// datagram to the process of slot 0, so only it saw CM MADs (a client on the address never got its REP; a second
/// server never got its REQs: the first server rejected them, and the REJ went back to slot 0 too). Now a REQ goes to
/// the process that claimed its service ID with its listen, every other CM MAD to the process whose slot its comm
/// ID carries (`docs/MULTIPROCESS.md`, QP 1). Two `rping` servers on one address (ports 7271, 7272) and a client to
/// each on that same address, four processes in one namespace, all verify 20 pings. Skipped with the reason when the
/// kernel refuses the steering (no CAP_BPF).
#[test]
fn rdma_cm_servers_and_clients_share_one_address() {
    let _turn = serial();
    let Some(ns) = setup("cmshare", &[("rping", "rdmacm-utils")]) else {
        return;
    };
    let dir = scratch("rdmacm-shared");
    let rping = |role: &str, port: &str| {
        common::run_argv(
            &ns.a,
            IP_A,
            &[
                "rping", role, "-a", IP_A, "-p", port, "-C", "20", "-v", "-V",
            ],
        )
    };
    let mut s1 = Proc::spawn("server1", &dir, &rping("-s", "7271"));
    wait_socket(&mut s1, "udp", ns.octets_a(), 4791, Duration::from_secs(60));
    let mut s2 = Proc::spawn("server2", &dir, &rping("-s", "7272"));
    // The address's socket is there already: give the second server time to bind and listen.
    std::thread::sleep(Duration::from_millis(1500));
    if let Some(st) = s2.try_wait() {
        let out = s2.wait(Duration::from_secs(1));
        if out.stderr.contains("CAP_BPF") {
            eprintln!("skipped: the kernel refuses the steering:\n{out}");
            return;
        }
        panic!("the second server ended ({st}):\n{out}");
    }
    let mut c2 = Proc::spawn("client2", &dir, &rping("-c", "7272"));
    let mut c1 = Proc::spawn("client1", &dir, &rping("-c", "7271"));
    let results = [
        ("client1", c1.wait(Duration::from_secs(60))),
        ("client2", c2.wait(Duration::from_secs(60))),
        ("server1", s1.wait(Duration::from_secs(30))),
        ("server2", s2.wait(Duration::from_secs(30))),
    ];
    for (who, f) in &results {
        let pings = f
            .stdout
            .lines()
            .filter(|l| l.contains("ping data: rdma-ping-"))
            .count();
        assert!(
            f.status.success() && pings == 20,
            "{who}: {pings} verified pings:\n{f}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The claims of a process that died (`SIGKILL`: nothing released) do not hold its port: the service entry it left
/// names a process that is gone, so the next server on the port takes it over, and a client on the same address
/// reaches that server (`docs/MULTIPROCESS.md`, QP 1, robustness). Another process must stay on the address
/// meanwhile, or the kernel frees the maps with the last socket (then nothing is stale): here a third `rping` server
/// on another port. Skipped with the reason when the kernel refuses the steering.
#[test]
fn a_killed_servers_port_is_taken_over_by_the_next_server() {
    let _turn = serial();
    let Some(ns) = setup("cmstale", &[("rping", "rdmacm-utils")]) else {
        return;
    };
    let dir = scratch("rdmacm-stale");
    let rping = |role: &str, port: &str| {
        common::run_argv(
            &ns.a,
            IP_A,
            &["rping", role, "-a", IP_A, "-p", port, "-C", "5", "-v", "-V"],
        )
    };
    let mut keep = Proc::spawn("keeper", &dir, &rping("-s", "7281"));
    wait_socket(
        &mut keep,
        "udp",
        ns.octets_a(),
        4791,
        Duration::from_secs(60),
    );
    let mut dead = Proc::spawn("killed", &dir, &rping("-s", "7282"));
    std::thread::sleep(Duration::from_millis(1500));
    if let Some(st) = dead.try_wait() {
        let out = dead.wait(Duration::from_secs(1));
        if out.stderr.contains("CAP_BPF") {
            eprintln!("skipped: the kernel refuses the steering:\n{out}");
            return;
        }
        panic!("the server ended ({st}):\n{out}");
    }
    drop(dead); // SIGKILL: its claim of port 7282 stays in the map
    std::thread::sleep(Duration::from_millis(300));
    let mut next = Proc::spawn("next", &dir, &rping("-s", "7282"));
    std::thread::sleep(Duration::from_millis(1500));
    let mut c = Proc::spawn("client", &dir, &rping("-c", "7282"));
    for (who, f) in [
        ("client", c.wait(Duration::from_secs(60))),
        ("next server", next.wait(Duration::from_secs(30))),
    ] {
        let pings = f
            .stdout
            .lines()
            .filter(|l| l.contains("ping data: rdma-ping-"))
            .count();
        assert!(
            f.status.success() && pings == 5,
            "{who}: {pings} verified pings:\n{f}"
        );
    }
    drop(keep);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #17, `ib_send_bw -R` race: a REQ that beats the server's listen is rejected with reason 8, as by Linux's
/// CM — and neither side may hang on it. The client is told at once (`RDMA_CM_EVENT_REJECTED`, status 8) and
/// exits; the process that rejected it keeps serving its own port, and a listen made afterwards on the rejected
/// port accepts the next REQ. Here the rejecting process is an `rping` server on port 7291 (its CM runs, nothing
/// listens on 7292); then a second server listens on 7292, on the same address, and a client connects to each. A
/// guard, not a failing-first test: this held before (with one server per address).
#[test]
fn a_request_before_the_listen_is_rejected_and_the_next_one_accepted() {
    let _turn = serial();
    let Some(ns) = setup("cmlate", &[("rping", "rdmacm-utils")]) else {
        return;
    };
    let dir = scratch("rdmacm-late-listen");
    let server = |port: &str| {
        common::run_argv(
            &ns.a,
            IP_A,
            &["rping", "-s", "-a", IP_A, "-p", port, "-C", "5", "-v", "-V"],
        )
    };
    let client = |port: &str| {
        common::run_argv(
            &ns.b,
            IP_B,
            &["rping", "-c", "-a", IP_A, "-p", port, "-C", "5", "-v", "-V"],
        )
    };
    let mut s1 = Proc::spawn("server7291", &dir, &server("7291"));
    wait_socket(&mut s1, "udp", ns.octets_a(), 4791, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    let early = Proc::spawn("early", &dir, &client("7292")).wait(Duration::from_secs(30));
    let out = format!("{}{}", early.stdout, early.stderr);
    assert!(
        !early.status.success()
            && out.contains("RDMA_CM_EVENT_REJECTED")
            && out.contains("error 8"),
        "the early client is rejected with reason 8:\n{early}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    let mut s2 = Proc::spawn("server7292", &dir, &server("7292"));
    std::thread::sleep(Duration::from_millis(1500));
    let mut c2 = Proc::spawn("client7292", &dir, &client("7292"));
    let mut c1 = Proc::spawn("client7291", &dir, &client("7291"));
    for (who, f) in [
        ("client 7292", c2.wait(Duration::from_secs(60))),
        ("client 7291", c1.wait(Duration::from_secs(60))),
        ("server 7292", s2.wait(Duration::from_secs(30))),
        ("server 7291", s1.wait(Duration::from_secs(30))),
    ] {
        let pings = f
            .stdout
            .lines()
            .filter(|l| l.contains("ping data: rdma-ping-"))
            .count();
        assert!(
            f.status.success() && pings == 5,
            "{who}: {pings} verified pings:\n{f}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A REQ to an address where no rocev2 process runs (nothing bound on UDP 4791) is never answered; the requester's
/// CM re-sends it after each CM response timeout ((2 × 2^16 + 2^20) × 4.096 µs ≈ 4.8 s: packet lifetime 16,
/// response timeout 20), 15 times, then gives up, and rdma_cm reports `RDMA_CM_EVENT_UNREACHABLE` with status
/// `-ETIMEDOUT` (-110), as Linux `cma.c` does for `IB_CM_REQ_ERROR`. So `rping -c` ends after about 77 s instead of
/// waiting for ever. A guard (it held before); it takes that long.
#[test]
fn a_request_nobody_answers_ends_unreachable_after_the_cm_retries() {
    let _turn = serial();
    let Some(ns) = setup("cmunr", &[("rping", "rdmacm-utils")]) else {
        return;
    };
    let dir = scratch("rdmacm-unreachable");
    let t0 = Instant::now();
    let f = Proc::spawn(
        "client",
        &dir,
        &common::run_argv(&ns.b, IP_B, &["rping", "-c", "-a", IP_A, "-C", "1", "-v"]),
    )
    .wait(Duration::from_secs(150));
    let took = t0.elapsed();
    let out = format!("{}{}", f.stdout, f.stderr);
    assert!(
        !f.status.success() && out.contains("RDMA_CM_EVENT_UNREACHABLE, error -110"),
        "{f}"
    );
    assert!(
        (Duration::from_secs(60)..Duration::from_secs(120)).contains(&took),
        "after 16 sends 4.8 s apart: {took:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
