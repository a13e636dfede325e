//! roce-verbs: the application-facing runtime of the rocev2 software RNIC — threads, not sans-IO.
//!
//! An **engine thread** owns the sans-IO [`roce_proto::Engine`] of a device together with its
//! [`roce_link::Link`] and drives it (`STYLE.md` D1, loop described in the `runner` module docs). Applications use
//! thread-safe handles whose verbs forward to that thread (`STYLE.md` §4.3, §10):
//!
//! * data path: [`Qp::post_send`] / [`Qp::post_recv`] copy the work requests into the QP's lock-free SPSC rings
//!   (rtrb) and ring **one doorbell per posted chain** (a release store, plus an unpark only when the engine thread
//!   is parked); completions come back through a per-CQ ring, [`Cq::poll`] `(&mut [Wc]) -> usize` (0 = empty);
//! * control path (create/modify/destroy, `reg_mr`, MR contents, counters): a command queue; the caller waits for
//!   the answer (bounded by [`COMMAND_TIMEOUT`]);
//! * completion channels with CQ moderation ([`CompChannel`], [`Moderation`]): `req_notify` + a blocking
//!   `get_event(timeout)`.
//!
//! # Memory
//!
//! MR buffers are owned by the engine (`roce_proto::Engine::reg_mr` takes any [`MrMemory`] boxed as an
//! [`MrBuffer`]: `Vec<u8>`, `Box<[u8]>`, or a [`HugePageBuffer`]), which leases them while a WR uses them, so no safe
//! call can make the engine touch freed memory; applications read and write MR contents with [`Mr::read`] /
//! [`Mr::write`] (copies, executed on the engine thread between packets). [`Pd::reg_mr_hugepages`] puts an MR on
//! 2 MiB huge pages (reserved in `/proc/sys/vm/nr_hugepages`), falling back to normal pages with a warning.
//!
//! # Example
//!
//! ```
//! use roce_verbs::*;
//! let (a, b) = Context::sim_pair(RuntimeConfig::default()).unwrap();
//! let pd = a.alloc_pd().unwrap();
//! let cq = a.create_cq(16, None, Moderation::default()).unwrap();
//! let mr = pd.reg_mr(vec![7u8; 64], AccessFlags::LOCAL_WRITE).unwrap();
//! assert_eq!(mr.length(), 64);
//! let mut wcs = [Wc::default(); 4];
//! assert_eq!(cq.poll(&mut wcs), 0);
//! # drop(b);
//! ```
#![warn(missing_docs)]

mod channel;
mod clock;
mod handles;
mod hugepage;
mod runner;
mod wqe;

pub use channel::{CompChannel, Moderation};
pub use clock::Clock;
pub use handles::{
    Ah, COMMAND_TIMEOUT, ConnectOpts, Context, Cq, Error, Mr, Pd, PostError, Qp, QpEndpoint,
};
pub use hugepage::{HUGE_PAGE_SIZE, HugePageBuffer, HugePagePolicy};
pub use roce_proto::{
    AccessFlags, AhAttr, Counters, EngineConfig, Gid, MrBuffer, MrMemory, Mtu, Psn, QpAttr,
    QpAttrMask, QpCap, QpState, QpType, RecvWr, Rkey, SendFlags, SendOp, SendWr, Sge, UdDest, Wc,
    WcOpcode, WcStatus,
};
pub use runner::{RuntimeConfig, RuntimeStats};
pub use wqe::{MAX_INLINE, MAX_SGE};
