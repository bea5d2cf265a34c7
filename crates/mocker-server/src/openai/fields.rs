//! The request fields that shape what the simulated model writes rather than how long:
//! `n`, `logprobs` / `top_logprobs`, `response_format`, `tools` / `tool_choice`. Each is
//! validated here into what generation needs, with vLLM's limits and a 400 naming the
//! field otherwise.

use std::sync::Arc;

use serde_json::Value;

use crate::error::ApiError;
use crate::output::logprobs::LogprobsShape;
use crate::output::sampler::MAX_TOP_LOGPROBS;
use crate::output::schema;

/// Most choices one request may ask for.
pub const MAX_N: u32 = 128;

/// Output constrained to JSON (`response_format`).
#[derive(Debug, Clone, PartialEq)]
pub enum Structured {
    /// `json_object`: any JSON object.
    JsonObject,
    /// `json_schema`: a value matching the schema.
    Schema(Arc<Value>),
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    /// `function.name`.
    pub name: String,
    /// `function.parameters` (a JSON schema; `{}` when absent).
    pub parameters: Arc<Value>,
}

/// `tool_choice`, once `none` is ruled out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides: a call with probability [`AUTO_CALL_PERCENT`] %.
    Auto,
    /// Always a call, to one of the tools.
    Required,
    /// Always a call to this tool (index into the functions).
    Named(usize),
}

/// Share of `tool_choice: "auto"` requests (per choice) answered with a tool call.
pub const AUTO_CALL_PERCENT: u64 = 50;

/// `tools` with a `tool_choice` other than `none`.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// The functions offered.
    pub functions: Vec<Function>,
    /// How the model picks.
    pub choice: ToolChoice,
}

fn bad(field: &str, message: String) -> ApiError {
    ApiError::invalid_field(field, message)
}

/// `n`: 1 to [`MAX_N`].
pub fn n(value: &Value) -> Result<u32, ApiError> {
    match value {
        Value::Null => Ok(1),
        v => match v.as_i64() {
            Some(n) if (1..=i64::from(MAX_N)).contains(&n) => Ok(n as u32),
            _ => Err(bad("n", format!("n must be an integer between 1 and {MAX_N}, got {v}"))),
        },
    }
}

/// Chat's `logprobs` (bool) and `top_logprobs` (0..=20, only with `logprobs: true`).
pub fn chat_logprobs(logprobs: &Value, top: &Value) -> Result<Option<LogprobsShape>, ApiError> {
    let on = match logprobs {
        Value::Null => false,
        Value::Bool(b) => *b,
        v => return Err(bad("logprobs", format!("logprobs: expected a boolean, got {v}"))),
    };
    let top = match top {
        Value::Null => None,
        v => match v.as_i64() {
            Some(k) if (0..=i64::from(MAX_TOP_LOGPROBS)).contains(&k) => Some(k as u32),
            _ => {
                return Err(bad(
                    "top_logprobs",
                    format!("top_logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS}, got {v}"),
                ))
            }
        },
    };
    match (on, top) {
        (false, Some(k)) if k > 0 => {
            Err(bad("top_logprobs", "when using top_logprobs, logprobs must be set to true".into()))
        }
        (false, _) => Ok(None),
        (true, k) => Ok(Some(LogprobsShape::Chat { top: k.unwrap_or(0) })),
    }
}

/// Completions' `logprobs`: how many alternatives per token (0..=20), or null.
pub fn completion_logprobs(value: &Value) -> Result<Option<LogprobsShape>, ApiError> {
    match value {
        Value::Null => Ok(None),
        v => match v.as_i64() {
            Some(k) if (0..=i64::from(MAX_TOP_LOGPROBS)).contains(&k) => {
                Ok(Some(LogprobsShape::Completion { top: k as u32 }))
            }
            _ => Err(bad(
                "logprobs",
                format!("logprobs must be an integer between 0 and {MAX_TOP_LOGPROBS}, got {v}"),
            )),
        },
    }
}

/// `response_format`: `text` (nothing to do), `json_object`, or `json_schema` with a
/// schema the generator supports.
pub fn response_format(value: &Value) -> Result<Option<Structured>, ApiError> {
    const F: &str = "response_format";
    if value.is_null() {
        return Ok(None);
    }
    match value.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Structured::JsonObject)),
        Some("json_schema") => {
            let schema = value
                .get("json_schema")
                .and_then(|j| j.get("schema"))
                .ok_or_else(|| bad(F, "response_format: json_schema needs json_schema.schema".into()))?;
            schema::check(schema).map_err(|e| bad(F, format!("response_format.json_schema.schema: {e}")))?;
            Ok(Some(Structured::Schema(Arc::new(schema.clone()))))
        }
        other => Err(bad(
            F,
            format!(
                "response_format: type must be \"text\", \"json_object\" or \"json_schema\", got {}",
                other.map_or_else(|| value.to_string(), |t| format!("{t:?}"))
            ),
        )),
    }
}

/// `tools` and `tool_choice`: `None` when no tool may be called.
pub fn tools(tools: &Value, choice: &Value) -> Result<Option<Tools>, ApiError> {
    let list = match tools {
        Value::Null => &[][..],
        Value::Array(items) => items.as_slice(),
        v => return Err(bad("tools", format!("tools: expected a list, got {v}"))),
    };
    let mut functions = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad(&at, format!("{at}.type must be \"function\"")));
        }
        let f = t.get("function").ok_or_else(|| bad(&at, format!("{at}.function is required")))?;
        let name = f
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad(&at, format!("{at}.function.name must be a non-empty string")))?;
        let parameters = f.get("parameters").cloned().unwrap_or_else(|| serde_json::json!({}));
        schema::check(&parameters).map_err(|e| bad(&at, format!("{at}.function.parameters: {e}")))?;
        functions.push(Function { name: name.to_string(), parameters: Arc::new(parameters) });
    }
    let choice = match choice {
        Value::Null if functions.is_empty() => return Ok(None),
        Value::Null => ToolChoice::Auto,
        Value::String(s) => match s.as_str() {
            "none" => return Ok(None),
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(bad(
                    "tool_choice",
                    format!(
                    "tool_choice must be \"none\", \"auto\", \"required\" or a named function, got {other:?}"
                ),
                ))
            }
        },
        Value::Object(_) => {
            let name =
                choice.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).ok_or_else(
                    || bad("tool_choice", "tool_choice: a named choice needs function.name".into()),
                )?;
            let at = functions.iter().position(|f| f.name == name).ok_or_else(|| {
                bad("tool_choice", format!("tool_choice names {name:?}, which is not among the tools"))
            })?;
            ToolChoice::Named(at)
        }
        v => return Err(bad("tool_choice", format!("tool_choice: expected a string or an object, got {v}"))),
    };
    if functions.is_empty() {
        return Err(bad("tool_choice", "tool_choice needs tools".into()));
    }
    Ok(Some(Tools { functions, choice }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn limits_and_combinations_are_checked() {
        assert_eq!(n(&json!(null)).unwrap(), 1);
        assert_eq!(n(&json!(128)).unwrap(), 128);
        for v in [json!(0), json!(129), json!("2"), json!(1.5)] {
            assert_eq!(n(&v).unwrap_err().param.as_deref(), Some("n"));
        }
        assert_eq!(chat_logprobs(&json!(true), &json!(3)).unwrap(), Some(LogprobsShape::Chat { top: 3 }));
        assert_eq!(chat_logprobs(&json!(false), &json!(0)).unwrap(), None);
        assert_eq!(
            chat_logprobs(&json!(null), &json!(2)).unwrap_err().param.as_deref(),
            Some("top_logprobs")
        );
        assert!(chat_logprobs(&json!(true), &json!(21)).is_err());
        assert_eq!(completion_logprobs(&json!(0)).unwrap(), Some(LogprobsShape::Completion { top: 0 }));
        assert!(completion_logprobs(&json!(true)).is_err());
    }

    #[test]
    fn response_formats_and_tools_parse_or_name_the_problem() {
        assert_eq!(response_format(&json!({"type": "text"})).unwrap(), None);
        assert_eq!(response_format(&json!({"type": "json_object"})).unwrap(), Some(Structured::JsonObject));
        let e = response_format(&json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a"}}})).unwrap_err();
        assert!(
            e.message.contains("pattern") && e.param.as_deref() == Some("response_format"),
            "{}",
            e.message
        );
        assert!(response_format(&json!({"type": "grammar"})).is_err());
        let t = json!([{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}}]);
        assert_eq!(tools(&t, &json!("none")).unwrap(), None);
        assert_eq!(tools(&t, &json!(null)).unwrap().unwrap().choice, ToolChoice::Auto);
        let named = tools(&t, &json!({"type": "function", "function": {"name": "b"}})).unwrap().unwrap();
        assert_eq!(named.choice, ToolChoice::Named(1));
        assert_eq!(
            tools(&t, &json!({"type": "function", "function": {"name": "c"}})).unwrap_err().param.as_deref(),
            Some("tool_choice")
        );
        assert_eq!(
            tools(&json!(null), &json!("required")).unwrap_err().param.as_deref(),
            Some("tool_choice")
        );
        let bad_params = json!([{"type": "function", "function": {"name": "a", "parameters": {"not": {}}}}]);
        assert_eq!(tools(&bad_params, &json!(null)).unwrap_err().param.as_deref(), Some("tools[0]"));
    }
}
