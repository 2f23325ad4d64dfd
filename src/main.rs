//! The `hdsd` binary: the allocator, then the command line parsed and run
//! (`hdsd::cli`, one file per command), its result as the exit code.

use std::process::ExitCode;

use clap::Parser as _;

/// jemalloc instead of glibc's malloc. glibc spent 17 % of hdsd's CPU in a
/// reconnect storm at 10k Envoys in `_int_malloc`, `unlink_chunk` and
/// `malloc_consolidate`, carving each connection's HTTP/2 buffers (16, 8 and
/// 4 KiB) out of a fragmented heap; jemalloc spends 8 %. Connecting 10k
/// Envoys costs about a third less CPU, and the steady RSS is 3 % lower
/// (BENCHMARKS.md, "Round six"). mimalloc held a third more memory.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    match hdsd::cli::Cli::parse().run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
