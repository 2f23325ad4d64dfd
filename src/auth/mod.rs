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
//! * [`rejection`]: [`Rejection`] (short client message, metric label, gRPC
//!   status, log detail), [`token_from_metadata`] and [`authorize`].
//! * [`revocation`]: the list of revoked token ids.
//!
//! The server's check for a connecting node is, in order:
//! [`token_from_metadata`], [`KeyRing::verify`], then [`authorize`] against
//! the node id and the dataplane's inbound tags.

pub mod gate;
pub mod keys;
pub mod rejection;
pub mod revocation;
pub mod token;

pub use gate::{Gate, GateError};
pub use keys::{ExtraPublicKey, GeneratedKey, KeyError, KeyRing};
pub use rejection::{authorize, check_identity, token_from_metadata, Rejection, AUTHORIZATION};
pub use revocation::{RevocationError, Revocations};
pub use token::{inspect, Claims, Inspection, IssueError, ISSUED_AT_LEEWAY_SECS};

#[cfg(test)]
mod tests;
