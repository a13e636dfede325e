//! roce-proto: the sans-IO RoCE v2 engine — verbs objects (PD, MR, CQ, AH, QP), the requester (the send module of
//! an RNIC), the responder that closes the loop, timers and counters.
//!
//! # Architecture
//!
//! [`Engine`] is one port of a software RNIC, written in the quinn-proto manner (`docs/STYLE.md` §2): it does
//! no I/O, reads no clock and draws randomness only from [`EngineConfig::seed`]. A driver feeds it received frames
//! ([`Engine::handle_frame`]) and timer expiries ([`Engine::handle_timeout`]), issues verbs (`post_send`, ...) and
//! drains its outputs ([`Engine::poll_transmit`], [`Engine::poll_timeout`], [`Engine::poll_cq`],
//! [`Engine::poll_async_event`]). Frames are whole Ethernet frames; packet layouts, ICRC and PSN arithmetic come from
//! `roce-wire`.
//!
//! * `verbs`: libibverbs-named data types ([`SendWr`], [`RecvWr`], [`Wc`], [`WcStatus`], [`QpAttr`], ...).
//! * `state`: the QP state machine table (`ROCEV2.md §4.6`).
//! * `requester` / `responder`: the transport rules (`ROCEV2.md §4`, `§5`, `§6`).
//! * `gsi`: QP 1, the GSI — a UD QP the engine owns, with [`Engine::poll_mad`] / [`Engine::send_mad`] for 256-byte
//!   MADs (IBTA Vol 1 §13.4; the connection manager `roce-cm` runs on it).
//! * `timer`: timers as data; `stats`: counters with operator names; `cc`: the rate-control seam (controllers
//!   compute a QP's rate) and the DCQCN reaction point (`cc::Dcqcn`, profiles `paper`/`ns3_mlx`/`nvidia`,
//!   `docs/spec/DCQCN.md` §2; the project's `docs/CONGESTION.md`); `sched`: the send scheduler that enforces
//!   the rate — control frames, then READ responses, then requests by ETS-weighted DWRR across traffic classes, with
//!   token-bucket shapers per QP, class and port (`DCQCN.md §7, §9`).
//!
//! # Quick start
//!
//! ```
//! use roce_proto::*;
//! let mut a = Engine::new(EngineConfig::default());
//! let pd = a.alloc_pd().unwrap();
//! let cq = a.create_cq(16).unwrap();
//! let mr = a.reg_mr(pd, vec![0u8; 4096], AccessFlags::LOCAL_WRITE).unwrap();
//! let (qpn, cap) = a
//!     .create_qp(&QpInitAttr {
//!         qp_type: QpType::Rc,
//!         pd,
//!         send_cq: cq,
//!         recv_cq: cq,
//!         cap: QpCap { max_send_wr: 16, max_recv_wr: 16, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 },
//!         sq_sig_all: false,
//!     })
//!     .unwrap();
//! assert_eq!(cap.max_send_wr, 16);
//! // ... modify_qp(RESET→INIT→RTR→RTS) with the peer's QPN/PSN/GID/MAC, then post_send / poll_transmit.
//! let mut wcs = [Wc::default(); 4];
//! assert_eq!(a.poll_cq(cq, &mut wcs), 0);
//! # let _ = (qpn, mr);
//! ```
//!
//! # Choices where the sources differ (documented once here)
//!
//! * `retry_cnt` 7 is a count of 7 retries (IBTA); rxe treats it as infinite. `rnr_retry` 7 is infinite.
//! * RC packets carry BTH.MigReq = 1 ("migrated", what hardware RNICs send when APM is unused, S12); UD and CNP
//!   packets carry 0 (UC too); received MigReq is ignored.
//! * The IPv4 identification is fixed per QP (DF is set, RFC 6864), so a retransmission is byte-identical to the
//!   original frame (the ID is ICRC-covered).
//! * Fence follows IBTA (wait for earlier READ/atomic WRs only), not rxe's "wait for everything".
//! * Atomic operands live in memory in little-endian order (host order of x86/ARM), as a hardware RNIC writes them.
//! * UD receive: payload + 40-byte GRH area larger than the receive WR → dropped and counted (`drop_ud_too_long`),
//!   QP stays RTS (S07). UD sends larger than the path MTU are rejected at `post_send`.
//! * After an RNR NAK the responder suppresses sequence NAKs until the NAKed PSN arrives again, and the requester
//!   ignores NAKs while it waits, so a retry happens exactly one advertised RNR time later (S04, S19).
//! * `local_ack_timeout_err` counts every local ACK timer expiry, including the last one that ends in RETRY_EXC_ERR
//!   (S15: `retry_cnt` = 3 gives 4 expiries).
//! * ACKs are coalesced but never delayed: every AckReq gets an ACK, several pending ones merge into the newest
//!   (no AckCoalesce timer). CNPs: at most one per QP per `cnp_interval`; a CE mark inside an open interval is
//!   answered at its end (`CnpPacing` timer, `DCQCN.md` §2.2 N2).
//!
//! # Resource cleanup
//!
//! The engine holds each MR's memory as an [`MrBuffer`] (a boxed [`MrMemory`]: `Vec<u8>`, `Box<[u8]>`, or memory the
//! application keeps using, such as roce-verbs' `MrBuf`) and reaches it only through range-scoped copies, CRC and
//! 64-bit atomics — one dynamic call per access, never a slice of the whole region (see the trait's contract);
//! [`Engine::dereg_mr`] returns the buffer and fails with `Busy` while a posted WR or a saved READ responder resource
//! still uses the MR. CQs and PDs cannot be
//! destroyed while QPs use them.
//!
//! # Testing
//!
//! `cargo test -p roce-proto` runs unit tests and the in-crate two-engine harness (`src/tests/`: a quinn-style `Pair`
//! over an in-memory wire with latency, loss/CE filters and capture): every opcode and QP type, segmentation and PSN
//! wrap, go-back-N, timeouts, RNR, flushes, responder rules with injected frames, counters, a proptest of
//! `modify_qp` against the `ROCEV2.md §4.6` table and a proptest throwing ICRC-valid arbitrary frames at live QPs.
//! Ignored extras: `cargo test --release -p roce-proto many_seeds -- --ignored` (SEEDS, LOSS, START env vars:
//! randomized lossy WR mixes) and `perf_pair -- --ignored --nocapture` (two engines, one thread, no link).
//! `tests/no_alloc.rs` (its own binary, with a counting `#[global_allocator]`) proves the per-packet path allocates
//! and frees nothing from the first packet on, lossless and lossy, for RC, UC and UD and every opcode.
//! The named scenarios S01–S20, the WR property test and the soak live in `crates/roce-tests`.
//!
//! # For the detail-oriented
//!
//! Protocol rules cite `docs/spec/ROCEV2.md` sections (IBTA Vol 1 ch. 9 transport, ch. 11 verbs, Annex A17
//! RoCE v2, and the Linux rxe driver files noted there). Where IBTA and rxe differ the engine follows IBTA and says so
//! (e.g. `retry_cnt` 7 is a count, not infinite).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cc;
pub mod config;
mod cq;
mod engine;
pub mod error;
pub mod gsi;
pub mod mcast;
mod mr;
mod mw;
mod qp;
pub mod qpn;
mod requester;
mod rereg;
mod resp_queue;
mod responder;
pub mod sched;
mod srq;
pub mod state;
pub mod stats;
pub mod time;
pub mod timer;
pub mod verbs;
mod wire;

#[cfg(test)]
mod tests;

pub use cc::{DcqcnConfig, FixedRate, RateController, RateMetrics};
pub use config::{CapPolicy, DeviceAttr, EngineConfig};
pub use engine::{
    Engine, FIRST_QPN, GATHER_MIN, PayloadCopies, QpDump, QpInfo, TxGather, TxKind, TxMeta, TxSeg,
};
pub use error::{CreateQpError, ModifyQpError, PostError, PostErrorKind, ResourceError};
pub use gsi::{GsiConfig, GsiError, GsiStats, MadDest, MadRecv};
pub use mr::{MemoryFault, MrBuffer, MrMemory};
pub use mw::MwType;
pub use qpn::{MAX_QPN, QpnRange};
pub use requester::{local_ack_timeout, packets_for};
pub use roce_wire::{Msn, Psn, Qpn};
pub use sched::{SchedConfig, Scheduler, TcConfig, TokenBucket};
pub use stats::Counters;
pub use time::Instant;
pub use timer::TimerKind;
pub use verbs::*;
