//! The device as programs look for it outside the verbs API: `/dev/infiniband/uverbs0`,
//! `/sys/class/infiniband/<dev>` and `/sys/class/infiniband_verbs/uverbs0`, made by `rocev2 run` in a private mount
//! namespace of the program (issue #16).
//!
//! What reads them (measured with `strace -f -e trace=file` under `rocev2 run`, Debian 12):
//! * UCX 1.13 `libuct_ib` keeps a device only if `/dev/infiniband/<ibv_device.dev_name>` is a character device
//!   the user may read and write (stat + access; it does not open it), reads
//!   `ports/<p>/gid_attrs/types/<i>` and `gid_attrs/ndevs/<i>` for the RoCE version and netdev of each GID, and
//!   `device/numa_node` / `device/local_cpus` for placement;
//! * rdma-core's tests (pyverbs) list `device/net/` for the netdev of the port;
//! * rdma-core's own libibverbs (not used under `rocev2 run`) starts from `/sys/class/infiniband_verbs/abi_version`
//!   and `uverbs*/ibdev`, `uverbs*/abi_version`.
//!
//! [`device_tree`] builds the entries from [`DeviceSpec`] and the constants of [`crate::device`] — the same facts
//! `ibv_query_device`/`ibv_query_port`/`ibv_query_gid` of rocev2's libibverbs report — in the kernel's formats
//! (Linux `drivers/infiniband/core/sysfs.c`: `node_type` `"%d: %s"`, GUIDs as four `%04x` groups, `state`
//! `"%d: %s"`, `phys_state` `"5: LinkUp"`, `rate` `"%d%s Gb/sec (%dX%s)"`, `gids/N` `%pI6` (eight groups of four
//! hex digits), `gid_attrs/types/N` `ib_cache_gid_type_str` (`"RoCE v2"`), `gid_attrs/ndevs/N` the netdev name;
//! `drivers/infiniband/core/uverbs_main.c`: `ibdev`, `abi_version`; `IB_USER_VERBS_ABI_VERSION` 6, rxe's
//! `RXE_UVERBS_ABI_VERSION` 2). [`install`] mounts them: a private mount namespace (`unshare(CLONE_NEWNS)` as
//! root, inside a new user namespace otherwise), a tmpfs over each directory (or, where the directory does not
//! exist, over its parent with every original entry bound back in place), then the files. Nothing outside the
//! namespace changes; it ends with the program.

use std::ffi::CString;
use std::fmt::Write as _;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::device::{DeviceSpec, FW_VER, UVERBS_NAME};

/// `/sys/class/infiniband_verbs/abi_version`: the kernel's `IB_USER_VERBS_ABI_VERSION`.
pub const UVERBS_CLASS_ABI: u32 = 6;
/// `/sys/class/infiniband_verbs/uverbs0/abi_version`: rxe's `RXE_UVERBS_ABI_VERSION` (the device presents rxe's
/// vendor id, [`crate::device::VENDOR_ID`]).
pub const UVERBS_DEVICE_ABI: u32 = 2;

/// One node of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    /// A directory (mode 0755).
    Dir,
    /// A regular file with this content and mode.
    File(String, u32),
    /// A symbolic link to this target.
    Link(PathBuf),
    /// This existing file (a character device) bound at the path.
    Bind(PathBuf),
}

/// A node at an absolute path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Absolute path.
    pub path: PathBuf,
    /// What is there.
    pub node: Node,
}

/// The directories [`install`] mounts a tmpfs over (each one, or its parent when it does not exist).
pub const MOUNT_POINTS: [&str; 3] = [
    "/sys/class/infiniband",
    "/sys/class/infiniband_verbs",
    "/dev/infiniband",
];

/// A 64-bit GUID (big-endian bytes) as sysfs writes it: four groups of four hex digits.
pub fn guid_text(g: [u8; 8]) -> String {
    let mut s = String::new();
    for (i, pair) in g.chunks(2).enumerate() {
        if i > 0 {
            s.push(':');
        }
        let _ = write!(s, "{:02x}{:02x}", pair[0], pair[1]);
    }
    s
}

/// A GID as the kernel's `%pI6` prints it: eight groups of four lowercase hex digits, nothing elided.
pub fn gid_sysfs_text(raw: [u8; 16]) -> String {
    let mut s = String::new();
    for (i, pair) in raw.chunks(2).enumerate() {
        if i > 0 {
            s.push(':');
        }
        let _ = write!(s, "{:02x}{:02x}", pair[0], pair[1]);
    }
    s
}

/// `rate` as `rate_show` writes it for `active_speed`/`active_width` (speeds SDR..EDR; widths 1X, 4X, 8X, 12X).
pub fn rate_text(speed: u8, width: u8) -> String {
    let (deci, name) = match speed {
        2 => (50, " DDR"),
        4 => (100, " QDR"),
        8 => (100, " FDR10"),
        16 => (140, " FDR"),
        32 => (250, " EDR"),
        _ => (25, ""),
    };
    let w = match width {
        2 => 4,
        4 => 8,
        8 => 12,
        _ => 1,
    };
    let r = deci * w;
    format!(
        "{}{} Gb/sec ({w}X{name})",
        r / 10,
        if r % 10 != 0 { ".5" } else { "" }
    )
}

/// `state` text (`"4: ACTIVE"`).
fn state_text(state: u8) -> String {
    let name = match state {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "UNKNOWN",
    };
    format!("{state}: {name}")
}

/// `phys_state` text (`"5: LinkUp"`).
fn phys_state_text(p: u8) -> String {
    let name = match p {
        1 => "Sleep",
        2 => "Polling",
        3 => "Disabled",
        4 => "PortConfigurationTraining",
        5 => "LinkUp",
        6 => "LinkErrorRecovery",
        7 => "Phy Test",
        _ => "<unknown>",
    };
    format!("{p}: {name}")
}

/// The entries for `spec` (parents before children). `net_parent`: the canonical sysfs path of the netdev's parent
/// device (`/sys/class/net/<if>/device`), if it has one: `device` then links there, as rxe's does (its parent is
/// the netdev's parent), so `device/net/<if>` and whatever that device has (`numa_node`, `local_cpus` for a PCI
/// NIC; a virtio-net parent has neither) are the real ones; a virtual netdev (`lo`, veth)
/// gets a `device` directory with `net/<if>` linking to `/sys/class/net/<if>` and `numa_node` -1 (no affinity,
/// what PCI reports without NUMA).
pub fn device_tree(spec: &DeviceSpec, net_parent: Option<&Path>) -> Vec<Entry> {
    let mut out = Vec::new();
    let dir = |p: String| Entry {
        path: PathBuf::from(p),
        node: Node::Dir,
    };
    let file = |p: String, text: String| Entry {
        path: PathBuf::from(p),
        node: Node::File(text + "\n", 0o444),
    };
    let name = spec.name();
    let ib = format!("/sys/class/infiniband/{name}");
    let guid = guid_text(spec.node_guid());
    out.push(dir(ib.clone()));
    out.push(file(format!("{ib}/node_type"), "1: CA".into()));
    out.push(file(format!("{ib}/node_guid"), guid.clone()));
    out.push(file(format!("{ib}/sys_image_guid"), guid));
    out.push(file(format!("{ib}/fw_ver"), FW_VER.into()));
    out.push(file(format!("{ib}/node_desc"), name.clone()));
    match net_parent {
        Some(p) => out.push(Entry {
            path: PathBuf::from(format!("{ib}/device")),
            node: Node::Link(p.to_path_buf()),
        }),
        None => {
            out.push(dir(format!("{ib}/device")));
            out.push(dir(format!("{ib}/device/net")));
            out.push(Entry {
                path: PathBuf::from(format!("{ib}/device/net/{}", spec.interface)),
                node: Node::Link(PathBuf::from(format!("/sys/class/net/{}", spec.interface))),
            });
            out.push(file(format!("{ib}/device/numa_node"), "-1".into()));
        }
    }
    let port = format!("{ib}/ports/1");
    out.push(dir(format!("{ib}/ports")));
    out.push(dir(port.clone()));
    out.push(file(format!("{port}/state"), state_text(spec.port_state())));
    out.push(file(
        format!("{port}/phys_state"),
        phys_state_text(spec.phys_state()),
    ));
    let (speed, width) = spec.active_speed_width();
    out.push(file(format!("{port}/rate"), rate_text(speed, width)));
    out.push(file(format!("{port}/link_layer"), "Ethernet".into()));
    out.push(file(format!("{port}/lid"), "0x0".into()));
    out.push(file(format!("{port}/sm_lid"), "0x0".into()));
    out.push(file(format!("{port}/lid_mask_count"), "0".into()));
    out.push(file(format!("{port}/sm_sl"), "0".into()));
    out.push(file(format!("{port}/cap_mask"), "0x00000000".into()));
    out.push(dir(format!("{port}/pkeys")));
    out.push(file(format!("{port}/pkeys/0"), "0xffff".into()));
    out.push(dir(format!("{port}/gids")));
    out.push(dir(format!("{port}/gid_attrs")));
    out.push(dir(format!("{port}/gid_attrs/types")));
    out.push(dir(format!("{port}/gid_attrs/ndevs")));
    for (i, g) in spec.gids().iter().enumerate() {
        out.push(file(format!("{port}/gids/{i}"), gid_sysfs_text(g.0)));
        out.push(file(
            format!("{port}/gid_attrs/types/{i}"),
            "RoCE v2".into(),
        ));
        out.push(file(
            format!("{port}/gid_attrs/ndevs/{i}"),
            spec.interface.clone(),
        ));
    }
    let uv = format!("/sys/class/infiniband_verbs/{UVERBS_NAME}");
    out.push(file(
        "/sys/class/infiniband_verbs/abi_version".into(),
        UVERBS_CLASS_ABI.to_string(),
    ));
    out.push(dir(uv.clone()));
    out.push(file(format!("{uv}/ibdev"), name));
    out.push(file(
        format!("{uv}/abi_version"),
        UVERBS_DEVICE_ABI.to_string(),
    ));
    // The uverbs device. UCX keeps a device only if this is a character device (`S_ISCHR`) the user may read and
    // write (`access(R_OK | W_OK)`) — a regular file is not enough (measured, and UCX 1.13
    // `uct_ib_device_is_accessible` says so); it never opens it. `/dev/null` bound here is such a device, one every
    // user may open in either namespace (making a device node needs CAP_MKNOD): reads end at once, writes are
    // discarded, and the library behind the program is rocev2's, which issues no uverbs commands.
    out.push(Entry {
        path: PathBuf::from(format!("/dev/infiniband/{UVERBS_NAME}")),
        node: Node::Bind(PathBuf::from("/dev/null")),
    });
    out
}

/// The canonical path of `/sys/class/net/<ifname>/device`, if the netdev has a parent device.
pub fn net_parent(ifname: &str) -> Option<PathBuf> {
    std::fs::canonicalize(format!("/sys/class/net/{ifname}/device")).ok()
}

/// How [`install`] got its mount namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Namespace {
    /// `unshare(CLONE_NEWNS)` with `CAP_SYS_ADMIN`.
    Mount,
    /// `unshare(CLONE_NEWUSER | CLONE_NEWNS)`: an unprivileged user namespace mapping the caller's uid and gid to
    /// themselves (the program keeps its ids and loses the namespace's capabilities at `exec`).
    User,
}

/// Why [`install`] could not make the tree.
#[derive(Debug)]
pub struct InstallError {
    /// What failed (`unshare(CLONE_NEWNS)`, `mount tmpfs on /sys/class`, ...).
    pub step: String,
    /// The error.
    pub error: io::Error,
}

impl std::fmt::Display for InstallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.error)?;
        match self.error.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => write!(
                f,
                " (needs root, or unprivileged user namespaces: kernel.unprivileged_userns_clone=1, \
                 kernel.apparmor_restrict_unprivileged_userns=0)"
            ),
            Some(libc::ENOSPC) => {
                write!(f, " (the user.max_user_namespaces limit is reached or 0)")
            }
            _ => Ok(()),
        }
    }
}

impl std::error::Error for InstallError {}

fn err(step: impl Into<String>) -> impl FnOnce(io::Error) -> InstallError {
    let step = step.into();
    move |error| InstallError { step, error }
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `mount(2)`.
fn mount(
    src: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let src = src.map(cstr).transpose()?;
    let target = cstr(target)?;
    let fstype = fstype.map(CString::new).transpose()?;
    let data = data.map(CString::new).transpose()?;
    let p = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is NULL or a NUL-terminated string that lives across the call.
    check(unsafe { libc::mount(p(&src), target.as_ptr(), p(&fstype), flags, p(&data).cast()) })
}

fn tmpfs(target: &Path) -> io::Result<()> {
    mount(
        Some(Path::new("tmpfs")),
        target,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=0755,size=1m"),
    )
}

/// Enters a private mount namespace: as root `unshare(CLONE_NEWNS)`; otherwise, or if that is refused, a new
/// user namespace with the caller's ids mapped to themselves. Must run while the process has one thread (a user
/// namespace requires it).
fn enter_namespace() -> Result<Namespace, InstallError> {
    // SAFETY: plain syscalls without pointers.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    // As root, a mount namespace; its refusal (no CAP_SYS_ADMIN) is named if the user namespace fails too.
    let mut refused = None;
    if uid == 0 {
        // SAFETY: as above.
        match check(unsafe { libc::unshare(libc::CLONE_NEWNS) }) {
            Ok(()) => refused = Some(None),
            Err(e) => refused = Some(Some(e)),
        }
    }
    let ns = if matches!(refused, Some(None)) {
        Namespace::Mount
    } else {
        let step = match refused.flatten() {
            Some(e) => format!("unshare(CLONE_NEWNS): {e}; unshare(CLONE_NEWUSER | CLONE_NEWNS)"),
            None => "unshare(CLONE_NEWUSER | CLONE_NEWNS)".to_owned(),
        };
        // SAFETY: as above.
        check(unsafe { libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) })
            .map_err(err(step))?;
        std::fs::write("/proc/self/setgroups", "deny")
            .map_err(err("writing /proc/self/setgroups"))?;
        std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))
            .map_err(err("writing /proc/self/uid_map"))?;
        std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
            .map_err(err("writing /proc/self/gid_map"))?;
        Namespace::User
    };
    mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
    .map_err(err("making / private (mount --make-rprivate /)"))?;
    Ok(ns)
}

/// Mounts a tmpfs over `parent` that shows everything `parent` showed: each original entry is bound back in place
/// (directories and files, with everything mounted below them) or recreated (symbolic links), so new entries can be
/// added beside them without touching the original file system.
fn shadow(parent: &Path) -> Result<(), InstallError> {
    let names: Vec<_> = std::fs::read_dir(parent)
        .map_err(err(format!("listing {}", parent.display())))?
        .filter_map(|e| e.ok())
        .collect();
    let orig = std::fs::File::open(parent).map_err(err(format!("opening {}", parent.display())))?;
    let via = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&orig)
    ));
    tmpfs(parent).map_err(err(format!("mounting a tmpfs on {}", parent.display())))?;
    for e in names {
        let name = e.file_name();
        let (from, to) = (via.join(&name), parent.join(&name));
        let Ok(ft) = e.file_type() else { continue };
        let r = if ft.is_symlink() {
            std::fs::read_link(&from).and_then(|t| std::os::unix::fs::symlink(t, &to))
        } else {
            let made = if ft.is_dir() {
                std::fs::create_dir(&to)
            } else {
                std::fs::File::create(&to).map(drop)
            };
            made.and_then(|()| mount(Some(&from), &to, None, libc::MS_BIND | libc::MS_REC, None))
        };
        r.map_err(err(format!("putting {} back", to.display())))?;
    }
    Ok(())
}

/// Writes `entries` (parents first) into a private mount namespace of this process: a tmpfs is mounted over each
/// of [`MOUNT_POINTS`]; where one does not exist, its parent is first covered by `shadow` and the directory made
/// in that. Call it in the process that then `exec`s the program, while it has one thread.
pub fn install(entries: &[Entry]) -> Result<Namespace, InstallError> {
    let ns = enter_namespace()?;
    let mut shadowed: Vec<&Path> = Vec::new();
    for mp in MOUNT_POINTS.map(Path::new) {
        if !mp.is_dir() {
            let parent = mp.parent().unwrap_or(Path::new("/"));
            if !shadowed.contains(&parent) {
                shadow(parent)?;
                shadowed.push(parent);
            }
            std::fs::create_dir(mp).map_err(err(format!("making {}", mp.display())))?;
        }
        tmpfs(mp).map_err(err(format!("mounting a tmpfs on {}", mp.display())))?;
    }
    for e in entries {
        let r = match &e.node {
            Node::Dir => std::fs::create_dir_all(&e.path),
            Node::File(text, mode) => std::fs::write(&e.path, text).and_then(|()| {
                std::fs::set_permissions(
                    &e.path,
                    std::os::unix::fs::PermissionsExt::from_mode(*mode),
                )
            }),
            Node::Link(t) => std::os::unix::fs::symlink(t, &e.path),
            Node::Bind(src) => std::fs::File::create(&e.path)
                .and_then(|_| mount(Some(src), &e.path, None, libc::MS_BIND, None)),
        };
        r.map_err(err(format!("making {}", e.path.display())))?;
    }
    Ok(ns)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RxMode;
    use crate::device::gid_of;

    #[test]
    fn formats_are_the_kernels() {
        assert_eq!(
            guid_text([0, 0, 127, 0xff, 0xfe, 0, 0, 1]),
            "0000:7fff:fe00:0001"
        );
        let g = gid_of("127.0.0.1".parse().expect("ip"));
        assert_eq!(
            gid_sysfs_text(g.0),
            "0000:0000:0000:0000:0000:ffff:7f00:0001"
        );
        assert_eq!(rate_text(1, 1), "2.5 Gb/sec (1X)");
        assert_eq!(rate_text(32, 2), "100 Gb/sec (4X EDR)");
        assert_eq!(rate_text(4, 1), "10 Gb/sec (1X QDR)");
        assert_eq!(state_text(4), "4: ACTIVE");
        assert_eq!(phys_state_text(5), "5: LinkUp");
    }

    #[test]
    fn the_tree_of_a_loopback_device() {
        let d = DeviceSpec::for_ip("127.0.0.1".parse().expect("ip"), RxMode::Socket).expect("lo");
        let t = device_tree(&d, None);
        let get = |p: &str| {
            t.iter()
                .find(|e| e.path == Path::new(p))
                .map(|e| e.node.clone())
        };
        let ib = format!("/sys/class/infiniband/{}", d.name());
        let f = |s: &str| Some(Node::File(format!("{s}\n"), 0o444));
        assert_eq!(get(&format!("{ib}/node_type")), f("1: CA"));
        assert_eq!(
            get(&format!("{ib}/ports/1/gid_attrs/types/0")),
            f("RoCE v2")
        );
        assert_eq!(
            get(&format!("{ib}/ports/1/gid_attrs/ndevs/0")),
            f(&d.interface)
        );
        assert_eq!(
            get(&format!("{ib}/device/net/{}", d.interface)),
            Some(Node::Link(PathBuf::from(format!(
                "/sys/class/net/{}",
                d.interface
            ))))
        );
        assert_eq!(
            get("/dev/infiniband/uverbs0"),
            Some(Node::Bind(PathBuf::from("/dev/null")))
        );
        // Parents come before children (the mount points are made by `install`).
        for (i, e) in t.iter().enumerate() {
            if let Some(p) = e
                .path
                .parent()
                .filter(|p| !MOUNT_POINTS.map(Path::new).contains(p))
            {
                assert!(
                    t[..i].iter().any(|x| x.path == p),
                    "{} before its parent",
                    e.path.display()
                );
            }
        }
    }
}
