//! SGLang prefill admission: waiting-queue order (fifo or longest prefix match) and the
//! prefill batch, budgeted by the pool minus the decode headroom the running requests are
//! expected to need (`new_token_ratio`), `max_prefill_tokens` and `chunked_prefill_size`.

use rustc_hash::FxHashSet;

use super::seq::Status;
use super::SglangScheduler;
use crate::config::SglangSchedulePolicy;
use crate::request::{Admission, SeqKey};
use crate::scheduler::Pass;

/// LPM falls back to fifo above this many waiting requests (SGLang's threshold).
const LPM_FALLBACK_THRESHOLD: usize = 128;
/// A request matching at most this many cached tokens is deprioritized when an earlier
/// waiting request shares its first `IN_BATCH_PREFIX_TOKENS` tokens (in-batch dedupe).
const IN_BATCH_CHECK_THRESHOLD: usize = 32;
const IN_BATCH_PREFIX_TOKENS: usize = 32;

/// The prefill batch of one pass.
#[derive(Debug, Default)]
pub(super) struct PrefillBatch {
    /// Admitted requests, in admission order.
    pub keys: Vec<SeqKey>,
    /// Σ chunk end positions and Σ tokens present before the chunks (the timing inputs).
    pub total_isl: usize,
    pub total_prefix: usize,
    /// Tokens computed.
    pub computed: usize,
    /// Radix hits of first admissions.
    pub hit_tokens: usize,
}

impl PrefillBatch {
    pub fn clear(&mut self) {
        self.keys.clear();
        self.total_isl = 0;
        self.total_prefix = 0;
        self.computed = 0;
        self.hit_tokens = 0;
    }
}

impl SglangScheduler {
    /// Reorders the waiting queue for `lpm`: not deprioritized first, then longest cached
    /// prefix, stable otherwise (so fifo order breaks ties).
    pub(super) fn order_waiting(&mut self) {
        if self.policy != SglangSchedulePolicy::Lpm
            || !self.prefix_caching
            || self.waiting.len() > LPM_FALLBACK_THRESHOLD
        {
            return;
        }
        let page = self.page as usize;
        let dup_pages = IN_BATCH_PREFIX_TOKENS.div_ceil(page);
        let mut seen: FxHashSet<u64> = FxHashSet::default();
        let mut scored = std::mem::take(&mut self.lpm_scratch);
        scored.clear();
        for &key in &self.waiting {
            let seq = self.seqs[key.0 as usize].as_ref().expect("live seq");
            let matched = self.cache.match_len(&seq.hashes) * page;
            let deprioritized = matched <= IN_BATCH_CHECK_THRESHOLD
                && seq.hashes.len() >= dup_pages
                && !seen.insert(seq.hashes[dup_pages - 1]);
            scored.push((deprioritized, std::cmp::Reverse(matched), key));
        }
        scored.sort_by_key(|&(d, m, _)| (d, m));
        self.waiting.clear();
        self.waiting.extend(scored.iter().map(|&(_, _, k)| k));
        self.lpm_scratch = scored;
    }

    /// Forms the prefill batch from the head of the waiting queue (SGLang's
    /// `get_new_batch_prefill`): stops at the first request that does not fit. `force`
    /// admits the first request on physical capacity alone, ignoring the decode headroom
    /// estimate (used only when nothing runs, so nothing else could make progress).
    pub(super) fn admit(&mut self, batch: &mut PrefillBatch, pass: &mut Pass, force: bool) {
        let page = self.page;
        let clip = self.clip as u32;
        let reserved: f64 = self
            .running
            .iter()
            .map(|e| f64::from(self.seqs[e.key.0 as usize].as_ref().expect("live seq").remaining().min(clip)))
            .sum::<f64>()
            * self.new_token_ratio;
        let mut rem_total = (self.cache.available_tokens() + self.cache.evictable_tokens()) as f64 - reserved;
        // A chunk budget above max_prefill_tokens (or below a page) could never admit a
        // long prompt; clamp it so every request can progress (defaults are unaffected).
        let pg = page as usize;
        let chunk_budget = self.chunked_prefill_size.min(self.max_prefill_tokens / pg * pg).max(pg);
        let mut rem_input = self.max_prefill_tokens.max(chunk_budget) as i64;
        let mut rem_chunk = chunk_budget as i64;
        let slots = self.max_running.saturating_sub(self.running.len());
        while batch.keys.len() < slots {
            let Some(&key) = self.waiting.front() else { break };
            let seq = self.seqs[key.0 as usize].as_ref().expect("live seq");
            let first = seq.materialized == 0;
            let matched = if first { self.match_pages(seq) } else { 0 };
            let start = seq.materialized.max(matched * page);
            let extend = seq.len - start;
            if extend == 0 {
                break;
            }
            // The last request of a full batch gets a page-aligned partial chunk.
            let chunk =
                if i64::from(extend) <= rem_chunk { extend } else { (rem_chunk as u32 / page) * page };
            if chunk == 0 {
                break;
            }
            let charged = chunk.div_ceil(page) * page;
            let out_res = if chunk < extend { 0 } else { seq.remaining().min(clip) };
            if f64::from(charged + out_res) >= rem_total && !(force && batch.keys.is_empty()) {
                break;
            }
            if i64::from(charged) > rem_input || i64::from(charged) > rem_chunk {
                break;
            }
            let (readmission, uuid) = (seq.status == Status::Retracted, seq.uuid);
            if !self.allocate_chunk(key, matched, start + chunk, pass) {
                break;
            }
            self.waiting.pop_front();
            let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
            let cached = matched * page;
            if first {
                seq.status = Status::Admitted;
                seq.first_cached.get_or_insert(cached);
                pass.admissions.push(Admission { key, uuid, reused_tokens: cached, readmission });
                batch.hit_tokens += cached as usize;
            }
            batch.keys.push(key);
            batch.total_isl += (start + chunk) as usize;
            batch.total_prefix += start as usize;
            batch.computed += chunk as usize;
            rem_total -= f64::from(charged + out_res);
            rem_input -= i64::from(charged);
            rem_chunk -= i64::from(charged);
            if rem_chunk <= 0 {
                break;
            }
        }
    }
}
