//! Chat messages to prompt text. mocker applies ChatML (`<|im_start|>role ... <|im_end|>`),
//! the template of the Qwen family and many others, whichever tokenizer is loaded: what the
//! simulation needs is a prompt whose length and prefix sharing follow the conversation.

use super::request::{ChatMessage, PromptInput};

/// Renders `messages` followed by the opening of the assistant's turn (images leave no
/// text; see [`prompt`]).
pub fn render(messages: &[ChatMessage]) -> String {
    render_with_images(messages).0
}

/// The rendered text and where each image stands in it (byte offset, URL).
fn render_with_images(messages: &[ChatMessage]) -> (String, Vec<(usize, String)>) {
    let mut out = String::new();
    let mut images = Vec::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        let base = out.len();
        images.extend(m.images.iter().map(|(at, url)| (base + at, url.clone())));
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    out.push_str("<|im_start|>assistant\n");
    (out, images)
}

/// The prompt of a chat request: text, or text with images when the messages carry any.
pub fn prompt(messages: &[ChatMessage]) -> PromptInput {
    let (text, images) = render_with_images(messages);
    if images.is_empty() {
        PromptInput::Text(text)
    } else {
        PromptInput::Multimodal { text, images }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_turns_extend_earlier_prompts() {
        let msg = |role: &str, content: &str| ChatMessage {
            role: role.into(),
            content: content.into(),
            images: Vec::new(),
        };
        let one = [msg("user", "hi")];
        let two = [msg("user", "hi"), msg("assistant", "hello"), msg("user", "more")];
        let first = render(&one);
        let second = render(&two);
        let shared = first.trim_end_matches("<|im_start|>assistant\n");
        assert!(second.starts_with(shared));
        assert!(first.ends_with("<|im_start|>assistant\n"));
    }
}
