//! MR memory on 2 MiB huge pages ([`HugePageBuffer`]), with a fallback to normal pages when none are reserved.
//!
//! Linux hands out `MAP_HUGETLB` pages only from the pool reserved in `/proc/sys/vm/nr_hugepages` (plus
//! `nr_overcommit_hugepages` surplus), which is 0 on most machines. A private hugetlb mapping reserves its pages when
//! it is created, so an empty pool shows up as `mmap` failing with `ENOMEM` (never as a `SIGBUS` later); other
//! kernels refuse with `EINVAL` (no hugetlbfs). [`HugePagePolicy::Prefer`] then maps normal anonymous memory instead
//! (advised `MADV_HUGEPAGE`, so transparent huge pages may still back it) and logs a `tracing::warn!`;
//! [`HugePagePolicy::Require`] returns the error. Both kinds of mapping are zeroed by the kernel.
//!
//! `rocev2 perf --use_hugepages` (perftest's flag name) allocates its test buffers here. A private anonymous mapping
//! is used rather than a System V `SHM_HUGETLB` segment, so nothing is left behind if the process dies.

use std::io;

use memmap2::{Advice, MmapMut, MmapOptions};
use roce_proto::MrMemory;

/// Size of the huge pages [`HugePageBuffer`] asks for: 2 MiB (`MAP_HUGE_2MB`, x86-64's default huge page size).
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

/// `log2(HUGE_PAGE_SIZE)`, the `MAP_HUGE_SHIFT` encoding of the page size.
const HUGE_PAGE_BITS: u8 = 21;

/// What [`HugePageBuffer::alloc`] does when no huge page can be had.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HugePagePolicy {
    /// Fall back to normal pages and log a warning; the caller can check [`HugePageBuffer::is_huge`].
    #[default]
    Prefer,
    /// Fail with the `mmap` error.
    Require,
}

/// A zeroed, page-aligned byte buffer mapped on 2 MiB huge pages when possible; an [`MrMemory`], so
/// [`Pd::reg_mr`](crate::Pd::reg_mr) takes it directly.
///
/// The mapping is rounded up to whole huge pages ([`mapped_len`](Self::mapped_len)); the buffer exposes exactly the
/// `len` bytes asked for. The memory is unmapped on drop.
#[derive(Debug)]
pub struct HugePageBuffer {
    map: MmapMut,
    len: usize,
    huge: bool,
}

impl HugePageBuffer {
    /// Maps `len` bytes (`len` 0 maps one page), on huge pages if the kernel has enough free in its pool.
    ///
    /// Huge pages are populated at once (`MAP_POPULATE`: they are reserved anyway, and the data path then takes no
    /// page fault); the fallback mapping is faulted in lazily like any heap memory.
    ///
    /// Errors: `InvalidInput` if `len` rounded up to [`HUGE_PAGE_SIZE`] overflows `usize`; with
    /// [`HugePagePolicy::Require`], the hugetlb `mmap` error (`ENOMEM` when the pool is empty) with a hint; with
    /// `Prefer`, only the fallback `mmap`'s error (`ENOMEM`: out of address space or memory).
    pub fn alloc(len: usize, policy: HugePagePolicy) -> io::Result<HugePageBuffer> {
        let mapped = round_up(len.max(1), HUGE_PAGE_SIZE).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{len} bytes rounded up to 2 MiB pages overflows the address space"),
            )
        })?;
        let huge_err = match MmapOptions::new()
            .len(mapped)
            .huge(Some(HUGE_PAGE_BITS))
            .populate()
            .map_anon()
        {
            Ok(map) => {
                return Ok(HugePageBuffer {
                    map,
                    len,
                    huge: true,
                });
            }
            Err(e) => e,
        };
        if policy == HugePagePolicy::Require {
            return Err(io::Error::new(
                huge_err.kind(),
                format!(
                    "no {} free 2 MiB huge pages for {len} bytes ({huge_err}); reserve some with \
                     `echo N > /proc/sys/vm/nr_hugepages`",
                    mapped / HUGE_PAGE_SIZE
                ),
            ));
        }
        tracing::warn!(
            len,
            huge_pages = mapped / HUGE_PAGE_SIZE,
            error = %huge_err,
            "no huge pages available (see /proc/sys/vm/nr_hugepages); using normal pages"
        );
        let map = MmapOptions::new().len(len.max(1)).map_anon()?;
        // Best effort: transparent huge pages where the kernel's THP mode is `madvise`; failure changes nothing.
        let _ = map.advise(Advice::HugePage);
        Ok(HugePageBuffer {
            map,
            len,
            huge: false,
        })
    }

    /// True when the buffer is on hugetlb (2 MiB) pages; false for the fallback mapping.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    /// Length in bytes (as asked for).
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes actually mapped: `len` rounded up to whole huge pages (at least one) when [`is_huge`](Self::is_huge),
    /// else at least `len` (at least 1).
    pub fn mapped_len(&self) -> usize {
        self.map.len()
    }
}

impl HugePageBuffer {
    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.map[..self.len]
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map[..self.len]
    }
}

/// Engine-owned use (the engine holds the buffer exclusively, like a `Box<[u8]>`).
impl MrMemory for HugePageBuffer {
    fn len(&self) -> usize {
        self.len
    }
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<(), roce_proto::MemoryFault> {
        dst.copy_from_slice(&self.as_slice()[offset..offset + dst.len()]);
        Ok(())
    }
    fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<(), roce_proto::MemoryFault> {
        self.as_mut_slice()[offset..offset + src.len()].copy_from_slice(src);
        Ok(())
    }
    fn crc32_update(
        &self,
        offset: usize,
        len: usize,
        hasher: &mut crc32fast::Hasher,
    ) -> Result<(), roce_proto::MemoryFault> {
        hasher.update(&self.as_slice()[offset..offset + len]);
        Ok(())
    }
    fn base_ptr(&self) -> Option<*const u8> {
        Some(self.map.as_ptr())
    }
}

impl AsRef<[u8]> for HugePageBuffer {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsMut<[u8]> for HugePageBuffer {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

fn round_up(n: usize, to: usize) -> Option<usize> {
    n.checked_next_multiple_of(to)
}

/// Helpers for tests that change the kernel's huge page pool (root only) and must not run concurrently.
#[cfg(test)]
pub(crate) mod test_util {
    use std::sync::{Mutex, MutexGuard};

    /// Serializes every test in this crate that depends on the size of the huge page pool.
    static POOL: Mutex<()> = Mutex::new(());

    /// Holds [`POOL`] and restores the sysctls it changed on drop (also when the test panics).
    pub(crate) struct PoolGuard {
        saved: Vec<(&'static str, String)>,
        _lock: MutexGuard<'static, ()>,
    }

    const NR: &str = "/proc/sys/vm/nr_hugepages";
    const OVERCOMMIT: &str = "/proc/sys/vm/nr_overcommit_hugepages";

    fn read(path: &str) -> Option<String> {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_owned())
    }

    impl PoolGuard {
        /// Takes the lock without changing anything.
        pub(crate) fn lock() -> PoolGuard {
            PoolGuard {
                saved: Vec::new(),
                _lock: POOL.lock().unwrap_or_else(|p| p.into_inner()),
            }
        }

        /// Sets `path` to `value`, remembering the old value; false if the kernel refused (not root) or did not
        /// take the whole value (a pool the kernel could only partly fill).
        fn set(&mut self, path: &'static str, value: u64) -> bool {
            let Some(prev) = read(path) else { return false };
            if !self.saved.iter().any(|(p, _)| *p == path) {
                self.saved.push((path, prev));
            }
            std::fs::write(path, value.to_string()).is_ok()
                && read(path).and_then(|s| s.parse::<u64>().ok()) == Some(value)
        }

        /// Pool of exactly `pages` persistent 2 MiB pages and no surplus; false if that could not be arranged.
        pub(crate) fn pool(&mut self, pages: u64) -> bool {
            self.set(OVERCOMMIT, 0) && self.set(NR, pages)
        }
    }

    impl Drop for PoolGuard {
        fn drop(&mut self) {
            for (path, prev) in self.saved.iter().rev() {
                if let Err(e) = std::fs::write(path, prev) {
                    eprintln!("could not restore {path} to {prev}: {e}");
                }
            }
        }
    }

    /// Free 2 MiB pages (`HugePages_Free` of `/proc/meminfo`).
    pub(crate) fn free_pages() -> u64 {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("HugePages_Free:"))
                    .and_then(|v| v.trim().parse().ok())
            })
            .unwrap_or(0)
    }

    /// The `/proc/self/smaps` entry of the mapping that contains `addr`: (pathname, KernelPageSize in kB,
    /// Private_Hugetlb in kB).
    pub(crate) fn smaps_entry(addr: usize) -> Option<(String, u64, u64)> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut lines = smaps.lines();
        while let Some(l) = lines.next() {
            let mut f = l.split_whitespace();
            let Some((lo, hi)) = f.next().and_then(|r| r.split_once('-')) else {
                continue;
            };
            let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            else {
                continue;
            };
            if !(lo..hi).contains(&addr) {
                continue;
            }
            let path = f.nth(4).map(str::to_owned).unwrap_or_default();
            let (mut kps, mut hugetlb) = (0, 0);
            for l in lines.by_ref() {
                let kb = |s: &str| {
                    s.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .unwrap_or(0)
                };
                if let Some(v) = l.strip_prefix("KernelPageSize:") {
                    kps = kb(v);
                } else if let Some(v) = l.strip_prefix("Private_Hugetlb:") {
                    hugetlb = kb(v);
                } else if l.starts_with("VmFlags:") {
                    break;
                }
            }
            return Some((path, kps, hugetlb));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::{PoolGuard, free_pages, smaps_entry};
    use super::*;

    #[test]
    fn fallback_when_no_huge_pages_are_reserved() {
        let mut g = PoolGuard::lock();
        if !g.pool(0) && free_pages() != 0 {
            eprintln!("skipped: huge pages are free and the pool cannot be emptied (not root?)");
            return;
        }
        assert_eq!(free_pages(), 0);
        let err = HugePageBuffer::alloc(3000, HugePagePolicy::Require).expect_err("empty pool");
        assert!(err.to_string().contains("nr_hugepages"), "{err}");
        let mut b = HugePageBuffer::alloc(3000, HugePagePolicy::Prefer).expect("fallback");
        assert!(!b.is_huge());
        assert_eq!((b.len(), b.as_slice().len()), (3000, 3000));
        assert!(b.mapped_len() >= 3000);
        assert!(b.as_slice().iter().all(|&x| x == 0), "zeroed");
        b.as_mut_slice()[2999] = 5;
        assert_eq!(b.as_ref()[2999], 5);
        let (_, page_kb, hugetlb_kb) =
            smaps_entry(b.as_slice().as_ptr() as usize).expect("in smaps");
        assert_eq!((page_kb, hugetlb_kb), (4, 0), "normal pages");
        let e = HugePageBuffer::alloc(0, HugePagePolicy::Prefer).expect("empty");
        assert!(e.is_empty() && e.as_slice().is_empty());
        let too_big =
            HugePageBuffer::alloc(usize::MAX - 5, HugePagePolicy::Prefer).expect_err("overflow");
        assert_eq!(too_big.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn huge_pages_when_reserved() {
        let mut g = PoolGuard::lock();
        // 3 MiB + 1 byte needs two pages; reserve three so one stays free.
        if !g.pool(3) {
            eprintln!("skipped: cannot reserve huge pages (needs root and /proc/sys/vm writable)");
            return;
        }
        let len = 3 * 1024 * 1024 + 1;
        let mut b =
            HugePageBuffer::alloc(len, HugePagePolicy::Require).expect("huge pages reserved");
        assert!(b.is_huge());
        assert_eq!(b.len(), len);
        assert_eq!(
            b.mapped_len(),
            2 * HUGE_PAGE_SIZE,
            "rounded up to whole 2 MiB pages"
        );
        let addr = b.as_slice().as_ptr() as usize;
        assert_eq!(addr % HUGE_PAGE_SIZE, 0, "huge-page aligned");
        assert!(b.as_slice().iter().all(|&x| x == 0), "zeroed");
        b.as_mut_slice()[len - 1] = 0xa5;
        assert_eq!(b.as_slice()[len - 1], 0xa5);
        let (path, page_kb, hugetlb_kb) = smaps_entry(addr).expect("in smaps");
        assert!(path.contains("anon_hugepage"), "{path}");
        assert_eq!(page_kb, 2048);
        assert_eq!(hugetlb_kb, 4096, "both pages populated");
        assert_eq!(free_pages(), 1);
        // Two more pages are not there: Require fails, Prefer falls back.
        assert!(HugePageBuffer::alloc(HUGE_PAGE_SIZE + 1, HugePagePolicy::Require).is_err());
        let c =
            HugePageBuffer::alloc(HUGE_PAGE_SIZE + 1, HugePagePolicy::Prefer).expect("fallback");
        assert!(!c.is_huge());
        drop(b);
        assert_eq!(free_pages(), 3, "unmapped on drop");
    }

    /// Waits for one completion on `cq` (10 s at most).
    fn wait_one(cq: &crate::Cq) -> crate::Wc {
        let t0 = std::time::Instant::now();
        let mut wc = [crate::Wc::default(); 1];
        while cq.poll(&mut wc) == 0 {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(10),
                "no completion"
            );
            std::thread::yield_now();
        }
        wc[0]
    }

    #[test]
    fn rdma_write_and_read_through_huge_page_mrs_on_sim_pair() {
        use crate::*;
        let mut g = PoolGuard::lock();
        // Two MRs of two pages each.
        let reserved = g.pool(4);
        if !reserved {
            eprintln!("cannot reserve huge pages (not root?): the MRs use the fallback");
        }
        let (ca, cb) = Context::sim_pair(RuntimeConfig::default()).expect("pair");
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let cap = QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let len = HUGE_PAGE_SIZE + 64 * 1024;
        let side = |ctx: &Context| {
            let pd = ctx.alloc_pd().expect("pd");
            let cq = ctx.create_cq(32, None, Moderation::default()).expect("cq");
            let qp = pd.create_qp(QpType::Rc, &cq, &cq, cap, false).expect("qp");
            let buf = MrBuf::hugepages(len, HugePagePolicy::Prefer).expect("buf");
            let mr = pd.reg_mr(&buf, access).expect("mr");
            assert_eq!((mr.is_huge(), buf.is_huge()), (reserved, reserved));
            assert_eq!(mr.length(), len as u64);
            assert_eq!(mr.addr(), buf.as_ptr() as u64, "registered in place");
            (pd, cq, qp, mr, buf)
        };
        let (_pa, cqa, qpa, mra, bufa) = side(&ca);
        let (_pb, _cqb, qpb, mrb, bufb) = side(&cb);
        let (psa, psb) = (Psn::new(7), Psn::new(0xff_fff0));
        let o = ConnectOpts::default();
        qpa.connect(&qpb.endpoint(psb), psa, &o).expect("connect a");
        qpb.connect(&qpa.endpoint(psa), psb, &o).expect("connect b");

        // WRITE the whole of A's MR (crossing A's and B's 2 MiB page boundary) into B.
        let pattern: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
        bufa.write(0, &pattern).expect("in range");
        let sge = [mra.sge(0, len as u32)];
        let wr = SendWr::new(
            1,
            SendOp::RdmaWrite {
                remote_addr: mrb.addr(),
                rkey: mrb.rkey(),
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED);
        qpa.post_send(&[wr]).expect("post write");
        let wc = wait_one(&cqa);
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
        assert!(bufb.to_vec() == pattern, "B holds A's bytes");

        // B changes 64 KiB around its page boundary; A READs them back into the same place of its own MR.
        let off = HUGE_PAGE_SIZE - 32 * 1024;
        let fresh: Vec<u8> = (0..64 * 1024).map(|i| !(i as u8)).collect();
        bufb.write(off, &fresh).expect("in range");
        let sge = [mra.sge(off as u64, fresh.len() as u32)];
        let wr = SendWr::new(
            2,
            SendOp::RdmaRead {
                remote_addr: mrb.addr() + off as u64,
                rkey: mrb.rkey(),
            },
            &sge,
        )
        .flags(SendFlags::SIGNALED);
        qpa.post_send(&[wr]).expect("post read");
        let wc = wait_one(&cqa);
        assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
        assert_eq!(wc.byte_len, fresh.len() as u32);
        let got = bufa.to_vec();
        assert!(got[off..off + fresh.len()] == fresh[..], "READ data");
        assert!(
            got[..off] == pattern[..off]
                && got[off + fresh.len()..] == pattern[off + fresh.len()..]
        );
        drop((qpa, qpb, mra, mrb, bufa, bufb, ca, cb));
    }
}
