//! Which workers hold which blocks: one flat hash map from block (sequence) hash to a slot
//! of a worker bitset, so a prefix walk is one lookup and a few word operations per block
//! whatever the number of workers.

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

    /// Marks `hash` as held by `worker`.
    pub fn insert(&mut self, hash: u64, worker: usize) {
        let slot = match self.slots.get(&hash) {
            Some(&s) => s,
            None => {
                let s = match self.free.pop() {
                    Some(s) => s,
                    None => {
                        self.masks.resize(self.masks.len() + self.words, 0);
                        (self.masks.len() / self.words - 1) as u32
                    }
                };
                self.slots.insert(hash, s);
                s
            }
        };
        self.masks[slot as usize * self.words + worker / 64] |= 1 << (worker % 64);
    }

    /// Clears `worker` from `hash`; the entry goes when no worker holds it.
    pub fn remove(&mut self, hash: u64, worker: usize) {
        let Some(&slot) = self.slots.get(&hash) else { return };
        let base = slot as usize * self.words;
        self.masks[base + worker / 64] &= !(1 << (worker % 64));
        if self.masks[base..base + self.words].iter().all(|&m| m == 0) {
            self.slots.remove(&hash);
            self.free.push(slot);
        }
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
}
