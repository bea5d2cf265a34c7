//! Compiles the vendored gRPC protocol (`proto/`, see `proto/SOURCE.md`) with `protox`, a
//! Rust protobuf compiler, so building needs no `protoc`. Besides the Rust types it writes
//! the encoded file descriptors: one set per served service for server reflection (so a
//! server lists only the service it serves), and both together for the unknown-field check.

use std::path::PathBuf;

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for (file, bin) in [
        ("vllm_engine.proto", "vllm_engine_descriptor.bin"),
        ("sglang_scheduler.proto", "sglang_scheduler_descriptor.bin"),
    ] {
        std::fs::write(out.join(bin), protox::compile([file], ["proto"])?.encode_to_vec())?;
    }
    let fds = protox::compile(["vllm_engine.proto", "sglang_scheduler.proto"], ["proto"])?;
    std::fs::write(out.join("all_descriptor.bin"), fds.encode_to_vec())?;
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
