//! Out-of-band connection setup over TCP for `rocev2 perf`: each side tells the other its QP numbers and PSNs, GID,
//! MAC, the remote buffer (rkey / VA / length) and MTU, then the two sides use the connection as a barrier and to
//! pass results.
//!
//! # Wire format (rocev2 ↔ rocev2, version 1)
//!
//! Newline-terminated JSON objects, one per message, each with `"proto": "rocev2-perf"` and `"v": 1`. The client
//! (the side given an address) speaks first. A message of another protocol or version is refused with a clear
//! error.
//!
//! # Wire format (perftest compatibility)
//!
//! [`PerftestExchange`] speaks perftest's own exchange (fixed-size binary and text messages, no `-R`;
//! `docs/spec/INTEROP.md` §5.2), so that `rocev2 perf --perftest-compat` pairs with `ib_send_bw`,
//! `ib_write_bw`, `ib_read_bw`, `ib_atomic_bw`, `ib_send_lat` and `ib_write_lat`.
//!
//! # Bounded waits
//!
//! Connecting uses a connect timeout, accepting an accept timeout, and every read a read timeout, so a bad or
//! absent peer ends in an error naming the address and the step, never in a hang.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Protocol tag of every message.
const PROTO: &str = "rocev2-perf";
/// Version of the message set.
const VERSION: u64 = 1;

/// Errors of the out-of-band exchange.
#[derive(Debug)]
pub enum OobError {
    /// Connecting, accepting, reading or writing failed.
    Io {
        /// What was being done (e.g. "connecting to 127.0.0.1:18515").
        step: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A wait ran out: no client connected, or no complete message arrived, within `after`.
    Timeout {
        /// What was being waited for (e.g. "waiting for `hello` from 127.0.0.1:40000").
        step: String,
        /// How long it waited.
        after: Duration,
        /// Which limit that was (`"--timeout"`, or the fixed limit of a step of the run).
        limit: &'static str,
        /// Bytes of an unfinished message received by then (a peer that dribbles bytes).
        partial: usize,
    },
    /// The server's host name did not resolve (no server was tried).
    Resolve {
        /// The name given.
        host: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// The peer closed the connection.
    Closed(String),
    /// The peer sent something that is not a valid message of this protocol.
    Protocol(String),
    /// The peer is not `rocev2 perf` (its first bytes show it): the message says what it is and what to do.
    Foreign(String),
}

impl std::fmt::Display for OobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OobError::Io { step, source } => write!(f, "{step}: {source}"),
            OobError::Timeout {
                step,
                after,
                limit,
                partial,
            } => {
                write!(f, "{step}: timed out after {} ({limit})", secs(*after))?;
                if *partial > 0 {
                    write!(f, "; {partial} bytes of an unfinished message had arrived")?;
                }
                Ok(())
            }
            OobError::Resolve { host, source } => {
                write!(f, "resolving the server name `{host}`: {source}")
            }
            OobError::Closed(step) => write!(f, "{step}: the peer closed the connection"),
            OobError::Protocol(m) => write!(f, "out-of-band protocol error: {m}"),
            OobError::Foreign(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for OobError {}

/// `d` for a message: whole seconds as "10 s", otherwise with one decimal ("0.5 s").
fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if d.subsec_millis() == 0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

/// Who sent `first` (the first bytes of what should be a rocev2-perf message, which is a JSON object: `{` first,
/// never a NUL), or `None` while it can still be one. perftest's exchange starts with its version string in 16
/// bytes padded with NULs (`6.06`, `docs/spec/INTEROP.md` §5.2 step 1): named, with the flag that pairs with it.
fn foreign_peer(first: &[u8], step: &str) -> Option<String> {
    let b = *first.first()?;
    if b == b'{' {
        return None;
    }
    let digits = first
        .iter()
        .take_while(|c| c.is_ascii_digit() || **c == b'.')
        .count();
    if b.is_ascii_digit() && first.get(digits) == Some(&0) {
        let version = String::from_utf8_lossy(&first[..digits]);
        return Some(format!(
            "{step}: the peer speaks perftest's exchange (it announced perftest version {version}), not rocev2 \
             perf's: to pair with perftest's programs (ib_send_bw, ib_write_bw, ...), start this side with \
             --perftest-compat"
        ));
    }
    if digits > 0 && digits == first.len() && digits < 16 {
        return None; // perhaps a version string still arriving
    }
    let shown: String = first
        .iter()
        .take(24)
        .flat_map(|c| std::ascii::escape_default(*c))
        .map(char::from)
        .collect();
    Some(format!(
        "{step}: the peer is not rocev2 perf (its first bytes are \"{shown}\"); is another program using that \
         TCP port? (perftest's programs pair with --perftest-compat)"
    ))
}

/// Whether a socket error means a read or write timeout ran out (`SO_RCVTIMEO` / `SO_SNDTIMEO` report `EAGAIN`).
fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Largest out-of-band message accepted, in bytes (rocev2-perf messages are well under 4 KiB).
const MAX_MSG: usize = 1 << 20;

fn io(step: impl Into<String>) -> impl FnOnce(std::io::Error) -> OobError {
    let step = step.into();
    move |source| OobError::Io { step, source }
}

/// Which exchange format to speak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OobFormat {
    /// Our own versioned JSON-lines format (rocev2 ↔ rocev2).
    #[default]
    Rocev2V1,
}

/// One QP's connection data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpRecord {
    /// QP number.
    pub qpn: u32,
    /// First PSN this QP sends.
    pub psn: u32,
}

/// Everything one side tells the other before the run.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerInfo {
    /// QPs, index-aligned with the peer's.
    pub qps: Vec<QpRecord>,
    /// Port GID (16 bytes).
    pub gid: [u8; 16],
    /// Port MAC.
    pub mac: [u8; 6],
    /// Remote key of the buffer the peer may access.
    pub rkey: u32,
    /// Virtual address of that buffer. Peer-supplied: this side only ever sends it back in RETHs (wrapping
    /// arithmetic), and the peer's responder bounds-checks it; it never indexes local memory.
    pub va: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Path MTU in bytes this side wants (the two sides use the minimum).
    pub mtu: u32,
    /// Test parameters (client → server: the server follows the client's; server → client: echoed).
    pub params: Value,
}

impl PeerInfo {
    fn to_json(&self) -> Value {
        json!({
            "qps": self.qps.iter().map(|q| json!({"qpn": q.qpn, "psn": q.psn})).collect::<Vec<_>>(),
            "gid": hex(&self.gid),
            "mac": hex(&self.mac),
            "rkey": self.rkey,
            "va": self.va,
            "len": self.len,
            "mtu": self.mtu,
            "params": self.params,
        })
    }

    fn from_json(v: &Value) -> Result<PeerInfo, OobError> {
        let bad = |f: &str| OobError::Protocol(format!("missing or invalid field `{f}`"));
        let u = |f: &str| v.get(f).and_then(Value::as_u64).ok_or_else(|| bad(f));
        let qps = v
            .get("qps")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("qps"))?
            .iter()
            .map(|q| {
                let qpn = q
                    .get("qpn")
                    .and_then(Value::as_u64)
                    .filter(|&x| x <= 0xFF_FFFF);
                let psn = q
                    .get("psn")
                    .and_then(Value::as_u64)
                    .filter(|&x| x <= 0xFF_FFFF);
                match (qpn, psn) {
                    (Some(qpn), Some(psn)) => Ok(QpRecord {
                        qpn: qpn as u32,
                        psn: psn as u32,
                    }),
                    _ => Err(bad("qps[].qpn/psn")),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let gid = unhex::<16>(v.get("gid").and_then(Value::as_str).unwrap_or(""))
            .ok_or_else(|| bad("gid"))?;
        let mac = unhex::<6>(v.get("mac").and_then(Value::as_str).unwrap_or(""))
            .ok_or_else(|| bad("mac"))?;
        Ok(PeerInfo {
            qps,
            gid,
            mac,
            rkey: u32::try_from(u("rkey")?).map_err(|_| bad("rkey"))?,
            va: u("va")?,
            len: u("len")?,
            mtu: u32::try_from(u("mtu")?).map_err(|_| bad("mtu"))?,
            params: v.get("params").cloned().unwrap_or(Value::Null),
        })
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// The exchange seam: our format today, perftest's later.
pub trait Exchange {
    /// Sends `mine` and returns the peer's record (client sends first, server answers).
    fn exchange(&mut self, mine: &PeerInfo) -> Result<PeerInfo, OobError>;
    /// A barrier carrying a small JSON payload each way; returns the peer's payload. `wait` bounds the wait.
    fn sync(&mut self, tag: &str, payload: Value, wait: Duration) -> Result<Value, OobError>;
}

/// A connected out-of-band channel.
#[derive(Debug)]
pub struct Oob {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    is_client: bool,
    peer: SocketAddr,
    read_timeout: Duration,
    format: OobFormat,
}

impl Oob {
    /// Client: connects to `host:port` within `timeout` (each resolved address in turn), from `bind` if given.
    pub fn connect(
        host: &str,
        port: u16,
        bind: Option<IpAddr>,
        timeout: Duration,
    ) -> Result<Oob, OobError> {
        Oob::new(tcp_connect(host, port, bind, timeout)?, true, timeout)
    }

    /// Server: waits up to `accept_timeout` for one client on `listener` (`None`: no limit); each later read or
    /// write waits at most `timeout` (a whole message at most that long, see `recv_msg`).
    pub fn accept(
        listener: &TcpListener,
        accept_timeout: Option<Duration>,
        timeout: Duration,
    ) -> Result<Oob, OobError> {
        Oob::new(tcp_accept(listener, accept_timeout)?, false, timeout)
    }

    fn new(s: TcpStream, is_client: bool, timeout: Duration) -> Result<Oob, OobError> {
        let peer = s.peer_addr().map_err(io("peer address"))?;
        let _ = s.set_nodelay(true);
        s.set_read_timeout(Some(timeout))
            .map_err(io("setting the read timeout"))?;
        s.set_write_timeout(Some(timeout))
            .map_err(io("setting the write timeout"))?;
        let writer = s.try_clone().map_err(io("cloning the socket"))?;
        Ok(Oob {
            reader: BufReader::new(s),
            writer,
            is_client,
            peer,
            read_timeout: timeout,
            format: OobFormat::Rocev2V1,
        })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Our address on the connection (the IP the RoCE link binds to).
    pub fn local_addr(&self) -> Result<SocketAddr, OobError> {
        self.writer.local_addr().map_err(io("local address"))
    }

    /// The format spoken.
    pub fn format(&self) -> OobFormat {
        self.format
    }

    /// Sends one message of `kind` (a peer that does not read it within `--timeout` is a [`OobError::Timeout`]).
    pub fn send_msg(&mut self, kind: &str, body: Value) -> Result<(), OobError> {
        let msg = json!({"proto": PROTO, "v": VERSION, "kind": kind, "body": body});
        let mut line = msg.to_string();
        line.push('\n');
        let step = format!("sending `{kind}` to {}", self.peer);
        self.writer
            .write_all(line.as_bytes())
            .map_err(|e| match is_timeout(&e) {
                true => OobError::Timeout {
                    step,
                    after: self.read_timeout,
                    limit: "--timeout",
                    partial: 0,
                },
                false => io(step)(e),
            })
    }

    /// Which limit a wait of `wait` is, for messages.
    fn limit_name(&self, wait: Duration) -> &'static str {
        if wait == self.read_timeout {
            "--timeout"
        } else {
            "the run's limit for this step"
        }
    }

    /// Reads one `\n`-terminated line of at most [`MAX_MSG`] bytes within `wait` in all: a peer that dribbles
    /// bytes or never ends its line gets a [`OobError::Timeout`] at the deadline, not a hang or unbounded memory.
    fn read_line_bounded(&mut self, wait: Duration, step: &str) -> Result<String, OobError> {
        let deadline = Instant::now() + wait;
        let mut line = Vec::new();
        let limit = self.limit_name(wait);
        let timeout = |line: &Vec<u8>| OobError::Timeout {
            step: step.to_owned(),
            after: wait,
            limit,
            partial: line.len(),
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timeout(&line));
            }
            let _ = self.reader.get_ref().set_read_timeout(Some(left));
            let chunk = match self.reader.fill_buf() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if is_timeout(&e) => return Err(timeout(&line)),
                Err(e) => return Err(io(step)(e)),
            };
            if chunk.is_empty() {
                return Err(OobError::Closed(step.to_string()));
            }
            let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            line.extend_from_slice(&chunk[..take]);
            self.reader.consume(take);
            // Not one of ours: say who it is now rather than wait for a newline that never comes.
            if let Some(m) = foreign_peer(&line, step) {
                return Err(OobError::Foreign(m));
            }
            if line.len() > MAX_MSG {
                return Err(OobError::Protocol(format!(
                    "{step}: message longer than {MAX_MSG} bytes"
                )));
            }
            if done {
                return String::from_utf8(line)
                    .map_err(|_| OobError::Protocol(format!("{step}: message is not UTF-8")));
            }
        }
    }

    /// Receives one message, which must be of `kind` (an `error` message from the peer becomes an error), waiting
    /// at most `wait`.
    pub fn recv_msg(&mut self, kind: &str, wait: Duration) -> Result<Value, OobError> {
        let step = format!("waiting for `{kind}` from {}", self.peer);
        let line = self.read_line_bounded(wait, &step);
        let _ = self
            .reader
            .get_ref()
            .set_read_timeout(Some(self.read_timeout));
        let line = line?;
        let v: Value = serde_json::from_str(line.trim_end())
            .map_err(|e| OobError::Protocol(format!("{step}: not a rocev2-perf message ({e})")))?;
        if v.get("proto").and_then(Value::as_str) != Some(PROTO) {
            return Err(OobError::Protocol(format!(
                "{step}: peer does not speak {PROTO}"
            )));
        }
        match v.get("v").and_then(Value::as_u64) {
            Some(VERSION) => {}
            other => {
                return Err(OobError::Protocol(format!(
                    "{step}: peer speaks version {other:?}, this side version {VERSION}"
                )));
            }
        }
        let got = v.get("kind").and_then(Value::as_str).unwrap_or("");
        if got == "error" {
            let m = v
                .pointer("/body/message")
                .and_then(Value::as_str)
                .unwrap_or("?");
            return Err(OobError::Protocol(format!(
                "the peer reported an error: {m}"
            )));
        }
        if got != kind {
            return Err(OobError::Protocol(format!("{step}: got `{got}` instead")));
        }
        Ok(v.get("body").cloned().unwrap_or(Value::Null))
    }

    /// Tells the peer this side failed (best effort), so it exits with the reason instead of a timeout.
    pub fn send_error(&mut self, message: &str) {
        let _ = self.send_msg("error", json!({ "message": message }));
    }

    /// Client: the first message (parameters) without the QP data; server: receives it. A server that drops the
    /// connection without a word on the first message is what perftest's programs do with ours: the error says so.
    pub fn hello(&mut self, params: Option<Value>) -> Result<Value, OobError> {
        let t = self.read_timeout;
        match params {
            Some(p) => {
                self.send_msg("hello", p.clone())?;
                self.recv_msg("hello", t).map_err(|e| match e {
                    OobError::Io { .. } | OobError::Closed(_) => OobError::Foreign(format!(
                        "{e} (a perftest server, ib_write_bw and the like, does that: start this side with \
                         --perftest-compat to pair with it)"
                    )),
                    e => e,
                })
            }
            None => {
                let p = self.recv_msg("hello", t)?;
                self.send_msg("hello", p.clone())?;
                Ok(p)
            }
        }
    }
}

impl Exchange for Oob {
    fn exchange(&mut self, mine: &PeerInfo) -> Result<PeerInfo, OobError> {
        let t = self.read_timeout;
        let v = if self.is_client {
            self.send_msg("setup", mine.to_json())?;
            self.recv_msg("setup", t)?
        } else {
            let v = self.recv_msg("setup", t)?;
            self.send_msg("setup", mine.to_json())?;
            v
        };
        PeerInfo::from_json(&v)
    }

    fn sync(&mut self, tag: &str, payload: Value, wait: Duration) -> Result<Value, OobError> {
        if self.is_client {
            self.send_msg(tag, payload)?;
            self.recv_msg(tag, wait)
        } else {
            let v = self.recv_msg(tag, wait)?;
            self.send_msg(tag, payload)?;
            Ok(v)
        }
    }
}

/// Connects to `host:port` within `timeout` (each resolved address in turn), from `bind` if given.
fn tcp_connect(
    host: &str,
    port: u16,
    bind: Option<IpAddr>,
    timeout: Duration,
) -> Result<TcpStream, OobError> {
    let step = format!("connecting to {host}:{port}");
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|source| OobError::Resolve {
            host: host.to_owned(),
            source,
        })?
        .collect();
    let mut last = None;
    for a in addrs {
        let r = match bind {
            Some(ip) => connect_from(ip, a, timeout),
            None => TcpStream::connect_timeout(&a, timeout),
        };
        match r {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) if is_timeout(&e) => Err(OobError::Timeout {
            step,
            after: timeout,
            limit: "--timeout",
            partial: 0,
        }),
        last => Err(OobError::Io {
            step,
            source: last.unwrap_or_else(|| std::io::Error::other("no address")),
        }),
    }
}

/// Waits up to `timeout` for one client on `listener` (`None`: for as long as it takes, as perftest's server); the
/// accepted stream is blocking.
fn tcp_accept(listener: &TcpListener, timeout: Option<Duration>) -> Result<TcpStream, OobError> {
    let local = listener.local_addr().map_err(io("listening"))?;
    let step = format!("waiting for a client on {local}");
    listener.set_nonblocking(true).map_err(io(step.clone()))?;
    let t0 = Instant::now();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).map_err(io(step.clone()))?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(t) = timeout
                    && t0.elapsed() >= t
                {
                    return Err(OobError::Timeout {
                        step,
                        after: t,
                        limit: "--timeout",
                        partial: 0,
                    });
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(io(step)(e)),
        }
    }
}

/// `connect` from a chosen local address (socket2: bind, then connect with a timeout).
fn connect_from(ip: IpAddr, to: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let domain = socket2::Domain::for_address(to);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.bind(&SocketAddr::new(ip, 0).into())?;
    s.connect_timeout(&to.into(), timeout)?;
    Ok(s.into())
}

// ------------------------------------------------------------------------------------------------ perftest

/// The version string this side announces to perftest (`docs/spec/INTEROP.md` §5.2 step 1; perftest
/// 4.5-0.17 announces "6.06" and refuses peers below 5.70).
pub const PERFTEST_VERSION: &str = "6.06";
/// Size of perftest's version message: the string NUL-padded to 16 bytes.
pub const PT_VERSION_LEN: usize = 16;
/// Size of perftest's QP record with a GID (`KEY_MSG_SIZE_GID`): 107 characters and a NUL.
pub const PT_RECORD_LEN: usize = 108;
/// Lowest peer version perftest (and this side) accepts.
const PT_MIN_VERSION: f64 = 5.70;
/// From this peer version on, the cycle-buffer and cache-line sizes are exchanged.
const PT_SYS_DATA_VERSION: f64 = 5.32;
/// From this peer version on, the iteration count of a bw report is 8 bytes (4 before).
const PT_ITERS64_VERSION: f64 = 5.33;

/// perftest's per-QP record (`pingpong_dest` as sent by `ethernet_write_keys`), with a GID.
///
/// Text form (all lowercase hex): `LLLL:OOOO:QQQQQQ:PPPPPP:RRRRRRRR:VVVVVVVVVVVVVVVV:` then the 16 GID bytes in wire
/// order as `hh:` each, then `SSSSSSSS:` and a NUL: 108 bytes (`docs/spec/INTEROP.md` §5.2 step 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PtRecord {
    /// LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA READ / atomic operations this side accepts as responder (the peer's `max_rd_atomic`).
    pub out_reads: u32,
    /// QP number (24 bits).
    pub qpn: u32,
    /// First PSN this QP sends (24 bits).
    pub psn: u32,
    /// R_Key of the buffer the peer may access.
    pub rkey: u32,
    /// Virtual address of that buffer (the peer's RDMA target).
    pub vaddr: u64,
    /// Port GID in wire order.
    pub gid: [u8; 16],
    /// SRQ number (0: none).
    pub srqn: u32,
}

impl PtRecord {
    /// The 108-byte text record. Fields wider than their column (a LID over 0xffff cannot happen; QPN/PSN are
    /// masked to 24 bits) never overflow it.
    pub fn encode(&self) -> [u8; PT_RECORD_LEN] {
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid,
            self.out_reads & 0xffff,
            self.qpn & 0xff_ffff,
            self.psn & 0xff_ffff,
            self.rkey,
            self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; PT_RECORD_LEN];
        let n = s.len().min(PT_RECORD_LEN - 1);
        out[..n].copy_from_slice(&s.as_bytes()[..n]);
        out
    }

    /// Parses a 108-byte record: 23 `:`-terminated hexadecimal fields (LID, out_reads, QPN, PSN, RKey, VAddr,
    /// 16 GID bytes, SRQN), as perftest's `ethernet_read_keys` splits it. Errors name the bad field.
    pub fn decode(b: &[u8]) -> Result<PtRecord, OobError> {
        if b.len() != PT_RECORD_LEN {
            return Err(OobError::Protocol(format!(
                "perftest QP record of {} bytes, expected {PT_RECORD_LEN}",
                b.len()
            )));
        }
        let text_len = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        let text = std::str::from_utf8(&b[..text_len])
            .map_err(|_| OobError::Protocol("perftest QP record is not ASCII text".into()))?;
        let mut fields = text.split(':');
        let mut next = |name: &str, max_digits: usize| -> Result<u64, OobError> {
            let f = fields.next().unwrap_or("");
            if f.is_empty() || f.len() > max_digits {
                return Err(OobError::Protocol(format!(
                    "perftest QP record: bad {name} field `{f}` in `{text}`"
                )));
            }
            u64::from_str_radix(f, 16).map_err(|_| {
                OobError::Protocol(format!(
                    "perftest QP record: {name} `{f}` is not hexadecimal"
                ))
            })
        };
        let lid = next("LID", 4)? as u16;
        let out_reads = next("out_reads", 8)? as u32;
        let qpn = next("QPN", 6)? as u32;
        let psn = next("PSN", 6)? as u32;
        let rkey = next("RKey", 8)? as u32;
        let vaddr = next("VAddr", 16)?;
        let mut gid = [0u8; 16];
        for g in gid.iter_mut() {
            *g = next("GID byte", 2)? as u8;
        }
        let srqn = next("SRQN", 8)? as u32;
        Ok(PtRecord {
            lid,
            out_reads,
            qpn,
            psn,
            rkey,
            vaddr,
            gid,
            srqn,
        })
    }
}

/// perftest's bandwidth report (`bw_report_data` as `xchg_bw_reports` sends it): five 8-byte big-endian values,
/// each exchanged on its own. The bandwidths are in the sender's unit (MB/s of 2^20 bytes, or Gb/s with
/// `--report_gbits`); the message rate in Mpps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PtBwReport {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations (all QPs).
    pub iters: u64,
    /// Peak bandwidth.
    pub bw_peak: f64,
    /// Average bandwidth.
    pub bw_avg: f64,
    /// Average message rate (Mpps).
    pub msg_rate: f64,
}

impl PtBwReport {
    /// The five 8-byte big-endian values, in exchange order.
    pub fn encode(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// The inverse of [`PtBwReport::encode`].
    pub fn decode(v: &[[u8; 8]; 5]) -> PtBwReport {
        let f = |b: [u8; 8]| f64::from_bits(u64::from_be_bytes(b));
        PtBwReport {
            size: u64::from_be_bytes(v[0]),
            iters: u64::from_be_bytes(v[1]),
            bw_peak: f(v[2]),
            bw_avg: f(v[3]),
            msg_rate: f(v[4]),
        }
    }
}

/// The 16-byte version message: `v` NUL-padded (truncated to 15 characters).
pub fn pt_encode_version(v: &str) -> [u8; PT_VERSION_LEN] {
    let mut out = [0u8; PT_VERSION_LEN];
    let n = v.len().min(PT_VERSION_LEN - 1);
    out[..n].copy_from_slice(&v.as_bytes()[..n]);
    out
}

/// The text of a version message and its numeric value as C's `atof` reads it (the leading decimal number; 0
/// when there is none).
pub fn pt_decode_version(b: &[u8]) -> (String, f64) {
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let text = String::from_utf8_lossy(&b[..n]).into_owned();
    let num: String = text
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    (text.clone(), num.parse().unwrap_or(0.0))
}

/// The 2-byte MTU message: the `ibv_mtu` enum value (1 = 256 … 5 = 4096) as one ASCII digit, then NUL.
pub fn pt_encode_mtu(mtu_enum: u8) -> [u8; 2] {
    [b'0' + mtu_enum.min(9), 0]
}

/// The `ibv_mtu` enum value of a 2-byte MTU message, `None` unless it is 1..=5 (perftest then keeps its own).
pub fn pt_decode_mtu(b: &[u8; 2]) -> Option<u8> {
    match b[0] {
        c @ b'1'..=b'5' if b[1] == 0 || !b[1].is_ascii_digit() => Some(c - b'0'),
        _ => None,
    }
}

/// perftest's out-of-band TCP exchange (without `-R`), as the client (the side given an address) or the server.
///
/// Every step is symmetric: the client writes its message, then reads the peer's of the same size; the server reads,
/// then writes. Each message goes out in one `write` (perftest reads it with one `read` that must return the whole
/// message). The order of steps is the caller's (it depends on the test; see `perf::compat`); the steps are:
/// [`versions`](PerftestExchange::versions), [`sys_data`](PerftestExchange::sys_data),
/// [`mtu`](PerftestExchange::mtu), then [`handshake`](PerftestExchange::handshake) a number of times, optionally
/// [`bw_reports`](PerftestExchange::bw_reports), and [`close`](PerftestExchange::close).
/// Facts: `docs/spec/INTEROP.md` §5.2, checked against `captures/perftest_tcp_exchange.pcap` and
/// perftest v4.5-0.17 `src/perftest_communication.c`.
///
/// This is not an [`Exchange`]: perftest's conversation is a fixed sequence of fixed-size binary and text messages
/// that carries no parameters and no tags, so it cannot carry `sync(tag, json)`; the compat runner drives it
/// step by step instead.
#[derive(Debug)]
pub struct PerftestExchange {
    stream: TcpStream,
    is_client: bool,
    peer: SocketAddr,
    timeout: Duration,
    remote_version: f64,
}

impl PerftestExchange {
    /// Client: connects to `host:port` within `timeout`, from `bind` if given.
    pub fn connect(
        host: &str,
        port: u16,
        bind: Option<IpAddr>,
        timeout: Duration,
    ) -> Result<PerftestExchange, OobError> {
        PerftestExchange::new(tcp_connect(host, port, bind, timeout)?, true, timeout)
    }

    /// Server: waits up to `accept_timeout` for one client on `listener` (`None`: no limit); reads then time out
    /// after `timeout`.
    pub fn accept(
        listener: &TcpListener,
        accept_timeout: Option<Duration>,
        timeout: Duration,
    ) -> Result<PerftestExchange, OobError> {
        PerftestExchange::new(tcp_accept(listener, accept_timeout)?, false, timeout)
    }

    fn new(
        stream: TcpStream,
        is_client: bool,
        timeout: Duration,
    ) -> Result<PerftestExchange, OobError> {
        let peer = stream.peer_addr().map_err(io("peer address"))?;
        let _ = stream.set_nodelay(true);
        stream
            .set_write_timeout(Some(timeout))
            .map_err(io("setting the write timeout"))?;
        Ok(PerftestExchange {
            stream,
            is_client,
            peer,
            timeout,
            remote_version: 0.0,
        })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Our address on the connection.
    pub fn local_addr(&self) -> Result<SocketAddr, OobError> {
        self.stream.local_addr().map_err(io("local address"))
    }

    /// The read timeout of the setup steps.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The peer's version as a number (after [`versions`](PerftestExchange::versions)).
    pub fn remote_version(&self) -> f64 {
        self.remote_version
    }

    fn write_msg(&mut self, what: &str, msg: &[u8]) -> Result<(), OobError> {
        let step = format!("sending the perftest {what} to {}", self.peer);
        self.stream.write_all(msg).map_err(io(step))
    }

    fn read_msg(&mut self, what: &str, buf: &mut [u8], wait: Duration) -> Result<(), OobError> {
        let step = format!(
            "waiting for the perftest {what} ({} bytes) from {}",
            buf.len(),
            self.peer
        );
        self.stream
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .map_err(io(step.clone()))?;
        match self.stream.read_exact(buf) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(OobError::Closed(step)),
            Err(e) if is_timeout(&e) => Err(OobError::Timeout {
                step,
                after: wait,
                limit: if wait == self.timeout {
                    "--timeout"
                } else {
                    "the run's limit for this step"
                },
                partial: 0,
            }),
            Err(e) => Err(io(step)(e)),
        }
    }

    /// One symmetric step: the client writes then reads, the server reads then writes; `N` bytes each way.
    fn xchg<const N: usize>(
        &mut self,
        what: &str,
        mine: &[u8; N],
        wait: Duration,
    ) -> Result<[u8; N], OobError> {
        let mut theirs = [0u8; N];
        if self.is_client {
            self.write_msg(what, mine)?;
            self.read_msg(what, &mut theirs, wait)?;
        } else {
            self.read_msg(what, &mut theirs, wait)?;
            self.write_msg(what, mine)?;
        }
        Ok(theirs)
    }

    /// Step 1: swaps [`PERFTEST_VERSION`] for the peer's; refuses a peer below 5.70 as perftest does. Returns the
    /// peer's version text.
    pub fn versions(&mut self) -> Result<String, OobError> {
        let t = self.timeout;
        let theirs = self.xchg("version", &pt_encode_version(PERFTEST_VERSION), t)?;
        let (text, num) = pt_decode_version(&theirs);
        if num < PT_MIN_VERSION {
            return Err(OobError::Protocol(format!(
                "the peer announced version `{}` (perftest needs at least {PT_MIN_VERSION}); is it perftest (without -R)?",
                text.escape_default()
            )));
        }
        self.remote_version = num;
        Ok(text)
    }

    /// Step 2: swaps the cycle-buffer (page) size and the cache-line size (4-byte big-endian each, in two
    /// messages) and returns the maxima of both sides, which both then use. Skipped (own values) for a peer below
    /// 5.32.
    pub fn sys_data(&mut self, cycle_buffer: u32, cache_line: u32) -> Result<(u32, u32), OobError> {
        if self.remote_version < PT_SYS_DATA_VERSION {
            return Ok((cycle_buffer, cache_line));
        }
        let t = self.timeout;
        let c =
            u32::from_be_bytes(self.xchg("cycle buffer size", &cycle_buffer.to_be_bytes(), t)?);
        let l = u32::from_be_bytes(self.xchg("cache line size", &cache_line.to_be_bytes(), t)?);
        Ok((cycle_buffer.max(c), cache_line.max(l)))
    }

    /// Step 3: swaps the `ibv_mtu` enum values (1..=5) and returns the smaller (ours when the peer's is invalid).
    pub fn mtu(&mut self, mtu_enum: u8) -> Result<u8, OobError> {
        let t = self.timeout;
        let theirs = self.xchg("MTU", &pt_encode_mtu(mtu_enum), t)?;
        Ok(match pt_decode_mtu(&theirs) {
            Some(r) => r.min(mtu_enum),
            None => mtu_enum,
        })
    }

    /// One QP-record exchange (the setup data, and later the same record again as a barrier), waiting at most
    /// `wait` for the peer's.
    pub fn handshake(&mut self, mine: &PtRecord, wait: Duration) -> Result<PtRecord, OobError> {
        let theirs = self.xchg("QP record", &mine.encode(), wait)?;
        PtRecord::decode(&theirs)
    }

    /// The five report exchanges of the bw tests (8 bytes each; the iteration count is 4 bytes for a peer below
    /// 5.33).
    pub fn bw_reports(&mut self, mine: &PtBwReport) -> Result<PtBwReport, OobError> {
        let t = self.timeout;
        let m = mine.encode();
        let mut r = [[0u8; 8]; 5];
        r[0] = self.xchg("bw report (size)", &m[0], t)?;
        if self.remote_version >= PT_ITERS64_VERSION {
            r[1] = self.xchg("bw report (iterations)", &m[1], t)?;
        } else {
            let it = (mine.iters.min(u64::from(u32::MAX)) as u32).to_be_bytes();
            let got = self.xchg("bw report (iterations)", &it, t)?;
            r[1] = u64::from(u32::from_be_bytes(got)).to_be_bytes();
        }
        r[2] = self.xchg("bw report (peak)", &m[2], t)?;
        r[3] = self.xchg("bw report (average)", &m[3], t)?;
        r[4] = self.xchg("bw report (message rate)", &m[4], t)?;
        Ok(PtBwReport::decode(&r))
    }

    /// `ctx_close_connection`: a last record exchange, then `done\0`; the peer's `done` is read if it comes within
    /// a second (so that closing does not reset the connection), then the connection is closed.
    pub fn close(&mut self, mine: &PtRecord) -> Result<(), OobError> {
        let t = self.timeout;
        self.handshake(mine, t)?;
        self.write_msg("done", b"done\0")?;
        let mut done = [0u8; 5];
        let _ = self.read_msg("done", &mut done, Duration::from_secs(1));
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(q: u32) -> PeerInfo {
        PeerInfo {
            qps: vec![QpRecord {
                qpn: q,
                psn: 0xabcdef,
            }],
            gid: [1; 16],
            mac: [2, 0, 0, 0, 0, 9],
            rkey: 77,
            va: 1 << 40,
            len: 4096,
            mtu: 1024,
            params: json!({"test": "write-bw"}),
        }
    }

    #[test]
    fn exchange_round_trip_and_sync() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let srv = std::thread::spawn(move || {
            let mut o = Oob::accept(&l, Some(Duration::from_secs(5)), Duration::from_secs(5))
                .expect("accept");
            assert_eq!(o.hello(None).expect("hello")["x"], 1);
            let peer = o.exchange(&info(0x22)).expect("exchange");
            assert_eq!(peer, info(0x11));
            o.sync("done", json!({"ok": true}), Duration::from_secs(5))
                .expect("sync")
        });
        let mut c = Oob::connect("127.0.0.1", port, None, Duration::from_secs(5)).expect("connect");
        c.hello(Some(json!({"x": 1}))).expect("hello");
        assert_eq!(c.exchange(&info(0x11)).expect("exchange"), info(0x22));
        let v = c
            .sync("done", json!({"n": 5}), Duration::from_secs(5))
            .expect("sync");
        assert_eq!(v["ok"], true);
        assert_eq!(srv.join().expect("server")["n"], 5);
    }

    #[test]
    fn refused_and_silent_peers_fail_fast() {
        // Nobody listens on a port we just released.
        let port = TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("a")
            .port();
        let t0 = Instant::now();
        let e = Oob::connect("127.0.0.1", port, None, Duration::from_secs(2)).expect_err("refused");
        assert!(e.to_string().contains("connecting to 127.0.0.1"), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(3));
        // A peer that accepts but never answers: the read times out.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("a").port();
        let mut c =
            Oob::connect("127.0.0.1", port, None, Duration::from_millis(300)).expect("connect");
        let t0 = Instant::now();
        let e = c.hello(Some(json!({}))).expect_err("timeout");
        assert!(t0.elapsed() < Duration::from_secs(2), "{e}");
        drop(l);
    }

    #[test]
    fn wrong_protocol_is_refused() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("a").port();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            s.write_all(b"6.06\0\0\0\0\0\0\0\0\0\0\0\0\n")
                .expect("write");
            std::thread::sleep(Duration::from_millis(200));
        });
        let mut c = Oob::connect("127.0.0.1", port, None, Duration::from_secs(2)).expect("connect");
        let e = c.hello(Some(json!({}))).expect_err("protocol");
        // perftest's version string: named, with the flag that pairs with it (issue #18 item 3).
        assert!(matches!(e, OobError::Foreign(_)), "{e}");
        assert!(
            e.to_string().contains("perftest version 6.06")
                && e.to_string().contains("--perftest-compat"),
            "{e}"
        );
        srv.join().expect("server");
    }
}

#[cfg(test)]
mod perftest_tests {
    use super::*;

    /// The client's and the server's QP records of `captures/perftest_tcp_exchange.pcap` (ib_write_bw, rxe).
    const CLIENT_REC: &[u8; 108] = b"0000:0001:000016:280036:0000079d:00007f8671394000:00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:02:00000000:\0";
    const SERVER_REC: &[u8; 108] = b"0000:0001:000016:280036:00000768:00007f6625c13000:00:00:00:00:00:00:00:00:00:00:ff:ff:c6:12:00:03:00000000:\0";

    fn mapped(ip: [u8; 4]) -> [u8; 16] {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&ip);
        g
    }

    #[test]
    fn qp_record_matches_the_capture_byte_for_byte() {
        let r = PtRecord::decode(CLIENT_REC).expect("decode");
        assert_eq!(
            r,
            PtRecord {
                lid: 0,
                out_reads: 1,
                qpn: 0x16,
                psn: 0x280036,
                rkey: 0x79d,
                vaddr: 0x7f86_7139_4000,
                gid: mapped([198, 18, 0, 2]),
                srqn: 0,
            }
        );
        assert_eq!(&r.encode(), CLIENT_REC);
        let s = PtRecord::decode(SERVER_REC).expect("decode");
        assert_eq!(s.rkey, 0x768);
        assert_eq!(s.gid, mapped([198, 18, 0, 3]));
        assert_eq!(&s.encode(), SERVER_REC);
        // Extreme values keep the fixed width.
        let big = PtRecord {
            lid: 0xffff,
            out_reads: 0x80,
            qpn: 0xff_ffff,
            psn: 0xff_ffff,
            rkey: u32::MAX,
            vaddr: u64::MAX,
            gid: [0xab; 16],
            srqn: u32::MAX,
        };
        let e = big.encode();
        assert_eq!(e[107], 0);
        assert_eq!(e[106], b':');
        assert_eq!(PtRecord::decode(&e).expect("decode"), big);
    }

    #[test]
    fn bad_records_are_errors_not_panics() {
        assert!(PtRecord::decode(&CLIENT_REC[..59]).is_err());
        let mut b = *CLIENT_REC;
        b[0] = b'x';
        assert!(PtRecord::decode(&b).is_err());
        let mut b = *CLIENT_REC;
        b[50] = 0; // cut inside the GID
        let e = PtRecord::decode(&b).expect_err("truncated");
        assert!(e.to_string().contains("GID"), "{e}");
        assert!(PtRecord::decode(&[0xffu8; 108]).is_err());
        assert!(PtRecord::decode(&[0u8; 108]).is_err());
    }

    #[test]
    fn small_messages_match_the_capture() {
        assert_eq!(&pt_encode_version("6.06"), b"6.06\0\0\0\0\0\0\0\0\0\0\0\0");
        assert_eq!(
            pt_decode_version(b"6.06\0\0\0\0\0\0\0\0\0\0\0\0"),
            ("6.06".to_string(), 6.06)
        );
        assert_eq!(pt_decode_version(b"5.6\0"), ("5.6".to_string(), 5.6));
        assert_eq!(
            pt_decode_version(b"{\"proto\":1}"),
            ("{\"proto\":1}".to_string(), 0.0)
        );
        assert_eq!(4096u32.to_be_bytes(), [0, 0, 0x10, 0]);
        assert_eq!(64u32.to_be_bytes(), *b"\0\0\0@");
        assert_eq!(&pt_encode_mtu(3), b"3\0");
        assert_eq!(pt_decode_mtu(b"3\0"), Some(3));
        assert_eq!(pt_decode_mtu(b"5\0"), Some(5));
        assert_eq!(pt_decode_mtu(b"9\0"), None);
        assert_eq!(pt_decode_mtu(b"\0\0"), None);
    }

    #[test]
    fn bw_report_matches_the_capture() {
        // Client → server values of the capture: size 65536, 5 iterations, then three big-endian doubles.
        let wire: [[u8; 8]; 5] = [
            *b"\0\0\0\0\0\x01\0\0",
            *b"\0\0\0\0\0\0\0\x05",
            *b"@\"\xc5i\xe4\x1f\xbe#",
            *b"@\"\xc5i\xd9/\x82\xcc",
            *b"?#\xae\xd7[,\xc9\xf7",
        ];
        let r = PtBwReport::decode(&wire);
        assert_eq!(r.size, 65536);
        assert_eq!(r.iters, 5);
        assert!((r.bw_peak - 9.386).abs() < 0.01, "{r:?}");
        assert!(r.bw_avg > 9.38 && r.bw_avg < r.bw_peak, "{r:?}");
        assert!(r.msg_rate > 0.0001 && r.msg_rate < 0.001, "{r:?}");
        assert_eq!(r.encode(), wire);
    }

    include!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/common/perftest_capture.rs"
    ));

    #[test]
    fn the_whole_captured_conversation_decodes_and_reencodes() {
        let m = perftest_capture();
        let sizes: Vec<(bool, usize)> = m.iter().map(|(c, b)| (*c, b.len())).collect();
        let mut want = vec![];
        for n in [16, 4, 4, 2, 108, 108, 108, 108, 8, 8, 8, 8, 8, 108, 5] {
            want.push((true, n));
            want.push((false, n));
        }
        // The server's `done` is written before the client's.
        let l = want.len();
        want.swap(l - 2, l - 1);
        assert_eq!(sizes, want);
        for (_, b) in &m {
            match b.len() {
                108 => assert_eq!(&PtRecord::decode(b).expect("record").encode()[..], &b[..]),
                16 => assert_eq!(pt_decode_version(b).1, 6.06),
                2 => assert_eq!(pt_decode_mtu(&[b[0], b[1]]), Some(3)),
                5 => assert_eq!(&b[..], b"done\0"),
                _ => {}
            }
        }
    }

    #[test]
    fn exchange_steps_over_tcp() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let t = Duration::from_secs(5);
        let srv = std::thread::spawn(move || {
            let mut x = PerftestExchange::accept(&l, Some(t), t).expect("accept");
            assert_eq!(x.versions().expect("versions"), "6.06");
            assert_eq!(x.sys_data(4096, 128).expect("sys"), (8192, 128));
            assert_eq!(x.mtu(3).expect("mtu"), 3);
            let srec = PtRecord::decode(SERVER_REC).expect("rec");
            let c = x.handshake(&srec, t).expect("handshake");
            let rep = x
                .bw_reports(&PtBwReport {
                    size: 1,
                    iters: 2,
                    bw_peak: 0.0,
                    bw_avg: 0.0,
                    msg_rate: 0.0,
                })
                .expect("reports");
            x.close(&srec).expect("close");
            (c, rep)
        });
        let mut x = PerftestExchange::connect("127.0.0.1", port, None, t).expect("connect");
        x.versions().expect("versions");
        assert_eq!(x.sys_data(8192, 64).expect("sys"), (8192, 128));
        assert_eq!(x.mtu(5).expect("mtu"), 3);
        let crec = PtRecord::decode(CLIENT_REC).expect("rec");
        assert_eq!(x.handshake(&crec, t).expect("hs").rkey, 0x768);
        let mine = PtBwReport {
            size: 65536,
            iters: 5000,
            bw_peak: 1.5,
            bw_avg: 1.25,
            msg_rate: 0.002,
        };
        assert_eq!(x.bw_reports(&mine).expect("reports").iters, 2);
        x.close(&crec).expect("close");
        let (c, rep) = srv.join().expect("server");
        assert_eq!(c, crec);
        assert_eq!(rep, mine);
    }

    #[test]
    fn old_or_foreign_peers_are_refused() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        let srv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let mut b = [0u8; 16];
            s.read_exact(&mut b).expect("read");
            s.write_all(&pt_encode_version("5.60")).expect("write");
        });
        let t = Duration::from_secs(5);
        let mut x = PerftestExchange::connect("127.0.0.1", port, None, t).expect("connect");
        let e = x.versions().expect_err("old");
        assert!(e.to_string().contains("5.60"), "{e}");
        srv.join().expect("server");
    }
}
