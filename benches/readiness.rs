//! Report folding: `hdsd::readiness::fold_report` alone, and
//! `hdsd::registry::apply` with a `Command::Report` (what a dataplane's task
//! does per report), for 2 and 16 inbounds, unchanged and flipping.

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use hdsd::clock::{Clock as _, SystemClock};
use hdsd::readiness::{fold_report, rebase};
use hdsd::registry::{apply, Command, Connection, DataplaneState};
use hdsd::report::Report;
use hdsd::sources::Defined;
use std::hint::black_box;

mod common;

fn fold(c: &mut Criterion) {
    let settings = common::settings();
    let mut group = c.benchmark_group("readiness::fold_report");
    for k in [2u16, 16] {
        let dp = common::dataplane(k);
        let spec = hdsd::specifier::build(&dp, &settings).unwrap();
        let now = SystemClock.now();
        let healthy = Report::from(common::report(k, HealthStatus::Healthy));
        let unhealthy = Report::from(common::report(k, HealthStatus::Unhealthy));
        let mut health = rebase(None, &dp, &spec, now);
        fold_report(&mut health, &spec, &healthy, now);
        group.bench_with_input(BenchmarkId::new("unchanged", k), &k, |b, _| {
            b.iter(|| fold_report(&mut health, &spec, black_box(&healthy), now))
        });
        let mut flip = false;
        group.bench_with_input(BenchmarkId::new("flipping", k), &k, |b, _| {
            b.iter(|| {
                flip = !flip;
                let r = if flip { &unhealthy } else { &healthy };
                fold_report(&mut health, &spec, black_box(r), now)
            })
        });
    }
    group.finish();
}

fn registry_apply(c: &mut Criterion) {
    let settings = common::settings();
    let mut group = c.benchmark_group("registry::apply(Report)");
    for k in [2u16, 16] {
        let dp = common::dataplane(k);
        let spec = hdsd::specifier::build(&dp, &settings).unwrap();
        let now = SystemClock.now();
        let health = rebase(None, &dp, &spec, now);
        let mut state = DataplaneState {
            defined: Some(Defined {
                dataplane: Arc::new(dp),
                specifier: Arc::new(spec),
                file: PathBuf::from("dataplanes/dp.yaml"),
            }),
            version: 1,
            health,
            connection: Connection {
                stream: Some(7),
                peer: None,
                connected_at: Some(now),
                replaced_on: None,
                holder: None,
                token_expires_at: None,
            },
            envoy: Default::default(),
        };
        let healthy = Report::from(common::report(k, HealthStatus::Healthy));
        // The report arrives as its bytes, as the stream hands it over: the
        // clone (a reference count) is part of the cost.
        group.bench_with_input(BenchmarkId::new("unchanged", k), &k, |b, _| {
            b.iter(|| {
                let command = Command::Report {
                    stream: 7,
                    report: healthy.clone(),
                    received: std::time::Instant::now(),
                };
                apply(&mut state, black_box(command), now)
            })
        });
        let unhealthy = Report::from(common::report(k, HealthStatus::Unhealthy));
        let mut flip = false;
        group.bench_with_input(BenchmarkId::new("flipping", k), &k, |b, _| {
            b.iter(|| {
                flip = !flip;
                let r = if flip { &unhealthy } else { &healthy };
                let command = Command::Report {
                    stream: 7,
                    report: r.clone(),
                    received: std::time::Instant::now(),
                };
                apply(&mut state, black_box(command), now)
            })
        });
        group.bench_with_input(BenchmarkId::new("report_clone_only", k), &k, |b, _| {
            b.iter(|| black_box(&healthy).clone())
        });
    }
    group.finish();
}

criterion_group!(benches, fold, registry_apply);
criterion_main!(benches);
