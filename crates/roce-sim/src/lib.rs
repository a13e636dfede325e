//! roce-sim: a packet-level discrete-event simulator whose hosts are the product's own sans-IO engines
//! ([`roce_proto::Engine`]: real RC QPs posting real RDMA WRITE WRs, real frames with ICRC, the engine's own DCQCN
//! reaction and notification points) behind one ECN-marking shared-buffer switch — the congestion point and the
//! fabric of `docs/spec/DCQCN.md` (issue #20).
//!
//! * [`scenario`]: scenarios as data (TOML or JSON): N senders → switch → 1 receiver, link rate and delay, switch
//!   buffer and ECN ramp, CC profile and parameters, flows, seed, duration. `scenarios/` ships E1–E8 of
//!   `DCQCN.md` §6.
//! * [`net`]: the event loop (virtual time in ns, the [`queue`] of pending events, seeded randomness only, no wall
//!   clock), hosts,
//!   links that serialise frames, the switch (strict-priority CNP queue, ECN ramp at enqueue or dequeue, tail drop,
//!   optional PFC pause).
//! * [`stats`]: per-flow throughput, Jain fairness, queue statistics, CNPs, marks, convergence; CSV series.
//! * [`ns3`]: the scenario as HPCC ns-3 input (`topology.txt`, `flow.txt`, `config.txt` with `CC_MODE 1`) and a
//!   parser of that format (`rocev2 sim --export-ns3 DIR`; mapping and what does not carry over in
//!   `docs/SIMULATOR.md`).
//!
//! ```no_run
//! let sc = roce_sim::Scenario::load("crates/roce-sim/scenarios/e3_two_flows.toml".as_ref()).unwrap();
//! let mut sim = roce_sim::Sim::new(&sc).unwrap();
//! sim.run();
//! println!("{}", sim.recorder.summary(&sc).table());
//! ```
//!
//! The scenario files are the §6 setups at full scale (40 Gb/s, 1 µs links, 20–100 ms): nothing was scaled down,
//! each runs in about a second on one core in a release build (3–6 million events per second of CPU time on the development VM;
//! `benches/speed.rs` and `BENCHMARKS.md`). One deviation
//! from §6: data packets are 1082 B frames (PMTU 1024 + headers; 1106 B on the wire) rather than 1000 B.
//! `cargo test --release -p roce-sim --test scenarios` asserts the §6 bands (E3's marked fraction against the fluid
//! model instead, `docs/spec/DCQCN.md` §6.1).
//!
//! PFC is simplified (`scenario::PfcSpec`: one lossless class, per-ingress XOFF/XON, the pause acts one propagation
//! delay later). Not modelled (yet): several switches, READ flows.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod net;
pub mod ns3;
pub mod queue;
pub mod scenario;
pub mod stats;

pub use net::{Sim, SwitchCounters};
pub use scenario::{Scenario, ScenarioError};
pub use stats::{Recorder, Summary};

/// Runs a scenario to its end and returns the simulation (for its recorder and counters) and the summary.
///
/// # Errors
/// As [`Sim::new`].
pub fn run(sc: &Scenario) -> Result<(Sim, Summary), ScenarioError> {
    let mut sim = Sim::new(sc)?;
    sim.run();
    let s = sim.recorder.summary(sc);
    Ok((sim, s))
}
