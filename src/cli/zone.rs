//! `hdsd zone add|delete|disable|enable NAME`: a global's zone
//! registrations through its REST API (`--api`, `--api-token`, `--ca`, as
//! `hdsd status` and `hdsd apply` take them, before or after the
//! subcommand). Each call is one request; the API's answer is turned into
//! one line for a person.

use std::process::ExitCode;

use clap::Subcommand;

use super::http::{Api, Method};
use super::ApiArgs;

/// `hdsd zone`'s arguments.
#[derive(clap::Args)]
pub(super) struct ZoneArgs {
    #[command(flatten)]
    pub(super) api: ApiArgs,
    #[command(subcommand)]
    command: ZoneCommand,
}

impl ZoneArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        let api = Api::connect(self.api)?;
        let name = self.command.name();
        let line = run(&api, &self.command)
            .map_err(|e| anyhow::anyhow!("zone {name} not changed: {e}"))?;
        println!("{line}");
        Ok(ExitCode::SUCCESS)
    }
}

/// What to do to a zone.
#[derive(Subcommand, Debug, Clone, PartialEq, Eq)]
enum ZoneCommand {
    /// Register a zone at a running global: from then on it may connect
    /// (with a zone token from `hdsd token issue --zone NAME`).
    Add {
        /// The zone's name (a DNS-1123 label).
        name: String,
        /// Register it disabled: its streams are refused until `hdsd zone enable`.
        #[arg(long)]
        disabled: bool,
    },
    /// Delete a zone: its stream ends, its dataplanes leave the global's
    /// view, its series and stored rows go, and its zone tokens issued until
    /// now stay refused (also if it is added again).
    Delete { name: String },
    /// Disable a zone: its stream ends and is refused, its data withdrawn.
    Disable { name: String },
    /// Enable a disabled zone: it connects again at its next try.
    Enable { name: String },
}

impl ZoneCommand {
    /// The zone it is about.
    fn name(&self) -> &str {
        match self {
            ZoneCommand::Add { name, .. }
            | ZoneCommand::Delete { name }
            | ZoneCommand::Disable { name }
            | ZoneCommand::Enable { name } => name,
        }
    }

    /// The request it is: the method (a registration's with its body) and
    /// the path.
    fn request(&self) -> (Method, String) {
        let base = format!("/api/v1/zones/{}", self.name());
        match self {
            ZoneCommand::Add { disabled, .. } => (
                Method::Put {
                    content_type: "application/json",
                    body: serde_json::json!({ "disabled": disabled }).to_string(),
                },
                base,
            ),
            ZoneCommand::Delete { .. } => (Method::Delete, base),
            ZoneCommand::Disable { .. } => (Method::Post, format!("{base}/disable")),
            ZoneCommand::Enable { .. } => (Method::Post, format!("{base}/enable")),
        }
    }

    fn what(&self) -> &'static str {
        match self {
            ZoneCommand::Add { .. } => "registered",
            ZoneCommand::Delete { .. } => "deleted",
            ZoneCommand::Disable { .. } => "disabled",
            ZoneCommand::Enable { .. } => "enabled",
        }
    }
}

/// The line printed for the API's answer `body` to `command` with
/// `status`: `Ok` on success, `Err` with the API's message otherwise.
fn outcome(command: &ZoneCommand, status: u16, body: &serde_json::Value) -> Result<String, String> {
    let said = body
        .get("error")
        .and_then(|e| e.as_str())
        .unwrap_or("no message");
    match status {
        200 | 201 | 204 => {}
        401 => {
            return Err(format!(
                "HTTP 401: {said}; pass one of the global's api.tokens with --api-token"
            ))
        }
        _ => return Err(format!("HTTP {status}: {said}")),
    }
    let zone = command.name();
    let mut line = format!("zone {zone} {}", command.what());
    match command {
        ZoneCommand::Add { .. } if status == 200 => {
            line = format!("zone {zone} was registered already");
            if let Some(by) = body.get("registeredBy").and_then(|b| b.as_str()) {
                line.push_str(&format!(" ({by})"));
            }
        }
        ZoneCommand::Delete { .. } => {
            if let Some(t) = body.get("tokensNotBefore").and_then(|t| t.as_str()) {
                line.push_str(&format!(
                    "; its zone tokens issued until {t} stay refused, also if it is added again"
                ));
            }
        }
        _ => {}
    }
    if let Some(state) = body.get("state").and_then(|s| s.as_str()) {
        line.push_str(&format!(" (state: {state})"));
    }
    Ok(line)
}

/// Sends `command` to the global's API; the line to print, or why it
/// failed.
fn run(api: &Api, command: &ZoneCommand) -> Result<String, String> {
    let zone = command.name();
    crate::names::check_zone(zone).map_err(|e| format!("{zone:?} is not a zone name: {e}"))?;
    let (method, path) = command.request();
    let (status, value) = api.send(method, &path)?;
    outcome(command, status, &value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_answer_as_one_line() {
        let add = ZoneCommand::Add {
            name: "eu-1".into(),
            disabled: false,
        };
        let delete = ZoneCommand::Delete {
            name: "eu-1".into(),
        };
        let disable = ZoneCommand::Disable {
            name: "eu-1".into(),
        };
        assert_eq!(
            outcome(
                &add,
                201,
                &json!({"name": "eu-1", "state": "never_connected"})
            ),
            Ok("zone eu-1 registered (state: never_connected)".to_string())
        );
        assert_eq!(
            outcome(
                &add,
                200,
                &json!({"registeredBy": "config", "state": "online"})
            ),
            Ok("zone eu-1 was registered already (config) (state: online)".to_string())
        );
        let deleted = outcome(
            &delete,
            200,
            &json!({"tokensNotBefore": "2026-01-01T00:00:00Z"}),
        )
        .unwrap();
        assert!(
            deleted.starts_with(
                "zone eu-1 deleted; its zone tokens issued until 2026-01-01T00:00:00Z"
            ),
            "{deleted}"
        );
        let refused = outcome(
            &delete,
            409,
            &json!({"error": "zone \"eu-1\" is in global.zones"}),
        )
        .unwrap_err();
        assert_eq!(refused, "HTTP 409: zone \"eu-1\" is in global.zones");
        assert!(outcome(&disable, 401, &json!({}))
            .unwrap_err()
            .contains("--api-token"));
    }

    /// Each subcommand is one request: its method, path and body.
    #[test]
    fn each_subcommand_is_one_request() {
        let name = || "eu-1".to_string();
        let put = |disabled: bool| Method::Put {
            content_type: "application/json",
            body: format!("{{\"disabled\":{disabled}}}"),
        };
        for (command, method, path) in [
            (
                ZoneCommand::Add {
                    name: name(),
                    disabled: true,
                },
                put(true),
                "/api/v1/zones/eu-1",
            ),
            (
                ZoneCommand::Add {
                    name: name(),
                    disabled: false,
                },
                put(false),
                "/api/v1/zones/eu-1",
            ),
            (
                ZoneCommand::Delete { name: name() },
                Method::Delete,
                "/api/v1/zones/eu-1",
            ),
            (
                ZoneCommand::Disable { name: name() },
                Method::Post,
                "/api/v1/zones/eu-1/disable",
            ),
            (
                ZoneCommand::Enable { name: name() },
                Method::Post,
                "/api/v1/zones/eu-1/enable",
            ),
        ] {
            assert_eq!(command.request(), (method, path.to_string()), "{command:?}");
        }
    }
}
