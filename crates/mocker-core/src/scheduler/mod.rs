//! Schedulers: the per-pass policies that decide which requests run.

pub mod vllm;
