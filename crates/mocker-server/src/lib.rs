//! mocker's OpenAI-compatible HTTP server: `/v1/completions` and `/v1/chat/completions`
//! (streamed at the simulated engine's pace), `/v1/models`, `/health` (and `/ping`,
//! `/health/ready`), `/metrics` as vLLM exposes it, `/tokenize` and `/detokenize`,
//! `/v1/embeddings`, `/v1/responses`, and vLLM's sleep mode (`/sleep`, `/wake_up`,
//! `/is_sleeping`), and LoRA adapters (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`).

#![warn(missing_docs)]

pub mod app;
pub mod auth;
mod conn;
pub mod embeddings;
pub mod error;
pub mod faults;
pub mod front;
pub mod gate;
pub mod generate;
pub mod lora;
pub mod metrics;
pub mod openai;
pub mod output;
pub mod pd;
pub mod plan;
pub mod prefix;
mod raw_errors;
pub mod responses;
pub mod server;
pub mod sleep;
pub mod tokenizer;

pub use server::{
    served_max_model_len, BoundKvEvents, BoundServer, KvEventsOptions, ServerError, ServerOptions,
};
pub use tokenizer::Tokenizer;
