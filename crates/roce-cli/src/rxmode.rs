//! `--rx auto|packet|socket` of `rocev2 pingpong` and `rocev2 perf`: where the UDP link's received frames come
//! from, and the one rule that resolves `auto`.
//!
//! Linux rxe numbers the IPv4 identification of its packets and the ICRC covers that field (`ROCEV2.md §3`), so
//! its frames verify only against the real IP header: [`RxMode::Packet`] (`AF_PACKET`, needs `CAP_NET_RAW`) reads
//! whole frames. [`RxMode::Socket`] reads the UDP socket and rebuilds the header with IPv4 ID 0 + DF, which is what
//! rocev2 writes. `auto` picks `socket` when the peer's address is on this host (loopback or one of our own
//! addresses: no foreign kernel stack can be there, and such frames travel over `lo`, which a packet socket on the
//! address's interface does not see) and `packet` otherwise; when `AF_PACKET` is not permitted it falls back to
//! `socket` with a warning.

use std::net::IpAddr;

use clap::ValueEnum;
use roce_link::RxMode;

/// `--rx`: where received frames come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RxArg {
    /// `packet` unless the peer is on this host, falling back to `socket` without CAP_NET_RAW.
    Auto,
    /// AF_PACKET: real IP headers, needed for Linux rxe peers (root / CAP_NET_RAW).
    Packet,
    /// The UDP socket: enough for rocev2 peers, no privileges.
    Socket,
}

/// The hint for received frames that failed the ICRC check in socket mode.
pub const PACKET_HINT: &str =
    "a sender that numbers its IPv4 IDs, like Linux rxe, needs --rx packet";

/// The receive mode `arg` asks for, given whether the peer's address is on this host.
pub fn choose(arg: RxArg, peer_is_local: bool) -> RxMode {
    match arg {
        RxArg::Packet => RxMode::Packet,
        RxArg::Socket => RxMode::Socket,
        RxArg::Auto if peer_is_local => RxMode::Socket,
        RxArg::Auto => RxMode::Packet,
    }
}

/// Whether `ip` is an address of this host (loopback, or configured on one of its interfaces).
pub fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback() || roce_link::udp::interface_of(ip).is_ok()
}

/// Whether `e` or one of its sources says that `AF_PACKET` needs `CAP_NET_RAW` (the `roce_link` bind error).
fn lacks_cap_net_raw(e: &dyn std::error::Error) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if c.to_string().contains("CAP_NET_RAW") {
            return true;
        }
        cur = c.source();
    }
    false
}

/// Opens a device with `open` in the mode `arg` resolves to for `peer`; returns it and the mode in use. With
/// `auto`, a packet-mode open refused for lack of `CAP_NET_RAW` is retried in socket mode after a warning on
/// stderr prefixed by `tool`.
///
/// # Errors
/// The error of the (last) `open`.
pub fn open<T, E: std::error::Error>(
    arg: RxArg,
    peer: IpAddr,
    tool: &str,
    mut open: impl FnMut(RxMode) -> Result<T, E>,
) -> Result<(T, RxMode), E> {
    let want = choose(arg, is_local(peer));
    match open(want) {
        Ok(t) => Ok((t, want)),
        Err(e) if arg == RxArg::Auto && want == RxMode::Packet && lacks_cap_net_raw(&e) => {
            eprintln!(
                "{tool}: warning: AF_PACKET receive not permitted, using the UDP socket; packets from Linux rxe \
                 will fail the ICRC check (run as root or with CAP_NET_RAW)"
            );
            open(RxMode::Socket).map(|t| (t, RxMode::Socket))
        }
        Err(e) => Err(e),
    }
}

/// [`PACKET_HINT`] when frames failed the ICRC check (`icrc_bad` > 0) in socket mode.
pub fn icrc_hint(rx: RxMode, icrc_bad: u64) -> Option<&'static str> {
    (rx == RxMode::Socket && icrc_bad > 0).then_some(PACKET_HINT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[derive(Debug)]
    struct E(&'static str);
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {}

    #[test]
    fn auto_is_socket_for_a_local_peer_and_packet_otherwise() {
        assert_eq!(choose(RxArg::Auto, true), RxMode::Socket);
        assert_eq!(choose(RxArg::Auto, false), RxMode::Packet);
        for local in [false, true] {
            assert_eq!(choose(RxArg::Packet, local), RxMode::Packet);
            assert_eq!(choose(RxArg::Socket, local), RxMode::Socket);
        }
    }

    #[test]
    fn loopback_is_local_and_a_documentation_address_is_not() {
        assert!(is_local(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        assert!(is_local(IpAddr::V4(Ipv4Addr::new(127, 0, 9, 2))));
        assert!(is_local("::1".parse().expect("::1")));
        // TEST-NET-1 (RFC 5737) is never configured on a test host.
        assert!(!is_local(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77))));
    }

    #[test]
    fn auto_falls_back_to_socket_only_when_cap_net_raw_is_missing() {
        let remote = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 77));
        let denied = |rx: RxMode| match rx {
            RxMode::Packet => Err(E("AF_PACKET socket (needs CAP_NET_RAW: run as root)")),
            RxMode::Socket => Ok(7),
        };
        assert_eq!(
            open(RxArg::Auto, remote, "t", denied).expect("fallback"),
            (7, RxMode::Socket)
        );
        // An explicit `packet` is not overridden.
        assert!(open(RxArg::Packet, remote, "t", denied).is_err());
        // Another error is not retried.
        let mut tries = Vec::new();
        let r = open(RxArg::Auto, remote, "t", |rx| {
            tries.push(rx);
            Err::<(), _>(E("Address in use"))
        });
        assert!(r.is_err());
        assert_eq!(tries, [RxMode::Packet]);
        // A local peer opens in socket mode at once.
        let mut tries = Vec::new();
        let r = open(RxArg::Auto, IpAddr::V4(Ipv4Addr::LOCALHOST), "t", |rx| {
            tries.push(rx);
            Ok::<_, E>(())
        });
        assert_eq!(r.expect("socket").1, RxMode::Socket);
        assert_eq!(tries, [RxMode::Socket]);
    }

    #[test]
    fn the_hint_needs_socket_mode_and_a_bad_icrc() {
        assert_eq!(icrc_hint(RxMode::Socket, 3), Some(PACKET_HINT));
        assert_eq!(icrc_hint(RxMode::Socket, 0), None);
        assert_eq!(icrc_hint(RxMode::Packet, 3), None);
    }
}
