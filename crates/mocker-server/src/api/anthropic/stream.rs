//! A chat completion stream as Anthropic's Messages events, in the order vLLM's adapter
//! sends them: `message_start` (from the role chunk, with the prompt's tokens), per block
//! `content_block_start`, `content_block_delta`s (`text_delta`, or `input_json_delta` for
//! a tool call), `content_block_stop` when the usage chunk arrives, `message_delta` with
//! `stop_reason`, `stop_sequence` and usage, then `message_stop` for `[DONE]`. As vLLM,
//! no `ping` events; a failure mid-stream is an `error` event.

use serde_json::{json, Value};

use super::stop_reason;

/// The block open in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Tool,
}

/// The state of one converted stream.
#[derive(Debug, Default)]
pub struct Events {
    started: bool,
    /// The open block and its index.
    open: Option<(Block, u32)>,
    /// Index of the next block.
    next: u32,
    /// `stop_reason` and `stop_sequence`, once the choice finished.
    stop: Option<(Value, Value)>,
    /// Nothing more is sent (after `message_stop` or an error).
    done: bool,
}

fn event(out: &mut Vec<u8>, name: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    serde_json::to_writer(&mut *out, data).expect("values serialize");
    out.extend_from_slice(b"\n\n");
}

impl Events {
    fn close_block(&mut self, out: &mut Vec<u8>) {
        if let Some((_, index)) = self.open.take() {
            event(out, "content_block_stop", &json!({"type": "content_block_stop", "index": index}));
        }
    }

    fn open_block(&mut self, out: &mut Vec<u8>, kind: Block, block: Value) -> u32 {
        self.close_block(out);
        let index = self.next;
        self.next += 1;
        self.open = Some((kind, index));
        event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        );
        index
    }

    fn error(&mut self, out: &mut Vec<u8>, kind: &str, message: &str) {
        event(out, "error", &json!({"type": "error", "error": {"type": kind, "message": message}}));
        self.done = true;
    }

    /// Converts one chat frame's payload.
    pub fn frame(&mut self, data: &[u8], out: &mut Vec<u8>) {
        if self.done {
            return;
        }
        if data == b"[DONE]" {
            self.close_block(out);
            event(out, "message_stop", &json!({"type": "message_stop"}));
            self.done = true;
            return;
        }
        let Ok(chunk) = serde_json::from_slice::<Value>(data) else {
            return self.error(out, "internal_error", "Invalid data format received");
        };
        if let Some(e) = chunk.get("error") {
            let kind = e["type"].as_str().unwrap_or("internal_error");
            return self.error(out, kind, e["message"].as_str().unwrap_or("generation failed"));
        }
        let usage = &chunk["usage"];
        let input = usage["prompt_tokens"].as_u64().unwrap_or(0);
        let output = usage["completion_tokens"].as_u64().unwrap_or(0);
        if !self.started {
            self.started = true;
            let message = json!({
                "id": chunk["id"], "type": "message", "role": "assistant", "content": [],
                "model": chunk["model"], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input, "output_tokens": 0},
            });
            event(out, "message_start", &json!({"type": "message_start", "message": message}));
        }
        let Some(choice) = chunk["choices"].as_array().and_then(|c| c.first()) else {
            if usage.is_object() {
                // The usage-only chunk: the content is complete.
                self.close_block(out);
                let (reason, sequence) = self.stop.take().unwrap_or((json!("end_turn"), Value::Null));
                let delta = json!({
                    "type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": {"input_tokens": input, "output_tokens": output},
                });
                event(out, "message_delta", &delta);
            }
            return;
        };
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            let index = match self.open {
                Some((Block::Text, index)) => index,
                _ => self.open_block(out, Block::Text, json!({"type": "text", "text": ""})),
            };
            let d = json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}});
            event(out, "content_block_delta", &d);
        }
        if let Some(call) = delta["tool_calls"].as_array().and_then(|c| c.first()) {
            let index = match (self.open, call.get("id")) {
                (Some((Block::Tool, index)), None) => index,
                _ => self.open_block(
                    out,
                    Block::Tool,
                    json!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": {}}),
                ),
            };
            if let Some(args) = call["function"]["arguments"].as_str().filter(|a| !a.is_empty()) {
                let d = json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": args}});
                event(out, "content_block_delta", &d);
            }
        }
        if !choice["finish_reason"].is_null() {
            self.stop = Some(stop_reason(&choice["finish_reason"], &choice["stop_reason"]));
        }
    }

    /// The chat stream ended: a stream cut short without `[DONE]` ends with an error event.
    pub fn end(&mut self, out: &mut Vec<u8>) {
        if !self.done {
            self.error(out, "internal_error", "the generation stream ended early");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(frames: &[&str]) -> Vec<(String, Value)> {
        let mut e = Events::default();
        let mut out = Vec::new();
        for f in frames {
            e.frame(f.as_bytes(), &mut out);
        }
        e.end(&mut out);
        String::from_utf8(out)
            .unwrap()
            .split("\n\n")
            .filter(|s| !s.is_empty())
            .map(|s| {
                let (name, data) = s.split_once('\n').unwrap();
                (
                    name.strip_prefix("event: ").unwrap().to_string(),
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
                )
            })
            .collect()
    }

    const USAGE: &str = r#""usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}"#;

    #[test]
    fn a_text_stream_becomes_anthropics_event_sequence() {
        let role = format!(
            r#"{{"id":"chatcmpl-1","model":"m","choices":[{{"index":0,"delta":{{"role":"assistant","content":""}},"finish_reason":null}}],{USAGE}}}"#
        );
        let a = format!(
            r#"{{"id":"chatcmpl-1","model":"m","choices":[{{"index":0,"delta":{{"content":"Hi"}},"finish_reason":null}}],{USAGE}}}"#
        );
        let b = format!(
            r#"{{"id":"chatcmpl-1","model":"m","choices":[{{"index":0,"delta":{{"content":" there"}},"finish_reason":"stop","stop_reason":"END"}}],{USAGE}}}"#
        );
        let u = format!(r#"{{"id":"chatcmpl-1","model":"m","choices":[],{USAGE}}}"#);
        let got = events(&[&role, &a, &b, &u, "[DONE]"]);
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        let start = &got[0].1["message"];
        assert_eq!(
            (start["id"].as_str(), start["type"].as_str(), start["role"].as_str()),
            (Some("chatcmpl-1"), Some("message"), Some("assistant"))
        );
        assert_eq!(start["usage"], json!({"input_tokens": 7, "output_tokens": 0}));
        assert_eq!(got[1].1["content_block"], json!({"type": "text", "text": ""}));
        assert_eq!(got[3].1["delta"], json!({"type": "text_delta", "text": " there"}));
        assert_eq!(got[5].1["delta"], json!({"stop_reason": "stop_sequence", "stop_sequence": "END"}));
        assert_eq!(got[5].1["usage"], json!({"input_tokens": 7, "output_tokens": 2}));
    }

    #[test]
    fn tool_calls_stream_as_tool_use_blocks_and_errors_as_error_events() {
        let first = r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call-1","type":"function","function":{"name":"f","arguments":"{\""}}]},"finish_reason":null}]}"#;
        let last = r#"{"id":"c","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"}"}}]},"finish_reason":"tool_calls","stop_reason":null}]}"#;
        let u = format!(r#"{{"id":"c","model":"m","choices":[],{USAGE}}}"#);
        let got = events(&[first, last, &u, "[DONE]"]);
        assert_eq!(
            got[1].1["content_block"],
            json!({"type": "tool_use", "id": "call-1", "name": "f", "input": {}})
        );
        assert_eq!(got[2].1["delta"], json!({"type": "input_json_delta", "partial_json": "{\""}));
        assert_eq!(got[3].1["index"], 0);
        assert_eq!(got[5].1["delta"]["stop_reason"], "tool_use");
        let cut = events(&[
            first,
            r#"{"error":{"message":"engine stopped","type":"ServiceUnavailableError"}}"#,
            "[DONE]",
        ]);
        let (name, data) = cut.last().unwrap();
        assert_eq!(name, "error");
        assert_eq!(data["error"]["message"], "engine stopped");
        assert!(cut.iter().all(|(n, _)| n != "message_stop"));
    }
}
