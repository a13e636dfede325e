//! Invariant CRC (`ROCEV2.md §3`, IBTA Annex A17; Linux
//! `drivers/infiniband/sw/rxe/rxe_icrc.c`).
//!
//! The ICRC is CRC-32 (IEEE 802.3, reflected, as `zlib.crc32`) over
//!
//! 1. eight 0xFF bytes standing in for the IB LRH,
//! 2. the IP header with the variant fields set to all-ones — IPv4: TOS,
//!    TTL, header checksum; IPv6: traffic class, flow label, hop limit,
//! 3. the UDP header with the checksum set to all-ones,
//! 4. the BTH with byte 4 (FECN, BECN, reserved) set to all-ones,
//! 5. everything after the BTH up to the ICRC (extension headers, payload,
//!    pad).
//!
//! It is stored least-significant byte first. Instead of hashing the eight
//! 0xFF bytes every time, the hasher starts from the CRC of those bytes,
//! [`ICRC_SEED`] (rxe starts its raw register from the equivalent pre-folded
//! 0xDEBB20E3). The masked headers are copied into a stack buffer; nothing is
//! allocated.
//!
//! Every function here takes the *IP packet* — the bytes from the first byte
//! of the IP header — and locates the ICRC from the IP length fields, never
//! from the end of the buffer (Ethernet pads short frames to 60 bytes).

use crate::{Error, Result, bth, ipv4, ipv6, udp};

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// CRC-32 of eight 0xFF bytes: the hasher state after the LRH stand-in
/// (`crc32fast::Hasher::new_with_initial(ICRC_SEED)` continues from there).
pub const ICRC_SEED: u32 = 0x2144_df1c;

const MAX_MASKED: usize = ipv6::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN;

/// Where the ICRC-covered bytes of an IP packet are.
struct Layout {
    /// Length of IP + UDP + BTH headers (the masked part).
    hdr_len: usize,
    /// End of the covered bytes (start of the ICRC) from the IP header start.
    icrc_off: usize,
    v6: bool,
}

fn layout(ip: &[u8]) -> Result<Layout> {
    let first = *ip.first().ok_or(Error::Truncated)?;
    let (ip_hdr, ip_end, v6) = match first >> 4 {
        4 => {
            let p = ipv4::Ipv4Packet::new_checked(ip)?;
            if p.header_len() != ipv4::HEADER_LEN {
                return Err(Error::Malformed);
            }
            (ipv4::HEADER_LEN, usize::from(p.total_len()), false)
        }
        6 => {
            let p = ipv6::Ipv6Packet::new_checked(ip)?;
            (
                ipv6::HEADER_LEN,
                ipv6::HEADER_LEN + usize::from(p.payload_len()),
                true,
            )
        }
        _ => return Err(Error::Malformed),
    };
    let hdr_len = ip_hdr + udp::HEADER_LEN + bth::HEADER_LEN;
    if ip_end < hdr_len + ICRC_LEN {
        return Err(Error::Malformed);
    }
    Ok(Layout {
        hdr_len,
        icrc_off: ip_end - ICRC_LEN,
        v6,
    })
}

/// Stored and computed ICRC for a packet whose layout the caller already
/// validated (`ip[..icrc_off + 4]` exists, `hdr_len` = IP + UDP + BTH).
pub(crate) fn stored_and_computed_at(ip: &[u8], v6: bool, icrc_off: usize) -> (u32, u32) {
    let ip_hdr = if v6 {
        ipv6::HEADER_LEN
    } else {
        ipv4::HEADER_LEN
    };
    let l = Layout {
        hdr_len: ip_hdr + udp::HEADER_LEN + bth::HEADER_LEN,
        icrc_off,
        v6,
    };
    let s = &ip[l.icrc_off..l.icrc_off + ICRC_LEN];
    (u32::from_le_bytes([s[0], s[1], s[2], s[3]]), crc_of(ip, &l))
}

/// Computes and stores the ICRC of a packet whose layout the caller built
/// (`ip[..icrc_off + 4]` exists).
pub(crate) fn fill_at(ip: &mut [u8], v6: bool, icrc_off: usize) -> u32 {
    let ip_hdr = if v6 {
        ipv6::HEADER_LEN
    } else {
        ipv4::HEADER_LEN
    };
    let l = Layout {
        hdr_len: ip_hdr + udp::HEADER_LEN + bth::HEADER_LEN,
        icrc_off,
        v6,
    };
    let v = crc_of(ip, &l);
    ip[icrc_off..icrc_off + ICRC_LEN].copy_from_slice(&v.to_le_bytes());
    v
}

/// The reflected CRC-32 polynomial (IEEE 802.3).
const POLY: u32 = 0xEDB8_8320;

/// Raw CRC register (initial 0, no final XOR) of the single byte `b`.
const fn raw_byte(b: u8) -> u32 {
    let mut r = b as u32;
    let mut i = 0;
    while i < 8 {
        r = if r & 1 != 0 { (r >> 1) ^ POLY } else { r >> 1 };
        i += 1;
    }
    r
}

/// `a · b mod P` in the reflected representation (zlib `multmodp`).
const fn mul_mod(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0u32;
    while m != 0 {
        if a & m != 0 {
            p ^= b;
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
    p
}

/// Table of the raw CRC of byte `b` followed by `k` zero bytes: `raw_byte(b) · x^(8k) mod P`.
const fn shifted_table(k: usize) -> [u32; 256] {
    // x^(8k) mod P: x^0 is bit 31; each zero bit multiplies by x.
    let mut x = 1u32 << 31;
    let mut i = 0;
    while i < 8 * k {
        x = if x & 1 != 0 { (x >> 1) ^ POLY } else { x >> 1 };
        i += 1;
    }
    let mut t = [0u32; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = mul_mod(x, raw_byte(b as u8));
        b += 1;
    }
    t
}

/// Distances (bytes between a byte and the end of the masked IP + UDP + BTH headers) of the fields a header
/// template patches per packet: BTH PSN, A bit, DestQP, flags, opcode; UDP length and source port; IPv4 total
/// length; IPv6 payload length.
const SHIFTS: [usize; 17] = [0, 1, 2, 3, 4, 5, 6, 10, 11, 14, 15, 18, 19, 36, 37, 54, 55];

/// `TABLES[i]` is `shifted_table(SHIFTS[i])`.
static TABLES: [[u32; 256]; SHIFTS.len()] = {
    let mut t = [[0u32; 256]; SHIFTS.len()];
    let mut i = 0;
    while i < SHIFTS.len() {
        t[i] = shifted_table(SHIFTS[i]);
        i += 1;
    }
    t
};

/// Offsets (from the IP header start) of the per-packet header bytes, by IP version, with their table index.
const fn patch_points(v6: bool) -> [(usize, usize); 15] {
    let ip_hdr = if v6 {
        ipv6::HEADER_LEN
    } else {
        ipv4::HEADER_LEN
    };
    let n = ip_hdr + udp::HEADER_LEN + bth::HEADER_LEN;
    let udp = ip_hdr;
    let bth = ip_hdr + udp::HEADER_LEN;
    // IP length field: IPv4 total length at 2..4, IPv6 payload length at 4..6.
    let ip_len = if v6 { 4 } else { 2 };
    let offs = [
        ip_len,
        ip_len + 1,
        udp,
        udp + 1,
        udp + 4,
        udp + 5,
        bth,
        bth + 1,
        bth + 5,
        bth + 6,
        bth + 7,
        bth + 8,
        bth + 9,
        bth + 10,
        bth + 11,
    ];
    let mut out = [(0usize, 0usize); 15];
    let mut i = 0;
    while i < offs.len() {
        let k = n - 1 - offs[i];
        let mut j = 0;
        while SHIFTS[j] != k {
            j += 1;
        }
        out[i] = (offs[i], j);
        i += 1;
    }
    out
}

#[cfg(test)]
const POINTS_V4: [(usize, usize); 15] = patch_points(false);
#[cfg(test)]
const POINTS_V6: [(usize, usize); 15] = patch_points(true);

/// The ICRC hasher state after the masked IP + UDP + BTH headers of `ip`, derived from `base` — the state after
/// the masked headers of `image`, a packet of the same IP version — by CRC linearity: for equal lengths
/// `crc(a) ^ crc(b) = raw(a ^ b)`, and `a ^ b` is zero outside the per-packet fields (lengths, UDP source port,
/// BTH opcode / flags / DestQP / A / PSN), whose contributions come from precomputed tables (15 lookups instead
/// of hashing 40–60 masked bytes). Both slices hold at least the IP + UDP + BTH headers; every other header byte
/// of `ip` must equal `image`'s, or the result is wrong (debug builds check).
#[inline]
pub(crate) fn header_state(base: u32, image: &[u8], ip: &[u8], v6: bool) -> u32 {
    if v6 {
        patch::<true, { ipv6::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN }>(base, image, ip)
    } else {
        patch::<false, { ipv4::HEADER_LEN + udp::HEADER_LEN + bth::HEADER_LEN }>(base, image, ip)
    }
}

/// [`header_state`] for headers of exactly `N` bytes: one length check, then 15 table lookups at offsets and
/// tables known at compile time (the loop unrolls; no bounds checks remain).
#[inline(always)]
fn patch<const V6: bool, const N: usize>(base: u32, image: &[u8], ip: &[u8]) -> u32 {
    let (Some(image), Some(ip)) = (image.first_chunk::<N>(), ip.first_chunk::<N>()) else {
        return base;
    };
    let points = const { patch_points(V6) };
    let mut s = base;
    let mut k = 0;
    while k < points.len() {
        let (off, t) = points[k];
        s ^= TABLES[t][usize::from(ip[off] ^ image[off])];
        k += 1;
    }
    s
}

/// The ICRC hasher state after the masked IP + UDP + BTH headers of `ip` (hashed in full).
pub(crate) fn header_state_full(ip: &[u8], v6: bool) -> u32 {
    let ip_hdr = if v6 {
        ipv6::HEADER_LEN
    } else {
        ipv4::HEADER_LEN
    };
    let l = Layout {
        hdr_len: ip_hdr + udp::HEADER_LEN + bth::HEADER_LEN,
        icrc_off: ip_hdr + udp::HEADER_LEN + bth::HEADER_LEN,
        v6,
    };
    crc_of(ip, &l)
}

/// Writes the ICRC of a packet whose header state the caller computed ([`header_state`]): hashes the bytes from
/// the BTH end to `icrc_off` (extension headers, payload, pad) and stores the value at `icrc_off`.
pub(crate) fn fill_from(ip: &mut [u8], v6: bool, state: u32, icrc_off: usize) -> u32 {
    let hdr_len = if v6 {
        ipv6::HEADER_LEN
    } else {
        ipv4::HEADER_LEN
    } + udp::HEADER_LEN
        + bth::HEADER_LEN;
    let mut h = crc32fast::Hasher::new_with_initial(state);
    h.update(&ip[hdr_len..icrc_off]);
    let v = h.finalize();
    ip[icrc_off..icrc_off + ICRC_LEN].copy_from_slice(&v.to_le_bytes());
    v
}

/// Hashes the masked headers and the rest of the covered bytes.
fn crc_of(ip: &[u8], l: &Layout) -> u32 {
    let mut masked = [0u8; MAX_MASKED];
    let m = &mut masked[..l.hdr_len];
    m.copy_from_slice(&ip[..l.hdr_len]);
    let ip_hdr = if l.v6 {
        // Traffic class + flow label: everything in the first word but the version.
        m[0] |= 0x0F;
        m[1] = 0xFF;
        m[2] = 0xFF;
        m[3] = 0xFF;
        m[ipv6::HOP_LIMIT_OFFSET] = 0xFF;
        ipv6::HEADER_LEN
    } else {
        m[ipv4::TOS_OFFSET] = 0xFF;
        m[ipv4::TTL_OFFSET] = 0xFF;
        m[ipv4::CHECKSUM_OFFSET] = 0xFF;
        m[ipv4::CHECKSUM_OFFSET + 1] = 0xFF;
        ipv4::HEADER_LEN
    };
    m[ip_hdr + udp::CHECKSUM_OFFSET] = 0xFF;
    m[ip_hdr + udp::CHECKSUM_OFFSET + 1] = 0xFF;
    m[ip_hdr + udp::HEADER_LEN + bth::RESV8A_OFFSET] = 0xFF;
    let mut h = crc32fast::Hasher::new_with_initial(ICRC_SEED);
    h.update(m);
    h.update(&ip[l.hdr_len..l.icrc_off]);
    h.finalize()
}

/// Computes the ICRC of an IP packet (IPv4 without options, or IPv6) carrying
/// UDP + BTH. `ip` starts at the IP header; its length fields say where the
/// ICRC sits (trailing bytes are ignored). Returns the CRC value; its wire
/// form is `value.to_le_bytes()`.
///
/// # Errors
/// [`Error::Truncated`] if the buffer is shorter than the IP length says;
/// [`Error::Malformed`] if the version is not 4/6, IPv4 has options, or the IP
/// length leaves no room for UDP + BTH + ICRC.
pub fn compute(ip: &[u8]) -> Result<u32> {
    let l = layout(ip)?;
    Ok(crc_of(ip, &l))
}

/// The ICRC stored in an IP packet (decoded little-endian).
///
/// # Errors
/// As [`compute`].
pub fn stored(ip: &[u8]) -> Result<u32> {
    let l = layout(ip)?;
    let s = &ip[l.icrc_off..l.icrc_off + ICRC_LEN];
    Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// The stored ICRC and the computed one, in one pass over the layout.
///
/// # Errors
/// As [`compute`].
pub fn stored_and_computed(ip: &[u8]) -> Result<(u32, u32)> {
    let l = layout(ip)?;
    let s = &ip[l.icrc_off..l.icrc_off + ICRC_LEN];
    Ok((u32::from_le_bytes([s[0], s[1], s[2], s[3]]), crc_of(ip, &l)))
}

/// Checks the stored ICRC. Under `cfg(fuzzing)` the check always passes so a
/// fuzzer reaches the transport logic (STYLE W6).
///
/// # Errors
/// [`Error::BadIcrc`] on mismatch; otherwise as [`compute`].
pub fn verify(ip: &[u8]) -> Result<()> {
    let l = layout(ip)?;
    let s = &ip[l.icrc_off..l.icrc_off + ICRC_LEN];
    let stored = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    if cfg!(fuzzing) || crc_of(ip, &l) == stored {
        Ok(())
    } else {
        Err(Error::BadIcrc)
    }
}

/// Computes the ICRC and writes it (little-endian) into its place, as given
/// by the IP length fields. Returns the value.
///
/// # Errors
/// As [`compute`].
pub fn fill(ip: &mut [u8]) -> Result<u32> {
    let l = layout(ip)?;
    let v = crc_of(ip, &l);
    ip[l.icrc_off..l.icrc_off + ICRC_LEN].copy_from_slice(&v.to_le_bytes());
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> std::vec::Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    // ROCEV2.md §3 worked example (vector rc_send_only_v4).
    const FRAME: &str = "0200000000020200000000010800456a003c010040004011b543c0000201c0000202c13212b7002800000400ffff0000001280000000000102030405060708090a0b0c0d0e0f966aa432";

    #[test]
    fn seed_is_crc_of_eight_ff() {
        let mut h = crc32fast::Hasher::new();
        h.update(&[0xFF; 8]);
        assert_eq!(h.finalize(), ICRC_SEED);
        // Continuing from the seed equals hashing the prefix.
        let mut a = crc32fast::Hasher::new();
        a.update(&[0xFF; 8]);
        a.update(b"abc");
        let mut b = crc32fast::Hasher::new_with_initial(ICRC_SEED);
        b.update(b"abc");
        assert_eq!(a.finalize(), b.finalize());
    }

    #[test]
    fn worked_example() {
        let f = hex(FRAME);
        let ip = &f[14..];
        assert_eq!(compute(ip).unwrap(), 0x32a4_6a96);
        assert_eq!(stored(ip).unwrap(), 0x32a4_6a96);
        verify(ip).unwrap();
        // The pseudo-header of ROCEV2.md §3, hashed with plain zlib-style CRC.
        let pseudo = hex(concat!(
            "ffffffffffffffff",
            "45ff003c01004000ff11ffffc0000201c0000202",
            "c13212b70028ffff",
            "0400ffffff00001280000000",
            "000102030405060708090a0b0c0d0e0f"
        ));
        assert_eq!(crc32fast::hash(&pseudo), 0x32a4_6a96);
    }

    #[test]
    fn masked_fields_and_padding() {
        let f = hex(FRAME);
        let mut ip = f[14..].to_vec();
        ip[1] = 0x6b; // CE
        ip[8] = 1; // TTL
        ip[10] = 0;
        ip[11] = 0; // IP checksum
        ip[26] = 0x12; // UDP checksum
        ip[28 + 4] = 0x40; // BECN
        ip.extend_from_slice(&[0, 0]); // Ethernet padding after the ICRC
        verify(&ip).unwrap();
        ip[5] ^= 1; // IP ID is covered
        assert_eq!(verify(&ip), Err(Error::BadIcrc));
    }

    #[test]
    fn fill_roundtrip() {
        let f = hex(FRAME);
        let mut ip = f[14..].to_vec();
        let n = ip.len();
        ip[n - 4..].fill(0);
        assert_eq!(fill(&mut ip).unwrap(), 0x32a4_6a96);
        assert_eq!(&ip[..], &f[14..]);
    }

    #[test]
    fn header_state_patches_every_per_packet_field() {
        let f = hex(FRAME);
        let image = f[14..].to_vec();
        let base = header_state_full(&image, false);
        for (v6, points) in [(false, &POINTS_V4), (true, &POINTS_V6)] {
            // An IPv6-shaped buffer: the arithmetic only cares about offsets.
            let image: std::vec::Vec<u8> = if v6 {
                (0..80u8).map(|b| b.wrapping_mul(37)).collect()
            } else {
                image.clone()
            };
            let base = if v6 {
                header_state_full(&image, true)
            } else {
                base
            };
            for &(off, _) in points {
                for delta in [1u8, 0x80, 0xff, 0x5a] {
                    let mut ip = image.clone();
                    ip[off] ^= delta;
                    assert_eq!(
                        header_state(base, &image, &ip, v6),
                        header_state_full(&ip, v6),
                        "v6 {v6} offset {off} delta {delta:#x}"
                    );
                }
            }
            // All fields at once.
            let mut ip = image.clone();
            for (k, &(off, _)) in points.iter().enumerate() {
                ip[off] = ip[off].wrapping_add(k as u8 * 17 + 1);
            }
            assert_eq!(
                header_state(base, &image, &ip, v6),
                header_state_full(&ip, v6)
            );
        }
    }

    #[test]
    fn bad_lengths() {
        let f = hex(FRAME);
        let ip = &f[14..];
        assert_eq!(compute(&ip[..30]), Err(Error::Truncated));
        assert_eq!(compute(&[]), Err(Error::Truncated));
        let mut short = ip.to_vec();
        short[2..4].copy_from_slice(&40u16.to_be_bytes()); // IP length < hdrs + ICRC
        assert_eq!(compute(&short), Err(Error::Malformed));
        let mut v5 = ip.to_vec();
        v5[0] = 0x55;
        assert_eq!(compute(&v5), Err(Error::Malformed));
    }
}
