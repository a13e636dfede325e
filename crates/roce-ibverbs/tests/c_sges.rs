//! `tests/c/sges.c`: 32 SGEs per WR through the C ABI (issue #16), compiled against the system
//! `<infiniband/verbs.h>` and linked with `-libverbs` like any ibverbs program, run with rocev2's `libibverbs.so.1`
//! first on `LD_LIBRARY_PATH` and the device on 127.0.201.3: `max_sge` 32; SEND (32 SGEs into a 32-SGE receive),
//! RDMA WRITE and RDMA READ with 32 SGEs, every byte checked; 33 SGEs refused at `ibv_create_qp`, `ibv_post_send` and
//! `ibv_post_recv` with `EINVAL`. Binds UDP 4791 on 127.0.201.3.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn c_program_posts_32_sges_and_is_refused_33() {
    assert!(
        Path::new("/usr/include/infiniband/verbs.h").is_file(),
        "<infiniband/verbs.h> missing: install Debian's libibverbs-dev (.ci/run does)"
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("c-sges-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/sges.c");
    let prog = dir.join("sges");
    let out = Command::new("cc")
        .args(["-O1", "-Wall", "-Werror", "-o"])
        .arg(&prog)
        .arg(&src)
        .arg("-libverbs")
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "cc failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::os::unix::fs::symlink(common::library(), dir.join("libibverbs.so.1")).expect("symlink");
    let out = Command::new(&prog)
        .env("LD_LIBRARY_PATH", &dir)
        .env("ROCEV2_IBV_IP", "127.0.201.3")
        .output()
        .expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "{:?}\n--- stdout\n{stdout}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
