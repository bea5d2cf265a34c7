//! What callers submit to an engine and what a pass hands back for each request.

/// A generation request as an engine receives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Caller's request id (a UUID as 128 bits); seeds deterministic output tokens.
    pub uuid: u128,
    /// Prompt token ids.
    pub tokens: Vec<u32>,
    /// Tokens to generate (no EOS is modelled).
    pub max_output_tokens: usize,
    /// Planned output tokens; when given, their count overrides `max_output_tokens`.
    pub output_token_ids: Option<Vec<u32>>,
    /// Hashes of the prompt's full blocks at the engine's block size, when the caller
    /// already has them (a router or a prompt-synthesis thread); the engine computes them
    /// otherwise. They must equal `hashing::PromptHashes::of(tokens, bs)`, except that
    /// `local` may be empty (the engine then computes it if it records KV events), and
    /// that an engine recording no KV events only uses `sequence` as cache keys: there a
    /// caller may pass any identities that are equal exactly when the content hashes are
    /// (for blocks it built to be unique, fresh ids rather than hashes).
    pub block_hashes: Option<crate::hashing::PromptHashes>,
    /// How many leading blocks another request may ever look up (`None`: all of them).
    /// The caller promises that every later block, prompt or generated, is unique to this
    /// request; an engine may then keep those blocks out of its shared prefix index and
    /// its KV events (they cost no hash probes), publishing them only if a preemption
    /// makes the request look them up again. Their `block_hashes` entries need only be
    /// identities unique to the request, and `local` may stop at this count.
    pub shareable_blocks: Option<usize>,
    /// The prompt's length when `tokens` is left empty. A caller that supplies
    /// `block_hashes` for every full prompt block and never needs the prompt's token ids
    /// back (no planned output, an engine with `opaque_output_blocks` and without KV token
    /// ids) may skip materialising prompts; an engine refuses such a request otherwise.
    /// Ignored when `tokens` is not empty.
    pub prompt_len: Option<usize>,
    /// The LoRA adapter the request runs with (`None`: the base model). Only a vLLM or
    /// TRT-LLM engine built with `EngineOptions::max_loras` > 0 accepts one.
    pub lora: Option<LoraRef>,
}

/// A LoRA adapter as a request names it.
///
/// Its name roots every block hash of the request (vLLM puts the adapter name in each
/// block's extra hash keys), so requests of different adapters, or of an adapter and the
/// base model, never share cached blocks; `block_hashes` given with the request must be
/// rooted the same way ([`crate::hashing::PromptHashes::rooted`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LoraRef {
    /// vLLM's `lora_int_id` (from 1): what the scheduler's `max_loras` limit counts and
    /// KV events carry as `lora_id`.
    pub id: u32,
    /// The adapter's name, KV events' `lora_name`.
    pub name: std::sync::Arc<str>,
}

impl LoraRef {
    /// The parent hash the adapter's first block chains onto.
    pub fn hash_root(&self) -> u64 {
        crate::hashing::lora_hash_root(&self.name)
    }
}

impl Request {
    /// Prompt length: `tokens`, or `prompt_len` when they were left out.
    pub fn prompt_len(&self) -> usize {
        match self.prompt_len {
            Some(n) if self.tokens.is_empty() => n,
            _ => self.tokens.len(),
        }
    }

    /// Whether the prompt's token ids were left out.
    pub fn tokenless(&self) -> bool {
        self.tokens.is_empty() && self.prompt_len.is_some_and(|n| n > 0)
    }
}

/// The engine's handle for a submitted request, valid until the pass after its terminal
/// output starts (so a shell can still map that output to its owner).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqKey(pub u32);

/// One request's output from a pass, stamped at the pass end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Output {
    /// Handle returned by `submit`.
    pub key: SeqKey,
    /// The request's id.
    pub uuid: u128,
    /// The sampled token, see [`Output::token_id`].
    pub token: OutputToken,
    /// Index of this token in the request's output (0 for the first token).
    pub index: u32,
    /// Time since the request's previous token (0 for the first token and terminal
    /// outputs without a token): the inter-token latency vLLM reports.
    pub itl_ns: u64,
    /// Last output of the request; its KV has been released.
    pub completed: bool,
    /// The request can never run here (too long for the model or the KV pool).
    pub rejected: bool,
    /// Prefix-cache hit at first admission, carried by the request's first output only.
    pub cached_tokens: Option<u32>,
}

/// A request moved from waiting to running in a pass (admissions happen at pass start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// Handle returned by `submit`.
    pub key: SeqKey,
    /// The request's id.
    pub uuid: u128,
    /// Tokens reused from the prefix cache by this admission.
    pub reused_tokens: u32,
    /// Whether the request had been preempted before.
    pub readmission: bool,
}

/// Where an output's token comes from. Generated tokens are derived on demand from the
/// request id and position, so shells that never read them (offline replay) pay nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputToken {
    /// Terminal output without a token (rejection, or nothing left to generate).
    None,
    /// A planned token given with the request.
    Planned(u32),
    /// The reference's deterministic token for (uuid, index).
    Generated,
}

impl Output {
    /// The sampled token; `None` only for a terminal output without a token.
    pub fn token_id(&self) -> Option<u32> {
        match self.token {
            OutputToken::None => None,
            OutputToken::Planned(t) => Some(t),
            OutputToken::Generated => {
                Some(crate::hashing::deterministic_output_token(self.uuid, u64::from(self.index)))
            }
        }
    }

    /// Whether this output carries a token.
    pub fn has_token(&self) -> bool {
        self.token != OutputToken::None
    }
}
