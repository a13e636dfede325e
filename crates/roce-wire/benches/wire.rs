//! Criterion benchmarks of the roce-wire hot paths. Results: `BENCHMARKS.md`.
//!
//! Run: `cargo bench -p roce-wire --bench wire`; smoke run (each benchmark once):
//! `cargo test -p roce-wire --benches`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

/// Payload sizes for the ICRC throughput group: a minimum-size packet, the Soft-RoCE
/// default path MTU (1 KiB) and the largest IB MTU (4 KiB).
const ICRC_SIZES: [usize; 3] = [64, 1024, 4096];

fn icrc(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for size in ICRC_SIZES {
        let bytes: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(
            BenchmarkId::new("crc32fast_raw", size),
            &bytes,
            |b, bytes| b.iter(|| crc32fast::hash(black_box(bytes))),
        );
    }
    g.finish();
}

criterion_group!(benches, icrc);
criterion_main!(benches);
