//! Completion channels (`ibv_comp_channel`) with CQ moderation (`ibv_modify_cq` `cq_count`/`cq_period`, perftest
//! `-Q`).
//!
//! A CQ created with a channel raises an event on it when the application has armed it ([`crate::Cq::req_notify`])
//! and, since the last event, either `count` completions were published or `period` has passed since the first of
//! them — whichever comes first. Events are one-shot: the application re-arms after each one (libibverbs
//! semantics). In adaptive mode both limits start at the configured values and double (up to 16×) while events keep
//! firing on the count limit in less than half the period (load), and halve back when the timer fires (idle), the
//! way NIC drivers' adaptive interrupt moderation (DIM) trades latency for event rate.

use std::collections::VecDeque;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use roce_link::{MAX_WAIT_FDS, Semaphore, Waiter};
use roce_proto::Instant;

use crate::progress::SleepFlag;
use crate::runner::{Idle, ProgressMode, Shared, idle_step};

/// CQ moderation parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Moderation {
    /// Completions per event (≥ 1; 1 = an event per completion).
    pub count: u32,
    /// Longest delay from the first unreported completion to its event (zero = no timer, count only).
    pub period: Duration,
    /// Raise both limits under load, lower them when idle.
    pub adaptive: bool,
}

impl Default for Moderation {
    /// An event for every completion, no timer, not adaptive.
    fn default() -> Self {
        Moderation {
            count: 1,
            period: Duration::ZERO,
            adaptive: false,
        }
    }
}

const ADAPTIVE_MAX_FACTOR: u32 = 16;

/// Engine-side moderation bookkeeping of one CQ.
#[derive(Clone, Debug)]
pub(crate) struct ModerationState {
    base: Moderation,
    count: u32,
    period: Duration,
    pending: u32,
    first_at: Option<Instant>,
}

impl ModerationState {
    pub(crate) fn new(m: Moderation) -> ModerationState {
        ModerationState {
            base: m,
            count: m.count.max(1),
            period: m.period,
            pending: 0,
            first_at: None,
        }
    }

    pub(crate) fn on_completions(&mut self, n: usize, now: Instant) {
        if n == 0 {
            return;
        }
        self.pending = self.pending.saturating_add(n as u32);
        self.first_at.get_or_insert(now);
    }

    /// The timer deadline, if completions are waiting and a period is set.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        if self.period.is_zero() {
            return None;
        }
        self.first_at.map(|t| t.saturating_add(self.period))
    }

    pub(crate) fn due(&self, now: Instant) -> bool {
        self.pending >= self.count
            || (self.pending > 0 && self.deadline().is_some_and(|d| d <= now))
    }

    /// An event was raised at `now`: reset, and adapt the limits.
    pub(crate) fn fired(&mut self, now: Instant) {
        if self.base.adaptive {
            let took = self
                .first_at
                .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
            let by_count = self.pending >= self.count;
            let max_count = self.base.count.max(1).saturating_mul(ADAPTIVE_MAX_FACTOR);
            let max_period = self.base.period.saturating_mul(ADAPTIVE_MAX_FACTOR);
            if by_count && took < self.period / 2 {
                self.count = self.count.saturating_mul(2).min(max_count);
                self.period = (self.period * 2).min(max_period);
            } else if !by_count {
                self.count = (self.count / 2).max(self.base.count.max(1));
                self.period = (self.period / 2).max(self.base.period);
            }
        }
        self.pending = 0;
        self.first_at = None;
    }

    /// Current limits `(count, period)` (they move in adaptive mode).
    #[cfg(test)]
    pub(crate) fn limits(&self) -> (u32, Duration) {
        (self.count, self.period)
    }
}

/// A completion channel: CQs that share it queue their events here; [`CompChannel::get_event`] blocks for one.
pub struct CompChannel {
    events: Mutex<VecDeque<u32>>,
    cv: Condvar,
    /// CQs attached over the channel's life (room reserved for one event each).
    attached: std::sync::atomic::AtomicUsize,
    /// Device groups in [`ProgressMode::Caller`] whose CQs are attached: `get_event` drives their progress.
    drivers: Mutex<Vec<Weak<Shared>>>,
    /// What a driving `get_event` blocks on with the links' receive descriptors, rung by [`notify`](Self::notify)
    /// (`None` if the eventfd could not be made: then it sleeps on the condition variable, as without descriptors).
    waiter: Option<Waiter>,
    /// `get_event` threads inside that readiness wait (`progress` module, "Sleep flag").
    sleep: SleepFlag,
    /// Counts the queued events for [`fd`](Self::fd): posted per event queued, taken per event returned.
    ready: Option<Semaphore>,
    /// [`close`](Self::close) was called: waits end at once.
    closed: std::sync::atomic::AtomicBool,
}

impl Default for CompChannel {
    fn default() -> Self {
        CompChannel {
            events: Mutex::default(),
            cv: Condvar::new(),
            attached: std::sync::atomic::AtomicUsize::new(0),
            drivers: Mutex::default(),
            waiter: Waiter::new()
                .inspect_err(|e| tracing::warn!(error = %e, "no eventfd for a completion channel"))
                .ok(),
            sleep: SleepFlag::default(),
            ready: Semaphore::new()
                .inspect_err(
                    |e| tracing::warn!(error = %e, "no eventfd for a completion channel's fd"),
                )
                .ok(),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel")
            .field("attached", &self.attached)
            .finish_non_exhaustive()
    }
}

impl CompChannel {
    /// An empty channel.
    pub fn new() -> CompChannel {
        CompChannel::default()
    }

    /// A CQ was attached (control path, application thread): reserves room for its event so that
    /// [`notify`](Self::notify) does not allocate while each attached CQ has at most one event queued (events are
    /// one-shot: a CQ fires again only after `req_notify`; an application that re-arms without calling
    /// [`get_event`](Self::get_event) can queue more, and the queue then grows).
    pub(crate) fn attach(&self, driver: Weak<Shared>) {
        if let Some(sh) = driver.upgrade()
            && sh.mode() == ProgressMode::Caller
            && let Ok(mut d) = self.drivers.lock()
            && !d.iter().any(|w| w.ptr_eq(&driver))
        {
            d.push(driver);
        }
        if let Ok(mut q) = self.events.lock() {
            let n = self.attached.fetch_add(1, Ordering::Relaxed) + 1;
            // `reserve` counts from the current length: make the capacity at least one slot per attached CQ.
            let len = q.len();
            q.reserve(n.saturating_sub(len));
        }
    }

    /// Queues an event of CQ `cq` (in a pass). Event path only (at most one per arm, never per packet): takes
    /// the mutex, which only a thread inside [`get_event`](Self::get_event) contends, for a push into reserved room
    /// and a condition-variable signal.
    pub(crate) fn notify(&self, cq: u32) {
        if let Ok(mut q) = self.events.lock() {
            q.push_back(cq);
            // Under the lock, so the count never lags a pop of this event.
            if let Some(r) = &self.ready {
                r.post();
            }
            self.cv.notify_one();
        }
        if self.sleep.must_wake()
            && let Some(w) = &self.waiter
        {
            w.wake();
        }
    }

    /// A descriptor that is readable (`POLLIN`) while an event waits, for a program that waits in its own
    /// `poll`/`epoll` (libibverbs `ibv_comp_channel.fd`) and then takes the event with
    /// [`get_event`](Self::get_event) (`Duration::ZERO` to only look). The channel owns it: poll it, set `O_NONBLOCK` on
    /// it, never read or close it. It may still be readable for a moment after the last event was taken. `None` if
    /// its eventfd could not be made.
    pub fn fd(&self) -> Option<RawFd> {
        self.ready.as_ref().map(Semaphore::fd)
    }

    /// Counts an event taken off the queue out of [`fd`](Self::fd) (outside the `events` lock: the read cannot wait,
    /// the event's post came before its push, but a program that reads the descriptor itself could make it).
    fn taken(&self, cq: u32) -> u32 {
        if let Some(r) = &self.ready {
            r.take();
        }
        cq
    }

    /// `ibv_get_cq_event`: waits up to `timeout` for an event and returns the id ([`crate::Cq::id`]) of the CQ
    /// that raised it; `None` on timeout.
    ///
    /// In [`ProgressMode::Caller`] the waiting thread drives the progress of the attached CQs' devices itself (a
    /// pass, then the progress thread's back-off: busy for `spin`, then blocking in `ppoll` on the links' receive
    /// descriptors and the channel's eventfd until a frame arrives, another thread's pass raises an event, or the
    /// next deadline, at most `park_max`; on links without a descriptor, yielding until `yield_for`, then sleeping on
    /// the channel at most `park_max` between passes), so an event-driven program needs no other thread.
    pub fn get_event(&self, timeout: Duration) -> Option<u32> {
        self.wait_event(timeout, false).unwrap_or(None)
    }

    /// As [`get_event`](Self::get_event), but a signal handler that runs while the thread blocks in `ppoll` ends
    /// the wait with an `Interrupted` error (as a blocking `read(2)` of rdma-core's completion channel fd fails
    /// with `EINTR`). A signal that lands while the thread spins or drives a pass is not seen: it ends the next
    /// blocking wait only if it is still arriving then, so callers that must not miss one block signals around
    /// their own checks. Waits on links without a descriptor (simulated links) are not interrupted.
    ///
    /// # Errors
    /// `ErrorKind::Interrupted` as above.
    pub fn get_event_interruptible(&self, timeout: Duration) -> std::io::Result<Option<u32>> {
        self.wait_event(timeout, true)
    }

    /// Closes the channel (its device was closed: `ibv_close_device`): every thread waiting in
    /// [`get_event`](Self::get_event) returns `None` at once, later calls too, and [`fd`](Self::fd) stays readable
    /// (as the uverbs event file a closed device leaves: a blocked `read` fails with `EIO`, `poll` wakes).
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Ok(_q) = self.events.lock() {
            self.cv.notify_all();
        }
        if let Some(r) = &self.ready {
            r.post();
        }
        if let Some(w) = &self.waiter {
            w.wake();
        }
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn wait_event(&self, timeout: Duration, stop_on_signal: bool) -> std::io::Result<Option<u32>> {
        let deadline = std::time::Instant::now() + timeout;
        // The groups to drive, without allocating for the usual few (the event path is allocation-free).
        let mut few: [Option<Arc<Shared>>; 4] = Default::default();
        let mut more: Vec<Arc<Shared>> = Vec::new();
        if let Ok(d) = self.drivers.lock() {
            for (i, sh) in d.iter().filter_map(Weak::upgrade).enumerate() {
                match few.get_mut(i) {
                    Some(slot) => *slot = Some(sh),
                    None => more.push(sh),
                }
            }
        }
        let drivers = || few.iter().flatten().chain(more.iter());
        if let Some(sh) = drivers().next() {
            // While this thread drives and waits here it receives the frames itself: the auto-progress threads
            // of these groups leave them to it (`runner` module docs, "Frames nobody receives").
            for d in drivers() {
                d.caller_waits(true);
            }
            let wait = || -> std::io::Result<Option<u32>> {
                let clock = sh.clock;
                let mut last_work = clock.now();
                let mut fds = [0 as RawFd; MAX_WAIT_FDS];
                loop {
                    if self.is_closed() {
                        return Ok(None);
                    }
                    if let Some(cq) = self.try_event() {
                        return Ok(Some(cq));
                    }
                    let mut work = false;
                    for d in drivers() {
                        work |= d.progress();
                    }
                    if let Some(cq) = self.try_event() {
                        return Ok(Some(cq));
                    }
                    let now = clock.now();
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        return Ok(None);
                    }
                    if work {
                        last_work = now;
                        continue;
                    }
                    // Every driven group's links must have a descriptor, or a frame for one of them would go unseen.
                    let ready = self.waiter.as_ref().and_then(|_| {
                        let mut n = 0;
                        for d in drivers() {
                            n += d.ready_fds(&mut fds[n..])?;
                        }
                        Some(n)
                    });
                    let idle = now.saturating_duration_since(last_work);
                    match idle_step(sh, now, idle, ready.is_some()) {
                        Idle::Spin => std::hint::spin_loop(),
                        Idle::Yield => std::thread::yield_now(),
                        Idle::Sleep(d) => {
                            let Ok(q) = self.events.lock() else {
                                return Ok(None);
                            };
                            if q.is_empty() && !self.is_closed() {
                                let _ = self.cv.wait_timeout(q, d.min(left));
                            }
                        }
                        Idle::Wait(d) => {
                            if let (Some(w), Some(n)) = (&self.waiter, ready)
                                && self.sleep.prepare_park(|| {
                                    self.is_closed()
                                        || self.events.lock().is_ok_and(|q| !q.is_empty())
                                })
                            {
                                sh.stats.readiness_waits.fetch_add(1, Ordering::Relaxed);
                                match w.wait(&fds[..n], d.min(left)) {
                                    Ok(r) if r.readable => {
                                        sh.stats.readiness_wakeups.fetch_add(1, Ordering::Relaxed);
                                    }
                                    Ok(r) if r.interrupted && stop_on_signal => {
                                        self.sleep.unparked();
                                        return Err(std::io::ErrorKind::Interrupted.into());
                                    }
                                    Ok(_) => {}
                                    Err(e) => {
                                        tracing::warn!(error = %e, "readiness wait failed");
                                        std::thread::yield_now();
                                    }
                                }
                                self.sleep.unparked();
                            }
                        }
                    }
                }
            };
            let r = wait();
            for d in drivers() {
                d.caller_waits(false);
            }
            return r;
        }
        let Ok(mut q) = self.events.lock() else {
            return Ok(None);
        };
        loop {
            if self.is_closed() {
                return Ok(None);
            }
            if let Some(cq) = q.pop_front() {
                drop(q);
                return Ok(Some(self.taken(cq)));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            q = match self.cv.wait_timeout(q, left) {
                Ok((q, _)) => q,
                Err(_) => return Ok(None),
            };
        }
    }

    fn try_event(&self) -> Option<u32> {
        let cq = self.events.lock().ok()?.pop_front()?;
        Some(self.taken(cq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A create_cq the engine refuses (depth above `max_cqe`) leaves its completion channel as it was: no CQ
    /// counted as attached (no room reserved for its event), no device group for `get_event` to drive. An accepted
    /// one attaches.
    #[test]
    fn a_refused_create_cq_leaves_no_attachment() {
        let (ca, _cb) = crate::Context::sim_pair(crate::RuntimeConfig::default()).expect("pair");
        let ch = Arc::new(CompChannel::new());
        let too_deep = ca.query_device().max_cqe + 1;
        assert!(
            ca.create_cq(too_deep, Some(&ch), Moderation::default())
                .is_err()
        );
        let drivers = |ch: &CompChannel| ch.drivers.lock().map(|d| d.len()).unwrap_or(usize::MAX);
        assert_eq!(ch.attached.load(Ordering::Relaxed), 0, "{ch:?}");
        assert_eq!(drivers(&ch), 0);
        let _cq = ca
            .create_cq(16, Some(&ch), Moderation::default())
            .expect("cq");
        assert_eq!(ch.attached.load(Ordering::Relaxed), 1, "{ch:?}");
        assert_eq!(drivers(&ch), 1);
    }

    #[test]
    fn count_or_period_whichever_first() {
        let mut m = ModerationState::new(Moderation {
            count: 4,
            period: Duration::from_micros(100),
            adaptive: false,
        });
        let t0 = Instant::from_micros(10);
        m.on_completions(3, t0);
        assert!(!m.due(t0));
        assert_eq!(m.deadline(), Some(Instant::from_micros(110)));
        assert!(!m.due(Instant::from_micros(109)));
        assert!(m.due(Instant::from_micros(110)));
        m.fired(Instant::from_micros(110));
        assert!(!m.due(Instant::from_micros(500)));
        m.on_completions(4, Instant::from_micros(600));
        assert!(m.due(Instant::from_micros(600)));
    }

    #[test]
    fn adaptive_raises_under_load_and_falls_back() {
        let base = Moderation {
            count: 2,
            period: Duration::from_micros(100),
            adaptive: true,
        };
        let mut m = ModerationState::new(base);
        let mut t = Instant::from_micros(1000);
        for _ in 0..10 {
            let (c, _) = m.limits();
            m.on_completions(c as usize, t);
            assert!(m.due(t));
            m.fired(t);
            t = t.saturating_add(Duration::from_micros(1));
        }
        assert_eq!(m.limits(), (32, Duration::from_micros(1600)));
        for _ in 0..10 {
            m.on_completions(1, t);
            let d = m.deadline().expect("timer");
            assert!(m.due(d));
            m.fired(d);
            t = d;
        }
        assert_eq!(m.limits(), (2, Duration::from_micros(100)));
    }

    #[test]
    fn channel_times_out_and_delivers() {
        let c = CompChannel::new();
        assert_eq!(c.get_event(Duration::from_millis(5)), None);
        c.notify(7);
        assert_eq!(c.get_event(Duration::from_millis(5)), Some(7));
    }
}
