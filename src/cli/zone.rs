//! `hdsd zone add|delete|disable|enable NAME`: a global's zone
//! registrations through its REST API (`--api`, `--api-token`, `--ca`, as
//! `hdsd status` and `hdsd apply` take them). Each call is one request; the
//! API's answer is turned into one line for a person.

use crate::cli::apply::Target;

/// What to do to a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneCommand {
    /// Register it (`disabled`: disabled from the start).
    Add {
        disabled: bool,
    },
    Delete,
    Disable,
    Enable,
}

impl ZoneCommand {
    fn what(self) -> &'static str {
        match self {
            ZoneCommand::Add { .. } => "registered",
            ZoneCommand::Delete => "deleted",
            ZoneCommand::Disable => "disabled",
            ZoneCommand::Enable => "enabled",
        }
    }
}

/// The line printed for the API's answer `body` to `command` of `zone`
/// with `status`: `Ok` on success, `Err` with the API's message otherwise.
pub fn outcome(
    command: ZoneCommand,
    zone: &str,
    status: u16,
    body: &serde_json::Value,
) -> Result<String, String> {
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
    let mut line = format!("zone {zone} {}", command.what());
    match command {
        ZoneCommand::Add { .. } if status == 200 => {
            line = format!("zone {zone} was registered already");
            if let Some(by) = body.get("registeredBy").and_then(|b| b.as_str()) {
                line.push_str(&format!(" ({by})"));
            }
        }
        ZoneCommand::Delete => {
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

/// Sends `command` for `zone` to the global's API; the line to print, or
/// why it failed.
pub fn run(target: &Target<'_>, command: ZoneCommand, zone: &str) -> Result<String, String> {
    crate::names::check_zone(zone).map_err(|e| format!("{zone:?} is not a zone name: {e}"))?;
    let base = format!("{}/api/v1/zones/{zone}", target.api.trim_end_matches('/'));
    let (method, url, body) = match command {
        ZoneCommand::Add { disabled } => (
            "PUT",
            base,
            Some(serde_json::json!({ "disabled": disabled }).to_string()),
        ),
        ZoneCommand::Delete => ("DELETE", base, None),
        ZoneCommand::Disable => ("POST", format!("{base}/disable"), None),
        ZoneCommand::Enable => ("POST", format!("{base}/enable"), None),
    };
    let (status, value) = target.send(method, &url, body.as_deref())?;
    outcome(command, zone, status, &value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_answer_as_one_line() {
        assert_eq!(
            outcome(
                ZoneCommand::Add { disabled: false },
                "eu-1",
                201,
                &json!({"name": "eu-1", "state": "never_connected"})
            ),
            Ok("zone eu-1 registered (state: never_connected)".to_string())
        );
        assert_eq!(
            outcome(
                ZoneCommand::Add { disabled: false },
                "eu-1",
                200,
                &json!({"registeredBy": "config", "state": "online"})
            ),
            Ok("zone eu-1 was registered already (config) (state: online)".to_string())
        );
        let deleted = outcome(
            ZoneCommand::Delete,
            "eu-1",
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
            ZoneCommand::Delete,
            "eu-1",
            409,
            &json!({"error": "zone \"eu-1\" is in global.zones"}),
        )
        .unwrap_err();
        assert_eq!(refused, "HTTP 409: zone \"eu-1\" is in global.zones");
        assert!(outcome(ZoneCommand::Disable, "eu-1", 401, &json!({}))
            .unwrap_err()
            .contains("--api-token"));
    }
}
