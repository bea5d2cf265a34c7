//! MTP / EAGLE speculative decoding on the SGLang scheduler (the reference's model): a
//! decode pass reserves the pages each running request's largest burst could fill
//! (retracting as for one token), then every request emits the tokens its verification
//! accepted, all at the pass end. Prefill workers and prefill forwards emit one token.

use super::seq::Status;
use super::SglangScheduler;
use crate::request::{Output, OutputToken};
use crate::scheduler::Pass;

impl SglangScheduler {
    /// Appends each running request's accepted burst (pages reserved by `reserve_growth`
    /// for the largest bursts); the pages no burst used go back to the pool.
    pub(super) fn append_bursts(&mut self, pass: &mut Pass) {
        let mut sampler = self.sampler.take().expect("MTP on");
        let (end_ns, pass_id, page) = (pass.end_ns, self.pass_id, self.page);
        let mut finished = false;
        let mut tokens = 0u64;
        for i in 0..self.running.len() {
            let key = self.running[i].key;
            let remaining = self.seq(key).remaining();
            let burst = sampler.sample().min(remaining);
            for k in 0..burst {
                let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
                if seq.len + 1 > seq.pages * page {
                    seq.pages += 1;
                    self.reserved_growth -= 1;
                }
                seq.materialized += 1;
                let index = seq.generated;
                seq.generated += 1;
                seq.len += 1;
                let last = seq.remaining() == 0;
                let token = match &seq.planned {
                    Some(p) => OutputToken::Planned(p[index as usize]),
                    None => OutputToken::Generated,
                };
                let cached_tokens = if seq.sent_first { None } else { seq.first_cached };
                seq.sent_first = true;
                // A burst's later tokens arrive with its first.
                let itl_ns = if index == 0 || k > 0 { 0 } else { end_ns - seq.last_token_ns };
                seq.last_token_ns = end_ns;
                seq.last_token_pass = pass_id;
                let (uuid, hold) = (seq.uuid, seq.hold);
                pass.outputs.push(Output {
                    key,
                    uuid,
                    token,
                    index,
                    itl_ns,
                    completed: last,
                    rejected: false,
                    cached_tokens,
                });
                tokens += 1;
                if last {
                    finished = true;
                    if hold {
                        self.seq_mut(key).status = Status::Held;
                    } else {
                        self.finish_kv(key, pass);
                    }
                    break;
                }
                let seq = self.seq(key);
                if self.prefix_caching && seq.materialized >= (seq.tree_depth + 1) * page {
                    self.cache_materialized(key, pass);
                }
            }
        }
        self.sampler = Some(sampler);
        self.cache.free(std::mem::take(&mut self.reserved_growth));
        self.totals.generation_tokens_total += tokens;
        if finished {
            self.retire_finished();
        }
    }
}
