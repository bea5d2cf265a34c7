//! Synthetic workloads: sessions of turns with fixed prompt/output lengths, optional
//! shared prefixes, and one load controller (closed loop, Poisson, constant interval).
//! Requests are materialised only when dispatched, so memory follows live requests.

use mocker_core::hashing::mix_identity;
use mocker_core::output_length::OutputLengthDistribution;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How requests are released.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// Closed loop: at most this many sessions active at once.
    Concurrency(usize),
    /// Poisson arrivals of first turns at this many requests per second.
    RequestRate(f64),
    /// First turns arrive at this constant gap in ms (0 = all at once).
    ArrivalIntervalMs(f64),
}

/// A synthetic workload description (the reference's `run_mocker_synthetic_trace_replay`).
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticWorkload {
    /// Prompt tokens per request.
    pub input_tokens: usize,
    /// Output tokens per request.
    pub output_tokens: usize,
    /// When set, each request's output length is drawn from it instead (keyed by the
    /// arrival seed, the session and the turn, so runs repeat): outputs that end at a
    /// simulated end-of-sequence, as chat answers do.
    pub output_lengths: Option<OutputLengthDistribution>,
    /// Sessions (each of `turns_per_session` requests).
    pub request_count: usize,
    /// Load controller.
    pub load: Load,
    /// Seed of Poisson arrivals.
    pub arrival_seed: u64,
    /// Turns per session; later turns follow the previous turn's completion.
    pub turns_per_session: usize,
    /// Fraction of each prompt's blocks shared within its prefix group.
    pub shared_prefix_ratio: f64,
    /// Number of prefix groups (0 = no sharing).
    pub num_prefix_groups: usize,
    /// Delay between a turn's completion and the next turn's arrival.
    pub inter_turn_delay_ms: f64,
}

impl Default for SyntheticWorkload {
    fn default() -> Self {
        Self {
            input_tokens: 1000,
            output_tokens: 100,
            output_lengths: None,
            request_count: 1000,
            load: Load::Concurrency(64),
            arrival_seed: 42,
            turns_per_session: 1,
            shared_prefix_ratio: 0.0,
            num_prefix_groups: 0,
            inter_turn_delay_ms: 0.0,
        }
    }
}

/// A workload field out of range; names the field and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct WorkloadError {
    /// The offending parameter, as the CLI names it.
    pub field: &'static str,
    /// What is wrong and what is allowed.
    pub message: String,
}

fn bad(field: &'static str, message: String) -> WorkloadError {
    WorkloadError { field, message }
}

impl SyntheticWorkload {
    /// Checks every parameter.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        use crate::limits::{show, MAX_CONCURRENCY, MAX_REQUESTS, MAX_SESSION_TOKENS, MAX_TURNS};
        use crate::trace::{MAX_DELAY_MS, MAX_TRACE_TOKENS};
        for (field, v, max) in [
            ("input_tokens", self.input_tokens, MAX_TRACE_TOKENS),
            ("output_tokens", self.output_tokens, MAX_TRACE_TOKENS),
            ("request_count", self.request_count, MAX_REQUESTS),
            ("turns_per_session", self.turns_per_session, MAX_TURNS),
        ] {
            if !(1..=max).contains(&v) {
                return Err(bad(field, format!("must be in 1..={max} (got {v})")));
            }
        }
        // Both at most 2^27 here: the products cannot overflow.
        let total = self.request_count * self.turns_per_session;
        if total > MAX_REQUESTS {
            let msg = format!(
                "{} sessions of {} turns are {total} requests, above the limit {MAX_REQUESTS}",
                self.request_count, self.turns_per_session
            );
            return Err(bad("turns_per_session", msg));
        }
        let session_tokens = self.turns_per_session * self.input_tokens;
        if session_tokens > MAX_SESSION_TOKENS {
            let msg = format!(
                "{} turns of {} prompt tokens are {session_tokens} tokens a session (its prompts are \
                 planned together), above the limit {MAX_SESSION_TOKENS}",
                self.turns_per_session, self.input_tokens
            );
            return Err(bad("turns_per_session", msg));
        }
        match self.load {
            Load::Concurrency(c) if !(1..=MAX_CONCURRENCY).contains(&c) => {
                return Err(bad("concurrency", format!("must be in 1..={MAX_CONCURRENCY} (got {c})")))
            }
            Load::RequestRate(r) if !(r.is_finite() && r > 0.0) => {
                return Err(bad("request_rate", format!("must be a finite number > 0 (got {r})")))
            }
            Load::ArrivalIntervalMs(i) if !(i.is_finite() && (0.0..=MAX_DELAY_MS).contains(&i)) => {
                return Err(bad(
                    "arrival_interval_ms",
                    format!("must be finite and in [0, {MAX_DELAY_MS:e}] (got {})", show(i)),
                ))
            }
            _ => {}
        }
        if !(0.0..=1.0).contains(&self.shared_prefix_ratio) {
            return Err(bad(
                "shared_prefix_ratio",
                format!("must be in [0, 1] (got {})", self.shared_prefix_ratio),
            ));
        }
        let d = self.inter_turn_delay_ms;
        if !(d.is_finite() && (0.0..=MAX_DELAY_MS).contains(&d)) {
            return Err(bad(
                "inter_turn_delay_ms",
                format!("must be finite and in [0, {MAX_DELAY_MS:e}] (got {})", show(d)),
            ));
        }
        // Groups take the low block ids (groups × blocks per prompt, in u64).
        if self.num_prefix_groups > MAX_REQUESTS {
            let msg = format!("must be in 0..={MAX_REQUESTS} (got {})", self.num_prefix_groups);
            return Err(bad("num_prefix_groups", msg));
        }
        Ok(())
    }

    /// Whether the reference would use its session path (anything beyond flat requests).
    fn uses_sessions(&self) -> bool {
        self.turns_per_session != 1
            || self.shared_prefix_ratio != 0.0
            || self.num_prefix_groups != 0
            || self.inter_turn_delay_ms != 0.0
    }

    /// Total requests the workload will issue.
    pub fn total_requests(&self) -> usize {
        self.request_count.saturating_mul(self.turns_per_session)
    }
}

/// One turn ready to be dispatched.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnRequest {
    /// Request id.
    pub uuid: u128,
    /// Prompt tokens.
    pub tokens: Vec<u32>,
    /// Output tokens.
    pub max_output_tokens: usize,
    /// The prefix group and how many leading blocks come from it unchanged: every turn of
    /// the group starts with the same blocks, so their hashes can be computed once.
    /// Every later block (all of them when `None`) differs from every block of every other
    /// turn of the workload, by construction (fresh block ids, or a per-request salt).
    pub shared_prefix: Option<(usize, usize)>,
    /// Its session's index and its turn index there, when the workload has sessions
    /// (several turns, or prefix groups): the reference labels those records
    /// `session_{index}`.
    pub session: Option<(u32, u32)>,
}

/// Generates sessions and turns in order, lazily.
#[derive(Debug)]
pub struct SyntheticSource {
    w: SyntheticWorkload,
    block_size: usize,
    sessions_started: usize,
    arrivals: Option<ArrivalClock>,
    shape_rng: StdRng,
    uuid_rng: StdRng,
    sessions: bool,
    /// Per-session prefix group, drawn when the session starts.
    next_fresh_id: u64,
}

/// First-turn arrival times for open-loop loads.
#[derive(Debug)]
struct ArrivalClock {
    next_ms: f64,
    kind: Load,
    rng: StdRng,
}

impl ArrivalClock {
    fn advance(&mut self) {
        let gap = match self.kind {
            Load::RequestRate(r) => {
                let mean = 1000.0 / r;
                let u = (1.0 - self.rng.random::<f64>()).clamp(f64::MIN_POSITIVE, 1.0);
                -mean * u.ln()
            }
            Load::ArrivalIntervalMs(i) => i,
            Load::Concurrency(_) => 0.0,
        };
        self.next_ms += gap;
    }
}

/// A started session: which turns remain and the prefix group it draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionState {
    /// Session index in generation order.
    pub index: usize,
    /// Turns issued so far.
    pub turns_issued: usize,
    group: Option<usize>,
}

impl SyntheticSource {
    /// A source for `workload` on engines with `block_size`-token blocks.
    pub fn new(workload: SyntheticWorkload, block_size: usize) -> Self {
        let arrivals = match workload.load {
            Load::Concurrency(_) => None,
            kind => {
                Some(ArrivalClock { next_ms: 0.0, kind, rng: StdRng::seed_from_u64(workload.arrival_seed) })
            }
        };
        let sessions = workload.uses_sessions();
        Self {
            block_size,
            sessions_started: 0,
            arrivals,
            shape_rng: StdRng::seed_from_u64(42),
            uuid_rng: StdRng::seed_from_u64(0x6d6f_636b_6572),
            sessions,
            // Group ids take the low range; fresh ids follow.
            next_fresh_id: (workload.num_prefix_groups as u64)
                * (workload.input_tokens.div_ceil(block_size) as u64),
            w: workload,
        }
    }

    /// Sessions not started yet.
    pub fn sessions_remaining(&self) -> usize {
        self.w.request_count - self.sessions_started
    }

    /// Arrival time (ms) of the next session's first turn, for open-loop loads.
    pub fn next_arrival_ms(&self) -> Option<f64> {
        if self.sessions_remaining() == 0 {
            return None;
        }
        self.arrivals.as_ref().map(|a| a.next_ms)
    }

    /// Starts the next session (its first arrival time, if open-loop, was `next_arrival_ms`).
    pub fn start_session(&mut self) -> Option<SessionState> {
        if self.sessions_remaining() == 0 {
            return None;
        }
        let index = self.sessions_started;
        self.sessions_started += 1;
        if let Some(a) = &mut self.arrivals {
            a.advance();
        }
        let group = (self.sessions && self.w.num_prefix_groups > 0 && self.w.shared_prefix_ratio > 0.0)
            .then(|| self.shape_rng.random_range(0..self.w.num_prefix_groups));
        Some(SessionState { index, turns_issued: 0, group })
    }

    /// Materialises the session's next turn; `None` when the session is finished.
    pub fn next_turn(&mut self, s: &mut SessionState) -> Option<TurnRequest> {
        if s.turns_issued >= self.w.turns_per_session {
            return None;
        }
        s.turns_issued += 1;
        let isl = self.w.input_tokens;
        if !self.sessions {
            return Some(TurnRequest {
                uuid: s.index as u128 + 1,
                tokens: flat_prompt(s.index as u64, isl),
                max_output_tokens: self.output_length(s),
                shared_prefix: None,
                session: None,
            });
        }
        let bs = self.block_size;
        let num_blocks = isl.div_ceil(bs);
        let prefix_blocks = match s.group {
            Some(_) => num_blocks.min((num_blocks as f64 * self.w.shared_prefix_ratio).round() as usize),
            None => 0,
        };
        let mut tokens = Vec::with_capacity(num_blocks * bs);
        for b in 0..num_blocks {
            let id = match s.group {
                Some(g) if b < prefix_blocks => (g * num_blocks + b) as u64,
                _ => {
                    let id = self.next_fresh_id;
                    self.next_fresh_id += 1;
                    id
                }
            };
            tokens.extend(std::iter::repeat_n(id_token(id), bs));
        }
        tokens.truncate(isl);
        // Only whole blocks of the truncated prompt are shared verbatim.
        let shared_blocks = prefix_blocks.min(isl / bs);
        Some(TurnRequest {
            uuid: self.uuid_rng.random::<u128>(),
            tokens,
            max_output_tokens: self.output_length(s),
            shared_prefix: s.group.filter(|_| shared_blocks > 0).map(|g| (g, shared_blocks)),
            session: Some((s.index as u32, s.turns_issued as u32 - 1)),
        })
    }

    /// The output length of the session's latest turn: drawn when the workload has a
    /// distribution, from a key of its own so that no other draw of the run moves.
    fn output_length(&self, s: &SessionState) -> usize {
        let Some(d) = &self.w.output_lengths else {
            return self.w.output_tokens;
        };
        let key = mix_identity(mix_identity(self.w.arrival_seed, s.index as u64), s.turns_issued as u64);
        d.sample(key).map_or(self.w.output_tokens, |n| n as usize)
    }

    /// Turns per session.
    pub fn turns_per_session(&self) -> usize {
        self.w.turns_per_session
    }
}

/// Injective map from a block id to the token value repeated across that block.
fn id_token(id: u64) -> u32 {
    // Ids are dense counters, far below 2^32 - 1 for any workload that fits in memory.
    (id as u32).wrapping_add(1)
}

/// Unique prompt tokens of flat request `i`: a per-request salt xor-ed into an
/// odd-multiplier scramble of the position, and the loop vectorises (prompt synthesis is a
/// visible share of replay time at 100k requests). Salts are distinct (a bijection of
/// `i < 2^31`) and even, so two requests' tokens differ at every position, even after the
/// clamp to 1 (which could only merge a 0 with a 1, salts one apart): no block, not even
/// a one-token page, is ever shared, as `shared_prefix` promises.
fn flat_prompt(i: u64, len: usize) -> Vec<u32> {
    let salt = ((i as u32).wrapping_mul(0x2C1B_3C6D) << 1) ^ 0x9E37_79B8;
    (0..len as u32).map(|j| (j.wrapping_mul(0x9E37_79B1) ^ salt).max(1)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(w: SyntheticWorkload) -> SyntheticSource {
        SyntheticSource::new(w, 64)
    }

    #[test]
    fn flat_requests_have_unique_prompts_and_sequential_uuids() {
        let mut s = source(SyntheticWorkload { request_count: 3, input_tokens: 130, ..Default::default() });
        let mut seen = std::collections::HashSet::new();
        for i in 0..3 {
            let mut st = s.start_session().unwrap();
            let t = s.next_turn(&mut st).unwrap();
            assert_eq!(t.uuid, i + 1);
            assert_eq!(t.tokens.len(), 130);
            assert!(t.tokens.iter().all(|&x| x != 0));
            for tok in t.tokens {
                assert!(seen.insert(tok), "tokens repeat across prompts");
            }
            assert!(s.next_turn(&mut st).is_none());
        }
        assert!(s.start_session().is_none());
    }

    #[test]
    fn flat_prompts_differ_at_every_position() {
        // Position by position, no two requests agree, so no block or one-token page is
        // shared (what lets the feed give flat blocks fresh identities).
        let prompts: Vec<Vec<u32>> = (0..20_000).map(|i| flat_prompt(i, 3)).collect();
        for j in 0..3 {
            let distinct: std::collections::HashSet<u32> = prompts.iter().map(|p| p[j]).collect();
            assert_eq!(distinct.len(), prompts.len(), "position {j}");
        }
    }

    #[test]
    fn prefix_groups_share_leading_blocks_only() {
        let w = SyntheticWorkload {
            request_count: 20,
            input_tokens: 1024,
            shared_prefix_ratio: 0.5,
            num_prefix_groups: 2,
            ..Default::default()
        };
        let mut s = source(w);
        let mut by_group: std::collections::HashMap<usize, Vec<Vec<u32>>> = Default::default();
        for _ in 0..20 {
            let mut st = s.start_session().unwrap();
            let t = s.next_turn(&mut st).unwrap();
            by_group.entry(st.group.unwrap()).or_default().push(t.tokens);
        }
        assert_eq!(by_group.len(), 2, "both groups drawn in 20 sessions");
        let all: Vec<&Vec<u32>> = by_group.values().flatten().collect();
        for prompts in by_group.values() {
            for p in prompts {
                assert_eq!(p[..512], prompts[0][..512], "first half shared within a group");
            }
        }
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a[512..], b[512..], "second halves are unique");
            }
        }
    }

    #[test]
    fn poisson_arrivals_are_seeded_and_have_the_right_mean() {
        let w =
            SyntheticWorkload { request_count: 20001, load: Load::RequestRate(20.0), ..Default::default() };
        let mut a = source(w.clone());
        let mut b = source(w);
        let mut last = 0.0;
        for _ in 0..20000 {
            let t = a.next_arrival_ms().unwrap();
            assert_eq!(Some(t), b.next_arrival_ms());
            assert!(t >= last);
            last = t;
            a.start_session();
            b.start_session();
        }
        let mean_gap = last / 19999.0;
        assert!((mean_gap - 50.0).abs() < 1.5, "mean gap {mean_gap}");
    }

    #[test]
    fn validation_names_the_field() {
        let w = SyntheticWorkload { output_tokens: 0, ..Default::default() };
        assert_eq!(w.validate().unwrap_err().field, "output_tokens");
        let w = SyntheticWorkload { load: Load::RequestRate(0.0), ..Default::default() };
        assert_eq!(w.validate().unwrap_err().field, "request_rate");
        let w = SyntheticWorkload { shared_prefix_ratio: 1.5, ..Default::default() };
        assert_eq!(w.validate().unwrap_err().field, "shared_prefix_ratio");
    }
}
