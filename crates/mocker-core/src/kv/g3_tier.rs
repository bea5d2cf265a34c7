//! The G3 tier (`g3_offload`): a block store below the host tier, as the reference models
//! it (docs/hybrid-kv.md §3.2).
//!
//! - Entries are keyed by (pool, sequence hash); a `worker_local` tier has one pool per
//!   worker, a `cluster_shared` one a single pool all workers read.
//! - A write job inserts its blocks at once as *pending* (not yet readable); they become
//!   resident when the job completes. A read job pins its resident blocks until it completes.
//! - When a write does not fit, the least recently touched resident, unpinned blocks outside
//!   the job are evicted; if there is still no room, only the job's leading blocks are kept.
//! - Transfers share bandwidth equally (see [`FairTransfers`]) and run on a clock of
//!   floating-point milliseconds, as the reference's do: the byte arithmetic and the
//!   reported `transfer_ms` follow it, and the scheduler wakes at the nanosecond nearest
//!   to a completion.
//!
//! Pure bookkeeping: no I/O, no wall clock.

use std::collections::{BTreeMap, BTreeSet};

use crate::config::{G3OffloadConfig, G3Scope};

/// A G3 tier as the engines of a deployment share it (`cluster_shared`), or as one engine
/// owns it (`worker_local`).
pub type SharedG3 = std::sync::Arc<std::sync::Mutex<G3Tier>>;

/// Whether a job reads from G3 (a promotion into the host tier) or writes to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum G3Direction {
    /// G3 to host.
    Read = 0,
    /// Host to G3.
    Write = 1,
}

/// What a probe finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum G3Probe {
    /// Not in the pool.
    Miss,
    /// Being written: present, not yet readable.
    Pending,
    /// Readable.
    Resident,
}

/// One direction's job counters, as the reference reports them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct G3IoStats {
    /// Jobs accepted.
    pub submitted_jobs: u64,
    /// Jobs that finished.
    pub completed_jobs: u64,
    /// Jobs cancelled (never, in a replay: promotions are detached, not aborted).
    pub cancelled_jobs: u64,
    /// Bytes of the finished jobs.
    pub completed_bytes: u64,
    /// Σ (completion − submission) of the finished jobs, ms.
    pub transfer_ms: f64,
}

/// The summary's `g3_offload` object, with the reference's keys in its order.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct G3Stats {
    /// Block probes (lookups that missed the GPU and host tiers), retries included.
    pub lookup_probes: u64,
    /// Probes that found a resident block.
    pub lookup_hits: u64,
    /// Probes that found a block still being written.
    pub lookup_pending: u64,
    /// Read (promotion) jobs.
    pub read: G3IoStats,
    /// Write-through jobs.
    pub write: G3IoStats,
    /// Blocks evicted to make room for writes.
    pub evictions: u64,
    /// Blocks a worker read that another worker wrote (`cluster_shared`).
    pub cross_worker_read_blocks: u64,
    /// Readable blocks at the end.
    pub resident_blocks: usize,
    /// Blocks still being written at the end.
    pub pending_blocks: usize,
    /// Requests that gave up restoring from G3 after 1024 rounds without progress; the
    /// key is left out when zero, as the reference does.
    #[serde(skip_serializing_if = "is_zero")]
    pub bypassed_restores: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

impl G3Stats {
    /// Adds `other`'s counters (the summary of several `worker_local` tiers).
    pub fn add(&mut self, other: &G3Stats) {
        self.lookup_probes += other.lookup_probes;
        self.lookup_hits += other.lookup_hits;
        self.lookup_pending += other.lookup_pending;
        for (a, b) in [(&mut self.read, &other.read), (&mut self.write, &other.write)] {
            a.submitted_jobs += b.submitted_jobs;
            a.completed_jobs += b.completed_jobs;
            a.cancelled_jobs += b.cancelled_jobs;
            a.completed_bytes += b.completed_bytes;
            a.transfer_ms += b.transfer_ms;
        }
        self.evictions += other.evictions;
        self.cross_worker_read_blocks += other.cross_worker_read_blocks;
        self.resident_blocks += other.resident_blocks;
        self.pending_blocks += other.pending_blocks;
        self.bypassed_restores += other.bypassed_restores;
    }
}

/// Decimal GB/s as bytes per millisecond; 0 means unlimited.
fn bytes_per_ms(gbps: f64) -> f64 {
    if gbps == 0.0 {
        f64::INFINITY
    } else {
        gbps * 1e6
    }
}

/// The scheduler's nanosecond nearest to `ms`: a G3 event is taken up then (the tier's
/// own clock keeps the exact time), so the rounding does not drift one way.
pub fn nearest_ns(ms: f64) -> u64 {
    (ms * 1e6).round() as u64
}

#[derive(Debug)]
struct Transfer {
    id: u64,
    worker: usize,
    dir: G3Direction,
    /// First-byte time: the job moves nothing before it.
    ready: f64,
    bytes: f64,
    worker_rate: f64,
    shared_rate: f64,
}

/// Equal-share byte service: a moving job's rate is
/// `min(worker_rate / that worker's moving jobs, shared_rate / all moving jobs)`, per
/// direction. Jobs waiting for their first byte take no share, and shares are recomputed
/// at every start and completion.
#[derive(Debug, Default)]
struct FairTransfers {
    now: f64,
    /// In submission order: same-time completions are reported in it.
    jobs: Vec<Transfer>,
}

impl FairTransfers {
    /// Per direction: moving jobs in all, and per worker.
    fn counts(&self) -> ([usize; 2], BTreeMap<usize, [usize; 2]>) {
        let mut total = [0; 2];
        let mut per = BTreeMap::<usize, [usize; 2]>::new();
        for j in self.jobs.iter().filter(|j| j.ready <= self.now) {
            total[j.dir as usize] += 1;
            per.entry(j.worker).or_default()[j.dir as usize] += 1;
        }
        (total, per)
    }

    fn rate(j: &Transfer, counts: &([usize; 2], BTreeMap<usize, [usize; 2]>)) -> f64 {
        let d = j.dir as usize;
        let local = counts.1.get(&j.worker).map_or(0, |c| c[d]).max(1) as f64;
        let all = counts.0[d].max(1) as f64;
        (j.worker_rate / local).min(j.shared_rate / all)
    }

    fn event_time(&self, j: &Transfer, counts: &([usize; 2], BTreeMap<usize, [usize; 2]>)) -> f64 {
        if j.ready > self.now {
            j.ready
        } else {
            self.now + j.bytes / Self::rate(j, counts)
        }
    }

    /// The next first byte or completion under the current jobs.
    fn next_event(&self) -> Option<f64> {
        let counts = self.counts();
        self.jobs.iter().map(|j| self.event_time(j, &counts)).min_by(f64::total_cmp)
    }

    /// Moves service to `target` ms, and past it to any event `due` accepts (an event
    /// within the nanosecond the scheduler is at); appends `(id, completion)` in event
    /// order and, within one event, submission order.
    fn advance(&mut self, target: f64, due: impl Fn(f64) -> bool, done: &mut Vec<(u64, f64)>) {
        let target = target.max(self.now);
        loop {
            let counts = self.counts();
            let event = self.jobs.iter().map(|j| self.event_time(j, &counts)).min_by(f64::total_cmp);
            let next = match event {
                Some(e) if e <= target || due(e) => e.max(self.now),
                _ => target,
            };
            let elapsed = next - self.now;
            for j in &mut self.jobs {
                if j.ready > self.now {
                    continue;
                }
                // The selected event is authoritative: a job whose completion it is ends
                // with no bytes left, however the subtraction rounds.
                let completes = self.now + j.bytes / Self::rate(j, &counts) <= next;
                j.bytes = if completes { 0.0 } else { (j.bytes - elapsed * Self::rate(j, &counts)).max(0.0) };
            }
            self.now = next;
            let now = self.now;
            let before = done.len();
            self.jobs.retain(|j| {
                let finished = j.ready <= now && j.bytes == 0.0;
                if finished {
                    done.push((j.id, now));
                }
                !finished
            });
            match event {
                Some(e) if e <= target || due(e) => {}
                _ => break,
            }
            if self.now >= target && done.len() == before {
                // First bytes at this instant may still complete zero-byte jobs now.
                let counts = self.counts();
                if self.jobs.iter().all(|j| {
                    let e = self.event_time(j, &counts);
                    e > target && !due(e)
                }) {
                    break;
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    pending: bool,
    pins: u32,
    writer: usize,
    /// Recency ordinal; in the pool's LRU set while resident and unpinned.
    touched: u64,
}

impl Entry {
    fn evictable(&self) -> bool {
        !self.pending && self.pins == 0
    }
}

#[derive(Debug)]
struct Job {
    worker: usize,
    dir: G3Direction,
    keys: Vec<u64>,
    submitted: f64,
}

/// A finished job, handed to the worker that submitted it.
#[derive(Debug, Clone)]
pub struct G3Completion {
    /// The job.
    pub id: u64,
    /// Its direction.
    pub dir: G3Direction,
    /// Its blocks.
    pub keys: Vec<u64>,
    /// When it finished, ms.
    pub at_ms: f64,
}

#[derive(Debug, Default)]
struct Pool {
    entries: BTreeMap<u64, Entry>,
    /// Resident, unpinned blocks by (touched, hash): eviction takes the front.
    lru: BTreeSet<(u64, u64)>,
}

impl Pool {
    fn set_touched(&mut self, key: u64, touched: u64) {
        let e = self.entries.get_mut(&key).expect("present");
        if e.evictable() {
            self.lru.remove(&(e.touched, key));
        }
        e.touched = touched;
        if e.evictable() {
            self.lru.insert((touched, key));
        }
    }
}

/// A G3 tier serving one or more workers.
#[derive(Debug)]
pub struct G3Tier {
    cfg: G3OffloadConfig,
    block_bytes: u64,
    pools: Vec<Pool>,
    jobs: BTreeMap<u64, Job>,
    transfers: FairTransfers,
    /// Finished jobs not yet taken by their worker, per worker.
    completed: Vec<Vec<G3Completion>>,
    /// Recency and job-id counter (the reference shares one).
    ordinal: u64,
    /// Counts finished jobs: a worker that has not seen the latest wakes.
    completion_epoch: u64,
    stats: G3Stats,
}

impl G3Tier {
    /// An empty tier for `workers` workers with blocks of `block_bytes` bytes.
    pub fn new(cfg: &G3OffloadConfig, workers: usize, block_bytes: u64) -> Self {
        let pools = match cfg.scope {
            G3Scope::WorkerLocal => workers,
            G3Scope::ClusterShared => 1,
        };
        Self {
            cfg: cfg.clone(),
            block_bytes,
            pools: (0..pools).map(|_| Pool::default()).collect(),
            jobs: BTreeMap::new(),
            transfers: FairTransfers::default(),
            completed: vec![Vec::new(); workers],
            ordinal: 0,
            completion_epoch: 0,
            stats: G3Stats::default(),
        }
    }

    fn pool(&self, worker: usize) -> usize {
        match self.cfg.scope {
            G3Scope::WorkerLocal => worker,
            G3Scope::ClusterShared => 0,
        }
    }

    /// The tier's clock, ms.
    pub fn now_ms(&self) -> f64 {
        self.transfers.now
    }

    /// Adds a worker (a scaled deployment's new engine); returns its index.
    pub fn add_worker(&mut self) -> usize {
        self.completed.push(Vec::new());
        if self.cfg.scope == G3Scope::WorkerLocal {
            self.pools.push(Pool::default());
        }
        self.completed.len() - 1
    }

    /// Jobs finished so far (any worker's).
    pub fn completion_epoch(&self) -> u64 {
        self.completion_epoch
    }

    /// Whether `key` is present for `worker` (resident or pending); touches nothing.
    pub fn contains(&self, worker: usize, key: u64) -> bool {
        self.pools[self.pool(worker)].entries.contains_key(&key)
    }

    /// Looks `key` up for `worker`, counting the probe; a hit refreshes its recency.
    pub fn probe(&mut self, worker: usize, key: u64) -> G3Probe {
        self.stats.lookup_probes += 1;
        self.ordinal += 1;
        let touched = self.ordinal;
        let p = self.pool(worker);
        let pool = &mut self.pools[p];
        match pool.entries.get(&key) {
            None => G3Probe::Miss,
            Some(e) if e.pending => {
                self.stats.lookup_pending += 1;
                G3Probe::Pending
            }
            Some(_) => {
                pool.set_touched(key, touched);
                self.stats.lookup_hits += 1;
                G3Probe::Resident
            }
        }
    }

    /// Submits a job at `now` ms (no earlier than the tier's clock). A write keeps the
    /// blocks not yet present, evicting as needed, and only the leading ones that fit; a
    /// read needs every block resident. Returns the job id and the blocks it carries, or
    /// `None` when nothing is submitted.
    pub fn submit(
        &mut self,
        worker: usize,
        dir: G3Direction,
        keys: &[u64],
        now: f64,
    ) -> Option<(u64, Vec<u64>)> {
        self.advance(now, u64::MAX, &mut Vec::new());
        let p = self.pool(worker);
        let pool = &mut self.pools[p];
        let offered = keys;
        let mut keys: Vec<u64> = match dir {
            G3Direction::Write => keys.iter().copied().filter(|k| !pool.entries.contains_key(k)).collect(),
            G3Direction::Read => keys.to_vec(),
        };
        if keys.is_empty() {
            return None;
        }
        match dir {
            G3Direction::Write => {
                let free = self.cfg.num_g3_blocks - pool.entries.len();
                let victims: Vec<(u64, u64)> = if keys.len() > free {
                    // Blocks of this job are never victims of it (the reference protects the
                    // whole offered list, present blocks included).
                    let protected = |k: &u64| offered.contains(k);
                    pool.lru.iter().filter(|(_, k)| !protected(k)).take(keys.len() - free).copied().collect()
                } else {
                    Vec::new()
                };
                keys.truncate(free + victims.len());
                if keys.is_empty() {
                    return None;
                }
                for v in &victims {
                    pool.lru.remove(v);
                    pool.entries.remove(&v.1);
                    self.stats.evictions += 1;
                }
                for &k in &keys {
                    pool.entries.insert(k, Entry { pending: true, pins: 0, writer: worker, touched: 0 });
                }
            }
            G3Direction::Read => {
                if keys.iter().any(|k| pool.entries.get(k).is_none_or(|e| e.pending)) {
                    return None;
                }
                for &k in &keys {
                    let e = pool.entries.get_mut(&k).expect("checked");
                    if e.evictable() {
                        pool.lru.remove(&(e.touched, k));
                    }
                    e.pins += 1;
                }
            }
        }
        self.ordinal += 1;
        let id = self.ordinal;
        self.io(dir).submitted_jobs += 1;
        let now = self.transfers.now;
        let (worker_gbps, shared_gbps) = match dir {
            G3Direction::Read => (self.cfg.read_bandwidth_gbps, self.cfg.shared_read_bandwidth_gbps),
            G3Direction::Write => (self.cfg.write_bandwidth_gbps, self.cfg.shared_write_bandwidth_gbps),
        };
        self.transfers.jobs.push(Transfer {
            id,
            worker,
            dir,
            ready: now + self.cfg.latency_to_first_byte_ms,
            bytes: (keys.len() as u64 * self.block_bytes) as f64,
            worker_rate: bytes_per_ms(worker_gbps),
            shared_rate: match self.cfg.scope {
                G3Scope::WorkerLocal => f64::INFINITY,
                G3Scope::ClusterShared => bytes_per_ms(shared_gbps),
            },
        });
        self.jobs.insert(id, Job { worker, dir, keys: keys.clone(), submitted: now });
        Some((id, keys))
    }

    fn io(&mut self, dir: G3Direction) -> &mut G3IoStats {
        match dir {
            G3Direction::Read => &mut self.stats.read,
            G3Direction::Write => &mut self.stats.write,
        }
    }

    /// The next time `worker` has something to take: a transfer event (any worker's, as
    /// they change each other's shares) or one of its finished jobs.
    pub fn next_deadline(&self, worker: usize) -> Option<f64> {
        let done = self.completed[worker].iter().map(|c| c.at_ms).min_by(f64::total_cmp);
        self.transfers.next_event().into_iter().chain(done).min_by(f64::total_cmp)
    }

    /// Whether `worker` has jobs in flight or finished jobs it has not taken.
    pub fn has_work(&self, worker: usize) -> bool {
        !self.completed[worker].is_empty() || self.transfers.jobs.iter().any(|j| j.worker == worker)
    }

    /// Advances to `now` ms, also finishing events before nanosecond `now_ns` ends.
    fn advance(&mut self, now: f64, now_ns: u64, scratch: &mut Vec<(u64, f64)>) {
        scratch.clear();
        self.transfers.advance(now, |e| now_ns != u64::MAX && nearest_ns(e) <= now_ns, scratch);
        for &(id, at) in scratch.iter() {
            let job = self.jobs.remove(&id).expect("finished job has its metadata");
            self.finish(id, job, at);
        }
    }

    fn finish(&mut self, id: u64, job: Job, at: f64) {
        self.completion_epoch += 1;
        self.ordinal += 1;
        let touched = self.ordinal;
        let p = self.pool(job.worker);
        let pool = &mut self.pools[p];
        let mut cross = 0;
        for &k in &job.keys {
            let e = pool.entries.get_mut(&k).expect("a job's blocks stay present");
            if e.evictable() {
                pool.lru.remove(&(e.touched, k));
            }
            match job.dir {
                G3Direction::Write => e.pending = false,
                G3Direction::Read => {
                    e.pins -= 1;
                    cross += u64::from(e.writer != job.worker);
                }
            }
            e.touched = touched;
            if e.evictable() {
                pool.lru.insert((touched, k));
            }
        }
        self.stats.cross_worker_read_blocks += cross;
        let bytes = job.keys.len() as u64 * self.block_bytes;
        let io = self.io(job.dir);
        io.completed_jobs += 1;
        io.completed_bytes += bytes;
        io.transfer_ms += at - job.submitted;
        self.completed[job.worker].push(G3Completion { id, dir: job.dir, keys: job.keys, at_ms: at });
    }

    /// Advances to nanosecond `now_ns` and hands `worker` its finished jobs, in order.
    pub fn take_completed(&mut self, worker: usize, now_ns: u64, out: &mut Vec<G3Completion>) {
        let mut scratch = Vec::new();
        self.advance(now_ns as f64 / 1e6, now_ns, &mut scratch);
        // A peer may have moved the shared clock past this worker's time: its completions
        // after `now_ns` wait for it.
        self.completed[worker].retain(|c| {
            let due = nearest_ns(c.at_ms) <= now_ns;
            if due {
                out.push(c.clone());
            }
            !due
        });
    }

    /// Counts a request that stopped restoring (see the scheduler's restore bound).
    pub fn note_bypass(&mut self) {
        self.stats.bypassed_restores += 1;
    }

    /// The counters, with the current residency.
    pub fn stats(&self) -> G3Stats {
        let mut s = self.stats.clone();
        s.pending_blocks = self.pools.iter().flat_map(|p| p.entries.values()).filter(|e| e.pending).count();
        s.resident_blocks = self.pools.iter().map(|p| p.entries.len()).sum::<usize>() - s.pending_blocks;
        s
    }

    /// Checks the bookkeeping; for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        for (i, p) in self.pools.iter().enumerate() {
            if p.entries.len() > self.cfg.num_g3_blocks {
                return Err(format!(
                    "pool {i}: {} blocks over capacity {}",
                    p.entries.len(),
                    self.cfg.num_g3_blocks
                ));
            }
            let evictable = p.entries.values().filter(|e| e.evictable()).count();
            if evictable != p.lru.len() {
                return Err(format!("pool {i}: LRU holds {} blocks, {evictable} are evictable", p.lru.len()));
            }
            for (k, e) in &p.entries {
                if e.evictable() && !p.lru.contains(&(e.touched, *k)) {
                    return Err(format!("pool {i}: block {k:#x} evictable but not in the LRU"));
                }
            }
        }
        let pins: u64 = self.pools.iter().flat_map(|p| p.entries.values()).map(|e| u64::from(e.pins)).sum();
        let reading: u64 =
            self.jobs.values().filter(|j| j.dir == G3Direction::Read).map(|j| j.keys.len() as u64).sum();
        if pins != reading {
            return Err(format!("{pins} read pins, {reading} blocks being read"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(scope: G3Scope, blocks: usize, workers: usize) -> G3Tier {
        // 1 MB blocks at 1 GB/s: 1 ms per block, no first-byte latency.
        let cfg = G3OffloadConfig {
            scope,
            num_g3_blocks: blocks,
            latency_to_first_byte_ms: 0.0,
            read_bandwidth_gbps: 1.0,
            write_bandwidth_gbps: 1.0,
            shared_read_bandwidth_gbps: 1.0,
            shared_write_bandwidth_gbps: 1.0,
        };
        G3Tier::new(&cfg, workers, 1_000_000)
    }

    fn done(t: &mut G3Tier, worker: usize, ms: u64) -> Vec<(u64, G3Direction)> {
        let mut out = Vec::new();
        t.take_completed(worker, ms * 1_000_000, &mut out);
        out.into_iter().map(|c| (c.id, c.dir)).collect()
    }

    #[test]
    fn a_worker_shares_its_bandwidth_between_its_jobs() {
        let mut t = tier(G3Scope::WorkerLocal, 8, 1);
        let (a, _) = t.submit(0, G3Direction::Write, &[1], 0.0).unwrap();
        let (b, _) = t.submit(0, G3Direction::Write, &[2], 0.0).unwrap();
        // Two jobs at half the rate each: both end at 2 ms.
        assert_eq!(t.next_deadline(0), Some(2.0));
        assert!(done(&mut t, 0, 1).is_empty());
        assert_eq!(done(&mut t, 0, 2), [(a, G3Direction::Write), (b, G3Direction::Write)]);
        assert_eq!(t.stats().write.transfer_ms, 4.0);
        t.check_invariants().unwrap();
    }

    #[test]
    fn the_shared_cap_binds_across_workers() {
        let mut t = tier(G3Scope::ClusterShared, 8, 2);
        t.submit(0, G3Direction::Write, &[1], 0.0).unwrap();
        t.submit(1, G3Direction::Write, &[2], 0.0).unwrap();
        assert_eq!(t.next_deadline(0), Some(2.0), "1 GB/s for both workers together");
        assert_eq!(t.probe(1, 1), G3Probe::Pending);
        done(&mut t, 0, 2);
        assert_eq!(t.probe(1, 1), G3Probe::Resident, "one pool");
        t.submit(1, G3Direction::Read, &[1], 2.0).unwrap();
        done(&mut t, 1, 3);
        assert_eq!(t.stats().cross_worker_read_blocks, 1);
    }

    #[test]
    fn a_full_pool_evicts_the_least_recent_and_keeps_the_leading_blocks() {
        let mut t = tier(G3Scope::WorkerLocal, 3, 1);
        t.submit(0, G3Direction::Write, &[1, 2, 3], 0.0).unwrap();
        done(&mut t, 0, 3);
        assert_eq!(t.probe(0, 1), G3Probe::Resident); // 2 is now the oldest
        t.submit(0, G3Direction::Read, &[3], 3.0).unwrap(); // pinned
        let (_, kept) = t.submit(0, G3Direction::Write, &[4, 5, 6], 3.0).unwrap();
        assert_eq!(kept, [4, 5], "two victims (2, then 1); 3 is pinned");
        assert_eq!(t.stats().evictions, 2);
        assert_eq!(t.probe(0, 2), G3Probe::Miss);
        t.check_invariants().unwrap();
    }

    #[test]
    fn an_instant_transfer_completes_at_its_submission() {
        let cfg = G3OffloadConfig {
            scope: G3Scope::WorkerLocal,
            num_g3_blocks: 4,
            latency_to_first_byte_ms: 0.0,
            read_bandwidth_gbps: 0.0,
            write_bandwidth_gbps: 0.0,
            shared_read_bandwidth_gbps: 0.0,
            shared_write_bandwidth_gbps: 0.0,
        };
        let mut t = G3Tier::new(&cfg, 1, 1000);
        t.submit(0, G3Direction::Write, &[1], 5.0).unwrap();
        assert_eq!(t.next_deadline(0), Some(5.0));
        assert_eq!(done(&mut t, 0, 5).len(), 1);
        assert_eq!(t.stats().write.transfer_ms, 0.0);
    }
}
