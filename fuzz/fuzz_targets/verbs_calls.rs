//! Fuzz target `verbs_calls`: arbitrary sequences of verbs calls through roce-verbs' Rust API on a simulated pair
//! of devices in caller progress mode (create, modify, post, poll, destroy, deregister in any order, misuse
//! included). The harness and its invariants are in `fuzz/harness/verbs_calls.rs` (shared with the replay test
//! `crates/roce-verbs/tests/fuzz_verbs_calls.rs`).

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness/verbs_calls.rs"]
mod verbs_calls;

fuzz_target!(|data: &[u8]| verbs_calls::run(data));
