//! `--link xdp` for every front end (`rocev2 perf`, `rocev2 pingpong`, and the `libibverbs.so.1` under
//! `rocev2 run --link xdp`): the AF_XDP link when it can be used; otherwise the UDP link with a line naming the
//! cause (no privilege, no kernel support, a loopback address, another XDP program on the interface), so the run
//! completes; and a refusal when the address belongs to another process (one process per address over AF_XDP,
//! see `claim` in the parent module).

use std::io;
use std::net::IpAddr;
use std::time::Duration;

use super::{XdpConfig, XdpLink};
use crate::LinkError;

/// What [`open_or_explain`] came to.
pub enum XdpChoice {
    /// The AF_XDP link, with the lines to print: `AF_XDP link on IF (N receive queue(s), MODE mode)`, after a
    /// note when the peer's neighbour entry was not resolved in time.
    Xdp(Box<XdpLink>, Vec<String>),
    /// The caller opens its UDP link; the line to print names the cause:
    /// `--link xdp: AF_XDP cannot be used (CAUSE); using the UDP link`.
    Udp(String),
}

/// The error and its sources, joined with ": ".
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Opens an AF_XDP link ([`XdpConfig::new`] of `local`) on the interface that owns `local`; with a `peer`, waits
/// up to `resolve_wait` for the kernel's neighbour entry of it first (frames without one are dropped and
/// retransmitted).
///
/// Returns [`XdpChoice::Udp`] with the cause when AF_XDP cannot be used here: a loopback `local` (`lo` has no
/// neighbour table, and both ends of a loopback run share it), or any failure of [`XdpLink::bind`] but the one
/// below.
///
/// # Errors
///
/// [`LinkError::Io`] of kind [`io::ErrorKind::AddrInUse`] when another process owns UDP 4791 on `local` (a UDP
/// link would not work either: while this process asks for AF_XDP, it is refused rather than put beside it).
pub fn open_or_explain(
    local: IpAddr,
    peer: Option<IpAddr>,
    resolve_wait: Duration,
) -> Result<XdpChoice, LinkError> {
    let fallback = |cause: String| {
        XdpChoice::Udp(format!(
            "--link xdp: AF_XDP cannot be used ({cause}); using the UDP link"
        ))
    };
    if local.is_loopback() {
        return Ok(fallback(format!("on a loopback address ({local})")));
    }
    match XdpLink::bind(XdpConfig::new(local)) {
        Ok(mut l) => {
            let mut lines = Vec::new();
            if let Some(peer) = peer.filter(|p| !p.is_unspecified())
                && !l.resolve(peer, resolve_wait)
            {
                lines.push(format!(
                    "--link xdp: no neighbour entry for {peer} on {} yet; the first frames wait for it",
                    l.interface()
                ));
            }
            lines.push(format!(
                "AF_XDP link on {} ({} receive queue(s), {} mode)",
                l.interface(),
                l.queues(),
                if l.zero_copy() { "zero-copy" } else { "copy" }
            ));
            Ok(XdpChoice::Xdp(Box::new(l), lines))
        }
        Err(LinkError::Io(e)) if e.kind() == io::ErrorKind::AddrInUse => Err(LinkError::Io(e)),
        Err(e) => Ok(fallback(chain(&e))),
    }
}
