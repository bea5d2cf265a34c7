//! `mocker trace generate`: a Mooncake-format trace with prefix families, follow-up turns,
//! Poisson or bursty arrivals and log-normal lengths, streamed to a file or stdout.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use mocker_replay::trace::generator::{GeneratorOptions, TraceGenerator};

use crate::UsageError;

/// `mocker trace ...`.
#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    #[command(subcommand)]
    action: TraceAction,
}

#[derive(Debug, clap::Subcommand)]
enum TraceAction {
    /// Write a synthetic Mooncake trace (JSONL) with the structure chat traffic has: popular
    /// system prompts (Zipf), follow-up turns extending an open conversation, Poisson
    /// arrivals, log-normal prompt and output lengths. Constant memory at any length.
    Generate(GenerateArgs),
}

/// `mocker trace generate`.
#[derive(Debug, clap::Args)]
struct GenerateArgs {
    /// Rows to write.
    #[arg(long, default_value_t = 1000)]
    rows: u64,
    /// Mean arrivals per second (Poisson; default 10).
    #[arg(long)]
    rate: Option<f64>,
    /// A rate that changes over time instead of --rate: RATE:SECONDS segments, comma-
    /// separated, in order; the last rate lasts to the end (e.g. 100:600,400:60,100:1).
    #[arg(long, value_name = "RATE:SECONDS,...", conflicts_with = "rate")]
    rate_schedule: Option<String>,
    /// vLLM's burstiness: gaps between arrivals follow a gamma distribution of this shape at
    /// the same mean rate; 1 is Poisson, below 1 burstier, above 1 more even (0.01 to 100).
    #[arg(long, default_value_t = 1.0)]
    burstiness: f64,
    /// System-prompt families.
    #[arg(long, default_value_t = 32)]
    families: usize,
    /// Zipf exponent of the families' popularity (0: all equally likely).
    #[arg(long, default_value_t = 1.0)]
    zipf: f64,
    /// Tokens of a family's system prompt.
    #[arg(long, default_value_t = 2048)]
    family_tokens: usize,
    /// Share of rows that continue an open conversation (its prompt, its answer, a new message).
    #[arg(long, default_value_t = 0.35)]
    follow_up: f64,
    /// Median new prompt tokens of a row (log-normal).
    #[arg(long, default_value_t = 2500.0)]
    prompt_median: f64,
    /// Largest new prompt.
    #[arg(long, default_value_t = 32_768)]
    prompt_max: usize,
    /// Median output tokens (log-normal).
    #[arg(long, default_value_t = 250.0)]
    output_median: f64,
    /// Largest output.
    #[arg(long, default_value_t = 4096)]
    output_max: usize,
    /// Spread (sigma) of both log-normals.
    #[arg(long, default_value_t = 1.0)]
    sigma: f64,
    /// Tokens per hash id (replay with the same --trace-block-size).
    #[arg(long, default_value_t = 512)]
    block_size: usize,
    /// Open conversations kept for follow-ups (the oldest is closed past it).
    #[arg(long, default_value_t = 10_000)]
    max_open: usize,
    /// Random seed: the same seed writes the same trace.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Where to write (default: standard output).
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Runs `mocker trace ...`.
pub fn run(args: TraceArgs) -> Result<(), UsageError> {
    match args.action {
        TraceAction::Generate(g) => generate(g),
    }
}

/// `--rate-schedule`: `RATE:SECONDS` segments.
fn schedule(text: &str) -> Result<Vec<(f64, f64)>, UsageError> {
    let bad = |part: &str| {
        UsageError(format!("--rate-schedule: {part:?} is not RATE:SECONDS (e.g. 100:600,400:60,100:1)"))
    };
    text.split(',')
        .map(|part| {
            let (rate, seconds) = part.trim().split_once(':').ok_or_else(|| bad(part))?;
            Ok((rate.trim().parse().map_err(|_| bad(part))?, seconds.trim().parse().map_err(|_| bad(part))?))
        })
        .collect()
}

fn generate(g: GenerateArgs) -> Result<(), UsageError> {
    let options = GeneratorOptions {
        rows: g.rows,
        rate: g.rate.unwrap_or(10.0),
        rate_schedule: g.rate_schedule.as_deref().map(schedule).transpose()?.unwrap_or_default(),
        burstiness: g.burstiness,
        families: g.families,
        zipf: g.zipf,
        family_tokens: g.family_tokens,
        follow_up: g.follow_up,
        prompt_median: g.prompt_median,
        prompt_max: g.prompt_max,
        output_median: g.output_median,
        output_max: g.output_max,
        sigma: g.sigma,
        block_size: g.block_size,
        max_open: g.max_open,
        seed: g.seed,
    };
    let rows = TraceGenerator::new(options)
        .map_err(|e| UsageError(format!("--{}: {}", e.field.replace('_', "-"), e.message)))?;
    let (label, sink): (String, Box<dyn Write>) = match &g.output {
        None => ("stdout".into(), Box::new(std::io::stdout().lock())),
        Some(path) => (
            path.display().to_string(),
            Box::new(
                std::fs::File::create(path)
                    .map_err(|e| UsageError(format!("--output: cannot create {}: {e}", path.display())))?,
            ),
        ),
    };
    let mut out = BufWriter::with_capacity(1 << 16, sink);
    for row in rows {
        let written = out.write_all(row.to_json().as_bytes()).and_then(|()| out.write_all(b"\n"));
        match written {
            Ok(()) => {}
            // A reader that stopped early (`| head`) is not an error.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(UsageError(format!("{label}: {e}"))),
        }
    }
    match out.flush() {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(UsageError(format!("{label}: {e}"))),
        _ => Ok(()),
    }
}
