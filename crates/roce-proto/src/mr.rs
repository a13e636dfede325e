//! Memory-region table: key allocation, address translation, bounds and access checks, leases.
//!
//! The engine owns every MR buffer (STYLE §4 V2). A key is `(slot + 1) << 8 | generation` (like hardware keys:
//! the low byte changes when a slot is reused, so a stale key misses). The engine assigns each MR a virtual
//! address range of its own (4 KiB aligned, never reused while the engine lives), so SGE/RETH addresses are
//! translated exactly like an RNIC's MTT would. In-flight WRs hold a *lease* on each MR they name;
//! `dereg` fails with `Busy` while one is held, so the engine never reads or writes a freed buffer.

use core::any::Any;
use core::fmt;

use crate::verbs::{AccessFlags, Lkey, MrInfo, PdHandle, Rkey};

/// Byte memory that can back a memory region: any owned, `Send` buffer that can lend its bytes as one contiguous
/// slice (`Box<[u8]>`, `Vec<u8>`, or a driver's mapping such as `roce_verbs::HugePageBuffer`).
///
/// The engine takes ownership of the value at [`Engine::reg_mr`](crate::Engine::reg_mr) and calls these two
/// methods on every access (one dynamic call per SGE/packet, no allocation); it never asks the buffer to grow.
///
/// Contract: both methods return slices of the **same length**, and that length never changes while the engine owns
/// the value (it is read once at registration and becomes [`MrInfo::length`]). A buffer that breaks this cannot make
/// the engine touch memory outside the slice it returned (the crate has no `unsafe`), but the engine may panic.
pub trait MrMemory: Any + Send {
    /// The whole buffer, read-only.
    fn as_slice(&self) -> &[u8];
    /// The whole buffer, writable.
    fn as_mut_slice(&mut self) -> &mut [u8];
}

impl MrMemory for Box<[u8]> {
    fn as_slice(&self) -> &[u8] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }
}

impl MrMemory for Vec<u8> {
    fn as_slice(&self) -> &[u8] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }
}

/// The buffer of a memory region: a boxed [`MrMemory`] of any type.
///
/// [`Engine::reg_mr`](crate::Engine::reg_mr) takes `impl Into<MrBuffer>`, so existing callers pass `Vec<u8>`,
/// `Box<[u8]>`, `&[u8]` (copied) or `[u8; N]` as before, and any other [`MrMemory`] converts too (e.g. a huge-page
/// mapping). [`Engine::dereg_mr`](crate::Engine::dereg_mr) gives it back; [`MrBuffer::downcast`] recovers the
/// concrete type.
pub struct MrBuffer(Box<dyn MrMemory>);

impl MrBuffer {
    /// Wraps `mem` (one allocation for the box; none afterwards).
    pub fn new<M: MrMemory>(mem: M) -> Self {
        MrBuffer(Box::new(mem))
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.as_slice().len()
    }

    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes, read-only.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        self.0.as_slice()
    }

    /// The bytes, writable.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.0.as_mut_slice()
    }

    /// The concrete buffer type, if it is `M`.
    pub fn downcast_ref<M: MrMemory>(&self) -> Option<&M> {
        let any: &dyn Any = &*self.0;
        any.downcast_ref::<M>()
    }

    /// Takes the concrete buffer back out; `Err(self)` if it is not an `M`.
    pub fn downcast<M: MrMemory>(self) -> Result<M, Self> {
        if self.downcast_ref::<M>().is_none() {
            return Err(self);
        }
        let any: Box<dyn Any> = self.0;
        any.downcast::<M>().map(|b| *b).map_err(|_| {
            // Unreachable: the type was checked above. Keep an empty buffer rather than panic.
            MrBuffer::new(Vec::new())
        })
    }

    /// The boxed trait object.
    pub fn into_inner(self) -> Box<dyn MrMemory> {
        self.0
    }
}

impl fmt::Debug for MrBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MrBuffer")
            .field("len", &self.len())
            .finish()
    }
}

impl<M: MrMemory> From<M> for MrBuffer {
    fn from(mem: M) -> Self {
        MrBuffer::new(mem)
    }
}

impl From<Box<dyn MrMemory>> for MrBuffer {
    fn from(mem: Box<dyn MrMemory>) -> Self {
        MrBuffer(mem)
    }
}

impl From<&[u8]> for MrBuffer {
    /// Copies the bytes into a new `Box<[u8]>`.
    fn from(bytes: &[u8]) -> Self {
        MrBuffer::new(Box::<[u8]>::from(bytes))
    }
}

impl<const N: usize> From<[u8; N]> for MrBuffer {
    fn from(bytes: [u8; N]) -> Self {
        MrBuffer::new(Box::<[u8]>::from(bytes))
    }
}

/// Why an access was refused (mapped by callers to LOC_PROT_ERR / NAK remote access error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MrFault {
    /// Key does not name a live MR (or the rkey was invalidated).
    BadKey,
    /// MR belongs to another PD.
    WrongPd,
    /// Range outside the MR.
    OutOfBounds,
    /// Missing permission.
    Access,
}

#[derive(Debug)]
pub(crate) struct Mr {
    pub(crate) pd: PdHandle,
    pub(crate) addr: u64,
    pub(crate) buf: MrBuffer,
    /// `buf.len()` at registration (the bounds every check uses).
    pub(crate) len: usize,
    pub(crate) access: AccessFlags,
    key: u32,
    leases: u32,
    rkey_valid: bool,
}

/// A resolved reference into an MR: slot index and byte offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrRef {
    pub(crate) slot: u32,
    pub(crate) offset: usize,
}

#[derive(Debug, Default)]
pub(crate) struct MrTable {
    slots: Vec<Option<Mr>>,
    gens: Vec<u8>,
    free: Vec<u32>,
    next_va: u64,
    live: u32,
}

const VA_BASE: u64 = 0x7f00_0000_0000;

impl MrTable {
    pub(crate) fn new() -> Self {
        MrTable {
            next_va: VA_BASE,
            ..Default::default()
        }
    }

    pub(crate) fn len(&self) -> u32 {
        self.live
    }

    pub(crate) fn register(&mut self, pd: PdHandle, buf: MrBuffer, access: AccessFlags) -> MrInfo {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.gens.push(0);
                (self.slots.len() - 1) as u32
            }
        };
        let g = &mut self.gens[slot as usize];
        *g = g.wrapping_add(1);
        let key = ((slot + 1) << 8) | u32::from(*g);
        let addr = self.next_va;
        let blen = buf.len();
        let len = blen as u64;
        // Keep a guard page between MRs so an off-by-one never lands in a neighbour.
        self.next_va = self
            .next_va
            .saturating_add(len.div_ceil(4096).saturating_add(1).saturating_mul(4096));
        self.slots[slot as usize] = Some(Mr {
            pd,
            addr,
            buf,
            len: blen,
            access,
            key,
            leases: 0,
            rkey_valid: true,
        });
        self.live += 1;
        MrInfo {
            lkey: Lkey(key),
            rkey: Rkey(key),
            addr,
            length: len,
        }
    }

    fn slot_of(&self, key: u32) -> Option<u32> {
        let slot = (key >> 8).checked_sub(1)?;
        match self.slots.get(slot as usize) {
            Some(Some(mr)) if mr.key == key => Some(slot),
            _ => None,
        }
    }

    pub(crate) fn get(&self, lkey: Lkey) -> Option<&Mr> {
        let s = self.slot_of(lkey.0)?;
        self.slots[s as usize].as_ref()
    }

    pub(crate) fn get_mut(&mut self, lkey: Lkey) -> Option<&mut Mr> {
        let s = self.slot_of(lkey.0)?;
        self.slots[s as usize].as_mut()
    }

    pub(crate) fn deregister(&mut self, lkey: Lkey) -> Result<MrBuffer, crate::ResourceError> {
        let s = self
            .slot_of(lkey.0)
            .ok_or(crate::ResourceError::InvalidHandle("lkey"))?;
        let mr = self.slots[s as usize]
            .as_ref()
            .ok_or(crate::ResourceError::InvalidHandle("lkey"))?;
        if mr.leases > 0 {
            return Err(crate::ResourceError::Busy("MR has in-flight work requests"));
        }
        let mr = self.slots[s as usize]
            .take()
            .ok_or(crate::ResourceError::InvalidHandle("lkey"))?;
        self.free.push(s);
        self.live -= 1;
        Ok(mr.buf)
    }

    pub(crate) fn pd_in_use(&self, pd: PdHandle) -> bool {
        self.slots.iter().flatten().any(|m| m.pd == pd)
    }

    fn check(
        &self,
        key: u32,
        pd: PdHandle,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MrRef, MrFault> {
        let slot = self.slot_of(key).ok_or(MrFault::BadKey)?;
        let mr = self.slots[slot as usize].as_ref().ok_or(MrFault::BadKey)?;
        if mr.pd != pd {
            return Err(MrFault::WrongPd);
        }
        let off = addr.checked_sub(mr.addr).ok_or(MrFault::OutOfBounds)?;
        let end = off.checked_add(len).ok_or(MrFault::OutOfBounds)?;
        if end > mr.len as u64 {
            return Err(MrFault::OutOfBounds);
        }
        if !mr.access.contains(need) {
            return Err(MrFault::Access);
        }
        Ok(MrRef {
            slot,
            offset: off as usize,
        })
    }

    /// Local check for an SGE (`need` = LOCAL_WRITE for scatter, empty for gather).
    pub(crate) fn check_local(
        &self,
        lkey: Lkey,
        pd: PdHandle,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MrRef, MrFault> {
        self.check(lkey.0, pd, addr, len, need)
    }

    /// Remote check for RETH/AtomicETH (`ROCEV2.md §5`: R_Key/range/permission).
    pub(crate) fn check_remote(
        &self,
        rkey: Rkey,
        pd: PdHandle,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MrRef, MrFault> {
        let r = self.check(rkey.0, pd, addr, len, need)?;
        match &self.slots[r.slot as usize] {
            Some(mr) if mr.rkey_valid => Ok(r),
            _ => Err(MrFault::BadKey),
        }
    }

    /// SEND_WITH_INV: invalidate `rkey` for remote access. Returns false if it names no MR of `pd`.
    pub(crate) fn invalidate_rkey(&mut self, rkey: Rkey, pd: PdHandle) -> bool {
        match self.slot_of(rkey.0) {
            Some(s) => match &mut self.slots[s as usize] {
                Some(mr) if mr.pd == pd && mr.rkey_valid => {
                    mr.rkey_valid = false;
                    true
                }
                _ => false,
            },
            None => false,
        }
    }

    pub(crate) fn lease(&mut self, slot: u32) {
        if let Some(Some(mr)) = self.slots.get_mut(slot as usize) {
            mr.leases += 1;
        }
    }

    pub(crate) fn release(&mut self, slot: u32) {
        if let Some(Some(mr)) = self.slots.get_mut(slot as usize) {
            debug_assert!(mr.leases > 0);
            mr.leases = mr.leases.saturating_sub(1);
        }
    }

    /// Bytes at a checked reference (empty slice if the reference went stale, which a lease prevents).
    pub(crate) fn bytes(&self, r: MrRef, len: usize) -> &[u8] {
        match self.slots.get(r.slot as usize) {
            Some(Some(mr)) => mr
                .buf
                .as_slice()
                .get(r.offset..r.offset.saturating_add(len))
                .unwrap_or(&[]),
            _ => &[],
        }
    }

    pub(crate) fn bytes_mut(&mut self, r: MrRef, len: usize) -> &mut [u8] {
        match self.slots.get_mut(r.slot as usize) {
            Some(Some(mr)) => mr
                .buf
                .as_mut_slice()
                .get_mut(r.offset..r.offset.saturating_add(len))
                .unwrap_or(&mut []),
            _ => &mut [],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A foreign buffer type: bytes behind a page-like offset, to prove the engine uses only the trait.
    struct Offset {
        raw: Vec<u8>,
        start: usize,
    }

    impl MrMemory for Offset {
        fn as_slice(&self) -> &[u8] {
            &self.raw[self.start..]
        }
        fn as_mut_slice(&mut self) -> &mut [u8] {
            &mut self.raw[self.start..]
        }
    }

    #[test]
    fn mr_buffer_conversions_and_downcast() {
        let b: MrBuffer = vec![1u8, 2, 3].into();
        assert_eq!(b.as_slice(), &[1, 2, 3]);
        assert_eq!(format!("{b:?}"), "MrBuffer { len: 3 }");
        let b = b
            .downcast::<Box<[u8]>>()
            .expect_err("a Vec is not a Box<[u8]>");
        assert_eq!(b.downcast::<Vec<u8>>().ok(), Some(vec![1, 2, 3]));
        let b: MrBuffer = (&[4u8, 5][..]).into();
        assert_eq!(
            b.downcast_ref::<Box<[u8]>>().map(|x| &x[..]),
            Some(&[4u8, 5][..])
        );
        let mut b: MrBuffer = [0u8; 4].into();
        b.as_mut_slice()[3] = 9;
        assert_eq!(b.as_slice(), &[0, 0, 0, 9]);
        let b: MrBuffer = MrBuffer::from(Box::new(Vec::<u8>::new()) as Box<dyn MrMemory>);
        assert!(b.is_empty());
        assert_eq!(b.into_inner().as_slice().len(), 0);
    }

    #[test]
    fn engine_uses_any_mr_memory() {
        let mut e = crate::Engine::new(crate::EngineConfig::default());
        let pd = e.alloc_pd().unwrap();
        let mem = Offset {
            raw: (0..100u8).collect(),
            start: 36,
        };
        let mr = e.reg_mr(pd, mem, AccessFlags::LOCAL_WRITE).unwrap();
        assert_eq!(mr.length, 64);
        let mut out = [0u8; 3];
        e.mr_read(mr.lkey, 0, &mut out).unwrap();
        assert_eq!(out, [36, 37, 38]);
        e.mr_write(mr.lkey, 62, &[7, 8]).unwrap();
        assert!(e.mr_write(mr.lkey, 63, &[7, 8]).is_err(), "past the end");
        assert_eq!(e.mr_bytes(mr.lkey).map(|b| b[63]), Some(8));
        let back = e
            .dereg_mr(mr.lkey)
            .unwrap()
            .downcast::<Offset>()
            .ok()
            .unwrap();
        assert_eq!(&back.raw[98..], &[7, 8]);
        assert_eq!(
            back.raw[..36],
            (0..36u8).collect::<Vec<_>>()[..],
            "bytes before the slice untouched"
        );
    }

    #[test]
    fn keys_bounds_access_and_leases() {
        let mut t = MrTable::new();
        let pd = PdHandle(1);
        let a = t.register(
            pd,
            vec![0u8; 100].into_boxed_slice().into(),
            AccessFlags::LOCAL_WRITE,
        );
        let b = t.register(pd, vec![0u8; 10].into(), AccessFlags::REMOTE_READ);
        assert_ne!(a.lkey, b.lkey);
        assert!(b.addr >= a.addr + 100 + 4096 - 100, "guard gap between MRs");
        assert_eq!(
            t.check_local(a.lkey, pd, a.addr, 100, AccessFlags::LOCAL_WRITE)
                .map(|r| r.offset),
            Ok(0)
        );
        assert_eq!(
            t.check_local(a.lkey, pd, a.addr + 1, 100, AccessFlags::EMPTY),
            Err(MrFault::OutOfBounds)
        );
        assert_eq!(
            t.check_local(a.lkey, pd, a.addr - 1, 1, AccessFlags::EMPTY),
            Err(MrFault::OutOfBounds)
        );
        assert_eq!(
            t.check_local(a.lkey, pd, u64::MAX, 2, AccessFlags::EMPTY),
            Err(MrFault::OutOfBounds)
        );
        assert_eq!(
            t.check_local(a.lkey, PdHandle(2), a.addr, 1, AccessFlags::EMPTY),
            Err(MrFault::WrongPd)
        );
        assert_eq!(
            t.check_remote(a.rkey, pd, a.addr, 1, AccessFlags::REMOTE_READ),
            Err(MrFault::Access)
        );
        assert!(
            t.check_remote(b.rkey, pd, b.addr, 10, AccessFlags::REMOTE_READ)
                .is_ok()
        );
        assert!(t.invalidate_rkey(b.rkey, pd));
        assert_eq!(
            t.check_remote(b.rkey, pd, b.addr, 10, AccessFlags::REMOTE_READ),
            Err(MrFault::BadKey)
        );
        let r = t
            .check_local(a.lkey, pd, a.addr, 1, AccessFlags::EMPTY)
            .unwrap();
        t.lease(r.slot);
        assert!(matches!(
            t.deregister(a.lkey),
            Err(crate::ResourceError::Busy(_))
        ));
        t.release(r.slot);
        assert_eq!(t.deregister(a.lkey).map(|b| b.len()), Ok(100));
        assert!(t.deregister(a.lkey).is_err());
        // The slot is reused with a new generation: the stale key misses.
        let c = t.register(pd, [0u8; 1].into(), AccessFlags::EMPTY);
        assert_ne!(c.lkey, a.lkey);
        assert_eq!(
            t.check_local(a.lkey, pd, c.addr, 1, AccessFlags::EMPTY),
            Err(MrFault::BadKey)
        );
    }
}
