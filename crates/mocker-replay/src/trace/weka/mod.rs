//! Weka/AgentX agent traces, lowered to an agentic request graph as the reference does.
//!
//! A corpus is a `.json` file (one trace object), a `.jsonl` file (one per line) or a
//! directory of them (walked in name order; symlinks refused). A trace object ("play") is
//! `{id, block_size, hash_id_scope: "local", models?, requests: [...]}` whose entries are
//! requests (`type` `n` or `s`: `{t (s), model, in, out, hash_ids, api_time?}`) or
//! `subagent` markers (`{t, agent_id, status, duration_ms?, requests: [...]}`).
//!
//! Lowering, per play: requests are grouped into conversation *streams* by their hash ids
//! (a request extends the stream whose last prompt is a prefix of its own, same model,
//! ended by then; otherwise it forks off the stream it shares the longest prefix with, and
//! a fork that starts after its parent's tail ended is spliced back as the conversation
//! going on). Within a stream each request follows its predecessor's completion after the
//! recorded gap (`t` minus the predecessor's `t + api_time`); a fork follows its parent's
//! dispatch or completion; a request also waits for the latest request of every other
//! stream of its scope that had ended before it started ("replay barrier"); a blocking
//! subagent's streams are joined by the first later parent request after its end. Every
//! request is also held until its recorded offset from the play's first request
//! (`not_before_ms`). Plays all start at time 0.
//!
//! Prompt blocks: the first `in / block_size` blocks take the request's hash ids, scoped
//! to the file (a missing id makes a block private); a partial last block is private.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::trace::agentic::RawDep;
use crate::trace::keys::KeyCheck;
use crate::trace::parser::{Parser, RowPrompt};
use crate::trace::{DepTrigger, GraphRow, NestedTimestampBasis, RowPlay, Trace, TraceError, TraceFormat};

mod read;

use read::{read_play, source_files, Play, Req};

const EPS_S: f64 = 1e-6;
const SEAM_MAX_GAP_S: f64 = 3600.0;
const SEAM_MIN_OVERLAP: f64 = 0.5;

fn request_order(a: &Req, b: &Req) -> std::cmp::Ordering {
    a.t.total_cmp(&b.t).then(a.order.cmp(&b.order)).then_with(|| a.source.cmp(&b.source))
}

fn lcp(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Recorded seconds to the graph's milliseconds (negative: no wait).
fn ms(seconds: f64) -> f64 {
    (seconds.max(0.0) * 1e9).round() / 1e6
}

#[derive(Clone)]
struct Fork {
    source: Option<String>,
    depth: usize,
    time: f64,
}

#[derive(Default)]
struct Chain {
    requests: Vec<Req>,
    fork: Option<Fork>,
    spliced_into: Option<usize>,
    tail_source: Option<String>,
    tail_hashes: Vec<u64>,
    tail_end: f64,
    tail_model: String,
}

impl Chain {
    fn append(&mut self, r: Req) {
        if !r.hashes.is_empty() {
            self.tail_source = Some(r.source.clone());
            self.tail_hashes.clone_from(&r.hashes);
            self.tail_end = r.end();
            self.tail_model.clone_from(&r.model);
        }
        self.requests.push(r);
    }
}

struct Stream {
    session: String,
    requests: Vec<Req>,
    fork_source: Option<String>,
    scope: String,
}

/// A lowered request: its place in the play and what it waits for.
struct Row {
    req: Req,
    session: String,
    not_before_ms: f64,
    deps: Vec<(String, DepTrigger, f64, &'static str)>,
}

fn push_dep(
    deps: &mut Vec<(String, DepTrigger, f64, &'static str)>,
    d: (String, DepTrigger, f64, &'static str),
) {
    if !deps.iter().any(|e| e.0 == d.0 && e.1 == d.1 && e.3 == d.3) {
        deps.push(d);
    }
}

/// Reads a Weka corpus (file or directory); `block_size` is the explicit
/// `--trace-block-size`, which must then equal the corpus's.
pub(crate) fn load_weka(
    path: &Path,
    block_size: Option<usize>,
    basis: NestedTimestampBasis,
) -> Result<Trace, TraceError> {
    let fail = |p: &Path, line: usize, field: &str, message: String| TraceError {
        path: p.to_path_buf(),
        line,
        field: field.into(),
        message,
    };
    let files = source_files(path).map_err(|m| fail(path, 0, "trace", m))?;
    if files.is_empty() {
        return Err(fail(path, 0, "trace", "contains no .json or .jsonl files".into()));
    }
    let mut texts = Vec::new();
    for (f, name) in &files {
        let bytes = std::fs::read(f).map_err(|e| fail(f, 0, "trace", format!("cannot read: {e}")))?;
        let text = String::from_utf8(bytes).map_err(|_| fail(f, 0, "trace", "is not UTF-8".into()))?;
        texts.push((f.clone(), name.clone(), text));
    }
    parse_corpus(&texts, block_size, basis)
}

/// Parses Weka text as one `.jsonl` file (tests and `parse_trace`).
pub(crate) fn parse_weka_text(
    text: &str,
    block_size: Option<usize>,
    basis: NestedTimestampBasis,
) -> Result<Trace, TraceError> {
    parse_corpus(&[(PathBuf::new(), "trace.jsonl".into(), text.to_string())], block_size, basis)
}

fn parse_corpus(
    files: &[(PathBuf, String, String)],
    block_size: Option<usize>,
    basis: NestedTimestampBasis,
) -> Result<Trace, TraceError> {
    let mut plays = Vec::new();
    let mut keys = KeyCheck::default();
    for (path, name, text) in files {
        keys.set_file(path.clone());
        let at = |line: usize, field: &str, message: String| TraceError {
            path: path.clone(),
            line,
            field: field.into(),
            message,
        };
        if name.to_ascii_lowercase().ends_with(".json") {
            let v: Value = serde_json::from_str(text)
                .map_err(|e| at(e.line(), "trace", format!("invalid JSON: {e}")))?;
            let play = read_play(&v, plays.len(), name, name.clone(), path, 1, &mut keys);
            plays.push(noted(&keys, play)?);
        } else {
            let mut objects = 0;
            for (l, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let v: Value = serde_json::from_str(line)
                    .map_err(|e| at(l + 1, "trace", format!("invalid JSON: {e}")))?;
                let source = format!("{name}#{objects:06}");
                objects += 1;
                let play = read_play(&v, plays.len(), name, source, path, l + 1, &mut keys);
                plays.push(noted(&keys, play)?);
            }
        }
    }
    let Some(first) = plays.first() else {
        return Err(TraceError {
            path: files[0].0.clone(),
            line: 0,
            field: "trace".into(),
            message: "contains no trace objects".into(),
        });
    };
    let bs = first.block_size;
    if let Some(p) = plays.iter().find(|p| p.block_size != bs) {
        let msg = format!("{} differs from the corpus's {bs}; one block size per corpus", p.block_size);
        return Err(TraceError {
            path: p.path.clone(),
            line: p.line,
            field: "block_size".into(),
            message: msg,
        });
    }
    if let Some(b) = block_size.filter(|&b| b != bs) {
        let msg =
            format!("the corpus says {bs} but --trace-block-size is {b}; drop the flag or make them agree");
        return Err(TraceError {
            path: first.path.clone(),
            line: first.line,
            field: "block_size".into(),
            message: msg,
        });
    }
    // `auto`: nested timestamps are relative to their subagent marker when any of them
    // precedes its marker (corpus-wide), else absolute; "not applicable" (read as
    // absolute) when no subagent has requests. That is the reference's corpus heuristic.
    let nested = || plays.iter().flat_map(|p| &p.subagents).filter(|s| !s.requests.is_empty());
    let (relative, resolved) = match basis {
        NestedTimestampBasis::Absolute => (false, "absolute"),
        NestedTimestampBasis::Relative => (true, "relative"),
        NestedTimestampBasis::Auto if nested().next().is_none() => (false, "not_applicable"),
        NestedTimestampBasis::Auto if nested().any(|s| s.requests.iter().any(|r| r.t < s.t - EPS_S)) => {
            (true, "relative")
        }
        NestedTimestampBasis::Auto => (false, "absolute"),
    };
    let mut parser = Parser::default();
    parser.format = TraceFormat::Weka;
    parser.block_size = bs;
    let mut ids: HashMap<(usize, u64), u32> = HashMap::new();
    for play in &plays {
        let rows = lower(play, relative)?;
        emit(&mut parser, play, rows, &mut ids)?;
    }
    let mut trace = parser.finish();
    trace.nested_timestamp_basis = Some(resolved);
    trace.path = files[0].0.clone();
    trace.unknown_keys = keys.finish();
    Ok(trace)
}

/// `read`'s error, with the misspelt keys of its line that look meant for its field.
fn noted<T>(keys: &KeyCheck, read: Result<T, TraceError>) -> Result<T, TraceError> {
    read.map_err(|mut e| {
        if let Some(note) = keys.note(e.line, &e.field) {
            e.message += &note;
        }
        e
    })
}

/// The first request, when it shares nothing with the rest (a system preamble): kept out
/// of stream detection and put back into the main stream.
fn split_preamble(mut reqs: Vec<Req>) -> (Vec<Req>, Vec<Req>) {
    reqs.sort_by(request_order);
    if reqs.len() < 2 || reqs[0].hashes.is_empty() {
        return (Vec::new(), reqs);
    }
    let first = &reqs[0];
    if reqs[1..].iter().any(|o| lcp(&first.hashes, &o.hashes) > 0) {
        return (Vec::new(), reqs);
    }
    if first.output > 64 {
        let others: HashSet<u64> = reqs[1..].iter().flat_map(|r| r.hashes.iter().copied()).collect();
        if first.hashes.iter().any(|h| others.contains(h)) {
            return (Vec::new(), reqs);
        }
    }
    let first = reqs.remove(0);
    (vec![first], reqs)
}

/// Chains of requests (conversations) and which is the main one.
fn detect_chains(mut reqs: Vec<Req>) -> (Vec<Chain>, usize, Vec<usize>) {
    reqs.sort_by(request_order);
    let mut chains: Vec<Chain> = Vec::new();
    let mut chain_of: HashMap<String, usize> = HashMap::new();
    let mut forks_by_source: HashMap<String, Vec<usize>> = HashMap::new();
    let mut by_source: HashMap<String, Req> = HashMap::new();
    for r in reqs {
        by_source.insert(r.source.clone(), r.clone());
        if chains.is_empty() {
            chains.push(Chain::default());
        }
        if r.hashes.is_empty() {
            chain_of.insert(r.source.clone(), 0);
            chains[0].requests.push(r);
            continue;
        }
        // The longest chain tail this prompt extends.
        let mut target = None;
        let mut best_len = 0;
        for (i, c) in chains.iter().enumerate() {
            let n = c.tail_hashes.len();
            if n == 0
                || n > r.hashes.len()
                || n <= best_len
                || c.tail_model != r.model
                || c.tail_end > r.t + EPS_S
                || c.tail_hashes[..] != r.hashes[..n]
            {
                continue;
            }
            target = Some(i);
            best_len = n;
        }
        if let Some(i) = target.or_else(|| chains.iter().all(|c| c.tail_hashes.is_empty()).then_some(0)) {
            chain_of.insert(r.source.clone(), i);
            chains[i].append(r);
            continue;
        }
        // A fork off the chain it shares the longest prefix with.
        let mut parent = None;
        let mut key = (0, 0);
        for (i, c) in chains.iter().enumerate() {
            let k = (lcp(&c.tail_hashes, &r.hashes), c.tail_hashes.len());
            if k.0 > 0 && k > key {
                parent = Some(i);
                key = k;
            }
        }
        let source = parent.and_then(|p| chains[p].tail_source.clone());
        let index = chains.len();
        chains.push(Chain {
            fork: Some(Fork { source: source.clone(), depth: key.0, time: r.t }),
            ..Chain::default()
        });
        chain_of.insert(r.source.clone(), index);
        chains[index].append(r);
        if let Some(s) = source.filter(|_| key.0 > 0) {
            forks_by_source.entry(s).or_default().push(index);
        }
    }
    resolve_seams(&mut chains, &mut forks_by_source, &mut chain_of, &by_source);
    let first_of = |c: &Chain| c.requests[0].clone();
    let live: Vec<usize> = (0..chains.len())
        .filter(|&i| chains[i].spliced_into.is_none() && !chains[i].requests.is_empty())
        .collect();
    let main = live
        .iter()
        .copied()
        .min_by(|&a, &b| request_order(&first_of(&chains[a]), &first_of(&chains[b])))
        .unwrap_or(0);
    let mut workers: Vec<usize> = live.into_iter().filter(|&i| i != main).collect();
    workers.sort_by(|&a, &b| request_order(&first_of(&chains[a]), &first_of(&chains[b])));
    (chains, main, workers)
}

/// Splices a fork that starts after its parent's tail ended back into the parent: the
/// same conversation, going on with an edited prefix.
fn resolve_seams(
    chains: &mut [Chain],
    forks_by_source: &mut HashMap<String, Vec<usize>>,
    chain_of: &mut HashMap<String, usize>,
    by_source: &HashMap<String, Req>,
) {
    let mut keys: BTreeSet<String> = forks_by_source.keys().cloned().collect();
    let mut aliases: HashMap<usize, usize> = HashMap::new();
    let mut processed: HashSet<String> = HashSet::new();
    while let Some(source) = keys.pop_first() {
        if !processed.insert(source.clone()) {
            continue;
        }
        let mut owner = chain_of[&source];
        while let Some(&next) = aliases.get(&owner) {
            owner = next;
        }
        if chains[owner].tail_source.as_deref() != Some(source.as_str()) {
            continue;
        }
        let tail = &by_source[&source];
        let registered: Vec<usize> =
            forks_by_source[&source].iter().copied().filter(|&i| chains[i].spliced_into.is_none()).collect();
        let eligible = |c: &Chain| {
            let Some(f) = &c.fork else { return false };
            if f.depth == 0 || c.requests.is_empty() {
                return false;
            }
            let first = &c.requests[0];
            let gap = first.t - tail.end();
            let overlap = f.depth as f64 / tail.hashes.len().max(1) as f64;
            tail.end() <= first.t + EPS_S
                && first.model == tail.model
                && !(gap > SEAM_MAX_GAP_S && overlap < SEAM_MIN_OVERLAP)
        };
        let elected = registered.iter().copied().filter(|&i| eligible(&chains[i])).max_by(|&a, &b| {
            let (fa, fb) = (chains[a].fork.as_ref().unwrap(), chains[b].fork.as_ref().unwrap());
            fa.depth.cmp(&fb.depth).then_with(|| fb.time.total_cmp(&fa.time)).then_with(|| b.cmp(&a))
        });
        let Some(elected) = elected else { continue };
        let moved = std::mem::take(&mut chains[elected].requests);
        for r in &moved {
            chain_of.insert(r.source.clone(), owner);
        }
        chains[owner].requests.extend(moved);
        chains[owner].tail_source = chains[elected].tail_source.clone();
        chains[owner].tail_hashes = chains[elected].tail_hashes.clone();
        chains[owner].tail_end = chains[elected].tail_end;
        chains[owner].tail_model = chains[elected].tail_model.clone();
        chains[elected].spliced_into = Some(owner);
        aliases.insert(elected, owner);
        let Some(new_tail) = chains[owner].tail_source.clone() else { continue };
        let new_hashes = chains[owner].tail_hashes.clone();
        let new_tail_t = by_source[&new_tail].t;
        for c in registered {
            if c == elected || chains[c].spliced_into.is_some() {
                continue;
            }
            let first = &chains[c].requests[0];
            if new_tail_t > first.t + EPS_S {
                continue;
            }
            let depth = lcp(&new_hashes, &first.hashes);
            if depth == 0 {
                continue;
            }
            let f = chains[c].fork.as_mut().unwrap();
            f.source = Some(new_tail.clone());
            f.depth = depth;
            forks_by_source.entry(new_tail.clone()).or_default().push(c);
            processed.remove(&new_tail);
            keys.insert(new_tail.clone());
        }
    }
}

fn streams(
    prefix: &str,
    chains: &[Chain],
    main: usize,
    workers: &[usize],
    preamble: Vec<Req>,
) -> Vec<Stream> {
    let mut out = Vec::with_capacity(1 + workers.len());
    let mut requests = chains[main].requests.clone();
    requests.extend(preamble);
    requests.sort_by(request_order);
    let fork_of = |c: &Chain| c.fork.as_ref().and_then(|f| f.source.clone());
    out.push(Stream {
        session: format!("session:{prefix}"),
        requests,
        fork_source: fork_of(&chains[main]),
        scope: format!("scope:{prefix}"),
    });
    for (k, &c) in workers.iter().enumerate() {
        let mut requests = chains[c].requests.clone();
        requests.sort_by(request_order);
        out.push(Stream {
            session: format!("session:{prefix}:worker:{k}"),
            requests,
            fork_source: fork_of(&chains[c]),
            scope: format!("scope:{prefix}"),
        });
    }
    out
}

/// A play's requests with their sessions, release times and dependencies.
fn lower(play: &Play, relative: bool) -> Result<Vec<Row>, TraceError> {
    let err = |field: &str, message: String| TraceError {
        path: play.path.clone(),
        line: play.line,
        field: field.into(),
        message,
    };
    let (preamble, rest) = split_preamble(play.top.clone());
    let (chains, main, workers) = detect_chains(rest);
    let mut all = streams("root", &chains, main, &workers, preamble);
    let parents = all.len();
    let mut joins: Vec<(String, Vec<String>)> = Vec::new();
    for sa in &play.subagents {
        // The owner: the latest-authored parent request before the marker.
        let owner = all[..parents]
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.requests.iter().filter(|r| r.order < sa.outer).map(move |r| (i, r)))
            .max_by_key(|(_, r)| r.order)
            .map(|(i, r)| (i, r.source.clone()));
        let Some((owner_stream, spawn_source)) = owner else {
            let msg = format!("subagent {} comes before any parent request", sa.agent_id);
            return Err(err(&format!("requests[{}]", sa.outer), msg));
        };
        let mut inner = Vec::with_capacity(sa.requests.len());
        for r in &sa.requests {
            let mut r = r.clone();
            if !relative && r.t < sa.t - EPS_S {
                // Only an explicit absolute basis gets here (auto would have chosen
                // relative); the reference's words.
                let msg = format!(
                    "Weka source {}, trace {}, subagent {} inner request {} at {} precedes its marker at {} \
                     under absolute nested_timestamp_basis",
                    play.source_name, play.id, sa.agent_id, r.order, r.t, sa.t
                );
                return Err(err(&format!("requests[{}].requests[{}].t", sa.outer, r.order), msg));
            }
            // Producers' rounding is clamped: an absolute time never precedes its marker.
            r.t = if relative { sa.t + r.t } else { r.t.max(sa.t) };
            inner.push(r);
        }
        if inner.is_empty() {
            continue;
        }
        let end = match sa.duration_ms {
            Some(d) => sa.t + d / 1e3,
            None => inner.iter().map(Req::end).fold(sa.t, f64::max),
        };
        let (pre, rest) = split_preamble(inner);
        let (c, m, w) = detect_chains(rest);
        let prefix = format!("subagent:{}:{}", sa.outer, sa.agent_id);
        let mut child = streams(&prefix, &c, m, &w, pre);
        child[0].fork_source = Some(spawn_source);
        let scope = child[0].session.clone();
        for s in &mut child {
            s.scope.clone_from(&scope);
        }
        let join = sa
            .blocking
            .then(|| {
                all[owner_stream]
                    .requests
                    .iter()
                    .filter(|r| r.order > sa.outer && r.t + EPS_S >= end)
                    .min_by_key(|r| r.order)
                    .map(|r| r.source.clone())
            })
            .flatten();
        if let Some(target) = join {
            let terminals: Vec<String> =
                child.iter().filter_map(|s| s.requests.last()).map(|r| r.source.clone()).collect();
            joins.push((target, terminals));
        }
        all.extend(child);
    }
    let root_time = all.iter().flat_map(|s| &s.requests).map(|r| r.t).fold(f64::INFINITY, f64::min);
    let by_source: HashMap<&str, &Req> =
        all.iter().flat_map(|s| &s.requests).map(|r| (r.source.as_str(), r)).collect();
    let mut deps: HashMap<String, Vec<(String, DepTrigger, f64, &'static str)>> = HashMap::new();
    for s in &all {
        for w in s.requests.windows(2) {
            let d = (w[0].source.clone(), DepTrigger::Completion, ms(w[1].t - w[0].end()), "sequence");
            push_dep(deps.entry(w[1].source.clone()).or_default(), d);
        }
    }
    for s in &all {
        let (Some(first), Some(spawn)) = (s.requests.first(), s.fork_source.as_deref()) else { continue };
        let parent = by_source[spawn];
        let d = if first.t < parent.end() {
            (spawn.to_string(), DepTrigger::Dispatch, ms(first.t - parent.t), "spawn")
        } else {
            (spawn.to_string(), DepTrigger::Completion, ms(first.t - parent.end()), "spawn")
        };
        push_dep(deps.entry(first.source.clone()).or_default(), d);
    }
    // Replay barriers: the latest request of every other stream of the scope that ended
    // before the request started, minus those another of them already follows.
    let mut by_scope: BTreeMap<&str, Vec<&Stream>> = BTreeMap::new();
    for s in &all {
        by_scope.entry(s.scope.as_str()).or_default().push(s);
    }
    for scoped in by_scope.values() {
        for (ti, target) in scoped.iter().enumerate() {
            for r in &target.requests {
                let mut frontier: Vec<&Req> = Vec::new();
                for (oi, other) in scoped.iter().enumerate() {
                    if oi == ti {
                        continue;
                    }
                    let latest =
                        other.requests.iter().filter(|c| c.t < r.t && c.end() <= r.t + EPS_S).max_by(
                            |a, b| {
                                a.end()
                                    .total_cmp(&b.end())
                                    .then(a.t.total_cmp(&b.t))
                                    .then_with(|| a.source.cmp(&b.source))
                            },
                        );
                    frontier.extend(latest);
                }
                let pruned: Vec<&Req> = frontier
                    .iter()
                    .copied()
                    .filter(|c| !frontier.iter().any(|l| c.t < l.t && c.end() <= l.t + EPS_S))
                    .collect();
                for p in pruned {
                    push_dep(
                        deps.entry(r.source.clone()).or_default(),
                        (p.source.clone(), DepTrigger::Completion, 0.0, "barrier"),
                    );
                }
            }
        }
    }
    for (target, terminals) in joins {
        let tr = by_source[target.as_str()];
        for term in terminals {
            let delay = tr.t - by_source[term.as_str()].end();
            if delay < -EPS_S {
                let msg = format!("{target} joins subagent request {term}, which ends {} s after it: the subagent's duration_ms understates its requests", -delay);
                return Err(err("requests", msg));
            }
            push_dep(
                deps.entry(target.clone()).or_default(),
                (term, DepTrigger::Completion, ms(delay), "join"),
            );
        }
    }
    // A stream that neither continues nor forks from anything starts with the root.
    let root = &all[0].requests[0];
    for s in &all {
        let first = &s.requests[0];
        if first.source == root.source || deps.get(&first.source).is_some_and(|d| !d.is_empty()) {
            continue;
        }
        let d = (root.source.clone(), DepTrigger::Dispatch, ms(first.t - root.t), "spawn");
        push_dep(deps.entry(first.source.clone()).or_default(), d);
    }
    let mut rows = Vec::new();
    for s in all {
        for r in s.requests {
            let d = deps.remove(&r.source).unwrap_or_default();
            rows.push(Row {
                not_before_ms: ms(r.t - root_time),
                session: s.session.clone(),
                req: r,
                deps: d,
            });
        }
    }
    Ok(rows)
}

/// Hands a play's rows to the parser in an order where dependencies come first (earliest
/// release first), as v2 agentic rows.
fn emit(
    p: &mut Parser,
    play: &Play,
    rows: Vec<Row>,
    ids: &mut HashMap<(usize, u64), u32>,
) -> Result<(), TraceError> {
    let index: HashMap<String, usize> =
        rows.iter().enumerate().map(|(i, r)| (r.req.source.clone(), i)).collect();
    let mut waiting: Vec<usize> = rows.iter().map(|r| r.deps.len()).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); rows.len()];
    for (i, r) in rows.iter().enumerate() {
        for d in &r.deps {
            dependents[index[&d.0]].push(i);
        }
    }
    let key = |i: usize| {
        let r = &rows[i].req;
        std::cmp::Reverse((ordered(r.t), r.order, r.source.clone()))
    };
    let mut ready: BinaryHeap<_> =
        (0..rows.len()).filter(|&i| waiting[i] == 0).map(|i| (key(i), i)).collect();
    let bs = play.block_size;
    while let Some((_, i)) = ready.pop() {
        for &j in &dependents[i] {
            waiting[j] -= 1;
            if waiting[j] == 0 {
                ready.push((key(j), j));
            }
        }
        let row = &rows[i];
        let r = &row.req;
        let full = r.input / bs;
        let mut blocks = Vec::with_capacity(r.input.div_ceil(bs));
        for b in 0..full {
            blocks.push(match r.hashes.get(b) {
                Some(&h) => *ids.entry((play.file, h)).or_insert_with(|| p.fresh_id()),
                None => p.fresh_id(),
            });
        }
        if !r.input.is_multiple_of(bs) {
            blocks.push(p.fresh_id());
        }
        let prompt = RowPrompt { ids: blocks, input_length: r.input as u32, output_length: r.output as u32 };
        let deps = row
            .deps
            .iter()
            .map(|d| RawDep { id: format!("{}/{}", play.name, d.0), trigger: d.1, delay_ms: d.2 })
            .collect();
        let line = p.next_request_ordinal();
        let id = format!("{}/{}", play.name, r.source);
        let nb = Some(row.not_before_ms);
        // A trace object is one play, run in corpus order (the reference's
        // `source_play_ordinal`).
        let play_id =
            RowPlay::Named { id: format!("weka:play:{}", play.id), ordinal: Some(play.file as u64) };
        p.graph_rows.push(GraphRow {
            line,
            request_id: id.clone(),
            play: play_id,
            model: Some(r.model.clone()),
        });
        p.place(line as usize, "requests", Some(id), prompt, deps, nb, nb, nb)?;
        p.row_sessions.push((line, format!("{}:{}", play.name, row.session)));
    }
    if waiting.iter().any(|&w| w > 0) {
        return Err(TraceError {
            path: play.path.clone(),
            line: play.line,
            field: "requests".into(),
            message: "the lowered request graph has a cycle".into(),
        });
    }
    Ok(())
}

/// An `f64` as a totally ordered integer key (non-negative times).
fn ordered(t: f64) -> u64 {
    t.to_bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn play(requests: &str) -> String {
        // One trace object per line.
        let requests = requests.replace('\n', " ");
        format!(r#"{{"id": "p", "block_size": 4, "hash_id_scope": "local", "requests": [{requests}]}}"#)
    }

    #[test]
    fn a_growing_conversation_is_one_session_and_a_disjoint_one_starts_with_the_root() {
        let text = play(
            r#"{"type": "s", "t": 1.0, "model": "m", "in": 8, "out": 2, "hash_ids": [1, 2], "api_time": 0.5},
               {"type": "s", "t": 2.0, "model": "m", "in": 10, "out": 2, "hash_ids": [1, 2, 3], "api_time": 0.5},
               {"type": "n", "t": 1.2, "model": "m", "in": 4, "out": 2, "hash_ids": [9], "api_time": 5}"#,
        );
        let t = parse_weka_text(&text, None, NestedTimestampBasis::Auto).unwrap();
        assert_eq!(t.block_size, 4);
        // The chain step follows its predecessor's completion after the recorded gap.
        let main = &t.sessions[0];
        let shape: Vec<(u32, f64, Option<f64>)> =
            main.turns.iter().map(|t| (t.input_length, t.delay_ms, t.not_before_ms)).collect();
        assert_eq!(shape, vec![(8, 0.0, None), (10, 500.0, Some(1000.0))]);
        assert_eq!(main.first_arrival_ms, Some(0.0), "the play's first request starts it");
        assert_eq!(main.turns[1].ids[..2], main.turns[0].ids[..], "shared hash ids share blocks");
        assert_ne!(main.turns[1].ids[2], main.turns[0].ids[1]);
        // The disjoint stream waits on the root's dispatch (200 ms later), gated.
        assert_eq!(t.gates.len(), 1);
        assert_eq!(t.gates[0].deps[0].trigger, DepTrigger::Dispatch);
        assert_eq!(t.gates[0].deps[0].delay_ms, 200.0);
        assert_eq!(t.row_sessions.iter().map(|r| r.1.as_str()).collect::<Vec<_>>().len(), 3);
    }

    #[test]
    fn errors_name_the_object_line_and_field() {
        let ok = play(r#"{"type": "s", "t": 0, "model": "m", "in": 8, "out": 2, "hash_ids": [1, 2]}"#);
        let cases = [
            (ok.replace("\"p\"", "\"\""), "id"),
            (ok.replace("\"t\": 0", "\"t\": -1"), "requests[0].t"),
            (ok.replace("\"type\": \"s\"", "\"type\": \"x\""), "requests[0].type"),
            (ok.replace("\"out\": 2", "\"out\": 0"), "requests[0].out"),
            (ok.replace("[1, 2]", "[1, -2]"), "requests[0].hash_ids"),
            (ok.replace("\"block_size\": 4", "\"block_size\": 0"), "block_size"),
        ];
        for (text, field) in cases {
            let e = parse_weka_text(&format!("{ok}\n{text}"), None, NestedTimestampBasis::Auto).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (2, field), "{text}: {e}");
        }
        let sub = play(
            r#"{"type": "subagent", "t": 0, "agent_id": "a", "status": "completed", "requests": []},
               {"type": "s", "t": 1, "model": "m", "in": 4, "out": 1}"#,
        );
        let e = parse_weka_text(&sub, None, NestedTimestampBasis::Auto).unwrap_err();
        assert_eq!(e.field, "requests[0].requests", "{e}");
    }
}
