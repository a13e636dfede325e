//! In-crate tests with a two-engine harness (`Pair`, after quinn-proto `tests/util.rs`).
mod api_tests;
mod cc_tests;
mod completer_tests;
mod fuzz_tests;
mod gsi_tests;
mod hostile_peer_tests;
mod hostile_tests;
mod loss_tests;
mod mem_tests;
mod mw_tests;
mod pair_tests;
mod random_tests;
mod rereg_tests;
mod responder_tests;
mod srq_tests;
mod state_tests;
mod util;
