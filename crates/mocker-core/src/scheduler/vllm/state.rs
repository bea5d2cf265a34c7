//! `state_cache`: a recurrent state per request (Mamba, linear attention) held in the block
//! pool beside the token blocks, as the reference's G1 model keeps it (docs/hybrid-kv.md §2).
//!
//! A running request owns a *working* state of `S` blocks. When a pass ends on a block
//! boundary the working blocks are published as that boundary's *checkpoint* (cached under
//! the boundary's state keys, costing no extra block). Before the state is written again the
//! checkpoint is preserved in `S` fresh blocks, which the request owns until its next pass
//! ends and then leaves in the cache; the next checkpoint discards them, so a request keeps
//! only its latest checkpoint. A prefix hit counts only up to a boundary whose checkpoint is
//! cached, and restoring it takes `S` more blocks for the working copy.

use crate::hashing::chain_hash;
use crate::kv::BlockId;
use crate::request::SeqKey;

use super::{Seq, VllmScheduler};

/// The key of slot `slot` of the checkpoint at the boundary whose token-block hash is
/// `prefix`: a hash of its own, so state blocks share the pool's index with token blocks
/// without colliding with them.
#[inline]
pub(super) fn state_key(prefix: u64, slot: usize) -> u64 {
    chain_hash(prefix, 0x5354_4154_4500_0000 | slot as u64)
}

/// The engine-wide part: the state size and what was published in the current pass.
#[derive(Debug)]
pub(super) struct StateCache {
    /// Blocks per state (`S`).
    pub blocks: usize,
    /// Speculative decoding: a hit needs one more block of hidden state.
    mtp: bool,
    /// Checkpoints published in the current pass: visible to lookups only from the next.
    published: Vec<u64>,
    step: u64,
    /// Scratch for one allocation (no allocation per pass once warm).
    keys: Vec<u64>,
    hit_ids: Vec<BlockId>,
    fresh_ids: Vec<BlockId>,
}

/// What one request holds of the state cache.
#[derive(Debug, Default)]
pub(super) struct SeqState {
    /// The working state's blocks (empty until the request is first allocated).
    working: Vec<BlockId>,
    /// The checkpoint the working blocks are published as (`None`: private to the request).
    working_key: Option<u64>,
    /// Tokens the working state has consumed.
    computed: u32,
    /// The request's latest checkpoint: aliases `working` until it is preserved in blocks
    /// of its own (`snapshot_owned`, held until the next pass ends).
    snapshot: Vec<BlockId>,
    snapshot_prefix: Option<u64>,
    snapshot_owned: bool,
    snapshot_step: u64,
}

impl StateCache {
    /// A state cache of `blocks` blocks per state.
    pub fn new(blocks: usize, mtp: bool) -> Self {
        assert!(blocks > 0, "validated: a state takes at least one block");
        Self {
            blocks,
            mtp,
            published: Vec::new(),
            step: 0,
            keys: Vec::new(),
            hit_ids: Vec::new(),
            fresh_ids: Vec::new(),
        }
    }
}

/// The outcome of a waiting request's admission check with a state cache.
pub(super) enum StateAdmission {
    /// Blocks the admission needs beyond the prefix hit's active blocks.
    Needs(usize),
    /// It could never fit: reject it.
    Impossible,
}

impl VllmScheduler {
    /// Starts a pass: checkpoints published by the previous one become visible.
    pub(super) fn state_begin_step(&mut self) {
        if let Some(sc) = self.state.as_mut() {
            sc.published.clear();
            sc.step += 1;
        }
    }

    /// Whether the checkpoint at the boundary hashed `prefix` is cached (every slot) and
    /// was not published in this pass.
    fn has_checkpoint(&self, prefix: u64) -> bool {
        let sc = self.state.as_ref().expect("state cache");
        !sc.published.contains(&prefix)
            && (0..sc.blocks).all(|slot| self.pool.contains(state_key(prefix, slot)))
    }

    /// The cached prefix of a waiting request with a state cache: the token hit, capped as
    /// usual, then cut back to the longest block boundary with a cached checkpoint.
    /// Returns (cached tokens, active cached tokens); `matched` holds the resident blocks.
    pub(super) fn state_prefix(&self, seq: &Seq, matched: &[BlockId]) -> (u32, u32) {
        let sc = self.state.as_ref().expect("state cache");
        let bs = self.block_size;
        let mut overlap = matched.len();
        let needs_logits = !seq.generation_complete();
        if needs_logits {
            overlap = overlap.min(((seq.len.saturating_sub(1)) / bs) as usize);
            if sc.mtp {
                overlap = overlap.saturating_sub(1);
            }
        }
        let count = (1..=overlap).rev().find(|&n| self.has_checkpoint(seq.hashes[n - 1])).unwrap_or(0);
        let active = matched[..count].iter().filter(|&&id| self.pool.is_active(id)).count();
        let cached = (count as u32 * bs).min(seq.len);
        (cached, (active as u32 * bs).min(seq.len))
    }

    /// The reference's admission requirement with a state cache: the token blocks not
    /// already active, a working state, and the inactive blocks a restored checkpoint
    /// pins; impossible when the tokens and (with a hit) two states exceed the pool.
    pub(super) fn state_admission(&self, seq: &Seq, cached: u32, active_cached: u32) -> StateAdmission {
        let sc = self.state.as_ref().expect("state cache");
        let bs = self.block_size as usize;
        let token_blocks = (seq.len as usize).div_ceil(bs);
        let copies = if cached > 0 { 2 } else { 1 };
        if seq.len == 0 || token_blocks + sc.blocks * copies > self.num_gpu_blocks {
            return StateAdmission::Impossible;
        }
        let reused = (active_cached as usize / bs).max(seq.blocks.len());
        let inactive_sources = match cached as usize / bs {
            0 => 0,
            n => (0..sc.blocks)
                .filter(|&slot| self.pool.hit(state_key(seq.hashes[n - 1], slot)) == Some(false))
                .count(),
        };
        StateAdmission::Needs(token_blocks.saturating_sub(reused) + sc.blocks + inactive_sources)
    }

    /// Blocks a state write up to `target` tokens needs first: a copy preserving the
    /// published checkpoint the working state still is.
    fn state_write_blocks(&self, seq: &Seq, target: u32) -> usize {
        let (Some(sc), Some(st)) = (self.state.as_ref(), seq.state.as_deref()) else { return 0 };
        if target > st.computed && st.working_key.is_some() {
            sc.blocks
        } else {
            0
        }
    }

    /// Whether a running request can still compute its whole known sequence in the pool
    /// (with its working state and any preservation copy); if not, the reference drops it.
    pub(super) fn state_can_compute(&self, seq: &Seq) -> bool {
        let sc = self.state.as_ref().expect("state cache");
        let tokens = (seq.len as usize).div_ceil(self.block_size as usize);
        tokens + sc.blocks + self.state_write_blocks(seq, seq.len) <= self.num_gpu_blocks
    }

    /// Blocks a burst of MTP decode up to `target` tokens needs for the state.
    pub(super) fn state_burst_blocks(&self, seq: &Seq, target: u32) -> usize {
        self.state_write_blocks(seq, target)
    }

    /// After an MTP burst computed request `key` through `computed` tokens: preserves a
    /// published checkpoint from the pass's `reserved` blocks, then commits the state.
    pub(super) fn state_after_burst(&mut self, key: SeqKey, computed: u32, reserved: &mut Vec<BlockId>) {
        if self.state.is_none() {
            return;
        }
        if self.state_write_blocks(self.seq(key), computed) > 0 {
            let mut sc = self.state.take().expect("state cache");
            let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
            let st = seq.state.as_deref_mut().expect("a published state");
            preserve(&mut self.pool, &mut sc, st, reserved);
            self.state = Some(sc);
        }
        self.state_commit(key, computed);
    }

    /// Allocates request `key` through `cumulative` tokens, with `reusable` leading blocks
    /// from the prefix cache, together with its state in one atomic reservation: the token
    /// blocks, the checkpoint restored from a hit, a fresh working state on first use and
    /// the copy preserving a published checkpoint before it is overwritten. Returns false
    /// (changing nothing) when the pool cannot supply them.
    pub(super) fn state_allocate(&mut self, key: SeqKey, cumulative: u32, reusable: usize) -> bool {
        let bs = self.block_size;
        let mut sc = self.state.take().expect("state cache");
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        let st = seq.state.get_or_insert_with(Default::default);
        let previous = seq.blocks.len();
        let target = (cumulative.div_ceil(bs) as usize).max(previous);
        let new_tokens = target - previous;
        let new_work = st.working.is_empty();
        let reused = reusable.saturating_sub(previous).min(new_tokens);
        let reusable_tokens = reusable as u32 * bs;
        sc.keys.clear();
        if reused > 0 {
            sc.keys.extend_from_slice(&seq.hashes[previous..previous + reused]);
        }
        let restores = new_work && reusable > 0;
        if restores {
            let prefix = seq.hashes[reusable - 1];
            sc.keys.extend((0..sc.blocks).map(|slot| state_key(prefix, slot)));
        }
        let write = if cumulative > st.computed && st.working_key.is_some() { sc.blocks } else { 0 };
        let fresh = write + new_tokens - reused + if new_work { sc.blocks } else { 0 };
        sc.hit_ids.clear();
        sc.fresh_ids.clear();
        if !self.pool.allocate_keys(&sc.keys, &mut sc.hit_ids, fresh, &mut sc.fresh_ids, &mut self.evicted) {
            self.state = Some(sc);
            return false;
        }
        // Fresh blocks are anonymous: hand them out from the back.
        seq.blocks.extend_from_slice(&sc.hit_ids[..reused]);
        for _ in reused..new_tokens {
            seq.blocks.push(sc.fresh_ids.pop().expect("reserved"));
        }
        if new_work {
            st.working.clear();
            for _ in 0..sc.blocks {
                st.working.push(sc.fresh_ids.pop().expect("reserved"));
            }
            st.working_key = None;
            st.computed = reusable_tokens;
        }
        if write > 0 {
            let mut fresh = std::mem::take(&mut sc.fresh_ids);
            preserve(&mut self.pool, &mut sc, st, &mut fresh);
            sc.fresh_ids = fresh;
        }
        debug_assert!(sc.fresh_ids.is_empty(), "every reserved block handed out");
        // A restored checkpoint is copied into the working state at once: its blocks
        // go back to the cache (at the LRU tail).
        if restores {
            for i in reused..sc.hit_ids.len() {
                self.pool.release_one(sc.hit_ids[i]);
            }
        }
        self.state = Some(sc);
        true
    }

    /// After request `key`'s pass computed through `computed` tokens: gives back a
    /// preserved checkpoint it no longer reads and, on a block boundary (with prefix
    /// caching), publishes the working state as the new checkpoint, discarding the old.
    pub(super) fn state_commit(&mut self, key: SeqKey, computed: u32) {
        let bs = self.block_size;
        let prefix_caching = self.prefix_caching;
        let Some(sc) = self.state.as_mut() else { return };
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        let Some(st) = seq.state.as_deref_mut() else { return };
        if computed <= st.computed || st.working.is_empty() {
            return;
        }
        debug_assert!(st.working_key.is_none(), "a state write reserves its preservation first");
        if st.snapshot_owned {
            for &id in &st.snapshot {
                self.pool.release_one(id);
            }
            st.snapshot_owned = false;
        }
        st.computed = computed;
        let boundary = prefix_caching && computed > 0 && computed.is_multiple_of(bs);
        let Some(&prefix) = seq.hashes.get((computed / bs) as usize - 1).filter(|_| boundary) else {
            return;
        };
        if let Some(old) = st.snapshot_prefix {
            for (slot, &id) in st.snapshot.iter().enumerate() {
                self.pool.discard_inactive(id, state_key(old, slot));
            }
        }
        st.snapshot.clear();
        for (slot, &id) in st.working.iter().enumerate() {
            self.pool.register_in(id, state_key(prefix, slot), None, crate::kv::Scope::Silent);
        }
        st.snapshot.extend_from_slice(&st.working);
        st.working_key = Some(prefix);
        st.snapshot_prefix = Some(prefix);
        st.snapshot_step = sc.step;
        sc.published.push(prefix);
    }

    /// Gives back what the request holds of the state cache (before its token blocks): a
    /// preserved checkpoint and the working state go to the cache if published, else free.
    /// On preemption a checkpoint published in this very pass is discarded too.
    pub(super) fn state_release(&mut self, key: SeqKey, preempted: bool) {
        let Some(sc) = self.state.as_ref() else { return };
        let step = sc.step;
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        let Some(st) = seq.state.as_deref_mut() else { return };
        let pending = (preempted && st.snapshot_step == step)
            .then(|| st.snapshot_prefix.map(|p| (p, st.snapshot.clone())))
            .flatten();
        if st.snapshot_owned {
            for &id in &st.snapshot {
                self.pool.release_one(id);
            }
            st.snapshot_owned = false;
        }
        // Slot order, as the reference releases them (so they join the LRU in that order).
        for &id in &st.working {
            self.pool.release_one(id);
        }
        st.working.clear();
        st.working_key = None;
        st.snapshot.clear();
        st.snapshot_prefix = None;
        st.computed = 0;
        if let Some((prefix, ids)) = pending {
            for (slot, id) in ids.into_iter().enumerate() {
                self.pool.discard_inactive(id, state_key(prefix, slot));
            }
        }
    }
}

/// Preserves the checkpoint the working state is published as in `S` blocks popped from
/// `fresh` (owned by the request until its pass ends), then takes the working blocks
/// private so they can be written.
fn preserve(
    pool: &mut crate::kv::BlockPool,
    sc: &mut StateCache,
    st: &mut SeqState,
    fresh: &mut Vec<BlockId>,
) {
    let prefix = st.working_key.take().expect("published working state");
    st.snapshot.clear();
    for slot in 0..sc.blocks {
        let id = fresh.pop().expect("reserved");
        pool.register_in(id, state_key(prefix, slot), None, crate::kv::Scope::Silent);
        st.snapshot.push(id);
    }
    for &id in &st.working {
        pool.unregister(id);
    }
    st.snapshot_prefix = Some(prefix);
    st.snapshot_owned = true;
    st.snapshot_step = sc.step;
    sc.published.push(prefix);
}
