//! The rsockets stream protocol of librdmacm (rdma-core `librdmacm/rsocket.c`, read for the facts, not copied):
//! what two rsockets exchange in the rdma_cm private data when they connect ([`ConnData`], 40 bytes) and in the
//! 32-bit immediate data of every RDMA WRITE WITH IMMEDIATE afterwards ([`Msg`]), and the scatter entry one side
//! writes into the other's target list to hand it receive buffer space ([`Sge`], 16 bytes).
//!
//! Flow control (rsocket.c `rs_send_credits`, `rs_poll_cq`): each side's receive buffer is split in two halves;
//! the connection data hands the peer the first half (`data_buf`) and `credits` receive WQEs; an [`OP_SGL`]
//! message later hands the next half (an [`Sge`] RDMA-written into the peer's target list, entry by entry
//! modulo `target_sgl.length`) and/or new credits: its data is the sender's receive sequence number plus its
//! receive queue size, taken modulo 2^16 ([`credit_limit`]). Data travels as RDMA WRITE WITH IMMEDIATE into the
//! peer's buffer with an [`OP_DATA`] message carrying the byte count; [`OP_CTRL`] messages (zero-length writes)
//! carry [`CTRL_DISCONNECT`] / [`CTRL_SHUTDOWN`].

use crate::field::{read_u16, read_u32, read_u64, write_u16, write_u32, write_u64};
use crate::{Error, Result};

/// Data: bits 28..0 are the bytes written.
pub const OP_DATA: u8 = 0;
/// Reserved (data, more to come).
pub const OP_RSVD_DATA_MORE: u8 = 1;
/// A direct write to an iomap (never sent on the wire as a message).
pub const OP_WRITE: u8 = 2;
/// Reserved (direct receive, more to come).
pub const OP_RSVD_DRA_MORE: u8 = 3;
/// Credits (and, when the write carried an [`Sge`], a new buffer half): bits 28..0 are the credit limit.
pub const OP_SGL: u8 = 4;
/// Reserved.
pub const OP_RSVD: u8 = 5;
/// An iomap entry was updated: bits 15..0 are its index.
pub const OP_IOMAP_SGL: u8 = 6;
/// Control: bits 28..0 are one of the `CTRL_*` values.
pub const OP_CTRL: u8 = 7;

/// [`OP_CTRL`]: the sender closed both directions.
pub const CTRL_DISCONNECT: u32 = 0;
/// [`OP_CTRL`]: keepalive (no effect on the receiver).
pub const CTRL_KEEPALIVE: u32 = 1;
/// [`OP_CTRL`]: the sender will send no more data (`shutdown(SHUT_WR)`).
pub const CTRL_SHUTDOWN: u32 = 2;

/// Largest value of a message's data field (29 bits).
pub const MSG_DATA_MAX: u32 = 0x1fff_ffff;

/// The immediate data of an rsocket message (host order; on the wire it is the big-endian IMMDT):
/// bits 31..29 the opcode (`OP_*`), bits 28..0 its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Msg {
    /// `OP_*` (0..=7).
    pub op: u8,
    /// 29 bits of data: a byte count, a credit limit or a `CTRL_*` value.
    pub data: u32,
}

impl Msg {
    /// The message `op` with `data` (data above 29 bits is cut to them, as rsocket.c's `rs_msg_set` leaves no
    /// room for more; callers keep byte counts ≤ 64 KiB and credit limits < 2^17).
    pub fn new(op: u8, data: u32) -> Self {
        Msg {
            op: op & 7,
            data: data & MSG_DATA_MAX,
        }
    }

    /// Decodes the immediate value (host order).
    pub fn from_imm(imm: u32) -> Self {
        Msg {
            op: (imm >> 29) as u8,
            data: imm & MSG_DATA_MAX,
        }
    }

    /// The immediate value (host order; put it into `ibv_send_wr.imm_data` big-endian).
    pub fn imm(self) -> u32 {
        (u32::from(self.op & 7) << 29) | (self.data & MSG_DATA_MAX)
    }
}

/// The credit limit an [`OP_SGL`] message carries: the receiver may send while its send sequence number (mod
/// 2^16) differs from it. `rseq_no` is the sender's count of data messages consumed, `rq_size` its receive
/// queue size (rsocket.c `rs_send_credits`).
pub fn credit_limit(rseq_no: u16, rq_size: u16) -> u32 {
    u32::from(rseq_no) + u32::from(rq_size)
}

/// Length of an [`Sge`] (`struct rs_sge`).
pub const SGE_LEN: usize = 16;

/// One receive-buffer region (`struct rs_sge`: addr, key, length). In the connection data it is big-endian; in
/// the target list, where the peer RDMA-writes it, it is in the writer's host order unless the connection data
/// said otherwise ([`FLAG_NET`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Virtual address of the region in the owner's memory.
    pub addr: u64,
    /// R_Key of the region.
    pub key: u32,
    /// Length in bytes (in a `target_sgl` of the connection data: the number of entries).
    pub length: u32,
}

impl Sge {
    /// Parses 16 bytes, big-endian when `big_endian`, else little-endian.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 16 bytes.
    pub fn parse(b: &[u8], big_endian: bool) -> Result<Self> {
        let b = b.get(..SGE_LEN).ok_or(Error::Truncated)?;
        let a: [u8; 8] = b[0..8].try_into().map_err(|_| Error::Truncated)?;
        let k: [u8; 4] = b[8..12].try_into().map_err(|_| Error::Truncated)?;
        let l: [u8; 4] = b[12..16].try_into().map_err(|_| Error::Truncated)?;
        Ok(if big_endian {
            Sge {
                addr: read_u64(&a),
                key: read_u32(&k),
                length: read_u32(&l),
            }
        } else {
            Sge {
                addr: u64::from_le_bytes(a),
                key: u32::from_le_bytes(k),
                length: u32::from_le_bytes(l),
            }
        })
    }

    /// Writes 16 bytes, big-endian when `big_endian`, else little-endian.
    ///
    /// # Errors
    /// [`Error::Truncated`] if `b` is shorter than 16 bytes.
    pub fn emit(&self, b: &mut [u8], big_endian: bool) -> Result<()> {
        let b = b.get_mut(..SGE_LEN).ok_or(Error::Truncated)?;
        if big_endian {
            write_u64(&mut b[0..8], self.addr);
            write_u32(&mut b[8..12], self.key);
            write_u32(&mut b[12..16], self.length);
        } else {
            b[0..8].copy_from_slice(&self.addr.to_le_bytes());
            b[8..12].copy_from_slice(&self.key.to_le_bytes());
            b[12..16].copy_from_slice(&self.length.to_le_bytes());
        }
        Ok(())
    }
}

/// Length of [`ConnData`] (`struct rs_conn_data`).
pub const CONN_DATA_LEN: usize = 40;
/// The only `version` rsockets speak.
pub const CONN_VERSION: u8 = 1;
/// [`ConnData::flags`]: the sender's host is big-endian (its target-list writes are big-endian).
pub const FLAG_NET: u8 = 1 << 0;
/// [`ConnData::flags`]: the sender has an iomap list after its target SGL.
pub const FLAG_IOMAP: u8 = 1 << 1;
/// Entries of a target SGL (`RS_SGL_SIZE`).
pub const SGL_SIZE: u32 = 2;

/// The rsocket connection data carried as rdma_cm private data in the REQ (after rdma_cm's own header) and in
/// the REP (`struct rs_conn_data`, 40 bytes, big-endian): version, flags, initial credits (the receive queue
/// size), the iomap size as a scale byte, the sender's target list (address, rkey, entry count) and the first
/// half of its receive buffer (address, rkey, length).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnData {
    /// [`CONN_VERSION`].
    pub version: u8,
    /// `FLAG_*`.
    pub flags: u8,
    /// Receive WQEs the sender posted: the peer's initial send limit.
    pub credits: u16,
    /// Iomap entries as rsocket.c's 8-bit scale (0 here: no iomap).
    pub target_iomap_size: u8,
    /// Where the peer writes [`Sge`]s for the sender (length = entries).
    pub target_sgl: Sge,
    /// The first receive-buffer region the peer may write data into.
    pub data_buf: Sge,
}

impl ConnData {
    /// Parses the first 40 bytes.
    ///
    /// # Errors
    /// [`Error::Truncated`] if fewer than 40 bytes; [`Error::Malformed`] if the version is not 1 (rsocket.c
    /// refuses the connection then) or the target list has no entry.
    pub fn parse(b: &[u8]) -> Result<Self> {
        let b = b.get(..CONN_DATA_LEN).ok_or(Error::Truncated)?;
        if b[0] != CONN_VERSION {
            return Err(Error::Malformed);
        }
        let c = ConnData {
            version: b[0],
            flags: b[1],
            credits: read_u16(&b[2..4]),
            target_iomap_size: b[7],
            target_sgl: Sge::parse(&b[8..24], true)?,
            data_buf: Sge::parse(&b[24..40], true)?,
        };
        if c.target_sgl.length == 0 {
            return Err(Error::Malformed);
        }
        Ok(c)
    }

    /// Writes the 40 bytes (reserved bytes zero).
    ///
    /// # Errors
    /// [`Error::Truncated`] if `b` is shorter than 40 bytes.
    pub fn emit(&self, b: &mut [u8]) -> Result<()> {
        let b = b.get_mut(..CONN_DATA_LEN).ok_or(Error::Truncated)?;
        b[0] = self.version;
        b[1] = self.flags;
        write_u16(&mut b[2..4], self.credits);
        b[4..7].fill(0);
        b[7] = self.target_iomap_size;
        self.target_sgl.emit(&mut b[8..24], true)?;
        self.data_buf.emit(&mut b[24..40], true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_encoding_matches_rsocket_c() {
        // rs_msg_set(RS_OP_DATA, 1000) = 1000; RS_OP_SGL is 4 << 29; RS_OP_CTRL | RS_CTRL_SHUTDOWN = 7 << 29 | 2.
        assert_eq!(Msg::new(OP_DATA, 1000).imm(), 1000);
        assert_eq!(Msg::new(OP_SGL, 384).imm(), 0x8000_0180);
        assert_eq!(Msg::new(OP_CTRL, CTRL_SHUTDOWN).imm(), 0xe000_0002);
        assert_eq!(Msg::new(OP_CTRL, CTRL_DISCONNECT).imm(), 0xe000_0000);
        for imm in [
            0u32,
            1,
            65536,
            0x8000_0180,
            0xe000_0002,
            0xc000_0007,
            u32::MAX,
        ] {
            assert_eq!(Msg::from_imm(imm).imm(), imm);
        }
        let m = Msg::from_imm(0xc000_0007);
        assert_eq!((m.op, m.data), (OP_IOMAP_SGL, 7));
        // Data beyond 29 bits cannot change the opcode.
        assert_eq!(Msg::new(OP_DATA, u32::MAX).op, OP_DATA);
    }

    #[test]
    fn credit_limit_wraps_as_the_receiver_reads_it() {
        // The receiver keeps the low 16 bits (rsocket.c stores `(uint16_t) rs_msg_data(msg)`).
        assert_eq!(credit_limit(0, 384), 384);
        let l = credit_limit(65500, 384);
        assert_eq!(l, 65884);
        assert_eq!(Msg::from_imm(Msg::new(OP_SGL, l).imm()).data as u16, 348);
    }

    #[test]
    fn conn_data_layout() {
        let c = ConnData {
            version: CONN_VERSION,
            flags: FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: Sge {
                addr: 0x1122_3344_5566_7788,
                key: 0xaabb_ccdd,
                length: SGL_SIZE,
            },
            data_buf: Sge {
                addr: 0x7f00_0000_1000,
                key: 0x0102_0304,
                length: 1 << 19,
            },
        };
        let mut b = [0xffu8; CONN_DATA_LEN];
        c.emit(&mut b).unwrap();
        assert_eq!(&b[..8], &[1, 2, 0x01, 0x80, 0, 0, 0, 0]);
        assert_eq!(&b[8..16], &0x1122_3344_5566_7788u64.to_be_bytes());
        assert_eq!(&b[16..20], &[0xaa, 0xbb, 0xcc, 0xdd]);
        assert_eq!(&b[20..24], &[0, 0, 0, 2]);
        assert_eq!(&b[36..40], &[0, 8, 0, 0]);
        assert_eq!(ConnData::parse(&b), Ok(c));
        assert_eq!(ConnData::parse(&b[..39]), Err(Error::Truncated));
        let mut v2 = b;
        v2[0] = 2;
        assert_eq!(ConnData::parse(&v2), Err(Error::Malformed));
        let mut empty = b;
        empty[20..24].fill(0);
        assert_eq!(ConnData::parse(&empty), Err(Error::Malformed));
    }

    #[test]
    fn sge_in_both_byte_orders() {
        let s = Sge {
            addr: 0x0102_0304_0506_0708,
            key: 0x0a0b_0c0d,
            length: 0x0001_0000,
        };
        let mut le = [0u8; SGE_LEN];
        s.emit(&mut le, false).unwrap();
        assert_eq!(le[0], 0x08);
        assert_eq!(Sge::parse(&le, false), Ok(s));
        let mut be = [0u8; SGE_LEN];
        s.emit(&mut be, true).unwrap();
        assert_eq!(be[0], 0x01);
        assert_eq!(Sge::parse(&be, true), Ok(s));
        assert_ne!(Sge::parse(&be, false), Ok(s));
        assert_eq!(Sge::parse(&be[..15], true), Err(Error::Truncated));
    }
}
