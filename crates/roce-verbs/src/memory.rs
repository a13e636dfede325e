//! MR memory the application owns — and every `unsafe` the runtime needs for it (`STYLE-progress-memory.md` §1).
//!
//! A registered region is a [`Region`]: a base pointer and a length, shared (`Arc`) between the application's handle
//! ([`MrBuf`], or nothing for a raw registration) and the engine (through [`SharedMemory`], its
//! [`MrMemory`](roce_proto::MrMemory)). The engine (the "RNIC") reaches the bytes only with copies scoped to the
//! exact range a WR or a remote access names — it never forms a `&`/`&mut` to the bytes and holds none between
//! calls — the way a NIC's DMA reads and writes host memory. Every access to the bytes, the engine's and the
//! application's safe copies alike, goes through one primitive: the fault-tolerant assembly routines of
//! [`fault`](crate::fault) (copy, fill, 64-bit compare-and-swap and fetch-and-add).
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
//! * For [`Pd::reg_mr_raw`]: the memory is not reused for something else (freed and reallocated, mapped over)
//!   until the MR is deregistered *and* every WR naming it has completed. Unmapping or protecting it is survived
//!   (below); reusing it is not detectable — the engine would write into whatever lives there now.
//!
//! # Memory the application unmaps or protects (issue #21)
//!
//! A hardware RNIC pins an MR's pages, so a program that `munmap`s or `mprotect`s registered memory does not hurt
//! the NIC. Here the CPU is the DMA engine: a copy into such memory faults. The primitive turns the fault into an
//! error ([`roce_proto::MemoryFault`]) instead of a SIGSEGV that ends the process, and the engine answers as an RNIC
//! does on a translation fault: a peer's WRITE, READ or atomic gets a NAK remote access error (its WR completes
//! REM_ACCESS_ERR), a receive completes LOC_PROT_ERR (the sender's WR REM_OP_ERR), the program's own send, READ
//! or atomic target completes LOC_PROT_ERR; the QP goes to the error state and `mr_access_faults` counts it (QP
//! and port). The application's own copies ([`MrBuf::read`], `Mr::read`, ...) return an error. How the
//! primitive works, why it was chosen over `process_vm_readv` and second mappings (measured), and what a program
//! that installs its own SIGSEGV handler later should know: [`fault`](crate::fault).
//!
//! A link that gathers payload itself (`sendmmsg` with iovecs into MR memory) has the kernel read the bytes after
//! the engine hashed them through the primitive. Memory unmapped in that window makes `sendmmsg` fail with EFAULT:
//! the link drops and counts the frame (`tx_errors`, a link error for the runtime), and go-back-N's retransmission
//! meets the fault in its ICRC and completes the WR LOC_PROT_ERR (not covered by a test: the window is a few
//! microseconds).
//!
//! # The application's view: copies, not references (issue #22 item 1)
//!
//! The contract above is the application's part of the protocol; it cannot be the precondition of a *safe*
//! function. So the safe way into the bytes is a copy through `&self` ([`MrBuf::read`], [`MrBuf::write`],
//! `Mr::read`, `Mr::write`): a bulk copy through the primitive that forms no reference, so the
//! compiler assumes nothing about the bytes between two copies and each copy reads memory afresh (a `&[u8]` held
//! across a receive read the stale byte in a release build). Application copies on one region are serialised by
//! the region's lock (the engine never takes it), so two application threads never race, and `Mr::dereg` takes it
//! too, so no copy reaches memory whose registration ended. Slices over the bytes exist only behind `unsafe`
//! ([`MrBuf::as_slice`] / [`MrBuf::as_mut_slice`]) with the contract as their `# Safety`.
//!
//! # Concurrent copies are defined (issue #22 item 1)
//!
//! The protocol itself lets copies of the same bytes run at once: an application that copies bytes *while* a WR
//! or a peer's WRITE lands in them (a peer holding an rkey decides when it writes), or one region registered on
//! devices of two groups whose engines copy the same bytes. As Rust non-atomic copies that would be a data race,
//! undefined behaviour. Every access therefore goes through the assembly routines: their loads and stores are
//! machine instructions outside the Rust abstract machine (like another process writing shared memory, or a device's
//! DMA), so a concurrent copy is defined — it yields a mix of old and new bytes, never UB — and the compiler
//! assumes nothing about the bytes between two copies (each copy reads memory afresh: a `&[u8]` held across a
//! receive read the stale byte in a release build). The ICRC of a gathered send source is computed over chunks
//! copied through the primitive into a stack buffer, never over a slice of the region. The remote atomics are
//! `lock cmpxchg` / `lock xadd` on aligned words; an application that uses atomics on those words is coherent
//! with them. The only ways to a reference into the bytes are the `unsafe` [`MrBuf::as_slice`] /
//! [`MrBuf::as_mut_slice`], whose `# Safety` is the RNIC contract.
//!
//! What the runtime guarantees besides: the memory cannot be freed while the engine may touch it (the engine
//! co-owns the allocation; `dereg` is refused while WRs use the MR), and the engine never touches a byte outside
//! the registered range (every range is checked against the MR, and again here).
//!
//! # Why assembly copies (not volatile, not atomic-memcpy)
//!
//! Volatile accesses would not make a racing access defined (Rust's memory model treats a racing volatile access
//! like any non-atomic one) and would block vectorised copies; a byte-wise atomic memcpy (P1478, `atomic-memcpy`)
//! would make the copies defined but cannot survive a fault, and costs a multiple of `memcpy` on the data path. The
//! routines do both at the cost of a plain copy (loads and stores up to 64 bytes, `rep movsb` beyond); the cost
//! against the `ptr::copy` they replace is measured in `BENCHMARKS.md`.
//!
//! Miri: the unit tests below use only heap-backed regions so that
//! `cargo +nightly miri test -p roce-verbs --lib memory` can check them (it does: `docs/TESTING.md`). Miri cannot run
//! assembly: under `cfg(miri)` the primitive is plain `ptr::copy` / `AtomicU64` (see [`fault`](crate::fault)).

use std::alloc::Layout;
use std::io;
use std::ptr::NonNull;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use roce_proto::{AccessFlags, MemoryFault, MrMemory};

use crate::fault::{self, Fault};

use crate::hugepage::{HugePageBuffer, HugePagePolicy};

/// Alignment of [`MrBuf::new`] buffers: one 4 KiB page.
pub const PAGE_SIZE: usize = 4096;

/// Bytes of a gathered send source copied (through the fault-tolerant primitive) into a stack buffer per ICRC
/// update: one 4 KiB chunk covers a whole packet at PMTU 4096. Measured (`BENCHMARKS.md`): 256 B and 1 KiB chunks
/// cost 3–5× and 2–3× the in-place hash they replace, 4 KiB chunks 1.3–1.6×.
const CRC_CHUNK: usize = 4096;

/// The error of an application copy that met a fault (the memory was unmapped or protected).
fn faulted(Fault: Fault) -> crate::Error {
    crate::Error::InvalidArgument("registered memory could not be accessed (unmapped or protected)")
}

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
    /// Taken by every application copy ([`MrBuf::read`]/[`MrBuf::write`], `Mr::read`/`Mr::write`: shared for a
    /// read, exclusive for a write) and, exclusively, by `Mr::dereg`, so application copies never race one another
    /// and never reach memory whose registration has just ended. The engine never takes it (no lock on the
    /// per-packet path).
    app: RwLock<()>,
}

// SAFETY: a `Region` is a pointer to plain bytes that are not tied to a thread (heap memory, an anonymous mapping,
// or memory whose validity the raw registration's caller promised) plus a lock; every access through it is a raw
// copy or an atomic operation, never a reference that outlives the call, so it may happen on any thread.
unsafe impl Send for Region {}
// SAFETY: `&Region` allows only the same copies/atomics as above, all through the assembly routines of `fault`
// (outside the Rust abstract machine: concurrent ones — an application copy of bytes the engine is writing at that
// moment, or two engines of different groups copying the same bytes — are defined and give a mix of old and new
// bytes, module docs). Application copies also exclude one another through `app`. No safe call hands out a
// reference into the bytes. (Under Miri or off x86_64 the routines are plain copies; there concurrent copies of the
// same bytes are the RNIC contract's business, as documented in `fault`.)
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
        fault::install();
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
            app: RwLock::new(()),
        })
    }

    /// A huge-page (or fallback) mapping; the region takes ownership of it.
    fn mapped(mut map: HugePageBuffer) -> Region {
        fault::install();
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
            app: RwLock::new(()),
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

    /// Copies `dst.len()` bytes at `off` into `dst` through the fault-tolerant primitive ([`fault::copy`]).
    /// Errors: [`Fault`] if the application unmapped or protected the memory (`dst` then holds some of the bytes).
    #[inline]
    pub(crate) fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), Fault> {
        self.check(off, dst.len());
        // SAFETY: the range is inside the region (checked), whose memory stays allocated to it while `self` lives
        // (owned, or the raw registration's promise that it is not reused; unmapped or protected is the `Fault`
        // this returns); every other access to region bytes goes through these routines or the application's
        // raw code, never a Rust reference another party writes behind. `dst` is exclusively borrowed.
        unsafe { fault::copy(dst.as_mut_ptr(), self.ptr.as_ptr().add(off), dst.len()) }
    }

    /// Copies `src` into the region at `off` through the fault-tolerant primitive (`memmove` semantics). A `src`
    /// inside the region could only come from `MrBuf::as_slice`, whose contract forbids writing the buffer while
    /// that slice lives (issue #22 item 2); the copy itself is defined for overlapping ranges all the same.
    /// Errors: [`Fault`] as [`read`](Self::read) (some bytes may have been written).
    #[inline]
    pub(crate) fn write(&self, off: usize, src: &[u8]) -> Result<(), Fault> {
        self.check(off, src.len());
        // SAFETY: as in `read`; the region is writable memory (heap, a private anonymous mapping, or memory the
        // raw registration's caller declared writable; `Mr::write` refuses an MR without LOCAL_WRITE — memory
        // that is not writable after all is the `Fault` this returns). `src` is only read.
        unsafe { fault::copy(self.ptr.as_ptr().add(off), src.as_ptr(), src.len()) }
    }

    /// Sets every byte of the region to `byte` (fault-tolerant, as [`write`](Self::write)).
    pub(crate) fn fill(&self, byte: u8) -> Result<(), Fault> {
        // SAFETY: the whole region, valid as in `write`.
        unsafe { fault::fill(self.ptr.as_ptr(), byte, self.len) }
    }

    /// Shared guard for an application read (see the `app` field).
    pub(crate) fn app_read(&self) -> RwLockReadGuard<'_, ()> {
        self.app.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Exclusive guard for an application write or a deregistration (see the `app` field).
    pub(crate) fn app_write(&self) -> RwLockWriteGuard<'_, ()> {
        self.app.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hashes `len` bytes at `off`: chunks of [`CRC_CHUNK`] bytes copied through the fault-tolerant primitive
    /// into a stack buffer, then hashed (a slice over the region would be a non-atomic read racing a peer's write,
    /// and a fault inside the hash would end the process). Errors: [`Fault`].
    fn crc32_update(
        &self,
        off: usize,
        len: usize,
        hasher: &mut crc32fast::Hasher,
    ) -> Result<(), Fault> {
        self.crc32_chunked::<CRC_CHUNK>(off, len, hasher)
    }

    /// [`crc32_update`](Self::crc32_update) with chunks of `N` bytes (the unit benchmark compares sizes).
    #[inline]
    fn crc32_chunked<const N: usize>(
        &self,
        off: usize,
        len: usize,
        hasher: &mut crc32fast::Hasher,
    ) -> Result<(), Fault> {
        self.check(off, len);
        // Not zeroed first (4 KiB of stores per call): each chunk is written whole by the copy before it is read.
        let mut tmp = [std::mem::MaybeUninit::<u8>::uninit(); N];
        let mut done = 0usize;
        while done < len {
            let n = (len - done).min(N);
            // SAFETY: `off + done .. + n` is inside the region (checked above), valid as in `read`; `tmp` is this
            // function's own buffer of `N >= n` bytes, written, not read, by the copy.
            unsafe {
                fault::copy(
                    tmp.as_mut_ptr().cast::<u8>(),
                    self.ptr.as_ptr().add(off + done),
                    n,
                )
            }?;
            // SAFETY: the copy succeeded, so `tmp[..n]` is initialised; the slice lives only for the hash.
            let bytes = unsafe { std::slice::from_raw_parts(tmp.as_ptr().cast::<u8>(), n) };
            hasher.update(bytes);
            done += n;
        }
        Ok(())
    }

    /// The address of the 8-byte word at `off`, if it is 8-byte aligned in memory.
    fn word_at(&self, off: usize) -> Option<*mut u64> {
        self.check(off, 8);
        let p = self.ptr.as_ptr().wrapping_add(off);
        (p as usize).is_multiple_of(8).then_some(p.cast::<u64>())
    }

    /// Compare-and-swap of the little-endian word at `off`; the value before. Errors: [`Fault`].
    fn compare_swap(&self, off: usize, compare: u64, swap: u64) -> Result<u64, Fault> {
        if let Some(p) = self.word_at(off) {
            // Memory holds little-endian bytes; `to_le`/`from_le` map them to the native integer the CPU compares.
            // SAFETY: `p` is inside the region (checked by `word_at`), 8-byte aligned, valid as in `read`.
            let old = unsafe { fault::cas64(p, compare.to_le(), swap.to_le()) }?;
            return Ok(u64::from_le(old));
        }
        // Unaligned (only possible for a raw registration at an odd address): a plain read-modify-write.
        let mut b = [0u8; 8];
        self.read(off, &mut b)?;
        let orig = u64::from_le_bytes(b);
        if orig == compare {
            self.write(off, &swap.to_le_bytes())?;
        }
        Ok(orig)
    }

    /// Wrapping fetch-and-add of the little-endian word at `off`; the value before. Errors: [`Fault`].
    fn fetch_add(&self, off: usize, add: u64) -> Result<u64, Fault> {
        if let Some(p) = self.word_at(off) {
            if cfg!(target_endian = "little") {
                // SAFETY: as in `compare_swap`.
                return unsafe { fault::fetch_add64(p, add) };
            }
            // Big-endian: add to the little-endian value with a compare-and-swap loop.
            loop {
                let mut b = [0u8; 8];
                self.read(off, &mut b)?;
                let cur = u64::from_le_bytes(b);
                if self.compare_swap(off, cur, cur.wrapping_add(add))? == cur {
                    return Ok(cur);
                }
            }
        }
        let mut b = [0u8; 8];
        self.read(off, &mut b)?;
        let orig = u64::from_le_bytes(b);
        self.write(off, &orig.wrapping_add(add).to_le_bytes())?;
        Ok(orig)
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
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryFault> {
        self.0.read(offset, dst).map_err(|Fault| MemoryFault)
    }
    #[inline]
    fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), MemoryFault> {
        self.0.write(offset, src).map_err(|Fault| MemoryFault)
    }
    fn crc32_update(
        &self,
        offset: usize,
        len: usize,
        hasher: &mut crc32fast::Hasher,
    ) -> Result<(), MemoryFault> {
        self.0
            .crc32_update(offset, len, hasher)
            .map_err(|Fault| MemoryFault)
    }
    fn compare_swap_u64(
        &mut self,
        offset: usize,
        compare: u64,
        swap: u64,
    ) -> Result<u64, MemoryFault> {
        self.0
            .compare_swap(offset, compare, swap)
            .map_err(|Fault| MemoryFault)
    }
    fn fetch_add_u64(&mut self, offset: usize, add: u64) -> Result<u64, MemoryFault> {
        self.0.fetch_add(offset, add).map_err(|Fault| MemoryFault)
    }
    /// Valid until the MR is deregistered and its last WR completed (the region never moves, and its writes go
    /// through raw pointers, so the pointer is never invalidated by a re-borrow).
    fn base_ptr(&self) -> Option<*const u8> {
        Some(self.0.ptr.as_ptr().cast_const())
    }
}

/// A page-aligned, zeroed byte buffer the application owns and registers with [`Pd::reg_mr`](crate::Pd::reg_mr),
/// whose bytes the engine reads and writes as an RNIC's DMA would.
///
/// The application reaches the bytes by **copies** through `&self` — [`read`](Self::read), [`write`](Self::write),
/// [`to_vec`](Self::to_vec), [`fill`](Self::fill), [`read_volatile`](Self::read_volatile) — in the manner of
/// vm-memory's `VolatileSlice`: no Rust reference to the memory is ever held, so nothing asserts that the bytes stay
/// unchanged while a receive, a READ response or a peer's WRITE lands in them, and every copy reads memory afresh
/// (issue #22 item 1: a `&[u8]` held across a receive read the stale byte in release builds). Copies are bulk
/// copies through the runtime's fault-tolerant assembly routines, defined even while the engine or a peer writes
/// the same bytes (module docs); application copies on one buffer are serialised with each other (and with
/// `Mr::read`/`Mr::write` on its MRs) by a lock the engine never takes.
///
/// Zero-copy users may borrow the bytes as a slice with the `unsafe` [`as_slice`](Self::as_slice) /
/// [`as_mut_slice`](Self::as_mut_slice), whose `# Safety` is the RNIC contract (module docs). `MrBuf` deliberately
/// does not implement `Deref<Target = [u8]>`, `AsRef<[u8]>` or their `mut` forms (safe functions cannot make that
/// promise):
///
/// ```compile_fail,E0308
/// let buf = roce_verbs::MrBuf::new(64).unwrap();
/// let view: &[u8] = &buf; // no Deref: the engine may write these bytes while `view` lives
/// ```
///
/// ```compile_fail,E0133
/// let buf = roce_verbs::MrBuf::new(64).unwrap();
/// let view = buf.as_slice(); // `unsafe`: its contract is the caller's
/// ```
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

/// The error of an [`MrBuf`] copy whose range is not inside the buffer.
fn outside(offset: usize, n: usize, len: usize) -> crate::Error {
    tracing::debug!(offset, n, len, "MrBuf copy outside the buffer");
    crate::Error::InvalidArgument("range outside the buffer")
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
        let b = MrBuf::new(bytes.len())?;
        b.region
            .write(0, bytes)
            .map_err(|Fault| io::Error::new(io::ErrorKind::InvalidData, "a new buffer faulted"))?;
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

    /// Copies `dst.len()` bytes at byte `offset` into `dst` (one bulk copy, memory read afresh). Bytes a WR in
    /// flight or a peer is writing at that moment may be old or new, byte by byte: read them after the completion
    /// (or the protocol message) that says they are there. Errors: `InvalidArgument` (range outside the buffer).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), crate::Error> {
        self.range_ok(offset, dst.len())?;
        let _g = self.region.app_read();
        self.region.read(offset, dst).map_err(faulted)
    }

    /// Copies `src` into the buffer at byte `offset` (one bulk copy; `&self`, as a store into memory an RNIC also
    /// writes asserts no exclusivity). Bytes named by a posted WR should not be changed before its completion (the
    /// RNIC contract: the wire then carries either version). Errors: `InvalidArgument` (range outside the buffer).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), crate::Error> {
        self.range_ok(offset, src.len())?;
        let _g = self.region.app_write();
        self.region.write(offset, src).map_err(faulted)
    }

    /// A copy of the whole buffer (as [`read`](Self::read)); all zero if the memory faulted (only possible if
    /// the application's own `unsafe` code unmapped or protected it).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.region.len];
        let _g = self.region.app_read();
        if self.region.read(0, &mut v).is_err() {
            tracing::debug!(len = self.region.len, "MrBuf::to_vec faulted");
            v.fill(0);
        }
        v
    }

    /// Sets every byte to `byte` (one `rep stosb` through the fault-tolerant primitive, as [`write`](Self::write)).
    /// Memory the application's own `unsafe` code unmapped or protected is left as it is (logged at debug level).
    pub fn fill(&self, byte: u8) {
        let _g = self.region.app_write();
        if self.region.fill(byte).is_err() {
            tracing::debug!(len = self.region.len, "MrBuf::fill faulted");
        }
    }

    fn range_ok(&self, offset: usize, n: usize) -> Result<(), crate::Error> {
        match offset.checked_add(n) {
            Some(end) if end <= self.region.len => Ok(()),
            _ => Err(outside(offset, n, self.region.len)),
        }
    }

    /// The bytes as a shared slice, for zero-copy users (a send source filled elsewhere, a checksum over a
    /// received message).
    ///
    /// # Safety
    ///
    /// For as long as the returned slice lives, no byte of the buffer is written by anyone: no receive, RDMA READ
    /// or atomic WR posted on an MR of this buffer is outstanding, no peer can write it (no REMOTE_WRITE /
    /// REMOTE_ATOMIC rkey of it is in a peer's hands, or the application's protocol guarantees the peer is not
    /// writing meanwhile), no other registration of it on another device is the target of any of these, and no
    /// [`write`](Self::write)/[`fill`](Self::fill)/`Mr::write` runs on it — not even with (part of) this slice as
    /// its source (Miri reports that as a write under a protected shared reference). A write under a live `&[u8]`
    /// is undefined behaviour: the compiler may keep returning the bytes it read first.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the region is valid for `len` bytes while `self` holds its `Arc`; that nobody writes them while
        // the slice lives is the caller's promise (`# Safety`).
        unsafe { std::slice::from_raw_parts(self.region.ptr.as_ptr(), self.region.len) }
    }

    /// The bytes as an exclusive slice, for zero-copy users (filling a send buffer in place).
    ///
    /// # Safety
    ///
    /// As [`as_slice`](Self::as_slice), and in addition nobody *reads* the buffer while the returned slice lives:
    /// no send, RDMA WRITE source or peer's RDMA READ of it is outstanding, and no other thread copies out of it
    /// through an `Mr` of it.
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`; `&mut self` excludes the `MrBuf`'s own accessors (an `MrBuf` is not `Clone`),
        // and the engine, peers and `Mr` copies are excluded by the caller's promise (`# Safety`).
        unsafe { std::slice::from_raw_parts_mut(self.region.ptr.as_ptr(), self.region.len) }
    }

    /// Reads `dst.len()` bytes at `offset`, for a loop that waits for bytes a peer writes (perftest's WRITE
    /// latency test polls the last byte): each call really reads memory. Since every copy goes through the
    /// assembly primitive ([`read`](Self::read) too: the compiler cannot keep bytes across it) this is the same
    /// copy, kept for the name. Errors: as [`read`](Self::read).
    pub fn read_volatile(&self, offset: usize, dst: &mut [u8]) -> Result<(), crate::Error> {
        self.read(offset, dst)
    }

    pub(crate) fn region(&self) -> &Arc<Region> {
        &self.region
    }
}

impl crate::Pd {
    /// `ibv_reg_mr` of memory the caller owns and manages itself (the C ABI's path). The MR's address is `addr`
    /// (as `ibv_reg_mr`: SGEs and peers use the caller's pointers). Errors as [`Pd::reg_mr`](crate::Pd::reg_mr).
    ///
    /// # Safety
    ///
    /// * `addr..addr + len` is memory of this process, and it is not reused for other data (freed and
    ///   reallocated, or mapped over) until this MR has been deregistered ([`Mr::dereg`](crate::Mr::dereg)
    ///   succeeded, or the last [`Mr`](crate::Mr) handle was dropped and the runtime deregistered it once its WRs
    ///   completed) and the context is gone or the deregistration has returned. Memory that is unmapped or
    ///   protected meanwhile (or was never writable) is not undefined behaviour: accesses to it fail with the
    ///   errors and completions of the module docs ("Memory the application unmaps or protects").
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
        fault::install();
        let region = Arc::new(Region {
            ptr,
            len,
            owner: Owner::Foreign,
            huge: false,
            app: RwLock::new(()),
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
        fault::install();
        let region = Arc::new(Region {
            ptr,
            len,
            owner: Owner::Foreign,
            huge: false,
            app: RwLock::new(()),
        });
        self.reg_region_at(region, access, iova)
    }
}

impl crate::Mr {
    /// `ibv_rereg_mr` of a raw registration ([`reg_mr_raw_iova`](crate::Pd::reg_mr_raw_iova)), in place: the keys
    /// stay; the MR gets the PD `pd`, the access `access` and, with `translation` = `Some((addr, len, iova))`, the
    /// memory `addr..addr + len` at virtual address `iova` (ibv_rereg_mr(3)). Returns the MR's new handle (this
    /// one then acts as deregistered). Errors as [`reg_mr_raw_iova`](crate::Pd::reg_mr_raw_iova), plus
    /// `InvalidArgument` for a PD of another context or an MR no longer registered; on error nothing changed.
    ///
    /// # Safety
    ///
    /// As [`reg_mr_raw`](crate::Pd::reg_mr_raw) for the new memory (or the old one, which stays registered when
    /// `translation` is `None`). After a successful call with a new translation the engine never touches the old
    /// memory again.
    pub unsafe fn rereg_raw(
        &self,
        pd: &crate::Pd,
        access: AccessFlags,
        translation: Option<(*mut u8, usize, u64)>,
    ) -> Result<crate::Mr, crate::Error> {
        let region = match translation {
            None => None,
            Some((addr, len, iova)) => {
                let ptr =
                    NonNull::new(addr).ok_or(crate::Error::InvalidArgument("null MR address"))?;
                if (addr as usize).checked_add(len).is_none() {
                    return Err(crate::Error::InvalidArgument(
                        "MR address + length overflows",
                    ));
                }
                Some((
                    Arc::new(Region {
                        ptr,
                        len,
                        owner: Owner::Foreign,
                        huge: false,
                        app: RwLock::new(()),
                    }),
                    iova,
                ))
            }
        };
        self.rereg_region(pd, access, region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_buffer_is_zeroed_aligned_and_shared_with_the_engine_view() {
        let b = MrBuf::new(10_000).expect("alloc");
        assert_eq!(b.len(), 10_000);
        assert!(!b.is_huge() && !b.is_empty());
        assert_eq!(b.as_ptr() as usize % PAGE_SIZE, 0, "page aligned");
        assert!(b.to_vec().iter().all(|&x| x == 0), "zeroed");
        b.write(100, b"hello").expect("in range");
        // The engine's view sees the application's stores, and the application sees the engine's writes.
        let mut eng = SharedMemory(Arc::clone(b.region()));
        let mut out = [0u8; 5];
        eng.read_at(100, &mut out).expect("mapped");
        assert_eq!(&out, b"hello");
        eng.write_at(9_995, b"world").expect("mapped");
        b.read(9_995, &mut out).expect("in range");
        assert_eq!(&out, b"world");
        let mut v = [0u8; 5];
        b.read_volatile(9_995, &mut v).expect("in range");
        assert_eq!(&v, b"world");
        let mut h = crc32fast::Hasher::new();
        eng.crc32_update(100, 5, &mut h).expect("mapped");
        assert_eq!(h.finalize(), crc32fast::hash(b"hello"));
        assert_eq!(eng.base_ptr(), Some(b.as_ptr()));
        // Dropping the application's handle first leaves the memory to the engine view.
        drop(b);
        eng.read_at(9_995, &mut out).expect("mapped");
        assert_eq!(&out, b"world");
        let e = MrBuf::new(0).expect("empty");
        assert!(e.is_empty() && e.to_vec().is_empty());
        let c = MrBuf::from_slice(&[1, 2, 3]).expect("copy");
        assert_eq!(c.to_vec(), [1, 2, 3]);
        c.fill(9);
        assert_eq!(c.to_vec(), [9, 9, 9]);
        assert!(format!("{c:?}").contains("len: 3"));
    }

    /// The cost of the engine's MR accesses through the fault-tolerant primitive against the plain `ptr::copy` and
    /// in-place CRC they replaced (issue #22 item 1's measurement, `BENCHMARKS.md`). Run:
    /// `cargo test --release -p roce-verbs --lib mr_access_cost -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn mr_access_cost() {
        use std::hint::black_box;
        use std::time::Instant;
        let b = MrBuf::new(1 << 16).expect("alloc");
        b.fill(0x5a);
        let eng = SharedMemory(Arc::clone(b.region()));
        let base = b.as_ptr();
        let mut dst = vec![0u8; 4096];
        // One round: ns per operation of `f` over `n` iterations.
        let time = |n: u32, f: &mut dyn FnMut(usize)| {
            let t = Instant::now();
            for i in 0..n as usize {
                f(i);
            }
            t.elapsed().as_nanos() as f64 / f64::from(n)
        };
        type Case<'a> = (&'static str, u32, Box<dyn FnMut(usize) + 'a>);
        let mut cases: Vec<Case<'_>> = Vec::new();
        for len in [64usize, 4096] {
            let d = dst.as_mut_ptr();
            cases.push((
                if len == 64 {
                    "read 64 B, ptr::copy (before)"
                } else {
                    "read 4 KiB, ptr::copy (before)"
                },
                if len == 64 { 4_000_000 } else { 400_000 },
                Box::new(move |i| {
                    let off = (i * 64) % 32768;
                    // SAFETY: inside the 64 KiB buffer and the 4 KiB `dst`; nothing else accesses them meanwhile.
                    unsafe { std::ptr::copy(base.add(off), d, len) };
                    black_box(d);
                }),
            ));
        }
        let eng_r = &eng;
        let mut d64 = [0u8; 64];
        cases.push((
            "read 64 B, primitive (after)",
            4_000_000,
            Box::new(move |i| {
                eng_r.read_at((i * 64) % 32768, &mut d64).expect("mapped");
                black_box(&d64);
            }),
        ));
        let d4k = &mut dst;
        cases.push((
            "read 4 KiB, primitive (after)",
            400_000,
            Box::new(move |i| {
                eng_r
                    .read_at((i * 64) % 32768, &mut d4k[..])
                    .expect("mapped");
                black_box(&d4k);
            }),
        ));
        let region = &**b.region();
        cases.push((
            "crc32 4 KiB in place (before)",
            200_000,
            Box::new(move |i| {
                let off = (i * 64) % 32768;
                // SAFETY: inside the buffer; nothing writes it meanwhile (this test only).
                let s = unsafe { std::slice::from_raw_parts(base.add(off), 4096) };
                let mut h = crc32fast::Hasher::new();
                h.update(s);
                black_box(h.finalize());
            }),
        ));
        cases.push((
            "crc32 4 KiB via 256 B chunks",
            200_000,
            Box::new(move |i| {
                let mut h = crc32fast::Hasher::new();
                region
                    .crc32_chunked::<256>((i * 64) % 32768, 4096, &mut h)
                    .expect("mapped");
                black_box(h.finalize());
            }),
        ));
        cases.push((
            "crc32 4 KiB via 1 KiB chunks",
            200_000,
            Box::new(move |i| {
                let mut h = crc32fast::Hasher::new();
                region
                    .crc32_chunked::<1024>((i * 64) % 32768, 4096, &mut h)
                    .expect("mapped");
                black_box(h.finalize());
            }),
        ));
        cases.push((
            "crc32 4 KiB via 4 KiB chunks (after)",
            200_000,
            Box::new(move |i| {
                let mut h = crc32fast::Hasher::new();
                region
                    .crc32_chunked::<4096>((i * 64) % 32768, 4096, &mut h)
                    .expect("mapped");
                black_box(h.finalize());
            }),
        ));
        let mut results: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
        for _ in 0..5 {
            for (k, (_, n, f)) in cases.iter_mut().enumerate() {
                results[k].push(time(*n, f.as_mut()));
            }
        }
        for ((name, _, _), r) in cases.iter().zip(results.iter_mut()) {
            r.sort_by(f64::total_cmp);
            println!("{name:40} {:8.1} ns (median of 5)", r[2]);
        }
    }

    #[test]
    fn application_copies_outside_the_buffer_are_errors() {
        let b = MrBuf::new(16).expect("alloc");
        let mut x = [0u8; 5];
        assert!(b.read(12, &mut x).is_err());
        assert!(b.read(usize::MAX, &mut x).is_err());
        assert!(b.write(12, &x).is_err());
        assert!(b.read_volatile(12, &mut x).is_err());
        assert_eq!(b.to_vec(), [0u8; 16], "nothing written");
    }

    #[test]
    fn atomics_are_little_endian_and_return_the_old_value() {
        let b = MrBuf::new(64).expect("alloc");
        let mut eng = SharedMemory(Arc::clone(b.region()));
        eng.write_at(8, &7u64.to_le_bytes()).expect("mapped");
        assert_eq!(eng.compare_swap_u64(8, 6, 1), Ok(7), "mismatch: no swap");
        assert_eq!(eng.compare_swap_u64(8, 7, 1), Ok(7));
        assert_eq!(eng.fetch_add_u64(8, u64::MAX), Ok(1), "wrapping");
        assert_eq!(b.to_vec()[8..16], 0u64.to_le_bytes());
        // Unaligned word (only a raw registration can have one): same results without atomics.
        eng.write_at(3, &41u64.to_le_bytes()).expect("mapped");
        assert_eq!(eng.fetch_add_u64(3, 1), Ok(41));
        assert_eq!(eng.compare_swap_u64(3, 42, 5), Ok(42));
        assert_eq!(b.to_vec()[3..11], 5u64.to_le_bytes());
    }

    #[test]
    #[should_panic(expected = "outside a region")]
    fn out_of_range_access_panics_instead_of_touching_other_memory() {
        let b = MrBuf::new(16).expect("alloc");
        let mut eng = SharedMemory(Arc::clone(b.region()));
        eng.write_at(12, &[0u8; 5]).expect("mapped");
    }

    #[test]
    fn offset_overflow_is_caught() {
        let b = MrBuf::new(16).expect("alloc");
        let eng = SharedMemory(Arc::clone(b.region()));
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut x = [0u8; 2];
            let _ = eng.read_at(usize::MAX, &mut x);
        }));
        assert!(r.is_err());
    }
}
