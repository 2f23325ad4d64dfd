//! `hdsd apply -f FILE|DIR` and `hdsd delete MESH NAME`: definitions sent to
//! a running hdsd's API (`dataplanes.source = "api"`), like `kumactl apply`.
//! Splitting files into documents is a plain function; the rest is HTTP.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::http::{Api, Method};
use super::ApiArgs;
use crate::dataplane::{self, DataplaneId, Format};

/// `hdsd apply`'s arguments.
#[derive(clap::Args)]
pub(super) struct ApplyArgs {
    /// A file (YAML documents separated by ---, or JSON), or a directory of them.
    #[arg(long, short = 'f')]
    file: PathBuf,
    #[command(flatten)]
    pub(super) api: ApiArgs,
}

impl ApplyArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        let api = Api::connect(self.api)?;
        let applied = apply(&api, &self.file).map_err(anyhow::Error::msg)?;
        for line in &applied.lines {
            println!("{line}");
        }
        for problem in &applied.problems {
            eprintln!("{problem}");
        }
        if applied.problems.is_empty() {
            Ok(ExitCode::SUCCESS)
        } else {
            eprintln!("{} document(s) not applied", applied.problems.len());
            Ok(ExitCode::from(1))
        }
    }
}

/// `hdsd delete`'s arguments.
#[derive(clap::Args)]
pub(super) struct DeleteArgs {
    mesh: String,
    name: String,
    #[command(flatten)]
    pub(super) api: ApiArgs,
}

impl DeleteArgs {
    /// The dataplane named, or why `MESH NAME` names none.
    fn id(&self) -> anyhow::Result<DataplaneId> {
        let (mesh, name) = (&self.mesh, &self.name);
        DataplaneId::try_new(mesh, name)
            .map_err(|e| anyhow::anyhow!("{mesh:?} {name:?} is not a dataplane identity: {e}"))
    }

    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        let id = self.id()?;
        let api = Api::connect(self.api)?;
        delete(&api, &id).map_err(|e| anyhow::anyhow!("dataplane {id} not deleted: {e}"))?;
        println!("dataplane {id} deleted");
        Ok(ExitCode::SUCCESS)
    }
}

/// One document of a file, with its 1-based position.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Document {
    position: usize,
    text: String,
}

/// Splits a YAML stream at its `---` lines (a JSON file is one document).
/// Empty documents are dropped; positions count every document.
fn split_documents(text: &str, format: Format) -> Vec<Document> {
    if format == Format::Json {
        return vec![Document {
            position: 1,
            text: text.to_string(),
        }];
    }
    let mut documents = Vec::new();
    let mut current = String::new();
    let mut position = 1;
    let mut push = |current: &mut String, position: usize| {
        if !current
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            documents.push(Document {
                position,
                text: std::mem::take(current),
            });
        }
        current.clear();
    };
    for line in text.lines() {
        let marker = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        if marker {
            push(&mut current, position);
            position += 1;
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    push(&mut current, position);
    documents
}

/// The files `apply -f` reads: the file itself, or a directory's
/// `*.yaml` / `*.yml` / `*.json` files (not hidden, not recursive), in order.
fn files_of(path: &Path) -> std::io::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && Format::of_path(p).is_some()
                && !p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with('.'))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// Where the API keeps a dataplane's definition.
fn path(id: &DataplaneId) -> String {
    format!("/api/v1/dataplanes/{}/{}", id.mesh, id.name)
}

/// The API's refusal in words.
fn message(status: u16, body: &serde_json::Value) -> String {
    let said = body
        .get("error")
        .and_then(|e| e.as_str())
        .unwrap_or("no message");
    match status {
        401 => format!("HTTP 401: {said}; pass one of the server's api.tokens with --api-token"),
        _ => format!("HTTP {status}: {said}"),
    }
}

/// Sends one document; `Ok` names the revision stored.
fn put(api: &Api, id: &DataplaneId, doc: &str, format: Format) -> Result<u64, String> {
    let content_type = match format {
        Format::Json => "application/json",
        Format::Yaml => "application/yaml",
    };
    let put = Method::Put {
        content_type,
        body: doc.to_string(),
    };
    let (status, body) = api.send(put, &path(id))?;
    if status == 200 {
        Ok(body.get("revision").and_then(|r| r.as_u64()).unwrap_or(0))
    } else {
        Err(message(status, &body))
    }
}

/// Deletes one definition.
fn delete(api: &Api, id: &DataplaneId) -> Result<(), String> {
    let (status, body) = api.send(Method::Delete, &path(id))?;
    if status == 204 {
        Ok(())
    } else {
        Err(message(status, &body))
    }
}

/// What `apply` did, one line per document, and whether everything went in.
#[derive(Debug, Default)]
struct Applied {
    lines: Vec<String>,
    problems: Vec<String>,
}

/// Applies every Dataplane document of `path` (a file or a directory);
/// documents of other types are skipped and listed, as the files source does.
fn apply(api: &Api, path: &Path) -> Result<Applied, String> {
    let files = files_of(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if files.is_empty() {
        return Err(format!(
            "{} holds no *.yaml, *.yml or *.json file",
            path.display()
        ));
    }
    let mut applied = Applied::default();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
        let format = Format::of_path(&file).unwrap_or(Format::Yaml);
        for doc in split_documents(&text, format) {
            let place = format!("{} (document {})", file.display(), doc.position);
            let parsed = match dataplane::parse_file(&doc.text, format) {
                Ok(parsed) => parsed,
                Err(e) => {
                    applied.problems.push(format!("{place}: {e}"));
                    continue;
                }
            };
            for ignored in &parsed.ignored {
                applied.lines.push(format!(
                    "{place}: skipped {}{} (not a Dataplane)",
                    ignored.kind,
                    ignored
                        .name
                        .as_deref()
                        .map(|n| format!(" {n}"))
                        .unwrap_or_default()
                ));
            }
            for w in &parsed.warnings {
                applied
                    .lines
                    .push(format!("{place}: warning: {}", w.message));
            }
            for dp in &parsed.dataplanes {
                match put(api, &dp.id, &doc.text, format) {
                    Ok(revision) => applied
                        .lines
                        .push(format!("dataplane {} applied (revision {revision})", dp.id)),
                    Err(e) => applied
                        .problems
                        .push(format!("{place}: dataplane {}: {e}", dp.id)),
                }
            }
        }
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_splits_at_its_markers() {
        let text = "# a comment only\n---\ntype: Mesh\nname: default\n--- # web\ntype: Dataplane\nname: a\n---\n\n";
        let docs = split_documents(text, Format::Yaml);
        assert_eq!(
            docs,
            vec![
                Document {
                    position: 2,
                    text: "type: Mesh\nname: default\n".into()
                },
                Document {
                    position: 3,
                    text: "type: Dataplane\nname: a\n".into()
                },
            ]
        );
        // A block scalar's line that merely contains dashes is no marker.
        let docs = split_documents("a: |\n  ---x\nb: 1\n", Format::Yaml);
        assert_eq!(docs.len(), 1);
        assert_eq!(split_documents("{\"a\": 1}", Format::Json).len(), 1);
    }

    #[test]
    fn a_directory_gives_its_dataplane_files_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.yaml", "a.json", "c.txt", ".d.yaml", "e.yml"] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        let names: Vec<String> = files_of(dir.path())
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["a.json", "b.yaml", "e.yml"]);
        let file = dir.path().join("b.yaml");
        assert_eq!(files_of(&file).unwrap(), vec![file]);
    }

    #[test]
    fn a_refusal_says_what_the_api_said() {
        let said = serde_json::json!({"error": "dataplanes.source is \"files\""});
        assert_eq!(
            message(409, &said),
            "HTTP 409: dataplanes.source is \"files\""
        );
        assert!(message(401, &serde_json::Value::Null).contains("--api-token"));
        assert_eq!(
            message(500, &serde_json::Value::Null),
            "HTTP 500: no message"
        );
    }

    #[test]
    fn delete_names_one_dataplane() {
        let args = |mesh: &str, name: &str| DeleteArgs {
            mesh: mesh.into(),
            name: name.into(),
            api: ApiArgs {
                api: "http://h:1".into(),
                api_token: None,
                ca: None,
            },
        };
        let id = args("default", "web-01").id().unwrap();
        assert_eq!(path(&id), "/api/v1/dataplanes/default/web-01");
        let said = args("default", "Web 01").id().unwrap_err().to_string();
        assert!(
            said.starts_with("\"default\" \"Web 01\" is not a dataplane identity: "),
            "{said}"
        );
    }
}
