//! The distributions of inter-token gaps: ITL and each user's token throughput. Long
//! replays add a sketch sample per distinct gap (about one per pass), which costs a
//! logarithm per distribution; a helper thread can do that off the simulation's thread,
//! fed in order in batches so the distributions come out exactly as if added inline.

use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread::JoinHandle;

use crate::report::SketchDistribution;

/// Gaps per message to the helper thread.
const BATCH: usize = 4096;

/// Gap samples: (gap in ns, how many tokens had it).
type Batch = Vec<(u64, u64)>;

/// ITL and per-user throughput, built here or on a helper thread.
#[derive(Debug)]
pub struct GapStats {
    mode: Mode,
}

#[derive(Debug)]
enum Mode {
    Inline(Box<Sketches>),
    Threaded {
        batch: Batch,
        tx: SyncSender<Batch>,
        /// Emptied batches coming back, so steady state allocates nothing.
        spare: Receiver<Batch>,
        worker: JoinHandle<Sketches>,
    },
}

#[derive(Debug)]
struct Sketches {
    itl: SketchDistribution,
    per_user: SketchDistribution,
}

impl Sketches {
    fn new() -> Self {
        Self { itl: SketchDistribution::new(), per_user: SketchDistribution::new() }
    }

    fn record(&mut self, gap_ns: u64, count: u64) {
        let gap_ms = gap_ns as f64 / 1e6;
        self.itl.add_n(gap_ms, count);
        if gap_ns > 0 {
            self.per_user.add_n(1000.0 / gap_ms, count);
        }
    }
}

impl Default for GapStats {
    fn default() -> Self {
        Self::inline()
    }
}

impl GapStats {
    /// Distributions built on the caller's thread.
    pub fn inline() -> Self {
        Self { mode: Mode::Inline(Box::new(Sketches::new())) }
    }

    /// Distributions built on a helper thread (which ends with [`GapStats::finish`], or when
    /// this is dropped).
    pub fn threaded() -> Self {
        let (tx, rx) = sync_channel::<Batch>(4);
        let (spare_tx, spare) = sync_channel::<Batch>(4);
        let worker = std::thread::Builder::new()
            .name("mocker-stats".into())
            .spawn(move || {
                let mut s = Sketches::new();
                for mut batch in rx {
                    batch.drain(..).for_each(|(gap, n)| s.record(gap, n));
                    let _ = spare_tx.try_send(batch);
                }
                s
            })
            .expect("spawn stats thread");
        Self { mode: Mode::Threaded { batch: Vec::with_capacity(BATCH), tx, spare, worker } }
    }

    /// `count` tokens arrived `gap_ns` after their request's previous token.
    #[inline]
    pub fn add(&mut self, gap_ns: u64, count: u64) {
        match &mut self.mode {
            Mode::Inline(s) => s.record(gap_ns, count),
            Mode::Threaded { batch, tx, spare, .. } => {
                batch.push((gap_ns, count));
                if batch.len() == BATCH {
                    let next = spare.try_recv().unwrap_or_else(|_| Vec::with_capacity(BATCH));
                    // A send fails only if the thread died; `finish` then reports it.
                    let _ = tx.send(std::mem::replace(batch, next));
                }
            }
        }
    }

    /// The ITL (ms) and per-user throughput (tokens/s) distributions.
    pub fn finish(self) -> (SketchDistribution, SketchDistribution) {
        let s = match self.mode {
            Mode::Inline(s) => *s,
            Mode::Threaded { batch, tx, worker, .. } => {
                let _ = tx.send(batch);
                drop(tx);
                worker.join().expect("stats thread panicked")
            }
        };
        (s.itl, s.per_user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threaded_and_inline_stats_agree_exactly() {
        let (mut a, mut b) = (GapStats::inline(), GapStats::threaded());
        // More than a few batches, gaps of every size including 0.
        let gaps: Vec<u64> = (0..(3 * BATCH as u64 + 17)).map(|i| (i * 7_919) % 50_000_000).collect();
        for (i, &gap) in gaps.iter().enumerate() {
            a.add(gap, 1 + i as u64 % 5);
            b.add(gap, 1 + i as u64 % 5);
        }
        let (a, b) = (a.finish(), b.finish());
        assert_eq!(format!("{a:?}"), format!("{b:?}"));
        assert_eq!((a.0.summarize(), a.1.summarize()), (b.0.summarize(), b.1.summarize()));
        let largest = *gaps.iter().max().unwrap() as f64 / 1e6;
        assert_eq!(a.0.summarize().max, largest, "the largest gap, in ms");
    }
}
