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

pub use vllm::grpc::engine::*;

/// The encoded file descriptors of both files (server reflection, unknown-field check).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/vllm_engine_descriptor.bin"));
