//! `mocker`: a GPU-free simulator of LLM inference engines.

#![warn(missing_docs)]

mod bench;
mod fleet;
mod profiles;
mod progress;
mod replay;
mod serve;
mod sweep;
mod tls_args;
mod trace;

use std::process::ExitCode;

/// The simulation allocates and frees per request (prompts, block lists, radix nodes) on
/// two threads; mimalloc's per-thread free lists make that a fraction of glibc's cost.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for the rest of the process. mimalloc asks for them,
/// and they pay off for dense, allocation-heavy runs (SGLang's radix nodes: 40% faster),
/// but a trace replay's per-worker tables are touched sparsely: each first touch zeroes
/// 2 MB, which doubled its resident set and, on a host that backs memory lazily (a run
/// right after another large process), up to doubled its wall time.
pub(crate) fn avoid_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE only sets a flag on this process; it takes no pointers.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

use clap::{Parser, Subcommand};

/// GPU-free simulator of LLM inference engines (vLLM-style scheduling, paged KV cache,
/// modelled timing).
#[derive(Debug, Parser)]
#[command(name = "mocker", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a trace or a synthetic workload offline, as fast as the CPU allows, and report latencies.
    Replay(replay::ReplayArgs),
    /// Run the fixed benchmark suite and print wall time per workload.
    Bench(bench::BenchArgs),
    /// Serve the OpenAI HTTP API from a simulated engine, streaming at modelled speed.
    Serve(serve::ServeArgs),
    /// Replay one workload over a grid of engine args, worker counts and routers, in
    /// parallel, and write one summary row per point (CSV and/or JSON).
    Sweep(sweep::SweepCommand),
    /// List the timing profiles bundled into mocker (for `--timing-profile NAME`), or
    /// (`profiles predict`) print the pass times a timing profile gives recorded passes.
    Profiles(profiles::ProfilesArgs),
    /// Generate workload traces (`trace generate`: a Mooncake JSONL with prefix families,
    /// follow-up turns, Poisson arrivals and log-normal lengths).
    Trace(trace::TraceArgs),
}

// The replay command's library: its engine args and report files serve the other
// subcommands too, and its user error is every subcommand's.
use mocker_args::{engine_args, output, UsageError};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => replay::run(args).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => bench::run(args).map(|()| ExitCode::SUCCESS),
        Command::Serve(args) => serve::run(args),
        Command::Sweep(args) => sweep::run(args).map(|()| ExitCode::SUCCESS),
        Command::Profiles(args) => profiles::run(args).map(|()| ExitCode::SUCCESS),
        Command::Trace(args) => trace::run(args).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(UsageError(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The kernel reports the process flag the call sets.
    #[test]
    fn avoid_huge_pages_disables_thp_for_the_process() {
        let thp = || {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            status
                .lines()
                .find(|l| l.starts_with("THP_enabled:"))
                .map(|l| l.split_whitespace().nth(1).unwrap().to_string())
        };
        // Kernels before 5.0 do not report the flag; nothing to check there.
        let Some(before) = thp() else { return };
        super::avoid_huge_pages();
        assert_eq!(thp().unwrap(), "0", "was {before}");
    }
}
