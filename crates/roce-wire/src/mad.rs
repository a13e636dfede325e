//! Management datagrams (MADs): the 24-byte common MAD header (IBTA Vol 1
//! §13.4, management datagrams; Linux `struct ib_mad_hdr` in `include/rdma/ib_mad.h`) over a 256-byte MAD, and how a MAD travels on
//! RoCE v2.
//!
//! A MAD is always 256 bytes: the common header (base version, management
//! class, class version, method, status, class-specific, transaction ID,
//! attribute ID, reserved, attribute modifier) followed by 232 bytes of class
//! data. The communication manager's messages (management class 0x07, class
//! version 2) are the class data of [`crate::cm`].
//!
//! On RoCE v2 a MAD of the general services interface (GSI) is the payload of
//! a UD SEND ONLY packet to QP1: BTH (opcode `UD_SEND_ONLY`, the P_Key of the
//! port, default `0xffff`) + DETH with the well-known GSI Q_Key
//! [`GSI_QKEY`] `0x8001_0000` (IBTA Vol 1 ch. 13, GSI; Linux
//! `IB_QP1_QKEY` in `include/rdma/ib_mad.h`) and the sender's QP number as
//! source QP (QP1 for the CM) + the 256 MAD bytes + ICRC. [`gsi_ud_repr`]
//! builds that [`crate::RoceRepr`].
//!
//! The view [`Mad`] and the value [`MadHeaderRepr`] follow the crate's panic
//! contract: after [`Mad::new_checked`] no accessor panics.

use core::fmt;

use crate::field::{self, Field};
use crate::{BthRepr, DethRepr, Error, ExtRepr, Opcode, Psn, Qpn, Result};

mod fld {
    use super::Field;
    pub(crate) const BASE_VERSION: usize = 0;
    pub(crate) const MGMT_CLASS: usize = 1;
    pub(crate) const CLASS_VERSION: usize = 2;
    pub(crate) const METHOD: usize = 3;
    pub(crate) const STATUS: Field = 4..6;
    pub(crate) const CLASS_SPECIFIC: Field = 6..8;
    pub(crate) const TID: Field = 8..16;
    pub(crate) const ATTR_ID: Field = 16..18;
    pub(crate) const RESV: Field = 18..20;
    pub(crate) const ATTR_MOD: Field = 20..24;
}

/// Length of the common MAD header in bytes.
pub const HEADER_LEN: usize = fld::ATTR_MOD.end;
/// Length of a whole MAD in bytes (IBTA Vol 1 §13.4: MADs are 256 bytes; Linux `IB_MGMT_MAD_SIZE`).
pub const MAD_LEN: usize = 256;
/// Length of the class data behind the common header.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;

/// The well-known Q_Key of QP1 (GSI), IBTA Vol 1 ch. 13 (Linux
/// `IB_QP1_QKEY`).
pub const GSI_QKEY: u32 = 0x8001_0000;
/// QP number of the general services interface.
pub const GSI_QPN: Qpn = Qpn::new(1);
/// The default partition key (full member), used on RoCE v2 unless the port
/// is configured otherwise.
pub const DEFAULT_PKEY: u16 = 0xffff;

/// `BaseVersion` of every MAD (Linux `IB_MGMT_BASE_VERSION`).
pub const BASE_VERSION: u8 = 1;
/// Management class of the communication manager (IBTA Vol 1 §13.4,
/// management class values; Linux `IB_MGMT_CLASS_CM`).
pub const MGMT_CLASS_CM: u8 = 0x07;
/// Class version of the CM messages this crate speaks (Linux
/// `IB_CM_CLASS_VERSION`).
pub const CM_CLASS_VERSION: u8 = 2;

/// MAD method values (IBTA Vol 1 §13.4; Linux `IB_MGMT_METHOD_*`). The top bit is the
/// response bit `R`. The CM sends all its messages with [`method::SEND`].
pub mod method {
    /// `Get()`.
    pub const GET: u8 = 0x01;
    /// `Set()`.
    pub const SET: u8 = 0x02;
    /// `Send()`: the method of every CM message (Linux `cm_format_mad_hdr`).
    pub const SEND: u8 = 0x03;
    /// `GetResp()`.
    pub const GET_RESP: u8 = 0x81;
}

field::fixed_view!(
    /// A read/write view of a 256-byte MAD: the common header and the class
    /// data (`check_len` requires all [`MAD_LEN`] bytes).
    Mad,
    MAD_LEN
);

impl<T: AsRef<[u8]>> Mad<T> {
    /// `BaseVersion` (1 for every MAD defined so far).
    #[inline]
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[fld::BASE_VERSION]
    }
    /// `MgmtClass` (0x07: communication management).
    #[inline]
    pub fn mgmt_class(&self) -> u8 {
        self.buffer.as_ref()[fld::MGMT_CLASS]
    }
    /// `ClassVersion` (2 for the CM).
    #[inline]
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[fld::CLASS_VERSION]
    }
    /// `R` bit and `Method` as one byte (see [`method`]).
    #[inline]
    pub fn method(&self) -> u8 {
        self.buffer.as_ref()[fld::METHOD]
    }
    /// `Status` (16 bits; 0 in CM messages).
    #[inline]
    pub fn status(&self) -> u16 {
        field::read_u16(&self.buffer.as_ref()[fld::STATUS])
    }
    /// `ClassSpecific` (16 bits).
    #[inline]
    pub fn class_specific(&self) -> u16 {
        field::read_u16(&self.buffer.as_ref()[fld::CLASS_SPECIFIC])
    }
    /// `TransactionID` (64 bits).
    #[inline]
    pub fn tid(&self) -> u64 {
        field::read_u64(&self.buffer.as_ref()[fld::TID])
    }
    /// `AttributeID` (16 bits; for the CM the message type, see
    /// [`crate::cm::attr`]).
    #[inline]
    pub fn attr_id(&self) -> u16 {
        field::read_u16(&self.buffer.as_ref()[fld::ATTR_ID])
    }
    /// `AttributeModifier` (32 bits; the CM carries the ECE options of REQ
    /// and REP here, Linux `cm_format_mad_ece_hdr`).
    #[inline]
    pub fn attr_mod(&self) -> u32 {
        field::read_u32(&self.buffer.as_ref()[fld::ATTR_MOD])
    }
    /// The [`DATA_LEN`] bytes of class data behind the header.
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..MAD_LEN]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Mad<T> {
    /// Sets `BaseVersion`.
    #[inline]
    pub fn set_base_version(&mut self, v: u8) {
        self.buffer.as_mut()[fld::BASE_VERSION] = v;
    }
    /// Sets `MgmtClass`.
    #[inline]
    pub fn set_mgmt_class(&mut self, v: u8) {
        self.buffer.as_mut()[fld::MGMT_CLASS] = v;
    }
    /// Sets `ClassVersion`.
    #[inline]
    pub fn set_class_version(&mut self, v: u8) {
        self.buffer.as_mut()[fld::CLASS_VERSION] = v;
    }
    /// Sets the `R` bit and `Method` byte.
    #[inline]
    pub fn set_method(&mut self, v: u8) {
        self.buffer.as_mut()[fld::METHOD] = v;
    }
    /// Sets `Status`.
    #[inline]
    pub fn set_status(&mut self, v: u16) {
        field::write_u16(&mut self.buffer.as_mut()[fld::STATUS], v);
    }
    /// Sets `ClassSpecific`.
    #[inline]
    pub fn set_class_specific(&mut self, v: u16) {
        field::write_u16(&mut self.buffer.as_mut()[fld::CLASS_SPECIFIC], v);
    }
    /// Sets `TransactionID`.
    #[inline]
    pub fn set_tid(&mut self, v: u64) {
        field::write_u64(&mut self.buffer.as_mut()[fld::TID], v);
    }
    /// Sets `AttributeID` (and clears the reserved 16 bits behind it).
    #[inline]
    pub fn set_attr_id(&mut self, v: u16) {
        let b = self.buffer.as_mut();
        field::write_u16(&mut b[fld::ATTR_ID], v);
        b[fld::RESV].fill(0);
    }
    /// Sets `AttributeModifier`.
    #[inline]
    pub fn set_attr_mod(&mut self, v: u32) {
        field::write_u32(&mut self.buffer.as_mut()[fld::ATTR_MOD], v);
    }
    /// The class data, writable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..MAD_LEN]
    }
}

/// The common MAD header as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MadHeaderRepr {
    /// `BaseVersion`.
    pub base_version: u8,
    /// `MgmtClass`.
    pub mgmt_class: u8,
    /// `ClassVersion`.
    pub class_version: u8,
    /// `R` bit and `Method`.
    pub method: u8,
    /// `Status`.
    pub status: u16,
    /// `ClassSpecific`.
    pub class_specific: u16,
    /// `TransactionID`.
    pub tid: u64,
    /// `AttributeID`.
    pub attr_id: u16,
    /// `AttributeModifier`.
    pub attr_mod: u32,
}

impl MadHeaderRepr {
    /// The header of a CM message: base version 1, class 0x07, class version
    /// 2, method `Send()`, status 0 (Linux `cm_format_mad_hdr`).
    pub const fn cm(attr_id: u16, tid: u64, attr_mod: u32) -> Self {
        MadHeaderRepr {
            base_version: BASE_VERSION,
            mgmt_class: MGMT_CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: method::SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id,
            attr_mod,
        }
    }

    /// Parses the header of a whole MAD (the reserved field is ignored).
    ///
    /// # Errors
    /// [`Error::Truncated`] if the view holds fewer than [`MAD_LEN`] bytes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(mad: &Mad<&T>) -> Result<Self> {
        mad.check_len()?;
        Ok(MadHeaderRepr {
            base_version: mad.base_version(),
            mgmt_class: mad.mgmt_class(),
            class_version: mad.class_version(),
            method: mad.method(),
            status: mad.status(),
            class_specific: mad.class_specific(),
            tid: mad.tid(),
            attr_id: mad.attr_id(),
            attr_mod: mad.attr_mod(),
        })
    }

    /// Emitted length: [`HEADER_LEN`] (24).
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header (the view must hold at least [`HEADER_LEN`] bytes;
    /// reserved bits are written as 0; the class data is left alone).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, mad: &mut Mad<T>) {
        mad.set_base_version(self.base_version);
        mad.set_mgmt_class(self.mgmt_class);
        mad.set_class_version(self.class_version);
        mad.set_method(self.method);
        mad.set_status(self.status);
        mad.set_class_specific(self.class_specific);
        mad.set_tid(self.tid);
        mad.set_attr_id(self.attr_id);
        mad.set_attr_mod(self.attr_mod);
    }

    /// True for base version 1, class 0x07, class version 2 (what the CM
    /// accepts; anything else is a counted drop there).
    pub const fn is_cm(&self) -> bool {
        self.base_version == BASE_VERSION
            && self.mgmt_class == MGMT_CLASS_CM
            && self.class_version == CM_CLASS_VERSION
    }
}

impl fmt::Display for MadHeaderRepr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MAD v{} class={:#04x} cv={} method={:#04x} status={:#06x} tid={:#018x} attr={:#06x} mod={:#x}",
            self.base_version,
            self.mgmt_class,
            self.class_version,
            self.method,
            self.status,
            self.tid,
            self.attr_id,
            self.attr_mod
        )
    }
}

/// The transport headers of a GSI datagram on RoCE v2 as a [`crate::RoceRepr`]
/// needs them: BTH `UD_SEND_ONLY` to `dest_qp` (QP1 for a CM peer) with
/// `pkey` and `psn`, and a DETH with the GSI Q_Key and `src_qp` (QP1 for the
/// CM). The payload is the [`MAD_LEN`]-byte MAD (a multiple of 4: no pad).
///
/// Source: IBTA Vol 1 ch. 13 (QP1 uses Q_Key 0x8001_0000) and
/// `docs/spec/LIBRDMACM-ABI.md` §5.
pub fn gsi_ud_repr(dest_qp: Qpn, src_qp: Qpn, pkey: u16, psn: Psn) -> (BthRepr, ExtRepr) {
    let bth = BthRepr {
        opcode: Opcode::UD_SEND_ONLY,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        pkey,
        fecn: false,
        becn: false,
        dest_qp,
        ack_req: false,
        psn,
    };
    let ext = ExtRepr {
        deth: Some(DethRepr {
            qkey: GSI_QKEY,
            src_qp,
        }),
        ..ExtRepr::NONE
    };
    (bth, ext)
}

/// Checks that `bytes` hold a whole MAD and returns the view.
///
/// # Errors
/// [`Error::Truncated`] when shorter than [`MAD_LEN`].
pub fn mad_view(bytes: &[u8]) -> Result<Mad<&[u8]>> {
    if bytes.len() < MAD_LEN {
        return Err(Error::Truncated);
    }
    Mad::new_checked(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> [u8; MAD_LEN] {
        let mut b = [0u8; MAD_LEN];
        b[..24].copy_from_slice(&[
            0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc,
            0xde, 0xf0, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x05,
        ]);
        b[24] = 0xaa;
        b
    }

    #[test]
    fn deconstruct() {
        let b = sample();
        let m = Mad::new_checked(&b[..]).unwrap();
        assert_eq!(m.base_version(), 1);
        assert_eq!(m.mgmt_class(), 0x07);
        assert_eq!(m.class_version(), 2);
        assert_eq!(m.method(), method::SEND);
        assert_eq!(m.tid(), 0x1234_5678_9abc_def0);
        assert_eq!(m.attr_id(), 0x0010);
        assert_eq!(m.attr_mod(), 5);
        assert_eq!(m.data().len(), DATA_LEN);
        assert_eq!(m.data()[0], 0xaa);
        let h = MadHeaderRepr::parse(&m).unwrap();
        assert_eq!(h, MadHeaderRepr::cm(0x10, 0x1234_5678_9abc_def0, 5));
        assert!(h.is_cm());
    }

    #[test]
    fn emit_matches_bytes() {
        let mut out = [0xffu8; MAD_LEN];
        let mut m = Mad::new_unchecked(&mut out[..]);
        MadHeaderRepr::cm(0x10, 0x1234_5678_9abc_def0, 5).emit(&mut m);
        assert_eq!(out[..24], sample()[..24]);
    }

    #[test]
    fn truncated_at_every_length() {
        let b = sample();
        for n in 0..MAD_LEN {
            assert_eq!(Mad::new_checked(&b[..n]).unwrap_err(), Error::Truncated);
            assert_eq!(mad_view(&b[..n]).unwrap_err(), Error::Truncated);
        }
        assert!(mad_view(&b[..]).is_ok());
    }
}
