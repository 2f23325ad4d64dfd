//! `hdsd bootstrap`: the Envoy bootstrap of one dataplane (`--mesh`,
//! `--name`), or with `bootstrap front` of a front proxy routing to one
//! service by readiness, written to stdout or `--out`. The YAML comes from
//! `crate::bootstrap`; this file turns the flags into its parameters.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;

use crate::bootstrap::{bootstrap_yaml, front_yaml, BootstrapParams, FrontParams};
use crate::dataplane::DataplaneId;

/// `hdsd bootstrap`'s arguments.
#[derive(clap::Args)]
pub(super) struct BootstrapArgs {
    #[command(subcommand)]
    front: Option<BootstrapCommand>,
    #[arg(long, required = true)]
    mesh: Option<String>,
    #[arg(long, required = true)]
    name: Option<String>,
    /// hdsd's HDS address, HOST:PORT; repeat it for each instance of a
    /// cluster (Envoy reconnects to another when one fails).
    #[arg(long, default_value = "127.0.0.1:5678")]
    server: Vec<String>,
    /// File holding the dataplane token.
    #[arg(long, conflicts_with = "token")]
    token_file: Option<PathBuf>,
    /// The dataplane token.
    #[arg(long)]
    token: Option<String>,
    /// Envoy's admin port (bound on 127.0.0.1).
    #[arg(long, default_value_t = 9901)]
    admin_port: u16,
    /// CA certificate to verify hdsd's TLS certificate (turns TLS on).
    #[arg(long)]
    ca: Option<PathBuf>,
    /// Write to this file instead of stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Subcommand)]
enum BootstrapCommand {
    /// An HTTP front proxy routing to one service's EDS cluster, fed by hdsd:
    /// endpoints leave it when their checks fail.
    Front {
        /// The service (inbound tag kuma.io/service) to route to.
        #[arg(long)]
        service: String,
        #[arg(long, default_value = "default")]
        mesh: String,
        /// The front's HTTP listener (port 0: any free port).
        #[arg(long, default_value = "0.0.0.0:8080")]
        listen: SocketAddr,
        /// hdsd's HDS address (EDS is served there), HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:5678")]
        server: String,
        /// File holding one of hdsd's api.tokens or eds.tokens (needed with auth.mode = "token").
        #[arg(long, conflicts_with = "token")]
        token_file: Option<PathBuf>,
        /// One of hdsd's api.tokens or eds.tokens.
        #[arg(long)]
        token: Option<String>,
        /// Envoy's admin port (bound on 127.0.0.1; 0: any free port).
        #[arg(long, default_value_t = 9901)]
        admin_port: u16,
        /// CA certificate to verify hdsd's TLS certificate (turns TLS on).
        #[arg(long)]
        ca: Option<PathBuf>,
        /// The front's zone (node.locality.zone): a global serves its own
        /// zone's endpoints first and fails over to the other zones.
        #[arg(long)]
        zone: Option<String>,
        /// Write to this file instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

impl BootstrapArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        let (yaml, out) = match self.front {
            Some(BootstrapCommand::Front {
                service,
                mesh,
                listen,
                server,
                token_file,
                token,
                admin_port,
                ca,
                zone,
                out,
            }) => {
                let yaml = front_yaml(&FrontParams {
                    mesh,
                    service,
                    listen,
                    server,
                    token: read_token(token_file, token)?,
                    admin_port,
                    ca,
                    zone,
                })?;
                (yaml, out)
            }
            None => {
                let token = read_token(self.token_file, self.token)?;
                let id = identity(self.mesh, self.name)?;
                let yaml = bootstrap_yaml(&BootstrapParams {
                    id,
                    servers: self.server,
                    token,
                    admin_port: self.admin_port,
                    ca: self.ca,
                })?;
                (yaml, self.out)
            }
        };
        write_out(out, &yaml)?;
        Ok(ExitCode::SUCCESS)
    }
}

/// The dataplane of `--mesh` and `--name` (both required by the parser
/// unless the subcommand is `front`), or what is wrong with them.
fn identity(mesh: Option<String>, name: Option<String>) -> anyhow::Result<DataplaneId> {
    let (mesh, name) = (mesh.unwrap_or_default(), name.unwrap_or_default());
    DataplaneId::try_new(&mesh, &name).map_err(|e| {
        anyhow::anyhow!(
            "--mesh {mesh:?} --name {name:?} is not a dataplane identity: {e}; the mesh takes lowercase letters, digits and '-', and the name must not be empty"
        )
    })
}

/// `--token-file`'s content, trimmed, or `--token`.
fn read_token(
    token_file: Option<PathBuf>,
    token: Option<String>,
) -> anyhow::Result<Option<String>> {
    Ok(match token_file {
        Some(path) => Some(
            std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read --token-file {}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => token,
    })
}

fn write_out(out: Option<PathBuf>, yaml: &str) -> anyhow::Result<()> {
    match out {
        Some(path) => {
            std::fs::write(&path, yaml).with_context(|| format!("cannot write {}", path.display()))
        }
        None => {
            print!("{yaml}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_trimmed_and_a_missing_one_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "  t0k\n").unwrap();
        assert_eq!(
            read_token(Some(file), None).unwrap().as_deref(),
            Some("t0k")
        );
        assert_eq!(
            read_token(None, Some("t".into())).unwrap().as_deref(),
            Some("t")
        );
        assert_eq!(read_token(None, None).unwrap(), None);
        let missing = dir.path().join("missing");
        let said = format!("{:#}", read_token(Some(missing.clone()), None).unwrap_err());
        assert!(
            said.starts_with(&format!("cannot read --token-file {}", missing.display())),
            "{said}"
        );
    }

    #[test]
    fn the_identity_is_checked_with_what_to_change() {
        let id = identity(Some("shop".into()), Some("web-01".into())).unwrap();
        assert_eq!(id.to_string(), "shop.web-01");
        let said = identity(Some("Shop".into()), Some("web".into()))
            .unwrap_err()
            .to_string();
        assert!(
            said.starts_with("--mesh \"Shop\" --name \"web\" is not a dataplane identity: "),
            "{said}"
        );
        assert!(said.ends_with("the name must not be empty"), "{said}");
    }

    #[test]
    fn a_bootstrap_is_written_to_its_out_file() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("envoy.yaml");
        write_out(Some(out.clone()), "node: {}\n").unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "node: {}\n");
        let said = format!(
            "{:#}",
            write_out(Some(dir.path().join("no/such/dir/x")), "").unwrap_err()
        );
        assert!(said.starts_with("cannot write "), "{said}");
    }
}
