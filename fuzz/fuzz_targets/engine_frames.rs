//! Fuzz target `engine_frames`: two roce-proto engines with live RC, UC and UD QPs fed a fuzzer-chosen program of
//! posts, real frames (delivered, dropped, duplicated or mutated), forged frames, raw bytes and time steps. The
//! harness and its invariants are in `fuzz/harness/engine_frames.rs` (shared with the replay test
//! `crates/roce-proto/tests/fuzz_engine_frames.rs`).

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness/engine_frames.rs"]
mod engine_frames;

fuzz_target!(|data: &[u8]| engine_frames::run(data));
