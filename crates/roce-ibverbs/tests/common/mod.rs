//! Shared by the tests of the built library.

use std::path::PathBuf;

/// `libroce_ibverbs.so` of this build (in `deps/`, where the test binary is, or uplifted beside it), canonical.
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let deps = exe.parent().expect("deps dir");
    [
        deps.join("libroce_ibverbs.so"),
        deps.join("../libroce_ibverbs.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
    .unwrap_or_else(|| panic!("libroce_ibverbs.so not built next to {}", deps.display()))
    .canonicalize()
    .expect("canonical path")
}
