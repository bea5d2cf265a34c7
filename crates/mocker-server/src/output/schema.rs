//! JSON text generated from a JSON schema, for `response_format` and tool-call arguments.
//! Supported: `type` (object, array, string, number, integer, boolean, null; a list of types
//! takes its first), `properties`, `required` (optional properties appear about half the
//! time), `items`, `minItems`/`maxItems`, `minimum`/`maximum` and their exclusive forms,
//! `enum`, `const`, `$ref` into `$defs`/`definitions`, `anyOf`/`oneOf` (the first branch),
//! and the annotations (`title`, `description`, `default`, `additionalProperties`, ...),
//! which constrain nothing the generator writes. Any other keyword is refused by name
//! before generation. Strings are pool words, so the output re-tokenizes as planned; the
//! layout is Python's `json.dumps` (`", "`, `": "`), which is what guided decoding in vLLM
//! usually produces. Every choice is a draw of the sequence's sampler: deterministic under
//! a seed.
//!
//! Generation is bounded: the caller gives a byte budget (what the request's output length
//! can hold) and the generator stops when it is spent, as a guided decoder stops at
//! `max_tokens`; its work is bounded by a step count too, so a schema whose values write
//! little but walk much (large objects inside long arrays) cannot run long either. The
//! schema itself is bounded at [`MAX_SCHEMA_ELEMENTS`].

use std::collections::HashSet;

use serde_json::Value;

use super::sampler::Sampler;
use super::vocab::OutputVocab;

/// Keywords the generator honours or that constrain nothing it writes.
const KNOWN: &[&str] = &[
    "type",
    "properties",
    "required",
    "items",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "enum",
    "const",
    "$ref",
    "$defs",
    "definitions",
    "anyOf",
    "oneOf",
    "additionalProperties",
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "nullable",
];

/// Nesting beyond which optional parts are left out (recursive schemas end there).
const SOFT_DEPTH: usize = 6;
/// Nesting at which a schema that still requires more is refused.
const HARD_DEPTH: usize = 24;

/// Most subschemas plus `required` names one schema may hold. vLLM sets no limit (its
/// grammar backends compile what they are given, slowly); a bound keeps checking and
/// generation to milliseconds while staying far above real schemas (OpenAI's structured
/// outputs allow 5,000 object properties in all).
pub const MAX_SCHEMA_ELEMENTS: usize = 200_000;

/// Steps (values written, properties and `required` names visited) a generation may take
/// beyond [`STEPS_PER_BYTE`] per budget byte: enough to walk the largest allowed schema once.
const BASE_STEPS: u64 = 2 * MAX_SCHEMA_ELEMENTS as u64;
/// Steps allowed per byte of the output budget.
const STEPS_PER_BYTE: u64 = 4;

/// Why a schema cannot be generated from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// JSON pointer of the offending subschema.
    pub at: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (at schema {})", self.message, if self.at.is_empty() { "root" } else { &self.at })
    }
}

/// Refuses schemas with keywords the generator does not honour, naming them, malformed
/// ones (a subschema that is not an object or a boolean, a `$ref` outside the document's
/// `$defs`, number bounds nothing lies within) and ones larger than
/// [`MAX_SCHEMA_ELEMENTS`].
pub fn check(schema: &Value) -> Result<(), SchemaError> {
    let mut elements = 0;
    check_at(schema, schema, &At::ROOT, &mut elements)
}

fn check_at(root: &Value, schema: &Value, at: &At<'_>, elements: &mut usize) -> Result<(), SchemaError> {
    let err = |message: String| SchemaError { at: at.render(), message };
    *elements += 1;
    if *elements > MAX_SCHEMA_ELEMENTS {
        return Err(err(format!(
            "the schema has more than {MAX_SCHEMA_ELEMENTS} subschemas and required names"
        )));
    }
    let map = match schema {
        Value::Bool(true) => return Ok(()),
        Value::Object(map) => map,
        other => return Err(err(format!("a schema must be an object (or true), got {other}"))),
    };
    let mut unknown: Vec<&str> = map.keys().map(String::as_str).filter(|k| !KNOWN.contains(k)).collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        return Err(err(format!("unsupported JSON schema keywords: {}", unknown.join(", "))));
    }
    if let Some(r) = map.get("$ref") {
        let Some(r) = r.as_str() else { return Err(err(format!("$ref must be a string, got {r}"))) };
        resolve(root, r)
            .ok_or_else(|| err(format!("$ref {r:?} does not name an entry of $defs or definitions")))?;
    }
    if let Some(t) = map.get("type") {
        let names: Vec<&Value> = match t {
            Value::Array(a) if !a.is_empty() => a.iter().collect(),
            other => vec![other],
        };
        for n in names {
            let ok = matches!(
                n.as_str(),
                Some("object" | "array" | "string" | "number" | "integer" | "boolean" | "null")
            );
            if !ok {
                return Err(err(format!("type {n} is not a JSON schema type")));
            }
        }
    }
    // Refused here rather than when generation reaches it, which a spent budget may prevent.
    if let Some(ty @ ("integer" | "number")) = first_type(map) {
        bounds(map, ty == "integer").map_err(err)?;
    }
    if let Some(e) = map.get("enum") {
        if e.as_array().is_none_or(|a| a.is_empty()) {
            return Err(err("enum must be a non-empty list".into()));
        }
    }
    if let (Some(min), Some(max)) =
        (map.get("minItems").and_then(Value::as_u64), map.get("maxItems").and_then(Value::as_u64))
    {
        if min > max {
            return Err(err(format!("minItems {min} is larger than maxItems {max}")));
        }
    }
    if let Some(Value::Array(required)) = map.get("required") {
        *elements += required.len();
        if *elements > MAX_SCHEMA_ELEMENTS {
            return Err(err(format!(
                "the schema has more than {MAX_SCHEMA_ELEMENTS} subschemas and required names"
            )));
        }
    }
    for key in ["properties", "$defs", "definitions"] {
        if let Some(Value::Object(children)) = map.get(key) {
            for (name, child) in children {
                check_at(root, child, &at.child(Seg::Named(key, name)), elements)?;
            }
        }
    }
    if let Some(items) = map.get("items") {
        check_at(root, items, &at.child(Seg::Key("items")), elements)?;
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(branches) = map.get(key) {
            let Some(branches) = branches.as_array().filter(|a| !a.is_empty()) else {
                return Err(err(format!("{key} must be a non-empty list")));
            };
            for (i, b) in branches.iter().enumerate() {
                check_at(root, b, &at.child(Seg::Index(key, i)), elements)?;
            }
        }
    }
    Ok(())
}

/// The `type` a subschema is generated as when it names one (a list takes its first).
fn first_type(map: &serde_json::Map<String, Value>) -> Option<&str> {
    match map.get("type") {
        Some(Value::String(t)) => Some(t.as_str()),
        Some(Value::Array(a)) => a.first().and_then(Value::as_str),
        _ => None,
    }
}

/// One step of a JSON pointer into the schema.
#[derive(Clone, Copy)]
enum Seg<'a> {
    Root,
    /// A `$ref` followed: pointers restart at the reference.
    Ref(&'a str),
    Key(&'static str),
    Named(&'static str, &'a str),
    Index(&'static str, usize),
}

/// Where a subschema sits, as a chain to its parent: rendered only when an error names it,
/// since building the pointer at every level would copy long property names at every level.
#[derive(Clone, Copy)]
struct At<'a> {
    up: Option<&'a At<'a>>,
    seg: Seg<'a>,
}

impl<'a> At<'a> {
    const ROOT: At<'static> = At { up: None, seg: Seg::Root };

    fn child(&'a self, seg: Seg<'a>) -> At<'a> {
        At { up: Some(self), seg }
    }

    fn render(&self) -> String {
        let mut out = match (self.seg, self.up) {
            (Seg::Ref(r), _) => return r.to_string(),
            (_, Some(up)) => up.render(),
            (_, None) => String::new(),
        };
        match self.seg {
            Seg::Root | Seg::Ref(_) => {}
            Seg::Key(k) => {
                out.push('/');
                out.push_str(k);
            }
            Seg::Named(k, name) => {
                out.push('/');
                out.push_str(k);
                out.push('/');
                out.push_str(name);
            }
            Seg::Index(k, i) => out.push_str(&format!("/{k}/{i}")),
        }
        out
    }
}

/// The subschema a local `$ref` names.
fn resolve<'a>(root: &'a Value, r: &str) -> Option<&'a Value> {
    if r == "#" {
        return Some(root);
    }
    let rest = r.strip_prefix("#/")?;
    let (section, name) = rest.split_once('/')?;
    if section != "$defs" && section != "definitions" {
        return None;
    }
    root.get(section)?.get(name.replace("~1", "/").replace("~0", "~"))
}

/// How a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Generated {
    /// The whole value was written.
    Complete,
    /// The budget ran out: `out` is a prefix of a matching value, at most the budget long.
    Cut,
}

/// Writes JSON text matching `schema` (already [`check`]ed) to `out`, at most `budget`
/// bytes of it: past that the text is cut (at a character boundary) and generation stops.
pub fn generate(
    schema: &Value,
    sampler: &Sampler,
    pool: &OutputVocab,
    budget: usize,
    out: &mut String,
) -> Result<Generated, SchemaError> {
    let start = out.len();
    let limit = start.saturating_add(budget);
    let steps_left = BASE_STEPS.saturating_add((budget as u64).saturating_mul(STEPS_PER_BYTE));
    let mut g = Gen { root: schema, sampler, pool, draws: 0, limit, steps_left };
    match g.value(schema, 0, &At::ROOT, out) {
        Ok(()) if out.len() <= limit => Ok(Generated::Complete),
        Ok(()) | Err(Halt::Budget) => {
            // A `const` or `enum` value written in one piece may overshoot the budget.
            let mut end = limit.min(out.len());
            while !out.is_char_boundary(end) {
                end -= 1;
            }
            out.truncate(end);
            Ok(Generated::Cut)
        }
        Err(Halt::Bad(e)) => Err(e),
    }
}

/// Writes a JSON object of a few word-named fields (`response_format: json_object`).
pub fn generate_object(sampler: &Sampler, pool: &OutputVocab, out: &mut String) {
    // A handful of fields: nothing to bound.
    let mut g = Gen { root: &Value::Null, sampler, pool, draws: 0, limit: usize::MAX, steps_left: u64::MAX };
    let fields = 2 + g.pick(3);
    out.push('{');
    for i in 0..fields {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('"');
        out.push_str(g.word());
        out.push_str(&i.to_string());
        out.push_str("\": ");
        match g.pick(3) {
            0 => g.words(out),
            1 => out.push_str(&g.pick(1000).to_string()),
            _ => out.push_str(if g.pick(2) == 0 { "true" } else { "false" }),
        }
    }
    out.push('}');
}

struct Gen<'a> {
    root: &'a Value,
    sampler: &'a Sampler,
    pool: &'a OutputVocab,
    draws: u64,
    /// Length of `out` at which generation stops.
    limit: usize,
    steps_left: u64,
}

/// Why generation stopped early.
enum Halt {
    /// The byte or step budget is spent (not an error: the output is cut).
    Budget,
    /// The schema cannot be satisfied.
    Bad(SchemaError),
}

impl Gen<'_> {
    /// Spends `n` steps; stops generation once the output or the steps reach their budget.
    fn spend(&mut self, n: u64, out: &str) -> Result<(), Halt> {
        if out.len() >= self.limit || self.steps_left < n {
            return Err(Halt::Budget);
        }
        self.steps_left -= n;
        Ok(())
    }

    fn pick(&mut self, n: usize) -> usize {
        self.draws += 1;
        self.sampler.pick(5, self.draws, n.max(1))
    }

    fn word(&mut self) -> &str {
        let i = self.pick(self.pool.len());
        self.pool.text(i).trim_start()
    }

    /// A string of one to three pool words.
    fn words(&mut self, out: &mut String) {
        out.push('"');
        for i in 0..=self.pick(3) {
            if i > 0 {
                out.push(' ');
            }
            let w = self.word().to_string();
            out.push_str(&w);
        }
        out.push('"');
    }

    fn value(&mut self, schema: &Value, depth: usize, at: &At<'_>, out: &mut String) -> Result<(), Halt> {
        self.spend(1, out)?;
        let err = |message: String| Halt::Bad(SchemaError { at: at.render(), message });
        if depth > HARD_DEPTH {
            return Err(err(format!("the schema requires nesting deeper than {HARD_DEPTH} levels")));
        }
        let Value::Object(map) = schema else {
            // `true`: anything; a string will do.
            self.words(out);
            return Ok(());
        };
        if let Some(r) = map.get("$ref").and_then(Value::as_str) {
            let target = resolve(self.root, r).ok_or_else(|| err(format!("unresolved $ref {r:?}")))?;
            return self.value(target, depth + 1, &at.child(Seg::Ref(r)), out);
        }
        if let Some(c) = map.get("const") {
            write_value(c, out);
            return Ok(());
        }
        if let Some(Value::Array(options)) = map.get("enum") {
            let i = self.pick(options.len());
            write_value(&options[i], out);
            return Ok(());
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(first) = map.get(key).and_then(Value::as_array).and_then(|a| a.first()) {
                return self.value(first, depth + 1, &at.child(Seg::Index(key, 0)), out);
            }
        }
        let ty = match first_type(map) {
            Some(t) => t,
            None if map.get("type").is_some() => "string",
            None if map.contains_key("properties") => "object",
            None if map.contains_key("items") => "array",
            None => "string",
        };
        match ty {
            "object" => {
                out.push('{');
                let required: Vec<&str> = map
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                self.spend(required.len() as u64, out)?;
                // A set, not the list: a list lookup per property is quadratic in the schema.
                let wanted: HashSet<&str> = required.iter().copied().collect();
                let mut first = true;
                let declared = map.get("properties").and_then(Value::as_object);
                if let Some(props) = declared {
                    for (name, sub) in props {
                        self.spend(1, out)?;
                        let include =
                            wanted.contains(name.as_str()) || (depth < SOFT_DEPTH && self.pick(2) == 0);
                        if !include {
                            continue;
                        }
                        if !first {
                            out.push_str(", ");
                        }
                        first = false;
                        write_string(name, out);
                        out.push_str(": ");
                        self.value(sub, depth + 1, &at.child(Seg::Named("properties", name)), out)?;
                    }
                }
                // A required name without a declared schema still has to appear.
                for name in required {
                    if declared.is_some_and(|p| p.contains_key(name)) {
                        continue;
                    }
                    self.spend(1, out)?;
                    if !first {
                        out.push_str(", ");
                    }
                    first = false;
                    write_string(name, out);
                    out.push_str(": ");
                    self.words(out);
                }
                out.push('}');
            }
            "array" => {
                let min = map.get("minItems").and_then(Value::as_u64).unwrap_or(0);
                let max = map.get("maxItems").and_then(Value::as_u64).unwrap_or(u64::MAX);
                let want = if depth < SOFT_DEPTH { 1 + self.pick(3) as u64 } else { 0 };
                // Up to 64 items beyond minItems; the budget, not the count, bounds the work.
                let count = want.clamp(min, max.max(min)).min(min.max(64));
                let items = map.get("items").unwrap_or(&Value::Bool(true));
                let item_at = at.child(Seg::Key("items"));
                out.push('[');
                for i in 0..count {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    self.value(items, depth + 1, &item_at, out)?;
                }
                out.push(']');
            }
            "integer" | "number" => {
                let (lo, hi) = bounds(map, ty == "integer").map_err(&err)?;
                let span = (hi - lo).max(0.0);
                let u = self.pick(1 << 20) as f64 / f64::from(1u32 << 20);
                if ty == "integer" {
                    let v = (lo + (u * (span + 1.0)).floor()).min(hi);
                    out.push_str(&format!("{}", v as i64));
                } else {
                    // Two decimals, kept inside the bounds after rounding.
                    let v = ((lo + u * span) * 100.0).floor() / 100.0;
                    let v = if v < lo { lo } else { v };
                    let s = serde_json::to_string(&v).expect("finite");
                    out.push_str(&s);
                }
            }
            "boolean" => out.push_str(if self.pick(2) == 0 { "true" } else { "false" }),
            "null" => out.push_str("null"),
            _ => self.words(out),
        }
        Ok(())
    }
}

/// The range numbers are drawn from: the schema's bounds (exclusive ones moved in), else
/// 0..=100 around whichever bound is given.
fn bounds(map: &serde_json::Map<String, Value>, integer: bool) -> Result<(f64, f64), String> {
    let get = |k: &str| map.get(k).and_then(Value::as_f64);
    let step = if integer { 1.0 } else { 0.01 };
    let mut lo = get("minimum");
    if let Some(x) = get("exclusiveMinimum") {
        lo = Some(lo.map_or(x + step, |l: f64| l.max(x + step)));
    }
    let mut hi = get("maximum");
    if let Some(x) = get("exclusiveMaximum") {
        hi = Some(hi.map_or(x - step, |h: f64| h.min(x - step)));
    }
    let (mut lo, mut hi) = match (lo, hi) {
        (Some(l), Some(h)) => (l, h),
        (Some(l), None) => (l, l + 100.0),
        (None, Some(h)) => (h - 100.0, h),
        (None, None) => (0.0, 100.0),
    };
    if integer {
        lo = lo.ceil();
        hi = hi.floor();
    }
    if lo > hi {
        return Err(format!("no {} lies within minimum/maximum", if integer { "integer" } else { "number" }));
    }
    Ok((lo, hi))
}

/// A JSON string literal.
fn write_string(s: &str, out: &mut String) {
    out.push_str(&serde_json::to_string(s).expect("strings serialize"));
}

/// A JSON value in `json.dumps` layout.
fn write_value(v: &Value, out: &mut String) {
    match v {
        Value::Array(items) => {
            out.push('[');
            for (i, x) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_value(x, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, x)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&serde_json::to_string(k).expect("strings serialize"));
                out.push_str(": ");
                write_value(x, out);
            }
            out.push('}');
        }
        other => out.push_str(&serde_json::to_string(other).expect("scalars serialize")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A budget no test schema reaches.
    const BIG: usize = 1 << 20;

    fn gen(schema: &Value, seed: u64) -> Value {
        check(schema).unwrap();
        let mut out = String::new();
        let done = generate(schema, &Sampler::seeded(seed, &[1], 0), &OutputVocab::builtin(), BIG, &mut out);
        assert_eq!(done, Ok(Generated::Complete));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    fn person() -> Value {
        json!({
            "$defs": {
                "pet": {"type": "object", "properties": {
                    "kind": {"enum": ["cat", "dog"]},
                    "age": {"type": "integer", "minimum": 1, "maximum": 20}
                }, "required": ["kind", "age"], "additionalProperties": false}
            },
            "type": "object",
            "title": "Person",
            "properties": {
                "name": {"type": "string", "description": "full name"},
                "height": {"type": "number", "exclusiveMinimum": 1.5, "maximum": 2.1},
                "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4},
                "pets": {"type": "array", "items": {"$ref": "#/$defs/pet"}},
                "alive": {"type": "boolean"},
                "spouse": {"anyOf": [{"type": "null"}, {"type": "string"}]},
                "nick": {"type": ["string", "null"]},
                "version": {"const": 2}
            },
            "required": ["name", "height", "tags", "pets", "alive", "spouse", "version", "extra"]
        })
    }

    #[test]
    fn generated_values_match_the_schema() {
        for seed in 0..200 {
            let v = gen(&person(), seed);
            let o = v.as_object().unwrap();
            assert!(o["name"].as_str().is_some_and(|s| !s.is_empty()));
            let h = o["height"].as_f64().unwrap();
            assert!(h > 1.5 && h <= 2.1, "{h}");
            let tags = o["tags"].as_array().unwrap();
            assert!((2..=4).contains(&tags.len()) && tags.iter().all(Value::is_string));
            for pet in o["pets"].as_array().unwrap() {
                assert!(["cat", "dog"].contains(&pet["kind"].as_str().unwrap()));
                assert!((1..=20).contains(&pet["age"].as_i64().unwrap()));
                assert_eq!(pet.as_object().unwrap().len(), 2);
            }
            assert!(o["alive"].is_boolean());
            assert!(o["spouse"].is_null(), "anyOf takes the first branch");
            assert_eq!(o["version"], 2);
            assert!(o["extra"].is_string());
            if let Some(n) = o.get("nick") {
                assert!(n.is_string());
            }
        }
    }

    #[test]
    fn output_is_deterministic_per_key_and_varies_across_keys() {
        assert_eq!(gen(&person(), 3), gen(&person(), 3));
        let distinct: std::collections::HashSet<String> =
            (0..20).map(|s| gen(&person(), s).to_string()).collect();
        assert!(distinct.len() > 15, "{}", distinct.len());
    }

    #[test]
    fn recursive_schemas_end_and_json_object_is_an_object() {
        let tree = json!({"$defs": {"node": {"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
            "$ref": "#/$defs/node"});
        for seed in 0..50 {
            assert!(gen(&tree, seed).is_object());
        }
        let endless = json!({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}}, "$ref": "#/$defs/n"});
        let mut out = String::new();
        let e = generate(&endless, &Sampler::seeded(1, &[], 0), &OutputVocab::builtin(), BIG, &mut out)
            .unwrap_err();
        assert!(e.message.contains("deeper"), "{e}");
        for seed in 0..50 {
            let mut out = String::new();
            generate_object(&Sampler::seeded(seed, &[], 0), &OutputVocab::builtin(), &mut out);
            let v: Value = serde_json::from_str(&out).unwrap();
            assert!((2..=4).contains(&v.as_object().unwrap().len()), "{out}");
        }
    }

    #[test]
    fn unsupported_keywords_and_bad_refs_are_refused_by_name() {
        let e = check(&json!({"type": "object", "properties": {"d": {"type": "string", "pattern": "^a", "format": "date"}}})).unwrap_err();
        assert_eq!(e.at, "/properties/d");
        assert!(e.message.contains("format, pattern"), "{e}");
        assert!(check(&json!({"allOf": [{}]})).unwrap_err().message.contains("allOf"));
        assert!(check(&json!({"$ref": "https://example.com/s.json"})).unwrap_err().message.contains("$ref"));
        assert!(check(&json!({"type": "text"})).is_err());
        assert!(check(&json!({"enum": []})).is_err());
        assert!(check(&json!({"type": "array", "minItems": 3, "maxItems": 1})).is_err());
        assert!(check(&json!(5)).is_err());
        let mut out = String::new();
        let bad = json!({"type": "integer", "minimum": 5, "maximum": 4});
        assert!(generate(&bad, &Sampler::seeded(1, &[], 0), &OutputVocab::builtin(), BIG, &mut out).is_err());
        // Bounds nothing lies within are refused up front, not when generation reaches them.
        assert!(check(&json!({"properties": {"n": bad}})).unwrap_err().at == "/properties/n");
    }

    /// Arrays of `min` items nested `depth` deep (the repro: `minItems: 100000`
    /// twice materialised 10^10 strings).
    fn nested_arrays(min: u64, depth: usize) -> Value {
        let mut s = json!({"type": "string"});
        for _ in 0..depth {
            s = json!({"type": "array", "items": s, "minItems": min});
        }
        s
    }

    /// Generates under `budget`, checking the output is a prefix of JSON text.
    fn cut(schema: &Value, budget: usize) -> (Generated, String) {
        check(schema).unwrap();
        let mut out = String::new();
        let done = generate(schema, &Sampler::seeded(9, &[1], 0), &OutputVocab::builtin(), budget, &mut out)
            .unwrap();
        (done, out)
    }

    /// Whether `text` is a prefix of some JSON text: serde_json reports running out of
    /// input, not a syntax error.
    fn is_json_prefix(text: &str) -> bool {
        match serde_json::from_str::<Value>(text) {
            Ok(_) => true,
            Err(e) => e.is_eof(),
        }
    }

    #[test]
    fn huge_min_items_stop_at_the_budget() {
        for schema in [nested_arrays(100_000, 2), nested_arrays(100_000, 4), nested_arrays(30_000_000, 1)] {
            let started = std::time::Instant::now();
            let (done, out) = cut(&schema, 1600);
            assert_eq!(done, Generated::Cut);
            assert!(out.len() <= 1600 && out.len() > 1000, "{}", out.len());
            assert!(out.starts_with('[') && is_json_prefix(&out), "{out}");
            assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        }
        // The hard ceiling a plan gets (4 MiB) is reached quickly too.
        let (done, out) = cut(&nested_arrays(30_000_000, 1), 4 << 20);
        assert_eq!((done, out.len() <= 4 << 20), (Generated::Cut, true));
        assert!(out.len() > 4_000_000 && is_json_prefix(&out));
    }

    #[test]
    fn a_cut_is_the_prefix_of_the_whole_value() {
        // Same draws, so the cut output is where the uncut one would have been.
        let (done, whole) = cut(&person(), BIG);
        assert_eq!(done, Generated::Complete);
        for budget in [1, 7, whole.len() / 2, whole.len() - 1] {
            let (done, part) = cut(&person(), budget);
            assert_eq!(done, Generated::Cut, "{budget}");
            assert!(whole.starts_with(&part) && part.len() <= budget, "{budget}: {part}");
        }
        assert_eq!(cut(&person(), whole.len()), (Generated::Complete, whole));
    }

    #[test]
    fn wide_objects_in_long_arrays_are_bounded_by_steps() {
        // Deep enough that nothing optional is written: each item walks 10k properties to
        // write "{}", so bytes alone would allow billions of steps.
        let props: serde_json::Map<String, Value> =
            (0..10_000).map(|i| (format!("p{i}"), json!({"type": "string"}))).collect();
        let mut schema = json!({"type": "object", "properties": props});
        for _ in 0..8 {
            schema = json!({"type": "array", "items": schema, "minItems": 1_000_000});
        }
        let started = std::time::Instant::now();
        let (done, out) = cut(&schema, 100_000);
        assert_eq!(done, Generated::Cut);
        assert!(is_json_prefix(&out), "{out}");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    /// An object with `n` properties, all required.
    fn all_required(n: usize) -> Value {
        let names: Vec<String> = (0..n).map(|i| format!("field_{i}")).collect();
        let props: serde_json::Map<String, Value> =
            names.iter().map(|k| (k.clone(), json!({"type": "boolean"}))).collect();
        json!({"type": "object", "properties": props, "required": names})
    }

    #[test]
    fn many_required_properties_are_linear() {
        // 50k required properties: 1.25e9 string comparisons with a list lookup per
        // property (seconds even in release); a set makes it milliseconds.
        let schema = all_required(50_000);
        let started = std::time::Instant::now();
        let (done, out) = cut(&schema, 4 << 20);
        let took = started.elapsed();
        assert_eq!(done, Generated::Complete);
        assert_eq!(serde_json::from_str::<Value>(&out).unwrap().as_object().unwrap().len(), 50_000);
        assert!(took < std::time::Duration::from_secs(3), "{took:?}");
    }

    #[test]
    fn oversized_schemas_are_refused() {
        let e = check(&all_required(MAX_SCHEMA_ELEMENTS / 2 + 1)).unwrap_err();
        assert!(e.message.contains("more than 200000"), "{e}");
        assert!(check(&all_required(MAX_SCHEMA_ELEMENTS / 2 - 1)).is_ok());
    }

    #[test]
    fn error_pointers_name_the_path() {
        let s = json!({"$defs": {"a": {"type": "object", "properties": {"x": {"anyOf": [{"type": "array", "items": {"format": "x"}}]}}}}, "$ref": "#/$defs/a"});
        assert_eq!(check(&s).unwrap_err().at, "/$defs/a/properties/x/anyOf/0/items");
    }
}
