//! The global's side of zone sync: the machines of one stream
//! ([`session`]), of one zone across streams ([`remote`]) and of every zone
//! ([`hub`]), the zone a client certificate names ([`certificate`]), and
//! their drivers: the zone listener and the hub task ([`server`]), the
//! ledger of several instances on PostgreSQL ([`ledger`]) and the API's
//! zone registrations ([`admin`]).

pub mod admin;
pub mod certificate;
pub mod hub;
pub mod ledger;
pub mod remote;
pub mod server;
pub mod session;
