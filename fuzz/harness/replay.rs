//! Runs a fuzz harness outside libFuzzer (issue #21): over the committed seed and regression inputs of a target
//! and over pseudo-random inputs, so the targets run briefly in the README's test command without cargo-fuzz.

use std::path::{Path, PathBuf};

/// The repository's `fuzz/` directory.
fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// Runs `run` on every file in `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/` (either may be missing);
/// returns how many inputs ran. A failing input is named before its panic propagates.
pub fn replay_dirs(target: &str, run: impl Fn(&[u8])) -> usize {
    let mut n = 0;
    for dir in ["seeds", "regressions"] {
        let Ok(rd) = std::fs::read_dir(fuzz_dir().join(dir).join(target)) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
        files.sort();
        for f in files {
            let data = std::fs::read(&f).unwrap();
            eprintln!("{target}: {}", f.display());
            run(&data);
            n += 1;
        }
    }
    n
}

/// Runs `run` on `count` inputs of up to `max_len` bytes from a xorshift generator seeded with `seed`.
pub fn random_inputs(seed: u64, count: usize, max_len: usize, run: impl Fn(&[u8])) {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for i in 0..count {
        let len = (next() as usize) % (max_len + 1);
        let data: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        eprintln!("random input {i} of seed {seed:#x}: {len} bytes");
        run(&data);
    }
}
