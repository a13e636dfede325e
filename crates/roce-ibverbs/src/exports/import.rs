//! Sharing a context's objects with another context of the same process: `ibv_import_device`, `ibv_import_pd`,
//! `ibv_import_mr`, `ibv_unimport_pd`, `ibv_unimport_mr` (ibv_import_device(3), ibv_import_pd(3), ibv_import_mr(3)).
//!
//! With a kernel RNIC a context is an open uverbs file, its `cmd_fd`; `ibv_import_device(fd)` makes a second
//! context on the same file (a `dup` of it, or one received from another process over a UNIX socket), and the
//! import verbs give it handles onto the PD and MR objects of that file, by their `handle`. Here the objects live in
//! this process's runtime, so what can honestly be offered is the same within one process:
//! * every context's `cmd_fd` is a descriptor of its own open file (an unbound `AF_UNIX` datagram socket: a unique
//!   inode, never readable), so `ibv_import_device(fd)` finds the live context whose `cmd_fd` is the same file as
//!   `fd` (same `st_dev` / `st_ino`: `fd` may be a `dup`), opens a new context on its device (sharing its runtime,
//!   as every context of a device does) and takes `fd` as its own `cmd_fd` (closed by `ibv_close_device`, as
//!   rdma-core does). An `fd` that is not such a file — another process's uverbs file passed over a socket, or any
//!   other descriptor — is `EOPNOTSUPP` (objects of another process cannot be reached), a closed one `EBADF`;
//! * PD and MR `handle`s are unique in the process (from 1); `ibv_import_pd(ctx, h)` / `ibv_import_mr(pd, h)` find
//!   the live object with that handle on a context of the same file as `ctx` and return a new `ibv_pd` / `ibv_mr`
//!   of `ctx` onto the same PD / registration (same keys, length; `addr` NULL as rdma-core's import, which cannot
//!   know the address the memory has in the exporting process). `EINVAL` when there is none;
//! * `ibv_unimport_*` release only the importing object (the PD or MR stays with its other owners); an imported PD
//!   that still has QPs, MRs, AHs, SRQs or windows is released when they are (at the latest when its context
//!   closes). `ibv_dealloc_pd` / `ibv_dereg_mr` of an imported object end that handle onto it: deregistration
//!   invalidates the registration for all (the kernel's semantics), a PD stays with its other owners.

use super::*;

use std::sync::atomic::AtomicU32 as HandleCounter;

/// The next PD / MR handle (unique in the process; 0 is never used).
static NEXT_HANDLE: HandleCounter = HandleCounter::new(1);

/// A fresh object handle for `ibv_pd.handle` / `ibv_mr.handle`.
pub(super) fn next_handle() -> u32 {
    NEXT_HANDLE.fetch_add(1, Ordering::Relaxed)
}

/// A context's command descriptor: an unbound `AF_UNIX` datagram socket (its own inode; `poll` never reports it
/// readable), or -1.
pub(super) fn new_cmd_fd() -> c_int {
    // SAFETY: a plain system call.
    unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) }
}

/// `(st_dev, st_ino)` of the file behind `fd`; `Err(errno)` if `fd` is not open.
fn file_id(fd: c_int) -> Result<(u64, u64), c_int> {
    // SAFETY: `st` is written by fstat before it is read; an all-zero stat is a valid value to start from.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: a plain system call with a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EBADF));
    }
    Ok((st.st_dev, st.st_ino))
}

/// The live contexts whose `cmd_fd` is the file `id`.
fn contexts_of(id: (u64, u64)) -> Vec<*mut IbvContext> {
    live::all(Kind::Ctx)
        .into_iter()
        .map(|p| p as *mut IbvContext)
        // SAFETY: a live context of ours (its `cmd_fd` is read only).
        .filter(|&c| file_id(unsafe { (*c).cmd_fd }) == Ok(id))
        .collect()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_import_device(cmd_fd: c_int) -> *mut IbvContext {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_import_device",
        || null_errno(libc::EIO),
        || unsafe { import_device_inner(cmd_fd) },
    )
}

unsafe fn import_device_inner(cmd_fd: c_int) -> *mut IbvContext {
    let id = match file_id(cmd_fd) {
        Ok(id) => id,
        Err(e) => return null_errno(e),
    };
    let Some(&src) = contexts_of(id).first() else {
        return null_errno(libc::EOPNOTSUPP);
    };
    // SAFETY: a live context of ours: its device pointer is one of the library's device blocks (never freed).
    let dev = unsafe { (*src).device };
    // SAFETY: `dev` is a listed device.
    let ctx = unsafe { rocev2_ibv_open_device_inner(dev) };
    if ctx.is_null() {
        return ctx;
    }
    // SAFETY: the context just made, not yet handed out: it takes `cmd_fd` instead of its own descriptor.
    unsafe {
        libc::close((*ctx).cmd_fd);
        (*ctx).cmd_fd = cmd_fd;
    }
    ctx
}

/// The live objects of `kind` on contexts of the same file as `ctx` whose C handle (read by `handle`) is `h`.
///
/// # Safety
/// `ctx` is a live context of ours; `handle` reads the handle of a live object of `kind`.
unsafe fn find(
    ctx: *mut IbvContext,
    kind: Kind,
    h: u32,
    handle: impl Fn(usize) -> u32,
) -> Option<usize> {
    // SAFETY: per the contract.
    let id = file_id(unsafe { (*ctx).cmd_fd }).ok()?;
    let ctxs: Vec<usize> = contexts_of(id).into_iter().map(|c| c as usize).collect();
    live::all_with_ctx(kind)
        .into_iter()
        .find(|&(p, c)| ctxs.contains(&c) && handle(p) == h)
        .map(|(p, _)| p)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_import_pd(ctx: *mut IbvContext, pd_handle: u32) -> *mut IbvPd {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_import_pd",
        || null_errno(libc::EIO),
        || unsafe { import_pd_inner(ctx, pd_handle) },
    )
}

unsafe fn import_pd_inner(ctx: *mut IbvContext, h: u32) -> *mut IbvPd {
    // SAFETY: NULL or a pointer the caller passes as a context.
    if unsafe { ctx_block(ctx) }.is_none() {
        return null_errno(libc::EINVAL);
    }
    // SAFETY: a live context; PD blocks are `PdBlock`s (read while live: the table's entries are live).
    let found = unsafe { find(ctx, Kind::Pd, h, |p| (*(p as *const PdBlock)).pd.handle) };
    let Some(p) = found else {
        return null_errno(libc::EINVAL);
    };
    // SAFETY: a live PD block (found in the table just now).
    let rust = unsafe { (*(p as *const PdBlock)).rust.clone() };
    let b = into_raw(PdBlock {
        pd: IbvPd {
            context: ctx,
            handle: h,
        },
        rust,
        users: AtomicU32::new(0),
    });
    live::insert(b, Kind::Pd, ctx as usize);
    b.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_unimport_pd(pd: *mut IbvPd) {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_unimport_pd",
        || (),
        || unsafe { unimport_pd_inner(pd) },
    )
}

unsafe fn unimport_pd_inner(pd: *mut IbvPd) {
    // Only a PD nothing uses goes now; one with users stays in the table (the objects made on it name its block)
    // and goes with them or with its context.
    let r = live::take(pd, Kind::Pd, || {
        // SAFETY: a live PD of ours (checked by `take` under its lock).
        let p = unsafe { &*pd.cast::<PdBlock>() };
        if p.users.load(Ordering::Acquire) != 0 {
            return Err(libc::EBUSY);
        }
        Ok(())
    });
    if r.is_ok() {
        // SAFETY: out of the table, without users, not used after this call.
        unsafe { free::<PdBlock, _>(pd) };
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_import_mr(pd: *mut IbvPd, mr_handle: u32) -> *mut IbvMr {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_import_mr",
        || null_errno(libc::EIO),
        || unsafe { import_mr_inner(pd, mr_handle) },
    )
}

unsafe fn import_mr_inner(pd: *mut IbvPd, h: u32) -> *mut IbvMr {
    // SAFETY: PD blocks are `PdBlock`s.
    let Some(p) = (unsafe { live_block::<PdBlock, _>(pd, Kind::Pd) }) else {
        return null_errno(libc::EINVAL);
    };
    let ctx = p.pd.context;
    // SAFETY: a live context (its PD is live); MR blocks are `MrBlock`s whose C part is read under the table's
    // promise that they are live.
    let found = unsafe {
        find(ctx, Kind::Mr, h, |m| {
            (*(*(m as *const MrBlock)).mr.get()).handle
        })
    };
    let Some(m) = found else {
        return null_errno(libc::EINVAL);
    };
    // SAFETY: a live MR block (found in the table just now).
    let src = unsafe { &*(m as *const MrBlock) };
    let st = src.state.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: the C part of a live MR (written only by `ibv_rereg_mr` under `state`'s lock, held here).
    let c = unsafe { &*src.mr.get() };
    let (lkey, rkey, length) = (c.lkey, c.rkey, c.length);
    let (rust, access) = (st.rust.clone(), st.access);
    drop(st);
    p.users.fetch_add(1, Ordering::AcqRel);
    let b = into_raw(MrBlock {
        mr: UnsafeCell::new(IbvMr {
            context: ctx,
            pd,
            addr: null_mut(),
            length,
            handle: h,
            lkey,
            rkey,
        }),
        state: Mutex::new(MrState {
            rust,
            pd: pd as usize,
            access,
        }),
    });
    live::insert(b, Kind::Mr, ctx as usize);
    b.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_unimport_mr(mr: *mut IbvMr) {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_unimport_mr",
        || (),
        || unsafe { unimport_mr_inner(mr) },
    )
}

unsafe fn unimport_mr_inner(mr: *mut IbvMr) {
    let mut pd = 0;
    let r = live::take(mr, Kind::Mr, || {
        // SAFETY: a live MR of ours (checked by `take` under its lock).
        let m = unsafe { &*mr.cast::<MrBlock>() };
        pd = m.state.lock().unwrap_or_else(|e| e.into_inner()).pd;
        Ok(())
    });
    if r.is_ok() {
        // SAFETY: out of the table, not used after this call; its PD is live (it has this user). The registration
        // stays with its other handles (dropping this one deregisters nothing while they live).
        unsafe {
            count_user::<PdBlock, _>(pd as *mut IbvPd, false);
            free::<MrBlock, _>(mr);
        }
    }
}
