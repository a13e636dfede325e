//! `rdma_getaddrinfo` / `rdma_freeaddrinfo` (rdma-core `librdmacm/addrinfo.c` semantics, read for facts): the
//! system resolver (`getaddrinfo`) turns `node`/`service` into an address; the result names it as the source
//! (`RAI_PASSIVE`) or the destination, with the port space and QP type of the hints (default `RDMA_PS_TCP`, RC).
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
        if res.is_null() || (node.is_null() && service.is_null()) {
            return Err(libc::EINVAL);
        }
        // SAFETY: per the contract.
        let h = unsafe { hints.as_ref() };
        let flags = h.map_or(0, |h| h.ai_flags);
        let passive = flags & RAI_PASSIVE != 0;
        // SAFETY: zero is a valid addrinfo.
        let mut sh: libc::addrinfo = unsafe { core::mem::zeroed() };
        sh.ai_family = h.map_or(0, |h| h.ai_family);
        sh.ai_socktype = libc::SOCK_STREAM;
        if passive {
            sh.ai_flags |= libc::AI_PASSIVE;
        }
        if flags & RAI_NUMERICHOST != 0 {
            sh.ai_flags |= libc::AI_NUMERICHOST;
        }
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
        // SAFETY: the first entry of a list getaddrinfo returned; calloc'd blocks filled field by field.
        unsafe {
            let ai = &*list;
            let out = libc::calloc(1, size_of::<RdmaAddrinfo>()).cast::<RdmaAddrinfo>();
            if out.is_null() {
                libc::freeaddrinfo(list);
                return Err(libc::ENOMEM);
            }
            let o = &mut *out;
            o.ai_flags = flags;
            o.ai_family = ai.ai_family;
            o.ai_qp_type = h.map_or(0, |h| h.ai_qp_type);
            if o.ai_qp_type == 0 {
                o.ai_qp_type = IBV_QPT_RC;
            }
            o.ai_port_space = h.map_or(0, |h| h.ai_port_space);
            if o.ai_port_space == 0 {
                o.ai_port_space = if o.ai_qp_type == IBV_QPT_UD {
                    RDMA_PS_UDP
                } else {
                    RDMA_PS_TCP
                };
            }
            let a = dup(ai.ai_addr.cast(), ai.ai_addrlen as usize).cast::<libc::sockaddr>();
            if passive {
                o.ai_src_addr = a;
                o.ai_src_len = ai.ai_addrlen;
            } else {
                o.ai_dst_addr = a;
                o.ai_dst_len = ai.ai_addrlen;
                if let Some(h) = h
                    && !h.ai_src_addr.is_null()
                    && h.ai_src_len > 0
                {
                    o.ai_src_addr = dup(h.ai_src_addr.cast(), h.ai_src_len as usize).cast();
                    o.ai_src_len = h.ai_src_len;
                }
            }
            libc::freeaddrinfo(list);
            res.write(out);
        }
        Ok(())
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
