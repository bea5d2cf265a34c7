//! A request graph's plays (trajectories) and the source models its rows name.
//!
//! `--agentic-lanes N` runs a request graph's plays N at a time, each on one lane from
//! its first request to its last; the order lanes take plays up in is the reference's:
//! by `source_play_ordinal` when every play has one (a Weka corpus's trace objects do),
//! else by play id. A row without `play_id` (legacy rows) belongs to its dependency
//! component, which the reference names `legacy-play:<request id of its earliest root>`.
//! A dependency between two plays is refused, as the reference refuses it.

use rustc_hash::FxHashMap;

use crate::trace::{GraphRow, RowPlay, Trace, TraceError};

/// One play of a request graph.
#[derive(Debug, Clone, PartialEq)]
pub struct TracePlay {
    /// Its id (`play_id`, or `legacy-play:<root request id>`).
    pub id: String,
    /// Its sessions (indices in [`Trace::sessions`]), ascending. A session never spans two
    /// plays.
    pub sessions: Vec<u32>,
    /// Its rows' lines (the requests' ids), ascending.
    pub lines: Vec<u32>,
}

impl Trace {
    /// The plays of a request graph in the order lanes take them up (empty for the
    /// session formats). Errors name the row whose play breaks a rule the reference
    /// enforces: a dependency on another play's request, or `source_play_ordinal`
    /// values that are not one per play, set for every play, unique and contiguous from 0.
    pub fn plays(&self) -> Result<Vec<TracePlay>, TraceError> {
        if self.graph_rows.is_empty() {
            return Ok(Vec::new());
        }
        let mut session_of_line: FxHashMap<u32, u32> = FxHashMap::default();
        for (i, s) in self.sessions.iter().enumerate() {
            for t in &s.turns {
                session_of_line.insert(t.line, i as u32);
            }
        }
        // Dependency components: chains are sessions already; gates join sessions.
        let mut parent: Vec<u32> = (0..self.sessions.len() as u32).collect();
        fn find(parent: &mut [u32], mut x: u32) -> u32 {
            while parent[x as usize] != x {
                parent[x as usize] = parent[parent[x as usize] as usize];
                x = parent[x as usize];
            }
            x
        }
        for gate in &self.gates {
            for d in &gate.deps {
                if let Some(&up) = session_of_line.get(&d.line) {
                    let (a, b) = (find(&mut parent, gate.session), find(&mut parent, up));
                    parent[a as usize] = b;
                }
            }
        }
        // A component's name: its earliest root (a row with no dependency: the first turn
        // of an ungated session), ties by request id.
        let row_at: FxHashMap<u32, &GraphRow> = self.graph_rows.iter().map(|r| (r.line, r)).collect();
        let mut label: FxHashMap<u32, (f64, &str)> = FxHashMap::default();
        for (i, s) in self.sessions.iter().enumerate() {
            let Some(row) = row_at.get(&s.turns[0].line) else { continue };
            if s.gate.is_some() {
                continue;
            }
            let c = find(&mut parent, i as u32);
            let key = (s.first_arrival_ms.unwrap_or(0.0), row.request_id.as_str());
            let e = label.entry(c).or_insert(key);
            if key.0.total_cmp(&e.0).then_with(|| key.1.cmp(e.1)).is_lt() {
                *e = key;
            }
        }
        // Each row's play (id, ordinal).
        let mut play_of_line: FxHashMap<u32, (String, Option<u64>)> = FxHashMap::default();
        for row in &self.graph_rows {
            let play = match &row.play {
                RowPlay::Named { id, ordinal } => (id.clone(), *ordinal),
                RowPlay::Component => {
                    let s = session_of_line[&row.line];
                    let c = find(&mut parent, s);
                    let name = label.get(&c).map_or(row.request_id.as_str(), |l| l.1);
                    (format!("legacy-play:{name}"), None)
                }
            };
            play_of_line.insert(row.line, play);
        }
        let crossing = |down: u32, up: u32| -> Result<(), TraceError> {
            let (a, b) = (&play_of_line[&down], &play_of_line[&up]);
            if a.0 == b.0 {
                return Ok(());
            }
            let msg = format!(
                "request {} in play {} depends on request {} in play {}",
                row_at[&down].request_id, a.0, row_at[&up].request_id, b.0
            );
            Err(self.error_at(down, "play_id", msg))
        };
        for s in &self.sessions {
            for w in s.turns.windows(2) {
                crossing(w[1].line, w[0].line)?;
            }
        }
        for gate in &self.gates {
            let down = self.sessions[gate.session as usize].turns[0].line;
            for d in &gate.deps {
                crossing(down, d.line)?;
            }
        }
        // Plays in first-row order, then sorted.
        let mut index: FxHashMap<&str, usize> = FxHashMap::default();
        let mut plays: Vec<(TracePlay, Option<u64>, u32)> = Vec::new();
        for row in &self.graph_rows {
            let (id, ordinal) = &play_of_line[&row.line];
            let i = *index.entry(id.as_str()).or_insert_with(|| {
                let play = TracePlay { id: id.clone(), sessions: Vec::new(), lines: Vec::new() };
                plays.push((play, *ordinal, row.line));
                plays.len() - 1
            });
            if plays[i].1 != *ordinal {
                let msg = format!("play {id} has inconsistent source_play_ordinal values");
                return Err(self.error_at(row.line, "source_play_ordinal", msg));
            }
            plays[i].0.lines.push(row.line);
        }
        for (i, s) in self.sessions.iter().enumerate() {
            if let Some((id, _)) = play_of_line.get(&s.turns[0].line) {
                plays[index[id.as_str()]].0.sessions.push(i as u32);
            }
        }
        let ordered = plays.iter().filter(|p| p.1.is_some()).count();
        if ordered == plays.len() {
            plays.sort_by_key(|p| p.1);
            for (expected, p) in plays.iter().enumerate() {
                let found = p.1.expect("every play has one");
                if found != expected as u64 {
                    let msg = format!(
                        "source_play_ordinal values must be unique and contiguous from 0; expected {expected}, \
                         found {found}"
                    );
                    return Err(self.error_at(p.2, "source_play_ordinal", msg));
                }
            }
        } else if let Some(p) = plays.iter().find(|p| p.1.is_some()) {
            let msg = "source_play_ordinal must be set for every play when it is used".to_string();
            return Err(self.error_at(p.2, "source_play_ordinal", msg));
        } else {
            plays.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        }
        Ok(plays.into_iter().map(|p| p.0).collect())
    }

    /// The source models the rows of a request graph name, sorted, each once (the
    /// reference reports them as `source_models` of its model projection).
    pub fn source_models(&self) -> Vec<String> {
        let mut models: Vec<String> = self.graph_rows.iter().filter_map(|r| r.model.clone()).collect();
        models.sort();
        models.dedup();
        models
    }
}

#[cfg(test)]
mod tests {
    use crate::trace::load::parse_trace;
    use crate::trace::TraceFormat;

    const HEADER: &str = r#"{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 4}"#;

    fn row(id: &str, play: &str, nb: f64, deps: &[&str]) -> String {
        let deps: Vec<String> = deps.iter().map(|d| format!(r#"{{"request_id": "{d}"}}"#)).collect();
        format!(
            r#"{{"request_id": "{id}", "play_id": "{play}", "model": "m-{play}", "output_length": 1, "hash_ids": [1], "not_before_ms": {nb}, "dependencies": [{}]}}"#,
            deps.join(", ")
        )
    }

    #[test]
    fn plays_group_rows_and_sort_by_id_or_ordinal() {
        let rows = [
            row("a0", "pb", 0.0, &[]),
            row("b0", "pa", 5.0, &[]),
            row("a1", "pb", 0.0, &["a0"]),
            row("b1", "pa", 0.0, &["b0"]),
            row("b2", "pa", 0.0, &["b0", "b1"]),
        ];
        let text = format!("{HEADER}\n{}", rows.join("\n"));
        let t = parse_trace(&text, TraceFormat::AgenticMooncake, None).unwrap();
        let plays = t.plays().unwrap();
        let ids: Vec<&str> = plays.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["pa", "pb"], "by play id, not file order");
        assert_eq!(plays[0].lines, [3, 5, 6]);
        assert_eq!(plays[1].lines, [2, 4]);
        assert_eq!(plays[0].sessions.len(), 2, "b0-b1 chain and the gated join");
        assert_eq!(t.source_models(), ["m-pa", "m-pb"]);

        // A dependency across plays is refused as the reference refuses it.
        let text = format!("{HEADER}\n{}\n{}", row("a0", "pa", 0.0, &[]), row("b0", "pb", 0.0, &["a0"]));
        let t = parse_trace(&text, TraceFormat::AgenticMooncake, None).unwrap();
        let e = t.plays().unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (3, "play_id"));
        assert_eq!(e.message, "request b0 in play pb depends on request a0 in play pa");
    }

    #[test]
    fn ordinals_order_plays_and_must_cover_every_play() {
        let with = |id: &str, play: &str, ord: Option<u32>| {
            let r = row(id, play, 0.0, &[]);
            match ord {
                Some(o) => r.replacen('{', &format!("{{\"source_play_ordinal\": {o}, "), 1),
                None => r,
            }
        };
        let text = format!("{HEADER}\n{}\n{}", with("x", "pa", Some(1)), with("y", "pb", Some(0)));
        let t = parse_trace(&text, TraceFormat::AgenticMooncake, None).unwrap();
        let ids: Vec<String> = t.plays().unwrap().into_iter().map(|p| p.id).collect();
        assert_eq!(ids, ["pb", "pa"]);
        for (text, needle) in [
            (format!("{HEADER}\n{}\n{}", with("x", "pa", Some(0)), with("y", "pb", None)), "every play"),
            (
                format!("{HEADER}\n{}\n{}", with("x", "pa", Some(0)), with("y", "pb", Some(2))),
                "expected 1, found 2",
            ),
            (format!("{HEADER}\n{}\n{}", with("x", "pa", Some(0)), with("y", "pa", Some(1))), "inconsistent"),
        ] {
            let t = parse_trace(&text, TraceFormat::AgenticMooncake, None).unwrap();
            let e = t.plays().unwrap_err();
            assert_eq!(e.field, "source_play_ordinal");
            assert!(e.message.contains(needle), "{e}");
        }
    }

    #[test]
    fn legacy_rows_form_one_play_per_dependency_component() {
        let text = r#"{"request_id": "r2", "timestamp": 10, "output_length": 1, "hash_ids": [1]}
{"request_id": "r1", "timestamp": 0, "output_length": 1, "hash_ids": [2]}
{"request_id": "j", "wait_for": ["r1", "r2"], "output_length": 1, "hash_ids": [3]}
{"request_id": "z", "timestamp": 5, "output_length": 1, "hash_ids": [4]}"#;
        let t = parse_trace(text, TraceFormat::AgenticMooncake, Some(4)).unwrap();
        let plays = t.plays().unwrap();
        let ids: Vec<&str> = plays.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(ids, ["legacy-play:r1", "legacy-play:z"], "named by the earliest root");
        assert_eq!(plays[0].lines, [1, 2, 3]);
        assert_eq!(t.source_models(), ["unknown"]);
    }
}
