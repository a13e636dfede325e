//! The fuzz target `verbs_calls` in the normal test command (issue #21): replays its seeds
//! (`fuzz/seeds/verbs_calls/`) and regression inputs (`fuzz/regressions/verbs_calls/`) through the harness the
//! target runs (`fuzz/harness/verbs_calls.rs`), then a bounded number of pseudo-random call sequences (fixed seed).
//! The harness panics on a panic in the library or a completion that is not owed.

#[path = "../../../fuzz/harness/verbs_calls.rs"]
mod verbs_calls;

#[path = "../../../fuzz/harness/replay.rs"]
mod replay;

#[test]
fn verbs_calls_seeds_and_regressions() {
    let n = replay::replay_dirs("verbs_calls", verbs_calls::run);
    assert!(n > 0, "no seed inputs found for verbs_calls");
}

#[test]
fn verbs_calls_random_programs() {
    replay::random_inputs(0x7E4B5, 300, 1500, verbs_calls::run);
}

/// The seeds reach the library: calls succeed and WRs complete.
#[test]
fn verbs_calls_seeds_do_work() {
    let data = std::fs::read(format!(
        "{}/../../fuzz/seeds/verbs_calls/rc_pair_traffic",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let st = verbs_calls::run_stats(&data);
    eprintln!("{st:?}");
    assert!(st.ok >= 10 && st.completions >= 4, "{st:?}");
}
