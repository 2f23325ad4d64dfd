//! The registry of dataplanes: who owns which state.
//!
//! - The registry task is the single writer of the catalog (which dataplanes
//!   exist). It diffs each new [`Loaded`] source snapshot against the catalog
//!   and publishes the catalog on a watch channel.
//! - Each dataplane has its own task, the single writer of that dataplane's
//!   [`DataplaneState`] (definition, specifier version, health, connection).
//!   Streams and the registry send it [`Command`]s; everyone else reads
//!   snapshots from its watch channel. No lock is shared between dataplanes,
//!   so the report path never contends with other dataplanes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::service::health::v3::EndpointHealthResponse;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::clock::Clock;
use crate::dataplane::DataplaneId;
use crate::readiness::{fold_report, rebase, FoldOutcome, Health, Timestamp};
use crate::source::{Defined, Loaded};

/// Identifies one HDS stream for the lifetime of the process.
pub type StreamId = u64;

/// Which stream currently speaks for a dataplane.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Connection {
    /// The stream whose reports count (the newest one); `None` when disconnected.
    pub stream: Option<StreamId>,
    pub peer: Option<SocketAddr>,
    pub connected_at: Option<Timestamp>,
}

/// Everything known about one dataplane. Written only by its own task.
#[derive(Debug, Clone, PartialEq)]
pub struct DataplaneState {
    /// The current definition; `None` once the dataplane was deleted.
    pub defined: Option<Defined>,
    /// Increases whenever the specifier to send changes.
    pub version: u64,
    pub health: Health,
    pub connection: Connection,
}

/// A request to a dataplane's task.
#[derive(Debug)]
pub enum Command {
    Define(Defined),
    Remove,
    Attach {
        stream: StreamId,
        peer: Option<SocketAddr>,
    },
    Detach {
        stream: StreamId,
    },
    Report {
        stream: StreamId,
        report: Box<EndpointHealthResponse>,
    },
}

/// How to reach one dataplane's task and read its state.
#[derive(Debug, Clone)]
pub struct DataplaneHandle {
    commands: mpsc::Sender<Command>,
    state: watch::Receiver<DataplaneState>,
}

impl DataplaneHandle {
    /// Sends a command; false when the dataplane's task has ended.
    pub async fn send(&self, command: Command) -> bool {
        self.commands.send(command).await.is_ok()
    }

    /// A receiver that wakes on every relevant change (specifier, status,
    /// connection), not on reports that change nothing.
    pub fn subscribe(&self) -> watch::Receiver<DataplaneState> {
        self.state.clone()
    }

    /// A consistent copy of the current state.
    pub fn state(&self) -> DataplaneState {
        self.state.borrow().clone()
    }
}

pub type Catalog = BTreeMap<DataplaneId, DataplaneHandle>;

/// Read access to the catalog. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Registry {
    catalog: watch::Receiver<Arc<Catalog>>,
}

/// Per-dataplane command queue length: reports wait (backpressure on their
/// stream) rather than pile up.
const COMMAND_QUEUE: usize = 64;

impl Registry {
    /// Starts the registry task, fed by the source's snapshots.
    pub fn spawn(sources: watch::Receiver<Arc<Loaded>>, clock: Arc<dyn Clock>) -> Registry {
        let (tx, rx) = watch::channel(Arc::new(Catalog::new()));
        tokio::spawn(run_registry(sources, tx, clock));
        Registry { catalog: rx }
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.borrow().clone()
    }

    pub fn get(&self, id: &DataplaneId) -> Option<DataplaneHandle> {
        self.catalog.borrow().get(id).cloned()
    }

    /// The dataplane's handle if it exists and is not being removed.
    pub fn get_defined(&self, id: &DataplaneId) -> Option<DataplaneHandle> {
        self.get(id).filter(|h| h.state.borrow().defined.is_some())
    }

    /// The dataplane's handle as soon as it is defined, or `None` at `deadline`.
    pub async fn wait_for(&self, id: &DataplaneId, deadline: Instant) -> Option<DataplaneHandle> {
        let mut rx = self.catalog.clone();
        loop {
            let found = rx
                .borrow_and_update()
                .get(id)
                .filter(|h| h.state.borrow().defined.is_some())
                .cloned();
            if found.is_some() {
                return found;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                _ => return None,
            }
        }
    }
}

async fn run_registry(
    mut sources: watch::Receiver<Arc<Loaded>>,
    catalog_tx: watch::Sender<Arc<Catalog>>,
    clock: Arc<dyn Clock>,
) {
    let mut current: BTreeMap<DataplaneId, (Defined, DataplaneHandle)> = BTreeMap::new();
    loop {
        let loaded = sources.borrow_and_update().clone();
        let mut changed = false;
        current.retain(|id, (_, handle)| {
            if loaded.dataplanes.contains_key(id) {
                return true;
            }
            // Sent from its own task: a full queue must not block the registry.
            let handle = handle.clone();
            tokio::spawn(async move { handle.send(Command::Remove).await });
            tracing::info!(dataplane = %id, "dataplane removed");
            changed = true;
            false
        });
        for (id, defined) in &loaded.dataplanes {
            match current.get_mut(id) {
                Some((old, _)) if old == defined => {}
                Some((old, handle)) => {
                    *old = defined.clone();
                    handle.send(Command::Define(defined.clone())).await;
                    tracing::info!(dataplane = %id, "dataplane definition changed");
                }
                None => {
                    let handle = spawn_dataplane(defined.clone(), clock.clone());
                    current.insert(id.clone(), (defined.clone(), handle));
                    tracing::info!(dataplane = %id, file = %defined.file.display(), "dataplane added");
                    changed = true;
                }
            }
        }
        if changed {
            let catalog: Catalog = current
                .iter()
                .map(|(id, (_, h))| (id.clone(), h.clone()))
                .collect();
            catalog_tx.send_replace(Arc::new(catalog));
        }
        if sources.changed().await.is_err() {
            return;
        }
    }
}

fn spawn_dataplane(defined: Defined, clock: Arc<dyn Clock>) -> DataplaneHandle {
    let now = clock.now();
    let health = rebase(None, &defined.dataplane, &defined.specifier, now);
    let (state_tx, state_rx) = watch::channel(DataplaneState {
        defined: Some(defined),
        version: 1,
        health,
        connection: Connection::default(),
    });
    let (commands_tx, commands_rx) = mpsc::channel(COMMAND_QUEUE);
    tokio::spawn(run_dataplane(commands_rx, state_tx, clock));
    DataplaneHandle {
        commands: commands_tx,
        state: state_rx,
    }
}

/// The dataplane's task: applies commands until every handle is gone.
async fn run_dataplane(
    mut commands: mpsc::Receiver<Command>,
    state: watch::Sender<DataplaneState>,
    clock: Arc<dyn Clock>,
) {
    while let Some(command) = commands.recv().await {
        let now = clock.now();
        let is_report = matches!(command, Command::Report { .. });
        let started = std::time::Instant::now();
        let mut applied = Applied::default();
        state.send_if_modified(|s| {
            applied = apply(s, command, now);
            applied.notify
        });
        if is_report {
            crate::metrics::report_folded(&applied.fold, started.elapsed());
        }
    }
}

/// What applying a command did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Watchers must wake (specifier, status or connection changed).
    pub notify: bool,
    pub fold: FoldOutcome,
}

/// Applies one command to a dataplane's state: the pure core of its task.
pub fn apply(s: &mut DataplaneState, command: Command, now: Timestamp) -> Applied {
    match command {
        Command::Define(defined) => {
            let previous = s.defined.as_ref();
            if previous == Some(&defined) {
                return Applied::default();
            }
            if previous.is_none_or(|p| p.specifier.message != defined.specifier.message) {
                s.version += 1;
            }
            s.health = rebase(
                previous.map(|p| (&*p.dataplane, &*p.specifier, &s.health)),
                &defined.dataplane,
                &defined.specifier,
                now,
            );
            s.defined = Some(defined);
            Applied {
                notify: true,
                ..Default::default()
            }
        }
        Command::Remove => {
            s.defined = None;
            s.version += 1;
            Applied {
                notify: true,
                ..Default::default()
            }
        }
        Command::Attach { stream, peer } => {
            s.connection = Connection {
                stream: Some(stream),
                peer,
                connected_at: Some(now),
            };
            Applied {
                notify: true,
                ..Default::default()
            }
        }
        Command::Detach { stream } => {
            if s.connection.stream != Some(stream) {
                return Applied::default();
            }
            s.connection.stream = None;
            Applied {
                notify: true,
                ..Default::default()
            }
        }
        Command::Report { stream, report } => {
            // Only the newest stream speaks for the dataplane.
            if s.connection.stream != Some(stream) {
                return Applied::default();
            }
            let Some(defined) = &s.defined else {
                return Applied::default();
            };
            let fold = fold_report(&mut s.health, &defined.specifier, &report, now);
            Applied {
                notify: fold.changed,
                fold,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::parse_documents;
    use crate::probe::ProbeSettings;
    use crate::readiness::Status;
    use crate::specifier::{build, endpoint, SpecifierSettings};
    use chrono::{TimeZone, Utc};
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;
    use envoy_types::pb::envoy::service::health::v3::{
        ClusterEndpointsHealth, EndpointHealth, LocalityEndpointsHealth,
    };
    use std::time::Duration;

    fn t(s: i64) -> Timestamp {
        Utc.timestamp_opt(1_700_000_000 + s, 0).unwrap()
    }

    fn defined(service_port: u16) -> Defined {
        let text = format!("type: Dataplane\nmesh: default\nname: a\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: {service_port}\n");
        let dp = parse_documents(&text).unwrap().remove(0);
        let settings = SpecifierSettings {
            defaults: ProbeSettings {
                interval: Duration::from_secs(1),
                timeout: Duration::from_secs(1),
                no_traffic_interval: Duration::from_secs(1),
                healthy_threshold: 1,
                unhealthy_threshold: 2,
            },
            report_interval: Duration::from_secs(5),
            probe_all_inbounds: true,
        };
        Defined {
            specifier: Arc::new(build(&dp, &settings).unwrap()),
            dataplane: Arc::new(dp),
            file: "a.yaml".into(),
        }
    }

    fn state(d: Defined) -> DataplaneState {
        DataplaneState {
            health: rebase(None, &d.dataplane, &d.specifier, t(0)),
            defined: Some(d),
            version: 1,
            connection: Connection::default(),
        }
    }

    fn healthy(port: u16) -> Box<EndpointHealthResponse> {
        Box::new(EndpointHealthResponse {
            cluster_endpoints_health: vec![ClusterEndpointsHealth {
                cluster_name: format!("probe_127.0.0.1:{port}"),
                locality_endpoints_health: vec![LocalityEndpointsHealth {
                    locality: None,
                    endpoints_health: vec![EndpointHealth {
                        endpoint: Some(endpoint(([127, 0, 0, 1], port).into())),
                        health_status: HealthStatus::Healthy as i32,
                        health_metadata: None,
                    }],
                }],
            }],
            ..Default::default()
        })
    }

    #[test]
    fn only_the_newest_stream_counts() {
        let mut s = state(defined(8080));
        apply(
            &mut s,
            Command::Attach {
                stream: 1,
                peer: None,
            },
            t(1),
        );
        apply(
            &mut s,
            Command::Attach {
                stream: 2,
                peer: None,
            },
            t(2),
        );
        let a = apply(
            &mut s,
            Command::Report {
                stream: 1,
                report: healthy(8080),
            },
            t(3),
        );
        assert!(!a.notify);
        assert_eq!(s.health.inbounds[0].status, Status::Pending);
        let a = apply(
            &mut s,
            Command::Report {
                stream: 2,
                report: healthy(8080),
            },
            t(4),
        );
        assert!(a.notify);
        assert_eq!(s.health.inbounds[0].status, Status::Healthy);
        // The old stream closing does not disconnect the new one.
        assert!(!apply(&mut s, Command::Detach { stream: 1 }, t(5)).notify);
        assert_eq!(s.connection.stream, Some(2));
        assert!(apply(&mut s, Command::Detach { stream: 2 }, t(6)).notify);
        assert_eq!(s.connection.stream, None);
        assert_eq!(s.connection.connected_at, Some(t(2)));
    }

    #[test]
    fn redefinition_bumps_version_only_when_the_specifier_changes() {
        let mut s = state(defined(8080));
        apply(
            &mut s,
            Command::Attach {
                stream: 1,
                peer: None,
            },
            t(1),
        );
        apply(
            &mut s,
            Command::Report {
                stream: 1,
                report: healthy(8080),
            },
            t(2),
        );
        assert!(!apply(&mut s, Command::Define(defined(8080)), t(3)).notify);
        assert_eq!(s.version, 1);
        let mut renamed = defined(8080);
        renamed.file = "b.yaml".into();
        assert!(apply(&mut s, Command::Define(renamed), t(3)).notify);
        assert_eq!(s.version, 1, "same specifier, nothing to push");
        assert_eq!(s.health.inbounds[0].status, Status::Healthy);
        apply(&mut s, Command::Define(defined(9090)), t(4));
        assert_eq!(s.version, 2);
        assert_eq!(s.health.inbounds[0].status, Status::Pending);
        apply(&mut s, Command::Remove, t(5));
        assert_eq!(s.version, 3);
        assert!(s.defined.is_none());
        // Reports after removal are ignored.
        assert!(
            !apply(
                &mut s,
                Command::Report {
                    stream: 1,
                    report: healthy(9090)
                },
                t(6)
            )
            .notify
        );
    }
}
