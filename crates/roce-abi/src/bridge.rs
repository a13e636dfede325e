//! The private table through which rocev2's `librdmacm.so.1` (crate `roce-rdmacm`) reaches the connection manager
//! of rocev2's `libibverbs.so.1` runtime (crate `roce-ibverbs`, `src/exports/cm_bridge.rs`; `docs/RDMACM.md` §1):
//! one runtime per process, whichever library the program calls first. roce-ibverbs exports
//! [`SYMBOL`]`@@`[`SYMBOL_VERSION`], an [`EntryFn`] returning its static [`PrivateV1`]; roce-rdmacm looks it up with
//! `dlvsym` and calls [`PrivateV1::check`] before it touches any other field.
//!
//! The table is the CM only: QPs, PDs and queries go through the ordinary libibverbs calls (as rdma-core's
//! librdmacm does), and the CM never touches a QP here (`connect` / `accept` name a QPN: the caller moves its QP
//! with `ibv_modify_qp`, so the library's recorded QP state stays right for the post checks).
//!
//! Connections and listens are named by `u64` handles (never reused within the process); every function answers
//! `0` (or what its docs say) or a negative errno (`-EINVAL` for a context the library did not open or a stale
//! handle), never panics.
//!
//! # Versioning rule
//!
//! Both libraries take every declaration of this module from this one crate, so they cannot disagree within one
//! build. Across builds (a `librdmacm.so.1` of one build meeting a `libibverbs.so.1` of another), the table's first
//! two fields decide: **any change of a field's layout or meaning** — of [`PrivateV1`], [`ConnectC`], [`CmEventC`],
//! [`kind`], a function's parameters or what it answers — **bumps [`PRIVATE_VERSION`]**, also when the size stays
//! the same. The exporter stamps [`PRIVATE_VERSION`] and `size_of::<PrivateV1>()` into its table
//! ([`PrivateV1::HEADER_VERSION`] / [`PrivateV1::HEADER_SIZE`]); the importer refuses a table whose version or size
//! differs from its own ([`check`]), with one line on stderr naming both versions, and then answers every rdma_cm
//! call that needs the CM with `ENODEV`: never a call through a layout it does not have. `version` and `size` are
//! the first two `u32` of every version of the table, so an importer of any version can read them.
//!
//! History:
//! * 1: the RC/UC CM (`open` .. `poll_event`).
//! * 2: SIDR (UD port spaces, IBTA Vol 1 §12.11): `sidr_resolve` / `sidr_accept` / `sidr_reject`, the event kinds
//!   `SIDR_REQUEST` / `SIDR_RESOLVED` / `SIDR_REJECTED`, [`CmEventC::qkey`], and `destroy`.
//! * 3: `flush` (librdmacm's exit handler: its DREQs leave before the process ends) and `set_cm_ids` (the
//!   library's ids in the stats endpoint's answer, `rocev2 stat`).
//! * 4: same layout as 3, new meanings (issue #17): [`ConnectC::timeout`] is the program's
//!   `RDMA_OPTION_ID_ACK_TIMEOUT` or 0 for none and sets the REQ's packet lifetime to `timeout - 1` (it was the QP's
//!   Local ACK Timeout, never 0); [`CmEventC::local_ack_timeout`] of `CONNECT_RESPONSE` carries the ACK timeout the
//!   active QP takes at RTS (it was unset there).

use core::ffi::{CStr, c_int};
use core::fmt;

use crate::verbs::IbvContext;

/// Version of [`PrivateV1`]'s layout and meaning (module docs: the versioning rule and history).
pub const PRIVATE_VERSION: u32 = 4;

/// Name of the entry point roce-ibverbs exports (an [`EntryFn`]).
pub const SYMBOL: &CStr = c"rocev2_private_v1";
/// The ELF symbol version of [`SYMBOL`] (`rocev2_private_v1@@ROCEV2_PRIVATE`).
pub const SYMBOL_VERSION: &CStr = c"ROCEV2_PRIVATE";

/// The entry point's type: returns a pointer to the exporter's static table (never NULL).
pub type EntryFn = extern "C" fn() -> *const PrivateV1;

/// Longest private data an event carries (DREP: 224 bytes, IBTA Vol 1 §12.6).
pub const EVENT_PRIVATE_MAX: usize = 224;

/// Event kinds of [`CmEventC::kind`].
pub mod kind {
    /// A REQ matched a listen.
    pub const CONNECT_REQUEST: u32 = 0;
    /// A REP for a connection made by `connect`.
    pub const CONNECT_RESPONSE: u32 = 1;
    /// RTU received (passive) or sent (active).
    pub const ESTABLISHED: u32 = 2;
    /// REJ received; `status` is the reason.
    pub const REJECTED: u32 = 3;
    /// DREQ/DREP exchange done (or gave up).
    pub const DISCONNECTED: u32 = 4;
    /// Timewait over.
    pub const TIMEWAIT_EXIT: u32 = 5;
    /// REQ or REP (or SIDR_REQ) unanswered after all retries.
    pub const UNREACHABLE: u32 = 6;
    /// A SIDR_REQ matched a listen: `conn` names the exchange (answer with `sidr_accept` / `sidr_reject`),
    /// `listen`, `peer_gid` and the SIDR_REQ's private data (216 bytes) are filled.
    pub const SIDR_REQUEST: u32 = 7;
    /// Our SIDR_REQ was answered with status success: `remote_qpn` and `qkey` name the service's UD QP,
    /// `peer_gid` / `traffic_class` the address handle towards it, private data the SIDR_REP's (136 bytes).
    pub const SIDR_RESOLVED: u32 = 8;
    /// Our SIDR_REQ was answered with another status (`status`: IBTA Vol 1 Table 120, 1 unsupported service ID,
    /// 2 rejected, ...); private data the SIDR_REP's.
    pub const SIDR_REJECTED: u32 = 9;
}

/// One CM event as the table hands it out (`poll_event`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CmEventC {
    /// One of [`kind`].
    pub kind: u32,
    /// REJ reason (IBTA Vol 1 Table 112) for `REJECTED`, SIDR status for `SIDR_REJECTED`, else 0.
    pub status: u32,
    /// The connection's handle.
    pub conn: u64,
    /// `CONNECT_REQUEST`: the listen's handle.
    pub listen: u64,
    /// `CONNECT_REQUEST` / `CONNECT_RESPONSE`: the peer's QPN and starting PSN.
    pub remote_qpn: u32,
    /// See `remote_qpn`.
    pub remote_psn: u32,
    /// `CONNECT_REQUEST`: the requester's GID.
    pub peer_gid: [u8; 16],
    /// The REQ's / REP's responder resources.
    pub responder_resources: u8,
    /// The REQ's / REP's initiator depth.
    pub initiator_depth: u8,
    /// `CONNECT_REQUEST`: retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// `CONNECT_REQUEST`: path MTU (IBTA encoding, 1..=5).
    pub path_mtu: u8,
    /// `CONNECT_REQUEST`: the REQ's Local ACK Timeout of the path; `CONNECT_RESPONSE`: the ACK timeout the
    /// active QP takes at RTS (from the REP's TargetACKDelay, Linux `cm.c` `cm_rep_handler`; version 4).
    /// 4.096 µs · 2^n.
    pub local_ack_timeout: u8,
    /// `CONNECT_REQUEST`: traffic class of the path.
    pub traffic_class: u8,
    /// Padding.
    pub reserved: u8,
    /// Bytes of `private_data` that are valid.
    pub private_len: u32,
    /// The message's private data.
    pub private_data: [u8; EVENT_PRIVATE_MAX],
    /// `SIDR_RESOLVED`: the service's Q_Key (version 2).
    pub qkey: u32,
}

impl CmEventC {
    /// An event with every field 0 (what `poll_event` is handed to fill).
    pub const fn zeroed() -> Self {
        Self {
            kind: 0,
            status: 0,
            conn: 0,
            listen: 0,
            remote_qpn: 0,
            remote_psn: 0,
            peer_gid: [0; 16],
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 0,
            rnr_retry_count: 0,
            path_mtu: 0,
            local_ack_timeout: 0,
            traffic_class: 0,
            reserved: 0,
            private_len: 0,
            private_data: [0; EVENT_PRIVATE_MAX],
            qkey: 0,
        }
    }

    /// The valid private data: the first `private_len` bytes (at most [`EVENT_PRIVATE_MAX`]).
    pub fn private(&self) -> &[u8] {
        &self.private_data[..(self.private_len as usize).min(EVENT_PRIVATE_MAX)]
    }

    /// Sets the private data to `pd`, cut to [`EVENT_PRIVATE_MAX`] bytes.
    pub fn set_private(&mut self, pd: &[u8]) {
        let n = pd.len().min(EVENT_PRIVATE_MAX);
        self.private_data[..n].copy_from_slice(&pd[..n]);
        self.private_len = n as u32;
    }
}

/// What `connect` sends (`rdma_connect`).
#[repr(C)]
pub struct ConnectC {
    /// The QP offered.
    pub qpn: u32,
    /// `ibv_qp_type`: 2 RC, 3 UC.
    pub qp_type: u32,
    /// The destination port's GID.
    pub dgid: [u8; 16],
    /// `ps << 16 | port`.
    pub service_id: u64,
    /// Private data (rdma_cm: the 36-byte `cma_hdr` first), at most 92 bytes.
    pub private_data: *const u8,
    /// Its length.
    pub private_len: u32,
    /// `ibv_mtu` 1..=5.
    pub mtu: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries.
    pub rnr_retry_count: u8,
    /// Responder resources / initiator depth offered.
    pub rd_atomic: u8,
    /// The program's ACK timeout (`RDMA_OPTION_ID_ACK_TIMEOUT`, 4.096 µs · 2^n), or 0 for none: when set, the
    /// REQ's Local ACK Timeout is computed from a packet lifetime of `timeout - 1` (Linux `cma.c`
    /// `cma_resolve_iboe_route`), else from the CM's. Version 4 (before: the QP's Local ACK Timeout itself).
    pub timeout: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// The callback of `set_cm_ids`: writes the library's rdma_cm ids as a JSON array (UTF-8, no NUL) into `out` when
/// it fits in `cap` bytes and returns the length it needs either way.
pub type CmIdsFn = unsafe extern "C" fn(out: *mut u8, cap: usize) -> usize;

/// The table (`rocev2_private_v1`). Every function returns 0 (or 1 for an event taken) or a negative errno.
#[repr(C)]
pub struct PrivateV1 {
    /// [`PRIVATE_VERSION`] of the exporter.
    pub version: u32,
    /// `size_of::<PrivateV1>()` of the exporter.
    pub size: u32,
    /// Starts the device's runtime and CM; returns the CM's event fd (readable while events wait) or `-errno`.
    pub open: unsafe extern "C" fn(ctx: *mut IbvContext) -> c_int,
    /// Listens on a service ID (starting the device's runtime and CM if `open` was not called: in one step, so a
    /// REQ that arrived first meets the listen); writes the listen's handle.
    pub listen: unsafe extern "C" fn(ctx: *mut IbvContext, service_id: u64, out: *mut u64) -> c_int,
    /// Stops a listen.
    pub stop_listen: unsafe extern "C" fn(ctx: *mut IbvContext, listen: u64) -> c_int,
    /// Sends a REQ; writes the connection's handle and the starting PSN offered (the QP's SQ PSN).
    pub connect: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        req: *const ConnectC,
        out: *mut u64,
        out_psn: *mut u32,
    ) -> c_int,
    /// Sends the REP for a request (QP `qpn` already in RTR, its RQ PSN `psn`: the REP's Starting PSN).
    pub accept: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        conn: u64,
        qpn: u32,
        psn: u32,
        private_data: *const u8,
        private_len: u32,
        rd_atomic: u8,
        rnr_retry_count: u8,
    ) -> c_int,
    /// Sends a REJ (consumer reject, 28) with private data (at most 148 bytes).
    pub reject: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        conn: u64,
        private_data: *const u8,
        private_len: u32,
    ) -> c_int,
    /// Sends the RTU after `CONNECT_RESPONSE`.
    pub establish: unsafe extern "C" fn(ctx: *mut IbvContext, conn: u64) -> c_int,
    /// Sends a DREQ.
    pub disconnect: unsafe extern "C" fn(ctx: *mut IbvContext, conn: u64) -> c_int,
    /// Takes one event: 1 and `*out` filled, 0 when none waits, or `-errno`.
    pub poll_event: unsafe extern "C" fn(ctx: *mut IbvContext, out: *mut CmEventC) -> c_int,
    /// Sends a SIDR_REQ for `service_id` to the port with GID `*dgid` (private data at most 216 bytes, rdma_cm's
    /// `cma_hdr` first), re-sent after the CM response timeout like a REQ; writes the exchange's handle. The
    /// answer is `SIDR_RESOLVED`, `SIDR_REJECTED` or, after all retries, `UNREACHABLE`.
    pub sidr_resolve: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        dgid: *const [u8; 16],
        service_id: u64,
        private_data: *const u8,
        private_len: u32,
        out: *mut u64,
    ) -> c_int,
    /// Answers a `SIDR_REQUEST` with status success naming UD QP `qpn` (already in RTS with Q_Key `qkey`) and
    /// `qkey`, private data at most 136 bytes. The exchange is over.
    pub sidr_accept: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        conn: u64,
        qpn: u32,
        qkey: u32,
        private_data: *const u8,
        private_len: u32,
    ) -> c_int,
    /// Answers a `SIDR_REQUEST` with status 2 (rejected; Linux `cma.c` for `rdma_reject` on a UD id), private
    /// data at most 136 bytes. The exchange is over.
    pub sidr_reject: unsafe extern "C" fn(
        ctx: *mut IbvContext,
        conn: u64,
        private_data: *const u8,
        private_len: u32,
    ) -> c_int,
    /// Forgets a connection or SIDR exchange as its id is destroyed (`ConnectionManager::destroy`: what Linux
    /// `cm_destroy_id` sends; our unanswered SIDR_REQ stops being re-sent); the handle is stale afterwards.
    pub destroy: unsafe extern "C" fn(ctx: *mut IbvContext, conn: u64) -> c_int,
    /// Drives the device until the CM's queued MADs have left through QP 1, at most `timeout_ms`
    /// (`ConnectionManager::flush`): 1 when they have, 0 when the time ran out. For librdmacm's exit handler.
    pub flush: unsafe extern "C" fn(ctx: *mut IbvContext, timeout_ms: u32) -> c_int,
    /// Registers the library's list of rdma_cm ids for the stats endpoint (`roce_verbs::endpoint::set_cm_id_source`)
    /// through a [`CmIdsFn`]. Answers 0.
    pub set_cm_ids: unsafe extern "C" fn(cb: CmIdsFn) -> c_int,
}

impl PrivateV1 {
    /// The `version` an exporter of this build stamps into its table.
    pub const HEADER_VERSION: u32 = PRIVATE_VERSION;
    /// The `size` an exporter of this build stamps into its table.
    pub const HEADER_SIZE: u32 = size_of::<PrivateV1>() as u32;

    /// [`check`] of this table's `version` and `size`.
    pub fn check(&self) -> Result<(), Mismatch> {
        check(self.version, self.size)
    }
}

/// A table of another version or size than this build's (module docs: the versioning rule).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The table's `version`.
    pub version: u32,
    /// The table's `size` in bytes.
    pub size: u32,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rocev2's libibverbs.so.1 offers private table version {} ({} bytes), this librdmacm needs version \
             {PRIVATE_VERSION} ({} bytes): use the two libraries of one build",
            self.version,
            self.size,
            PrivateV1::HEADER_SIZE,
        )
    }
}

impl std::error::Error for Mismatch {}

/// Whether a table with header `version` / `size` may be used by this build: both must equal this build's
/// ([`PRIVATE_VERSION`], `size_of::<PrivateV1>()`), else the [`Mismatch`] whose `Display` is the line the importer
/// prints.
pub fn check(version: u32, size: u32) -> Result<(), Mismatch> {
    if version == PRIVATE_VERSION && size == PrivateV1::HEADER_SIZE {
        Ok(())
    } else {
        Err(Mismatch { version, size })
    }
}

// The layout both libraries rely on; a change here is a change of layout (module docs: bump the version).
const _: () = {
    use core::mem::offset_of;
    assert!(size_of::<CmEventC>() == 288);
    assert!(offset_of!(CmEventC, peer_gid) == 32);
    assert!(offset_of!(CmEventC, local_ack_timeout) == 53);
    assert!(offset_of!(CmEventC, private_len) == 56);
    assert!(offset_of!(CmEventC, private_data) == 60);
    assert!(offset_of!(CmEventC, qkey) == 284);
    assert!(size_of::<ConnectC>() == 56);
    assert!(offset_of!(ConnectC, private_data) == 32);
    assert!(offset_of!(ConnectC, timeout) == 48);
    assert!(offset_of!(PrivateV1, version) == 0);
    assert!(offset_of!(PrivateV1, size) == 4);
    assert!(size_of::<PrivateV1>() == 8 + 15 * 8);
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_builds_table_header_is_accepted() {
        assert_eq!(
            check(PrivateV1::HEADER_VERSION, PrivateV1::HEADER_SIZE),
            Ok(())
        );
    }

    #[test]
    fn version_3_table_is_refused_with_both_versions_named() {
        // Version 3 has this build's size (the timeout change kept the layout): only the version tells them apart.
        let e = check(3, PrivateV1::HEADER_SIZE).unwrap_err();
        assert_eq!(
            e,
            Mismatch {
                version: 3,
                size: PrivateV1::HEADER_SIZE
            }
        );
        let msg = e.to_string();
        assert!(msg.contains("private table version 3 (128 bytes)"), "{msg}");
        assert!(msg.contains("needs version 4 (128 bytes)"), "{msg}");
        assert!(msg.contains("use the two libraries of one build"), "{msg}");
    }

    #[test]
    fn newer_version_and_other_size_are_refused() {
        assert!(check(PRIVATE_VERSION + 1, PrivateV1::HEADER_SIZE).is_err());
        assert!(check(PRIVATE_VERSION, PrivateV1::HEADER_SIZE - 8).is_err());
        assert!(check(PRIVATE_VERSION, PrivateV1::HEADER_SIZE + 8).is_err());
        assert!(check(0, 0).is_err());
    }

    #[test]
    fn event_private_data_is_cut_to_the_maximum() {
        let mut ev = CmEventC::zeroed();
        ev.set_private(&[7; EVENT_PRIVATE_MAX + 10]);
        assert_eq!(ev.private_len as usize, EVENT_PRIVATE_MAX);
        ev.private_len = u32::MAX;
        assert_eq!(ev.private().len(), EVENT_PRIVATE_MAX);
        ev.set_private(b"abc");
        assert_eq!(ev.private(), b"abc");
    }
}
