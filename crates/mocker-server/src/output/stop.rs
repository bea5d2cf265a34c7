//! Stop conditions as vLLM applies them: a stop token id ends the output at that token, a
//! stop string ends it where the string starts (across token boundaries), neither before
//! `min_tokens`; the stopping text is left out unless `include_stop_str_in_output`. While
//! stop strings are set, a stream holds back the last `longest - 1` bytes, which a string
//! might still start in, as vLLM's detokenizer does.
//!
//! All stop strings are matched at once by one Aho–Corasick automaton over the window a
//! new token could complete a match in, so a token costs time linear in that window, not
//! in the number of strings times their length.

use aho_corasick::{AhoCorasick, MatchKind};

/// Most stop strings a request may give.
pub const MAX_STOP_STRINGS: usize = 1024;
/// Longest stop string, in bytes.
pub const MAX_STOP_STRING_BYTES: usize = 4096;
/// Most bytes all of a request's stop strings may take together.
pub const MAX_STOP_TOTAL_BYTES: usize = 65_536;

/// Why `count` stop strings are too many, if they are (checked before they are read).
pub fn too_many_stop_strings(count: usize) -> Option<String> {
    (count > MAX_STOP_STRINGS).then(|| format!("at most {MAX_STOP_STRINGS} strings, got {count}"))
}

/// Why a request's stop strings exceed the bounds, if they do: every route and protocol
/// that takes stop strings checks them here.
pub fn check_stop_strings(strings: &[String]) -> Result<(), String> {
    if let Some(why) = too_many_stop_strings(strings.len()) {
        return Err(why);
    }
    if let Some(long) = strings.iter().find(|s| s.len() > MAX_STOP_STRING_BYTES) {
        return Err(format!("each string at most {MAX_STOP_STRING_BYTES} bytes, got one of {}", long.len()));
    }
    let total: usize = strings.iter().map(String::len).sum();
    if total > MAX_STOP_TOTAL_BYTES {
        return Err(format!(
            "the strings may take at most {MAX_STOP_TOTAL_BYTES} bytes together, got {total}"
        ));
    }
    Ok(())
}

/// Why the output stopped early, as `stop_reason` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// A stop string matched.
    Text(String),
    /// A stop token was generated.
    Token(u32),
}

/// The stop conditions of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopRules {
    /// `stop`: strings that end the output.
    pub strings: Vec<String>,
    /// `stop_token_ids`.
    pub token_ids: Vec<u32>,
    /// `min_tokens`: no stop before this many tokens.
    pub min_tokens: u32,
    /// `include_stop_str_in_output`.
    pub include_stop: bool,
}

impl StopRules {
    /// Whether any stop condition is set (otherwise output is not scanned at all).
    pub fn is_active(&self) -> bool {
        !self.strings.is_empty() || !self.token_ids.is_empty()
    }
}

/// What one token adds to the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Byte range of the scanner's text to send now.
    pub send: std::ops::Range<usize>,
    /// Set when this token ends the output.
    pub stop: Option<StopReason>,
}

/// Scans one output sequence for its stop conditions.
#[derive(Debug, Default)]
pub struct StopScan {
    text: String,
    sent: usize,
    /// Bytes a stop string could still begin in: the longest string's length minus one.
    hold: usize,
    tokens: u32,
    /// The non-empty stop strings, leftmost match first and the longest among those
    /// (the string vLLM's scan over the list would report).
    matcher: Option<AhoCorasick>,
}

impl StopScan {
    /// A scanner for `rules` (their strings within the `MAX_STOP_*` bounds the request
    /// parser enforces).
    pub fn new(rules: &StopRules) -> Self {
        let hold = rules.strings.iter().map(String::len).max().unwrap_or(1).saturating_sub(1);
        let patterns: Vec<&str> =
            rules.strings.iter().map(String::as_str).filter(|s| !s.is_empty()).collect();
        let matcher = (!patterns.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&patterns)
                .expect("stop strings are bounded by the request parser")
        });
        Self { text: String::new(), sent: 0, hold, tokens: 0, matcher }
    }

    /// The output so far (stopped output ends where it stopped).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Adds token `id` with text `piece`.
    pub fn push(&mut self, rules: &StopRules, id: u32, piece: &str) -> Step {
        self.tokens += 1;
        let armed = self.tokens >= rules.min_tokens;
        if armed && rules.token_ids.contains(&id) {
            if rules.include_stop {
                self.text.push_str(piece);
            }
            return self.finish(Some(StopReason::Token(id)));
        }
        let before = self.text.len();
        self.text.push_str(piece);
        if let (true, Some(matcher)) = (armed, &self.matcher) {
            // A match must end in the new piece: start the search where one could begin.
            let from = floor_boundary(&self.text, before.saturating_sub(self.hold));
            if let Some(m) = matcher.find(&self.text[from..]) {
                let matched = self.text[from + m.start()..from + m.end()].to_string();
                let end = from + if rules.include_stop { m.end() } else { m.start() };
                self.text.truncate(end);
                return self.finish(Some(StopReason::Text(matched)));
            }
        }
        let safe = floor_boundary(&self.text, self.text.len().saturating_sub(self.hold)).max(self.sent);
        let send = self.sent..safe;
        self.sent = safe;
        Step { send, stop: None }
    }

    /// Releases everything held back: the output ended (length limit or a stop).
    pub fn finish(&mut self, stop: Option<StopReason>) -> Step {
        let send = self.sent.min(self.text.len())..self.text.len();
        self.sent = self.text.len();
        Step { send, stop }
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(strings: &[&str], ids: &[u32]) -> StopRules {
        StopRules {
            strings: strings.iter().map(|s| s.to_string()).collect(),
            token_ids: ids.to_vec(),
            ..Default::default()
        }
    }

    /// Feeds pieces until a stop; returns the sent text and the reason.
    fn run(rules: &StopRules, pieces: &[(u32, &str)]) -> (String, Option<StopReason>) {
        let mut scan = StopScan::new(rules);
        let mut sent = String::new();
        for &(id, piece) in pieces {
            let step = scan.push(rules, id, piece);
            sent.push_str(&scan.text()[step.send.clone()]);
            if step.stop.is_some() {
                return (sent, step.stop);
            }
        }
        let step = scan.finish(None);
        sent.push_str(&scan.text()[step.send]);
        (sent, None)
    }

    #[test]
    fn a_stop_string_split_across_tokens_ends_the_output_before_it() {
        let pieces = [(1, " alpha"), (2, " be"), (3, "ta ga"), (4, "mma"), (5, " delta")];
        let (text, why) = run(&rules(&["beta g"], &[]), &pieces);
        assert_eq!((text.as_str(), why), (" alpha ", Some(StopReason::Text("beta g".into()))));
        let mut r = rules(&["beta g"], &[]);
        r.include_stop = true;
        assert_eq!(run(&r, &pieces).0, " alpha beta g");
        // No match: everything held back comes out at the end.
        assert_eq!(run(&rules(&["zeta"], &[]), &pieces), (" alpha beta gamma delta".into(), None));
        // The earliest match wins among several strings.
        assert_eq!(run(&rules(&["delta", "mm"], &[]), &pieces).0, " alpha beta ga");
    }

    #[test]
    fn stop_tokens_end_the_output_and_min_tokens_defers_both() {
        let pieces = [(1, " a"), (9, " b"), (3, " c"), (9, " d"), (5, " e")];
        assert_eq!(run(&rules(&[], &[9]), &pieces), (" a".into(), Some(StopReason::Token(9))));
        let mut r = rules(&[" c"], &[9]);
        r.min_tokens = 4;
        // Token 9 at position 2 and " c" at 3 are too early; 9 at position 4 stops.
        assert_eq!(run(&r, &pieces), (" a b c".into(), Some(StopReason::Token(9))));
    }

    #[test]
    fn streams_hold_back_only_what_a_stop_string_could_start_in() {
        let r = rules(&["wxyz"], &[]);
        let mut scan = StopScan::new(&r);
        let step = scan.push(&r, 1, " abcd");
        assert_eq!(&scan.text()[step.send], " a");
        // The cut would fall inside the first "é": it moves back to a character boundary.
        let step = scan.push(&r, 2, "éé");
        assert_eq!(&scan.text()[step.send], "bcd");
        let step = scan.finish(None);
        assert_eq!(&scan.text()[step.send], "éé");
    }

    /// The same scan by brute force: every string searched for in the window a new piece
    /// could complete a match in (from `hold` bytes before it), the earliest match first and
    /// the longest of those.
    fn naive(rules: &StopRules, pieces: &[(u32, String)]) -> (String, Option<StopReason>) {
        let hold = rules.strings.iter().map(String::len).max().unwrap_or(1).saturating_sub(1);
        let mut text = String::new();
        for (i, (id, piece)) in pieces.iter().enumerate() {
            let armed = i as u32 + 1 >= rules.min_tokens;
            if armed && rules.token_ids.contains(id) {
                if rules.include_stop {
                    text.push_str(piece);
                }
                return (text, Some(StopReason::Token(*id)));
            }
            let from = floor_boundary(&text, text.len().saturating_sub(hold));
            text.push_str(piece);
            if armed {
                let hit = rules
                    .strings
                    .iter()
                    .filter(|s| !s.is_empty())
                    .filter_map(|s| text[from..].find(s.as_str()).map(|at| (from + at, s)))
                    .min_by_key(|&(at, s)| (at, std::cmp::Reverse(s.len())));
                if let Some((at, s)) = hit {
                    text.truncate(if rules.include_stop { at + s.len() } else { at });
                    return (text, Some(StopReason::Text(s.clone())));
                }
            }
        }
        (text, None)
    }

    proptest::proptest! {
        #[test]
        fn the_automaton_stops_where_the_naive_scan_does(
            strings in proptest::collection::vec("[ab]{0,4}", 0..6),
            pieces in proptest::collection::vec((0u32..4, "[abc]{0,3}"), 0..24),
            ids in proptest::collection::vec(0u32..4, 0..2),
            min_tokens in 0u32..4,
            include_stop: bool,
        ) {
            let r = StopRules { strings, token_ids: ids, min_tokens, include_stop };
            let borrowed: Vec<(u32, &str)> = pieces.iter().map(|(id, p)| (*id, p.as_str())).collect();
            proptest::prop_assert_eq!(run(&r, &borrowed), naive(&r, &pieces));
        }
    }
}
