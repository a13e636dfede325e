//! The "active MTU" of a rocev2 port, as perftest and the rdma-core tools see it on Linux rxe: the largest IB MTU
//! (256 .. 4096 bytes of payload per packet) whose packets fit the MTU of the network device that owns the port's
//! IP address, with 80 bytes left for the RoCE headers (`RXE_MAX_HDR_LENGTH`, `ROCEV2.md §1.1`;
//! `drivers/infiniband/sw/rxe/rxe_param.h` `eth_mtu_int_to_enum`). A netdev too small even for 256 + 80 bytes
//! still gets 256, as `rxe_set_mtu` falls back to it. So a 1500-byte Ethernet gives 1024, jumbo 9000 and loopback
//! (65536) give 4096.
//!
//! `rocev2 perf` defaults `-m` to this value and lowers a larger `-m` to it (perftest does the same with the port's
//! active MTU); `rocev2 pingpong` caps its `-m` (default 1024) by it.

use std::net::{IpAddr, Ipv4Addr};

use roce_proto::Mtu;

/// The active MTU of one local address and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActiveMtu {
    /// The IB MTU (payload bytes per packet).
    pub mtu: Mtu,
    /// Name of the network device owning the address.
    pub netdev: String,
    /// That device's MTU in bytes (IP packet size).
    pub netdev_mtu: u32,
}

impl std::fmt::Display for ActiveMtu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes ({} has MTU {})",
            self.mtu.bytes(),
            self.netdev,
            self.netdev_mtu
        )
    }
}

/// The IB MTU a port on a netdev of `netdev_mtu` bytes offers: the largest of 256 .. 4096 that is at most
/// `netdev_mtu − 80`, and 256 when none is (rxe: `eth_mtu_int_to_enum`, then `rxe_set_mtu`'s fallback).
pub fn ib_mtu_for_netdev(netdev_mtu: u32) -> Mtu {
    Mtu::from_netdev_mtu(netdev_mtu).unwrap_or(Mtu::Mtu256)
}

/// The active MTU of the local address `ip`: the netdev owning it ([`roce_link::udp::interface_of`]; 127.0.0.0/8
/// belongs to the loopback device) and that netdev's MTU from `/sys/class/net/NAME/mtu`.
///
/// # Errors
/// A message when no interface has the address, or sysfs cannot be read or shows another network namespace (its
/// `ifindex` differs from the one `getifaddrs` gave: `/sys` is the view of whoever mounted it, which `ip netns
/// exec` remounts but a bare `setns` does not).
pub fn of_address(ip: IpAddr) -> Result<ActiveMtu, String> {
    let (ifindex, name) = roce_link::udp::interface_of(ip)
        .map_err(|e| format!("no network device owns {ip}: {e}"))?;
    of_netdev(&name, ifindex)
}

/// The active MTU of the loopback device (what `--loopback` runs over, whatever addresses it uses).
///
/// # Errors
/// As [`of_address`].
pub fn of_loopback() -> Result<ActiveMtu, String> {
    of_address(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The active MTU of the netdev `name` whose interface index is `ifindex`.
fn of_netdev(name: &str, ifindex: u32) -> Result<ActiveMtu, String> {
    // Device names never contain '/' and are never "." or ".." (Linux `dev_valid_name`); refuse anything else
    // rather than read another sysfs path.
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(format!("unexpected network device name {name:?}"));
    }
    let read = |what: &str| -> Result<u32, String> {
        let path = format!("/sys/class/net/{name}/{what}");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
        text.trim()
            .parse::<u32>()
            .map_err(|e| format!("{path}: {:?} is not a number: {e}", text.trim()))
    };
    let sys_index = read("ifindex")?;
    if sys_index != ifindex {
        return Err(format!(
            "/sys/class/net/{name} is interface {sys_index}, not {ifindex}: /sys belongs to another network \
             namespace (use `ip netns exec`, which remounts it)"
        ));
    }
    let netdev_mtu = read("mtu")?;
    Ok(ActiveMtu {
        mtu: ib_mtu_for_netdev(netdev_mtu),
        netdev: name.to_owned(),
        netdev_mtu,
    })
}

/// `active` as the AF_XDP link carries it: the netdev MTU capped at what one UMEM chunk holds
/// ([`roce_link::device::xdp_netdev_mtu_cap`], 3826 bytes: active MTU 2048 on a jumbo interface), as a device of
/// `rocev2 run --link xdp` reports it (issue #19). The netdev name stays; its MTU shown is the capped one.
pub fn for_xdp(active: ActiveMtu) -> ActiveMtu {
    let netdev_mtu = active
        .netdev_mtu
        .min(roce_link::device::xdp_netdev_mtu_cap());
    ActiveMtu {
        mtu: ib_mtu_for_netdev(netdev_mtu),
        netdev_mtu,
        ..active
    }
}

/// The MTU bytes of `-m` as an [`Mtu`], or an error naming the flag.
pub fn parse_flag(bytes: u32) -> Result<Mtu, String> {
    Ok(match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        4096 => Mtu::Mtu4096,
        _ => {
            return Err(format!(
                "-m {bytes}: the MTU must be 256, 512, 1024, 2048 or 4096"
            ));
        }
    })
}

/// `requested` capped by `active`, and the note to print when that lowered it (`-m N` above the active MTU, as
/// perftest warns).
pub fn cap(requested: Mtu, active: &ActiveMtu, local: IpAddr) -> (Mtu, Option<String>) {
    if requested <= active.mtu {
        return (requested, None);
    }
    let note = format!(
        "-m {} is above the active MTU of {local}, {active}: using {}",
        requested.bytes(),
        active.mtu.bytes()
    );
    (active.mtu, Some(note))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_xdp_link_caps_a_jumbo_netdev_at_2048() {
        let jumbo = ActiveMtu {
            mtu: Mtu::Mtu4096,
            netdev: "veth0".into(),
            netdev_mtu: 9000,
        };
        let x = for_xdp(jumbo);
        assert_eq!((x.mtu, x.netdev_mtu), (Mtu::Mtu2048, 3826));
        let eth = ActiveMtu {
            mtu: Mtu::Mtu1024,
            netdev: "veth0".into(),
            netdev_mtu: 1500,
        };
        assert_eq!(for_xdp(eth.clone()), eth);
    }

    #[test]
    fn netdev_mtu_to_ib_mtu() {
        for (netdev, ib) in [
            (65536, 4096),
            (9000, 4096),
            (4176, 4096),
            (4175, 2048),
            (2128, 2048),
            (2127, 1024),
            (1500, 1024),
            (1280, 1024),
            (1104, 1024),
            (1103, 512),
            (1100, 512),
            (592, 512),
            (591, 256),
            (576, 256),
            (336, 256),
            // Below 256 + 80 rxe still offers 256.
            (335, 256),
            (68, 256),
            (0, 256),
        ] {
            assert_eq!(ib_mtu_for_netdev(netdev).bytes(), ib, "netdev MTU {netdev}");
        }
    }

    #[test]
    fn cap_lowers_only_what_is_above() {
        let a = ActiveMtu {
            mtu: Mtu::Mtu1024,
            netdev: "veth0".into(),
            netdev_mtu: 1500,
        };
        let ip: IpAddr = "198.18.0.1".parse().expect("ip");
        let (m, note) = cap(Mtu::Mtu4096, &a, ip);
        assert_eq!(m, Mtu::Mtu1024);
        let note = note.expect("a note when lowered");
        assert!(
            note.contains("-m 4096") && note.contains("veth0") && note.contains("using 1024"),
            "{note}"
        );
        assert_eq!(cap(Mtu::Mtu1024, &a, ip), (Mtu::Mtu1024, None));
        assert_eq!(cap(Mtu::Mtu512, &a, ip), (Mtu::Mtu512, None));
    }

    #[test]
    fn flag_values() {
        assert_eq!(parse_flag(1024), Ok(Mtu::Mtu1024));
        assert_eq!(parse_flag(4096), Ok(Mtu::Mtu4096));
        assert!(parse_flag(1500).is_err());
        assert!(parse_flag(0).is_err());
    }

    #[test]
    fn loopback_device_offers_its_mtu() {
        // Whatever lo's MTU is on this host, the lookup must agree with sysfs and the mapping.
        let a = of_loopback().expect("the loopback device");
        let sys: u32 = std::fs::read_to_string(format!("/sys/class/net/{}/mtu", a.netdev))
            .expect("sysfs")
            .trim()
            .parse()
            .expect("number");
        assert_eq!(a.netdev_mtu, sys);
        assert_eq!(a.mtu, ib_mtu_for_netdev(sys));
        // 127.0.0.2 is not configured on lo but belongs to it.
        let b = of_address("127.0.0.2".parse().expect("ip")).expect("127.0.0.2");
        assert_eq!(b, a);
        assert!(of_address("192.0.2.123".parse().expect("ip")).is_err());
    }
}
