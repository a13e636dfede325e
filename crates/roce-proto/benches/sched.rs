//! Criterion benchmark: the send scheduler's cost per packet against the number of active QPs (issue #12: flat,
//! at most 1.2× from 1 to 10,000; `roce_proto::sched`).
//!
//! One [`Scheduler`] as the engine drives it, without the engine: `n` QPs, all backlogged (every one is queued
//! again right after it sends), spread over four traffic classes with ETS weights 4:3:2:1, each with its own
//! token bucket (a rate limit of 1 Tb/s, so the bucket check runs and never parks). One iteration = 4096
//! decisions of `next` → `sent` (a 1078-byte frame) → `push_data`, on a clock advancing 86 ns per frame (a
//! 100 Gb/s wire). Reported per element = per packet.
//!
//! Run: `cargo bench -p roce-proto --bench sched`; smoke run: `cargo test -p roce-proto --benches`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use roce_proto::sched::Pick;
use roce_proto::*;

const DECISIONS: u64 = 4096;
const FRAME: usize = 1078;

fn setup(n: usize) -> Scheduler {
    let mut cfg = SchedConfig::default();
    for (c, w) in [4, 3, 2, 1].into_iter().enumerate() {
        cfg.tcs[c].weight = w;
    }
    let mut s = Scheduler::new(cfg, 4096 + 18);
    for i in 0..n {
        s.add_qp(i, 1024);
        s.set_tc(i, (i % 4) as u8);
        s.set_limit(i, Some(1_000_000_000_000), None, None);
        s.push_data(i);
    }
    s
}

fn decisions(s: &mut Scheduler, now: &mut Instant) -> usize {
    let mut last = 0;
    for _ in 0..DECISIONS {
        *now = Instant::from_nanos(now.as_nanos() + 86);
        let p = s.next(*now).expect("backlogged");
        let Pick::Data(i) = p else { panic!("{p:?}") };
        s.sent(*now, p, FRAME);
        s.push_data(i);
        last = i;
    }
    last
}

fn per_packet(c: &mut Criterion) {
    let mut g = c.benchmark_group("sched_per_packet");
    g.throughput(Throughput::Elements(DECISIONS));
    for n in [1usize, 10, 100, 1000, 10_000] {
        let mut s = setup(n);
        let mut now = Instant::from_micros(1);
        // Warm: every QP has been served at least once.
        for _ in 0..n.div_ceil(DECISIONS as usize) + 1 {
            decisions(&mut s, &mut now);
        }
        g.bench_with_input(BenchmarkId::new("active_qps", n), &n, |b, _| {
            b.iter(|| black_box(decisions(&mut s, &mut now)));
        });
        assert_eq!(s.stats().parks, 0);
    }
    g.finish();
}

criterion_group!(benches, per_packet);
criterion_main!(benches);
