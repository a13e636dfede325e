//! Link-layer normalisation: every captured packet is turned into an Ethernet frame
//! (starting at the destination MAC), the one frame shape roce-wire parses.
//!
//! Linux cooked captures (`tcpdump -i any`) and raw-IP captures carry no Ethernet header;
//! a synthetic one (zero MACs, or the SLL source address, plus the EtherType) is prepended.
//! The Ethernet header is outside the ICRC (`ROCEV2.md §3` step 2), so the ICRC check is
//! unaffected.

use std::fmt;

use crate::capture::LinkType;

/// Why a captured packet cannot be turned into an Ethernet frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkError {
    /// The capture's link type is not handled.
    Unsupported(LinkType),
    /// The packet is shorter than its link-layer header.
    Short {
        /// Link type of the packet.
        link: LinkType,
        /// Captured length.
        len: usize,
    },
    /// A raw-IP packet whose first nibble is neither 4 nor 6.
    NotIp,
}

impl fmt::Display for LinkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkError::Unsupported(l) => write!(f, "unsupported link type {l}"),
            LinkError::Short { link, len } => {
                write!(f, "{len}-byte packet is shorter than its {link} header")
            }
            LinkError::NotIp => f.write_str("raw-IP packet is neither IPv4 nor IPv6"),
        }
    }
}

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
/// `LINKTYPE_LINUX_SLL` header length (tcpdump.org/linktypes/LINKTYPE_LINUX_SLL.html).
const SLL_LEN: usize = 16;
/// `LINKTYPE_LINUX_SLL2` header length (tcpdump.org/linktypes/LINKTYPE_LINUX_SLL2.html).
const SLL2_LEN: usize = 20;

/// Returns `data` as an Ethernet frame: `data` itself for Ethernet captures, otherwise a
/// frame built in `scratch` (whose previous contents are discarded).
pub fn to_ethernet<'a>(
    link: LinkType,
    data: &'a [u8],
    scratch: &'a mut Vec<u8>,
) -> Result<&'a [u8], LinkError> {
    let short = || LinkError::Short {
        link,
        len: data.len(),
    };
    let (src_mac, ethertype, payload) = match link {
        LinkType::Ethernet => return Ok(data),
        LinkType::LinuxSll => {
            // 0: packet type, 2: ARPHRD, 4: address length, 6: 8-byte address, 14: protocol.
            let hdr = data.get(..SLL_LEN).ok_or_else(short)?;
            let mut mac = [0u8; 6];
            if u16::from_be_bytes([hdr[4], hdr[5]]) == 6 {
                mac.copy_from_slice(&hdr[6..12]);
            }
            (mac, [hdr[14], hdr[15]], &data[SLL_LEN..])
        }
        LinkType::LinuxSll2 => {
            // 0: protocol, 2: reserved, 4: ifindex, 8: ARPHRD, 10: packet type,
            // 11: address length, 12: 8-byte address.
            let hdr = data.get(..SLL2_LEN).ok_or_else(short)?;
            let mut mac = [0u8; 6];
            if hdr[11] == 6 {
                mac.copy_from_slice(&hdr[12..18]);
            }
            (mac, [hdr[0], hdr[1]], &data[SLL2_LEN..])
        }
        LinkType::RawIp => {
            let first = data.first().ok_or_else(short)?;
            let ethertype = match first >> 4 {
                4 => ETHERTYPE_IPV4,
                6 => ETHERTYPE_IPV6,
                _ => return Err(LinkError::NotIp),
            };
            ([0; 6], ethertype.to_be_bytes(), data)
        }
        LinkType::Unsupported(_) => return Err(LinkError::Unsupported(link)),
    };
    scratch.clear();
    scratch.extend_from_slice(&[0; 6]);
    scratch.extend_from_slice(&src_mac);
    scratch.extend_from_slice(&ethertype);
    scratch.extend_from_slice(payload);
    Ok(scratch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ethernet_is_passed_through() {
        let mut s = Vec::new();
        let data = [1u8, 2, 3];
        assert_eq!(
            to_ethernet(LinkType::Ethernet, &data, &mut s),
            Ok(&data[..])
        );
    }

    #[test]
    fn sll_gets_synthetic_ethernet_header() {
        let mut pkt = vec![0, 4, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x08, 0x00];
        pkt.extend_from_slice(&[0x45, 0xaa]);
        let mut s = Vec::new();
        let eth = to_ethernet(LinkType::LinuxSll, &pkt, &mut s).expect("valid SLL");
        assert_eq!(
            eth,
            &[0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 1, 0x08, 0x00, 0x45, 0xaa][..]
        );
    }

    #[test]
    fn sll2_and_raw_ip() {
        let mut pkt = vec![0x86, 0xdd, 0, 0, 0, 0, 0, 2, 0, 1, 4, 6];
        pkt.extend_from_slice(&[2, 0, 0, 0, 0, 9, 0, 0]);
        pkt.push(0x60);
        let mut s = Vec::new();
        let eth = to_ethernet(LinkType::LinuxSll2, &pkt, &mut s).expect("valid SLL2");
        assert_eq!(&eth[6..], &[2, 0, 0, 0, 0, 9, 0x86, 0xdd, 0x60][..]);
        let mut s = Vec::new();
        let eth = to_ethernet(LinkType::RawIp, &[0x45, 0], &mut s).expect("IPv4");
        assert_eq!(&eth[12..], &[0x08, 0x00, 0x45, 0][..]);
        assert_eq!(
            to_ethernet(LinkType::RawIp, &[0x15], &mut Vec::new()),
            Err(LinkError::NotIp)
        );
    }

    #[test]
    fn short_and_unsupported() {
        assert_eq!(
            to_ethernet(LinkType::LinuxSll, &[0; 5], &mut Vec::new()),
            Err(LinkError::Short {
                link: LinkType::LinuxSll,
                len: 5
            })
        );
        assert_eq!(
            to_ethernet(LinkType::Unsupported(105), &[0; 50], &mut Vec::new()),
            Err(LinkError::Unsupported(LinkType::Unsupported(105)))
        );
    }
}
