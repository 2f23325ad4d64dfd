//! The layers of hdsd, bottom to top, in one place; a test holds the code to
//! them. A module may name (`crate::...`) a module of its own layer or of a
//! layer below, never one above. ARCHITECTURE.md ("Layers") explains them.
//!
//! Inside a layer, imports may go both ways as far as this test is
//! concerned; today no import circle is left (ARCHITECTURE.md, "Layers").

/// Each layer: its name, the sentence that says what may live there, and
/// its top-level modules (`src/<module>.rs` or `src/<module>/`).
pub const LAYERS: &[(&str, &str, &[&str])] = &[
    (
        "leaves",
        "metrics, names, the clock, the file watcher, the journal's budget, the log's byte budget and the generated protobuf code import nothing of hdsd: callers pass plain numbers, strings and label values",
        &["metrics", "names", "clock", "fswatch", "pb", "journal", "logging"],
    ),
    (
        "core",
        "the domain as plain data and pure functions: dataplanes, probes, what each Envoy runs, specifiers, reports, readiness, the operator's word, bootstraps; no task, no network, no settings",
        &[
            "probe",
            "capability",
            "dataplane",
            "report",
            "specifier",
            "readiness",
            "operator",
            "bootstrap",
        ],
    ),
    (
        "config",
        "plain settings, validated with the core's rules; owners convert them into their own types",
        &["config"],
    ),
    (
        "state",
        "who owns state, one writer each: the dataplane sources, the registry and its dataplane tasks, the stores, the change feed, the token gate (and how a gRPC request shows it a token)",
        &["auth", "grpc_auth", "source", "registry", "store", "feed"],
    ),
    (
        "view",
        "the read model every reader shares: dataplanes built from the registry's state, the zones as a global's hub publishes them, the change-feed entries two zone views differ by, and their protobuf form",
        &["view"],
    ),
    (
        "cluster",
        "what several instances share (membership, stream holders, the sweep, shared keys and revocations, revision numbering), one trait with a single-instance and a PostgreSQL implementation",
        &["cluster"],
    ),
    (
        "consumers",
        "readers of the feed and the view: gRPC watch, SSE, EDS, services, the metrics scrape, the last hour's history",
        &["consumers", "scrape", "history"],
    ),
    (
        "zones",
        "zone sync, both sides in one folder: the pure machines (the global's session, remote zone and hub, the zone's uplink, liveness, backoff) and their drivers (the global's zone listener, hub task, ledger and zone admin, the zone's link, which reads its own feed through the consumers' watch)",
        &["zones"],
    ),
    (
        "edges",
        "I/O and wiring: the listeners, HDS, the REST API and the page, TLS, the CLI's clients, the server",
        &[
            "net",
            "tls",
            "hds",
            "api",
            "ui",
            "cli",
            "server",
        ],
    ),
];

/// The layer (index into [`LAYERS`]) of a top-level module.
pub fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|(_, _, m)| m.contains(&module))
}

/// One import that runs up a layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub file: String,
    pub line: usize,
    pub from: String,
    pub to: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |m: &str| layer_of(m).map_or("?", |l| LAYERS[l].0);
        let rule = layer_of(&self.from).map_or("", |l| LAYERS[l].1);
        write!(
            f,
            "{}:{}: `{}` ({}) names `crate::{}` ({}), a layer above it; the rule for {}: {}",
            self.file,
            self.line,
            self.from,
            name(&self.from),
            self.to,
            name(&self.to),
            name(&self.from),
            rule
        )
    }
}

/// The imports of one source file (`module` is its top-level module) that
/// run up a layer. Comments and the file's `#[cfg(test)]` part are skipped:
/// tests may reach anything.
pub fn check_file(file: &str, module: &str, text: &str) -> Vec<Violation> {
    let Some(own) = layer_of(module) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            rest = &rest[at + "crate::".len()..];
            let target: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            match layer_of(&target) {
                Some(l) if l > own => out.push(Violation {
                    file: file.to_string(),
                    line: i + 1,
                    from: module.to_string(),
                    to: target,
                }),
                _ => {}
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                sources(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// Every module of `src/` is in a layer, and none names a module of a
    /// layer above its own.
    #[test]
    fn no_module_imports_a_layer_above_its_own() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        sources(&src, &mut files);
        let mut violations = Vec::new();
        let mut unplaced = Vec::new();
        for path in files {
            let rel = path
                .strip_prefix(&src)
                .unwrap()
                .to_string_lossy()
                .to_string();
            let module = rel
                .split('/')
                .next()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string();
            // The crate roots, the separate binaries and this table are above every layer.
            if matches!(module.as_str(), "lib" | "main" | "bin" | "layers") {
                continue;
            }
            if layer_of(&module).is_none() {
                unplaced.push(rel.clone());
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            violations.extend(check_file(&format!("src/{rel}"), &module, &text));
        }
        unplaced.sort();
        unplaced.dedup();
        assert!(
            unplaced.is_empty(),
            "modules in no layer (add them to layers::LAYERS): {unplaced:?}"
        );
        let lines: Vec<String> = violations.iter().map(|v| v.to_string()).collect();
        assert!(
            lines.is_empty(),
            "imports that run up:\n{}",
            lines.join("\n")
        );
    }

    /// The check itself: an import up is caught, with file, line and rule;
    /// one down, a comment and test code are not.
    #[test]
    fn an_import_that_runs_up_is_named_with_its_rule() {
        let text = "use crate::probe::Check;\n// crate::server is only named here\nuse crate::api::DataplaneItem;\n#[cfg(test)]\nmod tests { use crate::server; }\n";
        let v = check_file("src/readiness.rs", "readiness", text);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!((v[0].line, v[0].to.as_str()), (3, "api"));
        let said = v[0].to_string();
        assert!(
            said.starts_with("src/readiness.rs:3: `readiness` (core) names `crate::api` (edges)"),
            "{said}"
        );
        assert!(said.contains("no task, no network"), "{said}");
        // metrics is a leaf: even the feed is above it.
        assert_eq!(
            check_file(
                "src/metrics.rs",
                "metrics",
                "x(crate::feed::ResyncReason::ALL)"
            )
            .len(),
            1
        );
    }

    /// `registry` -> `store` runs one way (ARCHITECTURE.md, "Layers"): no
    /// store file names the registry outside its tests.
    #[test]
    fn the_store_does_not_name_the_registry() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = vec![src.join("store.rs")];
        sources(&src.join("store"), &mut files);
        let mut found = Vec::new();
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("#[cfg(test)]") {
                    break;
                }
                let code = line.split("//").next().unwrap_or("");
                if code.contains("crate::registry") {
                    found.push(format!("{}:{}", path.display(), i + 1));
                }
            }
        }
        assert!(found.is_empty(), "the store names the registry: {found:?}");
    }

    #[test]
    fn every_module_is_in_one_layer() {
        let mut seen = std::collections::BTreeSet::new();
        for (_, _, modules) in LAYERS {
            for m in *modules {
                assert!(seen.insert(*m), "{m} is in two layers");
            }
        }
    }
}
