//! Asynchronous events (`ibv_get_async_event` / `ibv_ack_async_event`, ibv_get_async_event(3)) on the context's
//! pollable `async_fd`.
//!
//! The engine's events (`roce_proto::AsyncEvent`: QP fatal / request / access errors, communication established,
//! SQ drained, LAST_WQE_REACHED, CQ error, an SRQ's limit, port active / error) reach [`deliver`] through the runtime's async handler, in a pass. It
//! routes each to the context that owns the QP, CQ or SRQ (port events to every context of the device), queues it and
//! counts it on that context's `async_fd` (an `EFD_SEMAPHORE` eventfd: readable while events wait, as the uverbs
//! async fd is). `ibv_get_async_event` takes the oldest event of its context — blocking, or -1 with `EAGAIN` when
//! the program made `async_fd` `O_NONBLOCK`, or -1 with `EINTR` when a signal handler without `SA_RESTART` runs
//! (module `signals`). `ibv_ack_async_event` counts the acknowledgement in the object's `events_completed` /
//! `async_events_completed` under its mutex, and `ibv_destroy_qp` / `ibv_destroy_cq` / `ibv_destroy_srq` wait until every event handed
//! out for the object has been acknowledged (the man page's rule); events still queued for an object being
//! destroyed are dropped with it.
//!
//! Lock order: [`ROUTES`] is taken inside a pass (under the runtime's progress lock) and never held while the
//! library calls into the runtime.

use super::*;
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

versioned! {
    "IBVERBS_1.1": [ibv_get_async_event, ibv_ack_async_event]
}

/// `enum ibv_event_type` values (rdma-core 44 `verbs.h`).
const IBV_EVENT_CQ_ERR: c_int = 0;
const IBV_EVENT_QP_FATAL: c_int = 1;
const IBV_EVENT_QP_REQ_ERR: c_int = 2;
const IBV_EVENT_QP_ACCESS_ERR: c_int = 3;
const IBV_EVENT_COMM_EST: c_int = 4;
const IBV_EVENT_SQ_DRAINED: c_int = 5;
const IBV_EVENT_PORT_ACTIVE: c_int = 9;
const IBV_EVENT_PORT_ERR: c_int = 10;
const IBV_EVENT_SRQ_LIMIT_REACHED: c_int = 15;
const IBV_EVENT_QP_LAST_WQE_REACHED: c_int = 16;

/// `struct ibv_async_event` (16 bytes): the element union (`ibv_cq *`, `ibv_qp *`, … or `int port_num`) and the
/// event type.
#[repr(C)]
pub struct IbvAsyncEvent {
    element: usize,
    event_type: c_int,
}

const _: () = assert!(size_of::<IbvAsyncEvent>() == 16);

/// A context's queue and its `async_fd`.
struct Queue {
    fd: c_int,
    /// Tells this context from a later one at the same address (a waiter of a closed context must not take the new
    /// one's events).
    generation: u64,
    events: VecDeque<(usize, c_int)>,
}

/// Source of [`Queue::generation`].
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Where events go: QPN → (context, `ibv_qp *`), CQ id → (context, `ibv_cq *`), SRQ handle → (context,
/// `ibv_srq *`), context → its queue.
#[derive(Default)]
struct Routes {
    qps: BTreeMap<u32, (usize, usize)>,
    cqs: BTreeMap<u32, (usize, usize)>,
    srqs: BTreeMap<u32, (usize, usize)>,
    queues: BTreeMap<usize, Queue>,
}

/// Each process has its own (`roce_fork`): the runtime's thread takes this lock to queue an event, and a child forked
/// while it held it would otherwise wait for ever in its first verb that routes events.
static ROUTES: roce_fork::ForkLocal<Option<Routes>> = roce_fork::ForkLocal::new(|| None);

fn routes<R>(f: impl FnOnce(&mut Routes) -> R) -> R {
    let mut g = ROUTES.lock();
    f(g.get_or_insert_with(Routes::default))
}

/// Adds one to an eventfd's count (a full counter stays full: the reader still finds the queue).
fn post(fd: c_int) {
    let one: u64 = 1;
    // SAFETY: an 8-byte write from a local to the context's eventfd.
    let _ = unsafe { libc::write(fd, ptr::from_ref(&one).cast(), 8) };
}

/// A new context and its `async_fd` (an `EFD_SEMAPHORE` eventfd).
pub(super) fn register_ctx(ctx: usize, fd: c_int) {
    routes(|r| {
        r.queues.insert(
            ctx,
            Queue {
                fd,
                generation: GENERATION.fetch_add(1, Ordering::Relaxed),
                events: VecDeque::new(),
            },
        )
    });
}

/// A closed context: its queue and routes go, and a thread blocked in `ibv_get_async_event` on it wakes (its
/// `async_fd` is made readable once more; the waiter polls its own duplicate of it, so the close of the context's
/// descriptor does not leave it polling a closed or reused number) and returns -1 with `EIO`, as a read of the
/// uverbs async event file of a closed device does (issue #21 finding: it hung).
pub(super) fn unregister_ctx(ctx: usize) {
    routes(|r| {
        if let Some(q) = r.queues.remove(&ctx) {
            post(q.fd);
        }
        r.qps.retain(|_, v| v.0 != ctx);
        r.cqs.retain(|_, v| v.0 != ctx);
        r.srqs.retain(|_, v| v.0 != ctx);
    });
}

pub(super) fn register_qp(qpn: u32, ctx: usize, qp: usize) {
    routes(|r| r.qps.insert(qpn, (ctx, qp)));
}

pub(super) fn register_cq(id: u32, ctx: usize, cq: usize) {
    routes(|r| r.cqs.insert(id, (ctx, cq)));
}

pub(super) fn register_srq(handle: u32, ctx: usize, srq: usize) {
    routes(|r| r.srqs.insert(handle, (ctx, srq)));
}

pub(super) fn unregister_srq(handle: u32, srq: usize) {
    routes(|r| {
        if let Some((ctx, _)) = r.srqs.remove(&handle) {
            forget(r, ctx, srq);
        }
    });
}

/// The object at `elem` is being destroyed: no event names it from now on (queued ones are dropped).
fn forget(r: &mut Routes, ctx: usize, elem: usize) {
    if let Some(q) = r.queues.get_mut(&ctx) {
        let before = q.events.len();
        q.events
            .retain(|&(e, t)| e != elem || t == IBV_EVENT_PORT_ACTIVE || t == IBV_EVENT_PORT_ERR);
        for _ in q.events.len()..before {
            // Take the dropped events' counts back off the descriptor (never blocks: each was posted).
            let mut v = 0u64;
            // SAFETY: an 8-byte read into a local from the context's eventfd, whose count covers the event.
            let _ = unsafe { libc::read(q.fd, ptr::from_mut(&mut v).cast(), 8) };
        }
    }
}

pub(super) fn unregister_qp(qpn: u32, qp: usize) {
    routes(|r| {
        if let Some((ctx, _)) = r.qps.remove(&qpn) {
            forget(r, ctx, qp);
        }
    });
}

pub(super) fn unregister_cq(id: u32, cq: usize) {
    routes(|r| {
        if let Some((ctx, _)) = r.cqs.remove(&id) {
            forget(r, ctx, cq);
        }
    });
}

/// The runtime's async handler (module docs): routes and queues one engine event.
pub(super) fn deliver(ev: roce_proto::AsyncEvent) {
    use roce_proto::AsyncEventType as T;
    let ty = match ev.event_type {
        T::CqErr => IBV_EVENT_CQ_ERR,
        T::QpFatal => IBV_EVENT_QP_FATAL,
        T::QpReqErr => IBV_EVENT_QP_REQ_ERR,
        T::QpAccessErr => IBV_EVENT_QP_ACCESS_ERR,
        T::CommEst => IBV_EVENT_COMM_EST,
        T::SqDrained => IBV_EVENT_SQ_DRAINED,
        T::PortActive => IBV_EVENT_PORT_ACTIVE,
        T::PortErr => IBV_EVENT_PORT_ERR,
        T::SrqLimitReached => IBV_EVENT_SRQ_LIMIT_REACHED,
        T::QpLastWqeReached => IBV_EVENT_QP_LAST_WQE_REACHED,
    };
    routes(|r| {
        let target = match ev.event_type {
            T::PortActive | T::PortErr => None,
            T::CqErr => match ev.cq.and_then(|c| r.cqs.get(&c.0)) {
                Some(&t) => Some(t),
                None => return,
            },
            T::SrqLimitReached => match ev.srq.and_then(|s| r.srqs.get(&s.0)) {
                Some(&t) => Some(t),
                None => return,
            },
            _ => match ev.qpn.and_then(|q| r.qps.get(&q.value())) {
                Some(&t) => Some(t),
                None => return,
            },
        };
        match target {
            Some((ctx, elem)) => {
                if let Some(q) = r.queues.get_mut(&ctx) {
                    q.events.push_back((elem, ty));
                    post(q.fd);
                }
            }
            // Port events: to every context, element = port 1.
            None => {
                for q in r.queues.values_mut() {
                    q.events.push_back((1, ty));
                    post(q.fd);
                }
            }
        }
    });
}

fn is_qp_event(t: c_int) -> bool {
    matches!(
        t,
        IBV_EVENT_QP_FATAL
            | IBV_EVENT_QP_REQ_ERR
            | IBV_EVENT_QP_ACCESS_ERR
            | IBV_EVENT_COMM_EST
            | IBV_EVENT_SQ_DRAINED
            | IBV_EVENT_QP_LAST_WQE_REACHED
    )
}

/// The oldest event queued for `ctx`, counted as handed out on its object (under [`ROUTES`], which `forget` holds
/// while it drops an object's events, so a handed-out event's object is still live).
fn take(ctx: usize, generation: u64) -> Option<(usize, c_int)> {
    routes(|r| {
        let q = r
            .queues
            .get_mut(&ctx)
            .filter(|q| q.generation == generation)?;
        let (elem, ty) = q.events.pop_front()?;
        let mut v = 0u64;
        // SAFETY: an 8-byte read into a local from the context's eventfd, whose count covers this event.
        let _ = unsafe { libc::read(q.fd, ptr::from_mut(&mut v).cast(), 8) };
        // SAFETY: a routed QP / CQ is live (its destroy unroutes it under this lock before it is freed).
        unsafe {
            if is_qp_event(ty) {
                (*(elem as *const QpBlock))
                    .async_handed
                    .fetch_add(1, Ordering::AcqRel);
            } else if ty == IBV_EVENT_CQ_ERR {
                (*(elem as *const CqBlock))
                    .async_handed
                    .fetch_add(1, Ordering::AcqRel);
            } else if ty == IBV_EVENT_SRQ_LIMIT_REACHED {
                (*(elem as *const srq::SrqBlock))
                    .async_handed
                    .fetch_add(1, Ordering::AcqRel);
            }
        }
        Some((elem, ty))
    })
}

/// `ibv_get_async_event(ctx, event)`: 0 with `*event` filled, or -1 with `errno` (`EINVAL` for a bad context or
/// NULL `event`; `EAGAIN`, `EINTR` as in the module docs).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_get_async_event(
    ctx: *mut IbvContext,
    event: *mut IbvAsyncEvent,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_get_async_event",
        || {
            set_errno(libc::EIO);
            -1
        },
        || unsafe { rocev2_ibv_get_async_event_inner(ctx, event) },
    )
}

unsafe fn rocev2_ibv_get_async_event_inner(
    ctx: *mut IbvContext,
    event: *mut IbvAsyncEvent,
) -> c_int {
    // SAFETY: the caller passes an open context.
    let Some(c) = (unsafe { ctx_block(ctx) }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if event.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let _ = c;
    // This thread's own duplicate of `async_fd` and the context's generation (see `unregister_ctx`).
    let Some((dup, generation)) = routes(|r| {
        r.queues.get(&(ctx as usize)).map(|q| {
            // SAFETY: dup of the context's open descriptor; the result is owned below.
            (
                unsafe { libc::fcntl(q.fd, libc::F_DUPFD_CLOEXEC, 0) },
                q.generation,
            )
        })
    }) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if dup < 0 {
        set_errno(libc::EMFILE);
        return -1;
    }
    // SAFETY: a descriptor just made for this call alone.
    let dup = unsafe { OwnedFd::from_raw_fd(dup) };
    let fd = dup.as_raw_fd();
    let closed = || {
        routes(|r| {
            r.queues
                .get(&(ctx as usize))
                .is_none_or(|q| q.generation != generation)
        })
    };
    loop {
        if let Some((element, event_type)) = take(ctx as usize, generation) {
            // SAFETY: the caller's out-parameter.
            unsafe {
                event.write(IbvAsyncEvent {
                    element,
                    event_type,
                })
            };
            return 0;
        }
        if closed() {
            set_errno(libc::EIO);
            return -1;
        }
        // SAFETY: fcntl on our duplicate (it shares the status flags of the context's descriptor).
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
            if e.kind() == std::io::ErrorKind::Interrupted && signals::all_handlers_restart() {
                continue;
            }
            set_errno(e.raw_os_error().unwrap_or(libc::EINTR));
            return -1;
        }
    }
}

/// Adds one to the counter at `count` under the pthread mutex `m` and wakes the waiters of `cv` (what
/// `ibv_ack_cq_events` does for completion events).
///
/// # Safety
/// The three point into a live object of ours.
unsafe fn ack_one(m: *mut PthreadMutex, cv: *mut PthreadCond, count: *mut u32) {
    // SAFETY: per the contract.
    unsafe {
        let m = m.cast::<libc::pthread_mutex_t>();
        libc::pthread_mutex_lock(m);
        count.write_volatile(count.read_volatile().wrapping_add(1));
        libc::pthread_cond_broadcast(cv.cast::<libc::pthread_cond_t>());
        libc::pthread_mutex_unlock(m);
    }
}

/// `ibv_ack_async_event(event)`: acknowledges an event `ibv_get_async_event` returned (port events need none).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_ack_async_event(event: *mut IbvAsyncEvent) {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_ack_async_event",
        || (),
        || unsafe { rocev2_ibv_ack_async_event_inner(event) },
    )
}

unsafe fn rocev2_ibv_ack_async_event_inner(event: *mut IbvAsyncEvent) {
    // SAFETY: the caller's event, as `ibv_get_async_event` filled it.
    let Some(ev) = (unsafe { event.as_ref() }) else {
        return;
    };
    let e = ev.element;
    // SAFETY: the event's object is live: its destroy waits for this acknowledgement (the table of live
    // objects cannot say: a destroy takes the object out of it before it waits).
    unsafe {
        if is_qp_event(ev.event_type) {
            let q = e as *mut IbvQp;
            ack_one(
                ptr::addr_of_mut!((*q).mutex),
                ptr::addr_of_mut!((*q).cond),
                ptr::addr_of_mut!((*q).events_completed),
            );
        } else if ev.event_type == IBV_EVENT_CQ_ERR {
            let c = e as *mut IbvCq;
            ack_one(
                ptr::addr_of_mut!((*c).mutex),
                ptr::addr_of_mut!((*c).cond),
                ptr::addr_of_mut!((*c).async_events_completed),
            );
        } else if ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED {
            let q = e as *mut IbvSrq;
            ack_one(
                ptr::addr_of_mut!((*q).mutex),
                ptr::addr_of_mut!((*q).cond),
                ptr::addr_of_mut!((*q).events_completed),
            );
        }
    }
}

/// Waits until the counter at `count` has caught up with `handed` (wrapping), on the object's mutex and condition
/// variable, which the acknowledgements signal.
///
/// # Safety
/// The three point into a live object of ours.
pub(super) unsafe fn wait_count(
    m: *mut PthreadMutex,
    cv: *mut PthreadCond,
    count: *const u32,
    handed: u32,
) {
    // SAFETY: per the contract.
    unsafe {
        let m = m.cast::<libc::pthread_mutex_t>();
        libc::pthread_mutex_lock(m);
        while (count.read_volatile().wrapping_sub(handed) as i32) < 0 {
            libc::pthread_cond_wait(cv.cast::<libc::pthread_cond_t>(), m);
        }
        libc::pthread_mutex_unlock(m);
    }
}
