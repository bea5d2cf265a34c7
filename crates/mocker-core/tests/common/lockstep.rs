//! Engines of one config stepped in lockstep: one itemizing every token, one counting
//! steady tokens (`aggregate_steady_tokens`), one itemizing with opaque identities for
//! generated blocks (`opaque_output_blocks`), and one that is also told which blocks are
//! private to their request (`Request::shareable_blocks`). All are optimisations only, so
//! every pass must match, except for the hash values of generated blocks in KV events and,
//! for the private engine, the events of private blocks, which it leaves out. The private
//! engine also gets its vLLM-style requests without tokens (`Request::prompt_len`), only
//! their block hashes.

use std::collections::HashSet;

use mocker_core::config::EngineConfig;
use mocker_core::events::{KvEvent, KvEventData};
use mocker_core::hashing::PromptHashes;
use mocker_core::{Engine, EngineOptions, Pass, Request};
use proptest::prelude::*;

/// The engine pair.
pub struct Lockstep {
    pub itemized: Engine,
    pub aggregated: Engine,
    pub opaque: Engine,
    pub private: Engine,
    /// Hashes of the blocks the private engine was told may be shared, once it was told
    /// of any private ones (until then its events are the opaque engine's).
    shareable: Option<HashSet<u64>>,
    block_size: usize,
    /// Whether the private engine can take requests without tokens.
    tokenless: bool,
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
        Self {
            itemized: build(false, false),
            aggregated: build(true, false),
            opaque: build(false, true),
            private: build(false, true),
            shareable: None,
            block_size: config.block_size,
            tokenless: config.backend != mocker_core::config::Backend::Sglang && !config.emit_kv_token_ids,
        }
    }

    /// Submits `request` to all; the private engine learns that its blocks from
    /// `shareable` on are never looked up by another request (the caller's promise).
    pub fn submit(&mut self, request: Request, shareable: Option<usize>) -> Result<(), TestCaseError> {
        if let Some(n) = shareable {
            let hashes = PromptHashes::of(&request.tokens, self.block_size).sequence;
            self.shareable.get_or_insert_default().extend(&hashes[..n.min(hashes.len())]);
        }
        let mut private = Request { shareable_blocks: shareable, ..request.clone() };
        if self.tokenless && private.output_token_ids.is_none() {
            private.block_hashes = Some(PromptHashes::of(&request.tokens, self.block_size));
            private.prompt_len = Some(request.tokens.len());
            private.tokens = Vec::new();
        }
        self.private.submit(private).map_err(|e| TestCaseError::fail(e.to_string()))?;
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
        prop_assert_eq!(removed, self.private.cancel(uuid));
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
        same_pass(a, c, pass_no, "opaque")?;
        prop_assert_eq!(
            event_shape(&a.kv_events),
            event_shape(&c.kv_events),
            "pass {} events (opaque)",
            pass_no
        );
        let opaque_events = match &self.shareable {
            Some(set) => shareable_events(&c.kv_events, set),
            None => c.kv_events.iter().map(|e| e.data.clone()).collect(),
        };
        let d = self.private.step(now);
        same_pass(a, d, pass_no, "private")?;
        prop_assert_eq!(
            opaque_events,
            d.kv_events.iter().map(|e| e.data.clone()).collect::<Vec<_>>(),
            "pass {} events (private): the opaque engine's minus private blocks",
            pass_no
        );
        prop_assert_eq!(self.itemized.metrics(), self.opaque.metrics(), "engine metrics (opaque)");
        prop_assert_eq!(self.itemized.metrics(), self.private.metrics(), "engine metrics (private)");
        self.private.check_invariants().map_err(TestCaseError::fail)?;
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

/// The itemized pass `a` and pass `x` of engine `name` agree on everything but KV events.
fn same_pass(a: &Pass, x: &Pass, pass_no: usize, name: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(a.end_ns, x.end_ns, "pass {} end ({})", pass_no, name);
    prop_assert_eq!(&a.outputs, &x.outputs, "pass {} outputs ({})", pass_no, name);
    prop_assert_eq!(&a.steady, &x.steady, "pass {} steady ({})", pass_no, name);
    prop_assert_eq!(&a.admissions, &x.admissions, "pass {} admissions ({})", pass_no, name);
    prop_assert_eq!(a.metrics, x.metrics, "pass {} metrics ({})", pass_no, name);
    Ok(())
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

/// The payloads of `events` restricted to blocks in `shareable` (events left empty go).
fn shareable_events(events: &[KvEvent], shareable: &HashSet<u64>) -> Vec<KvEventData> {
    events
        .iter()
        .filter_map(|e| match &e.data {
            KvEventData::Stored { parent_hash, blocks, lora } => {
                let blocks: Vec<_> =
                    blocks.iter().filter(|b| shareable.contains(&b.block_hash)).cloned().collect();
                (!blocks.is_empty()).then_some(KvEventData::Stored {
                    parent_hash: *parent_hash,
                    blocks,
                    lora: lora.clone(),
                })
            }
            KvEventData::Removed { block_hashes } => {
                let block_hashes: Vec<u64> =
                    block_hashes.iter().copied().filter(|h| shareable.contains(h)).collect();
                (!block_hashes.is_empty()).then_some(KvEventData::Removed { block_hashes })
            }
            KvEventData::Cleared => Some(KvEventData::Cleared),
        })
        .collect()
}
