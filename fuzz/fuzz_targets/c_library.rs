//! Fuzz target `c_library`: libibverbs calls through roce-ibverbs' C entry points (open / close, PD, CQ, MR, QP with
//! fuzzer-chosen attributes, AH), with the misuse the library promises to detect (destroys of dead handles, NULL,
//! a second close). The harness and its invariants are in `fuzz/harness/c_library.rs` (shared with the replay test
//! `crates/roce-ibverbs/tests/fuzz_c_library.rs`). The device is 127.0.207.1 (loopback).

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../harness/c_library.rs"]
mod c_library;

fuzz_target!(|data: &[u8]| c_library::run(data));
