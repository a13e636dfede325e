//! `--export-ns3`: the HPCC ns-3 input written for E3 and E5 parses back (with the format's own parser,
//! `roce_sim::ns3`, which reads the files as `third.cc` does) into the same topology, switch ramp and flows, and
//! `config.txt` carries `CC_MODE 1` and the scenario's DCQCN parameters under HPCC's keys.

use std::path::{Path, PathBuf};

use roce_sim::Scenario;
use roce_sim::ns3::{self, Ns3Export};

fn load(name: &str) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(name);
    Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"))
}

fn round_trip(name: &str) -> (Scenario, Ns3Export) {
    let sc = load(name);
    let ex = Ns3Export::from_scenario(&sc, Path::new("mix/x")).unwrap();
    let back =
        ns3::import(&ex.topology, &ex.flow, &ex.config).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(ns3::carried(&back), ns3::carried(&sc), "{name}");
    (sc, ex)
}

#[test]
fn e3_export_parses_back_into_the_same_topology_and_flows() {
    let (sc, ex) = round_trip("e3_two_flows.toml");
    // Two senders and the receiver, each linked to the switch (node 3) at 40 Gb/s, 1 µs.
    let t = ns3::parse_topology(&ex.topology).unwrap();
    assert_eq!((t.nodes, t.switches.clone()), (4, vec![3]));
    assert_eq!(t.links.len(), 3);
    for (h, l) in t.links.iter().enumerate() {
        assert_eq!(
            (l.src, l.dst, l.rate_bps, l.delay_ps),
            (h as u32, 3, 40_000_000_000, 1_000_000)
        );
    }
    let f = ns3::parse_flows(&ex.flow).unwrap();
    assert_eq!(f.len(), 2);
    for (i, fl) in f.iter().enumerate() {
        assert_eq!(
            (fl.src, fl.dst, fl.pg, fl.dport, fl.start_s),
            (i as u32, 2, 3, 100, 0.0)
        );
        // Backlogged: at least what 40 Gb/s carries in 60 ms of 1024-B payloads in 1106-B frames.
        assert!(
            u64::from(fl.size) >= 40_000_000_000 / 8 * 60 / 1000 * 1024 / 1106,
            "{}",
            fl.size
        );
    }
    let cfg = ns3::parse_config(&ex.config).unwrap();
    let v = |k| ns3::config_value(&cfg, k).unwrap().to_owned();
    // The paper profile's parameters (DCQCN.md §3) under CC_MODE 1's keys.
    for (k, want) in [
        ("CC_MODE", "1"),
        ("ENABLE_QCN", "1"),
        ("EWMA_GAIN", "0.00390625"),
        ("ALPHA_RESUME_INTERVAL", "55"),
        ("RATE_DECREASE_INTERVAL", "50"),
        ("RP_TIMER", "55"),
        ("FAST_RECOVERY_TIMES", "5"),
        ("RATE_AI", "40Mbps"),
        ("RATE_HAI", "200Mbps"),
        ("MIN_RATE", "100Mbps"),
        ("CLAMP_TARGET_RATE", "1"),
        ("SIMULATOR_STOP_TIME", "0.06"),
        ("PACKET_PAYLOAD_SIZE", "1024"),
        ("TOPOLOGY_FILE", "mix/x/topology.txt"),
    ] {
        assert_eq!(v(k), want, "{k}");
    }
    assert_eq!(
        ns3::config_map(&cfg, "KMIN_MAP", 40_000_000_000).unwrap(),
        5.0
    );
    assert_eq!(
        ns3::config_map(&cfg, "KMAX_MAP", 40_000_000_000).unwrap(),
        200.0
    );
    assert_eq!(
        ns3::config_map(&cfg, "PMAX_MAP", 40_000_000_000).unwrap(),
        0.01
    );
    // Enqueue marking and the absence of PFC are reported as not carried over.
    assert!(
        ex.notes.iter().any(|n| n.contains("enqueue")),
        "{:?}",
        ex.notes
    );
    assert!(
        ex.notes.iter().any(|n| n.contains("no PFC")),
        "{:?}",
        ex.notes
    );
    assert_eq!(sc.flows.len(), 2);
}

#[test]
fn e5_export_parses_back_into_the_same_topology_and_flows() {
    let (_, ex) = round_trip("e5_incast_8.toml");
    let t = ns3::parse_topology(&ex.topology).unwrap();
    assert_eq!((t.nodes, t.switches, t.links.len()), (10, vec![9], 9));
    assert_eq!(ns3::parse_flows(&ex.flow).unwrap().len(), 8);
}

/// The round trip can fail: a changed link, flow or ramp in the files no longer compares equal, and a sized flow
/// stays sized.
#[test]
fn a_changed_export_does_not_compare_equal() {
    let sc = load("e3_two_flows.toml");
    let ex = Ns3Export::from_scenario(&sc, Path::new("d")).unwrap();
    let same = |t: &str, f: &str, c: &str| {
        ns3::carried(&ns3::import(t, f, c).unwrap()) == ns3::carried(&sc)
    };
    assert!(same(&ex.topology, &ex.flow, &ex.config));
    assert!(!same(
        &ex.topology.replace("1000ns", "2000ns"),
        &ex.flow,
        &ex.config
    ));
    assert!(!same(
        &ex.topology,
        &later_second_flow(&ex.flow),
        &ex.config
    ));
    assert!(!same(
        &ex.topology,
        &ex.flow,
        &ex.config
            .replace("KMIN_MAP 1 40000000000 5", "KMIN_MAP 1 40000000000 6")
    ));
    let mut sized = sc.clone();
    sized.flows[1].bytes = Some(1_000_000);
    let ex = Ns3Export::from_scenario(&sized, Path::new("d")).unwrap();
    let back = ns3::import(&ex.topology, &ex.flow, &ex.config).unwrap();
    assert_eq!(back.flows[1].bytes, Some(1_000_000));
    assert_eq!(back.flows[0].bytes, None);
}

/// `flow.txt` with its last flow starting 1 ms later.
fn later_second_flow(flow: &str) -> String {
    let i = flow.trim_end().rfind(' ').unwrap();
    format!("{} 0.001\n", &flow[..i])
}

/// Flows are written sorted by start (third.cc schedules them in file order) and the reordering is noted.
#[test]
fn flows_are_sorted_by_start() {
    let mut sc = load("e4_late_joiner.toml");
    sc.flows.swap(0, 2);
    let ex = Ns3Export::from_scenario(&sc, Path::new("d")).unwrap();
    let f = ns3::parse_flows(&ex.flow).unwrap();
    assert!(f.windows(2).all(|w| w[0].start_s <= w[1].start_s));
    assert!(
        ex.notes.iter().any(|n| n.contains("reordered")),
        "{:?}",
        ex.notes
    );
    assert_eq!(
        ns3::carried(&ns3::import(&ex.topology, &ex.flow, &ex.config).unwrap()),
        ns3::carried(&sc)
    );
}
