//! Dataplane tokens: who may connect to the HDS stream.
//!
//! A dataplane token is a JWT signed by hdsd with Ed25519 (`alg: EdDSA`,
//! header `kid` naming the key) that binds an Envoy to its dataplane
//! identity `mesh.name` and, optionally, to inbound tags. Claims: see
//! [`Claims`].
//!
//! * [`keys`]: key generation, the `<state_dir>/keys/` layout, kid format,
//!   rotation, and the [`KeyRing`] of trusted keys.
//! * [`token`]: [`KeyRing::issue`], [`KeyRing::verify`] and [`inspect`].
//! * [`claims`]: [`Claims`], and [`authorize`] / [`check_identity`], which
//!   bind a verified token to a dataplane.
//! * [`rejection`]: [`Rejection`] (short client message, metric label,
//!   [`RejectionKind`], log detail).
//! * [`revocation`]: the list of revoked token ids.
//! * [`bearer`]: the one rule for `authorization: Bearer <token>` values.
//! * [`gate`]: the keys and revocations in force in a running server.
//!
//! This module knows nothing of gRPC or HTTP: reading the token from a
//! request and turning a [`Rejection`] into a status are the edges' work
//! (`grpc_auth`, `api`).
//!
//! The server's check for a connecting node is, in order: the token from the
//! request, [`KeyRing::verify`], then [`authorize`] against the node id and
//! the dataplane's inbound tags.

pub mod bearer;
pub mod claims;
pub mod gate;
pub mod keys;
pub mod rejection;
pub mod revocation;
pub mod token;

pub use bearer::BearerError;
pub use claims::{authorize, check_identity, Claims};
pub use gate::{Gate, GateError};
pub use keys::{ExtraPublicKey, GeneratedKey, KeyError, KeyRing, SharedKey};
pub use rejection::{Rejection, RejectionKind};
pub use revocation::{RevocationError, Revocations};
pub use token::{inspect, Inspection, IssueError, ISSUED_AT_LEEWAY_SECS};

#[cfg(test)]
mod tests;
