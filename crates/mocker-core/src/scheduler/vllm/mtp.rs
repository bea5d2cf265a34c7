//! MTP / EAGLE speculative decoding on the vLLM and TRT-LLM cores: each decode forward
//! verifies `aic_nextn` draft tokens and emits the run the shared [`DraftSampler`] accepts.

use crate::config::WorkerType;
use crate::kv::BlockId;
use crate::request::{Output, OutputToken};
use crate::scheduler::draft::DraftSampler;

use super::{Budget, Seq, VllmScheduler};

/// One rank's draft acceptance sampler and its per-pass scratch.
#[derive(Debug)]
pub(super) struct Mtp {
    sampler: DraftSampler,
    /// Blocks reserved for this pass's bursts, handed out during emission.
    reserved: Vec<BlockId>,
    /// The pass could not reserve its lookahead: it emits nothing.
    stalled: bool,
    /// Decode forwards and the tokens they accepted (before the output-limit clamp).
    pub forwards: u64,
    pub accepted: u64,
}

impl Mtp {
    /// A sampler for `rates` (one per draft), seeded with `seed`.
    pub fn new(rates: &[f64], seed: u64) -> Self {
        Self {
            sampler: DraftSampler::new(rates, seed),
            reserved: Vec::new(),
            stalled: false,
            forwards: 0,
            accepted: 0,
        }
    }
}

impl VllmScheduler {
    /// A ready request: every known token computed and output still to come.
    fn mtp_ready(seq: &Seq) -> bool {
        seq.num_computed == seq.len && !seq.generation_complete()
    }

    /// Before the decode is timed: reserves the blocks every ready request's largest burst
    /// could fill, preempting (vLLM) until they fit. Preempted requests leave the decode
    /// batch; the prefill already scheduled keeps its cost.
    pub(super) fn mtp_reserve(&mut self, b: &mut Budget) {
        let bs = self.block_size as usize;
        let mtp = self.mtp.as_mut().expect("MTP on");
        mtp.stalled = false;
        let max_burst = if self.worker_type == WorkerType::Prefill { 1 } else { mtp.sampler.max_burst };
        let mut reserved = std::mem::take(&mut mtp.reserved);
        let prefill = (b.batch_count, b.total_isl, b.total_prefix, b.prefill_work_tokens);
        loop {
            let mut required = 0;
            for e in &self.running {
                let seq = self.seqs[e.key.0 as usize].as_ref().expect("live seq");
                if Self::mtp_ready(seq) {
                    let burst = max_burst.min(seq.max_output - seq.generated) as usize;
                    let len = seq.len as usize;
                    required += (len + burst).div_ceil(bs) - len.div_ceil(bs);
                    // A state published at the last boundary is preserved before the burst.
                    required += self.state_burst_blocks(seq, (len + burst - 1) as u32);
                }
            }
            if self.pool.allocate(&mut reserved, required, &[], &mut self.evicted) {
                break;
            }
            let victim = if self.trtllm { None } else { self.pick_victim() };
            let Some(victim) = victim else {
                // Nothing left to preempt: the pass emits nothing.
                self.mtp.as_mut().expect("MTP on").stalled = true;
                b.decode_batch = 0;
                b.decode_kv = 0;
                break;
            };
            self.preempt(victim, b);
        }
        (b.batch_count, b.total_isl, b.total_prefix, b.prefill_work_tokens) = prefill;
        self.mtp.as_mut().expect("MTP on").reserved = reserved;
    }

    /// Emission with speculative bursts: each ready request emits the tokens its
    /// verification accepted (at most what it has left), all at the pass end; a request
    /// that goes on keeps its last token dangling.
    pub(super) fn emit_mtp(&mut self, pass: &mut super::Pass) {
        let mut mtp = self.mtp.take().expect("MTP on");
        let mut finished = false;
        let mut tokens = 0u64;
        let end_ns = pass.end_ns;
        let bs = self.block_size;
        let prefill_worker = self.worker_type == WorkerType::Prefill;
        for i in 0..self.running.len() {
            if mtp.stalled {
                break;
            }
            let key = self.running[i].key;
            let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
            if !Self::mtp_ready(seq) {
                continue;
            }
            let remaining = seq.max_output - seq.generated;
            let burst = if prefill_worker {
                1
            } else {
                let accepted = mtp.sampler.sample();
                if seq.pass_prompt_tokens == 0 && seq.pass_id == self.pass_id {
                    mtp.forwards += 1;
                    mtp.accepted += u64::from(accepted);
                    pass.metrics.spec_forwards += 1;
                    pass.metrics.spec_accepted_tokens += u64::from(accepted);
                }
                accepted.min(remaining)
            };
            let computed_before = seq.num_computed;
            for k in 0..burst {
                let index = seq.generated;
                let token = match &seq.planned {
                    Some(p) => OutputToken::Planned(p[index as usize]),
                    None => OutputToken::Generated,
                };
                seq.generated += 1;
                seq.len += 1;
                let completed = seq.generation_complete();
                let cached_tokens = if seq.sent_first { None } else { seq.first_cached };
                seq.sent_first = true;
                let itl_ns = if index == 0 || k > 0 { 0 } else { end_ns - seq.last_token_ns };
                pass.outputs.push(Output {
                    key,
                    uuid: seq.uuid,
                    token,
                    index,
                    itl_ns,
                    completed,
                    rejected: false,
                    cached_tokens,
                });
                tokens += 1;
                if completed {
                    seq.done = true;
                    finished = true;
                    break;
                }
            }
            seq.last_token_ns = end_ns;
            seq.last_token_pass = self.pass_id;
            // Every token but the last is computed; the KV of all of them is allocated.
            seq.num_computed = seq.len - 1;
            let target = seq.len.div_ceil(bs) as usize;
            while seq.blocks.len() < target {
                seq.blocks.push(mtp.reserved.pop().expect("burst blocks were reserved"));
            }
            let computed_after = seq.num_computed;
            if self.prefix_caching {
                self.finalize_blocks(key, computed_before, computed_after, pass);
            }
            self.state_after_burst(key, computed_after, &mut mtp.reserved);
        }
        self.pool.release(&mut mtp.reserved);
        self.mtp = Some(mtp);
        self.totals.generation_tokens_total += tokens;
        if finished {
            self.retire_done();
        } else {
            self.retire_rejected();
        }
    }
}
