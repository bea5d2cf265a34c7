//! Which workers hold which blocks: one flat hash map from block (sequence) hash to a slot
//! of a worker bitset, so a prefix walk is one lookup and a few word operations per block
//! whatever the number of workers.
//!
//! The index of live requests' blocks also keeps, per slot and worker, how many live
//! requests hold the block there ([`BlockIndex::acquire`] / [`BlockIndex::release`]), so
//! routing and freeing a request touch each block once, and freeing needs no hash lookup:
//! a request keeps the slot ids, which stay valid while any count on them is non-zero.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap;

/// Block hash -> set of workers.
#[derive(Debug)]
pub struct BlockIndex {
    /// u64 words per worker set.
    words: usize,
    num_workers: usize,
    slots: FxHashMap<u64, u32>,
    /// `words` words per slot.
    masks: Vec<u64>,
    /// Hash of each slot, to drop its map entry without the caller knowing it.
    slot_hash: Vec<u64>,
    /// `num_workers` live-request counts per slot (only for `acquire`/`release` users).
    counts: Vec<u32>,
    free: Vec<u32>,
    /// Scratch set of workers still matching during a walk.
    alive: Vec<u64>,
}

impl BlockIndex {
    /// An empty index over `num_workers` workers.
    pub fn new(num_workers: usize) -> Self {
        let words = num_workers.div_ceil(64).max(1);
        Self {
            words,
            num_workers,
            slots: FxHashMap::default(),
            masks: Vec::new(),
            slot_hash: Vec::new(),
            counts: Vec::new(),
            free: Vec::new(),
            alive: vec![0; words],
        }
    }

    /// Distinct blocks held by some worker.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The slot of `hash`, allocated (empty) if absent; one probe of the map.
    fn slot_of(&mut self, hash: u64, counted: bool) -> u32 {
        match self.slots.entry(hash) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(v) => {
                let s = match self.free.pop() {
                    Some(s) => {
                        self.slot_hash[s as usize] = hash;
                        s
                    }
                    None => {
                        self.masks.resize(self.masks.len() + self.words, 0);
                        self.slot_hash.push(hash);
                        if counted {
                            self.counts.resize(self.counts.len() + self.num_workers, 0);
                        }
                        (self.slot_hash.len() - 1) as u32
                    }
                };
                *v.insert(s)
            }
        }
    }

    fn mask_is_empty(&self, slot: u32) -> bool {
        let base = slot as usize * self.words;
        self.masks[base..base + self.words].iter().all(|&m| m == 0)
    }

    /// Marks `hash` as held by `worker`.
    pub fn insert(&mut self, hash: u64, worker: usize) {
        let slot = self.slot_of(hash, false);
        self.masks[slot as usize * self.words + worker / 64] |= 1 << (worker % 64);
    }

    /// Clears `worker` from `hash`; the entry goes when no worker holds it.
    pub fn remove(&mut self, hash: u64, worker: usize) {
        let Entry::Occupied(e) = self.slots.entry(hash) else { return };
        let slot = *e.get();
        let base = slot as usize * self.words;
        self.masks[base + worker / 64] &= !(1 << (worker % 64));
        if self.masks[base..base + self.words].iter().all(|&m| m == 0) {
            e.remove();
            self.free.push(slot);
        }
    }

    /// One more live request holds `hash` on `worker`: returns the block's slot (valid
    /// until the matching [`release`](Self::release)) and whether it is the first there.
    /// Do not mix with `insert`/`remove`/`clear_worker` on the same index.
    pub fn acquire(&mut self, hash: u64, worker: usize) -> (u32, bool) {
        let slot = self.slot_of(hash, true);
        let c = &mut self.counts[slot as usize * self.num_workers + worker];
        *c += 1;
        let first = *c == 1;
        if first {
            self.masks[slot as usize * self.words + worker / 64] |= 1 << (worker % 64);
        }
        (slot, first)
    }

    /// Undoes one [`acquire`](Self::acquire) of `slot` on `worker`; returns whether no
    /// live request holds the block there any more.
    pub fn release(&mut self, slot: u32, worker: usize) -> bool {
        let c = &mut self.counts[slot as usize * self.num_workers + worker];
        debug_assert!(*c > 0, "release without acquire");
        *c -= 1;
        if *c != 0 {
            return false;
        }
        self.masks[slot as usize * self.words + worker / 64] &= !(1 << (worker % 64));
        if self.mask_is_empty(slot) {
            self.slots.remove(&self.slot_hash[slot as usize]);
            self.free.push(slot);
        }
        true
    }

    /// Clears `worker` from every block (a cache reset).
    pub fn clear_worker(&mut self, worker: usize) {
        let held: Vec<u64> = self.slots.keys().copied().collect();
        for h in held {
            self.remove(h, worker);
        }
    }

    /// For each worker, how many leading blocks of `hashes` it holds, into `out`.
    pub fn prefix_overlaps(&mut self, hashes: &[u64], out: &mut [u32]) {
        out.fill(0);
        self.alive.fill(u64::MAX);
        let tail = self.num_workers % 64;
        if tail != 0 {
            self.alive[self.words - 1] = (1u64 << tail) - 1;
        }
        let mut depth = 0;
        for &h in hashes {
            let Some(&slot) = self.slots.get(&h) else { break };
            let base = slot as usize * self.words;
            let mut any = false;
            for (i, a) in self.alive.iter_mut().enumerate() {
                let mut dropped = *a & !self.masks[base + i];
                while dropped != 0 {
                    out[i * 64 + dropped.trailing_zeros() as usize] = depth;
                    dropped &= dropped - 1;
                }
                *a &= self.masks[base + i];
                any |= *a != 0;
            }
            depth += 1;
            if !any {
                return;
            }
        }
        for (i, &a) in self.alive.iter().enumerate() {
            let mut m = a;
            while m != 0 {
                out[i * 64 + m.trailing_zeros() as usize] = depth;
                m &= m - 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_walk_stops_per_worker_at_its_first_missing_block() {
        for n in [3, 64, 130] {
            let mut ix = BlockIndex::new(n);
            let last = n - 1;
            for h in [1, 2, 3] {
                ix.insert(h, 0);
            }
            ix.insert(1, last);
            ix.insert(3, last); // not a prefix: block 2 missing
            let mut out = vec![9; n];
            ix.prefix_overlaps(&[1, 2, 3, 4], &mut out);
            assert_eq!((out[0], out[1], out[last]), (3, 0, 1), "{n} workers");
            ix.remove(2, 0);
            ix.prefix_overlaps(&[1, 2, 3], &mut out);
            assert_eq!(out[0], 1);
            ix.clear_worker(0);
            ix.clear_worker(last);
            assert!(ix.is_empty());
            ix.insert(5, 1);
            assert_eq!(ix.len(), 1, "slots are reused");
        }
    }

    /// Counted index (acquire/release) and bitset index (insert/remove) against a
    /// BTreeMap model under random operation sequences, for 3, 64 and 70 workers.
    #[test]
    fn matches_a_simple_model_under_random_sequences() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        use std::collections::BTreeMap;

        for n in [3usize, 64, 70] {
            let mut rng = StdRng::seed_from_u64(n as u64);
            let mut held = BlockIndex::new(n);
            let mut held_model: BTreeMap<(u64, usize), u32> = BTreeMap::new();
            // Live "requests": worker and acquired (hash, slot) pairs.
            let mut live: Vec<(usize, Vec<(u64, u32)>)> = Vec::new();
            let mut cached = BlockIndex::new(n);
            let mut cached_model: BTreeMap<u64, Vec<bool>> = BTreeMap::new();
            let mut out = vec![0; n];
            for _ in 0..4000 {
                match rng.random_range(0..5) {
                    0 | 1 => {
                        let w = rng.random_range(0..n);
                        let len = rng.random_range(0..6);
                        let blocks: Vec<(u64, u32)> = (0..len)
                            .map(|_| {
                                let h = rng.random_range(0..20);
                                let (slot, first) = held.acquire(h, w);
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
                            assert_eq!(held.release(slot, w), last);
                        }
                    }
                    3 => {
                        let (h, w) = (rng.random_range(0..20), rng.random_range(0..n));
                        cached.insert(h, w);
                        cached_model.entry(h).or_insert_with(|| vec![false; n])[w] = true;
                    }
                    _ => {
                        let (h, w) = (rng.random_range(0..20), rng.random_range(0..n));
                        cached.remove(h, w);
                        if let Some(ws) = cached_model.get_mut(&h) {
                            ws[w] = false;
                            if ws.iter().all(|&b| !b) {
                                cached_model.remove(&h);
                            }
                        }
                    }
                }
                let distinct: std::collections::BTreeSet<u64> = held_model.keys().map(|k| k.0).collect();
                assert_eq!(held.len(), distinct.len());
                assert_eq!(cached.len(), cached_model.len());
                let probe: Vec<u64> = (0..rng.random_range(0..6)).map(|_| rng.random_range(0..20)).collect();
                held.prefix_overlaps(&probe, &mut out);
                for (w, &o) in out.iter().enumerate() {
                    let want = probe.iter().take_while(|&&h| held_model.contains_key(&(h, w))).count();
                    assert_eq!(o as usize, want, "held, {n} workers");
                }
                cached.prefix_overlaps(&probe, &mut out);
                for (w, &o) in out.iter().enumerate() {
                    let want =
                        probe.iter().take_while(|&&h| cached_model.get(&h).is_some_and(|ws| ws[w])).count();
                    assert_eq!(o as usize, want, "cached, {n} workers");
                }
            }
        }
    }
}
