//! Worker counts over simulated time in a scaled run, for the report's line and chart.

use std::fmt::Write;

use super::table::format_number;
use crate::scaling::{LifecycleOperation, PoolName};

/// Active (serving) workers of each pool over simulated time.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerCounts {
    /// Per pool: (ms, active workers from then on), starting at 0 ms.
    pub pools: Vec<(PoolName, Vec<(f64, usize)>)>,
}

impl WorkerCounts {
    /// The counts of pools that start with `initial` workers and change as `operations` say.
    pub fn from_operations(initial: &[(PoolName, usize)], operations: &[LifecycleOperation]) -> Self {
        let pools = initial
            .iter()
            .map(|&(pool, n)| {
                let mut steps = vec![(0.0, n)];
                for op in operations.iter().filter(|op| op.pool == pool) {
                    let active = op.state_after_batch.active.len();
                    match steps.last_mut() {
                        Some(last) if last.1 == active => {}
                        Some(last) if last.0 == op.at_ms => last.1 = active,
                        _ => steps.push((op.at_ms, active)),
                    }
                }
                (pool, steps)
            })
            .collect();
        Self { pools }
    }

    /// One line per pool: `Active Workers (agg): 1 from 0.00 s, 3 from 3.50 s, 1 from 9.58 s`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (pool, steps) in &self.pools {
            let name = serde_json::to_value(pool)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            let steps: Vec<String> =
                steps.iter().map(|&(ms, n)| format!("{n} from {} s", format_number(ms / 1e3))).collect();
            let _ = writeln!(out, "Active Workers ({name}): {}", steps.join(", "));
        }
        out
    }

    /// Pool `i`'s counts as a step line up to `end_ms`, in (s, workers) points.
    pub fn step_points(&self, i: usize, end_ms: f64) -> Vec<(f64, f64)> {
        let steps = &self.pools[i].1;
        let mut points = Vec::with_capacity(steps.len() * 2);
        for (k, &(ms, n)) in steps.iter().enumerate() {
            let until = steps.get(k + 1).map_or(end_ms.max(ms), |s| s.0);
            points.push((ms / 1e3, n as f64));
            points.push((until / 1e3, n as f64));
        }
        points
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaling::{OperationCause, PoolState};

    fn op(at_ms: f64, active: Vec<usize>) -> LifecycleOperation {
        LifecycleOperation {
            operation_ordinal: 0,
            at_ms,
            pool: PoolName::Agg,
            cause: OperationCause::WorkerReadyEvent,
            planner_tick_ordinal: None,
            origin_operation_ordinal: None,
            transitions: vec![],
            state_after_batch: PoolState { active, starting: vec![], draining: vec![] },
            topology_released_request_uuids: vec![],
        }
    }

    #[test]
    fn counts_follow_the_active_workers() {
        let ops =
            [op(2000.0, vec![0]), op(3500.0, vec![0, 1]), op(3500.0, vec![0, 1, 2]), op(8000.0, vec![0])];
        let c = WorkerCounts::from_operations(&[(PoolName::Agg, 1)], &ops);
        assert_eq!(c.pools[0].1, vec![(0.0, 1), (3500.0, 3), (8000.0, 1)]);
        assert_eq!(c.render(), "Active Workers (agg): 1 from 0.00 s, 3 from 3.50 s, 1 from 8.00 s\n");
        let p = c.step_points(0, 9000.0);
        assert_eq!(p.first(), Some(&(0.0, 1.0)));
        assert_eq!(p.last(), Some(&(9.0, 1.0)));
    }
}
