//! `mocker`: a GPU-free simulator of LLM inference engines.

#![warn(missing_docs)]

mod bench;
mod engine_args;
mod online;
mod output;
mod progress;
mod replay;
mod serve;
mod sweep;

use std::process::ExitCode;

/// The simulation allocates and frees per request (prompts, block lists, radix nodes) on
/// two threads; mimalloc's per-thread free lists make that a fraction of glibc's cost.
/// It is built without transparent huge pages (`no_thp`): each first touch of a huge
/// page zeroes 2 MB, which doubled the resident set and, on hosts that back memory
/// lazily, the wall time of a short trace replay.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Replay a synthetic workload offline, as fast as the CPU allows, and report latencies.
    Replay(replay::ReplayArgs),
    /// Run the fixed benchmark suite and print wall time per workload.
    Bench(bench::BenchArgs),
    /// Serve the OpenAI HTTP API from a simulated engine, streaming at modelled speed.
    Serve(serve::ServeArgs),
    /// Replay one workload over a grid of engine args, worker counts and routers, in
    /// parallel, and write one summary row per point (CSV and/or JSON).
    Sweep(sweep::SweepArgs),
}

/// A user error: printed with the field it concerns, exit code 2.
#[derive(Debug)]
pub struct UsageError(pub String);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Replay(args) => replay::run(args).map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => bench::run(args).map(|()| ExitCode::SUCCESS),
        Command::Serve(args) => serve::run(args),
        Command::Sweep(args) => sweep::run(args).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(UsageError(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
    }
}
