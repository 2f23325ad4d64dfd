//! The log's byte budget (`log.max_bytes_per_second`): whatever writes the
//! lines (a flood of refusals, a client's long strings, a flapping fleet),
//! the log grows by at most this many bytes per second. Each line is
//! checked whole as the formatter hands it over; past the budget it is
//! left out and counted, and the first line written once there is room
//! again is preceded by one saying how many lines and bytes were left out.
//! A line longer than the whole budget is never written whole: coming
//! first in its window it is cut to the budget (a JSON line, which a cut
//! would break, is replaced by a short one saying so), so one line of any
//! size costs at most the budget.
//!
//! Per-peer line limits ([`crate::net::LogLimiter`]) and the journal's
//! budget ([`crate::journal`]) keep one source from crowding out the
//! others; this is the bound on the sum.

use std::io::{self, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The budget's window.
pub const WINDOW: Duration = Duration::from_secs(1);

/// Bytes per [`WINDOW`]; pure over the time it is given.
#[derive(Debug, Clone)]
pub struct ByteBudget {
    bytes: u64,
    start: Option<Instant>,
    used: u64,
    left_out_lines: u64,
    left_out_bytes: u64,
}

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Write it; first say that `lines` lines of `bytes` bytes were left
    /// out, when `lines` > 0.
    Write { lines: u64, bytes: u64 },
    /// Leave it out (counted).
    LeaveOut,
    /// The line is longer than the whole budget and comes first in its
    /// window: write at most `keep` bytes of it, then say it was cut
    /// (first saying what was left out, as for [`Verdict::Write`]).
    Cut { keep: u64, lines: u64, bytes: u64 },
}

/// Bytes of a window's budget kept for the note that ends a cut line.
pub const CUT_NOTE_BYTES: u64 = 96;

impl ByteBudget {
    /// `bytes` per window; 0 means no limit.
    pub fn new(bytes: u64) -> ByteBudget {
        ByteBudget {
            bytes,
            start: None,
            used: 0,
            left_out_lines: 0,
            left_out_bytes: 0,
        }
    }

    /// Whether a line of `len` bytes may be written at `now`.
    pub fn admit(&mut self, len: u64, now: Instant) -> Verdict {
        if self.bytes == 0 {
            return Verdict::Write { lines: 0, bytes: 0 };
        }
        if self
            .start
            .is_none_or(|start| now.duration_since(start) >= WINDOW)
        {
            self.start = Some(now);
            self.used = 0;
        }
        if self.used.saturating_add(len) > self.bytes {
            if self.used > 0 {
                self.left_out_lines += 1;
                self.left_out_bytes = self.left_out_bytes.saturating_add(len);
                return Verdict::LeaveOut;
            }
            // Longer than the whole budget, first in its window: cut to the
            // budget, so that no line is lost for its size alone and none
            // costs more than the budget.
            self.used = self.bytes;
            return Verdict::Cut {
                keep: self.bytes.saturating_sub(CUT_NOTE_BYTES),
                lines: std::mem::take(&mut self.left_out_lines),
                bytes: std::mem::take(&mut self.left_out_bytes),
            };
        }
        self.used += len;
        Verdict::Write {
            lines: std::mem::take(&mut self.left_out_lines),
            bytes: std::mem::take(&mut self.left_out_bytes),
        }
    }
}

/// The line that says what was left out, in the log's format.
pub fn left_out_line(json: bool, lines: u64, bytes: u64, at: SystemTime) -> String {
    let message =
        format!("log.max_bytes_per_second reached: {lines} lines ({bytes} bytes) were left out");
    let timestamp = humantime::format_rfc3339_micros(at);
    match json {
        true => format!(
            "{}\n",
            serde_json::json!({
                "timestamp": timestamp.to_string(),
                "level": "WARN",
                "fields": { "message": message, "left_out_lines": lines, "left_out_bytes": bytes },
                "target": "hdsd::log",
            })
        ),
        false => format!("{timestamp}  WARN hdsd::log: {message}\n"),
    }
}

/// What is written of a line of `line.len()` bytes cut to `keep` bytes: its
/// first `keep` bytes (at a character boundary) and a note saying how long
/// it was, in text; in JSON (which a cut would break) a short warning line
/// in the log's format instead.
pub fn cut_line(json: bool, line: &[u8], keep: u64, at: SystemTime) -> Vec<u8> {
    let len = line.len();
    let message =
        format!("a log line of {len} bytes was cut: it is longer than log.max_bytes_per_second");
    if json {
        let timestamp = humantime::format_rfc3339_micros(at);
        let mut out = serde_json::json!({
            "timestamp": timestamp.to_string(),
            "level": "WARN",
            "fields": { "message": message, "cut_bytes": len },
            "target": "hdsd::log",
        })
        .to_string()
        .into_bytes();
        out.push(b'\n');
        return out;
    }
    let text = String::from_utf8_lossy(line);
    let mut end = usize::try_from(keep).unwrap_or(usize::MAX).min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = text[..end].trim_end_matches('\n').as_bytes().to_vec();
    out.extend_from_slice(format!(" ... ({message})\n").as_bytes());
    out
}

/// Standard error under a [`ByteBudget`], as a writer for the formatter.
#[derive(Debug, Clone)]
pub struct BudgetedStderr {
    budget: Arc<Mutex<ByteBudget>>,
    json: bool,
}

impl BudgetedStderr {
    pub fn new(bytes_per_second: u64, json: bool) -> BudgetedStderr {
        BudgetedStderr {
            budget: Arc::new(Mutex::new(ByteBudget::new(bytes_per_second))),
            json,
        }
    }
}

impl Write for BudgetedStderr {
    /// The formatter writes each line whole in one call.
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let verdict = self
            .budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(buf.len() as u64, Instant::now());
        let (lines, bytes, keep) = match verdict {
            Verdict::LeaveOut => return Ok(buf.len()),
            Verdict::Write { lines, bytes } => (lines, bytes, None),
            Verdict::Cut { keep, lines, bytes } => (lines, bytes, Some(keep)),
        };
        let mut err = io::stderr().lock();
        if lines > 0 {
            err.write_all(left_out_line(self.json, lines, bytes, SystemTime::now()).as_bytes())?;
        }
        match keep {
            None => err.write_all(buf)?,
            Some(keep) => err.write_all(&cut_line(self.json, buf, keep, SystemTime::now()))?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for BudgetedStderr {
    type Writer = BudgetedStderr;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_bytes_lines_are_left_out_and_the_next_one_says_so() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(1000);
        assert_eq!(b.admit(600, t0), Verdict::Write { lines: 0, bytes: 0 });
        assert_eq!(b.admit(300, t0), Verdict::Write { lines: 0, bytes: 0 });
        // 112 MB of log in 9.5 s was the finding: here, 200 bytes too many.
        assert_eq!(b.admit(200, t0), Verdict::LeaveOut);
        assert_eq!(
            b.admit(150, t0 + Duration::from_millis(900)),
            Verdict::LeaveOut
        );
        // A line that fits again says what was left out before it.
        assert_eq!(
            b.admit(100, t0 + Duration::from_millis(950)),
            Verdict::Write {
                lines: 2,
                bytes: 350
            }
        );
        assert_eq!(
            b.admit(1, t0 + Duration::from_millis(990)),
            Verdict::LeaveOut
        );
        assert_eq!(
            b.admit(900, t0 + WINDOW),
            Verdict::Write { lines: 1, bytes: 1 }
        );
    }

    /// A line over the whole budget is never written whole (a 500 KB line
    /// was, whenever it came first in its second): first in its window it
    /// is cut to the budget, later it is left out like any other.
    #[test]
    fn a_line_larger_than_the_budget_is_cut_to_it_first_in_its_window() {
        let t0 = Instant::now();
        let mut b = ByteBudget::new(1000);
        assert_eq!(
            b.admit(500_000, t0),
            Verdict::Cut {
                keep: 1000 - CUT_NOTE_BYTES,
                lines: 0,
                bytes: 0
            }
        );
        assert_eq!(b.admit(1, t0), Verdict::LeaveOut);
        assert_eq!(b.admit(500_000, t0), Verdict::LeaveOut);
        // The next window: the cut line is preceded by what was left out.
        assert_eq!(
            b.admit(500_000, t0 + WINDOW),
            Verdict::Cut {
                keep: 1000 - CUT_NOTE_BYTES,
                lines: 2,
                bytes: 500_001
            }
        );
        // Over many windows the log grows by at most the budget per window.
        let mut written = 0u64;
        let mut b = ByteBudget::new(4096);
        let line = vec![b'x'; 1 << 20];
        for i in 0..10u32 {
            let at = t0 + WINDOW * i;
            for _ in 0..3 {
                written += match b.admit(line.len() as u64, at) {
                    Verdict::Write { .. } => line.len() as u64,
                    Verdict::Cut { keep, .. } => {
                        cut_line(false, &line, keep, SystemTime::now()).len() as u64
                    }
                    Verdict::LeaveOut => 0,
                };
            }
        }
        assert!(written <= 10 * 4096, "{written} bytes in 10 windows");
        assert!(written > 0);
    }

    #[test]
    fn a_cut_line_ends_with_its_length_and_a_json_one_is_replaced() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let line = format!("{}\n", "é".repeat(1000));
        let cut = String::from_utf8(cut_line(false, line.as_bytes(), 101, at)).expect("UTF-8");
        assert!(cut.starts_with(&"é".repeat(50)), "{cut}");
        assert!(
            cut.ends_with(" ... (a log line of 2001 bytes was cut: it is longer than log.max_bytes_per_second)\n"),
            "{cut}"
        );
        assert!(
            cut.len() <= 101 + CUT_NOTE_BYTES as usize,
            "{} bytes",
            cut.len()
        );
        let json: serde_json::Value =
            serde_json::from_slice(&cut_line(true, line.as_bytes(), 101, at))
                .expect("one JSON line");
        assert_eq!(json["fields"]["cut_bytes"], 2001);
    }

    #[test]
    fn the_unlimited_budget_writes_everything() {
        let t0 = Instant::now();
        let mut unlimited = ByteBudget::new(0);
        for _ in 0..1000 {
            assert_eq!(
                unlimited.admit(1 << 20, t0),
                Verdict::Write { lines: 0, bytes: 0 }
            );
        }
    }

    #[test]
    fn the_left_out_line_is_in_the_log_format() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let text = left_out_line(false, 3, 4096, at);
        assert!(text.ends_with(
            "WARN hdsd::log: log.max_bytes_per_second reached: 3 lines (4096 bytes) were left out\n"
        ));
        let json: serde_json::Value =
            serde_json::from_str(&left_out_line(true, 3, 4096, at)).expect("one JSON line");
        assert_eq!(json["level"], "WARN");
        assert_eq!(json["fields"]["left_out_lines"], 3);
    }
}
