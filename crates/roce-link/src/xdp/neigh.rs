//! Neighbour MACs from the kernel's neighbour table (ARP for IPv4, NDP for IPv6), read with one rtnetlink
//! `RTM_GETNEIGH` request per address (the "get" form, Linux ≥ 5.0, `net/core/neighbour.c` `neigh_get`), and the
//! interface's own MAC and MTU (`SIOCGIFHWADDR`, `SIOCGIFMTU`, netdevice(7)).
//!
//! Why netlink and not `/proc/net/arp`: that file lists IPv4 (ARP) entries only; IPv6 neighbours (NDP) are only
//! in rtnetlink. The request and its answer live in stack buffers: no allocation.
//!
//! When the table has no usable entry, [`Neighbours::solicit`] makes the kernel resolve the address by sending
//! one empty UDP datagram to its discard port (9) from a kernel socket: the kernel resolves the next hop (ARP /
//! NDP) before it can send, and the peer's kernel at most answers with ICMP port unreachable, which the XDP
//! program passes to the kernel. Only on-link peers are resolved (the entry looked up is the peer's own address,
//! not a gateway's).

use std::io;
use std::mem;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// NUD states with a usable link-layer address: REACHABLE, STALE, DELAY, PROBE, NOARP, PERMANENT
/// (`include/uapi/linux/neighbour.h`).
const NUD_USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80;
const NLMSG_HDRLEN: usize = 16;
const NDMSG_LEN: usize = 12;

/// An rtnetlink socket for neighbour look-ups on one interface, and kernel UDP sockets to solicit resolution.
pub(super) struct Neighbours {
    nl: OwnedFd,
    ifindex: u32,
    seq: u32,
    solicit_v4: Option<UdpSocket>,
    solicit_v6: Option<UdpSocket>,
}

impl Neighbours {
    pub(super) fn open(ifindex: u32) -> io::Result<Neighbours> {
        // SAFETY: plain socket(2) call; the result is checked before use.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let nl = unsafe { OwnedFd::from_raw_fd(fd) };
        let tv = libc::timeval {
            tv_sec: 1,
            tv_usec: 0,
        };
        // SAFETY: `tv` is a valid `timeval` for the length given.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        Ok(Neighbours {
            nl,
            ifindex,
            seq: 0,
            solicit_v4: UdpSocket::bind("0.0.0.0:0").ok(),
            solicit_v6: UdpSocket::bind("[::]:0").ok(),
        })
    }

    /// The link-layer address the kernel's table holds for `ip` on this interface, if usable. `Ok(None)`: no
    /// entry, or one still being resolved (or failed).
    pub(super) fn lookup(&mut self, ip: IpAddr) -> io::Result<Option<[u8; 6]>> {
        let (family, addr): (u8, &[u8]) = match &ip {
            IpAddr::V4(a) => (libc::AF_INET as u8, &a.octets()[..]),
            IpAddr::V6(a) => (libc::AF_INET6 as u8, &a.octets()[..]),
        };
        // Own copy of the address bytes (the match above borrows temporaries).
        let mut abuf = [0u8; 16];
        abuf[..addr.len()].copy_from_slice(addr);
        let alen = addr.len();
        self.seq = self.seq.wrapping_add(1);
        let len = NLMSG_HDRLEN + NDMSG_LEN + 4 + alen;
        let mut req = [0u8; NLMSG_HDRLEN + NDMSG_LEN + 4 + 16];
        req[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
        req[4..6].copy_from_slice(&RTM_GETNEIGH.to_ne_bytes());
        req[6..8].copy_from_slice(&NLM_F_REQUEST.to_ne_bytes());
        req[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        // ndmsg: family, pads, ifindex, state 0, flags 0, type 0.
        req[16] = family;
        req[20..24].copy_from_slice(&(self.ifindex as i32).to_ne_bytes());
        let at = NLMSG_HDRLEN + NDMSG_LEN;
        req[at..at + 2].copy_from_slice(&((4 + alen) as u16).to_ne_bytes());
        req[at + 2..at + 4].copy_from_slice(&NDA_DST.to_ne_bytes());
        req[at + 4..at + 4 + alen].copy_from_slice(&abuf[..alen]);
        // SAFETY: `req` is readable for `len` bytes; a netlink socket without a destination sends to the kernel.
        let n = unsafe { libc::send(self.nl.as_raw_fd(), req.as_ptr().cast(), len, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut resp = [0u8; 1024];
        loop {
            // SAFETY: `resp` is writable for its length.
            let n =
                unsafe { libc::recv(self.nl.as_raw_fd(), resp.as_mut_ptr().cast(), resp.len(), 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let msg = &resp[..n as usize];
            if msg.len() < NLMSG_HDRLEN {
                return Err(io::Error::other("short rtnetlink answer"));
            }
            let seq = u32::from_ne_bytes([msg[8], msg[9], msg[10], msg[11]]);
            if seq != self.seq {
                continue; // an answer to an earlier request that timed out
            }
            return Ok(parse_answer(msg));
        }
    }

    /// Makes the kernel resolve `ip` (see the module docs). Errors are ignored: the next look-up tells.
    pub(super) fn solicit(&self, ip: IpAddr) {
        let s = match ip {
            IpAddr::V4(_) => self.solicit_v4.as_ref(),
            IpAddr::V6(_) => self.solicit_v6.as_ref(),
        };
        if let Some(s) = s {
            let _ = s.set_nonblocking(true);
            let _ = s.send_to(&[], SocketAddr::new(ip, 9));
        }
    }
}

/// The usable link-layer address in one rtnetlink answer (`RTM_NEWNEIGH`), `None` for an error answer (ENOENT:
/// no entry) or an entry without one.
fn parse_answer(msg: &[u8]) -> Option<[u8; 6]> {
    let ty = u16::from_ne_bytes([msg[4], msg[5]]);
    if ty == NLMSG_ERROR || ty != RTM_NEWNEIGH || msg.len() < NLMSG_HDRLEN + NDMSG_LEN {
        return None;
    }
    let state = u16::from_ne_bytes([msg[24], msg[25]]);
    if state & NUD_USABLE == 0 {
        return None;
    }
    let mut at = NLMSG_HDRLEN + NDMSG_LEN;
    while at + 4 <= msg.len() {
        let alen = usize::from(u16::from_ne_bytes([msg[at], msg[at + 1]]));
        let aty = u16::from_ne_bytes([msg[at + 2], msg[at + 3]]);
        if alen < 4 || at + alen > msg.len() {
            return None;
        }
        if aty == NDA_LLADDR && alen == 4 + 6 {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&msg[at + 4..at + 10]);
            return Some(mac);
        }
        at += (alen + 3) & !3;
    }
    None
}

/// The interface's own MAC (`SIOCGIFHWADDR`) and MTU (`SIOCGIFMTU`), in the calling thread's namespace.
pub(super) fn mac_and_mtu(ifname: &str) -> io::Result<([u8; 6], usize)> {
    let s = UdpSocket::bind("0.0.0.0:0")?;
    // SAFETY: `ifreq` is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { mem::zeroed() };
    let name = ifname.as_bytes();
    if name.len() >= req.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface name too long",
        ));
    }
    for (d, &b) in req.ifr_name.iter_mut().zip(name) {
        *d = b as libc::c_char;
    }
    // SAFETY: `req` is a valid `ifreq` naming the interface; the kernel writes `ifr_hwaddr`.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFHWADDR, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFHWADDR filled the `ifru_hwaddr` member of the union.
    let hw = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut mac = [0u8; 6];
    for (d, &b) in mac.iter_mut().zip(hw.sa_data.iter()) {
        *d = b as u8;
    }
    // SAFETY: as above; the kernel writes `ifru_mtu`.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFMTU, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: SIOCGIFMTU filled the `ifru_mtu` member.
    let mtu = unsafe { req.ifr_ifru.ifru_mtu };
    Ok((mac, usize::try_from(mtu).unwrap_or(0)))
}

/// Where the link's neighbour rule can reach an IPv4 peer: the subnets of the interface (`(address, netmask)`
/// in host order, from getifaddrs(3)) and every IPv4 address of this host (any interface). Read once when the link
/// opens; a subnet added later is not seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct OnLink {
    pub(super) subnets: Vec<(u32, u32)>,
    pub(super) local: Vec<std::net::Ipv4Addr>,
}

/// Why the link cannot reach `peer`, if it cannot: the AF_XDP link puts on the wire the MAC of the neighbour
/// entry of the peer's own address (no route, no gateway), and its frames leave on its interface only, never on
/// `lo` (ROCEV2.md §1.4 leaves the next hop to the host; Linux resolves the route's gateway, this link does not).
pub(super) fn unreachable_because(on: &OnLink, peer: IpAddr) -> Option<&'static str> {
    let IpAddr::V4(p) = peer else {
        return None;
    };
    if on.local.contains(&p) {
        return Some(
            "it is an address of this host (its frames would have to go over `lo`, which the AF_XDP link does not use)",
        );
    }
    let x = u32::from(p);
    if on.subnets.iter().any(|&(a, m)| a & m == x & m) {
        return None;
    }
    Some(
        "no subnet of the interface holds it (a peer behind a router needs the gateway's MAC; the AF_XDP link looks up the peer's own neighbour entry only)",
    )
}

/// [`OnLink`] of interface `ifname` (getifaddrs(3)).
pub(super) fn on_link(ifname: &str) -> io::Result<OnLink> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `list` is a valid out-pointer; on success it is freed with freeifaddrs below.
    if unsafe { libc::getifaddrs(&mut list) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let v4 = |sa: *const libc::sockaddr| -> Option<u32> {
        if sa.is_null() {
            return None;
        }
        // SAFETY: `sa` is non-null and points at a sockaddr of the list; its family says which struct it is.
        if libc::c_int::from(unsafe { (*sa).sa_family }) != libc::AF_INET {
            return None;
        }
        // SAFETY: an AF_INET address is a `sockaddr_in`.
        let sin = unsafe { std::ptr::read_unaligned(sa.cast::<libc::sockaddr_in>()) };
        Some(u32::from_be(sin.sin_addr.s_addr))
    };
    let mut out = OnLink::default();
    let mut cur = list;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let Some(addr) = v4(ifa.ifa_addr) else {
            continue;
        };
        out.local.push(std::net::Ipv4Addr::from(addr));
        // SAFETY: a non-null `ifa_name` is a NUL-terminated string owned by the list.
        let same = !ifa.ifa_name.is_null()
            && unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_bytes() == ifname.as_bytes();
        if same && let Some(mask) = v4(ifa.ifa_netmask) {
            out.subnets.push((addr, mask));
        }
    }
    // SAFETY: `list` came from a successful getifaddrs and is freed once; no reference into it outlives this.
    unsafe { libc::freeifaddrs(list) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_link_and_own_addresses_are_named_on_link_ones_are_not() {
        let on = OnLink {
            subnets: vec![(u32::from_be_bytes([198, 18, 56, 1]), 0xffff_ff00)],
            local: vec![[198, 18, 56, 1].into(), [198, 18, 57, 1].into()],
        };
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(unreachable_because(&on, ip("198.18.56.2")), None);
        assert!(unreachable_because(&on, ip("198.18.58.2")).is_some_and(|w| w.contains("router")));
        assert!(
            unreachable_because(&on, ip("198.18.57.1")).is_some_and(|w| w.contains("this host"))
        );
        assert!(
            unreachable_because(&on, ip("198.18.56.1")).is_some_and(|w| w.contains("this host"))
        );
        assert_eq!(unreachable_because(&on, ip("::1")), None);
        // The interface's real subnets: `lo` holds 127.0.0.0/8, and its own address is local.
        let lo = on_link("lo").expect("getifaddrs");
        assert!(lo.subnets.contains(&(0x7f00_0001, 0xff00_0000)), "{lo:?}");
        assert!(unreachable_because(&lo, ip("127.0.0.1")).is_some());
    }

    #[test]
    fn answer_with_lladdr_and_error_answers() {
        // RTM_NEWNEIGH, state STALE, NDA_DST 4 bytes, NDA_LLADDR 6 bytes (padded to 12).
        let mut m = vec![0u8; 16 + 12];
        m[4..6].copy_from_slice(&RTM_NEWNEIGH.to_ne_bytes());
        m[24..26].copy_from_slice(&0x04u16.to_ne_bytes());
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&NDA_DST.to_ne_bytes());
        m.extend_from_slice(&[198, 18, 26, 2]);
        m.extend_from_slice(&10u16.to_ne_bytes());
        m.extend_from_slice(&NDA_LLADDR.to_ne_bytes());
        m.extend_from_slice(&[2, 1, 2, 3, 4, 5, 0, 0]);
        assert_eq!(parse_answer(&m), Some([2, 1, 2, 3, 4, 5]));
        // INCOMPLETE: not usable.
        m[24..26].copy_from_slice(&0x01u16.to_ne_bytes());
        assert_eq!(parse_answer(&m), None);
        // An error answer.
        let mut e = vec![0u8; 20];
        e[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        assert_eq!(parse_answer(&e), None);
        // A truncated attribute is not read past the end.
        let mut t = m.clone();
        t[24..26].copy_from_slice(&0x02u16.to_ne_bytes());
        t.truncate(m.len() - 4);
        assert_eq!(parse_answer(&t), None);
    }
}
