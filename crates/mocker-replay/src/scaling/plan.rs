//! `--scaling-plan`: a timetable of worker counts, a policy for users without Python.

use serde::Deserialize;

use super::policy::{PolicyError, ScalingDecision, ScalingPolicy};
use super::snapshot::ClusterSnapshot;

/// One row of a plan: from `at_ms` on, these worker counts.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanStep {
    /// Simulated ms of the change.
    pub at_ms: f64,
    /// Prefill workers wanted (disaggregated clusters); absent keeps the count.
    #[serde(default)]
    pub prefill: Option<usize>,
    /// Decode workers wanted (an aggregated cluster's whole pool); absent keeps the count.
    #[serde(default)]
    pub decode: Option<usize>,
}

/// A timetable policy: ticks exactly at each step's time and asks for its counts.
#[derive(Debug, Clone, PartialEq)]
pub struct ScalingPlan {
    steps: Vec<PlanStep>,
    next: usize,
}

impl ScalingPlan {
    /// Parses a plan: a JSON list of `{"at_ms", "prefill"?, "decode"?}`, times finite,
    /// non-negative and strictly increasing, each step naming some count.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let steps: Vec<PlanStep> = serde_json::from_str(text).map_err(|e| {
            format!("a scaling plan is a JSON list of {{\"at_ms\", \"prefill\", \"decode\"}}: {e}")
        })?;
        Self::new(steps)
    }

    /// A plan of `steps` (see [`from_json`](Self::from_json) for the rules).
    pub fn new(steps: Vec<PlanStep>) -> Result<Self, String> {
        if steps.is_empty() {
            return Err("a scaling plan needs at least one step".into());
        }
        for (i, s) in steps.iter().enumerate() {
            if !(s.at_ms.is_finite() && s.at_ms >= 0.0) {
                return Err(format!("step {i}: at_ms must be a finite number >= 0 (got {})", s.at_ms));
            }
            if i > 0 && s.at_ms <= steps[i - 1].at_ms {
                return Err(format!(
                    "step {i}: at_ms must be later than the step before ({})",
                    steps[i - 1].at_ms
                ));
            }
            if s.prefill.is_none() && s.decode.is_none() {
                return Err(format!("step {i}: name \"prefill\" or \"decode\" (or both)"));
            }
        }
        Ok(Self { steps, next: 0 })
    }

    /// The plan's steps.
    pub fn steps(&self) -> &[PlanStep] {
        &self.steps
    }
}

impl ScalingPolicy for ScalingPlan {
    fn initial_tick_ms(&mut self) -> Result<f64, PolicyError> {
        self.next = 0;
        Ok(self.steps[0].at_ms)
    }

    fn on_tick(&mut self, _snapshot: &ClusterSnapshot) -> Result<ScalingDecision, PolicyError> {
        let step = self.steps[self.next];
        self.next += 1;
        Ok(ScalingDecision {
            target_prefill: step.prefill,
            target_decode: step.decode,
            next_tick_ms: self.steps.get(self.next).map(|s| s.at_ms),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_are_checked_and_tick_at_their_steps() {
        assert!(ScalingPlan::from_json("[]").is_err());
        assert!(ScalingPlan::from_json(r#"[{"at_ms": 5}]"#).unwrap_err().contains("name"));
        assert!(ScalingPlan::from_json(r#"[{"at_ms": 5, "decode": 1}, {"at_ms": 5, "decode": 2}]"#)
            .unwrap_err()
            .contains("later"));
        assert!(ScalingPlan::from_json(r#"[{"at_ms": 5, "decode": 1, "gpus": 2}]"#).is_err());
        assert!(ScalingPlan::from_json(r#"[{"at_ms": -1, "decode": 1}]"#).is_err());
        let mut p =
            ScalingPlan::from_json(r#"[{"at_ms": 0, "decode": 3}, {"at_ms": 800, "prefill": 2}]"#).unwrap();
        assert_eq!(p.initial_tick_ms().unwrap(), 0.0);
        let s = ClusterSnapshot::default();
        assert_eq!(
            p.on_tick(&s).unwrap(),
            ScalingDecision { target_prefill: None, target_decode: Some(3), next_tick_ms: Some(800.0) }
        );
        assert_eq!(
            p.on_tick(&s).unwrap(),
            ScalingDecision { target_prefill: Some(2), target_decode: None, next_tick_ms: None }
        );
    }
}
