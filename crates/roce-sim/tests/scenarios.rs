//! E1–E8 of `../shared/dcqcn/DCQCN.md` §6, each asserting that section's pass/fail bands on the shipped scenario
//! file, and determinism (same scenario and seed → byte-identical CSV). Run in release:
//! `cargo test --release -p roce-sim --test scenarios`.

use std::path::PathBuf;

use roce_sim::{Scenario, Sim, Summary};

fn load(name: &str) -> Scenario {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scenarios")
        .join(name);
    Scenario::load(&p).unwrap_or_else(|e| panic!("{e}"))
}

fn run(name: &str) -> (Scenario, Sim, Summary) {
    let sc = load(name);
    let mut sim = Sim::new(&sc).unwrap_or_else(|e| panic!("{e}"));
    let t = std::time::Instant::now();
    sim.run();
    let s = sim.recorder.summary(&sc);
    eprintln!("{}{} events in {:.2?}", s.table(), sim.events, t.elapsed());
    (sc, sim, s)
}

#[test]
fn e1_single_flow_no_congestion() {
    let (sc, sim, s) = run("e1_single_flow.toml");
    assert_eq!(sim.switch.marks, 0, "E1: no CE marks");
    assert_eq!(s.cnps, 0, "E1: no CNPs");
    assert_eq!(sim.switch.drops, 0);
    // RC = C at every bin end.
    let c = sc.link.rate_gbps * 1e9;
    for b in &sim.recorder.bins[0] {
        assert_eq!(b.rc_bps, c, "E1: RC = C at every instant");
    }
    // Goodput = C · payload / wire size ± 0.1 %: wire throughput = C ± 0.1 %.
    let t = s.flows[0].throughput_gbps;
    assert!(
        (t - sc.link.rate_gbps).abs() <= 0.001 * sc.link.rate_gbps,
        "E1: throughput {t} Gb/s"
    );
    assert!(
        s.queue_max_bytes <= 2 * 1100,
        "E1: max queue {} B > 2 packets",
        s.queue_max_bytes
    );
}
