//! The `hdsd` command line: each command's client side. `http` is the one
//! HTTP agent for a running hdsd's REST API; `status`, `apply` and `zone`
//! are the commands that read or change it.

pub mod apply;
pub mod http;
pub mod status;
pub mod zone;
