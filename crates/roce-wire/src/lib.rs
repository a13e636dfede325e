//! roce-wire: RoCE v2 wire formats.
//!
//! Under construction: see the module list for what exists.
#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(any(test, feature = "std"))]
#[macro_use]
extern crate std;

extern crate alloc;

use core::fmt;

mod field;

pub mod aeth;
pub mod atomic;
pub mod bth;
pub mod cnp;
pub mod deth;
pub mod feth;
pub mod ieth;
pub mod immdt;
pub mod opcode;
pub mod reth;
pub mod types;

pub use aeth::{Aeth, AethRepr, AethSyndrome, NakCode};
pub use atomic::{AtomicAckEth, AtomicAckEthRepr, AtomicEth, AtomicEthRepr};
pub use bth::{Bth, BthRepr};
pub use cnp::{CnpBody, CnpRepr};
pub use deth::{Deth, DethRepr};
pub use feth::{Feth, FethRepr};
pub use ieth::{Ieth, IethRepr};
pub use immdt::{ImmDt, ImmDtRepr};
pub use opcode::{
    Direction, ExtHeader, ExtHeaders, MsgPosition, OpKind, Opcode, OpcodeInfo, PayloadRule,
    Transport,
};
pub use reth::{Reth, RethRepr};
pub use types::{Msn, Psn, Qpn};

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
