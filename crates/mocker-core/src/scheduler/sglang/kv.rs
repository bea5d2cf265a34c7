//! Request-level KV operations of the SGLang scheduler over its radix cache: admission
//! locks and allocations, inserting computed pages, finishing and releasing, KV events.

use super::seq::Seq;
use super::SglangScheduler;
use crate::events::{KvEvent, KvEventData, StoredBlock};
use crate::hashing::local_block_hash;
use crate::request::SeqKey;
use crate::scheduler::Pass;

impl SglangScheduler {
    /// Pages of `seq` the radix tree already holds, capped so at least one token is
    /// computed (SGLang matches `len - 1` tokens): the admission-time prefix hit.
    pub(super) fn match_pages(&self, seq: &Seq) -> u32 {
        if !self.prefix_caching {
            return 0;
        }
        let cap = ((seq.len - 1) / self.page) as usize;
        self.cache.match_len(&seq.hashes[..cap.min(seq.hashes.len())]) as u32
    }

    /// Allocates pages so `key` owns tokens `[0, chunk_end)`: a first admission locks its
    /// `matched` tree pages first (so eviction cannot take them), a continuation extends
    /// its own pages. False, with nothing changed, when the pool cannot supply them.
    pub(super) fn allocate_chunk(
        &mut self,
        key: SeqKey,
        matched: u32,
        chunk_end: u32,
        pass: &mut Pass,
    ) -> bool {
        let page = self.page;
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        let target = chunk_end.div_ceil(page);
        let first = seq.materialized == 0;
        let mut locked = None;
        if first && matched > 0 {
            let (n, node) = self.cache.lock_prefix(&seq.hashes[..matched as usize]);
            debug_assert_eq!(n as u32, matched);
            locked = node;
        }
        let owned = if first { matched } else { seq.pages };
        let ok = self.cache.allocate(target.saturating_sub(owned) as usize, &mut self.evicted);
        if !ok {
            self.cache.unlock(locked);
            return false;
        }
        if first {
            seq.tree_depth = matched;
            seq.last_node = locked;
        }
        seq.pages = target.max(owned);
        seq.materialized = chunk_end;
        self.flush_evicted(pass);
        true
    }

    /// Inserts the complete pages of `key`'s materialized tokens into the tree (moving its
    /// lock down) and records Stored events for the pages that became visible.
    pub(super) fn cache_materialized(&mut self, key: SeqKey, pass: &mut Pass) {
        if !self.prefix_caching {
            return;
        }
        let page = self.page;
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        if seq.materialized / page <= seq.tree_depth {
            return;
        }
        seq.extend_hashes(seq.materialized, page, self.opaque_output_blocks, &mut self.scratch_tokens);
        let complete = (seq.materialized / page) as usize;
        self.created.clear();
        let ins = self.cache.insert(
            seq.last_node,
            seq.tree_depth as usize,
            &seq.hashes[..complete],
            &mut self.created,
        );
        seq.last_node = ins.last;
        // Merged duplicates were freed by the cache: the request now uses the tree's copies,
        // so its page count is unchanged while its private share shrinks.
        seq.tree_depth = ins.depth as u32;
        if self.record_kv_events && !self.created.is_empty() {
            self.stored_events(key, pass);
        }
    }

    /// One Stored event per maximal run of consecutive newly visible pages.
    fn stored_events(&mut self, key: SeqKey, pass: &mut Pass) {
        let created = std::mem::take(&mut self.created);
        let page = self.page;
        let mut i = 0;
        while i < created.len() {
            let mut j = i + 1;
            while j < created.len() && created[j] == created[j - 1] + 1 {
                j += 1;
            }
            let seq = self.seqs[key.0 as usize].as_ref().expect("live seq");
            let first = created[i] as usize;
            let parent_hash = first.checked_sub(1).map(|p| seq.hashes[p]);
            let blocks = created[i..j]
                .iter()
                .map(|&b| {
                    let mut tokens = Vec::with_capacity(page as usize);
                    seq.extend_tokens(b * page..(b + 1) * page, &mut tokens);
                    let tokens_hash = local_block_hash(&tokens);
                    let token_ids = self.kv_token_ids.then_some(tokens);
                    StoredBlock { block_hash: seq.hashes[b as usize], tokens_hash, token_ids }
                })
                .collect();
            self.push_event(pass, KvEventData::Stored { parent_hash, blocks, lora: None });
            i = j;
        }
        self.created = created;
    }

    /// A finished request: its complete pages enter the tree (evictable once unlocked; the
    /// insert refreshes its path only when it added pages, as the reference's does), the
    /// partial tail page is freed.
    pub(super) fn finish_kv(&mut self, key: SeqKey, pass: &mut Pass) {
        self.cache_materialized(key, pass);
        self.release_kv(key);
        self.capacity_generation += 1;
    }

    /// Frees `key`'s private pages and drops its tree lock; pages already in the tree stay
    /// cached (a retracted request may hit its own prefix later).
    pub(super) fn release_kv(&mut self, key: SeqKey) {
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        self.cache.free(seq.private_pages() as usize);
        self.cache.unlock(seq.last_node.take());
        seq.pages = 0;
        seq.tree_depth = 0;
        seq.materialized = 0;
    }

    pub(super) fn flush_evicted(&mut self, pass: &mut Pass) {
        if self.evicted.is_empty() {
            return;
        }
        if self.record_kv_events {
            let block_hashes = std::mem::take(&mut self.evicted);
            self.push_event(pass, KvEventData::Removed { block_hashes });
        } else {
            self.evicted.clear();
        }
    }

    pub(super) fn push_event(&mut self, pass: &mut Pass, data: KvEventData) {
        pass.kv_events.push(KvEvent { event_id: self.next_event_id, dp_rank: self.dp_rank, data });
        self.next_event_id += 1;
    }
}
