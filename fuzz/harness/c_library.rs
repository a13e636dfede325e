//! Harness of the fuzz target `c_library` (issue #21), shared by `fuzz/fuzz_targets/c_library.rs` and the replay test
//! `crates/roce-ibverbs/tests/fuzz_c_library.rs`.
//!
//! Calls the C entry points of roce-ibverbs (`rocev2_ibv_*`, the implementations exported as `ibv_*@@IBVERBS_1.x`
//! from `libibverbs.so.1`; linked here from the crate's rlib, so the fuzzer sees the library's coverage) in an order
//! the input chooses: open / close up to two contexts on the device `ROCEV2_IBV_IP` names (127.0.207.1, loopback),
//! alloc / dealloc PDs, create / destroy CQs, register / deregister MRs, create / modify (the attribute block and
//! mask are fuzzer bytes: `ibv_qp_attr` holds no pointers) / query / destroy QPs, create / destroy AHs (fuzzer
//! bytes for `ibv_ah_attr`). Misuse included, but only the misuse the library promises to detect (lib.rs "Object
//! lifetimes", module `exports::live`): every destroy, dealloc, dereg and close may be given a handle of the right
//! kind that was already destroyed (or freed with its context), or NULL, and must answer `EINVAL` (or succeed if the
//! pointer is live again because the library reused the address). Other calls get only live handles, as the C
//! API requires.
//!
//! Invariants (a violation panics): no crash or abort; a destroy of a handle the library does not hold never
//! returns 0 unless the address is live again; a destroy of a live handle that nothing depends on returns 0.

use core::ffi::{c_int, c_void};
use core::ptr::null_mut;

// The library's rlib provides the `rocev2_ibv_*` symbols declared below.
use roce_ibverbs as _;

/// The device address the harness uses (loopback; issue #21's range for this target).
pub const IP: &str = "127.0.207.1";

type P = *mut c_void;

unsafe extern "C" {
    fn rocev2_ibv_get_device_list(num: *mut c_int) -> *mut P;
    fn rocev2_ibv_free_device_list(list: *mut P);
    fn rocev2_ibv_open_device(dev: P) -> P;
    fn rocev2_ibv_close_device(ctx: P) -> c_int;
    fn rocev2_ibv_alloc_pd(ctx: P) -> P;
    fn rocev2_ibv_dealloc_pd(pd: P) -> c_int;
    fn rocev2_ibv_create_cq(ctx: P, cqe: c_int, cq_ctx: P, chan: P, vector: c_int) -> P;
    fn rocev2_ibv_destroy_cq(cq: P) -> c_int;
    fn rocev2_ibv_reg_mr(pd: P, addr: P, len: usize, access: c_int) -> P;
    fn rocev2_ibv_dereg_mr(mr: P) -> c_int;
    fn rocev2_ibv_create_qp(pd: P, init: P) -> P;
    fn rocev2_ibv_destroy_qp(qp: P) -> c_int;
    fn rocev2_ibv_modify_qp(qp: P, attr: P, mask: c_int) -> c_int;
    fn rocev2_ibv_query_qp(qp: P, attr: P, mask: c_int, init: P) -> c_int;
    fn rocev2_ibv_create_ah(pd: P, attr: P) -> P;
    fn rocev2_ibv_destroy_ah(ah: P) -> c_int;
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Ctx,
    Pd,
    Cq,
    Mr,
    Qp,
    Ah,
}

struct Obj {
    kind: Kind,
    ptr: P,
    /// Index of the owning context in `World::objs` order (its pointer).
    ctx: P,
    /// Objects this one depends on (PD of an MR/QP/AH, CQs of a QP).
    deps: Vec<P>,
    /// The memory of an MR (kept until the MR is gone).
    mem: Option<Vec<u8>>,
}

/// Reads the fuzzer's program: a byte at a time, 0 once it is used up.
struct Input<'a> {
    data: &'a [u8],
}

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }
    fn fill(&mut self, out: &mut [u8]) {
        for b in out {
            *b = self.u8();
        }
    }
}

/// What one run did (the replay test checks that its seeds reach the library).
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Objects created.
    pub created: u64,
    /// Destroys of live objects that succeeded.
    pub destroyed: u64,
    /// Destroys of dead handles answered with an error.
    pub refused: u64,
}

struct World {
    dev: P,
    live: Vec<Obj>,
    /// Handles that were destroyed (or went with their context), by kind.
    dead: Vec<(Kind, P)>,
    stats: Stats,
}

fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

impl World {
    fn pick(&self, inp: &mut Input<'_>, kind: Kind) -> Option<usize> {
        let ix: Vec<usize> = (0..self.live.len())
            .filter(|&i| self.live[i].kind == kind)
            .collect();
        let b = usize::from(inp.u8());
        (!ix.is_empty()).then(|| ix[b % ix.len()])
    }

    /// Like [`pick`](Self::pick), among the objects of context `ctx`.
    fn pick_in(&self, inp: &mut Input<'_>, kind: Kind, ctx: P) -> Option<usize> {
        let ix: Vec<usize> = (0..self.live.len())
            .filter(|&i| self.live[i].kind == kind && self.live[i].ctx == ctx)
            .collect();
        let b = usize::from(inp.u8());
        (!ix.is_empty()).then(|| ix[b % ix.len()])
    }

    fn add(&mut self, kind: Kind, ptr: P, ctx: P, deps: Vec<P>, mem: Option<Vec<u8>>) {
        if ptr.is_null() {
            return;
        }
        // A new object at an address the harness had as dead: it is live again.
        self.dead.retain(|d| d.1 != ptr);
        self.stats.created += 1;
        self.live.push(Obj {
            kind,
            ptr,
            ctx,
            deps,
            mem,
        });
    }

    /// The library released `ptr`: it and (for a context) everything it owned are dead.
    fn gone(&mut self, ptr: P) {
        let mut drop_ptrs = vec![ptr];
        if let Some(o) = self.live.iter().find(|o| o.ptr == ptr)
            && o.kind == Kind::Ctx
        {
            drop_ptrs.extend(self.live.iter().filter(|o| o.ctx == ptr).map(|o| o.ptr));
        }
        let (dead, keep): (Vec<Obj>, Vec<Obj>) = std::mem::take(&mut self.live)
            .into_iter()
            .partition(|o| drop_ptrs.contains(&o.ptr));
        self.live = keep;
        for o in dead {
            self.dead.push((o.kind, o.ptr));
            // The MR's memory may go now: the library no longer touches it.
            drop(o.mem);
        }
    }

    fn destroy_fn(kind: Kind) -> unsafe extern "C" fn(P) -> c_int {
        match kind {
            Kind::Ctx => rocev2_ibv_close_device,
            Kind::Pd => rocev2_ibv_dealloc_pd,
            Kind::Cq => rocev2_ibv_destroy_cq,
            Kind::Mr => rocev2_ibv_dereg_mr,
            Kind::Qp => rocev2_ibv_destroy_qp,
            Kind::Ah => rocev2_ibv_destroy_ah,
        }
    }

    /// Destroys a live object of `kind` (if nothing depends on it, it must succeed), a dead handle, or NULL.
    fn destroy(&mut self, kind: Kind, inp: &mut Input<'_>) {
        let how = inp.u8();
        let f = Self::destroy_fn(kind);
        if how & 3 == 0 {
            let dead: Vec<P> = self
                .dead
                .iter()
                .filter(|d| d.0 == kind)
                .map(|d| d.1)
                .collect();
            let p = if dead.is_empty() {
                null_mut()
            } else {
                dead[usize::from(how >> 2) % dead.len()]
            };
            let live_again = self.live.iter().any(|o| o.ptr == p);
            // SAFETY: `p` is NULL or a handle of this kind the library handed out and released; the library looks
            // destroy arguments up in its table of live objects before touching them (lib.rs "Object lifetimes").
            let r = unsafe { f(p) };
            if live_again {
                if r == 0 {
                    self.gone(p);
                }
            } else {
                assert_ne!(r, 0, "{kind:?} destroy of a dead handle {p:?} succeeded");
                self.stats.refused += 1;
            }
            return;
        }
        let Some(i) = self.pick(inp, kind) else {
            return;
        };
        let p = self.live[i].ptr;
        let depended = self
            .live
            .iter()
            .any(|o| o.deps.contains(&p) || (kind == Kind::Ctx && o.ctx == p && o.ptr != p));
        // SAFETY: `p` is a live handle of this kind.
        let r = unsafe { f(p) };
        if r == 0 {
            self.stats.destroyed += 1;
            self.gone(p);
        } else {
            assert!(
                depended,
                "{kind:?} destroy of a live handle nothing depends on failed: {r} (errno {})",
                errno()
            );
        }
    }

    fn step(&mut self, inp: &mut Input<'_>) {
        let op = inp.u8();
        match op % 24 {
            0 => {
                if self.live.iter().filter(|o| o.kind == Kind::Ctx).count() < 2 {
                    // SAFETY: `dev` is the device of the list the harness keeps.
                    let c = unsafe { rocev2_ibv_open_device(self.dev) };
                    self.add(Kind::Ctx, c, c, Vec::new(), None);
                }
            }
            1 => self.destroy(Kind::Ctx, inp),
            2 | 3 => {
                if let Some(c) = self.pick(inp, Kind::Ctx) {
                    let c = self.live[c].ptr;
                    // SAFETY: a live context.
                    let pd = unsafe { rocev2_ibv_alloc_pd(c) };
                    self.add(Kind::Pd, pd, c, Vec::new(), None);
                }
            }
            4 => self.destroy(Kind::Pd, inp),
            5 | 6 => {
                let cqe = c_int::from(inp.u8()) - 8;
                let vector = c_int::from(inp.u8() % 3);
                if let Some(c) = self.pick(inp, Kind::Ctx) {
                    let c = self.live[c].ptr;
                    // SAFETY: a live context, no channel.
                    let cq =
                        unsafe { rocev2_ibv_create_cq(c, cqe, null_mut(), null_mut(), vector) };
                    self.add(Kind::Cq, cq, c, Vec::new(), None);
                }
            }
            7 => self.destroy(Kind::Cq, inp),
            8 | 9 => {
                let len = usize::from(inp.u8()) * 64;
                let access = c_int::from(inp.u8() & 0x1f);
                if let Some(p) = self.pick(inp, Kind::Pd) {
                    let (pd, c) = (self.live[p].ptr, self.live[p].ctx);
                    let mut mem = vec![0u8; len.max(1)];
                    // SAFETY: a live PD; `mem` is `len` bytes of this process's memory, kept until the MR is gone.
                    let mr = unsafe { rocev2_ibv_reg_mr(pd, mem.as_mut_ptr().cast(), len, access) };
                    self.add(Kind::Mr, mr, c, vec![pd], Some(mem));
                }
            }
            10 => self.destroy(Kind::Mr, inp),
            11..=13 => {
                let mut init = [0u8; 64];
                let t = inp.u8();
                // cap: max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data (u32 each) at 32.
                for k in 0..5 {
                    let v = u32::from(inp.u8());
                    init[32 + 4 * k..36 + 4 * k].copy_from_slice(&v.to_ne_bytes());
                }
                // qp_type (RC 2, UC 3, UD 4, or anything) at 52, sq_sig_all at 56.
                let qp_type = match t & 7 {
                    0..=1 => 2u32,
                    2 => 3,
                    3 => 4,
                    _ => u32::from(t),
                };
                init[52..56].copy_from_slice(&qp_type.to_ne_bytes());
                init[56..60].copy_from_slice(&u32::from(t >> 7).to_ne_bytes());
                let Some(p) = self.pick(inp, Kind::Pd) else {
                    return;
                };
                let (pd, c) = (self.live[p].ptr, self.live[p].ctx);
                // CQs of the PD's context (a CQ of another context is not something the library promises to
                // detect).
                let (Some(s), Some(r)) = (
                    self.pick_in(inp, Kind::Cq, c),
                    self.pick_in(inp, Kind::Cq, c),
                ) else {
                    return;
                };
                let (scq, rcq) = (self.live[s].ptr, self.live[r].ptr);
                init[8..16].copy_from_slice(&(scq as usize).to_ne_bytes());
                init[16..24].copy_from_slice(&(rcq as usize).to_ne_bytes());
                // SAFETY: a live PD and CQs of its context, a 64-byte ibv_qp_init_attr.
                let qp = unsafe { rocev2_ibv_create_qp(pd, init.as_mut_ptr().cast()) };
                self.add(Kind::Qp, qp, c, vec![pd, scq, rcq], None);
            }
            14 => self.destroy(Kind::Qp, inp),
            15..=17 => {
                let mut attr = [0u8; 144];
                inp.fill(&mut attr[..40]);
                // qp_state at 0: mostly a valid state (0 ..= 6).
                attr[0] %= 8;
                attr[1..4].fill(0);
                inp.fill(&mut attr[56..88]);
                inp.fill(&mut attr[120..140]);
                let mask = c_int::from_ne_bytes([inp.u8(), inp.u8(), inp.u8() & 0x3f, 0]);
                if let Some(q) = self.pick(inp, Kind::Qp) {
                    let qp = self.live[q].ptr;
                    // SAFETY: a live QP; a 144-byte ibv_qp_attr without pointers.
                    unsafe { rocev2_ibv_modify_qp(qp, attr.as_mut_ptr().cast(), mask) };
                }
            }
            18 => {
                let mask = c_int::from_ne_bytes([inp.u8(), inp.u8(), inp.u8() & 0x3f, 0]);
                if let Some(q) = self.pick(inp, Kind::Qp) {
                    let qp = self.live[q].ptr;
                    let mut attr = [0u8; 144];
                    let mut init = [0u8; 64];
                    // SAFETY: a live QP; out-buffers of the structs' sizes.
                    unsafe {
                        rocev2_ibv_query_qp(
                            qp,
                            attr.as_mut_ptr().cast(),
                            mask,
                            init.as_mut_ptr().cast(),
                        )
                    };
                }
            }
            19 | 20 => {
                let mut attr = [0u8; 32];
                inp.fill(&mut attr);
                if let Some(p) = self.pick(inp, Kind::Pd) {
                    let (pd, c) = (self.live[p].ptr, self.live[p].ctx);
                    // SAFETY: a live PD; a 32-byte ibv_ah_attr without pointers.
                    let ah = unsafe { rocev2_ibv_create_ah(pd, attr.as_mut_ptr().cast()) };
                    self.add(Kind::Ah, ah, c, vec![pd], None);
                }
            }
            21 => self.destroy(Kind::Ah, inp),
            _ => {
                // Any kind's destroy given a dead handle or NULL.
                let kind = [Kind::Ctx, Kind::Pd, Kind::Cq, Kind::Mr, Kind::Qp, Kind::Ah]
                    [usize::from(inp.u8()) % 6];
                let mut zero = Input { data: &[0] };
                self.destroy(kind, &mut zero);
            }
        }
    }
}

/// Sets `ROCEV2_IBV_IP` (once, before the library's first device lookup reads it).
fn set_device_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: runs once, before this harness calls into the library; the harness's process (the fuzz target,
        // or the replay test binary whose only test calls this first) reads no environment concurrently.
        unsafe { std::env::set_var("ROCEV2_IBV_IP", IP) };
    });
}

/// Runs one input (see the module documentation). Panics when an invariant breaks.
pub fn run(data: &[u8]) {
    run_stats(data);
}

/// [`run`], returning what the run did.
pub fn run_stats(data: &[u8]) -> Stats {
    set_device_env();
    let mut num: c_int = 0;
    // SAFETY: out-parameter of the right type.
    let list = unsafe { rocev2_ibv_get_device_list(&mut num) };
    assert!(
        !list.is_null() && num == 1,
        "no device for ROCEV2_IBV_IP={IP}"
    );
    // SAFETY: the list holds `num` (1) devices and a NULL.
    let dev = unsafe { *list };
    let mut w = World {
        dev,
        live: Vec::new(),
        dead: Vec::new(),
        stats: Stats::default(),
    };
    let mut inp = Input { data };
    let mut ops = 0;
    while !inp.data.is_empty() && ops < 256 {
        ops += 1;
        w.step(&mut inp);
    }
    // Close every context left: it releases everything it owns (and a second close is refused).
    let ctxs: Vec<P> = w
        .live
        .iter()
        .filter(|o| o.kind == Kind::Ctx)
        .map(|o| o.ptr)
        .collect();
    for c in ctxs {
        // SAFETY: a live context.
        let r = unsafe { rocev2_ibv_close_device(c) };
        assert_eq!(r, 0, "ibv_close_device of a live context failed");
        w.gone(c);
        // SAFETY: `c` was just closed; the library refuses it from its table.
        let r2 = unsafe { rocev2_ibv_close_device(c) };
        assert_ne!(r2, 0, "second ibv_close_device succeeded");
    }
    assert!(w.live.is_empty(), "objects outlived their context");
    // SAFETY: the list from `ibv_get_device_list`, freed once.
    unsafe { rocev2_ibv_free_device_list(list) };
    w.stats
}
