//! Links the cdylib as `librdmacm.so.1` with the version nodes of `librdmacm.map` (`docs/spec/LIBRDMACM-ABI.md`
//! §1) and a `DT_NEEDED` on `libibverbs.so.1`, as Debian's librdmacm has: the `ibv_*` calls bind to whichever
//! `libibverbs.so.1` the program loads (rocev2's under `rocev2 run`). The linker records a `DT_NEEDED` only from a
//! shared object, so a stand-in with that SONAME is made here (the real library is never needed to build). It
//! defines the `ibv_*` functions this library calls in their version nodes, so the references are versioned
//! (`ibv_get_device_list@IBVERBS_1.1`) as in Debian's librdmacm: an unversioned reference would bind to the oldest
//! version, the `IBVERBS_1.0` twin (`docs/spec/LIBIBVERBS-ABI.md` §1.3).
use std::process::Command;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rerun-if-changed=librdmacm.map");
    println!("cargo:rerun-if-changed=build.rs");
    let src = format!("{out}/needed_stub.c");
    let lib = format!("{out}/libibverbs.so.1");
    let map = format!("{out}/needed_stub.map");
    let v10 = ["ibv_create_comp_channel", "ibv_destroy_comp_channel"];
    let v11 = [
        "ibv_get_device_list",
        "ibv_free_device_list",
        "ibv_open_device",
        "ibv_query_gid",
        "ibv_query_port",
        "ibv_query_device",
        "ibv_alloc_pd",
        "ibv_create_cq",
        "ibv_destroy_cq",
        "ibv_create_qp",
        "ibv_destroy_qp",
        "ibv_modify_qp",
        "ibv_reg_mr",
        "ibv_dereg_mr",
        "ibv_get_cq_event",
        "ibv_ack_cq_events",
        "ibv_attach_mcast",
        "ibv_detach_mcast",
    ];
    let mut c =
        String::from("/* link-time stand-in: only the SONAME and the version nodes matter */\n");
    for f in v10.iter().chain(&v11) {
        c.push_str(&format!("void {f}(void) {{}}\n"));
    }
    std::fs::write(&src, c).expect("write the stub source");
    std::fs::write(
        &map,
        format!(
            "IBVERBS_1.0 {{ global: {}; local: *; }};\nIBVERBS_1.1 {{ global: {}; }} IBVERBS_1.0;\n",
            v10.join("; "),
            v11.join("; ")
        ),
    )
    .expect("write the stub version script");
    let vs = format!("-Wl,--version-script={map}");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&cc)
        .args([
            "-shared",
            "-fPIC",
            "-nostdlib",
            "-Wl,-soname,libibverbs.so.1",
            &vs,
            "-o",
            &lib,
            &src,
        ])
        .status()
        .unwrap_or_else(|e| panic!("running {cc} to make the libibverbs.so.1 link stub: {e}"));
    assert!(
        status.success(),
        "{cc} failed to make the libibverbs.so.1 link stub"
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/librdmacm.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-cdylib-link-arg={lib}");
}
