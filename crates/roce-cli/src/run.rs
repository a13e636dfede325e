//! `rocev2 run [--ip ADDR] [--rx socket|packet] [--link udp|xdp] [--pcap FILE] -- PROGRAM ARGS`: runs an
//! unmodified libibverbs program on the rocev2 software RNIC.
//!
//! The program is executed (this process is replaced) with a directory holding rocev2's `libibverbs.so.1`
//! (crate `roce-ibverbs`, built as `libroce_ibverbs.so` next to the `rocev2` binary) first on `LD_LIBRARY_PATH`,
//! and the device's address in the environment ([`roce_link::device::ENV_IP`], [`roce_link::device::ENV_RX`],
//! [`roce_link::device::ENV_LINK`], [`roce_link::device::ENV_PCAP`]). Debian's binaries have no RPATH, so the dynamic loader takes our library
//! (`docs/spec/LIBIBVERBS-ABI.md` §1.1).
//! The program then sees one device, `rocev2_<interface>` (the interface owning the address, as `rocev2 devinfo`
//! names it), whose port is the address's GID.
//!
//! Programs that look for the device outside the verbs API (UCX requires `/dev/infiniband/uverbs0`; UCX and
//! pyverbs read `/sys/class/infiniband/<dev>` for GID types, the port's netdev, the NUMA node) find it too: before
//! the `exec`, this process enters a private mount namespace and makes those files there
//! ([`roce_link::devfs`]), from the facts the library reports. As root that is a mount namespace; otherwise an
//! unprivileged user namespace. When neither is allowed it says why and runs the program without them
//! (`--no-device-files` skips them).

use std::ffi::OsString;
use std::net::IpAddr;
use std::os::unix::fs::DirBuilderExt as _;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use roce_link::devfs;
use roce_link::device::{DeviceSpec, ENV_IP, ENV_LINK, ENV_PCAP, ENV_RX, UVERBS_NAME};
use roce_link::udp::interfaces;

/// Environment variable naming the rocev2 libibverbs to use instead of `libroce_ibverbs.so` beside `rocev2`: a
/// file this user or root owns that group and others cannot write (else refused); its `libibverbs.so.1` link goes
/// into this user's private directory, never beside it.
pub const ENV_LIB: &str = "ROCEV2_IBVERBS_LIB";

/// `rocev2 run` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// Local address of the device (UDP 4791 is bound on it when the program creates its first verbs object).
    /// Default: the first IPv4 address of an interface that is up, not loopback; else 127.0.0.1.
    #[arg(long)]
    pub ip: Option<IpAddr>,
    /// Receive path: `socket` (the UDP socket; enough for rocev2 peers) or `packet` (AF_PACKET: verifies the ICRC
    /// of peers that number their IPv4 IDs, such as Linux rxe; needs CAP_NET_RAW).
    #[arg(long, default_value = "socket", value_parser = ["socket", "packet"])]
    pub rx: String,
    /// Link: `udp` (kernel UDP sockets) or `xdp` (AF_XDP on the interface that owns the address, as
    /// `rocev2 perf --link xdp`; when it cannot be used the library says why and uses udp). Over xdp the program
    /// has the address to itself: a second process on it is refused (docs/DEVICE.md, "Link").
    #[arg(long, default_value = "udp", value_parser = ["udp", "xdp"])]
    pub link: String,
    /// Write every frame the device's link sends and receives to this pcap file (as `rocev2 perf --pcap`; one
    /// process per file: a forked child that opens the device afresh would write over it).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Do not make `/dev/infiniband/uverbs0` and `/sys/class/infiniband/<dev>` for the program (they are made in a
    /// private mount namespace of the program, so nothing outside it changes).
    #[arg(long)]
    pub no_device_files: bool,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub program: Vec<OsString>,
}

/// The default address: the first IPv4 address of an up, non-loopback interface, else 127.0.0.1.
fn default_ip() -> IpAddr {
    interfaces()
        .ok()
        .and_then(|all| {
            all.into_iter()
                .filter(|i| i.up && !i.loopback)
                .flat_map(|i| i.addrs)
                .find(IpAddr::is_ipv4)
        })
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// The rocev2 libibverbs and whether it was named by [`ENV_LIB`]: `$ROCEV2_IBVERBS_LIB`, else
/// `libroce_ibverbs.so` in the directory of this executable. A named library must be a regular file owned by this
/// user or root and not writable by group or others ([`file_trusted`]): the program will run its code.
fn library() -> Result<(PathBuf, bool), String> {
    if let Some(p) = std::env::var_os(ENV_LIB) {
        let p = PathBuf::from(p);
        file_trusted(&p, &[uid(), 0]).map_err(|why| {
            format!(
                "{ENV_LIB}={}: {why}; refused: the program would load code another user controls",
                p.display()
            )
        })?;
        return Ok((p, true));
    }
    let exe = std::env::current_exe().map_err(|e| format!("locating rocev2: {e}"))?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    let lib = dir.join("libroce_ibverbs.so");
    if lib.is_file() {
        Ok((lib, false))
    } else {
        Err(format!(
            "{} not found: {} (or name the library with {ENV_LIB})",
            lib.display(),
            build_hint(dir)
        ))
    }
}

/// This process's user id (the owner of `/proc/self`).
fn uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(0)
}

/// Whether `file` (symbolic links followed) is a regular file owned by one of `owners` and not writable by group
/// or others. Errors say why not.
fn file_trusted(file: &Path, owners: &[u32]) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(file).map_err(|e| e.to_string())?;
    if !m.is_file() {
        return Err("not a regular file".to_owned());
    }
    if !owners.contains(&m.uid()) {
        return Err(format!(
            "belongs to uid {}, neither this user ({}) nor root",
            m.uid(),
            owners[0]
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!(
            "writable by group or others (mode {:o})",
            m.mode() & 0o7777
        ));
    }
    Ok(())
}

/// The one command that puts `libroce_ibverbs.so` beside a `rocev2` in `dir`: the build command of README's Quick
/// start (`cargo build --release`), which builds rocev2 and both libraries (`libroce_ibverbs.so`,
/// `libroce_rdmacm.so`) in one go with the workspace's feature set (a `-p roce-ibverbs` build selects another one,
/// so alternating the two rebuilds the libraries). Cargo's `target/release` and `target/debug` are told apart by
/// their name (a debug `rocev2` next to a release library would not find it: `cargo build` there); anywhere else
/// the libraries have to be built and copied there.
fn build_hint(dir: &Path) -> String {
    let profile = dir.file_name().and_then(|n| n.to_str());
    match profile {
        Some("release") => {
            "build it with `cargo build --release` in the rocev2 checkout (README's build command: \
                            rocev2, libroce_ibverbs.so and libroce_rdmacm.so together)"
                .to_string()
        }
        Some("debug") => {
            "build it with `cargo build` in the rocev2 checkout (rocev2, libroce_ibverbs.so and \
                          libroce_rdmacm.so together, debug profile)"
                .to_string()
        }
        _ => format!(
            "build it in the rocev2 checkout with `cargo build --release` (README's build command) and copy \
             target/release/libroce_ibverbs.so and target/release/libroce_rdmacm.so to {}",
            dir.display()
        ),
    }
}

/// A directory whose `libibverbs.so.1` is a link to `lib` (and `librdmacm.so.1` to `libroce_rdmacm.so` when that
/// was built beside it; the second result says whether it was): for the library beside `rocev2` (`named` false),
/// `<dir of lib>/rocev2-ibverbs/` when writable; else, and always for a library named with [`ENV_LIB`] (nothing
/// is created beside a path given from outside), this user's private `$TMPDIR/rocev2-ibverbs-<uid>/`. The link is
/// replaced atomically (a rename), so concurrent runs never see it missing.
fn library_dir(lib: &Path, named: bool) -> Result<(PathBuf, bool), String> {
    let lib = lib
        .canonicalize()
        .map_err(|e| format!("{}: {e}", lib.display()))?;
    let uid = uid();
    // The directory goes first on the program's LD_LIBRARY_PATH: whoever can write to it chooses the code the
    // program loads. So it must be controlled by its owner alone (`dir_trusted`: no symlink, not group- or
    // other-writable), and that owner must be this user — or root, for the directory beside an installed library.
    // A directory another user planted in the shared temporary directory is refused, never used.
    // Beside the library the directory is readable by all (another user's program under `rocev2 run` loads the same
    // link from it); in the shared temporary directory it is this user's only.
    let beside = (!named)
        .then(|| {
            lib.parent()
                .map(|d| (d.join("rocev2-ibverbs"), vec![uid, 0], 0o755))
        })
        .flatten();
    let candidates = [
        beside,
        Some((
            std::env::temp_dir().join(format!("rocev2-ibverbs-{uid}")),
            vec![uid],
            0o700,
        )),
    ];
    let mut last = String::new();
    for (dir, owners, mode) in candidates.into_iter().flatten() {
        if std::fs::symlink_metadata(&dir).is_err() {
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(&dir);
        }
        if let Err(why) = roce_verbs::endpoint::dir_trusted(&dir, &owners) {
            last = format!("{why}: not used for the library");
            continue;
        }
        // rocev2's librdmacm.so.1 (crate `roce-rdmacm`) goes beside it when it was built next to the libibverbs.
        let rdmacm = lib.with_file_name("libroce_rdmacm.so");
        let mut made = link_into(&dir, &lib, "libibverbs.so.1");
        // A named library's sibling must pass the same ownership check as the library itself.
        let with_rdmacm = rdmacm.is_file() && (!named || file_trusted(&rdmacm, &[uid, 0]).is_ok());
        if made.is_ok() && with_rdmacm {
            made = link_into(&dir, &rdmacm, "librdmacm.so.1");
        }
        match made {
            Ok(()) => return Ok((dir, with_rdmacm)),
            Err(e) => last = format!("{}: {e}", dir.display()),
        }
    }
    Err(format!("making a directory for libibverbs.so.1: {last}"))
}

/// Makes `dir/name` a link to `target`, unless it already is one; replaced atomically (a rename).
fn link_into(dir: &Path, target: &Path, name: &str) -> std::io::Result<()> {
    let link = dir.join(name);
    if std::fs::read_link(&link).is_ok_and(|t| t == target) {
        return Ok(());
    }
    let tmp = dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).and_then(|()| std::fs::rename(&tmp, &link))
}

/// Runs `rocev2 run`: returns only on error (the program replaces this process).
pub fn run(a: &RunArgs) -> ExitCode {
    match exec(a) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("rocev2 run: {e}");
            ExitCode::from(2)
        }
    }
}

fn exec(a: &RunArgs) -> Result<std::convert::Infallible, String> {
    let ip = a.ip.unwrap_or_else(default_ip);
    // Check the address now, so a typo is reported here and not as "no devices" by the program.
    let spec = DeviceSpec::for_ip(ip, roce_link::RxMode::Socket)?;
    let (lib, named) = library()?;
    let (dir, with_rdmacm) = library_dir(&lib, named)?;
    let (prog, args) = a.program.split_first().ok_or("no program given")?;
    if !with_rdmacm && names_librdmacm(prog) {
        eprintln!("rocev2 run: {}", rdmacm_missing_note(&lib, prog));
    }
    if !a.no_device_files {
        let tree = devfs::device_tree(&spec, devfs::net_parent(&spec.interface).as_deref());
        if let Err(e) = devfs::install(&tree) {
            eprintln!(
                "rocev2 run: the program gets no /dev/infiniband/{UVERBS_NAME} and no /sys/class/infiniband/{} (a \
                 private mount namespace is needed for them: {e}); running it without them",
                spec.name()
            );
        }
    }
    let mut path = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", path)
        .env(ENV_IP, ip.to_string())
        .env(ENV_RX, &a.rx)
        .env(ENV_LINK, &a.link);
    match &a.pcap {
        Some(p) => cmd.env(ENV_PCAP, p),
        None => cmd.env_remove(ENV_PCAP),
    };
    let err = cmd.exec();
    Err(format!("executing {}: {err}", prog.to_string_lossy()))
}

/// Whether the program `prog` (found on `PATH` like `exec` finds it) names `librdmacm.so.1`: a program linked with
/// librdmacm has the name in its dynamic string table (`DT_NEEDED`), and one that loads it with `dlopen` has it as a
/// string too. A program that reaches librdmacm only through another library (a Python extension module, a UCX
/// plug-in) is not recognised. At most the first 256 MiB of the file are read; unreadable means no.
fn names_librdmacm(prog: &std::ffi::OsStr) -> bool {
    const NAME: &[u8] = b"librdmacm.so.1";
    let path = Path::new(prog);
    let file = if path.components().count() > 1 {
        Some(path.to_path_buf())
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(path))
                .find(|f| f.is_file())
        })
    };
    let Some(file) = file else { return false };
    let Ok(f) = std::fs::File::open(&file) else {
        return false;
    };
    let mut bytes = Vec::new();
    if std::io::Read::read_to_end(&mut std::io::Read::take(f, 256 << 20), &mut bytes).is_err() {
        return false;
    }
    bytes.windows(NAME.len()).any(|w| w == NAME)
}

/// The note for a program that uses librdmacm when rocev2's (`libroce_rdmacm.so` beside `lib`) is not there:
/// without it the dynamic loader takes the system's librdmacm, which needs the kernel's rdma_cm
/// (`/dev/infiniband/rdma_cm`), and the program's first rdma_cm call fails.
fn rdmacm_missing_note(lib: &Path, prog: &std::ffi::OsStr) -> String {
    let rdmacm = lib.with_file_name("libroce_rdmacm.so");
    let build = match lib
        .parent()
        .and_then(|d| d.file_name())
        .and_then(|n| n.to_str())
    {
        Some("debug") => "`cargo build` in the rocev2 checkout".to_string(),
        Some("release") => {
            "`cargo build --release` in the rocev2 checkout (README's build command)".to_string()
        }
        _ => format!(
            "`cargo build --release` in the rocev2 checkout (README's build command) and copy \
             target/release/libroce_rdmacm.so to {}",
            rdmacm.display()
        ),
    };
    let why = if rdmacm.is_file() {
        "is not owned by this user or root, or group or others may write to it"
    } else {
        "is missing"
    };
    format!(
        "note: {} uses librdmacm, but rocev2's librdmacm.so.1 ({}) {why}: its rdma_cm calls will fail (\"failed to \
         create RDMA CM event channel\"); build it with {build}",
        prog.to_string_lossy(),
        rdmacm.display()
    )
}
