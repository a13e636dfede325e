//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` (rdma-core `librdmacm/addrinfo.c` semantics, read for facts): the
//! system resolver (`getaddrinfo`) turns `node`/`service` into an address; the result names it as the source
//! (`RAI_PASSIVE`) or the destination, with the port space and QP type of the hints (default `RDMA_PS_TCP`, RC);
//! without node and service (libfabric's verbs provider) the result is the hints themselves, addresses copied.
//! Every block of the list is `calloc`'d here and released by `rdma_freeaddrinfo`.

use core::ffi::c_void;
use libc::{c_char, c_int};

use crate::abi::*;

fn set_errno(e: c_int) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// A `calloc`'d copy of `len` bytes at `p`.
///
/// # Safety
/// `p` points at `len` readable bytes.
unsafe fn dup(p: *const c_void, len: usize) -> *mut c_void {
    // SAFETY: calloc; then a copy of `len` bytes into the new block.
    unsafe {
        let q = libc::calloc(1, len.max(1));
        if !q.is_null() {
            core::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), len);
        }
        q
    }
}

/// Fills `o` as rdma-core's `librdmacm/addrinfo.c` does (read for facts): with a node or a service, the system
/// resolver's first answer for the hints' family, socket type (RC/UC stream, UD datagram) and protocol (port space
/// TCP or UDP/IPoIB) is the source address when `RAI_PASSIVE` is set (and the result says `RAI_PASSIVE`), else
/// the destination; the QP type and port space are the hints', else the socket type's (stream RC, datagram UD) and
/// protocol's (TCP `RDMA_PS_TCP`, UDP `RDMA_PS_UDP`). With neither, the result is the hints' flags, family, QP type,
/// port space and destination address. Either way a source address of the hints is kept when none was resolved.
///
/// Errors: `EADDRNOTAVAIL` when the resolver has no answer (its own error for a system failure), `ENOMEM`.
///
/// # Safety
/// `node` / `service` NULL or NUL-terminated; the hints' address pointers valid for their lengths.
unsafe fn fill(
    o: &mut RdmaAddrinfo,
    node: *const c_char,
    service: *const c_char,
    h: Option<&RdmaAddrinfo>,
) -> Result<(), c_int> {
    let copy = |p: *mut libc::sockaddr, len: u32| -> Result<*mut libc::sockaddr, c_int> {
        // SAFETY: the caller's address of `len` readable bytes.
        let q = unsafe { dup(p.cast(), len as usize) }.cast::<libc::sockaddr>();
        if q.is_null() {
            Err(libc::ENOMEM)
        } else {
            Ok(q)
        }
    };
    let flags = h.map_or(0, |h| h.ai_flags);
    let qp_type = h.map_or(0, |h| h.ai_qp_type);
    let port_space = h.map_or(0, |h| h.ai_port_space);
    if !node.is_null() || !service.is_null() {
        // SAFETY: zero is a valid addrinfo.
        let mut sh: libc::addrinfo = unsafe { core::mem::zeroed() };
        if flags & RAI_PASSIVE != 0 {
            sh.ai_flags |= libc::AI_PASSIVE;
        }
        if flags & RAI_NUMERICHOST != 0 {
            sh.ai_flags |= libc::AI_NUMERICHOST;
        }
        let family = h.map_or(0, |h| h.ai_family);
        if family != libc::AF_IB {
            sh.ai_family = family;
        }
        sh.ai_socktype = match qp_type {
            IBV_QPT_UD => libc::SOCK_DGRAM,
            0 => 0,
            _ => libc::SOCK_STREAM,
        };
        sh.ai_protocol = match port_space {
            RDMA_PS_TCP => libc::IPPROTO_TCP,
            RDMA_PS_UDP | RDMA_PS_IPOIB => libc::IPPROTO_UDP,
            _ => match sh.ai_socktype {
                libc::SOCK_STREAM => libc::IPPROTO_TCP,
                libc::SOCK_DGRAM => libc::IPPROTO_UDP,
                _ => 0,
            },
        };
        let mut list: *mut libc::addrinfo = core::ptr::null_mut();
        // SAFETY: valid arguments; the list is freed below.
        let r = unsafe { libc::getaddrinfo(node, service, &sh, &mut list) };
        if r != 0 || list.is_null() {
            return Err(if r == libc::EAI_SYSTEM {
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO)
            } else {
                libc::EADDRNOTAVAIL
            });
        }
        // SAFETY: the first entry of the list getaddrinfo returned, freed right after.
        let ai = unsafe { &*list };
        o.ai_qp_type = match (qp_type, ai.ai_socktype) {
            (0, libc::SOCK_DGRAM) => IBV_QPT_UD,
            (0, _) => IBV_QPT_RC,
            (t, _) => t,
        };
        o.ai_port_space = match (port_space, ai.ai_protocol) {
            (0, libc::IPPROTO_UDP) => RDMA_PS_UDP,
            (0, _) => RDMA_PS_TCP,
            (p, _) => p,
        };
        o.ai_family = ai.ai_family;
        let len = ai.ai_addrlen;
        let a = copy(ai.ai_addr, len);
        if flags & RAI_PASSIVE != 0 {
            o.ai_flags = RAI_PASSIVE;
        }
        // SAFETY: the list getaddrinfo returned.
        unsafe { libc::freeaddrinfo(list) };
        let a = a?;
        if flags & RAI_PASSIVE != 0 {
            o.ai_src_addr = a;
            o.ai_src_len = len;
        } else {
            o.ai_dst_addr = a;
            o.ai_dst_len = len;
        }
    } else if let Some(h) = h {
        o.ai_flags = h.ai_flags;
        o.ai_family = h.ai_family;
        o.ai_qp_type = h.ai_qp_type;
        o.ai_port_space = h.ai_port_space;
        if h.ai_dst_len > 0 && !h.ai_dst_addr.is_null() {
            o.ai_dst_addr = copy(h.ai_dst_addr, h.ai_dst_len)?;
            o.ai_dst_len = h.ai_dst_len;
        }
    }
    if let Some(h) = h
        && o.ai_src_len == 0
        && h.ai_src_len > 0
        && !h.ai_src_addr.is_null()
    {
        o.ai_src_addr = copy(h.ai_src_addr, h.ai_src_len)?;
        o.ai_src_len = h.ai_src_len;
    }
    Ok(())
}

/// # Safety
/// `node` / `service` NULL or NUL-terminated; `hints` NULL or valid; `res` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const RdmaAddrinfo,
    res: *mut *mut RdmaAddrinfo,
) -> c_int {
    let body = || -> Result<(), c_int> {
        // SAFETY: per the contract.
        let h = unsafe { hints.as_ref() };
        if res.is_null() || (node.is_null() && service.is_null() && h.is_none()) {
            return Err(libc::EINVAL);
        }
        // SAFETY: calloc'd, zero is a valid `RdmaAddrinfo`; freed by rdma_freeaddrinfo on every error below.
        let out = unsafe { libc::calloc(1, size_of::<RdmaAddrinfo>()) }.cast::<RdmaAddrinfo>();
        if out.is_null() {
            return Err(libc::ENOMEM);
        }
        // SAFETY: `out` is a fresh block, the hints' addresses are readable per the contract.
        let r = unsafe { fill(&mut *out, node, service, h) };
        match r {
            Ok(()) => {
                // SAFETY: `res` is writable (checked non-NULL above).
                unsafe { res.write(out) };
                Ok(())
            }
            Err(e) => {
                // SAFETY: `out` and what `fill` attached to it are this library's allocations.
                unsafe { rocev2_rdma_freeaddrinfo(out) };
                Err(e)
            }
        }
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            set_errno(e);
            -1
        }
        Err(_) => {
            set_errno(libc::EIO);
            -1
        }
    }
}

/// # Safety
/// `res` NULL or a list `rdma_getaddrinfo` returned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_rdma_freeaddrinfo(res: *mut RdmaAddrinfo) {
    let mut p = res;
    while !p.is_null() {
        // SAFETY: every block and member was calloc'd by rdma_getaddrinfo.
        unsafe {
            let next = (*p).ai_next;
            libc::free((*p).ai_src_addr.cast());
            libc::free((*p).ai_dst_addr.cast());
            libc::free((*p).ai_src_canonname.cast());
            libc::free((*p).ai_dst_canonname.cast());
            libc::free((*p).ai_route);
            libc::free((*p).ai_connect);
            libc::free(p.cast());
            p = next;
        }
    }
}
