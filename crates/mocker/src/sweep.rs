//! `mocker sweep`: one offline replay per point of a parameter grid (engine args × worker
//! counts × routers, or prefill × decode worker counts × routers for a disaggregated
//! cluster), run in parallel, one summary row per point as CSV and/or JSON. The grid and its
//! rows are `mocker_args::sweep`'s, shared with the Python module's `mocker.sweep`.

use std::path::PathBuf;

use clap::Args;
use mocker_args::sweep::Row;
use serde_json::Value;

use crate::output::write_atomically;
use crate::UsageError;

/// The grid (base replay flags and axes), the outputs and the parallelism.
#[derive(Debug, Args)]
pub struct SweepCommand {
    /// The base replay and the grid axes.
    #[command(flatten)]
    pub grid: mocker_args::sweep::SweepArgs,
    /// Write the rows here as CSV (header + one row per point).
    #[arg(long)]
    pub output_csv: Option<PathBuf>,
    /// Write the rows here as JSON ({"points": [...]}).
    #[arg(long)]
    pub output_json: Option<PathBuf>,
    /// Points run at once (default: all cores).
    #[arg(long)]
    pub jobs: Option<usize>,
}

fn to_csv(rows: &[Row]) -> Result<Vec<u8>, UsageError> {
    let err = |e: csv::Error| UsageError(format!("--output-csv: {e}"));
    let mut w = csv::Writer::from_writer(Vec::new());
    if let Some(first) = rows.first() {
        w.write_record(first.keys()).map_err(err)?;
    }
    for row in rows {
        w.write_record(row.values().map(|v| match v {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }))
        .map_err(err)?;
    }
    w.into_inner().map_err(|e| UsageError(format!("--output-csv: {e}")))
}

/// Runs `mocker sweep`.
pub fn run(mut args: SweepCommand) -> Result<(), UsageError> {
    if args.grid.base.trace.is_some() {
        // Trace replays touch their tables sparsely, as in `mocker replay`.
        crate::avoid_huge_pages();
    }
    let rows = args.grid.sweep(args.jobs)?.run()?;
    let csv = to_csv(&rows)?;
    let json = serde_json::to_string_pretty(&serde_json::json!({ "points": rows }))
        .expect("rows serialize to JSON")
        + "\n";
    if let Some(p) = &args.output_csv {
        write_atomically(p, &csv)
            .map_err(|e| UsageError(format!("--output-csv: cannot write {}: {e}", p.display())))?;
    }
    if let Some(p) = &args.output_json {
        write_atomically(p, json.as_bytes())
            .map_err(|e| UsageError(format!("--output-json: cannot write {}: {e}", p.display())))?;
    }
    if args.output_csv.is_none() && args.output_json.is_none() {
        print!("{}", String::from_utf8(csv).expect("CSV is UTF-8"));
    } else {
        let written: Vec<String> = [&args.output_csv, &args.output_json]
            .into_iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        println!("{} points written to {}", rows.len(), written.join(" and "));
    }
    Ok(())
}
