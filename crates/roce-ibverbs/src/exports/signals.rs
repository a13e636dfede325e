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
