//! `hdsd validate`: checks the configuration and every dataplane file as
//! `hdsd serve` would load them, and says what it found: every problem
//! (exit 1), the files' warnings, the probes an Envoy older than their kind
//! cannot run, the documents that are not Dataplanes, and on success the
//! worst-case detection time of the check defaults. [`check`] gives the
//! lines in order; `run` only prints them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::config::{CheckFallback, Config, DataplanesSource, StoreKind};
use crate::server;
use crate::sources::{self, Loaded};

/// `hdsd validate`'s arguments.
#[derive(clap::Args)]
pub(super) struct ValidateArgs {
    #[arg(long, short)]
    config: Option<PathBuf>,
}

impl ValidateArgs {
    pub(super) fn run(self) -> anyhow::Result<ExitCode> {
        let config_path = self.config.as_deref();
        let config = Config::load(config_path)?;
        let report = check(&config, config_path);
        for line in &report.lines {
            match line {
                Line::Out(text) => println!("{text}"),
                Line::Err(text) => eprintln!("{text}"),
            }
        }
        Ok(match report.valid {
            true => ExitCode::SUCCESS,
            false => ExitCode::from(1),
        })
    }
}

/// One line of the answer: for stdout, or for stderr.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Line {
    Out(String),
    Err(String),
}

/// What `hdsd validate` says, in order, and whether everything is valid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Report {
    lines: Vec<Line>,
    valid: bool,
}

/// Checks `config` (read from `config_path`, which the problems name) and,
/// when the dataplanes come from files, every file of `dataplanes.dir`.
fn check(config: &Config, config_path: Option<&Path>) -> Report {
    let mut problems = config.validate();
    problems.extend(config.file_problems());
    let mut problems = Config::locate(problems, config_path);
    let mut lines = Vec::new();
    if problems.is_empty() && config.dataplanes.source == DataplanesSource::Api {
        let store = match config.store.kind {
            StoreKind::Redb => "redb",
            StoreKind::Postgres => "PostgreSQL",
        };
        lines.push(Line::Out(format!(
            "ok: configuration valid; dataplanes.source is \"api\": definitions come from the {store} store, checked when they are applied"
        )));
        return Report { lines, valid: true };
    }
    let settings = server::specifier_settings(config);
    let mut dataplanes = 0;
    let mut ignored = String::new();
    if problems.is_empty() {
        let rules = sources::Rules {
            specifier: settings.clone(),
            limits: config.dataplanes.limits(),
        };
        match sources::dir::load(&config.dataplanes.dir, &rules) {
            Ok(loaded) => {
                dataplanes = loaded.dataplanes.len();
                problems.extend(loaded.problems());
                ignored = ignored_summary(&loaded);
                lines.extend(loaded.warnings().into_iter().map(Line::Err));
                lines.extend(version_warnings(&loaded, config).into_iter().map(Line::Err));
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    if !ignored.is_empty() {
        // Beside the problems on stderr when there are any.
        lines.push(match problems.is_empty() {
            true => Line::Out(ignored),
            false => Line::Err(ignored),
        });
    }
    if problems.is_empty() {
        lines.push(Line::Out(format!(
            "ok: configuration valid, {dataplanes} dataplanes in {}",
            config.dataplanes.dir.display()
        )));
        let detection = settings
            .defaults
            .worst_case_detection(config.hds.report_interval);
        lines.push(Line::Out(format!(
            "worst-case detection with the check defaults: {} (unhealthy_threshold x no_traffic_interval + timeout + report_interval)",
            humantime::format_duration(detection)
        )));
        return Report { lines, valid: true };
    }
    let count = problems.len();
    lines.extend(problems.into_iter().map(Line::Err));
    lines.push(Line::Err(format!("{count} problem(s) found")));
    Report {
        lines,
        valid: false,
    }
}

/// A warning for each probe that an Envoy older than its kind needs but
/// still supported (docs/configuration.md, "Envoy versions") cannot run.
fn version_warnings(loaded: &Loaded, config: &Config) -> Vec<String> {
    let fallback = match config.hds.check.fallback {
        CheckFallback::Tcp => "it is checked with a TCP connect instead (hds.check.fallback)",
        CheckFallback::None => "its inbounds read unsupported there (not ready); set hds.check.fallback = \"tcp\" to check them with a TCP connect instead",
    };
    let oldest = crate::capability::OLDEST_SUPPORTED;
    let mut warnings = Vec::new();
    for (id, defined) in loaded.dataplanes.iter() {
        for (target, r) in defined.specifier.beyond_oldest_supported() {
            let ports: Vec<String> = target
                .inbounds
                .iter()
                .filter_map(|&i| defined.dataplane.inbounds.get(i))
                .map(|i| i.port.to_string())
                .collect();
            warnings.push(format!(
                "warning: {id} inbound {} ({}): {} needs Envoy >= {}.{}, and hdsd supports Envoy from {}.{}: on an older Envoy {fallback}",
                ports.join(", "),
                defined.file.display(),
                r.what,
                r.since.major,
                r.since.minor,
                oldest.major,
                oldest.minor,
            ));
        }
    }
    warnings
}

/// `ignored N documents that are not Dataplanes (Mesh: 1, ...)`, or nothing.
fn ignored_summary(loaded: &Loaded) -> String {
    let by_type = loaded.ignored_by_type();
    let total: usize = by_type.values().sum();
    if total == 0 {
        return String::new();
    }
    let kinds: Vec<String> = by_type.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    let what = if total == 1 {
        "document that is not a Dataplane"
    } else {
        "documents that are not Dataplanes"
    };
    format!(
        "ignored {total} {what} ({}); GET /api/v1/sources lists them per file",
        kinds.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configuration of the defaults reading `dataplanes` (one file per
    /// `(name, text)`) from a fresh directory.
    fn setup(files: &[(&str, &str)]) -> (tempfile::TempDir, Config) {
        let dir = tempfile::tempdir().unwrap();
        let dps = dir.path().join("dataplanes");
        std::fs::create_dir_all(&dps).unwrap();
        for (name, text) in files {
            std::fs::write(dps.join(name), text).unwrap();
        }
        let mut config = Config {
            state_dir: dir.path().join("state"),
            ..Config::default()
        };
        config.dataplanes.dir = dps;
        (dir, config)
    }

    fn dataplane(name: &str, probe: &str) -> String {
        format!(
            "type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  admin: {{port: 9901}}\n  inbound:\n  - port: 10001\n    servicePort: 8080\n    tags: {{kuma.io/service: {name}}}\n{probe}"
        )
    }

    fn text(report: &Report) -> Vec<String> {
        report
            .lines
            .iter()
            .map(|l| match l {
                Line::Out(t) => format!("out: {t}"),
                Line::Err(t) => format!("err: {t}"),
            })
            .collect()
    }

    /// Valid files: the count, then the detection bound of the defaults
    /// (3 x 1 s + 1 s + 1 s with the shipped defaults), on stdout.
    #[test]
    fn valid_files_give_the_count_and_the_detection_bound() {
        let (_dir, config) = setup(&[("web.yaml", &dataplane("web", ""))]);
        let report = check(&config, None);
        assert!(report.valid, "{report:?}");
        let settings = server::specifier_settings(&config);
        let detection = settings
            .defaults
            .worst_case_detection(config.hds.report_interval);
        assert_eq!(
            text(&report),
            [
                format!(
                    "out: ok: configuration valid, 1 dataplanes in {}",
                    config.dataplanes.dir.display()
                ),
                format!(
                    "out: worst-case detection with the check defaults: {} (unhealthy_threshold x no_traffic_interval + timeout + report_interval)",
                    humantime::format_duration(detection)
                ),
            ]
        );
        // The bound follows the settings it names.
        let mut slower = config.clone();
        slower.hds.report_interval += std::time::Duration::from_secs(10);
        let line = text(&check(&slower, None))[1].clone();
        let want = humantime::format_duration(detection + std::time::Duration::from_secs(10));
        assert!(line.contains(&format!("defaults: {want} (")), "{line}");
    }

    /// A gRPC probe needs a newer Envoy than the oldest supported: a
    /// warning names the dataplane, the inbound, the file and what happens
    /// on an older Envoy under each `hds.check.fallback`; still valid.
    #[test]
    fn a_probe_beyond_the_oldest_envoy_is_warned_of_with_the_fallback() {
        let grpc = "    serviceProbe:\n      grpc: {}\n";
        let (_dir, mut config) = setup(&[
            ("cart.yaml", &dataplane("cart", grpc)),
            ("web.yaml", &dataplane("web", "")),
        ]);
        let oldest = crate::capability::OLDEST_SUPPORTED;
        let file = config.dataplanes.dir.join("cart.yaml");
        let warning = |then: &str| {
            format!(
                "err: warning: default.cart inbound 10001 ({}): gRPC probe needs Envoy >= 1.38, and hdsd supports Envoy from {}.{}: on an older Envoy {then}",
                file.display(),
                oldest.major,
                oldest.minor
            )
        };
        config.hds.check.fallback = CheckFallback::None;
        let report = check(&config, None);
        assert!(report.valid, "{report:?}");
        assert_eq!(
            text(&report)[0],
            warning("its inbounds read unsupported there (not ready); set hds.check.fallback = \"tcp\" to check them with a TCP connect instead")
        );
        assert!(text(&report)[1].starts_with("out: ok: configuration valid, 2 dataplanes"));
        config.hds.check.fallback = CheckFallback::Tcp;
        let report = check(&config, None);
        assert_eq!(
            text(&report)[0],
            warning("it is checked with a TCP connect instead (hds.check.fallback)")
        );
        // A probe every supported Envoy runs: no warning.
        let (_dir, config) = setup(&[(
            "web.yaml",
            &dataplane("web", "    serviceProbe:\n      tcp: {}\n"),
        )]);
        assert!(text(&check(&config, None))[0].starts_with("out: ok: "));
    }

    /// Documents of other types are counted by type: on stdout beside a
    /// valid answer, on stderr beside problems.
    #[test]
    fn documents_that_are_not_dataplanes_are_summed_up_by_type() {
        let mesh = "type: Mesh\nname: default\n";
        let (_dir, config) =
            setup(&[("all.yaml", &format!("{mesh}---\n{}", dataplane("web", "")))]);
        let report = check(&config, None);
        assert!(report.valid, "{report:?}");
        assert_eq!(
            text(&report)[0],
            "out: ignored 1 document that is not a Dataplane (Mesh: 1); GET /api/v1/sources lists them per file"
        );
        let (_dir, config) = setup(&[
            ("all.yaml", &format!("{mesh}---\n{mesh}")),
            (
                "broken.yaml",
                "type: Dataplane\nmesh: default\nname: db\nnetworking: {address: db.local}\n",
            ),
        ]);
        let report = check(&config, None);
        assert!(!report.valid);
        let lines = text(&report);
        assert!(
            lines.contains(&"err: ignored 2 documents that are not Dataplanes (Mesh: 2); GET /api/v1/sources lists them per file".to_string()),
            "{lines:?}"
        );
    }

    /// Every problem on stderr, then their count; exit 1.
    #[test]
    fn problems_are_listed_then_counted() {
        let (_dir, mut config) = setup(&[
            (
                "a.yaml",
                "type: Dataplane\nmesh: default\nname: a\nnetworking: {address: a.local}\n",
            ),
            (
                "b.yaml",
                "type: Dataplane\nmesh: default\nname: b\nnetworking: {address: b.local}\n",
            ),
        ]);
        let report = check(&config, None);
        assert!(!report.valid);
        let lines = text(&report);
        assert_eq!(
            lines.last().unwrap(),
            "err: 2 problem(s) found",
            "{lines:?}"
        );
        assert!(lines.iter().all(|l| l.starts_with("err: ")), "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("a.yaml")), "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("b.yaml")), "{lines:?}");
        // A configuration problem stops before the files are read.
        config.hds.report_interval = std::time::Duration::ZERO;
        let lines = text(&check(&config, None));
        assert!(lines.iter().all(|l| !l.contains("a.yaml")), "{lines:?}");
        assert!(
            lines.last().unwrap().ends_with(" problem(s) found"),
            "{lines:?}"
        );
    }

    /// With `dataplanes.source = "api"` no file is read: the definitions
    /// are checked when they are applied.
    #[test]
    fn definitions_from_the_api_are_not_read() {
        let (_dir, mut config) = setup(&[("a.yaml", "not: [yaml")]);
        config.dataplanes.source = DataplanesSource::Api;
        let report = check(&config, None);
        assert!(report.valid, "{report:?}");
        assert_eq!(
            text(&report),
            ["out: ok: configuration valid; dataplanes.source is \"api\": definitions come from the redb store, checked when they are applied"]
        );
    }
}
