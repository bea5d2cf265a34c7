//! `state_cache`: a recurrent state per request (Mamba, linear attention) held in the block
//! pool beside the token blocks, as the reference's G1 model keeps it (docs/hybrid-kv.md §2).
//!
//! A running request owns a *working* state of `S` blocks. A *checkpoint* is the working
//! state published (cached under the boundary's state keys, costing no extra block) at the
//! end of a pass; a prefix hit counts only up to a boundary whose checkpoint is cached, and
//! restoring it takes `S` more blocks for the working copy.
//!
//! Default mode publishes at the end of every pass that ends on a block boundary and keeps
//! only the latest checkpoint: before the state is written again the checkpoint is preserved
//! in `S` fresh blocks, owned until the pass ends and then left in the cache, and the next
//! checkpoint discards them.
//!
//! Align mode (`prefix_match_unit`, vLLM's "align" Mamba caching) splits prefill so passes
//! end at the prompt's last full block and at its partial tail (a multiple of the unit),
//! publishes only there, and moves the working state to fresh blocks whenever it enters a
//! new block, holding the previous blocks until the request's next allocation. A checkpoint
//! inside a block also publishes the partial token page, so a later prompt can hit it.

use crate::hashing::{chain_hash, local_block_hash};
use crate::kv::{BlockId, Scope};
use crate::request::SeqKey;

use super::{Seq, VllmScheduler};

/// The key of slot `slot` of the checkpoint at the boundary identified by `prefix`: a hash
/// of its own, so state blocks share the pool's index with token blocks without colliding.
#[inline]
pub(super) fn state_key(prefix: u64, slot: usize) -> u64 {
    chain_hash(prefix, 0x5354_4154_4500_0000 | slot as u64)
}

/// The engine-wide part: the state size, the mode and what the current pass published.
#[derive(Debug)]
pub(super) struct StateCache {
    /// Blocks per state (`S`).
    pub blocks: usize,
    /// Speculative decoding: a hit needs one more block of hidden state.
    mtp: bool,
    /// `prefix_match_unit` when align mode is on (it needs prefix caching).
    align_unit: Option<u32>,
    /// Checkpoints published in the current pass: visible to lookups only from the next.
    published: Vec<u64>,
    /// Blocks read by this pass's copies (a restored partial page and checkpoint, a
    /// preserved partial-tail state), in the order taken: released when the next pass
    /// starts. A request that lets go earlier takes its own out (`None` holes).
    step_holds: Vec<Option<BlockId>>,
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
    /// Align mode: the block the working state is writing (it moves at block boundaries).
    working_slot: Option<u32>,
    /// Tokens the working state has consumed.
    computed: u32,
    /// The request's latest checkpoint: aliases `working` until it is preserved in blocks
    /// of its own (default mode: `snapshot_owned`, held until the pass ends; align mode: a
    /// step hold).
    snapshot: Vec<BlockId>,
    snapshot_prefix: Option<u64>,
    snapshot_owned: bool,
    snapshot_step: u64,
    /// Align mode: the previous working blocks (or a restored checkpoint), still read by
    /// the pass that took them; released by the next allocation of a later pass.
    previous: Vec<BlockId>,
    previous_step: u64,
    /// Align mode: this request's entries in `StateCache::step_holds`, for `hold_step`.
    holds: Vec<usize>,
    hold_step: u64,
    /// Align mode: the identity of every multiple of the unit in the prompt (index
    /// `t / unit - 1` for `t` tokens): the block hash at a block boundary, else chained
    /// from the previous one over the unit's tokens.
    unit_hashes: Vec<u64>,
}

impl StateCache {
    /// `prefix_match_unit` when align mode is on.
    pub fn align_unit(&self) -> Option<u32> {
        self.align_unit
    }

    /// A state cache of `blocks` blocks per state; `align_unit` is `prefix_match_unit`
    /// when prefix caching is on (align mode), else `None`.
    pub fn new(blocks: usize, mtp: bool, align_unit: Option<u32>) -> Self {
        assert!(blocks > 0, "validated: a state takes at least one block");
        Self {
            blocks,
            mtp,
            align_unit,
            published: Vec::new(),
            step_holds: Vec::new(),
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

impl SeqState {
    /// A request's state before its first allocation, with its align-mode identities.
    pub fn with_unit_hashes(unit_hashes: Vec<u64>) -> Self {
        Self { unit_hashes, ..Self::default() }
    }

    fn hold_step(&mut self, sc: &mut StateCache, id: BlockId) {
        if self.hold_step != sc.step {
            self.holds.clear();
            self.hold_step = sc.step;
        }
        self.holds.push(sc.step_holds.len());
        sc.step_holds.push(Some(id));
    }

    fn hold_previous(&mut self, step: u64, id: BlockId) {
        self.previous.push(id);
        self.previous_step = step;
    }

    /// Blocks this pass's copies still read: they cannot be given back to make room.
    fn current_sources(&self, step: u64) -> usize {
        let previous = if self.previous_step == step { self.previous.len() } else { 0 };
        let holds = if self.hold_step == step { self.holds.len() } else { 0 };
        previous + holds
    }
}

impl VllmScheduler {
    /// The align-mode identities of request `seq`'s prompt (see `SeqState::unit_hashes`),
    /// or `None` when they need tokens it does not carry.
    pub(super) fn state_unit_hashes(&self, seq: &Seq) -> Option<Vec<u64>> {
        let unit = self.state.as_ref()?.align_unit?;
        let bs = self.block_size;
        let mut out = Vec::with_capacity((seq.prompt_len / unit) as usize);
        let mut prev: Option<u64> = seq.hash_root;
        for i in 1..=seq.prompt_len / unit {
            let t = i * unit;
            let h = if t.is_multiple_of(bs) {
                *seq.hashes.get((t / bs) as usize - 1)?
            } else {
                let tokens = seq.prompt.get((t - unit) as usize..t as usize)?;
                let local = local_block_hash(tokens);
                prev.map_or(local, |p| chain_hash(p, local))
            };
            out.push(h);
            prev = Some(h);
        }
        Some(out)
    }

    /// Starts a pass: checkpoints published by the previous one become visible, and the
    /// blocks its copies read are released (in the order they were taken).
    pub(super) fn state_begin_step(&mut self) {
        if let Some(sc) = self.state.as_mut() {
            for id in sc.step_holds.drain(..).flatten() {
                self.pool.release_one(id);
            }
            sc.published.clear();
            sc.step += 1;
        }
    }

    /// The identity of the boundary after `tokens` tokens of `seq` (`None` where no
    /// checkpoint can be: off the unit grid, past the prompt in align mode).
    fn boundary(&self, seq: &Seq, tokens: u32) -> Option<u64> {
        self.boundary_with(self.state.as_ref()?, seq, tokens)
    }

    /// Whether the checkpoint at the boundary `prefix` is cached (every slot) and was not
    /// published in this pass.
    fn has_checkpoint(&self, prefix: u64) -> bool {
        let sc = self.state.as_ref().expect("state cache");
        !sc.published.contains(&prefix)
            && (0..sc.blocks).all(|slot| self.pool.contains(state_key(prefix, slot)))
    }

    /// The cached prefix of a waiting request with a state cache: the token hit, capped as
    /// usual, then cut back to the longest boundary with a cached checkpoint (in align
    /// mode any multiple of the unit, inside a block only where its partial page is
    /// cached too). Returns (cached tokens, active cached tokens); `matched` holds the
    /// resident blocks of the token hit.
    pub(super) fn state_prefix(&self, seq: &Seq, matched: &[BlockId]) -> (u32, u32) {
        let sc = self.state.as_ref().expect("state cache");
        let bs = self.block_size;
        let needs_logits = !seq.generation_complete();
        let cached = if let Some(unit) = sc.align_unit {
            let limit = if needs_logits { seq.len.saturating_sub(1) } else { seq.len };
            let limit = limit.min((matched.len() as u32 + 1) * bs - 1);
            (1..=limit / unit)
                .rev()
                .map(|i| i * unit)
                .find(|&t| {
                    self.boundary(seq, t).is_some_and(|h| {
                        self.has_checkpoint(h) && (t.is_multiple_of(bs) || self.pool.contains(h))
                    })
                })
                .unwrap_or(0)
        } else {
            let mut overlap = matched.len();
            if needs_logits {
                overlap = overlap.min(((seq.len.saturating_sub(1)) / bs) as usize);
                if sc.mtp {
                    overlap = overlap.saturating_sub(1);
                }
            }
            let count = (1..=overlap).rev().find(|&n| self.has_checkpoint(seq.hashes[n - 1])).unwrap_or(0);
            (count as u32 * bs).min(seq.len)
        };
        let full = (cached / bs) as usize;
        let active = matched[..full].iter().filter(|&&id| self.pool.is_active(id)).count();
        (cached, (active as u32 * bs).min(seq.len))
    }

    /// The reference's admission requirement with a state cache: the token blocks not
    /// already active, a working state, and the inactive blocks a restored checkpoint (and
    /// partial page) pins; impossible when the tokens and (with a hit) two states exceed
    /// the pool.
    pub(super) fn state_admission(&self, seq: &Seq, cached: u32, active_cached: u32) -> StateAdmission {
        let sc = self.state.as_ref().expect("state cache");
        let bs = self.block_size as usize;
        let token_blocks = (seq.len as usize).div_ceil(bs);
        let copies = if cached > 0 { 2 } else { 1 };
        let partial = !(cached as usize).is_multiple_of(bs);
        if seq.len == 0 || token_blocks + sc.blocks * copies + usize::from(partial) > self.num_gpu_blocks {
            return StateAdmission::Impossible;
        }
        let reused = (active_cached as usize / bs).max(seq.blocks.len());
        let inactive_sources = match self.boundary(seq, cached).filter(|_| cached > 0) {
            None => 0,
            Some(prefix) => {
                let slots = (0..sc.blocks)
                    .filter(|&slot| self.pool.hit(state_key(prefix, slot)) == Some(false))
                    .count();
                slots + usize::from(partial && self.pool.hit(prefix) == Some(false))
            }
        };
        StateAdmission::Needs(token_blocks.saturating_sub(reused) + sc.blocks + inactive_sources)
    }

    /// Blocks a state write up to `target` tokens needs first: default mode, a copy
    /// preserving the published checkpoint the working state still is; align mode, a new
    /// working state when the write enters another block (or a copy preserving a
    /// published partial-tail checkpoint).
    fn state_write_blocks(&self, seq: &Seq, target: u32) -> usize {
        match (self.state.as_ref(), seq.state.as_deref()) {
            (Some(sc), Some(st)) => write_blocks(sc, st, self.block_size, target),
            _ => 0,
        }
    }

    /// Whether a running request can still compute its whole known sequence in the pool
    /// (with its working state, any copy and the blocks this pass's copies read); if not,
    /// the reference drops it.
    pub(super) fn state_can_compute(&self, seq: &Seq) -> bool {
        let sc = self.state.as_ref().expect("state cache");
        let tokens = (seq.len as usize).div_ceil(self.block_size as usize);
        let sources = seq.state.as_deref().map_or(0, |st| st.current_sources(sc.step));
        tokens + sc.blocks + self.state_write_blocks(seq, seq.len) + sources <= self.num_gpu_blocks
    }

    /// Blocks a burst of MTP decode up to `target` tokens needs for the state.
    pub(super) fn state_burst_blocks(&self, seq: &Seq, target: u32) -> usize {
        self.state_write_blocks(seq, target)
    }

    /// After an MTP burst computed request `key` through `computed` tokens: preserves a
    /// published checkpoint from the pass's `reserved` blocks, then commits the state.
    /// (Align mode refuses speculative decoding, so this is default mode.)
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

    /// Align mode: where a prefill chunk of `desired` tokens from `start` must end instead
    /// (vLLM's align split): on a block boundary while the prompt goes on, and never past
    /// the next block boundary, the prompt's last full block or its partial tail.
    pub(super) fn state_align_chunk(&self, seq: &Seq, start: u32, desired: u32) -> u32 {
        let Some(unit) = self.state.as_ref().and_then(|sc| sc.align_unit) else { return desired };
        let bs = self.block_size;
        let (prompt, known) = (seq.prompt_len, seq.len);
        let prefill_end = prompt.max(known.saturating_sub(1));
        if start >= prefill_end {
            return desired;
        }
        let mut end = start + desired;
        if end < prefill_end {
            let aligned = end / bs * bs;
            // A block larger than the whole budget must still progress.
            if aligned > start || bs <= self.max_num_batched_tokens {
                end = aligned;
            }
        }
        let last_full = known / bs * bs;
        let tail = prompt / unit * unit;
        let next_block = (!start.is_multiple_of(bs)).then(|| start + (bs - start % bs));
        let tail_stop = (last_full < tail && tail < prompt).then_some(tail);
        for stop in [next_block, Some(last_full), tail_stop].into_iter().flatten() {
            if start < stop && stop < end {
                end = stop;
            }
        }
        end.saturating_sub(start)
    }

    /// Allocates request `key` through `cumulative` tokens, with its first `cached` tokens
    /// from the prefix cache, together with its state in one atomic reservation: the token
    /// blocks, the checkpoint (and partial page) restored from a hit, a fresh working
    /// state on first use and the blocks a state write needs first. Returns false
    /// (changing nothing but the release of blocks an earlier pass read) when the pool
    /// cannot supply them.
    pub(super) fn state_allocate(&mut self, key: SeqKey, cumulative: u32, cached: u32) -> bool {
        let bs = self.block_size;
        let mut sc = self.state.take().expect("state cache");
        let align = sc.align_unit.is_some();
        {
            let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
            let st = seq.state.get_or_insert_with(Default::default);
            if st.previous_step < sc.step {
                // What an earlier pass read is free to go now (slot order).
                for &id in &st.previous {
                    self.pool.release_one(id);
                }
                st.previous.clear();
            }
        }
        let write = write_blocks(&sc, self.seq(key).state.as_deref().expect("state"), bs, cumulative);
        let restore_prefix = if cached > 0 { self.boundary_with(&sc, self.seq(key), cached) } else { None };
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        let st = seq.state.as_deref_mut().expect("state");
        let reusable = (cached / bs) as usize;
        let partial = !cached.is_multiple_of(bs);
        let previous = seq.blocks.len();
        let target = (cumulative.div_ceil(bs) as usize).max(previous);
        let new_tokens = target - previous;
        let new_work = st.working.is_empty();
        let reused = reusable.saturating_sub(previous).min(new_tokens);
        sc.keys.clear();
        if reused > 0 {
            sc.keys.extend_from_slice(&seq.hashes[previous..previous + reused]);
        }
        let restores = new_work && cached > 0;
        if restores {
            let prefix = restore_prefix.expect("an authorised checkpoint");
            if partial {
                sc.keys.push(prefix);
            }
            sc.keys.extend((0..sc.blocks).map(|slot| state_key(prefix, slot)));
        }
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
            st.computed = cached;
            if align {
                st.working_slot = Some(cumulative.saturating_sub(1) / bs);
            }
        }
        if write > 0 {
            let mut fresh = std::mem::take(&mut sc.fresh_ids);
            let slot = cumulative.saturating_sub(1) / bs;
            if align && st.working_slot != Some(slot) {
                // Enter the new block with a fresh working state; the previous blocks
                // stay this pass's input.
                for i in 0..sc.blocks {
                    let old = std::mem::replace(&mut st.working[i], fresh.pop().expect("reserved"));
                    st.hold_previous(sc.step, old);
                }
                st.working_slot = Some(slot);
                st.working_key = None;
            } else if align {
                // A published partial-tail state written again in its own block: its
                // checkpoint moves to a copy read through this pass.
                let prefix = st.working_key.take().expect("published working state");
                st.snapshot.clear();
                for slot in 0..sc.blocks {
                    let id = fresh.pop().expect("reserved");
                    self.pool.register_in(id, state_key(prefix, slot), None, Scope::Silent);
                    st.snapshot.push(id);
                }
                for &id in &st.working {
                    self.pool.unregister(id);
                }
                for i in 0..st.snapshot.len() {
                    let id = st.snapshot[i];
                    st.hold_step(&mut sc, id);
                }
                st.snapshot_prefix = Some(prefix);
                st.snapshot_step = sc.step;
                sc.published.push(prefix);
            } else {
                preserve(&mut self.pool, &mut sc, st, &mut fresh);
            }
            sc.fresh_ids = fresh;
        }
        debug_assert!(sc.fresh_ids.is_empty(), "every reserved block handed out");
        if restores {
            for i in reused..sc.hit_ids.len() {
                let id = sc.hit_ids[i];
                if !align {
                    // Copied into the working state at once: back to the cache (LRU tail).
                    self.pool.release_one(id);
                } else if !partial && i >= sc.hit_ids.len() - sc.blocks {
                    st.hold_previous(sc.step, id);
                } else {
                    st.hold_step(&mut sc, id);
                }
            }
        }
        self.state = Some(sc);
        true
    }

    /// [`boundary`](Self::boundary) while the state cache is taken out of `self`.
    fn boundary_with(&self, sc: &StateCache, seq: &Seq, tokens: u32) -> Option<u64> {
        let n = tokens as usize;
        match sc.align_unit {
            Some(unit) if tokens.is_multiple_of(unit) && tokens > 0 => {
                seq.state.as_ref()?.unit_hashes.get(n / unit as usize - 1).copied()
            }
            Some(_) => None,
            None => seq.hashes.get((n / self.block_size as usize).checked_sub(1)?).copied(),
        }
    }

    /// After request `key`'s pass computed through `computed` tokens. Default mode: gives
    /// back a preserved checkpoint it no longer reads and, on a block boundary (with prefix
    /// caching), publishes the working state as the new checkpoint, discarding the old.
    /// Align mode: publishes only at the prompt's last full block and its partial tail
    /// (with the partial page).
    pub(super) fn state_commit(&mut self, key: SeqKey, computed: u32) {
        let bs = self.block_size;
        let prefix_caching = self.prefix_caching;
        let Some(mut sc) = self.state.take() else { return };
        let prefix = {
            let seq = self.seq(key);
            let cacheable = match sc.align_unit {
                None => computed.is_multiple_of(bs),
                Some(unit) => {
                    let prompt = seq.prompt_len;
                    let tail = prompt / unit * unit;
                    let last_full = prompt.saturating_sub(1) / bs * bs;
                    computed == last_full || (computed == tail && !computed.is_multiple_of(bs))
                }
            };
            (prefix_caching && computed > 0 && cacheable)
                .then(|| self.boundary_with(&sc, seq, computed))
                .flatten()
        };
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        let Some(st) = seq.state.as_deref_mut() else {
            self.state = Some(sc);
            return;
        };
        if computed <= st.computed || st.working.is_empty() {
            self.state = Some(sc);
            return;
        }
        debug_assert!(st.working_key.is_none(), "a state write reserves its transition first");
        st.computed = computed;
        if sc.align_unit.is_none() && st.snapshot_owned {
            for &id in &st.snapshot {
                self.pool.release_one(id);
            }
            st.snapshot_owned = false;
        }
        if let Some(prefix) = prefix {
            if !computed.is_multiple_of(bs) {
                // The partial page is published with the state, under the boundary.
                let page = seq.blocks[(computed / bs) as usize];
                self.pool.register_or_alias(page, prefix);
            }
            if sc.align_unit.is_none() {
                if let Some(old) = st.snapshot_prefix {
                    for (slot, &id) in st.snapshot.iter().enumerate() {
                        self.pool.discard_inactive(id, state_key(old, slot));
                    }
                }
            }
            st.snapshot.clear();
            for (slot, &id) in st.working.iter().enumerate() {
                self.pool.register_in(id, state_key(prefix, slot), None, Scope::Silent);
            }
            st.snapshot.extend_from_slice(&st.working);
            st.working_key = Some(prefix);
            st.snapshot_prefix = Some(prefix);
            st.snapshot_step = sc.step;
            sc.published.push(prefix);
        }
        self.state = Some(sc);
    }

    /// Align mode: after the blocks of `[first, end)` of request `key` completed, a page
    /// already published under a partial boundary is also found by its block hash.
    pub(super) fn state_alias_completed(&mut self, key: SeqKey, first: u32, end: u32) {
        if self.state.as_ref().is_none_or(|sc| sc.align_unit.is_none()) {
            return;
        }
        let seq = self.seqs[key.0 as usize].as_ref().expect("live seq");
        for blk in first as usize..(end as usize).min(seq.hashes.len()).min(seq.blocks.len()) {
            let (id, hash) = (seq.blocks[blk], seq.hashes[blk]);
            if self.pool.registration(id).is_some_and(|h| h != hash) {
                self.pool.register_or_alias(id, hash);
            }
        }
    }

    /// Gives back what the request holds of the state cache (before its token blocks):
    /// blocks a pass read, a preserved checkpoint and the working state go to the cache
    /// if published, else free. On preemption a checkpoint published in this very pass
    /// is discarded too.
    pub(super) fn state_release(&mut self, key: SeqKey, preempted: bool) {
        let Some(sc) = self.state.as_mut() else { return };
        let step = sc.step;
        let seq = self.seqs[key.0 as usize].as_mut().expect("live seq");
        let Some(st) = seq.state.as_deref_mut() else { return };
        let pending = (preempted && st.snapshot_step == step)
            .then(|| st.snapshot_prefix.map(|p| (p, st.snapshot.clone())))
            .flatten();
        // In the reference's order: what a pass read, a preserved copy, the working state.
        for &id in &st.previous {
            self.pool.release_one(id);
        }
        st.previous.clear();
        if st.hold_step == step {
            for &i in &st.holds {
                if let Some(id) = sc.step_holds[i].take() {
                    self.pool.release_one(id);
                }
            }
        }
        st.holds.clear();
        st.working_slot = None;
        if st.snapshot_owned {
            for &id in &st.snapshot {
                self.pool.release_one(id);
            }
            st.snapshot_owned = false;
        }
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

/// Whether computing one decode token (to `len`, within the request's last block and,
/// with prefix caching, not completing it) leaves the state cache as it is, so the decode
/// fast path may take it: no published working state to preserve or copy, no preserved
/// checkpoint to give back, and in align mode no block change and nothing an earlier pass
/// read left to release. The state's token count then lags, which nothing reads until the
/// next write, and that one goes through the general path.
#[inline]
pub(super) fn decode_leaves_state(seq: &Seq, len: u32, bs: u32, align: bool) -> bool {
    seq.state.as_deref().is_some_and(|st| {
        st.working_key.is_none()
            && !st.snapshot_owned
            && !st.working.is_empty()
            && (!align || (st.previous.is_empty() && st.working_slot == Some((len - 1) / bs)))
    })
}

/// See [`VllmScheduler::state_write_blocks`].
fn write_blocks(sc: &StateCache, st: &SeqState, bs: u32, target: u32) -> usize {
    let needs = if sc.align_unit.is_some() {
        let slot = target.saturating_sub(1) / bs;
        target > st.computed
            && !st.working.is_empty()
            && (st.working_slot != Some(slot) || st.working_key.is_some())
    } else {
        target > st.computed && st.working_key.is_some()
    };
    if needs {
        sc.blocks
    } else {
        0
    }
}

/// Default mode: preserves the checkpoint the working state is published as in `S` blocks
/// popped from `fresh` (owned by the request until its pass ends), then takes the working
/// blocks private so they can be written.
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
        pool.register_in(id, state_key(prefix, slot), None, Scope::Silent);
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
