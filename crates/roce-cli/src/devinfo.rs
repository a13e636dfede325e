//! `rocev2 devinfo`: the rocev2 devices of this host as `ibv_devinfo [-v]` shows RDMA devices.
//!
//! A rocev2 device is a network interface with an IP address: a rocev2 program opens it by binding UDP 4791 on one
//! of the addresses (as Linux rxe makes `rxe0` on top of `eth0`). So there is one device per interface, named
//! `rocev2_<interface>`, with one port whose
//!
//! * state is `PORT_ACTIVE` when the interface is up with carrier (`IFF_RUNNING`), else `PORT_DOWN` (rxe: carrier);
//! * active MTU is the largest IB MTU that fits the interface's MTU minus 80 header bytes (rxe's rule; the same
//!   `rocev2 perf` negotiates, `perf::port_mtu`); max MTU 4096;
//! * GID table is that of the device opened on one address (docs/DEVICE.md "GID table"): one entry, GID[0] = the
//!   address (IPv4 as `::ffff:a.b.c.d`), type RoCE v2 — the one source address the link bound on it can send from,
//!   exactly what `ibv_query_gid` and sysfs `ports/1/gids/0` give a program under `rocev2 run --ip ADDRESS`. Without
//!   `-d ADDRESS` the address is the interface's first IPv4 address (else its first); its other addresses are
//!   listed as `other address` lines (each the GID[0] of a device opened on it), never at another index;
//! * active width and speed are the netdev's speed mapped as Linux maps it for rxe
//!   ([`roce_link::device::DeviceSpec::width_and_speed`]; `lo` reports none: 1X SDR, 2.5 Gb/s, as rxe on `lo`);
//! * limits (`-v`) are what a program opening the device gets ([`roce_verbs::device_attr`]), every field
//!   `ibv_devinfo -v` prints under the same name, plus `max_inline_data`.
//!
//! Identity and limits come from [`roce_link::device::DeviceSpec`], the facts `roce-ibverbs` reports to a program
//! under `rocev2 run --ip ADDRESS`: node GUID = EUI-64 of the MAC the engine puts on the wire for the address (as rxe
//! derives it from its netdev's MAC), vendor and page-size capability. With `-d ADDRESS` the device is shown as
//! that program sees it (GUID of that address, GID table = that address alone, the one source address its link
//! can send from), so `rocev2 devinfo -v -d A` and `rocev2 run --ip A -- ibv_devinfo -v` agree field by field;
//! without an address the GUID is that of the interface's first IPv4 address (else its first address). Devices that running programs have
//! open (their stats endpoints, see `rocev2 stat`) are listed under the port with their process (pid and comm, as `ps`
//! names it; `--json` adds the command line), when that process is in the caller's network namespace (another
//! namespace's `lo` is another interface).

use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use roce_link::device::{DeviceSpec, PAGE_SIZE_CAP, VENDOR_ID, VENDOR_PART_ID};
use roce_link::udp::{Interface, RxMode, device_name_of_interface, interfaces};
use roce_proto::{Gid, Mtu};
use roce_verbs::endpoint;
use serde_json::{Value, json};

use crate::perf::port_mtu;

/// `rocev2 devinfo` arguments.
#[derive(Clone, Debug, clap::Args)]
pub struct DevinfoArgs {
    /// Only this device: its name (`rocev2_eth0`), its interface (`eth0`) or one of its addresses.
    #[arg(short = 'd', long = "ib-dev", visible_alias = "device")]
    pub dev: Option<String>,
    /// Also print the device limits and port details (as `ibv_devinfo -v`).
    #[arg(short = 'v', long)]
    pub verbose: bool,
    /// Print a JSON array of devices instead of text.
    #[arg(long)]
    pub json: bool,
}

/// `ibv_mtu` enum value of an MTU (1 = 256 .. 5 = 4096).
fn mtu_enum(m: Mtu) -> u32 {
    match m {
        Mtu::Mtu256 => 1,
        Mtu::Mtu512 => 2,
        Mtu::Mtu1024 => 3,
        Mtu::Mtu2048 => 4,
        Mtu::Mtu4096 => 5,
    }
}

fn sysfs(name: &str, what: &str) -> Option<String> {
    // Interface names never contain '/' (Linux `dev_valid_name`); refuse to build another path from one.
    if name.contains('/') || name == "." || name == ".." {
        return None;
    }
    std::fs::read_to_string(format!("/sys/class/net/{name}/{what}"))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// A GUID (big-endian bytes) as `ibv_devinfo` writes it: `aabb:ccdd:eeff:0011`.
fn guid_text(g: [u8; 8]) -> String {
    format!(
        "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
        g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
    )
}

/// A GID as IPv6 text (`::ffff:198.18.0.1`, `fe80::1`), as `ibv_devinfo` and the stats endpoint write it.
fn gid_text(g: Gid) -> String {
    std::net::Ipv6Addr::from(g.0).to_string()
}

/// Programs that have a device open on an address of `i` (any 127.0.0.0/8 or ::1 address for the loopback
/// interface): `{pid, comm, cmdline, gid}` (`comm`: the process name, as `ps` shows it).
fn users(i: &Interface) -> Vec<Value> {
    let ours = |g: &str| {
        g.parse::<std::net::Ipv6Addr>().is_ok_and(|v6| {
            let ip = v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4);
            i.addrs.contains(&ip) || (i.loopback && ip.is_loopback())
        })
    };
    let mut v = Vec::new();
    for ep in endpoint::endpoints() {
        let Ok(a) = endpoint::query(&ep.path, &json!({"get": "stats"}), Duration::from_secs(2))
        else {
            continue;
        };
        for d in a["devices"]
            .as_array()
            .map(|d| d.as_slice())
            .unwrap_or_default()
        {
            for g in d["gids"]
                .as_array()
                .map(|g| g.as_slice())
                .unwrap_or_default()
            {
                if g.as_str().is_some_and(ours) {
                    v.push(json!({
                        "pid": ep.pid,
                        "comm": a["comm"],
                        "cmdline": a["cmdline"],
                        "gid": g,
                    }));
                }
            }
        }
    }
    v
}

/// `ibv_devinfo`'s text for an `active_width` value (`width_str`): 1X, 4X, 8X, 12X, 2X.
fn width_text(w: u8) -> String {
    let name = match w {
        1 => "1X",
        2 => "4X",
        4 => "8X",
        8 => "12X",
        16 => "2X",
        _ => "invalid width",
    };
    format!("{name} ({w})")
}

/// `ibv_devinfo`'s text for an `active_speed` value (`speed_str`): SDR 2.5 Gbps .. NDR 100.0 Gbps per lane.
fn speed_text(s: u8) -> String {
    let name = match s {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        128 => "100.0 Gbps",
        _ => "invalid speed",
    };
    format!("{name} ({s})")
}

/// The extended-attribute lines `ibv_devinfo -v` prints (from `ibv_query_device_ex`) for what rocev2's
/// libibverbs answers: no on-demand paging, no completion timestamps, no TSO/RSS/WQs, no packet pacing, no tag
/// matching (every capability 0, `roce-ibverbs` `exports/extended.rs`). Tab layout as `ibv_devinfo` prints it.
const EXTENDED_TEXT: &str = "\tgeneral_odp_caps:\n\
\trc_odp_caps:\n\t\t\t\t\tNO SUPPORT\n\
\tuc_odp_caps:\n\t\t\t\t\tNO SUPPORT\n\
\tud_odp_caps:\n\t\t\t\t\tNO SUPPORT\n\
\txrc_odp_caps:\n\t\t\t\t\tNO SUPPORT\n\
\tcompletion_timestamp_mask not supported\n\
\tcore clock not supported\n\
\tdevice_cap_flags_ex:\t\t0x0\n\
\ttso_caps:\n\t\tmax_tso:\t\t\t0\n\
\trss_caps:\n\
\t\tmax_rwq_indirection_tables:\t\t\t0\n\
\t\tmax_rwq_indirection_table_size:\t\t\t0\n\
\t\trx_hash_function:\t\t\t\t0x0\n\
\t\trx_hash_fields_mask:\t\t\t\t0x0\n\
\tmax_wq_type_rq:\t\t\t0\n\
\tpacket_pacing_caps:\n\
\t\tqp_rate_limit_min:\t0kbps\n\
\t\tqp_rate_limit_max:\t0kbps\n\
\ttag matching not supported\n";

/// One device as JSON (`verbose` adds the limits): as a program opened on address `at` sees it when given, else
/// on the interface's default address (its first IPv4 address, else its first address). The GID table is that of
/// the device opened on that address (docs/DEVICE.md "GID table"): one entry, GID[0] = the address; the
/// interface's other addresses are listed apart (`other_addresses`: each is GID[0] of a device opened on it).
/// `None` when the address has vanished from the interface meanwhile.
fn device(i: &Interface, at: Option<IpAddr>, verbose: bool) -> Option<Value> {
    let netdev_mtu: u32 = sysfs(&i.name, "mtu")
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let active = port_mtu::ib_mtu_for_netdev(netdev_mtu);
    let first = i
        .addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(i.addrs.first())
        .copied()?;
    let ip = at.unwrap_or(first);
    let spec = DeviceSpec::for_ip(ip, RxMode::Socket).ok()?;
    let attr = roce_verbs::device_attr(&spec.engine_config(0));
    let in_use = users(i);
    let gids: Vec<String> = spec.gids().into_iter().map(gid_text).collect();
    let others: Vec<String> = i
        .addrs
        .iter()
        .filter(|a| **a != ip)
        .map(ToString::to_string)
        .collect();
    let (width, speed) = spec.width_and_speed();
    let guid = guid_text(spec.node_guid());
    let mut d = json!({
        "hca_id": device_name_of_interface(&i.name),
        "netdev": i.name,
        "address": ip.to_string(),
        "transport": "InfiniBand (0)",
        "fw_ver": env!("CARGO_PKG_VERSION"),
        "node_guid": guid,
        "sys_image_guid": guid,
        "vendor_id": format!("{VENDOR_ID:#06x}"),
        "vendor_part_id": VENDOR_PART_ID,
        "hw_ver": "0x0",
        "phys_port_cnt": 1,
        "port": {
            "port": 1,
            "state": if i.running { "PORT_ACTIVE (4)" } else { "PORT_DOWN (1)" },
            "max_mtu": format!("{} ({})", attr.max_mtu.bytes(), mtu_enum(attr.max_mtu)),
            "active_mtu": format!("{} ({})", active.bytes(), mtu_enum(active)),
            "netdev_mtu": netdev_mtu,
            "netdev_speed_mbps": spec.netdev_speed_mbps,
            "active_width": width_text(width),
            "active_speed": speed_text(speed),
            "sm_lid": 0,
            "port_lid": 0,
            "port_lmc": "0x00",
            "link_layer": "Ethernet",
            "gids": gids.iter().map(|g| json!({ "gid": g, "type": "RoCE v2" })).collect::<Vec<_>>(),
            "other_addresses": others,
            "in_use_by": in_use,
        },
    });
    if verbose {
        // The values rocev2's libibverbs answers (`roce-ibverbs` `ibv_query_device`, `ibv_query_port`), named as
        // `ibv_devinfo -v` names them.
        d["limits"] = json!({
            "max_mr_size": format!("{:#x}", attr.max_mr_size),
            "page_size_cap": format!("{PAGE_SIZE_CAP:#x}"),
            "max_qp": attr.max_qp,
            "max_qp_wr": attr.max_qp_wr,
            "device_cap_flags": format!("{:#010x}", roce_verbs::DEVICE_CAP_FLAGS),
            "max_sge": attr.max_sge,
            "max_sge_rd": attr.max_sge,
            "max_inline_data": attr.max_inline_data,
            "max_cq": attr.max_cq,
            "max_cqe": attr.max_cqe,
            "max_mr": attr.max_mr,
            "max_pd": attr.max_pd,
            "max_qp_rd_atom": attr.max_qp_rd_atom,
            "max_ee_rd_atom": 0,
            "max_res_rd_atom": attr.max_qp_rd_atom.saturating_mul(attr.max_qp).min(i32::MAX as u32),
            "max_qp_init_rd_atom": attr.max_qp_init_rd_atom,
            "max_ee_init_rd_atom": 0,
            "atomic_cap": "ATOMIC_HCA (1)",
            "max_ee": 0,
            "max_rdd": 0,
            "max_mw": attr.max_mw,
            "max_raw_ipv6_qp": 0,
            "max_raw_ethy_qp": 0,
            "max_mcast_grp": attr.max_mcast_grp,
            "max_mcast_qp_attach": attr.max_mcast_qp_attach,
            "max_total_mcast_qp_attach": attr.max_total_mcast_qp_attach,
            "max_ah": attr.max_ah,
            "max_fmr": 0,
            "max_srq": attr.max_srq,
            "max_srq_wr": attr.max_srq_wr,
            "max_srq_sge": attr.max_srq_sge.min(roce_verbs::MAX_SGE as u32),
            "max_pkeys": 1,
            "local_ca_ack_delay": 15,
            "num_comp_vectors": 1,
        });
        let p = &mut d["port"];
        p["phys_state"] = json!(if i.running {
            "LINK_UP (5)"
        } else {
            "DISABLED (3)"
        });
        p["max_msg_sz"] = json!(format!("{:#x}", attr.max_msg_sz));
        p["port_cap_flags"] = json!("0x00000000");
        p["port_cap_flags2"] = json!("0x0000");
        p["max_vl_num"] = json!("1 (1)");
        p["bad_pkey_cntr"] = json!("0x0");
        p["qkey_viol_cntr"] = json!("0x0");
        p["sm_sl"] = json!(0);
        p["pkey_tbl_len"] = json!(1);
        p["gid_tbl_len"] = json!(gids.len());
        p["subnet_timeout"] = json!(0);
        p["init_type_reply"] = json!(0);
    }
    Some(d)
}

fn text(d: &Value) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    let _ = writeln!(o, "hca_id:\t{}", s(&d["hca_id"]));
    for k in [
        "transport",
        "fw_ver",
        "node_guid",
        "sys_image_guid",
        "vendor_id",
        "vendor_part_id",
        "hw_ver",
        "phys_port_cnt",
    ] {
        let _ = writeln!(o, "\t{:<24}{}", format!("{k}:"), s(&d[k]));
    }
    if d["limits"].is_object() {
        // ibv_devinfo -v's order (max_inline_data is ours: ibv_devinfo does not print it).
        for k in [
            "max_mr_size",
            "page_size_cap",
            "max_qp",
            "max_qp_wr",
            "device_cap_flags",
            "max_sge",
            "max_sge_rd",
            "max_inline_data",
            "max_cq",
            "max_cqe",
            "max_mr",
            "max_pd",
            "max_qp_rd_atom",
            "max_ee_rd_atom",
            "max_res_rd_atom",
            "max_qp_init_rd_atom",
            "max_ee_init_rd_atom",
            "atomic_cap",
            "max_ee",
            "max_rdd",
            "max_mw",
            "max_raw_ipv6_qp",
            "max_raw_ethy_qp",
            "max_mcast_grp",
            "max_mcast_qp_attach",
            "max_total_mcast_qp_attach",
            "max_ah",
            "max_fmr",
            "max_srq",
            "max_srq_wr",
            "max_srq_sge",
            "max_pkeys",
            "local_ca_ack_delay",
        ] {
            let _ = writeln!(o, "\t{:<24}{}", format!("{k}:"), s(&d["limits"][k]));
            if k == "device_cap_flags" {
                // ibv_devinfo names each set bit on a line of its own.
                for (bit, name) in roce_verbs::DEVICE_CAP_FLAG_NAMES {
                    if roce_verbs::DEVICE_CAP_FLAGS & bit != 0 {
                        let _ = writeln!(o, "\t\t\t\t\t{name}");
                    }
                }
            }
        }
        o.push_str(EXTENDED_TEXT);
        let _ = writeln!(
            o,
            "\t{:<24}{}",
            "num_comp_vectors:",
            s(&d["limits"]["num_comp_vectors"])
        );
    }
    let p = &d["port"];
    let _ = writeln!(o, "\t\tport:\t1");
    let verbose = d["limits"].is_object();
    for k in [
        "state",
        "max_mtu",
        "active_mtu",
        "sm_lid",
        "port_lid",
        "port_lmc",
        "link_layer",
        "max_msg_sz",
        "port_cap_flags",
        "port_cap_flags2",
        "max_vl_num",
        "bad_pkey_cntr",
        "qkey_viol_cntr",
        "sm_sl",
        "pkey_tbl_len",
        "gid_tbl_len",
        "subnet_timeout",
        "init_type_reply",
        "active_width",
        "active_speed",
        "phys_state",
    ] {
        let shown = if matches!(k, "active_width" | "active_speed") {
            verbose
        } else {
            !p[k].is_null()
        };
        if shown {
            let _ = writeln!(o, "\t\t\t{:<16}{}", format!("{k}:"), s(&p[k]));
        }
    }
    let _ = writeln!(
        o,
        "\t\t\t{:<16}{} ({}), address {}",
        "netdev:",
        s(&d["netdev"]),
        s(&p["netdev_mtu"]),
        s(&d["address"])
    );
    for (i, g) in p["gids"]
        .as_array()
        .map(|v| v.as_slice())
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let _ = writeln!(o, "\t\t\tGID[{i:>3}]:\t{}, {}", s(&g["gid"]), s(&g["type"]));
    }
    for a in p["other_addresses"]
        .as_array()
        .map(|v| v.as_slice())
        .unwrap_or_default()
    {
        let _ = writeln!(
            o,
            "\t\t\t{:<16}{} (GID[0] of the device opened on it: `rocev2 devinfo -d {}`)",
            "other address:",
            s(a),
            s(a)
        );
    }
    for u in p["in_use_by"]
        .as_array()
        .map(|v| v.as_slice())
        .unwrap_or_default()
    {
        let _ = writeln!(
            o,
            "\t\t\tin use by:\tpid {} ({}) on {} (its GID[0])",
            u["pid"],
            s(&u["comm"]),
            s(&u["gid"])
        );
    }
    o
}

/// Whether interface `i` is what `-d` names: `rocev2_<name>`, `<name>`, or one of its addresses.
fn matches(i: &Interface, want: &str) -> bool {
    want == i.name
        || want == device_name_of_interface(&i.name)
        || want
            .parse::<IpAddr>()
            .is_ok_and(|a| i.addrs.contains(&a) || (i.loopback && a.is_loopback()))
}

/// Entry point of `rocev2 devinfo`.
pub fn run(a: &DevinfoArgs) -> ExitCode {
    let all = match interfaces() {
        Ok(v) => v,
        Err(e) => {
            eprintln!("rocev2 devinfo: listing the network interfaces: {e}");
            return ExitCode::from(1);
        }
    };
    // `-d ADDRESS`: the device as a program on that address sees it.
    let at = a.dev.as_deref().and_then(|d| d.parse::<IpAddr>().ok());
    let devs: Vec<Value> = all
        .iter()
        .filter(|i| !i.addrs.is_empty())
        .filter(|i| a.dev.as_deref().is_none_or(|w| matches(i, w)))
        .filter_map(|i| device(i, at, a.verbose))
        .collect();
    if devs.is_empty() {
        match &a.dev {
            Some(d) => eprintln!(
                "rocev2 devinfo: no device `{d}` (a rocev2 device is a network interface with an IP address; see \
                 `rocev2 devinfo`)"
            ),
            None => eprintln!("rocev2 devinfo: no network interface with an IP address"),
        }
        return ExitCode::from(1);
    }
    if a.json {
        println!("{}", Value::Array(devs));
    } else {
        for d in &devs {
            print!("{}", text(d));
            println!();
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_is_written_as_ibv_devinfo_does() {
        assert_eq!(
            guid_text([0, 0, 0xc6, 0xff, 0xfe, 0x12, 0, 1]),
            "0000:c6ff:fe12:0001"
        );
    }
}
