//! The Rust types and server stubs of the vendored protocol (`proto/`), generated at build
//! time; the module tree mirrors the protobuf packages because the generated code names
//! types across packages by relative paths.

#![allow(missing_docs, clippy::all, clippy::pedantic)]

/// `smg.grpc.*`.
pub mod smg {
    /// `smg.grpc.*`.
    pub mod grpc {
        /// `smg.grpc.common`: tokenizer, KV-event and tensor-transport messages.
        pub mod common {
            include!(concat!(env!("OUT_DIR"), "/smg.grpc.common.rs"));
        }
    }
}

/// `vllm.grpc.*`.
pub mod vllm {
    /// `vllm.grpc.*`.
    pub mod grpc {
        /// `vllm.grpc.engine`: the `VllmEngine` service.
        pub mod engine {
            include!(concat!(env!("OUT_DIR"), "/vllm.grpc.engine.rs"));
        }
    }
}

/// `sglang.grpc.*`.
pub mod sglang {
    /// `sglang.grpc.*`.
    pub mod grpc {
        /// `sglang.grpc.scheduler`: the `SglangScheduler` service.
        pub mod scheduler {
            include!(concat!(env!("OUT_DIR"), "/sglang.grpc.scheduler.rs"));
        }
    }
}

pub use vllm::grpc::engine::*;

/// The encoded file descriptors of `vllm_engine.proto` and its imports (server reflection).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/vllm_engine_descriptor.bin"));

/// The encoded file descriptors of `sglang_scheduler.proto` and its imports (server reflection).
pub const SGLANG_FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/sglang_scheduler_descriptor.bin"));

/// Every vendored file's descriptors (the unknown-field check).
pub const ALL_FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/all_descriptor.bin"));
