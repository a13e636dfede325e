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
//! QP 1 (the CM's MADs) is one QPN for all processes: the program hands a CM REQ or SIDR_REQ to the slot that
//! claimed its ServiceID in the address's services map ([`Joined::claim_service`], made by a listen), and every
//! other CM MAD to the slot in the first byte of the comm ID it names (each process's CM makes its comm IDs with its
//! slot there, `roce_cm::CmConfig::comm_id_prefix`); `docs/MULTIPROCESS.md`, "QP 1".
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
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_GET_NEXT_ID: libc::c_long = 12;
const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_REUSEPORT_SOCKARRAY: u32 = 20;
const BPF_PROG_TYPE_SK_REUSEPORT: u32 = 21;
const BPF_ANY: u64 = 0;
const BPF_NOEXIST: u64 = 1;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_SKB_LOAD_BYTES: i32 = 26;
const BPF_FUNC_SK_SELECT_REUSEPORT: i32 = 82;
/// `SO_ATTACH_REUSEPORT_EBPF` (include/uapi/asm-generic/socket.h).
const SO_ATTACH_REUSEPORT_EBPF: libc::c_int = 52;

/// Listens (service IDs) the services map holds per address: a `listen` beyond it is not steered (module docs).
pub const MAX_SERVICES: u32 = 4096;

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

/// An instruction of [`program`] before assembly: an instruction, a jump to a label, or a label.
enum Op {
    I(Insn),
    /// Conditional (or, with code 0x05, unconditional) jump: code, register, immediate, target label.
    J(u8, u8, i32, &'static str),
    L(&'static str),
}

/// The steering program for the sockets map `map_fd` and the services map `services_fd` (`docs/MULTIPROCESS.md`
/// lists it as assembly). For every datagram it loads BTH bytes 4..8 (UDP offset 12):
///
/// * DestQP ≠ 1: the key is `DestQP[23:16]`, the slot of the QP's process;
/// * DestQP = 1 (QP 1, the GSI) and a MAD of the CM class (0x07; the MAD starts at UDP offset 28, after the BTH and
///   the DETH): for a REQ or SIDR_REQ the key is the slot the services map holds for its ServiceID (MAD data bytes
///   8..16, UDP offset 60: the process listening on it); for a SIDR_REP the first byte of its RequestID (UDP offset
///   52), for every other CM MAD the first byte of its RemoteCommID (UDP offset 56) — the receiver's own comm ID,
///   whose first byte is its slot (`roce_cm::CmConfig::comm_id_prefix`);
///
/// then `bpf_sk_select_reuseport(ctx, map, &key, 0)` and `SK_PASS`. A failed load, another class, a service nobody
/// steers, or a slot nobody holds leave the choice to the kernel's hash (any process of the address: its CM answers
/// what it cannot match, a REJ "invalid service ID" for a REQ, as any RNIC's CM would).
pub fn program(map_fd: RawFd, services_fd: RawFd) -> Vec<Insn> {
    const R0: u8 = 0;
    const R1: u8 = 1;
    const R2: u8 = 2;
    const R3: u8 = 3;
    const R4: u8 = 4;
    const R6: u8 = 6;
    const R7: u8 = 7;
    const R10: u8 = 10;
    use Op::{I, J, L};
    // Stack: fp-40..-16 the MAD header, fp-16..-8 a ServiceID, fp-8..-4 BTH bytes 4..8 or a comm ID, fp-4 the key.
    let load = |off: i32, at: i32, len: i32| {
        [
            I(insn(0xbf, R1, R6, 0, 0)),                     // r1 = ctx
            I(insn(0xb7, R2, 0, 0, off)),                    // r2 = UDP offset
            I(insn(0xbf, R3, R10, 0, 0)),                    // r3 = r10
            I(insn(0x07, R3, 0, 0, at)),                     // r3 += at
            I(insn(0xb7, R4, 0, 0, len)),                    // r4 = len
            I(insn(0x85, 0, 0, 0, BPF_FUNC_SKB_LOAD_BYTES)), // call bpf_skb_load_bytes
            J(0x55, R0, 0, "pass"),                          // if r0 != 0 goto pass
        ]
    };
    let mut ops = vec![I(insn(0xbf, R6, R1, 0, 0))]; // r6 = ctx
    ops.extend(load(12, -8, 4)); // BTH bytes 4..8: resv8a, DestQP[23:16], DestQP[15:8], DestQP[7:0]
    ops.extend([
        I(insn(0x61, R0, R10, -8, 0)), // r0 = *(u32 *)(r10 - 8)
        I(insn(0xbf, R7, R0, 0, 0)),   // r7 = r0
        I(insn(0x77, R7, 0, 0, 8)),    // r7 >>= 8: DestQP, bytes reversed
        J(0x15, R7, 0x01_0000, "qp1"), // if DestQP == 1 goto qp1
        I(insn(0x77, R0, 0, 0, 8)),    // r0 >>= 8
        I(insn(0x57, R0, 0, 0, 0xff)), // r0 &= 0xff: DestQP[23:16]
        L("select"),                   // r0 = slot
        I(insn(0x63, R10, R0, -4, 0)), // *(u32 *)(r10 - 4) = r0
        I(insn(0xbf, R1, R6, 0, 0)),   // r1 = ctx
        I(insn(0x18, R2, BPF_PSEUDO_MAP_FD, 0, map_fd)), // r2 = map (ld_imm64, low half)
        I(insn(0x00, 0, 0, 0, 0)),     //          (high half)
        I(insn(0xbf, R3, R10, 0, 0)),  // r3 = r10
        I(insn(0x07, R3, 0, 0, -4)),   // r3 += -4: &key
        I(insn(0xb7, R4, 0, 0, 0)),    // r4 = 0
        I(insn(0x85, 0, 0, 0, BPF_FUNC_SK_SELECT_REUSEPORT)), // call bpf_sk_select_reuseport
        L("pass"),
        I(insn(0xb7, R0, 0, 0, 1)), // r0 = SK_PASS
        I(insn(0x95, 0, 0, 0, 0)),  // exit
        L("qp1"),
    ]);
    ops.extend(load(28, -40, 24)); // the MAD header
    ops.extend([
        I(insn(0x71, R0, R10, -39, 0)), // r0 = *(u8 *)(r10 - 39): MgmtClass
        J(0x55, R0, 0x07, "pass"),      // not the CM class: pass
        I(insn(0x69, R7, R10, -24, 0)), // r7 = *(u16 *)(r10 - 24): AttributeID, bytes reversed
        J(0x15, R7, 0x1000, "service"), // REQ (0x0010)
        J(0x15, R7, 0x1700, "service"), // SIDR_REQ (0x0017)
        I(insn(0xb7, R2, 0, 0, 56)),    // r2 = 56: RemoteCommID
        J(0x55, R7, 0x1800, "commid"),  // not SIDR_REP (0x0018)
        I(insn(0xb7, R2, 0, 0, 52)),    // r2 = 52: RequestID
        L("commid"),
        I(insn(0xbf, R1, R6, 0, 0)),                     // r1 = ctx
        I(insn(0xbf, R3, R10, 0, 0)),                    // r3 = r10
        I(insn(0x07, R3, 0, 0, -8)),                     // r3 += -8
        I(insn(0xb7, R4, 0, 0, 4)),                      // r4 = 4
        I(insn(0x85, 0, 0, 0, BPF_FUNC_SKB_LOAD_BYTES)), // call bpf_skb_load_bytes
        J(0x55, R0, 0, "pass"),                          // if r0 != 0 goto pass
        I(insn(0x71, R0, R10, -8, 0)), // r0 = *(u8 *)(r10 - 8): the comm ID's first byte
        J(0x05, 0, 0, "select"),       // goto select
        L("service"),
    ]);
    ops.extend(load(60, -16, 8)); // ServiceID (big-endian, as the map's keys)
    ops.extend([
        I(insn(0x18, R1, BPF_PSEUDO_MAP_FD, 0, services_fd)), // r1 = services (ld_imm64, low half)
        I(insn(0x00, 0, 0, 0, 0)),                            //               (high half)
        I(insn(0xbf, R2, R10, 0, 0)),                         // r2 = r10
        I(insn(0x07, R2, 0, 0, -16)),                         // r2 += -16: &service ID
        I(insn(0x85, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM)),     // call bpf_map_lookup_elem
        J(0x15, R0, 0, "pass"),                               // nobody steers it: pass
        I(insn(0x61, R0, R0, 0, 0)),                          // r0 = *(u32 *)(r0 + 0): its slot
        J(0x05, 0, 0, "select"),                              // goto select
    ]);
    assemble(&ops)
}

/// Resolves [`Op`] labels into jump offsets (relative to the next instruction).
fn assemble(ops: &[Op]) -> Vec<Insn> {
    let mut at = std::collections::HashMap::new();
    let mut n = 0usize;
    for op in ops {
        match op {
            Op::L(l) => {
                at.insert(*l, n);
            }
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n);
    for op in ops {
        match *op {
            Op::I(i) => out.push(i),
            Op::J(code, dst, imm, l) => {
                let off = at[l] as i64 - (out.len() as i64 + 1);
                out.push(insn(code, dst, 0, off as i16, imm));
            }
            Op::L(_) => {}
        }
    }
    out
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

/// The services map of the address whose sockets map is `name`: `rocecm_` + the same 8 hex digits.
fn services_name(name: &str) -> String {
    format!("rocecm_{}", &name[name.len().saturating_sub(8)..])
}

/// A hash map ServiceID (8 bytes, big-endian as on the wire) → [`ServiceEntry`] (16 bytes).
fn create_services(name: &str) -> io::Result<OwnedFd> {
    let mut a = Attr::new();
    a.u32(0, BPF_MAP_TYPE_HASH)
        .u32(4, 8)
        .u32(8, 16)
        .u32(12, MAX_SERVICES)
        .bytes(28, name.as_bytes());
    bpf(BPF_MAP_CREATE, &mut a).map(fd_of)
}

fn load_program(map: &OwnedFd, services: &OwnedFd) -> io::Result<OwnedFd> {
    let prog = program(map.as_raw_fd(), services.as_raw_fd());
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
    services: OwnedFd,
    /// The sockets map's name (the lock name of the address).
    name: String,
    _prog: OwnedFd,
}

/// A value of the services map: the slot the steering program reads (first 4 bytes), and who claimed it — a
/// process id and that process's start time (`/proc/<pid>/stat` field 22), so an entry left by a process that
/// exited is recognised as stale even when its pid is reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ServiceEntry {
    slot: u32,
    pid: u32,
    start: u64,
}

impl ServiceEntry {
    fn to_bytes(self) -> [u8; 16] {
        let mut b = [0; 16];
        b[..4].copy_from_slice(&self.slot.to_ne_bytes());
        b[4..8].copy_from_slice(&self.pid.to_ne_bytes());
        b[8..].copy_from_slice(&self.start.to_ne_bytes());
        b
    }
    fn from_bytes(b: [u8; 16]) -> ServiceEntry {
        let w = |r: std::ops::Range<usize>| {
            let mut x = [0; 4];
            x.copy_from_slice(&b[r]);
            u32::from_ne_bytes(x)
        };
        let mut st = [0; 8];
        st.copy_from_slice(&b[8..]);
        ServiceEntry {
            slot: w(0..4),
            pid: w(4..8),
            start: u64::from_ne_bytes(st),
        }
    }
    /// Whether the process that made the entry still runs.
    fn alive(self) -> bool {
        start_time(self.pid).is_some_and(|s| s == self.start)
    }
}

/// The start time of process `pid` (clock ticks after boot, `/proc/<pid>/stat` field 22), `None` if it is gone.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count fields after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl Joined {
    /// The first QPN of the slot that is not a special QP (QP0/QP1 stay out of every range: slot 0 starts at 0x11,
    /// as `roce_proto::FIRST_QPN`).
    pub fn first_qpn(&self) -> u32 {
        (u32::from(self.slot) << QPN_SHIFT).max(0x11)
    }

    fn lookup(&self, key: &[u8; 8]) -> io::Result<Option<ServiceEntry>> {
        let mut v = [0u8; 16];
        let mut a = Attr::new();
        a.u32(0, self.services.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, v.as_mut_ptr() as u64);
        match bpf(BPF_MAP_LOOKUP_ELEM, &mut a) {
            Ok(_) => Ok(Some(ServiceEntry::from_bytes(v))),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn update(&self, key: &[u8; 8], e: ServiceEntry, flags: u64) -> io::Result<()> {
        let v = e.to_bytes();
        let mut a = Attr::new();
        a.u32(0, self.services.as_raw_fd() as u32)
            .u64(8, key.as_ptr() as u64)
            .u64(16, v.as_ptr() as u64)
            .u64(24, flags);
        bpf(BPF_MAP_UPDATE_ELEM, &mut a).map(|_| ())
    }

    /// Steers the REQs and SIDR_REQs for `service_id` on this address to this socket's slot ([`program`]): the
    /// process listens on it. Connection MADs need no claim (their comm IDs name the slot).
    ///
    /// Errors: `AddrInUse` when a running process (another slot) claimed it first — one listener per service and
    /// address, as Linux's CM refuses a second `ib_cm_listen` on a service ID; `OutOfMemory`-like kernel errors
    /// (`E2BIG`/`ENOMEM`) when [`MAX_SERVICES`] are claimed. An entry of a process that exited (or of this slot's
    /// earlier holder) is taken over.
    pub fn claim_service(&self, service_id: u64) -> io::Result<()> {
        let key = service_id.to_be_bytes();
        let pid = std::process::id();
        let mine = ServiceEntry {
            slot: u32::from(self.slot),
            pid,
            start: start_time(pid).unwrap_or(0),
        };
        match self.update(&key, mine, BPF_NOEXIST) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            r => return r,
        }
        // Taken: by a live process, or stale. Decide and replace under the address's lock, so two processes taking
        // over one stale entry do not both believe they own it.
        let _lock = Lock::take(&self.name)?;
        match self.lookup(&key)? {
            Some(e) if e.pid != pid && e.alive() => Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!(
                    "service ID {service_id:#x} is listened on by process {} on this address",
                    e.pid
                ),
            )),
            _ => self.update(&key, mine, BPF_ANY),
        }
    }

    /// Ends the steering of `service_id` to this process (the listen ended); an entry of another process is left.
    pub fn release_service(&self, service_id: u64) {
        let key = service_id.to_be_bytes();
        if let Ok(Some(e)) = self.lookup(&key)
            && e.pid == std::process::id()
        {
            let mut a = Attr::new();
            a.u32(0, self.services.as_raw_fd() as u32)
                .u64(8, key.as_ptr() as u64);
            let _ = bpf(BPF_MAP_DELETE_ELEM, &mut a);
        }
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
    let sname = services_name(&name);
    let services = match find_map(&sname).map_err(fail("looking for the address's services map"))? {
        Some(m) => m,
        None => create_services(&sname).map_err(fail("creating the services map"))?,
    };
    let prog = load_program(&map, &services).map_err(fail("loading the SK_REUSEPORT program"))?;
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
                    services,
                    name,
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
    fn the_program_jumps_to_pass_and_names_the_maps() {
        let p = program(7, 9);
        // The conditional jump after the first load lands on `r0 = SK_PASS; exit`.
        let j = p.iter().position(|i| i.code == 0x55).expect("jne");
        let target = j + 1 + p[j].off as usize;
        assert_eq!(p[target], insn(0xb7, 0, 0, 0, 1));
        assert_eq!(p[target + 1].code, 0x95);
        // Every jump lands inside the program.
        for (k, i) in p.iter().enumerate() {
            if matches!(i.code, 0x05 | 0x15 | 0x55) {
                let t = k as i64 + 1 + i64::from(i.off);
                assert!((0..p.len() as i64).contains(&t), "jump {k} to {t}");
            }
        }
        let maps: Vec<i32> = p
            .iter()
            .filter(|i| i.code == 0x18 && i.regs >> 4 == BPF_PSEUDO_MAP_FD)
            .map(|i| i.imm)
            .collect();
        assert_eq!(maps, [7, 9]);
        assert_eq!(p.len(), 62, "docs/MULTIPROCESS.md gives the count");
        assert_eq!(size_of::<Insn>(), 8);
    }

    #[test]
    fn service_entries_round_trip_and_this_process_is_alive() {
        let e = ServiceEntry {
            slot: 3,
            pid: std::process::id(),
            start: start_time(std::process::id()).expect("own start time"),
        };
        assert_eq!(ServiceEntry::from_bytes(e.to_bytes()), e);
        assert_eq!(
            e.to_bytes()[..4],
            3u32.to_ne_bytes(),
            "the program reads the slot first"
        );
        assert!(e.alive());
        assert!(
            !ServiceEntry {
                start: e.start + 1,
                ..e
            }
            .alive(),
            "a reused pid"
        );
        assert_eq!(services_name("rocev2_0123abcd"), "rocecm_0123abcd");
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
