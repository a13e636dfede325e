//! Communication manager (CM) messages: the class data of CM MADs (management
//! class 0x07, class version 2) and the rdma_cm address header carried in a
//! REQ's private data.
//!
//! Every message is a value (`XxxRepr`) with `parse` (from the 232 data bytes
//! behind the MAD header, [`crate::mad::DATA_LEN`]) and `emit`. Field positions
//! are those of IBTA Vol 1 chapter 12, §12.6 "Communication Management
//! Messages" (REQ Table 106 ... SIDR_REP Table 120); Linux lists the same
//! positions as data in `include/rdma/ibta_vol1_c12.h` (byte offset after the
//! MAD header, bit offset counted from the most significant bit, width), which
//! is what the private `fld` modules here restate. Bit fields of one byte are
//! read and written through two private helpers (`bits`, `put_bits`) with the same
//! (bit offset from the MSB, width) convention.
//!
//! Rules shared by every message:
//! * `parse` accepts any bytes: [`Error::Truncated`] when fewer than 232, and
//!   [`Error::Malformed`] only where a length field inside the message points
//!   past its area (REJ `RejectedInfoLength` > 72, SIDR_REP
//!   `AdditionalInformationLength` > 72). Reserved bits are ignored.
//! * `emit` writes all 232 bytes: reserved bits 0, values wider than their
//!   field are truncated to the field's width (documented per field).
//! * The private data areas have fixed sizes on the wire (REQ 92, MRA 222,
//!   REJ 148, REP 196, RTU 224, DREQ 220, DREP 224, SIDR_REQ 216, SIDR_REP
//!   136 bytes; Linux `enum ib_cm_data_size`); a repr carries the whole area
//!   as an array, so round trips are exact and nothing is allocated.
//!
//! [`CmMad`] is a whole CM MAD (header + message) with `parse`/`emit` over 256
//! bytes. [`CmaHdr`] is the rdma_cm address header (Linux `cma.c`, `struct
//! cma_hdr`) and [`service_id`] the rdma_cm service ID of a port space and
//! port (Linux `cma.c`, `rdma_get_service_id`).

use core::fmt;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::field::{
    read_u16, read_u24, read_u32, read_u64, write_u16, write_u24, write_u32, write_u64,
};
use crate::mad::{DATA_LEN, MAD_LEN, Mad, MadHeaderRepr};
use crate::{Error, Gid, Psn, Qpn, Result};

/// CM attribute IDs: which message a CM MAD carries (IBTA Vol 1 §12.6; Linux `CM_*_ATTR_ID` in `include/rdma/ib_cm.h`).
pub mod attr {
    /// ClassPortInfo.
    pub const CLASS_PORT_INFO: u16 = 0x0001;
    /// ConnectRequest (REQ).
    pub const REQ: u16 = 0x0010;
    /// MsgRcptAck (MRA).
    pub const MRA: u16 = 0x0011;
    /// ConnectReject (REJ).
    pub const REJ: u16 = 0x0012;
    /// ConnectReply (REP).
    pub const REP: u16 = 0x0013;
    /// ReadyToUse (RTU).
    pub const RTU: u16 = 0x0014;
    /// DisconnectRequest (DREQ).
    pub const DREQ: u16 = 0x0015;
    /// DisconnectReply (DREP).
    pub const DREP: u16 = 0x0016;
    /// ServiceIDResReq (SIDR_REQ).
    pub const SIDR_REQ: u16 = 0x0017;
    /// ServiceIDResReqResp (SIDR_REP).
    pub const SIDR_REP: u16 = 0x0018;
    /// LoadAlternatePath (LAP): not parsed by this crate.
    pub const LAP: u16 = 0x0019;
    /// AlternatePathResponse (APR): not parsed by this crate.
    pub const APR: u16 = 0x001a;
}

/// REJ reason codes (IBTA Vol 1 §12.6, REJ reasons; Linux `enum
/// ib_cm_rej_reason`). Unknown values are kept as they are (a `u16`).
pub mod rej_reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// No EEC available.
    pub const NO_EEC: u16 = 2;
    /// No resources available.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout (the sender's response timer ran out).
    pub const TIMEOUT: u16 = 4;
    /// Unsupported request.
    pub const UNSUPPORTED: u16 = 5;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid communication instance.
    pub const INVALID_COMM_INSTANCE: u16 = 7;
    /// Invalid service ID (nobody listens).
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Invalid transport service type.
    pub const INVALID_TRANSPORT_TYPE: u16 = 9;
    /// Stale connection (the remote QP / comm ID is still known here).
    pub const STALE_CONN: u16 = 10;
    /// Consumer-defined reject (the application said no).
    pub const CONSUMER_DEFINED: u16 = 28;
    /// Invalid class version.
    pub const INVALID_CLASS_VERSION: u16 = 31;
}

/// `MessageRejected` / `MessageMRAed` values: which message a REJ or MRA
/// answers (IBTA Vol 1 §12.6, MRA and REJ; Linux `enum cm_msg_response`).
pub mod msg_response {
    /// The REQ.
    pub const REQ: u8 = 0;
    /// The REP.
    pub const REP: u8 = 1;
    /// Other (LAP for an MRA; for a REJ: a message that is neither REQ nor REP).
    pub const OTHER: u8 = 2;
}

/// SIDR_REP status values (IBTA Vol 1 §12.11; Linux `enum
/// ib_cm_sidr_status`).
pub mod sidr_status {
    /// Success: QPN and Q_Key are valid.
    pub const SUCCESS: u8 = 0;
    /// Service ID not supported.
    pub const UNSUPPORTED: u8 = 1;
    /// Rejected by the service provider.
    pub const REJECT: u8 = 2;
    /// No QP available.
    pub const NO_QP: u8 = 3;
    /// Redirect (ClassPortInfo in the additional information).
    pub const REDIRECT: u8 = 4;
    /// Class version not supported.
    pub const UNSUPPORTED_VERSION: u8 = 5;
}

/// Private data size of a REQ.
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Private data size of an MRA.
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// Private data size of a REJ.
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Size of a REJ's additional rejection information (ARI).
pub const REJ_ARI_LEN: usize = 72;
/// Private data size of a REP.
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Private data size of an RTU.
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// Private data size of a DREQ.
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// Private data size of a DREP.
pub const DREP_PRIVATE_DATA_LEN: usize = 224;
/// Private data size of a SIDR_REQ.
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Private data size of a SIDR_REP.
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Size of a SIDR_REP's additional information.
pub const SIDR_REP_INFO_LEN: usize = 72;

/// Reads `width` bits of `b` starting `off` bits below the most significant
/// bit (the IBTA `Byte[Bit]` convention).
#[inline]
pub(crate) const fn bits(b: u8, off: u32, width: u32) -> u8 {
    let shift = 8 - off - width;
    let mask = ((1u16 << width) - 1) as u8;
    (b >> shift) & mask
}

/// Writes the low `width` bits of `v` into `b` at `off` bits below the MSB,
/// leaving the other bits alone.
#[inline]
pub(crate) fn put_bits(b: &mut u8, off: u32, width: u32, v: u8) {
    let shift = 8 - off - width;
    let mask = ((1u16 << width) - 1) as u8;
    *b = (*b & !(mask << shift)) | ((v & mask) << shift);
}

fn data(bytes: &[u8]) -> Result<&[u8; DATA_LEN]> {
    bytes
        .get(..DATA_LEN)
        .and_then(|d| d.try_into().ok())
        .ok_or(Error::Truncated)
}

fn array<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

/// One path's block inside a REQ (primary at data offset 52, alternate at 96;
/// 44 bytes each): IBTA Vol 1 §12.6, Table 106, "Primary/Alternate ..."
/// fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct PathRepr {
    /// Local port LID (on RoCE: 0, or 0xffff "permissive" as Linux writes
    /// for a routed path).
    pub local_lid: u16,
    /// Remote port LID.
    pub remote_lid: u16,
    /// Local port GID (on RoCE v2: the sender's IP address as a GID).
    pub local_gid: Gid,
    /// Remote port GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBTA rate encoding).
    pub packet_rate: u8,
    /// Traffic class (the IP DSCP/ECN byte on RoCE v2).
    pub traffic_class: u8,
    /// Hop limit (the IP TTL on RoCE v2).
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local bit.
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits, 4.096 µs × 2^n).
    pub local_ack_timeout: u8,
}

mod path_fld {
    use crate::field::Field;
    pub(crate) const LOCAL_LID: Field = 0..2;
    pub(crate) const REMOTE_LID: Field = 2..4;
    pub(crate) const LOCAL_GID: Field = 4..20;
    pub(crate) const REMOTE_GID: Field = 20..36;
    /// Flow label (top 20 bits), 6 reserved bits, packet rate (low 6 bits).
    pub(crate) const FLOW_RATE: Field = 36..40;
    pub(crate) const TCLASS: usize = 40;
    pub(crate) const HOP_LIMIT: usize = 41;
    /// SL (0, 4), subnet local (4, 1).
    pub(crate) const SL_BYTE: usize = 42;
    /// Local ACK timeout (0, 5); in the alternate block also SAP supported (5, 1).
    pub(crate) const ACK_BYTE: usize = 43;
    pub(crate) const LEN: usize = 44;
}

impl PathRepr {
    fn parse(b: &[u8]) -> Self {
        let w = read_u32(&b[path_fld::FLOW_RATE]);
        PathRepr {
            local_lid: read_u16(&b[path_fld::LOCAL_LID]),
            remote_lid: read_u16(&b[path_fld::REMOTE_LID]),
            local_gid: Gid::from_bytes(array(&b[path_fld::LOCAL_GID])),
            remote_gid: Gid::from_bytes(array(&b[path_fld::REMOTE_GID])),
            flow_label: w >> 12,
            packet_rate: (w & 0x3f) as u8,
            traffic_class: b[path_fld::TCLASS],
            hop_limit: b[path_fld::HOP_LIMIT],
            sl: bits(b[path_fld::SL_BYTE], 0, 4),
            subnet_local: bits(b[path_fld::SL_BYTE], 4, 1) != 0,
            local_ack_timeout: bits(b[path_fld::ACK_BYTE], 0, 5),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        write_u16(&mut b[path_fld::LOCAL_LID], self.local_lid);
        write_u16(&mut b[path_fld::REMOTE_LID], self.remote_lid);
        b[path_fld::LOCAL_GID].copy_from_slice(self.local_gid.as_bytes());
        b[path_fld::REMOTE_GID].copy_from_slice(self.remote_gid.as_bytes());
        write_u32(
            &mut b[path_fld::FLOW_RATE],
            ((self.flow_label & 0xf_ffff) << 12) | u32::from(self.packet_rate & 0x3f),
        );
        b[path_fld::TCLASS] = self.traffic_class;
        b[path_fld::HOP_LIMIT] = self.hop_limit;
        let mut s = 0;
        put_bits(&mut s, 0, 4, self.sl);
        put_bits(&mut s, 4, 1, self.subnet_local as u8);
        b[path_fld::SL_BYTE] = s;
        let mut a = 0;
        put_bits(&mut a, 0, 5, self.local_ack_timeout);
        b[path_fld::ACK_BYTE] = a;
    }
}

mod req_fld {
    use crate::field::Field;
    pub(crate) const LOCAL_COMM_ID: Field = 0..4;
    pub(crate) const VENDOR_ID: Field = 5..8;
    pub(crate) const SERVICE_ID: Field = 8..16;
    pub(crate) const LOCAL_CA_GUID: Field = 16..24;
    pub(crate) const LOCAL_QKEY: Field = 28..32;
    pub(crate) const LOCAL_QPN: Field = 32..35;
    pub(crate) const RESPONDER_RESOURCES: usize = 35;
    pub(crate) const LOCAL_EECN: Field = 36..39;
    pub(crate) const INITIATOR_DEPTH: usize = 39;
    pub(crate) const REMOTE_EECN: Field = 40..43;
    /// Remote CM response timeout (0, 5), transport service type (5, 2),
    /// end-to-end flow control (7, 1).
    pub(crate) const BYTE43: usize = 43;
    pub(crate) const STARTING_PSN: Field = 44..47;
    /// Local CM response timeout (0, 5), retry count (5, 3).
    pub(crate) const BYTE47: usize = 47;
    pub(crate) const PKEY: Field = 48..50;
    /// Path MTU (0, 4), RDC exists (4, 1), RNR retry count (5, 3).
    pub(crate) const BYTE50: usize = 50;
    /// Max CM retries (0, 4), SRQ (4, 1), extended transport type (5, 3).
    pub(crate) const BYTE51: usize = 51;
    pub(crate) const PRIMARY: usize = 52;
    pub(crate) const ALTERNATE: usize = 96;
    /// SAP supported: bit 5 of byte 139 (the alternate block's last byte).
    pub(crate) const SAP_BYTE: usize = 139;
    pub(crate) const PRIVATE: Field = 140..232;
}

/// Transport service types of a REQ (IBTA Vol 1 §12.6; Linux
/// `cm_req_set_qp_type`: RC 0, UC 1, and 3 with extended type 1 for XRC).
pub mod transport_type {
    /// Reliable connection.
    pub const RC: u8 = 0;
    /// Unreliable connection.
    pub const UC: u8 = 1;
    /// Reliable datagram.
    pub const RD: u8 = 2;
    /// "Extended" (see the extended transport type field; 1 = XRC).
    pub const EXTENDED: u8 = 3;
}

/// ConnectRequest (REQ), IBTA Vol 1 §12.6, Table 106.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ReqRepr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// ECE vendor ID (24 bits, bytes 5..8; Linux `CM_REQ_VENDOR_ID`).
    pub vendor_id: u32,
    /// Service ID (for rdma_cm see [`service_id`]).
    pub service_id: u64,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Local Q_Key (UD/RD only; 0 for RC).
    pub local_qkey: u32,
    /// Local QP number.
    pub local_qpn: Qpn,
    /// Responder resources (RDMA READ / atomic depth offered).
    pub responder_resources: u8,
    /// Local EE context number (24 bits, RD only).
    pub local_eecn: u32,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Remote EE context number (24 bits, RD only).
    pub remote_eecn: u32,
    /// Remote CM response timeout (5 bits, 4.096 µs × 2^n): how long the
    /// passive side may take to answer this REQ.
    pub remote_cm_response_timeout: u8,
    /// Transport service type (2 bits, [`transport_type`]).
    pub transport_service_type: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// Starting PSN: the PSN the sender's QP expects the first request from
    /// the peer to carry, i.e. the REP sender's send PSN (Linux `cm.c`
    /// `ib_send_cm_req` sets the requester's `rq_psn` from it,
    /// `cm_req_handler` the responder's `sq_psn`).
    pub starting_psn: Psn,
    /// Local CM response timeout (5 bits): how long the sender may take to
    /// answer a REP.
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU (4 bits, IBTA MTU encoding: 1 = 256 ... 5 = 4096).
    pub path_mtu: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// Max CM retries (4 bits): how often a CM message is re-sent.
    pub max_cm_retries: u8,
    /// SRQ in use.
    pub srq: bool,
    /// Extended transport type (3 bits).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary: PathRepr,
    /// Alternate path (all zero when there is none).
    pub alternate: PathRepr,
    /// SAP supported.
    pub sap_supported: bool,
    /// Private data (rdma_cm: a [`CmaHdr`] then the application's bytes).
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl Default for ReqRepr {
    fn default() -> Self {
        ReqRepr {
            local_comm_id: 0,
            vendor_id: 0,
            service_id: 0,
            local_ca_guid: 0,
            local_qkey: 0,
            local_qpn: Qpn::new(0),
            responder_resources: 0,
            local_eecn: 0,
            initiator_depth: 0,
            remote_eecn: 0,
            remote_cm_response_timeout: 0,
            transport_service_type: 0,
            end_to_end_flow_control: false,
            starting_psn: Psn::new(0),
            local_cm_response_timeout: 0,
            retry_count: 0,
            pkey: 0,
            path_mtu: 0,
            rdc_exists: false,
            rnr_retry_count: 0,
            max_cm_retries: 0,
            srq: false,
            extended_transport_type: 0,
            primary: PathRepr::default(),
            alternate: PathRepr::default(),
            sap_supported: false,
            private_data: [0; REQ_PRIVATE_DATA_LEN],
        }
    }
}

impl ReqRepr {
    /// Parses the 232 data bytes of a REQ MAD.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 232 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let d = data(bytes)?;
        use req_fld as f;
        let b43 = d[f::BYTE43];
        let b47 = d[f::BYTE47];
        let b50 = d[f::BYTE50];
        let b51 = d[f::BYTE51];
        Ok(ReqRepr {
            local_comm_id: read_u32(&d[f::LOCAL_COMM_ID]),
            vendor_id: read_u24(&d[f::VENDOR_ID]),
            service_id: read_u64(&d[f::SERVICE_ID]),
            local_ca_guid: read_u64(&d[f::LOCAL_CA_GUID]),
            local_qkey: read_u32(&d[f::LOCAL_QKEY]),
            local_qpn: Qpn::new(read_u24(&d[f::LOCAL_QPN])),
            responder_resources: d[f::RESPONDER_RESOURCES],
            local_eecn: read_u24(&d[f::LOCAL_EECN]),
            initiator_depth: d[f::INITIATOR_DEPTH],
            remote_eecn: read_u24(&d[f::REMOTE_EECN]),
            remote_cm_response_timeout: bits(b43, 0, 5),
            transport_service_type: bits(b43, 5, 2),
            end_to_end_flow_control: bits(b43, 7, 1) != 0,
            starting_psn: Psn::new(read_u24(&d[f::STARTING_PSN])),
            local_cm_response_timeout: bits(b47, 0, 5),
            retry_count: bits(b47, 5, 3),
            pkey: read_u16(&d[f::PKEY]),
            path_mtu: bits(b50, 0, 4),
            rdc_exists: bits(b50, 4, 1) != 0,
            rnr_retry_count: bits(b50, 5, 3),
            max_cm_retries: bits(b51, 0, 4),
            srq: bits(b51, 4, 1) != 0,
            extended_transport_type: bits(b51, 5, 3),
            primary: PathRepr::parse(&d[f::PRIMARY..f::PRIMARY + path_fld::LEN]),
            alternate: PathRepr::parse(&d[f::ALTERNATE..f::ALTERNATE + path_fld::LEN]),
            sap_supported: bits(d[f::SAP_BYTE], 5, 1) != 0,
            private_data: array(&d[f::PRIVATE]),
        })
    }

    /// Writes all 232 data bytes (reserved bits 0; bit fields truncated to
    /// their widths).
    pub fn emit(&self, d: &mut [u8; DATA_LEN]) {
        use req_fld as f;
        d.fill(0);
        write_u32(&mut d[f::LOCAL_COMM_ID], self.local_comm_id);
        write_u24(&mut d[f::VENDOR_ID], self.vendor_id);
        write_u64(&mut d[f::SERVICE_ID], self.service_id);
        write_u64(&mut d[f::LOCAL_CA_GUID], self.local_ca_guid);
        write_u32(&mut d[f::LOCAL_QKEY], self.local_qkey);
        write_u24(&mut d[f::LOCAL_QPN], self.local_qpn.value());
        d[f::RESPONDER_RESOURCES] = self.responder_resources;
        write_u24(&mut d[f::LOCAL_EECN], self.local_eecn);
        d[f::INITIATOR_DEPTH] = self.initiator_depth;
        write_u24(&mut d[f::REMOTE_EECN], self.remote_eecn);
        put_bits(&mut d[f::BYTE43], 0, 5, self.remote_cm_response_timeout);
        put_bits(&mut d[f::BYTE43], 5, 2, self.transport_service_type);
        put_bits(&mut d[f::BYTE43], 7, 1, self.end_to_end_flow_control as u8);
        write_u24(&mut d[f::STARTING_PSN], self.starting_psn.value());
        put_bits(&mut d[f::BYTE47], 0, 5, self.local_cm_response_timeout);
        put_bits(&mut d[f::BYTE47], 5, 3, self.retry_count);
        write_u16(&mut d[f::PKEY], self.pkey);
        put_bits(&mut d[f::BYTE50], 0, 4, self.path_mtu);
        put_bits(&mut d[f::BYTE50], 4, 1, self.rdc_exists as u8);
        put_bits(&mut d[f::BYTE50], 5, 3, self.rnr_retry_count);
        put_bits(&mut d[f::BYTE51], 0, 4, self.max_cm_retries);
        put_bits(&mut d[f::BYTE51], 4, 1, self.srq as u8);
        put_bits(&mut d[f::BYTE51], 5, 3, self.extended_transport_type);
        self.primary
            .emit(&mut d[f::PRIMARY..f::PRIMARY + path_fld::LEN]);
        self.alternate
            .emit(&mut d[f::ALTERNATE..f::ALTERNATE + path_fld::LEN]);
        put_bits(&mut d[f::SAP_BYTE], 5, 1, self.sap_supported as u8);
        d[f::PRIVATE].copy_from_slice(&self.private_data);
    }
}

/// Generates a message with local/remote comm IDs, optional fixed fields and a
/// private data area; used for the simple messages (RTU, DREP).
macro_rules! ids_and_private {
    ($(#[$meta:meta])* $name:ident, $len:expr) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name {
            /// Local communication ID (the sender's).
            pub local_comm_id: u32,
            /// Remote communication ID (the receiver's).
            pub remote_comm_id: u32,
            /// Private data.
            pub private_data: [u8; $len],
        }

        impl Default for $name {
            fn default() -> Self {
                $name { local_comm_id: 0, remote_comm_id: 0, private_data: [0; $len] }
            }
        }

        impl $name {
            /// Parses the 232 data bytes of the MAD.
            ///
            /// # Errors
            /// [`Error::Truncated`] if fewer than 232 bytes.
            pub fn parse(bytes: &[u8]) -> Result<Self> {
                let d = data(bytes)?;
                Ok($name {
                    local_comm_id: read_u32(&d[0..4]),
                    remote_comm_id: read_u32(&d[4..8]),
                    private_data: array(&d[DATA_LEN - $len..]),
                })
            }

            /// Writes all 232 data bytes.
            pub fn emit(&self, d: &mut [u8; DATA_LEN]) {
                d.fill(0);
                write_u32(&mut d[0..4], self.local_comm_id);
                write_u32(&mut d[4..8], self.remote_comm_id);
                d[DATA_LEN - $len..].copy_from_slice(&self.private_data);
            }
        }
    };
}

ids_and_private!(
    /// ReadyToUse (RTU), IBTA Vol 1 §12.6, Table 111: comm IDs at 0 and 4,
    /// private data at 8.
    RtuRepr,
    RTU_PRIVATE_DATA_LEN
);
ids_and_private!(
    /// DisconnectReply (DREP), IBTA Vol 1 §12.6, Table 113: comm IDs at 0
    /// and 4, private data at 8.
    DrepRepr,
    DREP_PRIVATE_DATA_LEN
);

/// MsgRcptAck (MRA), IBTA Vol 1 §12.6, Table 107.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MraRepr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's: the local comm ID of the
    /// message being acknowledged).
    pub remote_comm_id: u32,
    /// Which message is acknowledged (2 bits, [`msg_response`]).
    pub message_mraed: u8,
    /// Service timeout (5 bits, 4.096 µs × 2^n): the extra time the sender
    /// of the MRA needs before it answers.
    pub service_timeout: u8,
    /// Private data.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl Default for MraRepr {
    fn default() -> Self {
        MraRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_mraed: 0,
            service_timeout: 0,
            private_data: [0; MRA_PRIVATE_DATA_LEN],
        }
    }
}

impl MraRepr {
    /// Parses the 232 data bytes of an MRA MAD.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 232 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let d = data(bytes)?;
        Ok(MraRepr {
            local_comm_id: read_u32(&d[0..4]),
            remote_comm_id: read_u32(&d[4..8]),
            message_mraed: bits(d[8], 0, 2),
            service_timeout: bits(d[9], 0, 5),
            private_data: array(&d[10..]),
        })
    }

    /// Writes all 232 data bytes.
    pub fn emit(&self, d: &mut [u8; DATA_LEN]) {
        d.fill(0);
        write_u32(&mut d[0..4], self.local_comm_id);
        write_u32(&mut d[4..8], self.remote_comm_id);
        put_bits(&mut d[8], 0, 2, self.message_mraed);
        put_bits(&mut d[9], 0, 5, self.service_timeout);
        d[10..].copy_from_slice(&self.private_data);
    }
}

/// ConnectReject (REJ), IBTA Vol 1 §12.6, Table 108.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RejRepr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// Which message is rejected (2 bits, [`msg_response`]).
    pub message_rejected: u8,
    /// Length of the valid part of `ari` (7 bits; at most 72).
    pub ari_len: u8,
    /// Reason ([`rej_reason`]).
    pub reason: u16,
    /// Additional rejection information (72 bytes; `ari_len` of them valid).
    pub ari: [u8; REJ_ARI_LEN],
    /// Private data.
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl Default for RejRepr {
    fn default() -> Self {
        RejRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            message_rejected: 0,
            ari_len: 0,
            reason: 0,
            ari: [0; REJ_ARI_LEN],
            private_data: [0; REJ_PRIVATE_DATA_LEN],
        }
    }
}

impl RejRepr {
    /// Parses the 232 data bytes of a REJ MAD.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 232 bytes; [`Error::Malformed`] if
    /// `RejectedInfoLength` exceeds 72.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let d = data(bytes)?;
        let ari_len = bits(d[9], 0, 7);
        if usize::from(ari_len) > REJ_ARI_LEN {
            return Err(Error::Malformed);
        }
        Ok(RejRepr {
            local_comm_id: read_u32(&d[0..4]),
            remote_comm_id: read_u32(&d[4..8]),
            message_rejected: bits(d[8], 0, 2),
            ari_len,
            reason: read_u16(&d[10..12]),
            ari: array(&d[12..84]),
            private_data: array(&d[84..]),
        })
    }

    /// The valid part of the ARI.
    pub fn ari(&self) -> &[u8] {
        &self.ari[..usize::from(self.ari_len).min(REJ_ARI_LEN)]
    }

    /// Writes all 232 data bytes (`ari_len` is clamped to 72).
    pub fn emit(&self, d: &mut [u8; DATA_LEN]) {
        d.fill(0);
        write_u32(&mut d[0..4], self.local_comm_id);
        write_u32(&mut d[4..8], self.remote_comm_id);
        put_bits(&mut d[8], 0, 2, self.message_rejected);
        put_bits(&mut d[9], 0, 7, self.ari_len.min(REJ_ARI_LEN as u8));
        write_u16(&mut d[10..12], self.reason);
        d[12..84].copy_from_slice(&self.ari);
        d[84..].copy_from_slice(&self.private_data);
    }
}

/// ConnectReply (REP), IBTA Vol 1 §12.6, Table 110.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RepRepr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the REQ sender's).
    pub remote_comm_id: u32,
    /// Local Q_Key.
    pub local_qkey: u32,
    /// Local QP number.
    pub local_qpn: Qpn,
    /// ECE vendor ID (24 bits, spread over bytes 15, 19 and 23; Linux
    /// `CM_REP_VENDOR_ID_H/M/L`).
    pub vendor_id: u32,
    /// Local EE context number (24 bits).
    pub local_eecn: u32,
    /// Starting PSN: the PSN the sender's QP expects the first request from
    /// the peer to carry, i.e. the REQ sender's send PSN (Linux `cm.c`
    /// `cm_rep_handler` sets the requester's `sq_psn` from it).
    pub starting_psn: Psn,
    /// Responder resources.
    pub responder_resources: u8,
    /// Initiator depth.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR retry count (3 bits).
    pub rnr_retry_count: u8,
    /// SRQ in use.
    pub srq: bool,
    /// Local CA GUID.
    pub local_ca_guid: u64,
    /// Private data.
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl Default for RepRepr {
    fn default() -> Self {
        RepRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            local_qkey: 0,
            local_qpn: Qpn::new(0),
            vendor_id: 0,
            local_eecn: 0,
            starting_psn: Psn::new(0),
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            local_ca_guid: 0,
            private_data: [0; REP_PRIVATE_DATA_LEN],
        }
    }
}

impl RepRepr {
    /// Parses the 232 data bytes of a REP MAD.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 232 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let d = data(bytes)?;
        Ok(RepRepr {
            local_comm_id: read_u32(&d[0..4]),
            remote_comm_id: read_u32(&d[4..8]),
            local_qkey: read_u32(&d[8..12]),
            local_qpn: Qpn::new(read_u24(&d[12..15])),
            vendor_id: u32::from_be_bytes([0, d[15], d[19], d[23]]),
            local_eecn: read_u24(&d[16..19]),
            starting_psn: Psn::new(read_u24(&d[20..23])),
            responder_resources: d[24],
            initiator_depth: d[25],
            target_ack_delay: bits(d[26], 0, 5),
            failover_accepted: bits(d[26], 5, 2),
            end_to_end_flow_control: bits(d[26], 7, 1) != 0,
            rnr_retry_count: bits(d[27], 0, 3),
            srq: bits(d[27], 3, 1) != 0,
            local_ca_guid: read_u64(&d[28..36]),
            private_data: array(&d[36..]),
        })
    }

    /// Writes all 232 data bytes.
    pub fn emit(&self, d: &mut [u8; DATA_LEN]) {
        d.fill(0);
        write_u32(&mut d[0..4], self.local_comm_id);
        write_u32(&mut d[4..8], self.remote_comm_id);
        write_u32(&mut d[8..12], self.local_qkey);
        write_u24(&mut d[12..15], self.local_qpn.value());
        let v = self.vendor_id.to_be_bytes();
        d[15] = v[1];
        write_u24(&mut d[16..19], self.local_eecn);
        d[19] = v[2];
        write_u24(&mut d[20..23], self.starting_psn.value());
        d[23] = v[3];
        d[24] = self.responder_resources;
        d[25] = self.initiator_depth;
        put_bits(&mut d[26], 0, 5, self.target_ack_delay);
        put_bits(&mut d[26], 5, 2, self.failover_accepted);
        put_bits(&mut d[26], 7, 1, self.end_to_end_flow_control as u8);
        put_bits(&mut d[27], 0, 3, self.rnr_retry_count);
        put_bits(&mut d[27], 3, 1, self.srq as u8);
        write_u64(&mut d[28..36], self.local_ca_guid);
        d[36..].copy_from_slice(&self.private_data);
    }
}

/// DisconnectRequest (DREQ), IBTA Vol 1 §12.6, Table 112.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DreqRepr {
    /// Local communication ID (the sender's).
    pub local_comm_id: u32,
    /// Remote communication ID (the receiver's).
    pub remote_comm_id: u32,
    /// The receiver's QP number (or EECN for RD), 24 bits.
    pub remote_qpn_eecn: Qpn,
    /// Private data.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl Default for DreqRepr {
    fn default() -> Self {
        DreqRepr {
            local_comm_id: 0,
            remote_comm_id: 0,
            remote_qpn_eecn: Qpn::new(0),
            private_data: [0; DREQ_PRIVATE_DATA_LEN],
        }
    }
}

impl DreqRepr {
    /// Parses the 232 data bytes of a DREQ MAD.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 232 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let d = data(bytes)?;
        Ok(DreqRepr {
            local_comm_id: read_u32(&d[0..4]),
            remote_comm_id: read_u32(&d[4..8]),
            remote_qpn_eecn: Qpn::new(read_u24(&d[8..11])),
            private_data: array(&d[12..]),
        })
    }

    /// Writes all 232 data bytes.
    pub fn emit(&self, d: &mut [u8; DATA_LEN]) {
        d.fill(0);
        write_u32(&mut d[0..4], self.local_comm_id);
        write_u32(&mut d[4..8], self.remote_comm_id);
        write_u24(&mut d[8..11], self.remote_qpn_eecn.value());
        d[12..].copy_from_slice(&self.private_data);
    }
}

/// ServiceIDResReq (SIDR_REQ), IBTA Vol 1 §12.11, Table 119.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrReqRepr {
    /// Request ID (the sender's).
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID to resolve.
    pub service_id: u64,
    /// Private data (rdma_cm: a [`CmaHdr`] first).
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA_LEN],
}

impl Default for SidrReqRepr {
    fn default() -> Self {
        SidrReqRepr {
            request_id: 0,
            pkey: 0,
            service_id: 0,
            private_data: [0; SIDR_REQ_PRIVATE_DATA_LEN],
        }
    }
}

impl SidrReqRepr {
    /// Parses the 232 data bytes of a SIDR_REQ MAD.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 232 bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let d = data(bytes)?;
        Ok(SidrReqRepr {
            request_id: read_u32(&d[0..4]),
            pkey: read_u16(&d[4..6]),
            service_id: read_u64(&d[8..16]),
            private_data: array(&d[16..]),
        })
    }

    /// Writes all 232 data bytes.
    pub fn emit(&self, d: &mut [u8; DATA_LEN]) {
        d.fill(0);
        write_u32(&mut d[0..4], self.request_id);
        write_u16(&mut d[4..6], self.pkey);
        write_u64(&mut d[8..16], self.service_id);
        d[16..].copy_from_slice(&self.private_data);
    }
}

/// ServiceIDResReqResp (SIDR_REP), IBTA Vol 1 §12.11, Table 120.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRepRepr {
    /// Request ID (echoes the SIDR_REQ's).
    pub request_id: u32,
    /// Status ([`sidr_status`]).
    pub status: u8,
    /// Length of the valid part of `info` (at most 72).
    pub info_len: u8,
    /// ECE vendor ID (24 bits: bytes 6..8 and 11; Linux
    /// `CM_SIDR_REP_VENDOR_ID_H/L`).
    pub vendor_id: u32,
    /// QP number of the service.
    pub qpn: Qpn,
    /// Service ID (echoes the request's).
    pub service_id: u64,
    /// Q_Key of the service.
    pub qkey: u32,
    /// Additional information (ClassPortInfo on redirect).
    pub info: [u8; SIDR_REP_INFO_LEN],
    /// Private data.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA_LEN],
}

impl Default for SidrRepRepr {
    fn default() -> Self {
        SidrRepRepr {
            request_id: 0,
            status: 0,
            info_len: 0,
            vendor_id: 0,
            qpn: Qpn::new(0),
            service_id: 0,
            qkey: 0,
            info: [0; SIDR_REP_INFO_LEN],
            private_data: [0; SIDR_REP_PRIVATE_DATA_LEN],
        }
    }
}

impl SidrRepRepr {
    /// Parses the 232 data bytes of a SIDR_REP MAD.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 232 bytes; [`Error::Malformed`] if
    /// the additional information length exceeds 72.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let d = data(bytes)?;
        if usize::from(d[5]) > SIDR_REP_INFO_LEN {
            return Err(Error::Malformed);
        }
        Ok(SidrRepRepr {
            request_id: read_u32(&d[0..4]),
            status: d[4],
            info_len: d[5],
            vendor_id: u32::from_be_bytes([0, d[6], d[7], d[11]]),
            qpn: Qpn::new(read_u24(&d[8..11])),
            service_id: read_u64(&d[12..20]),
            qkey: read_u32(&d[20..24]),
            info: array(&d[24..96]),
            private_data: array(&d[96..]),
        })
    }

    /// Writes all 232 data bytes (`info_len` is clamped to 72).
    pub fn emit(&self, d: &mut [u8; DATA_LEN]) {
        d.fill(0);
        write_u32(&mut d[0..4], self.request_id);
        d[4] = self.status;
        d[5] = self.info_len.min(SIDR_REP_INFO_LEN as u8);
        let v = self.vendor_id.to_be_bytes();
        d[6] = v[1];
        d[7] = v[2];
        write_u24(&mut d[8..11], self.qpn.value());
        d[11] = v[3];
        write_u64(&mut d[12..20], self.service_id);
        write_u32(&mut d[20..24], self.qkey);
        d[24..96].copy_from_slice(&self.info);
        d[96..].copy_from_slice(&self.private_data);
    }
}

/// One CM message, by attribute ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)]
pub enum CmMessage {
    /// REQ.
    Req(ReqRepr),
    /// MRA.
    Mra(MraRepr),
    /// REJ.
    Rej(RejRepr),
    /// REP.
    Rep(RepRepr),
    /// RTU.
    Rtu(RtuRepr),
    /// DREQ.
    Dreq(DreqRepr),
    /// DREP.
    Drep(DrepRepr),
    /// SIDR_REQ.
    SidrReq(SidrReqRepr),
    /// SIDR_REP.
    SidrRep(SidrRepRepr),
}

impl CmMessage {
    /// The attribute ID of this message ([`attr`]).
    pub const fn attr_id(&self) -> u16 {
        match self {
            CmMessage::Req(_) => attr::REQ,
            CmMessage::Mra(_) => attr::MRA,
            CmMessage::Rej(_) => attr::REJ,
            CmMessage::Rep(_) => attr::REP,
            CmMessage::Rtu(_) => attr::RTU,
            CmMessage::Dreq(_) => attr::DREQ,
            CmMessage::Drep(_) => attr::DREP,
            CmMessage::SidrReq(_) => attr::SIDR_REQ,
            CmMessage::SidrRep(_) => attr::SIDR_REP,
        }
    }

    /// The IBTA short name (`REQ`, `MRA`, ...).
    pub const fn name(&self) -> &'static str {
        match self {
            CmMessage::Req(_) => "REQ",
            CmMessage::Mra(_) => "MRA",
            CmMessage::Rej(_) => "REJ",
            CmMessage::Rep(_) => "REP",
            CmMessage::Rtu(_) => "RTU",
            CmMessage::Dreq(_) => "DREQ",
            CmMessage::Drep(_) => "DREP",
            CmMessage::SidrReq(_) => "SIDR_REQ",
            CmMessage::SidrRep(_) => "SIDR_REP",
        }
    }

    /// Parses the 232 data bytes of a CM MAD with attribute `attr_id`.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 232 bytes; [`Error::Malformed`] for
    /// an attribute ID that is not one of the nine messages, or a message's
    /// own length field out of range.
    pub fn parse(attr_id: u16, data: &[u8]) -> Result<Self> {
        Ok(match attr_id {
            attr::REQ => CmMessage::Req(ReqRepr::parse(data)?),
            attr::MRA => CmMessage::Mra(MraRepr::parse(data)?),
            attr::REJ => CmMessage::Rej(RejRepr::parse(data)?),
            attr::REP => CmMessage::Rep(RepRepr::parse(data)?),
            attr::RTU => CmMessage::Rtu(RtuRepr::parse(data)?),
            attr::DREQ => CmMessage::Dreq(DreqRepr::parse(data)?),
            attr::DREP => CmMessage::Drep(DrepRepr::parse(data)?),
            attr::SIDR_REQ => CmMessage::SidrReq(SidrReqRepr::parse(data)?),
            attr::SIDR_REP => CmMessage::SidrRep(SidrRepRepr::parse(data)?),
            _ => {
                data.get(..DATA_LEN).ok_or(Error::Truncated)?;
                return Err(Error::Malformed);
            }
        })
    }

    /// Writes all 232 data bytes of the message.
    pub fn emit(&self, d: &mut [u8; DATA_LEN]) {
        match self {
            CmMessage::Req(m) => m.emit(d),
            CmMessage::Mra(m) => m.emit(d),
            CmMessage::Rej(m) => m.emit(d),
            CmMessage::Rep(m) => m.emit(d),
            CmMessage::Rtu(m) => m.emit(d),
            CmMessage::Dreq(m) => m.emit(d),
            CmMessage::Drep(m) => m.emit(d),
            CmMessage::SidrReq(m) => m.emit(d),
            CmMessage::SidrRep(m) => m.emit(d),
        }
    }
}

/// A whole CM MAD: the common header and one message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmMad {
    /// The MAD header (its `attr_id` is the message's).
    pub header: MadHeaderRepr,
    /// The message.
    pub message: CmMessage,
}

impl CmMad {
    /// A CM MAD for `message` with transaction ID `tid` and attribute
    /// modifier `attr_mod` (0 unless ECE is used).
    pub fn new(tid: u64, attr_mod: u32, message: CmMessage) -> Self {
        CmMad {
            header: MadHeaderRepr::cm(message.attr_id(), tid, attr_mod),
            message,
        }
    }

    /// Parses a whole 256-byte MAD (bytes past 256 are ignored).
    ///
    /// # Errors
    /// [`Error::Truncated`] when shorter than 256 bytes; [`Error::Malformed`]
    /// when the header is not CM class 0x07 version 2 with base version 1,
    /// the attribute is not one of the nine messages, or a length field inside
    /// the message is out of range.
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let mad = Mad::new_checked(bytes)?;
        let header = MadHeaderRepr::parse(&mad)?;
        if !header.is_cm() {
            return Err(Error::Malformed);
        }
        let message = CmMessage::parse(header.attr_id, mad.data())?;
        Ok(CmMad { header, message })
    }

    /// Writes the 256-byte MAD into `buf` and returns 256. The header's
    /// attribute ID is taken from the message.
    ///
    /// # Errors
    /// [`Error::Truncated`] when `buf` is shorter than 256 bytes.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        let buf = buf.get_mut(..MAD_LEN).ok_or(Error::Truncated)?;
        let mut mad = Mad::new_unchecked(&mut *buf);
        let mut h = self.header;
        h.attr_id = self.message.attr_id();
        h.emit(&mut mad);
        let d: &mut [u8; DATA_LEN] = mad.data_mut().try_into().map_err(|_| Error::Truncated)?;
        self.message.emit(d);
        Ok(MAD_LEN)
    }
}

impl fmt::Display for CmMad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CM {} tid={:#018x}",
            self.message.name(),
            self.header.tid
        )?;
        match &self.message {
            CmMessage::Req(m) => write!(
                f,
                " lcid={:#010x} sid={:#018x} qpn={} psn={}",
                m.local_comm_id, m.service_id, m.local_qpn, m.starting_psn
            ),
            CmMessage::Rep(m) => write!(
                f,
                " lcid={:#010x} rcid={:#010x} qpn={} psn={}",
                m.local_comm_id, m.remote_comm_id, m.local_qpn, m.starting_psn
            ),
            CmMessage::Rej(m) => write!(
                f,
                " lcid={:#010x} rcid={:#010x} reason={}",
                m.local_comm_id, m.remote_comm_id, m.reason
            ),
            CmMessage::Mra(m) => write!(
                f,
                " lcid={:#010x} rcid={:#010x} mraed={} timeout={}",
                m.local_comm_id, m.remote_comm_id, m.message_mraed, m.service_timeout
            ),
            CmMessage::Rtu(m) => write!(
                f,
                " lcid={:#010x} rcid={:#010x}",
                m.local_comm_id, m.remote_comm_id
            ),
            CmMessage::Dreq(m) => write!(
                f,
                " lcid={:#010x} rcid={:#010x} qpn={}",
                m.local_comm_id, m.remote_comm_id, m.remote_qpn_eecn
            ),
            CmMessage::Drep(m) => write!(
                f,
                " lcid={:#010x} rcid={:#010x}",
                m.local_comm_id, m.remote_comm_id
            ),
            CmMessage::SidrReq(m) => {
                write!(f, " rid={:#010x} sid={:#018x}", m.request_id, m.service_id)
            }
            CmMessage::SidrRep(m) => write!(
                f,
                " rid={:#010x} status={} qpn={}",
                m.request_id, m.status, m.qpn
            ),
        }
    }
}

/// rdma_cm port spaces (Linux `enum rdma_ucm_port_space`, rdma-core
/// `enum rdma_port_space`; values in `docs/spec/LIBRDMACM-ABI.md` §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB` (0x0002).
    Ipoib,
    /// `RDMA_PS_TCP` (0x0106): RC connections.
    Tcp,
    /// `RDMA_PS_UDP` (0x0111): UD, resolved with SIDR.
    Udp,
    /// `RDMA_PS_IB` (0x013F): any QP type.
    Ib,
}

impl PortSpace {
    /// The 16-bit port space value.
    pub const fn value(self) -> u16 {
        match self {
            PortSpace::Ipoib => 0x0002,
            PortSpace::Tcp => 0x0106,
            PortSpace::Udp => 0x0111,
            PortSpace::Ib => 0x013f,
        }
    }

    /// The port space of a 16-bit value, if it is one of the four.
    pub const fn from_value(v: u16) -> Option<Self> {
        match v {
            0x0002 => Some(PortSpace::Ipoib),
            0x0106 => Some(PortSpace::Tcp),
            0x0111 => Some(PortSpace::Udp),
            0x013f => Some(PortSpace::Ib),
            _ => None,
        }
    }
}

/// The rdma_cm service ID of `port` in port space `ps`: `ps << 16 | port`
/// (Linux `cma.c`, `rdma_get_service_id`: `((u64)id->ps << 16) + port`).
///
/// For TCP, UDP and IB this is `0x0000_0000_0100_0000 | ps_low << 16 | port`
/// (IBTA Annex A11's IP-based service ID prefix, Linux `IB_CMA_SERVICE_ID`);
/// for IPOIB (0x0002) the `0x0100_0000` bit is not set, as Linux computes it.
pub const fn service_id(ps: PortSpace, port: u16) -> u64 {
    ((ps.value() as u64) << 16) | port as u64
}

/// The port space and port of an rdma_cm service ID, or `None` when the top
/// 32 bits are not zero or the port space is not one of the four.
pub const fn service_id_parts(sid: u64) -> Option<(PortSpace, u16)> {
    if sid >> 32 != 0 {
        return None;
    }
    match PortSpace::from_value((sid >> 16) as u16) {
        Some(ps) => Some((ps, sid as u16)),
        None => None,
    }
}

/// Length of the rdma_cm address header.
pub const CMA_HDR_LEN: usize = 36;
/// `cma_version` rdma_cm writes (Linux `cma.c`, `CMA_VERSION`).
pub const CMA_VERSION: u8 = 0x00;

/// The rdma_cm address header at the start of a REQ's (and SIDR_REQ's)
/// private data (Linux `drivers/infiniband/core/cma.c`, `struct cma_hdr` and
/// `cma_format_hdr`): `cma_version` (1 byte, 0), `ip_version` (IP version in
/// the top 4 bits), the active side's source port (16 bits, big-endian), the
/// source and the destination address (16 bytes each; an IPv4 address sits
/// in the last 4 bytes after 12 zero bytes). 36 bytes; the application's own
/// private data follows it, so rdma_cm applications get 92 − 36 = 56 bytes in
/// a REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHdr {
    /// Source port of the connecting side.
    pub src_port: u16,
    /// Source address (the connecting side).
    pub src_addr: IpAddr,
    /// Destination address (the listener's).
    pub dst_addr: IpAddr,
}

impl CmaHdr {
    /// Parses the first 36 bytes of `bytes`.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 36 bytes; [`Error::Malformed`] if
    /// `cma_version` is not 0, the IP version is not 4 or 6, or the source and
    /// destination are of different families (they share one version field).
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let b = bytes.get(..CMA_HDR_LEN).ok_or(Error::Truncated)?;
        if b[0] != CMA_VERSION {
            return Err(Error::Malformed);
        }
        let addr = |a: &[u8]| -> Result<IpAddr> {
            match b[1] >> 4 {
                4 => Ok(IpAddr::V4(Ipv4Addr::new(a[12], a[13], a[14], a[15]))),
                6 => Ok(IpAddr::V6(Ipv6Addr::from(array::<16>(a)))),
                _ => Err(Error::Malformed),
            }
        };
        Ok(CmaHdr {
            src_port: read_u16(&b[2..4]),
            src_addr: addr(&b[4..20])?,
            dst_addr: addr(&b[20..36])?,
        })
    }

    /// Writes the 36 bytes into the start of `bytes`.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 36 bytes; [`Error::Malformed`] if the
    /// two addresses are of different families.
    pub fn emit(&self, bytes: &mut [u8]) -> Result<()> {
        let b = bytes.get_mut(..CMA_HDR_LEN).ok_or(Error::Truncated)?;
        let ver = match (self.src_addr, self.dst_addr) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4,
            (IpAddr::V6(_), IpAddr::V6(_)) => 6,
            _ => return Err(Error::Malformed),
        };
        b.fill(0);
        b[0] = CMA_VERSION;
        b[1] = ver << 4;
        write_u16(&mut b[2..4], self.src_port);
        let put = |a: IpAddr, out: &mut [u8]| match a {
            IpAddr::V4(v4) => out[12..16].copy_from_slice(&v4.octets()),
            IpAddr::V6(v6) => out.copy_from_slice(&v6.octets()),
        };
        put(self.src_addr, &mut b[4..20]);
        put(self.dst_addr, &mut b[20..36]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bit_helpers_follow_the_msb_convention() {
        // REQ byte 43: remote CM response timeout 0b10110 (top 5 bits),
        // transport type 0b01, flow control 1.
        let mut b = 0u8;
        put_bits(&mut b, 0, 5, 0b10110);
        put_bits(&mut b, 5, 2, 0b01);
        put_bits(&mut b, 7, 1, 1);
        assert_eq!(b, 0b1011_0011);
        assert_eq!(bits(b, 0, 5), 0b10110);
        assert_eq!(bits(b, 5, 2), 0b01);
        assert_eq!(bits(b, 7, 1), 1);
        // Out-of-width values are truncated, neighbours untouched.
        put_bits(&mut b, 5, 2, 0xff);
        assert_eq!(b, 0b1011_0111);
    }

    #[test]
    fn service_ids_as_linux_computes_them() {
        assert_eq!(service_id(PortSpace::Tcp, 7471), 0x0000_0000_0106_1d2f);
        assert_eq!(service_id(PortSpace::Udp, 1), 0x0000_0000_0111_0001);
        assert_eq!(service_id(PortSpace::Ib, 0xffff), 0x0000_0000_013f_ffff);
        assert_eq!(service_id(PortSpace::Ipoib, 5), 0x0000_0000_0002_0005);
        for ps in [
            PortSpace::Tcp,
            PortSpace::Udp,
            PortSpace::Ib,
            PortSpace::Ipoib,
        ] {
            assert_eq!(service_id_parts(service_id(ps, 4791)), Some((ps, 4791)));
        }
        assert_eq!(service_id_parts(0x0000_0001_0106_0000), None);
        assert_eq!(service_id_parts(0x0000_0000_0107_0000), None);
    }

    #[test]
    fn cma_hdr_v4_bytes() {
        let h = CmaHdr {
            src_port: 0x1234,
            src_addr: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)),
            dst_addr: IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
        };
        let mut b = [0xaau8; 40];
        h.emit(&mut b).unwrap();
        let mut want = [0u8; 36];
        want[1] = 0x40;
        want[2..4].copy_from_slice(&[0x12, 0x34]);
        want[16..20].copy_from_slice(&[198, 18, 0, 1]);
        want[32..36].copy_from_slice(&[198, 18, 0, 2]);
        assert_eq!(b[..36], want);
        assert_eq!(b[36..], [0xaa; 4]);
        assert_eq!(CmaHdr::parse(&b).unwrap(), h);
        for n in 0..CMA_HDR_LEN {
            assert_eq!(CmaHdr::parse(&b[..n]), Err(Error::Truncated));
        }
        let mut bad = b;
        bad[1] = 0x50;
        assert_eq!(CmaHdr::parse(&bad), Err(Error::Malformed));
        bad = b;
        bad[0] = 1;
        assert_eq!(CmaHdr::parse(&bad), Err(Error::Malformed));
        let mixed = CmaHdr {
            dst_addr: IpAddr::V6(Ipv6Addr::LOCALHOST),
            ..h
        };
        assert_eq!(mixed.emit(&mut b), Err(Error::Malformed));
    }

    #[test]
    fn cma_hdr_v6_round_trip() {
        let h = CmaHdr {
            src_port: 1,
            src_addr: IpAddr::V6("fd00::1".parse().unwrap()),
            dst_addr: IpAddr::V6("fd00::2".parse().unwrap()),
        };
        let mut b = [0u8; 36];
        h.emit(&mut b).unwrap();
        assert_eq!(b[1], 0x60);
        assert_eq!(CmaHdr::parse(&b).unwrap(), h);
    }

    #[test]
    fn req_field_positions() {
        let mut req = ReqRepr {
            local_comm_id: 0x0102_0304,
            vendor_id: 0x00ab_cdef,
            service_id: service_id(PortSpace::Tcp, 7471),
            local_qpn: Qpn::new(0x11_2233),
            responder_resources: 0x44,
            initiator_depth: 0x55,
            remote_cm_response_timeout: 20,
            transport_service_type: transport_type::UC,
            starting_psn: Psn::new(0x66_7788),
            local_cm_response_timeout: 18,
            retry_count: 7,
            pkey: 0xffff,
            path_mtu: 5,
            rnr_retry_count: 6,
            max_cm_retries: 15,
            srq: true,
            ..ReqRepr::default()
        };
        req.primary.flow_label = 0xf_edcb;
        req.primary.packet_rate = 0x3f;
        req.primary.sl = 0xf;
        req.primary.local_ack_timeout = 0x1f;
        req.alternate.local_ack_timeout = 0x1f;
        req.sap_supported = true;
        req.private_data[0] = 0xee;
        req.private_data[91] = 0xdd;
        let mut d = [0u8; DATA_LEN];
        req.emit(&mut d);
        assert_eq!(d[0..4], [1, 2, 3, 4]);
        assert_eq!(d[4..8], [0, 0xab, 0xcd, 0xef]);
        assert_eq!(d[8..16], [0, 0, 0, 0, 1, 6, 0x1d, 0x2f]);
        assert_eq!(d[32..36], [0x11, 0x22, 0x33, 0x44]);
        assert_eq!(d[39], 0x55);
        assert_eq!(d[43], (20 << 3) | (1 << 1));
        assert_eq!(d[44..48], [0x66, 0x77, 0x88, (18 << 3) | 7]);
        assert_eq!(d[48..52], [0xff, 0xff, (5 << 4) | 6, (15 << 4) | 0x08]);
        assert_eq!(d[52 + 36..52 + 40], [0xfe, 0xdc, 0xb0, 0x3f]);
        assert_eq!(d[52 + 42], 0xf0);
        assert_eq!(d[95], 0xf8);
        assert_eq!(d[139], 0xf8 | 0x04);
        assert_eq!(d[140], 0xee);
        assert_eq!(d[231], 0xdd);
        assert_eq!(ReqRepr::parse(&d).unwrap(), req);
    }

    #[test]
    fn rep_and_sidr_rep_vendor_id_spread() {
        let rep = RepRepr {
            local_qpn: Qpn::new(0x12_3456),
            vendor_id: 0x00a1_b2c3,
            local_eecn: 0x00_0001,
            starting_psn: Psn::new(0xff_fffe),
            target_ack_delay: 0x1f,
            failover_accepted: 2,
            end_to_end_flow_control: true,
            rnr_retry_count: 7,
            srq: true,
            ..RepRepr::default()
        };
        let mut d = [0u8; DATA_LEN];
        rep.emit(&mut d);
        assert_eq!(d[12..16], [0x12, 0x34, 0x56, 0xa1]);
        assert_eq!(d[16..20], [0, 0, 1, 0xb2]);
        assert_eq!(d[20..24], [0xff, 0xff, 0xfe, 0xc3]);
        assert_eq!(d[26], 0xf8 | 0x04 | 0x01);
        assert_eq!(d[27], 0xe0 | 0x10);
        assert_eq!(RepRepr::parse(&d).unwrap(), rep);

        let sr = SidrRepRepr {
            vendor_id: 0x00a1_b2c3,
            qpn: Qpn::new(0x12_3456),
            ..SidrRepRepr::default()
        };
        sr.emit(&mut d);
        assert_eq!(d[6..12], [0xa1, 0xb2, 0x12, 0x34, 0x56, 0xc3]);
        assert_eq!(SidrRepRepr::parse(&d).unwrap(), sr);
    }

    #[test]
    fn length_fields_out_of_range_are_malformed() {
        let mut d = [0u8; DATA_LEN];
        d[9] = 73 << 1;
        assert_eq!(RejRepr::parse(&d), Err(Error::Malformed));
        d[9] = 72 << 1;
        assert_eq!(RejRepr::parse(&d).unwrap().ari().len(), 72);
        let mut d = [0u8; DATA_LEN];
        d[5] = 73;
        assert_eq!(SidrRepRepr::parse(&d), Err(Error::Malformed));
    }

    #[test]
    fn unknown_attribute_and_foreign_class_are_malformed() {
        let mut mad = [0u8; MAD_LEN];
        CmMad::new(1, 0, CmMessage::Rtu(RtuRepr::default()))
            .emit(&mut mad)
            .unwrap();
        assert!(CmMad::parse(&mad).is_ok());
        let mut m = mad;
        m[17] = 0x19; // LAP: not parsed
        assert_eq!(CmMad::parse(&m), Err(Error::Malformed));
        let mut m = mad;
        m[1] = 0x03; // SA class
        assert_eq!(CmMad::parse(&m), Err(Error::Malformed));
        let mut m = mad;
        m[2] = 1; // class version 1
        assert_eq!(CmMad::parse(&m), Err(Error::Malformed));
        let mut m = mad;
        m[0] = 2;
        assert_eq!(CmMad::parse(&m), Err(Error::Malformed));
    }
}
