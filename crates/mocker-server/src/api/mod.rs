//! The routes, one module per API family, and the middleware around them.

pub mod admin;
pub mod anthropic;
pub mod embeddings;
pub mod grpc;
pub mod lora;
pub mod middleware;
pub mod openai;
pub mod pooling;
pub mod responses;
pub mod sleep;
pub mod sse;
pub mod tokens;
pub mod vllm;
