//! `rocev2 sim SCENARIO`: the thin adapter over roce-sim — summary table, `--json` (one object with `flows[]`
//! `throughput_gbps`, `jain`, queue percentiles, CNPs, mark fraction), `--csv DIR` (identical for the same seed),
//! `--plot DIR` (SVG), and one-line errors for a bad scenario.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{bin, scratch};
use serde_json::Value;

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../roce-sim/scenarios")
        .join(name)
}

fn sim(args: &[&std::ffi::OsStr]) -> Output {
    common::output_within(Command::new(bin()).arg("sim").args(args), common::RUN)
}

#[test]
fn json_csv_and_plot_of_the_single_flow_scenario() {
    let dir = scratch("sim-e1");
    let sc = scenario("e1_single_flow.toml");
    let (csv1, csv2, plots) = (dir.join("a"), dir.join("b"), dir.join("p"));
    let out = sim(&[
        sc.as_os_str(),
        "--json".as_ref(),
        "--csv".as_ref(),
        csv1.as_os_str(),
        "--plot".as_ref(),
        plots.as_os_str(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    let flows = v["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), 1);
    let t = flows[0]["throughput_gbps"].as_f64().unwrap();
    assert!((t - 40.0).abs() < 0.04, "E1 throughput {t}");
    assert_eq!(v["jain"].as_f64(), Some(1.0));
    assert_eq!(v["cnps"].as_u64(), Some(0));
    assert_eq!(v["mark_fraction"].as_f64(), Some(0.0));
    for k in [
        "queue_p50_bytes",
        "queue_p95_bytes",
        "queue_p99_bytes",
        "queue_mean_bytes",
    ] {
        assert!(v[k].is_number(), "{k}");
    }
    for f in ["rates.svg", "queue.svg"] {
        let svg = std::fs::read_to_string(plots.join(f)).expect(f);
        assert!(
            svg.contains("<svg") && svg.contains("polyline"),
            "{f} is a plot"
        );
    }
    // Same scenario, same seed: byte-identical CSV; the table names the scenario.
    let out = sim(&[sc.as_os_str(), "--csv".as_ref(), csv2.as_os_str()]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("scenario e1_single_flow"));
    for f in ["flows.csv", "queue.csv"] {
        let a = std::fs::read(csv1.join(f)).unwrap();
        assert!(a.len() > 100, "{f}");
        assert_eq!(
            a,
            std::fs::read(csv2.join(f)).unwrap(),
            "{f} differs between equal runs"
        );
    }
}

#[test]
fn bad_scenarios_are_one_line_errors() {
    let dir = scratch("sim-bad");
    let good = std::fs::read_to_string(scenario("e1_single_flow.toml")).unwrap();
    for (name, text, want) in [
        (
            "unknown_key",
            good.replace("seed = 1", "seed = 1\nsead = 2"),
            "sead",
        ),
        (
            "kmin_gt_kmax",
            good.replace("kmin_bytes = 5000", "kmin_bytes = 500000"),
            "kmin_bytes",
        ),
        (
            "profile",
            good.replace("profile = \"paper\"", "profile = \"cubic\""),
            "cubic",
        ),
        (
            "no_flows",
            good.replace("[[flow]]\nsender = 0\n", ""),
            "flow",
        ),
    ] {
        let p = dir.join(format!("{name}.toml"));
        std::fs::write(&p, text).unwrap();
        let out = sim(&[p.as_os_str()]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("rocev2 sim: ") && err.contains(want),
            "{name}: {err}"
        );
    }
    let out = sim(&[dir.join("missing.toml").as_os_str()]);
    assert_eq!(out.status.code(), Some(2));
}

/// `--export-ns3 DIR` writes the HPCC ns-3 input files without running, and they parse back into E5's topology and
/// flows.
#[test]
fn export_ns3_writes_the_hpcc_input_files() {
    let dir = scratch("sim-ns3").join("e5");
    let sc = scenario("e5_incast_8.toml");
    let out = sim(&[sc.as_os_str(), "--export-ns3".as_ref(), dir.as_os_str()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let read =
        |n: &str| std::fs::read_to_string(dir.join(n)).unwrap_or_else(|e| panic!("{n}: {e}"));
    let back = roce_sim::ns3::import(
        &read("topology.txt"),
        &read("flow.txt"),
        &read("config.txt"),
    )
    .unwrap();
    let want = roce_sim::Scenario::load(&sc).unwrap();
    assert_eq!(roce_sim::ns3::carried(&back), roce_sim::ns3::carried(&want));
    assert!(read("config.txt").contains("CC_MODE 1\n"));
    assert!(read("NOTES.txt").contains("enqueue"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not carried over"));
}
