//! The source address the kernel would use towards a destination (`rdma_resolve_addr` without a source): a UDP
//! socket `connect`ed to the destination and read back with `getsockname` — the kernel's route lookup, no packet
//! sent. One small module so a netlink `RTM_GETROUTE` / `RTM_GETNEIGH` lookup (`docs/RDMACM.md` §5: the output
//! interface, the neighbour's MAC) can replace it; on UDP links the MAC is not needed (the kernel routes by IP).

use std::net::{IpAddr, SocketAddr, UdpSocket};

/// The local address of the route to `dst`, or the error of the lookup (`ENETUNREACH` and the like).
pub fn source_for(dst: IpAddr) -> std::io::Result<IpAddr> {
    let any: IpAddr = match dst {
        IpAddr::V4(_) => IpAddr::from([0u8; 4]),
        IpAddr::V6(_) => IpAddr::from([0u16; 8]),
    };
    let s = UdpSocket::bind(SocketAddr::new(any, 0))?;
    // Any port: connecting a UDP socket only looks the route up.
    s.connect(SocketAddr::new(dst, 9))?;
    Ok(s.local_addr()?.ip())
}

/// Whether a UDP socket of this network namespace is bound to exactly `addr` (its address and port), as the
/// kernel lists them in `/proc/net/udp` (IPv4) or `/proc/net/udp6` (IPv6): each socket's `local_address` is the
/// address's bytes printed as native-endian 32-bit words (`%08X` each) and the port in host order (`%04X`), as
/// Linux `udp4_format_sock` / `ip6_dgram_sock_seq_show` write them. Reading the table sends nothing and binds
/// nothing. `false` when the table cannot be read.
pub fn udp_bound(addr: SocketAddr) -> bool {
    let (path, want) = match addr.ip() {
        IpAddr::V4(v4) => ("/proc/net/udp", v4.octets().to_vec()),
        IpAddr::V6(v6) => ("/proc/net/udp6", v6.octets().to_vec()),
    };
    let Ok(table) = std::fs::read_to_string(path) else {
        return false;
    };
    table.lines().skip(1).any(|line| {
        let Some(local) = line.split_whitespace().nth(1) else {
            return false;
        };
        let Some((a, p)) = local.split_once(':') else {
            return false;
        };
        if u16::from_str_radix(p, 16) != Ok(addr.port()) || a.len() != 2 * want.len() {
            return false;
        }
        let mut got = Vec::with_capacity(want.len());
        for word in a.as_bytes().chunks(8) {
            let Some(w) = std::str::from_utf8(word)
                .ok()
                .and_then(|w| u32::from_str_radix(w, 16).ok())
            else {
                return false;
            };
            got.extend_from_slice(&w.to_ne_bytes());
        }
        got == want
    })
}
