//! The machine side: file descriptor limits, connections from many loopback
//! source addresses, and a process's CPU time and memory from /proc.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the new soft limit.
pub fn raise_nofile() -> u64 {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("warning: cannot raise RLIMIT_NOFILE: {e}");
            rlimit::getrlimit(rlimit::Resource::NOFILE)
                .map(|(soft, _)| soft)
                .unwrap_or(1024)
        }
    }
}

/// The source address of connection `n`: 127.0.0.2, 127.0.0.3, ... wrapping
/// after `spread` addresses, so that no single source address runs out of
/// ephemeral ports. `spread` 0 lets the kernel choose (127.0.0.1).
pub fn source_ip(n: usize, spread: usize) -> Option<Ipv4Addr> {
    if spread == 0 {
        return None;
    }
    let i = (n % spread) as u32 + 2;
    Some(Ipv4Addr::from(u32::from(Ipv4Addr::new(127, 0, 0, 0)) + i))
}

/// Opens one HTTP/2 connection to `target` from `source` (bound before connect).
pub async fn connect(
    target: SocketAddr,
    source: Option<Ipv4Addr>,
    timeout: Duration,
) -> anyhow::Result<Channel> {
    anyhow::ensure!(
        target.ip().is_loopback(),
        "the loadgen only targets loopback addresses, not {target}"
    );
    let endpoint = Endpoint::from_shared(format!("http://{target}"))?
        .connect_timeout(timeout)
        .tcp_nodelay(true);
    let connector = tower::service_fn(move |_: Uri| async move {
        let socket = tokio::net::TcpSocket::new_v4()?;
        if let Some(ip) = source {
            socket.bind(SocketAddr::from((ip, 0)))?;
        }
        let stream = socket.connect(target).await?;
        stream.set_nodelay(true)?;
        Ok::<_, std::io::Error>(TokioIo::new(stream))
    });
    Ok(endpoint.connect_with_connector(connector).await?)
}

/// CPU seconds (user + system) and resident memory of a process.
#[derive(Debug, Clone, Copy)]
pub struct ProcSample {
    pub cpu_seconds: f64,
    pub rss_bytes: u64,
}

/// Reads /proc/<pid>/stat and /proc/<pid>/status (`None` for this process's own).
pub fn sample(pid: Option<u32>) -> anyhow::Result<ProcSample> {
    let base = match pid {
        Some(p) => PathBuf::from(format!("/proc/{p}")),
        None => PathBuf::from("/proc/self"),
    };
    let stat = std::fs::read_to_string(base.join("stat"))?;
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("unexpected /proc stat format"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>()? + fields[12].parse::<f64>()?;
    let status = std::fs::read_to_string(base.join("status"))?;
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    Ok(ProcSample {
        cpu_seconds: ticks / clock_ticks() as f64,
        rss_bytes: rss_kb * 1024,
    })
}

/// USER_HZ: 100 on every Linux architecture this runs on; `getconf` confirms.
fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100)
    })
}

/// The kernel's count of SYNs dropped because a listen queue was full
/// (`TcpExt: ListenOverflows`): each one costs the client a 1 s retransmit.
pub fn listen_overflows() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let i = names
            .split_whitespace()
            .position(|n| n == "ListenOverflows")?;
        return values.split_whitespace().nth(i)?.parse().ok();
    }
    None
}

/// The machine, for the results: cores, memory, CPU model.
pub fn machine() -> serde_json::Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    serde_json::json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "memory_gib": (mem_kb as f64 / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        "cpu_model": model,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_ips_spread_over_loopback() {
        assert_eq!(source_ip(0, 4), Some(Ipv4Addr::new(127, 0, 0, 2)));
        assert_eq!(source_ip(5, 4), Some(Ipv4Addr::new(127, 0, 0, 3)));
        assert_eq!(source_ip(300, 300), Some(Ipv4Addr::new(127, 0, 0, 2)));
        assert_eq!(source_ip(299, 300), Some(Ipv4Addr::new(127, 0, 1, 45)));
        assert_eq!(source_ip(1, 0), None);
    }

    #[test]
    fn own_process_sample() {
        let s = sample(None).unwrap();
        assert!(s.rss_bytes > 0);
        assert!(s.cpu_seconds >= 0.0);
    }
}
