//! Criterion front end of the engine benchmarks (`roce_bench`): the send side alone and both ends in one thread,
//! 64 B SEND and 4 KiB WRITE, post-list sizes 1..32, beside memcpy + crc32 of the same bytes.
//!
//! Run: `cargo bench -p roce-bench --bench engine`; smoke run: `cargo test -p roce-bench --benches`.
//! `rocev2 bench engine` times the same workloads itself (medians of interleaved repetitions, `--json`).

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roce_bench::{Baseline, Loopback, Op, SendSide, Workload};

fn engine(c: &mut Criterion) {
    for op in [Op::Send64, Op::Write4k] {
        let mut g = c.benchmark_group(format!("{op:?}"));
        g.throughput(Throughput::Bytes(op.size()));
        g.bench_function("baseline_memcpy_crc32", |b| {
            let mut w = Baseline::new(op);
            b.iter_custom(|n| w.sample(n).elapsed);
        });
        for pl in [1usize, 4, 8, 16, 32] {
            g.bench_with_input(BenchmarkId::new("send_side", pl), &pl, |b, &pl| {
                let mut w = SendSide::new(op, pl, 64);
                b.iter_custom(|n| w.sample(n).elapsed);
                assert!(w.verified());
            });
        }
        g.bench_function("loopback/16", |b| {
            let mut w = Loopback::new(op, 16, 64);
            b.iter_custom(|n| w.sample(n).elapsed);
            assert!(w.verified());
        });
        g.finish();
    }
}

criterion_group!(benches, engine);
criterion_main!(benches);
