//! Specifier generation: `hdsd::specifier::build` for 1, 2 and 16 inbounds.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;

mod common;

fn build(c: &mut Criterion) {
    let settings = common::settings();
    let mut group = c.benchmark_group("specifier::build");
    for k in [1u16, 2, 16] {
        let dp = common::dataplane(k);
        group.bench_with_input(BenchmarkId::from_parameter(k), &dp, |b, dp| {
            b.iter(|| hdsd::specifier::build(black_box(dp), &settings).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, build);
criterion_main!(benches);
