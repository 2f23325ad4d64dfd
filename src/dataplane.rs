//! Dataplanes: Kuma's universal `Dataplane` resource, parsed from YAML or JSON.
//!
//! A file may hold several resources (`kumactl apply -f` style): documents
//! whose `type` is not `Dataplane` are skipped and listed as ignored. Fields
//! Kuma defines but hdsd does not use are accepted and ignored; any other key
//! is an error that names the key and its line. Addresses must be IP literals:
//! Envoy may crash on a hostname in an HDS endpoint.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::time::Duration;

use serde::de::{Error as _, IgnoredAny};
use serde::{Deserialize, Deserializer, Serialize};

use crate::probe::{
    one_kind, Check, GrpcCheck, HttpCheck, Payload, ProbeSettings, StatusRange, TcpCheck,
};

mod documents;
pub use documents::{reparse_file, Documents, Reparsed};

/// `<mesh>.<name>`: the identity of a dataplane, and Envoy's `node.id`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct DataplaneId {
    pub mesh: String,
    pub name: String,
}

impl DataplaneId {
    /// An identity from parts already known to be valid (they come from a
    /// parsed dataplane or a verified token). Input from users goes through
    /// [`DataplaneId::try_new`] or `parse`.
    pub fn new(mesh: impl Into<String>, name: impl Into<String>) -> Self {
        DataplaneId {
            mesh: mesh.into(),
            name: name.into(),
        }
    }

    /// The identity `mesh.name`, validated by [`crate::names`]' rules (as
    /// Kuma's): the mesh a DNS-1123 label (no dot: the node id is
    /// `<mesh>.<name>`), the name lowercase letters, digits, '-', '_' and
    /// '.', at most 253 characters. Every name that enters hdsd (files,
    /// the API, tokens, HDS node ids) comes through here.
    pub fn try_new(
        mesh: impl Into<String>,
        name: impl Into<String>,
    ) -> Result<DataplaneId, BadIdentity> {
        let (mesh, name) = (mesh.into(), name.into());
        crate::names::check_mesh(&mesh).map_err(BadIdentity)?;
        crate::names::check_name(&name).map_err(BadIdentity)?;
        Ok(DataplaneId { mesh, name })
    }
}

/// Why a mesh and name cannot form a dataplane identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadIdentity(pub String);

impl fmt::Display for DataplaneId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.mesh, self.name)
    }
}

/// A node id that is not `<mesh>.<name>` with a valid mesh and name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadNodeId {
    #[error("node id {0:?} is not of the form <mesh>.<name> (e.g. default.web-01); set node.id in the Envoy bootstrap")]
    Form(String),
    #[error("node id {id:?}: {why}; set node.id in the Envoy bootstrap")]
    Name { id: String, why: String },
}

impl FromStr for DataplaneId {
    type Err = BadNodeId;

    /// Splits on the first dot (Kuma's convention: the name may contain dots).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mesh, name) = s
            .split_once('.')
            .ok_or_else(|| BadNodeId::Form(s.to_string()))?;
        DataplaneId::try_new(mesh, name).map_err(|e| BadNodeId::Name {
            id: s.to_string(),
            why: e.0,
        })
    }
}

/// One Envoy and the inbounds (application ports) it fronts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dataplane {
    pub id: DataplaneId,
    pub address: IpAddr,
    pub inbounds: Vec<Inbound>,
    /// `networking.gateway`: a gateway dataplane (usually without inbounds).
    pub gateway: Option<GatewayType>,
    /// `networking.listeners`: a zone proxy's listeners (never probed).
    pub listeners: Vec<Listener>,
    /// `networking.admin.port`: the Envoy's admin port on its loopback.
    pub admin_port: Option<u16>,
}

/// What a dataplane is, for display: hdsd probes inbounds whatever the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataplaneKind {
    /// A sidecar next to an application (the classic shape).
    Sidecar,
    /// `networking.gateway` is set.
    Gateway,
    /// `networking.listeners` declares zone ingress / egress listeners.
    ZoneProxy,
}

impl DataplaneKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DataplaneKind::Sidecar => "sidecar",
            DataplaneKind::Gateway => "gateway",
            DataplaneKind::ZoneProxy => "zone_proxy",
        }
    }
}

impl Dataplane {
    pub fn kind(&self) -> DataplaneKind {
        if !self.listeners.is_empty() {
            DataplaneKind::ZoneProxy
        } else if self.gateway.is_some() {
            DataplaneKind::Gateway
        } else {
            DataplaneKind::Sidecar
        }
    }
}

/// `networking.gateway.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatewayType {
    Delegated,
    Builtin,
}

/// One entry of `networking.listeners` (a mesh-scoped zone proxy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listener {
    /// `ZoneIngress` or `ZoneEgress`.
    #[serde(rename = "type")]
    pub kind: String,
    pub port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `networking.inbound[].state`, as the user declared it.
///
/// - `Ready` (the default): probed; ready when its checks pass.
/// - `NotReady`: still probed (the status shows what Envoy sees), but the
///   inbound reads not ready whatever the reports say.
/// - `Ignored`: not probed and left out of readiness: the API shows its
///   status as `ignored` and it never holds its dataplane back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub enum InboundState {
    #[default]
    Ready,
    NotReady,
    Ignored,
}

impl InboundState {
    const NAMES: [&'static str; 3] = ["Ready", "NotReady", "Ignored"];

    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    pub fn is_default(&self) -> bool {
        *self == InboundState::Ready
    }
}

impl<'de> Deserialize<'de> for InboundState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match proto_enum(d, "state", &InboundState::NAMES)? {
            0 => Ok(InboundState::Ready),
            1 => Ok(InboundState::NotReady),
            _ => Ok(InboundState::Ignored),
        }
    }
}

impl<'de> Deserialize<'de> for GatewayType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match proto_enum(d, "gateway type", &["DELEGATED", "BUILTIN"])? {
            0 => Ok(GatewayType::Delegated),
            _ => Ok(GatewayType::Builtin),
        }
    }
}

/// A protobuf enum as Kuma reads it: by name, or by number.
fn proto_enum<'de, D: Deserializer<'de>>(
    d: D,
    what: &'static str,
    names: &'static [&'static str],
) -> Result<usize, D::Error> {
    struct Visitor {
        what: &'static str,
        names: &'static [&'static str],
    }
    impl Visitor {
        fn bad<E: serde::de::Error>(&self, value: &dyn fmt::Display) -> E {
            E::custom(format!(
                "{} {value} is not one of {}",
                self.what,
                self.names.join(", ")
            ))
        }
    }
    impl serde::de::Visitor<'_> for Visitor {
        type Value = usize;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "one of {}", self.names.join(", "))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<usize, E> {
            self.names
                .iter()
                .position(|n| *n == v)
                .ok_or_else(|| self.bad(&format_args!("{v:?}")))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<usize, E> {
            usize::try_from(v)
                .ok()
                .filter(|i| *i < self.names.len())
                .ok_or_else(|| self.bad(&v))
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<usize, E> {
            match u64::try_from(v) {
                Ok(u) => self.visit_u64(u),
                Err(_) => Err(self.bad(&v)),
            }
        }
    }
    d.deserialize_any(Visitor { what, names })
}

/// One application port behind the dataplane's Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inbound {
    /// Envoy's public port for this inbound.
    pub port: u16,
    /// The inbound's own address (defaults to `networking.address`).
    pub address: IpAddr,
    /// Where the application listens: the probe target.
    pub service_address: IpAddr,
    pub service_port: u16,
    pub tags: BTreeMap<String, String>,
    /// Per-inbound overrides of the check defaults, from `serviceProbe`.
    pub probe: Option<ProbeOverrides>,
    /// Kuma's `name`: another way to refer to this port.
    pub name: Option<String>,
    /// Kuma's `state`: `Ignored` inbounds are not probed.
    pub state: InboundState,
}

/// The fields of `serviceProbe`; unset fields take the server's defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ProbeOverrides {
    pub interval: Option<Duration>,
    pub timeout: Option<Duration>,
    pub no_traffic_interval: Option<Duration>,
    pub healthy_threshold: Option<u32>,
    pub unhealthy_threshold: Option<u32>,
    /// `http:`, `grpc:` or `tcp:`; unset: the server's default check (`hds.check.kind`).
    pub check: Option<Check>,
    /// Probe this port instead of `servicePort`.
    pub port: Option<u16>,
    /// Probe this address instead of `serviceAddress`.
    pub address: Option<IpAddr>,
}

impl ProbeOverrides {
    /// The effective settings: overrides on top of `defaults`. A `serviceProbe`
    /// that sets `interval` but not `noTrafficInterval` gets its own interval
    /// as the no-traffic interval.
    pub fn apply(&self, defaults: &ProbeSettings) -> ProbeSettings {
        let interval = self.interval.unwrap_or(defaults.interval);
        ProbeSettings {
            interval,
            timeout: self.timeout.unwrap_or(defaults.timeout),
            no_traffic_interval: self.no_traffic_interval.unwrap_or(match self.interval {
                Some(i) => i,
                None => defaults.no_traffic_interval,
            }),
            healthy_threshold: self.healthy_threshold.unwrap_or(defaults.healthy_threshold),
            unhealthy_threshold: self
                .unhealthy_threshold
                .unwrap_or(defaults.unhealthy_threshold),
        }
    }
}

/// Why a document could not be turned into a dataplane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line, when the parser knows it.
    pub line: Option<usize>,
    pub message: String,
    /// The limit the file went past, when that is the problem.
    pub limit: Option<Limit>,
}

/// A limit a dataplane file can go past: the `limit` label of
/// `hdsd_dataplane_file_limit_hits_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// Not a regular file (a FIFO, a device, a socket, or a symlink to one).
    NotRegularFile,
    /// Larger than `dataplanes.max_file_size`.
    FileSize,
    /// YAML nested deeper than `dataplanes.max_nesting`.
    Nesting,
    /// More YAML aliases than `dataplanes.max_aliases`.
    Aliases,
    /// YAML aliases that expand the file past `dataplanes.max_file_size`.
    Expansion,
    /// A dataplane with more inbounds than `dataplanes.max_inbounds`.
    Inbounds,
    /// An inbound with more tags than `dataplanes.max_tags`.
    Tags,
}

impl Limit {
    pub const ALL: [Limit; 7] = [
        Limit::NotRegularFile,
        Limit::FileSize,
        Limit::Nesting,
        Limit::Aliases,
        Limit::Expansion,
        Limit::Inbounds,
        Limit::Tags,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Limit::NotRegularFile => "not_regular_file",
            Limit::FileSize => "file_size",
            Limit::Nesting => "nesting",
            Limit::Aliases => "aliases",
            Limit::Expansion => "alias_expansion",
            Limit::Inbounds => "inbounds",
            Limit::Tags => "tags",
        }
    }
}

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
}

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits {
            max_file_size: 1024 * 1024,
            max_nesting: 32,
            max_aliases: 64,
            max_inbounds: 4096,
            max_tags: 64,
        }
    }
}

impl ParseError {
    fn limit(limit: Limit, line: Option<usize>, message: String) -> ParseError {
        ParseError {
            line,
            message,
            limit: Some(limit),
        }
    }
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
struct YamlSize {
    aliases: usize,
    expanded: u64,
    documents: usize,
}

fn scan_yaml(text: &str, limits: &FileLimits) -> Result<YamlSize, ParseError> {
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
fn check_sizes(dp: &Dataplane, limits: &FileLimits) -> Result<(), ParseError> {
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

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

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

/// Everything one file holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedFile {
    pub dataplanes: Vec<Dataplane>,
    pub ignored: Vec<IgnoredDocument>,
}

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
            parse_yaml(text, &mut out)?
        }
        Format::Json => parse_json(text, &mut out)?,
    }
    for dp in &out.dataplanes {
        check_sizes(dp, limits)?;
    }
    Ok(out)
}

fn parse_yaml(text: &str, out: &mut ParsedFile) -> Result<(), ParseError> {
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
    for (index, (document, header)) in serde_yaml_ng::Deserializer::from_str(text)
        .zip(headers)
        .enumerate()
    {
        if !classify(index, header, out)? {
            continue;
        }
        let doc = DataplaneDoc::deserialize(document).map_err(|e| ParseError {
            limit: None,
            line: e.location().map(|l| l.line()),
            message: format!("document {}: {}", index + 1, strip_location(&e.to_string())),
        })?;
        add(index, doc, out)?;
    }
    Ok(())
}

fn parse_json(text: &str, out: &mut ParsedFile) -> Result<(), ParseError> {
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
    while let Some(header) = stream.next() {
        let header = header.map_err(|e| json_error(index, 1, &e, String::new()))?;
        let end = stream.byte_offset();
        let slice = &text[start..end];
        let first_line = 1 + text[..start].matches('\n').count();
        start = end;
        if classify(index, Some(header), out)? {
            let mut de = serde_json::Deserializer::from_str(slice);
            let doc: DataplaneDoc = serde_path_to_error::deserialize(&mut de).map_err(|e| {
                let path = e.path().to_string();
                let path = if path == "." {
                    String::new()
                } else {
                    format!("{path}: ")
                };
                json_error(index, first_line, e.inner(), path)
            })?;
            add(index, doc, out)?;
        }
        index += 1;
    }
    Ok(())
}

/// Sorts a document by its `type`: `Ok(true)` for a dataplane, `Ok(false)`
/// for an empty or ignored document.
fn classify(
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
fn find_template(text: &str) -> Option<(usize, &str)> {
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

// ---- the document shapes (Kuma's field names) ----
//
// Followed: Kuma's `api/mesh/v1alpha1/dataplane.proto` (main branch; see the
// README for the version). Kuma reads a resource with protojson, which also
// takes a field's proto name: the snake_case aliases below are those names.

/// The fields every resource has, read before deciding what a document is.
#[derive(Deserialize)]
#[serde(expecting = "a Kuma resource: a mapping with `type`, `mesh` and `name`")]
struct Header {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    name: Option<serde_json::Value>,
    /// Kubernetes manifests have `kind` instead of `type`.
    #[serde(rename = "kind", default)]
    k8s_kind: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct DataplaneDoc {
    #[serde(rename = "type")]
    kind: String,
    mesh: String,
    name: String,
    networking: NetworkingDoc,
    // Defined by Kuma, unused by hdsd.
    #[serde(default)]
    labels: Option<IgnoredAny>,
    #[serde(default)]
    creation_time: Option<IgnoredAny>,
    #[serde(default)]
    modification_time: Option<IgnoredAny>,
    /// Kuma's resource identifier (`kri_...`), set by the control plane.
    #[serde(default)]
    kri: Option<IgnoredAny>,
    #[serde(default)]
    metrics: Option<IgnoredAny>,
    #[serde(default)]
    probes: Option<IgnoredAny>,
    #[serde(default)]
    envoy: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct NetworkingDoc {
    address: IpLiteral,
    #[serde(default)]
    inbound: Vec<InboundDoc>,
    #[serde(default)]
    gateway: Option<GatewayDoc>,
    #[serde(default)]
    listeners: Vec<ListenerDoc>,
    // Defined by Kuma, unused by hdsd.
    #[serde(default)]
    advertised_address: Option<IgnoredAny>,
    #[serde(default)]
    outbound: Vec<OutboundDoc>,
    #[serde(default, alias = "transparent_proxying")]
    transparent_proxying: Option<TransparentProxyingDoc>,
    #[serde(default)]
    admin: Option<AdminDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct InboundDoc {
    port: Port,
    #[serde(default)]
    service_port: Option<Port>,
    #[serde(default)]
    service_address: Option<IpLiteral>,
    #[serde(default)]
    address: Option<IpLiteral>,
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(default)]
    service_probe: Option<ServiceProbeDoc>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    state: InboundState,
    // Defined by Kuma, unused by hdsd.
    #[serde(default)]
    health: Option<HealthDoc>,
    /// The application protocol (`http`, `grpc`, `tcp`...).
    #[serde(default)]
    protocol: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct ServiceProbeDoc {
    #[serde(default, with = "humantime_serde")]
    interval: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    no_traffic_interval: Option<Duration>,
    #[serde(default)]
    healthy_threshold: Option<u32>,
    #[serde(default)]
    unhealthy_threshold: Option<u32>,
    /// Kuma's `tcp: {}` (a connect), or hdsd's payload check.
    #[serde(default)]
    tcp: Option<TcpDoc>,
    /// hdsd's extension: an HTTP check.
    #[serde(default)]
    http: Option<HttpDoc>,
    /// hdsd's extension: a grpc.health.v1 check.
    #[serde(default)]
    grpc: Option<GrpcDoc>,
    /// hdsd's extension: probe this port instead of `servicePort`.
    #[serde(default)]
    port: Option<Port>,
    /// hdsd's extension: probe this address instead of `serviceAddress`.
    #[serde(default)]
    address: Option<IpLiteral>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TcpDoc {
    #[serde(default)]
    send: Option<String>,
    #[serde(default)]
    send_hex: Option<String>,
    #[serde(default)]
    receive: Vec<String>,
    #[serde(default)]
    receive_hex: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct HttpDoc {
    path: String,
    #[serde(default)]
    host: Option<String>,
    #[serde(default)]
    expected_statuses: Vec<StatusDoc>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    http2: bool,
}

/// `200` or `"200-299"`.
#[derive(Deserialize)]
#[serde(untagged)]
enum StatusDoc {
    Code(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrpcDoc {
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    authority: Option<String>,
}

impl StatusDoc {
    fn range(self) -> Result<StatusRange, String> {
        let text = match self {
            StatusDoc::Code(n) => return Ok(StatusRange { start: n, end: n }),
            StatusDoc::Text(t) => t,
        };
        let bad = || {
            format!("http.expectedStatuses: {text:?} is neither a status (200) nor a range (\"200-299\")")
        };
        let (start, end) = text.split_once('-').unwrap_or((&text, &text));
        let start = start.trim().parse::<u64>().map_err(|_| bad())?;
        let end = end.trim().parse::<u64>().map_err(|_| bad())?;
        Ok(StatusRange { start, end })
    }
}

impl TcpDoc {
    fn check(self) -> Result<TcpCheck, String> {
        let send = match (self.send, self.send_hex) {
            (Some(_), Some(_)) => {
                return Err("tcp: set send or sendHex, not both".into());
            }
            (Some(t), None) => Some(Payload::Text(t)),
            (None, Some(h)) => Some(Payload::Hex(h)),
            (None, None) => None,
        };
        if !self.receive.is_empty() && !self.receive_hex.is_empty() {
            return Err("tcp: set receive or receiveHex, not both".into());
        }
        let receive = if self.receive_hex.is_empty() {
            self.receive.into_iter().map(Payload::Text).collect()
        } else {
            self.receive_hex.into_iter().map(Payload::Hex).collect()
        };
        Ok(TcpCheck { send, receive })
    }
}

impl ServiceProbeDoc {
    fn into_overrides(self) -> Result<ProbeOverrides, String> {
        let kinds: Vec<&str> = [
            ("http", self.http.is_some()),
            ("grpc", self.grpc.is_some()),
            ("tcp", self.tcp.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect();
        one_kind(&kinds).map_err(|e| e.to_string())?;
        let check = if let Some(http) = self.http {
            Some(Check::Http(HttpCheck {
                path: http.path,
                host: http.host,
                expected_statuses: http
                    .expected_statuses
                    .into_iter()
                    .map(StatusDoc::range)
                    .collect::<Result<_, _>>()?,
                headers: http.headers,
                http2: http.http2,
            }))
        } else if let Some(grpc) = self.grpc {
            Some(Check::Grpc(GrpcCheck {
                service: grpc.service,
                authority: grpc.authority,
            }))
        } else if let Some(tcp) = self.tcp {
            Some(Check::Tcp(tcp.check()?))
        } else {
            None
        };
        Ok(ProbeOverrides {
            interval: self.interval,
            timeout: self.timeout,
            no_traffic_interval: self.no_traffic_interval,
            healthy_threshold: self.healthy_threshold,
            unhealthy_threshold: self.unhealthy_threshold,
            check,
            port: self.port.map(|p| p.0),
            address: self.address.map(|a| a.0),
        })
    }
}

/// An IP address literal; a hostname is refused with the reason.
struct IpLiteral(IpAddr);

impl<'de> Deserialize<'de> for IpLiteral {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<IpAddr>().map(IpLiteral).map_err(|_| {
            D::Error::custom(format!(
                "address {s:?} is not an IP literal; hdsd sends only IP addresses to Envoy (a hostname can crash Envoy's HDS), so write the IPv4 or IPv6 address"
            ))
        })
    }
}

/// A TCP port, 1..=65535.
struct Port(u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let n = u64::deserialize(d)?;
        match u16::try_from(n) {
            Ok(p) if p != 0 => Ok(Port(p)),
            _ => Err(D::Error::custom(format!(
                "port {n} is out of range; use 1-65535"
            ))),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct HealthDoc {
    #[serde(default)]
    ready: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct GatewayDoc {
    #[serde(default)]
    tags: BTreeMap<String, String>,
    #[serde(rename = "type", default)]
    kind: Option<GatewayType>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct ListenerDoc {
    #[serde(rename = "type")]
    kind: String,
    port: Port,
    #[serde(default)]
    address: Option<IgnoredAny>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    state: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct OutboundDoc {
    #[serde(default)]
    address: Option<IgnoredAny>,
    #[serde(default)]
    port: Option<IgnoredAny>,
    #[serde(default)]
    tags: Option<IgnoredAny>,
    /// Deprecated by Kuma in favour of `tags`.
    #[serde(default)]
    service: Option<IgnoredAny>,
    #[serde(default, alias = "backend_ref")]
    backend_ref: Option<BackendRefDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct BackendRefDoc {
    #[serde(default)]
    kind: Option<IgnoredAny>,
    #[serde(default)]
    name: Option<IgnoredAny>,
    #[serde(default)]
    namespace: Option<IgnoredAny>,
    #[serde(default)]
    port: Option<IgnoredAny>,
    #[serde(default)]
    labels: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct TransparentProxyingDoc {
    #[serde(default, alias = "redirect_port_inbound")]
    redirect_port_inbound: Option<IgnoredAny>,
    #[serde(default, alias = "redirect_port_outbound")]
    redirect_port_outbound: Option<IgnoredAny>,
    /// Removed by Kuma (one port for IPv4 and IPv6); older files still have it.
    #[serde(default, alias = "redirect_port_inbound_v6")]
    redirect_port_inbound_v6: Option<IgnoredAny>,
    #[serde(default, alias = "direct_access_services")]
    direct_access_services: Option<IgnoredAny>,
    #[serde(default, alias = "reachable_services")]
    reachable_services: Option<IgnoredAny>,
    #[serde(default, alias = "ip_family_mode")]
    ip_family_mode: Option<IgnoredAny>,
    #[serde(default, alias = "reachable_backends")]
    reachable_backends: Option<ReachableBackendsDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct ReachableBackendsDoc {
    #[serde(default)]
    refs: Vec<BackendRefDoc>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Kuma's fields that hdsd accepts and ignores are never read.
struct AdminDoc {
    #[serde(default)]
    port: Option<Port>,
}

impl DataplaneDoc {
    fn into_dataplane(self) -> Result<Dataplane, String> {
        if self.kind != "Dataplane" {
            return Err(format!(
                "type is {:?}; only `type: Dataplane` documents belong in the dataplanes directory",
                self.kind
            ));
        }
        let id = DataplaneId::try_new(self.mesh, self.name).map_err(|e| e.0)?;
        let address = self.networking.address.0;
        let mut inbounds: Vec<Inbound> = Vec::with_capacity(self.networking.inbound.len());
        for (i, doc) in self.networking.inbound.into_iter().enumerate() {
            let inbound_address = doc.address.map(|a| a.0).unwrap_or(address);
            if let Some(other) = inbounds
                .iter()
                .position(|o| o.address == inbound_address && o.port == doc.port.0)
            {
                return Err(format!(
                    "{id}: networking.inbound[{i}] repeats address {inbound_address} port {} of networking.inbound[{other}]; each inbound needs its own port",
                    doc.port.0
                ));
            }
            inbounds.push(Inbound {
                port: doc.port.0,
                address: inbound_address,
                service_address: doc.service_address.map(|a| a.0).unwrap_or(inbound_address),
                service_port: doc.service_port.map(|p| p.0).unwrap_or(doc.port.0),
                tags: doc.tags,
                probe: doc
                    .service_probe
                    .map(ServiceProbeDoc::into_overrides)
                    .transpose()
                    .map_err(|e| format!("{id}: networking.inbound[{i}].serviceProbe: {e}"))?,
                name: doc.name.filter(|n| !n.is_empty()),
                state: doc.state,
            });
        }
        let listeners = self
            .networking
            .listeners
            .into_iter()
            .map(|l| Listener {
                kind: l.kind,
                port: l.port.0,
                name: l.name.filter(|n| !n.is_empty()),
            })
            .collect();
        Ok(Dataplane {
            id,
            address,
            inbounds,
            gateway: self
                .networking
                .gateway
                .map(|g| g.kind.unwrap_or(GatewayType::Delegated)),
            listeners,
            admin_port: self.networking.admin.and_then(|a| a.port).map(|p| p.0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WEB: &str = r#"
type: Dataplane
mesh: default
name: web-01
labels: {team: a}
networking:
  address: 192.168.0.10
  advertisedAddress: 10.0.0.1
  inbound:
  - port: 10001
    servicePort: 8080
    serviceAddress: 127.0.0.1
    tags: {kuma.io/service: web}
    serviceProbe:
      interval: 2s
      timeout: 1s
      healthyThreshold: 1
      unhealthyThreshold: 2
      tcp: {}
  - port: 10002
    tags: {kuma.io/service: admin}
  outbound:
  - port: 33033
    tags: {kuma.io/service: db}
  transparentProxying: {redirectPortInbound: 15006}
"#;

    #[test]
    fn parses_kuma_dataplane() {
        let dps = parse_documents(WEB).unwrap();
        assert_eq!(dps.len(), 1);
        let dp = &dps[0];
        assert_eq!(dp.id.to_string(), "default.web-01");
        assert_eq!(dp.inbounds.len(), 2);
        let a = &dp.inbounds[0];
        assert_eq!((a.port, a.service_port), (10001, 8080));
        assert_eq!(a.service_address.to_string(), "127.0.0.1");
        assert_eq!(
            a.probe.as_ref().unwrap().interval,
            Some(Duration::from_secs(2))
        );
        let b = &dp.inbounds[1];
        assert_eq!(b.service_port, 10002, "servicePort defaults to port");
        assert_eq!(
            b.service_address.to_string(),
            "192.168.0.10",
            "serviceAddress defaults to networking.address"
        );
        assert!(b.probe.is_none());
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
    fn unknown_key_names_key_and_line() {
        let text = WEB.replace("    tags: {kuma.io/service: admin}", "    tagz: {a: b}");
        let e = parse_documents(&text).unwrap_err();
        assert!(e.message.contains("unknown field `tagz`"), "{e}");
        // The parser points at the mapping that holds the key; the message names the path.
        assert_eq!(e.line, Some(21), "{e}");
        assert!(e.message.contains("networking.inbound[1]"), "{e}");
    }

    #[test]
    fn hostname_is_rejected_with_line() {
        let text = WEB.replace("serviceAddress: 127.0.0.1", "serviceAddress: localhost");
        let e = parse_documents(&text).unwrap_err();
        assert!(
            e.message.contains("\"localhost\" is not an IP literal"),
            "{e}"
        );
        assert_eq!(e.line, Some(10), "the inbound's line");
        assert!(e.message.contains("networking.inbound[0]:"), "{e}");
    }

    #[test]
    fn ipv6_is_accepted() {
        let text = WEB.replace("serviceAddress: 127.0.0.1", "serviceAddress: \"::1\"");
        let dps = parse_documents(&text).unwrap();
        assert_eq!(dps[0].inbounds[0].service_address.to_string(), "::1");
    }

    #[test]
    fn semantic_errors() {
        for (from, to, expect) in [
            (
                "mesh: default",
                "mesh: Default",
                "a mesh is lowercase letters",
            ),
            (
                "name: web-01",
                "name: Web_01",
                "a dataplane name is lowercase letters",
            ),
            ("mesh: default", "mesh: a.b", "no dot"),
            ("name: web-01", "name: \"\"", "name must not be empty"),
            ("type: Dataplane", "type: \"\"", "`type` is empty"),
            (
                "port: 10002",
                "port: 10001",
                "each inbound needs its own port",
            ),
            ("port: 10002", "port: 70000", "port 70000 is out of range"),
        ] {
            let e = parse_documents(&WEB.replace(from, to)).unwrap_err();
            assert!(e.message.contains(expect), "{from} -> {to}: {e}");
        }
        let twice = format!("{WEB}\n---\n{WEB}");
        assert!(parse_documents(&twice)
            .unwrap_err()
            .message
            .contains("defined twice"));
    }

    const PROBES: &str = r#"
type: Dataplane
mesh: default
name: web-01
networking:
  address: 127.0.0.1
  admin: {port: 9901}
  inbound:
  - port: 10001
    servicePort: 8080
    serviceProbe:
      http:
        path: /healthz
        host: web.internal
        expectedStatuses: [200, "300-302", "204"]
        headers: {X-Probe: hdsd}
        http2: true
      port: 8081
      address: 127.0.0.2
  - port: 10002
    serviceProbe:
      grpc: {service: shop.Cart, authority: cart.internal}
  - port: 10003
    serviceProbe:
      tcp: {send: "PING\r\n", receive: ["PONG"]}
  - port: 10004
    serviceProbe:
      tcp: {sendHex: "50494e47", receiveHex: ["504f4e47", "0d0a"]}
  - port: 10005
    serviceProbe: {interval: 3s}
"#;

    #[test]
    fn parses_probe_kinds_port_address_and_admin() {
        let dp = parse_documents(PROBES).unwrap().remove(0);
        assert_eq!(dp.admin_port, Some(9901));
        let probe = |i: usize| dp.inbounds[i].probe.clone().unwrap();
        let web = probe(0);
        assert_eq!(web.port, Some(8081));
        assert_eq!(web.address, Some("127.0.0.2".parse().unwrap()));
        let mut headers = BTreeMap::new();
        headers.insert("X-Probe".to_string(), "hdsd".to_string());
        assert_eq!(
            web.check,
            Some(Check::Http(HttpCheck {
                path: "/healthz".into(),
                host: Some("web.internal".into()),
                expected_statuses: vec![
                    StatusRange {
                        start: 200,
                        end: 200
                    },
                    StatusRange {
                        start: 300,
                        end: 302
                    },
                    StatusRange {
                        start: 204,
                        end: 204
                    },
                ],
                headers,
                http2: true,
            }))
        );
        assert_eq!(
            probe(1).check,
            Some(Check::Grpc(GrpcCheck {
                service: Some("shop.Cart".into()),
                authority: Some("cart.internal".into()),
            }))
        );
        assert_eq!(
            probe(2).check,
            Some(Check::Tcp(TcpCheck {
                send: Some(Payload::Text("PING\r\n".into())),
                receive: vec![Payload::Text("PONG".into())],
            }))
        );
        assert_eq!(
            probe(3).check,
            Some(Check::Tcp(TcpCheck {
                send: Some(Payload::Hex("50494e47".into())),
                receive: vec![Payload::Hex("504f4e47".into()), Payload::Hex("0d0a".into())],
            }))
        );
        let timing = probe(4);
        assert_eq!(
            (timing.check, timing.port, timing.address),
            (None, None, None)
        );
        // Kuma's `tcp: {}` is a connect-only TCP check.
        let kuma = parse_documents(WEB).unwrap().remove(0);
        assert_eq!(
            kuma.inbounds[0].probe.as_ref().unwrap().check,
            Some(Check::default())
        );
        assert_eq!(kuma.admin_port, None);
    }

    #[test]
    fn probe_shape_errors() {
        for (from, to, expect) in [
            (
                "      grpc: {service: shop.Cart, authority: cart.internal}",
                "      grpc: {service: shop.Cart}\n      tcp: {}",
                "default.web-01: networking.inbound[1].serviceProbe: set exactly one of http, grpc, tcp (found grpc and tcp)",
            ),
            (
                "{send: \"PING\\r\\n\", receive",
                "{send: \"PING\", sendHex: \"50\", receive",
                "networking.inbound[2].serviceProbe: tcp: set send or sendHex, not both",
            ),
            (
                "receiveHex: [",
                "receive: [\"a\"], receiveHex: [",
                "networking.inbound[3].serviceProbe: tcp: set receive or receiveHex, not both",
            ),
            (
                "\"300-302\"",
                "\"3xx\"",
                "networking.inbound[0].serviceProbe: http.expectedStatuses: \"3xx\" is neither a status (200) nor a range (\"200-299\")",
            ),
            ("port: 8081", "port: 0", "port 0 is out of range; use 1-65535"),
            (
                "address: 127.0.0.2",
                "address: web.local",
                "\"web.local\" is not an IP literal",
            ),
            ("admin: {port: 9901}", "admin: {port: 99999}", "port 99999 is out of range"),
            ("        http2: true", "        http3: true", "unknown field `http3`"),
            ("        path: /healthz\n", "", "missing field `path`"),
        ] {
            assert!(PROBES.contains(from), "{from}");
            let e = parse_documents(&PROBES.replace(from, to)).unwrap_err();
            assert!(e.message.contains(expect), "{from} -> {to}: {e}");
        }
    }

    #[test]
    fn node_id_splits_on_first_dot() {
        let id: DataplaneId = "default.web.eu-1".parse().unwrap();
        assert_eq!(
            (id.mesh.as_str(), id.name.as_str()),
            ("default", "web.eu-1")
        );
        for bad in ["", "default", "default.", ".web", "Def.web"] {
            assert!(bad.parse::<DataplaneId>().is_err(), "{bad}");
        }
    }

    #[test]
    fn identity_from_parts_is_validated() {
        let id = DataplaneId::try_new("default", "web.eu-1").unwrap();
        assert_eq!(id.to_string(), "default.web.eu-1");
        assert_eq!(id, "default.web.eu-1".parse().unwrap());
        for (mesh, name, why) in [
            ("", "web", "mesh must not be empty"),
            ("de.fault", "web", "contains '.'"),
            ("Default", "web", "contains 'D'"),
            ("default", "", "name must not be empty"),
            ("default", "victim\tfake-host/1", "contains '\\t'"),
            ("default", "Web", "contains 'W'"),
        ] {
            let e = DataplaneId::try_new(mesh, name).unwrap_err();
            assert!(e.to_string().contains(why), "{mesh}.{name}: {e}");
        }
    }

    #[test]
    fn overrides_apply_on_defaults() {
        let d = ProbeSettings {
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            no_traffic_interval: Duration::from_secs(3),
            healthy_threshold: 1,
            unhealthy_threshold: 2,
        };
        assert_eq!(ProbeOverrides::default().apply(&d), d);
        let o = ProbeOverrides {
            interval: Some(Duration::from_secs(5)),
            unhealthy_threshold: Some(4),
            ..Default::default()
        };
        let s = o.apply(&d);
        assert_eq!(s.no_traffic_interval, Duration::from_secs(5));
        assert_eq!(s.unhealthy_threshold, 4);
        assert_eq!(s.timeout, Duration::from_secs(1));
    }

    // ---- Kuma's current shapes (fixtures in testdata/kuma*) ----

    const MIXED: &str = include_str!("../testdata/kuma/mixed.yaml");
    const GATEWAY: &str = include_str!("../testdata/kuma/gateway.yaml");
    const ZONE_PROXY: &str = include_str!("../testdata/kuma/zone-proxy.yaml");
    const INBOUND_FIELDS: &str = include_str!("../testdata/kuma/inbound-fields.yaml");
    const JSON: &str = include_str!("../testdata/kuma/dataplane.json");
    const TEMPLATE: &str = include_str!("../testdata/kuma-invalid/template.yaml");
    const TYPO: &str = include_str!("../testdata/kuma-invalid/typo.yaml");
    const NO_TYPE: &str = include_str!("../testdata/kuma-invalid/no-type.yaml");

    fn yaml(text: &str) -> ParsedFile {
        parse_file(text, Format::Yaml).unwrap_or_else(|e| panic!("{e}"))
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
    fn gateways_have_no_inbounds_and_say_so() {
        let parsed = yaml(GATEWAY);
        let [builtin, delegated] = &parsed.dataplanes[..] else {
            panic!("{parsed:?}")
        };
        assert_eq!(builtin.gateway, Some(GatewayType::Builtin));
        assert_eq!(
            delegated.gateway,
            Some(GatewayType::Delegated),
            "the default"
        );
        for dp in [builtin, delegated] {
            assert_eq!(dp.kind(), DataplaneKind::Gateway);
            assert!(dp.inbounds.is_empty());
        }
    }

    #[test]
    fn zone_proxy_listeners() {
        let dp = yaml(ZONE_PROXY).dataplanes.remove(0);
        assert_eq!(dp.kind(), DataplaneKind::ZoneProxy);
        assert!(dp.inbounds.is_empty());
        assert_eq!(
            dp.listeners,
            [
                Listener {
                    kind: "ZoneIngress".into(),
                    port: 10001,
                    name: Some("zone-ingress-port".into())
                },
                Listener {
                    kind: "ZoneEgress".into(),
                    port: 10002,
                    name: Some("zone-egress-port".into())
                },
            ]
        );
        let typo = ZONE_PROXY.replace("    port: 10002", "    prot: 10002");
        let e = parse_file(&typo, Format::Yaml).unwrap_err();
        assert!(e.message.contains("unknown field `prot`"), "{e}");
        assert!(e.message.contains("networking.listeners[1]"), "{e}");
    }

    #[test]
    fn inbound_name_state_protocol_and_the_new_fields() {
        let dp = yaml(INBOUND_FIELDS).dataplanes.remove(0);
        assert_eq!(dp.kind(), DataplaneKind::Sidecar);
        let got: Vec<(Option<&str>, InboundState)> = dp
            .inbounds
            .iter()
            .map(|i| (i.name.as_deref(), i.state))
            .collect();
        assert_eq!(
            got,
            [
                (Some("http-port"), InboundState::Ready),
                (Some("draining"), InboundState::NotReady),
                (Some("metrics"), InboundState::Ignored),
            ]
        );
    }

    #[test]
    fn proto_names_and_enum_numbers_are_accepted_as_kuma_does() {
        let text = INBOUND_FIELDS
            .replace("redirectPortInbound:", "redirect_port_inbound:")
            .replace("ipFamilyMode: IPv4", "ip_family_mode: 2")
            .replace("state: NotReady", "state: 1");
        let dp = yaml(&text).dataplanes.remove(0);
        assert_eq!(dp.inbounds[1].state, InboundState::NotReady);
        let bad = INBOUND_FIELDS.replace("state: NotReady", "state: Draining");
        let e = parse_file(&bad, Format::Yaml).unwrap_err();
        assert!(
            e.message
                .contains("state \"Draining\" is not one of Ready, NotReady, Ignored"),
            "{e}"
        );
        assert!(e.message.contains("networking.inbound[1]"), "{e}");
    }

    #[test]
    fn typos_inside_the_new_blocks_are_errors() {
        for (from, to, key) in [
            (
                "      name: backend\n      port: 80",
                "      name: backend\n      prt: 80",
                "prt",
            ),
            (
                "    reachableBackends:",
                "    reachableBackend:",
                "reachableBackend",
            ),
            ("kri: kri_", "kir: kri_", "kir"),
            ("    port: 9901", "    prt: 9901", "prt"),
        ] {
            let text = INBOUND_FIELDS.replacen(from, to, 1);
            assert_ne!(text, INBOUND_FIELDS, "{from}");
            let e = parse_file(&text, Format::Yaml).unwrap_err();
            assert!(
                e.message.contains(&format!("unknown field `{key}`")),
                "{key}: {e}"
            );
            assert!(e.line.is_some(), "{key}: {e}");
        }
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

    fn limits() -> FileLimits {
        FileLimits {
            max_file_size: 4096,
            max_nesting: 8,
            max_aliases: 3,
            max_inbounds: 2,
            max_tags: 2,
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
