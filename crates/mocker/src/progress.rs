//! The replay's progress bar on stderr: requests finished of the total, simulated time
//! reached and the wall time left. It appears only once a run has lasted a second (short
//! runs stay quiet) and never when stderr is not a terminal (indicatif hides itself there).
//!
//! The line fits the terminal: `{wide_bar}` takes whatever the text leaves (the text is
//! about 60 columns at a million requests). The time left is extrapolated from requests
//! done since the run started (not since the bar appeared), and shown as `?` until the
//! first request has finished.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// Shows a replay's progress, if it runs long enough to need it.
pub struct Progress {
    started: Instant,
    bar: Option<ProgressBar>,
}

/// How long a run goes before it gets a bar.
const QUIET_FOR: Duration = Duration::from_secs(1);

const TEMPLATE: &str = "{elapsed_precise} [{wide_bar}] {pos}/{len} requests, sim {msg}, {left} left";

impl Progress {
    /// A progress display for a run starting now.
    pub fn new() -> Self {
        Self { started: Instant::now(), bar: None }
    }

    /// `done` of `total` requests have finished; the simulated clock is at `sim_ms`.
    pub fn update(&mut self, done: usize, total: usize, sim_ms: f64) {
        match &self.bar {
            Some(bar) => set(bar, done, sim_ms),
            None if self.started.elapsed() < QUIET_FOR => {}
            None => {
                let elapsed = self.started.elapsed();
                self.bar = Some(start_bar(ProgressDrawTarget::stderr(), total, done, sim_ms, elapsed));
            }
        }
    }

    /// Removes the bar, so the report that follows starts on a clean line.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// A bar drawing to `target` whose first frame already shows `done` and `sim_ms`: it is
/// filled in while hidden, then attached, so no frame shows a half-set state.
fn start_bar(
    target: ProgressDrawTarget,
    total: usize,
    done: usize,
    sim_ms: f64,
    elapsed: Duration,
) -> ProgressBar {
    let style = ProgressStyle::with_template(TEMPLATE)
        .expect("the template is valid")
        .with_key("left", |s: &ProgressState, w: &mut dyn std::fmt::Write| {
            let _ = match time_left(s.elapsed(), s.pos(), s.len().unwrap_or(0)) {
                Some(d) => write!(w, "{}", short_duration(d)),
                None => write!(w, "?"),
            };
        })
        .progress_chars("=> ");
    let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::hidden())
        .with_style(style)
        .with_elapsed(elapsed);
    set(&bar, done, sim_ms);
    bar.set_draw_target(target);
    bar.tick();
    bar
}

fn set(bar: &ProgressBar, done: usize, sim_ms: f64) {
    bar.set_message(format!("{:.1} s", sim_ms / 1e3));
    bar.set_position(done as u64);
}

/// Wall time left at the average pace so far; unknown before the first request is done.
fn time_left(elapsed: Duration, done: u64, total: u64) -> Option<Duration> {
    (done > 0).then(|| elapsed.mul_f64(total.saturating_sub(done) as f64 / done as f64))
}

/// `1h02m`, `3m05s`, `12s`: short enough to keep the line narrow.
fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use indicatif::TermLike;

    use super::*;

    /// An 80-column terminal that keeps what is written to it.
    #[derive(Debug, Clone, Default)]
    struct Recorder(Arc<Mutex<Vec<String>>>);

    impl TermLike for Recorder {
        fn width(&self) -> u16 {
            80
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> std::io::Result<()> {
            self.0.lock().unwrap().push(s.to_string());
            Ok(())
        }
        fn write_str(&self, s: &str) -> std::io::Result<()> {
            self.write_line(s)
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Ok(())
        }
        fn flush(&self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn first_frame_shows_progress_and_a_real_eta_within_80_columns() {
        let term = Recorder::default();
        let target = ProgressDrawTarget::term_like(Box::new(term.clone()));
        let bar = start_bar(target, 1_000_000, 250_000, 3_893_000.0, Duration::from_secs(100));
        let frames = term.0.lock().unwrap().clone();
        let first = frames.iter().find(|f| !f.trim().is_empty()).expect("a frame was drawn");
        assert!(first.contains(" 250000/1000000 requests, sim 3893.0 s, "), "{first}");
        // 100 s for a quarter: 300 s (5m00s) left, give or take the test's own run time.
        assert!(first.contains(" 5m00s left") || first.contains(" 5m01s left"), "{first}");
        assert!(first.starts_with("00:01:40 ["), "elapsed counts from the run's start: {first}");
        assert!(frames.iter().all(|f| f.chars().count() <= 80), "{frames:?}");
        bar.finish_and_clear();
    }

    #[test]
    fn eta_is_unknown_until_a_request_finishes_and_formats_short() {
        assert_eq!(time_left(Duration::from_secs(5), 0, 100), None);
        assert_eq!(time_left(Duration::from_secs(5), 50, 100), Some(Duration::from_secs(5)));
        assert_eq!(time_left(Duration::from_secs(5), 100, 100), Some(Duration::ZERO));
        assert_eq!(short_duration(Duration::from_secs(12)), "12s");
        assert_eq!(short_duration(Duration::from_secs(185)), "3m05s");
        assert_eq!(short_duration(Duration::from_secs(3720)), "1h02m");
    }
}
