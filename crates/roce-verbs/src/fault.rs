//! Fault-tolerant, race-defined copies of application memory: the one primitive every access to MR bytes goes
//! through (issues #21 and #22 item 1).
//!
//! # What it solves
//!
//! * **Faults (#21).** A hardware RNIC pins the pages of an MR; here the "DMA" is the CPU, so a program that
//!   `munmap`s or `mprotect`s registered memory would make the engine's copy fault and kill the whole process with
//!   SIGSEGV. Every copy into or out of MR memory, the ICRC's reads of a send source and the 64-bit remote atomics
//!   run in a few hand-written x86_64 routines ([`copy`], [`fill`], [`cas64`], [`fetch_add64`]) whose instruction
//!   range is known. A SIGSEGV/SIGBUS handler, installed once ([`install`]), moves a thread that faults **inside
//!   that range** to the routines' common fixup, which returns [`Fault`] to the caller — the Linux kernel's
//!   exception-table technique (`copy_from_user` + `_ASM_EXTABLE`), as wasmtime does for its trap handling. Any
//!   other fault is passed on to the disposition that was in place before ours (Rust's stack-overflow guard, a
//!   sanitizer's handler, the default action), so crashes that are not ours stay crashes.
//! * **Races (#22 item 1).** A peer holding an rkey writes whenever it wants, so the engine's copies and the
//!   application's copies ([`MrBuf::read`](crate::MrBuf::read) / `write`, `Mr::read` / `write`) of the same bytes
//!   may run at the same time. As Rust non-atomic accesses that would be a data race, i.e. undefined behaviour.
//!   The routines are assembly (`global_asm!`): their loads and stores are machine instructions outside the Rust abstract
//!   machine, so the compiler assumes nothing about the bytes between two calls and two concurrent calls are
//!   defined at the level they run at (x86-64 TSO: each byte read is some byte that was written; a concurrent
//!   copy gives a mix of old and new bytes, never undefined behaviour). The atomics are `lock cmpxchg` /
//!   `lock xadd` on aligned words.
//!
//! # Why this design (measured, `BENCHMARKS.md`)
//!
//! * `process_vm_readv`/`writev` on the process itself (EFAULT instead of a signal) costs one system call per copy:
//!   measured on the development VM at 1,126 ns for a 64-byte copy (`memcpy`: 2.9 ns) and 1,429 ns for 4 KiB
//!   (`memcpy`: 43 ns) — more than the whole engine's per-packet budget.
//! * Pinning by a second mapping of the same pages works only for shared mappings; most registered memory is
//!   private (`malloc`, anonymous `mmap`).
//! * The copy loads every byte before storing any up to 64 bytes (`rep movsb` costs tens of cycles to start) and
//!   uses `rep movsb` beyond (fast on every x86-64 with ERMS/FSRM); fill is `rep stosb`. Measured against the
//!   `ptr::copy` they replace (`BENCHMARKS.md`): 64 B +0.3 ns, 4 KiB within the noise.
//!
//! # Consequences a program should know
//!
//! * The handler is installed once per process, at the first MR memory the runtime sets up, with
//!   `SA_SIGINFO | SA_ONSTACK | SA_NODEFER`, keeping the previous disposition to pass other faults on to (a
//!   handler installed *before* ours keeps working for every fault that is not ours). A program that installs its
//!   own SIGSEGV/SIGBUS handler *later* without passing faults on to the one it replaced takes the engine's faults
//!   too: a fault on unmapped MR memory then ends in that handler (usually a crash, as before this module).
//! * UCX is a special case: with its error handling on (the default `UCX_HANDLE_ERRORS`, SIGSEGV and SIGBUS in
//!   `UCX_ERROR_SIGNALS`), libucs builds that interpose `sigaction`/`signal` (`ucs/debug/debug.c`) return the
//!   old disposition for its error signals without setting the new one. Our installation then silently does nothing
//!   and a fault on unmapped registered memory ends in UCX's error handler (backtrace, abort), as before this
//!   module. `UCX_ERROR_SIGNALS=` (empty) leaves the signals to us. Every new region reads the disposition back
//!   and logs a warning (`tracing`) once when ours is not in place.
//! * A previous handler is called as the kernel would have called it (with `SA_SIGINFO`: `(sig, info, ucontext)`;
//!   else `(sig)`), but its `sa_mask` and `SA_RESETHAND` are not applied. `SIG_DFL` or `SIG_IGN` before ours: the
//!   disposition is reset to `SIG_DFL` and the faulting instruction runs again, so the default action (core dump)
//!   happens with the right signal and address.
//! * The routines are invisible to AddressSanitizer and Miri. Under Miri (`cfg(miri)`) and on targets other than
//!   x86_64 Linux the same functions are plain `ptr::copy` / `ptr::write_bytes` / `AtomicU64` operations: defined
//!   for Miri's single-threaded unit tests, but **neither fault-tolerant nor race-defined** there (documented in
//!   `docs/TESTING.md`); [`FAULT_TOLERANT`] says which.

/// The memory behind an MR range could not be accessed (the application unmapped or protected it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fault;

/// True where the copies survive faults and are race-defined (x86_64 Linux, not under Miri).
pub const FAULT_TOLERANT: bool = cfg!(all(target_arch = "x86_64", target_os = "linux", not(miri)));

#[cfg(all(target_arch = "x86_64", target_os = "linux", not(miri)))]
mod imp {
    use super::Fault;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    // The routines, System V calling convention. Everything between `roce_verbs_fault_start` and
    // `roce_verbs_fault_end` may fault on application memory; the handler sends such a thread to
    // `roce_verbs_fault_fixup`, which clears the direction flag (a backward copy sets it), and returns 1 in rax and
    // rdx: the copy/fill routines' status is rax, the atomics' status is rdx (their old value is in rax). The stack
    // pointer is never moved inside the range, so the fixup's `ret` returns to the caller. `.hidden`: the symbols
    // stay inside the binary (the C library exports none of them).
    core::arch::global_asm!(
        ".pushsection .text.roce_verbs_fault,\"ax\",@progbits",
        ".p2align 4",
        ".globl roce_verbs_fault_copy",
        ".hidden roce_verbs_fault_copy",
        ".globl roce_verbs_fault_fill",
        ".hidden roce_verbs_fault_fill",
        ".globl roce_verbs_fault_cas64",
        ".hidden roce_verbs_fault_cas64",
        ".globl roce_verbs_fault_xadd64",
        ".hidden roce_verbs_fault_xadd64",
        ".globl roce_verbs_fault_bounds",
        ".hidden roce_verbs_fault_bounds",
        "roce_verbs_fault_start:",
        // copy(dst rdi, src rsi, len rdx) -> rax: memmove semantics. Up to 64 bytes: every byte is loaded before
        // any is stored (two or four possibly overlapping loads of 1/4/8/16 bytes), so overlap needs no care and a
        // fault stores nothing; `rep movsb` has a start-up cost of tens of cycles there. Larger: `rep movsb`,
        // backward when dst overlaps src from above.
        "roce_verbs_fault_copy:",
        "cmp rdx, 64",
        "ja 5f",
        "cmp rdx, 16",
        "jae 4f",
        "cmp rdx, 8",
        "jae 3f",
        "cmp rdx, 4",
        "jae 6f",
        "test rdx, rdx",
        "jz 7f",
        // 1..=3: bytes 0, len/2 and len-1.
        "mov rcx, rdx",
        "shr rcx, 1",
        "movzx eax, byte ptr [rsi]",
        "movzx r8d, byte ptr [rsi + rcx]",
        "movzx r9d, byte ptr [rsi + rdx - 1]",
        "mov byte ptr [rdi], al",
        "mov byte ptr [rdi + rcx], r8b",
        "mov byte ptr [rdi + rdx - 1], r9b",
        "7:",
        "xor eax, eax",
        "ret",
        // 4..=7: two 4-byte words.
        "6:",
        "mov eax, dword ptr [rsi]",
        "mov ecx, dword ptr [rsi + rdx - 4]",
        "mov dword ptr [rdi], eax",
        "mov dword ptr [rdi + rdx - 4], ecx",
        "xor eax, eax",
        "ret",
        // 8..=15: two 8-byte words.
        "3:",
        "mov rax, qword ptr [rsi]",
        "mov rcx, qword ptr [rsi + rdx - 8]",
        "mov qword ptr [rdi], rax",
        "mov qword ptr [rdi + rdx - 8], rcx",
        "xor eax, eax",
        "ret",
        // 16..=64: two (up to 32) or four 16-byte blocks.
        "4:",
        "cmp rdx, 32",
        "ja 8f",
        "movdqu xmm0, xmmword ptr [rsi]",
        "movdqu xmm1, xmmword ptr [rsi + rdx - 16]",
        "movdqu xmmword ptr [rdi], xmm0",
        "movdqu xmmword ptr [rdi + rdx - 16], xmm1",
        "xor eax, eax",
        "ret",
        "8:",
        "movdqu xmm0, xmmword ptr [rsi]",
        "movdqu xmm1, xmmword ptr [rsi + 16]",
        "movdqu xmm2, xmmword ptr [rsi + rdx - 32]",
        "movdqu xmm3, xmmword ptr [rsi + rdx - 16]",
        "movdqu xmmword ptr [rdi], xmm0",
        "movdqu xmmword ptr [rdi + 16], xmm1",
        "movdqu xmmword ptr [rdi + rdx - 32], xmm2",
        "movdqu xmmword ptr [rdi + rdx - 16], xmm3",
        "xor eax, eax",
        "ret",
        "5:",
        "mov rcx, rdx",
        "mov rax, rdi",
        "sub rax, rsi",
        "cmp rax, rdx",
        "jb 2f",
        "rep movsb",
        "xor eax, eax",
        "ret",
        "2:",
        "lea rsi, [rsi + rdx - 1]",
        "lea rdi, [rdi + rdx - 1]",
        "std",
        "rep movsb",
        "cld",
        "xor eax, eax",
        "ret",
        // fill(dst rdi, byte sil, len rdx) -> rax
        "roce_verbs_fault_fill:",
        "mov eax, esi",
        "mov rcx, rdx",
        "rep stosb",
        "xor eax, eax",
        "ret",
        // cas64(ptr rdi, expected rsi, new rdx) -> (old rax, status rdx)
        "roce_verbs_fault_cas64:",
        "mov rax, rsi",
        "lock cmpxchg qword ptr [rdi], rdx",
        "xor edx, edx",
        "ret",
        // xadd64(ptr rdi, add rsi) -> (old rax, status rdx)
        "roce_verbs_fault_xadd64:",
        "mov rax, rsi",
        "lock xadd qword ptr [rdi], rax",
        "xor edx, edx",
        "ret",
        "roce_verbs_fault_end:",
        "roce_verbs_fault_fixup:",
        "cld",
        "mov eax, 1",
        "mov edx, 1",
        "ret",
        // bounds(out rdi: *mut [usize; 3]): start, end, fixup.
        "roce_verbs_fault_bounds:",
        "lea rax, [rip + roce_verbs_fault_start]",
        "mov [rdi], rax",
        "lea rax, [rip + roce_verbs_fault_end]",
        "mov [rdi + 8], rax",
        "lea rax, [rip + roce_verbs_fault_fixup]",
        "mov [rdi + 16], rax",
        "ret",
        ".popsection",
    );

    /// Old value and status (0 = done, 1 = faulted) of an atomic routine: returned in rax:rdx.
    #[repr(C)]
    struct Atomic {
        old: u64,
        fault: u64,
    }

    unsafe extern "C" {
        fn roce_verbs_fault_copy(dst: *mut u8, src: *const u8, len: usize) -> u64;
        fn roce_verbs_fault_fill(dst: *mut u8, byte: u32, len: usize) -> u64;
        fn roce_verbs_fault_cas64(p: *mut u64, expected: u64, new: u64) -> Atomic;
        fn roce_verbs_fault_xadd64(p: *mut u64, add: u64) -> Atomic;
        fn roce_verbs_fault_bounds(out: *mut [usize; 3]);
    }

    /// The routines' range and fixup, read by the handler (set before the handler is installed).
    static BOUNDS: OnceLock<[usize; 3]> = OnceLock::new();
    /// The dispositions our handler replaced: `[SIGSEGV, SIGBUS]` (set before the handler is installed).
    static PREV: OnceLock<[libc::sigaction; 2]> = OnceLock::new();
    /// Faults taken inside the routines, process-wide.
    pub(super) static FAULTS: AtomicU64 = AtomicU64::new(0);
    /// A registration already warned that our handler was replaced.
    static WARNED: AtomicBool = AtomicBool::new(false);

    fn bounds() -> [usize; 3] {
        *BOUNDS.get_or_init(|| {
            let mut b = [0usize; 3];
            // SAFETY: the routine writes three words to `b`, which is valid for them, and touches nothing else.
            unsafe { roce_verbs_fault_bounds(&mut b) };
            b
        })
    }

    /// The signal handler: a fault inside the routines returns from the routine with status 1; any other fault goes
    /// to the previous disposition.
    extern "C" fn on_fault(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        if let Some(&[start, end, fixup]) = BOUNDS.get()
            && !ctx.is_null()
        {
            let uc = ctx.cast::<libc::ucontext_t>();
            // SAFETY: with SA_SIGINFO the kernel passes a valid `ucontext_t` of the interrupted thread as the third
            // argument; the handler runs on that thread and is the only code touching it until it returns.
            // Changing the saved RIP to the fixup makes `sigreturn` resume there; the fixup only sets registers
            // and returns, with the stack pointer the routine was entered with (the routines never move it).
            unsafe {
                let rip = &mut (*uc).uc_mcontext.gregs[libc::REG_RIP as usize];
                let at = *rip as usize;
                if (start..end).contains(&at) {
                    *rip = fixup as i64;
                    FAULTS.fetch_add(1, Ordering::Relaxed);
                    return;
                }
            }
        }
        pass_on(sig, info, ctx);
    }

    /// Hands a fault that is not ours to the disposition our handler replaced.
    fn pass_on(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let prev = PREV
            .get()
            .map(|p| if sig == libc::SIGBUS { p[1] } else { p[0] });
        match prev {
            Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
                if p.sa_flags & libc::SA_SIGINFO != 0 {
                    // SAFETY: the previous disposition was installed with SA_SIGINFO, so its handler has this
                    // three-argument signature; it is called with the arguments the kernel gave us.
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                        unsafe { std::mem::transmute(p.sa_sigaction) };
                    f(sig, info, ctx);
                } else {
                    // SAFETY: without SA_SIGINFO the previous handler is a one-argument `void (*)(int)`.
                    let f: extern "C" fn(libc::c_int) =
                        unsafe { std::mem::transmute(p.sa_sigaction) };
                    f(sig);
                }
            }
            _ => {
                // Default (or ignored, which for a synchronous fault would loop forever): restore the default
                // action and return; the faulting instruction runs again and the kernel ends the process with the
                // right signal.
                // SAFETY: `signal` is async-signal-safe and only changes the disposition of `sig`.
                unsafe { libc::signal(sig, libc::SIG_DFL) };
            }
        }
    }

    /// Installs the handler for SIGSEGV and SIGBUS once per process (see the module docs); later calls only check
    /// that it is still in place. Errors are logged: the copies still work, without fault tolerance.
    pub(crate) fn install() {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            bounds();
            let mut prev = [zeroed(), zeroed()];
            let mut act = zeroed();
            act.sa_sigaction = on_fault as *const () as libc::sighandler_t;
            act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
            // SAFETY: `sa_mask` is a valid `sigset_t` owned by `act`.
            unsafe { libc::sigemptyset(&mut act.sa_mask) };
            for (i, sig) in [libc::SIGSEGV, libc::SIGBUS].into_iter().enumerate() {
                // SAFETY: reading the current disposition into a valid, owned `sigaction`.
                if unsafe { libc::sigaction(sig, std::ptr::null(), &mut prev[i]) } != 0 {
                    tracing::warn!(sig, err = %std::io::Error::last_os_error(), "reading the fault disposition failed");
                    return;
                }
            }
            // The previous dispositions must be readable before the handler can run.
            let _ = PREV.set(prev);
            for sig in [libc::SIGSEGV, libc::SIGBUS] {
                // SAFETY: `act` is a fully initialised `sigaction` whose handler has the SA_SIGINFO signature.
                if unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) } != 0 {
                    tracing::warn!(sig, err = %std::io::Error::last_os_error(), "installing the MR fault handler failed: a fault on registered memory will end the process");
                }
            }
        });
        // Also right after installing: an interposed `sigaction` (UCX's) may have answered success without
        // installing anything.
        check_installed();
    }

    /// Warns once if our handler is not the one in place (replaced since [`install`], or never installed because
    /// `sigaction` was interposed; see the module docs).
    fn check_installed() {
        if WARNED.load(Ordering::Relaxed) {
            return;
        }
        for sig in [libc::SIGSEGV, libc::SIGBUS] {
            let mut cur = zeroed();
            // SAFETY: reading the current disposition into a valid, owned `sigaction`.
            let ok = unsafe { libc::sigaction(sig, std::ptr::null(), &mut cur) } == 0;
            if ok
                && cur.sa_sigaction != on_fault as *const () as libc::sighandler_t
                && !WARNED.swap(true, Ordering::Relaxed)
            {
                tracing::warn!(
                    sig,
                    "another SIGSEGV/SIGBUS handler replaced the MR fault handler: a fault on unmapped or protected \
                     registered memory now goes to it (usually ending the process)"
                );
            }
        }
    }

    fn zeroed() -> libc::sigaction {
        // SAFETY: `sigaction` is a C struct of integers, a signal set and an optional function pointer, for all of
        // which all-zero bytes are a valid value.
        unsafe { std::mem::zeroed() }
    }

    /// See [`super::copy`].
    #[inline]
    pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Fault> {
        // SAFETY: the caller guarantees the ranges are allocated to this process's use (super::copy's contract);
        // the routine touches exactly `len` bytes at each and returns 1 instead of crashing if a page is gone.
        match unsafe { roce_verbs_fault_copy(dst, src, len) } {
            0 => Ok(()),
            _ => Err(Fault),
        }
    }

    /// See [`super::fill`].
    #[inline]
    pub(crate) unsafe fn fill(dst: *mut u8, byte: u8, len: usize) -> Result<(), Fault> {
        // SAFETY: as `copy`.
        match unsafe { roce_verbs_fault_fill(dst, u32::from(byte), len) } {
            0 => Ok(()),
            _ => Err(Fault),
        }
    }

    /// See [`super::cas64`].
    #[inline]
    pub(crate) unsafe fn cas64(p: *mut u64, expected: u64, new: u64) -> Result<u64, Fault> {
        // SAFETY: as `copy`, for the 8 bytes at `p`.
        let r = unsafe { roce_verbs_fault_cas64(p, expected, new) };
        if r.fault == 0 { Ok(r.old) } else { Err(Fault) }
    }

    /// See [`super::fetch_add64`].
    #[inline]
    pub(crate) unsafe fn fetch_add64(p: *mut u64, add: u64) -> Result<u64, Fault> {
        // SAFETY: as `copy`, for the 8 bytes at `p`.
        let r = unsafe { roce_verbs_fault_xadd64(p, add) };
        if r.fault == 0 { Ok(r.old) } else { Err(Fault) }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux", not(miri))))]
mod imp {
    //! Plain operations: no fault tolerance, and concurrent copies are the RNIC contract's business (module docs).
    use super::Fault;
    use std::sync::atomic::{AtomicU64, Ordering};

    pub(super) static FAULTS: AtomicU64 = AtomicU64::new(0);

    pub(crate) fn install() {}

    pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Fault> {
        // SAFETY: super::copy's contract; `ptr::copy` allows overlap.
        unsafe { std::ptr::copy(src, dst, len) };
        Ok(())
    }

    pub(crate) unsafe fn fill(dst: *mut u8, byte: u8, len: usize) -> Result<(), Fault> {
        // SAFETY: super::fill's contract.
        unsafe { std::ptr::write_bytes(dst, byte, len) };
        Ok(())
    }

    pub(crate) unsafe fn cas64(p: *mut u64, expected: u64, new: u64) -> Result<u64, Fault> {
        // SAFETY: super::cas64's contract (valid, 8-byte aligned, only accessed atomically meanwhile).
        let a = unsafe { AtomicU64::from_ptr(p) };
        Ok(
            match a.compare_exchange(expected, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            },
        )
    }

    pub(crate) unsafe fn fetch_add64(p: *mut u64, add: u64) -> Result<u64, Fault> {
        // SAFETY: as `cas64`.
        let a = unsafe { AtomicU64::from_ptr(p) };
        Ok(a.fetch_add(add, Ordering::AcqRel))
    }
}

pub(crate) use imp::install;

/// Faults on application memory the copy routines have survived in this process (all devices, all regions).
pub fn memory_faults() -> u64 {
    imp::FAULTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Copies `len` bytes from `src` to `dst` (`memmove` semantics: the ranges may overlap). `Err(Fault)` if a page of
/// either range is not accessible (some bytes may have been copied).
///
/// # Safety
///
/// Both ranges are memory this process may access without breaking Rust's rules: either Rust-owned memory the
/// caller holds exclusively (for `dst`) or shared (for `src`), or MR memory that only these routines (and the
/// application's own raw code) access — never memory behind a live Rust reference that another party writes. A
/// range may be unmapped or protected (that is the fault this returns), but must not be memory that was reused
/// for something else.
#[inline]
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) -> Result<(), Fault> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: forwarded contract.
    unsafe { imp::copy(dst, src, len) }
}

/// Sets `len` bytes at `dst` to `byte`. `Err(Fault)` as [`copy`].
///
/// # Safety
///
/// As [`copy`] for `dst`.
#[inline]
pub(crate) unsafe fn fill(dst: *mut u8, byte: u8, len: usize) -> Result<(), Fault> {
    if len == 0 {
        return Ok(());
    }
    // SAFETY: forwarded contract.
    unsafe { imp::fill(dst, byte, len) }
}

/// Atomic compare-and-swap of the native-endian word at `p` (8-byte aligned): the value before. `Err(Fault)` as
/// [`copy`].
///
/// # Safety
///
/// As [`copy`] for the 8 bytes at `p`, which is 8-byte aligned.
#[inline]
pub(crate) unsafe fn cas64(p: *mut u64, expected: u64, new: u64) -> Result<u64, Fault> {
    // SAFETY: forwarded contract.
    unsafe { imp::cas64(p, expected, new) }
}

/// Atomic wrapping fetch-and-add of the native-endian word at `p` (8-byte aligned): the value before.
/// `Err(Fault)` as [`copy`].
///
/// # Safety
///
/// As [`cas64`].
#[inline]
pub(crate) unsafe fn fetch_add64(p: *mut u64, add: u64) -> Result<u64, Fault> {
    // SAFETY: forwarded contract.
    unsafe { imp::fetch_add64(p, add) }
}

#[cfg(all(test, target_arch = "x86_64", target_os = "linux", not(miri)))]
mod tests {
    use super::*;

    /// One anonymous page, read-write.
    fn page() -> *mut u8 {
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        p.cast()
    }

    #[test]
    fn copies_fill_and_atomics_work_and_survive_protected_pages() {
        install();
        let p = page();
        let mut buf = [0u8; 100];
        let src: Vec<u8> = (0..100u8).collect();
        // SAFETY: `p` is this test's own page; `buf`/`src` are exclusively/shared borrowed.
        unsafe {
            copy(p.add(10), src.as_ptr(), 100).expect("mapped");
            copy(buf.as_mut_ptr(), p.add(10), 100).expect("mapped");
            assert_eq!(buf[..], src[..]);
            // Overlapping, dst above src (backward copy) and below it (forward).
            copy(p.add(11), p.add(10), 100).expect("mapped");
            copy(buf.as_mut_ptr(), p.add(11), 100).expect("mapped");
            assert_eq!(buf[..], src[..]);
            copy(p, p.add(11), 100).expect("mapped");
            copy(buf.as_mut_ptr(), p, 100).expect("mapped");
            assert_eq!(buf[..], src[..]);
            fill(p.add(200), 0xab, 8).expect("mapped");
            let w = p.add(200).cast::<u64>();
            assert_eq!(
                cas64(w, 0, 1),
                Ok(0xabab_abab_abab_abab),
                "mismatch: no swap"
            );
            assert_eq!(
                cas64(w, 0xabab_abab_abab_abab, 5),
                Ok(0xabab_abab_abab_abab)
            );
            assert_eq!(fetch_add64(w, u64::MAX), Ok(5), "wrapping");
            assert_eq!(fetch_add64(w, 0), Ok(4));
            let before = memory_faults();
            assert_eq!(libc::mprotect(p.cast(), 4096, libc::PROT_READ), 0);
            copy(buf.as_mut_ptr(), p.add(10), 100).expect("readable");
            assert_eq!(copy(p.add(4000), src.as_ptr(), 100), Err(Fault));
            assert_eq!(fill(p, 0, 4096), Err(Fault));
            assert_eq!(cas64(w, 4, 5), Err(Fault));
            assert_eq!(fetch_add64(w, 1), Err(Fault));
            assert_eq!(libc::mprotect(p.cast(), 4096, libc::PROT_NONE), 0);
            assert_eq!(copy(buf.as_mut_ptr(), p, 1), Err(Fault));
            // A backward copy that faults leaves the direction flag cleared (the fixup's `cld`): the next
            // forward copy works.
            assert_eq!(copy(p.add(1), p, 64), Err(Fault));
            let mut x = [0u8; 64];
            copy(x.as_mut_ptr(), src.as_ptr(), 64).expect("Rust memory");
            assert_eq!(x[..], src[..64]);
            assert!(memory_faults() >= before + 6, "six faults taken");
            assert_eq!(libc::munmap(p.cast(), 4096), 0);
        }
    }

    /// Every length up to 300 (the small-copy paths up to 64 bytes, `rep movsb` beyond), at every relative
    /// position of overlapping source and destination, gives what `ptr::copy` (memmove) gives.
    #[test]
    fn copy_matches_memmove_for_every_length_and_overlap() {
        let pattern: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in 0..=300usize {
            for (src_off, dst_off) in [
                (100, 500),
                (100, 100),
                (100, 101),
                (101, 100),
                (100, 108),
                (108, 100),
                (100, 100 + len / 2),
                (100 + len / 2, 100),
                (100, 99 + len),
            ] {
                let mut want = pattern.clone();
                let mut got = pattern.clone();
                // SAFETY: both ranges lie inside the 1024-byte vectors (offsets + len <= 700); raw pointers of one
                // vector only.
                unsafe {
                    let w = want.as_mut_ptr();
                    std::ptr::copy(w.add(src_off), w.add(dst_off), len);
                    let g = got.as_mut_ptr();
                    copy(g.add(dst_off), g.add(src_off), len).expect("Rust memory");
                }
                assert_eq!(got, want, "len {len}, src {src_off}, dst {dst_off}");
            }
        }
    }

    /// SIGBUS (a file mapping beyond the file's end, e.g. an MR over a file another process truncated) is
    /// survived as SIGSEGV is.
    #[test]
    fn bus_errors_on_a_truncated_file_mapping_are_faults() {
        install();
        // SAFETY: a fresh memfd, a shared mapping of it, then shrinking the file: only this test's objects.
        unsafe {
            let fd = libc::memfd_create(c"roce-verbs-fault-test".as_ptr(), 0);
            assert!(fd >= 0, "memfd_create");
            assert_eq!(libc::ftruncate(fd, 8192), 0);
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let p = p.cast::<u8>();
            fill(p, 7, 8192).expect("backed by the file");
            assert_eq!(libc::ftruncate(fd, 4096), 0);
            let mut b = [0u8; 16];
            copy(b.as_mut_ptr(), p.add(4000), 16).expect("first page still backed");
            assert_eq!(b, [7u8; 16]);
            assert_eq!(copy(b.as_mut_ptr(), p.add(4096), 16), Err(Fault), "SIGBUS");
            assert_eq!(fetch_add64(p.add(4096).cast::<u64>(), 1), Err(Fault));
            libc::munmap(p.cast(), 8192);
            libc::close(fd);
        }
    }

    /// A fault outside the routines is not ours: it goes on to the previous disposition and still ends the
    /// process with SIGSEGV (checked in a forked child).
    #[test]
    fn other_faults_still_end_the_process() {
        install();
        let p = page();
        // SAFETY: protecting this test's own page.
        let r = unsafe { libc::mprotect(p.cast(), 4096, libc::PROT_NONE) };
        assert_eq!(r, 0);
        // SAFETY: the child only stores to the protected page (it faults) and, should it return, `_exit`s; both
        // are async-signal-safe, as a child of a multi-threaded process needs.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            // SAFETY: a deliberate store to a PROT_NONE page outside the routines.
            unsafe {
                std::ptr::write_volatile(p, 1);
                libc::_exit(0);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFSIGNALED(status), "child status {status:#x}");
        assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
        // SAFETY: unmapping this test's own page.
        unsafe { libc::munmap(p.cast(), 4096) };
    }
}
