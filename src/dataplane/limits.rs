//! What one dataplane file may hold, checked before and after it is
//! deserialized: its size, its YAML's nesting, aliases and their expansion
//! (by a streaming parser), its inbounds and tags.

use super::error::{Limit, ParseError};
use super::model::Dataplane;

/// What one dataplane file may hold (the `dataplanes.max_*` settings). A
/// file past a limit is rejected like any broken file: its last good
/// definitions stay in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimits {
    /// Bytes a file may have; also the most its YAML aliases may expand it to.
    pub max_file_size: u64,
    /// Levels of YAML nesting (mappings and sequences, block or flow).
    pub max_nesting: usize,
    /// YAML aliases (`*name`) per file.
    pub max_aliases: usize,
    /// Inbounds per dataplane.
    pub max_inbounds: usize,
    /// Tags per inbound.
    pub max_tags: usize,
    /// YAML documents (or JSON values) per file, empty ones included.
    pub max_documents: usize,
    /// Bytes the parse of one file may keep for the file's next version
    /// (its text and what each of its documents parsed to).
    pub max_kept_bytes: u64,
    /// What a key the Dataplane resource does not define is: an error (the
    /// default), or a warning and the key ignored.
    pub unknown_fields: UnknownFields,
}

/// `dataplanes.unknown_fields`: what a key that Kuma's `Dataplane` does not
/// define (or that hdsd does not know) makes of its file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnknownFields {
    /// The file is refused, naming the key and its line: a typo fails.
    #[default]
    Refuse,
    /// The key is ignored and a warning listed with the file (as Kuma,
    /// which reads its resources with unknown fields allowed, does).
    Warn,
}

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits {
            max_file_size: 1024 * 1024,
            max_nesting: 32,
            max_aliases: 64,
            max_inbounds: 4096,
            max_tags: 64,
            max_documents: 10_000,
            max_kept_bytes: 4 * 1024 * 1024,
            unknown_fields: UnknownFields::Refuse,
        }
    }
}

/// The error of a file with more documents than `max_documents`.
pub(super) fn too_many_documents(line: Option<usize>, limits: &FileLimits) -> ParseError {
    ParseError::limit(
        Limit::Documents,
        line,
        format!(
            "the file has more than {} documents (dataplanes.max_documents), empty ones included; split it into several files or raise the limit",
            limits.max_documents
        ),
    )
}

/// The file size limit: checked first, on the text as read.
pub(super) fn check_file_size(text: &str, limits: &FileLimits) -> Result<(), ParseError> {
    if text.len() as u64 > limits.max_file_size {
        return Err(ParseError::limit(
            Limit::FileSize,
            None,
            format!(
                "the file has {} bytes, more than dataplanes.max_file_size ({}); split it into several files or raise the limit",
                text.len(),
                limits.max_file_size
            ),
        ));
    }
    Ok(())
}

/// Checks a YAML text against `limits` before it is deserialized, with a
/// streaming parser that holds one event at a time and stops at the first
/// limit: nesting (deep nesting makes the deserializer's parser slow, and
/// quadratically so in flow style), the number of aliases, and the size the
/// aliases expand the text to (every alias is a copy once deserialized: a
/// large anchored value aliased many times would take memory many times the
/// file's size). A text the streaming parser cannot read is an error too,
/// so nothing it has not checked reaches the deserializer.
pub fn check_yaml(text: &str, limits: &FileLimits) -> Result<(), ParseError> {
    scan_yaml(text, limits).map(|_| ())
}

/// What [`check_yaml`] counted in a text within the limits: its aliases, the
/// size its aliases expand it to, and its documents. They add up over the
/// documents of a stream, which lets a file be checked document by document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct YamlSize {
    pub(super) aliases: usize,
    pub(super) expanded: u64,
    pub(super) documents: usize,
}

pub(super) fn scan_yaml(text: &str, limits: &FileLimits) -> Result<YamlSize, ParseError> {
    use yaml_rust2::parser::{Event, Parser};
    // One open collection: its anchor and its expanded size so far.
    struct Open {
        anchor: usize,
        size: u64,
    }
    let cap = limits.max_file_size;
    let mut parser = Parser::new_from_str(text);
    let mut open: Vec<Open> = Vec::new();
    let mut anchored: std::collections::HashMap<usize, u64> = std::collections::HashMap::new();
    let mut aliases = 0usize;
    let mut total = 0u64;
    let mut documents = 0usize;
    let nesting = |line| {
        ParseError::limit(
            Limit::Nesting,
            line,
            format!(
                "nested deeper than {} levels (dataplanes.max_nesting); a Dataplane needs about 6: flatten the document or raise the limit",
                limits.max_nesting
            ),
        )
    };
    loop {
        let (event, mark) = parser.next_token().map_err(|e| {
            let line = Some(e.marker().line());
            // The streaming parser's own cap on flow nesting (255 levels).
            if e.info() == "recursion limit exceeded" {
                nesting(line)
            } else {
                ParseError {
                    line,
                    message: e.info().to_string(),
                    limit: None,
                }
            }
        })?;
        let line = Some(mark.line());
        // A finished node: (its anchor, its expanded size).
        let done = match event {
            Event::StreamEnd => {
                return Ok(YamlSize {
                    aliases,
                    expanded: total,
                    documents,
                })
            }
            Event::DocumentStart => {
                documents += 1;
                if documents > limits.max_documents {
                    return Err(too_many_documents(line, limits));
                }
                None
            }
            Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
                open.push(Open { anchor, size: 1 });
                if open.len() > limits.max_nesting {
                    return Err(nesting(line));
                }
                None
            }
            Event::SequenceEnd | Event::MappingEnd => open.pop().map(|o| (o.anchor, o.size)),
            Event::Scalar(value, _, anchor, _) => Some((anchor, 1 + value.len() as u64)),
            Event::Alias(id) => {
                aliases += 1;
                if aliases > limits.max_aliases {
                    return Err(ParseError::limit(
                        Limit::Aliases,
                        line,
                        format!(
                            "more than {} YAML aliases (*name) (dataplanes.max_aliases); write the values out or raise the limit",
                            limits.max_aliases
                        ),
                    ));
                }
                Some((0, anchored.get(&id).copied().unwrap_or(1)))
            }
            _ => None,
        };
        let Some((anchor, size)) = done else { continue };
        if anchor != 0 {
            anchored.insert(anchor, size);
        }
        let sum = match open.last_mut() {
            Some(parent) => {
                parent.size = parent.size.saturating_add(size);
                parent.size
            }
            None => {
                total = total.saturating_add(size);
                total
            }
        };
        if sum > cap {
            return Err(ParseError::limit(
                Limit::Expansion,
                line,
                format!(
                    "YAML aliases expand this file past {cap} bytes (dataplanes.max_file_size): every alias is a copy of its anchor's value; write the values out instead of repeating a large anchor"
                ),
            ));
        }
    }
}

/// The inbound and tag limits of one parsed dataplane.
pub(super) fn check_sizes(dp: &Dataplane, limits: &FileLimits) -> Result<(), ParseError> {
    if dp.inbounds.len() > limits.max_inbounds {
        return Err(ParseError::limit(
            Limit::Inbounds,
            None,
            format!(
                "dataplane {} has {} inbounds, more than dataplanes.max_inbounds ({}); split it into several dataplanes or raise the limit",
                dp.id,
                dp.inbounds.len(),
                limits.max_inbounds
            ),
        ));
    }
    if let Some((i, inbound)) = dp
        .inbounds
        .iter()
        .enumerate()
        .find(|(_, inbound)| inbound.tags.len() > limits.max_tags)
    {
        return Err(ParseError::limit(
            Limit::Tags,
            None,
            format!(
                "dataplane {}: networking.inbound[{i}] has {} tags, more than dataplanes.max_tags ({}); remove some or raise the limit",
                dp.id,
                inbound.tags.len(),
                limits.max_tags
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::{parse_file, parse_file_with, Format};

    fn limits() -> FileLimits {
        FileLimits {
            max_file_size: 4096,
            max_nesting: 8,
            max_aliases: 3,
            max_inbounds: 2,
            max_tags: 2,
            max_documents: 8,
            max_kept_bytes: 1 << 20,
            unknown_fields: UnknownFields::Refuse,
        }
    }

    fn limit_of(text: &str) -> Option<Limit> {
        parse_file_with(text, Format::Yaml, &limits())
            .err()
            .and_then(|e| e.limit)
    }

    #[test]
    fn deep_nesting_is_refused_fast_in_any_style() {
        let deep = 200_000;
        for text in [
            format!("{}{}", "[".repeat(deep), "]".repeat(deep)),
            format!("{}{}", "{a: ".repeat(deep), "}".repeat(deep)),
            format!("{}x\n", "- ".repeat(deep)),
            format!(
                "type: Dataplane\ntags: {}{}\n",
                "[".repeat(deep),
                "]".repeat(deep)
            ),
        ] {
            let started = std::time::Instant::now();
            let e = parse_file_with(
                &text,
                Format::Yaml,
                &FileLimits {
                    max_file_size: 10 << 20,
                    ..limits()
                },
            )
            .unwrap_err();
            assert_eq!(e.limit, Some(Limit::Nesting), "{e}");
            assert!(e.message.contains("dataplanes.max_nesting"), "{e}");
            assert!(started.elapsed() < std::time::Duration::from_secs(1));
        }
        // Within the limit: the file's own problem, not a limit.
        assert_eq!(limit_of("type: Dataplane\nmesh: [[[[x]]]]\n"), None);
    }

    #[test]
    fn aliases_are_counted_and_their_expansion_bounded() {
        let ok = "type: Dataplane\nmesh: default\nname: a\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 1\n    servicePort: 2\n    tags: &t {kuma.io/service: web}\n  - port: 3\n    servicePort: 4\n    tags: *t\n";
        let parsed = parse_file_with(ok, Format::Yaml, &limits()).unwrap();
        assert_eq!(
            parsed.dataplanes[0].inbounds[1].tags["kuma.io/service"],
            "web"
        );

        let many = format!("a: &a x\nb: [{}]\n", ["*a"; 4].join(", "));
        assert_eq!(limit_of(&many), Some(Limit::Aliases));

        // One large value aliased a few times: under the count, past the size.
        let big = format!("a: &a {}\nb: [*a, *a]\n", "x".repeat(1500));
        assert_eq!(limit_of(&big), Some(Limit::Expansion));

        // Nested anchors (a billion laughs): each level doubles the size.
        let mut laughs = String::from("l0: &l0 [xxxxxxxxxxxxxxxx, xxxxxxxxxxxxxxxx]\n");
        for i in 1..3 {
            laughs.push_str(&format!(
                "l{i}: &l{i} [*l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}, *l{p}]\n",
                p = i - 1
            ));
        }
        let e = parse_file_with(
            &laughs,
            Format::Yaml,
            &FileLimits {
                max_aliases: 100,
                max_file_size: 1000,
                ..limits()
            },
        )
        .unwrap_err();
        assert_eq!(e.limit, Some(Limit::Expansion), "{e}");
    }

    #[test]
    fn size_inbounds_and_tags_are_capped() {
        let e = parse_file_with(&"#".repeat(5000), Format::Yaml, &limits()).unwrap_err();
        assert_eq!(e.limit, Some(Limit::FileSize));
        let inbound = |port: u16, tags: &str| {
            format!("  - port: {port}\n    servicePort: 8080\n    tags: {{{tags}}}\n")
        };
        let head = "type: Dataplane\nmesh: default\nname: a\nnetworking:\n  address: 127.0.0.1\n  inbound:\n";
        let three = format!(
            "{head}{}{}{}",
            inbound(1, "a: b"),
            inbound(2, "a: b"),
            inbound(3, "a: b")
        );
        let e = parse_file_with(&three, Format::Yaml, &limits()).unwrap_err();
        assert_eq!(e.limit, Some(Limit::Inbounds));
        assert!(
            e.message
                .contains("3 inbounds, more than dataplanes.max_inbounds (2)"),
            "{e}"
        );
        let tags = format!("{head}{}", inbound(1, "a: b, c: d, e: f"));
        let e = parse_file_with(&tags, Format::Yaml, &limits()).unwrap_err();
        assert_eq!(e.limit, Some(Limit::Tags));
        assert!(
            e.message.contains("networking.inbound[0] has 3 tags"),
            "{e}"
        );
        // JSON too.
        let json = r#"{"type": "Dataplane", "mesh": "default", "name": "a", "networking": {"address": "127.0.0.1", "inbound": [{"port": 1, "servicePort": 2, "tags": {"a": "1", "b": "2", "c": "3"}}]}}"#;
        let e = parse_file_with(json, Format::Json, &limits()).unwrap_err();
        assert_eq!(e.limit, Some(Limit::Tags));
    }

    #[test]
    fn the_fixtures_pass_the_default_limits() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/kuma");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let Some(format) = Format::of_path(&path) else {
                continue;
            };
            let text = std::fs::read_to_string(&path).unwrap();
            parse_file(&text, format).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}
