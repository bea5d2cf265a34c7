//! Upper bounds of a replay's sizes and times, checked before anything runs.
//!
//! Each bound is far above real use and low enough that nothing a replay allocates up
//! front (engines, planned turns, per-request latency samples) exhausts memory, and that
//! every simulated time fits the u64 nanosecond clock. The clock holds 1.8e13 ms (about
//! 5.1 million hours); inputs may reach [`MAX_SIM_MS`], a fifth of it, so that the passes
//! and transfers simulated after the last arrival still fit. A saturated clock would
//! otherwise report wrong durations (and a wrapped one run delayed turns back to back)
//! with exit 0.

use crate::options::{invalid, ReplayError, ReplayOptions, TraceWorkload, Workload};
use crate::workload::{Load, SyntheticWorkload};

/// Simulated-time horizon, ms: 10^6 hours.
pub const MAX_SIM_MS: f64 = 3.6e12;
/// Most workers in one pool (`--num-workers`, `--num-prefill-workers`,
/// `--num-decode-workers`): each engine holds about 0.2 MB before any request.
pub const MAX_WORKERS: usize = 1024;
/// Most simulated engines in one replay (workers × `dp_size`, over all pools).
pub const MAX_ENGINES: usize = 4096;
/// Most requests one replay issues (sessions × turns, trace requests × repeats): the
/// report keeps four latency samples (32 bytes) per request, 3.2 GB at the bound.
pub const MAX_REQUESTS: usize = 100_000_000;
/// Most turns in one session (`--turns-per-session`, an applied-compute-agentic line's
/// `num_turns`): a session's turns are planned together (agents run tens to hundreds).
pub const MAX_TURNS: usize = 100_000;
/// Most prompt tokens planned for one session (the sum over its turns): its prompts are
/// materialised together, 64 MiB at the bound (the same bound as one trace prompt).
pub const MAX_SESSION_TOKENS: usize = crate::trace::MAX_TRACE_TOKENS;
/// Most sessions in flight (`--concurrency`).
pub const MAX_CONCURRENCY: usize = 1_000_000;
/// Range of `--arrival-speedup-ratio`.
pub const SPEEDUP_RANGE: (f64, f64) = (1e-6, 1e6);

/// `x` for a message: in exponent form when very large or small (1e300 spelt out is
/// three hundred digits).
pub fn show(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-4..1e9).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// `n` in `1..=max`, else an error naming `field`.
pub(crate) fn count(field: &'static str, n: usize, max: usize) -> Result<(), ReplayError> {
    if (1..=max).contains(&n) {
        return Ok(());
    }
    Err(invalid(field, format!("must be in 1..={max} (got {n})")))
}

/// Refuses a workload whose arrivals and delays, divided by the speed-up ratio, reach past
/// [`MAX_SIM_MS`]; the error names the flag to change.
pub(crate) fn check_horizon(o: &ReplayOptions) -> Result<(), ReplayError> {
    let r = o.arrival_speedup_ratio;
    match &o.workload {
        Workload::Synthetic(w) => synthetic_horizon(w, r),
        Workload::Trace(t) => trace_horizon(t, r),
    }
}

/// `ms` of workload time at speed-up `r`, refused past the horizon under `field` (or
/// under the ratio, when the ratio is what pushes it past).
fn within(field: &'static str, what: &str, ms: f64, r: f64) -> Result<(), ReplayError> {
    let scaled = ms / r;
    if scaled <= MAX_SIM_MS {
        return Ok(());
    }
    let horizon = format!("the simulated clock's horizon of {MAX_SIM_MS:e} ms (10^6 hours)");
    if ms <= MAX_SIM_MS {
        let least = ms / MAX_SIM_MS;
        return Err(invalid(
            "arrival_speedup_ratio",
            format!(
                "{} stretches {what} ({} ms) to {} ms, past {horizon}; use at least {least:.3e}",
                show(r),
                show(ms),
                show(scaled)
            ),
        ));
    }
    let by = if r == 1.0 { String::new() } else { format!(" (÷ --arrival-speedup-ratio {})", show(r)) };
    Err(invalid(field, format!("{what} span {} ms{by}, past {horizon}", show(scaled))))
}

fn synthetic_horizon(w: &SyntheticWorkload, r: f64) -> Result<(), ReplayError> {
    let n = w.request_count as f64;
    let arrivals = match w.load {
        // Poisson gaps vary: six mean gaps of margin make a clock overflow (five times the
        // horizon) less likely than 1e-15 even for one session.
        Load::RequestRate(rate) => Some((
            "request_rate",
            (n + 6.0) * 1000.0 / rate,
            format!("{} arrivals at {} a second", w.request_count, show(rate)),
        )),
        Load::ArrivalIntervalMs(i) => {
            Some(("arrival_interval_ms", n * i, format!("{} arrivals {} ms apart", w.request_count, show(i))))
        }
        Load::Concurrency(_) => None,
    };
    if let Some((field, ms, what)) = &arrivals {
        within(field, what, *ms, r)?;
    }
    // Later turns wait out the delay after the previous one; a closed loop runs its
    // sessions in rounds of `concurrency`.
    let rounds = match w.load {
        Load::Concurrency(c) => w.request_count.div_ceil(c.max(1)) as f64,
        _ => 1.0,
    };
    let waits = (w.turns_per_session - 1) as f64 * w.inter_turn_delay_ms * rounds;
    let start = arrivals.map_or(0.0, |a| a.1);
    let what = format!("the arrivals plus {} inter-turn delays per session", w.turns_per_session - 1);
    within("inter_turn_delay_ms", &what, start + waits, r)
}

fn trace_horizon(t: &TraceWorkload, r: f64) -> Result<(), ReplayError> {
    let trace = &t.trace;
    // Every delay of the trace, as if one session ran after another (what a closed loop of
    // one does; an upper bound of any other order).
    let delays: f64 = trace
        .sessions
        .iter()
        .flat_map(|s| &s.turns)
        .map(|turn| turn.delay_ms)
        .chain(trace.gates.iter().flat_map(|g| &g.deps).map(|d| d.delay_ms))
        .sum();
    let copies = t.repeat as f64;
    let mut ms = delays * copies;
    if t.concurrency.is_none() {
        // Arrival times are normalised to the first; copies follow one span apart.
        let times = trace.sessions.iter().flat_map(|s| {
            s.first_arrival_ms.into_iter().chain(s.turns.iter().filter_map(|t| t.not_before_ms))
        });
        // A streamed trace's rows (one-turn sessions, none held) gave their span up front.
        let streamed = trace.stream.as_ref().and_then(|st| st.span_ms).map(|(lo, hi)| [lo, hi]);
        let times = times.chain(streamed.into_iter().flatten());
        let (lo, hi) = times.fold((f64::INFINITY, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
        let last = if lo.is_finite() { hi - lo } else { 0.0 };
        // Later copies start one span apart: the last arrival plus the mean gap, at most
        // twice the last (or 1 ms for one session).
        ms = last + (last * 2.0 + 1.0) * (copies - 1.0) + delays;
    }
    let (field, what) = if t.repeat > 1 {
        ("trace_repeat", format!("{} copies of the trace {}", t.repeat, trace.path.display()))
    } else {
        ("trace", format!("{}: timestamp: the trace's arrivals and delays", trace.path.display()))
    };
    within(field, &what, ms, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizon_names_the_flag_that_pushes_past_it() {
        let w = |load, delay| SyntheticWorkload {
            load,
            inter_turn_delay_ms: delay,
            turns_per_session: 2,
            ..Default::default()
        };
        let field = |w: SyntheticWorkload, r| match synthetic_horizon(&w, r) {
            Err(ReplayError::Invalid { field, .. }) => field,
            other => panic!("{other:?}"),
        };
        assert_eq!(field(w(Load::RequestRate(1e-300), 0.0), 1.0), "request_rate");
        assert_eq!(field(w(Load::ArrivalIntervalMs(1e300), 0.0), 1.0), "arrival_interval_ms");
        assert_eq!(field(w(Load::Concurrency(1), 1e10), 1.0), "inter_turn_delay_ms");
        assert_eq!(field(w(Load::ArrivalIntervalMs(1e6), 0.0), 1e-6), "arrival_speedup_ratio");
        assert!(synthetic_horizon(&w(Load::RequestRate(1.0), 1e3), 1.0).is_ok());
    }
}
