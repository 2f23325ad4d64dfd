//! The figures each scenario reports, worked out from what was sampled:
//! pure functions of process samples, counts and latencies.

use std::time::Duration;

use serde_json::{json, Value};

use crate::stats::{round3, summary};
use crate::sys::ProcSample;

/// Bytes in MiB, to three decimals.
pub fn mib(bytes: u64) -> f64 {
    round3(bytes as f64 / 1048576.0)
}

/// Percent of one core a process used between two samples `window`
/// seconds apart (null without both).
pub fn cpu_percent(before: Option<ProcSample>, after: Option<ProcSample>, window: f64) -> Value {
    match (before, after) {
        (Some(a), Some(z)) => json!(round3((z.cpu_seconds - a.cpu_seconds) / window * 100.0)),
        _ => Value::Null,
    }
}

/// CPU microseconds per event between two samples of one process.
pub fn cpu_us_per(before: Option<ProcSample>, after: Option<ProcSample>, events: usize) -> Value {
    match (before, after) {
        (Some(a), Some(b)) if events > 0 => {
            json!(round3(
                (b.cpu_seconds - a.cpu_seconds) / events as f64 * 1e6
            ))
        }
        _ => Value::Null,
    }
}

/// The server's samples around the connect phase and the steady window.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerSamples {
    pub baseline: Option<ProcSample>,
    pub after_connect: Option<ProcSample>,
    pub steady_start: Option<ProcSample>,
    pub steady_end: Option<ProcSample>,
}

/// The server's memory and CPU over the connect phase and the steady
/// window of `window` seconds, in which `reports` were sent by `active`
/// connected dataplanes (null without every sample).
pub fn server_steady(
    pid: Option<u32>,
    s: ServerSamples,
    window: f64,
    reports: u64,
    active: usize,
) -> Value {
    let (Some(b), Some(c), Some(a), Some(z)) =
        (s.baseline, s.after_connect, s.steady_start, s.steady_end)
    else {
        return Value::Null;
    };
    let cpu = (z.cpu_seconds - a.cpu_seconds) / window;
    let per_dp = if active > 0 {
        (z.rss_bytes as f64 - b.rss_bytes as f64) / active as f64
    } else {
        0.0
    };
    json!({
        "pid": pid,
        "rss_baseline_mib": mib(b.rss_bytes),
        "rss_after_connect_mib": mib(c.rss_bytes),
        "rss_steady_mib": mib(z.rss_bytes),
        "rss_per_connected_dataplane_kib": round3(per_dp / 1024.0),
        "cpu_seconds_connect": round3(c.cpu_seconds - b.cpu_seconds),
        "cpu_seconds_steady": round3(z.cpu_seconds - a.cpu_seconds),
        "cpu_percent_of_one_core_steady": round3(cpu * 100.0),
        "cpu_us_per_report": if reports > 0 {
            json!(round3((z.cpu_seconds - a.cpu_seconds) / reports as f64 * 1e6))
        } else {
            Value::Null
        },
    })
}

/// The report rate `active` dataplanes owe at one report per `interval`
/// (null in saturation: no interval).
pub fn expected_rate(rate_unlimited: bool, active: usize, interval: Duration) -> Value {
    if rate_unlimited {
        Value::Null
    } else {
        json!(round3(active as f64 / interval.as_secs_f64()))
    }
}

/// The soak's RSS curve and its growth: over the last hour (null when the
/// window is shorter), and over the window's second half. `samples` are
/// (seconds since the first sample, bytes).
pub fn rss_soak(samples: &[(f64, u64)]) -> Value {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return Value::Null;
    };
    let growth =
        |from: &(f64, u64)| round3((last.1 as f64 - from.1 as f64) / from.1 as f64 * 100.0);
    let at = |t: f64| samples.iter().find(|s| s.0 >= t);
    let hour = 3600.0;
    json!({
        "samples": samples.len(),
        "first_mib": mib(first.1),
        "last_mib": mib(last.1),
        "max_mib": mib(samples.iter().map(|s| s.1).max().unwrap_or(0)),
        "growth_last_hour_percent": if last.0 - first.0 >= hour {
            at(last.0 - hour).map(growth).map(Value::from).unwrap_or(Value::Null)
        } else {
            Value::Null
        },
        "growth_second_half_percent": at(first.0 + (last.0 - first.0) / 2.0).map(growth),
        "curve_s_mib": samples
            .iter()
            .map(|s| json!([round3(s.0), mib(s.1)]))
            .collect::<Vec<_>>(),
    })
}

/// One window of `n` consumers of one kind (`what`: "watcher", "subscriber").
#[derive(Debug, Clone, Copy)]
pub struct ConsumerWindow<'a> {
    pub what: &'a str,
    pub n: usize,
    /// Seconds until all had synced, if they did.
    pub synced_in: Option<f64>,
    pub window: f64,
    /// Flips the simulated Envoys reported in the window.
    pub flips: u64,
    /// The loadgen's own samples at the window's ends.
    pub own: (Option<ProcSample>, Option<ProcSample>),
    /// The server before the consumers, once they synced, at the window's ends.
    pub server: [Option<ProcSample>; 4],
    /// The server's CPU in the steady window, without consumers.
    pub steady_cpu: Option<f64>,
}

/// The consumers' figures: `tally` (what they counted, with its `latency`
/// summary) and what the window adds to it.
pub fn consumer_figures(mut tally: Value, w: &ConsumerWindow<'_>) -> Value {
    let (what, n, window) = (w.what, w.n, w.window);
    let r = &mut tally;
    let per = |x: f64| round3(x / n as f64);
    r[format!("{what}s")] = json!(n);
    r["all_synced_within_s"] = json!(w.synced_in.map(round3));
    r["window_s"] = json!(round3(window));
    r["flips_reported"] = json!(w.flips);
    // The loadgen's own CPU in the window: its Envoys and the consumers.
    r["loadgen_cpu_percent_of_one_core"] = cpu_percent(w.own.0, w.own.1, window);
    r["flips_per_s"] = json!(round3(w.flips as f64 / window));
    let expected = w.flips as f64 * n as f64;
    let samples = r["latency"]["samples"].as_f64().unwrap_or(0.0);
    r["flips_seen_fraction"] = if expected > 0.0 {
        json!(round3(samples / expected))
    } else {
        Value::Null
    };
    if let [Some(b), Some(c), Some(a), Some(z)] = w.server {
        let cpu = (z.cpu_seconds - a.cpu_seconds) / window * 100.0;
        let rss = z.rss_bytes as f64 - b.rss_bytes as f64;
        let steady_cpu = w.steady_cpu;
        r["server"] = json!({
            "rss_before_mib": mib(b.rss_bytes),
            "rss_with_mib": mib(z.rss_bytes),
            format!("rss_per_{what}_kib"): per(rss / 1024.0),
            "cpu_seconds_connect": round3(c.cpu_seconds - b.cpu_seconds),
            "cpu_percent_of_one_core_without": steady_cpu,
            "cpu_percent_of_one_core_with": round3(cpu),
            "cpu_percent_added": steady_cpu.map(|s| round3(cpu - s)),
            format!("cpu_percent_added_per_{what}"): steady_cpu.map(|s| per(cpu - s)),
        });
    }
    tally
}

/// A reconnect storm of `target` streams.
#[derive(Debug, Clone, Default)]
pub struct Storm {
    pub target: usize,
    pub served_again: usize,
    /// Seconds until all were served again, when they were in time.
    pub all_served_within: Option<f64>,
    /// Seconds from the storm to each stream's new specifier.
    pub served_after: Vec<f64>,
    pub server: (Option<ProcSample>, Option<ProcSample>),
    pub own: (Option<ProcSample>, Option<ProcSample>),
}

pub fn storm_figures(s: &Storm) -> Value {
    json!({
        "dataplanes": s.target,
        "served_again": s.served_again,
        "all_served_within_s": s.all_served_within.map(round3),
        "served_after": summary(&s.served_after),
        "server_cpu_seconds": match s.server {
            (Some(a), Some(b)) => json!(round3(b.cpu_seconds - a.cpu_seconds)),
            _ => Value::Null,
        },
        "server_cpu_us_per_reconnect": cpu_us_per(s.server.0, s.server.1, s.target),
        "loadgen_cpu_us_per_reconnect": cpu_us_per(s.own.0, s.own.1, s.target),
    })
}

/// Definition churn: `done` changes requested at `rate` per second, written
/// in `written_in` seconds; `latencies` of those applied within
/// `applied_in`; `lost` not applied in time.
pub fn churn_figures(
    done: usize,
    rate: f64,
    written_in: f64,
    applied_in: f64,
    lost: usize,
    latencies: &[f64],
) -> Value {
    json!({
        "changes": done,
        "requested_rate_per_s": rate,
        "written_rate_per_s": round3(done as f64 / written_in),
        "applied": latencies.len(),
        "applied_rate_per_s": round3(latencies.len() as f64 / applied_in),
        "not_applied_within_60s": lost,
        "push_latency": summary(latencies),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(cpu_seconds: f64, mib: u64) -> Option<ProcSample> {
        Some(ProcSample {
            cpu_seconds,
            rss_bytes: mib << 20,
        })
    }

    #[test]
    fn cpu_is_a_percent_of_one_core_and_a_cost_per_event() {
        assert_eq!(cpu_percent(at(1.0, 0), at(1.5, 0), 2.0), json!(25.0));
        assert_eq!(cpu_percent(None, at(1.5, 0), 2.0), Value::Null);
        assert_eq!(cpu_us_per(at(1.0, 0), at(1.5, 0), 1000), json!(500.0));
        assert_eq!(cpu_us_per(at(1.0, 0), at(1.5, 0), 0), Value::Null);
        assert_eq!(cpu_us_per(at(1.0, 0), None, 10), Value::Null);
        assert_eq!(mib(3 << 19), 1.5);
    }

    #[test]
    fn the_steady_window_gives_memory_per_dataplane_and_cpu_per_report() {
        let s = ServerSamples {
            baseline: at(0.5, 10),
            after_connect: at(2.0, 30),
            steady_start: at(3.0, 30),
            steady_end: at(4.0, 40),
        };
        // 10 s, 20,000 reports, 1,024 dataplanes: 30 MiB more than the baseline.
        let v = server_steady(Some(7), s, 10.0, 20_000, 1024);
        assert_eq!(v["pid"], 7);
        assert_eq!(v["rss_baseline_mib"], 10.0);
        assert_eq!(v["rss_after_connect_mib"], 30.0);
        assert_eq!(v["rss_steady_mib"], 40.0);
        assert_eq!(v["rss_per_connected_dataplane_kib"], 30.0);
        assert_eq!(v["cpu_seconds_connect"], 1.5);
        assert_eq!(v["cpu_seconds_steady"], 1.0);
        assert_eq!(v["cpu_percent_of_one_core_steady"], 10.0);
        assert_eq!(v["cpu_us_per_report"], 50.0);
        let none = server_steady(Some(7), s, 10.0, 0, 0);
        assert_eq!(none["cpu_us_per_report"], Value::Null);
        assert_eq!(none["rss_per_connected_dataplane_kib"], 0.0);
        let missing = ServerSamples {
            steady_end: None,
            ..s
        };
        assert_eq!(server_steady(None, missing, 10.0, 1, 1), Value::Null);
    }

    #[test]
    fn the_expected_rate_is_one_report_per_interval() {
        let interval = Duration::from_secs(5);
        assert_eq!(expected_rate(false, 10_000, interval), json!(2000.0));
        assert_eq!(expected_rate(true, 10_000, interval), Value::Null);
    }

    #[test]
    fn the_soak_reports_growth_over_the_last_hour_and_the_second_half() {
        assert_eq!(rss_soak(&[]), Value::Null);
        // Two hours, a sample every 30 minutes: 100, 110, 120, 121, 132 MiB.
        let mib = |m: u64| m << 20;
        let samples: Vec<(f64, u64)> = [100, 110, 120, 121, 132]
            .iter()
            .enumerate()
            .map(|(i, &m)| (i as f64 * 1800.0, mib(m)))
            .collect();
        let v = rss_soak(&samples);
        assert_eq!(v["samples"], 5);
        assert_eq!(
            (v["first_mib"].clone(), v["last_mib"].clone()),
            (json!(100.0), json!(132.0))
        );
        assert_eq!(v["max_mib"], 132.0);
        // From the sample at 1 h (120 MiB) to the last: +10 %.
        assert_eq!(v["growth_last_hour_percent"], 10.0);
        assert_eq!(v["growth_second_half_percent"], 10.0);
        assert_eq!(v["curve_s_mib"][4], json!([7200.0, 132.0]));
        // Under an hour: no hourly growth; the second half from 50 to 55.
        let short = rss_soak(&[(0.0, 40), (30.0, 50), (60.0, 55)]);
        assert_eq!(short["growth_last_hour_percent"], Value::Null);
        assert_eq!(short["growth_second_half_percent"], 10.0);
    }

    #[test]
    fn consumers_get_their_share_of_the_servers_cost_and_the_flips_they_saw() {
        let tally = json!({"synced": 4, "latency": {"samples": 300}});
        let w = ConsumerWindow {
            what: "watcher",
            n: 4,
            synced_in: Some(0.12345),
            window: 10.0,
            flips: 100,
            own: (at(1.0, 0), at(2.0, 0)),
            server: [at(0.0, 100), at(1.0, 104), at(2.0, 104), at(4.0, 108)],
            steady_cpu: Some(12.0),
        };
        let r = consumer_figures(tally, &w);
        assert_eq!(r["synced"], 4, "the tally is kept");
        assert_eq!(r["watchers"], 4);
        assert_eq!(r["all_synced_within_s"], 0.123);
        assert_eq!(r["window_s"], 10.0);
        assert_eq!(r["flips_reported"], 100);
        assert_eq!(r["flips_per_s"], 10.0);
        assert_eq!(r["loadgen_cpu_percent_of_one_core"], 10.0);
        // 300 events of 400 (100 flips at each of 4 watchers).
        assert_eq!(r["flips_seen_fraction"], 0.75);
        let s = &r["server"];
        assert_eq!(s["rss_before_mib"], 100.0);
        assert_eq!(s["rss_with_mib"], 108.0);
        assert_eq!(s["rss_per_watcher_kib"], 2048.0);
        assert_eq!(s["cpu_seconds_connect"], 1.0);
        assert_eq!(s["cpu_percent_of_one_core_with"], 20.0);
        assert_eq!(s["cpu_percent_added"], 8.0);
        assert_eq!(s["cpu_percent_added_per_watcher"], 2.0);

        let quiet = ConsumerWindow {
            flips: 0,
            server: [None; 4],
            own: (None, None),
            ..w
        };
        let r = consumer_figures(json!({"latency": {"samples": 0}}), &quiet);
        assert_eq!(r["flips_seen_fraction"], Value::Null);
        assert_eq!(r["loadgen_cpu_percent_of_one_core"], Value::Null);
        assert_eq!(r.get("server"), None);
    }

    #[test]
    fn a_storm_reports_how_soon_everyone_was_served_and_its_cost() {
        let s = Storm {
            target: 4,
            served_again: 4,
            all_served_within: Some(1.23456),
            served_after: vec![0.1, 0.2, 0.3, 0.4],
            server: (at(1.0, 0), at(1.2, 0)),
            own: (at(5.0, 0), at(5.1, 0)),
        };
        let v = storm_figures(&s);
        assert_eq!(v["dataplanes"], 4);
        assert_eq!(v["all_served_within_s"], 1.235);
        assert_eq!(v["served_after"]["p50_ms"], 200.0);
        assert_eq!(v["served_after"]["max_ms"], 400.0);
        assert_eq!(v["server_cpu_seconds"], 0.2);
        assert_eq!(v["server_cpu_us_per_reconnect"], 50_000.0);
        assert_eq!(v["loadgen_cpu_us_per_reconnect"], 25_000.0);
        let late = storm_figures(&Storm {
            target: 4,
            served_again: 3,
            ..Storm::default()
        });
        assert_eq!(late["all_served_within_s"], Value::Null);
        assert_eq!(late["server_cpu_seconds"], Value::Null);
        assert_eq!(late["served_after"]["samples"], 0);
    }

    #[test]
    fn churn_reports_the_rates_written_and_applied() {
        let v = churn_figures(100, 50.0, 2.0, 4.0, 2, &[0.01; 98]);
        assert_eq!(v["changes"], 100);
        assert_eq!(v["requested_rate_per_s"], 50.0);
        assert_eq!(v["written_rate_per_s"], 50.0);
        assert_eq!(v["applied"], 98);
        assert_eq!(v["applied_rate_per_s"], 24.5);
        assert_eq!(v["not_applied_within_60s"], 2);
        assert_eq!(v["push_latency"]["p99_ms"], 10.0);
    }
}
