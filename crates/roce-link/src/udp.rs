//! The UDP socket backend: RoCE v2 over a kernel UDP socket on port 4791 ([`UdpLink`]).
//!
//! The engine speaks whole Ethernet frames; a UDP socket speaks UDP payloads (BTH .. ICRC). This backend converts
//! in both directions so that the bytes the Linux kernel puts on the wire are the frame the engine built
//! (except the MAC addresses, which the kernel's neighbour table chooses, and the IPv6 flow label, see below).
//!
//! # Transmit
//!
//! [`Link::tx_buf`] lends a slot of a preallocated batch; [`Link::tx_commit`] parses the frame's Ethernet / IPv4 or
//! IPv6 / UDP headers (VLAN tags are stripped), checks them against what Linux will write, and queues the UDP
//! payload; [`Link::flush`] hands the queue to the kernel with `sendmmsg(2)`, **one call per source-port socket**:
//! the queued frames are grouped by socket (stably, so frames of one socket — and so of one QP — leave in the order
//! they were committed), so two or more busy QPs whose frames the engine interleaves still cost one system call per
//! QP per flush, not one per frame ([`UdpStats::tx_sendmmsg`] counts the calls). Frames of different sockets may
//! leave in another order than committed; nothing depends on that order (each QP's packets are ordered by their own
//! PSNs, and a QP always uses one source port). Grouping uses preallocated index arrays (no allocation) and at most
//! `burst`² / 2 comparisons per flush. Each datagram carries `IP_TOS` + `IP_TTL` (IPv6: `IPV6_TCLASS` + `IPV6_HOPLIMIT`) control
//! messages taken from the frame's IP header, so DSCP, ECN (e.g. ECT(0)) and TTL are the engine's, per packet.
//!
//! The ICRC covers the IPv4 identification, flags, lengths and the UDP ports (`ROCEV2.md §3`), so:
//!
//! * **IP ID and DF.** Every socket sets `IP_MTU_DISCOVER = IP_PMTUDISC_DO` and is never connected; Linux then
//!   writes DF and IP ID 0 (`ip_select_ident`: a DF packet from a socket without a destination gets ID 0;
//!   `docs/spec/INTEROP.md` §6). A frame whose IPv4 ID is not 0 or whose DF bit is clear would
//!   leave with an ICRC that fails at the peer. Such frames are counted in [`UdpStats::tx_ip_hdr_mismatch`] and,
//!   per [`IpIdPolicy`], dropped or repaired (ICRC recomputed for ID 0 + DF). The rocev2 engine itself always
//!   writes ID 0 + DF (`roce_proto` `wire::IPV4_IDENT`), so its frames never take this path; it exists for
//!   *foreign* frames sent through the link: frames received from a stack that numbers its IDs (rxe, via
//!   [`RxMode::Packet`]) and replayed or relayed, or captured rxe traffic sent again. For those, `Repair` (the
//!   default) makes them valid on the wire at the cost of one CRC pass; `Drop` refuses them.
//! * **UDP source port.** The engine uses a per-QP source port (`0xC000 | hash(QPNs)`, `ROCEV2.md §1.4`, as rxe
//!   does: ECMP entropy, and the port is in the ICRC). The backend therefore sends each frame from a socket
//!   bound to `local_ip:frame_source_port`, created on first use and cached (a 64 Ki-entry port → socket table,
//!   O(1) per packet). The alternative, a fixed engine source port, would need an engine change and would lose
//!   the per-QP entropy rxe peers expect. These sockets do **not** set `SO_REUSEADDR`: a port already owned by
//!   another socket is reported (`EADDRINUSE`, frame dropped and counted in [`UdpStats::tx_errors`]) instead of
//!   silently sharing its traffic. The range 0xC000..=0xFFFF overlaps Linux's default ephemeral ports
//!   (32768..=60999); reserve it on hosts that run other UDP/TCP clients
//!   (`sysctl net.ipv4.ip_local_reserved_ports=49152-65535`). [`UdpConfig::max_tx_sockets`] bounds the number
//!   of file descriptors (default 1024, within the common `ulimit -n` of a C program and `select`'s `FD_SETSIZE`):
//!   once that many are open, a frame with a new source port leaves from an existing socket chosen by its port
//!   (`1 + port mod max_tx_sockets`, cached, so each QP still keeps one port for its life); the link writes that
//!   socket's port into the UDP header and recomputes the ICRC (gathered payload is copied first), counted in
//!   [`UdpStats::tx_sport_shared`]. So any number of QPs send, with up to `max_tx_sockets` distinct ports of ECMP
//!   entropy, and a QP's packets stay on one path and in order (`ROCEV2.md §1.4`). A new
//!   socket is created in the calling thread's network namespace, so a link bound inside a namespace (`setns`)
//!   must commit frames with new source ports from a thread in that namespace; otherwise `tx_commit` fails with
//!   a "wrong network namespace" [`LinkError::Io`] instead of binding in the wrong one.
//! * **UDP checksum.** The engine writes 0 (as rxe); IPv4 sockets set `SO_NO_CHECK`, IPv6 sockets
//!   `UDP_NO_CHECK6_TX`/`UDP_NO_CHECK6_RX`, so the wire also carries 0 and zero-checksum IPv6 peers are accepted.
//! * **IPv6 flow label** is chosen by the kernel (masked in the ICRC, so harmless).
//!
//! A frame the kernel cannot produce (source IP not the bound address, wrong family, not UDP to
//! [`UdpConfig::peer_port`], inconsistent lengths) is dropped and counted in [`UdpStats::tx_invalid`].
//!
//! # Receive
//!
//! [`Link::rx_burst`] takes up to a burst with one `recvmmsg(2)`; each datagram lands in its slot behind a gap the
//! size of the Ethernet + IP + UDP headers, which the backend then fills: MACs from [`UdpConfig::local_mac`]
//! (destination) and [`UdpConfig::peer_mac`] (source); IPv4 with the received TOS (`IP_RECVTOS`, so CE marks
//! reach the engine) and TTL (`IP_RECVTTL`), DF, ID 0, the right total length and a valid header checksum, the
//! destination address from `IP_PKTINFO`; IPv6 with the received traffic class / hop limit, flow label 0; UDP
//! with the sender's ports, the right length and checksum 0.
//!
//! **Kernel drops.** Frames the kernel drops for the receive socket before the link reads them (its buffer full
//! while the reader was descheduled) are invisible to the engine except as a sequence gap; the link counts them in
//! [`UdpStats::rx_kernel_drops`] (in both receive modes) from the `SO_RXQ_OVFL` control message every received
//! frame carries, with a low-rate `SO_MEMINFO` reading when the queue is found empty, and a fresh one for each
//! [`Link::counters`] call (the stats endpoint, `perf --stats`), so the last drops of a run are not missed.
//!
//! **ICRC: verified here, once.** With [`UdpConfig::verify_rx_icrc`] (default) the backend checks the ICRC over
//! the rebuilt frame, counts failures in [`UdpStats::rx_icrc_bad`], drops them, and reports
//! [`IcrcCaps::rx_verified`]. The rebuilt IPv4 header assumes the sender used ID 0 + DF (true for this backend
//! and for any unconnected-socket sender); a peer that numbers its IPv4 IDs (Linux rxe does: an incrementing ID,
//! `docs/spec/INTEROP.md` §4) cannot be verified through a UDP socket, whose API never
//! shows the received ID. For such peers use [`RxMode::Packet`].
//!
//! **Multicast groups.** [`UdpLink::join_group`] ([`Link::join_multicast`]) adds a socket bound to the group (with
//! `SO_REUSEADDR`, so every process on the host that joined gets a copy) that has joined it on the interface of
//! [`UdpConfig::local`]; `rx_burst` reads it after the receive socket, and [`Link::wait_fd`] is then an epoll set of
//! both. Its frames are rebuilt the same way, the group as destination. Socket mode only.
//!
//! ## [`RxMode::Packet`]: frames as they came off the wire
//!
//! With [`UdpConfig::rx`] = [`RxMode::Packet`], received frames come from an `AF_PACKET` socket bound to the
//! interface that owns [`UdpConfig::local`] (found with `getifaddrs`, or named by [`UdpConfig::rx_interface`]) in
//! the namespace the link is bound in. A classic BPF program attached with `SO_ATTACH_FILTER` keeps only frames
//! that this host did not send (`pkt_type` ≠ `PACKET_OUTGOING`, so loopback frames are seen once), are IPv4
//! (IPv6) UDP to `local`, are not later fragments, and go to UDP port [`UdpConfig::port`]; the kernel discards the rest
//! before they are queued. The socket is opened with protocol 0 and bound to the IP EtherType only after the
//! filter is in place, so no unfiltered frame ever reaches it. Frames reach the engine byte for byte as received
//! (real MACs, the sender's IP identification, flags, TTL, checksum), trimmed to the IP length (Ethernet padding
//! removed); the IPv4 header checksum and a non-zero UDP checksum are checked first, as the kernel's IP/UDP layers
//! would (failures counted in [`UdpStats::rx_bad_checksum`] and dropped; a fragmented IPv4 datagram, which a tap
//! cannot take whole, is dropped and counted in [`UdpStats::rx_fragments`]), then the ICRC is verified over those
//! bytes and failures are counted in [`UdpStats::rx_icrc_bad`] as in socket mode. One field can differ from what a remote sender wrote: a frame sent by a socket on this host
//! through a veth or `lo` with checksum offload still holds a partial UDP checksum (`PACKET_AUXDATA` reports
//! `TP_STATUS_CSUMNOTREADY`); the link completes it, as the NIC would have (not ICRC-covered, so only captures
//! notice). The UDP socket stays bound to the port, so the kernel answers nothing with ICMP port-unreachable,
//! and gets a drop-all filter (attached before `bind`), so its queue never fills. Transmit is unchanged (UDP
//! sockets).
//!
//! Limits: needs `CAP_NET_RAW`; sees only frames that arrive on that one interface (a peer on the same host
//! whose traffic to a non-loopback address goes through `lo` is not seen; use socket mode, or
//! `rx_interface = "lo"`); VLAN tags are stripped by the kernel before packet taps, so frames arrive untagged;
//! IPv6 frames with extension headers are not accepted.
//!
//! # Errors
//!
//! OS errors come back as [`LinkError::Io`] with the operation and address in the message. `EAGAIN`/`ENOBUFS`
//! on send is back-pressure: the frames stay queued (nothing is lost), [`UdpStats::tx_busy`] counts it, and
//! [`Link::tx_buf`] answers [`LinkError::Busy`] while the batch is full.

use std::io;
use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;

use roce_wire::{
    EtherType, EthernetAddress, EthernetFrame, EthernetRepr, Ipv4Packet, Ipv4Repr, Ipv6Packet,
    Ipv6Repr, ROCE_V2_PORT, UdpPacket, UdpRepr, icrc, ipv4, ipv6, udp,
};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::{
    IcrcCaps, Instant, Link, LinkCaps, LinkError, TxGather, TxSeg, copy_pieces, reuseport,
};

/// Length of an untagged Ethernet header.
const ETH_LEN: usize = 14;
/// `UDP_NO_CHECK6_TX` / `UDP_NO_CHECK6_RX` (linux/udp.h).
const UDP_NO_CHECK6_TX: libc::c_int = 101;
const UDP_NO_CHECK6_RX: libc::c_int = 102;
/// Bytes of control-message space per datagram (aligned; two `int` cmsgs on TX; on RX pktinfo + two + the receive
/// timestamp + the `SO_RXQ_OVFL` drop count: 136 bytes for IPv4, 144 for IPv6; `PACKET_AUXDATA` + drop count: 56).
const CMSG_WORDS: usize = 20;
/// Engine time (ns) between two `SO_MEMINFO` reads of the kernel's drop count by [`Link::rx_burst`] (only when a
/// receive found the queue empty).
const KERNEL_DROPS_POLL_NS: u64 = 100_000_000;

/// Classic BPF opcodes (linux/bpf_common.h), as the `u16` `sock_filter::code` field wants them.
mod bpf {
    // BPF_LD = 0x00, BPF_W = 0x00, BPF_H = 0x08, BPF_B = 0x10, BPF_ABS = 0x20, BPF_IND = 0x40.
    pub const LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
    pub const LD_H_ABS: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
    pub const LD_B_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
    pub const LD_H_IND: u16 = 0x48; // BPF_LD | BPF_H | BPF_IND
    pub const LDX_B_MSH: u16 = 0x01 | 0x10 | 0xa0; // BPF_LDX | BPF_B | BPF_MSH
    pub const JEQ_K: u16 = 0x05 | 0x10; // BPF_JMP | BPF_JEQ | BPF_K
    pub const JSET_K: u16 = 0x05 | 0x40; // BPF_JMP | BPF_JSET | BPF_K
    pub const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    /// `SKF_AD_OFF + SKF_AD_PKTTYPE`: ancillary load of the skb's packet type (linux/filter.h).
    pub const AD_PKTTYPE: u32 = 0xFFFF_F000 + 4;
    /// `PACKET_OUTGOING` (linux/if_packet.h): a copy of a frame this host sent.
    pub const PACKET_OUTGOING: u32 = 4;
    /// Bytes of a frame an accepting filter keeps (all of it).
    pub const ACCEPT: u32 = 0x0004_0000;
}

/// What [`UdpLink`] does with a frame whose IPv4 identification is not 0 or whose DF bit is clear: Linux will
/// put ID 0 and DF on the wire, so that frame's ICRC would be wrong at the peer (`ROCEV2.md §3`). Frames from the
/// rocev2 engine always carry ID 0 + DF; this only matters for foreign frames (rxe's numbered IDs) that are sent
/// through the link again, see the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IpIdPolicy {
    /// Drop it (counted in [`UdpStats::tx_ip_hdr_mismatch`]).
    Drop,
    /// Recompute the ICRC for the header Linux will send (ID 0, DF) and send it (counted in
    /// [`UdpStats::tx_ip_hdr_mismatch`]). Costs one CRC pass over the packet.
    #[default]
    Repair,
}

/// Where [`UdpLink`] takes received frames from (see the module docs, "Receive").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RxMode {
    /// From the UDP socket bound to [`UdpConfig::port`]; the Ethernet/IP/UDP header is rebuilt, assuming the
    /// sender wrote IPv4 ID 0 + DF (any rocev2 [`UdpLink`], any unconnected-socket sender). No privileges needed.
    #[default]
    Socket,
    /// Whole frames as they came off the wire, from an `AF_PACKET` socket on the interface that owns
    /// [`UdpConfig::local`] (or [`UdpConfig::rx_interface`]), filtered in the kernel (classic BPF) to UDP to
    /// `local:port`. Needed to verify the ICRC of senders that number their IPv4 IDs, such as Linux Soft-RoCE (rxe).
    /// The UDP socket stays bound to the port (so the kernel sends no ICMP port-unreachable) with a drop-all filter
    /// (so its queue never fills). Needs `CAP_NET_RAW`.
    Packet,
}

/// Configuration of a [`UdpLink`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdpConfig {
    /// Local address to bind (IPv4 or IPv6, not unspecified). Transmitted frames must carry it as source IP.
    pub local: IpAddr,
    /// Local UDP port to receive on (default 4791, `ROCEV2.md §1.4`).
    pub port: u16,
    /// Destination UDP port transmitted frames must use (default 4791).
    pub peer_port: u16,
    /// Destination MAC written into rebuilt received frames (the engine's own MAC, `EngineConfig::mac`).
    pub local_mac: [u8; 6],
    /// Source MAC written into rebuilt received frames.
    pub peer_mac: [u8; 6],
    /// Largest frame in bytes including the 14-byte Ethernet header ([`LinkCaps::mtu`]). Default 14 + 4200
    /// (the engine's default netdev MTU). The path MTU must allow it: DF is set, oversize sends fail (`EMSGSIZE`).
    pub mtu: usize,
    /// Frames per `sendmmsg` / `recvmmsg` ([`LinkCaps::max_burst`]); default 32.
    pub burst: usize,
    /// Verify the ICRC of received frames here (see the module docs). Default true.
    pub verify_rx_icrc: bool,
    /// Handling of transmitted frames with IPv4 ID ≠ 0 or DF clear.
    pub ip_id: IpIdPolicy,
    /// Most per-source-port transmit sockets to open (file descriptors); default 1024. Past it, new source ports
    /// share the open sockets (module docs, "UDP source port"); 0 = no transmit sockets (every send fails).
    pub max_tx_sockets: usize,
    /// `SO_RCVBUF` / `SO_SNDBUF` in bytes, if set (default 4 MiB). The receive buffer is set with
    /// `SO_RCVBUFFORCE` when the process may (CAP_NET_ADMIN), so it is not capped by `net.core.rmem_max`; otherwise
    /// (and always for the send buffer) the kernel caps it at `rmem_max`/`wmem_max`. A UC/UD message whose packets do
    /// not all fit while the receiving thread is not scheduled is lost (nothing retransmits it), so a user of large
    /// unreliable messages wants this above the largest message in flight.
    pub socket_buffer: Option<usize>,
    /// Receive path (default [`RxMode::Socket`]).
    pub rx: RxMode,
    /// [`RxMode::Packet`]: the interface to capture on; `None` (default) = the interface that owns
    /// [`UdpConfig::local`] in the namespace the link is bound in.
    pub rx_interface: Option<String>,
    /// Share the address with other processes (`docs/MULTIPROCESS.md`): bind with `SO_REUSEPORT` and join the
    /// kernel steering of [`crate::reuseport`], which gives this link a QPN slot ([`UdpLink::shared`],
    /// [`LinkCaps::first_qpn`]). When the kernel refuses the steering (no `CAP_BPF`), the link binds alone as without
    /// this option and keeps the reason ([`UdpLink::share_error`]). Only with [`RxMode::Socket`]. Default false.
    pub share: bool,
}

impl UdpConfig {
    /// Defaults for a link bound to `local`.
    pub fn new(local: IpAddr) -> UdpConfig {
        UdpConfig {
            local,
            port: ROCE_V2_PORT,
            peer_port: ROCE_V2_PORT,
            local_mac: [0x02, 0, 0, 0, 0, 1],
            peer_mac: [0x02, 0, 0, 0, 0, 2],
            mtu: ETH_LEN + 4200,
            burst: 32,
            verify_rx_icrc: true,
            ip_id: IpIdPolicy::Repair,
            max_tx_sockets: 1024,
            socket_buffer: Some(4 << 20),
            rx: RxMode::Socket,
            rx_interface: None,
            share: false,
        }
    }
}

/// Counters of a [`UdpLink`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams handed to the kernel.
    pub tx_frames: u64,
    /// Bytes of the frames handed to the kernel (Ethernet header .. ICRC, as [`UdpStats::rx_bytes`] and the
    /// engine's byte counters count them; the kernel sends the UDP payload of each).
    pub tx_bytes: u64,
    /// `sendmmsg(2)` calls made (successful or not); `tx_frames / tx_sendmmsg` is the average batch.
    pub tx_sendmmsg: u64,
    /// `sendmmsg` calls that found the socket full (`EAGAIN`/`ENOBUFS`); the frames stayed queued.
    pub tx_busy: u64,
    /// Frames dropped because the kernel refused them (`EMSGSIZE`, unreachable, `EADDRINUSE` on a new source-port
    /// socket, too many sockets).
    pub tx_errors: u64,
    /// Frames that are not IPv4/IPv6 + UDP to [`UdpConfig::peer_port`] from [`UdpConfig::local`] with
    /// consistent lengths; dropped.
    pub tx_invalid: u64,
    /// IPv4 frames with ID ≠ 0 or DF clear (dropped or repaired per [`IpIdPolicy`]).
    pub tx_ip_hdr_mismatch: u64,
    /// Payload bytes of gathered frames ([`Link::tx_commit_gather`]) handed to the kernel straight from the
    /// application's registered memory (iovecs, no user-space copy).
    pub tx_gathered_bytes: u64,
    /// Payload bytes of gathered frames this link had to copy into its own buffers: frames with more than
    /// [`MAX_GATHER`] pieces, frames it repaired ([`IpIdPolicy::Repair`]), and frames still queued when `flush`
    /// returned (socket full), which must not keep pointers into registered memory.
    pub tx_linearized_bytes: u64,
    /// Transmit sockets currently open (one per source port in use, plus the receive socket; at most
    /// [`UdpConfig::max_tx_sockets`] + 1).
    pub tx_sockets: u64,
    /// Frames sent from a shared socket because their source port found [`UdpConfig::max_tx_sockets`] reached:
    /// their UDP source port was rewritten to the shared socket's and their ICRC recomputed (gathered payload
    /// copied into the link's buffer first, counted in [`UdpStats::tx_linearized_bytes`]).
    pub tx_sport_shared: u64,
    /// Frames delivered to the receive sink.
    pub rx_frames: u64,
    /// Bytes (rebuilt frames) delivered to the receive sink.
    pub rx_bytes: u64,
    /// Datagrams dropped because the ICRC over the rebuilt frame is wrong, or the datagram is too short to hold
    /// BTH + ICRC.
    pub rx_icrc_bad: u64,
    /// Datagrams dropped because the rebuilt frame would exceed [`UdpConfig::mtu`] (or the kernel truncated them,
    /// `MSG_TRUNC`).
    pub rx_truncated: u64,
    /// Datagrams dropped because their source or destination address is not of the link's family.
    pub rx_bad_addr: u64,
    /// [`RxMode::Packet`] frames dropped because the IPv4 header checksum or a non-zero UDP checksum (IPv4 or
    /// IPv6) is wrong: the kernel, rxe or an RNIC would never hand them to RoCE processing (`ROCEV2.md §1.4`). In
    /// socket mode the kernel drops them itself (they never reach the link).
    pub rx_bad_checksum: u64,
    /// [`RxMode::Packet`] IPv4 datagrams to the link's address and UDP port dropped because they arrived
    /// fragmented: a packet tap sees fragments before the kernel's reassembly, so the whole datagram is never
    /// there to take. Counted once per datagram, at its first fragment (offset 0, MF set: the only one that carries
    /// the UDP port); the kernel's filter discards the later fragments unseen. A RoCE sender never fragments (DF,
    /// frames within the path MTU, `ROCEV2.md §1.4`), so these come from a misconfigured or hostile sender. In
    /// socket mode the kernel reassembles and delivers them whole.
    pub rx_fragments: u64,
    /// The longest time (µs) a datagram waited in the receive socket: from the kernel's receive timestamp
    /// (`SO_TIMESTAMPNS`, taken when the datagram was queued to the socket) to the `recvmmsg` that read it. Socket
    /// receive mode only. A wait near or above the peer's local ACK timeout means this side did not read (its
    /// progress thread or caller did not run) while responses or requests waited for it: a stall of the reader,
    /// not loss.
    pub rx_wait_max_us: u64,
    /// Frames the kernel dropped for the socket this link reads (the UDP socket, or in [`RxMode::Packet`] the
    /// `AF_PACKET` socket) before the link could read them, mostly because its receive buffer
    /// ([`UdpConfig::socket_buffer`]) was full while the reader did not run; for the UDP socket also datagrams
    /// the kernel's UDP layer refused (bad UDP checksum). Frames, cumulative since `bind`. Source: the socket's
    /// `sk_drops`, read from the `SO_RXQ_OVFL` control message of every received datagram (socket(7); no extra
    /// system call) and with `getsockopt(SO_MEMINFO)` (`SK_MEMINFO_DROPS`, sock_diag(7)) when a receive finds the
    /// queue empty (at most every 100 ms of engine time) and on [`UdpLink::refresh_kernel_drops`]; each
    /// [`Link::counters`] call reads it afresh. (packet(7)'s `PACKET_STATISTICS` counts the same overflows as
    /// `tp_drops` but resets on every read, so it is not used.)
    /// Such a loss never reached the wire's far end of this host's stack: on a lossless path, a sequence gap the
    /// engine counts on this side is explained by it and by nothing else.
    pub rx_kernel_drops: u64,
}

impl UdpStats {
    /// The names of the counters [`values`](Self::values) lists, in its order (the field names; `tx_sendmmsg`,
    /// `tx_gathered_bytes` and `tx_linearized_bytes` are left out).
    pub const NAMES: [&'static str; 16] = [
        "tx_frames",
        "tx_bytes",
        "tx_busy",
        "tx_errors",
        "tx_invalid",
        "tx_ip_hdr_mismatch",
        "tx_sockets",
        "rx_frames",
        "rx_bytes",
        "rx_icrc_bad",
        "rx_truncated",
        "rx_bad_addr",
        "rx_bad_checksum",
        "rx_fragments",
        "rx_wait_max_us",
        "rx_kernel_drops",
    ];

    /// The counters of [`NAMES`](Self::NAMES) that count datagrams (or frames) the link dropped or failed to send
    /// before the engine saw them: what `rocev2 stat` shows on its `link` line by default.
    pub const DROP_NAMES: [&'static str; 8] = [
        "rx_kernel_drops",
        "rx_icrc_bad",
        "rx_truncated",
        "rx_bad_addr",
        "rx_bad_checksum",
        "rx_fragments",
        "tx_errors",
        "tx_invalid",
    ];

    /// The values of the counters named in [`NAMES`](Self::NAMES), in that order.
    pub fn values(&self) -> [u64; 16] {
        [
            self.tx_frames,
            self.tx_bytes,
            self.tx_busy,
            self.tx_errors,
            self.tx_invalid,
            self.tx_ip_hdr_mismatch,
            self.tx_sockets,
            self.rx_frames,
            self.rx_bytes,
            self.rx_icrc_bad,
            self.rx_truncated,
            self.rx_bad_addr,
            self.rx_bad_checksum,
            self.rx_fragments,
            self.rx_wait_max_us,
            self.rx_kernel_drops,
        ]
    }
}

/// Payload pieces per gathered frame the link sends as iovecs; a frame with more is copied into the slot.
pub const MAX_GATHER: usize = 8;

/// Per-slot metadata of a queued datagram.
#[derive(Clone, Copy)]
struct TxMeta {
    /// Gathered frame: headers at `..head`, pieces in `tx_segs`, trailer at `head + payload..` of the slot.
    gather: Option<TxGather>,
    /// Payload start within the slot.
    off: usize,
    /// Payload length.
    len: usize,
    /// Index into `socks`.
    sock: u16,
    /// IPv4 TOS / IPv6 traffic class.
    tos: u8,
    /// TTL / hop limit (0 = kernel default).
    ttl: u8,
    /// Destination address (`sockaddr_in` or `sockaddr_in6`; the v6 struct is large enough for both).
    dst: libc::sockaddr_in6,
}

/// A RoCE v2 link over a kernel UDP socket (see the module docs for what it guarantees about the wire).
pub struct UdpLink {
    cfg: UdpConfig,
    v6: bool,
    /// Rebuilt header length: Ethernet + IP + UDP (42 or 62).
    hdr: usize,
    /// `socks[0]` receives (bound to `local:port`); the others send from one source port each.
    socks: Vec<Socket>,
    /// Source port → index into `socks` + 1 (0 = none yet). Past [`UdpConfig::max_tx_sockets`] a new source port
    /// maps to an existing socket (see [`UdpLink::sock_for`]).
    port_map: Vec<u16>,
    /// Index into `socks` → the UDP port that socket is bound to (what the kernel writes as source port).
    sock_port: Vec<u16>,
    tx_data: Vec<u8>,
    tx_meta: Vec<TxMeta>,
    /// Free transmit slots (a stack; the top is the slot `tx_buf` lends). Capacity `burst`, never grows.
    tx_free: Vec<u16>,
    /// Queued slots in commit order. Capacity `burst`.
    tx_pend: Vec<u16>,
    /// Scratch of `flush`: the slots of one socket's group, in commit order. Capacity `burst`.
    tx_sel: Vec<u16>,
    /// Scratch of `flush`, by position in `tx_pend`: already put into a group.
    tx_grouped: Vec<bool>,
    /// Scratch of `flush`, by slot: sent or dropped (leaves the queue).
    tx_done: Vec<bool>,
    /// Payload pieces of gathered frames, `MAX_GATHER` per slot.
    tx_segs: Vec<TxSeg>,
    /// `burst · (MAX_GATHER + 2)` iovecs: head, pieces, trailer per message.
    tx_iov: Vec<libc::iovec>,
    tx_msgs: Vec<libc::mmsghdr>,
    tx_ctrl: Vec<[u64; CMSG_WORDS]>,
    rx_data: Vec<u8>,
    /// Receive slot size: `mtu` + 1 (so a datagram that does not fit is seen as too long).
    rx_slot: usize,
    rx_iov: Vec<libc::iovec>,
    rx_msgs: Vec<libc::mmsghdr>,
    rx_ctrl: Vec<[u64; CMSG_WORDS]>,
    rx_names: Vec<libc::sockaddr_in6>,
    /// Kernel receive timestamp (ns since the epoch) of the datagram `rebuild` last parsed; 0 = none.
    rx_stamp_ns: u64,
    /// The kernel's cumulative drop count (`sk_drops`, a wrapping `u32`) last seen on the receive socket.
    rx_drops_seen: u32,
    /// Engine time (ns) of the next `SO_MEMINFO` read of the drop count by `rx_burst`.
    rx_drops_poll_ns: u64,
    /// Inode of the network namespace the link was bound in (new source-port sockets must be created there).
    netns: Option<u64>,
    /// [`RxMode::Packet`]: the filtered `AF_PACKET` socket frames are read from.
    pkt: Option<Socket>,
    /// The QPN slot of a shared address ([`UdpConfig::share`]).
    shared: Option<reuseport::Joined>,
    /// Why sharing was asked for but the link binds alone.
    share_error: Option<String>,
    /// Joined IP multicast groups, each with its socket bound to `group:port` ([`Link::join_multicast`]).
    mc: Vec<(IpAddr, Socket)>,
    /// While groups are joined: an epoll set of the receive socket and the group sockets, the link's
    /// [`Link::wait_fd`].
    mc_epoll: Option<std::os::fd::OwnedFd>,
    stats: UdpStats,
}

// SAFETY: the only non-`Send` fields are the `iovec`/`mmsghdr` scratch arrays, whose raw pointers point into this
// link's own heap buffers (or are stale), and `tx_segs`, whose pointers into registered memory are only read
// between `tx_commit_gather` and the end of the next `flush` (the caller's guarantee; `flush` copies whatever it
// could not send). They are rewritten before every `sendmmsg`/`recvmmsg` and never read otherwise, so moving the
// link to another thread moves everything they may refer to along with it.
unsafe impl Send for UdpLink {}

impl core::fmt::Debug for UdpLink {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("UdpLink")
            .field("local", &self.cfg.local)
            .field("port", &self.cfg.port)
            .field("queued", &self.tx_pend.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

fn io_ctx(e: io::Error, what: impl core::fmt::Display) -> LinkError {
    LinkError::Io(io::Error::new(e.kind(), format!("{what}: {e}")))
}

/// The receive buffer of `s`: `SO_RCVBUFFORCE` (beyond `net.core.rmem_max`, needs CAP_NET_ADMIN), else `SO_RCVBUF`
/// (capped by the kernel). Sizes above `c_int::MAX` are clamped.
fn set_recv_buffer(s: &Socket, bytes: usize) -> io::Result<()> {
    let n = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    match setopt(s, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, n) {
        Ok(()) => Ok(()),
        Err(_) => s.set_recv_buffer_size(bytes),
    }
}

fn setopt(s: &Socket, level: libc::c_int, name: libc::c_int, val: libc::c_int) -> io::Result<()> {
    // SAFETY: `s` is an open socket; the option value is a valid `c_int` that outlives the call, and its size is
    // passed exactly.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            level,
            name,
            (&val as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The zero-initialised value of a plain C struct.
fn zeroed<T: Copy>() -> T {
    // SAFETY: only used for libc structs (`sockaddr_in6`, `iovec`, `mmsghdr`) made of integers and raw pointers,
    // for which all-zero bytes are a valid value.
    unsafe { mem::zeroed() }
}

fn sockaddr_of(a: SocketAddr) -> libc::sockaddr_in6 {
    let mut out: libc::sockaddr_in6 = zeroed();
    match a {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sockaddr_in` (16 bytes) fits in `sockaddr_in6` (28 bytes); both are plain data and
            // `write_unaligned` has no alignment requirement.
            unsafe {
                core::ptr::write_unaligned((&mut out as *mut libc::sockaddr_in6).cast(), sin)
            };
        }
        SocketAddr::V6(a) => {
            out.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            out.sin6_port = a.port().to_be();
            out.sin6_addr.s6_addr = a.ip().octets();
            out.sin6_scope_id = a.scope_id();
        }
    }
    out
}

/// Reads an address filled in by the kernel (`msg_name`); `None` for other families.
fn sockaddr_to(s: &libc::sockaddr_in6) -> Option<(IpAddr, u16)> {
    match libc::c_int::from(s.sin6_family) {
        libc::AF_INET => {
            // SAFETY: the kernel wrote a `sockaddr_in` at the start of this (larger) buffer; unaligned read of
            // plain data.
            let sin: libc::sockaddr_in =
                unsafe { core::ptr::read_unaligned((s as *const libc::sockaddr_in6).cast()) };
            Some((
                IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes())),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 => Some((
            IpAddr::V6(Ipv6Addr::from(s.sin6_addr.s6_addr)),
            u16::from_be(s.sin6_port),
        )),
        _ => None,
    }
}

/// Inode of the calling thread's network namespace (`/proc/thread-self/ns/net`), if readable.
fn current_netns() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/thread-self/ns/net")
        .ok()
        .map(|m| m.ino())
}

fn sock_filter(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Attaches a classic BPF program that drops every datagram to `s` (nothing is ever queued on it; for a socket that
/// only keeps a port owned).
pub(crate) fn drop_all(s: &Socket) -> io::Result<()> {
    attach_filter(s, &[sock_filter(bpf::RET_K, 0, 0, 0)])
}

/// `SO_ATTACH_FILTER` of a classic BPF program (socket(7), filter.txt).
fn attach_filter(s: &Socket, prog: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        filter: prog.as_ptr().cast_mut(),
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call (the kernel copies the program); the option size
    // is exact.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&fprog as *const libc::sock_fprog).cast(),
            size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The classic BPF program of [`RxMode::Packet`]: accept frames that were not sent by this host (`pkt_type` ≠
/// `PACKET_OUTGOING`), are IPv4 (IPv6) UDP to `local`, not later fragments (an IPv4 fragment offset), and go to UDP
/// port `port`; drop the rest. The first fragment of a fragmented IPv4 datagram (offset 0, MF set) passes, so that
/// the link can count it ([`UdpStats::rx_fragments`]) before it drops it.
/// Offsets are from the start of the Ethernet header (no VLAN tag: the kernel strips it before packet taps).
fn rx_filter(local: IpAddr, port: u16) -> Vec<libc::sock_filter> {
    use bpf::*;
    let f = sock_filter;
    let port = u32::from(port);
    let mut p = vec![
        f(LD_W_ABS, 0, 0, AD_PKTTYPE),
        // Jump targets are patched below (relative offsets to the final "drop").
        f(JEQ_K, 0, 0, PACKET_OUTGOING),
    ];
    match local {
        IpAddr::V4(a) => {
            p.extend([
                f(LD_H_ABS, 0, 0, 12),
                f(JEQ_K, 0, 0, 0x0800),
                f(LD_B_ABS, 0, 0, 14 + 9),
                f(JEQ_K, 0, 0, u32::from(ipv4::PROTOCOL_UDP)),
                f(LD_W_ABS, 0, 0, 14 + 16),
                f(JEQ_K, 0, 0, u32::from_be_bytes(a.octets())),
                // A fragment offset: a later fragment, without the UDP header (MF alone passes: counted, then
                // dropped by the link).
                f(LD_H_ABS, 0, 0, 14 + 6),
                f(JSET_K, 0, 0, 0x1fff),
                // X = IPv4 header length; A = UDP destination port.
                f(LDX_B_MSH, 0, 0, 14),
                f(LD_H_IND, 0, 0, 14 + 2),
                f(JEQ_K, 0, 0, port),
            ]);
        }
        IpAddr::V6(a) => {
            let o = a.octets();
            p.extend([
                f(LD_H_ABS, 0, 0, 12),
                f(JEQ_K, 0, 0, 0x86dd),
                f(LD_B_ABS, 0, 0, 14 + 6),
                f(JEQ_K, 0, 0, u32::from(ipv4::PROTOCOL_UDP)),
            ]);
            for w in 0..4u32 {
                let i = w as usize * 4;
                p.push(f(LD_W_ABS, 0, 0, 14 + 24 + w * 4));
                p.push(f(
                    JEQ_K,
                    0,
                    0,
                    u32::from_be_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]),
                ));
            }
            p.extend([f(LD_H_ABS, 0, 0, 14 + 40 + 2), f(JEQ_K, 0, 0, port)]);
        }
    }
    // Accept, then drop. Patch every conditional jump: the last JEQ falls through to accept; every other test
    // jumps to drop when it fails (JEQ: jf; JSET and the PACKET_OUTGOING test: jt).
    let accept = p.len();
    p.push(f(RET_K, 0, 0, ACCEPT));
    let drop = p.len();
    p.push(f(RET_K, 0, 0, 0));
    for (i, ins) in p[..accept].iter_mut().enumerate() {
        let to_drop = (drop - i - 1) as u8;
        match ins.code {
            JEQ_K if i == 1 => ins.jt = to_drop,
            JSET_K => ins.jt = to_drop,
            JEQ_K => ins.jf = to_drop,
            _ => {}
        }
    }
    p
}

/// A network interface of the calling thread's network namespace and its IP addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    /// Its name (`eth0`, `lo`).
    pub name: String,
    /// Its interface index (0 if `if_nametoindex` failed).
    pub index: u32,
    /// `IFF_UP`: administratively up.
    pub up: bool,
    /// `IFF_RUNNING`: operationally up (carrier).
    pub running: bool,
    /// `IFF_LOOPBACK`.
    pub loopback: bool,
    /// Its IPv4 and IPv6 addresses, in `getifaddrs` order.
    pub addrs: Vec<IpAddr>,
}

/// Every interface with its addresses (getifaddrs(3)), in the order the kernel lists them; interfaces without an
/// IP address are included (no addresses).
///
/// # Errors
/// The `getifaddrs` error.
pub fn interfaces() -> io::Result<Vec<Interface>> {
    let mut list: *mut libc::ifaddrs = core::ptr::null_mut();
    // SAFETY: `list` is a valid out-pointer; on success it must be freed with freeifaddrs (done below).
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out: Vec<Interface> = Vec::new();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: `ifa_name` is a NUL-terminated string owned by the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        let i = match out.iter().position(|x| x.name == name) {
            Some(i) => i,
            None => {
                let flags = ifa.ifa_flags;
                let has = |f: libc::c_int| flags & f as libc::c_uint != 0;
                out.push(Interface {
                    // SAFETY: as above; `if_nametoindex` only reads the string.
                    index: unsafe { libc::if_nametoindex(ifa.ifa_name) },
                    name,
                    up: has(libc::IFF_UP),
                    running: has(libc::IFF_RUNNING),
                    loopback: has(libc::IFF_LOOPBACK),
                    addrs: Vec::new(),
                });
                out.len() - 1
            }
        };
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: `ifa_addr` is non-null and points at a sockaddr whose family says which struct it is.
        let fam = libc::c_int::from(unsafe { (*ifa.ifa_addr).sa_family });
        let a = match fam {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a `sockaddr_in`.
                let sin =
                    unsafe { core::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in>()) };
                IpAddr::V4(Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()))
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a `sockaddr_in6`.
                let sin6 =
                    unsafe { core::ptr::read_unaligned(ifa.ifa_addr.cast::<libc::sockaddr_in6>()) };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        out[i].addrs.push(a);
    }
    // SAFETY: `list` came from getifaddrs and is freed once; no reference into it survives (names were copied).
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

/// Index and name of the interface that owns `addr` in the calling thread's network namespace ([`interfaces`]);
/// a loopback address not configured on any interface (127.0.0.2) belongs to the loopback interface. This is the
/// interface [`RxMode::Packet`] captures on; callers can also use it to tell whether an address is local.
///
/// # Errors
/// `AddrNotAvailable` when no interface has the address; the `getifaddrs` error otherwise.
pub fn interface_of(addr: IpAddr) -> io::Result<(u32, String)> {
    let all = interfaces()?;
    // 127.0.0.0/8 (and ::1) are local through `lo` without being configured one by one.
    let found = all.iter().find(|i| i.addrs.contains(&addr)).or_else(|| {
        all.iter()
            .find(|i| i.loopback && addr.is_loopback() && !i.addrs.is_empty())
    });
    match found {
        Some(i) if i.index != 0 => Ok((i.index, i.name.clone())),
        Some(i) => Err(io::Error::other(format!(
            "interface {} has no index",
            i.name
        ))),
        None => Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!("no interface in this network namespace has address {addr}"),
        )),
    }
}

/// The name of the rocev2 device on interface `ifname`: `rocev2_<ifname>` (`rocev2_lo`, `rocev2_eth0`). A rocev2
/// program opens a device by binding one of the interface's addresses, so there is one device per interface, as
/// Linux rxe binds one RDMA device to one netdev; the name is unique in a network namespace because interface names
/// are, stable while the interface keeps its name, and at most 22 bytes (IFNAMSIZ 16 - 1 + 7), well inside
/// libibverbs' `IBV_SYSFS_NAME_MAX` (64). `rocev2 devinfo`, `rocev2 stat` and `rocev2 perf` use this name.
pub fn device_name_of_interface(ifname: &str) -> String {
    format!("rocev2_{ifname}")
}

/// The name of the rocev2 device that local address `addr` belongs to: [`device_name_of_interface`] of the
/// interface owning it ([`interface_of`]; 127.0.0.2 belongs to `lo`), in the calling thread's network namespace.
/// An address that no interface there has (a simulated link's, or another namespace's) gives `rocev2_<addr>`.
pub fn device_name(addr: IpAddr) -> String {
    match interface_of(addr) {
        Ok((_, ifname)) => device_name_of_interface(&ifname),
        Err(_) => format!("rocev2_{addr}"),
    }
}

/// The [`RxMode::Packet`] socket: `AF_PACKET`/`SOCK_RAW`, opened with protocol 0 (receives nothing), filtered,
/// then bound to the interface with the IP EtherType, so no unfiltered frame is ever queued.
fn packet_socket(cfg: &UdpConfig) -> Result<Socket, LinkError> {
    let (ifindex, ifname) = match &cfg.rx_interface {
        Some(name) => {
            let c = std::ffi::CString::new(name.as_str()).map_err(|_| {
                io_ctx(
                    io::Error::from(io::ErrorKind::InvalidInput),
                    "interface name with NUL",
                )
            })?;
            // SAFETY: `c` is a NUL-terminated string.
            let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
            if idx == 0 {
                return Err(io_ctx(
                    io::Error::last_os_error(),
                    format_args!("interface {name}"),
                ));
            }
            (idx, name.clone())
        }
        None => interface_of(cfg.local).map_err(|e| {
            io_ctx(
                e,
                format_args!(
                    "finding the interface of {} for AF_PACKET receive",
                    cfg.local
                ),
            )
        })?,
    };
    let ctx = |what: &'static str| {
        let ifname = ifname.clone();
        move |e| io_ctx(e, format_args!("{what} (AF_PACKET on {ifname})"))
    };
    let s = Socket::new(Domain::PACKET, Type::RAW, Some(Protocol::from(0))).map_err(|e| {
        let hint = if e.kind() == io::ErrorKind::PermissionDenied {
            " (needs CAP_NET_RAW: run as root, or use the socket receive mode)"
        } else {
            ""
        };
        io_ctx(e, format_args!("AF_PACKET socket{hint}"))
    })?;
    attach_filter(&s, &rx_filter(cfg.local, cfg.port)).map_err(ctx("SO_ATTACH_FILTER"))?;
    setopt(&s, libc::SOL_PACKET, libc::PACKET_AUXDATA, 1).map_err(ctx("PACKET_AUXDATA"))?;
    setopt(&s, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1).map_err(ctx("SO_RXQ_OVFL"))?;
    if let Some(n) = cfg.socket_buffer {
        set_recv_buffer(&s, n).map_err(ctx("SO_RCVBUF"))?;
    }
    s.set_nonblocking(true).map_err(ctx("O_NONBLOCK"))?;
    let ethertype = if cfg.local.is_ipv6() {
        libc::ETH_P_IPV6
    } else {
        libc::ETH_P_IP
    } as u16;
    let mut sll: libc::sockaddr_ll = zeroed();
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = ethertype.to_be();
    sll.sll_ifindex = ifindex as i32;
    // SAFETY: `sll` is a valid `sockaddr_ll` and its exact size is passed.
    let r = unsafe {
        libc::bind(
            s.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(ctx("bind")(io::Error::last_os_error()));
    }
    Ok(s)
}

/// The payload of control message `c` as a `T`, or `None` if `cmsg_len` does not cover a whole `T` or the payload
/// would end past the control buffer `hdr` describes (a message the kernel cut short sets `MSG_CTRUNC` and gives
/// it the shorter `cmsg_len`, `put_cmsg` in Linux `net/core/scm.c`). An unaligned copy.
///
/// # Safety
///
/// `hdr.msg_control` is valid for reads of `hdr.msg_controllen` bytes, `c` is a non-null header that
/// `CMSG_FIRSTHDR`/`CMSG_NXTHDR` returned for `hdr`, and `T` is plain data (integers only: every bit pattern valid).
// `cmsg_len` and `msg_controllen` are `size_t` on glibc but `socklen_t` on musl: the casts are for the latter.
#[allow(clippy::unnecessary_cast)]
unsafe fn cmsg_payload<T: Copy>(hdr: &libc::msghdr, c: *const libc::cmsghdr) -> Option<T> {
    // SAFETY: CMSG_LEN is pure arithmetic.
    let need = unsafe { libc::CMSG_LEN(size_of::<T>() as u32) } as usize;
    // SAFETY: `c` points at a whole header inside the buffer (the macros check that much).
    let have = unsafe { (*c).cmsg_len } as usize;
    // SAFETY: CMSG_DATA is pointer arithmetic within the header's own message.
    let data = unsafe { libc::CMSG_DATA(c) };
    let end = (hdr.msg_control as usize).checked_add(hdr.msg_controllen as usize)?;
    if have < need || (data as usize).checked_add(size_of::<T>())? > end {
        return None;
    }
    // SAFETY: `data .. data + size_of::<T>()` lies inside the control buffer (checked) and `T` accepts any bytes.
    Some(unsafe { core::ptr::read_unaligned(data.cast::<T>()) })
}

/// `tp_status` of the `PACKET_AUXDATA` control message of one received frame (0 if absent), and the kernel's drop
/// count from its `SO_RXQ_OVFL` control message (`None` if absent: the kernel sends it only once non-zero).
fn aux_status(ctrl: &[u64; CMSG_WORDS], msg: &libc::msghdr) -> (u32, Option<u32>) {
    let mut hdr: libc::msghdr = zeroed();
    hdr.msg_control = ctrl.as_ptr() as *mut libc::c_void;
    hdr.msg_controllen = msg.msg_controllen.min(size_of::<[u64; CMSG_WORDS]>() as _);
    // SAFETY: `hdr` describes `ctrl`, of which the kernel filled `msg_controllen` bytes (clamped to its size); the
    // macros stay within that length and return null at the end.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(&hdr) };
    let (mut status, mut drops) = (0, None);
    while !c.is_null() {
        // SAFETY: `c` is non-null and points at a complete cmsghdr inside `ctrl`.
        let (level, ty) = unsafe { ((*c).cmsg_level, (*c).cmsg_type) };
        if level == libc::SOL_PACKET && ty == libc::PACKET_AUXDATA {
            // SAFETY: `hdr` describes `ctrl` and `c` came from the macros; PACKET_AUXDATA carries a
            // `struct tpacket_auxdata` (packet(7)) of integers. A cut message (`MSG_CTRUNC`) yields `None`.
            if let Some(aux) = unsafe { cmsg_payload::<libc::tpacket_auxdata>(&hdr, c) } {
                status = aux.tp_status;
            }
        } else if level == libc::SOL_SOCKET && ty == libc::SO_RXQ_OVFL {
            // SAFETY: as above; SO_RXQ_OVFL carries a `__u32` (socket(7)).
            drops = unsafe { cmsg_payload::<u32>(&hdr, c) };
        }
        // SAFETY: `c` is a valid header within `hdr`'s control buffer.
        c = unsafe { libc::CMSG_NXTHDR(&hdr, c) };
    }
    (status, drops)
}

/// The kernel's cumulative drop count of socket `fd` (`SK_MEMINFO_DROPS` of `getsockopt(SO_MEMINFO)`,
/// sock_diag(7); a wrapping `u32`).
fn socket_drops(fd: std::os::fd::RawFd) -> io::Result<u32> {
    let mut info = [0u32; libc::SK_MEMINFO_DROPS as usize + 1];
    let mut len = size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes, which are passed; the kernel writes at most that many and
    // updates `len`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let at = libc::SK_MEMINFO_DROPS as usize;
    if (len as usize) < (at + 1) * size_of::<u32>() {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "SO_MEMINFO without SK_MEMINFO_DROPS",
        ));
    }
    Ok(info[at])
}

/// Completes the UDP checksum of a frame whose sender left it to checksum offload (`TP_STATUS_CSUMNOTREADY`: a
/// packet from a socket on this host, crossing a veth or `lo`, still holds only the pseudo-header sum). The value
/// is what a NIC would have put on the wire; a zero checksum ("none", what RoCE senders write) is left alone. The
/// UDP checksum is not covered by the ICRC (`ROCEV2.md §3`), so this changes nothing for the engine; it keeps
/// captures of received frames valid.
fn finish_udp_checksum(frame: &mut [u8], v6: bool) {
    let ip_len = if v6 {
        ipv6::HEADER_LEN
    } else {
        ipv4::HEADER_LEN
    };
    let Some(ip) = frame.get(ETH_LEN..) else {
        return;
    };
    let (src, dst) = if v6 {
        match Ipv6Packet::new_checked(ip) {
            Ok(p) => (IpAddr::V6(p.src_addr()), IpAddr::V6(p.dst_addr())),
            Err(_) => return,
        }
    } else {
        match Ipv4Packet::new_checked(ip) {
            Ok(p) => (IpAddr::V4(p.src_addr()), IpAddr::V4(p.dst_addr())),
            Err(_) => return,
        }
    };
    let Some(seg) = frame.get_mut(ETH_LEN + ip_len..) else {
        return;
    };
    let (len, sum) = match UdpPacket::new_checked(&*seg) {
        Ok(u) => (usize::from(u.len()), u.checksum()),
        Err(_) => return,
    };
    let Some(dgram) = seg.get(..len) else {
        return;
    };
    if sum == 0 {
        return;
    }
    let c = udp::checksum(src, dst, dgram);
    UdpPacket::new_unchecked(seg).set_checksum(c);
}

/// Whether a frame as received on the [`RxMode::Packet`] path (Ethernet header first, trimmed to the IP length)
/// has a correct IPv4 header checksum and a UDP checksum that is either 0 ("none", what RoCE senders write,
/// `ROCEV2.md §1.4`) or correct over the pseudo-header (IPv4 and IPv6). The kernel's IP and UDP layers, rxe and an
/// RNIC drop frames that fail either check before RoCE processing; packet capture sees frames before those layers,
/// so the link makes the same checks. A frame too short to hold the headers passes (the engine counts it as
/// malformed).
fn rx_checksums_ok(frame: &[u8], v6: bool) -> bool {
    let Some(ip) = frame.get(ETH_LEN..) else {
        return true;
    };
    let (src, dst, ip_len) = if v6 {
        match Ipv6Packet::new_checked(ip) {
            Ok(p) => (
                IpAddr::V6(p.src_addr()),
                IpAddr::V6(p.dst_addr()),
                ipv6::HEADER_LEN,
            ),
            Err(_) => return true,
        }
    } else {
        match Ipv4Packet::new_checked(ip) {
            Ok(p) if !p.verify_checksum() => return false,
            Ok(p) => (
                IpAddr::V4(p.src_addr()),
                IpAddr::V4(p.dst_addr()),
                p.header_len(),
            ),
            Err(_) => return true,
        }
    };
    match ip.get(ip_len..).map(UdpPacket::new_checked) {
        Some(Ok(u)) => u.verify_checksum(src, dst),
        _ => true,
    }
}

/// What `tx_commit` learned from a frame's headers.
struct Parsed {
    off: usize,
    len: usize,
    sport: u16,
    dst: IpAddr,
    tos: u8,
    ttl: u8,
    /// IPv4 ID ≠ 0 or DF clear.
    hdr_mismatch: bool,
    /// Start of the IP header.
    ip_off: usize,
}

impl UdpLink {
    /// Opens the receive socket on `cfg.local:cfg.port` (non-blocking) and preallocates `cfg.burst` transmit and
    /// receive slots of `cfg.mtu` bytes.
    ///
    /// # Errors
    /// [`LinkError::Io`]: `InvalidInput` for an unspecified address or a zero burst / too small MTU; otherwise the
    /// failing `socket`/`setsockopt`/`bind` with the address (e.g. `EADDRINUSE`, `EADDRNOTAVAIL`).
    pub fn bind(cfg: UdpConfig) -> Result<UdpLink, LinkError> {
        if cfg.local.is_unspecified() {
            return Err(io_ctx(
                io::Error::from(io::ErrorKind::InvalidInput),
                "UdpLink needs a specific local address (the ICRC covers the source IP)",
            ));
        }
        let v6 = cfg.local.is_ipv6();
        let hdr = ETH_LEN
            + if v6 {
                ipv6::HEADER_LEN
            } else {
                ipv4::HEADER_LEN
            }
            + udp::HEADER_LEN;
        if cfg.burst == 0
            || cfg.burst > usize::from(u16::MAX)
            || cfg.mtu < hdr + 16
            || cfg.mtu > 65535
            || cfg.max_tx_sockets >= 65535
        {
            return Err(io_ctx(
                io::Error::from(io::ErrorKind::InvalidInput),
                format_args!(
                    "UdpLink config: burst {} mtu {} max_tx_sockets {}",
                    cfg.burst, cfg.mtu, cfg.max_tx_sockets
                ),
            ));
        }
        let mut cfg = cfg;
        cfg.share &= cfg.rx == RxMode::Socket;
        let (rx, shared, share_error) = Self::rx_socket(&mut cfg)?;
        let pkt = match cfg.rx {
            RxMode::Socket => None,
            RxMode::Packet => Some(packet_socket(&cfg)?),
        };
        let burst = cfg.burst;
        let rx_slot = cfg.mtu + 1;
        let mut link = UdpLink {
            v6,
            hdr,
            socks: vec![rx],
            port_map: vec![0; 65536],
            sock_port: vec![cfg.port],
            tx_data: vec![0; burst * cfg.mtu],
            tx_meta: vec![
                TxMeta {
                    gather: None,
                    off: 0,
                    len: 0,
                    sock: 0,
                    tos: 0,
                    ttl: 0,
                    dst: zeroed(),
                };
                burst
            ],
            // Popped from the end: slot 0 is lent first.
            tx_free: (0..burst as u16).rev().collect(),
            tx_pend: Vec::with_capacity(burst),
            tx_sel: Vec::with_capacity(burst),
            tx_grouped: vec![false; burst],
            tx_done: vec![false; burst],
            tx_segs: vec![TxSeg::EMPTY; burst * MAX_GATHER],
            tx_iov: vec![zeroed(); burst * (MAX_GATHER + 2)],
            tx_msgs: vec![zeroed(); burst],
            tx_ctrl: vec![[0; CMSG_WORDS]; burst],
            rx_data: vec![0; burst * rx_slot],
            rx_slot,
            rx_iov: vec![zeroed(); burst],
            rx_msgs: vec![zeroed(); burst],
            rx_ctrl: vec![[0; CMSG_WORDS]; burst],
            rx_names: vec![zeroed(); burst],
            rx_stamp_ns: 0,
            rx_drops_seen: 0,
            rx_drops_poll_ns: 0,
            netns: current_netns(),
            pkt,
            shared,
            share_error,
            mc: Vec::new(),
            mc_epoll: None,
            stats: UdpStats {
                tx_sockets: 1,
                ..UdpStats::default()
            },
            cfg,
        };
        link.port_map[usize::from(link.cfg.port)] = 1;
        Ok(link)
    }

    /// The receive socket on `cfg.local:cfg.port`; with [`UdpConfig::share`], in the address's reuseport group with a
    /// QPN slot, or — when the steering cannot be had — alone (then `cfg.share` is cleared and the reason returned,
    /// and a taken port's error names it).
    #[allow(clippy::type_complexity)]
    fn rx_socket(
        cfg: &mut UdpConfig,
    ) -> Result<(Socket, Option<reuseport::Joined>, Option<String>), LinkError> {
        if !cfg.share {
            return Ok((Self::socket(cfg, cfg.port, true)?, None, None));
        }
        let s = Self::socket(cfg, cfg.port, true)?;
        let local = SocketAddr::new(cfg.local, cfg.port);
        let why = match reuseport::join(std::os::fd::AsFd::as_fd(&s), local) {
            Ok(j) => return Ok((s, Some(j), None)),
            Err(e) => e.to_string(),
        };
        // Never stay in the group unsteered: close it and bind alone, as without sharing.
        drop(s);
        cfg.share = false;
        match Self::socket(cfg, cfg.port, true) {
            Ok(s) => Ok((s, None, Some(why))),
            Err(LinkError::Io(e)) => Err(io_ctx(
                e,
                format_args!(
                    "sharing UDP {local} with other processes needs the kernel steering: {why}"
                ),
            )),
            Err(e) => Err(e),
        }
    }

    /// The QPN slot of a link bound with [`UdpConfig::share`] (`None` when not shared).
    pub fn shared(&self) -> Option<&reuseport::Joined> {
        self.shared.as_ref()
    }

    /// Why a link asked to share its address binds alone ([`UdpConfig::share`]), if it does.
    pub fn share_error(&self) -> Option<&str> {
        self.share_error.as_deref()
    }

    /// Creates a non-blocking socket bound to `cfg.local:port` with DF, no UDP checksum and (for the receive
    /// socket) the ancillary data the receive path reads; with [`UdpConfig::share`], `SO_REUSEPORT`.
    fn socket(cfg: &UdpConfig, port: u16, rx: bool) -> Result<Socket, LinkError> {
        let local = SocketAddr::new(cfg.local, port);
        let ctx = |what: &'static str| move |e| io_ctx(e, format_args!("{what} for UDP {local}"));
        let domain = if cfg.local.is_ipv6() {
            Domain::IPV6
        } else {
            Domain::IPV4
        };
        let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP)).map_err(ctx("socket"))?;
        s.set_nonblocking(true).map_err(ctx("O_NONBLOCK"))?;
        if let Some(n) = cfg.socket_buffer {
            s.set_send_buffer_size(n).map_err(ctx("SO_SNDBUF"))?;
            if rx {
                set_recv_buffer(&s, n).map_err(ctx("SO_RCVBUF"))?;
            }
        }
        if cfg.local.is_ipv6() {
            s.set_only_v6(true).map_err(ctx("IPV6_V6ONLY"))?;
            setopt(
                &s,
                libc::IPPROTO_IPV6,
                libc::IPV6_MTU_DISCOVER,
                libc::IPV6_PMTUDISC_DO,
            )
            .map_err(ctx("IPV6_MTU_DISCOVER"))?;
            setopt(&s, libc::IPPROTO_UDP, UDP_NO_CHECK6_TX, 1).map_err(ctx("UDP_NO_CHECK6_TX"))?;
            setopt(&s, libc::IPPROTO_UDP, UDP_NO_CHECK6_RX, 1).map_err(ctx("UDP_NO_CHECK6_RX"))?;
            if rx {
                setopt(&s, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
                    .map_err(ctx("SO_TIMESTAMPNS"))?;
                setopt(&s, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1).map_err(ctx("SO_RXQ_OVFL"))?;
                setopt(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, 1)
                    .map_err(ctx("IPV6_RECVPKTINFO"))?;
                setopt(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)
                    .map_err(ctx("IPV6_RECVTCLASS"))?;
                setopt(&s, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1)
                    .map_err(ctx("IPV6_RECVHOPLIMIT"))?;
            }
        } else {
            setopt(
                &s,
                libc::IPPROTO_IP,
                libc::IP_MTU_DISCOVER,
                libc::IP_PMTUDISC_DO,
            )
            .map_err(ctx("IP_MTU_DISCOVER"))?;
            setopt(&s, libc::SOL_SOCKET, libc::SO_NO_CHECK, 1).map_err(ctx("SO_NO_CHECK"))?;
            if rx {
                setopt(&s, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)
                    .map_err(ctx("SO_TIMESTAMPNS"))?;
                setopt(&s, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 1).map_err(ctx("SO_RXQ_OVFL"))?;
                setopt(&s, libc::IPPROTO_IP, libc::IP_PKTINFO, 1).map_err(ctx("IP_PKTINFO"))?;
                setopt(&s, libc::IPPROTO_IP, libc::IP_RECVTOS, 1).map_err(ctx("IP_RECVTOS"))?;
                setopt(&s, libc::IPPROTO_IP, libc::IP_RECVTTL, 1).map_err(ctx("IP_RECVTTL"))?;
            }
        }
        if rx && cfg.rx == RxMode::Packet {
            // Frames are read from AF_PACKET; the socket only keeps the port owned. Attached before `bind`, so
            // not a single datagram is ever queued.
            attach_filter(&s, &[sock_filter(bpf::RET_K, 0, 0, 0)])
                .map_err(ctx("SO_ATTACH_FILTER (drop all)"))?;
        }
        if cfg.share {
            s.set_reuse_port(true).map_err(ctx("SO_REUSEPORT"))?;
        }
        if cfg.local.is_multicast() {
            // A group socket: every process (and every link) that joined the group gets its own copy of each datagram
            // (UDP multicast delivery goes to every socket bound to the group with SO_REUSEADDR, ip(7)).
            s.set_reuse_address(true).map_err(ctx("SO_REUSEADDR"))?;
        }
        s.bind(&SockAddr::from(local)).map_err(ctx("bind"))?;
        Ok(s)
    }

    /// Joins the IP multicast group `group` on this link's address, as Linux's rdma_cm does for RoCE (`cma.c`
    /// `cma_iboe_join_multicast`: an IGMP/MLD join on the port's netdev): a socket bound to `group:port` with
    /// `SO_REUSEADDR` (so every process and every link on the host that joined gets its own copy) joins the group on
    /// the interface of [`UdpConfig::local`] (`IP_ADD_MEMBERSHIP` / `IPV6_JOIN_GROUP`); [`Link::rx_burst`] reads it
    /// after the receive socket, and [`Link::wait_fd`] becomes an epoll set of both. Sending needs nothing more: a
    /// socket bound to a local address sends multicast out of that address's interface, with the engine's TTL, and
    /// the kernel loops a copy back to the host's members (`IP_MULTICAST_LOOP`, on by default). Joining a group
    /// already joined does nothing. Control path.
    ///
    /// Errors: `InvalidInput` for an address that is not multicast or not of the link's family; `Unsupported` in
    /// [`RxMode::Packet`]; the failing `socket`/`bind`/`setsockopt`/`epoll_ctl`.
    pub fn join_group(&mut self, group: IpAddr) -> io::Result<()> {
        if !group.is_multicast() || group.is_ipv6() != self.v6 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{group} is not a multicast group of the link's address family"),
            ));
        }
        if self.pkt.is_some() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "multicast groups need the socket receive path (RxMode::Socket)",
            ));
        }
        if self.mc.iter().any(|(g, _)| *g == group) {
            return Ok(());
        }
        let mut gcfg = self.cfg.clone();
        gcfg.local = group;
        gcfg.share = false;
        let s = Self::socket(&gcfg, self.cfg.port, true).map_err(|e| match e {
            LinkError::Io(e) => e,
            e => io::Error::other(e.to_string()),
        })?;
        let ctx = |what: &str, e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("{what} {group} on {}: {e}", self.cfg.local),
            )
        };
        // The receive socket's drop count is the one the link follows (`SO_RXQ_OVFL`).
        setopt(&s, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, 0)
            .map_err(|e| ctx("SO_RXQ_OVFL for", e))?;
        match (group, self.cfg.local) {
            (IpAddr::V4(g), IpAddr::V4(l)) => s.join_multicast_v4(&g, &l),
            (IpAddr::V6(g), IpAddr::V6(_)) => {
                let (ifindex, _) = interface_of(self.cfg.local)?;
                s.join_multicast_v6(&g, ifindex)
            }
            _ => Err(io::Error::from(io::ErrorKind::InvalidInput)),
        }
        .map_err(|e| ctx("joining", e))?;
        if self.mc_epoll.is_none() {
            // SAFETY: plain system call; the result is checked before it is used as a descriptor.
            let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
            if fd < 0 {
                return Err(ctx("epoll_create1 for", io::Error::last_os_error()));
            }
            // SAFETY: `fd` was just returned by epoll_create1 and is owned by nothing else.
            let owned = unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) };
            self.mc_epoll = Some(owned);
            let rx = self.socks[0].as_raw_fd();
            self.epoll_ctl(libc::EPOLL_CTL_ADD, rx)
                .map_err(|e| ctx("epoll_ctl for", e))?;
        }
        self.epoll_ctl(libc::EPOLL_CTL_ADD, s.as_raw_fd())
            .map_err(|e| ctx("epoll_ctl for", e))?;
        self.mc.push((group, s));
        Ok(())
    }

    /// Leaves `group` ([`UdpLink::join_group`]): its socket is closed (the kernel drops the membership with it).
    /// Leaving a group not joined does nothing. Control path.
    pub fn leave_group(&mut self, group: IpAddr) -> io::Result<()> {
        let Some(k) = self.mc.iter().position(|(g, _)| *g == group) else {
            return Ok(());
        };
        let (_, s) = self.mc.remove(k);
        let _ = self.epoll_ctl(libc::EPOLL_CTL_DEL, s.as_raw_fd());
        drop(s);
        if self.mc.is_empty() {
            self.mc_epoll = None;
        }
        Ok(())
    }

    /// The multicast groups this link has joined.
    pub fn groups(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.mc.iter().map(|(g, _)| *g)
    }

    /// `epoll_ctl(op, fd)` on the multicast epoll set for readability.
    fn epoll_ctl(&self, op: libc::c_int, fd: std::os::fd::RawFd) -> io::Result<()> {
        let Some(ep) = &self.mc_epoll else {
            return Ok(());
        };
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: `ep` and `fd` are open descriptors owned by this link; `ev` is a valid event for the call.
        let r = unsafe { libc::epoll_ctl(ep.as_raw_fd(), op, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The configuration.
    pub fn config(&self) -> &UdpConfig {
        &self.cfg
    }

    /// Counters.
    pub fn stats(&self) -> UdpStats {
        self.stats
    }

    /// Reads the kernel's drop count of the receive socket now (`getsockopt(SO_MEMINFO)`, one system call) into
    /// [`UdpStats::rx_kernel_drops`] and returns it. The link also does this by itself, at a low rate, when a
    /// receive finds the queue empty; call it before reading the stats to include drops no later frame reported.
    ///
    /// # Errors
    ///
    /// [`LinkError::Io`] if the kernel refuses `SO_MEMINFO`.
    pub fn refresh_kernel_drops(&mut self) -> Result<u64, LinkError> {
        let d = socket_drops(self.rx_fd()).map_err(|e| {
            io_ctx(
                e,
                format_args!("SO_MEMINFO of the receive socket of {}", self.local_addr()),
            )
        })?;
        self.note_kernel_drops(d);
        Ok(self.stats.rx_kernel_drops)
    }

    /// Takes the kernel's cumulative drop count `d` (a wrapping `u32`, non-decreasing) into
    /// [`UdpStats::rx_kernel_drops`]. A value older than one already seen (a datagram queued before later drops,
    /// read after a `SO_MEMINFO` reading) changes nothing.
    fn note_kernel_drops(&mut self, d: u32) {
        let delta = self.kernel_drops_since_seen(d);
        if delta != 0 {
            self.rx_drops_seen = d;
            self.stats.rx_kernel_drops += u64::from(delta);
        }
    }

    /// The drops in the kernel's cumulative count `d` not yet in [`UdpStats::rx_kernel_drops`]: 0 for a value
    /// older than one already seen.
    fn kernel_drops_since_seen(&self, d: u32) -> u32 {
        let delta = d.wrapping_sub(self.rx_drops_seen);
        if delta < 1 << 31 { delta } else { 0 }
    }

    /// `rx_burst` found the queue empty: reads the drop count if [`KERNEL_DROPS_POLL_NS`] of engine time have
    /// passed since the last reading (a failure is left for [`UdpLink::refresh_kernel_drops`] to report).
    fn poll_kernel_drops(&mut self, now: Instant) {
        let t = now.as_nanos();
        if t >= self.rx_drops_poll_ns {
            self.rx_drops_poll_ns = t.saturating_add(KERNEL_DROPS_POLL_NS);
            if let Ok(d) = socket_drops(self.rx_fd()) {
                self.note_kernel_drops(d);
            }
        }
    }

    /// The address the receive socket is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        SocketAddr::new(self.cfg.local, self.cfg.port)
    }

    /// Frames committed and not yet handed to the kernel.
    pub fn queued(&self) -> usize {
        self.tx_pend.len()
    }

    /// The file descriptor received frames arrive on (to wait for readability with `poll`/`epoll`): the UDP
    /// socket, or in [`RxMode::Packet`] the `AF_PACKET` socket.
    pub fn rx_fd(&self) -> std::os::fd::RawFd {
        match &self.pkt {
            Some(p) => p.as_raw_fd(),
            None => self.socks[0].as_raw_fd(),
        }
    }

    /// Parses the headers of a committed frame; `None` if the kernel cannot send it as it is.
    fn parse_tx(&self, f: &[u8]) -> Option<Parsed> {
        let eth = EthernetFrame::new_checked(f).ok()?;
        let ip_off = eth.header_len();
        let ip = f.get(ip_off..)?;
        let (src, dst, tos, ttl, ip_hdr, ip_end, mismatch) = match eth.ethertype() {
            EtherType::IPV4 if !self.v6 => {
                let p = Ipv4Packet::new_checked(ip).ok()?;
                if p.header_len() != ipv4::HEADER_LEN
                    || p.protocol() != ipv4::PROTOCOL_UDP
                    || p.more_frags()
                    || p.frag_offset() != 0
                {
                    return None;
                }
                let tos = ip[ipv4::TOS_OFFSET];
                (
                    IpAddr::V4(p.src_addr()),
                    IpAddr::V4(p.dst_addr()),
                    tos,
                    p.ttl(),
                    ipv4::HEADER_LEN,
                    usize::from(p.total_len()),
                    p.ident() != 0 || !p.dont_frag(),
                )
            }
            EtherType::IPV6 if self.v6 => {
                let p = Ipv6Packet::new_checked(ip).ok()?;
                if p.next_header() != ipv4::PROTOCOL_UDP {
                    return None;
                }
                (
                    IpAddr::V6(p.src_addr()),
                    IpAddr::V6(p.dst_addr()),
                    p.traffic_class(),
                    p.hop_limit(),
                    ipv6::HEADER_LEN,
                    ipv6::HEADER_LEN + usize::from(p.payload_len()),
                    false,
                )
            }
            _ => return None,
        };
        if src != self.cfg.local {
            return None;
        }
        let u = UdpPacket::new_checked(ip.get(ip_hdr..ip_end)?).ok()?;
        let udp_len = usize::from(u.len());
        if u.dst_port() != self.cfg.peer_port || ip_hdr + udp_len != ip_end {
            return None;
        }
        Some(Parsed {
            off: ip_off + ip_hdr + udp::HEADER_LEN,
            len: udp_len - udp::HEADER_LEN,
            sport: u.src_port(),
            dst,
            tos,
            ttl,
            hdr_mismatch: mismatch,
            ip_off,
        })
    }

    /// Queues slot `tx_free.last()` holding a `len`-byte frame; with `gather`, its payload is `pieces` (trailer
    /// already behind the payload's place).
    ///
    /// # Safety
    ///
    /// `pieces` are readable until the next `flush` returns ([`Link::tx_commit_gather`]).
    unsafe fn commit(
        &mut self,
        len: usize,
        mut gather: Option<TxGather>,
        pieces: &[TxSeg],
    ) -> Result<(), LinkError> {
        let Some(&slot) = self.tx_free.last() else {
            return Err(LinkError::NoTxBuffer);
        };
        let mtu = self.cfg.mtu;
        if len > mtu {
            return Err(LinkError::TooLong { len, mtu });
        }
        let i = usize::from(slot);
        let Some(p) = self.parse_tx(&self.tx_data[i * mtu..i * mtu + len]) else {
            self.stats.tx_invalid += 1;
            return Ok(());
        };
        // A gathered frame's layout comes from the caller: its headers must cover the UDP header and its UDP length
        // must be exactly what the iovecs will carry (`send_group` and `flush` subtract on these terms).
        if let Some(g) = gather
            && (g.head < p.off || p.off + p.len != len)
        {
            self.stats.tx_invalid += 1;
            return Ok(());
        }
        if p.hdr_mismatch {
            self.stats.tx_ip_hdr_mismatch += 1;
            match self.cfg.ip_id {
                IpIdPolicy::Drop => return Ok(()),
                IpIdPolicy::Repair => {
                    if let Some(g) = gather.take() {
                        let plen = len - g.head - g.tail;
                        let at = i * mtu + g.head;
                        // SAFETY: the pieces are readable (caller) and `tx_data` is the link's own memory.
                        unsafe { copy_pieces(&mut self.tx_data[at..at + plen], pieces) };
                        self.stats.tx_linearized_bytes += plen as u64;
                    }
                    let ip = &mut self.tx_data[i * mtu + p.ip_off..i * mtu + len];
                    let mut v = Ipv4Packet::new_unchecked(&mut *ip);
                    v.set_ident(0);
                    v.set_flags_and_offset(true, false, 0);
                    v.fill_checksum();
                    if icrc::fill(ip).is_err() {
                        self.stats.tx_invalid += 1;
                        return Ok(());
                    }
                }
            }
        }
        let sock = match self.sock_for(p.sport) {
            Ok(s) => s,
            Err(e) => {
                self.stats.tx_errors += 1;
                return Err(e);
            }
        };
        let bound = self.sock_port[usize::from(sock)];
        if bound != p.sport {
            // A shared socket (max_tx_sockets reached): the kernel writes its port, and the ICRC covers the UDP
            // source port (`ROCEV2.md §3`), so the frame gets that port and a fresh ICRC.
            if let Some(g) = gather.take() {
                let plen = len - g.head - g.tail;
                let at = i * mtu + g.head;
                // SAFETY: the pieces are readable (caller) and `tx_data` is the link's own memory.
                unsafe { copy_pieces(&mut self.tx_data[at..at + plen], pieces) };
                self.stats.tx_linearized_bytes += plen as u64;
            }
            let ip = &mut self.tx_data[i * mtu + p.ip_off..i * mtu + len];
            let udp_at = p.off - udp::HEADER_LEN - p.ip_off;
            UdpPacket::new_unchecked(&mut ip[udp_at..]).set_src_port(bound);
            if icrc::fill(ip).is_err() {
                self.stats.tx_invalid += 1;
                return Ok(());
            }
            self.stats.tx_sport_shared += 1;
        }
        if let Some(g) = gather {
            self.tx_segs[i * MAX_GATHER..i * MAX_GATHER + g.segs].copy_from_slice(pieces);
            self.stats.tx_gathered_bytes += (len - g.head - g.tail) as u64;
        }
        self.tx_meta[i] = TxMeta {
            gather,
            off: p.off,
            len: p.len,
            sock,
            tos: p.tos,
            ttl: p.ttl,
            dst: sockaddr_of(SocketAddr::new(p.dst, self.cfg.peer_port)),
        };
        self.tx_free.pop();
        self.tx_pend.push(slot);
        Ok(())
    }

    /// Index of the socket frames with UDP source port `sport` leave from: the socket bound to `sport`, created
    /// on first use; once [`UdpConfig::max_tx_sockets`] transmit sockets are open, an existing one chosen by
    /// `sport` (`1 + sport mod max_tx_sockets`), whose port the frame then carries. Either way the choice is cached
    /// in `port_map`, so a QP keeps one source port for its life and its packets one ECMP path and their order
    /// (`ROCEV2.md §1.4`); with N sockets the link keeps up to N distinct ports of entropy. O(1), no allocation
    /// once cached.
    fn sock_for(&mut self, sport: u16) -> Result<u16, LinkError> {
        let m = self.port_map[usize::from(sport)];
        if m != 0 {
            return Ok(m - 1);
        }
        let max = self.cfg.max_tx_sockets;
        if self.socks.len() > max {
            if max == 0 {
                return Err(io_ctx(
                    io::Error::other("no transmit sockets allowed"),
                    format_args!(
                        "UdpLink: source port {sport} needs a socket, max_tx_sockets is 0"
                    ),
                ));
            }
            // `socks[1..=max]` are all transmit sockets (the receive socket is index 0).
            let idx = 1 + (usize::from(sport) % max) as u16;
            self.port_map[usize::from(sport)] = idx + 1;
            return Ok(idx);
        }
        if current_netns() != self.netns {
            return Err(io_ctx(
                io::Error::other("wrong network namespace"),
                format_args!(
                    "UdpLink: source port {sport} needs a new socket, but this thread is not in the network \
                     namespace the link was bound in"
                ),
            ));
        }
        let s = Self::socket(&self.cfg, sport, false)?;
        self.socks.push(s);
        self.sock_port.push(sport);
        self.stats.tx_sockets += 1;
        let idx = (self.socks.len() - 1) as u16;
        self.port_map[usize::from(sport)] = idx + 1;
        Ok(idx)
    }

    /// Writes the per-datagram control messages of slot `i` into `tx_ctrl[i]`; returns their length.
    fn tx_cmsgs(&mut self, i: usize) -> usize {
        let m = self.tx_meta[i];
        let (level, tos_name, ttl_name) = if self.v6 {
            (libc::IPPROTO_IPV6, libc::IPV6_TCLASS, libc::IPV6_HOPLIMIT)
        } else {
            (libc::IPPROTO_IP, libc::IP_TOS, libc::IP_TTL)
        };
        let ctrl = &mut self.tx_ctrl[i];
        let mut items = [(tos_name, libc::c_int::from(m.tos)), (ttl_name, 0)];
        let mut n = 1;
        if m.ttl != 0 {
            items[1].1 = libc::c_int::from(m.ttl);
            n = 2;
        }
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
        let space = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
        // SAFETY: as above.
        let clen = unsafe { libc::CMSG_LEN(size_of::<libc::c_int>() as u32) } as usize;
        let base = ctrl.as_mut_ptr().cast::<u8>();
        for (k, &(name, val)) in items[..n].iter().enumerate() {
            let hdr = libc::cmsghdr {
                cmsg_len: clen as _,
                cmsg_level: level,
                cmsg_type: name,
            };
            // SAFETY: `ctrl` is 8-byte aligned and CMSG_WORDS * 8 = 128 bytes long; two items of `space` (16)
            // bytes fit. The header is written at an aligned offset, the data at CMSG_LEN(0) after it, as
            // CMSG_DATA would compute.
            unsafe {
                let p = base.add(k * space);
                core::ptr::write_unaligned(p.cast::<libc::cmsghdr>(), hdr);
                let data = p.add(libc::CMSG_LEN(0) as usize);
                core::ptr::write_unaligned(data.cast::<libc::c_int>(), val);
            }
        }
        n * space
    }

    /// Sends the slots `tx_sel[from..]` (all queued on socket `sock`, in commit order) with one `sendmmsg`;
    /// returns how many the kernel took (a prefix of them).
    fn send_group(&mut self, from: usize, sock: u16) -> io::Result<usize> {
        let mtu = self.cfg.mtu;
        let addr_len = if self.v6 {
            size_of::<libc::sockaddr_in6>()
        } else {
            size_of::<libc::sockaddr_in>()
        } as libc::socklen_t;
        let count = self.tx_sel.len() - from;
        // At most `burst` slots are queued, each with at most MAX_GATHER pieces (checked at commit): the arrays below
        // hold them all. An invariant of this link; the raw writes below rely on it.
        assert!(
            count <= self.tx_msgs.len() && count * (MAX_GATHER + 2) <= self.tx_iov.len(),
            "send_group: {count} datagrams exceed the scratch arrays"
        );
        // Control messages first: `tx_cmsgs` borrows the link mutably, so it runs before any pointer handed to the
        // kernel is taken.
        for k in 0..count {
            let i = usize::from(self.tx_sel[from + k]);
            let clen = self.tx_cmsgs(i);
            self.tx_msgs[k].msg_hdr.msg_controllen = clen as _;
        }
        // Every pointer the kernel follows derives from one `as_mut_ptr` per array, taken here, and the arrays are
        // written only through those pointers until `sendmmsg` returns (no element reference is formed in between,
        // which would invalidate pointers taken from an earlier one).
        let data = self.tx_data.as_mut_ptr();
        let iov = self.tx_iov.as_mut_ptr();
        let msgs = self.tx_msgs.as_mut_ptr();
        let meta = self.tx_meta.as_mut_ptr();
        let ctrl = self.tx_ctrl.as_mut_ptr();
        let mut j = 0usize;
        for k in 0..count {
            let i = usize::from(self.tx_sel[from + k]);
            // SAFETY: `i` is a slot index (< burst = `tx_meta.len()`); a plain copy of three fields.
            let (gather, off, len) = unsafe {
                let m = meta.add(i);
                ((*m).gather, (*m).off, (*m).len)
            };
            let start = j;
            // SAFETY: `off + len <= mtu` was checked at commit (for a gathered frame also `off <= head` and
            // `off + len == head + pieces + tail`), so every pointer below stays inside slot `i` of `tx_data`; `j`
            // stays below `count * (MAX_GATHER + 2)` (asserted above), inside `tx_iov`.
            unsafe {
                let slot = data.add(i * mtu);
                match gather {
                    None => {
                        iov.add(j).write(libc::iovec {
                            iov_base: slot.add(off).cast(),
                            iov_len: len,
                        });
                        j += 1;
                    }
                    Some(g) => {
                        let head = g.head - off;
                        let plen = len - head - g.tail;
                        iov.add(j).write(libc::iovec {
                            iov_base: slot.add(off).cast(),
                            iov_len: head,
                        });
                        j += 1;
                        for p in &self.tx_segs[i * MAX_GATHER..i * MAX_GATHER + g.segs] {
                            iov.add(j).write(libc::iovec {
                                iov_base: p.ptr.cast_mut().cast(),
                                iov_len: p.len,
                            });
                            j += 1;
                        }
                        // The trailer was moved to `head + plen` at commit.
                        iov.add(j).write(libc::iovec {
                            iov_base: slot.add(g.head + plen).cast(),
                            iov_len: g.tail,
                        });
                        j += 1;
                    }
                }
                // `k < count <= tx_msgs.len()` (asserted above); `msg_controllen` was set in the first loop.
                let h = &raw mut (*msgs.add(k)).msg_hdr;
                (*h).msg_name = (&raw mut (*meta.add(i)).dst).cast();
                (*h).msg_namelen = addr_len;
                (*h).msg_iov = iov.add(start);
                (*h).msg_iovlen = (j - start) as _;
                (*h).msg_control = ctrl.add(i).cast();
                (*h).msg_flags = 0;
                (*msgs.add(k)).msg_len = 0;
            }
        }
        let fd = self.socks[usize::from(sock)].as_raw_fd();
        self.stats.tx_sendmmsg += 1;
        // SAFETY: `tx_msgs[..count]` were just filled with pointers into `tx_meta`, `tx_iov`, `tx_ctrl` and
        // `tx_data`, which are neither moved nor resized until this call returns, and with the pieces of gathered
        // frames, readable until this `flush` returns (`tx_commit_gather`'s contract); `count` is at most `burst`.
        let r = unsafe { libc::sendmmsg(fd, msgs, count as libc::c_uint, libc::MSG_DONTWAIT) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as usize)
        }
    }

    /// Sends the group in `tx_sel` (socket `sock`) until it is all sent, the socket is full (`EAGAIN`/`ENOBUFS`:
    /// the rest stays queued) or the kernel refuses a datagram (that one is dropped and counted, the rest of the
    /// group stays queued; the error is returned). Sent and dropped slots are marked in `tx_done`.
    fn send_sel(&mut self, sock: u16) -> Result<(), LinkError> {
        let mut off = 0;
        while off < self.tx_sel.len() {
            match self.send_group(off, sock) {
                Ok(0) => break,
                Ok(k) => {
                    for &slot in &self.tx_sel[off..off + k] {
                        let slot = usize::from(slot);
                        self.tx_done[slot] = true;
                        let m = &self.tx_meta[slot];
                        self.stats.tx_bytes += (m.off + m.len) as u64;
                    }
                    self.stats.tx_frames += k as u64;
                    off += k;
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN | libc::ENOBUFS) => {
                        self.stats.tx_busy += 1;
                        break;
                    }
                    Some(libc::EINTR) => {}
                    _ => {
                        // The first datagram of the call is the one the kernel refused: drop it.
                        let slot = usize::from(self.tx_sel[off]);
                        self.tx_done[slot] = true;
                        self.stats.tx_errors += 1;
                        let m = self.tx_meta[slot];
                        let to = sockaddr_to(&m.dst).map(|(a, p)| SocketAddr::new(a, p));
                        return Err(io_ctx(
                            e,
                            format_args!(
                                "sendmmsg of a {}-byte datagram from {} to {to:?}",
                                m.len,
                                self.socks[usize::from(sock)]
                                    .local_addr()
                                    .ok()
                                    .and_then(|a| a.as_socket())
                                    .map_or_else(|| "?".to_owned(), |a| a.to_string()),
                            ),
                        ));
                    }
                },
            }
        }
        Ok(())
    }

    /// One non-blocking `recvmmsg` of up to `n` datagrams on `fd` into the prepared `rx_msgs[..n]` (the caller
    /// has pointed them at its buffers). `Ok(None)`: nothing waiting (or interrupted); errors name `what`.
    fn recv_batch(
        &mut self,
        fd: std::os::fd::RawFd,
        n: usize,
        what: &str,
    ) -> Result<Option<usize>, LinkError> {
        // SAFETY: the caller filled `rx_msgs[..n]` with headers pointing into this link's receive buffers
        // (`rx_names`, `rx_iov`, `rx_ctrl`, `rx_data`), which stay in place for the call, each length given
        // exactly; no timeout pointer.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                self.rx_msgs.as_mut_ptr(),
                n as libc::c_uint,
                libc::MSG_DONTWAIT,
                core::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(io_ctx(
                    e,
                    format_args!("recvmmsg on {what} for {}", self.local_addr()),
                )),
            };
        }
        Ok(Some(r as usize))
    }

    /// [`RxMode::Packet`] receive: up to `n` whole frames with one `recvmmsg` on the `AF_PACKET` socket, each
    /// trimmed to its IP length (Ethernet padding removed), ICRC-verified over the bytes as received.
    fn rx_packet(
        &mut self,
        now: Instant,
        n: usize,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError> {
        let Some(pkt) = &self.pkt else {
            return Ok(0);
        };
        let cap = self.rx_slot;
        assert!(n <= self.rx_msgs.len(), "rx_packet: {n} exceeds the burst");
        // Every pointer the kernel follows derives from one `as_mut_ptr` per array, and the arrays are written only
        // through those until `recvmmsg` returns (`recv_batch` takes the headers' array with `as_mut_ptr` too).
        let (data, iov, msgs, ctrl) = (
            self.rx_data.as_mut_ptr(),
            self.rx_iov.as_mut_ptr(),
            self.rx_msgs.as_mut_ptr(),
            self.rx_ctrl.as_mut_ptr(),
        );
        for i in 0..n {
            // SAFETY: `i < n <= burst`, the length of `rx_iov`, `rx_msgs` and `rx_ctrl` (asserted above); slot `i`
            // spans `rx_slot` bytes of `rx_data` (`burst` slots).
            unsafe {
                iov.add(i).write(libc::iovec {
                    iov_base: data.add(i * cap).cast(),
                    iov_len: cap,
                });
                let h = &raw mut (*msgs.add(i)).msg_hdr;
                (*h).msg_name = core::ptr::null_mut();
                (*h).msg_namelen = 0;
                (*h).msg_iov = iov.add(i);
                (*h).msg_iovlen = 1;
                (*h).msg_control = ctrl.add(i).cast();
                (*h).msg_controllen = size_of::<[u64; CMSG_WORDS]>() as _;
                (*h).msg_flags = 0;
            }
        }
        let fd = pkt.as_raw_fd();
        let Some(r) = self.recv_batch(fd, n, "AF_PACKET")? else {
            self.poll_kernel_drops(now);
            return Ok(0);
        };
        for i in 0..r {
            let len = self.rx_msgs[i].msg_len as usize;
            if self.rx_msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || len >= cap {
                self.stats.rx_truncated += 1;
                continue;
            }
            let (status, drops) = aux_status(&self.rx_ctrl[i], &self.rx_msgs[i].msg_hdr);
            if let Some(d) = drops {
                self.note_kernel_drops(d);
            }
            let start = i * self.rx_slot;
            let frame = &mut self.rx_data[start..start + len];
            // The filter guarantees the EtherType and family; the IP length says where the packet ends.
            let ip_end = if self.v6 {
                frame.get(ETH_LEN + 4..ETH_LEN + 6).map(|b| {
                    ETH_LEN + ipv6::HEADER_LEN + usize::from(u16::from_be_bytes([b[0], b[1]]))
                })
            } else {
                frame
                    .get(ETH_LEN + 2..ETH_LEN + 4)
                    .map(|b| ETH_LEN + usize::from(u16::from_be_bytes([b[0], b[1]])))
            };
            let Some(flen) = ip_end.filter(|&e| e <= len) else {
                self.stats.rx_truncated += 1;
                continue;
            };
            // The first fragment of a fragmented datagram (the filter passes no other fragment).
            if !self.v6 && frame.get(ETH_LEN + 6).is_some_and(|b| b & 0x20 != 0) {
                self.stats.rx_fragments += 1;
                continue;
            }
            let csum_not_ready = status & libc::TP_STATUS_CSUMNOTREADY != 0;
            let frame = &mut frame[..flen];
            if csum_not_ready {
                finish_udp_checksum(frame, self.v6);
            }
            if !rx_checksums_ok(frame, self.v6) {
                self.stats.rx_bad_checksum += 1;
                continue;
            }
            if self.cfg.verify_rx_icrc && icrc::verify(&frame[ETH_LEN..]).is_err() {
                self.stats.rx_icrc_bad += 1;
                continue;
            }
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += flen as u64;
            sink(frame);
        }
        Ok(r)
    }

    /// One `recvmmsg` of up to `n` datagrams on the UDP socket `fd` (`main`: the receive socket, whose kernel drop
    /// count the link follows; otherwise a multicast group socket), each rebuilt into a frame for `sink`.
    fn rx_udp(
        &mut self,
        now: Instant,
        fd: std::os::fd::RawFd,
        n: usize,
        main: bool,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError> {
        let cap = self.rx_slot - self.hdr;
        // `n <= burst`: the length of every receive array.
        assert!(n <= self.rx_msgs.len(), "rx_burst: {n} exceeds the burst");
        // Every pointer the kernel follows derives from one `as_mut_ptr` per array, and the arrays are written only
        // through those until `recvmmsg` returns (`recv_batch` takes the headers' array with `as_mut_ptr` too).
        let (data, iov, msgs, ctrl, names) = (
            self.rx_data.as_mut_ptr(),
            self.rx_iov.as_mut_ptr(),
            self.rx_msgs.as_mut_ptr(),
            self.rx_ctrl.as_mut_ptr(),
            self.rx_names.as_mut_ptr(),
        );
        for i in 0..n {
            // SAFETY: `i < n <= burst`, the length of `rx_iov`, `rx_msgs`, `rx_ctrl` and `rx_names` (asserted
            // above); slot `i` spans `rx_slot` bytes of `rx_data`, and the datagram goes `hdr` bytes in, `cap` bytes
            // long, ending exactly at the slot end.
            unsafe {
                iov.add(i).write(libc::iovec {
                    iov_base: data.add(i * self.rx_slot + self.hdr).cast(),
                    iov_len: cap,
                });
                let h = &raw mut (*msgs.add(i)).msg_hdr;
                (*h).msg_name = names.add(i).cast();
                (*h).msg_namelen = size_of::<libc::sockaddr_in6>() as libc::socklen_t;
                (*h).msg_iov = iov.add(i);
                (*h).msg_iovlen = 1;
                (*h).msg_control = ctrl.add(i).cast();
                (*h).msg_controllen = size_of::<[u64; CMSG_WORDS]>() as _;
                (*h).msg_flags = 0;
            }
        }
        let Some(r) = self.recv_batch(fd, n, "UDP")? else {
            if main {
                self.poll_kernel_drops(now);
            }
            return Ok(0);
        };
        // The kernel's receive timestamps are CLOCK_REALTIME; one reading per burst.
        let read_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        for i in 0..r {
            let len = self.rx_msgs[i].msg_len as usize;
            if self.rx_msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0 || len >= cap {
                self.stats.rx_truncated += 1;
                continue;
            }
            self.rx_stamp_ns = 0;
            let Some(flen) = self.rebuild(i, len) else {
                self.stats.rx_bad_addr += 1;
                continue;
            };
            if self.rx_stamp_ns != 0 {
                let wait_us = read_ns.saturating_sub(self.rx_stamp_ns) / 1000;
                self.stats.rx_wait_max_us = self.stats.rx_wait_max_us.max(wait_us);
            }
            let start = i * self.rx_slot;
            let frame = &mut self.rx_data[start..start + flen];
            if self.cfg.verify_rx_icrc && icrc::verify(&frame[ETH_LEN..]).is_err() {
                self.stats.rx_icrc_bad += 1;
                continue;
            }
            self.stats.rx_frames += 1;
            self.stats.rx_bytes += flen as u64;
            sink(frame);
        }
        Ok(r)
    }

    /// Rebuilds the Ethernet/IP/UDP header in front of the `len`-byte datagram in receive slot `i`; returns the
    /// frame length, or `None` if the datagram's addresses are unusable.
    fn rebuild(&mut self, i: usize, len: usize) -> Option<usize> {
        let (src, sport) = sockaddr_to(&self.rx_names[i])?;
        let ctrl = &self.rx_ctrl[i];
        let msg = &self.rx_msgs[i].msg_hdr;
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            // Control data was cut (`recvmsg(2)`): the destination address or the ECN bits may be missing, so the
            // header cannot be rebuilt faithfully. Never with the buffer sized for every message requested.
            return None;
        }
        let clen = msg.msg_controllen.min(size_of::<[u64; CMSG_WORDS]>() as _);
        let mut tos = 0u8;
        let mut ttl = 64u8;
        let mut dst = self.cfg.local;
        let (mut drops, mut stamp) = (None, None);
        // Walk the control messages with the libc macros over this slot's header.
        let mut hdr: libc::msghdr = zeroed();
        hdr.msg_control = ctrl.as_ptr() as *mut libc::c_void;
        hdr.msg_controllen = clen;
        // SAFETY: `hdr` describes `ctrl` (CMSG_WORDS * 8 bytes, of which the kernel filled `clen`, clamped to its
        // size); CMSG_FIRSTHDR/CMSG_NXTHDR stay within `msg_controllen` and return null at the end.
        let mut c = unsafe { libc::CMSG_FIRSTHDR(&hdr) };
        while !c.is_null() {
            // SAFETY: `c` is non-null and points at a complete cmsghdr inside `ctrl` (checked by the macros).
            let (level, ty) = unsafe { ((*c).cmsg_level, (*c).cmsg_type) };
            // Every `cmsg_payload` below: `hdr` describes `ctrl` and `c` came from the macros; each type is the one
            // the kernel writes for that (level, type) pair (ip(7), ipv6(7), socket(7)), made of integers; a
            // payload shorter than its type (a cut message) reads as `None` and is ignored.
            match (level, ty) {
                (libc::IPPROTO_IP, libc::IP_TOS) => {
                    // IP_TOS carries one byte.
                    // SAFETY: as said above the match.
                    tos = unsafe { cmsg_payload::<u8>(&hdr, c) }.unwrap_or(tos);
                }
                (libc::IPPROTO_IP, libc::IP_TTL) | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                    // SAFETY: as said above the match.
                    if let Some(v) = unsafe { cmsg_payload::<libc::c_int>(&hdr, c) } {
                        ttl = v as u8;
                    }
                }
                (libc::IPPROTO_IP, libc::IP_PKTINFO) => {
                    // SAFETY: as said above the match.
                    if let Some(pi) = unsafe { cmsg_payload::<libc::in_pktinfo>(&hdr, c) } {
                        dst = IpAddr::V4(Ipv4Addr::from(pi.ipi_addr.s_addr.to_ne_bytes()));
                    }
                }
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                    // SAFETY: as said above the match.
                    if let Some(v) = unsafe { cmsg_payload::<libc::c_int>(&hdr, c) } {
                        tos = v as u8;
                    }
                }
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                    // SAFETY: as said above the match.
                    if let Some(pi) = unsafe { cmsg_payload::<libc::in6_pktinfo>(&hdr, c) } {
                        dst = IpAddr::V6(Ipv6Addr::from(pi.ipi6_addr.s6_addr));
                    }
                }
                (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                    // The socket's drop count.
                    // SAFETY: as said above the match.
                    drops = unsafe { cmsg_payload::<u32>(&hdr, c) };
                }
                (libc::SOL_SOCKET, libc::SCM_TIMESTAMPNS) => {
                    // SAFETY: as said above the match.
                    stamp = unsafe { cmsg_payload::<libc::timespec>(&hdr, c) };
                }
                _ => {}
            }
            // SAFETY: `c` is a valid header within `hdr`'s control buffer.
            c = unsafe { libc::CMSG_NXTHDR(&hdr, c) };
        }
        if let Some(d) = drops {
            self.note_kernel_drops(d);
        }
        if let Some(ts) = stamp {
            self.rx_stamp_ns = (ts.tv_sec as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(ts.tv_nsec as u64);
        }
        let frame_len = self.hdr + len;
        let slot = &mut self.rx_data[i * self.rx_slot..i * self.rx_slot + frame_len];
        let (l2, rest) = slot.split_at_mut(ETH_LEN);
        let ethertype = match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) if !self.v6 => {
                Ipv4Repr {
                    src_addr: s,
                    dst_addr: d,
                    dscp: tos >> 2,
                    ecn: roce_wire::Ecn::from_bits(tos),
                    ident: 0,
                    dont_frag: true,
                    ttl,
                    protocol: ipv4::PROTOCOL_UDP,
                }
                .emit(
                    &mut Ipv4Packet::new_unchecked(&mut rest[..ipv4::HEADER_LEN]),
                    udp::HEADER_LEN + len,
                );
                EtherType::IPV4
            }
            (IpAddr::V6(s), IpAddr::V6(d)) if self.v6 => {
                Ipv6Repr {
                    src_addr: s,
                    dst_addr: d,
                    dscp: tos >> 2,
                    ecn: roce_wire::Ecn::from_bits(tos),
                    flow_label: 0,
                    next_header: ipv4::PROTOCOL_UDP,
                    hop_limit: ttl,
                }
                .emit(
                    &mut Ipv6Packet::new_unchecked(&mut rest[..ipv6::HEADER_LEN]),
                    udp::HEADER_LEN + len,
                );
                EtherType::IPV6
            }
            _ => return None,
        };
        let ip_len = self.hdr - ETH_LEN - udp::HEADER_LEN;
        UdpRepr {
            src_port: sport,
            dst_port: self.cfg.port,
        }
        .emit(
            &mut UdpPacket::new_unchecked(&mut rest[ip_len..ip_len + udp::HEADER_LEN]),
            len,
        );
        EthernetRepr {
            src_addr: EthernetAddress(self.cfg.peer_mac),
            dst_addr: EthernetAddress(self.cfg.local_mac),
            vlan: None,
            ethertype,
        }
        .emit(&mut EthernetFrame::new_unchecked(l2));
        Some(frame_len)
    }
}

impl Link for UdpLink {
    fn caps(&self) -> LinkCaps {
        LinkCaps {
            mtu: self.cfg.mtu,
            max_burst: self.cfg.burst,
            icrc: IcrcCaps {
                rx_verified: self.cfg.verify_rx_icrc,
                tx_computed: false,
            },
            first_qpn: self.shared.as_ref().map(reuseport::Joined::first_qpn),
        }
    }

    fn rx_burst(
        &mut self,
        now: Instant,
        max: usize,
        sink: &mut dyn FnMut(&mut [u8]),
    ) -> Result<usize, LinkError> {
        let n = max.min(self.cfg.burst);
        if n == 0 {
            return Ok(0);
        }
        if self.pkt.is_some() {
            return self.rx_packet(now, n, sink);
        }
        let fd = self.socks[0].as_raw_fd();
        let mut got = self.rx_udp(now, fd, n, true, sink)?;
        // Joined multicast groups: their sockets, with what is left of the burst (one `recvmmsg` each; only while
        // groups are joined).
        for k in 0..self.mc.len() {
            if got >= n {
                break;
            }
            let fd = self.mc[k].1.as_raw_fd();
            got += self.rx_udp(now, fd, n - got, false, sink)?;
        }
        Ok(got)
    }

    fn tx_buf(&mut self, _now: Instant) -> Result<&mut [u8], LinkError> {
        let Some(&i) = self.tx_free.last() else {
            return Err(LinkError::Busy);
        };
        let mtu = self.cfg.mtu;
        let i = usize::from(i);
        Ok(&mut self.tx_data[i * mtu..(i + 1) * mtu])
    }

    fn tx_commit(&mut self, _now: Instant, len: usize) -> Result<(), LinkError> {
        // SAFETY: no pieces.
        unsafe { self.commit(len, None, &[]) }
    }

    unsafe fn tx_commit_gather(
        &mut self,
        _now: Instant,
        g: TxGather,
        segs: &[TxSeg],
    ) -> Result<(), LinkError> {
        let Some(&slot) = self.tx_free.last() else {
            return Err(LinkError::NoTxBuffer);
        };
        let mtu = self.cfg.mtu;
        let Some(pieces) = segs.get(..g.segs) else {
            return Err(LinkError::TooLong {
                len: usize::MAX,
                mtu,
            });
        };
        // Checked: the lengths are the caller's (a wrapped sum would pass the MTU check with pieces far larger).
        let len = pieces
            .iter()
            .try_fold(0usize, |a, p| a.checked_add(p.len))
            .and_then(|plen| g.head.checked_add(plen)?.checked_add(g.tail));
        let Some(len) = len.filter(|&l| l <= mtu) else {
            return Err(LinkError::TooLong {
                len: len.unwrap_or(usize::MAX),
                mtu,
            });
        };
        let plen = len - g.head - g.tail;
        let base = usize::from(slot) * mtu;
        // The trailer goes behind the payload's place, so the slot reads as the frame's headers and lengths.
        self.tx_data
            .copy_within(base + g.head..base + g.head + g.tail, base + g.head + plen);
        if g.segs > MAX_GATHER {
            // SAFETY: the pieces are readable now (caller); `tx_data` is the link's own memory.
            unsafe {
                copy_pieces(
                    &mut self.tx_data[base + g.head..base + g.head + plen],
                    pieces,
                )
            };
            self.stats.tx_linearized_bytes += plen as u64;
            // SAFETY: no pieces.
            return unsafe { self.commit(len, None, &[]) };
        }
        // SAFETY: passed on from the caller.
        unsafe { self.commit(len, Some(g), pieces) }
    }

    fn flush(&mut self, _now: Instant) -> Result<(), LinkError> {
        let n = self.tx_pend.len();
        if n == 0 {
            return Ok(());
        }
        self.tx_grouped[..n].fill(false);
        for &slot in &self.tx_pend {
            self.tx_done[usize::from(slot)] = false;
        }
        let mut first_err = None;
        // One group per socket, in order of first appearance; stable within the group.
        for start in 0..n {
            if self.tx_grouped[start] {
                continue;
            }
            let sock = self.tx_meta[usize::from(self.tx_pend[start])].sock;
            self.tx_sel.clear();
            for j in start..n {
                let slot = self.tx_pend[j];
                if !self.tx_grouped[j] && self.tx_meta[usize::from(slot)].sock == sock {
                    self.tx_grouped[j] = true;
                    self.tx_sel.push(slot);
                }
            }
            if let Err(e) = self.send_sel(sock)
                && first_err.is_none()
            {
                first_err = Some(e);
            }
        }
        // Keep what was not sent, in commit order; sent and dropped slots become free again.
        let mut w = 0;
        for r in 0..n {
            let slot = self.tx_pend[r];
            if self.tx_done[usize::from(slot)] {
                self.tx_free.push(slot);
            } else {
                self.tx_pend[w] = slot;
                w += 1;
            }
        }
        self.tx_pend.truncate(w);
        // No pointer into registered memory outlives this flush: copy what is still queued.
        for &slot in &self.tx_pend {
            let i = usize::from(slot);
            let m = &mut self.tx_meta[i];
            if let Some(g) = m.gather.take() {
                let plen = m.len - (g.head - m.off) - g.tail;
                let at = i * self.cfg.mtu + g.head;
                // SAFETY: the pieces are readable until this flush returns (`tx_commit_gather`'s contract);
                // `tx_data` is the link's own memory.
                unsafe {
                    copy_pieces(
                        &mut self.tx_data[at..at + plen],
                        &self.tx_segs[i * MAX_GATHER..i * MAX_GATHER + g.segs],
                    )
                };
                self.stats.tx_linearized_bytes += plen as u64;
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn poll_at(&self) -> Option<Instant> {
        None
    }

    /// [`UdpLink::rx_fd`] while no frame waits in the transmit queue (after `EAGAIN`/`ENOBUFS` only a later
    /// `flush` sends it, and no receive readiness says when).
    ///
    /// With multicast groups joined, an epoll descriptor over the receive socket and the group sockets instead (it
    /// is readable when any of them is).
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        let fd = match &self.mc_epoll {
            Some(e) => e.as_raw_fd(),
            None => self.rx_fd(),
        };
        self.tx_pend.is_empty().then_some(fd)
    }

    /// Joins or leaves `group` on this link's address (see [`UdpLink::join_group`]).
    fn join_multicast(&mut self, group: IpAddr, join: bool) -> io::Result<()> {
        if join {
            self.join_group(group)
        } else {
            self.leave_group(group)
        }
    }

    /// [`UdpStats`] ([`UdpStats::NAMES`]), with [`UdpStats::rx_kernel_drops`] as the kernel counts it now: one
    /// `SO_MEMINFO` reading (a system call; this is the control path, never called per packet), so the stats
    /// endpoint and `perf --stats` include drops that no later frame and no empty-queue reading reported yet (the
    /// last ones of a run). The link's own [`UdpLink::stats`] take them in at its next reading. If the kernel
    /// refuses the reading, the count of the last one.
    fn counters(&self, f: &mut dyn FnMut(&'static str, u64)) {
        let mut s = self.stats;
        if let Ok(d) = socket_drops(self.rx_fd()) {
            s.rx_kernel_drops += u64::from(self.kernel_drops_since_seen(d));
        }
        for (n, v) in UdpStats::NAMES.iter().zip(s.values()) {
            f(n, v);
        }
    }

    /// On a shared address ([`UdpConfig::share`]) the claim or release of `service_id` in the address's services
    /// map ([`reuseport::Joined::claim_service`]); alone on the address, nothing to steer.
    fn steer_service(&self, service_id: u64, listen: bool) -> io::Result<()> {
        match &self.shared {
            Some(j) if listen => j.claim_service(service_id),
            Some(j) => {
                j.release_service(service_id);
                Ok(())
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_wire::{
        BthRepr, DethRepr, Ecn, ExtRepr, IpRepr, Opcode, Psn, Qpn, RoceRepr, UdpPacket,
    };

    fn frame(v6: bool) -> Vec<u8> {
        frame_from(if v6 {
            IpRepr::Ipv6(Ipv6Repr {
                src_addr: Ipv6Addr::LOCALHOST,
                dst_addr: Ipv6Addr::LOCALHOST,
                dscp: 0,
                ecn: Ecn::NotEct,
                flow_label: 0,
                next_header: 17,
                hop_limit: 64,
            })
        } else {
            IpRepr::Ipv4(Ipv4Repr {
                src_addr: Ipv4Addr::new(198, 18, 0, 1),
                dst_addr: Ipv4Addr::new(198, 18, 0, 2),
                dscp: 0,
                ecn: Ecn::NotEct,
                ident: 7,
                dont_frag: true,
                ttl: 64,
                protocol: 17,
            })
        })
    }

    /// A 64-byte UD SEND frame with the IP header `ip`.
    fn frame_from(ip: IpRepr) -> Vec<u8> {
        let v6 = matches!(ip, IpRepr::Ipv6(_));
        let repr = RoceRepr {
            eth: EthernetRepr {
                src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
                dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
                vlan: None,
                ethertype: if v6 { EtherType::IPV6 } else { EtherType::IPV4 },
            },
            ip,
            udp: UdpRepr {
                src_port: 0xc123,
                dst_port: ROCE_V2_PORT,
            },
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY,
                solicited: false,
                mig_req: false,
                pad_count: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qp: Qpn::new(0x11),
                ack_req: false,
                psn: Psn::new(1),
            },
            ext: ExtRepr {
                deth: Some(DethRepr {
                    qkey: 1,
                    src_qp: Qpn::new(0x22),
                }),
                ..ExtRepr::NONE
            },
            payload_len: 64,
        };
        let mut buf = vec![0u8; 256];
        let n = repr.emit_with_payload(&mut buf, &[0xA5; 64]).unwrap();
        buf.truncate(n);
        buf
    }

    fn set_udp_checksum(f: &mut [u8], v6: bool, c: Option<u16>) {
        let ip_len = if v6 {
            ipv6::HEADER_LEN
        } else {
            ipv4::HEADER_LEN
        };
        let (src, dst) = if v6 {
            (
                IpAddr::V6(Ipv6Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
            )
        } else {
            (
                IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
                IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
            )
        };
        let seg = &mut f[ETH_LEN + ip_len..];
        let c = c.unwrap_or_else(|| udp::checksum(src, dst, seg));
        UdpPacket::new_unchecked(seg).set_checksum(c);
    }

    /// A link on 127.0.91.1 (this test module's own loopback address) and a frame it may send to 127.0.91.2.
    fn loopback_link_and_frame() -> (UdpLink, Vec<u8>) {
        let local = Ipv4Addr::new(127, 0, 91, 1);
        let mut cfg = UdpConfig::new(IpAddr::V4(local));
        cfg.port = 0;
        let link = UdpLink::bind(cfg).expect("bind 127.0.91.1");
        let f = frame_from(IpRepr::Ipv4(Ipv4Repr {
            src_addr: local,
            dst_addr: Ipv4Addr::new(127, 0, 91, 2),
            dscp: 0,
            ecn: Ecn::NotEct,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
        }));
        (link, f)
    }

    /// Issue #22 item 9: piece lengths whose sum overflows are refused (`TooLong`), not summed with wrap-around
    /// (before the fix: "attempt to add with overflow" in a debug build; in release a wrapped length passed the
    /// MTU check and the pieces went to `sendmmsg` with their full lengths).
    #[test]
    fn gathered_piece_lengths_that_overflow_are_refused() {
        let (mut link, f) = loopback_link_and_frame();
        let payload = [0u8; 8];
        let head = f.len() - 64 - 4;
        link.tx_buf(Instant::ZERO).expect("buf")[..f.len()].copy_from_slice(&f);
        let segs = [
            TxSeg {
                ptr: payload.as_ptr(),
                len: usize::MAX,
            },
            TxSeg {
                ptr: payload.as_ptr(),
                len: 2,
            },
        ];
        let g = TxGather {
            head,
            segs: 2,
            tail: 4,
        };
        // SAFETY: the call is refused before any piece is read (and none is kept).
        let r = unsafe { link.tx_commit_gather(Instant::ZERO, g, &segs) };
        assert!(matches!(r, Err(LinkError::TooLong { .. })), "{r:?}");
        link.flush(Instant::ZERO).expect("flush");
        assert_eq!(link.stats().tx_frames, 0);
    }

    /// Issue #22 item 9: a gathered frame whose headers (`head`) end before its UDP payload starts is dropped and
    /// counted as `tx_invalid`; before the fix it was queued and `flush` computed `head - payload offset` below
    /// zero ("attempt to subtract with overflow" in a debug build, a huge iovec in release).
    #[test]
    fn a_gathered_frame_whose_headers_end_early_is_invalid() {
        let (mut link, f) = loopback_link_and_frame();
        link.tx_buf(Instant::ZERO).expect("buf")[..f.len()].copy_from_slice(&f);
        // The whole frame as one piece after zero header bytes: the slot still parses as this frame.
        let segs = [TxSeg {
            ptr: f.as_ptr(),
            len: f.len(),
        }];
        let g = TxGather {
            head: 0,
            segs: 1,
            tail: 0,
        };
        // SAFETY: `f` is readable and outlives the `flush` below; it is not the link's memory.
        let r = unsafe { link.tx_commit_gather(Instant::ZERO, g, &segs) };
        assert!(r.is_ok(), "{r:?}");
        link.flush(Instant::ZERO).expect("flush");
        let st = link.stats();
        assert_eq!((st.tx_invalid, st.tx_frames), (1, 0));
    }

    /// Issue #22 item 9: a control message's payload is read only when `cmsg_len` covers the whole type and the
    /// payload lies inside the control length (a message the kernel cut short under `MSG_CTRUNC` has a shorter
    /// `cmsg_len`).
    #[test]
    fn control_message_payloads_are_length_checked() {
        let mut ctrl = [0u64; CMSG_WORDS];
        let put = |ctrl: &mut [u64; CMSG_WORDS], cmsg_len: usize| {
            let hdr = libc::cmsghdr {
                cmsg_len: cmsg_len as _,
                cmsg_level: libc::SOL_SOCKET,
                cmsg_type: libc::SO_RXQ_OVFL,
            };
            // SAFETY: the buffer is 8-byte aligned and larger than a header plus an int; plain data.
            unsafe {
                let p = ctrl.as_mut_ptr().cast::<u8>();
                core::ptr::write_unaligned(p.cast::<libc::cmsghdr>(), hdr);
                core::ptr::write_unaligned(p.add(libc::CMSG_LEN(0) as usize).cast::<u32>(), 77);
            }
        };
        let read = |ctrl: &[u64; CMSG_WORDS], controllen: usize| {
            let mut hdr: libc::msghdr = zeroed();
            hdr.msg_control = ctrl.as_ptr() as *mut libc::c_void;
            hdr.msg_controllen = controllen as _;
            // SAFETY: `hdr` describes `ctrl` (at most its size); the macro checks the header fits.
            let c = unsafe { libc::CMSG_FIRSTHDR(&hdr) };
            assert!(!c.is_null());
            // SAFETY: `c` came from CMSG_FIRSTHDR over `hdr`; `u32` accepts any bytes.
            unsafe { cmsg_payload::<u32>(&hdr, c) }
        };
        // SAFETY: pure arithmetic.
        let (len0, len4) = unsafe { (libc::CMSG_LEN(0) as usize, libc::CMSG_LEN(4) as usize) };
        put(&mut ctrl, len4);
        assert_eq!(read(&ctrl, size_of_val(&ctrl)), Some(77), "whole message");
        put(&mut ctrl, len0 + 2);
        assert_eq!(read(&ctrl, size_of_val(&ctrl)), None, "cmsg_len cut short");
        put(&mut ctrl, len4);
        assert_eq!(read(&ctrl, len0 + 2), None, "payload past msg_controllen");
    }

    /// IPv4 header checksum and non-zero UDP checksums (IPv4 and IPv6) are checked; zero UDP checksums pass.

    #[test]
    fn drop_names_are_counter_names() {
        for n in UdpStats::DROP_NAMES {
            assert!(
                UdpStats::NAMES.contains(&n),
                "{n} is not a UdpStats counter"
            );
        }
    }
    #[test]
    fn packet_path_checksum_rules() {
        for v6 in [false, true] {
            let mut f = frame(v6);
            assert!(rx_checksums_ok(&f, v6), "v6={v6}: zero UDP checksum");
            set_udp_checksum(&mut f, v6, None);
            assert!(rx_checksums_ok(&f, v6), "v6={v6}: correct UDP checksum");
            let good = UdpPacket::new_checked(&f[ETH_LEN + if v6 { 40 } else { 20 }..])
                .unwrap()
                .checksum();
            set_udp_checksum(&mut f, v6, Some(good ^ 0x0100));
            assert!(!rx_checksums_ok(&f, v6), "v6={v6}: wrong UDP checksum");
        }
        let mut f = frame(false);
        f[ETH_LEN + 10] ^= 0x01;
        assert!(!rx_checksums_ok(&f, false), "wrong IPv4 header checksum");
    }
}
