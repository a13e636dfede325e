//! ACK Extended Transport Header, 4 bytes (`ROCEV2.md §1.6`, §4.3; IBTA Vol 1
//! §9.3.5): syndrome (8) and MSN (24), plus the syndrome classification and
//! the RNR-timer and ACK-credit tables (`ROCEV2.md §4.2`, §4.3).

use core::fmt;

use crate::field::{self, Field};
use crate::{Msn, Result};

mod fld {
    use super::Field;
    pub(crate) const SYNDROME: usize = 0;
    pub(crate) const MSN: Field = 1..4;
}

/// Length of the AETH in bytes.
pub const HEADER_LEN: usize = fld::MSN.end;

/// Credit code meaning "no credit information" (`ROCEV2.md §4.3`); \[rxe\]
/// always sends ACK syndrome 0x1F.
pub const CREDIT_INVALID: u8 = 31;

/// NAK codes, syndrome bits 4–0 when bits 6–5 are `11` (`ROCEV2.md §4.3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: PSN sequence error (syndrome 0x60).
    PsnSeqErr,
    /// 1: invalid request (0x61).
    InvalidRequest,
    /// 2: remote access error (0x62).
    RemoteAccessErr,
    /// 3: remote operational error (0x63).
    RemoteOpErr,
    /// 4: invalid RD request (0x64).
    InvalidRdRequest,
    /// A reserved code (5–31), kept (value masked to 5 bits on emit).
    Unknown(u8),
}

impl NakCode {
    /// Decodes the 5-bit code.
    pub const fn from_code(code: u8) -> Self {
        match code & 0x1F {
            0 => NakCode::PsnSeqErr,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessErr,
            3 => NakCode::RemoteOpErr,
            4 => NakCode::InvalidRdRequest,
            c => NakCode::Unknown(c),
        }
    }

    /// The 5-bit code.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSeqErr => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessErr => 2,
            NakCode::RemoteOpErr => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Unknown(c) => c & 0x1F,
        }
    }

    /// Short name for printing (`seq`, `inv_req`, `rem_access`, `rem_op`,
    /// `inv_rd_req`, `code<N>`).
    pub fn short_name(self) -> &'static str {
        match self {
            NakCode::PsnSeqErr => "seq",
            NakCode::InvalidRequest => "inv_req",
            NakCode::RemoteAccessErr => "rem_access",
            NakCode::RemoteOpErr => "rem_op",
            NakCode::InvalidRdRequest => "inv_rd_req",
            NakCode::Unknown(_) => "unknown",
        }
    }
}

/// The AETH syndrome byte, classified (`ROCEV2.md §4.3`). Conversion from and
/// to `u8` is lossless: syndromes with bit 7 set or bits 6–5 = `10` are kept as
/// [`AethSyndrome::Reserved`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Bits 6–5 = `00`: ACK; `credit` is the 5-bit credit code
    /// ([`ack_credit_count`]; 31 = [`CREDIT_INVALID`]).
    Ack {
        /// Credit code 0–31.
        credit: u8,
    },
    /// Bits 6–5 = `01`: RNR NAK; `timer` is the 5-bit RNR timer code
    /// ([`rnr_timer_us`]).
    RnrNak {
        /// RNR timer code 0–31.
        timer: u8,
    },
    /// Bits 6–5 = `11`: NAK with a code.
    Nak(NakCode),
    /// Any other syndrome byte (reserved encodings), kept verbatim.
    Reserved(u8),
}

impl AethSyndrome {
    /// The syndrome \[rxe\] sends in every ACK: credit code 31 (0x1F).
    pub const ACK: AethSyndrome = AethSyndrome::Ack {
        credit: CREDIT_INVALID,
    };

    /// Decodes a syndrome byte.
    pub const fn from_byte(b: u8) -> Self {
        if b & 0x80 != 0 {
            return AethSyndrome::Reserved(b);
        }
        match (b >> 5) & 0x3 {
            0 => AethSyndrome::Ack { credit: b & 0x1F },
            1 => AethSyndrome::RnrNak { timer: b & 0x1F },
            3 => AethSyndrome::Nak(NakCode::from_code(b)),
            _ => AethSyndrome::Reserved(b),
        }
    }

    /// Encodes to the syndrome byte (5-bit fields are masked).
    pub const fn to_byte(self) -> u8 {
        match self {
            AethSyndrome::Ack { credit } => credit & 0x1F,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1F),
            AethSyndrome::Nak(c) => 0x60 | c.code(),
            AethSyndrome::Reserved(b) => b,
        }
    }

    /// `true` for a positive ACK.
    pub const fn is_ack(self) -> bool {
        matches!(self, AethSyndrome::Ack { .. })
    }
}

impl From<u8> for AethSyndrome {
    fn from(b: u8) -> Self {
        AethSyndrome::from_byte(b)
    }
}

impl From<AethSyndrome> for u8 {
    fn from(s: AethSyndrome) -> u8 {
        s.to_byte()
    }
}

/// RNR NAK timer, code → microseconds (`ROCEV2.md §4.2`, IBTA Table 45).
/// Code 0 is the longest (655.36 ms). rxe's typo for code 25 (61410) is not
/// copied.
pub const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840,
    5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122_880, 163_840, 245_760,
    327_680, 491_520,
];

/// RNR timer in µs for a 5-bit code (upper bits of `code` ignored).
pub const fn rnr_timer_us(code: u8) -> u32 {
    RNR_TIMER_US[(code & 0x1F) as usize]
}

/// ACK credit count table, code 0..=30 → number of receive WQEs
/// (`ROCEV2.md §4.3`, IBTA Table 44).
pub const ACK_CREDITS: [u32; 31] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536,
    2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768,
];

/// Credits for an ACK credit code, `None` for 31 ("no credit information").
pub const fn ack_credit_count(code: u8) -> Option<u32> {
    let c = (code & 0x1F) as usize;
    if c < ACK_CREDITS.len() {
        Some(ACK_CREDITS[c])
    } else {
        None
    }
}

field::fixed_view!(
    /// A read/write view of an AETH.
    Aeth,
    HEADER_LEN
);

impl<T: AsRef<[u8]>> Aeth<T> {
    /// Raw syndrome byte.
    #[inline]
    pub fn syndrome_byte(&self) -> u8 {
        self.buffer.as_ref()[fld::SYNDROME]
    }
    /// Classified syndrome.
    #[inline]
    pub fn syndrome(&self) -> AethSyndrome {
        AethSyndrome::from_byte(self.syndrome_byte())
    }
    /// Message sequence number.
    #[inline]
    pub fn msn(&self) -> Msn {
        Msn::new(field::read_u24(&self.buffer.as_ref()[fld::MSN]))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Aeth<T> {
    /// Sets the syndrome.
    #[inline]
    pub fn set_syndrome(&mut self, s: AethSyndrome) {
        self.buffer.as_mut()[fld::SYNDROME] = s.to_byte();
    }
    /// Sets the MSN.
    #[inline]
    pub fn set_msn(&mut self, v: Msn) {
        field::write_u24(&mut self.buffer.as_mut()[fld::MSN], v.value());
    }
}

/// AETH as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AethRepr {
    /// Syndrome.
    pub syndrome: AethSyndrome,
    /// MSN.
    pub msn: Msn,
}

impl AethRepr {
    /// Parses an AETH view.
    ///
    /// # Errors
    /// [`crate::Error::Truncated`] if shorter than 4 bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(h: &Aeth<&T>) -> Result<Self> {
        h.check_len()?;
        Ok(AethRepr {
            syndrome: h.syndrome(),
            msn: h.msn(),
        })
    }
    /// Emitted length: 4.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header (buffer ≥ 4 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut Aeth<T>) {
        h.set_syndrome(self.syndrome);
        h.set_msn(self.msn);
    }
}

impl fmt::Display for AethRepr {
    /// `ack msn=7`, `ack credit=3 msn=7`, `rnr t=12 msn=5`, `nak seq msn=5`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.syndrome {
            AethSyndrome::Ack {
                credit: CREDIT_INVALID,
            } => write!(f, "ack msn={}", self.msn),
            AethSyndrome::Ack { credit } => write!(f, "ack credit={credit} msn={}", self.msn),
            AethSyndrome::RnrNak { timer } => {
                write!(
                    f,
                    "rnr t={timer}({}us) msn={}",
                    rnr_timer_us(timer),
                    self.msn
                )
            }
            AethSyndrome::Nak(NakCode::Unknown(c)) => write!(f, "nak code={c} msn={}", self.msn),
            AethSyndrome::Nak(c) => write!(f, "nak {} msn={}", c.short_name(), self.msn),
            AethSyndrome::Reserved(b) => write!(f, "syndrome=0x{b:02x} msn={}", self.msn),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    static BYTES: [u8; 4] = [0x2c, 0x00, 0x00, 0x05];
    const REPR: AethRepr = AethRepr {
        syndrome: AethSyndrome::RnrNak { timer: 12 },
        msn: Msn::new(5),
    };

    #[test]
    fn test_deconstruct() {
        let h = Aeth::new_checked(&BYTES[..]).unwrap();
        assert_eq!(h.syndrome_byte(), 0x2c);
        assert_eq!(h.syndrome(), AethSyndrome::RnrNak { timer: 12 });
        assert_eq!(h.msn(), Msn::new(5));
    }
    #[test]
    fn test_construct() {
        let mut buf = [0xffu8; 4];
        let mut h = Aeth::new_unchecked(&mut buf[..]);
        h.set_syndrome(AethSyndrome::RnrNak { timer: 12 });
        h.set_msn(Msn::new(5));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        assert_eq!(
            AethRepr::parse(&Aeth::new_unchecked(&BYTES[..])).unwrap(),
            REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0u8; 4];
        REPR.emit(&mut Aeth::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            Aeth::new_checked(&BYTES[..3]).unwrap_err(),
            Error::Truncated
        );
    }

    #[test]
    fn syndrome_roundtrip_all_bytes() {
        for b in 0..=255u8 {
            assert_eq!(AethSyndrome::from_byte(b).to_byte(), b, "{b:#x}");
        }
        assert_eq!(AethSyndrome::from_byte(0x1f), AethSyndrome::ACK);
        assert_eq!(
            AethSyndrome::from_byte(0x60),
            AethSyndrome::Nak(NakCode::PsnSeqErr)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x61),
            AethSyndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x62),
            AethSyndrome::Nak(NakCode::RemoteAccessErr)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x63),
            AethSyndrome::Nak(NakCode::RemoteOpErr)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x64),
            AethSyndrome::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x65),
            AethSyndrome::Nak(NakCode::Unknown(5))
        );
        assert_eq!(AethSyndrome::from_byte(0x40), AethSyndrome::Reserved(0x40));
        assert_eq!(AethSyndrome::from_byte(0x9f), AethSyndrome::Reserved(0x9f));
    }

    #[test]
    fn tables() {
        assert_eq!(rnr_timer_us(0), 655_360);
        assert_eq!(rnr_timer_us(12), 640);
        assert_eq!(rnr_timer_us(25), 61_440);
        assert_eq!(rnr_timer_us(31), 491_520);
        assert!(RNR_TIMER_US[1..].windows(2).all(|w| w[0] < w[1]));
        assert_eq!(ack_credit_count(0), Some(0));
        assert_eq!(ack_credit_count(5), Some(6));
        assert_eq!(ack_credit_count(30), Some(32768));
        assert_eq!(ack_credit_count(31), None);
        assert!(ACK_CREDITS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn display() {
        let a = AethRepr {
            syndrome: AethSyndrome::ACK,
            msn: Msn::new(7),
        };
        assert_eq!(format!("{a}"), "ack msn=7");
        let a = AethRepr {
            syndrome: AethSyndrome::Nak(NakCode::PsnSeqErr),
            msn: Msn::new(5),
        };
        assert_eq!(format!("{a}"), "nak seq msn=5");
    }
}
