//! The rest of Debian 12's export table that no rocev2 object can serve, each answering as rdma-core 44 does on a
//! device without the capability (its man pages and `libibverbs/dummy_ops.c`: `EOPNOTSUPP` / NULL + `errno`):
//!
//! * The `IBVERBS_1.0` twins (`ibv_get_device_list@IBVERBS_1.0` …): rdma-core keeps them for programs linked
//!   against libibverbs 1.0 (2006), whose objects had other layouts (`libibverbs/compat-1_0.c` wraps every object
//!   in a `*_1_0` struct). This library does not implement that ABI: `ibv_get_device_list@IBVERBS_1.0` returns NULL
//!   with `errno = EOPNOTSUPP`, so such a program never holds a 1.0 object, and every other twin treats its handle
//!   as foreign (`EINVAL`, NULL + `EINVAL`, or nothing for the `void` ones). No program of Debian 12 imports them
//!   (ABI.md §1.3); the loader only needs them to exist.
//! * `ibv_register_driver@IBVERBS_1.1`: the pre-1.1.8 provider registration, an empty function in rdma-core 44.
//! * Import/unimport of device memory (`ibv_import_dm` / `ibv_unimport_dm`): there is no device memory, NULL +
//!   `EOPNOTSUPP`; the unimport has nothing to release. (Contexts, PDs and MRs are imported within the process:
//!   `exports/import.rs`.)
//! * `ibv_reg_dmabuf_mr`: no dma-buf importer, NULL + `EOPNOTSUPP`.
//! * Private provider entry points not listed in `exports` (`ibv_cmd_*` of the write() path,
//!   `__ioctl_final_num_attrs`, `ibv_read_ibdev_sysfs_file`): providers are never used (ABI.md §1.4).

use core::ffi::{c_char, c_int, c_uint, c_void};
use core::ptr::null_mut;

versioned! {
    "IBVERBS_1.0": [ibv_copy_path_rec_to_kern]
    "IBVERBS_1.10": [ibv_import_device, ibv_import_pd, ibv_import_mr, ibv_unimport_pd, ibv_unimport_mr]
    "IBVERBS_1.12": [ibv_reg_dmabuf_mr]
    "IBVERBS_1.13": [ibv_import_dm, ibv_unimport_dm]
    "IBVERBS_PRIVATE_34": [__ioctl_final_num_attrs, ibv_read_ibdev_sysfs_file, ibv_cmd_create_cq, ibv_cmd_create_qp,
        ibv_cmd_poll_cq, ibv_cmd_post_recv, ibv_cmd_post_send, ibv_cmd_post_srq_recv, ibv_cmd_req_notify_cq]
}

versioned_compat! {
    "IBVERBS_1.0", rocev2_v10_: [ibv_ack_async_event, ibv_ack_cq_events, ibv_alloc_pd, ibv_attach_mcast,
        ibv_close_device, ibv_create_ah, ibv_create_cq, ibv_create_qp, ibv_create_srq, ibv_dealloc_pd, ibv_dereg_mr,
        ibv_destroy_ah, ibv_destroy_cq, ibv_destroy_qp, ibv_destroy_srq, ibv_detach_mcast, ibv_free_device_list,
        ibv_get_async_event, ibv_get_cq_event, ibv_get_device_guid, ibv_get_device_list, ibv_get_device_name,
        ibv_modify_qp, ibv_modify_srq, ibv_open_device, ibv_query_device, ibv_query_gid, ibv_query_pkey,
        ibv_query_port, ibv_query_qp, ibv_query_srq, ibv_reg_mr, ibv_resize_cq]
    "IBVERBS_1.1", rocev2_v11_: [ibv_register_driver]
}

fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot, valid for the thread's life.
    unsafe { *libc::__errno_location() = e };
}

/// Functions of the given names that take anything and return `$ret` (the extra C arguments are ignored: on the
/// x86_64 SysV ABI a callee that declares fewer parameters is called correctly), setting `errno = $errno` when
/// `$errno` is non-zero.
macro_rules! refuse {
    ($ret:ty = $val:expr, errno $errno:expr; $($name:ident),* $(,)?) => {
        $(
            #[unsafe(no_mangle)]
            pub extern "C" fn $name() -> $ret {
                if $errno != 0 {
                    set_errno($errno);
                }
                $val
            }
        )*
    };
}

// IBVERBS_1.0 twins whose return is a pointer: no 1.0 object exists.
refuse!(*mut c_void = null_mut(), errno libc::EINVAL; rocev2_v10_ibv_alloc_pd, rocev2_v10_ibv_create_ah,
    rocev2_v10_ibv_create_cq, rocev2_v10_ibv_create_qp, rocev2_v10_ibv_create_srq, rocev2_v10_ibv_open_device,
    rocev2_v10_ibv_reg_mr, rocev2_v10_ibv_get_device_name);
// ... an errno value (the verbs that return 0 or an errno).
refuse!(c_int = libc::EINVAL, errno 0; rocev2_v10_ibv_attach_mcast, rocev2_v10_ibv_close_device,
    rocev2_v10_ibv_dealloc_pd, rocev2_v10_ibv_dereg_mr, rocev2_v10_ibv_destroy_ah, rocev2_v10_ibv_destroy_cq,
    rocev2_v10_ibv_destroy_qp, rocev2_v10_ibv_destroy_srq, rocev2_v10_ibv_detach_mcast, rocev2_v10_ibv_modify_qp,
    rocev2_v10_ibv_modify_srq, rocev2_v10_ibv_query_device, rocev2_v10_ibv_query_port, rocev2_v10_ibv_query_qp,
    rocev2_v10_ibv_query_srq, rocev2_v10_ibv_resize_cq);
// ... -1 with errno (`ibv_get_async_event`, `ibv_get_cq_event`) or plain -1 (`ibv_query_gid`, `ibv_query_pkey`).
refuse!(c_int = -1, errno libc::EINVAL; rocev2_v10_ibv_get_async_event, rocev2_v10_ibv_get_cq_event,
    rocev2_v10_ibv_query_gid, rocev2_v10_ibv_query_pkey);
// ... a GUID (0: none).
refuse!(u64 = 0, errno 0; rocev2_v10_ibv_get_device_guid);
// ... nothing: acknowledging events of, or freeing a list from, an ABI that never handed any out.
refuse!(() = (), errno 0; rocev2_v10_ibv_ack_async_event, rocev2_v10_ibv_ack_cq_events,
    rocev2_v10_ibv_free_device_list, rocev2_v11_ibv_register_driver, rocev2_ibv_unimport_dm);
// Pointer returns that need a kernel object this product has no equivalent of.
refuse!(*mut c_void = null_mut(), errno libc::EOPNOTSUPP; rocev2_ibv_import_dm, rocev2_ibv_reg_dmabuf_mr);
// Private provider commands (callers treat the return as the errno).
refuse!(c_int = libc::EOPNOTSUPP, errno 0; rocev2_ibv_cmd_create_cq, rocev2_ibv_cmd_create_qp,
    rocev2_ibv_cmd_poll_cq, rocev2_ibv_cmd_post_recv, rocev2_ibv_cmd_post_send, rocev2_ibv_cmd_post_srq_recv,
    rocev2_ibv_cmd_req_notify_cq);

/// `ibv_get_device_list@IBVERBS_1.0`: NULL with `errno = EOPNOTSUPP` (module docs).
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_v10_ibv_get_device_list(num: *mut c_int) -> *mut c_void {
    if !num.is_null() {
        // SAFETY: the caller's out-parameter (`int *num_devices`).
        unsafe { *num = 0 };
    }
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}

/// `ibv_copy_path_rec_to_kern`: converts for the kernel's rdma_cm, which librdmacm cannot reach here (ABI.md
/// §5.2); returns nothing, so a call is reported on stderr and the destination is left untouched (as its
/// `_from_kern` siblings in `exports`).
#[unsafe(no_mangle)]
pub extern "C" fn rocev2_ibv_copy_path_rec_to_kern(_dst: *mut c_void, _src: *const c_void) {
    crate::guard::guard(
        "ibv_copy_path_rec_to_kern",
        || (),
        || rocev2_ibv_copy_path_rec_to_kern_inner(_dst, _src),
    )
}

fn rocev2_ibv_copy_path_rec_to_kern_inner(_dst: *mut c_void, _src: *const c_void) {
    eprintln!(
        "rocev2 libibverbs: ibv_copy_path_rec_to_kern is not supported (it needs the kernel rdma_cm)"
    );
}

/// `__ioctl_final_num_attrs(num_attrs, link)`: the attribute count of a provider's ioctl command buffer chain.
/// No provider command ever runs (`execute_ioctl` refuses every buffer), so the chain is never walked: the count
/// of this buffer.
#[unsafe(no_mangle)]
pub extern "C" fn rocev2___ioctl_final_num_attrs(num_attrs: c_uint, _link: *mut c_void) -> c_uint {
    num_attrs
}

/// Conversions in `fmt` that consume an argument (`%%` does not).
fn conversions(fmt: &[u8]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while i < fmt.len() {
        if fmt[i] == b'%' {
            if fmt.get(i + 1) == Some(&b'%') {
                i += 2;
                continue;
            }
            n += 1;
        }
        i += 1;
    }
    n
}

/// Private `ibv_read_ibdev_sysfs_file(buf, size, ibdev, fmt, ...)`: reads `<sysfs>/class/infiniband/<ibdev>/<fmt
/// formatted>` as `ibv_read_sysfs_file` does (the length, or -1). C passes the variadic arguments in registers
/// after `fmt` (x86_64 SysV, the only target `abi` builds for); the callers in rdma-core's providers pass at most
/// two integers (`"ports/%d/gid_attrs/types/%d"`), so up to two are taken and a format with more conversions is
/// -1 with `errno = EINVAL`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rocev2_ibv_read_ibdev_sysfs_file(
    buf: *mut c_char,
    size: usize,
    ibdev: *const c_char,
    fmt: *const c_char,
    a1: usize,
    a2: usize,
) -> c_int {
    // SAFETY: forwarded under the caller's contract.
    crate::guard::guard(
        "ibv_read_ibdev_sysfs_file",
        || {
            set_errno(libc::EIO);
            -1
        },
        || unsafe { rocev2_ibv_read_ibdev_sysfs_file_inner(buf, size, ibdev, fmt, a1, a2) },
    )
}

unsafe fn rocev2_ibv_read_ibdev_sysfs_file_inner(
    buf: *mut c_char,
    size: usize,
    ibdev: *const c_char,
    fmt: *const c_char,
    a1: usize,
    a2: usize,
) -> c_int {
    if buf.is_null() || ibdev.is_null() || fmt.is_null() || size == 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: NUL-terminated strings (the caller's contract).
    let (dev, f) = unsafe {
        (
            std::ffi::CStr::from_ptr(ibdev),
            std::ffi::CStr::from_ptr(fmt),
        )
    };
    if conversions(f.to_bytes()) > 2 {
        set_errno(libc::EINVAL);
        return -1;
    }
    let mut rel = [0 as c_char; 256];
    // SAFETY: `rel` has `rel.len()` bytes; `fmt` consumes at most the two arguments passed (checked above).
    let n = unsafe { libc::snprintf(rel.as_mut_ptr(), rel.len(), fmt, a1, a2) };
    if n < 0 || n as usize >= rel.len() {
        set_errno(libc::ENAMETOOLONG);
        return -1;
    }
    // SAFETY: snprintf NUL-terminated `rel`.
    let rel = unsafe { std::ffi::CStr::from_ptr(rel.as_ptr()) };
    let dir = format!(
        "{}/class/infiniband/{}",
        // SAFETY: a static NUL-terminated string.
        unsafe { std::ffi::CStr::from_ptr(crate::exports::rocev2_ibv_get_sysfs_path()) }
            .to_string_lossy(),
        dev.to_string_lossy()
    );
    let Ok(dir) = std::ffi::CString::new(dir) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    // SAFETY: NUL-terminated strings and the caller's `buf` of `size` bytes.
    unsafe { crate::exports::rocev2_ibv_read_sysfs_file(dir.as_ptr(), rel.as_ptr(), buf, size) }
}
