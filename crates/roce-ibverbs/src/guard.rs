//! No Rust panic crosses the C boundary: every C entry point that does more than return a constant runs its body
//! in [`guard`], which catches a panic (an invariant broken inside the library, a bug) and answers the program
//! with the entry point's error return instead of letting it unwind into C (undefined) or abort the host process.
//! The panic's message is printed by the standard hook; the answer is `EIO` in the form the verb's man page gives
//! for errors (an errno value, -1 with `errno`, NULL with `errno`, or nothing for a `void` verb).
//!
//! Test hook: with `ROCEV2_IBVERBS_INJECT_PANIC=<C name>` (e.g. `ibv_alloc_pd`) in the environment, that entry
//! point panics inside its guard on every call (`tests/c/panic.c`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

/// The environment variable of the test hook (module docs).
pub(crate) const ENV_INJECT: &str = "ROCEV2_IBVERBS_INJECT_PANIC";

fn inject(name: &str) {
    static WHICH: OnceLock<Option<String>> = OnceLock::new();
    if WHICH
        .get_or_init(|| std::env::var(ENV_INJECT).ok())
        .as_deref()
        == Some(name)
    {
        panic!("{ENV_INJECT}: injected panic in {name}");
    }
}

/// Runs `body` (the entry point `name`'s work); if it panics, returns `on_panic()` (which sets `errno` where the
/// verb reports through it).
pub(crate) fn guard<R>(name: &str, on_panic: impl FnOnce() -> R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(|| {
        inject(name);
        body()
    })) {
        Ok(r) => r,
        Err(_) => on_panic(),
    }
}
