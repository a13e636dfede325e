//! Ethernet II header with an optional single 802.1Q tag (`ROCEV2.md §1.1`):
//! dst MAC (6), src MAC (6), [TPID 0x8100 (2), TCI = PCP(3) DEI(1) VID(12)],
//! EtherType (2).

use core::fmt;

use crate::field::{self, Field};
use crate::{Error, Result};

mod fld {
    use super::Field;
    pub(crate) const DST: Field = 0..6;
    pub(crate) const SRC: Field = 6..12;
    pub(crate) const TYPE_OR_TPID: Field = 12..14;
    pub(crate) const TCI: Field = 14..16;
}

/// Length of an untagged Ethernet header.
pub const HEADER_LEN: usize = 14;
/// Length of an 802.1Q-tagged Ethernet header.
pub const VLAN_HEADER_LEN: usize = 18;
/// Minimum Ethernet frame length without FCS; shorter frames are padded by
/// the MAC (`ROCEV2.md §1.1`), so the ICRC must be located from IP/UDP lengths.
pub const MIN_FRAME_LEN: usize = 60;

/// A 48-bit MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct EthernetAddress(pub [u8; 6]);

impl EthernetAddress {
    /// The broadcast address.
    pub const BROADCAST: EthernetAddress = EthernetAddress([0xff; 6]);
}

impl fmt::Display for EthernetAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

/// An EtherType value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EtherType(pub u16);

impl EtherType {
    /// IPv4.
    pub const IPV4: EtherType = EtherType(0x0800);
    /// IPv6.
    pub const IPV6: EtherType = EtherType(0x86DD);
    /// 802.1Q VLAN tag protocol identifier.
    pub const VLAN: EtherType = EtherType(0x8100);
}

/// An 802.1Q tag control information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    /// Priority code point (3 bits).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

impl VlanTag {
    /// Decodes a TCI.
    pub const fn from_tci(tci: u16) -> Self {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0FFF,
        }
    }
    /// Encodes to a TCI (fields masked to their widths).
    pub const fn to_tci(self) -> u16 {
        (((self.pcp & 0x7) as u16) << 13)
            | (if self.dei { 0x1000 } else { 0 })
            | (self.vid & 0x0FFF)
    }
}

/// A read/write view of an Ethernet header at the start of `buffer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a buffer without checks (for emission into a buffer of computed size).
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wraps a buffer and runs [`check_len`](Self::check_len).
    ///
    /// # Errors
    /// [`Error::Truncated`] if the header (including a VLAN tag) does not fit.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let f = Self::new_unchecked(buffer);
        f.check_len()?;
        Ok(f)
    }

    /// Checks the buffer holds the whole header, including the VLAN tag if
    /// the TPID says there is one. Changing the TPID through
    /// [`set_tpid_or_ethertype`](EthernetFrame::set_tpid_or_ethertype)
    /// invalidates this check.
    ///
    /// # Errors
    /// [`Error::Truncated`].
    pub fn check_len(&self) -> Result<()> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || len < self.header_len() {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn tpid(&self) -> u16 {
        field::read_u16(&self.buffer.as_ref()[fld::TYPE_OR_TPID])
    }

    /// Whether an 802.1Q tag is present (bytes 12..14 = 0x8100).
    pub fn has_vlan(&self) -> bool {
        self.tpid() == EtherType::VLAN.0
    }

    /// Header length: 14, or 18 with a VLAN tag.
    pub fn header_len(&self) -> usize {
        if self.has_vlan() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Destination MAC.
    pub fn dst_addr(&self) -> EthernetAddress {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[fld::DST]);
        EthernetAddress(a)
    }

    /// Source MAC.
    pub fn src_addr(&self) -> EthernetAddress {
        let mut a = [0u8; 6];
        a.copy_from_slice(&self.buffer.as_ref()[fld::SRC]);
        EthernetAddress(a)
    }

    /// The VLAN tag, if present.
    pub fn vlan(&self) -> Option<VlanTag> {
        if self.has_vlan() {
            Some(VlanTag::from_tci(field::read_u16(
                &self.buffer.as_ref()[fld::TCI],
            )))
        } else {
            None
        }
    }

    /// The EtherType of the payload (after the VLAN tag if present).
    pub fn ethertype(&self) -> EtherType {
        let off = self.header_len() - 2;
        EtherType(field::read_u16(&self.buffer.as_ref()[off..off + 2]))
    }

    /// Bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    /// Sets the destination MAC.
    pub fn set_dst_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[fld::DST].copy_from_slice(&a.0);
    }

    /// Sets the source MAC.
    pub fn set_src_addr(&mut self, a: EthernetAddress) {
        self.buffer.as_mut()[fld::SRC].copy_from_slice(&a.0);
    }

    /// Writes bytes 12..14 (TPID 0x8100 for a tagged frame, else the EtherType).
    pub fn set_tpid_or_ethertype(&mut self, v: EtherType) {
        field::write_u16(&mut self.buffer.as_mut()[fld::TYPE_OR_TPID], v.0);
    }

    /// Sets the VLAN tag TCI (only meaningful when the TPID is 0x8100).
    pub fn set_vlan_tci(&mut self, tag: VlanTag) {
        field::write_u16(&mut self.buffer.as_mut()[fld::TCI], tag.to_tci());
    }

    /// Sets the payload EtherType (after the tag if one is present).
    pub fn set_ethertype(&mut self, v: EtherType) {
        let off = self.header_len() - 2;
        field::write_u16(&mut self.buffer.as_mut()[off..off + 2], v.0);
    }

    /// Mutable bytes after the header.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let off = self.header_len();
        &mut self.buffer.as_mut()[off..]
    }
}

/// Ethernet header as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Source MAC.
    pub src_addr: EthernetAddress,
    /// Destination MAC.
    pub dst_addr: EthernetAddress,
    /// Optional 802.1Q tag.
    pub vlan: Option<VlanTag>,
    /// Payload EtherType.
    pub ethertype: EtherType,
}

impl EthernetRepr {
    /// Parses a view.
    ///
    /// # Errors
    /// [`Error::Truncated`] if the header does not fit.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(f: &EthernetFrame<&T>) -> Result<Self> {
        f.check_len()?;
        Ok(EthernetRepr {
            src_addr: f.src_addr(),
            dst_addr: f.dst_addr(),
            vlan: f.vlan(),
            ethertype: f.ethertype(),
        })
    }

    /// Header length: 14 or 18.
    pub const fn header_len(&self) -> usize {
        if self.vlan.is_some() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the header (buffer ≥ `header_len()`).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, f: &mut EthernetFrame<T>) {
        f.set_dst_addr(self.dst_addr);
        f.set_src_addr(self.src_addr);
        match self.vlan {
            Some(tag) => {
                f.set_tpid_or_ethertype(EtherType::VLAN);
                f.set_vlan_tci(tag);
            }
            None => f.set_tpid_or_ethertype(self.ethertype),
        }
        f.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 18] = [
        0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x81, 0x00, 0xa0, 0x64, 0x08, 0x00,
    ];
    const REPR: EthernetRepr = EthernetRepr {
        src_addr: EthernetAddress([2, 0, 0, 0, 0, 1]),
        dst_addr: EthernetAddress([2, 0, 0, 0, 0, 2]),
        vlan: Some(VlanTag {
            pcp: 5,
            dei: false,
            vid: 100,
        }),
        ethertype: EtherType::IPV4,
    };

    #[test]
    fn test_deconstruct() {
        let f = EthernetFrame::new_checked(&BYTES[..]).unwrap();
        assert_eq!(f.dst_addr(), EthernetAddress([2, 0, 0, 0, 0, 2]));
        assert_eq!(f.src_addr(), EthernetAddress([2, 0, 0, 0, 0, 1]));
        assert_eq!(
            f.vlan(),
            Some(VlanTag {
                pcp: 5,
                dei: false,
                vid: 100
            })
        );
        assert_eq!(f.ethertype(), EtherType::IPV4);
        assert_eq!(f.header_len(), 18);
        let untagged = [&BYTES[..12], &BYTES[16..]].concat();
        let f = EthernetFrame::new_checked(&untagged[..]).unwrap();
        assert_eq!(f.vlan(), None);
        assert_eq!(f.ethertype(), EtherType::IPV4);
    }
    #[test]
    fn test_construct() {
        let mut buf = [0u8; 18];
        let mut f = EthernetFrame::new_unchecked(&mut buf[..]);
        f.set_dst_addr(EthernetAddress([2, 0, 0, 0, 0, 2]));
        f.set_src_addr(EthernetAddress([2, 0, 0, 0, 0, 1]));
        f.set_tpid_or_ethertype(EtherType::VLAN);
        f.set_vlan_tci(VlanTag {
            pcp: 5,
            dei: false,
            vid: 100,
        });
        f.set_ethertype(EtherType::IPV4);
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_parse() {
        assert_eq!(
            EthernetRepr::parse(&EthernetFrame::new_unchecked(&BYTES[..])).unwrap(),
            REPR
        );
    }
    #[test]
    fn test_emit() {
        let mut buf = [0u8; 18];
        REPR.emit(&mut EthernetFrame::new_unchecked(&mut buf[..]));
        assert_eq!(buf, BYTES);
    }
    #[test]
    fn test_impossible_len() {
        assert_eq!(
            EthernetFrame::new_checked(&BYTES[..13]).unwrap_err(),
            Error::Truncated
        );
        // Tag announced but cut off.
        assert_eq!(
            EthernetFrame::new_checked(&BYTES[..16]).unwrap_err(),
            Error::Truncated
        );
    }
}
