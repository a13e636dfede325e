//! Memory-region table: key allocation, address translation, bounds and access checks, leases.
//!
//! The engine holds every MR's memory as a boxed [`MrMemory`] (STYLE §4 V2) and reaches it only through range-scoped
//! copies and atomics, so the memory may be the application's (roce-verbs `MrBuf`, raw registrations). A key is `(slot + 1) << 8 | generation` (like hardware keys:
//! the low byte changes when a slot is reused, so a stale key misses). The engine assigns each MR a virtual
//! address range of its own (4 KiB aligned, never reused while the engine lives), so SGE/RETH addresses are
//! translated exactly like an RNIC's MTT would. In-flight WRs hold a *lease* on each MR they name;
//! `dereg` fails with `Busy` while one is held, so the engine never reads or writes a freed buffer.

use core::any::Any;
use core::fmt;

use crate::verbs::{AccessFlags, Lkey, MrInfo, PdHandle, Rkey};
use roce_wire::Qpn;

/// Byte memory that can back a memory region, reached only through **range-scoped** operations: the engine never
/// asks for a slice of the whole region, so the bytes may belong to the application (which keeps using them, as with
/// `ibv_reg_mr`), to a driver's mapping, or to the engine itself (`Vec<u8>`, `Box<[u8]>`: tests, simulations).
///
/// The engine takes the value at [`Engine::reg_mr`](crate::Engine::reg_mr) (boxed as an [`MrBuffer`]) and calls
/// these methods on every access: one dynamic call per SGE piece / packet, no allocation.
///
/// # Contract
///
/// * [`len`](Self::len) is fixed: it is read once at registration and becomes [`MrInfo::length`].
/// * The engine only passes ranges inside `0..len()`: every SGE, RETH and AtomicETH range is checked against the MR
///   before any access (`ROCEV2.md §5`). Implementations may panic on a range outside (roce-verbs' raw memory does,
///   so a defect can never reach bytes outside the region); they must not touch bytes outside the range.
/// * Reads for transmit go straight into the frame buffer ([`read_at`](Self::read_at) with the payload area of the
///   frame as `dst`), and a link that gathers payload itself can use [`base_ptr`](Self::base_ptr) and hash the range
///   with [`crc32_update`](Self::crc32_update) instead, so the engine never copies a payload twice.
/// * Writes take `&mut self`: the engine holds the value exclusively. Memory the application shares with the engine
///   implements them through raw pointers scoped to the written range (see `roce_verbs::MrBuf`).
/// * The engine may read the same range again (go-back-N retransmission, READ response replay) until the WR that
///   named it has completed, and writes a receive/READ/WRITE target range only while a WR or a remote access covers
///   it. That the application leaves those bytes alone meanwhile is the RNIC contract (IBTA Vol 1 §10.7.2.1 and
///   §11.4.1.1: a buffer is not to be modified between post and completion), documented for users in roce-verbs.
/// * Atomics ([`compare_swap_u64`](Self::compare_swap_u64), [`fetch_add_u64`](Self::fetch_add_u64)) act on the 8
///   bytes at `offset`, which hold the value in little-endian order (as a hardware RNIC on x86/ARM writes it; see
///   the crate docs), and return the value before the operation. The defaults do a read-modify-write through
///   [`read_at`](Self::read_at) / [`write_at`](Self::write_at), which is atomic with respect to the engine (it holds
///   `&mut self`); shared memory overrides them with real atomic instructions.
/// * Every access may fail with [`MemoryFault`] (memory the application unmapped or protected: roce-verbs' copies
///   survive the fault and report it); the engine then fails the WR or the remote request as an RNIC does on a
///   translation fault (see [`MemoryFault`]). Memory the engine owns never fails.
pub trait MrMemory: Any + Send {
    /// Length in bytes (constant while registered).
    fn len(&self) -> usize;

    /// True for a zero-length region.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `dst.len()` bytes starting at byte `offset` into `dst`. Errors: [`MemoryFault`] if the memory behind the
    /// range cannot be read (some of `dst` may have been written).
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryFault>;

    /// Copies `src` into the region starting at byte `offset`. Errors: [`MemoryFault`] if the memory behind the range
    /// cannot be written (some bytes may have been).
    fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), MemoryFault>;

    /// Feeds the `len` bytes at `offset` into `hasher` (the ICRC of a frame whose payload a link gathers straight
    /// from this memory). The default copies through a 256-byte stack buffer; memory the engine owns overrides it
    /// to hash in place. Errors: [`MemoryFault`] as [`read_at`](Self::read_at) (the hash is then meaningless).
    fn crc32_update(
        &self,
        offset: usize,
        len: usize,
        hasher: &mut crc32fast::Hasher,
    ) -> Result<(), MemoryFault> {
        let mut tmp = [0u8; 256];
        let mut done = 0usize;
        while done < len {
            let n = (len - done).min(tmp.len());
            self.read_at(offset + done, &mut tmp[..n])?;
            hasher.update(&tmp[..n]);
            done += n;
        }
        Ok(())
    }

    /// 64-bit compare-and-swap of the little-endian word at `offset`: stores `swap` if it equals `compare`. Returns
    /// the value before (IBTA §9.4.5 CmpSwap). Errors: [`MemoryFault`] as [`write_at`](Self::write_at).
    fn compare_swap_u64(
        &mut self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryFault> {
        let mut b = [0u8; 8];
        self.read_at(offset, &mut b)?;
        let orig = u64::from_le_bytes(b);
        if orig == compare {
            self.write_at(offset, &swap.to_le_bytes())?;
        }
        Ok(orig)
    }

    /// 64-bit fetch-and-add (wrapping) of the little-endian word at `offset`. Returns the value before (IBTA §9.4.5
    /// FetchAdd). Errors: [`MemoryFault`] as [`write_at`](Self::write_at).
    fn fetch_add_u64(&mut self, offset: usize, add: u64) -> Result<u64, MemoryFault> {
        let mut b = [0u8; 8];
        self.read_at(offset, &mut b)?;
        let orig = u64::from_le_bytes(b);
        self.write_at(offset, &orig.wrapping_add(add).to_le_bytes())?;
        Ok(orig)
    }

    /// RDMA ATOMIC WRITE (IBTA Vol 1 1.5 §9.4.6): stores `value` into the little-endian word at `offset` in one
    /// piece, so no reader sees a mix of old and new bytes. The default is a compare-and-swap loop over
    /// [`fetch_add_u64`](Self::fetch_add_u64) (an atomic read with 0) and [`compare_swap_u64`](Self::compare_swap_u64),
    /// atomic wherever those are. Errors: [`MemoryFault`] as [`write_at`](Self::write_at).
    fn atomic_write_u64(&mut self, offset: usize, value: u64) -> Result<(), MemoryFault> {
        let mut cur = self.fetch_add_u64(offset, 0)?;
        loop {
            let prev = self.compare_swap_u64(offset, cur, value)?;
            if prev == cur {
                return Ok(());
            }
            cur = prev;
        }
    }

    /// Address of byte 0, for a link that gathers payload straight from the memory (iovecs): creating the pointer is
    /// safe, dereferencing it is the link's `unsafe`. `None` (the default) when the memory is not one contiguous
    /// mapping; the link then asks the engine to copy ([`read_at`](Self::read_at)).
    ///
    /// Validity: bytes `0..len()` are readable through the pointer while the MR is registered, subject to the RNIC
    /// contract above. For `Vec<u8>` / `Box<[u8]>` (whose writes re-borrow the whole buffer mutably) the pointer is
    /// only valid until the engine's next write to the region; memory whose writes go through raw pointers
    /// (roce-verbs `MrBuf`, raw registrations) keeps it valid until deregistration.
    fn base_ptr(&self) -> Option<*const u8> {
        None
    }
}

/// The memory behind an MR range could not be accessed: the application unmapped or protected pages it registered
/// (roce-verbs' fault-tolerant copies report it instead of crashing, issue #21). An RNIC meets the same as a
/// translation fault; the engine answers as rxe does (`rxe_resp.c`, `rxe_comp.c`): a remote request → NAK remote
/// access error (receive: NAK remote operational error, the receive WR completes LOC_PROT_ERR); a local WR's
/// gather or a READ/atomic response target → the WR completes LOC_PROT_ERR. Either way the QP goes to the error
/// state, and the QP's and the port's `mr_fault` counters count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryFault;

impl fmt::Display for MemoryFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("registered memory could not be accessed (unmapped or protected)")
    }
}

impl std::error::Error for MemoryFault {}

/// `MrMemory` for a byte container the engine owns outright (`Vec<u8>`, `Box<[u8]>`): slices, no `unsafe`.
macro_rules! owned_mr_memory {
    ($t:ty) => {
        impl MrMemory for $t {
            fn len(&self) -> usize {
                <[u8]>::len(self)
            }
            #[inline]
            fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryFault> {
                dst.copy_from_slice(&self[offset..offset + dst.len()]);
                Ok(())
            }
            #[inline]
            fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), MemoryFault> {
                self[offset..offset + src.len()].copy_from_slice(src);
                Ok(())
            }
            fn crc32_update(
                &self,
                offset: usize,
                len: usize,
                hasher: &mut crc32fast::Hasher,
            ) -> Result<(), MemoryFault> {
                hasher.update(&self[offset..offset + len]);
                Ok(())
            }
            fn base_ptr(&self) -> Option<*const u8> {
                Some(self.as_ptr())
            }
        }
    };
}

owned_mr_memory!(Box<[u8]>);
owned_mr_memory!(Vec<u8>);

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
        self.0.len()
    }

    /// True when the buffer has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The memory.
    #[inline]
    pub fn memory(&self) -> &dyn MrMemory {
        &*self.0
    }

    /// The memory, writable.
    #[inline]
    pub fn memory_mut(&mut self) -> &mut dyn MrMemory {
        &mut *self.0
    }

    /// A copy of all bytes (tests, diagnostics); all zero if the memory faulted ([`MemoryFault`]).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        if self.0.read_at(0, &mut v).is_err() {
            v.fill(0);
        }
        v
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
}

impl Mr {
    /// True while a WR or responder resource holds a lease.
    pub(crate) fn leased(&self) -> bool {
        self.leases > 0
    }
}

/// A resolved reference into an MR: slot index and byte offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrRef {
    pub(crate) slot: u32,
    pub(crate) offset: usize,
}

#[derive(Debug, Default)]
pub(crate) struct MrTable {
    /// The memory windows (their keys are resolved by [`check_remote`](Self::check_remote) too).
    pub(crate) mws: crate::mw::MwTable,
    slots: Vec<Option<Mr>>,
    gens: Vec<u8>,
    free: Vec<u32>,
    next_va: u64,
    live: u32,
    /// Bytes copied out of MR memory by [`read`](Self::read) (transmit payload, inline capture, READ responses).
    pub(crate) bytes_read: core::cell::Cell<u64>,
    /// Bytes copied into MR memory by [`write`](Self::write) (received payload, UD GRH, atomic results).
    pub(crate) bytes_written: u64,
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

    /// Registers `buf`; its virtual address is `iova` if given (the caller checked that `iova + len` does not
    /// overflow), else a fresh engine-assigned range.
    ///
    /// The key is the slot index + 1 in bits 31..8 (what finds the MR without a search) and a key byte in bits 7..0
    /// (IBTA Vol 1 §10.6.3.1: the consumer-owned "key" portion of an L_Key/R_Key, which verbs providers vary so that
    /// a stale key is rejected): here the slot's previous key byte advanced by `1 + random % 255`, so the new key is
    /// never the slot's previous one (a deregistered key is rejected at once) and is not guessable from it (a blind
    /// peer cannot walk keys in sequence).
    pub(crate) fn register(
        &mut self,
        pd: PdHandle,
        buf: MrBuffer,
        access: AccessFlags,
        iova: Option<u64>,
        random: u64,
    ) -> MrInfo {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(None);
                self.gens.push(0);
                (self.slots.len() - 1) as u32
            }
        };
        let g = &mut self.gens[slot as usize];
        *g = g.wrapping_add(1 + (random % 255) as u8);
        let key = ((slot + 1) << 8) | u32::from(*g);
        let blen = buf.len();
        let len = blen as u64;
        let addr = match iova {
            Some(a) => a,
            None => {
                let a = self.next_va;
                // Keep a guard page between MRs so an off-by-one never lands in a neighbour.
                self.next_va = self
                    .next_va
                    .saturating_add(len.div_ceil(4096).saturating_add(1).saturating_mul(4096));
                a
            }
        };
        self.slots[slot as usize] = Some(Mr {
            pd,
            addr,
            buf,
            len: blen,
            access,
            key,
            leases: 0,
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

    /// The slot of a live key (what the leases of WQEs that name it refer to).
    pub(crate) fn slot(&self, lkey: Lkey) -> Option<u32> {
        self.slot_of(lkey.0)
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
        self.mws.unbind_mr(mr.key);
        self.free.push(s);
        self.live -= 1;
        Ok(mr.buf)
    }

    pub(crate) fn pd_in_use(&self, pd: PdHandle) -> bool {
        self.slots.iter().flatten().any(|m| m.pd == pd) || self.mws.pd_in_use(pd)
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

    /// Remote check for RETH/AtomicETH (`ROCEV2.md §5`: R_Key/range/permission) by QP `qpn` of PD `pd`; a memory
    /// window's key is checked against the window first (`crate::mw`).
    pub(crate) fn check_remote(
        &self,
        rkey: Rkey,
        pd: PdHandle,
        qpn: Qpn,
        addr: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MrRef, MrFault> {
        if rkey.0 & crate::mw::MW_KEY_BIT != 0 {
            return self.check_remote_mw(rkey, pd, qpn, addr, len, need);
        }
        self.check(rkey.0, pd, addr, len, need)
    }

    /// A SEND with invalidate received on QP `qpn` of PD `pd`: invalidates `rkey`, a type 2 window's key
    /// (`crate::mw`). Returns false if it names nothing of `pd` that can be invalidated: an R_Key of a memory region
    /// registered with `ibv_reg_mr` cannot be (IBTA Vol 1 §10.6.7: remote invalidation applies to type 2 windows
    /// and fast-registered regions, which rocev2 does not have; rxe `rxe_invalidate_mr` refuses user MRs too), so a
    /// peer cannot revoke another client's access to a shared MR.
    pub(crate) fn invalidate_remote(&mut self, rkey: Rkey, pd: PdHandle, qpn: Qpn) -> bool {
        rkey.0 & crate::mw::MW_KEY_BIT != 0 && self.invalidate_mw_remote(rkey, pd, qpn)
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

    /// The memory of a live slot (`None` if the reference went stale, which a lease prevents).
    #[inline]
    fn mem(&self, slot: u32) -> Option<&Mr> {
        match self.slots.get(slot as usize) {
            Some(Some(mr)) => Some(mr),
            _ => None,
        }
    }

    #[inline]
    fn mem_mut(&mut self, slot: u32) -> Option<&mut Mr> {
        match self.slots.get_mut(slot as usize) {
            Some(Some(mr)) => Some(mr),
            _ => None,
        }
    }

    /// True if `len` bytes at `r` lie inside the MR (re-checked at every access, so a stale or corrupted reference
    /// can never reach a buffer outside its range, whatever the memory's own checks).
    #[inline]
    fn fits(mr: &Mr, r: MrRef, len: usize) -> bool {
        r.offset.checked_add(len).is_some_and(|end| end <= mr.len)
    }

    /// Copies `dst.len()` bytes at a checked reference into `dst` (left unchanged if the reference went stale).
    /// Errors: [`MemoryFault`] (the application unmapped or protected the memory).
    #[inline]
    pub(crate) fn read(&self, r: MrRef, dst: &mut [u8]) -> Result<(), MemoryFault> {
        if let Some(mr) = self.mem(r.slot)
            && Self::fits(mr, r, dst.len())
            && !dst.is_empty()
        {
            mr.buf.0.read_at(r.offset, dst)?;
            self.bytes_read
                .set(self.bytes_read.get() + dst.len() as u64);
        }
        Ok(())
    }

    /// Address of the `len` bytes at a checked reference, for a link that gathers them itself
    /// ([`MrMemory::base_ptr`]); `None` if the memory has no contiguous mapping or the reference went stale.
    #[inline]
    pub(crate) fn ptr(&self, r: MrRef, len: usize) -> Option<*const u8> {
        let mr = self.mem(r.slot)?;
        if !Self::fits(mr, r, len) {
            return None;
        }
        mr.buf.0.base_ptr().map(|p| p.wrapping_add(r.offset))
    }

    /// Feeds the `len` bytes at a checked reference into `h` ([`MrMemory::crc32_update`]); nothing is hashed if
    /// the reference went stale. Errors: [`MemoryFault`].
    #[inline]
    pub(crate) fn crc32_update(
        &self,
        r: MrRef,
        len: usize,
        h: &mut crc32fast::Hasher,
    ) -> Result<(), MemoryFault> {
        match self.mem(r.slot) {
            Some(mr) if Self::fits(mr, r, len) => mr.buf.0.crc32_update(r.offset, len, h),
            _ => Ok(()),
        }
    }

    /// Copies `src` into the MR at a checked reference (nothing if the reference went stale). Errors: [`MemoryFault`].
    #[inline]
    pub(crate) fn write(&mut self, r: MrRef, src: &[u8]) -> Result<(), MemoryFault> {
        if let Some(mr) = self.mem_mut(r.slot)
            && Self::fits(mr, r, src.len())
            && !src.is_empty()
        {
            mr.buf.0.write_at(r.offset, src)?;
            self.bytes_written += src.len() as u64;
        }
        Ok(())
    }

    /// 64-bit compare-and-swap at a checked reference ([`MrMemory::compare_swap_u64`]); the value before, or 0 if the
    /// reference went stale. Errors: [`MemoryFault`].
    pub(crate) fn compare_swap(
        &mut self,
        r: MrRef,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryFault> {
        match self.mem_mut(r.slot) {
            Some(mr) if Self::fits(mr, r, 8) => mr.buf.0.compare_swap_u64(r.offset, compare, swap),
            _ => Ok(0),
        }
    }

    /// RDMA ATOMIC WRITE of `bytes` (memory order) at a checked reference ([`MrMemory::atomic_write_u64`]); nothing
    /// if the reference went stale. Errors: [`MemoryFault`].
    pub(crate) fn atomic_write(&mut self, r: MrRef, bytes: [u8; 8]) -> Result<(), MemoryFault> {
        match self.mem_mut(r.slot) {
            Some(mr) if Self::fits(mr, r, 8) => {
                mr.buf
                    .0
                    .atomic_write_u64(r.offset, u64::from_le_bytes(bytes))?;
                self.bytes_written += 8;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// 64-bit fetch-and-add at a checked reference ([`MrMemory::fetch_add_u64`]); the value before, or 0 if the
    /// reference went stale. Errors: [`MemoryFault`].
    pub(crate) fn fetch_add(&mut self, r: MrRef, add: u64) -> Result<u64, MemoryFault> {
        match self.mem_mut(r.slot) {
            Some(mr) if Self::fits(mr, r, 8) => mr.buf.0.fetch_add_u64(r.offset, add),
            _ => Ok(0),
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

    /// Only the three required methods: the defaults (CRC, atomics, no base pointer) are what the engine uses.
    impl MrMemory for Offset {
        fn len(&self) -> usize {
            self.raw.len() - self.start
        }
        fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryFault> {
            let o = self.start + offset;
            dst.copy_from_slice(&self.raw[o..o + dst.len()]);
            Ok(())
        }
        fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), MemoryFault> {
            let o = self.start + offset;
            self.raw[o..o + src.len()].copy_from_slice(src);
            Ok(())
        }
    }

    #[test]
    fn default_methods_crc_and_atomics() {
        let mut m = Offset {
            raw: (0..=255u8).cycle().take(1000).collect(),
            start: 100,
        };
        assert_eq!(m.len(), 900);
        assert!(!m.is_empty() && m.base_ptr().is_none());
        // CRC over a range longer than the default's stack buffer equals hashing the bytes in place.
        let mut h = crc32fast::Hasher::new();
        m.crc32_update(7, 700, &mut h).expect("owned memory");
        let mut want = crc32fast::Hasher::new();
        want.update(&m.raw[107..807]);
        assert_eq!(h.finalize(), want.finalize());
        let v: Vec<u8> = m.raw[100..].to_vec();
        let mut h = crc32fast::Hasher::new();
        v.crc32_update(7, 700, &mut h).expect("owned memory");
        assert_eq!(h.finalize(), crc32fast::hash(&m.raw[107..807]));
        assert_eq!(v.base_ptr(), Some(v.as_ptr()));
        // Atomics: little-endian words, value before returned.
        m.write_at(8, &5u64.to_le_bytes()).expect("owned memory");
        assert_eq!(m.compare_swap_u64(8, 4, 9), Ok(5), "no swap on mismatch");
        assert_eq!(m.compare_swap_u64(8, 5, 9), Ok(5));
        assert_eq!(m.fetch_add_u64(8, u64::MAX), Ok(9), "wrapping add");
        let mut b = [0u8; 8];
        m.read_at(8, &mut b).expect("owned memory");
        assert_eq!(u64::from_le_bytes(b), 8);
        assert_eq!(&m.raw[..100], &(0..100u8).collect::<Vec<_>>()[..]);
    }

    #[test]
    fn mr_buffer_conversions_and_downcast() {
        let b: MrBuffer = vec![1u8, 2, 3].into();
        assert_eq!(b.to_vec(), &[1, 2, 3]);
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
        b.memory_mut().write_at(3, &[9]).expect("owned memory");
        assert_eq!(b.to_vec(), &[0, 0, 0, 9]);
        assert_eq!(b.memory().len(), 4);
        let b: MrBuffer = MrBuffer::from(Box::new(Vec::<u8>::new()) as Box<dyn MrMemory>);
        assert!(b.is_empty());
        assert_eq!(b.into_inner().len(), 0);
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
        // An iova registration: the MR's addresses are the caller's.
        let iova = 0x1234_5000;
        let mr2 = e
            .reg_mr_iova(pd, vec![1u8; 16], AccessFlags::LOCAL_WRITE, iova)
            .unwrap();
        assert_eq!((mr2.addr, mr2.length), (iova, 16));
        assert!(
            e.reg_mr_iova(pd, vec![1u8; 16], AccessFlags::LOCAL_WRITE, u64::MAX - 8)
                .is_err(),
            "iova + length overflows"
        );
        e.dereg_mr(mr2.lkey).unwrap();
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
            None,
            0x1234,
        );
        let b = t.register(
            pd,
            vec![0u8; 10].into(),
            AccessFlags::REMOTE_READ,
            None,
            0x99,
        );
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
            t.check_remote(a.rkey, pd, Qpn::new(1), a.addr, 1, AccessFlags::REMOTE_READ),
            Err(MrFault::Access)
        );
        assert!(
            t.check_remote(
                b.rkey,
                pd,
                Qpn::new(1),
                b.addr,
                10,
                AccessFlags::REMOTE_READ
            )
            .is_ok()
        );
        // A registered MR's R_Key cannot be invalidated by a peer (breaker finding: any client could revoke a
        // shared MR for good); it keeps granting access.
        assert!(!t.invalidate_remote(b.rkey, pd, Qpn::new(1)));
        assert!(
            t.check_remote(
                b.rkey,
                pd,
                Qpn::new(1),
                b.addr,
                10,
                AccessFlags::REMOTE_READ
            )
            .is_ok()
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
        let c = t.register(pd, [0u8; 1].into(), AccessFlags::EMPTY, None, 254);
        assert_ne!(c.lkey, a.lkey);
        assert_eq!(
            t.check_local(a.lkey, pd, c.addr, 1, AccessFlags::EMPTY),
            Err(MrFault::BadKey)
        );
    }

    /// Issue #21: keys are not guessable in sequence, and a slot's new key is never its previous one, whatever
    /// the random draw (including the draws that would wrap the key byte onto itself).
    #[test]
    fn key_bytes_are_random_and_never_repeat_a_slot_s_last_key() {
        let mut t = MrTable::new();
        let pd = PdHandle(1);
        let mut last = None;
        for r in [0u64, 254, 255, 256, 509, 510, u64::MAX, 7, 7] {
            let k = t
                .register(pd, [0u8; 1].into(), AccessFlags::EMPTY, None, r)
                .lkey;
            assert_eq!(k.0 >> 8, 1, "the same slot is reused");
            assert_ne!(Some(k), last, "draw {r}: the previous key came back");
            last = Some(k);
            assert!(t.deregister(k).is_ok());
        }
        // Two tables (engines) with different draws give different first keys: not 0x101 for everyone.
        let mut u = MrTable::new();
        let a = u
            .register(pd, [0u8; 1].into(), AccessFlags::EMPTY, None, 3)
            .rkey;
        let mut v = MrTable::new();
        let b = v
            .register(pd, [0u8; 1].into(), AccessFlags::EMPTY, None, 100)
            .rkey;
        assert_ne!(a, b);
    }
}
