//! Schedulers: the per-pass policies that decide which requests run, and the types every
//! scheduler shares (what a pass reports, how submission fails).

mod draft;
pub mod sglang;
pub mod vllm;

use crate::events::KvEvent;
use crate::hashing::OutputTokens;
use crate::metrics::ForwardPassMetrics;
use crate::request::{Admission, Output, Request, SeqKey};

/// The checks every backend makes at submit: a prompt, and at least one output token
/// (planned tokens fix the length). Returns the requested output length.
pub(crate) fn requested_output(request: &Request) -> Result<usize, SubmitError> {
    if request.prompt_len() == 0 {
        return Err(SubmitError::EmptyPrompt(request.uuid));
    }
    match request.output_token_ids.as_ref().map_or(request.max_output_tokens, Vec::len) {
        0 => Err(SubmitError::NoOutput(request.uuid)),
        n => Ok(n),
    }
}

/// Appends the tokens at positions `range` of a sequence to `out`: its prompt, then its
/// planned output or, without a plan, the reference's deterministic token for each output
/// index. Shared by both schedulers so their block identities agree.
pub(crate) fn extend_tokens(
    prompt: &[u32],
    planned: Option<&[u32]>,
    uuid: u128,
    range: std::ops::Range<u32>,
    out: &mut Vec<u32>,
) {
    let (start, end) = (range.start as usize, range.end as usize);
    let split = end.min(prompt.len()).max(start);
    if start < split {
        out.extend_from_slice(&prompt[start..split]);
    }
    if split == end {
        return;
    }
    let (from, to) = (split - prompt.len(), end - prompt.len());
    match planned {
        Some(p) => out.extend_from_slice(&p[from..to]),
        None => {
            let tokens = OutputTokens::new(uuid);
            out.extend((from as u64..to as u64).map(|k| tokens.at(k)));
        }
    }
}

/// A running request and, while it decodes steadily, until when; both schedulers keep
/// their running lists as these.
///
/// With `aggregate_steady_tokens` on, a request that will decode one token per pass with
/// nothing else happening to it (no block or page to allocate or fill, no completion, no
/// cache insert) for a known number of passes is *steady*: passes count it and add its KV
/// length from an offset without touching its `Seq`, whose counters stay those of the pass
/// the run started in until the scheduler catches it up. A pass then costs what changes
/// in it, not the batch size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunEntry {
    pub key: SeqKey,
    /// First pass that needs the request's `Seq` again; 0 when not in a run.
    steady_until: u64,
    /// `len - pass_id` during the run (wrapping), so its KV length in a pass is one add.
    len_base: u64,
}

impl RunEntry {
    /// A request entering the running list (not in a run).
    pub fn new(key: SeqKey) -> Self {
        Self { key, steady_until: 0, len_base: 0 }
    }

    /// Whether pass `pass_id` only counts the request.
    #[inline]
    pub fn is_steady(&self, pass_id: u64) -> bool {
        self.steady_until > pass_id
    }

    /// The first pass that is not steady for the request (0 when not in a run).
    #[inline]
    pub fn steady_until_pass(&self) -> u64 {
        self.steady_until
    }

    /// Whether the request is in a run (steady now, or its run ends at this pass and its
    /// `Seq` must be caught up before use).
    #[inline]
    pub fn in_run(&self) -> bool {
        self.steady_until != 0
    }

    /// The request's KV length in steady pass `pass_id`.
    #[inline]
    pub fn kv_len(&self, pass_id: u64) -> usize {
        self.len_base.wrapping_add(pass_id) as usize
    }

    /// Starts a run after the request's token in pass `pass_id`, at length `len`: it is
    /// steady in the next `passes` passes, at lengths `len`, `len + 1`, ...
    pub fn start_run(&mut self, pass_id: u64, len: u32, passes: u32) {
        if passes > 0 {
            self.steady_until = pass_id + u64::from(passes) + 1;
            self.len_base = u64::from(len).wrapping_sub(pass_id + 1);
        }
    }

    /// Ends the run; returns whether there was one (the caller then catches the `Seq` up).
    pub fn end_run(&mut self) -> bool {
        std::mem::replace(&mut self.steady_until, 0) != 0
    }
}

/// Puts `seq` in a free slot of `seqs` (reusing retired ones first) and returns its key.
pub(crate) fn insert_slot<T>(seqs: &mut Vec<Option<T>>, free_slots: &mut Vec<u32>, seq: T) -> SeqKey {
    match free_slots.pop() {
        Some(slot) => {
            seqs[slot as usize] = Some(seq);
            SeqKey(slot)
        }
        None => {
            seqs.push(Some(seq));
            SeqKey((seqs.len() - 1) as u32)
        }
    }
}

/// Everything one forward pass did. Buffers are reused from pass to pass.
#[derive(Debug, Default)]
pub struct Pass {
    /// Simulated time the pass started (ns).
    pub start_ns: u64,
    /// Simulated time the pass ends and its outputs are delivered (ns).
    pub end_ns: u64,
    /// Tokens and terminal signals, in running order, except steady tokens.
    pub outputs: Vec<Output>,
    /// Mid-stream tokens of requests that also got a token in the previous pass: none is
    /// a first, second or last token, and all share one `itl_ns`, so aggregating
    /// consumers can take them as a block. [`Pass::all_outputs`] iterates both lists.
    pub steady: Vec<Output>,
    /// Further steady tokens counted but not itemized (engines built with
    /// `aggregate_steady_tokens`): as many requests each got a mid-stream token, with gap
    /// `steady_itl_ns`. Shells that only aggregate read both through [`Pass::steady_tokens`].
    pub steady_count: usize,
    /// The gap of the counted steady tokens (0 when `steady_count` is 0).
    pub steady_itl_ns: u64,
    /// Requests admitted at pass start.
    pub admissions: Vec<Admission>,
    /// KV events, visible at pass end.
    pub kv_events: Vec<KvEvent>,
    /// The pass's shape and cost (of the run's last pass, for a run).
    pub metrics: ForwardPassMetrics,
    /// For a run of steady passes (see `Engine::extend_steady_run`), the end of each pass
    /// of the run in order, this one first and `end_ns` last; empty for a single pass.
    /// Every pass of a run only counts `steady_count` steady tokens, back to back.
    pub run_ends: Vec<u64>,
}

impl Pass {
    /// Modelled duration of the pass (ns).
    pub fn duration_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    /// Every output of the pass: `outputs`, then `steady`.
    pub fn all_outputs(&self) -> impl Iterator<Item = &Output> {
        self.outputs.iter().chain(self.steady.iter())
    }

    /// Steady tokens of the pass, itemized or counted, and their shared gap (ns).
    pub fn steady_tokens(&self) -> (usize, u64) {
        let itl = self.steady.first().map_or(self.steady_itl_ns, |o| o.itl_ns);
        (self.steady.len() + self.steady_count, itl)
    }

    /// Start of the last pass: of the run's last, for a run.
    pub fn last_start_ns(&self) -> u64 {
        match self.run_ends.len() {
            0 | 1 => self.start_ns,
            n => self.run_ends[n - 2],
        }
    }

    /// Steady tokens and their gap, per pass of the run (one entry for a single pass).
    pub fn steady_runs(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        let first = std::iter::once(self.steady_tokens());
        let count = self.steady_count;
        first.chain(self.run_ends.windows(2).map(move |w| (count, w[1] - w[0])))
    }

    /// Whether the pass changed anything (a pass that did not cannot be repeated usefully).
    pub fn had_effect(&self) -> bool {
        !self.outputs.is_empty()
            || !self.steady.is_empty()
            || self.steady_count > 0
            || !self.admissions.is_empty()
            || !self.kv_events.is_empty()
            || self.metrics.scheduled_tokens > 0
            || self.metrics.num_preempted > 0
    }

    fn clear(&mut self, start_ns: u64) {
        self.start_ns = start_ns;
        self.end_ns = start_ns;
        self.outputs.clear();
        self.steady.clear();
        self.steady_count = 0;
        self.steady_itl_ns = 0;
        self.admissions.clear();
        self.kv_events.clear();
        self.metrics = ForwardPassMetrics::default();
        self.run_ends.clear();
    }
}

/// The prefix cache cannot be reset while requests hold blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cannot reset the prefix cache: {active_blocks} blocks are in use")]
pub struct PrefixCacheBusy {
    /// Blocks referenced by running requests.
    pub active_blocks: usize,
}

/// Why a request could not be submitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The prompt is empty.
    #[error("request {0:#x}: prompt is empty")]
    EmptyPrompt(u128),
    /// Nothing to generate.
    #[error("request {0:#x}: max_output_tokens must be at least 1")]
    NoOutput(u128),
    /// The prompt's token ids were left out (`Request::prompt_len`) where the engine needs
    /// them: its block hashes are missing, or tokens must be read back.
    #[error("request {0:#x}: prompt tokens are required here (block hashes missing, planned output, KV token ids, or output blocks hashed by content)")]
    MissingTokens(u128),
    /// The request names a LoRA adapter and the engine serves none (`max_loras` 0, or a
    /// backend without LoRA).
    #[error("request {0:#x}: this engine serves no LoRA adapters")]
    LoraDisabled(u128),
}

/// Options of a scheduler beyond its engine configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct SchedulerOptions {
    /// Data-parallel rank stamped on events and metrics.
    pub dp_rank: u32,
    /// Produce KV events (costs an allocation per event; off for offline replay).
    pub record_kv_events: bool,
    /// Count steady tokens instead of itemizing them (see [`Pass::steady_count`]).
    pub aggregate_steady_tokens: bool,
    /// Opaque identities for generated blocks (see `EngineOptions::opaque_output_blocks`).
    pub opaque_output_blocks: bool,
    /// Added to `aic_mtp_seed` (see `EngineOptions::seed_offset`).
    pub seed_offset: u64,
    /// Ranks in the worker's data-parallel group (see `EngineOptions::dp_size`).
    pub dp_size: u32,
    /// Most LoRA adapters in one batch (see `EngineOptions::max_loras`).
    pub max_loras: u32,
}

/// Moves `pass`'s end to `end_ns` (its group's wave end, not before its own), so its tokens
/// are emitted then and every later gap counts from it; `set_last` as in [`stretch_outputs`].
pub(crate) fn stretch_pass(pass: &mut Pass, end_ns: u64, set_last: impl FnMut(SeqKey, u64)) {
    let delta = end_ns - pass.end_ns;
    if delta == 0 {
        return;
    }
    pass.end_ns = end_ns;
    pass.metrics.wall_time_secs = (end_ns - pass.start_ns) as f64 / 1e9;
    stretch_outputs(pass, delta, set_last);
}

/// Moves every token of `pass` `delta` ns later (its end moved to its group's wave end):
/// the first token of each request's burst gets a gap `delta` longer, counted steady
/// tokens too; `set_last` records each emitting request's new last token time.
fn stretch_outputs(pass: &mut Pass, delta: u64, mut set_last: impl FnMut(SeqKey, u64)) {
    let end = pass.end_ns;
    let mut prev = None;
    for o in pass.outputs.iter_mut().chain(pass.steady.iter_mut()) {
        if !o.has_token() {
            continue;
        }
        // MTP bursts are consecutive outputs of one request; only their first has a gap.
        if prev != Some(o.key) && o.index > 0 {
            o.itl_ns += delta;
        }
        prev = Some(o.key);
        set_last(o.key, end);
    }
    if pass.steady_count > 0 {
        pass.steady_itl_ns += delta;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::deterministic_output_token;

    /// The token at one position, by the definition `extend_tokens` implements.
    fn token_at(prompt: &[u32], planned: Option<&[u32]>, uuid: u128, pos: u32) -> u32 {
        match prompt.get(pos as usize) {
            Some(&t) => t,
            None => {
                let k = pos as usize - prompt.len();
                planned.map_or_else(|| deterministic_output_token(uuid, k as u64), |p| p[k])
            }
        }
    }

    #[test]
    fn extend_tokens_equals_token_at_for_every_range() {
        let prompt: Vec<u32> = (100..110).collect();
        let planned: Vec<u32> = (900..906).collect();
        for plan in [None, Some(&planned[..])] {
            for start in 0..16u32 {
                for end in start..=16u32 {
                    let mut got = Vec::new();
                    extend_tokens(&prompt, plan, 7, start..end, &mut got);
                    let want: Vec<u32> = (start..end).map(|p| token_at(&prompt, plan, 7, p)).collect();
                    assert_eq!(got, want, "range {start}..{end}, planned {}", plan.is_some());
                }
            }
        }
    }
}
