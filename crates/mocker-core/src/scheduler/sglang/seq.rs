//! One request's state in the SGLang scheduler.

use crate::hashing::{chain_hash, local_block_hash, unique_block_identity};
use crate::kv::radix::NodeId;

/// Where a request is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// Submitted, never admitted.
    Fresh,
    /// Admitted (running, or waiting for its next prefill chunk).
    Admitted,
    /// Retracted under memory pressure; its generated tokens are kept and recomputed.
    Retracted,
    /// A finished disaggregation source keeping its KV until released.
    Held,
    /// A disaggregation destination whose prompt pages are reserved, awaiting activation.
    Reserved,
}

#[derive(Debug)]
pub(super) struct Seq {
    pub uuid: u128,
    pub prompt: Vec<u32>,
    pub planned: Option<Vec<u32>>,
    /// Output cap, already clipped to `max_model_len`.
    pub max_output: u32,
    /// Prompt plus generated tokens.
    pub len: u32,
    pub generated: u32,
    /// Tokens whose KV is computed and held (0 while waiting for a first chunk).
    pub materialized: u32,
    /// Pages owned: the locked tree path (`tree_depth` pages) plus private pages.
    pub pages: u32,
    pub tree_depth: u32,
    /// Deepest node of the locked radix path (None: nothing locked).
    pub last_node: Option<NodeId>,
    /// Sequence hashes of complete pages computed so far (empty without prefix caching).
    pub hashes: Vec<u64>,
    pub status: Status,
    /// Rejected at the next pass (can never run here).
    pub reject: bool,
    /// A disaggregation source: on finishing, its KV is held, not cached and freed.
    pub hold: bool,
    pub first_cached: Option<u32>,
    pub sent_first: bool,
    pub last_token_ns: u64,
    pub last_token_pass: u64,
}

impl Seq {
    /// Appends the tokens at positions `range` to `out`.
    pub fn extend_tokens(&self, range: std::ops::Range<u32>, out: &mut Vec<u32>) {
        crate::scheduler::extend_tokens(&self.prompt, self.planned.as_deref(), self.uuid, range, out);
    }

    #[inline]
    pub fn remaining(&self) -> u32 {
        self.max_output.saturating_sub(self.generated)
    }

    /// Private pages (owned, not in the tree).
    #[inline]
    pub fn private_pages(&self) -> u32 {
        self.pages - self.tree_depth
    }

    /// Extends `hashes` to cover every complete page of the first `upto` tokens; `scratch`
    /// is a reusable token buffer (prompt pages are hashed at submit, so this only runs for
    /// pages of generated tokens, one page at a time). With `opaque`, pages of generated
    /// tokens without a plan get [`unique_block_identity`] instead of a content hash.
    pub fn extend_hashes(&mut self, upto: u32, page: u32, opaque: bool, scratch: &mut Vec<u32>) {
        let target = (upto / page) as usize;
        let prompt_pages = self.prompt.len() as u32 / page;
        while self.hashes.len() < target {
            let blk = self.hashes.len() as u32;
            if opaque && blk >= prompt_pages && self.planned.is_none() {
                let h = unique_block_identity(self.uuid, blk);
                self.hashes.push(h);
                continue;
            }
            scratch.clear();
            self.extend_tokens(blk * page..(blk + 1) * page, scratch);
            let local = local_block_hash(scratch);
            let h = self.hashes.last().map_or(local, |&p| chain_hash(p, local));
            self.hashes.push(h);
        }
    }
}
