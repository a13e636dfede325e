//! Waiting for links without polling them: an `eventfd(2)` that other threads ring ([`Waiter::wake`]) and a
//! `ppoll(2)` on it together with the links' receive descriptors ([`Link::wait_fd`](crate::Link::wait_fd)) and a
//! timeout ([`Waiter::wait`]).
//!
//! A driver thread that has run out of work (no frame received, no timer due, nothing posted) blocks here instead of
//! sleeping for a fixed time or yielding its core: it wakes when a frame arrives on a link (the kernel marks the
//! socket readable), when another thread rings the waiter (a post, a shutdown), or at the timeout (the engine's next
//! timer), and uses no CPU until then.
//!
//! The eventfd counter persists until read: a [`wake`](Waiter::wake) that comes before the [`wait`](Waiter::wait)
//! makes that wait return at once, so a wake-up cannot be lost between a driver's last look for work and its
//! `ppoll` (the runtime's sleep flag only saves the system call when nobody sleeps). [`wait`](Waiter::wait) reads the
//! counter back to zero when it finds it set.
//!
//! The receive descriptors are level-triggered (`POLLIN`): frames that arrived before the wait, or that a bounded
//! receive burst left queued, make it return at once.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Most link descriptors one [`Waiter::wait`] takes (the waiter's own eventfd comes on top). The poll set lives on
/// the stack, so a wait allocates nothing.
pub const MAX_WAIT_FDS: usize = 8;

/// Why [`Waiter::wait`] returned. All false: the timeout passed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Woken {
    /// Another thread rang [`Waiter::wake`] (now or before the wait).
    pub rung: bool,
    /// At least one of the link descriptors is readable (a frame is waiting; also set for an error or hang-up
    /// condition on it, which the next receive burst reports).
    pub readable: bool,
    /// A signal handler ran during the wait (`ppoll` failed with `EINTR`).
    pub interrupted: bool,
}

/// An eventfd other threads ring, and the `ppoll` a driver blocks in (module docs). `Send + Sync`: any thread may
/// [`wake`](Self::wake); waits are meant for one thread at a time (several waiters all see a ring only if it comes
/// while they are all inside `ppoll`: the first to return reads the counter back to zero).
#[derive(Debug)]
pub struct Waiter {
    fd: OwnedFd,
}

impl Waiter {
    /// Creates the eventfd (non-blocking, close-on-exec).
    ///
    /// # Errors
    /// The `eventfd(2)` failure (`EMFILE`, `ENFILE`, `ENOMEM`).
    pub fn new() -> io::Result<Waiter> {
        Ok(Waiter {
            fd: eventfd(libc::EFD_NONBLOCK)?,
        })
    }

    /// Rings the waiter: a thread inside [`wait`](Self::wait) returns, and if none is, the next wait returns at once.
    /// One `write(2)` of 8 bytes; never blocks (a counter that is already near its maximum stays set).
    pub fn wake(&self) {
        eventfd_add(&self.fd);
    }

    /// Blocks until the waiter is rung, one of `fds` is readable, or `timeout` passes (nanosecond resolution,
    /// `ppoll(2)`); reads the ring back to zero if it was set. A zero `timeout` only looks.
    ///
    /// # Errors
    /// `InvalidInput` for more than [`MAX_WAIT_FDS`] descriptors; a `ppoll` failure other than `EINTR` (which
    /// returns `Ok` with only [`Woken::interrupted`] set).
    pub fn wait(&self, fds: &[RawFd], timeout: Duration) -> io::Result<Woken> {
        if fds.len() > MAX_WAIT_FDS {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        let mut set = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; MAX_WAIT_FDS + 1];
        set[0] = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        for (p, &fd) in set[1..].iter_mut().zip(fds) {
            *p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
        }
        let ts = libc::timespec {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        let n = fds.len() + 1;
        // SAFETY: `set` holds `n` initialised pollfd entries on this stack frame, `ts` is a valid timespec, and a
        // null signal mask means "keep the current one".
        let r = unsafe { libc::ppoll(set.as_mut_ptr(), n as libc::nfds_t, &ts, core::ptr::null()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(Woken {
                    interrupted: true,
                    ..Woken::default()
                })
            } else {
                Err(e)
            };
        }
        let rung = set[0].revents & libc::POLLIN != 0;
        if rung {
            eventfd_read(&self.fd);
        }
        let readable = set[1..n].iter().any(|p| p.revents != 0);
        Ok(Woken {
            rung,
            readable,
            interrupted: false,
        })
    }
}

/// A counting eventfd (`EFD_SEMAPHORE`): [`post`](Self::post) adds one, [`take`](Self::take) removes one, and
/// [`fd`](Self::fd) is readable (`POLLIN`) while the count is above zero. For a queue whose readiness a program
/// watches in its own `poll`/`epoll` (a completion channel's `fd`, libibverbs `ibv_comp_channel`): post once per
/// item pushed, take once per item popped. The descriptor is blocking unless the program sets `O_NONBLOCK` on it;
/// [`take`](Self::take) after a pop never waits, since that item's post came first (unless someone else read it).
#[derive(Debug)]
pub struct Semaphore {
    fd: OwnedFd,
}

impl Semaphore {
    /// Creates the eventfd (count 0, close-on-exec).
    ///
    /// # Errors
    /// The `eventfd(2)` failure (`EMFILE`, `ENFILE`, `ENOMEM`).
    pub fn new() -> io::Result<Semaphore> {
        Ok(Semaphore {
            fd: eventfd(libc::EFD_SEMAPHORE)?,
        })
    }

    /// The descriptor (owned by this semaphore; the program may poll it and set `O_NONBLOCK`, not close it).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Adds one: one `write(2)` of 8 bytes.
    pub fn post(&self) {
        eventfd_add(&self.fd);
    }

    /// Removes one: one `read(2)` of 8 bytes (semaphore mode: the count drops by one).
    pub fn take(&self) {
        eventfd_read(&self.fd);
    }
}

/// A new close-on-exec eventfd with count 0 and the extra `flags` (`EFD_NONBLOCK`, `EFD_SEMAPHORE`).
fn eventfd(flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor this process owns.
    let fd = unsafe { libc::eventfd(0, flags | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to the eventfd's counter: one `write(2)` of 8 bytes (a counter already near its maximum stays set, so
/// the result is ignored).
fn eventfd_add(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes the 8 bytes of `one` from a live stack value to an eventfd we own.
    let _ = unsafe {
        libc::write(
            fd.as_raw_fd(),
            (&one as *const u64).cast(),
            size_of::<u64>(),
        )
    };
}

/// One `read(2)` of 8 bytes from the eventfd: the whole counter back to zero, or one in `EFD_SEMAPHORE` mode (an
/// empty non-blocking counter just fails with `EAGAIN`, ignored).
fn eventfd_read(fd: &OwnedFd) {
    let mut v: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live stack `u64` from an eventfd we own.
    let _ = unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut v as *mut u64).cast(),
            size_of::<u64>(),
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::UdpSocket;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn times_out_with_nothing_set() {
        let w = Waiter::new().expect("eventfd");
        let t0 = Instant::now();
        let r = w.wait(&[], Duration::from_millis(20)).expect("wait");
        assert_eq!(r, Woken::default());
        assert!(t0.elapsed() >= Duration::from_millis(19));
    }

    #[test]
    fn a_ring_before_the_wait_is_not_lost_and_is_consumed() {
        let w = Waiter::new().expect("eventfd");
        w.wake();
        w.wake();
        let r = w.wait(&[], Duration::from_secs(30)).expect("wait");
        assert!(r.rung && !r.readable);
        // Read back to zero: the next wait times out.
        let r = w.wait(&[], Duration::ZERO).expect("look");
        assert_eq!(r, Woken::default());
    }

    #[test]
    fn a_ring_from_another_thread_ends_the_wait() {
        let w = Arc::new(Waiter::new().expect("eventfd"));
        let w2 = Arc::clone(&w);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            w2.wake();
        });
        let r = w.wait(&[], Duration::from_secs(30)).expect("wait");
        assert!(r.rung);
        t.join().expect("join");
    }

    #[test]
    fn a_datagram_makes_the_socket_readable_until_received() {
        let w = Waiter::new().expect("eventfd");
        let rx = UdpSocket::bind("127.0.0.1:0").expect("bind");
        rx.set_nonblocking(true).expect("nonblocking");
        let fd = rx.as_raw_fd();
        assert_eq!(
            w.wait(&[fd], Duration::ZERO).expect("look"),
            Woken::default()
        );
        let tx = UdpSocket::bind("127.0.0.1:0").expect("bind");
        tx.send_to(b"frame", rx.local_addr().expect("addr"))
            .expect("send");
        let r = w.wait(&[fd], Duration::from_secs(30)).expect("wait");
        assert!(r.readable && !r.rung);
        // Level-triggered: still readable until the datagram is taken.
        assert!(w.wait(&[fd], Duration::ZERO).expect("look").readable);
        let mut b = [0u8; 16];
        assert_eq!(rx.recv(&mut b).expect("recv"), 5);
        assert!(!w.wait(&[fd], Duration::ZERO).expect("look").readable);
    }

    #[test]
    fn too_many_descriptors_is_an_error() {
        let w = Waiter::new().expect("eventfd");
        let fds = [0; MAX_WAIT_FDS + 1];
        assert_eq!(
            w.wait(&fds, Duration::ZERO).expect_err("too many").kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
