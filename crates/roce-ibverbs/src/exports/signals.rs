//! Whether an interrupted wait is restarted or fails with `EINTR`, as the kernel decides for rdma-core's blocking
//! `read()` of a completion channel or async fd: restarted when the handler that ran was installed with
//! `SA_RESTART`, `EINTR` otherwise (signal(7), "Interruption of system calls and library functions by signal
//! handlers"). A `ppoll` does not say which handler ran, so the answer is `EINTR` as soon as any installed handler
//! lacks `SA_RESTART` (only such a handler can make `read()` fail), and a restart when every one has it.

/// True when every signal handler of the process was installed with `SA_RESTART` (signals left at `SIG_DFL` or
/// `SIG_IGN` run no handler and interrupt nothing).
pub(super) fn all_handlers_restart() -> bool {
    (1..=libc::SIGRTMAX()).all(|sig| {
        // SAFETY: `sigaction` with a NULL new action only reads the current one into `old`, a local.
        let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
        if unsafe { libc::sigaction(sig, core::ptr::null(), &mut old) } != 0 {
            return true;
        }
        old.sa_sigaction == libc::SIG_DFL
            || old.sa_sigaction == libc::SIG_IGN
            || old.sa_flags & libc::SA_RESTART != 0
    })
}

/// Runs `f` (which starts the runtime's threads: progress, auto-progress, stats endpoint) with every signal
/// blocked, so the threads it spawns inherit a full mask: the program's signals are delivered to the program's own
/// threads, as they are when the RNIC is hardware and the library starts no thread. Without this a process-wide
/// signal (`SIGALRM`, `SIGINT`) may run its handler on a runtime thread, and the program's thread blocked in
/// `ibv_get_cq_event` never sees `EINTR`. The calling thread's mask is restored before returning.
pub(super) fn with_signals_blocked<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: plain calls on local, initialised signal sets (`sigfillset` initialises `all`; `old` is written by
    // `pthread_sigmask` before it is read).
    let mut old: libc::sigset_t = unsafe { core::mem::zeroed() };
    let blocked = unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old) == 0
    };
    let r = f();
    if blocked {
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, core::ptr::null_mut()) };
    }
    r
}
