//! Compiles the vendored gRPC protocol (`proto/`, see `proto/SOURCE.md`) with `protox`, a
//! Rust protobuf compiler, so building needs no `protoc`. Besides the Rust types it writes
//! the encoded file descriptors, which server reflection serves and the unknown-field check
//! reads.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(["vllm_engine.proto"], ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("vllm_engine_descriptor.bin"), fds.encode_to_vec())?;
    let mut config = prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure()
        .build_client(false)
        .build_transport(false)
        .codec_path("crate::api::grpc::codec::StrictCodec")
        // `prost::Name` on every message: the codec finds a request's descriptor by its name.
        .compile_fds_with_config(fds, config)?;
    Ok(())
}
