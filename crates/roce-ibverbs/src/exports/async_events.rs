//! Asynchronous events (`ibv_get_async_event` / `ibv_ack_async_event`, ibv_get_async_event(3)) on the context's
//! `async_fd`. The library raises none yet (the engine's `poll_async_event` is not plumbed through the runtime), so
//! the descriptor is never readable: a blocking call waits as it does on an RNIC where nothing happens, and returns
//! -1 with `errno = EINTR` when a signal handler without `SA_RESTART` runs (rdma-core's `read()` of the uverbs
//! async fd does, module `signals`); an `async_fd`
//! the program made `O_NONBLOCK` answers -1 with `errno = EAGAIN` at once.

use super::*;

versioned! {
    "IBVERBS_1.1": [ibv_get_async_event, ibv_ack_async_event]
}

/// `ibv_get_async_event(ctx, event)`: 0 with `*event` filled, or -1 with `errno` (`EINVAL` for a bad context or
/// NULL `event`; `EAGAIN`, `EINTR` as in the module docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_get_async_event(
    ctx: *mut IbvContext,
    event: *mut c_void,
) -> c_int {
    crate::guard::guard(
        "ibv_get_async_event",
        || {
            set_errno(libc::EIO);
            -1
        },
        || {
            // SAFETY: the caller passes an open context.
            let Some(c) = (unsafe { ctx_block(ctx) }) else {
                set_errno(libc::EINVAL);
                return -1;
            };
            if event.is_null() {
                set_errno(libc::EINVAL);
                return -1;
            }
            let fd = c.ctx.async_fd;
            loop {
                // SAFETY: fcntl on the context's descriptor.
                if unsafe { libc::fcntl(fd, libc::F_GETFL) } & libc::O_NONBLOCK != 0 {
                    set_errno(libc::EAGAIN);
                    return -1;
                }
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd of ours.
                if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
                    let e = std::io::Error::last_os_error();
                    if e.kind() == std::io::ErrorKind::Interrupted
                        && signals::all_handlers_restart()
                    {
                        continue;
                    }
                    set_errno(e.raw_os_error().unwrap_or(libc::EINTR));
                    return -1;
                }
            }
        },
    )
}

/// `ibv_ack_async_event(event)`: nothing to release (no event is ever handed out, module docs).
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_ack_async_event(_event: *mut c_void) {}
