//! The replay's progress bar on stderr: requests finished of the total and simulated time
//! reached. It appears only once a run has lasted a second (short runs stay quiet) and
//! never when stderr is not a terminal (indicatif hides itself there).

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Shows a replay's progress, if it runs long enough to need it.
pub struct Progress {
    started: Instant,
    bar: Option<ProgressBar>,
}

/// How long a run goes before it gets a bar.
const QUIET_FOR: Duration = Duration::from_secs(1);

impl Progress {
    /// A progress display for a run starting now.
    pub fn new() -> Self {
        Self { started: Instant::now(), bar: None }
    }

    /// `done` of `total` requests have finished; the simulated clock is at `sim_ms`.
    pub fn update(&mut self, done: usize, total: usize, sim_ms: f64) {
        if self.bar.is_none() {
            if self.started.elapsed() < QUIET_FOR {
                return;
            }
            let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {pos}/{len} requests, simulated {msg} ({eta} left)",
            )
            .expect("the template is valid")
            .progress_chars("=> ");
            bar.set_style(style);
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            // The message first: a position change may draw, and the first frame would
            // otherwise show no simulated time.
            bar.set_message(format!("{:.1} s", sim_ms / 1e3));
            bar.set_position(done as u64);
        }
    }

    /// Removes the bar, so the report that follows starts on a clean line.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
