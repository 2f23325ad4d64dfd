//! Generates the gRPC code of `proto/` (hdsd's own API) with protox, a
//! protobuf compiler in Rust: no system `protoc` needed.
//!
//! Every file of `proto/hdsd/v1/` is package `hdsd.v1`, generated into one
//! module. For server reflection: `hdsd_v1_descriptor.bin` holds
//! `readiness.proto` alone; each other file `<name>.proto` gets
//! `hdsd_v1_<name>_descriptor.bin` (with the files it imports).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    commit();
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut files: Vec<PathBuf> = std::fs::read_dir("proto/hdsd/v1")?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.retain(|f| f.extension().is_some_and(|e| e == "proto"));
    files.sort();
    for file in &files {
        let stem = file
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or_default();
        let name = match stem {
            "readiness" => "hdsd_v1_descriptor.bin".to_string(),
            other => format!("hdsd_v1_{other}_descriptor.bin"),
        };
        let descriptors = protox::compile([file], ["proto"])?;
        std::fs::write(out.join(name), prost::Message::encode_to_vec(&descriptors))?;
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(protox::compile(&files, ["proto"])?)?;
    Ok(())
}

/// `BUILD_GIT_COMMIT`: the commit built (`git rev-parse`), `unknown` outside a
/// git checkout; `hdsd --version` prints it.
fn commit() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=BUILD_GIT_COMMIT={commit}");
    // A new commit moves HEAD's branch (or HEAD itself, detached).
    for path in [".git/HEAD", ".git/refs/heads"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
