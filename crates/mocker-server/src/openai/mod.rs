//! The OpenAI wire protocol as vLLM's server speaks it: request parsing and validation,
//! response bodies and streamed chunks, and the chat prompt template.

pub mod fields;
pub mod request;
pub mod response;
pub mod template;
