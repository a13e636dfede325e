//! roce-fork: process-global state that a `fork`ed child gets afresh.
//!
//! rocev2's C libraries (`libibverbs.so.1`, `librdmacm.so.1`) keep some state in process globals behind a lock, and
//! their own threads (the runtime's progress thread, the rdma_cm dispatcher) take those locks. `fork(2)` copies the
//! memory of the calling thread's process but only the calling thread: a lock one of the other threads held at that
//! instant stays held in the child for ever, and the child's first call that takes it waits until it is killed
//! (CI finding: forked children stuck in `rdma_create_id`, about 1 run in 8 of `forkcm.c`).
//!
//! rdma-core's rule is that a child may not use its parent's verbs or rdma_cm resources (ibv_fork_init(3); the
//! parent's ids, channels and runtimes are the parent's). So the state behind such a lock is worth nothing to the
//! child, and [`ForkLocal`] gives each process a lock and value of its own: the first use in a process that did not
//! create the current one makes a fresh one from the initialiser and leaks the inherited copy, untouched (its
//! teardown would wait for threads that do not exist here). No `pthread_atfork` handler, so no lock ordering
//! between libraries to get right, and nothing is ever waited for at the fork.
//!
//! Cost: one `getpid(2)` per [`ForkLocal::lock`] — for control paths, not per packet.

#![warn(missing_docs)]

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard};

/// The value of one process: made by that process, never freed (a child leaks its parent's, see the crate docs).
struct Slot<T> {
    pid: u32,
    mutex: Mutex<T>,
}

/// A process-global `Mutex<T>` that each process — the one that loads the library and every `fork`ed child — has
/// afresh (see the crate docs). Use it as a `static`:
///
/// ```
/// use roce_fork::ForkLocal;
/// static TABLE: ForkLocal<Vec<u32>> = ForkLocal::new(Vec::new);
/// TABLE.lock().push(7);
/// assert_eq!(*TABLE.lock(), [7]);
/// ```
pub struct ForkLocal<T> {
    /// The current process's slot, or NULL before the first use, or the parent's slot in a child that has not
    /// used it yet. Only ever replaced by a newer leaked `Box<Slot<T>>`.
    slot: AtomicPtr<Slot<T>>,
    init: fn() -> T,
    /// What a child makes of its parent's value when that was not locked at the fork ([`inheriting`](Self::inheriting)).
    inherit: Option<fn(&T) -> T>,
}

impl<T> ForkLocal<T> {
    /// A global whose value starts as `init()` in each process, at its first [`lock`](Self::lock).
    pub const fn new(init: fn() -> T) -> Self {
        ForkLocal {
            slot: AtomicPtr::new(std::ptr::null_mut()),
            init,
            inherit: None,
        }
    }

    /// Like [`new`](Self::new), but a child starts from `inherit(&parent's value)` when no thread held the parent's
    /// lock at the fork (the value is then consistent), and from `init()` when one did (the value may be half
    /// updated: it is not read). For tables a child may still consult, e.g. to close what it inherited.
    pub const fn inheriting(init: fn() -> T, inherit: fn(&T) -> T) -> Self {
        ForkLocal {
            slot: AtomicPtr::new(std::ptr::null_mut()),
            init,
            inherit: Some(inherit),
        }
    }

    /// This process's mutex (created on first use in this process).
    pub fn get(&self) -> &Mutex<T> {
        let pid = std::process::id();
        loop {
            let cur = self.slot.load(Ordering::Acquire);
            // SAFETY: a non-NULL `slot` is a `Box<Slot<T>>` leaked by `Box::into_raw` below and never freed, so it
            // is valid for the life of the process (`self` is a `static`, or at least outlives the borrow).
            if let Some(s) = unsafe { cur.as_ref() }
                && s.pid == pid
            {
                return &s.mutex;
            }
            // SAFETY: as above.
            let value = match (unsafe { cur.as_ref() }, self.inherit) {
                // A child: the parent's lock is free, so its value is whole (a lock held at the fork stays held
                // here for ever and `try_lock` says so without waiting).
                (Some(parent), Some(inherit)) => match parent.mutex.try_lock() {
                    Ok(g) => inherit(&g),
                    Err(_) => (self.init)(),
                },
                _ => (self.init)(),
            };
            let fresh = Box::into_raw(Box::new(Slot {
                pid,
                mutex: Mutex::new(value),
            }));
            match self
                .slot
                .compare_exchange(cur, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // The inherited slot (if any) is leaked: it is the parent's state.
                // SAFETY: just published; never freed (see above).
                Ok(_) => return unsafe { &(*fresh).mutex },
                Err(_) => {
                    // Another thread of this process published first: ours was never shared.
                    // SAFETY: `fresh` came from `Box::into_raw` above and nobody else saw it.
                    drop(unsafe { Box::from_raw(fresh) });
                }
            }
        }
    }

    /// Locks this process's value (a poisoned lock is taken over: the value is the state of a library call that
    /// panicked inside its guard, which the libraries tolerate).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.get().lock().unwrap_or_else(|p| p.into_inner())
    }
}

// SAFETY: the slot is shared between threads only through its `Mutex<T>`, which is `Sync` when `T: Send`; the
// `init` function pointer is plain data.
unsafe impl<T: Send> Sync for ForkLocal<T> {}
// SAFETY: as above; moving the handle moves a pointer to a leaked slot.
unsafe impl<T: Send> Send for ForkLocal<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_value_per_process() {
        static G: ForkLocal<u32> = ForkLocal::new(|| 5);
        *G.lock() += 1;
        assert_eq!(*G.lock(), 6);
        assert!(std::ptr::eq(G.get(), G.get()));
    }

    /// Runs `check` in a forked child (ended by SIGALRM after 5 s if it blocks) and returns the child's wait status:
    /// 0 when `check` said true.
    fn in_child(check: impl FnOnce() -> bool) -> i32 {
        // SAFETY: the child only calls async-signal-safe functions besides the lock under test (alarm, _exit, and
        // malloc, which glibc makes usable in a child of a threaded process).
        let pid = unsafe { libc_fork() };
        if pid == 0 {
            // SAFETY: plain syscalls in the child.
            unsafe { alarm(5) };
            let ok = check();
            // SAFETY: ends the child without running the parent's destructors or test harness.
            unsafe { _exit(if ok { 0 } else { 1 }) };
        }
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { waitpid(pid, &mut status, 0) }, pid);
        status
    }

    /// Runs `f` while another thread holds `g`'s lock, then lets it go.
    fn while_held<T: Send, R>(g: &'static ForkLocal<T>, f: impl FnOnce() -> R) -> R {
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let guard = g.lock();
            held_tx.send(()).unwrap();
            release_rx.recv().unwrap();
            drop(guard);
        });
        held_rx.recv().unwrap();
        let r = f();
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        r
    }

    /// A child forked while another thread holds the lock gets a fresh value at once, and the parent's lock and
    /// value are untouched. Fails (the child is killed by its alarm after 5 s, or sees 41) with a plain global
    /// `Mutex`.
    #[test]
    fn a_child_forked_while_another_thread_holds_the_lock_is_not_blocked() {
        static G: ForkLocal<u32> = ForkLocal::new(|| 0);
        *G.lock() = 41;
        let status = while_held(&G, || in_child(|| *G.lock() == 0));
        assert_eq!(
            status, 0,
            "child status {status:#x} (0xe: killed by its alarm)"
        );
        assert_eq!(*G.lock(), 41);
    }

    /// `inheriting`: a child forked while the lock is free starts from the parent's value (mapped); one forked while
    /// another thread holds it starts from `init`, at once.
    #[test]
    fn an_inheriting_global_copies_a_free_value_and_skips_a_held_one() {
        static G: ForkLocal<Vec<u32>> =
            ForkLocal::inheriting(Vec::new, |v| v.iter().map(|x| x + 100).collect());
        G.lock().push(1);
        let child = |expect: &'static [u32]| in_child(|| G.lock().as_slice() == expect);
        assert_eq!(child(&[101]), 0, "a free lock: the value is inherited");
        let status = while_held(&G, || child(&[]));
        assert_eq!(
            status, 0,
            "a held lock: a fresh value at once (0xe: stuck until the alarm)"
        );
        assert_eq!(*G.lock(), [1]);
    }

    unsafe extern "C" {
        #[link_name = "fork"]
        fn libc_fork() -> i32;
        fn alarm(secs: u32) -> u32;
        fn _exit(code: i32) -> !;
        fn waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
    }
}
