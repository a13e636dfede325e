//! The BTH opcode and the one per-opcode table that parse, emit, segmentation
//! and the engine share (STYLE W4; `ROCEV2.md §2.1`, mirroring the Linux
//! `drivers/infiniband/sw/rxe/rxe_opcode.c` table and `include/rdma/ib_pack.h`
//! names).
//!
//! [`Opcode`] is a newtype over the raw byte, so unknown code points are kept
//! (parsing never fails because of an unknown opcode). [`Opcode::info`]
//! returns the table entry, or `None` for opcodes this stack does not know:
//! RD (0x40–0x5F), XRC (0xA0–0xBF), manufacturer specific (0xC0–0xFF), the
//! IB-native CNP 0x80, reserved RC/UC/UD values, and UC READ/atomic/ACK
//! code points (UC supports SEND and RDMA WRITE only).

use core::fmt;

/// A BTH opcode byte (`ROCEV2.md §1.5`, byte 0): bits 7–5 select the transport,
/// bits 4–0 the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// Transport service, from opcode bits 7–5 (`ROCEV2.md §1.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected, 0x00–0x1F.
    Rc,
    /// Unreliable connected, 0x20–0x3F.
    Uc,
    /// Reliable datagram, 0x40–0x5F (not used by RoCE stacks).
    Rd,
    /// Unreliable datagram, 0x60–0x7F.
    Ud,
    /// Congestion notification, 0x80–0x9F (RoCE v2 CNP is 0x81).
    Cnp,
    /// Extended reliable connected, 0xA0–0xBF.
    Xrc,
    /// Manufacturer specific, 0xC0–0xFF.
    Manufacturer,
}

impl Transport {
    /// Short upper-case name as printed by the pretty printer (`RC`, `UD`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Rd => "RD",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
            Transport::Manufacturer => "MFR",
        }
    }
}

/// The operation an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// SEND (with or without immediate / invalidate).
    Send,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response (FIRST/MIDDLE/LAST/ONLY).
    RdmaReadResponse,
    /// ACKNOWLEDGE (ACK, RNR NAK or NAK, told apart by the AETH syndrome).
    Acknowledge,
    /// ATOMIC ACKNOWLEDGE carrying the original remote value.
    AtomicAcknowledge,
    /// COMPARE & SWAP request.
    CompareSwap,
    /// FETCH & ADD request.
    FetchAdd,
    /// FLUSH request (newer IBTA).
    Flush,
    /// ATOMIC WRITE request (newer IBTA).
    AtomicWrite,
    /// RoCE v2 congestion notification packet.
    Cnp,
}

/// Position of a packet within its message (`ROCEV2.md §2.1`, "Msg position").
/// Single-packet operations (READ request, ACKs, atomics, CNP) are `Only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgPosition {
    /// First packet of a multi-packet message.
    First,
    /// Middle packet.
    Middle,
    /// Last packet of a multi-packet message.
    Last,
    /// The message is this single packet.
    Only,
}

impl MsgPosition {
    /// Position of packet `index` (0-based) in a message of `count` packets
    /// (`ROCEV2.md §4.1`): `count <= 1` → `Only`; otherwise `First`, `Middle`…,
    /// `Last`.
    pub const fn of(index: usize, count: usize) -> Self {
        if count <= 1 {
            MsgPosition::Only
        } else if index == 0 {
            MsgPosition::First
        } else if index + 1 >= count {
            MsgPosition::Last
        } else {
            MsgPosition::Middle
        }
    }

    /// `true` for `First` and `Only` (a packet that starts a message).
    pub const fn starts_message(self) -> bool {
        matches!(self, MsgPosition::First | MsgPosition::Only)
    }

    /// `true` for `Last` and `Only` (a packet that ends a message).
    pub const fn ends_message(self) -> bool {
        matches!(self, MsgPosition::Last | MsgPosition::Only)
    }
}

/// Who sends an opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Sent by a requester (SEND, WRITE, READ request, atomics, FLUSH, ...).
    Request,
    /// Sent by a responder (READ responses, ACKNOWLEDGE, ATOMIC ACKNOWLEDGE).
    Response,
    /// CNP: sent by the notification point, neither request nor response.
    Notification,
}

/// Payload length rule of an opcode, PMTU = path MTU in payload bytes
/// (`ROCEV2.md §2.1` "Payload" column, §5 "Lengths").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadRule {
    /// No payload (pad count must be 0).
    None,
    /// Exactly PMTU bytes (FIRST / MIDDLE packets).
    Pmtu,
    /// 1..=PMTU bytes (LAST packets).
    OneToPmtu,
    /// 0..=PMTU bytes (ONLY packets, UD).
    UpToPmtu,
    /// Exactly this many bytes (ATOMIC WRITE: 8).
    Exactly(u16),
}

impl PayloadRule {
    /// `true` unless the rule is [`PayloadRule::None`].
    pub const fn allows_payload(self) -> bool {
        !matches!(self, PayloadRule::None)
    }

    /// Whether a payload of `len` bytes is valid for path MTU `pmtu` bytes.
    pub const fn accepts(self, len: usize, pmtu: usize) -> bool {
        match self {
            PayloadRule::None => len == 0,
            PayloadRule::Pmtu => len == pmtu,
            PayloadRule::OneToPmtu => len >= 1 && len <= pmtu,
            PayloadRule::UpToPmtu => len <= pmtu,
            PayloadRule::Exactly(n) => len == n as usize,
        }
    }
}

/// One extension header that may follow the BTH (`ROCEV2.md §1.6`).
///
/// The variants are declared in the order they appear on the wire after the
/// BTH: DETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH, ImmDt, IETH, and the
/// CNP body. (RDETH and XRCETH are not listed: RD and XRC opcodes are unknown
/// to this table.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtHeader {
    /// Datagram ETH (UD): Q_Key, source QPN — 8 bytes.
    Deth,
    /// Flush ETH: selectivity / placement — 4 bytes.
    Feth,
    /// RDMA ETH: VA, R_Key, DMA length — 16 bytes.
    Reth,
    /// Atomic ETH: VA, R_Key, swap/add, compare — 28 bytes.
    AtomicEth,
    /// ACK ETH: syndrome, MSN — 4 bytes.
    Aeth,
    /// Atomic ACK ETH: original remote value — 8 bytes.
    AtomicAckEth,
    /// Immediate data — 4 bytes.
    ImmDt,
    /// Invalidate ETH: R_Key to invalidate — 4 bytes.
    Ieth,
    /// CNP body: 16 reserved bytes.
    CnpBody,
}

impl ExtHeader {
    /// All extension headers in wire order.
    pub const ALL: [ExtHeader; 9] = [
        ExtHeader::Deth,
        ExtHeader::Feth,
        ExtHeader::Reth,
        ExtHeader::AtomicEth,
        ExtHeader::Aeth,
        ExtHeader::AtomicAckEth,
        ExtHeader::ImmDt,
        ExtHeader::Ieth,
        ExtHeader::CnpBody,
    ];

    /// Length of this header in bytes (`ROCEV2.md §1.6`).
    pub const fn byte_len(self) -> usize {
        match self {
            ExtHeader::Deth => crate::deth::HEADER_LEN,
            ExtHeader::Feth => crate::feth::HEADER_LEN,
            ExtHeader::Reth => crate::reth::HEADER_LEN,
            ExtHeader::AtomicEth => crate::atomic::ATOMIC_ETH_LEN,
            ExtHeader::Aeth => crate::aeth::HEADER_LEN,
            ExtHeader::AtomicAckEth => crate::atomic::ATOMIC_ACK_ETH_LEN,
            ExtHeader::ImmDt => crate::immdt::HEADER_LEN,
            ExtHeader::Ieth => crate::ieth::HEADER_LEN,
            ExtHeader::CnpBody => crate::cnp::HEADER_LEN,
        }
    }

    const fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

/// The set of extension headers of an opcode; iteration and offsets follow the
/// wire order of [`ExtHeader`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders(u16);

impl ExtHeaders {
    /// No extension headers.
    pub const NONE: ExtHeaders = ExtHeaders(0);

    /// This set plus `h`.
    #[must_use]
    pub const fn with(self, h: ExtHeader) -> Self {
        ExtHeaders(self.0 | h.bit())
    }

    /// Whether `h` is in the set.
    pub const fn contains(self, h: ExtHeader) -> bool {
        self.0 & h.bit() != 0
    }

    /// `true` if the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Total length in bytes of all headers in the set.
    pub const fn byte_len(self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < ExtHeader::ALL.len() {
            if self.contains(ExtHeader::ALL[i]) {
                n += ExtHeader::ALL[i].byte_len();
            }
            i += 1;
        }
        n
    }

    /// Offset of `h` counted from the end of the BTH, or `None` if `h` is not
    /// in the set.
    pub const fn offset_of(self, h: ExtHeader) -> Option<usize> {
        if !self.contains(h) {
            return None;
        }
        let mut n = 0;
        let mut i = 0;
        while i < ExtHeader::ALL.len() {
            let x = ExtHeader::ALL[i];
            if x as u16 == h as u16 {
                return Some(n);
            }
            if self.contains(x) {
                n += x.byte_len();
            }
            i += 1;
        }
        None
    }

    /// Iterates over the headers in wire order.
    pub fn iter(self) -> impl Iterator<Item = ExtHeader> {
        ExtHeader::ALL
            .into_iter()
            .filter(move |h| self.contains(*h))
    }
}

/// One row of the opcode table (`ROCEV2.md §2.1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode itself.
    pub opcode: Opcode,
    /// Name in `ib_pack.h` style, e.g. `RC_SEND_FIRST`, `UD_SEND_ONLY`, `CNP`
    /// (the `opcode_name` spelling of `vectors.json`).
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// Operation kind.
    pub kind: OpKind,
    /// Position within the message.
    pub position: MsgPosition,
    /// Extension headers following the BTH, in wire order.
    pub ext: ExtHeaders,
    /// Payload length rule (also says whether a payload is allowed).
    pub payload: PayloadRule,
    /// Request, response or notification.
    pub direction: Direction,
    /// Carries immediate data (ImmDt).
    pub immediate: bool,
    /// Carries an R_Key to invalidate (IETH).
    pub invalidate: bool,
    /// Consumes a receive WQE at the responder (`ROCEV2.md §2.1` last column;
    /// a SEND claims its WQE on FIRST/ONLY, WRITE with immediate on LAST/ONLY).
    pub consumes_recv_wqe: bool,
}

impl OpcodeInfo {
    /// Whether the opcode may carry payload bytes.
    pub const fn has_payload(&self) -> bool {
        self.payload.allows_payload()
    }

    /// Whether this opcode is sent by a requester.
    pub const fn is_request(&self) -> bool {
        matches!(self.direction, Direction::Request)
    }

    /// Whether this opcode is sent by a responder.
    pub const fn is_response(&self) -> bool {
        matches!(self.direction, Direction::Response)
    }

    /// The operation part of the name, without the transport prefix
    /// (`SEND_FIRST` for `RC_SEND_FIRST`; `CNP` for `CNP`).
    pub fn op_name(&self) -> &'static str {
        match self.name.split_once('_') {
            Some((prefix, rest)) if prefix == self.transport.name() => rest,
            _ => self.name,
        }
    }
}

use ExtHeader as H;
use MsgPosition as P;
use OpKind as K;
use PayloadRule as L;

const fn ext1(a: ExtHeader) -> ExtHeaders {
    ExtHeaders::NONE.with(a)
}
const fn ext2(a: ExtHeader, b: ExtHeader) -> ExtHeaders {
    ExtHeaders::NONE.with(a).with(b)
}

#[allow(clippy::too_many_arguments)]
const fn row(
    op: u8,
    name: &'static str,
    transport: Transport,
    kind: OpKind,
    position: MsgPosition,
    ext: ExtHeaders,
    payload: PayloadRule,
    consumes_recv_wqe: bool,
) -> OpcodeInfo {
    let direction = match kind {
        K::RdmaReadResponse | K::Acknowledge | K::AtomicAcknowledge => Direction::Response,
        K::Cnp => Direction::Notification,
        _ => Direction::Request,
    };
    OpcodeInfo {
        opcode: Opcode(op),
        name,
        transport,
        kind,
        position,
        ext,
        payload,
        direction,
        immediate: ext.contains(H::ImmDt),
        invalidate: ext.contains(H::Ieth),
        consumes_recv_wqe,
    }
}

const N: ExtHeaders = ExtHeaders::NONE;

/// The table: index = opcode byte.
static TABLE: [Option<OpcodeInfo>; 256] = build_table();

#[rustfmt::skip]
const fn build_table() -> [Option<OpcodeInfo>; 256] {
    use Transport::{Cnp, Rc, Uc, Ud};
    let mut t: [Option<OpcodeInfo>; 256] = [None; 256];
    let rows = [
        // RC (ROCEV2.md §2.1)
        row(0x00, "RC_SEND_FIRST", Rc, K::Send, P::First, N, L::Pmtu, true),
        row(0x01, "RC_SEND_MIDDLE", Rc, K::Send, P::Middle, N, L::Pmtu, false),
        row(0x02, "RC_SEND_LAST", Rc, K::Send, P::Last, N, L::OneToPmtu, false),
        row(0x03, "RC_SEND_LAST_WITH_IMMEDIATE", Rc, K::Send, P::Last, ext1(H::ImmDt), L::OneToPmtu, false),
        row(0x04, "RC_SEND_ONLY", Rc, K::Send, P::Only, N, L::UpToPmtu, true),
        row(0x05, "RC_SEND_ONLY_WITH_IMMEDIATE", Rc, K::Send, P::Only, ext1(H::ImmDt), L::UpToPmtu, true),
        row(0x06, "RC_RDMA_WRITE_FIRST", Rc, K::RdmaWrite, P::First, ext1(H::Reth), L::Pmtu, false),
        row(0x07, "RC_RDMA_WRITE_MIDDLE", Rc, K::RdmaWrite, P::Middle, N, L::Pmtu, false),
        row(0x08, "RC_RDMA_WRITE_LAST", Rc, K::RdmaWrite, P::Last, N, L::OneToPmtu, false),
        row(0x09, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Rc, K::RdmaWrite, P::Last, ext1(H::ImmDt), L::OneToPmtu, true),
        row(0x0A, "RC_RDMA_WRITE_ONLY", Rc, K::RdmaWrite, P::Only, ext1(H::Reth), L::UpToPmtu, false),
        row(0x0B, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Rc, K::RdmaWrite, P::Only, ext2(H::Reth, H::ImmDt), L::UpToPmtu, true),
        row(0x0C, "RC_RDMA_READ_REQUEST", Rc, K::RdmaReadRequest, P::Only, ext1(H::Reth), L::None, false),
        row(0x0D, "RC_RDMA_READ_RESPONSE_FIRST", Rc, K::RdmaReadResponse, P::First, ext1(H::Aeth), L::Pmtu, false),
        row(0x0E, "RC_RDMA_READ_RESPONSE_MIDDLE", Rc, K::RdmaReadResponse, P::Middle, N, L::Pmtu, false),
        row(0x0F, "RC_RDMA_READ_RESPONSE_LAST", Rc, K::RdmaReadResponse, P::Last, ext1(H::Aeth), L::OneToPmtu, false),
        row(0x10, "RC_RDMA_READ_RESPONSE_ONLY", Rc, K::RdmaReadResponse, P::Only, ext1(H::Aeth), L::UpToPmtu, false),
        row(0x11, "RC_ACKNOWLEDGE", Rc, K::Acknowledge, P::Only, ext1(H::Aeth), L::None, false),
        row(0x12, "RC_ATOMIC_ACKNOWLEDGE", Rc, K::AtomicAcknowledge, P::Only, ext2(H::Aeth, H::AtomicAckEth), L::None, false),
        row(0x13, "RC_COMPARE_SWAP", Rc, K::CompareSwap, P::Only, ext1(H::AtomicEth), L::None, false),
        row(0x14, "RC_FETCH_ADD", Rc, K::FetchAdd, P::Only, ext1(H::AtomicEth), L::None, false),
        row(0x16, "RC_SEND_LAST_WITH_INVALIDATE", Rc, K::Send, P::Last, ext1(H::Ieth), L::OneToPmtu, false),
        row(0x17, "RC_SEND_ONLY_WITH_INVALIDATE", Rc, K::Send, P::Only, ext1(H::Ieth), L::UpToPmtu, true),
        row(0x1C, "RC_FLUSH", Rc, K::Flush, P::Only, ext2(H::Feth, H::Reth), L::None, false),
        row(0x1D, "RC_ATOMIC_WRITE", Rc, K::AtomicWrite, P::Only, ext1(H::Reth), L::Exactly(8), false),
        // UC = RC + 0x20, SEND and RDMA WRITE only (ROCEV2.md §2.1)
        row(0x20, "UC_SEND_FIRST", Uc, K::Send, P::First, N, L::Pmtu, true),
        row(0x21, "UC_SEND_MIDDLE", Uc, K::Send, P::Middle, N, L::Pmtu, false),
        row(0x22, "UC_SEND_LAST", Uc, K::Send, P::Last, N, L::OneToPmtu, false),
        row(0x23, "UC_SEND_LAST_WITH_IMMEDIATE", Uc, K::Send, P::Last, ext1(H::ImmDt), L::OneToPmtu, false),
        row(0x24, "UC_SEND_ONLY", Uc, K::Send, P::Only, N, L::UpToPmtu, true),
        row(0x25, "UC_SEND_ONLY_WITH_IMMEDIATE", Uc, K::Send, P::Only, ext1(H::ImmDt), L::UpToPmtu, true),
        row(0x26, "UC_RDMA_WRITE_FIRST", Uc, K::RdmaWrite, P::First, ext1(H::Reth), L::Pmtu, false),
        row(0x27, "UC_RDMA_WRITE_MIDDLE", Uc, K::RdmaWrite, P::Middle, N, L::Pmtu, false),
        row(0x28, "UC_RDMA_WRITE_LAST", Uc, K::RdmaWrite, P::Last, N, L::OneToPmtu, false),
        row(0x29, "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", Uc, K::RdmaWrite, P::Last, ext1(H::ImmDt), L::OneToPmtu, true),
        row(0x2A, "UC_RDMA_WRITE_ONLY", Uc, K::RdmaWrite, P::Only, ext1(H::Reth), L::UpToPmtu, false),
        row(0x2B, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", Uc, K::RdmaWrite, P::Only, ext2(H::Reth, H::ImmDt), L::UpToPmtu, true),
        // UD
        row(0x64, "UD_SEND_ONLY", Ud, K::Send, P::Only, ext1(H::Deth), L::UpToPmtu, true),
        row(0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", Ud, K::Send, P::Only, ext2(H::Deth, H::ImmDt), L::UpToPmtu, true),
        // RoCE v2 CNP (ROCEV2.md §6)
        row(0x81, "CNP", Cnp, K::Cnp, P::Only, ext1(H::CnpBody), L::None, false),
    ];
    let mut i = 0;
    while i < rows.len() {
        t[rows[i].opcode.0 as usize] = Some(rows[i]);
        i += 1;
    }
    t
}

impl Opcode {
    /// RC SEND FIRST (0x00).
    pub const RC_SEND_FIRST: Opcode = Opcode(0x00);
    /// RC SEND MIDDLE (0x01).
    pub const RC_SEND_MIDDLE: Opcode = Opcode(0x01);
    /// RC SEND LAST (0x02).
    pub const RC_SEND_LAST: Opcode = Opcode(0x02);
    /// RC SEND LAST with immediate (0x03).
    pub const RC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x03);
    /// RC SEND ONLY (0x04).
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// RC SEND ONLY with immediate (0x05).
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x05);
    /// RC RDMA WRITE FIRST (0x06).
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(0x06);
    /// RC RDMA WRITE MIDDLE (0x07).
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x07);
    /// RC RDMA WRITE LAST (0x08).
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(0x08);
    /// RC RDMA WRITE LAST with immediate (0x09).
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x09);
    /// RC RDMA WRITE ONLY (0x0A).
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0A);
    /// RC RDMA WRITE ONLY with immediate (0x0B).
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x0B);
    /// RC RDMA READ REQUEST (0x0C).
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0C);
    /// RC RDMA READ RESPONSE FIRST (0x0D).
    pub const RC_RDMA_READ_RESPONSE_FIRST: Opcode = Opcode(0x0D);
    /// RC RDMA READ RESPONSE MIDDLE (0x0E).
    pub const RC_RDMA_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0E);
    /// RC RDMA READ RESPONSE LAST (0x0F).
    pub const RC_RDMA_READ_RESPONSE_LAST: Opcode = Opcode(0x0F);
    /// RC RDMA READ RESPONSE ONLY (0x10).
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    /// RC ACKNOWLEDGE (0x11).
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    /// RC ATOMIC ACKNOWLEDGE (0x12).
    pub const RC_ATOMIC_ACKNOWLEDGE: Opcode = Opcode(0x12);
    /// RC COMPARE & SWAP (0x13).
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    /// RC FETCH & ADD (0x14).
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    /// RC SEND LAST with invalidate (0x16).
    pub const RC_SEND_LAST_WITH_INVALIDATE: Opcode = Opcode(0x16);
    /// RC SEND ONLY with invalidate (0x17).
    pub const RC_SEND_ONLY_WITH_INVALIDATE: Opcode = Opcode(0x17);
    /// RC FLUSH (0x1C).
    pub const RC_FLUSH: Opcode = Opcode(0x1C);
    /// RC ATOMIC WRITE (0x1D).
    pub const RC_ATOMIC_WRITE: Opcode = Opcode(0x1D);
    /// UC SEND FIRST (0x20).
    pub const UC_SEND_FIRST: Opcode = Opcode(0x20);
    /// UC SEND MIDDLE (0x21).
    pub const UC_SEND_MIDDLE: Opcode = Opcode(0x21);
    /// UC SEND LAST (0x22).
    pub const UC_SEND_LAST: Opcode = Opcode(0x22);
    /// UC SEND LAST with immediate (0x23).
    pub const UC_SEND_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x23);
    /// UC SEND ONLY (0x24).
    pub const UC_SEND_ONLY: Opcode = Opcode(0x24);
    /// UC SEND ONLY with immediate (0x25).
    pub const UC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x25);
    /// UC RDMA WRITE FIRST (0x26).
    pub const UC_RDMA_WRITE_FIRST: Opcode = Opcode(0x26);
    /// UC RDMA WRITE MIDDLE (0x27).
    pub const UC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x27);
    /// UC RDMA WRITE LAST (0x28).
    pub const UC_RDMA_WRITE_LAST: Opcode = Opcode(0x28);
    /// UC RDMA WRITE LAST with immediate (0x29).
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x29);
    /// UC RDMA WRITE ONLY (0x2A).
    pub const UC_RDMA_WRITE_ONLY: Opcode = Opcode(0x2A);
    /// UC RDMA WRITE ONLY with immediate (0x2B).
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x2B);
    /// UD SEND ONLY (0x64).
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// UD SEND ONLY with immediate (0x65).
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x65);
    /// RoCE v2 congestion notification packet (0x81, `ROCEV2.md §6`).
    pub const CNP: Opcode = Opcode(0x81);

    /// The SEND opcode for a packet at `pos` (`ROCEV2.md §2.1`). `imm` and
    /// `inv` only apply to `Last`/`Only` (ignored on `First`/`Middle`);
    /// asking for both returns `None`. RC supports all forms; UC has no
    /// invalidate; UD has only `Only` (with or without immediate). Other
    /// transports return `None`.
    pub const fn send(
        transport: Transport,
        pos: MsgPosition,
        imm: bool,
        inv: bool,
    ) -> Option<Opcode> {
        let ends = matches!(pos, MsgPosition::Last | MsgPosition::Only);
        if ends && imm && inv {
            return None;
        }
        let base = match transport {
            Transport::Rc => 0x00,
            Transport::Uc if !(ends && inv) => 0x20,
            Transport::Ud => {
                return match (pos, inv) {
                    (MsgPosition::Only, false) => Some(if imm {
                        Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                    } else {
                        Opcode::UD_SEND_ONLY
                    }),
                    _ => None,
                };
            }
            _ => return None,
        };
        let op = match pos {
            MsgPosition::First => 0x00,
            MsgPosition::Middle => 0x01,
            MsgPosition::Last if imm => 0x03,
            MsgPosition::Last if inv => 0x16,
            MsgPosition::Last => 0x02,
            MsgPosition::Only if imm => 0x05,
            MsgPosition::Only if inv => 0x17,
            MsgPosition::Only => 0x04,
        };
        Some(Opcode(base + op))
    }

    /// The RDMA WRITE opcode for a packet at `pos` on RC or UC (`ROCEV2.md
    /// §2.1`); `imm` only applies to `Last`/`Only`. Other transports: `None`.
    pub const fn rdma_write(transport: Transport, pos: MsgPosition, imm: bool) -> Option<Opcode> {
        let base = match transport {
            Transport::Rc => 0x00,
            Transport::Uc => 0x20,
            _ => return None,
        };
        let op = match pos {
            MsgPosition::First => 0x06,
            MsgPosition::Middle => 0x07,
            MsgPosition::Last if imm => 0x09,
            MsgPosition::Last => 0x08,
            MsgPosition::Only if imm => 0x0B,
            MsgPosition::Only => 0x0A,
        };
        Some(Opcode(base + op))
    }

    /// The RC RDMA READ RESPONSE opcode for a packet at `pos`.
    pub const fn read_response(pos: MsgPosition) -> Opcode {
        match pos {
            MsgPosition::First => Opcode::RC_RDMA_READ_RESPONSE_FIRST,
            MsgPosition::Middle => Opcode::RC_RDMA_READ_RESPONSE_MIDDLE,
            MsgPosition::Last => Opcode::RC_RDMA_READ_RESPONSE_LAST,
            MsgPosition::Only => Opcode::RC_RDMA_READ_RESPONSE_ONLY,
        }
    }

    /// The table entry, or `None` for an opcode this stack does not know.
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    /// Whether the opcode is in the table.
    #[inline]
    pub fn is_known(self) -> bool {
        self.info().is_some()
    }

    /// Transport from bits 7–5 (defined for every opcode, known or not).
    #[inline]
    pub const fn transport(self) -> Transport {
        match self.0 >> 5 {
            0 => Transport::Rc,
            1 => Transport::Uc,
            2 => Transport::Rd,
            3 => Transport::Ud,
            4 => Transport::Cnp,
            5 => Transport::Xrc,
            _ => Transport::Manufacturer,
        }
    }

    /// The table name (e.g. `RC_SEND_FIRST`), or `"UNKNOWN"`.
    pub fn name(self) -> &'static str {
        self.info().map_or("UNKNOWN", |i| i.name)
    }

    /// Extension headers that follow the BTH (empty for unknown opcodes).
    #[inline]
    pub fn ext_headers(self) -> ExtHeaders {
        self.info().map_or(ExtHeaders::NONE, |i| i.ext)
    }

    /// Total length of the extension headers (0 for unknown opcodes).
    #[inline]
    pub fn ext_len(self) -> usize {
        self.ext_headers().byte_len()
    }

    /// Whether the opcode may carry payload (`true` for unknown opcodes,
    /// whose bytes after the BTH are treated as opaque payload).
    #[inline]
    pub fn has_payload(self) -> bool {
        self.info().is_none_or(|i| i.has_payload())
    }
}

impl From<u8> for Opcode {
    fn from(v: u8) -> Self {
        Opcode(v)
    }
}

impl From<Opcode> for u8 {
    fn from(v: Opcode) -> Self {
        v.0
    }
}

impl fmt::Display for Opcode {
    /// Prints the table name, or `UNKNOWN(0xNN)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) => f.write_str(i.name),
            None => write!(f, "UNKNOWN(0x{:02x})", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_shape() {
        let known: usize = (0..=255u8).filter(|b| Opcode(*b).is_known()).count();
        // 25 RC + 12 UC + 2 UD + 1 CNP
        assert_eq!(known, 40);
        for b in 0..=255u8 {
            let op = Opcode(b);
            if let Some(i) = op.info() {
                assert_eq!(i.opcode, op);
                assert_eq!(i.transport, op.transport(), "{}", i.name);
                assert!(i.name.starts_with(i.transport.name()));
                // No opcode without payload has a position other than Only.
                if !i.has_payload() {
                    assert_eq!(i.position, MsgPosition::Only, "{}", i.name);
                }
            }
        }
        // UC mirrors RC for SEND/WRITE.
        for b in 0..=0x0Bu8 {
            let rc = Opcode(b).info().unwrap();
            let uc = Opcode(b + 0x20).info().unwrap();
            assert_eq!(rc.ext, uc.ext);
            assert_eq!(rc.kind, uc.kind);
            assert_eq!(rc.position, uc.position);
            assert_eq!(&rc.name[3..], &uc.name[3..]);
        }
        for b in [0x15u8, 0x18, 0x1E, 0x2C, 0x31, 0x40, 0x66, 0x80, 0xA0, 0xFF] {
            assert!(!Opcode(b).is_known(), "{b:#x}");
        }
    }

    #[test]
    fn ext_offsets() {
        let e = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.ext_headers();
        assert_eq!(e.byte_len(), 20);
        assert_eq!(e.offset_of(ExtHeader::Reth), Some(0));
        assert_eq!(e.offset_of(ExtHeader::ImmDt), Some(16));
        assert_eq!(e.offset_of(ExtHeader::Aeth), None);
        let e = Opcode::RC_ATOMIC_ACKNOWLEDGE.ext_headers();
        assert_eq!(e.offset_of(ExtHeader::AtomicAckEth), Some(4));
        let e = Opcode::RC_FLUSH.ext_headers();
        assert_eq!(e.offset_of(ExtHeader::Reth), Some(4));
        let e = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.ext_headers();
        assert_eq!(
            e.iter().collect::<std::vec::Vec<_>>(),
            vec![ExtHeader::Deth, ExtHeader::ImmDt]
        );
        assert_eq!(Opcode::CNP.ext_len(), 16);
        assert_eq!(Opcode::RC_COMPARE_SWAP.ext_len(), 28);
    }

    #[test]
    fn constructors_agree_with_table() {
        use MsgPosition::*;
        for t in [Transport::Rc, Transport::Uc, Transport::Ud, Transport::Xrc] {
            for pos in [First, Middle, Last, Only] {
                for imm in [false, true] {
                    for inv in [false, true] {
                        if let Some(op) = Opcode::send(t, pos, imm, inv) {
                            let i = op.info().unwrap();
                            assert_eq!((i.transport, i.kind, i.position), (t, OpKind::Send, pos));
                            if pos.ends_message() {
                                assert_eq!((i.immediate, i.invalidate), (imm, inv), "{}", i.name);
                            }
                        } else {
                            assert!(
                                (imm && inv && pos.ends_message())
                                    || t == Transport::Xrc
                                    || (t == Transport::Ud && (pos != Only || inv))
                                    || (t == Transport::Uc && inv && pos.ends_message()),
                                "{t:?} {pos:?} {imm} {inv}"
                            );
                        }
                    }
                    if let Some(op) = Opcode::rdma_write(t, pos, imm) {
                        let i = op.info().unwrap();
                        assert_eq!(
                            (i.transport, i.kind, i.position),
                            (t, OpKind::RdmaWrite, pos)
                        );
                        if pos.ends_message() {
                            assert_eq!(i.immediate, imm);
                        }
                    } else {
                        assert!(matches!(t, Transport::Ud | Transport::Xrc));
                    }
                }
            }
            let r = Opcode::read_response(Middle).info().unwrap();
            assert_eq!((r.kind, r.position), (OpKind::RdmaReadResponse, Middle));
        }
        assert_eq!(MsgPosition::of(0, 1), Only);
        assert_eq!(MsgPosition::of(0, 0), Only);
        assert_eq!(MsgPosition::of(0, 3), First);
        assert_eq!(MsgPosition::of(1, 3), Middle);
        assert_eq!(MsgPosition::of(2, 3), Last);
        assert_eq!(MsgPosition::of(1, 2), Last);
    }

    #[test]
    fn names_and_kinds() {
        let i = Opcode::RC_RDMA_READ_RESPONSE_LAST.info().unwrap();
        assert_eq!(i.op_name(), "RDMA_READ_RESPONSE_LAST");
        assert!(i.is_response());
        assert_eq!(Opcode::CNP.info().unwrap().op_name(), "CNP");
        assert_eq!(
            Opcode::CNP.info().unwrap().direction,
            Direction::Notification
        );
        assert!(
            Opcode::RC_SEND_LAST_WITH_INVALIDATE
                .info()
                .unwrap()
                .invalidate
        );
        assert!(
            Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
                .info()
                .unwrap()
                .immediate
        );
        assert_eq!(format!("{}", Opcode(0x15)), "UNKNOWN(0x15)");
        assert!(PayloadRule::Pmtu.accepts(256, 256));
        assert!(!PayloadRule::OneToPmtu.accepts(0, 256));
        assert!(PayloadRule::Exactly(8).accepts(8, 256));
    }
}
