//! `gen-dataplanes`: Dataplane YAML files for hdsd, and the manifest that lets
//! `run` find the same dataplanes again (names, files, service ports).
//!
//! The inbounds' service ports point at 127.0.0.1 ports where nothing has to
//! listen: no real Envoy probes them, the loadgen invents the statuses.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// The manifest's file name: hidden, so hdsd does not read it.
pub const MANIFEST: &str = ".loadgen.json";

/// Inbound `k` listens on `INBOUND_PORT_BASE + k`.
pub const INBOUND_PORT_BASE: u16 = 10001;
/// Inbound `k` probes 127.0.0.1:`SERVICE_PORT_BASE + k` ...
pub const SERVICE_PORT_BASE: u16 = 20001;
/// ... or, after a churn rewrite of inbound 0, `CHURN_PORT_BASE + k`.
pub const CHURN_PORT_BASE: u16 = 30001;

#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// How many dataplanes.
    #[arg(long)]
    pub count: usize,
    /// Inbounds per dataplane (each probed at its own service port).
    #[arg(long, default_value_t = 2)]
    pub inbounds: u16,
    /// Directory to write into (created if missing; existing loadgen files are replaced).
    #[arg(long)]
    pub dir: PathBuf,
    #[arg(long, default_value = "default")]
    pub mesh: String,
    /// Dataplane names are <prefix><index>, e.g. dp-000042.
    #[arg(long, default_value = "dp-")]
    pub prefix: String,
    /// Dataplanes per YAML file (documents separated by `---`).
    #[arg(long, default_value_t = 100)]
    pub per_file: usize,
    /// Spread the inbounds over this many `kuma.io/service` values
    /// (svc-0000...), round robin over every dataplane's inbounds; 0: inbound
    /// `k` of every dataplane is `svc-k`.
    #[arg(long, default_value_t = 0)]
    pub services: usize,
}

/// What `run` needs to know about generated dataplanes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub count: usize,
    pub inbounds: u16,
    pub mesh: String,
    pub prefix: String,
    pub per_file: usize,
    /// See [`Args::services`] (0 in manifests written before it existed).
    #[serde(default)]
    pub services: usize,
}

impl Manifest {
    pub fn name(&self, index: usize) -> String {
        format!("{}{index:06}", self.prefix)
    }

    pub fn file_name(&self, file: usize) -> String {
        format!("{}{file:05}.yaml", self.prefix)
    }

    /// The `kuma.io/service` tag of inbound `k` of dataplane `index`.
    pub fn service(&self, index: usize, k: u16) -> String {
        if self.services == 0 {
            format!("svc-{k}")
        } else {
            format!(
                "svc-{:04}",
                (index * usize::from(self.inbounds) + usize::from(k)) % self.services
            )
        }
    }

    /// Every service name, as EDS resource names (`<mesh>/<service>`).
    pub fn eds_resource_names(&self) -> Vec<String> {
        let services: std::collections::BTreeSet<String> = if self.services == 0 {
            (0..self.inbounds).map(|k| self.service(0, k)).collect()
        } else {
            (0..self.services).map(|s| format!("svc-{s:04}")).collect()
        };
        services
            .into_iter()
            .map(|s| format!("{}/{s}", self.mesh))
            .collect()
    }

    /// The `networking.address` of dataplane `index`: 10.0.0.1 + index, unique
    /// per dataplane, so that EDS endpoints (address, inbound port) tell the
    /// dataplanes apart. Nothing connects to it: probes go to `serviceAddress`.
    pub fn address(&self, index: usize) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 0, 0, 1)) + index as u32)
    }

    /// The dataplane named `name`, if it is one of these.
    pub fn index_of_name(&self, name: &str) -> Option<usize> {
        let index: usize = name.strip_prefix(&self.prefix)?.parse().ok()?;
        (index < self.count && self.name(index) == name).then_some(index)
    }

    pub fn file_of(&self, index: usize) -> usize {
        index / self.per_file
    }

    pub fn files(&self) -> usize {
        self.count.div_ceil(self.per_file)
    }

    /// The YAML of one file; `churned` dataplanes probe inbound 0 at its churn port.
    pub fn render_file(&self, file: usize, churned: &HashMap<usize, bool>) -> String {
        let first = file * self.per_file;
        let last = (first + self.per_file).min(self.count);
        let mut s =
            String::with_capacity((last - first) * (200 + 120 * usize::from(self.inbounds)));
        for index in first..last {
            if index > first {
                s.push_str("---\n");
            }
            let _ = write!(
                s,
                "type: Dataplane\nmesh: {}\nname: {}\nnetworking:\n  address: {}\n  inbound:\n",
                self.mesh,
                self.name(index),
                self.address(index)
            );
            for k in 0..self.inbounds {
                let service_port = if k == 0 && churned.get(&index).copied().unwrap_or(false) {
                    CHURN_PORT_BASE + k
                } else {
                    SERVICE_PORT_BASE + k
                };
                let _ = write!(
                    s,
                    "  - port: {}\n    servicePort: {service_port}\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: {}}}\n",
                    INBOUND_PORT_BASE + k,
                    self.service(index, k)
                );
            }
        }
        s
    }

    /// Writes one file atomically (temp file, then rename), as config tools do.
    pub fn write_file(
        &self,
        dir: &Path,
        file: usize,
        churned: &HashMap<usize, bool>,
    ) -> anyhow::Result<()> {
        let name = self.file_name(file);
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, self.render_file(file, churned))
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, dir.join(&name))
            .with_context(|| format!("cannot rename {} into place", tmp.display()))?;
        Ok(())
    }

    pub fn load(dir: &Path) -> anyhow::Result<Manifest> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {}; create the dataplanes with `hdsd-loadgen gen-dataplanes --dir {}`",
                path.display(),
                dir.display()
            )
        })?;
        serde_json::from_str(&text).with_context(|| format!("{} is not a manifest", path.display()))
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.count > 0, "--count must be > 0");
    anyhow::ensure!(
        (1..=1000).contains(&args.inbounds),
        "--inbounds must be 1..=1000"
    );
    anyhow::ensure!(args.per_file > 0, "--per-file must be > 0");
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let manifest = Manifest {
        count: args.count,
        inbounds: args.inbounds,
        mesh: args.mesh,
        prefix: args.prefix,
        per_file: args.per_file,
        services: args.services,
    };
    // Remove files of an earlier, larger generation with the same prefix.
    for entry in std::fs::read_dir(&args.dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(&manifest.prefix) && name.ends_with(".yaml") {
            std::fs::remove_file(entry.path())?;
        }
    }
    let none = HashMap::new();
    for file in 0..manifest.files() {
        manifest.write_file(&args.dir, file, &none)?;
    }
    std::fs::write(
        args.dir.join(MANIFEST),
        serde_json::to_string_pretty(&manifest)?,
    )?;
    eprintln!(
        "wrote {} dataplanes x {} inbounds in {} files under {}",
        manifest.count,
        manifest.inbounds,
        manifest.files(),
        args.dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_parse_as_hdsd_dataplanes() {
        let m = Manifest {
            count: 5,
            inbounds: 3,
            mesh: "default".into(),
            prefix: "dp-".into(),
            per_file: 2,
            services: 0,
        };
        assert_eq!(m.files(), 3);
        let mut churned = HashMap::new();
        churned.insert(3, true);
        let dps = hdsd::dataplane::parse_documents(&m.render_file(1, &churned)).unwrap();
        assert_eq!(dps.len(), 2);
        assert_eq!(dps[0].id.to_string(), "default.dp-000002");
        assert_eq!(dps[1].inbounds[0].service_port, CHURN_PORT_BASE);
        assert_eq!(dps[1].inbounds[2].service_port, SERVICE_PORT_BASE + 2);
        assert_eq!(dps[0].inbounds[1].tags["kuma.io/service"], "svc-1");
        assert_eq!(dps[0].address.to_string(), "10.0.0.3");
        assert_eq!(m.index_of_name("dp-000004"), Some(4));
        assert_eq!(m.index_of_name("dp-000005"), None);
        assert_eq!(
            hdsd::dataplane::parse_documents(&m.render_file(2, &churned))
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn services_spread_inbounds_round_robin() {
        let m = Manifest {
            count: 10,
            inbounds: 2,
            mesh: "default".into(),
            prefix: "dp-".into(),
            per_file: 10,
            services: 4,
        };
        let dps = hdsd::dataplane::parse_documents(&m.render_file(0, &HashMap::new())).unwrap();
        let tag = |i: usize, k: usize| dps[i].inbounds[k].tags["kuma.io/service"].clone();
        assert_eq!(
            (tag(0, 0), tag(0, 1), tag(1, 0), tag(2, 0)),
            (
                "svc-0000".into(),
                "svc-0001".into(),
                "svc-0002".into(),
                "svc-0000".into()
            )
        );
        assert_eq!(m.eds_resource_names().len(), 4);
        assert_eq!(m.eds_resource_names()[3], "default/svc-0003");
    }
}
