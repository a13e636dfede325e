//! Synchronisation facade (`STYLE-progress-memory.md` §4 L1, tokio's `loom` module): the std types normally, loom's
//! under `RUSTFLAGS="--cfg loom"`, so the loom models in `progress` check the very code the runtime runs.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

pub(crate) use std::sync::TryLockError;
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering, fence};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
