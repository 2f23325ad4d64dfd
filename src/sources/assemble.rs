//! The assembler of definitions: pure. It turns what an origin read (the
//! texts of `*.yaml` / `*.yml` / `*.json` files, or stored documents named as
//! such files) and the previous snapshot into the new set of dataplanes.
//! Documents of other Kuma resource types are skipped and listed per file.
//!
//! [`assemble`] and [`reassemble`] keep a broken file's last good
//! definitions. They read no clock, record no metrics and do no I/O: the
//! `_with` variants take the specifier builder, and the pipeline around them
//! (`sources`) passes one that is timed and counted.
//!
//! The snapshot is made of persistent maps ([`imbl::OrdMap`]): a new one
//! shares everything but the changed files' entries with the previous one, so
//! making it, comparing it and diffing it cost what the changed files
//! contain, not the fleet. Each snapshot numbers its change ([`Loaded::revision`])
//! and remembers which dataplanes the last [`CHANGE_LOG`] changes touched, so
//! the registry reconciles only those ([`Loaded::changed_since`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use imbl::OrdMap;
use serde::Serialize;

use crate::dataplane::{
    self, Dataplane, DataplaneId, Documents, FileLimits, Format, IgnoredDocument, Limit, Warning,
};
use crate::specifier::{build, Specifier, SpecifierError, SpecifierSettings};

/// A dataplane as defined by a file, with its specifier already built.
#[derive(Debug, Clone)]
pub struct Defined {
    pub dataplane: Arc<Dataplane>,
    pub specifier: Arc<Specifier>,
    pub file: PathBuf,
}

impl PartialEq for Defined {
    /// Shared definitions (an unchanged file's) compare by pointer, cheaply.
    fn eq(&self, other: &Self) -> bool {
        self.file == other.file
            && (Arc::ptr_eq(&self.dataplane, &other.dataplane) || self.dataplane == other.dataplane)
            && (Arc::ptr_eq(&self.specifier, &other.specifier) || self.specifier == other.specifier)
    }
}

/// What one file contributed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FileState {
    /// The definitions in use: the file's current ones, or its last good ones
    /// when it is broken now.
    pub dataplanes: Vec<Defined>,
    /// Documents of other resource types (`Mesh`, policies...), skipped; the
    /// last good parse's when the file is broken now.
    pub ignored: Vec<IgnoredDocument>,
    /// What the file's reader should know (fields ignored, inbounds in no
    /// service); the last good parse's when the file is broken now.
    pub warnings: Vec<Warning>,
    /// Why the file cannot be used now: its own problem, or a conflict with
    /// another file.
    pub error: Option<FileError>,
    /// The file's own problem (read, parse, validation), without conflicts.
    parse_error: Option<FileError>,
    /// The documents of the last good parse, which the next version of the
    /// file reuses where their text is unchanged.
    documents: Documents,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileError {
    pub line: Option<usize>,
    /// What is wrong, with at most a short excerpt of the file's content.
    pub message: String,
    /// The limit the file went past, when that is the problem (counted in
    /// `hdsd_dataplane_file_limit_hits_total`).
    #[serde(skip)]
    pub limit: Option<Limit>,
}

impl FileError {
    pub(super) fn new(line: Option<usize>, message: &str, limit: Option<Limit>) -> FileError {
        FileError {
            line,
            message: excerpted(message),
            limit,
        }
    }
}

/// The longest quoted text an error message keeps (in characters).
const EXCERPT_CHARS: usize = 24;
/// The longest error message kept (in characters).
const MESSAGE_CHARS: usize = 400;

/// `message` with every quoted run (`"..."`, `` `...` ``) cut to
/// [`EXCERPT_CHARS`], control characters escaped, and the whole cut to
/// [`MESSAGE_CHARS`]: parser messages quote the values they reject, and a
/// file that is not a dataplane (a symlink to a secret, say) must not have
/// its content echoed into the log and the API.
pub fn excerpted(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MESSAGE_CHARS + 8));
    // Characters kept so far, and the quote open now with its length.
    let mut kept = 0;
    let mut quote: Option<(char, usize)> = None;
    for c in message.chars() {
        if kept >= MESSAGE_CHARS {
            out.push('…');
            break;
        }
        match quote {
            Some((q, _)) if c == q => quote = None,
            Some((q, n)) => {
                quote = Some((q, n + 1));
                if n == EXCERPT_CHARS {
                    out.push('…');
                    kept += 1;
                }
                if n >= EXCERPT_CHARS {
                    continue;
                }
            }
            None if c == '"' || c == '`' => quote = Some((c, 0)),
            None => {}
        }
        kept += 1;
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// How many changes a snapshot remembers the touched dataplanes of: a reader
/// that fell further behind diffs everything once.
pub const CHANGE_LOG: usize = 256;

/// The definitions in force: one snapshot of an origin (the directory, or
/// the store), as every reader sees it.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    /// Where the files are: the directory, or the store's description.
    pub dir: PathBuf,
    pub files: OrdMap<PathBuf, Arc<FileState>>,
    /// The dataplanes in force, first file (in path order) wins on a conflict.
    pub dataplanes: OrdMap<DataplaneId, Defined>,
    /// The files that define each dataplane, in path order (two or more: a
    /// conflict, the first wins).
    pub(crate) definers: OrdMap<DataplaneId, Vec<PathBuf>>,
    /// Counts the changes made to this snapshot's lineage (0: nothing loaded).
    pub(crate) revision: u64,
    /// The dataplanes whose entry in `dataplanes` changed, by the revision
    /// that changed them: the last [`CHANGE_LOG`] revisions, contiguous.
    pub(crate) changes: OrdMap<u64, Arc<[DataplaneId]>>,
}

impl PartialEq for Loaded {
    /// The same directory, files and dataplanes, however they were reached.
    fn eq(&self, other: &Self) -> bool {
        self.dir == other.dir && self.files == other.files && self.dataplanes == other.dataplanes
    }
}

impl Loaded {
    /// The number of the last change (0: nothing loaded yet). A snapshot with
    /// the same revision as another of the same lineage is the same.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The dataplanes whose entry in [`Loaded::dataplanes`] may differ between
    /// the snapshot at revision `since` (of this lineage) and this one: added,
    /// changed or removed. `None` when this snapshot does not remember that
    /// far back: compare everything then.
    pub fn changed_since(&self, since: u64) -> Option<BTreeSet<DataplaneId>> {
        if since == self.revision {
            return Some(BTreeSet::new());
        }
        if since > self.revision {
            return None;
        }
        let (first, _) = self.changes.get_min()?;
        if *first > since + 1 {
            return None;
        }
        let mut ids = BTreeSet::new();
        for (_, changed) in self.changes.range(since + 1..) {
            ids.extend(changed.iter().cloned());
        }
        Some(ids)
    }

    /// Every problem, one line each, as `validate` and the log print them.
    pub fn problems(&self) -> Vec<String> {
        self.files
            .iter()
            .filter_map(|(path, f)| {
                let e = f.error.as_ref()?;
                Some(match e.line {
                    Some(line) => format!("{}:{line}: {}", path.display(), e.message),
                    None => format!("{}: {}", path.display(), e.message),
                })
            })
            .collect()
    }

    /// Every warning, one line each (`path:line: warning: ...`), as
    /// `validate` and the log print them.
    pub fn warnings(&self) -> Vec<String> {
        self.files
            .iter()
            .flat_map(|(path, f)| {
                f.warnings.iter().map(move |w| match w.line {
                    Some(line) => format!("{}:{line}: warning: {}", path.display(), w.message),
                    None => format!("{}: warning: {}", path.display(), w.message),
                })
            })
            .collect()
    }

    pub fn error_count(&self) -> usize {
        self.files.values().filter(|f| f.error.is_some()).count()
    }

    /// What the files' kept parses hold: bytes and documents (the
    /// `hdsd_dataplane_document_cache_*` gauges).
    pub fn document_cache(&self) -> (u64, usize) {
        self.files.values().fold((0, 0), |(b, d), f| {
            (b + f.documents.kept_bytes(), d + f.documents.len())
        })
    }

    /// Skipped documents (other resource types), by type, over all files.
    pub fn ignored_by_type(&self) -> BTreeMap<&str, usize> {
        let mut by_type = BTreeMap::new();
        for doc in self.files.values().flat_map(|f| &f.ignored) {
            *by_type.entry(doc.kind.as_str()).or_insert(0) += 1;
        }
        by_type
    }
}

/// The raw content of one file, as read from disk.
pub type FileRead = Result<String, FileError>;

/// Builds one dataplane's specifier: [`build`] with the server's settings, or
/// that wrapped by an edge that measures it.
pub type Build<'a> = dyn FnMut(&Dataplane) -> Result<Specifier, SpecifierError> + 'a;

/// Builds the new [`Loaded`] from the files that exist now. A file that fails
/// to read, parse or validate keeps its previous good definitions.
pub fn assemble(
    dir: &Path,
    files: BTreeMap<PathBuf, FileRead>,
    previous: &Loaded,
    settings: &SpecifierSettings,
) -> Loaded {
    assemble_with(dir, files, previous, &FileLimits::default(), &mut |dp| {
        build(dp, settings)
    })
}

/// [`assemble`] with the given specifier builder.
pub fn assemble_with(
    dir: &Path,
    files: BTreeMap<PathBuf, FileRead>,
    previous: &Loaded,
    limits: &FileLimits,
    build: &mut Build<'_>,
) -> Loaded {
    let mut changed: BTreeMap<PathBuf, Option<FileRead>> = previous
        .files
        .keys()
        .filter(|p| !files.contains_key(*p))
        .map(|p| (p.clone(), None))
        .collect();
    changed.extend(files.into_iter().map(|(p, r)| (p, Some(r))));
    update(previous, dir, changed, limits, build)
}

/// Like [`assemble`], for the files that changed only: `Some` is a file's new
/// content, `None` a file that is gone. Every other file keeps its state.
pub fn reassemble(
    previous: &Loaded,
    changed: BTreeMap<PathBuf, Option<FileRead>>,
    settings: &SpecifierSettings,
) -> Loaded {
    reassemble_with(previous, changed, &FileLimits::default(), &mut |dp| {
        build(dp, settings)
    })
}

/// [`reassemble`] with the given specifier builder.
pub fn reassemble_with(
    previous: &Loaded,
    changed: BTreeMap<PathBuf, Option<FileRead>>,
    limits: &FileLimits,
    build: &mut Build<'_>,
) -> Loaded {
    update(previous, &previous.dir, changed, limits, build)
}

/// The same parse: definitions, skipped documents, own problem (a conflict
/// is worked out afterwards).
fn same_parse(a: &FileState, b: &FileState) -> bool {
    a.parse_error == b.parse_error
        && a.dataplanes == b.dataplanes
        && a.ignored == b.ignored
        && a.warnings == b.warnings
}

/// The previous snapshot with `changed` applied; costs what the changed files
/// (and the files sharing a dataplane with them) contain.
fn update(
    previous: &Loaded,
    dir: &Path,
    changed: BTreeMap<PathBuf, Option<FileRead>>,
    limits: &FileLimits,
    build: &mut Build<'_>,
) -> Loaded {
    let mut next = previous.clone();
    next.dir = dir.to_path_buf();
    let mut modified = next.dir != previous.dir;
    let mut touched: BTreeSet<DataplaneId> = BTreeSet::new();
    // The files whose conflicts may have changed: the changed ones, and every
    // file that defines a touched dataplane.
    let mut affected: BTreeSet<PathBuf> = BTreeSet::new();
    for (path, read) in changed {
        let old = next.files.get(&path).cloned();
        let new = read.map(|read| file_state(&path, read, old.as_deref(), limits, build));
        match (&old, &new) {
            (Some(o), Some(n)) if same_parse(o, n) => continue,
            (None, None) => continue,
            _ => modified = true,
        }
        let (gone, came, differ) = differences(
            old.as_deref().map_or(&[], |o| &o.dataplanes),
            new.as_ref().map_or(&[], |n| &n.dataplanes),
        );
        for id in gone {
            let emptied = match next.definers.get_mut(id) {
                Some(paths) => {
                    paths.retain(|p| p != &path);
                    paths.is_empty()
                }
                None => false,
            };
            if emptied {
                next.definers.remove(id);
            }
            touched.insert(id.clone());
        }
        for id in came {
            let paths = next.definers.entry(id.clone()).or_default();
            if let Err(at) = paths.binary_search(&path) {
                paths.insert(at, path.clone());
            }
            touched.insert(id.clone());
        }
        touched.extend(differ.into_iter().cloned());
        match new {
            Some(state) => {
                // Its conflicts are worked out below, with the others'.
                affected.insert(path.clone());
                next.files.insert(path, Arc::new(state));
            }
            None => {
                next.files.remove(&path);
            }
        }
    }
    // The winner of each touched dataplane: the first file in path order
    // that defines it (each such file's definitions indexed once).
    let mut by_file: HashMap<&PathBuf, HashMap<&DataplaneId, &Defined>> = HashMap::new();
    let mut changed_ids: Vec<DataplaneId> = Vec::new();
    for id in touched {
        let winner = match next.definers.get(&id) {
            Some(paths) => {
                affected.extend(paths.iter().cloned());
                let first = &paths[0];
                let files = &next.files;
                let index = by_file.entry(first).or_insert_with(|| {
                    files
                        .get(first)
                        .map(|f| f.dataplanes.iter().map(|d| (&d.dataplane.id, d)).collect())
                        .unwrap_or_default()
                });
                index.get(&id).map(|d| Defined::clone(d))
            }
            None => None,
        };
        let same = match (next.dataplanes.get(&id), &winner) {
            (Some(a), Some(b)) => a == b,
            (None, None) => true,
            _ => false,
        };
        if same {
            continue;
        }
        match winner {
            Some(d) => next.dataplanes.insert(id.clone(), d),
            None => next.dataplanes.remove(&id),
        };
        changed_ids.push(id);
    }
    for path in affected {
        let Some(state) = next.files.get(&path) else {
            continue;
        };
        let error = file_error(&path, state, &next.definers);
        if state.error != error {
            let mut state = FileState::clone(state);
            state.error = error;
            next.files.insert(path, Arc::new(state));
            modified = true;
        }
    }
    if modified || !changed_ids.is_empty() {
        next.revision += 1;
        next.changes.insert(next.revision, changed_ids.into());
        while next.changes.len() > CHANGE_LOG {
            let Some(oldest) = next.changes.get_min().map(|(k, _)| *k) else {
                break;
            };
            next.changes.remove(&oldest);
        }
    }
    next
}

/// How a file's definitions changed: the dataplanes it no longer defines,
/// the ones it defines now and did not, and the ones it defines differently.
/// Definitions in the same place compare first, by pointer when the file's
/// parse kept them, so an edit of one document costs that document.
fn differences<'a>(
    old: &'a [Defined],
    new: &'a [Defined],
) -> (
    Vec<&'a DataplaneId>,
    Vec<&'a DataplaneId>,
    Vec<&'a DataplaneId>,
) {
    // Definitions in the same place, the same: untouched.
    let same: Vec<bool> = old
        .iter()
        .zip(new)
        .map(|(o, n)| o.dataplane.id == n.dataplane.id && o == n)
        .collect();
    let untouched = |i: usize| same.get(i).copied().unwrap_or(false);
    let mut before: HashMap<&DataplaneId, &Defined> = HashMap::new();
    for (i, d) in old.iter().enumerate() {
        if !untouched(i) {
            before.insert(&d.dataplane.id, d);
        }
    }
    let (mut came, mut differ) = (Vec::new(), Vec::new());
    for (i, d) in new.iter().enumerate() {
        if untouched(i) {
            continue;
        }
        match before.remove(&d.dataplane.id) {
            Some(o) if o == d => {}
            Some(_) => differ.push(&d.dataplane.id),
            None => came.push(&d.dataplane.id),
        }
    }
    (before.into_keys().collect(), came, differ)
}

/// A file's error: its own problem, else its conflicts with files earlier in
/// path order that define the same dataplanes.
fn file_error(
    path: &Path,
    state: &FileState,
    definers: &OrdMap<DataplaneId, Vec<PathBuf>>,
) -> Option<FileError> {
    if state.parse_error.is_some() {
        return state.parse_error.clone();
    }
    let duplicates: Vec<String> = state
        .dataplanes
        .iter()
        .filter_map(|d| {
            let first = definers.get(&d.dataplane.id)?.first()?;
            (first != path).then(|| format!(
                "dataplane {} is also defined in {}, which wins (first in path order); remove one of the two definitions",
                d.dataplane.id,
                first.display()
            ))
        })
        .collect();
    (!duplicates.is_empty()).then(|| FileError {
        line: None,
        message: duplicates.join("; "),
        limit: None,
    })
}

fn file_state(
    path: &Path,
    read: FileRead,
    previous: Option<&FileState>,
    limits: &FileLimits,
    build: &mut Build<'_>,
) -> FileState {
    let result = read.and_then(|text| parse_file(path, &text, previous, limits, build));
    match result {
        Ok(Parsed {
            dataplanes,
            ignored,
            warnings,
            documents,
        }) => FileState {
            dataplanes,
            ignored,
            warnings,
            error: None,
            parse_error: None,
            documents,
        },
        Err(error) => FileState {
            dataplanes: previous.map(|f| f.dataplanes.clone()).unwrap_or_default(),
            ignored: previous.map(|f| f.ignored.clone()).unwrap_or_default(),
            warnings: previous.map(|f| f.warnings.clone()).unwrap_or_default(),
            error: Some(error.clone()),
            parse_error: Some(error),
            documents: previous.map(|f| f.documents.clone()).unwrap_or_default(),
        },
    }
}

/// What [`parse_file`] made of a file.
struct Parsed {
    dataplanes: Vec<Defined>,
    ignored: Vec<IgnoredDocument>,
    warnings: Vec<Warning>,
    documents: Documents,
}

/// Parses a file, reusing the previous parse of each of its documents whose
/// text is unchanged; a dataplane defined exactly as in the file's
/// `previous` state keeps that definition (and its specifier: not built
/// again).
fn parse_file(
    path: &Path,
    text: &str,
    previous: Option<&FileState>,
    limits: &FileLimits,
    build: &mut Build<'_>,
) -> Result<Parsed, FileError> {
    let before: HashMap<&DataplaneId, &Defined> = previous
        .map(|f| f.dataplanes.iter().map(|d| (&d.dataplane.id, d)).collect())
        .unwrap_or_default();
    let format = Format::of_path(path).unwrap_or(Format::Yaml);
    let kept = previous.map(|f| &f.documents);
    let parsed =
        dataplane::reparse_file(text, format, limits, kept.unwrap_or(&Documents::default()))
            .map_err(|e| FileError::new(e.line, &e.message, e.limit))?;
    let defined = parsed
        .dataplanes
        .into_iter()
        .map(|dp| {
            let unchanged = before
                .get(&dp.id)
                .filter(|d| Arc::ptr_eq(&d.dataplane, &dp) || d.dataplane == dp);
            if let Some(d) = unchanged {
                return Ok(Defined::clone(d));
            }
            let specifier = build(&dp)
                .map_err(|e| FileError::new(None, &format!("dataplane {}: {e}", dp.id), None))?;
            Ok(Defined {
                dataplane: dp,
                specifier: Arc::new(specifier),
                file: path.to_path_buf(),
            })
        })
        .collect::<Result<_, _>>()?;
    // Messages that may quote the file are cut as its errors are.
    let warnings = parsed
        .warnings
        .into_iter()
        .map(|w| Warning {
            line: w.line,
            message: excerpted(&w.message),
        })
        .collect();
    Ok(Parsed {
        dataplanes: defined,
        ignored: parsed.ignored,
        warnings,
        documents: parsed.documents,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SpecifierSettings {
        SpecifierSettings::default()
    }

    fn doc(name: &str, service_port: u16) -> String {
        format!(
            "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: {service_port}\n"
        )
    }

    fn files(entries: &[(&str, &str)]) -> BTreeMap<PathBuf, FileRead> {
        entries
            .iter()
            .map(|(p, t)| (PathBuf::from(p), Ok(t.to_string())))
            .collect()
    }

    fn names(l: &Loaded) -> Vec<String> {
        l.dataplanes.keys().map(|k| k.to_string()).collect()
    }

    #[test]
    fn broken_file_keeps_last_good_and_others_load() {
        let dir = Path::new("d");
        let first = assemble(
            dir,
            files(&[("d/a.yaml", &doc("a", 8080)), ("d/b.yaml", &doc("b", 8081))]),
            &Loaded::default(),
            &settings(),
        );
        assert_eq!(names(&first), vec!["default.a", "default.b"]);
        assert!(first.problems().is_empty());

        let second = assemble(
            dir,
            files(&[
                ("d/a.yaml", "type: Dataplane\nmesh: [oops"),
                ("d/b.yaml", &doc("b", 9999)),
            ]),
            &first,
            &settings(),
        );
        assert_eq!(names(&second), vec!["default.a", "default.b"]);
        assert_eq!(
            second.dataplanes[&DataplaneId::new("default", "a")],
            first.dataplanes[&DataplaneId::new("default", "a")],
            "the broken file's last good definition stays"
        );
        assert_eq!(
            second.dataplanes[&DataplaneId::new("default", "b")]
                .dataplane
                .inbounds[0]
                .service_port,
            9999
        );
        let problems = second.problems();
        assert_eq!(problems.len(), 1);
        // The flow sequence is never closed: the parser stops at the end.
        assert!(problems[0].starts_with("d/a.yaml:3: "), "{problems:?}");
        assert!(problems[0].contains("flow sequence"), "{problems:?}");
    }

    #[test]
    fn a_broken_new_file_contributes_nothing() {
        let l = assemble(
            Path::new("d"),
            files(&[(
                "d/a.yaml",
                "type: Dataplane\nmesh: default\nname: x\nnetworking:\n  address: db.local\n",
            )]),
            &Loaded::default(),
            &settings(),
        );
        assert!(l.dataplanes.is_empty());
        assert_eq!(l.error_count(), 1);
        assert!(l.problems()[0].contains("not an IP literal"));
    }

    #[test]
    fn deleted_file_removes_its_dataplanes() {
        let first = assemble(
            Path::new("d"),
            files(&[("d/a.yaml", &doc("a", 8080))]),
            &Loaded::default(),
            &settings(),
        );
        let second = assemble(Path::new("d"), files(&[]), &first, &settings());
        assert!(second.dataplanes.is_empty());
    }

    #[test]
    fn duplicate_across_files_names_both_and_first_wins() {
        let l = assemble(
            Path::new("d"),
            files(&[("d/b.yaml", &doc("x", 2)), ("d/a.yaml", &doc("x", 1))]),
            &Loaded::default(),
            &settings(),
        );
        let x = &l.dataplanes[&DataplaneId::new("default", "x")];
        assert_eq!(x.file, PathBuf::from("d/a.yaml"));
        let problems = l.problems();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].starts_with("d/b.yaml: "), "{problems:?}");
        assert!(
            problems[0].contains("also defined in d/a.yaml"),
            "{problems:?}"
        );
    }

    #[test]
    fn invalid_probe_override_is_a_file_error() {
        let text = format!(
            "{}    serviceProbe:\n      unhealthyThreshold: 0\n",
            doc("a", 8080)
        );
        let l = assemble(
            Path::new("d"),
            files(&[("d/a.yaml", &text)]),
            &Loaded::default(),
            &settings(),
        );
        assert!(l.dataplanes.is_empty());
        assert!(
            l.problems()[0]
                .contains("networking.inbound[0].serviceProbe: unhealthy_threshold must be >= 1"),
            "{:?}",
            l.problems()
        );
    }

    #[test]
    fn reassemble_touches_only_the_changed_files() {
        let dir = Path::new("d");
        let first = assemble(
            dir,
            files(&[
                ("d/a.yaml", &doc("a", 1)),
                ("d/b.yaml", &doc("b", 2)),
                ("d/c.yaml", &doc("c", 3)),
            ]),
            &Loaded::default(),
            &settings(),
        );
        let changed: BTreeMap<PathBuf, Option<FileRead>> = [
            (PathBuf::from("d/b.yaml"), Some(Ok(doc("b", 20)))),
            (PathBuf::from("d/c.yaml"), None),
            (PathBuf::from("d/d.yaml"), Some(Ok(doc("d", 4)))),
        ]
        .into();
        let second = reassemble(&first, changed, &settings());
        assert_eq!(names(&second), vec!["default.a", "default.b", "default.d"]);
        let a = DataplaneId::new("default", "a");
        assert!(
            Arc::ptr_eq(
                &second.dataplanes[&a].specifier,
                &first.dataplanes[&a].specifier
            ),
            "an unchanged file is not parsed again"
        );
        assert_eq!(
            second.dataplanes[&DataplaneId::new("default", "b")]
                .dataplane
                .inbounds[0]
                .service_port,
            20
        );
        // The same as reading everything.
        let full = assemble(
            dir,
            files(&[
                ("d/a.yaml", &doc("a", 1)),
                ("d/b.yaml", &doc("b", 20)),
                ("d/d.yaml", &doc("d", 4)),
            ]),
            &Loaded::default(),
            &settings(),
        );
        assert_eq!(second, full);
    }

    #[test]
    fn edits_of_multi_document_files_give_what_reading_everything_gives() {
        let dir = Path::new("d");
        let text = |docs: &[(&str, u16)]| {
            docs.iter()
                .map(|(n, p)| doc(n, *p))
                .collect::<Vec<_>>()
                .join("---\n")
        };
        // Each step: the files' contents; a step replaces only the files it names.
        let steps: Vec<Vec<(&str, String)>> = vec![
            vec![
                ("d/a.yaml", text(&[("a1", 1), ("a2", 2), ("x", 3)])),
                ("d/b.yaml", text(&[("b1", 1), ("x", 4)])),
            ],
            // One document changed; one added; a conflict appears and goes.
            vec![("d/a.yaml", text(&[("a1", 1), ("a2", 20), ("x", 3)]))],
            vec![("d/b.yaml", text(&[("b1", 1), ("b2", 2), ("x", 4)]))],
            vec![("d/a.yaml", text(&[("a1", 1), ("a2", 20)]))],
            // Broken, then fixed to what it was: its conflict comes back.
            vec![("d/a.yaml", text(&[("a1", 1), ("x", 3)]))],
            vec![(
                "d/a.yaml",
                format!("{}---\nmesh: [", text(&[("a1", 1), ("x", 3)])),
            )],
            vec![("d/a.yaml", text(&[("a1", 1), ("x", 3)]))],
            // Documents moved within a file and between files.
            vec![("d/a.yaml", text(&[("x", 3), ("a1", 1)]))],
            vec![
                ("d/a.yaml", text(&[("x", 3)])),
                ("d/b.yaml", text(&[("a1", 1), ("b1", 1), ("b2", 2)])),
            ],
        ];
        let mut contents: BTreeMap<PathBuf, String> = BTreeMap::new();
        let mut loaded = Loaded::default();
        for (n, step) in steps.into_iter().enumerate() {
            let mut changed = BTreeMap::new();
            for (path, text) in step {
                contents.insert(PathBuf::from(path), text.clone());
                changed.insert(PathBuf::from(path), Some(Ok(text)));
            }
            loaded = if n == 0 {
                assemble(
                    dir,
                    changed.into_iter().map(|(p, r)| (p, r.unwrap())).collect(),
                    &loaded,
                    &settings(),
                )
            } else {
                reassemble(&loaded, changed, &settings())
            };
            // Reading everything from scratch, with the broken file's last
            // good text read first.
            let mut full = Loaded::default();
            if n == 5 {
                let mut good = contents.clone();
                good.insert(PathBuf::from("d/a.yaml"), text(&[("a1", 1), ("x", 3)]));
                full = assemble(
                    dir,
                    good.into_iter().map(|(p, t)| (p, Ok(t))).collect(),
                    &full,
                    &settings(),
                );
            }
            let full = assemble(
                dir,
                contents
                    .iter()
                    .map(|(p, t)| (p.clone(), Ok(t.clone())))
                    .collect(),
                &full,
                &settings(),
            );
            assert_eq!(loaded.dataplanes, full.dataplanes, "step {n}");
            assert_eq!(loaded.problems(), full.problems(), "step {n}");
            assert_eq!(loaded.definers, full.definers, "step {n}");
            if n == 6 {
                let problems = loaded.problems();
                assert_eq!(problems.len(), 1, "{problems:?}");
                assert!(
                    problems[0].contains("default.x is also defined in d/a.yaml"),
                    "{problems:?}"
                );
            }
        }
        assert!(loaded.problems().is_empty(), "{:?}", loaded.problems());
    }

    /// `count` dataplanes, `per_file` to a file: d/f000.yaml...
    fn fleet(count: usize, per_file: usize) -> BTreeMap<PathBuf, FileRead> {
        (0..count.div_ceil(per_file))
            .map(|f| {
                let text = (f * per_file..((f + 1) * per_file).min(count))
                    .map(|i| doc(&format!("dp-{i:05}"), 20000))
                    .collect::<Vec<_>>()
                    .join("---\n");
                (PathBuf::from(format!("d/f{f:03}.yaml")), Ok(text))
            })
            .collect()
    }

    #[test]
    fn a_change_costs_its_file_and_names_only_what_it_touched() {
        let files = fleet(30, 10);
        let first = assemble(
            Path::new("d"),
            files.clone(),
            &Loaded::default(),
            &settings(),
        );
        assert_eq!(first.dataplanes.len(), 30);
        assert_eq!(first.revision(), 1);
        // One dataplane of f001.yaml changes; the file is read again.
        let mut text = files[Path::new("d/f001.yaml")].clone().unwrap();
        text = text.replacen(&doc("dp-00012", 20000), &doc("dp-00012", 30000), 1);
        let mut built = 0;
        let mut counting = |dp: &Dataplane| {
            built += 1;
            build(dp, &settings())
        };
        let second = reassemble_with(
            &first,
            [(PathBuf::from("d/f001.yaml"), Some(Ok(text.clone())))].into(),
            &FileLimits::default(),
            &mut counting,
        );
        assert_eq!(
            built, 1,
            "only the changed dataplane's specifier is built again"
        );
        assert_eq!(second.revision(), 2);
        let changed: Vec<String> = second
            .changed_since(first.revision())
            .unwrap()
            .iter()
            .map(|id| id.to_string())
            .collect();
        assert_eq!(changed, ["default.dp-00012"]);
        // Everything else is shared with the previous snapshot, not copied.
        assert!(Arc::ptr_eq(
            &first.files[Path::new("d/f000.yaml")],
            &second.files[Path::new("d/f000.yaml")]
        ));
        let same = DataplaneId::new("default", "dp-00011");
        assert!(Arc::ptr_eq(
            &first.dataplanes[&same].specifier,
            &second.dataplanes[&same].specifier
        ));
        // Writing the same content again changes nothing, not even the revision.
        let third = reassemble(
            &second,
            [(PathBuf::from("d/f001.yaml"), Some(Ok(text)))].into(),
            &settings(),
        );
        assert_eq!(third.revision(), second.revision());
        assert_eq!(third.changed_since(second.revision()).unwrap().len(), 0);
        // From the start: every dataplane ever touched.
        assert_eq!(third.changed_since(0).unwrap().len(), 30);
        // The same result as reading every file.
        let mut all = files;
        all.insert(
            PathBuf::from("d/f001.yaml"),
            Ok(second.files[Path::new("d/f001.yaml")]
                .dataplanes
                .iter()
                .map(|d| doc(&d.dataplane.id.name, d.dataplane.inbounds[0].service_port))
                .collect::<Vec<_>>()
                .join("---\n")),
        );
        assert_eq!(
            assemble(Path::new("d"), all, &Loaded::default(), &settings()),
            second
        );
    }

    #[test]
    fn a_reader_further_behind_than_the_change_log_diffs_everything() {
        let mut l = assemble(Path::new("d"), fleet(2, 1), &Loaded::default(), &settings());
        let start = l.revision();
        for n in 0..CHANGE_LOG as u16 + 1 {
            l = reassemble(
                &l,
                [(
                    PathBuf::from("d/f000.yaml"),
                    Some(Ok(doc("dp-00000", 1000 + n))),
                )]
                .into(),
                &settings(),
            );
        }
        assert_eq!(l.revision(), start + CHANGE_LOG as u64 + 1);
        assert!(l.changed_since(start).is_none());
        assert_eq!(l.changed_since(start + 1).unwrap().len(), 1);
        assert!(
            l.changed_since(l.revision() + 1).is_none(),
            "another lineage"
        );
    }

    #[test]
    fn the_given_builder_builds_each_dataplane_of_the_files_read_only() {
        let dir = Path::new("d");
        let settings = settings();
        let mut built = Vec::new();
        let mut counting = |dp: &Dataplane| {
            built.push(dp.id.to_string());
            build(dp, &settings)
        };
        let limits = FileLimits::default();
        let first = assemble_with(
            dir,
            files(&[("d/a.yaml", &doc("a", 1)), ("d/b.yaml", &doc("b", 2))]),
            &Loaded::default(),
            &limits,
            &mut counting,
        );
        let second = reassemble_with(
            &first,
            [(PathBuf::from("d/b.yaml"), Some(Ok(doc("b", 20))))].into(),
            &limits,
            &mut counting,
        );
        assert_eq!(built, vec!["default.a", "default.b", "default.b"]);
        assert_eq!(names(&second), vec!["default.a", "default.b"]);
    }

    #[test]
    fn a_conflict_clears_when_the_other_file_goes() {
        let first = assemble(
            Path::new("d"),
            files(&[("d/a.yaml", &doc("x", 1)), ("d/b.yaml", &doc("x", 2))]),
            &Loaded::default(),
            &settings(),
        );
        assert_eq!(first.error_count(), 1);
        let second = reassemble(
            &first,
            [(PathBuf::from("d/a.yaml"), None)].into(),
            &settings(),
        );
        assert_eq!(second.error_count(), 0, "{:?}", second.problems());
        assert_eq!(
            second.dataplanes[&DataplaneId::new("default", "x")].file,
            PathBuf::from("d/b.yaml")
        );
        // And a broken file keeps its last good definitions across a reassemble.
        let third = reassemble(
            &second,
            [(PathBuf::from("d/b.yaml"), Some(Ok("mesh: [".into())))].into(),
            &settings(),
        );
        assert_eq!(third.error_count(), 1);
        assert_eq!(
            third.dataplanes[&DataplaneId::new("default", "x")]
                .dataplane
                .inbounds[0]
                .service_port,
            2
        );
    }

    #[test]
    fn ignored_documents_are_listed_per_file_and_kept_when_broken() {
        let mixed = format!("type: Mesh\nname: default\n---\n{}", doc("a", 1));
        let first = assemble(
            Path::new("d"),
            files(&[("d/a.yaml", &mixed), ("d/b.yaml", &doc("b", 2))]),
            &Loaded::default(),
            &settings(),
        );
        assert_eq!(first.error_count(), 0, "{:?}", first.problems());
        let a = &first.files[Path::new("d/a.yaml")];
        assert_eq!(a.ignored.len(), 1);
        assert_eq!(
            (a.ignored[0].kind.as_str(), a.ignored[0].document),
            ("Mesh", 1)
        );
        assert_eq!(first.ignored_by_type(), [("Mesh", 1)].into());
        // Broken now: the last good parse's ignored documents stay listed.
        let second = reassemble(
            &first,
            [(PathBuf::from("d/a.yaml"), Some(Ok("type: [".into())))].into(),
            &settings(),
        );
        assert_eq!(second.error_count(), 1);
        assert_eq!(second.files[Path::new("d/a.yaml")].ignored, a.ignored);
    }

    #[test]
    fn excerpts_cut_quoted_content_and_escape_control_characters() {
        let secret = "root:x:0:0:root:/root:/bin/bash daemon:x:1:1:daemon:/usr/sbin";
        let m = excerpted(&format!("invalid type: string \"{secret}\", expected x"));
        assert_eq!(
            m,
            "invalid type: string \"root:x:0:0:root:/root:/b…\", expected x"
        );
        assert_eq!(excerpted("unknown field `a\nb`"), "unknown field `a\\nb`");
        assert_eq!(
            excerpted(&"y".repeat(1000)).chars().count(),
            MESSAGE_CHARS + 1
        );
    }
}
