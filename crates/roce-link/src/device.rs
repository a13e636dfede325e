//! A rocev2 device on a local address: its identity (name, node GUID, MAC, GID table, port MTU and state) and the
//! engine and UDP link configuration to open it, in one place for every front end (`roce-ibverbs`, the
//! `libibverbs.so.1` that `rocev2 run` puts in front of a program, reads it from the environment).
//!
//! `rocev2 run [--ip ADDR] [--rx socket|packet] [--link udp|xdp] [--pcap FILE] -- PROGRAM` sets [`ENV_IP`] (and
//! [`ENV_RX`], [`ENV_LINK`], [`ENV_PCAP`]). The device is one port on the network interface that owns the address, named as every rocev2
//! tool names it ([`udp::device_name_of_interface`]): `rocev2_<interface>`.

use std::net::IpAddr;

use crate::udp::{self, RxMode, UdpConfig};
use roce_proto::{EngineConfig, Gid, Mtu};

/// Environment variable with the local IP address of the device (IPv4 or IPv6).
pub const ENV_IP: &str = "ROCEV2_IBV_IP";
/// Environment variable with the receive path of the link: `socket` (default) or `packet` (`AF_PACKET`, needed to
/// verify the ICRC of peers that number their IPv4 IDs, such as Linux rxe; needs `CAP_NET_RAW`).
pub const ENV_RX: &str = "ROCEV2_IBV_RX";
/// Environment variable with the link of the device: `udp` (default; the kernel's UDP sockets) or `xdp` (an
/// `AF_XDP` socket on the interface, [`crate::XdpLink`], through [`crate::xdp::open_or_explain`]: when AF_XDP cannot
/// be used the UDP link is taken with a message naming the cause). `rocev2 run --link` sets it.
pub const ENV_LINK: &str = "ROCEV2_IBV_LINK";

/// Environment variable naming a file the device's link writes a capture of every frame to (pcap, nanosecond
/// time stamps, both directions as `rocev2 perf --pcap` writes them; unbuffered, so a program that exits without
/// closing its device leaves a whole capture). `rocev2 run --pcap FILE` sets it. For tests and debugging: each
/// frame costs two `write` calls.
pub const ENV_PCAP: &str = "ROCEV2_IBV_PCAP";

/// The link a device opens ([`ENV_LINK`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceLink {
    /// [`crate::UdpLink`] (receive path per [`DeviceSpec::rx`]).
    #[default]
    Udp,
    /// [`crate::XdpLink`] when it can be used, else [`crate::UdpLink`] with a message naming the cause.
    Xdp,
}

/// `ibv_device_attr.vendor_id` of every rocev2 device: rxe's (0xFFFFFF), with `vendor_part_id` 0 — not a Mellanox,
/// EFA, Chelsio or Intel id, so perftest takes the plain `post_send` path (`docs/spec/LIBIBVERBS-ABI.md §6.3`).
pub const VENDOR_ID: u32 = 0x00ff_ffff;
/// `ibv_device_attr.vendor_part_id` (see [`VENDOR_ID`]).
pub const VENDOR_PART_ID: u32 = 0;
/// `ibv_device_attr.page_size_cap`: every power of two from 4 KiB up, as rxe's `RXE_PAGE_SIZE_CAP` (MRs are
/// byte-granular, so any page size works).
pub const PAGE_SIZE_CAP: u64 = 0xffff_f000;

/// `ibv_device.dev_name` of the device: the name the kernel gives the first uverbs character device. Programs look
/// for `/dev/infiniband/<dev_name>` (UCX stats it and checks it is read-writable) and
/// `/sys/class/infiniband_verbs/<dev_name>` (`ibv_device.dev_path`); `rocev2 run` makes both ([`crate::devfs`]).
pub const UVERBS_NAME: &str = "uverbs0";
/// `ibv_device_attr.fw_ver` (and sysfs `fw_ver`): the rocev2 version.
pub const FW_VER: &str = env!("CARGO_PKG_VERSION");
/// The netdev speed (Mb/s) assumed when the interface reports none (`lo`; a netdev without carrier): 1000, the
/// default of Linux `ib_get_eth_speed` (`drivers/infiniband/core/verbs.c`), which rxe's `rxe_query_port` uses, so
/// a rocev2 port on `lo` reports what an rxe port on `lo` reports: 1X SDR, 2.5 Gb/s.
pub const UNKNOWN_NETDEV_SPEED_MBPS: u32 = 1000;

/// `ibv_port_attr.active_width` and `active_speed` (IBTA Vol 1 §14.2.5.6 PortInfo `LinkWidthActive`,
/// `LinkSpeedActive`; the `ib_port_width`/`ib_port_speed` enum values of Linux and rdma-core) for an Ethernet
/// netdev of `mbps` Mb/s, as Linux `ib_get_width_and_speed` maps it when the netdev reports no lane count (the
/// mapping rxe and every RoCE driver without its own table report): ≤ 1 G → 1X SDR (2.5 Gb/s), ≤ 10 G → 1X FDR10
/// (10 Gb/s), ≤ 20 G → 4X DDR (20), ≤ 25 G → 1X EDR (25), ≤ 40 G → 4X FDR10 (40), ≤ 50 G → 2X EDR (50),
/// ≤ 100 G → 4X EDR (100), ≤ 200 G → 4X HDR (200), above → 4X NDR (400). Returns `(width, speed)`.
pub fn ib_width_and_speed(mbps: u32) -> (u8, u8) {
    const W1X: u8 = 1;
    const W4X: u8 = 2;
    const W2X: u8 = 16;
    const SDR: u8 = 1;
    const DDR: u8 = 2;
    const FDR10: u8 = 8;
    const EDR: u8 = 32;
    const HDR: u8 = 64;
    const NDR: u8 = 128;
    match mbps {
        0..=1_000 => (W1X, SDR),
        1_001..=10_000 => (W1X, FDR10),
        10_001..=20_000 => (W4X, DDR),
        20_001..=25_000 => (W1X, EDR),
        25_001..=40_000 => (W4X, FDR10),
        40_001..=50_000 => (W2X, EDR),
        50_001..=100_000 => (W4X, EDR),
        100_001..=200_000 => (W4X, HDR),
        _ => (W4X, NDR),
    }
}

/// The speed of interface `name` in Mb/s as sysfs `/sys/class/net/<name>/speed` gives it (ethtool's
/// `get_link_ksettings`), `None` when it has none: `lo` (the read fails), a netdev without carrier (fails), or
/// `SPEED_UNKNOWN` (-1) / 0.
pub fn netdev_speed_mbps(name: &str) -> Option<u32> {
    if name.contains('/') || name == "." || name == ".." {
        return None;
    }
    let t = std::fs::read_to_string(format!("/sys/class/net/{name}/speed")).ok()?;
    t.trim()
        .parse::<i64>()
        .ok()
        .filter(|&v| v > 0)
        .and_then(|v| u32::try_from(v).ok())
}
/// `ibv_port_attr.state` of an active port (`IBV_PORT_ACTIVE`).
pub const PORT_ACTIVE: u8 = 4;
/// `ibv_port_attr.state` of a port without carrier (`IBV_PORT_DOWN`).
pub const PORT_DOWN: u8 = 1;
/// `ibv_port_attr.phys_state` with carrier: LinkUp (5), IBTA Vol 1 §14.2.5.6 PortInfo `PortPhysicalState`.
pub const PHYS_LINK_UP: u8 = 5;
/// `ibv_port_attr.phys_state` without carrier: Disabled (3), as rxe reports a netdev without carrier.
pub const PHYS_DISABLED: u8 = 3;

/// The MAC address rocev2 uses for `ip` (`02:00:` + the last four address bytes), as `rocev2 perf`/`pingpong` do.
pub fn mac_of(ip: IpAddr) -> [u8; 6] {
    let o = match ip {
        IpAddr::V4(v) => v.octets(),
        IpAddr::V6(v) => {
            let x = v.octets();
            [x[12], x[13], x[14], x[15]]
        }
    };
    [0x02, 0x00, o[0], o[1], o[2], o[3]]
}

/// The hint for a device whose UDP 4791 on `local` is taken (bind: address in use): another RoCE stack or rocev2
/// process has that address and does not share it (`rocev2 run` programs share an address only with the kernel's
/// steering, `crate::reuseport`), so this process needs an address of its own (`--ip`). For a loopback
/// IPv4 address the hint names the next one (127.0.0.1 → `--ip 127.0.0.2`: any 127/8 address is on `lo`).
/// `command`: the command line the remedy is written for (`rocev2 run --ip 127.0.0.2 -- PROGRAM` for a program
/// under `rocev2 run`), else the bare option (`rocev2 perf`/`pingpong`).
pub fn in_use_hint(local: IpAddr, command: Option<&str>) -> String {
    let other = match local {
        IpAddr::V4(v4) if v4.is_loopback() => {
            let [a, b, c, d] = v4.octets();
            let d = if d >= 254 { 2 } else { d + 1 };
            IpAddr::from([a, b, c, d]).to_string()
        }
        _ => "<another address of this host>".to_owned(),
    };
    match command {
        Some(cmd) => format!(
            "another RoCE stack or rocev2 process owns UDP 4791 on {local} and does not share it (rocev2 programs \
             share an address when the kernel steers by QPN, which needs CAP_BPF and CAP_NET_ADMIN: \
             docs/MULTIPROCESS.md); start it with `rocev2 run --ip {other} -- {cmd}`"
        ),
        // `rocev2 perf` / `pingpong` never share an address (docs/MULTIPROCESS.md): capabilities do not matter.
        None => format!(
            "another RoCE stack or rocev2 process owns UDP 4791 on {local}, and `rocev2 perf` / `rocev2 pingpong` \
             take an address of their own (docs/MULTIPROCESS.md); start it with --ip {other}"
        ),
    }
}

/// The GID of an address (IPv4-mapped for IPv4, `ROCEV2.md §1.4`).
pub fn gid_of(ip: IpAddr) -> Gid {
    match ip {
        IpAddr::V4(v) => Gid::from_ipv4(v.octets()),
        IpAddr::V6(v) => Gid(v.octets()),
    }
}

/// The netdev MTU a device on the AF_XDP link reports at most: what its frames can carry
/// ([`crate::xdp::XdpConfig::max_netdev_mtu`] of the default configuration, 3826 bytes, so active MTU 2048). A
/// jumbo interface (MTU 9000) would otherwise offer path MTU 4096, whose 4176-byte frames the link can never send.
/// The cap stays when the link falls back to UDP (the choice is made only when the device is first used).
pub fn xdp_netdev_mtu_cap() -> u32 {
    crate::xdp::XdpConfig::new(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)).max_netdev_mtu()
}

/// What `ibv_get_device_list` reports about the one device; `rocev2 devinfo -d ADDRESS` shows the same facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Local address (UDP 4791 is bound on it when the device is first used for a verbs object).
    pub ip: IpAddr,
    /// Receive path of the link.
    pub rx: RxMode,
    /// The link to open ([`ENV_LINK`]; [`DeviceLink::Udp`] from [`DeviceSpec::for_ip`]).
    pub link: DeviceLink,
    /// Interface owning `ip`.
    pub interface: String,
    /// Its index.
    pub ifindex: u32,
    /// Its MTU in bytes (the netdev MTU; bounds the port MTU as rxe's does).
    pub netdev_mtu: u32,
    /// Carrier (IFF_RUNNING): port ACTIVE, else DOWN.
    pub running: bool,
    /// The netdev's speed in Mb/s ([`netdev_speed_mbps`]), `None` when it reports none.
    pub netdev_speed_mbps: Option<u32>,
}

impl DeviceSpec {
    /// The device configured by the environment, `Ok(None)` when [`ENV_IP`] is unset; errors name what is wrong.
    pub fn from_env() -> Result<Option<DeviceSpec>, String> {
        let Some(ip) = std::env::var_os(ENV_IP) else {
            return Ok(None);
        };
        let ip = ip.to_string_lossy();
        let ip: IpAddr = ip
            .parse()
            .map_err(|e| format!("{ENV_IP}={ip}: not an IP address: {e}"))?;
        let rx = match std::env::var(ENV_RX).as_deref() {
            Err(_) | Ok("socket") => RxMode::Socket,
            Ok("packet") => RxMode::Packet,
            Ok(other) => return Err(format!("{ENV_RX}={other}: expected socket or packet")),
        };
        let link = match std::env::var(ENV_LINK).as_deref() {
            Err(_) | Ok("udp") => DeviceLink::Udp,
            Ok("xdp") => DeviceLink::Xdp,
            Ok(other) => return Err(format!("{ENV_LINK}={other}: expected udp or xdp")),
        };
        let mut spec = DeviceSpec::for_ip(ip, rx)?;
        spec.link = link;
        if link == DeviceLink::Xdp {
            spec.netdev_mtu = spec.netdev_mtu.min(xdp_netdev_mtu_cap());
        }
        Ok(Some(spec))
    }

    /// The device on `ip` (its interface looked up in this network namespace).
    pub fn for_ip(ip: IpAddr, rx: RxMode) -> Result<DeviceSpec, String> {
        let all = udp::interfaces().map_err(|e| format!("listing interfaces: {e}"))?;
        let (ifindex, interface) = udp::interface_of(ip).map_err(|e| e.to_string())?;
        let running = all.iter().any(|i| i.index == ifindex && i.running);
        let netdev_speed_mbps = netdev_speed_mbps(&interface);
        let netdev_mtu = std::fs::read_to_string(format!("/sys/class/net/{interface}/mtu"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1500);
        Ok(DeviceSpec {
            ip,
            rx,
            link: DeviceLink::Udp,
            interface,
            ifindex,
            netdev_mtu,
            running,
            netdev_speed_mbps,
        })
    }

    /// `rocev2_<interface>`.
    pub fn name(&self) -> String {
        udp::device_name_of_interface(&self.interface)
    }

    /// The GID table (one entry: the address, the only source address the link bound on it can send from).
    pub fn gids(&self) -> Vec<Gid> {
        vec![gid_of(self.ip)]
    }

    /// Node GUID: the EUI-64 of the MAC the engine puts on the wire ([`mac_of`], U/L bit flipped), as rxe derives it
    /// from its netdev's MAC; big-endian bytes.
    pub fn node_guid(&self) -> [u8; 8] {
        let m = mac_of(self.ip);
        [m[0] ^ 0x02, m[1], m[2], 0xff, 0xfe, m[3], m[4], m[5]]
    }

    /// `ibv_port_attr.state`: [`PORT_ACTIVE`] with carrier, else [`PORT_DOWN`].
    pub fn port_state(&self) -> u8 {
        if self.running { PORT_ACTIVE } else { PORT_DOWN }
    }

    /// `ibv_port_attr.phys_state`: [`PHYS_LINK_UP`] with carrier, else [`PHYS_DISABLED`].
    pub fn phys_state(&self) -> u8 {
        if self.running {
            PHYS_LINK_UP
        } else {
            PHYS_DISABLED
        }
    }

    /// `ibv_port_attr.active_width` and `active_speed` of the port: [`ib_width_and_speed`] of the netdev's speed,
    /// or of [`UNKNOWN_NETDEV_SPEED_MBPS`] when it reports none (rxe's rule). `ibv_query_port`, sysfs `ports/1/rate`
    /// and `rocev2 devinfo` all report this.
    pub fn width_and_speed(&self) -> (u8, u8) {
        ib_width_and_speed(self.netdev_speed_mbps.unwrap_or(UNKNOWN_NETDEV_SPEED_MBPS))
    }

    /// Active MTU: the largest IB MTU that fits the netdev MTU minus the RoCE headers (rxe's rule), capped at 4096.
    pub fn active_mtu(&self) -> Mtu {
        Mtu::from_netdev_mtu(self.netdev_mtu).unwrap_or(Mtu::Mtu256)
    }

    /// The engine configuration for this device, seeded with `seed`.
    pub fn engine_config(&self, seed: u64) -> EngineConfig {
        EngineConfig {
            mac: mac_of(self.ip),
            gids: self.gids(),
            netdev_mtu: self.netdev_mtu,
            seed,
            ..EngineConfig::default()
        }
    }

    /// The UDP link configuration (frames from any peer; the peer MAC written into rebuilt frames is not checked).
    pub fn udp_config(&self) -> UdpConfig {
        UdpConfig {
            local_mac: mac_of(self.ip),
            rx: self.rx,
            ..UdpConfig::new(self.ip)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_device_is_named_after_its_interface_and_has_a_mapped_gid() {
        let d = DeviceSpec::for_ip("127.0.0.1".parse().expect("ip"), RxMode::Socket).expect("lo");
        assert_eq!(d.name(), format!("rocev2_{}", d.interface));
        assert_eq!(d.gids()[0].to_string(), "::ffff:127.0.0.1");
        assert_eq!(d.node_guid(), [0x00, 0x00, 127, 0xff, 0xfe, 0, 0, 1]);
    }

    #[test]
    fn the_in_use_hint_names_the_next_loopback_address() {
        let lo = "127.0.0.1".parse().expect("ip");
        assert!(in_use_hint(lo, None).ends_with("start it with --ip 127.0.0.2"));
        assert!(
            in_use_hint(lo, Some("ib_send_bw -n 5"))
                .ends_with("start it with `rocev2 run --ip 127.0.0.2 -- ib_send_bw -n 5`")
        );
        let top = "127.0.0.254".parse().expect("ip");
        assert!(in_use_hint(top, None).ends_with("--ip 127.0.0.2"));
    }

    /// Fresh-user finding: `rocev2 perf` / `pingpong` never share an address, so their hint must not send a root
    /// user after capabilities they already have; programs under `rocev2 run` do share with CAP_BPF + CAP_NET_ADMIN.
    #[test]
    fn the_in_use_hint_names_capabilities_only_where_they_help() {
        let lo = "127.0.0.1".parse().expect("ip");
        let perf = in_use_hint(lo, None);
        assert!(!perf.contains("CAP_BPF"), "{perf}");
        assert!(perf.contains("take an address of their own"), "{perf}");
        assert!(in_use_hint(lo, Some("ibv_rc_pingpong")).contains("CAP_BPF and CAP_NET_ADMIN"));
    }

    #[test]
    fn port_width_and_speed_follow_the_netdev_as_linux_maps_them() {
        // (Mb/s, width, speed) from Linux `ib_get_width_and_speed` without lanes.
        for (mbps, w, s) in [
            (100, 1, 1),
            (1_000, 1, 1),
            (2_500, 1, 8),
            (10_000, 1, 8),
            (20_000, 2, 2),
            (25_000, 1, 32),
            (40_000, 2, 8),
            (50_000, 16, 32),
            (100_000, 2, 32),
            (200_000, 2, 64),
            (400_000, 2, 128),
        ] {
            assert_eq!(ib_width_and_speed(mbps), (w, s), "{mbps} Mb/s");
        }
        // `lo` reports no speed: rxe's default, 1X SDR.
        let d = DeviceSpec::for_ip("127.0.0.1".parse().expect("ip"), RxMode::Socket).expect("lo");
        assert_eq!(d.netdev_speed_mbps, None);
        assert_eq!(d.width_and_speed(), (1, 1));
    }

    #[test]
    fn the_xdp_cap_leaves_room_for_path_mtu_2048_only() {
        // 4096-byte chunks − 256 headroom − 14 Ethernet: 3826; 2048 + 80 fits, 4096 + 80 does not.
        assert_eq!(xdp_netdev_mtu_cap(), 3826);
        let mut d =
            DeviceSpec::for_ip("127.0.0.1".parse().expect("ip"), RxMode::Socket).expect("lo");
        d.netdev_mtu = d.netdev_mtu.min(xdp_netdev_mtu_cap());
        assert_eq!(d.active_mtu(), Mtu::Mtu2048);
        assert_eq!(d.engine_config(0).netdev_mtu, 3826);
    }

    #[test]
    fn an_address_of_no_interface_is_an_error() {
        let e = DeviceSpec::for_ip("198.51.100.77".parse().expect("ip"), RxMode::Socket);
        assert!(e.is_err(), "{e:?}");
    }
}
