//! SGLang decode passes (retraction under memory pressure, one token per running request)
//! and the first tokens a prefill forward samples.

use super::seq::Status;
use super::SglangScheduler;
use crate::request::{Output, OutputToken, SeqKey};
use crate::scheduler::Pass;

/// Decode steps of headroom per surviving request in the post-retraction ratio estimate
/// (SGLang's `SGLANG_RETRACT_DECODE_STEPS`).
const RETRACT_DECODE_STEPS: f64 = 20.0;

impl SglangScheduler {
    /// Pages the requests `keys` need for one more token each.
    fn growth_pages(&self, keys: &[SeqKey]) -> usize {
        let page = self.page;
        keys.iter()
            .map(|k| {
                let s = self.seqs[k.0 as usize].as_ref().expect("live seq");
                (s.len + 1).div_ceil(page).saturating_sub(s.pages) as usize
            })
            .sum()
    }

    /// Retracts running requests (fewest generated tokens first) until the survivors' next
    /// tokens fit in free plus evictable pages; at least one request always stays. Returns
    /// how many were retracted; they go to the back of the waiting queue with their
    /// generated tokens and their inserted pages left in the tree.
    pub(super) fn retract_for_decode(&mut self) -> usize {
        let mut needed = self.growth_pages(&self.running);
        let mut retracted = 0;
        while self.cache.free_pages() + self.cache.evictable_pages() < needed && self.running.len() > 1 {
            let idx = (0..self.running.len())
                .min_by_key(|&i| self.seqs[self.running[i].0 as usize].as_ref().expect("live seq").generated)
                .expect("non-empty");
            let key = self.running.remove(idx);
            needed -= self.growth_pages(&[key]);
            self.release_kv(key, false);
            self.seq_mut(key).status = Status::Retracted;
            self.waiting.push_back(key);
            self.totals.num_preemptions_total += 1;
            retracted += 1;
        }
        if retracted > 0 {
            let (mut gen, mut max_new) = (0u64, 0u64);
            for k in &self.running {
                let s = self.seqs[k.0 as usize].as_ref().expect("live seq");
                gen += u64::from(s.generated);
                max_new += u64::from(s.max_output);
            }
            let n = self.running.len() as f64;
            self.new_token_ratio =
                ((gen as f64 + RETRACT_DECODE_STEPS * n) / (max_new as f64 + 1.0)).min(1.0);
        }
        retracted
    }

    /// Reserves the pages the requests `running[from..]` need for one more token; false
    /// when the pool cannot supply them even after evicting.
    pub(super) fn reserve_growth(&mut self, from: usize, pass: &mut Pass) -> bool {
        let needed = self.growth_pages(&self.running[from..]);
        if !self.cache.allocate(needed, &mut self.evicted) {
            self.evicted.clear();
            return false;
        }
        self.reserved_growth = needed;
        self.flush_evicted(pass);
        true
    }

    /// Appends one token to every request in `running[from..]` (their pages were reserved
    /// by `reserve_growth`, except `final_without_slot` ones finishing on a prefill's first
    /// token, which SGLang never gives a slot), emitting outputs stamped at `pass.end_ns`.
    pub(super) fn append_tokens(&mut self, from: usize, final_without_slot: bool, pass: &mut Pass) {
        let (end_ns, pass_id, page) = (pass.end_ns, self.pass_id, self.page);
        let mut finished = false;
        let mut tokens = 0;
        for i in from..self.running.len() {
            let key = self.running[i];
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
                self.finish_kv(key, pass);
            } else if seq_page_completed(self.seq(key).materialized, page) {
                self.cache_materialized(key, pass);
            }
        }
        debug_assert_eq!(self.reserved_growth, 0);
        // Reserved pages not used (none expected) go back to the pool.
        self.cache.free(std::mem::take(&mut self.reserved_growth));
        self.totals.generation_tokens_total += tokens;
        if finished {
            let seqs = &self.seqs;
            let retired = &mut self.retired;
            self.running.retain(|k| {
                let done = seqs[k.0 as usize].as_ref().is_some_and(|s| s.remaining() == 0);
                if done {
                    retired.push(*k);
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
}

#[inline]
fn seq_page_completed(materialized: u32, page: u32) -> bool {
    materialized.is_multiple_of(page)
}
