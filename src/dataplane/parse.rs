//! Parsing one dataplane file: its YAML documents or JSON objects, each
//! sorted by its `type` into a dataplane or an ignored document, within the
//! file's limits.

use serde::{Deserialize, Serialize};
use serde_path_to_error::{Path, Segment};

use super::error::ParseError;
use super::kuma::{DataplaneDoc, Header};
use super::limits::{check_file_size, check_sizes, check_yaml, FileLimits, UnknownFields};
use super::model::{Dataplane, InboundState, SERVICE_TAG};

/// The two forms Kuma reads a resource in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Yaml,
    Json,
}

impl Format {
    /// The format of a dataplane file, by extension: `.yaml`, `.yml`, `.json`.
    pub fn of_path(path: &std::path::Path) -> Option<Format> {
        match path.extension().and_then(|e| e.to_str()) {
            Some("yaml" | "yml") => Some(Format::Yaml),
            Some("json") => Some(Format::Json),
            _ => None,
        }
    }
}

/// A document of another resource type (`Mesh`, a policy...): skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IgnoredDocument {
    /// 1-based position in the file.
    pub document: usize,
    /// Its `type`.
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// Something about a file that does not stop it from loading: a field
/// ignored (`dataplanes.unknown_fields = "warn"`), an inbound in no service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warning {
    /// The line it is about, when known.
    #[serde(default)]
    pub line: Option<usize>,
    pub message: String,
}

/// Everything one file holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedFile {
    pub dataplanes: Vec<Dataplane>,
    pub ignored: Vec<IgnoredDocument>,
    /// In file order: the unknown fields ignored, then the dataplanes'
    /// warnings ([`dataplane_warnings`]).
    pub warnings: Vec<Warning>,
}

/// The most unknown fields one document may have with
/// `dataplanes.unknown_fields = "warn"`: each costs a deserialization of
/// the document, and a document with more is hardly a Dataplane.
pub const MAX_UNKNOWN_FIELDS: usize = 32;

/// Parses every `---`-separated YAML document of one file and keeps the
/// dataplanes. Empty documents and other resource types are skipped.
pub fn parse_documents(text: &str) -> Result<Vec<Dataplane>, ParseError> {
    parse_file(text, Format::Yaml).map(|p| p.dataplanes)
}

/// Parses one file: YAML documents separated by `---`, or a stream of JSON
/// objects. Documents whose `type` is not `Dataplane` are listed as ignored;
/// a document without `type` is an error. The default [`FileLimits`] apply.
pub fn parse_file(text: &str, format: Format) -> Result<ParsedFile, ParseError> {
    parse_file_with(text, format, &FileLimits::default())
}

/// [`parse_file`] within the given limits. YAML is checked by
/// [`check_yaml`] before it is deserialized; JSON, which has no aliases, is
/// deserialized at once (its parser stops at 128 levels, in linear time).
pub fn parse_file_with(
    text: &str,
    format: Format,
    limits: &FileLimits,
) -> Result<ParsedFile, ParseError> {
    check_file_size(text, limits)?;
    if let Some((line, placeholder)) = find_template(text) {
        return Err(ParseError {
        limit: None,
            line: Some(line),
            message: format!(
                "{placeholder} is a template placeholder: this file is a kuma-dp Dataplane template; render it first (replace every {{{{ ... }}}} with its value, as `kuma-dp run --dataplane-var` does) and put the rendered file in the dataplanes directory"
            ),
        });
    }
    let mut out = ParsedFile::default();
    match format {
        Format::Yaml => {
            check_yaml(text, limits)?;
            parse_yaml(text, limits, &mut out)?
        }
        Format::Json => parse_json(text, limits, &mut out)?,
    }
    for dp in &out.dataplanes {
        check_sizes(dp, limits)?;
    }
    out.warnings.extend(dataplane_warnings(&out.dataplanes));
    Ok(out)
}

/// What a file's reader should know about its dataplanes: an inbound
/// without a `kuma.io/service` tag (Kuma refuses one) is checked, but it
/// counts in no service and no EDS cluster. Inbounds of state `Ignored` are
/// not checked and are left out.
pub fn dataplane_warnings<'a>(dataplanes: impl IntoIterator<Item = &'a Dataplane>) -> Vec<Warning> {
    let mut warnings = Vec::new();
    for dp in dataplanes {
        for (i, inbound) in dp.inbounds.iter().enumerate() {
            if inbound.state == InboundState::Ignored || inbound.tags.contains_key(SERVICE_TAG) {
                continue;
            }
            warnings.push(Warning {
                line: None,
                message: format!(
                    "dataplane {}: networking.inbound[{i}] (port {}) has no {SERVICE_TAG} tag: it counts in no service (GET /api/v1/services) and in no EDS cluster, whatever its health; add tags: {{{SERVICE_TAG}: <service name>}}",
                    dp.id, inbound.port
                ),
            });
        }
    }
    warnings
}

fn parse_yaml(text: &str, limits: &FileLimits, out: &mut ParsedFile) -> Result<(), ParseError> {
    // First pass: what each document is. Second pass: the dataplanes, with
    // the parser's line numbers for their errors.
    let mut headers = Vec::new();
    for (index, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        headers.push(
            Option::<Header>::deserialize(document).map_err(|e| ParseError {
                limit: None,
                line: e.location().map(|l| l.line()),
                message: format!("document {}: {}", index + 1, strip_location(&e.to_string())),
            })?,
        );
    }
    // With unknown fields allowed, a third pass reads a document with one
    // as a value, to take the fields out.
    let mut values = (limits.unknown_fields == UnknownFields::Warn)
        .then(|| serde_yaml_ng::Deserializer::from_str(text));
    for (index, (document, header)) in serde_yaml_ng::Deserializer::from_str(text)
        .zip(headers)
        .enumerate()
    {
        let as_value = values.as_mut().and_then(Iterator::next);
        if !classify(index, header, out)? {
            continue;
        }
        let doc = match serde_path_to_error::deserialize::<_, DataplaneDoc>(document) {
            Ok(doc) => doc,
            Err(e) => {
                let error = ParseError {
                    limit: None,
                    line: e.inner().location().map(|l| l.line()),
                    message: format!(
                        "document {}: {}",
                        index + 1,
                        strip_location(&e.inner().to_string())
                    ),
                };
                let (Some(document), Some(unknown)) = (as_value, unknown_field(&e)) else {
                    return Err(error);
                };
                let value =
                    serde_yaml_ng::Value::deserialize(document).map_err(|_| error.clone())?;
                let line = e.inner().location().map(|l| l.line());
                without_unknown(
                    index,
                    value,
                    unknown,
                    line,
                    error,
                    out,
                    |value, path, field| {
                        let mut at = value;
                        for segment in path {
                            at = match (segment, at) {
                                (Segment::Map { key }, serde_yaml_ng::Value::Mapping(m)) => {
                                    m.get_mut(key.as_str())?
                                }
                                (Segment::Seq { index }, serde_yaml_ng::Value::Sequence(s)) => {
                                    s.get_mut(*index)?
                                }
                                _ => return None,
                            };
                        }
                        at.as_mapping_mut()?.remove(field).map(|_| ())
                    },
                    |value| {
                        serde_path_to_error::deserialize::<_, DataplaneDoc>(value)
                            .map_err(|e| (e.path().clone(), e.inner().to_string()))
                    },
                )?
            }
        };
        add(index, doc, out)?;
    }
    Ok(())
}

/// The unknown field a strict deserialization stopped at: the path of its
/// mapping and its name. `None` for any other error.
fn unknown_field<E: std::fmt::Display>(e: &serde_path_to_error::Error<E>) -> Option<Unknown> {
    unknown_in(&e.inner().to_string()).map(|field| Unknown::new(e.path(), field))
}

/// An unknown field: the path of the mapping that holds it, and its name.
struct Unknown {
    mapping: Vec<Segment>,
    field: String,
}

impl Unknown {
    /// The error's path may end with the field's own key (JSON's does).
    fn new(path: &Path, field: String) -> Unknown {
        let mut mapping: Vec<Segment> = path.iter().cloned().collect();
        if matches!(mapping.last(), Some(Segment::Map { key }) if *key == field) {
            mapping.pop();
        }
        Unknown { mapping, field }
    }

    /// `networking.inbound[0].field`.
    fn path(&self) -> String {
        let mut out = String::new();
        for segment in &self.mapping {
            match segment {
                Segment::Seq { index } => out.push_str(&format!("[{index}]")),
                Segment::Map { key } => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(key);
                }
                _ => out.push_str(".?"),
            }
        }
        if !out.is_empty() {
            out.push('.');
        }
        out + &self.field
    }
}

/// The field named by serde's `unknown field `NAME`, expected ...` (after
/// the parser's own path, if any).
fn unknown_in(message: &str) -> Option<String> {
    const START: &str = "unknown field `";
    let at = message.find(START)?;
    if at > 0 && !message[..at].ends_with(": ") {
        return None;
    }
    let rest = &message[at + START.len()..];
    let end = ["`, expected", "`, there are no fields"]
        .iter()
        .filter_map(|t| rest.find(t))
        .min()?;
    Some(rest[..end].to_string())
}

/// Document `index` (its value) read without its unknown fields, each one
/// taken out and listed as a warning, the first being `unknown` (found at
/// `line`). Any other problem is an error: `strict` (the strict parse's)
/// when an unknown field cannot be taken out, else the problem left once
/// they are.
#[allow(clippy::too_many_arguments)]
fn without_unknown<V>(
    index: usize,
    mut value: V,
    mut unknown: Unknown,
    mut line: Option<usize>,
    strict: ParseError,
    out: &mut ParsedFile,
    remove: impl Fn(&mut V, &[Segment], &str) -> Option<()>,
    read: impl Fn(&V) -> Result<DataplaneDoc, (Path, String)>,
) -> Result<DataplaneDoc, ParseError> {
    let mut warnings = Vec::new();
    loop {
        if warnings.len() == MAX_UNKNOWN_FIELDS {
            return Err(ParseError {
                message: format!(
                    "document {}: more than {MAX_UNKNOWN_FIELDS} unknown fields (dataplanes.unknown_fields = \"warn\" ignores at most {MAX_UNKNOWN_FIELDS} per document), the last {}; is it a Dataplane? remove them",
                    index + 1,
                    unknown.path()
                ),
                ..strict
            });
        }
        if remove(&mut value, &unknown.mapping, &unknown.field).is_none() {
            return Err(strict);
        }
        warnings.push(Warning {
            line,
            message: format!(
                "document {}: unknown field {} ignored (dataplanes.unknown_fields = \"warn\"); remove it, or set dataplanes.unknown_fields = \"refuse\" to make it an error",
                index + 1,
                unknown.path()
            ),
        });
        match read(&value) {
            Ok(doc) => {
                out.warnings.append(&mut warnings);
                return Ok(doc);
            }
            Err((path, message)) => match unknown_in(&message) {
                // Read from a value: no line.
                Some(field) => {
                    unknown = Unknown::new(&path, field);
                    line = None;
                }
                None => {
                    let path = match path.to_string().as_str() {
                        "." => String::new(),
                        p => format!("{p}: "),
                    };
                    return Err(ParseError {
                        limit: None,
                        line: None,
                        message: format!(
                            "document {}: {path}{}",
                            index + 1,
                            strip_location(&message)
                        ),
                    });
                }
            },
        }
    }
}

fn parse_json(text: &str, limits: &FileLimits, out: &mut ParsedFile) -> Result<(), ParseError> {
    let json_error =
        |index: usize, first_line: usize, e: &serde_json::Error, path: String| ParseError {
            limit: None,
            line: (e.line() > 0).then(|| first_line + e.line() - 1),
            message: format!(
                "document {}: {path}{}",
                index + 1,
                strip_location(&e.to_string())
            ),
        };
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Header>();
    let mut start = 0;
    let mut index = 0;
    // Counted as the stream goes (from the file's start each time, a file
    // of many small values took quadratic time).
    let mut first_line = 1;
    while let Some(header) = stream.next() {
        if index >= limits.max_documents {
            // The line the next value starts on.
            let rest = &text[start..];
            let blank = &rest[..rest.len() - rest.trim_start().len()];
            let line = first_line + blank.matches('\n').count();
            return Err(super::limits::too_many_documents(Some(line), limits));
        }
        let header = header.map_err(|e| json_error(index, 1, &e, String::new()))?;
        let end = stream.byte_offset();
        let slice = &text[start..end];
        start = end;
        if classify(index, Some(header), out)? {
            let mut de = serde_json::Deserializer::from_str(slice);
            let doc = match serde_path_to_error::deserialize::<_, DataplaneDoc>(&mut de) {
                Ok(doc) => doc,
                Err(e) => {
                    let path = e.path().to_string();
                    let path = if path == "." {
                        String::new()
                    } else {
                        format!("{path}: ")
                    };
                    let error = json_error(index, first_line, e.inner(), path);
                    let unknown =
                        unknown_field(&e).filter(|_| limits.unknown_fields == UnknownFields::Warn);
                    let value = serde_json::from_str::<serde_json::Value>(slice).ok();
                    let (Some(unknown), Some(value)) = (unknown, value) else {
                        return Err(error);
                    };
                    let line = error.line;
                    without_unknown(
                        index,
                        value,
                        unknown,
                        line,
                        error,
                        out,
                        |value, path, field| {
                            let mut at = value;
                            for segment in path {
                                at = match segment {
                                    Segment::Map { key } => at.as_object_mut()?.get_mut(key)?,
                                    Segment::Seq { index } => at.as_array_mut()?.get_mut(*index)?,
                                    _ => return None,
                                };
                            }
                            at.as_object_mut()?.remove(field).map(|_| ())
                        },
                        |value| {
                            serde_path_to_error::deserialize::<_, DataplaneDoc>(value)
                                .map_err(|e| (e.path().clone(), e.inner().to_string()))
                        },
                    )?
                }
            };
            add(index, doc, out)?;
        }
        first_line += slice.matches('\n').count();
        index += 1;
    }
    Ok(())
}

/// Sorts a document by its `type`: `Ok(true)` for a dataplane, `Ok(false)`
/// for an empty or ignored document.
pub(super) fn classify(
    index: usize,
    header: Option<Header>,
    out: &mut ParsedFile,
) -> Result<bool, ParseError> {
    let Some(header) = header else {
        return Ok(false);
    };
    let error = |message: String| ParseError {
        limit: None,
        line: None,
        message: format!("document {}: {message}", index + 1),
    };
    match header.kind {
        Some(kind) if kind == "Dataplane" => Ok(true),
        Some(kind) if kind.is_empty() => Err(error("`type` is empty; write `type: Dataplane` (other resource types are skipped)".into())),
        Some(kind) => {
            out.ignored.push(IgnoredDocument {
                document: index + 1,
                kind,
                name: header.name.and_then(|n| n.as_str().map(str::to_string)),
            });
            Ok(false)
        }
        None => match header.k8s_kind.as_ref().and_then(|k| k.as_str()) {
            Some(kind) => Err(error(format!(
                "this is a Kubernetes manifest (kind: {kind}); hdsd reads Kuma's universal format: a document with `type: Dataplane`, `mesh`, `name` and `networking`"
            ))),
            None => Err(error(
                "missing field `type`; every resource needs one (`type: Dataplane` for a dataplane; other types are skipped)".into(),
            )),
        },
    }
}

fn add(index: usize, doc: DataplaneDoc, out: &mut ParsedFile) -> Result<(), ParseError> {
    let dataplane = doc.into_dataplane().map_err(|message| ParseError {
        limit: None,
        line: None,
        message: format!("document {}: {message}", index + 1),
    })?;
    if out.dataplanes.iter().any(|d| d.id == dataplane.id) {
        return Err(ParseError {
        limit: None,
            line: None,
            message: format!(
                "document {}: dataplane {} is defined twice in this file; remove one of the documents",
                index + 1,
                dataplane.id
            ),
        });
    }
    out.dataplanes.push(dataplane);
    Ok(())
}

/// The first `{{ name }}` placeholder outside a comment: (line, placeholder).
pub(super) fn find_template(text: &str) -> Option<(usize, &str)> {
    memchr::memmem::find(text.as_bytes(), b"{{")?;
    text.lines().enumerate().find_map(|(i, line)| {
        if line.trim_start().starts_with('#') {
            return None;
        }
        let open = line.find("{{")?;
        let close = open + 2 + line[open + 2..].find("}}")?;
        let inner = line[open + 2..close].trim();
        let is_name = !inner.is_empty()
            && inner
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        is_name.then(|| (i + 1, &line[open..close + 2]))
    })
}

fn strip_location(s: &str) -> &str {
    match s.rfind(" at line ") {
        Some(i) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::kuma::tests::{yaml, WEB};
    use super::*;

    const MIXED: &str = include_str!("../../testdata/kuma/mixed.yaml");
    const JSON: &str = include_str!("../../testdata/kuma/dataplane.json");
    const TEMPLATE: &str = include_str!("../../testdata/kuma-invalid/template.yaml");
    const TYPO: &str = include_str!("../../testdata/kuma-invalid/typo.yaml");
    const NO_TYPE: &str = include_str!("../../testdata/kuma-invalid/no-type.yaml");
    const STALE: &str = include_str!("../../testdata/kuma-invalid/stale-field.yaml");

    fn warn() -> FileLimits {
        FileLimits {
            unknown_fields: UnknownFields::Warn,
            ..FileLimits::default()
        }
    }

    fn messages(parsed: &ParsedFile) -> Vec<(Option<usize>, &str)> {
        parsed
            .warnings
            .iter()
            .map(|w| (w.line, w.message.as_str()))
            .collect()
    }

    #[test]
    fn a_stale_field_is_refused_by_default_and_ignored_with_a_warning() {
        let e = parse_file(STALE, Format::Yaml).unwrap_err();
        assert!(e.message.contains("unknown field `redirectPort`"), "{e}");
        assert!(e.message.contains("networking.transparentProxying"), "{e}");
        assert_eq!(e.line, Some(15), "{e}");

        let parsed =
            parse_file_with(STALE, Format::Yaml, &warn()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed.dataplanes[0].id.to_string(), "default.stale-01");
        assert_eq!(
            messages(&parsed),
            [(
                Some(15),
                "document 1: unknown field networking.transparentProxying.redirectPort ignored (dataplanes.unknown_fields = \"warn\"); remove it, or set dataplanes.unknown_fields = \"refuse\" to make it an error"
            )]
        );
        // The dataplane is the one without the field.
        let without = STALE.replace("    redirectPort: 15001\n", "");
        let clean = parse_file(&without, Format::Yaml).unwrap();
        assert_eq!(clean.dataplanes, parsed.dataplanes);
        assert!(clean.warnings.is_empty());
    }

    #[test]
    fn a_typo_is_still_refused_by_default_and_every_unknown_field_listed_in_warn_mode() {
        // Today's error, unchanged.
        let e = parse_file_with(TYPO, Format::Yaml, &FileLimits::default()).unwrap_err();
        assert_eq!(e.line, Some(12), "{e}");
        assert!(
            e.message
                .starts_with("document 2: networking.inbound[0]: unknown field `protocl`"),
            "{e}"
        );
        // Warn mode: nested and top-level fields, several in a document,
        // in several documents; the first of each document has its line.
        let text = format!(
            "{TYPO}\n---\n{}",
            STALE.replace("mesh: default\n", "mesh: default\nstatus: {a: 1}\n")
        );
        let parsed =
            parse_file_with(&text, Format::Yaml, &warn()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(parsed.dataplanes.len(), 2);
        let fields: Vec<(Option<usize>, &str)> = messages(&parsed)
            .into_iter()
            .map(|(l, m)| (l, m.split(" ignored").next().unwrap()))
            .collect();
        assert_eq!(
            fields,
            [
                (
                    Some(12),
                    "document 2: unknown field networking.inbound[0].protocl"
                ),
                (Some(22), "document 3: unknown field status"),
                (
                    None,
                    "document 3: unknown field networking.transparentProxying.redirectPort"
                ),
            ]
        );
        // Any other problem stays an error, named after the fields are gone.
        let bad = STALE.replace("127.0.0.1", "web.local");
        let e = parse_file_with(&bad, Format::Yaml, &warn()).unwrap_err();
        assert!(e.message.contains("not an IP literal"), "{e}");
        assert!(!e.message.contains("unknown field"), "{e}");
    }

    #[test]
    fn unknown_fields_in_json_and_the_cap() {
        let json = JSON.replace("\"servicePort\"", "\"oldPort\": 1, \"servicePort\"");
        let e = parse_file(&json, Format::Json).unwrap_err();
        assert!(e.message.contains("unknown field `oldPort`"), "{e}");
        let parsed =
            parse_file_with(&json, Format::Json, &warn()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            parsed.dataplanes,
            parse_file(JSON, Format::Json).unwrap().dataplanes
        );
        let (line, message) = messages(&parsed)[0];
        assert_eq!(line, e.line);
        assert!(
            message.starts_with("document 1: unknown field networking.inbound[0].oldPort ignored"),
            "{message}"
        );
        // Past the cap, the document is refused.
        let many: String = (0..=MAX_UNKNOWN_FIELDS)
            .map(|i| format!("x{i}: 1\n"))
            .collect();
        let text = format!("{many}{}", STALE.replace("# ", "#"));
        let e = parse_file_with(&text, Format::Yaml, &warn()).unwrap_err();
        assert!(e.message.contains("more than 32 unknown fields"), "{e}");
        let fewer: String = (0..MAX_UNKNOWN_FIELDS - 1)
            .map(|i| format!("x{i}: 1\n"))
            .collect();
        let parsed = parse_file_with(&format!("{fewer}{STALE}"), Format::Yaml, &warn()).unwrap();
        assert_eq!(parsed.warnings.len(), MAX_UNKNOWN_FIELDS);
    }

    #[test]
    fn an_inbound_without_a_service_tag_is_a_warning() {
        let text = "type: Dataplane\nmesh: shop\nname: web-01\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {kuma.io/service: web}\n  - port: 10002\n    servicePort: 8081\n    tags: {version: v1}\n  - port: 10003\n    servicePort: 8082\n    state: Ignored\n";
        let parsed = parse_file(text, Format::Yaml).unwrap();
        assert_eq!(
            messages(&parsed),
            [(None, "dataplane shop.web-01: networking.inbound[1] (port 10002) has no kuma.io/service tag: it counts in no service (GET /api/v1/services) and in no EDS cluster, whatever its health; add tags: {kuma.io/service: <service name>}")]
        );
        // The fixtures all have one.
        assert!(yaml(MIXED).warnings.is_empty());
    }

    #[test]
    fn several_documents_and_empty_ones() {
        let text = format!("{WEB}\n---\n---\n{}", WEB.replace("web-01", "web-02"));
        let dps = parse_documents(&text).unwrap();
        assert_eq!(dps.len(), 2);
        assert_eq!(dps[1].id.name, "web-02");
        assert!(parse_documents("").unwrap().is_empty());
    }

    #[test]
    fn other_resource_types_are_skipped_and_listed() {
        let parsed = yaml(MIXED);
        let names: Vec<String> = parsed.dataplanes.iter().map(|d| d.id.to_string()).collect();
        assert_eq!(names, ["default.backend-01", "default.frontend-01"]);
        let ignored: Vec<(usize, &str, Option<&str>)> = parsed
            .ignored
            .iter()
            .map(|d| (d.document, d.kind.as_str(), d.name.as_deref()))
            .collect();
        assert_eq!(
            ignored,
            [
                (1, "Mesh", Some("default")),
                (3, "MeshTrafficPermission", Some("allow-all")),
                (5, "MeshHealthCheck", Some("backend-hc")),
            ]
        );
        // parse_documents keeps only the dataplanes.
        assert_eq!(parse_documents(MIXED).unwrap(), parsed.dataplanes);
    }

    #[test]
    fn a_document_without_type_is_an_error() {
        let e = parse_file(NO_TYPE, Format::Yaml).unwrap_err();
        assert!(
            e.message.contains("document 1: missing field `type`"),
            "{e}"
        );
        let k8s = "apiVersion: kuma.io/v1alpha1\nkind: Dataplane\nmetadata: {name: a}\n";
        let e = parse_file(k8s, Format::Yaml).unwrap_err();
        assert!(
            e.message.contains("Kubernetes manifest (kind: Dataplane)"),
            "{e}"
        );
        let e = parse_file("- a\n- b\n", Format::Yaml).unwrap_err();
        assert!(e.message.contains("a Kuma resource"), "{e}");
    }

    #[test]
    fn typo_names_key_and_line_in_a_mixed_file() {
        let e = parse_file(TYPO, Format::Yaml).unwrap_err();
        assert!(e.message.contains("document 2"), "{e}");
        assert!(e.message.contains("unknown field `protocl`"), "{e}");
        assert!(e.message.contains("networking.inbound[0]"), "{e}");
        assert_eq!(e.line, Some(12), "the key's line: {e}");
    }

    #[test]
    fn json_form() {
        let parsed = parse_file(JSON, Format::Json).unwrap_or_else(|e| panic!("{e}"));
        let dp = &parsed.dataplanes[0];
        assert_eq!(dp.id.to_string(), "default.json-01");
        assert_eq!(dp.inbounds[0].name.as_deref(), Some("main"));
        assert_eq!(
            dp.inbounds[0].probe.as_ref().unwrap().interval,
            Some(Duration::from_secs(2))
        );
        // The same dataplane as its YAML form.
        let value: serde_json::Value = serde_json::from_str(JSON).unwrap();
        let as_yaml = serde_yaml_ng::to_string(&value).unwrap();
        assert_eq!(yaml(&as_yaml).dataplanes, parsed.dataplanes);
        // Several objects in one file, other types skipped.
        let stream = format!("{{\"type\": \"Mesh\", \"name\": \"default\"}}\n{JSON}");
        let parsed = parse_file(&stream, Format::Json).unwrap();
        assert_eq!(parsed.dataplanes.len(), 1);
        assert_eq!(parsed.ignored[0].kind, "Mesh");
    }

    #[test]
    fn json_errors_name_the_path_and_the_line() {
        let text = format!(
            "{{\"type\": \"Mesh\", \"name\": \"default\"}}\n{}",
            JSON.replace("\"servicePort\"", "\"servicePrt\"")
        );
        let e = parse_file(&text, Format::Json).unwrap_err();
        assert!(e.message.contains("document 2"), "{e}");
        assert!(e.message.contains("networking.inbound[0]"), "{e}");
        assert!(e.message.contains("unknown field `servicePrt`"), "{e}");
        assert_eq!(e.line, Some(12), "the key's line: {e}");
        let e = parse_file("{\"type\": \"Dataplane\",", Format::Json).unwrap_err();
        assert_eq!(e.line, Some(1), "{e}");
    }

    #[test]
    fn a_template_must_be_rendered_first() {
        let e = parse_file(TEMPLATE, Format::Yaml).unwrap_err();
        assert_eq!(e.line, Some(5), "{e}");
        assert!(
            e.message.contains("{{ name }} is a template placeholder"),
            "{e}"
        );
        assert!(e.message.contains("render it first"), "{e}");
        // Quoted or not, in JSON too.
        let json = JSON.replace("\"127.0.0.1\"", "\"{{ address }}\"");
        let e = parse_file(&json, Format::Json).unwrap_err();
        assert!(e.message.contains("{{ address }}"), "{e}");
        // Braces that are not a placeholder are left to the parser.
        assert!(find_template("tags: {a: {b: c}}\n# {{ commented }}\n").is_none());
    }

    #[test]
    fn format_by_extension() {
        use std::path::Path;
        assert_eq!(Format::of_path(Path::new("a.yaml")), Some(Format::Yaml));
        assert_eq!(Format::of_path(Path::new("a.yml")), Some(Format::Yaml));
        assert_eq!(Format::of_path(Path::new("a.json")), Some(Format::Json));
        assert_eq!(Format::of_path(Path::new("a.txt")), None);
    }
}
