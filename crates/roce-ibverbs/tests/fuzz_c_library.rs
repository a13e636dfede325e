//! The fuzz target `c_library` in the normal test command (issue #21): replays its seeds (`fuzz/seeds/c_library/`)
//! and regression inputs (`fuzz/regressions/c_library/`) through the harness the target runs
//! (`fuzz/harness/c_library.rs`: the library's C entry points, misuse included), then a bounded number of
//! pseudo-random call sequences (fixed seed). One test function: the harness sets `ROCEV2_IBV_IP` (127.0.207.1,
//! loopback) before its first call into the library.

#[path = "../../../fuzz/harness/c_library.rs"]
mod c_library;

#[path = "../../../fuzz/harness/replay.rs"]
mod replay;

#[test]
fn c_library_seeds_regressions_and_random_calls() {
    let data = std::fs::read(format!(
        "{}/../../fuzz/seeds/c_library/objects_and_double_destroys",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let st = c_library::run_stats(&data);
    eprintln!("{st:?}");
    assert!(
        st.created >= 8 && st.destroyed >= 4 && st.refused >= 4,
        "{st:?}"
    );
    let n = replay::replay_dirs("c_library", c_library::run);
    assert!(n > 0, "no seed inputs found for c_library");
    replay::random_inputs(0xC11B, 300, 600, c_library::run);
}
