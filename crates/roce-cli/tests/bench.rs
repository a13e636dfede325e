//! `rocev2 bench engine --json` runs briefly (smoke): the object has the documented keys with sane values and the
//! data checks passed (every frame fully checked). No timing is asserted.

mod common;

use std::process::Command;

#[test]
fn bench_engine_json_smoke() {
    let out = common::output_within(
        Command::new(env!("CARGO_BIN_EXE_rocev2")).args([
            "bench",
            "engine",
            "--json",
            "--reps",
            "1",
            "--sample-ms",
            "2",
            "--check-every",
            "1",
        ]),
        common::RUN,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    let pos = |k: &str| {
        let x = v[k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {v}"));
        assert!(x.is_finite() && x > 0.0, "{k} = {x}");
        x
    };
    pos("send64_msgs_per_s");
    pos("write4k_gbps");
    pos("baseline_memcpy_crc32_gbps");
    pos("loopback_send64_msgs_per_s");
    pos("loopback_write4k_gbps");
    // 4 KiB messages: Gb/s and messages/s agree.
    let w = pos("write4k_msgs_per_s");
    let g = pos("write4k_gbps");
    assert!((w * 4096.0 * 8.0 / 1e9 - g).abs() < 1e-6 * g.max(1.0));
    let pl = v["post_list"].as_object().expect("post_list object");
    for k in ["1", "4", "8", "16", "32"] {
        let x = pl[k].as_f64().expect("post-list rate");
        assert!(x.is_finite() && x > 0.0, "post_list {k} = {x}");
    }
    assert_eq!(v["verified"], true);
    assert_eq!(v["bad_frames"], 0);
    assert_eq!(
        v["full_checks"], v["frames"],
        "--check-every 1 checks every frame"
    );
}
