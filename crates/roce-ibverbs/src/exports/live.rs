//! The library's own table of live objects, as the kernel's uverbs handles are for rdma-core
//! (`drivers/infiniband/core/rdma_core.c`: every command looks its object up by handle and fails with `EINVAL`
//! when it is gone). Every destroy, dealloc, dereg and close finds its pointer here, of the right kind, and removes
//! it under the table's lock before the block is freed: a second destroy of the same pointer, or a pointer this
//! library never made, is `EINVAL` instead of a double free. Each entry remembers the context that made it, so
//! `ibv_close_device` can release what the program left behind (the kernel's "destroy on close" of the uverbs fd).
//!
//! A `fork`ed child has a table of its own (`roce_fork`): a copy of the parent's with every entry marked
//! inherited when no thread held the parent's lock at the fork, else an empty one — never the parent's lock, which a
//! thread of the parent may have held at that instant and would hold for ever in the child. Destroying an inherited
//! object only takes it out of the child's table ([`INHERITED`]): its teardown would act on the parent's runtime,
//! channels and eventfds (rdma-core, ibv_fork_init(3): a child may not use its parent's resources).
//!
//! Control path only: the data-path slots (`post_send`, `poll_cq` …) trust their pointers as every provider does
//! (one lock per call there would be a lock per WR).

use std::collections::BTreeMap;

/// The error [`take`] gives for an object a `fork`ed child inherited: it is out of the child's table and must be
/// left alone; the verb returns it as its result, 0 (success), having freed nothing.
pub(super) const INHERITED: libc::c_int = 0;

/// What a live pointer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Ctx,
    Pd,
    Mr,
    Mw,
    Channel,
    Cq,
    Qp,
    Srq,
    Ah,
    DeviceList,
}

#[derive(Clone, Copy)]
struct Entry {
    kind: Kind,
    /// The `ibv_context *` the object belongs to (0 for device lists).
    ctx: usize,
    /// Made by the parent of this `fork`ed child (module docs).
    inherited: bool,
}

static LIVE: roce_fork::ForkLocal<BTreeMap<usize, Entry>> =
    roce_fork::ForkLocal::inheriting(BTreeMap::new, |parent| {
        parent
            .iter()
            .map(|(&p, e)| {
                (
                    p,
                    Entry {
                        inherited: true,
                        ..*e
                    },
                )
            })
            .collect()
    });

fn table() -> std::sync::MutexGuard<'static, BTreeMap<usize, Entry>> {
    LIVE.lock()
}

/// Records a new object at `ptr` (its C struct's address) made on context `ctx`.
pub(super) fn insert<T>(ptr: *mut T, kind: Kind, ctx: usize) {
    table().insert(
        ptr as usize,
        Entry {
            kind,
            ctx,
            inherited: false,
        },
    );
}

/// Whether `ptr` is a live object of `kind`.
pub(super) fn is<T>(ptr: *mut T, kind: Kind) -> bool {
    table().get(&(ptr as usize)).is_some_and(|e| e.kind == kind)
}

/// The live objects of `kind` (addresses).
pub(super) fn all(kind: Kind) -> Vec<usize> {
    all_with_ctx(kind).into_iter().map(|(p, _)| p).collect()
}

/// The live objects of `kind` with the context each belongs to.
pub(super) fn all_with_ctx(kind: Kind) -> Vec<(usize, usize)> {
    table()
        .iter()
        .filter(|(_, e)| e.kind == kind)
        .map(|(&p, e)| (p, e.ctx))
        .collect()
}

/// Removes the live object `ptr` of `kind` if `ready` (run under the table's lock, so two destroys of one pointer
/// cannot both pass it) says it may go: `Err(EINVAL)` when `ptr` is not a live `kind`, `ready`'s error otherwise;
/// `Err(INHERITED)` (0) without running `ready` for an object a `fork`ed child inherited: removed, to be left alone.
pub(super) fn take<T>(
    ptr: *mut T,
    kind: Kind,
    ready: impl FnOnce() -> Result<(), libc::c_int>,
) -> Result<(), libc::c_int> {
    let mut t = table();
    match t.get(&(ptr as usize)) {
        Some(e) if e.kind == kind && e.inherited => {
            t.remove(&(ptr as usize));
            Err(INHERITED)
        }
        Some(e) if e.kind == kind => {
            ready()?;
            t.remove(&(ptr as usize));
            Ok(())
        }
        _ => Err(libc::EINVAL),
    }
}

/// Removes and returns every object of context `ctx` (the context itself is not among them), in the order they
/// must be released: QPs, SRQs (once no QP uses them), AHs, MRs and memory windows, CQs, channels, PDs.
pub(super) fn drain_context(ctx: usize) -> Vec<(usize, Kind)> {
    let mut t = table();
    let mut v: Vec<(usize, Kind)> = t
        .iter()
        .filter(|(_, e)| e.ctx == ctx && e.kind != Kind::Ctx)
        .map(|(&p, e)| (p, e.kind))
        .collect();
    for (p, _) in &v {
        t.remove(p);
    }
    let rank = |k: Kind| match k {
        Kind::Qp => 0,
        Kind::Srq => 1,
        Kind::Ah => 2,
        Kind::Mr | Kind::Mw => 3,
        Kind::Cq => 4,
        Kind::Channel => 5,
        Kind::Pd => 6,
        Kind::Ctx | Kind::DeviceList => 7,
    };
    v.sort_by_key(|&(_, k)| rank(k));
    v
}
