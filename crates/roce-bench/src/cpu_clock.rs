//! The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`): the one `unsafe` call of this crate.

use std::time::Duration;

/// A reading of the calling thread's CPU clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ThreadCpu(Duration);

impl ThreadCpu {
    /// The thread's CPU time now (zero if the clock cannot be read, which Linux never does for this clock).
    pub fn now() -> ThreadCpu {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call; clock_gettime writes only it.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        if rc != 0 {
            return ThreadCpu(Duration::ZERO);
        }
        ThreadCpu(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// CPU time since `self`.
    pub fn elapsed(&self) -> Duration {
        ThreadCpu::now().0.saturating_sub(self.0)
    }
}
