//! The XDP program of [`super::XdpLink`], assembled here as eBPF instructions and loaded with the `bpf(2)` system
//! call: no clang, no libbpf, no object file at build or run time.
//!
//! The program (Linux `Documentation/bpf/standardization/instruction-set.rst` for the encoding,
//! `include/uapi/linux/bpf.h` for the helper and the `xdp_md` context):
//!
//! ```text
//! if the frame is shorter than Ethernet + IPv4 (no options) + UDP           -> XDP_PASS
//! if EtherType != IPv4, IHL != 5, protocol != UDP, or it is a fragment      -> XDP_PASS
//! if destination address != local or destination port != port              -> XDP_PASS
//! return bpf_redirect_map(&xskmap, ctx->rx_queue_index, XDP_PASS)
//! ```
//!
//! so RoCE v2 to our address goes to the AF_XDP socket of the receive queue and every other frame (ARP, ICMP,
//! the out-of-band TCP of `rocev2 perf`) to the kernel. The last argument of `bpf_redirect_map` (its low bits:
//! the action when the key has no socket, Linux ≥ 5.3) passes frames of queues without a socket to the kernel.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `bpf(2)` commands, map/program/attach types (`include/uapi/linux/bpf.h`, values checked against the
/// installed header).
const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_MAP_TYPE_XSKMAP: u32 = 17;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
const BPF_FUNC_REDIRECT_MAP: i32 = 51;
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// `XDP_FLAGS_SKB_MODE`: the program runs in the kernel's generic receive path (`include/uapi/linux/if_link.h`).
pub(super) const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
/// `XDP_FLAGS_DRV_MODE`: the program runs in the driver.
pub(super) const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
/// `XDP_PASS` (`enum xdp_action`).
const XDP_PASS: i32 = 2;
/// `sizeof(union bpf_attr)` on Linux 6.x; the kernel accepts a shorter or equal size with zeroed tail.
const ATTR_LEN: usize = 144;

/// One eBPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy)]
#[repr(C)]
struct Insn {
    code: u8,
    /// dst_reg (low nibble), src_reg (high nibble).
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

// Opcodes: class | size/op | mode/source.
const LDX_W: u8 = 0x61; // BPF_LDX | BPF_MEM | BPF_W
const LDX_H: u8 = 0x69; // BPF_LDX | BPF_MEM | BPF_H
const LDX_B: u8 = 0x71; // BPF_LDX | BPF_MEM | BPF_B
const MOV64_X: u8 = 0xbf; // BPF_ALU64 | BPF_MOV | BPF_X
const MOV64_K: u8 = 0xb7; // BPF_ALU64 | BPF_MOV | BPF_K
const ADD64_K: u8 = 0x07; // BPF_ALU64 | BPF_ADD | BPF_K
const AND64_K: u8 = 0x57; // BPF_ALU64 | BPF_AND | BPF_K
const JGT_X: u8 = 0x2d; // BPF_JMP | BPF_JGT | BPF_X
const JNE_K: u8 = 0x55; // BPF_JMP | BPF_JNE | BPF_K
const JNE32_K: u8 = 0x56; // BPF_JMP32 | BPF_JNE | BPF_K (compares the low 32 bits, no sign extension)
const LD_IMM64: u8 = 0x18; // BPF_LD | BPF_DW | BPF_IMM (two slots)
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;

/// Number of instructions of [`program`].
const PROG_LEN: usize = 27;

/// The program for destination `local`:`port` and the XSKMAP `map_fd` (see the module docs). Packet bytes are
/// loaded little-endian, so network-order constants are byte-swapped here.
fn program(local: Ipv4Addr, port: u16, map_fd: i32) -> [Insn; PROG_LEN] {
    // Index of the `pass:` label; jump offsets are relative to the next instruction.
    const PASS: i16 = 25;
    let to_pass = |at: i16| PASS - at - 1;
    let ip = i32::from_le_bytes(local.octets());
    let port_le = i32::from(u16::from_le_bytes(port.to_be_bytes()));
    [
        /* 0 */ insn(MOV64_X, 6, 1, 0, 0), // r6 = ctx
        /* 1 */ insn(LDX_W, 2, 1, 0, 0), // r2 = ctx->data
        /* 2 */ insn(LDX_W, 3, 1, 4, 0), // r3 = ctx->data_end
        /* 3 */ insn(MOV64_X, 4, 2, 0, 0), // r4 = data
        /* 4 */ insn(ADD64_K, 4, 0, 0, 42), // r4 += 14 + 20 + 8
        /* 5 */ insn(JGT_X, 4, 3, to_pass(5), 0), // if r4 > data_end: pass
        /* 6 */ insn(LDX_H, 5, 2, 12, 0), // EtherType
        /* 7 */ insn(JNE_K, 5, 0, to_pass(7), 0x0008), // != 0x0800 (IPv4)
        /* 8 */ insn(LDX_B, 5, 2, 14, 0), // version + IHL
        /* 9 */ insn(JNE_K, 5, 0, to_pass(9), 0x45),
        /* 10 */ insn(LDX_B, 5, 2, 23, 0), // protocol
        /* 11 */ insn(JNE_K, 5, 0, to_pass(11), 17), // UDP
        /* 12 */ insn(LDX_H, 5, 2, 20, 0), // flags + fragment offset
        /* 13 */ insn(AND64_K, 5, 0, 0, 0xff3f), // MF + offset (little-endian view)
        /* 14 */
        insn(JNE_K, 5, 0, to_pass(14), 0), // a fragment: the kernel reassembles
        /* 15 */ insn(LDX_W, 5, 2, 30, 0), // destination address
        /* 16 */ insn(JNE32_K, 5, 0, to_pass(16), ip),
        /* 17 */ insn(LDX_H, 5, 2, 36, 0), // UDP destination port
        /* 18 */ insn(JNE_K, 5, 0, to_pass(18), port_le),
        /* 19 */ insn(LDX_W, 2, 6, 16, 0), // r2 = ctx->rx_queue_index
        /* 20 */ insn(LD_IMM64, 1, BPF_PSEUDO_MAP_FD, 0, map_fd), // r1 = &xskmap
        /* 21 */ insn(0, 0, 0, 0, 0), // (upper half of the 64-bit immediate)
        /* 22 */
        insn(MOV64_K, 3, 0, 0, XDP_PASS), // r3 = action when the queue has no socket
        /* 23 */ insn(CALL, 0, 0, 0, BPF_FUNC_REDIRECT_MAP),
        /* 24 */ insn(EXIT, 0, 0, 0, 0),
        /* 25 pass: */ insn(MOV64_K, 0, 0, 0, XDP_PASS),
        /* 26 */ insn(EXIT, 0, 0, 0, 0),
    ]
}

/// Calls `bpf(cmd, attr, ATTR_LEN)`; a new file descriptor on success.
fn bpf_fd(cmd: libc::c_int, attr: &mut [u8; ATTR_LEN], what: &'static str) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a valid, writable `union bpf_attr`-sized buffer for the duration of the call; the kernel
    // reads (and for some commands writes) at most `ATTR_LEN` bytes of it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            ATTR_LEN as libc::c_uint,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), super::OsCause { what, err: e }));
    }
    let fd = i32::try_from(r).map_err(|_| io::Error::other("bpf returned no descriptor"))?;
    // SAFETY: on success these commands return a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn put32(a: &mut [u8; ATTR_LEN], at: usize, v: u32) {
    a[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put64(a: &mut [u8; ATTR_LEN], at: usize, v: u64) {
    a[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// The kernel objects of one attachment: the XSKMAP, the program, and the `bpf_link` that holds it on the
/// interface. Dropping it closes the link descriptor, which detaches the program (a `bpf_link` never outlives
/// its last descriptor, so a crashed process leaves no program behind).
pub(super) struct Attached {
    map: OwnedFd,
    _prog: OwnedFd,
    _link: OwnedFd,
}

impl Attached {
    /// Creates an XSKMAP of `queues` entries, loads the program for `local`:`port` and attaches it to `ifindex`
    /// in the mode `flags` asks for ([`XDP_FLAGS_DRV_MODE`] or [`XDP_FLAGS_SKB_MODE`], `include/uapi/linux/if_link.h`).
    pub(super) fn attach(
        ifindex: u32,
        queues: u32,
        local: Ipv4Addr,
        port: u16,
        flags: u32,
    ) -> io::Result<Attached> {
        let mut a = [0u8; ATTR_LEN];
        put32(&mut a, 0, BPF_MAP_TYPE_XSKMAP);
        put32(&mut a, 4, 4); // key_size
        put32(&mut a, 8, 4); // value_size
        put32(&mut a, 12, queues.max(1)); // max_entries
        let map = bpf_fd(
            BPF_MAP_CREATE,
            &mut a,
            "creating the XSKMAP (bpf BPF_MAP_CREATE)",
        )?;

        let prog = program(local, port, map.as_raw_fd());
        let license = c"Dual MIT/GPL";
        let mut log = [0u8; 4096];
        let mut a = [0u8; ATTR_LEN];
        put32(&mut a, 0, BPF_PROG_TYPE_XDP);
        put32(&mut a, 4, PROG_LEN as u32);
        put64(&mut a, 8, prog.as_ptr() as u64);
        put64(&mut a, 16, license.as_ptr() as u64);
        put32(&mut a, 24, 1); // log_level
        put32(&mut a, 28, log.len() as u32);
        put64(&mut a, 32, log.as_mut_ptr() as u64);
        a[48..56].copy_from_slice(b"rocev2_x"); // prog_name
        put32(&mut a, 68, BPF_XDP); // expected_attach_type
        let prog_fd = bpf_fd(
            BPF_PROG_LOAD,
            &mut a,
            "loading the XDP program (bpf BPF_PROG_LOAD)",
        )
        .map_err(|e| {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            if text.trim().is_empty() {
                e
            } else {
                io::Error::new(e.kind(), format!("{e}; verifier: {}", text.trim()))
            }
        })?;

        let mut a = [0u8; ATTR_LEN];
        put32(&mut a, 0, prog_fd.as_raw_fd() as u32);
        put32(&mut a, 4, ifindex);
        put32(&mut a, 8, BPF_XDP);
        put32(&mut a, 12, flags);
        let link = bpf_fd(
            BPF_LINK_CREATE,
            &mut a,
            "attaching the XDP program (bpf BPF_LINK_CREATE)",
        )?;
        Ok(Attached {
            map,
            _prog: prog_fd,
            _link: link,
        })
    }

    /// Puts the AF_XDP socket `xsk` into the map at `queue` (`BPF_MAP_UPDATE_ELEM`).
    pub(super) fn insert(&self, queue: u32, xsk: i32) -> io::Result<()> {
        let key = queue;
        let value = xsk as u32;
        let mut a = [0u8; ATTR_LEN];
        put32(&mut a, 0, self.map.as_raw_fd() as u32);
        put64(&mut a, 8, &key as *const u32 as u64);
        put64(&mut a, 16, &value as *const u32 as u64);
        // SAFETY: `a` is a valid attribute buffer; `key` and `value` outlive the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_ELEM,
                a.as_mut_ptr(),
                ATTR_LEN as libc::c_uint,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                super::OsCause {
                    what: "adding the socket to the XSKMAP",
                    err: e,
                },
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_on_pass_and_constants_are_network_order() {
        let p = program(Ipv4Addr::new(198, 18, 26, 1), 4791, 7);
        for (i, x) in p.iter().enumerate() {
            if x.code == JNE_K || x.code == JNE32_K || x.code == JGT_X {
                assert_eq!(i as i16 + 1 + x.off, 25, "jump at {i}");
            }
        }
        assert_eq!(p[25].code, MOV64_K);
        assert_eq!(p[25].imm, XDP_PASS);
        // 198.18.26.1 as the little-endian load of its four bytes.
        assert_eq!(p[16].imm.to_le_bytes(), [198, 18, 26, 1]);
        // 4791 = 0x12B7, on the wire 12 B7, loaded little-endian as 0xB712.
        assert_eq!(p[18].imm, 0xB712);
        assert_eq!(p[20].imm, 7);
        assert_eq!(p[20].regs >> 4, BPF_PSEUDO_MAP_FD);
    }
}
