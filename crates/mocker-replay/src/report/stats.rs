//! Distribution summaries for the replay report.
//!
//! Two collectors exist because the reference treats its distributions differently:
//! per-request metrics (TTFT, TTST, TPOT, E2E) are few and summarized exactly, while the
//! per-token metrics (ITL, per-user throughput) are streamed into a DDSketch so memory does not
//! grow with the number of generated tokens. Matching each choice keeps our percentiles
//! bit-close to 1.6.1.

use ddsketchy::DDSketch;
use serde::Serialize;

/// Percentiles (in percent) reported for every distribution, in report order.
const PERCENTILES: [f64; 5] = [50.0, 75.0, 90.0, 95.0, 99.0];

/// Relative accuracy of the reference's ITL / per-user-throughput sketches.
pub const SKETCH_RELATIVE_ACCURACY: f64 = 0.001;

/// Bin budget of the reference's sketches; beyond it the lowest bins are merged.
pub const SKETCH_MAX_BINS: usize = 32_768;

/// The nine statistics the report emits per distribution.
///
/// A plain value type so the collectors, the JSON writer and the table all share one shape;
/// every field is 0.0 for an empty distribution, as in the reference.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct DistSummary {
    /// Arithmetic mean.
    pub mean: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// 50th percentile.
    pub median: f64,
    /// 75th percentile.
    pub p75: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Population standard deviation (divides by n, not n − 1).
    pub std: f64,
}

impl DistSummary {
    /// Statistic names paired with values, in the order the report lists them
    /// (`mean, min, max, median, p75, p90, p95, p99, std`); the names are the key prefixes.
    pub fn named_values(&self) -> [(&'static str, f64); 9] {
        [
            ("mean", self.mean),
            ("min", self.min),
            ("max", self.max),
            ("median", self.median),
            ("p75", self.p75),
            ("p90", self.p90),
            ("p95", self.p95),
            ("p99", self.p99),
            ("std", self.std),
        ]
    }

    fn with_percentiles(mut self, values: [f64; 5]) -> Self {
        [self.median, self.p75, self.p90, self.p95, self.p99] = values;
        self
    }
}

/// Index of the `p`-th percentile among `n` sorted samples under the reference's
/// "rounded rank" rule: `round((n − 1)·p/100)`, half away from zero, clamped to `n − 1`.
///
/// `n` must be at least 1.
pub fn rounded_rank(n: usize, p: f64) -> usize {
    let last = n.saturating_sub(1);
    // f64::round is half-away-from-zero, which is what the reference does; (n-1)*p is exact
    // for the integer percentiles we use, so ties such as 31.5 are detected exactly.
    let rank = (last as f64 * p / 100.0).round();
    if rank <= 0.0 {
        0
    } else {
        (rank as usize).min(last)
    }
}

/// Exact collector: keeps every sample, used for the per-request metrics.
#[derive(Debug, Clone, Default)]
pub struct ExactDistribution {
    values: Vec<f64>,
}

impl ExactDistribution {
    /// Creates an empty collector.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one sample.
    pub fn push(&mut self, value: f64) {
        self.values.push(value);
    }

    /// Makes room for `more` samples at once (a long run then never copies them as the
    /// vector doubles).
    pub fn reserve_exact(&mut self, more: usize) {
        self.values.reserve_exact(more);
    }

    /// Number of samples recorded (the report's `num_*_samples`).
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// True when no sample was recorded.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Computes the nine statistics; reorders the samples in place (hence `&mut`) to avoid
    /// a copy.
    pub fn summarize(&mut self) -> DistSummary {
        let n = self.values.len();
        if n == 0 {
            return DistSummary::default();
        }
        let count = n as f64;
        let mean = self.values.iter().sum::<f64>() / count;
        // Two-pass variance: no cancellation problem, and we hold all the samples anyway.
        let var = self.values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / count;
        let p = PERCENTILES.map(|p| rounded_rank(n, p));
        let [min, p50, p75, p90, p95, p99, max] =
            order_statistics(&mut self.values, [0, p[0], p[1], p[2], p[3], p[4], n - 1]);
        DistSummary { mean, min, max, std: var.sqrt(), ..DistSummary::default() }
            .with_percentiles([p50, p75, p90, p95, p99])
    }
}

/// The values at nondecreasing `ranks` of `values` in `f64::total_cmp` order, as sorting
/// would give them. Each selection partitions only what lies above the previous rank, so
/// this is linear rather than a full sort (the summary is a visible share of short runs).
fn order_statistics<const K: usize>(values: &mut [f64], ranks: [usize; K]) -> [f64; K] {
    let mut out = [0.0; K];
    // values[..lo] holds the lo smallest samples once a rank below lo has been selected.
    let mut lo = 0;
    for (i, &r) in ranks.iter().enumerate() {
        debug_assert!(i == 0 || r >= ranks[i - 1], "ranks must not decrease");
        if r < lo {
            out[i] = out[i - 1];
            continue;
        }
        let (_, v, _) = values[lo..].select_nth_unstable_by(r - lo, f64::total_cmp);
        out[i] = *v;
        lo = r + 1;
    }
    out
}

impl Extend<f64> for ExactDistribution {
    fn extend<I: IntoIterator<Item = f64>>(&mut self, iter: I) {
        self.values.extend(iter);
    }
}

/// Streaming collector for per-token metrics: exact mean/std/min/max, sketched percentiles.
///
/// Percentiles reproduce what the reference gets from a ddsketchy `DDSketch` (α = 0.001,
/// 32,768 bins): we use ddsketchy's own value↔bin mapping but count bins ourselves, because
/// ddsketchy has no add-with-count and the replay adds long runs of identical gaps (one per
/// request in a decode batch). With our own counts `add_n` costs one logarithm, not `count`.
/// Non-finite samples are ignored, as the sketch itself would.
#[derive(Debug, Clone)]
pub struct SketchDistribution {
    mapping: DDSketch,
    positive: Bins,
    negative: Bins,
    zeros: u64,
    count: u64,
    mean: f64,
    m2: f64,
    min: f64,
    max: f64,
}

impl Default for SketchDistribution {
    fn default() -> Self {
        Self::new()
    }
}

impl SketchDistribution {
    /// Creates an empty collector with the reference's accuracy and bin budget.
    pub fn new() -> Self {
        Self::with_max_bins(SKETCH_MAX_BINS)
    }

    /// Like [`SketchDistribution::new`] with another bin budget; exists so tests can exercise
    /// bin collapsing on small inputs.
    pub fn with_max_bins(max_bins: usize) -> Self {
        // Only ddsketchy's mapping is used; the counts live in `Bins` with the same budget.
        let mapping = DDSketch::new(SKETCH_RELATIVE_ACCURACY).expect("constant accuracy is within (0, 1)");
        Self {
            mapping,
            positive: Bins::new(max_bins),
            negative: Bins::new(max_bins),
            zeros: 0,
            count: 0,
            mean: 0.0,
            m2: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }

    /// Records one sample; hot path (once per generated token), allocation-free except when
    /// the value range first widens.
    #[inline]
    pub fn add(&mut self, value: f64) {
        self.add_n(value, 1);
    }

    /// Records `count` copies of `value`, equivalent to `count` calls of [`add`](Self::add)
    /// (up to floating-point rounding in mean/std) at the cost of one.
    #[inline]
    pub fn add_n(&mut self, value: f64, count: u64) {
        if count == 0 || !value.is_finite() {
            return;
        }
        let min_indexable = self.mapping.min_possible();
        if value >= min_indexable {
            self.positive.add(self.mapping.key(value), count);
        } else if value <= -min_indexable {
            self.negative.add(self.mapping.key(value), count);
        } else {
            self.zeros += count;
        }
        self.min = self.min.min(value);
        self.max = self.max.max(value);

        // Welford; the weighted (Chan) update for runs is the same recurrence applied to a
        // block of identical values, so it agrees with repeated single updates to rounding.
        let before = self.count as f64;
        self.count += count;
        let total = self.count as f64;
        let delta = value - self.mean;
        if count == 1 {
            self.mean += delta / total;
            self.m2 += delta * (value - self.mean);
        } else {
            let weight = count as f64;
            self.mean += delta * weight / total;
            self.m2 += delta * delta * before * weight / total;
        }
    }

    /// Number of samples recorded.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// True when no sample was recorded.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Computes the nine statistics; percentiles are sketch estimates (≤ 0.1% relative error).
    pub fn summarize(&self) -> DistSummary {
        if self.count == 0 {
            return DistSummary::default();
        }
        DistSummary {
            mean: self.mean,
            min: self.min,
            max: self.max,
            std: (self.m2.max(0.0) / self.count as f64).sqrt(),
            ..DistSummary::default()
        }
        .with_percentiles(PERCENTILES.map(|p| self.percentile(p)))
    }

    /// The reference's query: aim at the middle of rank `r` so the sketch's truncating
    /// `rank = ⌊q·(n − 1)⌋` lands on `r` despite rounding.
    fn percentile(&self, p: f64) -> f64 {
        let n = self.count;
        let r = rounded_rank(n as usize, p) as u64;
        let q = if n == 1 || r >= n - 1 { 1.0 } else { (r as f64 + 0.5) / (n - 1) as f64 };
        self.quantile(q)
    }

    /// Same lookup as `DDSketch::quantile` over our bin counts.
    fn quantile(&self, q: f64) -> f64 {
        if self.count == 1 {
            // The sketch answers a single sample with its exact value.
            return self.min;
        }
        let rank = (q * (self.count - 1) as f64) as u64;
        let negatives = self.negative.count;
        if rank < negatives {
            -self.mapping.value(self.negative.key_at_rank(negatives - 1 - rank))
        } else if rank < negatives + self.zeros {
            0.0
        } else {
            self.mapping.value(self.positive.key_at_rank(rank - negatives - self.zeros))
        }
    }
}

/// Counts per sketch key over a contiguous key window, collapsing the lowest keys once the
/// window would exceed the bin budget (same outcome as ddsketchy's collapsing-lowest store:
/// a key ends up in bin `max(key, max_key − budget + 1)`).
#[derive(Debug, Clone)]
struct Bins {
    /// `counts[i]` is the count of key `offset + i`.
    counts: Vec<u64>,
    offset: i64,
    max_key: i64,
    count: u64,
    budget: i64,
}

impl Bins {
    fn new(budget: usize) -> Self {
        Self { counts: Vec::new(), offset: 0, max_key: i64::MIN, count: 0, budget: budget.max(1) as i64 }
    }

    fn floor(&self) -> i64 {
        self.max_key - self.budget + 1
    }

    #[inline]
    fn add(&mut self, key: i32, n: u64) {
        let mut key = i64::from(key);
        if self.counts.is_empty() {
            self.start_window(key);
        } else if key > self.max_key {
            self.raise_max(key);
        } else {
            key = key.max(self.floor());
        }
        if key < self.offset {
            self.grow_down(key);
        } else if key >= self.offset + self.counts.len() as i64 {
            self.grow_up(key);
        }
        self.counts[(key - self.offset) as usize] += n;
        self.count += n;
    }

    /// The first key opens a window reaching `SLACK` keys to either side (never below the
    /// floor): growing a few keys at a time, downwards above all, shifts the whole window.
    #[cold]
    fn start_window(&mut self, key: i64) {
        const SLACK: i64 = 512;
        let below = SLACK.min(self.budget - 1);
        self.counts = vec![0; (below + 1 + SLACK) as usize];
        self.offset = key - below;
        self.max_key = key;
    }

    #[cold]
    fn raise_max(&mut self, key: i64) {
        self.max_key = key;
        let floor = self.floor();
        if floor <= self.offset {
            return;
        }
        let below = ((floor - self.offset) as usize).min(self.counts.len());
        let folded: u64 = self.counts.drain(..below).sum();
        // Either the window now starts exactly at the floor, or everything was folded and the
        // window restarts there (never materialize the gap after a large jump).
        self.offset = floor;
        if self.counts.is_empty() {
            self.counts.push(0);
        }
        self.counts[0] += folded;
    }

    #[cold]
    fn grow_down(&mut self, key: i64) {
        // Over-allocate downwards (bounded by the floor) so descending inputs stay amortized.
        let slack = (self.counts.len() as i64).min(key - self.floor()).max(0);
        let new_offset = key - slack;
        let extra = (self.offset - new_offset) as usize;
        self.counts.splice(0..0, std::iter::repeat_n(0, extra));
        self.offset = new_offset;
    }

    #[cold]
    fn grow_up(&mut self, key: i64) {
        self.counts.resize((key - self.offset + 1) as usize, 0);
    }

    /// Smallest key whose cumulative count exceeds `rank`; the max key when out of range.
    fn key_at_rank(&self, rank: u64) -> i32 {
        // Whole chunks first (their sums vectorize), then the one that crosses `rank`: the
        // window spans thousands of mostly empty keys and a report asks for ten ranks.
        const CHUNK: usize = 16;
        let mut seen = 0u64;
        let mut start = 0;
        for chunk in self.counts.chunks(CHUNK) {
            let sum: u64 = chunk.iter().sum();
            if seen + sum > rank {
                break;
            }
            seen += sum;
            start += chunk.len();
        }
        for (i, &c) in self.counts[start..].iter().enumerate() {
            seen += c;
            if seen > rank {
                return (self.offset + (start + i) as i64) as i32;
            }
        }
        self.max_key as i32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic xorshift so the tests need no RNG API.
    fn pseudo_random(seed: u64, n: usize) -> Vec<f64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 11) as f64 / (1u64 << 53) as f64
            })
            .collect()
    }

    /// Latency-like positive samples spanning a few orders of magnitude.
    fn latency_like(seed: u64, n: usize) -> Vec<f64> {
        pseudo_random(seed, n).into_iter().map(|u| 5.0 * (6.0 * u).exp()).collect()
    }

    fn exact(values: &[f64]) -> DistSummary {
        let mut d = ExactDistribution::new();
        d.extend(values.iter().copied());
        d.summarize()
    }

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-300)
    }

    #[test]
    fn rounded_rank_rule() {
        assert_eq!(rounded_rank(64, 50.0), 32); // 31.5 rounds away from zero
        assert_eq!(rounded_rank(1, 99.0), 0);
        assert_eq!(rounded_rank(100, 99.0), 98); // 98.01
        assert_eq!(rounded_rank(2, 50.0), 1); // 0.5
        assert_eq!(rounded_rank(4, 50.0), 2); // 1.5
        assert_eq!(rounded_rank(10, 90.0), 8); // 8.1
        assert_eq!(rounded_rank(10, 95.0), 9); // 8.55
        assert_eq!(rounded_rank(5, 75.0), 3);
        assert_eq!(rounded_rank(7, 100.0), 6);
    }

    #[test]
    fn exact_percentiles_use_rounded_rank() {
        // 1..=64 in scrambled order: median is sorted[32] = 33, not 32.5.
        let values: Vec<f64> = (0..64).map(|i| ((i * 37) % 64 + 1) as f64).collect();
        let s = exact(&values);
        assert_eq!(s.median, 33.0);
        assert_eq!(s.p75, 48.0); // round(47.25) = 47 -> 48
        assert_eq!(s.p90, 58.0); // round(56.7) = 57 -> 58
        assert_eq!(s.p95, 61.0); // round(59.85) = 60 -> 61
        assert_eq!(s.p99, 63.0); // round(62.37) = 62 -> 63
        assert_eq!((s.min, s.max, s.mean), (1.0, 64.0, 32.5));

        let hundred: Vec<f64> = (0..100).rev().map(f64::from).collect();
        let s = exact(&hundred);
        assert_eq!((s.p99, s.p95, s.median), (98.0, 94.0, 50.0)); // 98.01, 94.05, 49.5
    }

    #[test]
    fn order_statistics_equal_a_full_sort() {
        for n in [1usize, 2, 3, 7, 64, 1000] {
            let mut values: Vec<f64> =
                pseudo_random(n as u64, n).into_iter().map(|u| (u * 20.0).floor()).collect();
            values.extend([0.0, -0.0].iter().take(n.min(2)));
            let mut sorted = values.clone();
            sorted.sort_unstable_by(f64::total_cmp);
            let m = values.len();
            let ranks = [0, rounded_rank(m, 50.0), rounded_rank(m, 90.0), rounded_rank(m, 90.0), m - 1];
            let got = order_statistics(&mut values, ranks);
            let want = ranks.map(|r| sorted[r]);
            assert_eq!(got.map(f64::to_bits), want.map(f64::to_bits), "n = {n}");
        }
    }

    #[test]
    fn exact_single_and_empty() {
        assert_eq!(exact(&[]), DistSummary::default());
        let s = exact(&[7.25]);
        assert_eq!(s.named_values().map(|(_, v)| v)[..8], [7.25; 8]);
        assert_eq!(s.std, 0.0);
    }

    #[test]
    fn std_is_population() {
        let s = exact(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!((s.mean, s.std), (5.0, 2.0)); // sample std would be 2.138...
        let mut sketch = SketchDistribution::new();
        [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0].iter().for_each(|&v| sketch.add(v));
        let k = sketch.summarize();
        assert!(close(k.mean, 5.0, 1e-15) && close(k.std, 2.0, 1e-15), "{k:?}");
    }

    #[test]
    fn add_n_matches_repeated_add() {
        let runs: Vec<(f64, u64)> = latency_like(7, 300)
            .into_iter()
            .zip(pseudo_random(8, 300))
            .map(|(v, u)| (v, 1 + (u * 64.0) as u64))
            .collect();
        let (mut one, mut many) = (SketchDistribution::new(), SketchDistribution::new());
        for &(v, c) in &runs {
            (0..c).for_each(|_| one.add(v));
            many.add_n(v, c);
        }
        many.add_n(3.0, 0);
        assert_eq!(one.len(), many.len());
        let (a, b) = (one.summarize(), many.summarize());
        for ((name, x), (_, y)) in a.named_values().into_iter().zip(b.named_values()) {
            assert!(close(x, y, 1e-12), "{name}: {x} vs {y}");
        }
        assert_eq!([a.median, a.p75, a.p90, a.p95, a.p99], [b.median, b.p75, b.p90, b.p95, b.p99]);
    }

    #[test]
    fn sketch_within_tenth_of_percent_of_exact() {
        let values = latency_like(42, 4000);
        let mut sketch = SketchDistribution::new();
        values.iter().for_each(|&v| sketch.add(v));
        let (e, k) = (exact(&values), sketch.summarize());
        assert!(close(e.mean, k.mean, 1e-12) && close(e.std, k.std, 1e-9));
        assert_eq!((e.min, e.max), (k.min, k.max));
        for ((name, x), (_, y)) in e.named_values().into_iter().zip(k.named_values()) {
            assert!(close(x, y, 1e-3), "{name}: exact {x} vs sketch {y}");
        }
    }

    /// Our bin counting must answer exactly what a ddsketchy sketch fed the same samples does.
    fn assert_same_as_ddsketchy(values: &[f64], max_bins: usize) {
        let mut ours = SketchDistribution::with_max_bins(max_bins);
        let mut theirs = DDSketch::with_max_bins(SKETCH_RELATIVE_ACCURACY, max_bins).unwrap();
        for &v in values {
            ours.add(v);
            theirs.add(v);
        }
        let n = theirs.count();
        assert_eq!(ours.len(), n);
        for p in [0.0, 1.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 100.0] {
            let r = rounded_rank(n as usize, p) as u64;
            let q = if n == 1 || r >= n - 1 { 1.0 } else { (r as f64 + 0.5) / (n - 1) as f64 };
            assert_eq!(ours.percentile(p), theirs.quantile(q).unwrap(), "p{p} bins {max_bins}");
        }
    }

    #[test]
    fn sketch_matches_ddsketchy_bit_for_bit() {
        assert_same_as_ddsketchy(&latency_like(1, 3000), SKETCH_MAX_BINS);
        assert_same_as_ddsketchy(&[0.0, 0.0, 3.0, -2.0, 1e-320, -7.5, 4.0], SKETCH_MAX_BINS);
        // Seven decades with a 256-bin budget forces collapsing, in both orders of arrival.
        let mut wide: Vec<f64> = pseudo_random(3, 2000).iter().map(|u| 10f64.powf(7.0 * u - 3.0)).collect();
        assert_same_as_ddsketchy(&wide, 256);
        wide.sort_by(f64::total_cmp);
        assert_same_as_ddsketchy(&wide, 256);
        wide.reverse();
        assert_same_as_ddsketchy(&wide, 256);
        assert_same_as_ddsketchy(&[1.0, 1e300, 2.0, 1e-300], 128);
    }

    #[test]
    fn sketch_single_empty_and_non_finite() {
        assert_eq!(SketchDistribution::new().summarize(), DistSummary::default());
        let mut d = SketchDistribution::new();
        d.add(f64::NAN);
        d.add_n(f64::INFINITY, 3);
        assert!(d.is_empty());
        d.add(175.223);
        let s = d.summarize();
        assert_eq!(
            [s.mean, s.min, s.max, s.median, s.p99, s.std],
            [175.223, 175.223, 175.223, 175.223, 175.223, 0.0]
        );
    }
}
