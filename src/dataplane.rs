//! Dataplanes: Kuma's universal `Dataplane` resource, parsed from YAML or JSON.
//!
//! A file may hold several resources (`kumactl apply -f` style): documents
//! whose `type` is not `Dataplane` are skipped and listed as ignored. Fields
//! Kuma defines but hdsd does not use are accepted and ignored; any other key
//! is an error that names the key and its line, or, with
//! `dataplanes.unknown_fields = "warn"`, a [`Warning`] listed with the file. Addresses must be IP literals:
//! Envoy may crash on a hostname in an HDS endpoint.
//!
//! One file per job:
//!
//! * `model`: the dataplane as hdsd holds it ([`Dataplane`], [`DataplaneId`],
//!   [`Inbound`], [`ProbeOverrides`]...).
//! * `error`: why a file is refused ([`ParseError`]) and the [`Limit`] it
//!   went past.
//! * `limits`: what one file may hold ([`FileLimits`]) and the streaming
//!   YAML scanner that checks them ([`check_yaml`]).
//! * `parse`: one file's documents, sorted by their `type` ([`parse_file`]).
//! * `kuma`: Kuma's `Dataplane` resource as serde reads it.
//! * `documents`: a new version of a file parsed at the cost of its changed
//!   documents ([`reparse_file`]).

mod documents;
mod error;
mod kuma;
mod limits;
mod model;
mod parse;

pub use documents::{reparse_file, Documents, Reparsed};
pub use error::{Limit, ParseError};
pub use limits::{check_yaml, FileLimits, UnknownFields};
pub use model::{
    BadIdentity, BadNodeId, Dataplane, DataplaneId, DataplaneKind, GatewayType, Inbound,
    InboundState, Listener, ProbeOverrides, SERVICE_TAG,
};
pub use parse::{
    parse_documents, parse_file, parse_file_with, Format, IgnoredDocument, ParsedFile, Warning,
};
