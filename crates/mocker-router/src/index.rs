//! Which workers cache which blocks and which live requests hold them: one flat hash map
//! from block (sequence) hash to the set of workers caching it (from KV events) and, for a
//! router that tracks holds, the set of workers where live routed requests hold it. A
//! held bit stands for one live request; only a (block, worker) pair held by more keeps a
//! count, in a small side map (most held blocks have one holder per worker, and a row of
//! counts per held block was a quarter of a 64-worker replay's working set and three
//! cache misses per acquire and release). A route walks the prompt's prefix once for both
//! overlaps, and a prefix walk costs one lookup and a few word operations per block
//! whatever the number of workers.
//!
//! Two layouts: a router without holds over at most 64 workers keeps (hash, cached set)
//! pairs in the table itself, so a probe reads the table's own cache lines; otherwise the
//! table maps a hash to a slot, whose record holds the sets. A slot lives while any worker
//! caches it or any live request holds it, so a request keeps its blocks' slot ids and
//! freeing needs no hash lookup.

use std::collections::hash_map::Entry;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use mocker_core::kv::prefetch;
use rustc_hash::{FxBuildHasher, FxHashMap};

/// Entries from which a full table grows straight toward the expected size.
const GROW_AT_ONCE_FROM: usize = 3_584;

/// The table's hash of a block hash (already well mixed: one multiply is enough).
#[inline]
fn key(hash: u64) -> u64 {
    FxBuildHasher.hash_one(hash)
}

/// The side-map key of `slot` held on `worker`.
#[inline]
fn holder_key(slot: u32, worker: usize) -> u64 {
    u64::from(slot) << 32 | worker as u64
}

/// Block hash -> cached (and held) worker sets.
#[derive(Debug)]
pub struct BlockIndex {
    /// u64 words per worker set.
    words: usize,
    num_workers: usize,
    store: Store,
    /// Most distinct blocks the workers' pools can cache together (0: unknown), the size
    /// the table grows to once a run outgrows its first one (see `make_room`).
    expected: usize,
    /// Scratch sets of workers still matching during a walk.
    alive_cached: Vec<u64>,
    alive_held: Vec<u64>,
    /// Slots an event's blocks were found at (`NO_SLOT`: absent), between the probes and
    /// the changes of [`insert_all`](Self::insert_all) and [`remove_all`](Self::remove_all).
    probed: Vec<u32>,
}

/// Marks a block [`BlockIndex::probed`] absent.
const NO_SLOT: u32 = u32::MAX;

#[derive(Debug)]
enum Store {
    /// (block hash, cached set) entries: no holds, one word of workers. A probe that finds
    /// its block has the set in hand; through a slot it would read two more cache lines
    /// (the slot, then the record), which were a third of the misses of a router's events.
    Flat(HashTable<(u64, u64)>),
    /// Slots of records, for holds or more than 64 workers.
    Slotted(Slotted),
}

#[derive(Debug)]
struct Slotted {
    /// The slot of each block, keyed by its record's hash: 4-byte entries instead of
    /// (hash, slot) pairs keep the table a quarter of the size, and its probes in cache.
    slots: HashTable<u32>,
    /// One record of `stride` words per slot: its block hash (to confirm a probe, and to
    /// drop its map entry without the caller knowing it), the cached set, then the held
    /// set. Side by side, the read that confirms a probe brings the sets into cache too.
    records: Vec<u64>,
    /// `1 + 2 * words`, or `1 + words` without holds.
    stride: usize,
    /// Live requests beyond the first holding a slot on a worker, keyed by
    /// [`holder_key`]: present only while two or more do (the held bit is the first).
    extra_holders: FxHashMap<u64, u32>,
    free: Vec<u32>,
}

/// Records depth `depth` into `out` for the workers of `alive` missing from `mask`, and
/// narrows `alive` to `mask`; returns whether any worker is still alive in this word.
#[inline]
fn narrow(alive: &mut u64, mask: u64, word: usize, out: &mut [u32], depth: u32) -> bool {
    let mut dropped = *alive & !mask;
    while dropped != 0 {
        out[word * 64 + dropped.trailing_zeros() as usize] = depth;
        dropped &= dropped - 1;
    }
    *alive &= mask;
    *alive != 0
}

fn flush(alive: &[u64], out: &mut [u32], depth: u32) {
    for (i, &a) in alive.iter().enumerate() {
        let mut m = a;
        while m != 0 {
            out[i * 64 + m.trailing_zeros() as usize] = depth;
            m &= m - 1;
        }
    }
}

impl BlockIndex {
    /// An empty index over `num_workers` workers; with `holds`, it also tracks which live
    /// requests hold each block ([`acquire`](Self::acquire)), else it keeps no held sets
    /// (a router that never asks saves their memory and cache misses).
    pub fn new(num_workers: usize, holds: bool) -> Self {
        let words = num_workers.div_ceil(64).max(1);
        let store = if !holds && words == 1 {
            Store::Flat(HashTable::new())
        } else {
            Store::Slotted(Slotted {
                slots: HashTable::new(),
                records: Vec::new(),
                stride: 1 + words * if holds { 2 } else { 1 },
                extra_holders: FxHashMap::default(),
                free: Vec::new(),
            })
        };
        Self {
            words,
            num_workers,
            store,
            expected: 0,
            alive_cached: vec![0; words],
            alive_held: vec![0; words],
            probed: Vec::new(),
        }
    }

    /// Tells the index how many distinct blocks its workers can cache at most (the sum
    /// of their pools). Doubling to that size rehashed every entry (and faulted in a new
    /// table's pages) about a dozen times, a third of a long replay's page faults; a
    /// table that fills its first few thousand entries grows there in one step instead,
    /// while a short run's stays small.
    pub fn expect_blocks(&mut self, blocks: usize) {
        self.expected = blocks;
    }

    /// Makes room for one more entry: a full table that has reached a few thousand grows
    /// toward `expected` at once (sixteenfold at most), else as hashbrown would.
    #[inline]
    fn make_room(&mut self) {
        let expected = self.expected;
        let room = |len: usize| {
            if expected > len && len >= GROW_AT_ONCE_FROM {
                expected.min(len.saturating_mul(16)) - len
            } else {
                1
            }
        };
        match &mut self.store {
            Store::Flat(t) if t.len() == t.capacity() => t.reserve(room(t.len()), |e| key(e.0)),
            Store::Slotted(s) if s.slots.len() == s.slots.capacity() => {
                let (records, stride) = (&s.records, s.stride);
                s.slots.reserve(room(s.slots.len()), |&x| key(records[x as usize * stride]));
            }
            _ => {}
        }
    }

    /// Distinct blocks cached or held on some worker.
    pub fn len(&self) -> usize {
        match &self.store {
            Store::Flat(t) => t.len(),
            Store::Slotted(s) => s.slots.len(),
        }
    }

    /// Whether no block is cached or held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Marks `hash` as cached on `worker` (a Stored event).
    pub fn insert(&mut self, hash: u64, worker: usize) {
        self.make_room();
        match &mut self.store {
            Store::Flat(t) => {
                let mut entry = t.entry(key(hash), |e| e.0 == hash, |e| key(e.0)).or_insert((hash, 0));
                entry.get_mut().1 |= 1 << worker;
            }
            Store::Slotted(s) => {
                let slot = s.slot_of(hash);
                let i = s.cached_word(slot, worker);
                s.records[i] |= 1 << (worker % 64);
            }
        }
    }

    /// [`insert`](Self::insert) of every block of `hashes` (a Stored event's). With slots,
    /// every block is probed before any changes: the probes do not wait on one another, so
    /// their cache misses overlap (one at a time, they were most of applying an event).
    pub fn insert_all(&mut self, hashes: impl Iterator<Item = u64> + Clone, worker: usize) {
        let Store::Slotted(s) = &self.store else {
            return hashes.for_each(|h| self.insert(h, worker));
        };
        self.probed.clear();
        self.probed.extend(hashes.clone().map(|h| s.find(h).unwrap_or(NO_SLOT)));
        let probed = std::mem::take(&mut self.probed);
        for (h, &slot) in hashes.zip(&probed) {
            if slot == NO_SLOT {
                self.insert(h, worker); // a new block: one probe more, to enter it
            } else {
                let s = self.slotted();
                let i = s.cached_word(slot, worker);
                s.records[i] |= 1 << (worker % 64);
            }
        }
        self.probed = probed;
    }

    /// [`remove`](Self::remove) of every block of `hashes` (a Removed event's), probing
    /// them all first as [`insert_all`](Self::insert_all) does.
    pub fn remove_all(&mut self, hashes: &[u64], worker: usize) {
        let Store::Slotted(s) = &mut self.store else {
            return hashes.iter().for_each(|&h| self.remove(h, worker));
        };
        self.probed.clear();
        self.probed.extend(hashes.iter().map(|&h| s.find(h).unwrap_or(NO_SLOT)));
        for &slot in &self.probed {
            // A slot this event already dropped (its hash listed twice) names nobody.
            if slot == NO_SLOT || s.unused(slot) {
                continue;
            }
            let i = s.cached_word(slot, worker);
            s.records[i] &= !(1 << (worker % 64));
            if s.unused(slot) {
                s.drop_slot(slot);
            }
        }
    }

    /// Clears `worker` from the cached set of `hash` (a Removed event); the entry goes
    /// when no worker caches it and no live request holds it. One probe.
    pub fn remove(&mut self, hash: u64, worker: usize) {
        match &mut self.store {
            Store::Flat(t) => {
                if let Ok(mut e) = t.find_entry(key(hash), |e| e.0 == hash) {
                    let set = &mut e.get_mut().1;
                    *set &= !(1 << worker);
                    if *set == 0 {
                        e.remove();
                    }
                }
            }
            Store::Slotted(s) => s.remove(hash, worker),
        }
    }

    /// One more live request holds `hash` on `worker`: returns the block's slot (valid
    /// until the matching [`release`](Self::release)) and whether it is the first there.
    /// Only for an index built with holds.
    pub fn acquire(&mut self, hash: u64, worker: usize) -> (u32, bool) {
        self.make_room();
        let s = self.slotted();
        let slot = s.slot_of(hash);
        (slot, self.acquire_slot(slot, worker))
    }

    /// [`acquire`](Self::acquire) of a block whose slot a walk just found (no lookup).
    pub fn acquire_slot(&mut self, slot: u32, worker: usize) -> bool {
        let words = self.words;
        let s = self.slotted();
        let i = s.held_word(slot, words, worker);
        let bit = 1 << (worker % 64);
        if s.records[i] & bit == 0 {
            s.records[i] |= bit;
            return true;
        }
        *s.extra_holders.entry(holder_key(slot, worker)).or_insert(0) += 1;
        false
    }

    /// Undoes one [`acquire`](Self::acquire) of `slot` on `worker`; returns whether no
    /// live request holds the block there any more.
    pub fn release(&mut self, slot: u32, worker: usize) -> bool {
        let words = self.words;
        let s = self.slotted();
        if !s.extra_holders.is_empty() {
            if let Entry::Occupied(mut e) = s.extra_holders.entry(holder_key(slot, worker)) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
                return false;
            }
        }
        let i = s.held_word(slot, words, worker);
        debug_assert!(s.records[i] & (1 << (worker % 64)) != 0, "release without acquire");
        s.records[i] &= !(1 << (worker % 64));
        if s.unused(slot) {
            s.drop_slot(slot);
        }
        true
    }

    /// [`release`](Self::release) of each of `slots` on `worker`; returns how many blocks
    /// no live request holds there any more. The slots are known up front, so their records
    /// are asked for before any is changed and their cache misses overlap.
    pub fn release_all(&mut self, slots: &[u32], worker: usize) -> u64 {
        if slots.is_empty() {
            return 0; // also an index without holds, whose requests hold no slots
        }
        let s = self.slotted();
        for &slot in slots {
            prefetch(&s.records[slot as usize * s.stride]);
        }
        slots.iter().map(|&slot| u64::from(self.release(slot, worker))).sum()
    }

    /// The slotted store; holds exist only there (see [`new`](Self::new)).
    fn slotted(&mut self) -> &mut Slotted {
        match &mut self.store {
            Store::Slotted(s) => s,
            Store::Flat(_) => unreachable!("holds on an index built without them"),
        }
    }

    /// Workers the sets can name.
    pub fn num_workers(&self) -> usize {
        self.num_workers
    }

    /// Widens every set by one worker, who caches and holds nothing yet (a worker joining a
    /// scaled pool). Slots keep their numbers, so live requests' slots stay valid; rare
    /// (a topology change), so it may rewrite the whole index.
    pub fn add_worker(&mut self) {
        let (old_n, old_words) = (self.num_workers, self.words);
        let n = old_n + 1;
        let words = n.div_ceil(64).max(1);
        self.num_workers = n;
        self.words = words;
        self.alive_cached = vec![0; words];
        self.alive_held = vec![0; words];
        if words == old_words {
            return;
        }
        match &mut self.store {
            Store::Flat(t) => {
                // A flat table holds no held sets (and so no slots anyone kept).
                let mut s = Slotted {
                    slots: HashTable::new(),
                    records: Vec::new(),
                    stride: 1 + words,
                    extra_holders: FxHashMap::default(),
                    free: Vec::new(),
                };
                for &(hash, mask) in t.iter() {
                    let slot = s.slot_of(hash);
                    s.records[slot as usize * s.stride + 1] = mask;
                }
                self.store = Store::Slotted(s);
            }
            Store::Slotted(s) => {
                let holds = s.stride == 1 + 2 * old_words;
                let stride = 1 + words * if holds { 2 } else { 1 };
                let slots = s.records.len() / s.stride;
                let mut records = vec![0; slots * stride];
                for slot in 0..slots {
                    let (from, to) = (slot * s.stride, slot * stride);
                    records[to] = s.records[from];
                    records[to + 1..to + 1 + old_words]
                        .copy_from_slice(&s.records[from + 1..from + 1 + old_words]);
                    if holds {
                        let (hf, ht) = (from + 1 + old_words, to + 1 + words);
                        records[ht..ht + old_words].copy_from_slice(&s.records[hf..hf + old_words]);
                    }
                }
                s.records = records;
                s.stride = stride;
            }
        }
    }

    /// Clears `worker` from every block's cached set (a cache reset).
    pub fn clear_worker(&mut self, worker: usize) {
        match &mut self.store {
            Store::Flat(t) => t.retain(|e| {
                e.1 &= !(1 << worker);
                e.1 != 0
            }),
            Store::Slotted(s) => {
                let (stride, records, free) = (s.stride, &mut s.records, &mut s.free);
                s.slots.retain(|&mut slot| {
                    records[slot as usize * stride + 1 + worker / 64] &= !(1 << (worker % 64));
                    let keep = !Slotted::unused_in(records, stride, slot);
                    if !keep {
                        free.push(slot);
                    }
                    keep
                });
            }
        }
    }

    /// For each worker, how many leading blocks of `hashes` it caches (into `cached`) and,
    /// with `held`, how many live requests on it hold; with holds, the slots of the walked
    /// prefix go to `found` (valid until the index next changes), so admitting the request
    /// probes only the blocks beyond it (without holds `found` is left empty).
    pub fn prefix_overlaps(
        &mut self,
        hashes: &[u64],
        cached: &mut [u32],
        mut held: Option<&mut [u32]>,
        found: &mut Vec<u32>,
    ) {
        let w = self.words;
        let full = |alive: &mut Vec<u64>, n: usize| {
            alive.fill(u64::MAX);
            if !n.is_multiple_of(64) {
                alive[w - 1] = (1u64 << (n % 64)) - 1;
            }
        };
        cached.fill(0);
        full(&mut self.alive_cached, self.num_workers);
        match held.as_deref_mut() {
            Some(h) => {
                h.fill(0);
                full(&mut self.alive_held, self.num_workers);
            }
            None => self.alive_held.fill(0),
        }
        found.clear();
        let mut depth = 0;
        match &self.store {
            Store::Flat(t) => {
                debug_assert!(held.is_none(), "held overlaps from an index without holds");
                let alive = &mut self.alive_cached[0];
                for &h in hashes {
                    let Some(&(_, mask)) = t.find(key(h), |e| e.0 == h) else { break };
                    let any = narrow(alive, mask, 0, cached, depth);
                    depth += 1;
                    if !any {
                        return;
                    }
                }
            }
            Store::Slotted(s) => {
                // Probes first (each confirms its block on the record, bringing the sets
                // into cache), in a loop whose loads do not depend on one another so the
                // misses of successive blocks overlap; then the sets. Interleaved, the
                // narrowing's branches kept fewer blocks' misses in flight. A block past
                // the point where every worker dropped out is still found (its slot spares
                // admission a probe).
                for &h in hashes {
                    let Some(slot) = s.find(h) else { break };
                    found.push(slot);
                }
                for &slot in found.iter() {
                    let base = slot as usize * s.stride + 1;
                    let mut any = false;
                    for i in 0..w {
                        any |= narrow(&mut self.alive_cached[i], s.records[base + i], i, cached, depth);
                        if let Some(out) = held.as_deref_mut() {
                            any |= narrow(&mut self.alive_held[i], s.records[base + w + i], i, out, depth);
                        }
                    }
                    depth += 1;
                    if !any {
                        return;
                    }
                }
            }
        }
        flush(&self.alive_cached, cached, depth);
        if let Some(out) = held {
            flush(&self.alive_held, out, depth);
        }
    }
}

impl Slotted {
    /// The slot of `hash`, allocated (empty) if absent; one probe of the map.
    fn slot_of(&mut self, hash: u64) -> u32 {
        let (records, stride) = (&self.records, self.stride);
        let entry = self.slots.entry(
            key(hash),
            |&s| records[s as usize * stride] == hash,
            |&s| key(records[s as usize * stride]),
        );
        match entry {
            hashbrown::hash_table::Entry::Occupied(e) => *e.get(),
            hashbrown::hash_table::Entry::Vacant(e) => {
                let s = match self.free.pop() {
                    Some(s) => {
                        // A freed slot's sets are empty (see `unused`).
                        self.records[s as usize * stride] = hash;
                        s
                    }
                    None => {
                        self.records.push(hash);
                        self.records.resize(self.records.len() + stride - 1, 0);
                        (self.records.len() / stride - 1) as u32
                    }
                };
                e.insert(s);
                s
            }
        }
    }

    /// The slot of `hash`, if some worker caches it or some live request holds it.
    #[inline]
    fn find(&self, hash: u64) -> Option<u32> {
        let (records, stride) = (&self.records, self.stride);
        self.slots.find(key(hash), |&s| records[s as usize * stride] == hash).copied()
    }

    /// Drops the table entry of `slot` and frees it.
    fn drop_slot(&mut self, slot: u32) {
        let hash = self.records[slot as usize * self.stride];
        if let Ok(e) = self.slots.find_entry(key(hash), |&s| s == slot) {
            e.remove();
        }
        self.free.push(slot);
    }

    /// Whether neither set of `slot` names a worker.
    fn unused(&self, slot: u32) -> bool {
        Self::unused_in(&self.records, self.stride, slot)
    }

    fn unused_in(records: &[u64], stride: usize, slot: u32) -> bool {
        let base = slot as usize * stride + 1;
        records[base..base + stride - 1].iter().all(|&m| m == 0)
    }

    /// Index of the word of `slot`'s cached set holding `worker`.
    #[inline]
    fn cached_word(&self, slot: u32, worker: usize) -> usize {
        slot as usize * self.stride + 1 + worker / 64
    }

    /// Index of the word of `slot`'s held set holding `worker`, with `words` words a set.
    #[inline]
    fn held_word(&self, slot: u32, words: usize, worker: usize) -> usize {
        debug_assert!(self.stride == 1 + 2 * words, "an index built without holds");
        slot as usize * self.stride + 1 + words + worker / 64
    }

    /// See [`BlockIndex::remove`].
    fn remove(&mut self, hash: u64, worker: usize) {
        let (records, stride) = (&mut self.records, self.stride);
        let Ok(entry) = self.slots.find_entry(key(hash), |&s| records[s as usize * stride] == hash) else {
            return;
        };
        let slot = *entry.get();
        records[slot as usize * stride + 1 + worker / 64] &= !(1 << (worker % 64));
        if Self::unused_in(records, stride, slot) {
            entry.remove();
            self.free.push(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_walk_stops_per_worker_at_its_first_missing_block() {
        // With and without held sets: slotted records of either width, or the flat table.
        for (n, holds) in [3, 64, 130].into_iter().flat_map(|n| [(n, true), (n, false)]) {
            let mut ix = BlockIndex::new(n, holds);
            let last = n - 1;
            for h in [1, 2, 3] {
                ix.insert(h, 0);
            }
            ix.insert(1, last);
            ix.insert(3, last); // not a prefix: block 2 missing
            let (mut out, mut found) = (vec![9; n], Vec::new());
            ix.prefix_overlaps(&[1, 2, 3, 4], &mut out, None, &mut found);
            assert_eq!((out[0], out[1], out[last]), (3, 0, 1), "{n} workers");
            // The walk goes on while worker 0 matches; only slots are reported.
            let slotted = holds || n > 64;
            assert_eq!(found.len(), if slotted { 3 } else { 0 }, "{n} workers");
            ix.remove(2, 0);
            ix.prefix_overlaps(&[1, 2, 3], &mut out, None, &mut found);
            assert_eq!(out[0], 1);
            ix.clear_worker(0);
            ix.clear_worker(last);
            assert!(ix.is_empty());
            ix.insert(5, 1);
            assert_eq!(ix.len(), 1, "slots are reused");
        }
    }

    #[test]
    fn an_event_listing_a_block_twice_frees_its_slot_once() {
        for (n, holds) in [(3, true), (70, false)] {
            let mut ix = BlockIndex::new(n, holds);
            ix.insert_all([1, 2].into_iter(), 0);
            ix.remove_all(&[1, 1], 0);
            // A slot freed twice would be handed to both new blocks.
            ix.insert_all([3, 4].into_iter(), 0);
            let (mut out, mut found) = (vec![0; n], Vec::new());
            ix.prefix_overlaps(&[3, 4], &mut out, None, &mut found);
            assert_eq!(out[0], 2, "{n} workers");
            ix.prefix_overlaps(&[2], &mut out, None, &mut found);
            assert_eq!((out[0], ix.len()), (1, 3), "{n} workers");
        }
    }

    #[test]
    fn an_index_told_its_size_grows_past_its_first_table_and_keeps_every_block() {
        // Past a few thousand entries the table jumps toward the expected size: every
        // block must still be found, for both stores, through removals and reinsertion.
        for (n, holds) in [(3, false), (3, true), (130, false)] {
            let mut ix = BlockIndex::new(n, holds);
            ix.expect_blocks(30_000);
            // Hashes unlike the slot numbers, so a growth rehashing by slot would lose them.
            let chain = |w: usize| (0..8_000u64).map(move |i| (w as u64 + 1) << 40 | i);
            for w in [0, n - 1] {
                chain(w).for_each(|h| ix.insert(h, w));
            }
            assert_eq!(ix.len(), 16_000);
            // Half of worker 0's blocks go (tombstones), then come back.
            chain(0).skip(4_000).for_each(|h| ix.remove(h, 0));
            assert_eq!(ix.len(), 12_000);
            let (mut out, mut found) = (vec![9; n], Vec::new());
            let first: Vec<u64> = chain(0).collect();
            ix.prefix_overlaps(&first, &mut out, None, &mut found);
            assert_eq!(out[0], 4_000, "{n} workers, holds {holds}");
            chain(0).skip(4_000).for_each(|h| ix.insert(h, 0));
            ix.prefix_overlaps(&first, &mut out, None, &mut found);
            assert_eq!(out[0], 8_000, "{n} workers, holds {holds}");
            let last: Vec<u64> = chain(n - 1).collect();
            ix.prefix_overlaps(&last, &mut out, None, &mut found);
            assert_eq!(out[n - 1], 8_000, "{n} workers, holds {holds}");
        }
    }

    /// A slot outlives its last cached copy while a live request holds it, and the
    /// other way round.
    #[test]
    fn a_slot_lives_while_cached_or_held() {
        let mut ix = BlockIndex::new(2, true);
        ix.insert(7, 0);
        let (slot, first) = ix.acquire(7, 1);
        assert!(first);
        ix.remove(7, 0);
        assert_eq!(ix.len(), 1, "still held");
        ix.insert(7, 1);
        assert!(ix.release(slot, 1));
        assert_eq!(ix.len(), 1, "still cached");
        ix.clear_worker(1);
        assert!(ix.is_empty());
    }

    /// The merged index against BTreeMap models of the cached sets and of the live
    /// requests' counts, under random routes (walk, then acquire through the found
    /// slots), frees, Stored, Removed and Cleared, for 3, 64 and 70 workers.
    #[test]
    fn matches_a_simple_model_under_random_sequences() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        use std::collections::{BTreeMap, BTreeSet};

        for n in [3usize, 64, 70] {
            let mut rng = StdRng::seed_from_u64(n as u64);
            let mut ix = BlockIndex::new(n, true);
            let mut held_model: BTreeMap<(u64, usize), u32> = BTreeMap::new();
            // Live "requests": worker and acquired (hash, slot) pairs.
            let mut live: Vec<(usize, Vec<(u64, u32)>)> = Vec::new();
            let mut cached_model: BTreeSet<(u64, usize)> = BTreeSet::new();
            let (mut out, mut out_held, mut found) = (vec![0; n], vec![0; n], Vec::new());
            let check = |ix: &mut BlockIndex,
                         probe: &[u64],
                         held_model: &BTreeMap<(u64, usize), u32>,
                         cached_model: &BTreeSet<(u64, usize)>,
                         out: &mut Vec<u32>,
                         out_held: &mut Vec<u32>,
                         found: &mut Vec<u32>| {
                ix.prefix_overlaps(probe, out, Some(out_held), found);
                for w in 0..n {
                    let want = probe.iter().take_while(|&&h| held_model.contains_key(&(h, w))).count();
                    assert_eq!(out_held[w] as usize, want, "held, {n} workers");
                    let want = probe.iter().take_while(|&&h| cached_model.contains(&(h, w))).count();
                    assert_eq!(out[w] as usize, want, "cached, {n} workers");
                }
                let deepest = out.iter().chain(out_held.iter()).copied().max().unwrap_or(0) as usize;
                assert!(found.len() >= deepest && found.len() <= probe.len());
            };
            for _ in 0..4000 {
                match rng.random_range(0..6) {
                    0 | 1 => {
                        let w = rng.random_range(0..n);
                        let probe: Vec<u64> =
                            (0..rng.random_range(0..6)).map(|_| rng.random_range(0..20)).collect();
                        check(
                            &mut ix,
                            &probe,
                            &held_model,
                            &cached_model,
                            &mut out,
                            &mut out_held,
                            &mut found,
                        );
                        let walked = found.clone();
                        let blocks: Vec<(u64, u32)> = probe
                            .iter()
                            .enumerate()
                            .map(|(i, &h)| {
                                let (slot, first) = match walked.get(i) {
                                    Some(&s) => (s, ix.acquire_slot(s, w)),
                                    None => ix.acquire(h, w),
                                };
                                let c = held_model.entry((h, w)).or_insert(0);
                                *c += 1;
                                assert_eq!(first, *c == 1);
                                (h, slot)
                            })
                            .collect();
                        live.push((w, blocks));
                    }
                    2 if !live.is_empty() => {
                        let (w, blocks) = live.swap_remove(rng.random_range(0..live.len()));
                        for (h, slot) in blocks {
                            let c = held_model.get_mut(&(h, w)).unwrap();
                            *c -= 1;
                            let last = *c == 0;
                            if last {
                                held_model.remove(&(h, w));
                            }
                            assert_eq!(ix.release(slot, w), last);
                        }
                    }
                    3 => {
                        // One block, or an event's list (repeats included).
                        let w = rng.random_range(0..n);
                        let hs: Vec<u64> =
                            (0..rng.random_range(1..5)).map(|_| rng.random_range(0..20)).collect();
                        if hs.len() == 1 {
                            ix.insert(hs[0], w);
                        } else {
                            ix.insert_all(hs.iter().copied(), w);
                        }
                        hs.iter().for_each(|&h| _ = cached_model.insert((h, w)));
                    }
                    4 => {
                        let w = rng.random_range(0..n);
                        let hs: Vec<u64> =
                            (0..rng.random_range(1..5)).map(|_| rng.random_range(0..20)).collect();
                        if hs.len() == 1 {
                            ix.remove(hs[0], w);
                        } else {
                            ix.remove_all(&hs, w);
                        }
                        hs.iter().for_each(|&h| _ = cached_model.remove(&(h, w)));
                    }
                    _ if rng.random_range(0..20) == 0 => {
                        let w = rng.random_range(0..n);
                        ix.clear_worker(w);
                        cached_model.retain(|&(_, x)| x != w);
                    }
                    _ => {}
                }
                let distinct: BTreeSet<u64> =
                    held_model.keys().map(|k| k.0).chain(cached_model.iter().map(|k| k.0)).collect();
                assert_eq!(ix.len(), distinct.len());
                let shared = held_model.values().filter(|&&c| c > 1).count();
                assert_eq!(ix.slotted().extra_holders.len(), shared, "counts only for shared holds");
                let probe: Vec<u64> = (0..rng.random_range(0..6)).map(|_| rng.random_range(0..20)).collect();
                check(&mut ix, &probe, &held_model, &cached_model, &mut out, &mut out_held, &mut found);
                ix.prefix_overlaps(&probe, &mut out, None, &mut found);
                for (w, &o) in out.iter().enumerate() {
                    let want = probe.iter().take_while(|&&h| cached_model.contains(&(h, w))).count();
                    assert_eq!(o as usize, want, "cached only, {n} workers");
                }
            }
        }
    }

    /// Without holds (the flat table up to 64 workers, slots beyond): cached sets against
    /// a BTreeSet model under random Stored, Removed, Cleared and walks.
    #[test]
    fn without_holds_matches_a_simple_model() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        use std::collections::BTreeSet;

        for n in [1usize, 3, 64, 70] {
            let mut rng = StdRng::seed_from_u64(100 + n as u64);
            let mut ix = BlockIndex::new(n, false);
            assert_eq!(matches!(ix.store, Store::Flat(_)), n <= 64, "{n} workers");
            let mut model: BTreeSet<(u64, usize)> = BTreeSet::new();
            let (mut out, mut found) = (vec![0; n], Vec::new());
            for _ in 0..4000 {
                let (h, w) = (rng.random_range(0..20), rng.random_range(0..n));
                let hs: Vec<u64> = (0..rng.random_range(1..4)).map(|_| rng.random_range(0..20)).collect();
                match rng.random_range(0..10) {
                    0 | 1 => {
                        ix.insert(h, w);
                        model.insert((h, w));
                    }
                    2 | 3 => {
                        ix.insert_all(hs.iter().copied(), w);
                        hs.iter().for_each(|&h| _ = model.insert((h, w)));
                    }
                    4 | 5 => {
                        ix.remove(h, w);
                        model.remove(&(h, w));
                    }
                    6 => {
                        ix.remove_all(&hs, w);
                        hs.iter().for_each(|&h| _ = model.remove(&(h, w)));
                    }
                    7 if rng.random_range(0..10) == 0 => {
                        ix.clear_worker(w);
                        model.retain(|&(_, x)| x != w);
                    }
                    _ => {}
                }
                let distinct: BTreeSet<u64> = model.iter().map(|k| k.0).collect();
                assert_eq!(ix.len(), distinct.len(), "{n} workers");
                let probe: Vec<u64> = (0..rng.random_range(0..6)).map(|_| rng.random_range(0..20)).collect();
                ix.prefix_overlaps(&probe, &mut out, None, &mut found);
                for (w, &o) in out.iter().enumerate() {
                    let want = probe.iter().take_while(|&&h| model.contains(&(h, w))).count();
                    assert_eq!(o as usize, want, "{n} workers, worker {w}");
                }
            }
        }
    }

    #[test]
    fn added_workers_keep_every_set_and_slot() {
        // Across the 64-worker word boundary, with and without held sets.
        for holds in [false, true] {
            let mut ix = BlockIndex::new(63, holds);
            ix.insert(7, 0);
            ix.insert(7, 62);
            ix.insert(8, 62);
            let held = holds.then(|| ix.acquire(7, 5));
            for _ in 0..3 {
                ix.add_worker();
            }
            assert_eq!(ix.num_workers(), 66);
            ix.insert(7, 65);
            let (mut out, mut found) = (vec![0; 66], Vec::new());
            let mut held_out = vec![0; 66];
            let h = holds.then_some(&mut held_out[..]);
            ix.prefix_overlaps(&[7, 8], &mut out, h, &mut found);
            assert_eq!((out[0], out[62], out[65], out[64]), (1, 2, 1, 0), "holds {holds}");
            if let Some((slot, _)) = held {
                assert_eq!(held_out[5], 1);
                // The slot taken before the growth still releases the block.
                assert!(ix.release(slot, 5));
            }
            ix.clear_worker(62);
            ix.prefix_overlaps(&[7, 8], &mut out, None, &mut found);
            assert_eq!((out[0], out[62], out[65]), (1, 0, 1));
        }
    }
}
