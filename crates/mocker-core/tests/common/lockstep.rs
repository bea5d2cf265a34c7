//! Engines of one config stepped in lockstep: one itemizing every token, one counting
//! steady tokens (`aggregate_steady_tokens`), and one itemizing with opaque identities for
//! generated blocks (`opaque_output_blocks`). Both are optimisations only, so every pass
//! must match, except for the hash values of generated blocks in KV events.

use mocker_core::config::EngineConfig;
use mocker_core::events::{KvEvent, KvEventData};
use mocker_core::{Engine, EngineOptions, Request};
use proptest::prelude::*;

/// The engine pair.
pub struct Lockstep {
    pub itemized: Engine,
    pub aggregated: Engine,
    pub opaque: Engine,
}

impl Lockstep {
    /// Both engines, recording KV events so their streams are compared too.
    pub fn new(config: &EngineConfig) -> Self {
        let build = |aggregate, opaque| {
            Engine::new(EngineOptions {
                config: config.clone(),
                record_kv_events: true,
                aggregate_steady_tokens: aggregate,
                opaque_output_blocks: opaque,
                ..Default::default()
            })
            .unwrap()
        };
        Self { itemized: build(false, false), aggregated: build(true, false), opaque: build(false, true) }
    }

    /// Submits `request` to both.
    pub fn submit(&mut self, request: Request) -> Result<(), TestCaseError> {
        self.itemized.submit(request.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        self.opaque.submit(request.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
        self.aggregated.submit(request).map_err(|e| TestCaseError::fail(e.to_string()))?;
        Ok(())
    }

    /// Cancels `uuid` on both; they must agree on whether anything was removed.
    pub fn cancel(&mut self, uuid: u128) -> Result<(), TestCaseError> {
        let removed = self.itemized.cancel(uuid);
        prop_assert_eq!(removed, self.aggregated.cancel(uuid));
        prop_assert_eq!(removed, self.opaque.cancel(uuid));
        Ok(())
    }

    /// Whether the engines hold work (they must agree).
    pub fn has_work(&self) -> Result<bool, TestCaseError> {
        prop_assert_eq!(self.itemized.has_work(), self.aggregated.has_work());
        Ok(self.itemized.has_work())
    }

    /// Steps both at `now` and requires identical passes: end time, non-steady outputs,
    /// steady count and gap, admissions, KV events, pass and engine metrics, and sound
    /// bookkeeping. Returns the pass end and the steady tokens the aggregating engine
    /// counted.
    pub fn step(&mut self, now: u64, pass_no: usize) -> Result<(u64, usize), TestCaseError> {
        let a = self.itemized.step(now);
        let b = self.aggregated.step(now);
        prop_assert_eq!(a.end_ns, b.end_ns, "pass {} end", pass_no);
        prop_assert_eq!(&a.outputs, &b.outputs, "pass {} outputs", pass_no);
        prop_assert_eq!(a.steady_tokens(), b.steady_tokens(), "pass {} steady tokens", pass_no);
        prop_assert_eq!(a.steady_count, 0, "the itemizing engine never counts");
        prop_assert_eq!(&a.admissions, &b.admissions, "pass {} admissions", pass_no);
        prop_assert_eq!(&a.kv_events, &b.kv_events, "pass {} KV events", pass_no);
        prop_assert_eq!(a.metrics, b.metrics, "pass {} metrics", pass_no);
        let (end, counted) = (a.end_ns, b.steady_count);
        let c = self.opaque.step(now);
        prop_assert_eq!(a.end_ns, c.end_ns, "pass {} end (opaque)", pass_no);
        prop_assert_eq!(&a.outputs, &c.outputs, "pass {} outputs (opaque)", pass_no);
        prop_assert_eq!(&a.steady, &c.steady, "pass {} steady (opaque)", pass_no);
        prop_assert_eq!(&a.admissions, &c.admissions, "pass {} admissions (opaque)", pass_no);
        prop_assert_eq!(a.metrics, c.metrics, "pass {} metrics (opaque)", pass_no);
        prop_assert_eq!(
            event_shape(&a.kv_events),
            event_shape(&c.kv_events),
            "pass {} events (opaque)",
            pass_no
        );
        prop_assert_eq!(self.itemized.metrics(), self.opaque.metrics(), "engine metrics (opaque)");
        self.opaque.check_invariants().map_err(TestCaseError::fail)?;
        prop_assert_eq!(
            self.itemized.metrics(),
            self.aggregated.metrics(),
            "engine metrics after pass {}",
            pass_no
        );
        self.aggregated.check_invariants().map_err(TestCaseError::fail)?;
        Ok((end, counted))
    }
}

/// What KV events say apart from hash values: kind and block count of each.
fn event_shape(events: &[KvEvent]) -> Vec<(u8, usize)> {
    events
        .iter()
        .map(|e| match &e.data {
            KvEventData::Stored { blocks, .. } => (0, blocks.len()),
            KvEventData::Removed { block_hashes } => (1, block_hashes.len()),
            KvEventData::Cleared => (2, 0),
        })
        .collect()
}
