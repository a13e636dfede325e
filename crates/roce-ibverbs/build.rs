//! Links the cdylib as `libibverbs.so.1` with the version nodes of `ibverbs.map` (`ABI.md` §1.3, §1.5).
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=ibverbs.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/ibverbs.map");
}
