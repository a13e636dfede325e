//! Open MPI on rocev2 (issue #16): Debian 12's unmodified Open MPI 4.1 `mpirun` runs four ranks of a small MPI
//! program kept in the repository (`tests/mpi/pingpong_allreduce.c`, built here with `mpicc`), two in each of two
//! network namespaces, every rank under `rocev2 run`, over PML ucx (`--mca pml ucx`, which fails the job when UCX
//! cannot be used). The two ranks of a namespace share its one device address (UDP 4791 through SO_REUSEPORT and
//! the kernel's QPN steering, `docs/MULTIPROCESS.md`). The program checks every byte of its ping-pong between rank 0
//! and rank 3 (one per namespace) and every element of its allreduces; the test checks its exit status, its
//! `pingpong ok=yes` / `allreduce ok=yes` lines and that ranks 0, 1 ran in namespace A on address A and ranks 2, 3 in
//! namespace B on address B.
//!
//! Three runs: with `UCX_TLS=rc_verbs,ud_verbs,self`, so every pair of ranks — the two on one address too — talks
//! over rocev2; with UCX's defaults (no UCX_* setting) and each rank in its own IPC and PID namespaces (`unshare`),
//! where UCX picks rocev2 between all ranks by itself; and with UCX's defaults on one host, where UCX mixes shared
//! memory and `rc_verbs` (`docs/UCX.md`). The first two must also have put at least two UDP datagrams per ping-pong
//! round trip into the namespaces (`/proc/net/snmp`): their traffic crossed rocev2.
//!
//! mpirun reaches the other namespace through its launch agent: `--mca plm_rsh_agent tests/mpi/rsh-netns` with
//! `--host ADDR_A:2,ADDR_B:2`; mpirun runs in namespace A (so ADDR_A is its own host) and starts its daemon for
//! ADDR_B as `rsh-netns ADDR_B orted ...`, which runs it in the namespace owning that address (of the two named in
//! `RSH_NETNS`). Needs root (`ip netns`, CAP_BPF for the shared address) and Debian's `openmpi-bin` and
//! `libopenmpi-dev` (mpicc); otherwise skipped with the reason.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{NetnsPair, Proc, netns_unavailable, scratch, serial, strings};

const IP_A: &str = "198.18.44.1";
const IP_B: &str = "198.18.44.2";

fn tests_mpi() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mpi")
}

/// The network namespace `ns` as `/proc/self/ns/net` names it (`net:[INODE]`).
fn netns_id(ns: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "readlink", "/proc/self/ns/net"])
        .output()
        .expect("ip netns exec readlink");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[test]
fn mpirun_four_ranks_two_per_address_over_pml_ucx_between_namespaces() {
    if let Some(why) = netns_unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    for (program, package) in [("mpirun", "openmpi-bin"), ("mpicc", "libopenmpi-dev")] {
        if let Some(why) = common::program_missing(program, package) {
            eprintln!("skipped: {why}");
            return;
        }
    }
    common::c_libraries();
    let dir = scratch("mpi");
    let exe = dir.join("pingpong_allreduce");
    let cc = Command::new("mpicc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(tests_mpi().join("pingpong_allreduce.c"))
        .output()
        .expect("run mpicc");
    assert!(cc.status.success(), "mpicc failed: {cc:?}");

    let _turn = serial();
    let ns = NetnsPair::up("mpi", IP_A, IP_B, 1500);
    ns.wait_running();
    let (id_a, id_b) = (netns_id(&ns.a), netns_id(&ns.b));
    assert!(id_a.starts_with("net:") && id_a != id_b, "{id_a} {id_b}");
    let agent = tests_mpi().join("rsh-netns");
    let iters = "200";
    // (what, UCX_TLS, each rank in its own IPC and PID namespaces, traffic must cross rocev2)
    for (what, tls, isolate, over_rocev2) in [
        (
            "UCX_TLS=rc_verbs,ud_verbs,self",
            Some("rc_verbs,ud_verbs,self"),
            false,
            true,
        ),
        ("UCX defaults, ranks as hosts", None, true, true),
        ("UCX defaults, one host", None, false, false),
    ] {
        let before = common::udp_in_datagrams(&ns.a) + common::udp_in_datagrams(&ns.b);
        let mut argv = strings(&[
            "ip",
            "netns",
            "exec",
            &ns.a,
            "env",
            &format!("RSH_NETNS={} {}", ns.a, ns.b),
            "mpirun",
            "--allow-run-as-root",
            "--oversubscribe",
            "--timeout",
            "90",
            "--mca",
            "plm_rsh_agent",
            agent.to_str().expect("utf-8 path"),
            "--host",
            &format!("{IP_A}:2,{IP_B}:2"),
            "-np",
            "4",
            "--mca",
            "pml",
            "ucx",
        ]);
        if let Some(tls) = tls {
            argv.extend(strings(&["-x", &format!("UCX_TLS={tls}")]));
        }
        if isolate {
            argv.extend(strings(&["unshare", "--ipc", "--pid", "--fork"]));
        }
        argv.extend(strings(&[common::bin(), "run", "--"]));
        argv.push(exe.to_str().expect("utf-8 path").to_owned());
        argv.extend(strings(&[iters, "4096"]));
        let f = Proc::spawn("mpirun", &dir, &argv).wait(Duration::from_secs(120));
        assert!(f.status.success(), "{what}: mpirun failed:\n{f}");
        let line = |prefix: &str| {
            f.stdout
                .lines()
                .find(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("{what}: no `{prefix}` line:\n{f}"))
                .to_owned()
        };
        let pp = line("pingpong ");
        assert!(
            pp.starts_with(&format!(
                "pingpong ok=yes ranks 0<->3 iterations {iters} size 4096 "
            )),
            "{what}: {pp}"
        );
        let ar = line("allreduce ");
        assert!(
            ar.starts_with("allreduce ok=yes ranks 4 ") && ar.ends_with(" failures 0"),
            "{what}: {ar}"
        );
        for (rank, id, ip) in [
            (0, &id_a, IP_A),
            (1, &id_a, IP_A),
            (2, &id_b, IP_B),
            (3, &id_b, IP_B),
        ] {
            let l = line(&format!("rank {rank} of 4 "));
            assert!(
                l.ends_with(&format!(" netns {id} device address {ip}")),
                "{what}: rank {rank} ran elsewhere: {l}"
            );
            let c = line(&format!("rank {rank} checked "));
            assert!(c.ends_with(", 0 failures"), "{what}: {c}");
        }
        let datagrams = common::udp_in_datagrams(&ns.a) + common::udp_in_datagrams(&ns.b) - before;
        assert!(
            !over_rocev2 || datagrams >= 2 * iters.parse::<u64>().expect("number"),
            "{what}: only {datagrams} UDP datagrams for {iters} round trips: not over rocev2?\n{f}"
        );
        eprintln!("{what}: {pp} ({datagrams} UDP datagrams)");
    }
}
