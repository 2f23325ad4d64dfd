//! The documentation checks itself: every markdown link of README.md and
//! docs/*.md resolves (the file exists, a `#anchor` names a heading of its
//! file), every docs page opens with a title, a paragraph and a table of
//! contents of its `##` sections, the README links every docs page, and the
//! README stays short.
//!
//! Standard library only, so it also runs without building hdsd:
//! `CARGO_MANIFEST_DIR=$PWD rustc --edition 2021 --test tests/docs.rs -o docs-test && ./docs-test`.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The README must stay under this many lines: what a newcomer needs, the
/// rest in docs/.
const README_MAX_LINES: usize = 300;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A markdown file of the documentation, named as from the repository root.
struct Doc {
    name: String,
    text: String,
}

impl Doc {
    fn read(name: &str) -> Doc {
        let path = root().join(name);
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        Doc {
            name: name.to_string(),
            text,
        }
    }
}

/// README.md and every docs/*.md, sorted.
fn documents() -> Vec<Doc> {
    let mut docs = vec![Doc::read("README.md")];
    docs.extend(docs_pages().iter().map(|name| Doc::read(name)));
    docs
}

/// `docs/<page>.md` for every markdown file of docs/, sorted.
fn docs_pages() -> Vec<String> {
    let dir = root().join("docs");
    let mut pages: Vec<String> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".md"))
        .map(|name| format!("docs/{name}"))
        .collect();
    pages.sort();
    pages
}

/// The text with every line of a fenced code block (fences included)
/// blanked, so that line numbers stay those of the file.
fn prose(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    // The fence's character and length while inside a block.
    let mut fence: Option<(char, usize)> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        let opener = ['`', '~']
            .into_iter()
            .find(|&c| trimmed.starts_with(c))
            .map(|c| (c, trimmed.chars().take_while(|&x| x == c).count()))
            // A backtick fence's info string has no backtick (else it is
            // inline code).
            .filter(|&(c, n)| n >= 3 && !(c == '`' && trimmed[n..].contains('`')));
        match (fence, opener) {
            (None, Some(open)) => fence = Some(open),
            (Some((c, n)), Some((c2, n2)))
                if c == c2 && n2 >= n && trimmed.trim_start_matches(c).trim().is_empty() =>
            {
                fence = None
            }
            (None, None) => out.push_str(line),
            (Some(_), _) => {}
        }
        out.push('\n');
    }
    out
}

/// The text with every inline code span blanked (newlines kept), so that
/// brackets in code are never taken for links. A span ends at the next run
/// of as many backticks, within its paragraph; an unclosed run is literal.
fn without_code_spans(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = bytes.to_vec();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&b| b == b'`').count();
        let mut j = i + run;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j..].starts_with(b"\n\n") {
                break;
            }
            if bytes[j] == b'`' {
                let n = bytes[j..].iter().take_while(|&&b| b == b'`').count();
                if n == run {
                    close = Some(j + n);
                    break;
                }
                j += n;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                for b in &mut out[i..end] {
                    if *b != b'\n' {
                        *b = b' ';
                    }
                }
                i = end;
            }
            None => i += run,
        }
    }
    // Only ASCII bytes were replaced, by ASCII spaces: still UTF-8.
    String::from_utf8(out).unwrap()
}

/// A markdown link `[text](target)` (or image), with its 1-based line.
#[derive(Debug, PartialEq)]
struct Link {
    line: usize,
    text: String,
    target: String,
}

/// Every inline link outside fenced code blocks and code spans.
fn links(text: &str) -> Vec<Link> {
    let shown = prose(text);
    // Blanking code spans keeps every byte where it was: positions found in
    // `text` are those of `shown`, which still has the link text's code.
    let text = without_code_spans(&shown);
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    for open in 0..bytes.len() {
        if bytes[open] != b'[' || (open > 0 && bytes[open - 1] == b'\\') {
            continue;
        }
        // The matching `]`, within the paragraph.
        let mut depth = 0;
        let mut close = None;
        let mut i = open;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => i += 1,
                b'[' => depth += 1,
                b']' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(i);
                        break;
                    }
                }
                b'\n' if bytes.get(i + 1) == Some(&b'\n') => break,
                _ => {}
            }
            i += 1;
        }
        let Some(close) = close else { continue };
        if bytes.get(close + 1) != Some(&b'(') {
            continue;
        }
        // The matching `)`, on the same line.
        let mut depth = 0;
        let mut end = None;
        for (k, &b) in bytes.iter().enumerate().skip(close + 1) {
            match b {
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        end = Some(k);
                        break;
                    }
                }
                b'\n' => break,
                _ => {}
            }
        }
        let Some(end) = end else { continue };
        let inside = text[close + 2..end].trim();
        let target = match inside.strip_prefix('<') {
            Some(rest) => rest.split('>').next().unwrap_or(""),
            None => inside.split_whitespace().next().unwrap_or(""),
        };
        found.push(Link {
            line: text[..open].matches('\n').count() + 1,
            text: shown[open + 1..close]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
            target: target.to_string(),
        });
    }
    found
}

/// An ATX heading outside code: its level, text and 1-based line.
struct Heading {
    level: usize,
    text: String,
    line: usize,
}

fn headings(text: &str) -> Vec<Heading> {
    prose(text)
        .lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let level = line.chars().take_while(|&c| c == '#').count();
            let rest = &line[level..];
            if !(1..=6).contains(&level) || !(rest.is_empty() || rest.starts_with(' ')) {
                return None;
            }
            Some(Heading {
                level,
                text: rest.trim().trim_end_matches('#').trim().to_string(),
                line: i + 1,
            })
        })
        .collect()
}

/// GitHub's anchor for a heading: lowercase, punctuation dropped except `-`
/// and `_`, each space a `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a file's headings, in order; a repeated heading gets
/// `-1`, `-2`... as on GitHub.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    headings(text)
        .iter()
        .map(|h| {
            let base = slug(&h.text);
            let n = seen.entry(base.clone()).or_insert(0);
            let anchor = match *n {
                0 => base,
                k => format!("{base}-{k}"),
            };
            *n += 1;
            anchor
        })
        .collect()
}

/// Whether a link leaves the repository (a URL scheme such as `https:` or
/// `mailto:`): not checked here.
fn is_external(target: &str) -> bool {
    match target.split_once(':') {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        }
        None => false,
    }
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Where a relative link of `from` points: a path from the repository root
/// (a leading `/` is the root, as on GitHub).
fn resolve(from: &Doc, path: &str) -> PathBuf {
    match path.strip_prefix('/') {
        Some(from_root) => normalize(Path::new(from_root)),
        None => {
            let dir = Path::new(&from.name).parent().unwrap_or(Path::new(""));
            normalize(&dir.join(path))
        }
    }
}

/// The problems of one link, if any.
fn check_link(doc: &Doc, link: &Link) -> Option<String> {
    let at = format!(
        "{}:{}: link [{}]({})",
        doc.name, link.line, link.text, link.target
    );
    if link.target.is_empty() {
        return Some(format!(
            "{at}: the target is empty; write the file or #anchor it points to"
        ));
    }
    if is_external(&link.target) {
        return None;
    }
    let (path, anchor) = match link.target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (link.target.as_str(), None),
    };
    let (target_name, target_text) = if path.is_empty() {
        (doc.name.clone(), doc.text.clone())
    } else {
        let resolved = resolve(doc, path);
        let shown = resolved.display().to_string();
        let full = root().join(&resolved);
        if !full.exists() {
            return Some(format!(
                "{at}: {shown} does not exist (relative links are read from {}'s directory); fix the path or create the file",
                doc.name
            ));
        }
        let text = match anchor {
            Some(_) if shown.ends_with(".md") => fs::read_to_string(&full).unwrap_or_default(),
            _ => String::new(),
        };
        (shown, text)
    };
    let anchor = anchor?;
    if !target_name.ends_with(".md") {
        return None;
    }
    let known = anchors(&target_text);
    if known.iter().any(|a| a == anchor) {
        return None;
    }
    Some(format!(
        "{at}: {target_name} has no heading with the anchor #{anchor}; use one of its anchors ({}) or add the heading",
        known.join(", ")
    ))
}

#[test]
fn every_link_resolves() {
    let mut problems = Vec::new();
    for doc in documents() {
        for link in links(&doc.text) {
            problems.extend(check_link(&doc, &link));
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_docs_page_has_a_title_a_paragraph_and_a_table_of_contents() {
    let mut problems = Vec::new();
    for name in docs_pages() {
        let doc = Doc::read(&name);
        let lines: Vec<&str> = doc.text.lines().collect();
        let all = headings(&doc.text);
        let title_line = lines
            .iter()
            .position(|l| !l.trim().is_empty())
            .map(|i| i + 1);
        let titled = all
            .first()
            .filter(|h| h.level == 1 && Some(h.line) == title_line);
        if titled.is_none() {
            problems.push(format!(
                "{name}:{}: a docs page starts with its title, a `# Title` line",
                title_line.unwrap_or(1)
            ));
            continue;
        }
        let sections: Vec<&Heading> = all.iter().filter(|h| h.level == 2).collect();
        let Some(first) = sections.first() else {
            continue;
        };
        // What lies between the title and the first `##` section: the
        // paragraph, then the table of contents.
        let intro = &lines[all[0].line..first.line - 1];
        let has_paragraph = intro.iter().any(|l| {
            let t = l.trim_start();
            !t.is_empty() && !t.starts_with("- ") && !t.starts_with("* ")
        });
        if !has_paragraph {
            problems.push(format!(
                "{name}:{}: the title is followed by no paragraph; say in one paragraph what the page covers, before its table of contents",
                all[0].line
            ));
        }
        let listed: BTreeSet<String> = links(&doc.text)
            .into_iter()
            .filter(|l| l.line > all[0].line && l.line < first.line)
            .filter(|l| {
                let t = lines[l.line - 1].trim_start();
                t.starts_with("- ") || t.starts_with("* ")
            })
            .filter_map(|l| l.target.strip_prefix('#').map(str::to_string))
            .collect();
        let anchors = anchors(&doc.text);
        for section in &sections {
            let index = all.iter().position(|h| h.line == section.line).unwrap();
            let anchor = &anchors[index];
            if !listed.contains(anchor) {
                problems.push(format!(
                    "{name}:{}: `## {}` is not in the table of contents; add `- [{}](#{anchor})` to the bulleted list before line {}",
                    section.line, section.text, section.text, first.line
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs pages without a complete table of contents:\n{}",
        problems.join("\n")
    );
}

#[test]
fn the_readme_links_every_docs_page() {
    let readme = Doc::read("README.md");
    let linked: BTreeSet<PathBuf> = links(&readme.text)
        .iter()
        .filter(|l| !is_external(&l.target))
        .map(|l| resolve(&readme, l.target.split('#').next().unwrap_or("")))
        .collect();
    let next = headings(&readme.text)
        .into_iter()
        .find(|h| h.text == "Where to go next");
    let line = next.as_ref().map_or(1, |h| h.line);
    let mut problems = Vec::new();
    if next.is_none() {
        problems.push(
            "README.md:1: no `## Where to go next` section; add one listing every docs page with one line each"
                .to_string(),
        );
    }
    for page in docs_pages() {
        if !linked.contains(Path::new(&page)) {
            problems.push(format!(
                "README.md:{line}: {page} is not linked from the README; add `- [{page}]({page}): <what it covers>` under \"Where to go next\""
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_readme_stays_short() {
    let readme = Doc::read("README.md");
    let lines = readme.text.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md:{README_MAX_LINES}: the README has {lines} lines, it must stay under {README_MAX_LINES}: keep what a newcomer needs (what hdsd is, the two commands, the quick start, where to go next) and move the rest into a docs/ page"
    );
}

#[test]
fn anchors_follow_github() {
    let text = "# Title\n## The Envoy's own readiness\n### `hdsd_inbounds` statuses\n## Liveness: what operators see\n## Dataplane files\n```sh\n## not a heading\n```\n## Dataplane files\n## Dataplane files\n";
    assert_eq!(
        anchors(text),
        [
            "title",
            "the-envoys-own-readiness",
            "hdsd_inbounds-statuses",
            "liveness-what-operators-see",
            "dataplane-files",
            "dataplane-files-1",
            "dataplane-files-2",
        ]
    );
}

#[test]
fn links_are_found_outside_code_only() {
    let text = "See [the API](docs/api.md#rest-api) and\n[a wrapped\nlink](b.md \"title\"), not `[code](x.md)`:\n\n```md\n[fenced](y.md)\n```\n![img](ui.png) [![badge](a.png)](c.md) [not a link] (z.md)\n";
    let found: Vec<(usize, String)> = links(text)
        .into_iter()
        .map(|l| (l.line, l.target))
        .collect();
    let expected = [
        (1, "docs/api.md#rest-api"),
        (2, "b.md"),
        (8, "ui.png"),
        (8, "c.md"),
        (8, "a.png"),
    ]
    .map(|(line, target)| (line, target.to_string()));
    assert_eq!(found, expected);
    assert!(is_external("https://example.com/x.md"));
    assert!(is_external("mailto:someone@example.com"));
    assert!(!is_external("docs/api.md#rest-api"));
    assert!(!is_external("#quick-start"));
}
