//! UCX, the communication library under Open MPI and most HPC and AI frameworks, on rocev2 (issue #16): Debian 12's
//! unmodified UCX 1.13 `ucx_perftest` between two network namespaces, each side under `rocev2 run`, runs UCP's
//! tag-matching latency and bandwidth (`tag_lat`, `tag_bw`, also with 1 MB messages: rendezvous over RDMA READ),
//! RMA put bandwidth and get (`ucp_put_bw`, `ucp_get`) and active-message latency (UCT's `am_lat` on the transport,
//! UCP's `ucp_am_lat` where UCX chooses) — over UCX's `rc_verbs` transport (RC QPs, with `ud_verbs` for its wire-up),
//! over `ud_verbs` alone, and with UCX's defaults (no UCX_* variable at all). Every run must exit 0 on both sides,
//! the client must print its `Final:` line with every iteration, neither side may log a UCX `ERROR`, and the two
//! namespaces must have received at least one UDP datagram per iteration (`/proc/net/snmp` `Udp: InDatagrams`: the
//! traffic went over rocev2, not shared memory or TCP). UCX only takes a verbs device it finds as programs look for
//! one (`/dev/infiniband/uverbs0`, `/sys/class/infiniband/...`), with the symbols, SRQs, async events and 6-SGE UD
//! QPs it needs, so these runs cover all of them at once.
//!
//! UCX's defaults pick shared memory (`sysv`, `cma`) between two processes that share the host's boot id and IPC and
//! PID namespaces, network namespaces or not — UCX's reachability rules, whatever the RNIC (`docs/UCX.md`). The
//! defaults run therefore gives each side its own IPC and PID namespaces too (`unshare --ipc --pid --fork`), as two
//! hosts or two containers look to UCX, and UCX then picks `rc_verbs` on rocev2 by itself; a fourth test keeps the
//! one-host set-up (shared memory, rocev2's device opened and an `rc_verbs` lane configured beside it) and checks that
//! both sides complete (`tag_lat`, `tag_bw`). A fifth connects through a socket address with UCX's `rdmacm`
//! connection manager on rocev2's `librdmacm.so.1` (`io_demo`; `ucx_perftest` has no such mode). Needs root, `ip netns`, `unshare` and Debian's `ucx-utils` (installed by
//! `.ci/run`); otherwise skipped with the reason.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{NetnsPair, Proc, netns_unavailable, scratch, serial, strings};

/// `ucx_perftest`'s default TCP port for its out-of-band exchange.
const PORT: u16 = 13337;
/// The rocev2 device of the namespaces' `veth0`, as UCT tests name it (`-d`).
const DEVICE: &str = "rocev2_veth0:1";

/// How the two sides are set up.
#[derive(Clone, Copy)]
enum Mode {
    /// `UCX_TLS=<value>` on both sides.
    Tls(&'static str),
    /// No UCX_* variable; each side in its own IPC and PID namespaces as well (a host of its own to UCX).
    Defaults,
    /// No UCX_* variable, network namespaces only: one host to UCX, which takes shared memory (rocev2's device is
    /// still opened and an `rc_verbs` lane configured beside it).
    DefaultsOneHost,
}

/// `ip netns exec NS [unshare ...] env [-u UCX_*...] [UCX_TLS=...] ROCEV2 run -- ucx_perftest [PEER] ARGS`.
fn argv(ns: &str, mode: Mode, args: &[&str], peer: Option<&str>) -> Vec<String> {
    let mut v = strings(&["ip", "netns", "exec", ns]);
    if let Mode::Defaults = mode {
        v.extend(strings(&["unshare", "--ipc", "--pid", "--fork"]));
    }
    v.push("env".to_owned());
    // Nothing of the test's own environment may choose for UCX.
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str().filter(|k| k.starts_with("UCX_")) {
            v.extend(strings(&["-u", k]));
        }
    }
    if let Mode::Tls(tls) = mode {
        v.push(format!("UCX_TLS={tls}"));
    }
    v.extend(strings(&[common::bin(), "run", "--", "ucx_perftest"]));
    v.extend(peer.map(str::to_owned));
    v.extend(strings(args));
    v
}

/// Waits until something in namespace `ns` listens on TCP `port` (the server's out-of-band socket; the server may
/// run in a PID namespace of its own, so this reads the namespace's `/proc/net/tcp`, never connecting).
fn wait_listening(ns: &str, port: u16, server: &mut Proc) {
    let t0 = Instant::now();
    let want = format!(":{port:04X} 00000000:0000 0A");
    loop {
        let out = Command::new("ip")
            .args(["netns", "exec", ns, "cat", "/proc/net/tcp"])
            .output()
            .expect("read /proc/net/tcp");
        if String::from_utf8_lossy(&out.stdout).contains(&want) {
            return;
        }
        if server.try_wait().is_some() || t0.elapsed() > Duration::from_secs(60) {
            panic!(
                "server not listening on {port}:\n{}",
                server.output_so_far()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `ucx_perftest ARGS -n ITERS` with the server in `ns.a` and the client in `ns.b`; checks both exit statuses,
/// the client's `Final:` line, that neither logs a UCX ERROR and that at least `iters` UDP datagrams arrived (not
/// in [`Mode::DefaultsOneHost`], where UCX takes shared memory).
fn run(ns: &NetnsPair, mode: Mode, what: &str, args: &[&str], iters: u32) {
    let dir = scratch("ucx");
    let n = iters.to_string();
    let mut args = args.to_vec();
    args.extend(["-n", &n, "-w", "10"]);
    let before = common::udp_in_datagrams(&ns.a) + common::udp_in_datagrams(&ns.b);
    let mut server = Proc::spawn("server", &dir, &argv(&ns.a, mode, &args, None));
    wait_listening(&ns.a, PORT, &mut server);
    let mut client = Proc::spawn("client", &dir, &argv(&ns.b, mode, &args, Some(&ns.ip_a)));
    let c = client.wait(Duration::from_secs(120));
    let s = server.wait(Duration::from_secs(60));
    let datagrams = common::udp_in_datagrams(&ns.a) + common::udp_in_datagrams(&ns.b) - before;
    assert!(
        c.status.success(),
        "{what}: client failed:\n{c}\nserver:\n{s}"
    );
    assert!(
        s.status.success(),
        "{what}: server failed:\n{s}\nclient:\n{c}"
    );
    let last = c
        .stdout
        .lines()
        .find(|l| l.starts_with("Final:"))
        .unwrap_or_else(|| panic!("{what}: no Final line:\n{c}"));
    let f: Vec<&str> = last.split_whitespace().collect();
    assert_eq!(f.get(1), Some(&n.as_str()), "{what}: {last}");
    for p in [&s, &c] {
        assert!(
            !p.stderr.contains(" ERROR "),
            "{what}: UCX reported an error:\n{p}"
        );
    }
    assert!(
        matches!(mode, Mode::DefaultsOneHost) || datagrams >= u64::from(iters),
        "{what}: only {datagrams} UDP datagrams for {iters} iterations: not over rocev2?\n{c}"
    );
    eprintln!("{what}: {last} ({datagrams} UDP datagrams)");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Skips (printing why) unless root, `ip netns`, `unshare` and `ucx_perftest` are there.
fn unavailable() -> Option<String> {
    netns_unavailable()
        .or_else(|| common::program_missing("ucx_perftest", "ucx-utils"))
        .or_else(|| common::program_missing("unshare", "util-linux"))
}

/// The UCP tests every mode runs, and the active-message test: UCT's `am_lat` on `uct_tl`, else `ucp_am_lat`.
fn run_all(tag: &str, ip_a: &str, ip_b: &str, mode: Mode, uct_tl: Option<&str>) {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    common::c_libraries();
    let _turn = serial();
    let ns = NetnsPair::up(tag, ip_a, ip_b, 1500);
    ns.wait_running();
    let name = match mode {
        Mode::Tls(t) => t,
        Mode::Defaults => "UCX defaults",
        Mode::DefaultsOneHost => "UCX defaults, one host",
    };
    for (test, size, iters) in [
        ("tag_lat", "8", 200),
        ("tag_bw", "8", 200),
        ("tag_bw", "1000000", 20),
        ("ucp_put_bw", "8", 200),
        ("ucp_get", "8", 200),
    ] {
        let what = format!("{name} {test} -s {size}");
        run(&ns, mode, &what, &["-t", test, "-s", size], iters);
    }
    match uct_tl {
        Some(tl) => run(
            &ns,
            mode,
            &format!("{name} am_lat -x {tl}"),
            &["-t", "am_lat", "-x", tl, "-d", DEVICE],
            200,
        ),
        None => run(
            &ns,
            mode,
            &format!("{name} ucp_am_lat"),
            &["-t", "ucp_am_lat"],
            200,
        ),
    }
}

#[test]
fn ucx_perftest_over_rc_verbs_between_namespaces() {
    run_all(
        "ucxrc",
        "198.18.42.1",
        "198.18.42.2",
        Mode::Tls("rc_verbs,ud_verbs,self"),
        Some("rc_verbs"),
    );
}

#[test]
fn ucx_perftest_over_ud_verbs_between_namespaces() {
    run_all(
        "ucxud",
        "198.18.42.5",
        "198.18.42.6",
        Mode::Tls("ud_verbs,self"),
        Some("ud_verbs"),
    );
}

#[test]
fn ucx_perftest_with_ucx_defaults_between_two_hosts_of_namespaces() {
    run_all(
        "ucxdef",
        "198.18.42.9",
        "198.18.42.10",
        Mode::Defaults,
        None,
    );
}

/// UCX's defaults between two network namespaces that share the IPC and PID namespaces: UCX takes shared memory,
/// but opens rocev2's device and configures an `rc_verbs` lane on the way (`UCX_LOG_LEVEL=info`: `ep_cfg[0]:
/// tag(sysv/memory cma/memory rc_verbs/rocev2_veth0:1)`); both sides still complete.
#[test]
fn ucx_perftest_with_ucx_defaults_between_namespaces_of_one_host() {
    if let Some(why) = unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    common::c_libraries();
    let _turn = serial();
    let ns = NetnsPair::up("ucxone", "198.18.42.13", "198.18.42.14", 1500);
    ns.wait_running();
    for test in ["tag_lat", "tag_bw"] {
        let what = format!("UCX defaults, one host, {test}");
        run(&ns, Mode::DefaultsOneHost, &what, &["-t", test], 200);
    }
}

/// UCX's client-server connections through a socket address (`ucp_listener_create` / `ucp_ep_create` with
/// `UCP_EP_PARAM_FIELD_SOCK_ADDR`), the path that goes through a connection manager — UCX 1.13's default
/// `UCX_SOCKADDR_TLS_PRIORITY=rdmacm,tcp,sockcm` takes the `rdmacm` component, i.e. rocev2's `librdmacm.so.1`.
/// `ucx_perftest` 1.13 has no such mode (it exchanges worker addresses over its own TCP socket), so the program is
/// `io_demo`, UCX's own client-server demo in the same `ucx-utils` package: the server listens on TCP port 20001's
/// address, the client connects to it and runs 200 read and write transactions of 1 KiB–64 KiB with io_demo's data
/// and transaction checks (`-q`), then must print `Client exit with status 'OK'` and exit 0. No UCX_* variable
/// chooses anything: `UCX_LOG_LEVEL=debug` on the client only makes UCX say which CM it used, and the client must
/// have used `cm rdmacm` (not the `tcp` CM fallback). Addresses 198.18.24.5/6.
#[test]
fn ucx_io_demo_connects_through_rdmacm_sockaddr_between_namespaces() {
    if let Some(why) = unavailable().or_else(|| common::program_missing("io_demo", "ucx-utils")) {
        eprintln!("skipped: {why}");
        return;
    }
    common::c_libraries();
    let _turn = serial();
    let ns = NetnsPair::up("ucxcm", "198.18.24.5", "198.18.24.6", 1500);
    ns.wait_running();
    let dir = scratch("ucx-io_demo");
    let io_demo = |ns_name: &str, env: &[&str], args: &[&str]| {
        let mut v = strings(&["ip", "netns", "exec", ns_name, "env"]);
        for (k, _) in std::env::vars_os() {
            if let Some(k) = k.to_str().filter(|k| k.starts_with("UCX_")) {
                v.extend(strings(&["-u", k]));
            }
        }
        v.extend(strings(env));
        v.extend(strings(&[common::bin(), "run", "--", "io_demo"]));
        v.extend(strings(args));
        v
    };
    let common_args = [
        "-p",
        "20001",
        "-q",
        "-o",
        "read,write",
        "-d",
        "1024:65536",
        "-i",
        "200",
    ];
    let mut server = Proc::spawn("server", &dir, &io_demo(&ns.a, &[], &common_args));
    let t0 = Instant::now();
    while !server.output_so_far().contains("started listener") {
        assert!(
            server.try_wait().is_none() && t0.elapsed() < Duration::from_secs(60),
            "io_demo server did not listen:\n{}",
            server.output_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = common::udp_in_datagrams(&ns.a) + common::udp_in_datagrams(&ns.b);
    let mut args = common_args.to_vec();
    args.push(&ns.ip_a);
    let mut client = Proc::spawn(
        "client",
        &dir,
        &io_demo(&ns.b, &["UCX_LOG_LEVEL=debug"], &args),
    );
    let c = client.wait(Duration::from_secs(60));
    let datagrams = common::udp_in_datagrams(&ns.a) + common::udp_in_datagrams(&ns.b) - before;
    let server_out = server.output_so_far();
    drop(server);
    assert!(
        c.status.success(),
        "io_demo client failed:\n{c}\nserver:\n{server_out}"
    );
    assert!(c.stdout.contains("Client exit with status 'OK'"), "{c}");
    let all = format!("{}{}", c.stdout, c.stderr);
    assert!(
        all.contains("lane[0]: cm rdmacm") && all.contains("created an endpoint on rdmacm"),
        "the client did not connect through UCX's rdmacm CM:\n{c}"
    );
    assert!(!all.contains(" ERROR "), "UCX reported an error:\n{c}");
    assert!(
        datagrams >= 200,
        "only {datagrams} UDP datagrams: not over rocev2?\n{c}"
    );
    eprintln!("io_demo over rdmacm: ok ({datagrams} UDP datagrams)");
    let _ = std::fs::remove_dir_all(&dir);
}
