//! hdsd: a management server for Envoy's Health Discovery Service (HDS).
//!
//! The pure core: [`dataplane`] (the resource), [`probe`] (check settings and
//! their rules), [`specifier`] (dataplane -> `HealthCheckSpecifier`) and
//! [`readiness`] (reports -> per-inbound status). State: [`source`] (files ->
//! definitions), [`store`] (readiness; definitions in redb or PostgreSQL) and
//! [`registry`] (one writer per dataplane). Edges: [`hds`]
//! (gRPC), [`api`] (REST), [`consumers`] (the change feed and who reads it:
//! gRPC `hdsd.v1`, SSE), [`ui`] (the fleet page), [`server`] (wiring).

pub mod api;
pub mod auth;
pub mod bootstrap;
pub mod capability;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod consumers;
pub mod dataplane;
pub mod feed;
pub mod fswatch;
pub mod grpc_auth;
pub mod hds;
pub mod history;
pub mod journal;
pub mod layers;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod net;
pub mod operator;
pub mod pb;
pub mod probe;
pub mod readiness;
pub mod registry;
pub mod report;
pub mod scrape;
pub mod server;
pub mod source;
pub mod specifier;
pub mod store;
pub mod tls;
pub mod ui;
pub mod view;
pub mod zones;
