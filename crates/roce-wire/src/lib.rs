//! # roce-wire: RoCE v2 wire formats
//!
//! The packet layer of the rocev2 stack: bytes in, typed headers out, and
//! back. It knows nothing about queue pairs or time; the engine
//! (`roce-proto`) builds on it.
//!
//! ## Architecture
//!
//! The layout follows smoltcp's `wire` module. Every header has two levels:
//!
//! * a zero-copy **view** over a byte buffer — [`EthernetFrame`],
//!   [`Ipv4Packet`], [`Ipv6Packet`], [`UdpPacket`], [`Bth`], [`Reth`],
//!   [`Aeth`], [`AtomicEth`], [`AtomicAckEth`], [`ImmDt`], [`Ieth`], [`Deth`],
//!   [`Feth`], [`CnpBody`] — with `new_unchecked` / `check_len` /
//!   `new_checked`, getters on `T: AsRef<[u8]>` and setters on
//!   `T: AsMut<[u8]>`;
//! * a small **repr** value — [`EthernetRepr`], [`Ipv4Repr`], [`BthRepr`],
//!   [`RethRepr`], [`AethRepr`], ... — with `parse` / `emit` / `header_len`.
//!
//! On top of these:
//!
//! * [`opcode`]: the single per-opcode table ([`Opcode::info`] →
//!   [`OpcodeInfo`]: name, transport, extension headers in order, payload
//!   rule, message position, operation kind, request/response,
//!   immediate/invalidate). Parsing, emission, segmentation and the engine
//!   all consult it.
//! * [`types`]: 24-bit [`Psn`] (wrapping, window compare), [`Qpn`], [`Msn`].
//! * [`gid`]: [`Gid`], the port GID (IPv4-mapped `::ffff:a.b.c.d` ↔ 16 bytes,
//!   the hex form of the rdma-core pingpong exchange).
//! * [`icrc`]: the invariant CRC (`ROCEV2.md §3`), seeded so the LRH stand-in
//!   costs nothing, masked header copies on the stack.
//! * [`frame`]: [`RoceRepr`], a whole Ethernet/IP/UDP/BTH/ext/payload/ICRC
//!   frame; [`RoceRepr::parse`] for untrusted input and [`RoceRepr::emit`].
//! * [`template`]: [`HeaderTemplate`], the per-QP precomputed header image
//!   the send path patches per packet.
//! * [`pretty`]: one-line tcpdump-like rendering ([`PrettyFrame`]).
//! * [`udp::udp_sport`]: the Linux UDP source-port rule.
//! * [`mad`]: management datagrams ([`Mad`] view, [`MadHeaderRepr`]) and how
//!   a GSI datagram travels on RoCE v2 (UD to QP1, Q_Key 0x8001_0000);
//!   [`cm`]: the communication manager's messages (REQ, MRA, REJ, REP, RTU,
//!   DREQ, DREP, SIDR_REQ, SIDR_REP as [`CmMad`]), the rdma_cm address
//!   header and service IDs.
//!
//! The crate is `no_std` (with `alloc` available but unused), has no
//! `unsafe` code, and allocates nothing in parse or emit. Protocol facts cite
//! `docs/spec/ROCEV2.md` sections, IBTA Vol 1 or the Linux rxe source.
//!
//! ## Cargo features
//!
//! * `std` (default): lets `crc32fast` detect PCLMULQDQ / AVX2 / AVX-512
//!   VPCLMULQDQ at run time. Without it the CRC can only use CPU features
//!   enabled at compile time (`-C target-cpu=...`), which on a baseline
//!   x86_64 build means a table-driven CRC several times slower. The crate
//!   itself is `no_std` with or without this feature.
//!
//! ## Panic contract
//!
//! Views are cheap wrappers and index their buffer directly, so the rules
//! for avoiding panics are explicit:
//!
//! * After `new_checked` (or `check_len`) has succeeded, no getter of that
//!   view panics, and no setter panics unless it changes a length field the
//!   check relied on (those setters say so).
//! * `XxxRepr::parse` never panics, whatever the buffer; it returns an
//!   [`Error`].
//! * [`RoceRepr::parse`], [`PrettyFrame`] and the [`icrc`] functions accept
//!   arbitrary bytes and never panic: they are the entry points for untrusted
//!   input and for fuzzing.
//! * `XxxRepr::emit` does not panic when the buffer holds at least
//!   `header_len()` bytes; [`RoceRepr::emit`] and [`HeaderTemplate::emit`]
//!   check the buffer length and return an error instead.
//! * `new_unchecked` is for buffers whose length the caller computed (the
//!   emit path). Do not use `new_checked` to validate a buffer you are about
//!   to fill: its contents are stale, so the check would depend on whatever
//!   bytes happened to be there.
//!
//! Under `cfg(fuzzing)` the ICRC and IPv4 checksum checks always pass so
//! fuzzers reach the transport logic.
//!
//! ## Example
//!
//! ```
//! use core::net::Ipv4Addr;
//! use roce_wire::*;
//!
//! let repr = RoceRepr {
//!     eth: EthernetRepr {
//!         src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
//!         dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
//!         vlan: None,
//!         ethertype: EtherType::IPV4,
//!     },
//!     ip: IpRepr::Ipv4(Ipv4Repr {
//!         src_addr: Ipv4Addr::new(192, 0, 2, 1),
//!         dst_addr: Ipv4Addr::new(192, 0, 2, 2),
//!         dscp: 26,
//!         ecn: Ecn::Ect0,
//!         ident: 0x0100,
//!         dont_frag: true,
//!         ttl: 64,
//!         protocol: 17,
//!     }),
//!     udp: UdpRepr { src_port: udp_sport(Qpn::new(0x11), Qpn::new(0x12), 0), dst_port: ROCE_V2_PORT },
//!     bth: BthRepr {
//!         opcode: Opcode::RC_SEND_ONLY,
//!         solicited: false,
//!         mig_req: false,
//!         pad_count: 0,
//!         pkey: 0xffff,
//!         fecn: false,
//!         becn: false,
//!         dest_qp: Qpn::new(0x12),
//!         ack_req: true,
//!         psn: Psn::new(0),
//!     },
//!     ext: ExtRepr::NONE,
//!     payload_len: 16,
//! };
//! let payload: Vec<u8> = (0u8..16).collect();
//! let mut frame = [0u8; 128];
//! let n = repr.emit_with_payload(&mut frame, &payload).unwrap();
//! assert_eq!(n, 74);
//! // ROCEV2.md §3 worked example: ICRC 0x32a46a96, wire bytes 96 6a a4 32.
//! assert_eq!(&frame[70..74], &[0x96, 0x6a, 0xa4, 0x32]);
//!
//! let parsed = RoceRepr::parse(&frame[..n]).unwrap();
//! assert!(parsed.icrc_ok);
//! assert_eq!(parsed.repr, repr);
//! assert_eq!(parsed.payload, &payload[..]);
//! assert_eq!(parsed.to_string(), "RC SEND_ONLY qp=0x000012 psn=0x000000 A=1 pad=0 len=16 icrc=ok");
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(test)]
#[macro_use]
extern crate std;

extern crate alloc;

use core::fmt;

mod field;

pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
pub mod eth;
pub mod ext;
pub mod feth;
pub mod frame;
pub mod gid;
pub mod icrc;
pub mod ieth;
pub mod immdt;
pub mod ipv4;
pub mod ipv6;
pub mod mad;
pub mod opcode;
pub mod pretty;
pub mod reth;
pub mod rsocket;
pub mod template;
pub mod types;
pub mod udp;

pub use aeth::{Aeth, AethRepr, AethSyndrome, NakCode, ack_credit_count, rnr_timer_us};
pub use atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use cm::{CmMad, CmMessage};
pub use cnp::{CnpBody, CnpRepr};
pub use deth::{Deth, DethRepr};
pub use eth::{EtherType, EthernetAddress, EthernetFrame, EthernetRepr, VlanTag};
pub use ext::ExtRepr;
pub use feth::{Feth, FethRepr};
pub use frame::{IpRepr, ParsedFrame, Rejection, RoceFrame, RoceRepr};
pub use gid::{Gid, GidHex};
pub use icrc::ICRC_LEN;
pub use ieth::{Ieth, IethRepr};
pub use immdt::{ImmDt, ImmDtRepr};
pub use ipv4::{Ecn, Ipv4Packet, Ipv4Repr};
pub use ipv6::{Ipv6Packet, Ipv6Repr};
pub use mad::{Mad, MadHeaderRepr};
pub use opcode::{
    Direction, ExtHeader, ExtHeaders, MsgPosition, OpKind, Opcode, OpcodeInfo, PayloadRule,
    Transport,
};
pub use pretty::PrettyFrame;
pub use reth::{Reth, RethRepr};
pub use template::{HeaderTemplate, PacketHeader};
pub use types::{Msn, Psn, Qpn};
pub use udp::{ROCE_V2_PORT, UdpPacket, UdpRepr, udp_sport};

/// Why bytes could not be parsed (STYLE W10: tiny on purpose; drop reasons
/// that need context — unknown QPN, bad P_Key, PSN out of window — are
/// classified by the engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer ends before a header or a length field says it should.
    Truncated,
    /// Fields are inconsistent or invalid (lengths disagree, TVer ≠ 0, bad pad
    /// count, IPv4 options/fragments, extension headers not matching the
    /// opcode, ...).
    Malformed,
    /// Well-formed bytes that are not RoCE v2: not IPv4/IPv6, not UDP, or UDP
    /// destination port ≠ 4791.
    NotRoce,
    /// The ICRC does not match (only returned by the strict helpers; the
    /// frame parser reports ICRC status separately).
    BadIcrc,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Truncated => "truncated",
            Error::Malformed => "malformed",
            Error::NotRoce => "not RoCE v2",
            Error::BadIcrc => "bad ICRC",
        })
    }
}

impl core::error::Error for Error {}

/// Result alias with [`Error`].
pub type Result<T> = core::result::Result<T, Error>;
