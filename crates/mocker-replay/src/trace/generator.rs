//! A Mooncake-format trace with the structure chat and agent traffic has: prompts that start
//! with one of a few popular system prompts (Zipf-like), follow-up turns that extend an open
//! conversation, Poisson or bursty (gamma) arrivals, log-normal lengths. Rows come out one at a time from a
//! seeded iterator whose state is bounded (open conversations are capped), so a trace of any
//! length streams in constant memory.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::Distribution;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratorOptions {
    /// Rows to write.
    pub rows: u64,
    /// Mean arrivals per second (Poisson).
    pub rate: f64,
    /// A rate that changes over time instead: (arrivals per second, seconds) segments in
    /// order, the last one lasting to the end (empty: `rate` throughout).
    pub rate_schedule: Vec<(f64, f64)>,
    /// vLLM's `--burstiness`: the shape of the gamma distribution gaps between arrivals
    /// follow, at the same mean rate. 1 is Poisson; below 1 arrivals come in bursts (the
    /// gaps' coefficient of variation is 1/sqrt(burstiness)), above 1 more evenly.
    pub burstiness: f64,
    /// System-prompt families.
    pub families: usize,
    /// Zipf exponent of the families' popularity (0: uniform).
    pub zipf: f64,
    /// Tokens of a family's system prompt.
    pub family_tokens: usize,
    /// Share of rows that continue an open conversation.
    pub follow_up: f64,
    /// Median and cap of a row's new prompt tokens (log-normal, sigma `sigma`).
    pub prompt_median: f64,
    /// Largest new prompt.
    pub prompt_max: usize,
    /// Median of output tokens.
    pub output_median: f64,
    /// Largest output.
    pub output_max: usize,
    /// Spread of both log-normals.
    pub sigma: f64,
    /// Tokens per hash id (Mooncake's 512).
    pub block_size: usize,
    /// Open conversations kept for follow-ups; the oldest is closed past it.
    pub max_open: usize,
    /// Random seed.
    pub seed: u64,
}

impl Default for GeneratorOptions {
    fn default() -> Self {
        Self {
            rows: 1000,
            rate: 10.0,
            rate_schedule: Vec::new(),
            burstiness: 1.0,
            families: 32,
            zipf: 1.0,
            family_tokens: 2048,
            follow_up: 0.35,
            prompt_median: 2500.0,
            prompt_max: 32_768,
            output_median: 250.0,
            output_max: 4096,
            sigma: 1.0,
            block_size: 512,
            max_open: 10_000,
            seed: 42,
        }
    }
}

/// One trace row.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Arrival, ms from the start.
    pub timestamp_ms: u64,
    /// Prompt tokens.
    pub input_length: usize,
    /// Output tokens.
    pub output_length: usize,
    /// One id per `block_size` tokens of the prompt (a last partial block included).
    pub hash_ids: Vec<u64>,
}

impl Row {
    /// The row as a Mooncake JSONL line (without the newline).
    pub fn to_json(&self) -> String {
        let ids: Vec<String> = self.hash_ids.iter().map(u64::to_string).collect();
        format!(
            r#"{{"timestamp": {}, "input_length": {}, "output_length": {}, "hash_ids": [{}]}}"#,
            self.timestamp_ms,
            self.input_length,
            self.output_length,
            ids.join(", ")
        )
    }
}

/// Why options cannot generate a trace.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct GeneratorError {
    /// The option.
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

/// An open conversation: its full prompt so far, as hash ids and tokens.
#[derive(Debug, Clone)]
struct Conversation {
    ids: Vec<u64>,
    tokens: usize,
}

/// Rows of a generated trace, in arrival order.
#[derive(Debug)]
pub struct TraceGenerator {
    o: GeneratorOptions,
    rng: StdRng,
    emitted: u64,
    clock_ms: f64,
    /// Cumulative Zipf weights of the families.
    cdf: Vec<f64>,
    open: std::collections::VecDeque<Conversation>,
    /// The next fresh hash id (family prefixes take the first ids).
    next_id: u64,
}

impl TraceGenerator {
    /// A generator for `o`, or why `o` cannot generate.
    pub fn new(o: GeneratorOptions) -> Result<Self, GeneratorError> {
        let bad = |field, message: String| Err(GeneratorError { field, message });
        if !(o.rate.is_finite() && o.rate > 0.0 && o.rate <= 1e7) {
            return bad("rate", format!("must be in (0, 1e7] requests per second, got {}", o.rate));
        }
        for &(rate, seconds) in &o.rate_schedule {
            if !(rate.is_finite() && rate > 0.0 && rate <= 1e7 && seconds.is_finite() && seconds > 0.0) {
                return bad(
                    "rate_schedule",
                    format!(
                        "each segment needs a rate in (0, 1e7] and a positive duration, got {rate}:{seconds}"
                    ),
                );
            }
        }
        if !(o.burstiness.is_finite() && o.burstiness >= 0.01 && o.burstiness <= 100.0) {
            return bad("burstiness", format!("must be in [0.01, 100], got {}", o.burstiness));
        }
        if !(1..=1_000_000).contains(&o.families) {
            return bad("families", format!("must be 1 to 1,000,000, got {}", o.families));
        }
        if !(o.zipf.is_finite() && (0.0..=10.0).contains(&o.zipf)) {
            return bad("zipf", format!("must be in [0, 10], got {}", o.zipf));
        }
        if !(o.follow_up.is_finite() && (0.0..=1.0).contains(&o.follow_up)) {
            return bad("follow_up", format!("must be in [0, 1], got {}", o.follow_up));
        }
        for (field, median, max) in [
            ("prompt_median", o.prompt_median, o.prompt_max),
            ("output_median", o.output_median, o.output_max),
        ] {
            if !(median.is_finite() && median >= 1.0 && median <= max as f64 && max <= 1 << 24) {
                return bad(
                    field,
                    format!("must be at least 1 and at most its cap ({max}, ≤ 2^24), got {median}"),
                );
            }
        }
        if !(o.sigma.is_finite() && (0.0..=5.0).contains(&o.sigma)) {
            return bad("sigma", format!("must be in [0, 5], got {}", o.sigma));
        }
        if !(1..=1 << 20).contains(&o.block_size) || o.family_tokens > 1 << 24 {
            return bad(
                "block_size",
                format!("must be 1 to 2^20 (family prompt ≤ 2^24), got {}", o.block_size),
            );
        }
        if !(1..=10_000_000).contains(&o.max_open) {
            return bad("max_open", format!("must be 1 to 10,000,000, got {}", o.max_open));
        }
        let mut cdf = Vec::with_capacity(o.families);
        let mut total = 0.0;
        for rank in 1..=o.families {
            total += 1.0 / (rank as f64).powf(o.zipf);
            cdf.push(total);
        }
        cdf.iter_mut().for_each(|c| *c /= total);
        let family_blocks = o.family_tokens.div_ceil(o.block_size) as u64;
        let next_id = o.families as u64 * family_blocks;
        Ok(Self {
            rng: StdRng::seed_from_u64(o.seed),
            o,
            emitted: 0,
            clock_ms: 0.0,
            cdf,
            open: std::collections::VecDeque::new(),
            next_id,
        })
    }

    /// A log-normal draw with this median, clipped to 1..=max: the core's output-length
    /// sampler, whose parameter is the mean (median × e^(σ²/2)).
    fn lognormal(&mut self, median: f64, max: usize) -> usize {
        let sigma = self.o.sigma;
        let lengths = mocker_core::output_length::OutputLengthDistribution::Lognormal {
            mean: median * (sigma * sigma / 2.0).exp(),
            sigma,
            min: 1,
            max: max as u32,
        };
        lengths.sample(self.rng.random()).expect("a log-normal always draws") as usize
    }

    /// The time, from `now_ms`, by which `expected` arrivals are due at the scheduled rates.
    fn advance(&self, now_ms: f64, mut expected: f64) -> f64 {
        if self.o.rate_schedule.is_empty() {
            return now_ms + expected / self.o.rate * 1000.0;
        }
        let mut start = 0.0;
        let mut t = now_ms / 1000.0;
        let last = self.o.rate_schedule.len() - 1;
        for (i, &(rate, seconds)) in self.o.rate_schedule.iter().enumerate() {
            let end = if i == last { f64::INFINITY } else { start + seconds };
            if t < end {
                let room = (end - t) * rate;
                if expected <= room {
                    return (t + expected / rate) * 1000.0;
                }
                expected -= room;
                t = end;
            }
            start = end;
        }
        t * 1000.0
    }

    fn fresh_ids(&mut self, ids: &mut Vec<u64>, from_tokens: usize, to_tokens: usize) {
        let bs = self.o.block_size;
        // The block holding `from_tokens` is partial when it does not end on a boundary: it
        // changes, so it gets a fresh id too.
        ids.truncate(from_tokens / bs);
        for _ in from_tokens / bs..to_tokens.div_ceil(bs) {
            ids.push(self.next_id);
            self.next_id += 1;
        }
    }
}

impl Iterator for TraceGenerator {
    type Item = Row;

    fn next(&mut self) -> Option<Row> {
        if self.emitted >= self.o.rows {
            return None;
        }
        self.emitted += 1;
        // The gap, in expected arrivals (mean 1), spent at the rate in force (across
        // schedule segments, each at its own rate): a unit exponential for Poisson
        // arrivals (drawn as before, so Poisson traces keep their bytes), else a gamma.
        let gap = if self.o.burstiness == 1.0 {
            let u: f64 = self.rng.random::<f64>().max(f64::MIN_POSITIVE);
            -u.ln()
        } else {
            let k = self.o.burstiness;
            rand_distr::Gamma::new(k, 1.0 / k).expect("validated shape").sample(&mut self.rng)
        };
        self.clock_ms = self.advance(self.clock_ms, gap);
        let new_tokens = self.lognormal(self.o.prompt_median, self.o.prompt_max);
        let output_length = self.lognormal(self.o.output_median, self.o.output_max);
        let follow = !self.open.is_empty() && self.rng.random::<f64>() < self.o.follow_up;
        let (mut ids, start) = if follow {
            // A later turn: the conversation's prompt, its last answer, then the new message.
            let at = self.rng.random_range(0..self.open.len());
            let c = self.open.remove(at).expect("in range");
            (c.ids, c.tokens)
        } else {
            let u: f64 = self.rng.random();
            let family = self.cdf.partition_point(|&c| c < u).min(self.o.families - 1);
            let blocks = self.o.family_tokens.div_ceil(self.o.block_size) as u64;
            let first = family as u64 * blocks;
            ((first..first + blocks).collect(), self.o.family_tokens)
        };
        let input_length = (start + new_tokens).min(1 << 26);
        self.fresh_ids(&mut ids, start, input_length);
        let row = Row {
            timestamp_ms: self.clock_ms.round() as u64,
            input_length,
            output_length,
            hash_ids: ids.clone(),
        };
        // The answer becomes part of the conversation's next prompt.
        let tokens = input_length + output_length;
        self.fresh_ids(&mut ids, input_length, tokens);
        self.open.push_back(Conversation { ids, tokens });
        if self.open.len() > self.o.max_open {
            self.open.pop_front();
        }
        Some(row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(o: GeneratorOptions) -> Vec<Row> {
        TraceGenerator::new(o).unwrap().collect()
    }

    #[test]
    fn rows_arrive_in_order_with_one_id_per_block() {
        let o = GeneratorOptions { rows: 2000, ..Default::default() };
        let r = rows(o.clone());
        assert_eq!(r.len(), 2000);
        assert!(r.windows(2).all(|w| w[0].timestamp_ms <= w[1].timestamp_ms));
        for row in &r {
            assert_eq!(row.hash_ids.len(), row.input_length.div_ceil(o.block_size));
            assert!(row.output_length >= 1 && row.output_length <= o.output_max);
        }
        // About `rate` arrivals a second.
        let seconds = r.last().unwrap().timestamp_ms as f64 / 1000.0;
        assert!((seconds - 200.0).abs() < 30.0, "{seconds} s for 2000 rows at 10/s");
        assert_eq!(r, rows(o), "the same seed gives the same trace");
    }

    #[test]
    fn popular_families_and_follow_ups_share_prefixes() {
        let o = GeneratorOptions { rows: 4000, families: 8, zipf: 1.2, ..Default::default() };
        let r = rows(o.clone());
        let family_blocks = o.family_tokens / o.block_size;
        let mut first_block = std::collections::HashMap::new();
        for row in &r {
            *first_block.entry(row.hash_ids[0]).or_insert(0usize) += 1;
        }
        let top = first_block.get(&0).copied().unwrap_or(0);
        let last = first_block.get(&(7 * family_blocks as u64)).copied().unwrap_or(0);
        assert!(top > 3 * last.max(1), "Zipf: family 0 {top} rows, family 7 {last}");
        // A follow-up starts with an earlier prompt of its conversation (its full blocks,
        // beyond the family's system prompt).
        let ids: std::collections::HashSet<&[u64]> =
            r.iter().map(|row| &row.hash_ids[..row.input_length / o.block_size]).collect();
        let extends = r.iter().filter(|row| {
            (family_blocks + 1..row.input_length / o.block_size).any(|k| ids.contains(&row.hash_ids[..k]))
        });
        let share = extends.count() as f64 / r.len() as f64;
        assert!(share > 0.2, "{share} of rows extend an earlier prompt");
        let none = rows(GeneratorOptions { follow_up: 0.0, ..o.clone() });
        assert!(none.iter().all(|row| row.input_length <= o.family_tokens + o.prompt_max));
    }

    #[test]
    fn a_rate_schedule_sets_the_arrival_rate_of_each_segment() {
        let o = GeneratorOptions {
            rows: 3000,
            rate_schedule: vec![(5.0, 100.0), (50.0, 20.0), (5.0, 1.0)],
            ..Default::default()
        };
        let r = rows(o);
        let count =
            |from: u64, to: u64| r.iter().filter(|x| (from..to).contains(&x.timestamp_ms)).count() as f64;
        // About 500 in the first 100 s, 1000 in the next 20 s, then 5 a second again.
        assert!((count(0, 100_000) - 500.0).abs() < 80.0, "{}", count(0, 100_000));
        assert!((count(100_000, 120_000) - 1000.0).abs() < 120.0, "{}", count(100_000, 120_000));
        assert!((count(120_000, 220_000) - 500.0).abs() < 80.0, "{}", count(120_000, 220_000));
    }

    /// Gaps between arrivals: mean and squared coefficient of variation.
    fn gap_stats(r: &[Row]) -> (f64, f64) {
        let gaps: Vec<f64> = r.windows(2).map(|w| (w[1].timestamp_ms - w[0].timestamp_ms) as f64).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        (mean, var / (mean * mean))
    }

    #[test]
    fn burstiness_keeps_the_rate_and_sets_the_spread_of_gaps() {
        let o = GeneratorOptions { rows: 40_000, rate: 2.0, ..Default::default() };
        let poisson = rows(o.clone());
        assert_eq!(poisson, rows(GeneratorOptions { burstiness: 1.0, ..o.clone() }), "1 is Poisson");
        let (mean, cv2) = gap_stats(&poisson);
        assert!((mean - 500.0).abs() < 10.0 && (cv2 - 1.0).abs() < 0.05, "{mean} {cv2}");
        for k in [0.25, 4.0] {
            let (mean, cv2) = gap_stats(&rows(GeneratorOptions { burstiness: k, ..o.clone() }));
            assert!((mean - 500.0).abs() < 15.0, "burstiness {k}: mean gap {mean} ms");
            assert!((cv2 * k - 1.0).abs() < 0.08, "burstiness {k}: squared CV {cv2}, expected {}", 1.0 / k);
        }
    }

    #[test]
    fn bad_options_name_the_field() {
        for (o, field) in [
            (GeneratorOptions { rate: 0.0, ..Default::default() }, "rate"),
            (GeneratorOptions { families: 0, ..Default::default() }, "families"),
            (GeneratorOptions { follow_up: 1.5, ..Default::default() }, "follow_up"),
            (GeneratorOptions { prompt_median: 1e9, ..Default::default() }, "prompt_median"),
            (GeneratorOptions { block_size: 0, ..Default::default() }, "block_size"),
            (GeneratorOptions { rate_schedule: vec![(5.0, 0.0)], ..Default::default() }, "rate_schedule"),
            (GeneratorOptions { burstiness: 0.0, ..Default::default() }, "burstiness"),
        ] {
            assert_eq!(TraceGenerator::new(o).unwrap_err().field, field);
        }
    }
}
