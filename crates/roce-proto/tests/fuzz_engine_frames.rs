//! The fuzz target `engine_frames` in the normal test command (issue #21): replays its seeds
//! (`fuzz/seeds/engine_frames/`) and regression inputs (`fuzz/regressions/engine_frames/`, one file per crash the
//! fuzzer found) through the same harness the target runs (`fuzz/harness/engine_frames.rs`), then pseudo-random
//! programs (3,000 in release, 300 in debug; fixed seed, so a failure reproduces). The harness panics when an
//! invariant breaks: a panic in the engine, a completion twice or never, or a write to a guarded MR byte.

#[path = "../../../fuzz/harness/engine_frames.rs"]
mod engine_frames;

#[path = "../../../fuzz/harness/replay.rs"]
mod replay;

#[test]
fn engine_frames_seeds_and_regressions() {
    let n = replay::replay_dirs("engine_frames", engine_frames::run);
    assert!(n > 0, "no seed inputs found for engine_frames");
}

#[test]
fn engine_frames_random_programs() {
    // About 1 s in release (the README's test command), 6 s in a debug build.
    let count = if cfg!(debug_assertions) { 300 } else { 3000 };
    replay::random_inputs(0xE6F1, count, 1200, engine_frames::run);
}

/// The seeds reach the engine: frames flow, WRs complete, some with an error.
#[test]
fn engine_frames_seeds_do_work() {
    for seed in [
        "rc_all_ops",
        "rc_mutated",
        "rc_loss_dup_naks",
        "forged",
        "uc_ud",
    ] {
        let data = std::fs::read(format!(
            "{}/../../fuzz/seeds/engine_frames/{seed}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let st = engine_frames::run_stats(&data);
        eprintln!("{seed}: {st:?}");
        assert!(st.delivered >= 4 && st.completions >= 10, "{seed}: {st:?}");
    }
}
