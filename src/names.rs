//! The rules for names users give hdsd: meshes, dataplanes (and, with
//! zones, zone names). Pure; every entry point (files, the API, tokens, HDS
//! node ids) goes through `DataplaneId::try_new`, which applies them.
//!
//! As Kuma validates them: a dataplane name is lowercase letters, digits,
//! '-', '_' and '.', starting and ending with a letter or digit, at most
//! [`MAX_NAME`] characters (a DNS-1123 subdomain, plus '_'); a mesh or a
//! zone name is a DNS-1123 label: lowercase letters, digits and '-',
//! starting and ending with a letter or digit, at most [`MAX_LABEL`]
//! characters (a mesh has no dot: a node id is `<mesh>.<name>`). So no name
//! can carry a separator, a control character or a NUL into a log line, a
//! store row or a message between instances, and every such message has a
//! size known in advance.

/// The longest dataplane name (a DNS-1123 subdomain).
pub const MAX_NAME: usize = 253;
/// The longest mesh or zone name (a DNS-1123 label).
pub const MAX_LABEL: usize = 63;

/// Checks a dataplane name; the error names the rule broken.
pub fn check_name(name: &str) -> Result<(), String> {
    check(name, "name", MAX_NAME, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.')
    })
    .map_err(|e| format!("{e}; a dataplane name is lowercase letters, digits, '-', '_' and '.', starts and ends with a letter or digit, and has at most {MAX_NAME} characters"))
}

/// Checks a mesh name; the error names the rule broken.
pub fn check_mesh(mesh: &str) -> Result<(), String> {
    check_label(mesh, "mesh").map_err(|e| {
        format!("{e}; a mesh is lowercase letters, digits and '-' (no dot: the node id is <mesh>.<name>), starts and ends with a letter or digit, and has at most {MAX_LABEL} characters")
    })
}

/// Checks a zone name; the error names the rule broken.
pub fn check_zone(zone: &str) -> Result<(), String> {
    if zone == RESERVED_ZONE {
        return Err(format!("zone name {RESERVED_ZONE:?} is reserved: it names a global's own dataplanes (`?zone={RESERVED_ZONE}`); choose another"));
    }
    check_label(zone, "zone").map_err(|e| {
        format!("{e}; a zone name is lowercase letters, digits and '-', starts and ends with a letter or digit, and has at most {MAX_LABEL} characters")
    })
}

/// The most characters of a client's text that hdsd writes into a log
/// line or a status message ([`shown`]).
pub const SHOWN_MAX: usize = 96;

/// A text a client sent, as hdsd shows it in a log line or a status
/// message: quoted and escaped (control characters and NULs as escapes),
/// cut to its first [`SHOWN_MAX`] characters with how much was left out,
/// so no client can make one line longer than a few hundred bytes.
pub fn shown(text: &str) -> String {
    let mut chars = text.char_indices();
    match chars.nth(SHOWN_MAX) {
        None => format!("{text:?}"),
        Some((cut, _)) => format!("{:?}... ({} bytes in all)", &text[..cut], text.len()),
    }
}

/// The most characters of a peer's message for people (a global's
/// refusal, a zone's rejection) that hdsd writes into a log line or a
/// status ([`message`]).
pub const MESSAGE_MAX: usize = 1024;

/// A message a peer wrote for people, as hdsd shows it: control characters
/// and NULs escaped (a newline cannot forge a line), cut to its first
/// [`MESSAGE_MAX`] characters with how much was left out. Unlike
/// [`shown`] it is not quoted: it is a sentence, not a name.
pub fn message(text: &str) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == MESSAGE_MAX {
            out.push_str(&format!("... ({} bytes in all)", text.len()));
            return out;
        }
        if c.is_control() {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    out
}

/// The zone name no zone may have: the API's word for a global's own
/// dataplanes.
pub const RESERVED_ZONE: &str = "local";

fn check_label(text: &str, what: &str) -> Result<(), String> {
    check(text, what, MAX_LABEL, |c| {
        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
    })
}

fn check(text: &str, what: &str, max: usize, allowed: impl Fn(char) -> bool) -> Result<(), String> {
    if text.is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if text.len() > max {
        return Err(format!(
            "{what} has {} characters, more than {max}",
            text.chars().count()
        ));
    }
    if let Some(c) = text.chars().find(|&c| !allowed(c)) {
        // Debug-escaped: the character may be a control character or a NUL.
        return Err(format!("{what} {text:?} contains {c:?}"));
    }
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge(text.chars().next()) || !edge(text.chars().last()) {
        return Err(format!(
            "{what} {text:?} must start and end with a letter or digit"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_kumas_rules() {
        for ok in [
            "web",
            "web-01",
            "web.eu-1",
            "a",
            "db_primary",
            "0x",
            &"a".repeat(253),
        ] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("", "must not be empty"),
            ("Web", "contains 'W'"),
            ("web 01", "contains ' '"),
            ("victim\tfake-host/1\t2099", "contains '\\t'"),
            ("a\0b", "contains '\\0'"),
            ("web/01", "contains '/'"),
            ("-web", "start and end"),
            ("web.", "start and end"),
            (&"a".repeat(254), "more than 253"),
            (&"a".repeat(7990), "more than 253"),
        ] {
            let e = check_name(bad).unwrap_err();
            assert!(e.contains(why), "{bad:?}: {e}");
            assert!(e.contains("a dataplane name is"), "{e}");
        }
    }

    #[test]
    fn a_clients_text_is_shown_escaped_and_cut() {
        assert_eq!(shown("default.web"), "\"default.web\"");
        assert_eq!(shown("a\tb\0"), "\"a\\tb\\0\"");
        let long = format!("default.{}", "\u{1}".repeat(450_000));
        let s = shown(&long);
        assert!(s.len() < 8 * SHOWN_MAX, "{} bytes", s.len());
        assert!(s.ends_with("... (450008 bytes in all)"), "{s}");
        // A cut never splits a character.
        let s = shown(&"é".repeat(SHOWN_MAX + 1));
        assert!(
            s.starts_with(&format!("{:?}", "é".repeat(SHOWN_MAX))),
            "{s}"
        );
    }

    #[test]
    fn a_peers_message_is_escaped_and_cut_but_not_quoted() {
        assert_eq!(
            message("zone \"eu-1\" is disabled"),
            "zone \"eu-1\" is disabled"
        );
        assert_eq!(
            message("NACK\n2026-01-01T00:00:00Z ERROR hdsd: forged"),
            "NACK\\n2026-01-01T00:00:00Z ERROR hdsd: forged"
        );
        let long = "\u{1}".repeat(500_000);
        let m = message(&long);
        assert!(m.len() < 8 * MESSAGE_MAX, "{} bytes", m.len());
        assert!(m.ends_with("... (500000 bytes in all)"), "{m}");
    }

    #[test]
    fn meshes_and_zones_are_labels() {
        for ok in ["default", "eu-1", &"m".repeat(63)] {
            assert_eq!(check_mesh(ok), Ok(()));
            assert_eq!(check_zone(ok), Ok(()));
        }
        for (bad, why) in [
            ("", "must not be empty"),
            ("de.fault", "contains '.'"),
            ("Default", "contains 'D'"),
            ("eu_1", "contains '_'"),
            ("eu-", "start and end"),
            (&"m".repeat(64), "more than 63"),
        ] {
            assert!(check_mesh(bad).unwrap_err().contains(why), "{bad}");
            let e = check_zone(bad).unwrap_err();
            assert!(
                e.contains(why) && e.contains("a zone name is"),
                "{bad}: {e}"
            );
        }
    }
}
