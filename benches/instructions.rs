//! Hot paths measured in instructions, for the regression guard
//! (`scripts/instructions.py`, `make bench-instructions`).
//!
//! `instructions list` prints every benchmark with its iteration count;
//! `instructions run NAME` prepares NAME's inputs, runs one untimed warm-up
//! iteration, then calls [`hdsd_bench_measured`] once, which runs the
//! iterations. The script runs this binary under
//! `valgrind --tool=callgrind --toggle-collect=*hdsd_bench_measured*`, so only
//! the iterations are counted: no setup, no process start. Inputs are fixed
//! (no clock, no randomness), so the same binary gives the same count.
//!
//! Benchmarks:
//! - `report/{unchanged,flip}/{2,16}`: one report of a dataplane with 2 or 16
//!   inbounds, from its encoded bytes to the published state: prost decode,
//!   the stream machine (`Event::Report` -> `Action::Forward`), the dataplane
//!   task's `publish` (`apply` + `fold_report` + the watch send). In `flip` the
//!   first endpoint alternates HEALTHY/UNHEALTHY, so every report also wakes
//!   the stream's watcher, which takes the new state and hands it to its
//!   machine (`Event::StateChanged`), as the stream driver does.
//! - `specifier/build/{2,16}`: `specifier::build` of a dataplane.
//! - `specifier/push/{2,16}`: a new specifier reaching a stream: its machine
//!   gets the state with a new version and returns `Action::Send`; the
//!   specifier is encoded (its first send) and the bytes copied into a reused
//!   buffer, as the codec in `hds::transport` does before writing them.
//! - `specifier/resend/{2,16}`: the same specifier sent again (a reconnect, an
//!   answer to a request): its bytes are already encoded, only copied.
//! - `churn/file/{1000,10000}`: one definition change in a file of 100
//!   dataplanes, in a fleet of 1,000 or 10,000: the file read again
//!   (`sources::reassemble`), the new snapshot published or not (its revision),
//!   the registry's diff (`Loaded::changed_since` and each named dataplane's
//!   comparison), and the previous snapshot dropped. The two counts should be
//!   close: a change costs its file, not the fleet.
//! - `eds/push/{50,500}`: one readiness flip reaching an EDS subscriber of
//!   every service, among 50 or 500 services (one endpoint each): the index
//!   takes the dataplane's new state (`Index::set`, `commit`), publishes its
//!   snapshot, the stream's machine finds what changed (`on_change`) and the
//!   response is encoded as the stream's transport writes it. The two counts should be close: a
//!   flip costs the service it changed, not every service subscribed.
//! - `eds/index/{100,10000}`: one readiness flip in a service of 100 or
//!   10,000 endpoints, nobody subscribed: the index takes the dataplane's new
//!   state, commits and publishes its snapshot. The two counts should be
//!   close: a flip costs the endpoint it changed, not the service's size.
//! - `eds/zones/{50,500}`: on a global, one readiness flip in zone us-1
//!   (among 50 or 500 dataplanes, one service each, in each of eu-1 and
//!   us-1) reaching a front in eu-1 subscribed to every service: the index
//!   takes the zone's new dataplanes (`Index::set_zone`), commits and
//!   publishes, the stream finds the change and the response is encoded for
//!   the front's zone (us-1 at priority 1). The two counts should be close:
//!   a flip costs the dataplane that changed, not the zone's size.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{TimeZone, Utc};
use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Node};
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::health::v3::health_check_request_or_endpoint_health_response::RequestType;
use envoy_types::pb::envoy::service::health::v3::{
    HealthCheckRequest, HealthCheckRequestOrEndpointHealthResponse,
};
use hdsd::consumers::eds::{self, index::Index, protocol::EdsStream, EdsOptions};
use hdsd::dataplane::{parse_documents, DataplaneId};
use hdsd::hds::stream::{Action, Event, Stream};
use hdsd::hds::{FromEnvoy, HdsSettings};
use hdsd::readiness::{rebase, Timestamp};
use hdsd::registry::{publish, Command, Connection, DataplaneState};
use hdsd::sources::Defined;
use hdsd::specifier::Specifier;
use prost::bytes::Bytes;
use prost::Message;
use tokio::sync::watch;
use tokio::time::Instant;

mod common;

/// Iterations per measured call: the guard divides the count by this.
const ITERATIONS: u64 = 200;

const BENCHMARKS: &[&str] = &[
    "report/unchanged/2",
    "report/flip/2",
    "report/unchanged/16",
    "report/flip/16",
    "specifier/build/2",
    "specifier/build/16",
    "specifier/push/2",
    "specifier/push/16",
    "specifier/resend/2",
    "specifier/resend/16",
    "churn/file/1000",
    "churn/file/10000",
    "eds/push/50",
    "eds/push/500",
    "eds/index/100",
    "eds/index/10000",
    "eds/zones/50",
    "eds/zones/500",
];

/// Iterations of one benchmark: a churn iteration parses a file of 100
/// dataplanes, so fewer of them.
fn iterations(name: &str) -> u64 {
    if name.starts_with("churn/") {
        20
    } else {
        ITERATIONS
    }
}

/// The only function callgrind counts (inclusive of everything it calls).
#[inline(never)]
fn hdsd_bench_measured(iteration: &mut dyn FnMut(), iterations: u64) {
    for _ in 0..iterations {
        iteration();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["list"] => {
            for name in BENCHMARKS {
                println!("{name} {}", iterations(name));
            }
        }
        ["run", name] => {
            let Some(mut iteration) = benchmark(name) else {
                eprintln!("instructions: no benchmark {name:?}; `instructions list` names them");
                std::process::exit(2);
            };
            iteration();
            hdsd_bench_measured(&mut *iteration, iterations(name));
        }
        // `cargo test --benches` and `cargo bench` run bench targets with
        // their own flags: run every benchmark once, as a smoke test.
        _ => {
            for name in BENCHMARKS {
                let mut iteration = benchmark(name).expect("every listed benchmark exists");
                iteration();
            }
        }
    }
}

fn benchmark(name: &str) -> Option<Box<dyn FnMut()>> {
    let mut parts = name.split('/');
    let (group, case, k) = (parts.next()?, parts.next()?, parts.next()?);
    let k: u16 = k.parse().ok()?;
    Some(match (group, case) {
        ("report", "unchanged") => report(k, false),
        ("report", "flip") => report(k, true),
        ("specifier", "build") => {
            let dp = common::dataplane(k);
            let settings = common::settings();
            Box::new(move || {
                black_box(hdsd::specifier::build(black_box(&dp), &settings).unwrap());
            })
        }
        ("specifier", "push") => push(k, true),
        ("specifier", "resend") => push(k, false),
        ("churn", "file") => churn(usize::from(k)),
        ("eds", "push") => eds_push(usize::from(k)),
        ("eds", "index") => eds_index(usize::from(k)),
        ("eds", "zones") => eds_zones(usize::from(k)),
        _ => return None,
    })
}

const STREAM: u64 = 7;

fn now() -> Timestamp {
    Utc.timestamp_opt(1_700_000_000, 0).unwrap()
}

fn hds_settings() -> Arc<HdsSettings> {
    Arc::new(HdsSettings {
        unknown_dataplane_grace: Duration::from_secs(30),
        report_interval: Duration::from_secs(5),
        stale_after: Duration::from_secs(15),
        limits: hdsd::config::HdsLimits::default(),
        definitions_from_api: false,
    })
}

/// The state of a connected dataplane with `k` inbounds, attached to `STREAM`.
fn connected_state(k: u16) -> DataplaneState {
    let dp = common::dataplane(k);
    let spec = hdsd::specifier::build(&dp, &common::settings()).unwrap();
    let health = rebase(None, &dp, &spec, now());
    DataplaneState {
        defined: Some(Defined {
            dataplane: Arc::new(dp),
            specifier: Arc::new(spec),
            file: PathBuf::from("dataplanes/dp.yaml"),
        }),
        version: 1,
        health,
        connection: Connection {
            stream: Some(STREAM),
            peer: None,
            connected_at: Some(now()),
            replaced_on: None,
            holder: None,
            token_expires_at: None,
        },
        // As the dataplane's task left it after the stream's attach: it
        // knows the Envoy's version, which runs the whole specifier.
        envoy: hdsd::registry::EnvoyRun {
            version: Some(ENVOY),
            seen: true,
            ..Default::default()
        },
    }
}

/// The version the simulated Envoy's node reports.
const ENVOY: hdsd::capability::EnvoyVersion = hdsd::capability::EnvoyVersion::new(1, 40, 0);

/// A stream machine serving `state`, its first specifier already sent.
fn attached_machine(state: &DataplaneState, at: Instant) -> Stream {
    let mut machine = Stream::new(STREAM, hds_settings(), None, at);
    let mut actions = Vec::new();
    let request = HealthCheckRequest {
        node: Some(Node {
            id: "default.dp-000001".into(),
            user_agent_version_type: Some(
                envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType::UserAgentBuildVersion(
                    envoy_types::pb::envoy::config::core::v3::BuildVersion {
                        version: Some(envoy_types::pb::envoy::r#type::v3::SemanticVersion {
                            major_number: ENVOY.major,
                            minor_number: ENVOY.minor,
                            patch: ENVOY.patch,
                        }),
                        metadata: None,
                    },
                ),
            ),
            ..Default::default()
        }),
        ..Default::default()
    };
    machine.handle(Event::Request(Box::new(request)), at, &mut actions);
    machine.handle(Event::Resolved(Box::new(state.clone())), at, &mut actions);
    assert!(
        actions.iter().any(|a| matches!(a, Action::Send(_))),
        "the machine attached and answered: {actions:?}"
    );
    machine
}

fn encoded_report(k: u16, first: HealthStatus) -> Bytes {
    HealthCheckRequestOrEndpointHealthResponse {
        request_type: Some(RequestType::EndpointHealthResponse(common::report(
            k, first,
        ))),
    }
    .encode_to_vec()
    .into()
}

fn report(k: u16, flip: bool) -> Box<dyn FnMut()> {
    let at = Instant::now();
    let state = connected_state(k);
    let mut machine = attached_machine(&state, at);
    let (tx, mut rx) = watch::channel(state);
    let healthy = encoded_report(k, HealthStatus::Healthy);
    let unhealthy = encoded_report(k, HealthStatus::Unhealthy);
    let mut actions = Vec::with_capacity(4);
    let mut odd = false;
    Box::new(move || {
        odd = !odd;
        let bytes = if flip && odd { &unhealthy } else { &healthy };
        // As the stream's codec decodes it (the bytes are shared, not copied).
        let FromEnvoy::Report(r) = FromEnvoy::decode(bytes.clone()).unwrap() else {
            unreachable!("the input is a report")
        };
        machine.handle(Event::Report(r), at, &mut actions);
        for action in actions.drain(..) {
            let Action::Forward(report) = action else {
                panic!("a report is forwarded, nothing else: {action:?}")
            };
            let command = Command::Report {
                stream: STREAM,
                report,
                // A fixed instant: the clock read belongs to the stream task.
                received: at.into_std(),
            };
            black_box(publish(&tx, command, now()));
        }
        if rx.has_changed().unwrap() {
            let state = rx.borrow_and_update().clone();
            machine.handle(Event::StateChanged(Box::new(state)), at, &mut actions);
            assert!(actions.is_empty(), "nothing to do on a status change");
        }
    })
}

/// `fresh`: every iteration pushes a new specifier (a new definition), which
/// is encoded at this first send; otherwise the same one is sent again (an
/// answer to a request, a reconnect), already encoded.
fn push(k: u16, fresh: bool) -> Box<dyn FnMut()> {
    let at = Instant::now();
    let mut state = connected_state(k);
    let mut machine = attached_machine(&state, at);
    let mut actions = Vec::with_capacity(4);
    let mut buf: Vec<u8> = Vec::with_capacity(8 * 1024);
    // Built beforehand: building is `specifier/build`. One per iteration, warm-up included.
    let dp = common::dataplane(k);
    let mut new_specifiers: Vec<Arc<Specifier>> = if fresh {
        (0..=ITERATIONS)
            .map(|_| Arc::new(hdsd::specifier::build(&dp, &common::settings()).unwrap()))
            .collect()
    } else {
        Vec::new()
    };
    Box::new(move || {
        if let (Some(next), Some(defined)) = (new_specifiers.pop(), state.defined.as_mut()) {
            defined.specifier = next;
        }
        state.version += 1;
        machine.handle(
            Event::StateChanged(Box::new(state.clone())),
            at,
            &mut actions,
        );
        for action in actions.drain(..) {
            let Action::Send(message) = action else {
                panic!("a new version is sent, nothing else: {action:?}")
            };
            // What the codec does with it (`hds::transport`): copy the
            // bytes encoded when the specifier was built into the buffer.
            buf.clear();
            buf.extend_from_slice(message.encoded());
            black_box(&buf);
        }
    })
}

/// One dataplane of the loadgen's kind (2 inbounds), its first service port given.
fn churn_doc(i: usize, port: u16) -> String {
    format!(
        "type: Dataplane\nmesh: default\nname: dp-{i:06}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: {port}\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: svc-0}}\n  - port: 10002\n    servicePort: 20002\n    serviceAddress: 127.0.0.1\n    tags: {{kuma.io/service: svc-1}}\n"
    )
}

/// File `f` of 100 dataplanes; `changed`: its first dataplane's port differs.
fn churn_file(f: usize, changed: bool) -> String {
    (f * 100..(f + 1) * 100)
        .map(|i| {
            churn_doc(
                i,
                if changed && i == f * 100 {
                    30001
                } else {
                    20001
                },
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

fn churn(count: usize) -> Box<dyn FnMut()> {
    use std::collections::BTreeMap;
    let settings = common::settings();
    let dir = PathBuf::from("dataplanes");
    let files: BTreeMap<PathBuf, hdsd::sources::FileRead> = (0..count / 100)
        .map(|f| (dir.join(format!("f{f:05}.yaml")), Ok(churn_file(f, false))))
        .collect();
    let mut loaded = hdsd::sources::assemble(&dir, files, &Default::default(), &settings);
    assert_eq!(loaded.dataplanes.len(), count);
    // The file in the middle of the fleet, alternating between two contents.
    let f = count / 200;
    let path = dir.join(format!("f{f:05}.yaml"));
    let texts = [churn_file(f, true), churn_file(f, false)];
    let mut odd = false;
    Box::new(move || {
        odd = !odd;
        let text = texts[usize::from(!odd)].clone();
        let next =
            hdsd::sources::reassemble(&loaded, [(path.clone(), Some(Ok(text)))].into(), &settings);
        assert_ne!(next.revision(), loaded.revision(), "the file changed");
        let ids = next
            .changed_since(loaded.revision())
            .expect("one revision behind");
        assert_eq!(ids.len(), 1, "one dataplane changed");
        for id in &ids {
            black_box(next.dataplanes.get(id) != loaded.dataplanes.get(id));
        }
        loaded = next;
    })
}

/// A dataplane `i` with one inbound in service `svc-<i>`, in `status`.
fn eds_state(i: usize, status: hdsd::readiness::Status) -> (DataplaneId, DataplaneState) {
    eds_member(i, &format!("svc-{i:04}"), status)
}

/// A dataplane `i` with one inbound (port 10000 + i) in `service`, in `status`.
fn eds_member(
    i: usize,
    service: &str,
    status: hdsd::readiness::Status,
) -> (DataplaneId, DataplaneState) {
    let yaml = format!(
        "type: Dataplane\nmesh: default\nname: dp-{i:06}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: {port}\n    servicePort: {port}\n    tags: {{kuma.io/service: {service}}}\n",
        port = 10000 + i
    );
    let dp = Arc::new(parse_documents(&yaml).expect("valid dataplane").remove(0));
    let spec = Arc::new(hdsd::specifier::build(&dp, &common::settings()).unwrap());
    let mut health = rebase(None, &dp, &spec, now());
    for h in &mut health.inbounds {
        h.status = status;
    }
    let state = DataplaneState {
        defined: Some(Defined {
            dataplane: dp.clone(),
            specifier: spec,
            file: PathBuf::from("dataplanes/dp.yaml"),
        }),
        version: 1,
        health,
        connection: Connection::default(),
        envoy: Default::default(),
    };
    (dp.id.clone(), state)
}

/// One flip in a service of `members` endpoints, nobody subscribed: the
/// index takes the state, commits and publishes its snapshot.
fn eds_index(members: usize) -> Box<dyn FnMut()> {
    use hdsd::readiness::Status;
    let mut index = Index::new(EdsOptions::default());
    for i in 0..members {
        let (id, state) = eds_member(i, "web", Status::Healthy);
        index.set(&id, Some(&state));
    }
    index.commit();
    let (id, healthy) = eds_member(7, "web", Status::Healthy);
    let (_, unhealthy) = eds_member(7, "web", Status::Unhealthy);
    let mut flip = false;
    Box::new(move || {
        flip = !flip;
        index.set(&id, Some(if flip { &unhealthy } else { &healthy }));
        assert!(index.commit(), "the flip changes web");
        black_box(index.snapshot(1, true));
    })
}

/// A front's first request for every `svc-NNNN`, from `zone` if given.
fn subscribe_all(services: usize, zone: Option<&str>) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: eds::protocol::TYPE_URL.to_string(),
        resource_names: (0..services)
            .map(|i| format!("default/svc-{i:04}"))
            .collect(),
        node: zone.map(|zone| Node {
            locality: Some(envoy_types::pb::envoy::config::core::v3::Locality {
                zone: zone.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A zone's dataplane `i` as the global holds it: one inbound of
/// `svc-i` at `address:10000+i`, healthy or not.
fn eds_remote(i: usize, address: &str, healthy: bool) -> hdsd::pb::Dataplane {
    use hdsd::pb;
    let status = if healthy {
        pb::Status::Healthy
    } else {
        pb::Status::Unhealthy
    };
    pb::Dataplane {
        mesh: "default".into(),
        name: format!("dp-{i:06}"),
        address: address.into(),
        inbounds: vec![pb::Inbound {
            port: 10000 + i as u32,
            tags: [("kuma.io/service".to_string(), format!("svc-{i:04}"))].into(),
            health: Some(pb::Health {
                ready: healthy,
                status: status as i32,
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn eds_zones(services: usize) -> Box<dyn FnMut()> {
    use eds::assignment::ZoneLink;
    let mut index = Index::new(EdsOptions::default());
    let entry = |dp: hdsd::pb::Dataplane| (DataplaneId::new(&dp.mesh, &dp.name), Arc::new(dp));
    let zone = |address: &str| -> hdsd::view::zones::Dataplanes {
        (0..services)
            .map(|i| entry(eds_remote(i, address, true)))
            .collect()
    };
    let (eu, us): (Arc<str>, Arc<str>) = (Arc::from("eu-1"), Arc::from("us-1"));
    index.set_zone(&eu, ZoneLink::Online, &zone("10.1.0.1"));
    // As the hub holds them: the flipped map shares all but one entry.
    let healthy = zone("10.2.0.1");
    let (id, dp) = entry(eds_remote(7, "10.2.0.1", false));
    let flipped = healthy.update(id, dp);
    index.set_zone(&us, ZoneLink::Online, &healthy);
    index.commit();
    let mut stream = EdsStream::new();
    let request = subscribe_all(services, Some("eu-1"));
    let first = stream
        .on_request(&request, &index.snapshot(1, true))
        .expect("a named subscription");
    assert!(!first.is_empty(), "the subscription is answered");
    let mut flip = false;
    let mut buffer = Vec::with_capacity(64 * 1024);
    Box::new(move || {
        flip = !flip;
        index.set_zone(
            &us,
            ZoneLink::Online,
            if flip { &flipped } else { &healthy },
        );
        assert!(index.commit(), "the flip changes svc-0007");
        let current = Arc::new(index.snapshot(1, true));
        let response = stream
            .on_change(black_box(&current))
            .expect("a subscribed service changed");
        assert_eq!(response.front_zone.as_deref(), Some("eu-1"));
        buffer.clear();
        response.encode(&mut buffer);
        black_box(&buffer);
    })
}

fn eds_push(services: usize) -> Box<dyn FnMut()> {
    use hdsd::readiness::Status;
    let mut index = Index::new(EdsOptions::default());
    for i in 0..services {
        let (id, state) = eds_state(i, Status::Healthy);
        index.set(&id, Some(&state));
    }
    index.commit();
    let mut stream = EdsStream::new();
    let request = subscribe_all(services, None);
    let first = stream
        .on_request(&request, &index.snapshot(1, true))
        .expect("a named subscription");
    assert!(!first.is_empty(), "the subscription is answered");
    // Dataplane 7 flips between healthy and unhealthy.
    let (id, healthy) = eds_state(7, Status::Healthy);
    let (_, unhealthy) = eds_state(7, Status::Unhealthy);
    let mut flip = false;
    let mut buffer = Vec::with_capacity(64 * 1024);
    Box::new(move || {
        flip = !flip;
        index.set(&id, Some(if flip { &unhealthy } else { &healthy }));
        assert!(index.commit(), "the flip changes svc-0007");
        let current = Arc::new(index.snapshot(1, true));
        let response = stream
            .on_change(black_box(&current))
            .expect("a subscribed service changed");
        buffer.clear();
        response.encode(&mut buffer);
        black_box(&buffer);
    })
}
