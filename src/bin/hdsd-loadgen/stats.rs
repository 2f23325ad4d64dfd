//! Latency summaries and the results table.

use serde_json::{json, Value};

/// p50 / p99 / max (milliseconds) of a set of latencies in seconds.
pub fn summary(samples: &[f64]) -> Value {
    if samples.is_empty() {
        return json!({"samples": 0});
    }
    let mut v = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let q = |q: f64| {
        let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
        round3(v[rank - 1] * 1000.0)
    };
    json!({
        "samples": v.len(),
        "p50_ms": q(0.50),
        "p99_ms": q(0.99),
        "max_ms": round3(v[v.len() - 1] * 1000.0),
    })
}

pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Flattens the results into `key: value` rows for the terminal.
pub fn table(value: &Value) -> String {
    let mut rows = Vec::new();
    flatten("", value, &mut rows);
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
        .collect()
}

fn flatten(prefix: &str, value: &Value, rows: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, rows);
            }
        }
        Value::Null => rows.push((prefix.to_string(), "-".into())),
        Value::String(s) => rows.push((prefix.to_string(), s.clone())),
        other => rows.push((prefix.to_string(), other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<f64> = (1..=100).map(|i| f64::from(i) / 1000.0).collect();
        let s = summary(&v);
        assert_eq!(s["p50_ms"], 50.0);
        assert_eq!(s["p99_ms"], 99.0);
        assert_eq!(s["max_ms"], 100.0);
        assert_eq!(summary(&[])["samples"], 0);
        let t = table(&json!({"a": {"b": 1}, "c": null}));
        assert!(t.contains("a.b  1"), "{t}");
    }
}
