//! A new version of a YAML file parsed at the cost of its documents that
//! changed.
//!
//! A YAML stream is split into documents at each line that starts with `---`
//! followed by a blank or the line's end: YAML forbids such a line inside a
//! scalar or a collection, so the parser starts a new document there too.
//! Without directives (`%YAML`, `%TAG`), the documents of a stream are
//! independent (anchors, tags and errors belong to one document), so each
//! piece is parsed on its own, and a piece whose text is unchanged since the
//! file's last good parse keeps that parse.
//!
//! Whatever the pieces cannot settle on their own goes to the whole-file
//! parser, which gives the answer and the error message it always gave: a
//! piece that does not parse, limits over the whole file (aliases, expansion,
//! size), a dataplane defined twice, a template placeholder, directives, and
//! JSON. The pieces are only a way to get the whole-file parser's answer
//! cheaply; the fuzz target `dataplane_file` checks that they always do.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use serde::Deserialize;

use super::error::{Limit, ParseError};
use super::kuma::{DataplaneDoc, Header};
use super::limits::{check_sizes, scan_yaml, FileLimits, YamlSize};
use super::model::Dataplane;
use super::parse::{
    classify, dataplane_warnings, find_template, parse_file_with, Format, IgnoredDocument,
    ParsedFile, Warning,
};

/// A file's documents as of its last good parse, for the next version of the
/// file to reuse. It holds the file's text once; its dataplanes are shared
/// with the parse's result.
#[derive(Debug, Clone, Default)]
pub struct Documents(Option<Arc<Kept>>);

#[derive(Debug)]
struct Kept {
    text: Box<str>,
    /// The limits the pieces were checked against.
    limits: FileLimits,
    pieces: Vec<Piece>,
}

/// One piece of the stream (normally one document) and what it holds.
#[derive(Debug)]
struct Piece {
    range: Range<usize>,
    items: Vec<Item>,
    size: YamlSize,
}

#[derive(Debug, Clone)]
enum Item {
    /// An empty document (`---` alone).
    Empty,
    Dataplane(Arc<Dataplane>),
    Ignored {
        kind: String,
        name: Option<String>,
    },
}

impl Documents {
    /// Bytes of file text held.
    pub fn text_len(&self) -> usize {
        self.0.as_ref().map_or(0, |k| k.text.len())
    }

    /// Documents whose parse is kept.
    pub fn len(&self) -> usize {
        self.0
            .as_ref()
            .map_or(0, |k| k.pieces.iter().map(|p| p.items.len()).sum())
    }

    /// Whether no document is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes this cache holds for its file, the dataplanes (shared with
    /// the parse's result) left out: the text, and per document its piece,
    /// its item and the names of an ignored one. At most
    /// `dataplanes.max_kept_bytes`, or the file is refused.
    pub fn kept_bytes(&self) -> u64 {
        self.0.as_deref().map_or(0, Kept::bytes)
    }
}

impl Kept {
    fn bytes(&self) -> u64 {
        let item = |i: &Item| {
            std::mem::size_of::<Item>()
                + match i {
                    Item::Ignored { kind, name } => {
                        kind.len() + name.as_ref().map_or(0, String::len)
                    }
                    _ => 0,
                }
        };
        let pieces: usize = self
            .pieces
            .iter()
            .map(|p| std::mem::size_of::<Piece>() + p.items.iter().map(item).sum::<usize>())
            .sum();
        (std::mem::size_of::<Kept>() + self.text.len() + pieces) as u64
    }
}

impl PartialEq for Documents {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || (a.text == b.text && a.limits == b.limits),
            _ => false,
        }
    }
}

/// A file parsed by [`reparse_file`].
#[derive(Debug, Clone, Default)]
pub struct Reparsed {
    pub dataplanes: Vec<Arc<Dataplane>>,
    pub ignored: Vec<IgnoredDocument>,
    /// As [`ParsedFile::warnings`].
    pub warnings: Vec<Warning>,
    /// What the next version of the file can reuse.
    pub documents: Documents,
    /// How many pieces of the file kept their previous parse (0 when the
    /// whole-file parser answered).
    pub reused: usize,
}

/// [`parse_file_with`]'s answer for `text`, reusing the parse of every
/// document of `previous` (the file's last good parse) whose text is
/// unchanged.
pub fn reparse_file(
    text: &str,
    format: Format,
    limits: &FileLimits,
    previous: &Documents,
) -> Result<Reparsed, ParseError> {
    if format == Format::Yaml {
        if let Some(reparsed) = by_pieces(text, limits, previous) {
            let kept = reparsed.documents.kept_bytes();
            if kept > limits.max_kept_bytes {
                return Err(ParseError::limit(
                    Limit::KeptBytes,
                    None,
                    format!(
                        "the parse of this file would keep {kept} bytes (its text and {} documents), more than dataplanes.max_kept_bytes ({}); split it into several files or raise the limit",
                        reparsed.documents.len(),
                        limits.max_kept_bytes
                    ),
                ));
            }
            return Ok(reparsed);
        }
    }
    let ParsedFile {
        dataplanes,
        ignored,
        warnings,
    } = parse_file_with(text, format, limits)?;
    Ok(Reparsed {
        dataplanes: dataplanes.into_iter().map(Arc::new).collect(),
        ignored,
        warnings,
        documents: Documents::default(),
        reused: 0,
    })
}

/// The file from its pieces, or `None` when the whole-file parser must answer.
fn by_pieces(text: &str, limits: &FileLimits, previous: &Documents) -> Option<Reparsed> {
    if text.len() as u64 > limits.max_file_size
        || text.starts_with('%')
        || memchr::memmem::find(text.as_bytes(), b"\n%").is_some()
        || !plain_breaks(text)
        || find_template(text).is_some()
    {
        return None;
    }
    let kept = previous.0.as_deref().filter(|k| k.limits == *limits);
    let old: &[Piece] = kept.map_or(&[], |k| &k.pieces);
    // Old piece `j`, when its text is `new`.
    let same = |j: usize, new: &str| {
        let (kept, piece) = (kept?, old.get(j)?);
        (&kept.text[piece.range.clone()] == new).then_some(piece)
    };
    // A piece holds one document, or none (comments before the first
    // `---`): past this many, the whole-file parser refuses the file, after
    // reading no more than `max_documents` + 1 of them.
    let ranges = split(text, limits.max_documents.saturating_add(1))?;
    let mut pieces = Vec::with_capacity(ranges.len());
    let mut reused = 0;
    // The old pieces are matched in order, as a diff would: a document
    // changed, added or removed keeps every other document's parse; documents
    // moved around are parsed again.
    let mut j = 0;
    for (i, range) in ranges.iter().enumerate() {
        let new = &text[range.clone()];
        let found = if let Some(p) = same(j, new) {
            j += 1;
            Some(p)
        } else if let Some(p) = same(j + 1, new) {
            // Old piece j was removed.
            j += 2;
            Some(p)
        } else {
            // Added before old piece j, or old piece j changed.
            let added = ranges
                .get(i + 1)
                .is_some_and(|next| same(j, &text[next.clone()]).is_some());
            if !added {
                j += 1;
            }
            None
        };
        let piece = match found {
            Some(p) => {
                reused += 1;
                Piece {
                    range: range.clone(),
                    items: p.items.clone(),
                    size: p.size,
                }
            }
            None => parse_piece(text, range.clone(), limits)?,
        };
        pieces.push(piece);
    }
    let mut out = Reparsed {
        reused,
        ..Reparsed::default()
    };
    let mut size = YamlSize::default();
    let mut index = 0;
    for piece in &pieces {
        size.aliases = size.aliases.saturating_add(piece.size.aliases);
        size.expanded = size.expanded.saturating_add(piece.size.expanded);
        size.documents = size.documents.saturating_add(piece.size.documents);
        for item in &piece.items {
            index += 1;
            match item {
                Item::Empty => {}
                Item::Dataplane(dp) => out.dataplanes.push(Arc::clone(dp)),
                Item::Ignored { kind, name } => out.ignored.push(IgnoredDocument {
                    document: index,
                    kind: kind.clone(),
                    name: name.clone(),
                }),
            }
        }
    }
    let mut ids = HashSet::with_capacity(out.dataplanes.len());
    if size.aliases > limits.max_aliases
        || size.documents > limits.max_documents
        || size.expanded > limits.max_file_size
        || !out.dataplanes.iter().all(|d| ids.insert(&d.id))
    {
        return None;
    }
    // A piece with an unknown field went to the whole-file parser: only the
    // dataplanes' own warnings are left.
    out.warnings = dataplane_warnings(out.dataplanes.iter().map(|d| &**d));
    out.documents = Documents(Some(Arc::new(Kept {
        text: text.into(),
        limits: *limits,
        pieces,
    })));
    Some(out)
}

/// The byte ranges of the pieces of a YAML stream: a piece starts at the
/// text's start and at each line that starts with `---` followed by a blank
/// or a line break. A piece may hold no document (comments before the first
/// `---`) or several (after a `...`): it is parsed as a stream of its own.
/// `None` when there are more than `max` pieces (what is collected stays
/// within `max`).
fn split(text: &str, max: usize) -> Option<Vec<Range<usize>>> {
    let bytes = text.as_bytes();
    let mut starts = vec![0];
    starts.extend(
        memchr::memmem::find_iter(bytes, b"\n---")
            .map(|at| at + 1)
            .filter(|&at| matches!(bytes.get(at + 3), None | Some(b' ' | b'\t' | b'\r' | b'\n')))
            .take(max),
    );
    if starts.len() > max {
        return None;
    }
    let mut ends = starts[1..].to_vec();
    ends.push(text.len());
    Some(starts.into_iter().zip(ends).map(|(s, e)| s..e).collect())
}

/// Whether the text breaks its lines with `\n` or `\r\n` only, with no
/// byte order mark past its start. The two YAML parsers hdsd runs read
/// other breaks differently (the deserializer's also breaks at `\r`, NEL,
/// LS and PS), so such a text is left to the whole-file parser.
fn plain_breaks(text: &str) -> bool {
    let bytes = text.as_bytes();
    let other = [&b"\xc2\x85"[..], b"\xe2\x80\xa8", b"\xe2\x80\xa9"];
    memchr::memchr_iter(b'\r', bytes).all(|at| bytes.get(at + 1) == Some(&b'\n'))
        && other
            .iter()
            .all(|b| memchr::memmem::find(bytes, b).is_none())
        && memchr::memmem::find(bytes.get(3..).unwrap_or_default(), b"\xef\xbb\xbf").is_none()
}

/// Whether every line of `text` is blank or a comment: no document, to
/// either parser.
fn only_comments(text: &str) -> bool {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.lines().all(|line| {
        let line = line.trim_start_matches([' ', '\t']);
        line.is_empty() || line.starts_with('#')
    })
}

/// One piece parsed as [`super::parse::parse_yaml`] parses a file, or `None`
/// at any problem (the whole-file parser then says what it is and where).
fn parse_piece(text: &str, range: Range<usize>, limits: &FileLimits) -> Option<Piece> {
    let piece = &text[range.clone()];
    let size = scan_yaml(piece, limits).ok()?;
    let headers = serde_yaml_ng::Deserializer::from_str(piece)
        .map(|document| Option::<Header>::deserialize(document).ok())
        .collect::<Option<Vec<_>>>()?;
    // An empty stream is one empty document to the deserializer, but a piece
    // of comments before the first `---` adds no document to the file. The
    // two parsers must agree on what they read.
    let headers = match size.documents {
        0 if only_comments(piece) => Vec::new(),
        n if n > 0 && n == headers.len() => headers,
        _ => return None,
    };
    let mut items = Vec::with_capacity(headers.len());
    for (document, header) in serde_yaml_ng::Deserializer::from_str(piece).zip(headers) {
        let mut skipped = ParsedFile::default();
        let item = if classify(0, header, &mut skipped).ok()? {
            let dataplane = DataplaneDoc::deserialize(document)
                .ok()?
                .into_dataplane()
                .ok()?;
            check_sizes(&dataplane, limits).ok()?;
            Item::Dataplane(Arc::new(dataplane))
        } else {
            match skipped.ignored.pop() {
                Some(d) => Item::Ignored {
                    kind: d.kind,
                    name: d.name,
                },
                None => Item::Empty,
            }
        };
        items.push(item);
    }
    Some(Piece { range, items, size })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(name: &str, port: u16) -> String {
        format!(
            "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: {port}\n"
        )
    }

    fn fleet(count: usize, changed: Option<usize>) -> String {
        (0..count)
            .map(|i| doc(&format!("dp-{i}"), if changed == Some(i) { 9 } else { 8 }))
            .collect::<Vec<_>>()
            .join("---\n")
    }

    /// The pieces' answer is the whole-file parser's, from no previous parse
    /// and from the parse of `before`.
    fn same_as_whole(text: &str, before: &str) -> Reparsed {
        let limits = FileLimits::default();
        let whole = parse_file_with(text, Format::Yaml, &limits);
        let previous = reparse_file(before, Format::Yaml, &limits, &Documents::default())
            .map(|r| r.documents)
            .unwrap_or_default();
        let mut last = None;
        for previous in [Documents::default(), previous] {
            let got = reparse_file(text, Format::Yaml, &limits, &previous);
            match (&whole, &got) {
                (Ok(w), Ok(g)) => {
                    let dps: Vec<Dataplane> = g.dataplanes.iter().map(|d| (**d).clone()).collect();
                    assert_eq!(w.dataplanes, dps, "{text:?}");
                    assert_eq!(w.ignored, g.ignored, "{text:?}");
                    assert_eq!(w.warnings, g.warnings, "{text:?}");
                }
                (Err(w), Err(g)) => assert_eq!(w, g, "{text:?}"),
                _ => panic!("{text:?}: whole {whole:?}, pieces {got:?}"),
            }
            last = got.ok();
        }
        last.unwrap_or_default()
    }

    #[test]
    fn a_change_reparses_its_document_only() {
        let before = fleet(100, None);
        let after = fleet(100, Some(40));
        let limits = FileLimits::default();
        let first = reparse_file(&before, Format::Yaml, &limits, &Documents::default()).unwrap();
        assert_eq!(first.reused, 0);
        let next = reparse_file(&after, Format::Yaml, &limits, &first.documents).unwrap();
        assert_eq!(next.reused, 99);
        assert_eq!(next.dataplanes.len(), 100);
        assert_eq!(next.dataplanes[40].inbounds[0].service_port, 9);
        // The unchanged dataplanes are the previous parse's, shared.
        assert!(Arc::ptr_eq(&next.dataplanes[0], &first.dataplanes[0]));
        assert!(!Arc::ptr_eq(&next.dataplanes[40], &first.dataplanes[40]));
        assert_eq!(next.documents.text_len(), after.len());
        same_as_whole(&after, &before);
    }

    #[test]
    fn documents_added_or_removed_keep_the_others_parse() {
        let limits = FileLimits::default();
        let docs: Vec<String> = (0..10).map(|i| doc(&format!("dp-{i}"), 8)).collect();
        let file = |docs: &[String]| docs.join("---\n");
        let first =
            reparse_file(&file(&docs), Format::Yaml, &limits, &Documents::default()).unwrap();
        let mut added = docs.clone();
        added.insert(4, doc("new", 8));
        let r = reparse_file(&file(&added), Format::Yaml, &limits, &first.documents).unwrap();
        assert_eq!((r.reused, r.dataplanes.len()), (10, 11));
        let mut removed = docs.clone();
        removed.remove(4);
        let r = reparse_file(&file(&removed), Format::Yaml, &limits, &first.documents).unwrap();
        assert_eq!((r.reused, r.dataplanes.len()), (9, 9));
        // Moved: parsed again from there on (correct, only slower).
        let mut moved = docs.clone();
        moved.swap(2, 7);
        let r = reparse_file(&file(&moved), Format::Yaml, &limits, &first.documents).unwrap();
        assert!(r.reused >= 2, "{}", r.reused);
        same_as_whole(&file(&moved), &file(&docs));
        same_as_whole(&file(&added), &file(&docs));
        same_as_whole(&file(&removed), &file(&docs));
    }

    #[test]
    fn pieces_agree_with_the_whole_file() {
        let a = doc("a", 8);
        let b = doc("b", 8);
        let mesh = "type: Mesh\nname: default\n";
        let cases = [
            String::new(),
            "---\n".into(),
            "---\n---\n".into(),
            "# a comment\n---\n".into(),
            format!("# a comment\n---\n{a}---\n{mesh}---\n---\n{b}"),
            format!("{a}...\n---\n{b}"),
            format!("{a}...\n{b}"),
            format!("--- # the first\n{a}--- \n{b}"),
            format!("{a}---\t\n{b}"),
            format!("{a}----\n{b}"),
            format!("{a}\r\n---\r\n{b}"),
            format!("{mesh}---\n{mesh}"),
            // A block scalar holding `---` indented, and a document that is one.
            format!("{a}---\nx: |\n  ---\n  y\n"),
            format!("{a}--- |\n  text\n---\n{b}"),
            // Broken: a quoted scalar or a flow collection cut by `---`.
            format!("{a}---\nname: \"x\n---\ny\"\n"),
            format!("{a}---\nx: [1,\n---\n2]\n"),
            // Line breaks the two parsers read differently.
            format!("# a\u{2029}b: 1\n---\n{a}"),
            format!("# a\u{2029}~\n---\n{mesh}"),
            format!("# a\rb: 1\n---\n{a}"),
            format!("# a\u{85}b: 1\n---\n{a}"),
            format!("{a}---\n\u{feff}{b}"),
            format!("\u{feff}# a\n---\n{a}"),
            // Anchors belong to their document.
            "x: &v 1\n---\ny: *v\n".to_string(),
            format!(
                "{}---\n{}",
                a.replace("mesh: default", "mesh: &m default"),
                b.replace("mesh: default", "mesh: *m")
            ),
            // Defined twice, in two documents.
            format!("{a}---\n{a}"),
            // A directive, a template, a bad document, a Kubernetes manifest.
            format!("%YAML 1.2\n---\n{a}"),
            format!("{a}---\nname: {{{{ name }}}}\n"),
            format!("{a}---\nnot: a resource\n"),
            format!("{a}---\nkind: Pod\n"),
            format!("{a}---\ntype: ''\n"),
        ];
        for text in &cases {
            same_as_whole(text, "");
            same_as_whole(text, &format!("{a}---\n{b}"));
            same_as_whole(text, text);
        }
    }

    #[test]
    fn limits_over_the_whole_file_are_the_whole_files() {
        // Each document has 40 aliases, within the limit of 64; the file has 80.
        let many = |name: &str| {
            let refs: String = (0..40).map(|i| format!("  k{i}: *v\n")).collect();
            format!("type: Mesh\nname: {name}\nv: &v 1\nrefs:\n{refs}")
        };
        let text = format!("{}---\n{}", many("a"), many("b"));
        let limits = FileLimits::default();
        let e = reparse_file(&text, Format::Yaml, &limits, &Documents::default()).unwrap_err();
        assert_eq!(e.limit, Some(super::super::Limit::Aliases), "{e}");
        same_as_whole(&text, &many("a"));
        let one = format!("{}---\n---\n", many("a"));
        assert_eq!(same_as_whole(&one, "").ignored.len(), 1);
    }

    #[test]
    fn other_limits_invalidate_the_kept_parse() {
        let text = fleet(3, None);
        let limits = FileLimits::default();
        let first = reparse_file(&text, Format::Yaml, &limits, &Documents::default()).unwrap();
        let again = reparse_file(&text, Format::Yaml, &limits, &first.documents).unwrap();
        assert_eq!(again.reused, 3);
        let tighter = FileLimits {
            max_inbounds: 0,
            ..limits
        };
        let e = reparse_file(&text, Format::Yaml, &tighter, &first.documents).unwrap_err();
        assert_eq!(e.limit, Some(super::super::Limit::Inbounds), "{e}");
    }

    /// Issue 33, finding 7: 262,000 empty documents (1 MiB of `---`) kept
    /// 38 MB per file in this cache. Past `max_documents` the file is
    /// refused, by either parser, after reading no more than the limit.
    #[test]
    fn files_with_too_many_documents_are_refused() {
        let limits = FileLimits::default();
        let text = "---\n".repeat(262_000);
        assert!(text.len() as u64 <= limits.max_file_size);
        let started = std::time::Instant::now();
        let e = reparse_file(&text, Format::Yaml, &limits, &Documents::default()).unwrap_err();
        assert_eq!(e.limit, Some(Limit::Documents), "{e}");
        assert!(
            e.message
                .contains("more than 10000 documents (dataplanes.max_documents)"),
            "{e}"
        );
        // Debug build: the whole-file parser stops at the limit.
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        // Just past it: the pieces defer to the whole-file parser.
        let text = "---\n".repeat(10_001);
        let whole = parse_file_with(&text, Format::Yaml, &limits).unwrap_err();
        let pieces = reparse_file(&text, Format::Yaml, &limits, &Documents::default()).unwrap_err();
        assert_eq!(whole, pieces);
        assert_eq!(pieces.limit, Some(Limit::Documents));
        // At the limit: read, and what is kept is counted.
        let ok = reparse_file(
            &"---\n".repeat(10_000),
            Format::Yaml,
            &limits,
            &Documents::default(),
        )
        .unwrap();
        assert_eq!(ok.documents.len(), 10_000);
        assert!(
            ok.documents.kept_bytes() > 40_000,
            "{}",
            ok.documents.kept_bytes()
        );
        // JSON: a stream of values, the same limit.
        let json = "{\"type\": \"Mesh\", \"name\": \"m\"}\n".repeat(10_001);
        let e = reparse_file(&json, Format::Json, &limits, &Documents::default()).unwrap_err();
        assert_eq!(e.limit, Some(Limit::Documents), "{e}");
        assert_eq!(e.line, Some(10_001), "{e}");
    }

    /// What a file's parse keeps is bounded too: past `max_kept_bytes` the
    /// file is refused with the setting's name.
    #[test]
    fn a_parse_that_would_keep_too_much_is_refused() {
        let text = fleet(20, None);
        let loose = FileLimits::default();
        let kept = reparse_file(&text, Format::Yaml, &loose, &Documents::default())
            .unwrap()
            .documents
            .kept_bytes();
        assert!(kept > text.len() as u64, "{kept}");
        let tight = FileLimits {
            max_kept_bytes: kept - 1,
            ..loose
        };
        let e = reparse_file(&text, Format::Yaml, &tight, &Documents::default()).unwrap_err();
        assert_eq!(e.limit, Some(Limit::KeptBytes), "{e}");
        assert!(e.message.contains("dataplanes.max_kept_bytes"), "{e}");
        let exact = FileLimits {
            max_kept_bytes: kept,
            ..loose
        };
        reparse_file(&text, Format::Yaml, &exact, &Documents::default()).unwrap();
    }

    #[test]
    fn json_is_parsed_whole() {
        let json = r#"{"type": "Dataplane", "mesh": "default", "name": "a", "networking": {"address": "127.0.0.1", "inbound": [{"port": 1}]}}"#;
        let r = reparse_file(
            json,
            Format::Json,
            &FileLimits::default(),
            &Documents::default(),
        )
        .unwrap();
        assert_eq!(r.dataplanes.len(), 1);
        assert_eq!(r.documents, Documents::default());
    }
}
