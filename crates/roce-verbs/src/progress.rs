//! The progress lock and the sleep flag: how any thread may drive a device's engine without losing a post or a
//! wake-up (`STYLE-progress-memory.md` §3; Linux qdisc `MISSED`, io-uring `need_wakeup`).
//!
//! # Progress lock (`ProgressLock`)
//!
//! The engines and links of a device group sit behind one mutex taken with `try_lock`. A thread that finds it held
//! does not wait: it raises `missed` and leaves; the holder, after unlocking, checks `missed` and runs another pass
//! on that thread's behalf. The handshake (Dekker's, with SeqCst fences on both sides):
//!
//! * loser: publishes its work (ring push, doorbell) → `missed.swap(true)` → fence → `try_lock` once more (the
//!   holder may have checked `missed` just before the swap; then it has unlocked, and this retry wins);
//! * holder: `missed.swap(false)` under the lock → pass → unlock → fence → `missed.load()`: set → `try_lock` again.
//!
//! Either the holder's load sees the loser's flag, or the loser's retry sees the holder's unlock; and a holder that
//! clears the flag (an RMW, so it synchronises with every earlier setter) runs its pass after seeing their work. So
//! a post made while another thread drives the engine is handled by a pass that starts after it. A holder runs at
//! most `max_rounds` passes (a poster never drives other threads' traffic for long); if `missed` is still set then,
//! it says so (`Outcome::left_missed`) and the caller wakes the progress thread, which serves it.
//!
//! # Sleep flag (`SleepFlag`)
//!
//! A thread that is about to block (the progress thread, a [`crate::CompChannel::get_event`] waiter) announces it
//! (`parked += 1`, fence, re-check for work, block in `ppoll` on the waiter's eventfd and the links' receive
//! descriptors, `roce_link::wait`); a poster publishes its work, fences, and rings the eventfd only if `parked` is
//! non-zero. Either the sleeper's re-check sees the work or the poster sees the count: a wake-up cannot be lost. The
//! eventfd keeps a ring until it is read, so a ring that lands between the re-check and the `ppoll` ends that
//! `ppoll` at once; a frame that arrives at any point leaves its descriptor readable (level-triggered), so the
//! `ppoll` returns for it too. The flag only spares posters the system call while nobody sleeps.
//!
//! Both are checked with loom (`tests` below: `RUSTFLAGS="--cfg loom" cargo test --release -p roce-verbs --lib
//! loom`, docs/TESTING.md).

use crate::sync::{AtomicBool, AtomicUsize, Mutex, MutexGuard, Ordering, TryLockError, fence};

/// What [`ProgressLock::try_progress`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// Passes this thread ran (0: the lock was held; the holder will run one for us).
    pub(crate) passes: u32,
    /// This thread stopped at `max_rounds` with `missed` still set: someone must run another pass.
    pub(crate) left_missed: bool,
}

/// A mutex around the state a progress pass drives, with the `missed` flag (module docs).
pub(crate) struct ProgressLock<T> {
    state: Mutex<T>,
    missed: AtomicBool,
}

type TryLock<'a, T> = Result<MutexGuard<'a, T>, TryLockError<MutexGuard<'a, T>>>;

fn relock<T>(r: TryLock<'_, T>) -> Option<MutexGuard<'_, T>> {
    match r {
        Ok(g) => Some(g),
        // A panic in an earlier pass left plain data behind: keep going rather than wedge the device.
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

impl<T> ProgressLock<T> {
    pub(crate) fn new(state: T) -> ProgressLock<T> {
        ProgressLock {
            state: Mutex::new(state),
            missed: AtomicBool::new(false),
        }
    }

    /// True while a pass has been asked for and not yet started.
    pub(crate) fn missed(&self) -> bool {
        self.missed.load(Ordering::SeqCst)
    }

    /// Runs `pass` under the lock if it is free (then again while other threads flagged `missed`, at most
    /// `max_rounds` times); if it is held, flags `missed` so that the holder runs a pass for this thread.
    pub(crate) fn try_progress(&self, max_rounds: u32, pass: impl FnMut(&mut T)) -> Outcome {
        self.try_progress_as(true, max_rounds, pass)
    }

    /// Like [`try_progress`](Self::try_progress), but a thread that has published no work of its own (the progress
    /// thread looking for work) leaves `missed` alone when the lock is held: flagging it would only make the holder
    /// run extra passes for nothing.
    pub(crate) fn try_progress_idle(&self, max_rounds: u32, pass: impl FnMut(&mut T)) -> Outcome {
        self.try_progress_as(false, max_rounds, pass)
    }

    fn try_progress_as(
        &self,
        announce: bool,
        max_rounds: u32,
        mut pass: impl FnMut(&mut T),
    ) -> Outcome {
        let g = match relock(self.state.try_lock()) {
            Some(g) => g,
            None if !announce => {
                return Outcome {
                    passes: 0,
                    left_missed: false,
                };
            }
            None => {
                self.missed.swap(true, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                match relock(self.state.try_lock()) {
                    Some(g) => g,
                    None => {
                        return Outcome {
                            passes: 0,
                            left_missed: false,
                        };
                    }
                }
            }
        };
        self.drive(g, max_rounds, &mut pass)
    }

    /// Takes the lock (blocking: control verbs), runs `f`, then one pass, then serves `missed` like
    /// [`try_progress`](Self::try_progress). Returns `f`'s result and what the passes did.
    pub(crate) fn with<R>(
        &self,
        max_rounds: u32,
        f: impl FnOnce(&mut T) -> R,
        mut pass: impl FnMut(&mut T),
    ) -> (R, Outcome) {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let r = f(&mut g);
        (r, self.drive(g, max_rounds, &mut pass))
    }

    /// The holder's loop (module docs).
    fn drive<'a>(
        &'a self,
        mut g: MutexGuard<'a, T>,
        max_rounds: u32,
        pass: &mut impl FnMut(&mut T),
    ) -> Outcome {
        let mut passes = 0;
        loop {
            // Cleared under the lock, before the pass: a flag raised from here on asks for another pass.
            self.missed.swap(false, Ordering::SeqCst);
            pass(&mut g);
            passes += 1;
            drop(g);
            fence(Ordering::SeqCst);
            if !self.missed.load(Ordering::SeqCst) {
                return Outcome {
                    passes,
                    left_missed: false,
                };
            }
            if passes >= max_rounds {
                return Outcome {
                    passes,
                    left_missed: true,
                };
            }
            g = match relock(self.state.try_lock()) {
                Some(g) => g,
                // Another thread holds it now: it clears the flag and runs a pass after our unlock.
                None => {
                    return Outcome {
                        passes,
                        left_missed: false,
                    };
                }
            };
        }
    }
}

/// The "about to block" count of the threads that sleep on one waiter (module docs).
#[derive(Default)]
pub(crate) struct SleepFlag {
    parked: AtomicUsize,
}

impl SleepFlag {
    /// Sleeper: announce the sleep; afterwards re-check for work (`has_work`) and sleep only if there is none.
    /// Returns true if the caller may sleep (it then calls [`unparked`](Self::unparked) when it is back).
    pub(crate) fn prepare_park(&self, has_work: impl FnOnce() -> bool) -> bool {
        self.parked.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if has_work() {
            self.parked.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Sleeper: back from sleeping.
    pub(crate) fn unparked(&self) {
        self.parked.fetch_sub(1, Ordering::SeqCst);
    }

    /// Poster, after publishing work: true if a sleeper must be woken (its waiter rung).
    pub(crate) fn must_wake(&self) -> bool {
        fence(Ordering::SeqCst);
        self.parked.load(Ordering::SeqCst) > 0
    }
}

/// Loom models (`RUSTFLAGS="--cfg loom" cargo test --release -p roce-verbs --lib loom`): every interleaving of a few
/// threads, with a counter standing in for the engine (`STYLE-progress-memory.md` §4).
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::sync::atomic::AtomicUsize;

    /// Runs `f` under loom with at most 5 preemptions per execution (`LOOM_MAX_PREEMPTIONS` overrides; unbounded, the
    /// three-thread models run for many minutes): about half a minute for all models in a release build.
    fn model(f: impl Fn() + Sync + Send + 'static) {
        let mut b = loom::model::Builder::new();
        if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
            b.preemption_bound = Some(5);
        }
        b.check(f);
    }

    /// Trylock + `missed`: three threads each publish a post (an atomic "producer index", as a ring push) and try
    /// to progress. Whoever runs passes, after all have returned the engine has seen every post — none waits for a
    /// pass that nobody will run.
    #[test]
    fn loom_trylock_missed_loses_no_post() {
        model(|| {
            let lock = Arc::new(ProgressLock::new(0usize));
            let posted = Arc::new(AtomicUsize::new(0));
            let post = |lock: &ProgressLock<usize>, posted: &AtomicUsize| {
                posted.fetch_add(1, Ordering::Release);
                lock.try_progress(u32::MAX, |seen| *seen = posted.load(Ordering::Acquire));
            };
            let ths: Vec<_> = (0..2)
                .map(|_| {
                    let (lock, posted) = (lock.clone(), posted.clone());
                    loom::thread::spawn(move || post(&lock, &posted))
                })
                .collect();
            post(&lock, &posted);
            for t in ths {
                t.join().unwrap();
            }
            assert_eq!(*lock.state.lock().unwrap(), 3, "a post no pass has seen");
        });
    }

    /// A control verb (blocking lock) racing a post: the post's work is still seen.
    #[test]
    fn loom_control_and_post() {
        model(|| {
            let lock = Arc::new(ProgressLock::new(0usize));
            let posted = Arc::new(AtomicUsize::new(0));
            let t = {
                let (lock, posted) = (lock.clone(), posted.clone());
                loom::thread::spawn(move || {
                    posted.fetch_add(1, Ordering::Release);
                    lock.try_progress(u32::MAX, |seen| *seen = posted.load(Ordering::Acquire));
                })
            };
            let (_, _) = lock.with(
                u32::MAX,
                |_| (),
                |seen| *seen = posted.load(Ordering::Acquire),
            );
            t.join().unwrap();
            assert_eq!(*lock.state.lock().unwrap(), 1);
        });
    }

    /// The CQ-ring handshake: a poster's pass publishes completions into a one-entry ring (the rest waits in the
    /// "engine CQ", as the runtime's pending list does); a poller that finds the ring empty runs a pass itself. The
    /// poller gets both completions, whatever the interleaving (a lost one would leave it spinning: loom reports
    /// that as a failure).
    #[test]
    fn loom_cq_ring_publish_poll() {
        /// Engine CQ: completions made, not yet in the ring.
        struct Engine {
            made: usize,
            published: usize,
        }
        model(|| {
            let lock = Arc::new(ProgressLock::new(Engine {
                made: 0,
                published: 0,
            }));
            let posted = Arc::new(AtomicUsize::new(0));
            // One-entry ring: producer index (written under the lock) and consumer index (the poller's).
            let prod = Arc::new(AtomicUsize::new(0));
            let cons = Arc::new(AtomicUsize::new(0));
            let pass = {
                let (posted, prod, cons) = (posted.clone(), prod.clone(), cons.clone());
                move |e: &mut Engine| {
                    // Every post completes at once; publish while the ring has room.
                    e.made = posted.load(Ordering::Acquire);
                    while e.published < e.made && e.published - cons.load(Ordering::Acquire) < 1 {
                        e.published += 1;
                        prod.store(e.published, Ordering::Release);
                    }
                }
            };
            let poster = {
                let (lock, posted, pass) = (lock.clone(), posted.clone(), pass.clone());
                loom::thread::spawn(move || {
                    for _ in 0..2 {
                        posted.fetch_add(1, Ordering::Release);
                        lock.try_progress(u32::MAX, pass.clone());
                    }
                })
            };
            let mut got = 0;
            while got < 2 {
                let c = cons.load(Ordering::Relaxed);
                if prod.load(Ordering::Acquire) > c {
                    cons.store(c + 1, Ordering::Release);
                    got += 1;
                    continue;
                }
                lock.try_progress(u32::MAX, pass.clone());
                if prod.load(Ordering::Acquire) == c {
                    loom::thread::yield_now();
                }
            }
            poster.join().unwrap();
        });
    }

    /// The waiter of `roce_link::wait` as loom sees it: an eventfd counter that `wake` raises and a wait reads back to
    /// zero, plus one link descriptor that is readable while a frame is queued. `wait` blocks (no timeout: a lost
    /// wake-up would block forever, which loom reports as a deadlock) until either is set, like `ppoll` on both.
    #[derive(Default)]
    struct WaiterModel {
        state: Mutex<(usize, usize)>,
        cv: loom::sync::Condvar,
    }

    impl WaiterModel {
        /// `Waiter::wake`: one `write(2)` to the eventfd.
        fn wake(&self) {
            self.state.lock().unwrap().0 += 1;
            self.cv.notify_all();
        }
        /// The kernel queues a frame on the link's socket (readable, level-triggered).
        fn frame_arrives(&self) {
            self.state.lock().unwrap().1 += 1;
            self.cv.notify_all();
        }
        /// `rx_burst`: takes every queued frame (non-blocking). Returns how many.
        fn rx_burst(&self) -> usize {
            std::mem::take(&mut self.state.lock().unwrap().1)
        }
        /// `Waiter::wait`: blocks until rung or readable; reads the ring back to zero.
        fn wait(&self) {
            let mut g = self.state.lock().unwrap();
            while g.0 == 0 && g.1 == 0 {
                g = self.cv.wait(g).unwrap();
            }
            g.0 = 0;
        }
    }

    /// The sleep flag with the readiness wait: the progress thread runs passes (take posts, receive frames) and,
    /// finding none, announces the sleep, re-checks for posts and blocks on the eventfd + the link. A poster
    /// publishes a post and rings only if the thread announced a sleep; a frame arrives on the link meanwhile. The
    /// thread always wakes for both (a lost wake-up would leave it blocked forever: loom reports the deadlock).
    #[test]
    fn loom_sleep_flag_loses_no_wakeup() {
        model(|| {
            let flag = Arc::new(SleepFlag::default());
            let waiter = Arc::new(WaiterModel::default());
            let work = Arc::new(AtomicUsize::new(0));
            let progress = {
                let (flag, waiter, work) = (flag.clone(), waiter.clone(), work.clone());
                loom::thread::spawn(move || {
                    let mut frames = 0;
                    loop {
                        // A pass.
                        let posts = work.load(Ordering::Acquire);
                        frames += waiter.rx_burst();
                        if posts == 1 && frames == 1 {
                            return;
                        }
                        if flag.prepare_park(|| work.load(Ordering::Acquire) != posts) {
                            waiter.wait();
                            flag.unparked();
                        }
                    }
                })
            };
            let poster = {
                let (flag, waiter, work) = (flag.clone(), waiter.clone(), work.clone());
                loom::thread::spawn(move || {
                    work.store(1, Ordering::Release);
                    if flag.must_wake() {
                        waiter.wake();
                    }
                })
            };
            waiter.frame_arrives();
            poster.join().unwrap();
            progress.join().unwrap();
        });
    }

    /// Two sleepers on one flag (two threads in `CompChannel::get_event`): while either is announced, a poster
    /// rings. (With a boolean flag the first sleeper's `unparked` would hide the second one from posters.)
    #[test]
    fn loom_sleep_flag_counts_sleepers() {
        model(|| {
            let flag = Arc::new(SleepFlag::default());
            let a = flag.prepare_park(|| false);
            let b = {
                let flag = flag.clone();
                loom::thread::spawn(move || flag.prepare_park(|| false))
            };
            let b = b.join().unwrap();
            assert!(a && b);
            flag.unparked();
            assert!(flag.must_wake(), "the second sleeper must still be woken");
            flag.unparked();
            assert!(!flag.must_wake());
        });
    }
}
