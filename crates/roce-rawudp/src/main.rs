//! `rawudp`: raw-UDP baselines for BENCHMARKS.md — what plain kernel UDP sockets achieve on the same path and
//! payload sizes as the RoCE v2 stack's UDP backend.
//!
//! * `rawudp sink ADDR` — receives with `recvmmsg` (64 per call) until idle, prints received Mpps / Gb/s as JSON.
//! * `rawudp send ADDR --size N --seconds S` — unconnected socket, DF set (as `roce_link::UdpLink`), `sendmmsg`
//!   of `--batch` datagrams of N payload bytes; prints sent Mpps / Gb/s (UDP payload bits) as JSON.
//! * `rawudp pong ADDR` — busy-poll echo server (non-blocking `recvfrom` spin, `sendto` back).
//! * `rawudp ping ADDR --size N --iters N` — busy-poll client; prints RTT min / typical (median) / avg / p99 /
//!   p99.9 in µs as JSON (HDR histogram, 3 significant digits).
//!
//! * `rawudp link-send ADDR --local IP --size N --seconds S` — the same traffic through `roce_link::UdpLink`: a
//!   RoCE v2 SEND ONLY frame (N payload bytes, built once with roce-wire) is copied into each `tx_buf` slot,
//!   committed and flushed in bursts, as the engine driver does; datagrams are N + 16 bytes (BTH + ICRC). Shows
//!   the backend's cost over raw `sendmmsg`.
//!
//! Every number is measured by this process; nothing is derived from configuration.

use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

#[derive(Parser)]
#[command(
    name = "rawudp",
    about = "Raw-UDP throughput and ping-pong baselines (JSON output)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Receive datagrams on ADDR until `--idle` passes without one; report the received rate.
    Sink {
        /// Local address to bind, e.g. 198.18.1.2:4791.
        addr: SocketAddr,
        /// Stop after this long without a datagram once traffic started (seconds).
        #[arg(long, default_value_t = 1.0)]
        idle: f64,
        /// Give up if nothing arrives within this many seconds.
        #[arg(long, default_value_t = 60.0)]
        max_wait: f64,
    },
    /// Send N-byte datagrams to ADDR with sendmmsg for S seconds; report the sent rate.
    Send {
        /// Destination address, e.g. 198.18.1.2:4791.
        addr: SocketAddr,
        /// UDP payload bytes per datagram.
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Duration in seconds.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Datagrams per sendmmsg call.
        #[arg(long, default_value_t = 32)]
        batch: usize,
        /// Local address to bind (default: any, kernel-chosen port).
        #[arg(long)]
        bind: Option<SocketAddr>,
    },
    /// Send RoCE v2 frames of N payload bytes through roce_link::UdpLink for S seconds; report the sent rate.
    LinkSend {
        /// Destination address (its port is the RoCE port the frames carry), e.g. 198.18.1.2:4791.
        addr: SocketAddr,
        /// Local address to bind the link to (must be specific: it is in the frame and its ICRC).
        #[arg(long)]
        local: std::net::IpAddr,
        /// Payload bytes per packet (after BTH).
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Duration in seconds.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// Frames per flush (UdpLink burst).
        #[arg(long, default_value_t = 32)]
        batch: usize,
    },
    /// Busy-poll echo server on ADDR.
    Pong {
        /// Local address to bind.
        addr: SocketAddr,
        /// Exit after this many seconds.
        #[arg(long, default_value_t = 120.0)]
        max_secs: f64,
        /// Exit after this many seconds without a datagram once traffic started.
        #[arg(long, default_value_t = 2.0)]
        idle: f64,
    },
    /// Busy-poll ping-pong client against a `pong` at ADDR; report RTT percentiles.
    Ping {
        /// Address of the pong server.
        addr: SocketAddr,
        /// UDP payload bytes per datagram (≥ 8: carries a sequence number).
        #[arg(long, default_value_t = 64)]
        size: usize,
        /// Measured round trips.
        #[arg(long, default_value_t = 20_000)]
        iters: u64,
        /// Unmeasured round trips first.
        #[arg(long, default_value_t = 2_000)]
        warmup: u64,
        /// Local address to bind (default: any).
        #[arg(long)]
        bind: Option<SocketAddr>,
    },
}

fn ctx(e: io::Error, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn setopt(s: &Socket, level: libc::c_int, name: libc::c_int, val: libc::c_int) -> io::Result<()> {
    // SAFETY: `s` is open; the value is a live c_int whose exact size is passed.
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

/// A UDP socket for `family_of`'s family, DF set (IP_PMTUDISC_DO), large buffers, optionally bound.
fn udp_socket(family_of: SocketAddr, bind: Option<SocketAddr>) -> io::Result<Socket> {
    let s = Socket::new(
        Domain::for_address(family_of),
        Type::DGRAM,
        Some(Protocol::UDP),
    )
    .map_err(|e| ctx(e, "socket"))?;
    let _ = s.set_send_buffer_size(4 << 20);
    let _ = s.set_recv_buffer_size(64 << 20);
    if family_of.is_ipv4() {
        setopt(
            &s,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
        .map_err(|e| ctx(e, "IP_MTU_DISCOVER"))?;
    } else {
        setopt(
            &s,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
        .map_err(|e| ctx(e, "IPV6_MTU_DISCOVER"))?;
    }
    if let Some(b) = bind {
        s.bind(&SockAddr::from(b))
            .map_err(|e| ctx(e, format_args!("bind {b}")))?;
    }
    Ok(s)
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the provided struct.
    let ru = unsafe {
        let mut ru = MaybeUninit::<libc::rusage>::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 * 1e-6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn send(
    addr: SocketAddr,
    size: usize,
    seconds: f64,
    batch: usize,
    bind: Option<SocketAddr>,
) -> io::Result<serde_json::Value> {
    let s = udp_socket(addr, bind)?;
    let dst = SockAddr::from(addr);
    let batch = batch.clamp(1, 1024);
    let payload = vec![0xa5u8; size];
    let mut iov: Vec<libc::iovec> = (0..batch)
        .map(|_| libc::iovec {
            iov_base: payload.as_ptr() as *mut libc::c_void,
            iov_len: size,
        })
        .collect();
    // SAFETY: mmsghdr is plain data (integers and pointers); all-zero is valid.
    let mut msgs: Vec<libc::mmsghdr> = (0..batch).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
        m.msg_hdr.msg_name = dst.as_ptr() as *mut libc::c_void;
        m.msg_hdr.msg_namelen = dst.len();
        m.msg_hdr.msg_iov = v;
        m.msg_hdr.msg_iovlen = 1;
    }
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let (mut pkts, mut calls, mut errors) = (0u64, 0u64, 0u64);
    let mut last_err = None;
    while Instant::now() < end {
        // SAFETY: `msgs` point at `dst`, `iov` and `payload`, all alive and unmoved for the call.
        let r = unsafe { libc::sendmmsg(s.as_raw_fd(), msgs.as_mut_ptr(), batch as u32, 0) };
        calls += 1;
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN | libc::ENOBUFS | libc::EINTR) => {}
                _ => {
                    errors += 1;
                    last_err = Some(e.to_string());
                    if errors > 1000 {
                        return Err(ctx(e, format_args!("sendmmsg to {addr}")));
                    }
                }
            }
        } else {
            pkts += r as u64;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    Ok(serde_json::json!({
        "mode": "send",
        "addr": addr.to_string(),
        "size": size,
        "batch": batch,
        "seconds": secs,
        "packets": pkts,
        "sendmmsg_calls": calls,
        "errors": errors,
        "last_error": last_err,
        "mpps": pkts as f64 / secs / 1e6,
        "gbps": pkts as f64 * size as f64 * 8.0 / secs / 1e9,
        "cpu_seconds": cpu,
        "mpps_per_cpu_second": if cpu > 0.0 { pkts as f64 / cpu / 1e6 } else { 0.0 },
    }))
}

/// A RoCE v2 RC SEND ONLY frame from `local` to `addr` with `size` payload bytes (IP ID 0, DF, ECT(0)).
fn roce_frame(local: std::net::IpAddr, addr: SocketAddr, size: usize) -> io::Result<Vec<u8>> {
    use roce_wire::*;
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "local and ADDR differ in family",
        )
    };
    let ip = match (local, addr.ip()) {
        (std::net::IpAddr::V4(s), std::net::IpAddr::V4(d)) => IpRepr::Ipv4(Ipv4Repr {
            src_addr: s,
            dst_addr: d,
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: 0,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
        }),
        (std::net::IpAddr::V6(s), std::net::IpAddr::V6(d)) => IpRepr::Ipv6(Ipv6Repr {
            src_addr: s,
            dst_addr: d,
            dscp: 26,
            ecn: Ecn::Ect0,
            flow_label: 0,
            next_header: 17,
            hop_limit: 64,
        }),
        _ => return Err(bad()),
    };
    let repr = RoceRepr {
        eth: EthernetRepr {
            src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
            dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
            vlan: None,
            ethertype: if local.is_ipv4() {
                EtherType::IPV4
            } else {
                EtherType::IPV6
            },
        },
        ip,
        udp: UdpRepr {
            src_port: udp_sport(Qpn::new(0x11), Qpn::new(0x12), 0),
            dst_port: addr.port(),
        },
        bth: BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad_count: ((4 - size % 4) % 4) as u8,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: Qpn::new(0x12),
            ack_req: false,
            psn: Psn::new(0),
        },
        ext: ExtRepr::NONE,
        payload_len: size,
    };
    let mut buf = vec![0u8; 14 + 40 + 8 + 12 + size + 8];
    let payload = vec![0xa5u8; size];
    let n = repr
        .emit_with_payload(&mut buf, &payload)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("emit: {e:?}")))?;
    buf.truncate(n);
    Ok(buf)
}

fn link_send(
    addr: SocketAddr,
    local: std::net::IpAddr,
    size: usize,
    seconds: f64,
    batch: usize,
) -> io::Result<serde_json::Value> {
    use roce_link::{Instant as LinkInstant, Link, LinkError, UdpConfig, UdpLink};
    let frame = roce_frame(local, addr, size)?;
    let mut cfg = UdpConfig::new(local);
    // Bind the link's receive socket to a port the sink does not use (the sink may share the address).
    cfg.port = addr.port().wrapping_add(1);
    cfg.peer_port = addr.port();
    cfg.mtu = frame.len().max(14 + 1500);
    cfg.burst = batch.clamp(1, 1024);
    let mut link = UdpLink::bind(cfg).map_err(|e| io::Error::other(format!("{e}: {e:?}")))?;
    let err = |e: LinkError| io::Error::other(format!("{e}: {e:?}"));
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(seconds);
    let now = LinkInstant::ZERO;
    let mut flushes = 0u64;
    while Instant::now() < end {
        for _ in 0..batch {
            match link.tx_buf(now) {
                Ok(b) => b[..frame.len()].copy_from_slice(&frame),
                Err(LinkError::Busy) => break,
                Err(e) => return Err(err(e)),
            }
            link.tx_commit(now, frame.len()).map_err(err)?;
        }
        link.flush(now).map_err(err)?;
        flushes += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let st = link.stats();
    let pkts = st.tx_frames;
    Ok(serde_json::json!({
        "mode": "link-send",
        "addr": addr.to_string(),
        "size": size,
        "datagram_bytes": size + 16 + (4 - size % 4) % 4,
        "batch": batch,
        "seconds": secs,
        "packets": pkts,
        "flushes": flushes,
        "tx_busy": st.tx_busy,
        "tx_errors": st.tx_errors,
        "queued_at_end": link.queued(),
        "mpps": pkts as f64 / secs / 1e6,
        "gbps": pkts as f64 * size as f64 * 8.0 / secs / 1e9,
        "cpu_seconds": cpu,
        "mpps_per_cpu_second": if cpu > 0.0 { pkts as f64 / cpu / 1e6 } else { 0.0 },
    }))
}

fn sink(addr: SocketAddr, idle: f64, max_wait: f64) -> io::Result<serde_json::Value> {
    let s = udp_socket(addr, Some(addr))?;
    s.set_read_timeout(Some(Duration::from_millis(50)))
        .map_err(|e| ctx(e, "SO_RCVTIMEO"))?;
    const N: usize = 64;
    const CAP: usize = 65536;
    let mut bufs = vec![0u8; N * CAP];
    let mut iov: Vec<libc::iovec> = (0..N)
        .map(|i| libc::iovec {
            // SAFETY: slot `i` of `bufs` (CAP bytes) is in bounds.
            iov_base: unsafe { bufs.as_mut_ptr().add(i * CAP) }.cast(),
            iov_len: CAP,
        })
        .collect();
    // SAFETY: mmsghdr is plain data; all-zero is valid.
    let mut msgs: Vec<libc::mmsghdr> = (0..N).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (m, v) in msgs.iter_mut().zip(iov.iter_mut()) {
        m.msg_hdr.msg_iov = v;
        m.msg_hdr.msg_iovlen = 1;
    }
    let begin = Instant::now();
    let (mut pkts, mut bytes) = (0u64, 0u64);
    let mut first: Option<Instant> = None;
    let mut last = Instant::now();
    let mut cpu0 = 0.0;
    loop {
        // SAFETY: `msgs` point into `iov`/`bufs`, alive and unmoved for the call.
        let r = unsafe {
            libc::recvmmsg(
                s.as_raw_fd(),
                msgs.as_mut_ptr(),
                N as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        let now = Instant::now();
        if r > 0 {
            if first.is_none() {
                first = Some(now);
                cpu0 = cpu_seconds();
            }
            last = now;
            pkts += r as u64;
            for m in &msgs[..r as usize] {
                bytes += u64::from(m.msg_len);
            }
        } else {
            let e = io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) {
                return Err(ctx(e, format_args!("recvmmsg on {addr}")));
            }
        }
        match first {
            Some(_) if now.duration_since(last).as_secs_f64() > idle => break,
            None if now.duration_since(begin).as_secs_f64() > max_wait => break,
            _ => {}
        }
    }
    let secs = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
    let rate = |x: f64| if secs > 0.0 { x / secs } else { 0.0 };
    Ok(serde_json::json!({
        "mode": "sink",
        "addr": addr.to_string(),
        "packets": pkts,
        "bytes": bytes,
        "seconds": secs,
        "mpps": rate(pkts as f64) / 1e6,
        "gbps": rate(bytes as f64 * 8.0) / 1e9,
        "cpu_seconds": if first.is_some() { cpu_seconds() - cpu0 } else { 0.0 },
    }))
}

fn pong(addr: SocketAddr, max_secs: f64, idle: f64) -> io::Result<serde_json::Value> {
    let s = udp_socket(addr, Some(addr))?;
    s.set_nonblocking(true).map_err(|e| ctx(e, "O_NONBLOCK"))?;
    let mut buf = [MaybeUninit::<u8>::uninit(); 65536];
    let start = Instant::now();
    let mut last: Option<Instant> = None;
    let mut echoed = 0u64;
    loop {
        match s.recv_from(&mut buf) {
            Ok((n, from)) => {
                // SAFETY: recv_from initialised the first `n` bytes.
                let data = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
                loop {
                    match s.send_to(data, &from) {
                        Ok(_) => break,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                        Err(e) => return Err(ctx(e, "sendto")),
                    }
                }
                echoed += 1;
                last = Some(Instant::now());
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let now = Instant::now();
                if now.duration_since(start).as_secs_f64() > max_secs
                    || last.is_some_and(|l| now.duration_since(l).as_secs_f64() > idle)
                {
                    break;
                }
                std::hint::spin_loop();
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ctx(e, format_args!("recvfrom on {addr}"))),
        }
    }
    Ok(serde_json::json!({ "mode": "pong", "addr": addr.to_string(), "echoed": echoed }))
}

fn ping(
    addr: SocketAddr,
    size: usize,
    iters: u64,
    warmup: u64,
    bind: Option<SocketAddr>,
) -> io::Result<serde_json::Value> {
    let size = size.max(8);
    let s = udp_socket(addr, bind)?;
    s.connect(&SockAddr::from(addr))
        .map_err(|e| ctx(e, format_args!("connect {addr}")))?;
    s.set_nonblocking(true).map_err(|e| ctx(e, "O_NONBLOCK"))?;
    let mut out = vec![0u8; size];
    let mut inb = [MaybeUninit::<u8>::uninit(); 65536];
    let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3)
        .map_err(|e| io::Error::other(format!("histogram: {e}")))?;
    let (mut sum_ns, mut lost) = (0u128, 0u64);
    let timeout = Duration::from_millis(200);
    let mut seq = 0u64;
    let mut done = 0u64;
    while done < warmup + iters {
        seq += 1;
        out[..8].copy_from_slice(&seq.to_le_bytes());
        let t0 = Instant::now();
        loop {
            match s.send(&out) {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(ctx(e, format_args!("send to {addr}"))),
            }
        }
        let rtt = loop {
            match s.recv(&mut inb) {
                Ok(n) if n >= 8 => {
                    // SAFETY: recv initialised the first `n` ≥ 8 bytes.
                    let b = unsafe { std::slice::from_raw_parts(inb.as_ptr().cast::<u8>(), 8) };
                    if u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) == seq {
                        break Some(t0.elapsed());
                    }
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if t0.elapsed() > timeout {
                        break None;
                    }
                    std::hint::spin_loop();
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ctx(e, format_args!("recv from {addr}"))),
            }
        };
        let Some(rtt) = rtt else {
            lost += 1;
            if lost > 100 {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no echo from {addr} (is `rawudp pong` running?)"),
                ));
            }
            continue;
        };
        done += 1;
        if done > warmup {
            let ns = rtt.as_nanos() as u64;
            sum_ns += u128::from(ns);
            hist.saturating_record(ns.max(1));
        }
    }
    let us = |ns: u64| ns as f64 / 1e3;
    Ok(serde_json::json!({
        "mode": "ping",
        "addr": addr.to_string(),
        "size": size,
        "iters": iters,
        "warmup": warmup,
        "lost": lost,
        "rtt_us": {
            "min": us(hist.min()),
            "typical": us(hist.value_at_quantile(0.5)),
            "avg": sum_ns as f64 / iters.max(1) as f64 / 1e3,
            "p99": us(hist.value_at_quantile(0.99)),
            "p99_9": us(hist.value_at_quantile(0.999)),
            "max": us(hist.max()),
        },
    }))
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Sink {
            addr,
            idle,
            max_wait,
        } => sink(addr, idle, max_wait),
        Cmd::Send {
            addr,
            size,
            seconds,
            batch,
            bind,
        } => send(addr, size, seconds, batch, bind),
        Cmd::LinkSend {
            addr,
            local,
            size,
            seconds,
            batch,
        } => link_send(addr, local, size, seconds, batch),
        Cmd::Pong {
            addr,
            max_secs,
            idle,
        } => pong(addr, max_secs, idle),
        Cmd::Ping {
            addr,
            size,
            iters,
            warmup,
            bind,
        } => ping(addr, size, iters, warmup, bind),
    };
    match r {
        Ok(v) => println!("{v}"),
        Err(e) => {
            eprintln!("rawudp: {e}");
            std::process::exit(1);
        }
    }
}
