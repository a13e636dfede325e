//! The layouts of `roce_abi::verbs` checked against the installed `<infiniband/verbs.h>` (Debian's
//! `libibverbs-dev`, rdma-core 44: the header ABI.md §4 was measured from): this test writes one C11
//! `_Static_assert` per structure size, alignment and field offset *from the Rust declarations* (`size_of`,
//! `align_of`, `offset_of!`) and compiles them against the header. So the one Rust declaration both libraries use
//! cannot drift from C without this test failing, and no second list of numbers has to be kept by hand (the
//! `layout!` assertions in `src/verbs.rs` hold ABI.md's numbers; this holds the header's).

use core::mem::{align_of, offset_of, size_of};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use roce_abi::verbs::*;

/// `(C member designator, Rust offset)` of each listed field; `field as "c.path"` where the C name differs.
macro_rules! fields {
    ($t:ty; $($f:ident $(as $c:literal)?),* $(,)?) => {
        &[$((c_name!($f $(, $c)?), offset_of!($t, $f))),*]
    };
}

macro_rules! c_name {
    ($f:ident) => {
        stringify!($f)
    };
    ($f:ident, $c:literal) => {
        $c
    };
}

/// Asserts of one C type: its size (when the Rust type is the whole C type), alignment and field offsets.
fn emit(c: &mut String, ty: &str, size: Option<usize>, align: usize, fields: &[(&str, usize)]) {
    if let Some(size) = size {
        writeln!(
            c,
            "_Static_assert(sizeof({ty}) == {size}, \"sizeof({ty}): Rust has {size}\");"
        )
        .unwrap();
    }
    writeln!(
        c,
        "_Static_assert(_Alignof({ty}) == {align}, \"_Alignof({ty}): Rust has {align}\");"
    )
    .unwrap();
    for (f, off) in fields {
        writeln!(
            c,
            "_Static_assert(offsetof({ty}, {f}) == {off}, \"{ty}.{f}: Rust has offset {off}\");"
        )
        .unwrap();
    }
}

macro_rules! whole {
    ($c:ident, $cty:literal, $t:ty; $($rest:tt)*) => {
        emit(&mut $c, $cty, Some(size_of::<$t>()), align_of::<$t>(), fields!($t; $($rest)*))
    };
}

fn source() -> String {
    let mut c = String::from("#include <stddef.h>\n#include <infiniband/verbs.h>\n");
    whole!(c, "struct ibv_context_ops", IbvContextOps; alloc_mw, bind_mw, dealloc_mw, poll_cq, req_notify_cq,
        post_srq_recv, post_send, post_recv);
    whole!(c, "struct ibv_device", IbvDevice; ops as "_ops", node_type, transport_type, name, dev_name, dev_path,
        ibdev_path);
    whole!(c, "struct ibv_context", IbvContext; device, ops, cmd_fd, async_fd, num_comp_vectors, mutex,
        abi_compat);
    // `VerbsContextHead` is the part of `struct verbs_context` before its `struct ibv_context`.
    emit(
        &mut c,
        "struct verbs_context",
        None,
        8,
        fields!(VerbsContextHead; sz),
    );
    emit(
        &mut c,
        "struct verbs_context",
        None,
        8,
        &[("context", size_of::<VerbsContextHead>())],
    );
    whole!(c, "struct ibv_pd", IbvPd; context, handle);
    whole!(c, "struct ibv_mr", IbvMr; context, pd, addr, length, handle, lkey, rkey);
    whole!(c, "struct ibv_mw", IbvMw; context, pd, rkey, handle, mw_type as "type");
    whole!(c, "struct ibv_mw_bind_info", IbvMwBindInfo; mr, addr, length, mw_access_flags);
    whole!(c, "struct ibv_mw_bind", IbvMwBind; wr_id, send_flags, bind_info);
    whole!(c, "struct ibv_comp_channel", IbvCompChannel; context, fd, refcnt);
    whole!(c, "struct ibv_cq", IbvCq; context, channel, cq_context, handle, cqe, mutex, cond,
        comp_events_completed, async_events_completed);
    whole!(c, "struct ibv_qp_cap", IbvQpCap; max_send_wr, max_recv_wr, max_send_sge, max_recv_sge,
        max_inline_data);
    whole!(c, "struct ibv_qp", IbvQp; context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state,
        qp_type, mutex, cond, events_completed);
    whole!(c, "struct ibv_ah", IbvAh; context, pd, handle);
    whole!(c, "struct ibv_sge", IbvSge; addr, length, lkey);
    whole!(c, "struct ibv_send_wr", IbvSendWr; wr_id, next, sg_list, num_sge, opcode, send_flags, imm_data, wr,
        qp_type_xrc_remote_srqn as "qp_type.xrc.remote_srqn", bind_mw_tso as "bind_mw");
    // The members `SendWrUnion`'s accessors read (their docs name the offsets).
    let wr = offset_of!(IbvSendWr, wr);
    emit(
        &mut c,
        "struct ibv_send_wr",
        None,
        8,
        &[
            ("wr.rdma.remote_addr", wr),
            ("wr.rdma.rkey", wr + 8),
            ("wr.atomic.compare_add", wr + 8),
            ("wr.atomic.swap", wr + 16),
            ("wr.atomic.rkey", wr + 24),
            ("wr.ud.ah", wr),
            ("wr.ud.remote_qpn", wr + 8),
            ("wr.ud.remote_qkey", wr + 12),
        ],
    );
    whole!(c, "struct ibv_recv_wr", IbvRecvWr; wr_id, next, sg_list, num_sge);
    whole!(c, "struct ibv_wc", IbvWc; wr_id, status, opcode, vendor_err, byte_len, imm_data, qp_num, src_qp,
        wc_flags, pkey_index, slid, sl, dlid_path_bits);
    whole!(c, "union ibv_gid", IbvGid; raw);
    whole!(c, "struct ibv_global_route", IbvGlobalRoute; dgid, flow_label, sgid_index, hop_limit, traffic_class);
    whole!(c, "struct ibv_ah_attr", IbvAhAttr; grh, dlid, sl, src_path_bits, static_rate, is_global, port_num);
    whole!(c, "struct ibv_qp_attr", IbvQpAttr; qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn,
        sq_psn, dest_qp_num, qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index,
        en_sqd_async_notify, sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout,
        retry_cnt, rnr_retry, alt_port_num, alt_timeout, rate_limit);
    whole!(c, "struct ibv_qp_init_attr", IbvQpInitAttr; qp_context, send_cq, recv_cq, srq, cap, qp_type,
        sq_sig_all);
    whole!(c, "struct ibv_qp_init_attr_ex", IbvQpInitAttrEx; qp_context, send_cq, recv_cq, srq, cap, qp_type,
        sq_sig_all, comp_mask, pd, xrcd, create_flags, max_tso_header, rwq_ind_tbl, rx_hash_conf, source_qpn,
        send_ops_flags);
    // `IbvPortAttr` is the 48-byte `_compat_ibv_port_attr` (ABI.md §3.2): `struct ibv_port_attr` up to
    // `port_cap_flags2`.
    emit(
        &mut c,
        "struct ibv_port_attr",
        None,
        align_of::<IbvPortAttr>(),
        fields!(IbvPortAttr; state, max_mtu,
        active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, bad_pkey_cntr, qkey_viol_cntr, pkey_tbl_len, lid,
        sm_lid, lmc, max_vl_num, sm_sl, subnet_timeout, init_type_reply, active_width, active_speed, phys_state,
        link_layer, flags),
    );
    emit(
        &mut c,
        "struct ibv_port_attr",
        None,
        align_of::<IbvPortAttr>(),
        &[("port_cap_flags2", size_of::<IbvPortAttr>())],
    );
    whole!(c, "struct ibv_device_attr", IbvDeviceAttr; fw_ver, node_guid, sys_image_guid, max_mr_size,
        page_size_cap, vendor_id, vendor_part_id, hw_ver, max_qp, max_qp_wr, device_cap_flags, max_sge,
        max_sge_rd, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_ee_rd_atom, max_res_rd_atom,
        max_qp_init_rd_atom, max_ee_init_rd_atom, atomic_cap, max_ee, max_rdd, max_mw, max_raw_ipv6_qp,
        max_raw_ethy_qp, max_mcast_grp, max_mcast_qp_attach, max_total_mcast_qp_attach, max_ah, max_fmr,
        max_map_per_fmr, max_srq, max_srq_wr, max_srq_sge, max_pkeys, local_ca_ack_delay, phys_port_cnt);
    whole!(c, "struct ibv_gid_entry", IbvGidEntry; gid, gid_index, port_num, gid_type, ndev_ifindex);
    whole!(c, "struct ibv_srq", IbvSrq; context, srq_context, pd, handle, mutex, cond, events_completed);
    whole!(c, "struct ibv_srq_attr", IbvSrqAttr; max_wr, max_sge, srq_limit);
    whole!(c, "struct ibv_srq_init_attr", IbvSrqInitAttr; srq_context, attr);
    c
}

/// Compiles `src` (C11, no output file) and answers the compiler's verdict and messages.
fn compile(src: &str) -> (bool, String) {
    let mut cc = Command::new("cc")
        .args(["-std=gnu11", "-fsyntax-only", "-x", "c", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cc runs (Debian's gcc; .ci/run installs it)");
    cc.stdin
        .take()
        .expect("stdin")
        .write_all(src.as_bytes())
        .expect("write the C source");
    let out = cc.wait_with_output().expect("cc finishes");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn verbs_layouts_match_the_installed_header() {
    assert!(
        Path::new("/usr/include/infiniband/verbs.h").is_file(),
        "<infiniband/verbs.h> missing: install Debian's libibverbs-dev (.ci/run does)"
    );
    let src = source();
    assert!(
        src.lines()
            .filter(|l| l.starts_with("_Static_assert"))
            .count()
            > 250,
        "{src}"
    );
    let (ok, err) = compile(&src);
    assert!(
        ok,
        "the Rust declarations differ from <infiniband/verbs.h>:\n{err}"
    );
}

/// The check itself can fail: one wrong number is a compile error naming the member.
#[test]
fn a_wrong_offset_is_a_compile_error_naming_the_member() {
    let mut src = String::from("#include <stddef.h>\n#include <infiniband/verbs.h>\n");
    emit(
        &mut src,
        "struct ibv_qp",
        None,
        align_of::<IbvQp>(),
        &[("qp_num", offset_of!(IbvQp, qp_num) + 4)],
    );
    let (ok, err) = compile(&src);
    assert!(!ok);
    assert!(
        err.contains("struct ibv_qp.qp_num: Rust has offset 56"),
        "{err}"
    );
}
