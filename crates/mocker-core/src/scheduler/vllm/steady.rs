//! Runs of identical steady decode passes: after a pass in which every running request only
//! decoded a token that completes no block, the passes that follow are alike until the first
//! request reaches a block boundary or its last token, so the engine can advance through them
//! at once (`Pass::run_ends`) and catch each request up when its run ends.

use crate::config::WorkerType;
use crate::timing::{scaled_nanos, DecodeShape};

use super::{Seq, VllmScheduler};

impl VllmScheduler {
    /// Continues the last pass, if it only counted steady tokens of every running request
    /// and nothing waits, with the passes that would follow it back to back while all of
    /// them stay that way, as long as they end by `max_end_ns`: the engine is then as if
    /// stepped through each, and the last pass describes the run (`Pass::run_ends`).
    /// Returns the passes added.
    pub fn extend_steady_run(&mut self, max_end_ns: u64) -> u32 {
        let pass = &self.pass;
        let batch = pass.steady_count;
        let pure = batch > 0
            && batch == self.running.len()
            && self.waiting.is_empty()
            && pass.outputs.is_empty()
            && pass.steady.is_empty()
            && pass.admissions.is_empty()
            && pass.kv_events.is_empty()
            && pass.metrics.num_prefill_requests == 0
            && self.worker_type != WorkerType::Prefill;
        if !pure {
            return 0;
        }
        // Every request stays steady through pass `steady_until - 1`.
        let horizon = self.running.iter().map(|e| e.steady_until_pass()).min().unwrap_or(0);
        let mut kv = pass.metrics.sum_decode_kv_tokens;
        let mut added = 0;
        while self.pass_id + 1 < horizon {
            let decode_ns = self.steady_decode_ns(batch, kv + batch);
            let end = self.last_end_ns + decode_ns;
            if end > max_end_ns || decode_ns == 0 {
                break;
            }
            kv += batch;
            if self.pass.run_ends.is_empty() {
                let first = self.pass.end_ns;
                self.pass.run_ends.push(first);
            }
            self.pass.run_ends.push(end);
            self.pass_id += 1;
            self.last_end_ns = end;
            self.totals.generation_tokens_total += batch as u64;
            added += 1;
        }
        if added > 0 {
            self.pass.end_ns = self.last_end_ns;
            self.set_steady_run_metrics(kv);
        }
        added
    }

    /// Drops the passes of the current run (see [`Self::extend_steady_run`]) that start at
    /// or after `t_ns`, as if the engine had been stepped only through the others; the
    /// run's first pass always stays.
    pub fn truncate_steady_run(&mut self, t_ns: u64) {
        let batch = self.pass.steady_count;
        let mut dropped = 0;
        while self.pass.run_ends.len() >= 2 && self.pass.run_ends[self.pass.run_ends.len() - 2] >= t_ns {
            self.pass.run_ends.pop();
            self.pass_id -= 1;
            self.totals.generation_tokens_total -= batch as u64;
            dropped += 1;
        }
        if dropped == 0 {
            return;
        }
        let end = *self.pass.run_ends.last().expect("a run keeps its first pass");
        let kv = self.pass.metrics.sum_decode_kv_tokens - dropped * batch;
        if self.pass.run_ends.len() == 1 {
            self.pass.run_ends.clear();
        }
        self.pass.end_ns = end;
        self.last_end_ns = end;
        self.set_steady_run_metrics(kv);
    }

    /// Decode time of a steady pass of `batch` requests holding `kv` tokens, as
    /// `pass_cost` prices a pass that only decodes (`pass_ms` then asks the model for its
    /// decode term alone). Priced directly: runs price every pass of every run.
    fn steady_decode_ns(&self, batch: usize, kv: usize) -> u64 {
        if batch == 0 || self.worker_type == WorkerType::Prefill {
            return 0;
        }
        let total_kv_tokens = self.decode_total_kv_tokens(kv);
        let ms = self.timing.decode_ms(DecodeShape { batch, active_kv_tokens: kv, total_kv_tokens });
        scaled_nanos(ms, self.decode_speedup)
    }

    /// The metrics of the run's last pass, which holds `kv` tokens.
    fn set_steady_run_metrics(&mut self, kv: usize) {
        let n = self.pass.run_ends.len();
        let duration = self.pass.end_ns - self.pass.last_start_ns();
        debug_assert!(n >= 2 || duration == self.pass.duration_ns());
        let m = &mut self.pass.metrics;
        if m.decode_lengths.count > 0 {
            // Every decoding request is as many tokens longer as the run has passes more.
            let k = (kv as i64 - m.sum_decode_kv_tokens as i64) / m.decode_lengths.count as i64;
            m.decode_lengths.shift(k);
        }
        m.sum_decode_kv_tokens = kv;
        m.wall_time_secs = duration as f64 / 1e9;
    }

    /// Brings the `Seq` of a steady `running[i]` up to the start of the current pass (or,
    /// with `scheduled`, to having been scheduled for one decode token in it, as
    /// `plain_decode_run` would have left it) and ends its steady run.
    pub(super) fn catch_up(&mut self, i: usize, scheduled: bool) {
        let entry = &mut self.running[i];
        if !entry.end_run() {
            return;
        }
        let pass_id = self.pass_id;
        let seq = self.seqs[entry.key.0 as usize].as_mut().expect("live seq");
        // Steady passes emitted since the Seq was last written.
        let k = (pass_id - 1 - seq.last_token_pass) as u32;
        if k > 0 {
            seq.len += k;
            seq.generated += k;
            seq.num_computed = seq.len - 1;
            seq.last_token_pass = pass_id - 1;
            seq.last_token_ns = self.last_end_ns;
        }
        if scheduled {
            seq.num_computed = seq.len;
            seq.pass_id = pass_id;
            seq.pass_tokens = 1;
            seq.pass_prompt_tokens = 0;
            seq.pass_decode = true;
        }
    }

    /// After `seq` emitted its token in the current pass: how many following passes it
    /// decodes steadily (one token that fits its last block, completes no block and does
    /// not finish it, and is neither its first nor second token).
    pub(super) fn steady_passes(&self, seq: &Seq) -> u32 {
        if !self.aggregate_steady || seq.generated < 2 || seq.num_computed + 1 != seq.len {
            return 0;
        }
        let finishes = seq.max_output.saturating_sub(seq.generated + 1);
        if let Some(groups) = &self.groups {
            // A grouped request holds a lease, not blocks: it is steady while the lease's
            // page ranges stay where they are.
            return groups.steady_decode_passes(&seq.lease).min(finishes);
        }
        let bs = self.block_size;
        let len = seq.len;
        // The pass j (1-based) ahead runs at length len + j - 1.
        let fits = (seq.blocks.len() as u32 * bs + 1).saturating_sub(len);
        let mut passes = fits.min(finishes);
        if self.prefix_caching {
            let rem = len % bs;
            passes = passes.min(if rem == 0 { 0 } else { bs - rem });
        }
        passes
    }
}
