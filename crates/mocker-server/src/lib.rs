//! mocker's OpenAI-compatible HTTP server: `/v1/completions` and `/v1/chat/completions`
//! (streamed at the simulated engine's pace), `/v1/models`, `/health` (and `/ping`,
//! `/health/ready`), `/metrics` as vLLM exposes it, `/tokenize` and `/detokenize`,
//! `/v1/embeddings`, `/v1/responses`, Anthropic's `/v1/messages`, vLLM's tokens-in/tokens-out
//! `/inference/v1/generate` and pooling routes (`/rerank`, `/score`, `/pooling`), vLLM's
//! sleep mode (`/sleep`, `/wake_up`, `/is_sleeping`), and LoRA adapters
//! (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`);
//! and on the same port the backend's gRPC service, vLLM's `vllm.grpc.engine.VllmEngine` or
//! SGLang's `sglang.grpc.scheduler.SglangScheduler` (`api::grpc`).
//!
//! The modules form five layers; a module imports only from its own layer or those below
//! (`tests/layers.rs` checks it, and that no two modules import each other):
//!
//! - types (bottom): errors, the tokenizer, metrics, the protocols' request and response
//!   types (`openai`, `pd`), what the model writes (`output`, `choice_plan`), and the small state machines the routes
//!   share (`readiness`, `sleep`, `lora`, `faults`, `runtime`, `auth`,
//!   `engine_card`), and TLS material (`tls`);
//! - state: `state` (`AppState`, what every handler shares);
//! - serving: `generate` (a request through the engine to its response or stream) and
//!   `prefix` (prompt blocks as the server hashes them);
//! - api: `api`, one module per API family, and the middleware;
//! - assembly (top): `app` (the router), `conn` (connections), `server` (start and stop),
//!   `front` (the P/D front).

#![warn(missing_docs)]

// types
pub mod auth;
pub mod body;
pub mod choice_plan;
pub mod engine_card;
pub mod error;
pub mod faults;
pub mod lora;
pub mod metrics;
pub mod openai;
pub mod output;
pub mod pd;
pub mod plan;
mod raw_errors;
pub mod readiness;
pub mod runtime;
pub mod sleep;
pub mod tls;
pub mod tokenizer;
// state
pub mod state;
// serving
pub mod generate;
pub mod prefix;
// api
pub mod api;
// assembly
pub mod app;
mod conn;
pub mod front;
pub mod server;

pub use server::{
    served_max_model_len, BoundKvEvents, BoundServer, KvEventsOptions, ServerError, ServerOptions,
};
pub use tokenizer::Tokenizer;
