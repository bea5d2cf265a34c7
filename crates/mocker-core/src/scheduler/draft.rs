//! The MTP / EAGLE draft acceptance sampler every backend shares: a decode forward verifies
//! `aic_nextn` drafts and accepts 1 + the run of consecutive draft successes, drafts
//! succeeding with their conditional accept rates. The draws come from the `rand` crate's
//! seeded `StdRng` (ChaCha12) in the reference's order, so bursts match it exactly.

use rand::distr::{Bernoulli, Distribution};
use rand::rngs::StdRng;
use rand::SeedableRng;

/// One rank's draft acceptance stream.
#[derive(Debug)]
pub(crate) struct DraftSampler {
    drafts: Vec<Bernoulli>,
    rng: StdRng,
    /// Most tokens one forward can emit per request (`aic_nextn + 1`).
    pub max_burst: u32,
}

impl DraftSampler {
    /// A sampler for `rates` (one per draft), seeded with `seed`.
    pub fn new(rates: &[f64], seed: u64) -> Self {
        let drafts = rates.iter().map(|&p| Bernoulli::new(p.clamp(0.0, 1.0)).expect("p in [0, 1]")).collect();
        Self { drafts, rng: StdRng::seed_from_u64(seed), max_burst: rates.len() as u32 + 1 }
    }

    /// Tokens one verification accepts, the base token included.
    pub fn sample(&mut self) -> u32 {
        let mut n = 1;
        for d in &self.drafts {
            if !d.sample(&mut self.rng) {
                break;
            }
            n += 1;
        }
        n
    }
}
