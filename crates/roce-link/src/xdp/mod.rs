//! The AF_XDP backend ([`XdpLink`]): whole Ethernet frames between the engine and a network interface's queue
//! through an `AF_XDP` socket, bypassing the kernel's IP/UDP stack in both directions (Linux
//! `Documentation/networking/af_xdp.rst`; the ring protocol is the one libxdp's `xsk.c` implements).
//!
//! # Pieces
//!
//! * **Sockets**: one per receive queue of the interface (`ETHTOOL_GCHANNELS`; veth has one per CPU by default),
//!   because a frame can only be redirected to the socket bound to the queue it arrived on, and a peer that sends
//!   through the kernel (a UDP link, rxe) spreads its flows over the queues. Queue 0's socket also transmits;
//!   the others only receive. With more than one, an `epoll` set of all of them is the link's [`Link::wait_fd`].
//! * **UMEM**: one anonymous mapping per socket of [`XdpConfig::frames`] chunks (receive-only sockets:
//!   [`XdpConfig::ring_size`]) of [`XdpConfig::frame_size`] bytes (aligned mode). The first `ring_size` chunks are
//!   lent to the kernel for receive (fill ring), the rest are the transmit pool.
//! * **Rings**: fill, completion, RX and TX, each [`XdpConfig::ring_size`] entries, mapped from the socket. A
//!   producer writes descriptors, then publishes its index with a release store; a consumer reads the other index
//!   with an acquire load (`af_xdp.rst`, "Rings").
//! * **XDP program** (module `bpf`): steers IPv4 UDP to [`XdpConfig::local`]:[`XdpConfig::port`] into the socket through an
//!   XSKMAP and passes every other frame (ARP, ICMP, TCP) to the kernel. Attached as a `bpf_link`, so it is
//!   detached when the link is dropped or the process dies. Driver (native) mode with zero-copy; generic (skb)
//!   mode with copy mode, see the comment in [`XdpLink::bind`] for why (veth's NAPI starvation).
//! * **Mode**: the socket is bound zero-copy first and, when the driver refuses (veth, most virtual devices),
//!   in copy mode; [`XdpLink::zero_copy`] says which. `XDP_USE_NEED_WAKEUP` is set: the link kicks the kernel
//!   (`sendto`, `recvfrom`) only when a ring's flag asks for it.
//!
//! # Frames
//!
//! The engine writes whole frames (its per-QP header template: Ethernet, IPv4 with ID 0 + DF and its checksum,
//! UDP with checksum 0, BTH .. ICRC). On transmit the link replaces only the MAC addresses, which are outside
//! the ICRC (`ROCEV2.md §3`): the source with the interface's MAC, the destination with the kernel's neighbour
//! entry for the frame's destination IP (module `neigh`: rtnetlink, so IPv6 entries would be found too). A frame
//! whose neighbour is not resolved yet is dropped and counted (`tx_no_neighbour`) while the kernel is asked to
//! resolve it; RC retransmits it. Entries are re-read every [`NEIGH_TTL_NS`] of engine time. Received frames
//! reach the engine byte for byte as they arrived (real MACs); the engine verifies the ICRC.
//!
//! # Limits
//!
//! * IPv4 only (the program matches IPv4; an IPv6 [`XdpConfig::local`] is refused with a clear error).
//! * At most [`MAX_QUEUES`] receive queues are bound (frames on higher queues pass to the kernel); the program
//!   is attached when the link opens, so a queue count changed later (`ethtool -L`) is not followed.
//! * No multi-buffer: a frame must fit one chunk (receive: `frame_size` − 256 B of XDP headroom), so with the
//!   default 4 KiB chunks the link's MTU is at most 3840 B; a jumbo MTU needs `XDP_USE_SG` and a frags-aware
//!   program, not done.
//! * On-link peers on other hosts only: the neighbour entry looked up is the peer's own address (no route, no
//!   gateway), and frames leave on the interface, never on `lo`. A peer behind a router or on this host is never
//!   reached; the first unresolved frame to a peer outside the interface's subnets, or to an address of this
//!   host, prints a one-time warning naming why (`neigh::unreachable_because`). Use the UDP link for them.
//! * One program per interface: a second process on the same interface (or another XDP program) gets `EBUSY`.
//! * One process per address: the link owns UDP [`XdpConfig::port`] on its address with an ordinary socket
//!   (`claim`), so a second AF_XDP link or a UDP link of another process on the address fails to bind, and an
//!   AF_XDP link on an address another process already uses fails with `io::ErrorKind::AddrInUse` (its program
//!   would otherwise steer that process's frames to itself).
//! * Needs `CAP_NET_ADMIN` + `CAP_BPF` (or `CAP_SYS_ADMIN`) and `CAP_NET_RAW`; without them [`XdpLink::bind`]
//!   fails with an error naming the missing privilege, and a driver falls back to [`crate::UdpLink`].
//!
//! # Per packet
//!
//! `rx_burst`, `tx_buf`, `tx_commit` and `flush` touch only the rings, the UMEM and a fixed neighbour cache of
//! [`NEIGH_SLOTS`] entries: no allocation, no lock. System calls: one `sendto` per flush (copy mode: one per 32
//! frames, the kernel's per-call budget), one `recvfrom` when the fill ring asks for a wake-up, and an rtnetlink
//! request when a neighbour entry is missing or older than [`NEIGH_TTL_NS`].

mod bpf;
mod choice;
mod neigh;

pub use choice::{XdpChoice, open_or_explain};

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{IcrcCaps, Instant, Link, LinkCaps, LinkError};

/// Entries of the transmit-side neighbour cache.
pub const NEIGH_SLOTS: usize = 8;
/// Engine time (ns) after which a cached neighbour MAC is read from the kernel again.
pub const NEIGH_TTL_NS: u64 = 1_000_000_000;
/// Engine time (ns) between two resolution requests for one unresolved neighbour.
const SOLICIT_EVERY_NS: u64 = 100_000_000;
/// `XDP_PACKET_HEADROOM`: bytes the kernel leaves in front of a received frame in its chunk.
const XDP_HEADROOM: usize = 256;
/// How soon a flush that left frames on the TX ring is retried ([`Link::poll_at`]).
const TX_RETRY: std::time::Duration = std::time::Duration::from_micros(20);
/// Frames the kernel sends per `sendto` in copy mode (`xsk_generic_xmit`'s default budget).
const COPY_TX_BUDGET: usize = 32;

/// An OS error with the step that failed, for messages that name the cause.
#[derive(Debug)]
pub(crate) struct OsCause {
    pub(crate) what: &'static str,
    pub(crate) err: io::Error,
}

impl std::fmt::Display for OsCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.what, self.err)?;
        match self.err.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => {
                f.write_str(" (AF_XDP needs CAP_NET_ADMIN, CAP_BPF and CAP_NET_RAW, or root)")
            }
            Some(libc::EAFNOSUPPORT) | Some(libc::ENOSYS) => {
                f.write_str(" (this kernel has no AF_XDP / BPF support)")
            }
            Some(libc::EBUSY) | Some(libc::EEXIST) => {
                f.write_str(" (another XDP program is attached to this interface)")
            }
            Some(libc::ENODEV) => f.write_str(" (no such interface)"),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for OsCause {}

fn os(what: &'static str) -> io::Error {
    let err = io::Error::last_os_error();
    io::Error::new(err.kind(), OsCause { what, err })
}

/// Whether this process can open an `AF_XDP` socket here (kernel support and privilege): `Err` names the cause
/// as [`XdpLink::bind`] would. Opens and closes one socket; nothing is bound.
pub fn probe() -> io::Result<()> {
    // SAFETY: plain socket(2); the descriptor is closed right away.
    let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(os("opening an AF_XDP socket"));
    }
    // SAFETY: `fd` is ours and closed once.
    unsafe { libc::close(fd) };
    Ok(())
}

/// Configuration of an [`XdpLink`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdpConfig {
    /// Local IPv4 address: the program steers UDP to it (and [`port`](Self::port)) into the socket.
    pub local: IpAddr,
    /// Interface to attach to; `None`: the one that owns [`local`](Self::local) ([`crate::udp::interface_of`]).
    pub interface: Option<String>,
    /// UDP destination port steered to the socket (default 4791, `ROCEV2.md §1.4`).
    pub port: u16,
    /// UMEM chunks (default 4096; half receive, half transmit).
    pub frames: u32,
    /// Bytes per chunk, a power of two from 2048 to the page size (default 4096).
    pub frame_size: u32,
    /// Entries of each ring, a power of two (default 2048; at most `frames / 2`).
    pub ring_size: u32,
    /// Frames per [`Link::rx_burst`] / flush ([`LinkCaps::max_burst`]; default 64).
    pub burst: usize,
}

impl XdpConfig {
    /// Defaults for `local`.
    pub fn new(local: IpAddr) -> XdpConfig {
        XdpConfig {
            local,
            interface: None,
            port: roce_wire::ROCE_V2_PORT,
            frames: 4096,
            frame_size: 4096,
            ring_size: 2048,
            burst: 64,
        }
    }

    /// The largest netdev (IP) MTU in bytes this configuration carries: a frame must fit one chunk after the
    /// kernel's 256-byte XDP headroom (no multi-buffer, see "Limits"), less the 14-byte Ethernet header; 3826
    /// with the default 4096-byte chunks. A device on this link reports at most this MTU
    /// ([`crate::device::DeviceSpec::from_env`]), so its active MTU is 2048 however large the interface's MTU is.
    pub fn max_netdev_mtu(&self) -> u32 {
        self.frame_size
            .saturating_sub(XDP_HEADROOM as u32 + roce_wire::eth::HEADER_LEN as u32)
    }
}

/// Counters of an [`XdpLink`] (also reported by [`Link::counters`] with these names).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct XdpStats {
    /// Frames delivered to the engine.
    pub rx_frames: u64,
    /// Frames put on the TX ring.
    pub tx_frames: u64,
    /// Committed frames dropped because the kernel had no usable neighbour entry for their destination.
    pub tx_no_neighbour: u64,
    /// Committed frames dropped because they are not IPv4/IPv6 or too short to name a destination.
    pub tx_invalid: u64,
    /// RX descriptors outside the UMEM (never expected; counted and skipped).
    pub rx_bad_desc: u64,
    /// `tx_buf` answered busy (no free chunk or TX slot).
    pub tx_busy: u64,
    /// Wake-up system calls (`sendto` for TX, `recvfrom` for the fill ring).
    pub wakeups: u64,
    /// Flushes that left frames on the TX ring (the device was busy: veth's peer queue full, no skb); they go
    /// with a later flush, which [`Link::poll_at`] asks for.
    pub tx_left_pending: u64,
}

/// One mapped ring (`struct xdp_ring_offset`); `D` is the descriptor: `u64` (fill, completion) or
/// `libc::xdp_desc` (RX, TX).
struct Ring<D> {
    producer: NonNull<AtomicU32>,
    consumer: NonNull<AtomicU32>,
    flags: NonNull<AtomicU32>,
    desc: NonNull<D>,
    mask: u32,
    size: u32,
    /// Our copy of the index we own (producer of a producer ring, consumer of a consumer ring).
    local: u32,
    map: NonNull<libc::c_void>,
    map_len: usize,
}

impl<D: Copy> Ring<D> {
    /// Maps the ring of `size` entries at page offset `pgoff` of socket `fd`, laid out per `off`.
    fn map(
        fd: RawFd,
        off: &libc::xdp_ring_offset,
        size: u32,
        pgoff: libc::off_t,
    ) -> io::Result<Ring<D>> {
        let map_len = off.desc as usize + size as usize * size_of::<D>();
        // SAFETY: a shared mapping of the socket's ring; the kernel checks offset and length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd,
                pgoff,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os("mapping an AF_XDP ring"));
        }
        let base = p.cast::<u8>();
        // SAFETY: the offsets come from XDP_MMAP_OFFSETS and lie inside the mapping of `map_len` bytes; the
        // index words are 4-byte aligned, the descriptor array is 8-byte aligned (kernel layout).
        let at = |o: u64| unsafe { NonNull::new_unchecked(base.add(o as usize)) };
        let producer = at(off.producer).cast();
        let consumer = at(off.consumer).cast();
        Ok(Ring {
            producer,
            consumer,
            flags: at(off.flags).cast(),
            desc: at(off.desc).cast(),
            mask: size - 1,
            size,
            local: 0,
            // SAFETY: mmap succeeded, so `p` is not null.
            map: unsafe { NonNull::new_unchecked(p) },
            map_len,
        })
    }

    fn load(p: NonNull<AtomicU32>) -> u32 {
        // SAFETY: the index word lives in the mapping for the ring's lifetime; the kernel updates it
        // concurrently, which is what the atomic type is for.
        unsafe { p.as_ref() }.load(Ordering::Acquire)
    }

    fn store(p: NonNull<AtomicU32>, v: u32) {
        // SAFETY: as `load`.
        unsafe { p.as_ref() }.store(v, Ordering::Release)
    }

    /// Producer ring: free entries.
    fn free(&self) -> u32 {
        self.size - self.local.wrapping_sub(Self::load(self.consumer))
    }

    /// Producer ring: writes `d` at the next entry (caller checked [`free`](Self::free)); published by
    /// [`submit`](Self::submit).
    fn push(&mut self, d: D) {
        // SAFETY: the index is masked into the array of `size` descriptors inside the mapping; the entry is
        // ours until published (the kernel reads only below the producer index).
        unsafe {
            self.desc
                .as_ptr()
                .add((self.local & self.mask) as usize)
                .write(d)
        };
        self.local = self.local.wrapping_add(1);
    }

    fn submit(&self) {
        Self::store(self.producer, self.local);
    }

    /// Consumer ring: entries ready.
    fn ready(&self) -> u32 {
        Self::load(self.producer).wrapping_sub(self.local)
    }

    /// Consumer ring: the `i`-th ready entry (caller checked `i < ready()`).
    fn peek(&self, i: u32) -> D {
        // SAFETY: masked index into the descriptor array; the kernel published it (acquire in `ready`).
        unsafe {
            self.desc
                .as_ptr()
                .add((self.local.wrapping_add(i) & self.mask) as usize)
                .read()
        }
    }

    /// Consumer ring: hands `n` entries back to the kernel.
    fn release(&mut self, n: u32) {
        self.local = self.local.wrapping_add(n);
        Self::store(self.consumer, self.local);
    }

    fn needs_wakeup(&self) -> bool {
        Self::load(self.flags) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    /// Producer ring: entries the kernel has not consumed yet.
    fn pending(&self) -> u32 {
        self.local.wrapping_sub(Self::load(self.consumer))
    }
}

impl<D> Drop for Ring<D> {
    fn drop(&mut self) {
        // SAFETY: the mapping was made in `map` with this length and nothing refers to it after the ring.
        unsafe { libc::munmap(self.map.as_ptr(), self.map_len) };
    }
}

/// A neighbour cache entry.
#[derive(Clone, Copy)]
struct Neigh {
    ip: IpAddr,
    mac: Option<[u8; 6]>,
    /// Engine time of the look-up (ns).
    at: u64,
    /// Engine time of the last resolution request (ns).
    solicited: u64,
}

/// One `AF_XDP` socket bound to one receive queue, with its own UMEM and rings.
struct Xsk {
    // Field order is drop order: rings before the socket, the socket before the UMEM.
    rx: Ring<libc::xdp_desc>,
    /// Only the socket of the first queue transmits.
    tx: Option<Ring<libc::xdp_desc>>,
    fill: Ring<u64>,
    comp: Ring<u64>,
    fd: OwnedFd,
    umem: NonNull<u8>,
    umem_len: usize,
    /// Unmaps the UMEM when dropped (after the rings and the socket above).
    _umem_map: UmemGuard,
}

impl Xsk {
    /// Opens a socket with a UMEM of `frames` chunks: the first `ring_size` go to the fill ring, the rest are
    /// returned as the transmit pool (only with `tx`). Not bound yet.
    fn open(cfg: &XdpConfig, frames: u32, tx: bool) -> Result<(Xsk, Vec<u64>), LinkError> {
        // The socket first: it is the step that fails without privilege or kernel support.
        // SAFETY: plain socket(2); checked below.
        let fd = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(os("opening an AF_XDP socket").into());
        }
        // SAFETY: a new descriptor nothing else owns.
        let xsk = unsafe { OwnedFd::from_raw_fd(fd) };

        let umem_len = frames as usize * cfg.frame_size as usize;
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                umem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os("mapping the UMEM").into());
        }
        // SAFETY: mmap succeeded.
        let umem = unsafe { NonNull::new_unchecked(p.cast::<u8>()) };
        let umem_guard = UmemGuard {
            p: umem,
            len: umem_len,
        };

        let reg = libc::xdp_umem_reg {
            addr: p as u64,
            len: umem_len as u64,
            chunk_size: cfg.frame_size,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        setsockopt(
            fd,
            libc::XDP_UMEM_REG,
            &reg,
            "registering the UMEM (XDP_UMEM_REG)",
        )?;
        let n = cfg.ring_size;
        setsockopt(fd, libc::XDP_UMEM_FILL_RING, &n, "sizing the fill ring")?;
        setsockopt(
            fd,
            libc::XDP_UMEM_COMPLETION_RING,
            &n,
            "sizing the completion ring",
        )?;
        setsockopt(fd, libc::XDP_RX_RING, &n, "sizing the RX ring")?;
        if tx {
            setsockopt(fd, libc::XDP_TX_RING, &n, "sizing the TX ring")?;
        }
        // SAFETY: all-zero is a valid `xdp_mmap_offsets`.
        let mut off: libc::xdp_mmap_offsets = unsafe { std::mem::zeroed() };
        let mut olen = size_of::<libc::xdp_mmap_offsets>() as libc::socklen_t;
        // SAFETY: `off` is writable for `olen` bytes.
        if unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_XDP,
                libc::XDP_MMAP_OFFSETS,
                (&mut off as *mut libc::xdp_mmap_offsets).cast(),
                &mut olen,
            )
        } < 0
        {
            return Err(os("reading the ring offsets (XDP_MMAP_OFFSETS)").into());
        }
        let mut fill = Ring::<u64>::map(
            fd,
            &off.fr,
            n,
            libc::XDP_UMEM_PGOFF_FILL_RING as libc::off_t,
        )?;
        let comp = Ring::<u64>::map(
            fd,
            &off.cr,
            n,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING as libc::off_t,
        )?;
        let rx = Ring::<libc::xdp_desc>::map(fd, &off.rx, n, libc::XDP_PGOFF_RX_RING)?;
        let txr = if tx {
            Some(Ring::<libc::xdp_desc>::map(
                fd,
                &off.tx,
                n,
                libc::XDP_PGOFF_TX_RING,
            )?)
        } else {
            None
        };
        // Receive chunks: the first `ring_size`, all lent to the kernel now.
        for i in 0..n {
            fill.push(u64::from(i) * u64::from(cfg.frame_size));
        }
        fill.submit();
        let mut tx_free = Vec::new();
        if tx {
            // Capacity exactly the pool: `reap` never grows it (no allocation per packet).
            tx_free.reserve_exact((frames - n) as usize);
            tx_free.extend((n..frames).map(|i| u64::from(i) * u64::from(cfg.frame_size)));
        }
        Ok((
            Xsk {
                rx,
                tx: txr,
                fill,
                comp,
                fd: xsk,
                umem,
                umem_len,
                _umem_map: umem_guard,
            },
            tx_free,
        ))
    }

    /// Binds to `ifindex` queue `queue` with `flags` (`XDP_ZEROCOPY` or `XDP_COPY`) and need-wakeup.
    fn bind(&self, ifindex: u32, queue: u32, flags: u16) -> io::Result<()> {
        let sa = libc::sockaddr_xdp {
            sxdp_family: libc::AF_XDP as u16,
            sxdp_flags: flags | libc::XDP_USE_NEED_WAKEUP,
            sxdp_ifindex: ifindex,
            sxdp_queue_id: queue,
            sxdp_shared_umem_fd: 0,
        };
        // SAFETY: `sa` is a valid `sockaddr_xdp` of the length given.
        let r = unsafe {
            libc::bind(
                self.fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_xdp).cast(),
                size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
            )
        };
        if r < 0 {
            Err(os("binding the AF_XDP socket to the interface queue"))
        } else {
            Ok(())
        }
    }

    /// The chunk at UMEM offset `addr`, `len` bytes, if inside the UMEM.
    fn chunk(&mut self, addr: u64, len: usize) -> Option<&mut [u8]> {
        let a = usize::try_from(addr).ok()?;
        if a.checked_add(len)? > self.umem_len {
            return None;
        }
        // SAFETY: `a .. a + len` lies inside the UMEM mapping (checked); the kernel does not write a chunk while
        // we own it (an RX chunk until it returns to the fill ring, a TX chunk until it is on the TX ring), and
        // `&mut self` makes this the only borrow.
        Some(unsafe { std::slice::from_raw_parts_mut(self.umem.as_ptr().add(a), len) })
    }

    /// Lends up to `max` received frames to `sink` and returns their chunks to the fill ring; `(taken,
    /// delivered, bad descriptors, wake-ups)`.
    fn rx_burst(
        &mut self,
        frame_size: u32,
        max: u32,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> (u32, u64, u64, u64) {
        let ready = self.rx.ready().min(max);
        let fs = u64::from(frame_size);
        let (mut delivered, mut bad, mut wakeups) = (0, 0, 0);
        for i in 0..ready {
            let d = self.rx.peek(i);
            match self.chunk(d.addr, d.len as usize) {
                Some(frame) => {
                    sink(frame);
                    delivered += 1;
                }
                None => bad += 1,
            }
            // The chunk goes back to the kernel (the fill ring has room: it and the RX ring share `ring_size`
            // chunks).
            self.fill.push(d.addr - d.addr % fs);
        }
        if ready > 0 {
            self.rx.release(ready);
            self.fill.submit();
        }
        if self.fill.needs_wakeup() {
            wakeups += 1;
            // SAFETY: a zero-length, non-blocking receive on our socket: only a wake-up for the driver.
            unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            };
        }
        (ready, delivered, bad, wakeups)
    }

    fn kernel_stats(&self) -> io::Result<libc::xdp_statistics> {
        // SAFETY: all-zero is a valid value.
        let mut s: libc::xdp_statistics = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::xdp_statistics>() as libc::socklen_t;
        // SAFETY: `s` is writable for `len` bytes.
        if unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_XDP,
                libc::XDP_STATISTICS,
                (&mut s as *mut libc::xdp_statistics).cast(),
                &mut len,
            )
        } < 0
        {
            return Err(io::Error::last_os_error());
        }
        Ok(s)
    }
}

/// RoCE v2 over `AF_XDP` sockets, one per receive queue of the interface (see the module docs).
pub struct XdpLink {
    cfg: XdpConfig,
    /// The UDP socket that owns [`XdpConfig::port`] on [`XdpConfig::local`] for this process ([`claim`]).
    _claim: socket2::Socket,
    /// The socket of queue 0 (receives and transmits).
    main: Xsk,
    /// The sockets of the other receive queues (receive only), preallocated at bind.
    others: Vec<Xsk>,
    /// Readable when any socket has a frame (`epoll`, level-triggered), when there is more than one socket.
    epoll: Option<OwnedFd>,
    /// The socket `rx_burst` starts with (rotates, so no queue starves).
    rx_next: usize,
    /// Holds the XSKMAP, the program and its `bpf_link`; dropping it detaches the program. Declared after the
    /// sockets, so the program goes last.
    _attached: bpf::Attached,
    neigh: neigh::Neighbours,
    cache: [Option<Neigh>; NEIGH_SLOTS],
    cache_next: usize,
    ifname: String,
    ifmac: [u8; 6],
    /// The interface's subnets and this host's addresses, to name why a peer cannot be reached (read at bind).
    on_link: neigh::OnLink,
    /// Whether the one-time warning about an unreachable peer was printed.
    unreachable_warned: bool,
    mtu: usize,
    zero_copy: bool,
    /// Free transmit chunks (UMEM offsets of `main`), a stack preallocated to the transmit pool's size.
    tx_free: Vec<u64>,
    /// The chunk lent by the last `tx_buf`, not committed yet.
    tx_held: Option<u64>,
    /// When frames were left on the TX ring: the instant of the next flush the driver should make.
    retry_at: Option<Instant>,
    stats: XdpStats,
}

// SAFETY: the link owns its mappings and descriptors exclusively (the raw pointers point into them and are never
// shared); moving it to another thread moves that ownership. It is not `Sync`.
unsafe impl Send for XdpLink {}

impl XdpLink {
    /// Creates the UMEM and rings, binds the socket to the interface queue and attaches the program.
    ///
    /// Errors ([`LinkError::Io`], the message names the step and the cause): no privilege (`EPERM`), no kernel
    /// support (`EAFNOSUPPORT`), no interface owns `local` or the named one does not exist (`ENODEV`), another
    /// XDP program on the interface (`EBUSY`), an IPv6 `local` or a bad configuration (`EINVAL`).
    pub fn bind(cfg: XdpConfig) -> Result<XdpLink, LinkError> {
        let bad =
            |m: &str| LinkError::Io(io::Error::new(io::ErrorKind::InvalidInput, m.to_owned()));
        let IpAddr::V4(local4) = cfg.local else {
            return Err(bad(
                "the AF_XDP link is IPv4 only (its XDP program matches IPv4)",
            ));
        };
        if !cfg.frame_size.is_power_of_two()
            || !(2048..=4096).contains(&cfg.frame_size)
            || !cfg.ring_size.is_power_of_two()
            || cfg.ring_size.saturating_mul(2) > cfg.frames
            || cfg.burst == 0
        {
            return Err(bad(
                "AF_XDP configuration: frame_size a power of two in 2048..=4096, ring_size a power of two, frames >= 2 * ring_size, burst > 0",
            ));
        }
        let ifname = match &cfg.interface {
            Some(n) => n.clone(),
            None => {
                crate::udp::interface_of(cfg.local)
                    .map_err(|e| {
                        LinkError::Io(io::Error::new(
                            io::ErrorKind::NotFound,
                            format!("no interface owns {}: {e}", cfg.local),
                        ))
                    })?
                    .1
            }
        };
        let cname = std::ffi::CString::new(ifname.clone())
            .map_err(|_| bad("interface name has a NUL byte"))?;
        // SAFETY: `cname` is a valid C string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if ifindex == 0 {
            return Err(LinkError::Io(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "interface {ifname:?}: {} (no such interface)",
                    io::Error::last_os_error()
                ),
            )));
        }
        let claim = claim(cfg.local, cfg.port)?;
        let (ifmac, ifmtu) = neigh::mac_and_mtu(&ifname)?;

        let queues = rx_queues(&ifname).clamp(1, MAX_QUEUES);
        let (main, tx_free) = Xsk::open(&cfg, cfg.frames, true)?;
        let mut others = Vec::with_capacity(queues as usize - 1);
        for _ in 1..queues {
            others.push(Xsk::open(&cfg, cfg.ring_size, false)?.0);
        }
        let zero_copy = match main.bind(ifindex, 0, libc::XDP_ZEROCOPY) {
            Ok(()) => true,
            Err(_) => {
                main.bind(ifindex, 0, libc::XDP_COPY)?;
                false
            }
        };
        let mode = if zero_copy {
            libc::XDP_ZEROCOPY
        } else {
            libc::XDP_COPY
        };
        for (q, x) in (1..).zip(&others) {
            x.bind(ifindex, q, mode)?;
        }
        // Zero-copy needs the program in the driver. In copy mode it runs in generic (skb) mode: the frame then
        // takes the kernel's per-CPU receive path in the sender's context, as a UDP datagram does, instead of
        // waiting for the driver's NAPI poll. Measured on veth (BENCHMARKS.md, "AF_XDP link"): in driver mode one
        // write-bw repetition of five stalled for seconds (0.06 → 0.001 Mpps, no packet lost); in generic mode
        // none of seven did. The likely cause, not proven: veth's NAPI poll runs on the CPU that scheduled it
        // and waits there behind a busy-polling nice -20 thread.
        let attach_flags = if zero_copy {
            bpf::XDP_FLAGS_DRV_MODE
        } else {
            bpf::XDP_FLAGS_SKB_MODE
        };
        let attached = bpf::Attached::attach(ifindex, queues, local4, cfg.port, attach_flags)?;
        attached.insert(0, main.fd.as_raw_fd())?;
        for (q, x) in (1..).zip(&others) {
            attached.insert(q, x.fd.as_raw_fd())?;
        }
        let epoll = if others.is_empty() {
            None
        } else {
            Some(epoll_of(std::iter::once(&main).chain(&others))?)
        };
        let neigh = neigh::Neighbours::open(ifindex).map_err(|e| {
            LinkError::Io(io::Error::new(
                e.kind(),
                format!("opening rtnetlink for neighbour look-ups: {e}"),
            ))
        })?;
        let mtu = (ifmtu + 14).min(cfg.frame_size as usize - XDP_HEADROOM);
        // Only for the warning of `neighbour`: a host whose addresses cannot be listed gets no warning.
        let on_link = neigh::on_link(&ifname).unwrap_or_default();
        Ok(XdpLink {
            cfg,
            _claim: claim,
            main,
            others,
            epoll,
            rx_next: 0,
            _attached: attached,
            neigh,
            cache: [None; NEIGH_SLOTS],
            cache_next: 0,
            ifname,
            ifmac,
            on_link,
            unreachable_warned: false,
            mtu,
            zero_copy,
            tx_free,
            tx_held: None,
            retry_at: None,
            stats: XdpStats::default(),
        })
    }

    /// Whether the socket runs in zero-copy mode (else copy mode).
    pub fn zero_copy(&self) -> bool {
        self.zero_copy
    }

    /// The interface the link is attached to.
    pub fn interface(&self) -> &str {
        &self.ifname
    }

    /// The configuration.
    pub fn config(&self) -> &XdpConfig {
        &self.cfg
    }

    /// The link's counters.
    pub fn stats(&self) -> XdpStats {
        self.stats
    }

    /// The kernel's socket statistics (`XDP_STATISTICS`) summed over the sockets: receive drops, ring-full and
    /// fill-empty events, invalid descriptors.
    pub fn kernel_stats(&self) -> io::Result<libc::xdp_statistics> {
        let mut t = self.main.kernel_stats()?;
        for x in &self.others {
            let s = x.kernel_stats()?;
            t.rx_dropped += s.rx_dropped;
            t.rx_invalid_descs += s.rx_invalid_descs;
            t.tx_invalid_descs += s.tx_invalid_descs;
            t.rx_ring_full += s.rx_ring_full;
            t.rx_fill_ring_empty_descs += s.rx_fill_ring_empty_descs;
            t.tx_ring_empty_descs += s.tx_ring_empty_descs;
        }
        Ok(t)
    }

    /// Number of sockets (= receive queues bound).
    pub fn queues(&self) -> usize {
        1 + self.others.len()
    }

    /// Moves completed transmit chunks back to the free stack.
    fn reap(&mut self) {
        let comp = &mut self.main.comp;
        let n = comp.ready();
        for i in 0..n {
            let a = comp.peek(i);
            if self.tx_free.len() < self.tx_free.capacity() {
                self.tx_free.push(a);
            }
        }
        if n > 0 {
            comp.release(n);
        }
    }

    /// Frames on the TX ring the kernel has not taken yet.
    fn tx_pending(&self) -> u32 {
        self.main.tx.as_ref().map_or(0, Ring::pending)
    }

    /// Kicks the kernel to send what is on the TX ring (copy mode: in budgets of 32 frames).
    fn kick_tx(&mut self) -> Result<(), LinkError> {
        let Some(tx) = self.main.tx.as_ref() else {
            return Ok(());
        };
        let rounds = (tx.size as usize).div_ceil(COPY_TX_BUDGET) + 1;
        for _ in 0..rounds {
            if tx.pending() == 0 || (self.zero_copy && !tx.needs_wakeup()) {
                return Ok(());
            }
            self.stats.wakeups += 1;
            // SAFETY: a zero-length send on our socket with no buffer and no address.
            let r = unsafe {
                libc::sendto(
                    self.main.fd.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    libc::MSG_DONTWAIT,
                    std::ptr::null(),
                    0,
                )
            };
            if r < 0 {
                let e = io::Error::last_os_error();
                match e.raw_os_error() {
                    // Budget used up (copy mode) or a concurrent kick: go round again.
                    Some(libc::EAGAIN) | Some(libc::EBUSY) | Some(libc::EINTR) => continue,
                    // No skb / completion space now: frames stay on the ring for the next flush.
                    Some(libc::ENOBUFS) => return Ok(()),
                    _ => {
                        return Err(LinkError::Io(io::Error::new(
                            e.kind(),
                            OsCause {
                                what: "AF_XDP transmit wake-up",
                                err: e,
                            },
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// The destination MAC for `ip`, from the cache or the kernel (see the module docs).
    fn neighbour(&mut self, now: u64, ip: IpAddr) -> Option<[u8; 6]> {
        let slot = self
            .cache
            .iter()
            .position(|e| matches!(e, Some(n) if n.ip == ip));
        if let Some(i) = slot {
            let n = self.cache[i].expect("slot is some");
            if n.mac.is_some() && now.saturating_sub(n.at) < NEIGH_TTL_NS {
                return n.mac;
            }
        }
        let mac = self.neigh.lookup(ip).ok().flatten();
        let i = slot.unwrap_or_else(|| {
            let i = self.cache_next;
            self.cache_next = (i + 1) % NEIGH_SLOTS;
            i
        });
        let mut e = self.cache[i].filter(|n| n.ip == ip).unwrap_or(Neigh {
            ip,
            mac: None,
            at: now,
            solicited: 0,
        });
        e.mac = mac;
        e.at = now;
        if mac.is_none()
            && (e.solicited == 0 || now.saturating_sub(e.solicited) >= SOLICIT_EVERY_NS)
        {
            self.neigh.solicit(ip);
            e.solicited = now.max(1);
            // Once per link: a peer this link can never reach is named, with the reason, instead of RC only
            // retrying into RETRY_EXC_ERR (issue #19; a peer that resolves anyway, e.g. by proxy ARP, is never
            // named).
            if !self.unreachable_warned
                && let Some(why) = neigh::unreachable_because(&self.on_link, ip)
            {
                self.unreachable_warned = true;
                eprintln!(
                    "rocev2: AF_XDP link on {}: cannot reach {ip}: {why}; frames to it are dropped \
                     (xdp_tx_no_neighbour); use --link udp for such a peer",
                    self.ifname
                );
            }
        }
        self.cache[i] = Some(e);
        mac
    }

    /// Resolves the neighbour of `peer` ahead of traffic (control path): asks the kernel to resolve it and waits up
    /// to `wait` for a usable entry. Returns whether one was found.
    pub fn resolve(&mut self, peer: IpAddr, wait: std::time::Duration) -> bool {
        let start = std::time::Instant::now();
        loop {
            if let Ok(Some(_)) = self.neigh.lookup(peer) {
                return true;
            }
            self.neigh.solicit(peer);
            if start.elapsed() >= wait {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// Claims UDP `port` on `local` for this process: an ordinary UDP socket bound without `SO_REUSEPORT`, with a
/// filter that drops every datagram (the XDP program steers the port's frames past the kernel's UDP stack; frames
/// of queues without a socket would otherwise queue here unread). While the link holds it, no other process can
/// bind the port on the address: a rocev2 UDP link (its shared sockets set `SO_REUSEPORT`, docs/MULTIPROCESS.md),
/// another AF_XDP link, another RoCE stack. And an AF_XDP link on an address another process already uses fails
/// here, before its program could steer that process's frames away from it.
///
/// Errors: `io::ErrorKind::AddrInUse` with a message naming the rule when the port is taken; the step and OS
/// error otherwise.
fn claim(local: IpAddr, port: u16) -> Result<socket2::Socket, LinkError> {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let at = std::net::SocketAddr::new(local, port);
    let step = |what: &'static str| {
        move |e: io::Error| {
            LinkError::Io(io::Error::new(
                e.kind(),
                format!("{what} for UDP {at} (the AF_XDP link's claim on the port): {e}"),
            ))
        }
    };
    let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(step("socket"))?;
    crate::udp::drop_all(&s).map_err(step("SO_ATTACH_FILTER (drop all)"))?;
    match s.bind(&SockAddr::from(at)) {
        Ok(()) => Ok(s),
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => Err(LinkError::Io(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "UDP {port} on {local} is taken by another process, and an AF_XDP link takes its address \
                     alone: several processes on one address are not supported over AF_XDP (docs/DEVICE.md, \
                     \"Link\"); give each process an address of its own"
            ),
        ))),
        Err(e) => Err(step("bind")(e)),
    }
}

/// Owns the UMEM mapping: unmaps it when [`XdpLink::bind`] fails after mapping it, or with the link (declared
/// after the rings and the socket, so it is dropped after them; the kernel pins the pages it uses in any case).
struct UmemGuard {
    p: NonNull<u8>,
    len: usize,
}

impl Drop for UmemGuard {
    fn drop(&mut self) {
        // SAFETY: the mapping was made with this length in `bind`; no slice into it outlives the link's `&mut`
        // borrows, and the rings and socket that referred to it are dropped already.
        unsafe { libc::munmap(self.p.as_ptr().cast(), self.len) };
    }
}

fn setsockopt<T>(fd: RawFd, opt: libc::c_int, v: &T, what: &'static str) -> Result<(), LinkError> {
    // SAFETY: `v` is a valid `T` readable for its size, the layout the option expects.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_XDP,
            opt,
            (v as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 { Err(os(what).into()) } else { Ok(()) }
}

impl Link for XdpLink {
    fn caps(&self) -> LinkCaps {
        LinkCaps {
            mtu: self.mtu,
            max_burst: self.cfg.burst,
            icrc: IcrcCaps::default(),
            first_qpn: None,
        }
    }

    fn rx_burst(
        &mut self,
        _now: Instant,
        max: usize,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError> {
        let mut left = u32::try_from(max).unwrap_or(u32::MAX);
        let n = 1 + self.others.len();
        let start = self.rx_next;
        self.rx_next = (start + 1) % n;
        let mut taken = 0usize;
        for k in 0..n {
            if left == 0 {
                break;
            }
            let q = (start + k) % n;
            let x = if q == 0 {
                &mut self.main
            } else {
                &mut self.others[q - 1]
            };
            let (t, delivered, bad, wakeups) = x.rx_burst(self.cfg.frame_size, left, sink);
            left -= t;
            taken += t as usize;
            self.stats.rx_frames += delivered;
            self.stats.rx_bad_desc += bad;
            self.stats.wakeups += wakeups;
        }
        Ok(taken)
    }

    fn tx_buf(&mut self, _now: Instant) -> Result<&mut [u8], LinkError> {
        let addr = match self.tx_held {
            Some(a) => a,
            None => {
                if self.tx_free.is_empty() {
                    self.reap();
                }
                if self.main.tx.as_ref().is_none_or(|t| t.free() == 0) {
                    self.stats.tx_busy += 1;
                    return Err(LinkError::Busy);
                }
                let Some(a) = self.tx_free.pop() else {
                    self.stats.tx_busy += 1;
                    return Err(LinkError::Busy);
                };
                self.tx_held = Some(a);
                a
            }
        };
        let len = self.cfg.frame_size as usize;
        self.main.chunk(addr, len).ok_or(LinkError::NoTxBuffer)
    }

    fn tx_commit(&mut self, now: Instant, len: usize) -> Result<(), LinkError> {
        let Some(addr) = self.tx_held else {
            return Err(LinkError::NoTxBuffer);
        };
        if len > self.mtu {
            return Err(LinkError::TooLong { len, mtu: self.mtu });
        }
        let (dst, ok) = {
            let f = self.main.chunk(addr, len).ok_or(LinkError::NoTxBuffer)?;
            dest_ip(f)
        };
        let Some(dst) = dst.filter(|_| ok) else {
            self.tx_held = None;
            self.tx_free.push(addr);
            self.stats.tx_invalid += 1;
            return Ok(());
        };
        let Some(mac) = self.neighbour(now.as_nanos(), dst) else {
            self.tx_held = None;
            self.tx_free.push(addr);
            self.stats.tx_no_neighbour += 1;
            return Ok(());
        };
        let ifmac = self.ifmac;
        let f = self.main.chunk(addr, len).ok_or(LinkError::NoTxBuffer)?;
        f[0..6].copy_from_slice(&mac);
        f[6..12].copy_from_slice(&ifmac);
        let Some(tx) = self.main.tx.as_mut() else {
            return Err(LinkError::NoTxBuffer);
        };
        tx.push(libc::xdp_desc {
            addr,
            len: len as u32,
            options: 0,
        });
        self.tx_held = None;
        self.stats.tx_frames += 1;
        Ok(())
    }

    fn flush(&mut self, now: Instant) -> Result<(), LinkError> {
        if let Some(a) = self.tx_held.take() {
            self.tx_free.push(a);
        }
        if let Some(tx) = self.main.tx.as_ref() {
            tx.submit();
        }
        let r = self.kick_tx();
        self.reap();
        self.retry_at = if self.tx_pending() != 0 {
            self.stats.tx_left_pending += 1;
            Some(now.saturating_add(TX_RETRY))
        } else {
            None
        };
        r
    }

    fn poll_at(&self) -> Option<Instant> {
        self.retry_at
    }

    fn wait_fd(&self) -> Option<RawFd> {
        // Frames still on the TX ring need another flush; a wait on the descriptor would not announce that.
        if self.tx_pending() != 0 {
            return None;
        }
        Some(
            self.epoll
                .as_ref()
                .map_or(self.main.fd.as_raw_fd(), |e| e.as_raw_fd()),
        )
    }

    fn counters(&self, f: &mut dyn FnMut(&'static str, u64)) {
        let s = self.stats;
        f("xdp_rx_frames", s.rx_frames);
        f("xdp_tx_frames", s.tx_frames);
        f("xdp_tx_no_neighbour", s.tx_no_neighbour);
        f("xdp_tx_invalid", s.tx_invalid);
        f("xdp_rx_bad_desc", s.rx_bad_desc);
        f("xdp_tx_busy", s.tx_busy);
        f("xdp_wakeups", s.wakeups);
        f("xdp_tx_left_pending", s.tx_left_pending);
        if let Ok(k) = self.kernel_stats() {
            f("xdp_rx_dropped", k.rx_dropped);
            f("xdp_rx_ring_full", k.rx_ring_full);
            f("xdp_rx_fill_ring_empty", k.rx_fill_ring_empty_descs);
            f("xdp_tx_invalid_descs", k.tx_invalid_descs);
        }
    }
}

/// Most receive queues bound (one socket and UMEM each).
pub const MAX_QUEUES: u32 = 64;

/// Receive queues of `ifname` (`ETHTOOL_GCHANNELS`: rx + combined channels; veth reports its real queue
/// count); 1 when the driver does not say.
fn rx_queues(ifname: &str) -> u32 {
    /// `struct ethtool_channels` (`include/uapi/linux/ethtool.h`).
    #[repr(C)]
    #[derive(Default)]
    struct Channels {
        cmd: u32,
        max_rx: u32,
        max_tx: u32,
        max_other: u32,
        max_combined: u32,
        rx_count: u32,
        tx_count: u32,
        other_count: u32,
        combined_count: u32,
    }
    const ETHTOOL_GCHANNELS: u32 = 0x3c;
    let Ok(s) = std::net::UdpSocket::bind("0.0.0.0:0") else {
        return 1;
    };
    let mut ch = Channels {
        cmd: ETHTOOL_GCHANNELS,
        ..Channels::default()
    };
    // SAFETY: `ifreq` is plain old data; all-zero is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let name = ifname.as_bytes();
    if name.len() >= req.ifr_name.len() {
        return 1;
    }
    for (d, &b) in req.ifr_name.iter_mut().zip(name) {
        *d = b as libc::c_char;
    }
    req.ifr_ifru.ifru_data = (&mut ch as *mut Channels).cast();
    // SAFETY: `req` names the interface and points at a valid `ethtool_channels`, which lives across the call.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCETHTOOL, &mut req) } < 0 {
        return 1;
    }
    (ch.rx_count + ch.combined_count).max(1)
}

/// An epoll descriptor that is readable when any of `socks` has a received frame (level-triggered).
fn epoll_of<'a>(socks: impl Iterator<Item = &'a Xsk>) -> Result<OwnedFd, LinkError> {
    // SAFETY: plain epoll_create1(2); checked below.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return Err(os("creating the epoll set of the AF_XDP sockets").into());
    }
    // SAFETY: a new descriptor nothing else owns.
    let ep = unsafe { OwnedFd::from_raw_fd(fd) };
    for x in socks {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: x.fd.as_raw_fd() as u64,
        };
        // SAFETY: both descriptors are open; `ev` is a valid event for the call.
        if unsafe { libc::epoll_ctl(fd, libc::EPOLL_CTL_ADD, x.fd.as_raw_fd(), &mut ev) } < 0 {
            return Err(os("adding an AF_XDP socket to the epoll set").into());
        }
    }
    Ok(ep)
}

/// The destination IP of an Ethernet frame (untagged IPv4 or IPv6), and whether the frame is long enough to
/// hold it.
fn dest_ip(f: &[u8]) -> (Option<IpAddr>, bool) {
    match f.get(12..14) {
        Some([0x08, 0x00]) => match f.get(30..34) {
            Some(a) => (
                Some(IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))),
                true,
            ),
            None => (None, false),
        },
        Some([0x86, 0xdd]) => match f.get(38..54).and_then(|a| <[u8; 16]>::try_from(a).ok()) {
            Some(a) => (Some(IpAddr::V6(a.into())), true),
            None => (None, false),
        },
        _ => (None, false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dest_ip_of_frames() {
        let mut f = [0u8; 60];
        f[12] = 0x08;
        f[30..34].copy_from_slice(&[198, 18, 26, 2]);
        assert_eq!(
            dest_ip(&f),
            (Some(IpAddr::V4(Ipv4Addr::new(198, 18, 26, 2))), true)
        );
        assert_eq!(dest_ip(&f[..33]), (None, false));
        f[12] = 0x88;
        assert_eq!(dest_ip(&f), (None, false));
    }

    #[test]
    fn a_missing_interface_is_named() {
        let cfg = XdpConfig {
            interface: Some("rcexdpnone0".to_owned()),
            ..XdpConfig::new("198.18.26.1".parse().expect("ip"))
        };
        let e = XdpLink::bind(cfg).err().expect("refused");
        let LinkError::Io(io) = e else {
            panic!("not an I/O error: {e:?}")
        };
        assert_eq!(io.kind(), io::ErrorKind::NotFound);
        let m = io.to_string();
        assert!(
            m.contains("rcexdpnone0") && m.contains("no such interface"),
            "{m}"
        );
    }

    #[test]
    fn ipv6_local_is_refused_with_a_reason() {
        let e = XdpLink::bind(XdpConfig::new("::1".parse().expect("ip")))
            .err()
            .expect("refused");
        let LinkError::Io(io) = e else {
            panic!("not an I/O error: {e:?}")
        };
        assert_eq!(io.kind(), io::ErrorKind::InvalidInput);
        assert!(io.to_string().contains("IPv4 only"), "{io}");
    }
}
