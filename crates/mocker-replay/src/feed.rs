//! Sessions handed to the replay loop in order, with their prompts synthesised and
//! block-hashed. For large workloads that work runs on a second thread, a bounded
//! distance ahead of the simulation, since it is a fifth of a replay's CPU time.

use std::collections::VecDeque;
use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;

use mocker_core::hashing::{chain_hash, extend_hashes, extend_unique_identities, mix_identity, PromptHashes};

use crate::options::Workload;
use crate::trace::source::TraceSource;
use crate::workload::SyntheticSource;

/// One turn, ready to submit.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTurn {
    /// Request id.
    pub uuid: u128,
    /// Prompt tokens; empty with [`FeedOptions::tokenless`].
    pub tokens: Vec<u32>,
    /// Prompt length.
    pub input_length: usize,
    /// Output tokens.
    pub max_output_tokens: usize,
    /// Hashes of the prompt's full blocks (when prefix caching or the KV router needs
    /// them), computed here so the synthesis thread does that work.
    pub block_hashes: Option<PromptHashes>,
    /// With [`FeedOptions::private_tails`]: how many leading blocks other turns may share
    /// (`mocker_core::Request::shareable_blocks`); the hashes of later blocks are
    /// identities unique to the turn, and their locals are left out.
    pub shareable_blocks: Option<usize>,
    /// Delay after the previous turn of the session completes (ms, before the speedup).
    pub delay_ms: f64,
    /// Not released before this (ms, before the speedup): agentic v2 `not_before_ms`.
    pub not_before_ms: Option<f64>,
    /// Synthetic sessions: the session's index and the turn's (for the request log).
    pub session: Option<(u32, u32)>,
}

/// A session ready to start.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedSession {
    /// First-turn arrival for open-loop loads.
    pub arrival_ms: Option<f64>,
    /// Turns not yet dispatched, in order.
    pub turns: VecDeque<PlannedTurn>,
    /// The gate its first turn waits on (agentic dependencies), see `crate::deps`.
    pub gate: Option<u64>,
    /// Its index in workload order (generation order; a trace's file order), as the
    /// reference indexes sessions: turns due at the same instant are released in this
    /// order, not in the order their previous turns completed.
    pub order: u64,
}

impl PromptHashing {
    /// Whether local hashes are wanted too; `None` when no hashes are.
    fn with_local(self) -> Option<bool> {
        match self {
            Self::Off => None,
            Self::Sequence => Some(false),
            Self::WithLocal => Some(true),
        }
    }
}

/// How a [`SessionFeed`] prepares prompts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedOptions {
    /// The engines' block size.
    pub block_size: usize,
    /// Which hashes to compute.
    pub hashing: PromptHashing,
    /// Find each turn's blocks that no other turn can share (past a synthetic turn's group
    /// prefix; past a trace turn's first hash id no other row uses) and give them fresh
    /// identities instead of hashes, for engines told they are private. Only sound when
    /// no later prompt contains earlier outputs (not for delta traces).
    pub private_tails: bool,
    /// Hand the engines no prompt tokens (`PlannedTurn::tokens` empty), only lengths and
    /// block keys. Trace prompts are then never synthesised: their block identities come
    /// from the trace's block ids, folded so that they are equal exactly when the content
    /// hashes of the synthesised tokens would be. Synthetic prompts are hashed and then
    /// dropped on the feed's side, so the replay neither copies nor frees them. Only for
    /// engines that accept token-less requests (`mocker_core::Request::prompt_len`), and
    /// with `private_tails` (identities never leave the process). Delta traces keep tokens.
    pub tokenless: bool,
}

/// Prompt tokens below which a helper thread costs more than it saves.
const THREAD_MIN_PROMPT_TOKENS: usize = 4_000_000;
/// Sessions per message: handing over one at a time woke the other thread per request.
const BATCH: usize = 32;
/// Batches the helper thread may run ahead.
const LOOKAHEAD: usize = 8;

enum Source {
    Inline(Box<Planner>),
    Threaded {
        rx: Receiver<Vec<PlannedSession>>,
        batch: std::vec::IntoIter<PlannedSession>,
        worker: Option<JoinHandle<()>>,
    },
}

/// Where sessions come from.
#[allow(clippy::large_enum_variant)] // one per feed
enum Generator {
    Synthetic(SyntheticSource, f64),
    Trace(TraceSource),
}

/// Turns a workload into planned sessions.
struct Planner {
    source: Generator,
    keys: KeyMaker,
    /// Synthetic sessions generated so far (the next one's `PlannedSession::order`).
    generated: u64,
    /// Synthetic prompts are dropped once hashed (see [`FeedOptions::tokenless`]).
    tokenless: bool,
}

/// Computes prompts' block hashes and identities.
struct KeyMaker {
    block_size: usize,
    hashing: PromptHashing,
    private_tails: bool,
    /// Hashes of each synthetic prefix group's shared blocks, computed once per group.
    group_prefixes: Vec<Option<PromptHashes>>,
}

/// The hashes of `tokens`, whose first `shared` blocks are group `group`'s prefix: those
/// come from `cache` (filled on the group's first turn) and only the rest is hashed.
fn hashes_after_prefix(
    cache: &mut Vec<Option<PromptHashes>>,
    (group, shared): (usize, usize),
    tokens: &[u32],
    bs: usize,
    with_local: bool,
    capacity: usize,
) -> PromptHashes {
    if cache.len() <= group {
        cache.resize(group + 1, None);
    }
    let prefix = match &cache[group] {
        Some(p) if p.sequence.len() == shared => p,
        _ => {
            let head = &tokens[..shared * bs];
            let p =
                if with_local { PromptHashes::of(head, bs) } else { PromptHashes::sequence_only(head, bs) };
            cache[group].insert(p)
        }
    };
    // Sized for the whole generation at once: a clone of the prefix grew (and copied) on
    // the first block past it, for every turn, and again in the engine's submit.
    let mut h = PromptHashes {
        sequence: Vec::with_capacity(capacity),
        local: Vec::with_capacity(if with_local { capacity } else { 0 }),
    };
    h.sequence.extend_from_slice(&prefix.sequence);
    h.local.extend_from_slice(&prefix.local);
    let parent = h.sequence.last().copied();
    let locals = with_local.then_some(&mut h.local);
    extend_hashes(parent, &tokens[shared * bs..], bs, &mut h.sequence, locals);
    h
}

/// Which block identities the feed computes for each prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptHashing {
    /// None: prefix caching is off and no KV router reads them.
    Off,
    /// Sequence hashes, the prefix-cache and routing keys.
    Sequence,
    /// Sequence and local hashes, for engines that record KV events (Stored events carry
    /// the local ones).
    WithLocal,
}

impl Planner {
    fn next(&mut self) -> Option<PlannedSession> {
        match &mut self.source {
            Generator::Synthetic(source, delay) => {
                let delay = *delay;
                let arrival_ms = source.next_arrival_ms();
                let mut state = source.start_session()?;
                let mut turns = VecDeque::with_capacity(source.turns_per_session());
                while let Some(t) = source.next_turn(&mut state) {
                    // Blocks past the group prefix are unique by construction (see
                    // `TurnRequest::shared_prefix`).
                    let shareable = self.keys.private_tails.then(|| t.shared_prefix.map_or(0, |(_, n)| n));
                    let block_hashes = self.keys.prompt_hashes(
                        t.uuid,
                        &t.tokens,
                        t.max_output_tokens,
                        t.shared_prefix,
                        shareable,
                    );
                    turns.push_back(PlannedTurn {
                        uuid: t.uuid,
                        block_hashes,
                        shareable_blocks: shareable,
                        input_length: t.tokens.len(),
                        tokens: if self.tokenless { Vec::new() } else { t.tokens },
                        max_output_tokens: t.max_output_tokens,
                        delay_ms: if turns.is_empty() { 0.0 } else { delay },
                        not_before_ms: None,
                        session: t.session,
                    });
                }
                let order = self.generated;
                self.generated += 1;
                Some(PlannedSession { arrival_ms, turns, gate: None, order })
            }
            Generator::Trace(source) => {
                let arrival_ms = source.next_arrival_ms();
                let session = source.next_session()?;
                let bs = self.keys.block_size;
                let mut turns = VecDeque::with_capacity(session.turns.len());
                for t in session.turns {
                    let shareable = match t.shareable_tokens {
                        Some(n) if self.keys.private_tails => Some(n / bs),
                        _ => None,
                    };
                    let block_hashes = if t.tokens.is_empty() && t.input_length > 0 {
                        let tbs = source.trace_block_size();
                        self.keys.id_hashes(
                            t.uuid,
                            &t.ids,
                            tbs,
                            t.input_length,
                            t.max_output_tokens,
                            shareable,
                        )
                    } else {
                        self.keys.prompt_hashes(t.uuid, &t.tokens, t.max_output_tokens, None, shareable)
                    };
                    turns.push_back(PlannedTurn {
                        uuid: t.uuid,
                        block_hashes,
                        shareable_blocks: shareable,
                        input_length: t.input_length,
                        tokens: t.tokens,
                        max_output_tokens: t.max_output_tokens,
                        delay_ms: t.delay_ms,
                        not_before_ms: t.not_before_ms,
                        session: None,
                    });
                }
                Some(PlannedSession { arrival_ms, turns, gate: session.gate, order: session.order })
            }
        }
    }
}

impl KeyMaker {
    /// [`prompt_hashes`](Self::prompt_hashes) of a token-less trace prompt of `len` tokens
    /// made of trace blocks `ids` of `tbs` tokens each. A block's content is its trace
    /// ids and where it starts within the first of them; two prompts' blocks at one index
    /// hold the same tokens exactly when those agree (an id's tokens are its own), so
    /// folding them and chaining gives keys equal exactly when the content hashes are.
    fn id_hashes(
        &mut self,
        uuid: u128,
        ids: &[u32],
        tbs: usize,
        len: usize,
        max_output: usize,
        shareable: Option<usize>,
    ) -> Option<PromptHashes> {
        let bs = self.block_size;
        let with_local = self.hashing.with_local()?;
        let blocks = len / bs;
        let hashed = shareable.map_or(blocks, |n| n.min(blocks));
        // Both sized for the whole generation, so the engine's submit need not grow them.
        let capacity = (len + max_output).div_ceil(bs);
        let mut h = PromptHashes {
            sequence: Vec::with_capacity(capacity),
            local: Vec::with_capacity(if with_local { capacity } else { 0 }),
        };
        let mut parent = None;
        for k in 0..hashed {
            let (start, end) = (k * bs, (k + 1) * bs);
            let local = ids[start / tbs..=(end - 1) / tbs]
                .iter()
                .fold(mix_identity(0, (start % tbs) as u64), |acc, &id| mix_identity(acc, u64::from(id)));
            let seq = parent.map_or(local, |p| chain_hash(p, local));
            h.sequence.push(seq);
            if with_local {
                h.local.push(local);
            }
            parent = Some(seq);
        }
        extend_unique_identities(uuid, hashed as u32..blocks as u32, &mut h.sequence);
        Some(h)
    }

    /// The hashes of a turn's prompt: the first `group.1` blocks from the group's cache,
    /// hashes up to `shareable` blocks (all when `None`), fresh identities after that.
    fn prompt_hashes(
        &mut self,
        uuid: u128,
        tokens: &[u32],
        max_output: usize,
        group: Option<(usize, usize)>,
        shareable: Option<usize>,
    ) -> Option<PromptHashes> {
        let bs = self.block_size;
        let with_local = self.hashing.with_local()?;
        let blocks = tokens.len() / bs;
        let hashed = shareable.map_or(blocks, |n| n.min(blocks));
        // Sized for the whole generation, so the engine's submit need not grow them.
        let capacity = (tokens.len() + max_output).div_ceil(bs);
        let mut h = match group {
            Some((g, prefix)) if prefix > 0 && prefix <= hashed => hashes_after_prefix(
                &mut self.group_prefixes,
                (g, prefix),
                &tokens[..hashed * bs],
                bs,
                with_local,
                capacity,
            ),
            _ => {
                let mut h = PromptHashes {
                    sequence: Vec::with_capacity(capacity),
                    local: Vec::with_capacity(if with_local { capacity } else { 0 }),
                };
                let locals = with_local.then_some(&mut h.local);
                extend_hashes(None, &tokens[..hashed * bs], bs, &mut h.sequence, locals);
                h
            }
        };
        extend_unique_identities(uuid, hashed as u32..blocks as u32, &mut h.sequence);
        Some(h)
    }
}

/// Planned sessions in workload order.
pub struct SessionFeed {
    source: Source,
    peeked: Option<PlannedSession>,
    remaining: usize,
}

impl SessionFeed {
    /// A feed of `workload`, prompts prepared as `options` say.
    pub fn new(workload: &Workload, options: FeedOptions) -> Self {
        let FeedOptions { block_size, hashing, private_tails, tokenless } = options;
        let (source, remaining, total_prompt_tokens) = match workload {
            Workload::Synthetic(w) => (
                Generator::Synthetic(SyntheticSource::new(w.clone(), block_size), w.inter_turn_delay_ms),
                w.request_count,
                w.total_requests().saturating_mul(w.input_tokens),
            ),
            Workload::Trace(t) => {
                let source = TraceSource::new(t);
                let source = if tokenless { source.tokenless() } else { source };
                let per_copy = t.trace.prompt_tokens() as usize;
                let remaining = source.sessions_remaining();
                (Generator::Trace(source), remaining, per_copy.saturating_mul(t.repeat))
            }
        };
        let keys = KeyMaker { block_size, hashing, private_tails, group_prefixes: Vec::new() };
        let tokenless = tokenless && private_tails;
        let mut planner = Planner { source, keys, generated: 0, tokenless };
        let source = if total_prompt_tokens < THREAD_MIN_PROMPT_TOKENS {
            Source::Inline(Box::new(planner))
        } else {
            let (tx, rx) = sync_channel(LOOKAHEAD);
            let worker = std::thread::Builder::new()
                .name("mocker-prompts".into())
                .spawn(move || loop {
                    let batch: Vec<_> = std::iter::from_fn(|| planner.next()).take(BATCH).collect();
                    if batch.is_empty() || tx.send(batch).is_err() {
                        return; // done, or the replay stopped early
                    }
                })
                .expect("spawn prompt synthesis thread");
            Source::Threaded { rx, batch: Vec::new().into_iter(), worker: Some(worker) }
        };
        Self { source, peeked: None, remaining }
    }

    fn fill(&mut self) {
        if self.peeked.is_some() || self.remaining == 0 {
            return;
        }
        self.peeked = match &mut self.source {
            Source::Inline(p) => p.next(),
            // A closed channel before `remaining` reached 0 means the thread died; the
            // replay then ends early and reports the sessions it got.
            Source::Threaded { rx, batch, .. } => batch.next().or_else(|| {
                *batch = rx.recv().ok()?.into_iter();
                batch.next()
            }),
        };
        if self.peeked.is_none() {
            self.remaining = 0;
        }
    }

    /// Arrival (ms) of the next session's first turn, for open-loop loads.
    pub fn next_arrival_ms(&mut self) -> Option<f64> {
        self.fill();
        self.peeked.as_ref().and_then(|s| s.arrival_ms)
    }

    /// Takes the next session.
    pub fn start_session(&mut self) -> Option<PlannedSession> {
        self.fill();
        let s = self.peeked.take()?;
        self.remaining -= 1;
        Some(s)
    }

    /// Sessions not taken yet.
    pub fn sessions_remaining(&self) -> usize {
        self.remaining
    }
}

impl Drop for SessionFeed {
    fn drop(&mut self) {
        if let Source::Threaded { rx, worker, .. } = &mut self.source {
            // Disconnecting wakes a sender blocked on a full channel; then it finishes.
            let (_, dead) = sync_channel::<Vec<PlannedSession>>(0);
            drop(std::mem::replace(rx, dead));
            if let Some(w) = worker.take() {
                let _ = w.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Load;
    use rustc_hash::FxHashMap;

    use crate::workload::SyntheticWorkload;

    fn opts(block_size: usize, hashing: PromptHashing, private_tails: bool) -> FeedOptions {
        FeedOptions { block_size, hashing, private_tails, tokenless: false }
    }

    fn collect(w: &SyntheticWorkload) -> Vec<PlannedSession> {
        let mut feed = SessionFeed::new(&w.clone().into(), opts(64, PromptHashing::WithLocal, false));
        let mut out = Vec::new();
        while let Some(s) = feed.start_session() {
            out.push(s);
        }
        assert_eq!(feed.sessions_remaining(), 0);
        out
    }

    #[test]
    fn threaded_and_inline_feeds_agree() {
        let small = SyntheticWorkload {
            input_tokens: 1000,
            request_count: 50,
            turns_per_session: 2,
            load: Load::RequestRate(10.0),
            ..Default::default()
        };
        // Same workload but large enough to use the thread; compare its first sessions.
        let big = SyntheticWorkload { request_count: 2_500, ..small.clone() };
        let a = collect(&small);
        let b = collect(&big);
        assert_eq!(a.len(), 50);
        assert_eq!(b.len(), 2_500);
        assert_eq!(a[..], b[..50]);
        let t = &a[3].turns[1];
        assert_eq!(t.block_hashes, Some(PromptHashes::of(&t.tokens, 64)));
    }

    #[test]
    fn prefix_group_hashes_equal_hashing_the_whole_prompt() {
        // 1000 tokens at block 64: 16 blocks, the last partial; ratios put the shared prefix
        // inside, at and past the last whole block.
        for ratio in [0.3, 0.94, 1.0] {
            let w = SyntheticWorkload {
                input_tokens: 1000,
                request_count: 24,
                shared_prefix_ratio: ratio,
                num_prefix_groups: 3,
                load: Load::Concurrency(4),
                ..Default::default()
            };
            for hashing in [PromptHashing::Sequence, PromptHashing::WithLocal] {
                let mut feed = SessionFeed::new(&w.clone().into(), opts(64, hashing, false));
                let mut firsts = std::collections::BTreeSet::new();
                let mut turns = 0;
                while let Some(s) = feed.start_session() {
                    for t in &s.turns {
                        let mut want = PromptHashes::of(&t.tokens, 64);
                        if hashing == PromptHashing::Sequence {
                            want.local.clear();
                        }
                        assert_eq!(t.block_hashes.as_ref(), Some(&want), "ratio {ratio}, {hashing:?}");
                        firsts.insert(t.block_hashes.as_ref().unwrap().sequence[0]);
                        turns += 1;
                    }
                }
                // Turns of one group share their leading block, so the shared-prefix path ran.
                assert!(firsts.len() <= 3 && turns == 24, "{} distinct first blocks", firsts.len());
            }
        }
    }

    /// The contract of private tails: as cache keys the identities behave like the content
    /// hashes (a bijection over every block of the run), and every block past a turn's
    /// shareable count occurs in that turn only.
    fn check_private_tails(workload: &Workload, bs: usize) -> usize {
        let mut feed = SessionFeed::new(workload, opts(bs, PromptHashing::Sequence, true));
        let (mut by_hash, mut by_id) = (FxHashMap::default(), FxHashMap::default());
        let mut uses: FxHashMap<u64, usize> = FxHashMap::default();
        let mut tails = Vec::new();
        let mut shared = 0;
        while let Some(s) = feed.start_session() {
            for t in &s.turns {
                let ids = &t.block_hashes.as_ref().unwrap().sequence;
                let hashes = PromptHashes::sequence_only(&t.tokens, bs).sequence;
                assert_eq!(ids.len(), hashes.len(), "at {bs}");
                let n = t.shareable_blocks.expect("private tails are marked");
                for (i, (&h, &id)) in hashes.iter().zip(ids).enumerate() {
                    shared += usize::from(by_hash.contains_key(&h));
                    assert_eq!(*by_hash.entry(h).or_insert(id), id, "at {bs}");
                    assert_eq!(*by_id.entry(id).or_insert(h), h, "at {bs}");
                    *uses.entry(h).or_default() += 1;
                    if i >= n {
                        tails.push(h);
                    }
                }
            }
        }
        for h in tails {
            assert_eq!(uses[&h], 1, "a private block occurs elsewhere, at {bs}");
        }
        shared
    }

    #[test]
    fn private_tails_are_unique_and_their_identities_act_as_hashes() {
        let base = SyntheticWorkload { input_tokens: 300, request_count: 60, ..Default::default() };
        let cases = [
            (base.clone(), 64),
            (base.clone(), 1),
            (SyntheticWorkload { turns_per_session: 3, ..base.clone() }, 16),
            (SyntheticWorkload { shared_prefix_ratio: 0.5, num_prefix_groups: 3, ..base.clone() }, 64),
            (SyntheticWorkload { shared_prefix_ratio: 0.5, num_prefix_groups: 3, ..base.clone() }, 1),
            (
                SyntheticWorkload {
                    shared_prefix_ratio: 1.0,
                    num_prefix_groups: 2,
                    turns_per_session: 2,
                    ..base
                },
                7,
            ),
        ];
        for (w, bs) in cases {
            let shared = check_private_tails(&w.clone().into(), bs);
            // Prefix groups do share blocks, so both directions were exercised.
            assert_eq!(shared > 0, w.num_prefix_groups > 0, "{w:?} at {bs}");
        }
        // Trace rows share ids 1 and 2 (and 5 twice within one row); the rest are theirs
        // alone. Block sizes that divide the trace's 4 and that straddle it.
        let text = "{\"timestamp\": 0, \"output_length\": 2, \"hash_ids\": [1, 2, 3, 4]}\n\
                    {\"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [1, 2, 6], \"input_length\": 10}\n\
                    {\"timestamp\": 2, \"output_length\": 2, \"hash_ids\": [1, 5, 5, 7]}\n\
                    {\"timestamp\": 3, \"output_length\": 2, \"hash_ids\": [8]}";
        let trace = std::sync::Arc::new(
            crate::trace::load::parse_trace(text, crate::trace::TraceFormat::Mooncake, Some(4)).unwrap(),
        );
        for bs in [1, 2, 3, 4] {
            let w = Workload::Trace(crate::options::TraceWorkload {
                trace: trace.clone(),
                concurrency: None,
                repeat: 1,
                lanes: None,
            });
            assert!(check_private_tails(&w, bs) > 0, "rows share blocks at {bs}");
        }
        let w = Workload::Trace(crate::options::TraceWorkload {
            trace,
            concurrency: None,
            repeat: 1,
            lanes: None,
        });
        let mut feed = SessionFeed::new(&w, opts(2, PromptHashing::Sequence, true));
        let firsts: Vec<_> =
            std::iter::from_fn(|| feed.start_session()).map(|s| s.turns[0].shareable_blocks).collect();
        assert_eq!(firsts, vec![Some(4), Some(4), Some(6), Some(0)]);
    }

    /// Token-less trace turns: identities folded from the trace ids behave like the content
    /// hashes of the synthesised prompts (a bijection over every block of the run), with
    /// the same lengths and shareable counts, whether engine blocks split trace blocks,
    /// straddle them or span several.
    #[test]
    fn tokenless_trace_identities_act_as_content_hashes() {
        let text = "{\"timestamp\": 0, \"output_length\": 2, \"hash_ids\": [1, 2, 3, 4]}\n\
                    {\"timestamp\": 1, \"output_length\": 2, \"hash_ids\": [1, 2, 6], \"input_length\": 10}\n\
                    {\"timestamp\": 2, \"output_length\": 2, \"hash_ids\": [1, 5, 5, 7]}\n\
                    {\"timestamp\": 3, \"output_length\": 2, \"hash_ids\": [1, 5, 5, 9, 2]}\n\
                    {\"timestamp\": 4, \"output_length\": 2, \"hash_ids\": [1, 2, 3, 4, 8], \"input_length\": 19}\n\
                    {\"timestamp\": 5, \"output_length\": 2, \"hash_ids\": [8]}";
        let trace = std::sync::Arc::new(
            crate::trace::load::parse_trace(text, crate::trace::TraceFormat::Mooncake, Some(4)).unwrap(),
        );
        for repeat in [1, 2] {
            let w = Workload::Trace(crate::options::TraceWorkload {
                trace: trace.clone(),
                concurrency: None,
                repeat,
                lanes: None,
            });
            for bs in [1, 2, 3, 4, 5, 8] {
                for hashing in [PromptHashing::Sequence, PromptHashing::WithLocal] {
                    let plain =
                        FeedOptions { block_size: bs, hashing, private_tails: true, tokenless: false };
                    let mut with_tokens = SessionFeed::new(&w, plain);
                    let mut tokenless = SessionFeed::new(&w, FeedOptions { tokenless: true, ..plain });
                    let (mut by_hash, mut by_id) = (FxHashMap::default(), FxHashMap::default());
                    let mut shared = 0;
                    while let Some(a) = with_tokens.start_session() {
                        let b = tokenless.start_session().unwrap();
                        let (a, b) = (&a.turns[0], &b.turns[0]);
                        assert!(b.tokens.is_empty());
                        assert_eq!(
                            (a.input_length, a.shareable_blocks),
                            (b.input_length, b.shareable_blocks)
                        );
                        let ids = b.block_hashes.as_ref().unwrap();
                        let hashes = PromptHashes::sequence_only(&a.tokens, bs).sequence;
                        assert_eq!(ids.sequence.len(), hashes.len(), "at {bs}");
                        let shareable = b.shareable_blocks.unwrap_or(usize::MAX).min(hashes.len());
                        if hashing == PromptHashing::WithLocal {
                            assert_eq!(ids.local.len(), shareable, "locals of the shareable blocks");
                        }
                        for (&h, &id) in hashes.iter().zip(&ids.sequence) {
                            shared += usize::from(by_hash.contains_key(&h));
                            assert_eq!(*by_hash.entry(h).or_insert(id), id, "at {bs}, repeat {repeat}");
                            assert_eq!(*by_id.entry(id).or_insert(h), h, "at {bs}, repeat {repeat}");
                        }
                    }
                    assert!(tokenless.start_session().is_none());
                    assert!(shared > 0, "rows share blocks at {bs}");
                }
            }
        }
    }

    #[test]
    fn dropping_a_threaded_feed_early_stops_its_thread() {
        let w = SyntheticWorkload { input_tokens: 1000, request_count: 100_000, ..Default::default() };
        let mut feed = SessionFeed::new(&w.into(), opts(64, PromptHashing::Off, false));
        assert!(feed.start_session().is_some());
        drop(feed); // must not hang
    }
}
