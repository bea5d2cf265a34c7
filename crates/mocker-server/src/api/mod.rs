//! The routes, one module per API family, and the middleware around them.

pub mod embeddings;
pub mod grpc;
pub mod lora;
pub mod middleware;
pub mod openai;
pub mod responses;
pub mod sleep;
pub mod vllm;
