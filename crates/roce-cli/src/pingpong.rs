//! `rocev2 pingpong [rc|ud] [SERVER]`: the rdma-core `ibv_rc_pingpong` / `ibv_ud_pingpong` test over the rocev2
//! runtime, wire-compatible with those tools (and so with Linux Soft-RoCE, rxe).
//!
//! # What it does (facts from `docs/spec/INTEROP.md` §5.1)
//!
//! * **Exchange** on TCP (`-p`, default 18515): a 52-byte ASCII record `LLLL:QQQQQQ:PPPPPP:<32 hex GID>` plus one
//!   NUL (LID, QPN, initial PSN, GID in wire order). The client connects and writes its record in one `write`;
//!   the server reads it, takes its QP to RTR/RTS, writes its own record in one `write`, and reads `done\0`; the
//!   client reads the server's record, writes `done\0` and then takes its QP to RTR/RTS. Records are written with
//!   a single `write` because the rdma-core server reads them with a single `read`.
//! * **Traffic**: the client sends first; each side sends its next message only when its previous send has
//!   completed and the peer's message has arrived; `-n` messages each way. Every side keeps `-r` receives posted,
//!   topping them up when one is left.
//! * **RC QP**: path MTU `-m` (default 1024; lowered, with a note, to the active MTU of the local address: its
//!   network device's MTU − 80 rounded down to an IB MTU, as Linux rxe — `perf::port_mtu`), min RNR timer 12,
//!   local ACK timeout `-u` (default 14 ≈ 67 ms), retry count 7, RNR retry 7, one outstanding READ/atomic each way, no remote
//!   access; default message size 4096.
//! * **UD QP**: Q_Key 0x11111111, an address handle to the peer's GID, receive buffers with 40 bytes of GRH space
//!   in front of the payload; default message size 1024 (rdma-core's help says 2048, which is larger than rxe's
//!   1024-byte MTU on a 1500-byte Ethernet, so it cannot work against rxe); a message must fit the MTU (`-m`).
//! * **GID**: a rocev2 port has one GID, index 0, the IPv4-mapped (or IPv6) address of `--ip`; `-g` is accepted
//!   and ignored with a note. The peer's GID is its RoCE address: RoCE v2 frames go to the IP address in it
//!   (`docs/spec/ROCEV2.md` §1.2), which need not be the address its TCP connection came from — on one host a
//!   client on 127.0.0.2 connects to 127.0.0.1 *from* 127.0.0.1, since Linux picks the source of a loopback
//!   connection by the route. So the GID is taken as it is, and refused at exchange time only when it cannot
//!   address this port's peer: all zero (rdma-core tools run without `-g`), or of the other IP family than `--ip`
//!   (e.g. rxe's link-local GID index 0 against an IPv4 port); the error names the GID and the `-g` index to use.
//! * **Output** (stdout), as the rdma-core tools print it: the local and remote address lines, then
//!   `N bytes in X seconds = Y Mbit/sec` (N = 2 × size × iters) and `N iters in X seconds = Y usec/iter`.
//!   `ibv_ud_pingpong` writes `PSN 0x...: GID` in its local line; this tool does the same in UD mode.
//! * **Data**: the send buffer holds the pattern `byte[i] = 7·i mod 256`. The rdma-core tools do not check
//!   content; with `-c` this tool checks every received message against that pattern (meaningful when the peer is
//!   rocev2 or `host_pingpong_peer.py`, which sends the same pattern) and always checks the received length.
//!
//! # Receive mode (`--rx`)
//!
//! Linux rxe numbers the IPv4 identification of its packets, and the ICRC covers that field
//! (`ROCEV2.md §3`), so rxe's packets can only be verified with the real IP header: `--rx packet` reads whole frames
//! with `AF_PACKET` ([`roce_link::RxMode::Packet`], needs `CAP_NET_RAW`). `--rx socket` reads from the UDP socket
//! and rebuilds the header assuming IPv4 ID 0 + DF, which is what rocev2 (and any unconnected UDP-socket sender)
//! writes. The default `auto` picks `socket` when the peer's address is on this host (loopback or one of our own
//! addresses: a foreign kernel stack cannot be there, and its frames would travel over `lo`, which a packet socket
//! on the address's interface does not see) and `packet` otherwise, falling back to `socket` with a warning when
//! `AF_PACKET` is not permitted. `packet` works with rocev2 peers as well.
//!
//! # Capture (`--pcap`)
//!
//! Every RoCE frame the engine sends and receives, as the engine sees it: received frames byte for byte as they
//! came off the wire with `--rx packet` (rebuilt from the socket with `--rx socket`), sent frames as the engine built
//! them (their MAC addresses are the engine's placeholders; the kernel writes the real ones). `check_pcap.py`
//! accepts both.
//!
//! # Interoperability checked
//!
//! Against Linux 6.1 rxe (rdma-core 44) in the `testdata/interop/softroce-vm` guest: `ibv_rc_pingpong -g 1` and
//! `ibv_ud_pingpong -g 1` as server and as client, with and without `-e`, sizes 1, 1024, 4096 (the 1000-iteration
//! default) and 10000; every frame of the captures passes `check_pcap.py`. Without `-g` the rdma-core tool is
//! refused at exchange time; with `--rx socket` the rxe frames fail the ICRC and the run ends with the hint.
//!
//! # Bounded waits
//!
//! `--timeout` (default 20 s) bounds waiting for a client to connect, the connect, every exchange read, and the
//! time without a completion in the traffic phase; RC errors (transport retries exhausted after ≈7 × 67 ms with the
//! default `-u 14`; raise `-u` for a slow peer such as rxe in an emulated guest) end
//! the run earlier. Any failure prints one line naming the step and exits 1.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use roce_link::device::mac_of;
use roce_link::{LinkError, Pcap, PcapMode, RxMode, UdpConfig, UdpLink};
use roce_proto::{EngineConfig, Mtu, QpType};
use roce_verbs::{
    AccessFlags, Ah, AhAttr, CompChannel, ConnectOpts, Context, Cq, Moderation, Mr, MrBuf, Pd,
    ProgressMode, Psn, Qp, QpAttr, QpAttrMask, QpCap, QpEndpoint, QpState, RecvWr, RuntimeConfig,
    SendLink, SendOp, SendWr, Sge, UdDest, Wc, WcStatus,
};
use roce_wire::{Gid, Qpn};

use crate::perf::port_mtu;
use crate::rxmode::{self, RxArg};

/// Length of the rdma-core pingpong exchange record, including its NUL.
const RECORD_LEN: usize = 52;
/// The message that ends the exchange.
const DONE: &[u8; 5] = b"done\0";
/// Q_Key of `ibv_ud_pingpong`.
const UD_QKEY: u32 = 0x1111_1111;
/// Bytes in front of a UD receive that hold the GRH (`ROCEV2.md §5`, IBTA 11.4.1.1).
const GRH_LEN: usize = 40;
/// Work request ids, as the rdma-core tools use them (bit flags of what is pending).
const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// Transport of the test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    Rc,
    Ud,
}

/// Arguments of `rocev2 pingpong`.
#[derive(Clone, Debug, Args)]
#[command(
    after_help = "Examples:\n  rocev2 pingpong rc --ip 198.18.0.1                 # server\n  rocev2 pingpong rc 198.18.0.1 --ip 198.18.0.2      # client\n  ibv_rc_pingpong -g 1 198.18.0.1                    # rdma-core's client on Linux rxe against the rocev2 server\n  rocev2 run --ip 198.18.0.2 -- ibv_rc_pingpong -g 0 198.18.0.1   # rdma-core's client on rocev2\n\nThe rdma-core tools' -g is the index of the IPv4-mapped GID in their device's table (`ibv_devinfo -v`): 1 on\nLinux rxe (index 0 is its link-local GID), 0 under `rocev2 run` (a rocev2 device opened on an address has that one GID, at index 0: docs/DEVICE.md).\n\nExit status: 0 when all iterations completed, 1 on any error (exchange, unusable peer GID, work completion error,\ntimeout), 2 on bad arguments."
)]
pub struct PingpongArgs {
    /// `rc` (default) or `ud`, optionally followed by the server's address; without an address, wait for a
    /// client (server).
    #[arg(value_name = "rc|ud|SERVER")]
    first: Option<String>,
    /// The server's address (when the first argument is the transport).
    #[arg(value_name = "SERVER")]
    second: Option<String>,
    /// TCP port of the exchange.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Message size in bytes (default 4096 for rc, 1024 for ud).
    #[arg(short = 's', long)]
    size: Option<u32>,
    /// Number of exchanges (messages each way).
    #[arg(short = 'n', long, default_value_t = 1000)]
    iters: u32,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096 (UD: the largest message). Capped by the active MTU of
    /// the local address (the MTU of its network device minus 80, rounded down to one of those, as Linux rxe:
    /// 1500 → 1024), with a note when that lowers it.
    #[arg(short = 'm', long, default_value_t = 1024)]
    mtu: u32,
    /// Receives to keep posted.
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// GID index: accepted for compatibility and ignored (a rocev2 port has one GID, index 0, from --ip).
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u32>,
    /// Sleep on completion events instead of polling.
    #[arg(short = 'e', long)]
    events: bool,
    /// Who drives the RoCE engine: `caller` (run-to-completion in this program's thread) or `thread` (a progress
    /// thread).
    #[arg(long = "progress", default_value = "caller", value_parser = crate::perf::parse_progress)]
    progress: ProgressMode,
    /// Service level: accepted and ignored (RoCE v2 carries no SL).
    #[arg(short = 'l', long)]
    sl: Option<u32>,
    /// IB device: accepted and ignored (the device is the rocev2 engine on --ip).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// IB port: accepted and ignored (one port).
    #[arg(short = 'i', long = "ib-port")]
    ib_port: Option<u32>,
    /// Check every received message against the sender pattern (byte i = 7·i mod 256) as rocev2 sends it.
    #[arg(short = 'c', long)]
    chk: bool,
    /// Local IP address for RoCE and TCP (default: the address the TCP connection uses).
    #[arg(long)]
    ip: Option<IpAddr>,
    /// Receive path: packet (AF_PACKET, real IP headers; needed for rxe), socket (UDP socket), auto.
    #[arg(long, value_enum, default_value_t = RxArg::Auto)]
    rx: RxArg,
    /// RC: the QP's local ACK timeout exponent (4.096 µs · 2^N, as perftest's -u and `rocev2 perf -u`; default 14
    /// ≈ 67 ms, the ibv_rc_pingpong value). Raise it for a slow peer, e.g. rxe in an emulated guest.
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(1..=31))]
    qp_timeout: u8,
    /// Write every RoCE frame sent and received to this pcap file.
    #[arg(long)]
    pcap: Option<PathBuf>,
    /// Link: `udp` (kernel UDP sockets) or `xdp` (AF_XDP on the interface that owns --ip; when it cannot be used,
    /// a message names the cause and the UDP link is used).
    #[arg(long, value_enum, default_value_t = PingLink::Udp)]
    link: PingLink,
    /// Seconds to wait for a client, the exchange, or the next completion before giving up.
    #[arg(long, default_value_t = 20.0)]
    timeout: f64,
}

/// `--link` of `rocev2 pingpong`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PingLink {
    /// Kernel UDP sockets on port 4791 (`UdpLink`).
    Udp,
    /// AF_XDP (`XdpLink`), falling back to UDP with a message naming the cause.
    Xdp,
}

/// Parameters after validation.
#[derive(Clone, Debug)]
struct Params {
    transport: Transport,
    server: Option<String>,
    size: usize,
    iters: u32,
    mtu: Mtu,
    rx_depth: u32,
    timeout: Duration,
    chk: bool,
    /// Local ACK timeout exponent of the RC QP (`-u`).
    qp_timeout: u8,
}

impl Params {
    fn from_args(a: &PingpongArgs) -> Result<Params, String> {
        let parse_t = |s: &str| match s.to_ascii_lowercase().as_str() {
            "rc" => Some(Transport::Rc),
            "ud" => Some(Transport::Ud),
            _ => None,
        };
        let (transport, server) = match (&a.first, &a.second) {
            (None, _) => (Transport::Rc, None),
            (Some(f), s) => match (parse_t(f), s) {
                (Some(t), s) => (t, s.clone()),
                (None, None) => (Transport::Rc, Some(f.clone())),
                (None, Some(_)) => {
                    return Err(format!("unknown transport {f:?}: expected rc or ud"));
                }
            },
        };
        let mtu = port_mtu::parse_flag(a.mtu)?;
        let size = a.size.unwrap_or(match transport {
            Transport::Rc => 4096,
            Transport::Ud => 1024,
        });
        check_ud_size(transport, size, mtu)?;
        if size > (1 << 30) {
            return Err(format!("-s {size}: at most 1 GiB"));
        }
        if a.iters == 0 {
            return Err("-n must be at least 1".into());
        }
        if a.rx_depth < 2 || a.rx_depth > 16384 {
            return Err(format!("-r {}: between 2 and 16384", a.rx_depth));
        }
        if !(a.timeout.is_finite() && a.timeout > 0.0 && a.timeout < 1e6) {
            return Err(format!(
                "--timeout {}: a positive number of seconds",
                a.timeout
            ));
        }
        Ok(Params {
            transport,
            server,
            size: size as usize,
            iters: a.iters,
            mtu,
            rx_depth: a.rx_depth,
            timeout: Duration::from_secs_f64(a.timeout),
            chk: a.chk,
            qp_timeout: a.qp_timeout,
        })
    }
}

/// A UD message is one packet: it must fit the MTU.
fn check_ud_size(transport: Transport, size: u32, mtu: Mtu) -> Result<(), String> {
    if transport == Transport::Ud && size > mtu.bytes() {
        return Err(format!(
            "Requested size larger than port MTU ({}): a UD message is one packet (-s {size}, -m {})",
            mtu.bytes(),
            mtu.bytes()
        ));
    }
    Ok(())
}

/// `p` with its MTU capped by the active MTU of `local` ([`port_mtu`]; over `--link xdp` also by what the AF_XDP
/// link carries, [`port_mtu::for_xdp`]), printing a note when that lowers it (or
/// when the active MTU cannot be found).
///
/// # Errors
/// A UD message size that no longer fits.
fn with_port_mtu(p: &Params, local: IpAddr, link: PingLink) -> Result<Params, String> {
    let mut p = p.clone();
    let active = port_mtu::of_address(local);
    let active = if link == PingLink::Xdp {
        active.map(port_mtu::for_xdp)
    } else {
        active
    };
    match active {
        Ok(act) => {
            let (m, note) = port_mtu::cap(p.mtu, &act, local);
            if let Some(n) = note {
                eprintln!("rocev2 pingpong: note: {n}");
            }
            p.mtu = m;
        }
        Err(e) => eprintln!(
            "rocev2 pingpong: note: the active MTU of {local} is unknown ({e}); using -m {}",
            p.mtu.bytes()
        ),
    }
    check_ud_size(p.transport, p.size as u32, p.mtu)?;
    Ok(p)
}

/// One side's exchange record (`LLLL:QQQQQQ:PPPPPP:GID`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dest {
    lid: u16,
    qpn: Qpn,
    psn: Psn,
    gid: Gid,
}

impl Dest {
    /// The 52-byte record: lowercase hex fields, the GID as 32 hex digits in wire order, one NUL.
    fn encode(&self) -> [u8; RECORD_LEN] {
        let text = format!(
            "{:04x}:{:06x}:{:06x}:{}",
            self.lid,
            self.qpn.value(),
            self.psn.value(),
            self.gid.hex()
        );
        let mut out = [0u8; RECORD_LEN];
        // 4 + 1 + 6 + 1 + 6 + 1 + 32 = 51 bytes, then the NUL.
        out[..text.len()].copy_from_slice(text.as_bytes());
        out
    }

    /// Parses a record (`strtoul`-like hex fields separated by `:`, text ending at the first NUL).
    fn decode(buf: &[u8]) -> Result<Dest, String> {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let text = std::str::from_utf8(&buf[..end])
            .map_err(|_| "the peer's address record is not ASCII".to_owned())?;
        let bad = || format!("the peer's address record {text:?} is not LID:QPN:PSN:GID");
        let mut f = text.split(':');
        let (Some(lid), Some(qpn), Some(psn), Some(gid), None) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            return Err(bad());
        };
        let lid = u16::from_str_radix(lid, 16).map_err(|_| bad())?;
        let qpn = u32::from_str_radix(qpn, 16)
            .ok()
            .and_then(Qpn::new_checked)
            .ok_or_else(bad)?;
        let psn = u32::from_str_radix(psn, 16)
            .ok()
            .and_then(Psn::new_checked)
            .ok_or_else(bad)?;
        let gid = Gid::parse_hex(gid).map_err(|_| bad())?;
        Ok(Dest { lid, qpn, psn, gid })
    }
}

/// The address line as the rdma-core tools print it.
fn address_line(which: &str, d: &Dest, t: Transport) -> String {
    let sep = if t == Transport::Ud && which == "local" {
        ':'
    } else {
        ','
    };
    let label = if which == "local" {
        "local address: "
    } else {
        "remote address:"
    };
    format!(
        "  {label} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}{sep} GID {}",
        d.lid,
        d.qpn.value(),
        d.psn.value(),
        d.gid
    )
}

/// The test's send pattern.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(7) & 0xff) as u8).collect()
}

/// The peer's RoCE address: the IP address in its GID (`docs/spec/ROCEV2.md` §1.2), whatever address its TCP
/// connection came from (`tcp_ip`, named in errors). Refused: an all-zero GID, and a GID of the other IP family
/// than `local` (this port cannot send there), e.g. a link-local IPv6 GID against an IPv4 `--ip`.
fn peer_roce_ip(peer: &Dest, tcp_ip: IpAddr, local: IpAddr, side: &str) -> Result<IpAddr, String> {
    let ip = peer.gid.to_ip().to_canonical();
    if !peer.gid.is_zero() && ip.is_ipv4() == local.is_ipv4() {
        return Ok(ip);
    }
    let what = if peer.gid.is_zero() {
        "an all-zero GID (the rdma-core tools send that without -g)".to_owned()
    } else {
        format!(
            "GID {} (an {} address)",
            peer.gid,
            if ip.is_ipv4() { "IPv4" } else { "IPv6" }
        )
    };
    let family = if local.is_ipv4() {
        "IPv4-mapped"
    } else {
        "IPv6"
    };
    Err(format!(
        "GID refused at exchange time: the {side} at {tcp_ip} sent {what}, but RoCE v2 packets go to the IP address \
         in the GID and this port is {local}, so it needs the {side}'s {family} GID (like {}). Start the rdma-core \
         tool with `-g N`, N the index of that GID in `ibv_devinfo -v` (1 on Linux rxe; 0 under `rocev2 run`)",
        Gid::from_ip(tcp_ip.to_canonical())
    ))
}

fn io_err(step: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> String {
    move |e| format!("{step}: {e}")
}

/// Reads exactly `buf.len()` bytes before `deadline`.
fn read_full(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Instant,
    step: &str,
) -> Result<(), String> {
    let mut got = 0;
    while got < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!(
                "{step}: timed out after {got} of {} bytes",
                buf.len()
            ));
        }
        s.set_read_timeout(Some(left)).map_err(io_err(step))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(format!(
                    "{step}: the peer closed the connection after {got} of {} bytes",
                    buf.len()
                ));
            }
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(format!(
                    "{step}: timed out after {got} of {} bytes",
                    buf.len()
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{step}: {e}")),
        }
    }
    Ok(())
}

/// Writes `buf` with one `write` (the rdma-core server reads a record with one `read`).
fn write_one(s: &mut TcpStream, buf: &[u8], step: &str) -> Result<(), String> {
    let n = s.write(buf).map_err(io_err(step))?;
    if n != buf.len() {
        return Err(format!("{step}: short write ({n} of {} bytes)", buf.len()));
    }
    Ok(())
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Opens the device: a UdpLink on `local` (receive mode per `--rx`), wrapped in a pcap writer with `--pcap`.
fn open_device(a: &PingpongArgs, local: IpAddr, peer: IpAddr) -> Result<(Context, RxMode), String> {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ (u64::from(std::process::id()) << 32);
    let open = |rx: RxMode| {
        let ucfg = UdpConfig {
            local_mac: mac_of(local),
            peer_mac: mac_of(peer),
            // The engine checks every ICRC itself and counts failures (`rx_icrc_encapsulated`), which this tool
            // reports; a second check in the link would hide them from the counters.
            verify_rx_icrc: false,
            rx,
            ..UdpConfig::new(local)
        };
        let pcap = a.pcap.clone();
        let cfg = EngineConfig {
            mac: mac_of(local),
            gids: vec![roce_proto::Gid(Gid::from_ip(local).to_bytes())],
            seed,
            ..EngineConfig::default()
        };
        let xdp = a.link == PingLink::Xdp;
        Context::open(cfg, RuntimeConfig::with_mode(a.progress), move || {
            let xdp = if xdp {
                crate::xdplink::open_or_explain("rocev2 pingpong", local, peer)?
            } else {
                None
            };
            let mut l: SendLink = match xdp {
                Some(x) => x,
                None => Box::new(UdpLink::bind(ucfg)?),
            };
            if let Some(p) = pcap {
                let file = File::create(&p).map_err(|e| {
                    LinkError::Io(std::io::Error::new(
                        e.kind(),
                        format!("creating {}: {e}", p.display()),
                    ))
                })?;
                l = Box::new(Pcap::new(l, BufWriter::new(file), PcapMode::Both)?);
            }
            Ok(l)
        })
    };
    rxmode::open(a.rx, peer, "rocev2 pingpong", open).map_err(|e| {
        let msg = source_chain(&e);
        let hint = if msg.contains("in use") {
            format!(" ({})", roce_link::device::in_use_hint(local, None))
        } else {
            String::new()
        };
        format!("opening the RoCE device on {local}: {msg}{hint}")
    })
}

/// Verbs objects of one run.
struct Session {
    ctx: Context,
    rx: RxMode,
    pd: Pd,
    cq: Cq,
    chan: Option<Arc<CompChannel>>,
    qp: Qp,
    send_mr: Mr,
    recv_mr: Mr,
    /// The registered memory of `send_mr` (filled with the pattern) and `recv_mr` (checked in place).
    _send_buf: MrBuf,
    recv_buf: MrBuf,
    ah: Option<Ah>,
    local: Dest,
}

fn setup(a: &PingpongArgs, p: &Params, local: IpAddr, peer: IpAddr) -> Result<Session, String> {
    let (ctx, rx) = open_device(a, local, peer)?;
    let e = |what: &'static str| {
        move |err: roce_verbs::Error| format!("{what}: {}", source_chain(&err))
    };
    let pd = ctx.alloc_pd().map_err(e("ibv_alloc_pd"))?;
    let recv_len = p.size
        + if p.transport == Transport::Ud {
            GRH_LEN
        } else {
            0
        };
    let alloc = |what: &'static str| move |err: std::io::Error| format!("{what}: {err}");
    let send_buf =
        MrBuf::from_slice(&pattern(p.size.max(1))).map_err(alloc("allocating the send buffer"))?;
    let recv_buf = MrBuf::new(recv_len.max(1)).map_err(alloc("allocating the receive buffer"))?;
    let send_mr = pd
        .reg_mr(&send_buf, AccessFlags::LOCAL_WRITE)
        .map_err(e("ibv_reg_mr (send buffer)"))?;
    let recv_mr = pd
        .reg_mr(&recv_buf, AccessFlags::LOCAL_WRITE)
        .map_err(e("ibv_reg_mr (receive buffer)"))?;
    let chan = a.events.then(|| Arc::new(CompChannel::new()));
    let cq = ctx
        .create_cq(p.rx_depth + 1, chan.as_ref(), Moderation::default())
        .map_err(e("ibv_create_cq"))?;
    let qp_type = match p.transport {
        Transport::Rc => QpType::Rc,
        Transport::Ud => QpType::Ud,
    };
    let qp = pd
        .create_qp(
            qp_type,
            &cq,
            &cq,
            QpCap {
                max_send_wr: 1,
                max_recv_wr: p.rx_depth,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            false,
        )
        .map_err(e("ibv_create_qp"))?;
    let psn = ctx.random_psn().map_err(e("choosing the initial PSN"))?;
    let local = Dest {
        lid: 0,
        qpn: qp.qpn(),
        psn,
        gid: Gid::from_ip(local),
    };
    let s = Session {
        ctx,
        rx,
        pd,
        cq,
        chan,
        qp,
        send_mr,
        recv_mr,
        _send_buf: send_buf,
        recv_buf,
        ah: None,
        local,
    };
    match p.transport {
        // UD is ready for traffic without knowing the peer (RESET→INIT(Q_Key)→RTR→RTS).
        Transport::Ud => {
            s.qp.ready_ud(UD_QKEY, psn)
                .map_err(e("moving the UD QP to RTS"))?
        }
        // Receives can be posted from INIT on (IBTA 10.8.2); RTR/RTS follow once the peer is known.
        Transport::Rc => {
            s.qp.modify(
                &QpAttr {
                    qp_state: QpState::Init,
                    pkey_index: 0,
                    port_num: 1,
                    qp_access_flags: AccessFlags::EMPTY,
                    ..QpAttr::default()
                },
                QpAttrMask::STATE
                    | QpAttrMask::PKEY_INDEX
                    | QpAttrMask::PORT
                    | QpAttrMask::ACCESS_FLAGS,
            )
            .map_err(e("Failed to modify QP to INIT"))?
        }
    }
    post_recvs(&s, p, p.rx_depth)?;
    // Receives must be in the engine before the peer learns our QPN (UD has no RNR retry).
    s.qp.sync().map_err(e("posting receives"))?;
    Ok(s)
}

fn post_recvs(s: &Session, p: &Params, n: u32) -> Result<(), String> {
    let len = (p.size
        + if p.transport == Transport::Ud {
            GRH_LEN
        } else {
            0
        }) as u32;
    let sge = [s.recv_mr.sge(0, len)];
    let sg: &[Sge] = if len == 0 { &[] } else { &sge };
    let wrs: Vec<RecvWr<'_>> = (0..n)
        .map(|_| RecvWr {
            wr_id: RECV_WRID,
            sg_list: sg,
        })
        .collect();
    // The ring may be shorter than the chain when WQEs still sit in it; post what fits, chunk by chunk.
    for chunk in wrs.chunks(64) {
        s.qp.post_recv(chunk)
            .map_err(|e| format!("Couldn't post receive ({}): {e}", chunk.len()))?;
    }
    Ok(())
}

/// RC: RESET→INIT→RTR→RTS towards `remote` with the rdma-core pingpong attributes.
fn connect_rc(s: &Session, p: &Params, remote: &Dest, peer: IpAddr) -> Result<(), String> {
    let ep = QpEndpoint {
        qpn: remote.qpn,
        psn: remote.psn,
        gid: roce_proto::Gid(remote.gid.to_bytes()),
        mac: mac_of(peer),
    };
    let opts = ConnectOpts {
        mtu: p.mtu,
        access: AccessFlags::EMPTY,
        timeout: p.qp_timeout,
        retry_cnt: 7,
        rnr_retry: 7,
        min_rnr_timer: 12,
        rd_atomic: 1,
        sgid_index: 0,
        traffic_class: 0,
    };
    s.qp.connect(&ep, s.local.psn, &opts)
        .map_err(|e| format!("Failed to modify QP to RTR/RTS: {}", source_chain(&e)))
}

/// UD: the address handle to the peer.
fn make_ah(s: &mut Session, remote: &Dest, peer: IpAddr) -> Result<(), String> {
    let attr = AhAttr {
        dgid: roce_proto::Gid(remote.gid.to_bytes()),
        hop_limit: 64,
        dmac: mac_of(peer),
        ..AhAttr::default()
    };
    s.ah = Some(
        s.pd.create_ah(&attr)
            .map_err(|e| format!("Failed to create AH: {}", source_chain(&e)))?,
    );
    Ok(())
}

fn post_send(s: &Session, p: &Params, remote: &Dest) -> Result<(), String> {
    let sge = [s.send_mr.sge(0, p.size as u32)];
    let sg: &[Sge] = if p.size == 0 { &[] } else { &sge };
    let mut wr = SendWr::new(SEND_WRID, SendOp::Send, sg).signaled();
    if let Some(ah) = &s.ah {
        wr = wr.ud(UdDest {
            ah: ah.handle(),
            remote_qpn: remote.qpn,
            remote_qkey: UD_QKEY,
        });
    }
    s.qp.post_send(&[wr])
        .map_err(|e| format!("Couldn't post send: {e}"))
}

/// Diagnostics for a run that stopped making progress.
fn stall_hint(s: &Session) -> String {
    let Ok(c) = s.ctx.counters() else {
        return String::new();
    };
    let mut h = format!(
        " [RoCE packets sent {}, received {}",
        c.sent_pkts, c.rcvd_pkts
    );
    if c.rx_icrc_encapsulated > 0 {
        h.push_str(&format!(", {} with a bad ICRC", c.rx_icrc_encapsulated));
        if let Some(hint) = rxmode::icrc_hint(s.rx, c.rx_icrc_encapsulated) {
            h.push_str(&format!(" ({hint})"));
        }
    }
    if c.drop_wrong_peer > 0 {
        h.push_str(&format!(
            ", {} from an unexpected peer GID",
            c.drop_wrong_peer
        ));
    }
    if c.drop_unknown_qp > 0 {
        h.push_str(&format!(
            ", {} for an unknown or not-ready QP",
            c.drop_unknown_qp
        ));
    }
    h.push(']');
    h
}

/// The traffic phase; returns the elapsed time.
fn run_traffic(s: &Session, p: &Params, remote: &Dest, client: bool) -> Result<Duration, String> {
    let expected_len = p.size
        + if p.transport == Transport::Ud {
            GRH_LEN
        } else {
            0
        };
    let want = pattern(p.size);
    let mut routs = p.rx_depth;
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    let mut pending = RECV_WRID;
    let start = Instant::now();
    if client {
        post_send(s, p, remote)?;
        pending |= SEND_WRID;
    }
    let mut wcs = [Wc::default(); 16];
    let mut last_progress = Instant::now();
    let mut idle_polls = 0u32;
    if s.chan.is_some() {
        s.cq.req_notify();
    }
    while scnt < p.iters || rcnt < p.iters {
        let n = s.cq.poll(&mut wcs);
        if n == 0 {
            if last_progress.elapsed() > p.timeout {
                return Err(format!(
                    "no completion for {:.1} s (sent {scnt}, received {rcnt} of {} messages): the peer stopped or \
                     its packets do not reach us{}",
                    p.timeout.as_secs_f64(),
                    p.iters,
                    stall_hint(s)
                ));
            }
            if let Some(ch) = &s.chan {
                // Armed before this poll: an event means a completion arrived since.
                if ch.get_event(Duration::from_millis(100)).is_some() {
                    s.cq.req_notify();
                }
            } else if s.ctx.progress_mode() == ProgressMode::Thread {
                idle_polls += 1;
                // Spin briefly, then sleep: the progress threads (this side's and, on one host, the peer's) need
                // the CPU to move the packets; yielding instead starved them on a 2-core machine (≈1 ms/iter over
                // loopback against ≈0.17 ms/iter with the sleep).
                if idle_polls < 32 {
                    std::hint::spin_loop();
                } else {
                    std::thread::sleep(Duration::from_micros(1));
                }
            }
            // Caller mode: the empty poll itself ran a pass (receive, process, complete); poll again at once.
            continue;
        }
        idle_polls = 0;
        last_progress = Instant::now();
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}{}{}",
                    wc.status.name(),
                    wc.status as u32,
                    wc.wr_id,
                    match wc.status {
                        WcStatus::RetryExcErr =>
                            " (the peer did not acknowledge: gone, or our packets do not reach it)",
                        WcStatus::RnrRetryExcErr => " (the peer has no receive posted)",
                        WcStatus::RemInvReqErr | WcStatus::LocLenErr =>
                            " (message larger than the receive buffer: different -s on the two sides?)",
                        _ => "",
                    },
                    stall_hint(s)
                ));
            }
            match wc.wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    if wc.byte_len as usize != expected_len {
                        return Err(format!(
                            "received a {}-byte message, expected {expected_len} (-s {} on this side; the peer \
                             uses a different -s?)",
                            wc.byte_len, p.size
                        ));
                    }
                    if p.chk {
                        let off = expected_len - p.size;
                        // The message landed in the application's receive buffer: compare a copy of it.
                        let mut got = vec![0u8; p.size];
                        s.recv_buf
                            .read(off, &mut got)
                            .map_err(|_| "the receive buffer is smaller than the message")?;
                        if got != want[..] {
                            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                            return Err(format!(
                                "message {} differs from the pattern at byte {at} (got 0x{:02x}, expected \
                                 0x{:02x})",
                                rcnt + 1,
                                got.get(at).copied().unwrap_or(0),
                                want.get(at).copied().unwrap_or(0)
                            ));
                        }
                    }
                    routs -= 1;
                    if routs <= 1 {
                        post_recvs(s, p, p.rx_depth - routs)?;
                        routs = p.rx_depth;
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}")),
            }
            pending &= !wc.wr_id;
            if scnt < p.iters && pending == 0 {
                post_send(s, p, remote)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    Ok(start.elapsed())
}

fn print_result(p: &Params, dt: Duration) {
    let secs = dt.as_secs_f64();
    let usec = secs * 1e6;
    let bytes = p.size as u64 * u64::from(p.iters) * 2;
    println!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec",
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {secs:.2} seconds = {:.2} usec/iter",
        p.iters,
        usec / f64::from(p.iters)
    );
}

fn connect_tcp(a: &PingpongArgs, host: &str, timeout: Duration) -> Result<TcpStream, String> {
    let addrs: Vec<SocketAddr> = (host, a.port)
        .to_socket_addrs()
        .map_err(|e| format!("resolving {host}: {e}"))?
        .collect();
    let addr = addrs
        .iter()
        .find(|x| a.ip.is_none_or(|ip| ip.is_ipv4() == x.is_ipv4()))
        .or(addrs.first())
        .copied()
        .ok_or_else(|| format!("resolving {host}: no address"))?;
    let step = format!("Couldn't connect to {host}:{}", a.port);
    let domain = socket2::Domain::for_address(addr);
    let sock = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))
        .map_err(io_err(&step))?;
    if let Some(ip) = a.ip {
        sock.bind(&SocketAddr::new(ip, 0).into())
            .map_err(io_err(format!("{step} (binding to --ip {ip})")))?;
    }
    sock.connect_timeout(&addr.into(), timeout)
        .map_err(io_err(&step))?;
    Ok(sock.into())
}

fn client(a: &PingpongArgs, p: &Params, host: &str) -> Result<(), String> {
    let deadline = Instant::now() + p.timeout;
    let mut tcp = connect_tcp(a, host, p.timeout)?;
    let peer = tcp
        .peer_addr()
        .map_err(io_err("TCP peer address"))?
        .ip()
        .to_canonical();
    let local = match a.ip {
        Some(ip) => ip,
        None => tcp
            .local_addr()
            .map_err(io_err("TCP local address"))?
            .ip()
            .to_canonical(),
    };
    let p = &with_port_mtu(p, local, a.link)?;
    let mut s = setup(a, p, local, peer)?;
    println!("{}", address_line("local", &s.local, p.transport));
    write_one(&mut tcp, &s.local.encode(), "Couldn't send local address")?;
    let mut buf = [0u8; RECORD_LEN];
    read_full(&mut tcp, &mut buf, deadline, "Couldn't read remote address")?;
    let remote = Dest::decode(&buf)?;
    let peer = peer_roce_ip(&remote, peer, local, "server")?;
    write_one(&mut tcp, DONE, "Couldn't send \"done\"")?;
    drop(tcp);
    println!("{}", address_line("remote", &remote, p.transport));
    match p.transport {
        Transport::Rc => connect_rc(&s, p, &remote, peer)?,
        Transport::Ud => make_ah(&mut s, &remote, peer)?,
    }
    let dt = run_traffic(&s, p, &remote, true)?;
    print_result(p, dt);
    finish(s);
    Ok(())
}

fn server(a: &PingpongArgs, p: &Params) -> Result<(), String> {
    let bind_ip = a.ip.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let listener = TcpListener::bind((bind_ip, a.port)).map_err(io_err(format!(
        "Couldn't listen to port {} on {bind_ip}",
        a.port
    )))?;
    listener
        .set_nonblocking(true)
        .map_err(io_err("listening socket"))?;
    let t0 = Instant::now();
    let mut tcp = loop {
        match listener.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if t0.elapsed() > p.timeout {
                    return Err(format!(
                        "no client connected to TCP port {} within {:.0} s (--timeout)",
                        a.port,
                        p.timeout.as_secs_f64()
                    ));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("accepting on port {}: {e}", a.port)),
        }
    };
    drop(listener);
    tcp.set_nonblocking(false)
        .map_err(io_err("TCP connection"))?;
    let deadline = Instant::now() + p.timeout;
    let peer = tcp
        .peer_addr()
        .map_err(io_err("TCP peer address"))?
        .ip()
        .to_canonical();
    let local = match a.ip {
        Some(ip) => ip,
        None => tcp
            .local_addr()
            .map_err(io_err("TCP local address"))?
            .ip()
            .to_canonical(),
    };
    let p = &with_port_mtu(p, local, a.link)?;
    let mut s = setup(a, p, local, peer)?;
    println!("{}", address_line("local", &s.local, p.transport));
    let mut buf = [0u8; RECORD_LEN];
    read_full(&mut tcp, &mut buf, deadline, "Couldn't read remote address")?;
    let remote = Dest::decode(&buf)?;
    // Refused before answering: the client then fails reading our record and exits too.
    let peer = peer_roce_ip(&remote, peer, local, "client")?;
    match p.transport {
        Transport::Rc => connect_rc(&s, p, &remote, peer)?,
        Transport::Ud => make_ah(&mut s, &remote, peer)?,
    }
    write_one(&mut tcp, &s.local.encode(), "Couldn't send local address")?;
    let mut done = [0u8; DONE.len()];
    read_full(
        &mut tcp,
        &mut done,
        deadline,
        "reading \"done\" from the client (did it reject our address?)",
    )?;
    drop(tcp);
    println!("{}", address_line("remote", &remote, p.transport));
    let dt = run_traffic(&s, p, &remote, false)?;
    print_result(p, dt);
    finish(s);
    Ok(())
}

/// Tears the session down in order and stops the engine thread, so a `--pcap` file is complete on exit.
fn finish(s: Session) {
    let Session {
        ctx,
        pd,
        cq,
        chan,
        qp,
        send_mr,
        recv_mr,
        ah,
        ..
    } = s;
    drop(ah);
    drop(qp);
    drop((send_mr, recv_mr, cq, chan, pd));
    drop(ctx);
}

/// Entry point of `rocev2 pingpong`.
pub fn run(a: &PingpongArgs) -> ExitCode {
    let p = match Params::from_args(a) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("rocev2 pingpong: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(g) = a.gid_idx {
        eprintln!(
            "rocev2 pingpong: note: -g {g} ignored: a rocev2 port has a single GID (index 0), the IPv4-mapped \
             address of --ip"
        );
    }
    for (flag, given) in [
        ("-l", a.sl.is_some()),
        ("-d", a.ib_dev.is_some()),
        ("-i", a.ib_port.is_some()),
    ] {
        if given {
            eprintln!("rocev2 pingpong: note: {flag} accepted and ignored");
        }
    }
    let r = match &p.server {
        Some(h) => client(a, &p, h),
        None => server(a, &p),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rocev2 pingpong: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_layout() {
        let d = Dest {
            lid: 0,
            qpn: Qpn::new(0x11),
            psn: Psn::new(0x7835f0),
            gid: "::ffff:198.18.0.2".parse().unwrap(),
        };
        let r = d.encode();
        assert_eq!(
            &r[..],
            &b"0000:000011:7835f0:00000000000000000000ffffc6120002\0"[..]
        );
        assert_eq!(Dest::decode(&r), Ok(d));
    }

    #[test]
    fn bad_records_are_errors() {
        for bad in [
            &b"garbage"[..],
            b"0000:000011:7835f0\0",
            b"0000:000011:7835f0:0000\0",
            b"0000:1000000:000000:00000000000000000000ffffc6120002\0",
            b"0000:000011:zz35f0:00000000000000000000ffffc6120002\0",
            b"0000:000011:7835f0:00000000000000000000ffffc6120002:9\0",
            b"\xff\xfe\0",
        ] {
            assert!(Dest::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn gid_check() {
        let ip: IpAddr = "198.18.0.2".parse().unwrap();
        let local: IpAddr = "198.18.0.1".parse().unwrap();
        let mut d = Dest {
            lid: 0,
            qpn: Qpn::new(1),
            psn: Psn::new(1),
            gid: Gid::from_ip(ip),
        };
        assert_eq!(peer_roce_ip(&d, ip, local, "server"), Ok(ip));
        // The GID, not the TCP source, is the RoCE address (one host: TCP from 127.0.0.1, GID 127.0.0.2).
        let other: IpAddr = "198.18.0.9".parse().unwrap();
        d.gid = Gid::from_ip(other);
        assert_eq!(peer_roce_ip(&d, ip, local, "client"), Ok(other));
        d.gid = Gid::ZERO;
        let e = peer_roce_ip(&d, ip, local, "server").unwrap_err();
        assert!(
            e.contains("all-zero") && e.contains("::ffff:198.18.0.2") && e.contains("-g N"),
            "{e}"
        );
        d.gid = "fe80::5054:c6ff:fe12:2".parse().unwrap();
        let e = peer_roce_ip(&d, ip, local, "client").unwrap_err();
        assert!(
            e.contains("fe80::5054:c6ff:fe12:2")
                && e.contains("::ffff:198.18.0.2")
                && e.contains("1 on Linux rxe"),
            "{e}"
        );
    }

    #[test]
    fn address_lines_match_rdma_core() {
        let d = Dest {
            lid: 0,
            qpn: Qpn::new(0x11),
            psn: Psn::new(0xabc),
            gid: "::ffff:198.18.0.1".parse().unwrap(),
        };
        assert_eq!(
            address_line("local", &d, Transport::Rc),
            "  local address:  LID 0x0000, QPN 0x000011, PSN 0x000abc, GID ::ffff:198.18.0.1"
        );
        assert_eq!(
            address_line("remote", &d, Transport::Rc),
            "  remote address: LID 0x0000, QPN 0x000011, PSN 0x000abc, GID ::ffff:198.18.0.1"
        );
        assert_eq!(
            address_line("local", &d, Transport::Ud),
            "  local address:  LID 0x0000, QPN 0x000011, PSN 0x000abc: GID ::ffff:198.18.0.1"
        );
    }
}
