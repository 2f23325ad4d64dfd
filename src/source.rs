//! The dataplane source: a directory of `*.yaml` / `*.yml` files.
//!
//! [`assemble`] is pure: it turns the files' texts and the previous result into
//! the new set of dataplanes, keeping a broken file's last good definitions.
//! [`read_dir`] and [`watch`] are the I/O around it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use serde::Serialize;
use tokio::sync::watch;

use crate::dataplane::{parse_documents, Dataplane, DataplaneId};
use crate::specifier::{build, Specifier, SpecifierSettings};

/// A dataplane as defined by a file, with its specifier already built.
#[derive(Debug, Clone, PartialEq)]
pub struct Defined {
    pub dataplane: Arc<Dataplane>,
    pub specifier: Arc<Specifier>,
    pub file: PathBuf,
}

/// What one file contributed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FileState {
    /// The definitions in use: the file's current ones, or its last good ones
    /// when it is broken now.
    pub dataplanes: Vec<Defined>,
    /// Why the file cannot be used now.
    pub error: Option<FileError>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileError {
    pub line: Option<usize>,
    pub message: String,
}

/// The result of loading the directory.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Loaded {
    pub dir: PathBuf,
    pub files: BTreeMap<PathBuf, FileState>,
    /// The dataplanes in force, first file (in path order) wins on a conflict.
    pub dataplanes: BTreeMap<DataplaneId, Defined>,
}

impl Loaded {
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

    pub fn error_count(&self) -> usize {
        self.files.values().filter(|f| f.error.is_some()).count()
    }
}

/// The raw content of one file, as read from disk.
pub type FileRead = Result<String, String>;

/// Builds the new [`Loaded`] from the files that exist now. A file that fails
/// to read, parse or validate keeps its previous good definitions.
pub fn assemble(
    dir: &Path,
    files: BTreeMap<PathBuf, FileRead>,
    previous: &Loaded,
    settings: &SpecifierSettings,
) -> Loaded {
    let mut states: BTreeMap<PathBuf, FileState> = BTreeMap::new();
    for (path, read) in files {
        let result = read
            .map_err(|message| FileError {
                line: None,
                message,
            })
            .and_then(|text| parse_file(&path, &text, settings));
        let state = match result {
            Ok(dataplanes) => FileState {
                dataplanes,
                error: None,
            },
            Err(error) => FileState {
                dataplanes: previous
                    .files
                    .get(&path)
                    .map(|f| f.dataplanes.clone())
                    .unwrap_or_default(),
                error: Some(error),
            },
        };
        states.insert(path, state);
    }
    // Merge in path order: the first definition of an id wins.
    let mut dataplanes: BTreeMap<DataplaneId, Defined> = BTreeMap::new();
    for state in states.values_mut() {
        let mut duplicates = Vec::new();
        for d in &state.dataplanes {
            match dataplanes.get(&d.dataplane.id) {
                Some(first) => duplicates.push(format!(
                    "dataplane {} is also defined in {}, which wins (first in path order); remove one of the two definitions",
                    d.dataplane.id,
                    first.file.display()
                )),
                None => {
                    dataplanes.insert(d.dataplane.id.clone(), d.clone());
                }
            }
        }
        if !duplicates.is_empty() && state.error.is_none() {
            state.error = Some(FileError {
                line: None,
                message: duplicates.join("; "),
            });
        }
    }
    Loaded {
        dir: dir.to_path_buf(),
        files: states,
        dataplanes,
    }
}

fn parse_file(
    path: &Path,
    text: &str,
    settings: &SpecifierSettings,
) -> Result<Vec<Defined>, FileError> {
    let dataplanes = parse_documents(text).map_err(|e| FileError {
        line: e.line,
        message: e.message,
    })?;
    dataplanes
        .into_iter()
        .map(|dp| {
            let started = std::time::Instant::now();
            let built = build(&dp, settings);
            crate::metrics::specifier_built(built.is_ok(), started.elapsed());
            let specifier = built.map_err(|e| FileError {
                line: None,
                message: format!("dataplane {}: {e}", dp.id),
            })?;
            Ok(Defined {
                dataplane: Arc::new(dp),
                specifier: Arc::new(specifier),
                file: path.to_path_buf(),
            })
        })
        .collect()
}

/// Why the directory itself cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the dataplanes directory {dir}: {source}; create it or point dataplanes.dir at an existing directory")]
pub struct DirError {
    pub dir: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Reads every `*.yaml` / `*.yml` file of `dir` (not recursive, hidden files skipped).
pub fn read_dir(dir: &Path) -> Result<BTreeMap<PathBuf, FileRead>, DirError> {
    let entries = std::fs::read_dir(dir).map_err(|source| DirError {
        dir: dir.to_path_buf(),
        source,
    })?;
    let mut files = BTreeMap::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if !is_dataplane_file(&path) || !path.is_file() {
            continue;
        }
        let read = std::fs::read_to_string(&path).map_err(|e| format!("cannot read file: {e}"));
        files.insert(path, read);
    }
    Ok(files)
}

fn is_dataplane_file(path: &Path) -> bool {
    let hidden = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'));
    let ext = path.extension().and_then(|e| e.to_str());
    !hidden && matches!(ext, Some("yaml" | "yml"))
}

/// Loads the directory once.
pub fn load(
    dir: &Path,
    previous: &Loaded,
    settings: &SpecifierSettings,
) -> Result<Loaded, DirError> {
    Ok(assemble(dir, read_dir(dir)?, previous, settings))
}

/// How long file events are coalesced before the directory is read again.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Watches `dir` and publishes every change to `tx`, which must hold the
/// initial load. Runs until `tx` has no receivers left.
pub async fn watch(
    dir: PathBuf,
    settings: SpecifierSettings,
    tx: watch::Sender<Arc<Loaded>>,
) -> Result<(), notify::Error> {
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Opening or reading a file changes nothing, and hdsd's own reads of
        // the directory would otherwise trigger the next reload, forever.
        if matches!(&event, Ok(e) if matches!(e.kind, notify::EventKind::Access(_))) {
            return;
        }
        let _ = events_tx.send(event.map(|_| ()));
    })?;
    watcher.watch(&dir, RecursiveMode::NonRecursive)?;
    while let Some(event) = events.recv().await {
        if let Err(e) = event {
            tracing::warn!(error = %e, "file watch error; reloading the dataplanes directory");
        }
        // Coalesce a burst (editors write, rename and chmod in quick succession).
        let deadline = tokio::time::Instant::now() + DEBOUNCE;
        while let Ok(Some(_)) = tokio::time::timeout_at(deadline, events.recv()).await {}
        tracing::debug!(dir = %dir.display(), "dataplanes directory changed; reloading");
        let previous = tx.borrow().clone();
        let dir2 = dir.clone();
        let loaded = tokio::task::spawn_blocking(move || load(&dir2, &previous, &settings)).await;
        match loaded {
            Ok(Ok(loaded)) => {
                log_problems(&loaded, &tx.borrow());
                tx.send_if_modified(|current| {
                    if **current == loaded {
                        return false;
                    }
                    *current = Arc::new(loaded);
                    true
                });
            }
            Ok(Err(e)) => tracing::error!("{e}; keeping the dataplanes loaded before"),
            Err(e) => tracing::error!(error = %e, "dataplane loading task failed"),
        }
        if tx.is_closed() {
            break;
        }
    }
    Ok(())
}

/// Logs each file error once, when it appears or changes.
pub fn log_problems(loaded: &Loaded, before: &Loaded) {
    for (path, state) in &loaded.files {
        let Some(error) = &state.error else { continue };
        if before.files.get(path).and_then(|f| f.error.as_ref()) == Some(error) {
            continue;
        }
        let kept = state.dataplanes.len();
        tracing::error!(
            file = %path.display(),
            line = error.line,
            kept_dataplanes = kept,
            "dataplane file rejected: {}; its last good definitions stay in force",
            error.message
        );
    }
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
        assert!(problems[0].starts_with("d/a.yaml:2: "), "{problems:?}");
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
    fn reads_only_yaml_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), doc("a", 1)).unwrap();
        std::fs::write(dir.path().join("b.yml"), doc("b", 2)).unwrap();
        std::fs::write(dir.path().join("c.txt"), "junk").unwrap();
        std::fs::write(dir.path().join(".d.yaml.swp"), "junk").unwrap();
        std::fs::write(dir.path().join(".e.yaml"), "junk").unwrap();
        let l = load(dir.path(), &Loaded::default(), &settings()).unwrap();
        assert_eq!(names(&l), vec!["default.a", "default.b"]);
        assert!(
            load(&dir.path().join("missing"), &Loaded::default(), &settings())
                .unwrap_err()
                .to_string()
                .contains("create it or point dataplanes.dir")
        );
    }
}
