//! What a configuration that does not load says to the person who wrote it.
//!
//! figment reports a bad key or value as serde does (`invalid value string
//! "5x", expected a duration for key "default.hds.report_interval"`, or an
//! unknown field with a list of backticked names). This module turns each
//! error into one line that names the key, where it was written (file and
//! line, or the environment variable), what is allowed, an example taken from
//! the defaults, and for a misspelled key or value the nearest allowed one.
//! Pure: the caller passes the file's text.

use std::path::Path;

use figment::error::{Actual, Kind};
use figment::Source;

/// The text of the configuration file that was loaded, to find lines in.
#[derive(Debug, Clone, Copy)]
pub struct FileText<'a> {
    /// As the user named it (figment's own name for it is absolute).
    pub path: &'a Path,
    pub text: &'a str,
    pub yaml: bool,
}

/// One line per problem, joined with `; `.
pub fn describe(errors: figment::Error, file: Option<FileText<'_>>, defaults: &str) -> String {
    errors
        .into_iter()
        .map(|e| describe_one(&e, file, defaults))
        .collect::<Vec<_>>()
        .join("; ")
}

fn describe_one(e: &figment::Error, file: Option<FileText<'_>>, defaults: &str) -> String {
    let path: Vec<&str> = e.path.iter().map(String::as_str).collect();
    // The key the problem is about: an unknown field is a child of `path`.
    let mut key = path.clone();
    if let Kind::UnknownField(field, _) = &e.kind {
        if key.last() != Some(&field.as_str()) {
            key.push(field);
        }
    }
    let dotted = key.join(".");
    let origin = origin(e, &key, file);
    let what = match &e.kind {
        Kind::UnknownField(field, expected) => {
            let section = if key.len() > 1 {
                format!("[{}]", key[..key.len() - 1].join("."))
            } else {
                "the top level".to_string()
            };
            let mut s = format!("unknown key {dotted}{origin}");
            if let Some(near) = nearest(field, expected) {
                s.push_str(&format!(": did you mean {near}?"));
            }
            s.push_str(&format!(
                " The keys of {section} are: {}; `hdsd config defaults` prints each with its default",
                expected.join(", ")
            ));
            s
        }
        Kind::UnknownVariant(value, expected) => {
            let mut s = format!(
                "{dotted} is {value:?}{origin}: allowed values are {}",
                quoted(expected)
            );
            if let Some(near) = nearest(value, expected) {
                s.push_str(&format!("; did you mean {near:?}?"));
            }
            s
        }
        Kind::InvalidValue(actual, expected) | Kind::InvalidType(actual, expected) => {
            let shown = show(actual);
            if expected.contains("duration") {
                format!("{dotted} is {shown}{origin}, not a duration: write a number and a unit, e.g. \"250ms\", \"5s\", \"1m\" or \"1h\"")
            } else {
                let mut s = format!("{dotted} is {shown}{origin}; expected {expected}");
                if let Some(example) = example(defaults, &key) {
                    s.push_str(&format!(", e.g. {example}"));
                }
                s
            }
        }
        Kind::MissingField(field) => {
            format!("{dotted} is missing the key {field}{origin}: add it")
        }
        Kind::Message(message) => {
            if dotted.is_empty() {
                format!("{message}{origin}")
            } else {
                format!("{dotted}{origin}: {message}")
            }
        }
        other => {
            if dotted.is_empty() {
                format!("{other}{origin}")
            } else {
                format!("{dotted}{origin}: {other}")
            }
        }
    };
    what
}

/// A validation problem (`hds.check: timeout (5s) must be ...`) with the line
/// of the key it starts with, when the file sets it: ` (hdsd.toml line 7)`.
pub fn with_line(problem: String, file: FileText<'_>) -> String {
    let key: String = problem
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '.')
        .collect();
    let parts: Vec<&str> = key.trim_end_matches('.').split('.').collect();
    if parts.len() < 2 && !problem[key.len()..].starts_with([':', ' ']) {
        return problem;
    }
    // The key itself, else the nearest table that holds it.
    let line = (1..=parts.len()).rev().find_map(|n| {
        if file.yaml {
            yaml_line(file.text, &parts[..n])
        } else {
            toml_line(file.text, &parts[..n])
        }
    });
    match line {
        Some(line) => format!("{problem} ({} line {line})", file.path.display()),
        None => problem,
    }
}

/// ` (hdsd.toml line 3)`, ` (from HDSD_HDS__REPORT_INTERVAL)`, or nothing.
fn origin(e: &figment::Error, key: &[&str], file: Option<FileText<'_>>) -> String {
    let Some(metadata) = &e.metadata else {
        return String::new();
    };
    match &metadata.source {
        Some(Source::File(path)) => {
            // One file is loaded: its text is the caller's (figment names it
            // by its absolute path).
            let line = file.and_then(|f| {
                if f.yaml {
                    yaml_line(f.text, key)
                } else {
                    toml_line(f.text, key)
                }
            });
            match line {
                Some(line) => format!(" ({} line {line})", shown(path, file)),
                None => format!(" (in {})", shown(path, file)),
            }
        }
        // hdsd's variables: `HDSD_` and the key's parts joined with `__`.
        _ if metadata.name.contains("environment") && !key.is_empty() => {
            format!(" (from HDSD_{})", key.join("__").to_uppercase())
        }
        _ => String::new(),
    }
}

/// The file as the user named it when it is the one loaded.
fn shown(path: &Path, file: Option<FileText<'_>>) -> String {
    match file {
        Some(f) if path.ends_with(f.path) || f.path.is_absolute() => f.path.display().to_string(),
        _ => path.display().to_string(),
    }
}

/// The allowed name closest to `given`, when it is close enough to be a
/// misspelling of it.
pub fn nearest<'a>(given: &str, allowed: &[&'a str]) -> Option<&'a str> {
    allowed
        .iter()
        .map(|a| (strsim::damerau_levenshtein(given, a), *a))
        .filter(|(d, a)| *d <= (a.len().max(given.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, a)| a)
}

fn quoted(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn show(actual: &Actual) -> String {
    match actual {
        Actual::Str(s) => format!("{s:?}"),
        Actual::Unsigned(v) => v.to_string(),
        Actual::Signed(v) => v.to_string(),
        Actual::Float(v) => v.to_string(),
        Actual::Bool(v) => v.to_string(),
        Actual::Seq => "a list".to_string(),
        Actual::Map => "a table".to_string(),
        other => other.to_string(),
    }
}

/// `key = value` as the defaults write it, e.g. `report_interval = "5s"`
/// (commented-out defaults count too).
fn example(defaults: &str, key: &[&str]) -> Option<String> {
    let (last, section) = key.split_last()?;
    let header = format!("[{}]", section.join("."));
    let mut in_section = section.is_empty();
    for line in defaults.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_section = t == header;
            continue;
        }
        if !in_section {
            continue;
        }
        let t = t.trim_start_matches('#').trim_start();
        if let Some(rest) = t.strip_prefix(last) {
            if rest.trim_start().starts_with('=') {
                return Some(t.to_string());
            }
        }
    }
    None
}

/// The 1-based line of `key` in a TOML text, through its tables.
pub fn toml_line(text: &str, key: &[&str]) -> Option<usize> {
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    let mut table: &dyn toml_edit::TableLike = doc.as_table();
    let mut span = None;
    for (i, segment) in key.iter().enumerate() {
        let (k, item) = table.get_key_value(segment)?;
        span = k.span().or_else(|| item.span());
        if i + 1 < key.len() {
            table = item.as_table_like()?;
            if span.is_none() {
                span = item.span();
            }
        }
    }
    span.map(|s| line_of(text, s.start))
}

/// The 1-based line of `key` in a YAML text: each segment is the next
/// `name:` line indented deeper than its parent's.
pub fn yaml_line(text: &str, key: &[&str]) -> Option<usize> {
    let mut segments = key.iter().peekable();
    let mut parent_indent: Option<usize> = None;
    // The indent of the parent's direct children: the first line under it.
    let mut child_indent: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let Some(segment) = segments.peek() else {
            break;
        };
        let content = line.trim_start();
        if content.is_empty() || content.starts_with('#') {
            continue;
        }
        let indent = line.len() - content.len();
        if let Some(p) = parent_indent {
            if indent <= p {
                // Left the parent's block without finding the key.
                return None;
            }
        }
        match child_indent {
            None => child_indent = Some(indent),
            Some(c) if indent > c => continue, // deeper than a direct child
            Some(_) => {}
        }
        let name = content.trim_start_matches("- ");
        if name
            .strip_prefix(**segment)
            .is_some_and(|rest| rest.trim_start().starts_with(':'))
        {
            segments.next();
            if segments.peek().is_none() {
                return Some(n + 1);
            }
            parent_indent = Some(indent);
            child_indent = None;
        }
    }
    None
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, DEFAULTS_TOML};
    use figment::providers::{Format, Serialized, Toml, Yaml};
    use figment::Figment;

    fn load(path: &Path, text: &str, yaml: bool) -> String {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(path);
        std::fs::write(&file, text).unwrap();
        let figment = Figment::from(Serialized::defaults(Config::default()));
        let figment = if yaml {
            figment.merge(Yaml::file(&file))
        } else {
            figment.merge(Toml::file(&file))
        };
        let e = figment.extract::<Config>().unwrap_err();
        let text = describe(
            e,
            Some(FileText {
                path: &file,
                text,
                yaml,
            }),
            DEFAULTS_TOML,
        );
        text.replace(&format!("{}", file.display()), &path.display().to_string())
    }

    #[test]
    fn a_bad_duration_names_the_key_the_line_and_an_example() {
        let m = load(
            Path::new("hdsd.toml"),
            "state_dir = \"x\"\n\n[hds]\nreport_interval = \"5x\"\n",
            false,
        );
        assert_eq!(m, "hds.report_interval is \"5x\" (hdsd.toml line 4), not a duration: write a number and a unit, e.g. \"250ms\", \"5s\", \"1m\" or \"1h\"");
        let m = load(
            Path::new("hdsd.yaml"),
            "hds:\n  listen: 0.0.0.0:1\n  report_interval: 5x\n",
            true,
        );
        assert!(
            m.starts_with("hds.report_interval is \"5x\" (hdsd.yaml line 3)"),
            "{m}"
        );
    }

    #[test]
    fn a_misspelled_key_gets_the_nearest_and_no_nested_backticks() {
        let m = load(
            Path::new("hdsd.toml"),
            "[hds]\nreport_intervall = \"5s\"\n",
            false,
        );
        assert!(
            m.starts_with("unknown key hds.report_intervall (hdsd.toml line 2): did you mean report_interval? The keys of [hds] are: listen, report_interval,"),
            "{m}"
        );
        assert!(!m.contains("``"), "{m}");
        // Nothing near: no guess.
        let m = load(Path::new("hdsd.toml"), "[hds]\nzzzzzzzz = 1\n", false);
        assert!(!m.contains("did you mean"), "{m}");
        let m = load(Path::new("hdsd.toml"), "[hdss]\nlisten = 1\n", false);
        assert!(
            m.starts_with("unknown key hdss (hdsd.toml line 1): did you mean hds? The keys of the top level are:"),
            "{m}"
        );
    }

    #[test]
    fn a_bad_variant_lists_what_is_allowed() {
        let m = load(
            Path::new("hdsd.toml"),
            "[hds.check]\nkind = \"htp\"\n",
            false,
        );
        assert!(
            m.starts_with("hds.check.kind is \"htp\" (hdsd.toml line 2): allowed values are"),
            "{m}"
        );
        assert!(m.ends_with("did you mean \"http\"?"), "{m}");
    }

    #[test]
    fn a_wrong_type_shows_the_default_as_an_example() {
        let m = load(
            Path::new("hdsd.toml"),
            "[hds.limits]\nmax_connections = \"many\"\n",
            false,
        );
        assert!(
            m.starts_with("hds.limits.max_connections is \"many\" (hdsd.toml line 2); expected"),
            "{m}"
        );
        assert!(m.ends_with("e.g. max_connections = 10000"), "{m}");
    }

    #[test]
    fn an_environment_variable_is_named() {
        let mut e = figment::Error::from(Kind::InvalidValue(
            Actual::Str("5x".into()),
            "a duration".into(),
        ));
        e.path = vec!["hds".into(), "report_interval".into()];
        e.metadata = Some(figment::Metadata::named("`HDSD_` environment variable(s)"));
        let m = describe(e, None, DEFAULTS_TOML);
        assert!(
            m.starts_with(
                "hds.report_interval is \"5x\" (from HDSD_HDS__REPORT_INTERVAL), not a duration"
            ),
            "{m}"
        );
    }

    #[test]
    fn a_validation_problem_gets_the_line_of_its_key() {
        let file = FileText {
            path: Path::new("hdsd.toml"),
            text: "[hds]\nlisten = \"x\"\n\n[hds.check]\ntimeout = \"5s\"\n",
            yaml: false,
        };
        assert_eq!(
            with_line(
                "hds.check: timeout (5s) must be <= interval (1s)".into(),
                file
            ),
            "hds.check: timeout (5s) must be <= interval (1s) (hdsd.toml line 4)"
        );
        assert_eq!(
            with_line("hds.listen is wrong".into(), file),
            "hds.listen is wrong (hdsd.toml line 2)"
        );
        // Not set in the file: no line.
        assert_eq!(with_line("eds.x is 1".into(), file), "eds.x is 1");
        assert_eq!(
            with_line("shutdown_timeout must be > 0".into(), file),
            "shutdown_timeout must be > 0"
        );
    }

    #[test]
    fn lines_are_found_through_tables_and_yaml_blocks() {
        let toml = "a = 1\n[x]\nb = 2\n[x.y]\nc = 3\n";
        assert_eq!(toml_line(toml, &["a"]), Some(1));
        assert_eq!(toml_line(toml, &["x", "b"]), Some(3));
        assert_eq!(toml_line(toml, &["x", "y", "c"]), Some(5));
        assert_eq!(toml_line(toml, &["x", "z"]), None);
        let yaml = "a: 1\nx:\n  b: 2\n  y:\n    c: 3\nz:\n  c: 4\n";
        assert_eq!(yaml_line(yaml, &["x", "y", "c"]), Some(5));
        assert_eq!(yaml_line(yaml, &["z", "c"]), Some(7));
        assert_eq!(yaml_line(yaml, &["x", "c"]), None);
    }
}
