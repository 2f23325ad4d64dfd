//! `hdsd apply -f FILE|DIR` and `hdsd delete MESH NAME`: definitions sent to
//! a running hdsd's API (`dataplanes.source = "api"`), like `kumactl apply`.
//! Splitting files into documents is a plain function; the rest is HTTP.

use std::path::{Path, PathBuf};

use crate::dataplane::{self, DataplaneId, Format};

/// One document of a file, with its 1-based position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub position: usize,
    pub text: String,
}

/// Splits a YAML stream at its `---` lines (a JSON file is one document).
/// Empty documents are dropped; positions count every document.
pub fn split_documents(text: &str, format: Format) -> Vec<Document> {
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
pub fn files_of(path: &Path) -> std::io::Result<Vec<PathBuf>> {
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

/// How to reach the API.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    pub agent: &'a ureq::Agent,
    pub api: &'a str,
    pub token: Option<&'a str>,
}

impl Target<'_> {
    fn url(&self, id: &DataplaneId) -> String {
        format!(
            "{}/api/v1/dataplanes/{}/{}",
            self.api.trim_end_matches('/'),
            id.mesh,
            id.name
        )
    }

    fn authorization(&self) -> Option<String> {
        self.token.map(|t| format!("Bearer {t}"))
    }

    /// Sends `method` (`PUT`, `POST` or `DELETE`) to `url` with the token
    /// and, for `PUT` and `POST`, the JSON `body`: the status and the JSON
    /// answer (`null` when there is none), whatever the status.
    pub fn send(
        &self,
        method: &str,
        url: &str,
        body: Option<&str>,
    ) -> Result<(u16, serde_json::Value), String> {
        let auth = self.authorization();
        let with_body = |request: ureq::RequestBuilder<ureq::typestate::WithBody>| {
            let mut request = request
                .config()
                .http_status_as_error(false)
                .build()
                .header("Content-Type", "application/json");
            if let Some(auth) = &auth {
                request = request.header("Authorization", auth);
            }
            request.send(body.unwrap_or_default())
        };
        let response = match method {
            "PUT" => with_body(self.agent.put(url)),
            "POST" => with_body(self.agent.post(url)),
            _ => {
                let mut request = self
                    .agent
                    .delete(url)
                    .config()
                    .http_status_as_error(false)
                    .build();
                if let Some(auth) = &auth {
                    request = request.header("Authorization", auth);
                }
                request.call()
            }
        };
        outcome(url, response)
    }
}

/// An answer of the API: status and its `error` message, if any.
fn outcome(
    url: &str,
    response: Result<http::Response<ureq::Body>, ureq::Error>,
) -> Result<(u16, serde_json::Value), String> {
    let mut response = response.map_err(|e| {
        format!("cannot reach {url}: {e}; is hdsd running, and is --api its api.listen address?")
    })?;
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().unwrap_or_default();
    let value = serde_json::from_str(&body).unwrap_or(serde_json::Value::Null);
    Ok((status, value))
}

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
pub fn put(
    target: &Target<'_>,
    id: &DataplaneId,
    doc: &str,
    format: Format,
) -> Result<u64, String> {
    let url = target.url(id);
    let content_type = match format {
        Format::Json => "application/json",
        Format::Yaml => "application/yaml",
    };
    let mut request = target
        .agent
        .put(&url)
        .config()
        .http_status_as_error(false)
        .build()
        .header("Content-Type", content_type);
    if let Some(auth) = target.authorization() {
        request = request.header("Authorization", &auth);
    }
    let (status, body) = outcome(&url, request.send(doc))?;
    if status == 200 {
        Ok(body.get("revision").and_then(|r| r.as_u64()).unwrap_or(0))
    } else {
        Err(message(status, &body))
    }
}

/// Deletes one definition.
pub fn delete(target: &Target<'_>, id: &DataplaneId) -> Result<(), String> {
    let url = target.url(id);
    let mut request = target
        .agent
        .delete(&url)
        .config()
        .http_status_as_error(false)
        .build();
    if let Some(auth) = target.authorization() {
        request = request.header("Authorization", &auth);
    }
    let (status, body) = outcome(&url, request.call())?;
    if status == 204 {
        Ok(())
    } else {
        Err(message(status, &body))
    }
}

/// What `apply` did, one line per document, and whether everything went in.
#[derive(Debug, Default)]
pub struct Applied {
    pub lines: Vec<String>,
    pub problems: Vec<String>,
}

/// Applies every Dataplane document of `path` (a file or a directory);
/// documents of other types are skipped and listed, as the files source does.
pub fn apply(target: &Target<'_>, path: &Path) -> Result<Applied, String> {
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
                match put(target, &dp.id, &doc.text, format) {
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
    }
}
