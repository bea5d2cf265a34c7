//! Steady decode runs: with `aggregate_steady` on, a running request that will decode one
//! token per pass with no page to allocate or fill, no completion and no radix insert for
//! a known number of passes is *steady*. Decode passes only count it (its KV length comes
//! from an offset) without touching its `Seq`, which keeps the counters of the pass it
//! became steady in until `catch_up` brings them forward. This makes a decode pass cost
//! what changes in it, not the batch size.

use super::SglangScheduler;

impl SglangScheduler {
    /// Brings the `Seq` of `running[i]` up to the start of the current pass (the tokens its
    /// steady passes emitted) and ends its steady run. Steady passes are always consecutive
    /// decode passes (anything else catches every request up first), so the run emitted
    /// one token in each pass after the Seq's last write, and the last of them ended at
    /// the previous pass's end.
    pub(super) fn catch_up(&mut self, i: usize) {
        let entry = &mut self.running[i];
        if !entry.end_run() {
            return;
        }
        let seq = self.seqs[entry.key.0 as usize].as_mut().expect("live seq");
        let k = (self.pass_id - 1 - seq.last_token_pass) as u32;
        if k > 0 {
            seq.len += k;
            seq.generated += k;
            seq.materialized += k;
            seq.last_token_pass = self.pass_id - 1;
            seq.last_token_ns = self.last_end_ns;
        }
    }

    /// Catches every running request up: before anything that reads running requests'
    /// `Seq`s wholesale (admission, retraction) or a pass that does not decode them all.
    pub(super) fn catch_up_all(&mut self) {
        if !self.aggregate_steady {
            return;
        }
        for i in 0..self.running.len() {
            self.catch_up(i);
        }
    }

    /// After `running[i]` got its (non-final) token in the current decode pass: makes it
    /// steady for the following passes in which its token is mid-stream, needs no page,
    /// completes no page and does not finish it.
    pub(super) fn start_steady(&mut self, i: usize) {
        let entry = &mut self.running[i];
        let seq = self.seqs[entry.key.0 as usize].as_ref().expect("live seq");
        if seq.generated < 2 {
            return;
        }
        let (page, len) = (self.page, seq.len);
        // Pass j (1-based) ahead starts at length len + j - 1 and ends at len + j.
        let fits = (seq.pages * page).saturating_sub(len);
        let finishes = seq.max_output.saturating_sub(seq.generated + 1);
        let mut passes = fits.min(finishes);
        if self.prefix_caching {
            // The pass whose token completes the page after the tree path inserts it.
            let insert_at = ((seq.tree_depth + 1) * page).saturating_sub(len);
            passes = passes.min(insert_at.saturating_sub(1));
        }
        entry.start_run(self.pass_id, len, passes);
    }
}
