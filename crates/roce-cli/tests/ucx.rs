//! UCX, the communication library under Open MPI and most HPC and AI frameworks, on rocev2 (issue #16): Debian 12's
//! unmodified UCX 1.13 `ucx_perftest` runs its tag-matching latency test between two network namespaces, each side
//! under `rocev2 run`, over UCX's `rc_verbs` transport (RC QPs, with `ud_verbs` for its wire-up) and over `ud_verbs`
//! alone; both sides must exit 0 and the client must print its `Final:` line for every iteration. UCX only takes a
//! verbs device it finds as programs look for one (`/dev/infiniband/uverbs0`, `/sys/class/infiniband/...`), with the
//! symbols, SRQs, async events and 6-SGE UD QPs it needs, so this test covers all of them at once.
//!
//! `UCX_TLS` selects the transports because UCX prefers shared memory between two processes of one host, namespaces
//! or not. Needs root, `ip netns` and Debian's `ucx-utils` (installed by `.ci/run`); otherwise skipped with the reason.

mod common;

use std::time::Duration;

use common::{NetnsPair, Proc, netns_unavailable, scratch, serial, strings, wait_socket};

const IP_A: &str = "198.18.42.1";
const IP_B: &str = "198.18.42.2";
/// `ucx_perftest`'s default TCP port for its out-of-band exchange.
const PORT: u16 = 13337;

/// `ip netns exec NS env UCX_TLS=TLS ROCEV2 run --ip IP -- ucx_perftest ARGS [PEER]`.
fn argv(ns: &str, tls: &str, ip: &str, args: &[&str], peer: Option<&str>) -> Vec<String> {
    let mut v = strings(&[
        "ip",
        "netns",
        "exec",
        ns,
        "env",
        &format!("UCX_TLS={tls}"),
        common::bin(),
        "run",
        "--ip",
        ip,
        "--",
        "ucx_perftest",
    ]);
    v.extend(peer.map(str::to_owned));
    v.extend(strings(args));
    v
}

#[test]
fn ucx_perftest_tag_latency_over_rc_verbs_and_ud_verbs_between_namespaces() {
    if let Some(why) = netns_unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    common::need_program("ucx_perftest", "ucx-utils");
    common::ibverbs_library();
    let _turn = serial();
    let ns = NetnsPair::up("ucx", IP_A, IP_B, 1500);
    ns.wait_running();
    let dir = scratch("ucx");
    let iters = "500";
    for tls in ["rc_verbs,ud_verbs,self", "ud_verbs,self"] {
        let args = ["-t", "tag_lat", "-n", iters];
        let mut server = Proc::spawn("server", &dir, &argv(&ns.a, tls, IP_A, &args, None));
        wait_socket(
            &mut server,
            "tcp",
            [0, 0, 0, 0],
            PORT,
            Duration::from_secs(60),
        );
        let mut client = Proc::spawn("client", &dir, &argv(&ns.b, tls, IP_B, &args, Some(IP_A)));
        let c = client.wait(Duration::from_secs(120));
        let s = server.wait(Duration::from_secs(60));
        assert!(
            c.status.success(),
            "{tls}: client failed:\n{c}\nserver:\n{s}"
        );
        assert!(
            s.status.success(),
            "{tls}: server failed:\n{s}\nclient:\n{c}"
        );
        let last = c
            .stdout
            .lines()
            .find(|l| l.starts_with("Final:"))
            .unwrap_or_else(|| panic!("{tls}: no Final line:\n{c}"));
        let n: Vec<&str> = last.split_whitespace().collect();
        assert_eq!(n.get(1), Some(&iters), "{tls}: {last}");
        for f in [&s, &c] {
            assert!(
                !f.stderr.contains(" ERROR "),
                "{tls}: UCX reported an error:\n{f}"
            );
        }
    }
}
