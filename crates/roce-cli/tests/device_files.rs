//! The device as programs look for it outside the verbs API, under `rocev2 run` (issue #16; `roce_link::devfs`):
//!
//! * the program sees `/sys/class/infiniband/<dev>` whose every file agrees with what Debian's unmodified
//!   `ibv_devinfo -v` reports through rocev2's library in the same kind of run (node and system GUID, firmware,
//!   port state, physical state, rate = width x speed, link layer, GID 0 and its type), plus `gid_attrs/ndevs`,
//!   `device/net/<if>` (the real netdev), `device/numa_node`, `/sys/class/infiniband_verbs/{abi_version,
//!   uverbs0/ibdev}`, and a `/dev/infiniband/uverbs0` that is a character device it can open read-write — while
//!   nothing changes outside the program's mount namespace; the same holds for an unprivileged user (a user
//!   namespace), and when neither namespace can be had the program still runs, after a message naming the cause;
//! * UCX 1.13's `ucx_info -d` accepts the device: it lists it with its transports, or — while the library still
//!   lacks symbols `libuct_ib` imports (another part of issue #16) — dies at the first of them, which it reaches
//!   only after it has found the device accessible (without the device files it lists no IB device and exits 0).
//!
//! Needs root (or unprivileged user namespaces) for the namespace and `ibverbs-utils`; `ucx-utils` for the UCX part.

mod common;

use std::collections::HashMap;
use std::net::Ipv6Addr;
use std::path::Path;
use std::process::{Command, Output};

fn library() {
    common::c_libraries();
}

/// `PREFIX... rocev2 run --ip 127.0.0.1 [EXTRA] -- ARGS`, waited for.
fn run(prefix: &[&str], extra: &[&str], args: &[&str]) -> Output {
    library();
    let mut all: Vec<&str> = prefix.to_vec();
    all.extend([common::bin(), "run", "--ip", "127.0.0.1"]);
    all.extend(extra);
    all.push("--");
    all.extend(args);
    common::output_within(Command::new(all[0]).args(&all[1..]), common::RUN)
}

/// True when this test runs as root (the owner of `/proc/self`).
fn root() -> bool {
    std::fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
}

fn installed(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

/// Prints `path=content` for each file of the tree the checks read, and what the program can do with the device.
const SCRIPT: &str = r#"
set -e
dev=$(ls /sys/class/infiniband)
d=/sys/class/infiniband/$dev
echo "dev=$dev"
for f in node_type node_guid sys_image_guid fw_ver ports/1/state ports/1/phys_state ports/1/rate \
         ports/1/link_layer ports/1/gids/0 ports/1/gid_attrs/types/0 ports/1/gid_attrs/ndevs/0 device/numa_node; do
    echo "$f=$(cat $d/$f)"
done
echo "net=$(ls $d/device/net)"
echo "net_ifindex=$(cat $d/device/net/*/ifindex)"
echo "ibdev=$(cat /sys/class/infiniband_verbs/uverbs0/ibdev)"
echo "abi=$(cat /sys/class/infiniband_verbs/abi_version)"
test -c /dev/infiniband/uverbs0 && test -r /dev/infiniband/uverbs0 && test -w /dev/infiniband/uverbs0
: <> /dev/infiniband/uverbs0
echo "uverbs0=rw"
echo "class_net=$(ls /sys/class/net | wc -l)"
"#;

fn pairs(text: &str, sep: char) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(sep))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// The tree seen by the program run with `prefix` (as root: none; unprivileged: `setpriv ...`), checked against
/// `ibv_devinfo -v` run as root.
fn check_tree(prefix: &[&str]) {
    let out = run(prefix, &[], &["sh", "-c", SCRIPT]);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let t = pairs(&String::from_utf8_lossy(&out.stdout), '=');
    let info = run(&[], &[], &["ibv_devinfo", "-v"]);
    assert!(info.status.success(), "{info:?}");
    let v = pairs(&String::from_utf8_lossy(&info.stdout), ':');
    let get = |m: &HashMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();

    assert_eq!(get(&t, "dev"), get(&v, "hca_id"), "{t:#?}");
    assert_eq!(get(&t, "node_type"), "1: CA");
    // ibv_devinfo prints GUIDs as the kernel's sysfs does (four groups of four hex digits).
    assert_eq!(get(&t, "node_guid"), get(&v, "node_guid"));
    assert_eq!(get(&t, "sys_image_guid"), get(&v, "sys_image_guid"));
    assert_eq!(get(&t, "fw_ver"), get(&v, "fw_ver"));
    assert_eq!(get(&v, "state"), "PORT_ACTIVE (4)");
    assert_eq!(get(&t, "ports/1/state"), "4: ACTIVE");
    assert_eq!(get(&v, "phys_state"), "LINK_UP (5)");
    assert_eq!(get(&t, "ports/1/phys_state"), "5: LinkUp");
    // rate = active_width x active_speed: `lo` reports no speed, so 1X (1) at 2.5 Gbps (1), what rxe reports for it
    // (Linux `ib_get_eth_speed` assumes 1000 Mb/s).
    assert_eq!(
        (get(&v, "active_width"), get(&v, "active_speed")),
        ("1X (1)".to_owned(), "2.5 Gbps (1)".to_owned())
    );
    assert_eq!(get(&t, "ports/1/rate"), "2.5 Gb/sec (1X)");
    assert_eq!(get(&t, "ports/1/link_layer"), get(&v, "link_layer"));
    // GID 0: sysfs writes all eight groups (`%pI6`); the same address and type as ibv_query_gid(_type).
    let gid0 = get(&v, "GID[  0]");
    let (addr, kind) = gid0.split_once(", ").expect("GID[0] line");
    let sys = get(&t, "ports/1/gids/0");
    assert_eq!(sys.len(), 39, "{sys}");
    assert_eq!(
        sys.parse::<Ipv6Addr>().expect("sysfs gid"),
        addr.parse::<Ipv6Addr>().expect("devinfo gid")
    );
    assert_eq!(get(&t, "ports/1/gid_attrs/types/0"), kind);
    // The netdev of the GID and of the device: the interface that owns 127.0.0.1, the real one.
    assert_eq!(get(&t, "ports/1/gid_attrs/ndevs/0"), "lo");
    assert_eq!(get(&t, "net"), "lo");
    let ifindex = std::fs::read_to_string("/sys/class/net/lo/ifindex").expect("lo ifindex");
    assert_eq!(get(&t, "net_ifindex"), ifindex.trim());
    assert_eq!(get(&t, "device/numa_node"), "-1");
    assert_eq!(get(&t, "ibdev"), get(&v, "hca_id"));
    assert_eq!(get(&t, "abi"), "6");
    assert_eq!(get(&t, "uverbs0"), "rw");
    // Everything else under /sys/class is still there.
    let n = std::fs::read_dir("/sys/class/net")
        .expect("class/net")
        .count();
    assert_eq!(get(&t, "class_net"), n.to_string());
}

#[test]
fn the_program_sees_a_device_tree_that_agrees_with_the_library() {
    let _g = common::serial();
    assert!(
        installed("ibv_devinfo"),
        "ibv_devinfo not found: install Debian's ibverbs-utils (.ci/run does)"
    );
    if !root() {
        eprintln!(
            "skipped: the root case needs root (the unprivileged case is covered when root can drop to nobody)"
        );
        return;
    }
    let before = (
        Path::new("/sys/class/infiniband").exists(),
        Path::new("/dev/infiniband").exists(),
    );
    check_tree(&[]);
    // Nothing leaked out of the program's namespace.
    let after = (
        Path::new("/sys/class/infiniband").exists(),
        Path::new("/dev/infiniband").exists(),
    );
    assert_eq!(before, after);

    // An unprivileged user gets the same tree through a user namespace (when the host allows them).
    if installed("setpriv") {
        let nobody = [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ];
        let probe = Command::new("setpriv")
            .args(&nobody[1..])
            .args(["unshare", "-U", "true"])
            .output()
            .expect("setpriv");
        if probe.status.success() {
            check_tree(&nobody);
        } else {
            eprintln!("unprivileged case skipped: no user namespaces for nobody here: {probe:?}");
        }
    }
}

#[test]
fn without_a_namespace_the_program_runs_after_a_message() {
    let _g = common::serial();
    if !installed("setpriv") || !installed("unshare") {
        eprintln!("skipped: needs setpriv and unshare (util-linux)");
        return;
    }
    // In a user namespace of our own whose limit on nested user namespaces is 0, and without CAP_SYS_ADMIN: neither
    // a mount namespace nor a user namespace can be had.
    let script = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --bounding-set -sys_admin --inh-caps -sys_admin \
         {} run --ip 127.0.0.1 -- sh -c 'test -e /dev/infiniband/uverbs0 || echo ran-without'",
        common::bin()
    );
    library();
    let out = common::output_within(
        Command::new("unshare").args(["-U", "-r", "sh", "-c", &script]),
        common::RUN,
    );
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unshare failed") {
        eprintln!("skipped: no user namespace for the test itself: {out:?}");
        return;
    }
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ran-without");
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "rocev2 run: the program gets no /dev/infiniband/uverbs0",
        "unshare(CLONE_NEWNS): Operation not permitted",
        "unshare(CLONE_NEWUSER | CLONE_NEWNS): No space left on device",
        "user.max_user_namespaces",
        "running it without them",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
    // `--no-device-files`: none, and no message.
    let out = run(
        &[],
        &["--no-device-files"],
        &["sh", "-c", "test -e /sys/class/infiniband || echo none"],
    );
    assert!(out.status.success() && out.stderr.is_empty(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "none");
}

#[test]
fn ucx_info_finds_the_device() {
    let _g = common::serial();
    if !installed("ucx_info") {
        eprintln!("skipped: ucx_info not found (Debian's ucx-utils)");
        return;
    }
    if !root() {
        eprintln!("skipped: needs root for the mount namespace");
        return;
    }
    let out = run(&[], &[], &["ucx_info", "-d"]);
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    if se.contains("libuct_ib.so") && se.contains("undefined symbol: ibv_") {
        // Reached only after `uct_ib_device_is_accessible` accepted /dev/infiniband/uverbs0 (the symbol is first
        // called when the memory domain opens); the missing symbols are another part of issue #16.
        eprintln!("ucx_info stops at a symbol the library lacks: {se}");
        return;
    }
    assert!(
        so.contains("# Memory domain: rocev2_lo"),
        "no rocev2 memory domain:\n{so}\n{se}"
    );
    assert!(
        so.contains("Transport: ud_verbs") && so.contains("Device: rocev2_lo:1"),
        "no ud_verbs transport on rocev2_lo:1:\n{so}\n{se}"
    );
}

/// Breaker finding (issue #21): `rocev2 run` puts a directory holding its `libibverbs.so.1` link first on the
/// program's `LD_LIBRARY_PATH`; when it could not write beside the library (an installed copy), it used
/// `$TMPDIR/rocev2-ibverbs-<uid>` without asking who owns it, so another local user who created that directory
/// world-writable chose the code the victim's program loaded. Such a directory is now refused.
#[test]
fn a_library_directory_another_user_planted_is_refused() {
    if !root() || !installed("setpriv") {
        eprintln!("skipped: needs root and setpriv to act as two users");
        return;
    }
    library();
    use std::os::unix::fs::PermissionsExt as _;
    let mode = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod")
    };
    // An installed copy: rocev2 and its library in a directory of root's that nobody cannot write to.
    let inst = common::scratch("planted-install");
    mode(&inst, 0o755);
    let bin_dir = Path::new(common::bin()).parent().expect("bin dir");
    for f in ["rocev2", "libroce_ibverbs.so"] {
        std::fs::copy(bin_dir.join(f), inst.join(f)).expect("copy");
    }
    // nobody's temporary directory holds a world-writable `rocev2-ibverbs-65534` another user (root) made.
    let tmp = common::scratch("planted-tmp");
    mode(&tmp, 0o755);
    let planted = tmp.join("rocev2-ibverbs-65534");
    std::fs::create_dir(&planted).expect("plant");
    mode(&planted, 0o777);
    let out = common::output_within(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "env"])
            .arg(format!("TMPDIR={}", tmp.display()))
            .arg(inst.join("rocev2"))
            .args(["run", "--ip", "127.0.0.1", "--", "true"]),
        common::RUN,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !planted.join("libibverbs.so.1").exists(),
        "the library was linked into a directory another user controls: {err}"
    );
    assert!(
        !out.status.success(),
        "ran with a planted library directory: {err}"
    );
    assert!(err.contains("not used for the library"), "{err}");
    let _ = std::fs::remove_dir_all(&inst);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Breaker finding (issue #21): `ROCEV2_IBVERBS_LIB=PATH` made `rocev2 run` create `rocev2-ibverbs/` beside any
/// PATH it was given (as root: in any directory of the system). A named library now gets its `libibverbs.so.1` link
/// only in this user's private directory (`$TMPDIR/rocev2-ibverbs-<uid>`, mode 0700, checked), nothing is created
/// beside it, and a library this user (or root) does not own, or that group or others may write, is refused with
/// the reason: the program would load code another user controls.
#[test]
fn a_named_library_creates_nothing_beside_it_and_must_be_ours() {
    library();
    let bin_dir = Path::new(common::bin()).parent().expect("bin dir");
    let scratch = common::scratch("named-lib");
    let tmp = scratch.join("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let place = scratch.join("elsewhere");
    std::fs::create_dir(&place).expect("dir");
    let lib = place.join("my-libibverbs.so");
    std::fs::copy(bin_dir.join("libroce_ibverbs.so"), &lib).expect("copy");
    let run_with = |lib: &Path| {
        common::output_within(
            Command::new(common::bin())
                .args([
                    "run",
                    "--no-device-files",
                    "--ip",
                    "127.0.0.1",
                    "--",
                    "true",
                ])
                .env("ROCEV2_IBVERBS_LIB", lib)
                .env("TMPDIR", &tmp),
            common::RUN,
        )
    };
    let out = run_with(&lib);
    assert!(out.status.success(), "{out:?}");
    let beside: Vec<_> = std::fs::read_dir(&place)
        .expect("list")
        .filter_map(|e| e.ok().map(|e| e.file_name()))
        .collect();
    assert_eq!(
        beside,
        [std::ffi::OsString::from("my-libibverbs.so")],
        "created beside the library"
    );
    // The link is in this user's private directory.
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .expect("uid");
    let private = tmp.join(format!("rocev2-ibverbs-{uid}"));
    assert_eq!(
        std::fs::read_link(private.join("libibverbs.so.1")).ok(),
        Some(lib.canonicalize().expect("canonical"))
    );
    // A library another user may write to is refused, and said so.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let out = run_with(&lib);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        err.contains("ROCEV2_IBVERBS_LIB") && err.contains("writable by group or others"),
        "{err}"
    );
    // As root: a library of another user is refused too.
    if root() {
        std::fs::set_permissions(&lib, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::chown(&lib, Some(65534), Some(65534)).expect("chown");
        let out = run_with(&lib);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        assert!(err.contains("belongs to uid 65534"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
