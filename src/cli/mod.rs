//! The `hdsd` command line: the clap tree ([`Cli`]) and one file per
//! command, each holding its arguments and their `run`. [`http`] is the one
//! HTTP agent that the commands talking to a running hdsd share (`status`,
//! `explain`, `watch`, `apply`, `delete`, `zone`), built from the one set of
//! [`ApiArgs`]. `main.rs` only parses and turns the result into the exit code.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod apply;
mod bootstrap;
mod completions;
mod config;
mod explain;
mod http;
mod man;
mod serve;
mod status;
mod token;
mod validate;
mod watch;
mod zone;

/// `hdsd` and its commands, as parsed from the command line.
#[derive(Parser)]
#[command(
    name = "hdsd",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("BUILD_GIT_COMMIT"), ")"),
    about = "A management server for Envoy's Health Discovery Service"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

impl Cli {
    /// Runs the command: the exit code to end with (1 for a problem the
    /// command reports itself, 2 when a server fails at run time), or the
    /// error to print.
    pub fn run(self) -> anyhow::Result<ExitCode> {
        match self.command {
            Command::Serve(args) => args.run(),
            Command::Validate(args) => args.run(),
            Command::Token(args) => args.run(),
            Command::Config(args) => args.run(),
            Command::Status(args) => args.run(),
            Command::Completions(args) => args.run(),
            Command::Man(args) => args.run(),
            Command::Explain(args) => args.run(),
            Command::Watch(args) => args.run(),
            Command::Apply(args) => args.run(),
            Command::Delete(args) => args.run(),
            Command::Zone(args) => args.run(),
            Command::Bootstrap(args) => args.run(),
        }
    }
}

/// How the CLI reaches a running hdsd's REST API (global: `hdsd zone`
/// takes them before or after its subcommand).
#[derive(clap::Args, Debug, Clone, PartialEq, Eq)]
struct ApiArgs {
    /// hdsd's REST API (https://... when it has api.tls).
    #[arg(long, default_value = "http://127.0.0.1:5680", global = true)]
    api: String,
    /// One of the server's api.tokens, when its API requires one.
    #[arg(long, global = true)]
    api_token: Option<String>,
    /// CA certificate (PEM) that signed the API's TLS certificate (api.tls).
    #[arg(long, global = true)]
    ca: Option<PathBuf>,
}

#[derive(Subcommand)]
// Parsed once per process: the size of its largest variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Run the server.
    Serve(serve::ServeArgs),
    /// Check the config and every dataplane file; exit 1 listing every problem.
    Validate(validate::ValidateArgs),
    /// Dataplane tokens: create keys, issue, inspect and revoke tokens.
    Token(token::TokenArgs),
    /// Configuration helpers.
    Config(config::ConfigArgs),
    /// Print the readiness table from a running hdsd.
    Status(status::StatusArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
    /// Print the man page (roff) of hdsd and its commands.
    Man(man::ManArgs),
    /// Explain one dataplane: for each inbound what is checked, by which
    /// Envoy, the last reports, and why it is not ready.
    Explain(explain::ExplainArgs),
    /// Follow readiness changes from a running hdsd: one line per change.
    Watch(watch::WatchArgs),
    /// Send Dataplane definitions to a running hdsd (dataplanes.source = "api"), like `kumactl apply`.
    Apply(apply::ApplyArgs),
    /// Delete a dataplane's definition from a running hdsd (dataplanes.source = "api").
    Delete(apply::DeleteArgs),
    /// A global's zones, through its REST API: register, delete, disable, enable
    /// (no restart of the global).
    Zone(zone::ZoneArgs),
    /// Print an Envoy bootstrap that connects a dataplane to hdsd
    /// (`bootstrap front`: a front proxy routing by readiness).
    #[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
    Bootstrap(bootstrap::BootstrapArgs),
}

/// A `k=v` tag (`hdsd watch --selector`, `hdsd token issue --tag`).
fn parse_tag(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("tag {s:?} is not key=value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("hdsd").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn a_tag_is_key_equals_value() {
        assert_eq!(parse_tag("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_tag("a="), Ok(("a".into(), String::new())));
        assert!(parse_tag("=b").is_err());
        assert!(parse_tag("ab").is_err());
    }

    /// The API flags are spelled once: every command that reads the API
    /// takes them, and `hdsd zone` before or after its subcommand.
    #[test]
    fn every_api_command_takes_the_api_flags() {
        let api = |cli: Cli| match cli.command {
            Command::Status(a) => a.api,
            Command::Explain(a) => a.api,
            Command::Watch(a) => a.api,
            Command::Apply(a) => a.api,
            Command::Delete(a) => a.api,
            Command::Zone(a) => a.api,
            _ => panic!("not an API command"),
        };
        let wanted = ApiArgs {
            api: "https://h:1".into(),
            api_token: Some("t".into()),
            ca: Some("ca.pem".into()),
        };
        let flags = ["--api", "https://h:1", "--api-token", "t", "--ca", "ca.pem"];
        for command in [
            &["status"][..],
            &["explain", "default", "web"],
            &["watch"],
            &["apply", "-f", "dps"],
            &["delete", "default", "web"],
            &["zone", "add", "eu-1"],
        ] {
            let args: Vec<&str> = command.iter().chain(&flags).copied().collect();
            assert_eq!(api(parse(&args).unwrap()), wanted, "{args:?}");
        }
        let before: Vec<&str> = ["zone"]
            .iter()
            .chain(&flags)
            .chain(&["disable", "eu-1"])
            .copied()
            .collect();
        assert_eq!(api(parse(&before).unwrap()), wanted);
        let defaults = api(parse(&["status"]).unwrap());
        assert_eq!(defaults.api, "http://127.0.0.1:5680");
        assert_eq!((defaults.api_token, defaults.ca), (None, None));
    }

    #[test]
    fn bootstrap_needs_a_dataplane_unless_it_is_a_front() {
        assert!(parse(&["bootstrap"]).is_err());
        assert!(parse(&["bootstrap", "--mesh", "m", "--name", "n"]).is_ok());
        assert!(parse(&["bootstrap", "front", "--service", "web"]).is_ok());
        assert!(parse(&["status", "--json", "--watch"]).is_err());
    }
}
