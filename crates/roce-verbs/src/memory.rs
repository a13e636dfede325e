//! MR memory the application owns — and every `unsafe` the runtime needs for it (`STYLE-progress-memory.md` §1).
//!
//! A registered region is a [`Region`]: a base pointer and a length, shared (`Arc`) between the application's handle
//! ([`MrBuf`], or nothing for a raw registration) and the engine (through [`SharedMemory`], its
//! [`MrMemory`](roce_proto::MrMemory)). The engine (the "RNIC") reaches the bytes only with raw-pointer copies scoped
//! to the exact range a WR or a remote access names — it never forms a `&`/`&mut` to more than that range and holds
//! none between calls — the way a NIC's DMA reads and writes host memory.
//!
//! # The RNIC contract (what the application promises)
//!
//! * Bytes named by a posted WR (a send/WRITE source, a receive or READ/atomic target) are not written by the
//!   application between the post and the WR's completion, and a receive/READ target is not read before it either.
//!   The engine may read a send source **again** until the completion (go-back-N retransmission). IBTA Vol 1
//!   §10.7.2.1 / §11.4.1.1; libibverbs `ibv_post_send(3)`.
//! * Bytes that a peer may access through an rkey (an MR registered with REMOTE_WRITE / REMOTE_READ /
//!   REMOTE_ATOMIC) are not accessed by the application while the peer's operation runs; applications learn that an
//!   operation ended from the protocol they run on top (a SEND, an immediate, a flag byte the peer writes last).
//! * For [`Pd::reg_mr_raw`]: the memory stays valid (mapped, not freed, not reused for something else) until the MR
//!   is deregistered *and* every WR naming it has completed.
//!
//! An access that breaks the contract is a data race between the application and the engine: as with a hardware
//! RNIC, Rust cannot rule it out at compile time for memory the application uses as a plain slice. What the runtime
//! does guarantee: the memory cannot be freed while the engine may touch it (the engine co-owns the allocation;
//! `dereg` is refused while WRs use the MR), and the engine never touches a byte outside the registered range
//! (every range is checked against the MR, and again here).
//!
//! # Why plain copies (not volatile, not atomic-memcpy)
//!
//! The engine copies with `ptr::copy_nonoverlapping`. Volatile accesses would not make a racing access defined
//! (Rust's memory model treats a racing volatile access like any non-atomic one) and would block vectorised copies;
//! a byte-wise atomic memcpy (P1478, `atomic-memcpy`) is defined only if *both* sides use atomics, and the
//! application uses ordinary slices; both would cost a multiple of `memcpy` on the data path. What matters for an
//! application that waits for a byte the peer writes (perftest's WRITE latency test) is that its own reads are not
//! hoisted out of its wait loop: [`MrBuf::read_volatile`] gives that read. The 64-bit remote atomics use real atomic
//! instructions on 8-byte-aligned words, so an application may use `AtomicU64` views of such words concurrently.
//!
//! Miri: the unit tests below use only heap-backed regions so that `cargo +nightly miri test -p roce-verbs memory`
//! can check them; no Miri toolchain is installed on the development machine (see `docs/TESTING.md`).

use std::alloc::Layout;
use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use roce_proto::{AccessFlags, MrMemory};

use crate::hugepage::{HugePageBuffer, HugePagePolicy};

/// Alignment of [`MrBuf::new`] buffers: one 4 KiB page.
pub const PAGE_SIZE: usize = 4096;

/// Who frees the bytes of a [`Region`] when its last reference goes.
enum Owner {
    /// `std::alloc` with this layout.
    Heap(Layout),
    /// A huge-page (or fallback) mapping, unmapped on drop.
    Map(#[allow(dead_code)] HugePageBuffer),
    /// The application (raw registration): nothing to free.
    Foreign,
}

/// A registered byte range: base pointer, length, owner. Shared by the application's handle and the engine.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    owner: Owner,
    huge: bool,
}

// SAFETY: a `Region` is a pointer to plain bytes that are not tied to a thread (heap memory, an anonymous mapping,
// or memory whose validity the raw registration's caller promised); every access through it is a copy or an atomic
// operation, which is valid from any thread under the RNIC contract in the module docs.
unsafe impl Send for Region {}
// SAFETY: `&Region` only allows the same copies/atomics as above; concurrent calls on disjoint ranges do not
// conflict, and callers on overlapping ranges are excluded by the RNIC contract (module docs).
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        if let Owner::Heap(layout) = self.owner {
            // SAFETY: `ptr` came from `std::alloc::alloc_zeroed(layout)` in `Region::heap` and is freed only here, once
            // (the last `Arc` is going); no reference into the bytes outlives the region.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl Region {
    /// `len` zeroed bytes from the heap, aligned to [`PAGE_SIZE`] (at least one byte is allocated).
    fn heap(len: usize) -> io::Result<Region> {
        let layout = Layout::from_size_align(len.max(1), PAGE_SIZE).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes is too large for one buffer"),
            )
        })?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("allocating {len} bytes failed"),
            )
        })?;
        Ok(Region {
            ptr,
            len,
            owner: Owner::Heap(layout),
            huge: false,
        })
    }

    /// A huge-page (or fallback) mapping; the region takes ownership of it.
    fn mapped(mut map: HugePageBuffer) -> Region {
        let len = map.len();
        let huge = map.is_huge();
        // The mapping is at least one byte long, so its pointer is never null; `as_mut_slice` is the only reference
        // ever formed to it, and it ends here: from now on only raw pointers derived from this one are used.
        let ptr = NonNull::from(map.as_mut_slice()).cast::<u8>();
        Region {
            ptr,
            len,
            owner: Owner::Map(map),
            huge,
        }
    }

    /// Panics unless `off..off + n` lies inside the region (the engine checks every range before it asks; this is
    /// the last line that keeps a defect from reaching memory outside the registration).
    #[inline]
    fn check(&self, off: usize, n: usize) {
        assert!(
            off.checked_add(n).is_some_and(|end| end <= self.len),
            "MR access {off}+{n} outside a region of {} bytes",
            self.len
        );
    }

    /// Copies `dst.len()` bytes at `off` into `dst`.
    #[inline]
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        // SAFETY: the range is inside the region (checked), the region's memory is valid while `self` lives, and
        // `dst` is a distinct Rust buffer, so the ranges do not overlap. No reference to region memory is formed.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), dst.as_mut_ptr(), dst.len())
        };
    }

    /// Copies `src` into the region at `off`.
    #[inline]
    pub(crate) fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        // SAFETY: as in `read`; the region is writable memory (heap, a private anonymous mapping, or memory the
        // raw registration's caller declared writable), and `src` cannot overlap it unless the caller passed region
        // memory itself, which no caller in this crate does (sources are packets and application slices).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(off), src.len())
        };
    }

    /// Hashes `len` bytes at `off` in place.
    fn crc32_update(&self, off: usize, len: usize, hasher: &mut crc32fast::Hasher) {
        self.check(off, len);
        // SAFETY: the range is inside the valid region (checked). The shared slice covers exactly the bytes being
        // transmitted and lives only for this call; under the RNIC contract nobody writes those bytes meanwhile.
        let bytes = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off), len) };
        hasher.update(bytes);
    }

    /// The 8-byte word at `off` as an atomic, if it is 8-byte aligned in memory.
    fn atomic_at(&self, off: usize) -> Option<&AtomicU64> {
        self.check(off, 8);
        // SAFETY: inside the region (checked), so `add` stays in bounds.
        let p = unsafe { self.ptr.as_ptr().add(off) };
        if !(p as usize).is_multiple_of(8) {
            return None;
        }
        // SAFETY: `p` is valid for 8 bytes for the lifetime of `&self`, aligned to 8 (checked), and every engine
        // access to it goes through atomics; the application may use atomics on it too (module docs).
        Some(unsafe { AtomicU64::from_ptr(p.cast::<u64>()) })
    }

    /// Compare-and-swap of the little-endian word at `off`; the value before.
    fn compare_swap(&self, off: usize, compare: u64, swap: u64) -> u64 {
        if let Some(a) = self.atomic_at(off) {
            // Memory holds little-endian bytes; `to_le`/`from_le` map them to the native integer the CPU compares.
            return match a.compare_exchange(
                compare.to_le(),
                swap.to_le(),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(v) | Err(v) => u64::from_le(v),
            };
        }
        // Unaligned (only possible for a raw registration at an odd address): a plain read-modify-write.
        let mut b = [0u8; 8];
        self.read(off, &mut b);
        let orig = u64::from_le_bytes(b);
        if orig == compare {
            self.write(off, &swap.to_le_bytes());
        }
        orig
    }

    /// Wrapping fetch-and-add of the little-endian word at `off`; the value before.
    fn fetch_add(&self, off: usize, add: u64) -> u64 {
        if let Some(a) = self.atomic_at(off) {
            let r = a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(u64::from_le(v).wrapping_add(add).to_le())
            });
            return match r {
                Ok(v) | Err(v) => u64::from_le(v),
            };
        }
        let mut b = [0u8; 8];
        self.read(off, &mut b);
        let orig = u64::from_le_bytes(b);
        self.write(off, &orig.wrapping_add(add).to_le_bytes());
        orig
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub(crate) fn is_huge(&self) -> bool {
        self.huge
    }
}

/// The engine's view of a [`Region`]: an [`MrMemory`] whose every operation is a range-scoped raw copy or atomic.
pub(crate) struct SharedMemory(pub(crate) Arc<Region>);

impl MrMemory for SharedMemory {
    fn len(&self) -> usize {
        self.0.len
    }
    #[inline]
    fn read_at(&self, offset: usize, dst: &mut [u8]) {
        self.0.read(offset, dst);
    }
    #[inline]
    fn write_at(&mut self, offset: usize, src: &[u8]) {
        self.0.write(offset, src);
    }
    fn crc32_update(&self, offset: usize, len: usize, hasher: &mut crc32fast::Hasher) {
        self.0.crc32_update(offset, len, hasher);
    }
    fn compare_swap_u64(&mut self, offset: usize, compare: u64, swap: u64) -> u64 {
        self.0.compare_swap(offset, compare, swap)
    }
    fn fetch_add_u64(&mut self, offset: usize, add: u64) -> u64 {
        self.0.fetch_add(offset, add)
    }
    /// Valid until the MR is deregistered and its last WR completed (the region never moves, and its writes go
    /// through raw pointers, so the pointer is never invalidated by a re-borrow).
    fn base_ptr(&self) -> Option<*const u8> {
        Some(self.0.ptr.as_ptr().cast_const())
    }
}

/// A page-aligned, zeroed byte buffer the application owns and registers with [`Pd::reg_mr`](crate::Pd::reg_mr):
/// it reads and writes its data through the buffer as a slice (`Deref<Target = [u8]>`,
/// [`as_mut_slice`](Self::as_mut_slice)) while the engine reads and writes the same bytes as an RNIC's DMA would —
/// under the RNIC contract (a buffer is not changed between post and completion; see the crate docs).
///
/// The engine co-owns the memory while an MR covers it, so dropping the `MrBuf` early never frees bytes the engine
/// may still touch: the memory goes when the last of the buffer and its MRs goes. Optionally on 2 MiB huge pages
/// ([`hugepages`](Self::hugepages)).
pub struct MrBuf {
    region: Arc<Region>,
}

impl std::fmt::Debug for MrBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MrBuf")
            .field("len", &self.region.len)
            .field("huge", &self.region.huge)
            .finish_non_exhaustive()
    }
}

impl MrBuf {
    /// `len` zeroed bytes aligned to [`PAGE_SIZE`]. Errors: `InvalidInput` (too large for a layout), `OutOfMemory`.
    pub fn new(len: usize) -> io::Result<MrBuf> {
        Ok(MrBuf {
            region: Arc::new(Region::heap(len)?),
        })
    }

    /// A page-aligned copy of `bytes`.
    pub fn from_slice(bytes: &[u8]) -> io::Result<MrBuf> {
        let mut b = MrBuf::new(bytes.len())?;
        b.as_mut_slice().copy_from_slice(bytes);
        Ok(b)
    }

    /// `len` zeroed bytes on 2 MiB huge pages (perftest `--use_hugepages`); with [`HugePagePolicy::Prefer`] falls
    /// back to normal pages with a `tracing::warn!` when none are free ([`is_huge`](Self::is_huge) tells which).
    /// Errors: those of [`HugePageBuffer::alloc`].
    pub fn hugepages(len: usize, policy: HugePagePolicy) -> io::Result<MrBuf> {
        Ok(MrBuf {
            region: Arc::new(Region::mapped(HugePageBuffer::alloc(len, policy)?)),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.region.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.region.len == 0
    }

    /// True when the buffer is on hugetlb (2 MiB) pages.
    pub fn is_huge(&self) -> bool {
        self.region.huge
    }

    /// Address of byte 0 (the MR's `addr` when registered: SGEs and peers use these addresses).
    pub fn as_ptr(&self) -> *const u8 {
        self.region.ptr.as_ptr()
    }

    /// The bytes. Bytes that a WR in flight or a peer writes may change under the application only if it breaks
    /// the RNIC contract (crate docs); read them after the completion that says they are there.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the region is valid for `len` bytes while `self` holds its `Arc`. The engine never holds a
        // reference into it; it copies ranges named by WRs or by remote accesses the application granted, which the
        // application does not access meanwhile (RNIC contract, module docs), so no engine write overlaps a read
        // through this slice.
        unsafe { std::slice::from_raw_parts(self.region.ptr.as_ptr(), self.region.len) }
    }

    /// The bytes, writable (the application's own stores, e.g. filling a send buffer before posting it).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only application reference (an `MrBuf` is not
        // `Clone`), and the engine's accesses are excluded from overlapping ones by the RNIC contract.
        unsafe { std::slice::from_raw_parts_mut(self.region.ptr.as_ptr(), self.region.len) }
    }

    /// Reads `dst.len()` bytes at `offset` with volatile loads, for a loop that waits for bytes a peer writes
    /// (perftest's WRITE latency test polls the last byte): each call really reads memory. Panics if the range is
    /// outside the buffer.
    pub fn read_volatile(&self, offset: usize, dst: &mut [u8]) {
        self.region.check(offset, dst.len());
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: inside the region (checked above); a byte load has no alignment requirement.
            *d = unsafe { std::ptr::read_volatile(self.region.ptr.as_ptr().add(offset + i)) };
        }
    }

    pub(crate) fn region(&self) -> &Arc<Region> {
        &self.region
    }
}

impl Deref for MrBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for MrBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl AsRef<[u8]> for MrBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsMut<[u8]> for MrBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl crate::Pd {
    /// `ibv_reg_mr` of memory the caller owns and manages itself (the C ABI's path). The MR's address is `addr`
    /// (as `ibv_reg_mr`: SGEs and peers use the caller's pointers). Errors as [`Pd::reg_mr`](crate::Pd::reg_mr).
    ///
    /// # Safety
    ///
    /// * `addr..addr + len` is memory of this process that is readable and (for any write access in `access`,
    ///   including receives and READ targets posted later) writable, and it stays so — not unmapped, freed, or
    ///   reused for other data — until this MR has been deregistered ([`Mr::dereg`](crate::Mr::dereg) succeeded, or
    ///   the last [`Mr`](crate::Mr) handle was dropped and the runtime deregistered it once its WRs completed) and
    ///   the context is gone or the deregistration has returned.
    /// * The application does not access bytes of in-flight WRs or bytes a peer is accessing (the RNIC contract in
    ///   the crate docs); data races there are the caller's undefined behaviour, as with a hardware RNIC.
    pub unsafe fn reg_mr_raw(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
    ) -> Result<crate::Mr, crate::Error> {
        let ptr = NonNull::new(addr).ok_or(crate::Error::InvalidArgument("null MR address"))?;
        if (addr as usize).checked_add(len).is_none() {
            return Err(crate::Error::InvalidArgument(
                "MR address + length overflows",
            ));
        }
        let region = Arc::new(Region {
            ptr,
            len,
            owner: Owner::Foreign,
            huge: false,
        });
        self.reg_region(region, access)
    }

    /// `ibv_reg_mr_iova2`: as [`reg_mr_raw`](Self::reg_mr_raw), but the MR's byte 0 has the virtual address `iova`
    /// (SGEs and peers name the memory by `iova + offset`; `addr` is only where the bytes are). Errors as
    /// `reg_mr_raw`, plus `InvalidArgument` if `iova + len` overflows 64 bits.
    ///
    /// # Safety
    ///
    /// As [`reg_mr_raw`](Self::reg_mr_raw).
    pub unsafe fn reg_mr_raw_iova(
        &self,
        addr: *mut u8,
        len: usize,
        access: AccessFlags,
        iova: u64,
    ) -> Result<crate::Mr, crate::Error> {
        let ptr = NonNull::new(addr).ok_or(crate::Error::InvalidArgument("null MR address"))?;
        if (addr as usize).checked_add(len).is_none() {
            return Err(crate::Error::InvalidArgument(
                "MR address + length overflows",
            ));
        }
        let region = Arc::new(Region {
            ptr,
            len,
            owner: Owner::Foreign,
            huge: false,
        });
        self.reg_region_at(region, access, iova)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_buffer_is_zeroed_aligned_and_shared_with_the_engine_view() {
        let mut b = MrBuf::new(10_000).expect("alloc");
        assert_eq!(b.len(), 10_000);
        assert!(!b.is_huge() && !b.is_empty());
        assert_eq!(b.as_ptr() as usize % PAGE_SIZE, 0, "page aligned");
        assert!(b.iter().all(|&x| x == 0), "zeroed");
        b[100..105].copy_from_slice(b"hello");
        // The engine's view sees the application's stores, and the application sees the engine's writes.
        let mut eng = SharedMemory(Arc::clone(b.region()));
        let mut out = [0u8; 5];
        eng.read_at(100, &mut out);
        assert_eq!(&out, b"hello");
        eng.write_at(9_995, b"world");
        assert_eq!(&b[9_995..], b"world");
        let mut v = [0u8; 5];
        b.read_volatile(9_995, &mut v);
        assert_eq!(&v, b"world");
        let mut h = crc32fast::Hasher::new();
        eng.crc32_update(100, 5, &mut h);
        assert_eq!(h.finalize(), crc32fast::hash(b"hello"));
        assert_eq!(eng.base_ptr(), Some(b.as_ptr()));
        // Dropping the application's handle first leaves the memory to the engine view.
        drop(b);
        eng.read_at(9_995, &mut out);
        assert_eq!(&out, b"world");
        let e = MrBuf::new(0).expect("empty");
        assert!(e.is_empty() && e.as_slice().is_empty());
        let c = MrBuf::from_slice(&[1, 2, 3]).expect("copy");
        assert_eq!(&c[..], &[1, 2, 3]);
        assert!(format!("{c:?}").contains("len: 3"));
    }

    #[test]
    fn atomics_are_little_endian_and_return_the_old_value() {
        let b = MrBuf::new(64).expect("alloc");
        let mut eng = SharedMemory(Arc::clone(b.region()));
        eng.write_at(8, &7u64.to_le_bytes());
        assert_eq!(eng.compare_swap_u64(8, 6, 1), 7, "mismatch: no swap");
        assert_eq!(eng.compare_swap_u64(8, 7, 1), 7);
        assert_eq!(eng.fetch_add_u64(8, u64::MAX), 1, "wrapping");
        assert_eq!(&b[8..16], &0u64.to_le_bytes());
        // Unaligned word (only a raw registration can have one): same results without atomics.
        eng.write_at(3, &41u64.to_le_bytes());
        assert_eq!(eng.fetch_add_u64(3, 1), 41);
        assert_eq!(eng.compare_swap_u64(3, 42, 5), 42);
        assert_eq!(&b[3..11], &5u64.to_le_bytes());
    }

    #[test]
    #[should_panic(expected = "outside a region")]
    fn out_of_range_access_panics_instead_of_touching_other_memory() {
        let b = MrBuf::new(16).expect("alloc");
        let mut eng = SharedMemory(Arc::clone(b.region()));
        eng.write_at(12, &[0u8; 5]);
    }

    #[test]
    fn offset_overflow_is_caught() {
        let b = MrBuf::new(16).expect("alloc");
        let eng = SharedMemory(Arc::clone(b.region()));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut x = [0u8; 2];
            eng.read_at(usize::MAX, &mut x);
        }));
        assert!(r.is_err());
    }
}
