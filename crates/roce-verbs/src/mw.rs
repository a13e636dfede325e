//! Memory windows ([`Mw`], `ibv_mw`): a thread-safe handle over one of the engine's windows (`roce_proto` `mw`
//! module: IBTA Vol 1 §10.6.7, rxe `rxe_mw.c`).
//!
//! Allocation and deallocation are control verbs (progress lock, blocking). Binding and invalidating are work
//! requests on a QP's send queue, posted with [`Qp::post_send`](crate::Qp::post_send) like any other:
//! [`SendOp::BindMw`](roce_proto::SendOp::BindMw) naming [`Mw::rkey`] (any key of the window names it) and
//! [`SendOp::LocalInv`](roce_proto::SendOp::LocalInv); their completions come through the send CQ in order.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use roce_proto::{MwType, Rkey};

use crate::handles::{Context, Error, Pd};

struct MwInner {
    pd: Pd,
    /// The key at allocation: names the window for the engine whatever its key byte is now.
    rkey: Rkey,
    ty: MwType,
    /// Cleared by a successful [`Mw::dealloc`], so `Drop` does not free it again.
    live: AtomicBool,
}

impl std::fmt::Debug for MwInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw")
            .field("rkey", &self.rkey)
            .field("type", &self.ty)
            .finish_non_exhaustive()
    }
}

impl Drop for MwInner {
    fn drop(&mut self) {
        if !self.live.load(Ordering::Acquire) {
            return;
        }
        let k = self.rkey;
        self.pd.context().cast(move |d| {
            if let Err(e) = d.engine.dealloc_mw(k) {
                tracing::warn!(error = %e, "dealloc_mw failed");
            }
        });
    }
}

/// A memory window (`ibv_mw`). Cheap to clone, `Send + Sync`; keeps its PD alive. The last handle dropped frees
/// the window (as [`Mw::dealloc`]).
#[derive(Clone, Debug)]
pub struct Mw {
    inner: Arc<MwInner>,
}

impl Pd {
    /// `ibv_alloc_mw` of type `ty` in this PD: unbound (no remote access until a BIND_MW WR binds it). Errors: the
    /// engine's (`InvalidHandle` for a dead PD, `Exhausted` at `max_mw`).
    pub fn alloc_mw(&self, ty: MwType) -> Result<Mw, Error> {
        let pd = self.handle();
        let rkey = self.context().call(move |d| d.engine.alloc_mw(pd, ty))??;
        Ok(Mw {
            inner: Arc::new(MwInner {
                pd: self.clone(),
                rkey,
                ty,
                live: AtomicBool::new(true),
            }),
        })
    }
}

impl Mw {
    /// The window's R_Key at allocation (`ibv_mw.rkey` after `ibv_alloc_mw`). A bind gives it a new key byte (the
    /// low byte of the WR's `rkey`); this value still names the window in [`SendOp::BindMw`](roce_proto::SendOp).
    pub fn rkey(&self) -> Rkey {
        self.inner.rkey
    }

    /// The window's type.
    pub fn mw_type(&self) -> MwType {
        self.inner.ty
    }

    /// The PD of this window.
    pub fn pd(&self) -> &Pd {
        &self.inner.pd
    }

    /// The device of this window.
    pub fn context(&self) -> &Context {
        self.inner.pd.context()
    }

    /// `ibv_dealloc_mw`: frees the window now, bound or not (its key stops granting access at once; rxe
    /// `rxe_dealloc_mw`). Other clones of this handle then name a freed window. Errors: `Resource(InvalidHandle)`
    /// if it was freed already.
    pub fn dealloc(&self) -> Result<(), Error> {
        let k = self.inner.rkey;
        self.context().call(move |d| d.engine.dealloc_mw(k))??;
        self.inner.live.store(false, Ordering::Release);
        Ok(())
    }
}
