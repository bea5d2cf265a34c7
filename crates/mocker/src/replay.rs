//! `mocker replay`: the flags (in `mocker_args::replay`, shared with the Python module) to a
//! run with a progress bar, then the report printed.

use mocker_replay::report::render_table;

use crate::progress::Progress;
use crate::UsageError;

// `serve` warns about transfer keys as replay does.
pub(crate) use mocker_args::replay::{warn_transfer_keys, ReplayArgs};

/// Runs `mocker replay`.
pub fn run(args: ReplayArgs) -> Result<(), UsageError> {
    if args.trace.is_some() {
        // Before the trace is read: its id map and rows are filled sparsely too.
        crate::avoid_huge_pages();
    }
    let options = args.options()?;
    let run = args.describe(&options);
    let mut progress = Progress::new();
    let mut on_progress = |done: usize, total: usize, sim_ms: f64| progress.update(done, total, sim_ms);
    let hooks = mocker_args::replay::RunHooks { progress: Some(&mut on_progress), ..Default::default() };
    let outcome = args.execute(&options, &run, hooks);
    progress.finish();
    let outcome = outcome?;
    let shown = args.report_path().map(|p| p.display().to_string());
    print!("{}{}", run.header(), render_table(&outcome.summary, shown.as_deref()));
    if let Some(counts) = mocker_args::replay::worker_counts(&options, &outcome) {
        print!("{}", counts.render());
    }
    let s = &outcome.summary;
    if s.completed_requests < s.num_requests {
        // The table's figures cover completed requests only; say what the rest were.
        eprintln!(
            "warning: {} of {} requests did not complete (rejected: a prompt plus its output needs more \
             KV than a worker has, or the simulation ended first); the figures cover the {} that did",
            s.num_requests - s.completed_requests,
            s.num_requests,
            s.completed_requests
        );
    }
    Ok(())
}
