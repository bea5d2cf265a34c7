//! What the simulated model writes: the token pool output is drawn from, the keyed sampler
//! behind text and log-probabilities, stop conditions, and JSON generated from schemas.

pub mod logprobs;
pub mod plan;
pub mod sampler;
pub mod schema;
pub mod stop;
pub mod vocab;
pub mod words;
