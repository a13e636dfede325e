//! Many processes on one device address (`docs/MULTIPROCESS.md`): the UDP 4791 sockets of every process on an
//! address form one `SO_REUSEPORT` group, and an `SK_REUSEPORT` eBPF program hands each datagram to the socket of the
//! process owning its destination QPN.
//!
//! The 24-bit QPN space is cut into [`SLOTS`] slots of 65 536 QPNs; a process claims slot *k* by inserting its socket
//! at index *k* of a shared `BPF_MAP_TYPE_REUSEPORT_SOCKARRAY` map with `BPF_NOEXIST` (atomic; the kernel removes the
//! socket when it is closed, so the slot frees itself), and numbers its QPs from `k << 16`. The program
//! ([`program`]) reads the first byte of the BTH DestQP field and selects the socket at that index; datagrams too
//! short for a BTH, or for a slot nobody holds, fall back to the kernel's hash selection. The map is found by its
//! name ([`map_name`]) among the host's BPF maps, or made, under a lock (a file lock in a directory only the joining
//! user controls, see `Lock`) so concurrent starts agree on one map.
//!
//! The program is hand-assembled (`docs/MULTIPROCESS.md` §6: aya loads only ELF objects, and building one needs a
//! BPF toolchain this project does not have) and loaded with the `bpf(2)` system call. Everything here needs
//! `CAP_BPF` + `CAP_NET_ADMIN` (or `CAP_SYS_ADMIN`); [`ReuseportError`] says so when the kernel refuses.

use std::hash::Hasher as _;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt as _;

/// Slots (processes) per address: one per value of the DestQP's most significant byte.
pub const SLOTS: u32 = 256;
/// QPNs per slot: slot *k* owns `k << QPN_SHIFT .. (k + 1) << QPN_SHIFT`.
pub const QPN_SHIFT: u32 = 16;

// bpf(2) commands and constants (Linux include/uapi/linux/bpf.h).
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_GET_NEXT_ID: libc::c_long = 12;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_MAP_TYPE_REUSEPORT_SOCKARRAY: u32 = 20;
const BPF_PROG_TYPE_SK_REUSEPORT: u32 = 21;
const BPF_NOEXIST: u64 = 1;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_FUNC_SKB_LOAD_BYTES: i32 = 26;
const BPF_FUNC_SK_SELECT_REUSEPORT: i32 = 82;
/// `SO_ATTACH_REUSEPORT_EBPF` (include/uapi/asm-generic/socket.h).
const SO_ATTACH_REUSEPORT_EBPF: libc::c_int = 52;

/// One eBPF instruction (`struct bpf_insn`): opcode, destination and source registers, offset, immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Insn {
    /// Opcode.
    pub code: u8,
    /// Destination register (low nibble) and source register (high nibble).
    pub regs: u8,
    /// Signed offset.
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: dst | (src << 4),
        off,
        imm,
    }
}

/// The steering program for map `map_fd` (20 instruction slots; `docs/MULTIPROCESS.md` lists it as assembly):
/// load BTH bytes 4..8 (UDP offset 12) to the stack, key = `DestQP[23:16]`, `bpf_sk_select_reuseport(ctx, map, &key,
/// 0)`, return `SK_PASS` (a failed load or selection leaves the choice to the kernel's hash).
pub fn program(map_fd: RawFd) -> [Insn; 20] {
    const R0: u8 = 0;
    const R1: u8 = 1;
    const R2: u8 = 2;
    const R3: u8 = 3;
    const R4: u8 = 4;
    const R6: u8 = 6;
    const R10: u8 = 10;
    [
        insn(0xbf, R6, R1, 0, 0),                          // r6 = r1 (ctx)
        insn(0xb7, R2, 0, 0, 12),                          // r2 = 12: UDP header + BTH bytes 0..3
        insn(0xbf, R3, R10, 0, 0),                         // r3 = r10
        insn(0x07, R3, 0, 0, -8),                          // r3 += -8
        insn(0xb7, R4, 0, 0, 4),                           // r4 = 4
        insn(0x85, 0, 0, 0, BPF_FUNC_SKB_LOAD_BYTES),      // call bpf_skb_load_bytes
        insn(0x55, R0, 0, 11, 0),                          // if r0 != 0 goto pass
        insn(0x61, R0, R10, -8, 0),                        // r0 = *(u32 *)(r10 - 8)
        insn(0x77, R0, 0, 0, 8),                           // r0 >>= 8
        insn(0x57, R0, 0, 0, 0xff),                        // r0 &= 0xff: DestQP[23:16]
        insn(0x63, R10, R0, -4, 0),                        // *(u32 *)(r10 - 4) = r0
        insn(0xbf, R1, R6, 0, 0),                          // r1 = ctx
        insn(0x18, R2, BPF_PSEUDO_MAP_FD, 0, map_fd),      // r2 = map (ld_imm64, low half)
        insn(0x00, 0, 0, 0, 0),                            //          (high half)
        insn(0xbf, R3, R10, 0, 0),                         // r3 = r10
        insn(0x07, R3, 0, 0, -4),                          // r3 += -4: &key
        insn(0xb7, R4, 0, 0, 0),                           // r4 = 0
        insn(0x85, 0, 0, 0, BPF_FUNC_SK_SELECT_REUSEPORT), // call bpf_sk_select_reuseport
        insn(0xb7, R0, 0, 0, 1),                           // pass: r0 = SK_PASS
        insn(0x95, 0, 0, 0, 0),                            // exit
    ]
}

/// `rocev2_` + 8 hex digits of a hash of `local` and the network namespace `netns` (its inode number): BPF maps are
/// host-wide, reuseport groups are per namespace. BPF object names hold at most 15 characters.
pub fn map_name(local: SocketAddr, netns: u64) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    h.write_u64(netns);
    match local {
        SocketAddr::V4(a) => h.write(&a.ip().octets()),
        SocketAddr::V6(a) => h.write(&a.ip().octets()),
    }
    h.write_u16(local.port());
    format!("rocev2_{:08x}", h.finish() as u32)
}

/// Why joining failed.
#[derive(Debug)]
pub struct ReuseportError {
    /// What failed.
    pub step: &'static str,
    /// The error.
    pub error: io::Error,
}

impl std::fmt::Display for ReuseportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.step, self.error)?;
        if matches!(self.error.raw_os_error(), Some(libc::EPERM | libc::EACCES)) {
            write!(
                f,
                " (an SK_REUSEPORT program and its map need CAP_BPF and CAP_NET_ADMIN, or CAP_SYS_ADMIN)"
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for ReuseportError {}

fn fail(step: &'static str) -> impl FnOnce(io::Error) -> ReuseportError {
    move |error| ReuseportError { step, error }
}

/// A `union bpf_attr` image: zeroed, fields written at their offsets.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Attr {
        Attr([0; 128])
    }
    fn u32(&mut self, off: usize, v: u32) -> &mut Self {
        self.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn u64(&mut self, off: usize, v: u64) -> &mut Self {
        self.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }
    fn bytes(&mut self, off: usize, v: &[u8]) -> &mut Self {
        self.0[off..off + v.len()].copy_from_slice(v);
        self
    }
    fn get_u32(&self, off: usize) -> u32 {
        let mut b = [0; 4];
        b.copy_from_slice(&self.0[off..off + 4]);
        u32::from_ne_bytes(b)
    }
}

/// `bpf(cmd, attr, sizeof attr)`: the non-negative result, or the error.
fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, writable 128-byte `union bpf_attr` image (zero past the fields this command
    // reads); every pointer written into it points to memory that outlives the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.0.as_mut_ptr(), attr.0.len()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fd_of(r: libc::c_long) -> OwnedFd {
    // SAFETY: `r` is a file descriptor the kernel just returned to us and nothing else owns.
    unsafe { OwnedFd::from_raw_fd(r as RawFd) }
}

/// The name of map `fd` (`BPF_OBJ_GET_INFO_BY_FD`).
fn name_of(fd: &OwnedFd) -> io::Result<String> {
    let mut info = [0u8; 40];
    let mut a = Attr::new();
    a.u32(0, fd.as_raw_fd() as u32)
        .u32(4, info.len() as u32)
        .u64(8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    let name = &info[24..40];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// The host's map named `name`, if any (walks the map ids).
fn find_map(name: &str) -> io::Result<Option<OwnedFd>> {
    let mut id = 0u32;
    loop {
        let mut a = Attr::new();
        a.u32(0, id);
        match bpf(BPF_MAP_GET_NEXT_ID, &mut a) {
            Ok(_) => id = a.get_u32(4),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut g = Attr::new();
        g.u32(0, id);
        let fd = match bpf(BPF_MAP_GET_FD_BY_ID, &mut g) {
            Ok(fd) => fd_of(fd),
            // Freed between the two calls.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            Err(e) => return Err(e),
        };
        if name_of(&fd)? == name {
            return Ok(Some(fd));
        }
    }
}

fn create_map(name: &str) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY)
        .u32(4, 4)
        .u32(8, 4)
        .u32(12, SLOTS)
        .bytes(28, name.as_bytes());
    bpf(BPF_MAP_CREATE, &mut a).map(fd_of)
}

fn load_program(map: &OwnedFd) -> io::Result<OwnedFd> {
    let prog = program(map.as_raw_fd());
    let license = c"MIT OR Apache-2.0";
    let mut a = Attr::new();
    a.u32(0, BPF_PROG_TYPE_SK_REUSEPORT)
        .u32(4, prog.len() as u32)
        .u64(8, prog.as_ptr() as u64)
        .u64(16, license.as_ptr() as u64)
        .bytes(48, b"rocev2_steer");
    bpf(BPF_PROG_LOAD, &mut a).map(fd_of)
}

/// A lock held while it lives: an exclusive `flock` on `<dir>/<name>.lock` in a directory only the joining user
/// controls ([`lock_dir`]); released when the holder exits, crash included (the kernel drops a dead process's
/// locks; only a crashed holder leaves its empty file behind, for the next join to use). Not an abstract Unix socket name: any local user can bind any
/// such name first and hold it forever, which denied every join of the address (issue #21 finding).
struct Lock(#[allow(dead_code)] std::fs::File, std::path::PathBuf);

/// Where the lock files are: `/run/rocev2-reuseport` for root (only root can create there), else
/// `$TMPDIR/rocev2-reuseport-<euid>`; created 0700, and used only if it is a real directory (not a symlink) owned by
/// this effective user and not writable by group or others, so another user can neither hold nor replace a lock.
/// The sockets of one reuseport group all have one effective uid (a kernel rule), so all joiners of an address find
/// the same directory.
fn lock_dir() -> io::Result<std::path::PathBuf> {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    let dir = if euid == 0 {
        std::path::PathBuf::from("/run/rocev2-reuseport")
    } else {
        std::env::temp_dir().join(format!("rocev2-reuseport-{euid}"))
    };
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let m = std::fs::symlink_metadata(&dir)?;
    if !m.is_dir() || m.uid() != euid || m.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory only uid {euid} controls (owner {}, mode {:o})",
                dir.display(),
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(dir)
}

impl Lock {
    /// Takes the lock `name`, waiting for the holder (at most 10 s: a join takes milliseconds).
    fn take(name: &str) -> io::Result<Lock> {
        use std::os::unix::fs::MetadataExt as _;
        let path = lock_dir()?.join(format!("{name}.lock"));
        let t0 = std::time::Instant::now();
        loop {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .mode(0o600)
                .open(&path)?;
            loop {
                match f.try_lock() {
                    Ok(()) => break,
                    Err(std::fs::TryLockError::WouldBlock) if t0.elapsed().as_secs() < 10 => {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                    }
                    Err(std::fs::TryLockError::WouldBlock) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("{} held for 10 s", path.display()),
                        ));
                    }
                    Err(std::fs::TryLockError::Error(e)) => return Err(e),
                }
            }
            // The holder before us removes the file as it lets go (`Drop`): the lock counts only if the file we
            // locked is still the one at the path; else take the new one.
            let held = f.metadata()?;
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.ino() == held.ino() && m.dev() == held.dev() => {
                    return Ok(Lock(f, path));
                }
                _ => continue,
            }
        }
    }
}

impl Drop for Lock {
    /// Removes the file, then unlocks (closing it): no lock file is left per address, and a waiter that locked the
    /// removed file sees it is gone and takes the path's new one.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.1);
    }
}

/// A socket that joined the steering of its reuseport group.
#[derive(Debug)]
pub struct Joined {
    /// Its slot: its process numbers its QPs from `slot << QPN_SHIFT`.
    pub slot: u8,
    _map: OwnedFd,
    _prog: OwnedFd,
}

impl Joined {
    /// The first QPN of the slot that is not a special QP (QP0/QP1 stay out of every range: slot 0 starts at 0x11,
    /// as `roce_proto::FIRST_QPN`).
    pub fn first_qpn(&self) -> u32 {
        (u32::from(self.slot) << QPN_SHIFT).max(0x11)
    }
}

/// Joins `socket` — a UDP socket bound to `local` with `SO_REUSEPORT` — to the steering of its group: finds or makes
/// the address's map, claims the lowest free slot for the socket, and (re)attaches the program to the group.
pub fn join(socket: BorrowedFd<'_>, local: SocketAddr) -> Result<Joined, ReuseportError> {
    let netns = std::fs::metadata("/proc/self/ns/net")
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap_or(0);
    let name = map_name(local, netns);
    let _lock = Lock::take(&name).map_err(fail("locking the map name"))?;
    let map = match find_map(&name).map_err(fail("looking for the address's BPF map"))? {
        Some(m) => m,
        None => create_map(&name).map_err(fail("creating a REUSEPORT_SOCKARRAY map"))?,
    };
    let prog = load_program(&map).map_err(fail("loading the SK_REUSEPORT program"))?;
    let pfd: libc::c_int = prog.as_raw_fd();
    // SAFETY: `socket` is an open socket; the option value is a c_int that lives across the call.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_EBPF,
            (&raw const pfd).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(ReuseportError {
            step: "attaching the program (SO_ATTACH_REUSEPORT_EBPF)",
            error: io::Error::last_os_error(),
        });
    }
    let value: u32 = socket.as_raw_fd() as u32;
    for slot in 0..SLOTS {
        let key: u32 = slot;
        let mut a = Attr::new();
        a.u32(0, map.as_raw_fd() as u32)
            .u64(8, (&raw const key) as u64)
            .u64(16, (&raw const value) as u64)
            .u64(24, BPF_NOEXIST);
        match bpf(BPF_MAP_UPDATE_ELEM, &mut a) {
            Ok(_) => {
                return Ok(Joined {
                    slot: slot as u8,
                    _map: map,
                    _prog: prog,
                });
            }
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
            Err(e) => {
                return Err(ReuseportError {
                    step: "claiming a slot (inserting the socket into the map)",
                    error: e,
                });
            }
        }
    }
    Err(ReuseportError {
        step: "claiming a slot",
        error: io::Error::new(
            io::ErrorKind::AddrInUse,
            "all 256 slots of the address are taken",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_jumps_to_pass_and_names_the_map() {
        let p = program(7);
        // The conditional jump after the load lands on `r0 = SK_PASS`.
        let j = p.iter().position(|i| i.code == 0x55).expect("jne");
        let target = j + 1 + p[j].off as usize;
        assert_eq!(p[target], insn(0xb7, 0, 0, 0, 1));
        assert_eq!(p.last().map(|i| i.code), Some(0x95));
        let ld = p.iter().find(|i| i.code == 0x18).expect("ld_imm64");
        assert_eq!((ld.imm, ld.regs >> 4), (7, BPF_PSEUDO_MAP_FD));
        assert_eq!(size_of::<Insn>(), 8);
    }

    #[test]
    fn the_lock_waits_for_its_holder_and_leaves_no_file() {
        let name = format!("rocev2_t{}", std::process::id());
        let held = Lock::take(&name).expect("lock");
        let n2 = name.clone();
        let t = std::thread::spawn(move || {
            let t0 = std::time::Instant::now();
            let _l = Lock::take(&n2).expect("lock 2");
            t0.elapsed()
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(held);
        let waited = t.join().expect("thread");
        assert!(waited >= std::time::Duration::from_millis(90), "{waited:?}");
        let file = lock_dir().expect("dir").join(format!("{name}.lock"));
        assert!(!file.exists(), "{} left behind", file.display());
    }

    #[test]
    fn map_names_fit_bpf_object_names() {
        let n = map_name("127.0.0.1:4791".parse().expect("addr"), 1);
        assert_eq!(n.len(), 15);
        assert!(n.starts_with("rocev2_"));
        assert_ne!(n, map_name("127.0.0.2:4791".parse().expect("addr"), 1));
        assert_ne!(n, map_name("127.0.0.1:4791".parse().expect("addr"), 2));
    }
}
