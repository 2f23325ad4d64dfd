//! `hdsd token keygen|issue|inspect|revoke`: the signing keys under
//! `<state_dir>/keys` and the tokens they sign, read with the config's
//! `state_dir` and `auth` settings. What `issue` is asked for (a dataplane
//! token or a zone token) is decided from the flags by a plain function.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Subcommand;

use crate::auth::{inspect, KeyRing, Revocations};
use crate::clock::{Clock as _, SystemClock};
use crate::config::{Config, StoreKind};

/// `hdsd token`'s arguments.
#[derive(clap::Args)]
pub(super) struct TokenArgs {
    /// Config file; tokens use its state_dir and auth settings.
    #[arg(long, short, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Create a new signing key pair under <state_dir>/keys (never overwrites).
    Keygen,
    /// Print a token for one dataplane, signed with the newest key.
    /// A dataplane token (`--mesh M --name N`), or a zone token for the
    /// global's zone listener (`--zone Z --mesh M [--mesh M2 ...]`: the
    /// meshes whose dataplanes the zone may announce).
    Issue {
        /// The dataplane's mesh; with --zone, a mesh the zone may announce (repeatable).
        #[arg(long, required = true)]
        mesh: Vec<String>,
        /// The dataplane's name (not with --zone).
        #[arg(long, conflicts_with = "zone", required_unless_present = "zone")]
        name: Option<String>,
        /// Issue a zone token for this zone (a DNS-1123 label).
        #[arg(long)]
        zone: Option<String>,
        /// How long the token is valid (at most auth.max_token_validity).
        #[arg(long, default_value = "720h", value_parser = humantime::parse_duration)]
        valid_for: Duration,
        /// A tag the dataplane must carry on one of its inbounds (repeatable): k=v.
        #[arg(long = "tag", value_parser = super::parse_tag)]
        tags: Vec<(String, String)>,
    },
    /// Print a token's claims and whether this server would accept it.
    Inspect { token: String },
    /// Revoke a token by its id (jti); running servers end its streams within a second.
    Revoke { jti: String },
}

/// The token `hdsd token issue` is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subject {
    /// A dataplane's: its one mesh, its name and the tags it must carry.
    Dataplane {
        mesh: String,
        name: String,
        tags: BTreeMap<String, String>,
    },
    /// A zone's, with the meshes it may announce.
    Zone { zone: String, meshes: Vec<String> },
}

impl Subject {
    /// The subject of `--mesh`, `--name`, `--zone` and `--tag`, or what is
    /// wrong with them.
    fn of(
        mesh: Vec<String>,
        name: Option<String>,
        zone: Option<String>,
        tags: Vec<(String, String)>,
    ) -> anyhow::Result<Subject> {
        match (zone, name) {
            (Some(zone), _) => {
                if !tags.is_empty() {
                    anyhow::bail!("--tag is for dataplane tokens; a zone token carries --zone and the --mesh(es) it may announce");
                }
                Ok(Subject::Zone { zone, meshes: mesh })
            }
            (None, Some(name)) => {
                match <[String; 1]>::try_from(mesh) {
                    Ok([mesh]) => Ok(Subject::Dataplane {
                        mesh,
                        name,
                        tags: tags.into_iter().collect(),
                    }),
                    Err(mesh) => anyhow::bail!("a dataplane token names one --mesh (got {}); more than one is for zone tokens (--zone)", mesh.len()),
                }
            }
            (None, None) => {
                anyhow::bail!("name the dataplane with --name, or the zone with --zone")
            }
        }
    }
}

impl TokenArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        let config = Config::load(self.config.as_deref())?;
        let now = SystemClock.now();
        let state_dir = &config.state_dir;
        let revocations = config.auth.revocations_path(state_dir);
        match self.command {
            TokenCommand::Keygen => {
                let key = KeyRing::generate(state_dir, now)?;
                println!("created key {}", key.kid);
                println!(
                    "  private: {} (keep it secret; mode 0600)",
                    key.private_path.display()
                );
                println!("  public:  {}", key.public_path.display());
                println!("new tokens are signed with it; tokens of older keys stay valid until their key files are removed");
            }
            TokenCommand::Issue {
                mesh,
                name,
                zone,
                valid_for,
                tags,
            } => {
                let ring = KeyRing::load(state_dir, &config.auth.public_keys)?;
                let max = config.auth.max_token_validity;
                let token = match Subject::of(mesh, name, zone, tags)? {
                    Subject::Zone { zone, meshes } => {
                        ring.issue_zone(&zone, &meshes, valid_for, max, now)?
                    }
                    Subject::Dataplane { mesh, name, tags } => {
                        ring.issue(&mesh, &name, valid_for, max, tags, now)?
                    }
                };
                println!("{token}");
                // On stderr: the token alone on stdout can be piped to a file.
                let expires = now + chrono::Duration::from_std(valid_for).unwrap_or_default();
                eprintln!(
                    "expires at {} (valid for {}); issue the next one before then: the old one stays valid until it expires",
                    expires.to_rfc3339(),
                    humantime::format_duration(valid_for)
                );
            }
            TokenCommand::Inspect { token } => {
                let ring = KeyRing::load(state_dir, &config.auth.public_keys)?;
                let revoked = Revocations::load(&revocations)?;
                let inspection = inspect(&ring, &revoked, token.trim(), now);
                println!("{inspection}");
                if !inspection.accepted() {
                    return Ok(ExitCode::from(1));
                }
            }
            TokenCommand::Revoke { jti } => {
                if config.store.kind == StoreKind::Postgres {
                    // Every instance sharing the store takes it from there.
                    Revocations::revoke(&revocations, &jti)?;
                    let runtime =
                        tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
                    let added = runtime.block_on(async {
                        let store =
                            crate::store::postgres::PgStore::connect(&config.store.postgres)
                                .await?;
                        store.revoke(&jti).await
                    })?;
                    println!(
                        "{} {jti} in the PostgreSQL store (and {}); every instance sharing it ends its streams within a second",
                        if added { "revoked" } else { "already revoked:" },
                        revocations.display()
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                if Revocations::revoke(&revocations, &jti)? {
                    println!(
                        "revoked {jti} (in {}); running hdsd servers end its streams within a second",
                        revocations.display()
                    );
                } else {
                    println!("{jti} was already revoked");
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(mesh: &[&str], name: Option<&str>, zone: Option<&str>, tags: &[(&str, &str)]) -> String {
        let tags = tags
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let meshes = mesh.iter().map(|m| m.to_string()).collect();
        match Subject::of(meshes, name.map(Into::into), zone.map(Into::into), tags) {
            Ok(subject) => format!("{subject:?}"),
            Err(e) => format!("error: {e}"),
        }
    }

    /// `--zone` makes a zone token of every `--mesh`; `--name` a dataplane
    /// token of one mesh and its tags; anything else says what to change.
    #[test]
    fn issue_tells_a_dataplane_token_from_a_zone_token() {
        assert_eq!(
            Subject::of(
                vec!["shop".into()],
                Some("web-01".into()),
                None,
                vec![("team".into(), "a".into())]
            )
            .unwrap(),
            Subject::Dataplane {
                mesh: "shop".into(),
                name: "web-01".into(),
                tags: [("team".to_string(), "a".to_string())].into(),
            }
        );
        assert_eq!(
            Subject::of(
                vec!["a".into(), "b".into()],
                None,
                Some("eu-1".into()),
                vec![]
            )
            .unwrap(),
            Subject::Zone {
                zone: "eu-1".into(),
                meshes: vec!["a".into(), "b".into()],
            }
        );
        let said = of(&["a"], None, Some("eu-1"), &[("k", "v")]);
        assert!(
            said.starts_with("error: --tag is for dataplane tokens"),
            "{said}"
        );
        let said = of(&["a", "b"], Some("web"), None, &[]);
        assert!(
            said.starts_with("error: a dataplane token names one --mesh (got 2)"),
            "{said}"
        );
        let said = of(&["a"], None, None, &[]);
        assert_eq!(
            said,
            "error: name the dataplane with --name, or the zone with --zone"
        );
    }
}
