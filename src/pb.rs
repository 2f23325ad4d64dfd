//! Code generated from `proto/hdsd/v1/` at build time: the readiness API
//! (`readiness.proto`) and the zone sync API (`zone.proto`), both package
//! `hdsd.v1`. A leaf: the generated code names nothing of hdsd, so every
//! layer may use its messages (`consumers::pb` is the same module).
#![allow(clippy::all, clippy::pedantic, missing_docs)]

tonic::include_proto!("hdsd.v1");

/// The encoded descriptors of `readiness.proto`, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/hdsd_v1_descriptor.bin"));

/// The encoded descriptors of `zone.proto` and the `readiness.proto` it
/// imports: for reflection where both services are served (instead of
/// [`FILE_DESCRIPTOR_SET`], which it contains).
pub const ZONE_FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/hdsd_v1_zone_descriptor.bin"));
