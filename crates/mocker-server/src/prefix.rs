//! A request's prompt as a KV-aware router sees it before sending it: its length and the
//! sequence hashes of its full blocks, computed exactly as the worker will compute them
//! (same tokenizer, chat template, image tokens and LoRA root), so they match the block
//! hashes the worker's KV events publish.

use std::sync::Arc;

use mocker_core::hashing::PromptHashes;

use crate::error::ApiError;
use crate::generate::prompt_tokens;
use crate::openai::request::{parse_chat, parse_completion};
use crate::openai::template;
use crate::state::AppState;

/// A request's prompt length and block hashes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptBlocks {
    /// Prompt tokens.
    pub isl: usize,
    /// Sequence hashes of the prompt's full blocks.
    pub hashes: Vec<u64>,
}

/// Computes [`PromptBlocks`] of request bodies as one server would (see
/// [`crate::server::BoundServer::prompt_hasher`]).
#[derive(Clone)]
pub struct PromptHasher {
    state: Arc<AppState>,
}

impl std::fmt::Debug for PromptHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptHasher").field("block_size", &self.state.block_size).finish()
    }
}

impl PromptHasher {
    pub(crate) fn new(state: Arc<AppState>) -> Self {
        Self { state }
    }

    /// The prompt of a `/v1/completions` or `/v1/chat/completions` body (`path`); the
    /// error the server itself would answer for a body it refuses.
    pub fn blocks(&self, path: &str, body: &[u8]) -> Result<PromptBlocks, ApiError> {
        let (generation, prompt) = match path {
            "/v1/chat/completions" => {
                let (generation, messages) = parse_chat(body)?;
                (generation, template::prompt(&messages))
            }
            _ => parse_completion(body)?,
        };
        let lora = self.state.resolve_model(generation.model.as_deref())?;
        let (tokens, _) = prompt_tokens(&self.state, prompt, &generation)?;
        let root = lora.as_ref().map(mocker_core::LoraRef::hash_root);
        let hashes = PromptHashes::rooted(&tokens, self.state.block_size, root).sequence;
        Ok(PromptBlocks { isl: tokens.len(), hashes })
    }
}
