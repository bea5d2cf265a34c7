//! Chat messages to prompt text. mocker applies ChatML (`<|im_start|>role ... <|im_end|>`),
//! the template of the Qwen family and many others, whichever tokenizer is loaded: what the
//! simulation needs is a prompt whose length and prefix sharing follow the conversation.

use super::request::ChatMessage;

/// Renders `messages` followed by the opening of the assistant's turn.
pub fn render(messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_turns_extend_earlier_prompts() {
        let msg = |role: &str, content: &str| ChatMessage { role: role.into(), content: content.into() };
        let one = [msg("user", "hi")];
        let two = [msg("user", "hi"), msg("assistant", "hello"), msg("user", "more")];
        let first = render(&one);
        let second = render(&two);
        let shared = first.trim_end_matches("<|im_start|>assistant\n");
        assert!(second.starts_with(shared));
        assert!(first.ends_with("<|im_start|>assistant\n"));
    }
}
