//! Reading a Weka corpus: its files (a file or a directory walked in name order, no
//! symlinks) and each trace object checked, with errors naming file, line and field.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::trace::keys::{KeyCheck, WEKA_REQUEST, WEKA_SUBAGENT, WEKA_TRACE};
use crate::trace::{TraceError, MAX_TRACE_BLOCK_SIZE, MAX_TRACE_TOKENS};

/// One request of a play, as read.
#[derive(Debug, Clone)]
pub(super) struct Req {
    /// `outer:<i>` or `outer:<i>:inner:<j>`.
    pub(super) source: String,
    /// Index among its siblings (outer index, or inner index within a subagent).
    pub(super) order: usize,
    pub(super) t: f64,
    pub(super) model: String,
    pub(super) input: usize,
    pub(super) output: usize,
    pub(super) hashes: Vec<u64>,
    pub(super) api_time: f64,
}

impl Req {
    pub(super) fn end(&self) -> f64 {
        self.t + self.api_time
    }
}

/// A `subagent` marker and its requests (times as read).
pub(super) struct Subagent {
    pub(super) outer: usize,
    pub(super) t: f64,
    pub(super) agent_id: String,
    pub(super) duration_ms: Option<f64>,
    pub(super) blocking: bool,
    pub(super) requests: Vec<Req>,
}

/// One trace object, checked.
pub(super) struct Play {
    /// Index within the corpus: hash ids are scoped to one play (the reference names a
    /// block by its source, a `.jsonl` line being a source of its own).
    pub(super) file: usize,
    pub(super) name: String,
    /// The trace object's `id`.
    pub(super) id: String,
    /// The reference's name of its source: the file's corpus path, with `#<index>` (six
    /// digits, from 0) for an object of a `.jsonl` file.
    pub(super) source_name: String,
    /// Where errors about the play point.
    pub(super) path: PathBuf,
    pub(super) line: usize,
    pub(super) block_size: usize,
    pub(super) top: Vec<Req>,
    pub(super) subagents: Vec<Subagent>,
}

/// The corpus's files: `(path, name relative to the corpus)`, in name order.
pub(super) fn source_files(path: &Path) -> Result<Vec<(PathBuf, String)>, String> {
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    if meta.file_type().is_symlink() {
        return Err("a Weka source may not be a symlink".into());
    }
    let weka_ext = |p: &Path| {
        p.extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e.eq_ignore_ascii_case("json") || e.eq_ignore_ascii_case("jsonl"))
    };
    if meta.is_file() {
        if !weka_ext(path) {
            return Err("a Weka file must be .json (one trace) or .jsonl (one per line)".into());
        }
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        return Ok(vec![(path.to_path_buf(), name)]);
    }
    if !meta.is_dir() {
        return Err("not a file or a directory".into());
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        for e in entries {
            let p = e.map_err(|e| e.to_string())?.path();
            let m = std::fs::symlink_metadata(&p).map_err(|e| e.to_string())?;
            if m.file_type().is_symlink() {
                return Err(format!("a Weka corpus may not hold symlinks ({})", p.display()));
            }
            if m.is_dir() {
                stack.push(p);
            } else if m.is_file() && weka_ext(&p) {
                let rel = p.strip_prefix(path).unwrap_or(&p).to_string_lossy().replace('\\', "/");
                out.push((p, rel));
            }
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

pub(super) fn read_play(
    v: &Value,
    file: usize,
    name: &str,
    source_name: String,
    path: &Path,
    line: usize,
    keys: &mut KeyCheck,
) -> Result<Play, TraceError> {
    let err = |field: &str, message: String| TraceError {
        path: path.to_path_buf(),
        line,
        field: field.into(),
        message,
    };
    let Value::Object(o) = v else { return Err(err("trace", format!("must be a JSON object (got {v})"))) };
    keys.check(line, "", o.keys(), WEKA_TRACE);
    let id = match o.get("id") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => return Err(err("id", "must be a non-empty string".into())),
    };
    let block_size = match o.get("block_size").and_then(Value::as_u64) {
        Some(b) if (1..=MAX_TRACE_BLOCK_SIZE as u64).contains(&b) => b as usize,
        _ => return Err(err("block_size", format!("must be an integer in 1..={MAX_TRACE_BLOCK_SIZE}"))),
    };
    match o.get("hash_id_scope") {
        Some(Value::String(s)) if s == "local" => {}
        v => {
            return Err(err(
                "hash_id_scope",
                format!("must be \"local\" (got {})", v.map_or("(missing)".into(), Value::to_string)),
            ))
        }
    }
    let models: Vec<String> = match o.get("models") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|m| {
                m.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| err("models", format!("must hold strings (got {m})")))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(err("models", format!("must be a list of strings (got {v})"))),
    };
    let Some(Value::Array(entries)) = o.get("requests") else {
        return Err(err("requests", "must be a list".into()));
    };
    let mut top = Vec::new();
    let mut subagents = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let field = format!("requests[{i}]");
        let Value::Object(e) = e else { return Err(err(&field, "must be an object".into())) };
        match e.get("type").and_then(Value::as_str) {
            Some("n" | "s") => {
                keys.check(line, "requests[].", e.keys(), WEKA_REQUEST);
                top.push(read_request(e, format!("outer:{i}"), i, &field, &err)?)
            }
            Some("subagent") => {
                keys.check(line, "requests[].", e.keys(), WEKA_SUBAGENT);
                let num = |k: &str| e.get(k).and_then(Value::as_f64);
                let t = num("t")
                    .filter(|t| t.is_finite() && *t >= 0.0)
                    .ok_or_else(|| err(&format!("{field}.t"), "must be a finite number >= 0 (s)".into()))?;
                let agent_id =
                    e.get("agent_id").and_then(Value::as_str).filter(|a| !a.trim().is_empty()).ok_or_else(
                        || err(&format!("{field}.agent_id"), "must be a non-empty string".into()),
                    )?;
                let duration_ms = match e.get("duration_ms") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v.as_f64().filter(|d| d.is_finite() && *d >= 0.0).ok_or_else(|| {
                        err(&format!("{field}.duration_ms"), format!("must be a number >= 0 (got {v})"))
                    })?),
                };
                let blocking = match e.get("status").and_then(Value::as_str) {
                    Some("completed") => true,
                    Some("async_launched") => false,
                    s => {
                        return Err(err(
                            &format!("{field}.status"),
                            format!("must be \"completed\" or \"async_launched\" (got {s:?})"),
                        ))
                    }
                };
                let Some(Value::Array(inner)) = e.get("requests") else {
                    return Err(err(&format!("{field}.requests"), "must be a list".into()));
                };
                if blocking && inner.is_empty() {
                    return Err(err(
                        &format!("{field}.requests"),
                        "a blocking (completed) subagent needs requests to replay".into(),
                    ));
                }
                let mut requests = Vec::new();
                for (j, r) in inner.iter().enumerate() {
                    let f = format!("{field}.requests[{j}]");
                    let Value::Object(r) = r else { return Err(err(&f, "must be an object".into())) };
                    if !matches!(r.get("type").and_then(Value::as_str), Some("n" | "s")) {
                        return Err(err(&format!("{f}.type"), "must be \"n\" or \"s\"".into()));
                    }
                    keys.check(line, "requests[].requests[].", r.keys(), WEKA_REQUEST);
                    requests.push(read_request(r, format!("outer:{i}:inner:{j}"), j, &f, &err)?);
                }
                subagents.push(Subagent {
                    outer: i,
                    t,
                    agent_id: agent_id.to_string(),
                    duration_ms,
                    blocking,
                    requests,
                });
            }
            t => {
                return Err(err(
                    &format!("{field}.type"),
                    format!("must be \"n\", \"s\" or \"subagent\" (got {t:?})"),
                ))
            }
        }
    }
    if top.is_empty() {
        return Err(err("requests", "has no parent requests (type n or s)".into()));
    }
    if !models.is_empty() {
        let all = top.iter().chain(subagents.iter().flat_map(|s| &s.requests));
        if let Some(r) = all.into_iter().find(|r| !models.contains(&r.model)) {
            return Err(err("models", format!("does not declare {:?}, which {} uses", r.model, r.source)));
        }
    }
    Ok(Play {
        file,
        name: format!("{name}#{id}"),
        id,
        source_name,
        path: path.to_path_buf(),
        line,
        block_size,
        top,
        subagents,
    })
}

fn read_request(
    e: &Map<String, Value>,
    source: String,
    order: usize,
    field: &str,
    err: &dyn Fn(&str, String) -> TraceError,
) -> Result<Req, TraceError> {
    let f = |k: &str| format!("{field}.{k}");
    let t = e
        .get("t")
        .and_then(Value::as_f64)
        .filter(|t| t.is_finite() && *t >= 0.0)
        .ok_or_else(|| err(&f("t"), "must be a finite number >= 0 (s)".into()))?;
    let model = e
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.trim().is_empty())
        .ok_or_else(|| err(&f("model"), "must be a non-empty string".into()))?;
    let count = |k: &str, min: u64| -> Result<usize, TraceError> {
        match e.get(k).and_then(Value::as_u64) {
            Some(n) if n >= min && n <= MAX_TRACE_TOKENS as u64 => Ok(n as usize),
            _ => Err(err(&f(k), format!("must be an integer in {min}..={MAX_TRACE_TOKENS}"))),
        }
    };
    let input = count("in", 1)?;
    // A zero-output request (prefill only) cannot be replayed by mocker's engines.
    let output = count("out", 1)?;
    let hashes = match e.get("hash_ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|h| {
                h.as_u64()
                    .ok_or_else(|| err(&f("hash_ids"), format!("must hold non-negative integers (got {h})")))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(err(&f("hash_ids"), format!("must be a list of integers (got {v})"))),
    };
    let api_time = match e.get("api_time") {
        None | Some(Value::Null) => 0.0,
        Some(v) => v
            .as_f64()
            .filter(|a| a.is_finite() && *a >= 0.0)
            .ok_or_else(|| err(&f("api_time"), format!("must be a number >= 0 (got {v})")))?,
    };
    Ok(Req { source, order, t, model: model.to_string(), input, output, hashes, api_time })
}
