//! SGLang decode passes (retraction under memory pressure, one token per running request)
//! and the first tokens a prefill forward samples.

use super::seq::Status;
use super::SglangScheduler;
use crate::request::{Output, OutputToken, SeqKey};
use crate::scheduler::Pass;
use crate::scheduler::RunEntry;

/// Decode steps of headroom per surviving request in the post-retraction ratio estimate
/// (SGLang's `SGLANG_RETRACT_DECODE_STEPS`).
const RETRACT_DECODE_STEPS: f64 = 20.0;

/// What a decode pass will run, after retraction.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct DecodePlan {
    /// Requests retracted.
    pub retracted: usize,
    /// Pages the survivors need for their next tokens.
    pub pages: usize,
    /// Σ survivors' sequence lengths.
    pub kv: usize,
}

impl SglangScheduler {
    /// Pages request `key` needs for its next tokens (one, or an MTP pass's largest burst).
    #[inline]
    fn growth_of(&self, key: SeqKey) -> (usize, usize) {
        let s = self.seqs[key.0 as usize].as_ref().expect("live seq");
        let burst = self.max_burst.min(s.remaining());
        ((s.len + burst).div_ceil(self.page).saturating_sub(s.pages) as usize, s.len as usize)
    }

    /// Retracts running requests (fewest generated tokens first) until the survivors' next
    /// tokens fit in free plus evictable pages; at least one request always stays.
    /// Retracted requests go to the back of the waiting queue with their generated tokens;
    /// their inserted pages stay in the tree. Returns the number retracted and the
    /// survivors' page growth and Σ sequence length (the decode batch's KV).
    pub(super) fn retract_for_decode(&mut self) -> DecodePlan {
        let mut plan = DecodePlan::default();
        let pass_id = self.pass_id;
        for i in 0..self.running.len() {
            let entry = self.running[i];
            if entry.is_steady(pass_id) {
                plan.kv += entry.kv_len(pass_id);
                continue;
            }
            if entry.in_run() {
                self.catch_up(i); // its steady run ended
            }
            let (g, len) = self.growth_of(entry.key);
            plan.pages += g;
            plan.kv += len;
        }
        if self.cache.free_pages() + self.cache.evictable_pages() < plan.pages && self.running.len() > 1 {
            // Victims are chosen by generated tokens: every Seq must be current.
            self.catch_up_all();
        }
        while self.cache.free_pages() + self.cache.evictable_pages() < plan.pages && self.running.len() > 1 {
            let idx = (0..self.running.len())
                .min_by_key(|&i| {
                    self.seqs[self.running[i].key.0 as usize].as_ref().expect("live seq").generated
                })
                .expect("non-empty");
            let key = self.running.remove(idx).key;
            let (g, len) = self.growth_of(key);
            plan.pages -= g;
            plan.kv -= len;
            self.release_kv(key);
            self.seq_mut(key).status = Status::Retracted;
            self.waiting.push_back(key);
            self.totals.num_preemptions_total += 1;
            plan.retracted += 1;
        }
        if plan.retracted > 0 {
            let (mut gen, mut max_new) = (0u64, 0u64);
            for e in &self.running {
                let s = self.seqs[e.key.0 as usize].as_ref().expect("live seq");
                gen += u64::from(s.generated);
                max_new += u64::from(s.max_output);
            }
            let n = self.running.len() as f64;
            self.new_token_ratio =
                ((gen as f64 + RETRACT_DECODE_STEPS * n) / (max_new as f64 + 1.0)).min(1.0);
        }
        plan
    }

    /// Takes `pages` pages for this pass's token growth; false when the pool cannot
    /// supply them even after evicting.
    pub(super) fn reserve_growth(&mut self, pages: usize, pass: &mut Pass) -> bool {
        if !self.cache.allocate(pages, &mut self.evicted) {
            self.evicted.clear();
            return false;
        }
        self.reserved_growth = pages;
        self.flush_evicted(pass);
        true
    }

    /// Last resort when even one running request cannot grow: partially prefilled waiting
    /// requests give up their KV (newest first; they restart their prefill later) until
    /// `pages` can be reserved. Without this the pool could deadlock (the reference
    /// stalls there). Returns whether the reservation succeeded.
    pub(super) fn release_chunked_for(&mut self, pages: usize, pass: &mut Pass) -> bool {
        for i in (0..self.waiting.len()).rev() {
            let key = self.waiting[i];
            if self.seq(key).materialized == 0 {
                continue;
            }
            self.release_kv(key);
            self.seq_mut(key).status = Status::Retracted;
            self.totals.num_preemptions_total += 1;
            if self.reserve_growth(pages, pass) {
                return true;
            }
        }
        false
    }

    /// Reserves the decode pass's `pages` (releasing partially prefilled requests' KV if
    /// it must) and appends the pass's tokens; without the pages nobody decodes.
    pub(super) fn grow_and_append(&mut self, pages: usize, pass: &mut Pass) {
        if !self.reserve_growth(pages, pass) {
            // No token this pass: steady runs end before it.
            self.catch_up_all();
            if !self.release_chunked_for(pages, pass) {
                return;
            }
        }
        if self.max_burst > 1 {
            self.append_bursts(pass);
        } else {
            self.append_tokens(0, false, pass);
        }
    }

    /// Prefill-only variant of `append_tokens` for a pass with no pages for first tokens:
    /// emits just the tokens that complete a request (they need no slot).
    pub(super) fn append_final_only(&mut self, from: usize, pass: &mut Pass) {
        let keep: Vec<RunEntry> = self.running.drain(from..).collect();
        let (finishing, rest): (Vec<RunEntry>, Vec<RunEntry>) = keep
            .into_iter()
            .partition(|e| self.seqs[e.key.0 as usize].as_ref().expect("live seq").remaining() <= 1);
        let start = self.running.len();
        self.running.extend(finishing);
        self.append_tokens(start, true, pass);
        self.running.extend(rest);
    }

    /// Appends one token to every request in `running[from..]` (their pages were reserved
    /// by `reserve_growth`, except `final_without_slot` ones finishing on a prefill's first
    /// token, which SGLang never gives a slot), emitting outputs stamped at `pass.end_ns`.
    pub(super) fn append_tokens(&mut self, from: usize, final_without_slot: bool, pass: &mut Pass) {
        let (end_ns, pass_id, page) = (pass.end_ns, self.pass_id, self.page);
        let mut finished = false;
        let mut tokens = 0;
        let mut steady = 0;
        for i in from..self.running.len() {
            let entry = self.running[i];
            if entry.is_steady(pass_id) {
                steady += 1;
                continue;
            }
            let key = entry.key;
            let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
            let index = seq.generated;
            let last = seq.remaining() == 1;
            if !(last && final_without_slot) {
                if seq.len + 1 > seq.pages * page {
                    seq.pages += 1;
                    self.reserved_growth -= 1;
                }
                seq.materialized += 1;
            }
            seq.generated += 1;
            seq.len += 1;
            let token = match &seq.planned {
                Some(p) => OutputToken::Planned(p[index as usize]),
                None => OutputToken::Generated,
            };
            let cached_tokens = if seq.sent_first { None } else { seq.first_cached };
            seq.sent_first = true;
            let itl_ns = if index == 0 { 0 } else { end_ns - seq.last_token_ns };
            let steady = index >= 2 && !last && seq.last_token_pass.wrapping_add(1) == pass_id;
            seq.last_token_ns = end_ns;
            seq.last_token_pass = pass_id;
            let out = Output {
                key,
                uuid: seq.uuid,
                token,
                index,
                itl_ns,
                completed: last,
                rejected: false,
                cached_tokens,
            };
            if steady {
                pass.steady.push(out);
            } else {
                pass.outputs.push(out);
            }
            tokens += 1;
            if last {
                finished = true;
                if self.seqs[key.0 as usize].as_ref().expect("live seq").hold {
                    // A disaggregation source keeps its KV for the transfer.
                    self.seq_mut(key).status = Status::Held;
                } else {
                    self.finish_kv(key, pass);
                }
            } else if self.prefix_caching && seq.materialized >= (seq.tree_depth + 1) * page {
                // A page completed since the last insert (a prompt's tail page completes at
                // an arbitrary token, so this is not just `materialized % page == 0`).
                self.cache_materialized(key, pass);
            }
            // With one-token pages every token fills a page, so nothing is ever steady.
            if self.aggregate_steady && !last && page > 1 {
                self.start_steady(i);
            }
        }
        if steady > 0 {
            pass.steady_count = steady;
            pass.steady_itl_ns = end_ns - self.last_end_ns;
        }
        debug_assert_eq!(self.reserved_growth, 0);
        // Reserved pages not used (none expected) go back to the pool.
        self.cache.free(std::mem::take(&mut self.reserved_growth));
        self.totals.generation_tokens_total += tokens + steady as u64;
        if finished {
            self.retire_finished();
        }
    }

    /// Drops finished requests from the running list, retiring all but held sources.
    pub(super) fn retire_finished(&mut self) {
        let seqs = &self.seqs;
        let retired = &mut self.retired;
        self.running.retain(|e| {
            let Some(s) = seqs[e.key.0 as usize].as_ref() else { return true };
            let done = s.remaining() == 0;
            if done && s.status != Status::Held {
                retired.push(e.key);
            }
            !done
        });
        for j in 0..self.retired.len() {
            let key = self.retired[j];
            self.retire(key);
        }
        self.retired.clear();
    }
}
