//! Generates the gRPC code of `proto/` (hdsd's own API) with protox, a
//! protobuf compiler in Rust: no system `protoc` needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/hdsd/v1/readiness.proto";
    println!("cargo:rerun-if-changed=proto");
    let descriptors = protox::compile([proto], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("hdsd_v1_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
