//! Out-of-band connection setup over TCP for `rocev2 perf`: each side tells the other its QP numbers and PSNs, GID,
//! MAC, the remote buffer (rkey / VA / length) and MTU, then the two sides use the connection as a barrier and to
//! pass results.
//!
//! # Wire format (rocev2 ↔ rocev2, version 1)
//!
//! Newline-terminated JSON objects, one per message, each with `"proto": "rocev2-perf"` and `"v": 1`. The client
//! (the side given an address) speaks first. A message of another protocol or version is refused with a clear
//! error. perftest's own exchange (fixed-size text records, `../shared/interop/README.md`) is a different
//! [`OobFormat`]; the [`Exchange`] trait is the seam where it will plug in.
//!
//! # Bounded waits
//!
//! Connecting uses a connect timeout, accepting an accept timeout, and every read a read timeout, so a bad or
//! absent peer ends in an error naming the address and the step, never in a hang.

use std::io::{BufRead, BufReader, Write};
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
    /// The peer closed the connection.
    Closed(String),
    /// The peer sent something that is not a valid message of this protocol.
    Protocol(String),
}

impl std::fmt::Display for OobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OobError::Io { step, source } => write!(f, "{step}: {source}"),
            OobError::Closed(step) => write!(f, "{step}: the peer closed the connection"),
            OobError::Protocol(m) => write!(f, "out-of-band protocol error: {m}"),
        }
    }
}

impl std::error::Error for OobError {}

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
    /// Virtual address of that buffer.
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
        let step = format!("connecting to {host}:{port}");
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(io(step.clone()))?
            .collect();
        let mut last = None;
        for a in addrs {
            let r = match bind {
                Some(ip) => connect_from(ip, a, timeout),
                None => TcpStream::connect_timeout(&a, timeout),
            };
            match r {
                Ok(s) => return Oob::new(s, true, timeout),
                Err(e) => last = Some(e),
            }
        }
        Err(OobError::Io {
            step,
            source: last.unwrap_or_else(|| std::io::Error::other("no address")),
        })
    }

    /// Server: waits up to `timeout` for one client on `listener`.
    pub fn accept(listener: &TcpListener, timeout: Duration) -> Result<Oob, OobError> {
        let local = listener.local_addr().map_err(io("listening"))?;
        let step = format!("waiting for a client on {local}");
        listener.set_nonblocking(true).map_err(io(step.clone()))?;
        let t0 = Instant::now();
        loop {
            match listener.accept() {
                Ok((s, _)) => {
                    s.set_nonblocking(false).map_err(io(step.clone()))?;
                    return Oob::new(s, false, timeout);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if t0.elapsed() >= timeout {
                        return Err(OobError::Io {
                            step,
                            source: std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                "no client connected in time",
                            ),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(io(step)(e)),
            }
        }
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

    /// Sends one message of `kind`.
    pub fn send_msg(&mut self, kind: &str, body: Value) -> Result<(), OobError> {
        let msg = json!({"proto": PROTO, "v": VERSION, "kind": kind, "body": body});
        let mut line = msg.to_string();
        line.push('\n');
        let step = format!("sending `{kind}` to {}", self.peer);
        self.writer.write_all(line.as_bytes()).map_err(io(step))
    }

    /// Receives one message, which must be of `kind` (an `error` message from the peer becomes an error), waiting
    /// at most `wait`.
    pub fn recv_msg(&mut self, kind: &str, wait: Duration) -> Result<Value, OobError> {
        let step = format!("waiting for `{kind}` from {}", self.peer);
        let _ = self.reader.get_ref().set_read_timeout(Some(wait));
        let mut line = String::new();
        let n = self.reader.read_line(&mut line);
        let _ = self
            .reader
            .get_ref()
            .set_read_timeout(Some(self.read_timeout));
        match n {
            Ok(0) => return Err(OobError::Closed(step)),
            Ok(_) => {}
            Err(e) => return Err(io(step)(e)),
        }
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

    /// Client: the first message (parameters) without the QP data; server: receives it.
    pub fn hello(&mut self, params: Option<Value>) -> Result<Value, OobError> {
        let t = self.read_timeout;
        match params {
            Some(p) => {
                self.send_msg("hello", p.clone())?;
                self.recv_msg("hello", t)
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

/// `connect` from a chosen local address (socket2: bind, then connect with a timeout).
fn connect_from(ip: IpAddr, to: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    let domain = socket2::Domain::for_address(to);
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    s.bind(&SocketAddr::new(ip, 0).into())?;
    s.connect_timeout(&to.into(), timeout)?;
    Ok(s.into())
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
            let mut o = Oob::accept(&l, Duration::from_secs(5)).expect("accept");
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
        assert!(matches!(e, OobError::Protocol(_)), "{e}");
        srv.join().expect("server");
    }
}
