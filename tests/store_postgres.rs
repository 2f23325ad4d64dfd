//! Definitions in a store (`dataplanes.source = "api"`), and several hdsd
//! instances on one real PostgreSQL (a throwaway cluster per test):
//! - the `DefinitionStore` contract on PostgreSQL (the redb engine runs the
//!   same contract in its unit tests), and migrations that two instances
//!   starting together apply once;
//! - the API's writes: PUT (YAML or JSON), 422 with each rule's message,
//!   ETag / If-Match and 412, DELETE, 409 when definitions come from files,
//!   and `hdsd apply` / `hdsd delete`;
//! - a definition applied on one instance is visible on another within 1 s
//!   and served to a real Envoy connected there; a row written behind hdsd's
//!   back (no notification) is healed by the periodic reconcile;
//! - readiness shared: both instances answer the same, a transition travels
//!   in under a second, at most 5 store transactions per second per
//!   instance, and a SIGKILL failover never reads not ready;
//! - PostgreSQL stopped for 10 s and started again: the instances keep
//!   running and say so in `/readyz` (still 200) and `hdsd_store_up`, a
//!   write fails with 503 meanwhile, a readiness transition folded during the
//!   outage reaches the other instance afterwards, changes flow again, and no
//!   instance is taken for dead although every heartbeat was older than
//!   `cluster.instance_timeout`;
//! - heartbeats: the instance holding a stream is SIGKILLed and its Envoy
//!   does not reconnect: one live instance (of two) marks the dataplane
//!   disconnected within the instance timeout and a sweep, and it goes
//!   stale; a SIGTERM leaves the cluster at once;
//! - watch revisions are cluster-wide: a consumer that watched on A,
//!   stopped at revision R and resumes on B with `Last-Event-ID: R` gets the
//!   change it missed (an inbound that went unhealthy meanwhile), with its
//!   current state, and nothing older than R minus `cluster.resume_slack`,
//!   without RESYNC or a snapshot; a revision far ahead of B gets RESYNC;
//! - signing keys shared: a token issued with instance A's key (A's own key
//!   directory) opens a stream on B; deleting the key's files on A (a
//!   rotation) ends B's stream within a second and B refuses the token.

use std::time::{Duration, Instant};

use crate::support::cluster::{
    hdsd_cli, on_postgres, on_postgres_with_timeout, send, web01_envoy_on_all, web01_served_by,
};
use crate::support::postgres::Postgres;
use crate::support::{
    dataplane_yaml, wait_for, App, AuthMode, Config, DataplanesSource, Envoy, Hdsd, HdsdOptions,
};

/// Token auth, definitions through the API, and the PostgreSQL store (in
/// the config file, so that `hdsd token ... --config` uses the store too).
fn token_auth_on_postgres(c: &mut Config, pg: &Postgres) {
    on_postgres(c, pg.url());
    c.auth.mode = AuthMode::Token;
}

/// `PUT`s web-01 (one inbound) on `a` and waits until `b` serves it.
fn define_web01_seen_by(a: &Hdsd, b: &Hdsd) {
    let yaml = dataplane_yaml("web-01", &[(10001, 8080)]);
    let (status, _, _) = send(
        a,
        "/api/v1/dataplanes/default/web-01",
        Some(("application/yaml", &yaml)),
        &[],
    );
    assert_eq!(status, 200);
    wait_for("web-01 on B", Duration::from_secs(5), || {
        b.dataplane("default.web-01").map(|_| ())
    });
}

/// Rows of one table of the shared store.
fn count(pg: &Postgres, table: &str) -> u32 {
    pg.psql(&format!("SELECT count(*) FROM {table}"))
        .trim()
        .parse()
        .unwrap()
}

fn names(hdsd: &Hdsd) -> Result<Vec<String>, String> {
    Ok(hdsd
        .dataplanes("")?
        .iter()
        .map(|i| format!("{}.{}", i.mesh, i.name))
        .collect())
}

#[test]
fn the_definition_store_contract_holds_on_postgres() {
    let Some(pg) = Postgres::start("the_definition_store_contract_holds_on_postgres") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let settings = hdsd::config::PostgresConfig {
            url: pg.url(),
            ..Default::default()
        };
        // Two stores migrating a new database at the same time: both succeed,
        // each migration is applied once (the advisory lock serialises them).
        let (a, b) = tokio::join!(
            hdsd::store::postgres::PgStore::connect(&settings),
            hdsd::store::postgres::PgStore::connect(&settings)
        );
        let (a, _b) = (a.expect("first store"), b.expect("second store"));
        hdsd::store::definitions::conformance(&a).await;
    });
    let versions =
        pg.psql("SELECT string_agg(version::text, ',' ORDER BY version) FROM hdsd_schema");
    let newest = hdsd::store::postgres::MIGRATIONS.len();
    let expected: Vec<String> = (1..=newest).map(|v| v.to_string()).collect();
    assert_eq!(versions.trim(), expected.join(","));
}

/// The cluster contract (the same tests the single-instance cluster
/// passes): one instance's duties, then what two instances sharing the
/// database see of each other, including a burst with the longest name
/// and a claim no name can forge.
#[test]
fn the_cluster_contract_holds_on_postgres() {
    use hdsd::cluster::{conformance, PgCluster};
    use hdsd::store::postgres::PgStore;
    let Some(pg) = Postgres::start("the_cluster_contract_holds_on_postgres") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let settings = hdsd::config::PostgresConfig {
            url: pg.url(),
            ..Default::default()
        };
        let slack = std::time::Duration::from_secs(10);
        let a = PgStore::connect_as(&settings, "conformance/a".into());
        let b = PgStore::connect_as(&settings, "conformance/b".into());
        let (a, b) = tokio::join!(a, b);
        let (a, b) = (
            std::sync::Arc::new(a.expect("store a")),
            std::sync::Arc::new(b.expect("store b")),
        );
        conformance::one_instance(&PgCluster::new(a.clone(), slack)).await;
        conformance::two_instances(&PgCluster::new(a, slack), &PgCluster::new(b, slack)).await;
    });
}

/// Four instances write readiness at once, as fast as they can, each row
/// once; a fifth follows with no full re-read to fall back on (reconcile in
/// an hour). It must see every row from the rows after the last sequence
/// number it saw alone: a row numbered before another but committed after
/// it would be skipped for good. (The readiness lock orders them; it is
/// held for one statement's server time, not across round trips.)
/// Stores of several instances on one database, driven by hand from a
/// test's own runtime.
struct Stores {
    runtime: tokio::runtime::Runtime,
    settings: hdsd::config::PostgresConfig,
}

impl Stores {
    fn new(pg: &Postgres, reconcile_interval: Duration) -> Stores {
        Stores {
            runtime: tokio::runtime::Runtime::new().unwrap(),
            settings: hdsd::config::PostgresConfig {
                url: pg.url(),
                reconcile_interval,
                ..Default::default()
            },
        }
    }

    /// The store of instance `who`.
    fn connect(&self, who: &str) -> std::sync::Arc<hdsd::store::postgres::PgStore> {
        std::sync::Arc::new(
            self.runtime
                .block_on(hdsd::store::postgres::PgStore::connect_as(
                    &self.settings,
                    who.into(),
                ))
                .expect("store"),
        )
    }
}

#[test]
fn concurrent_readiness_writers_are_followed_without_a_row_skipped() {
    use hdsd::dataplane::DataplaneId;
    use hdsd::store::{ReadinessStore, StoredHealth};
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    let Some(pg) =
        Postgres::start("concurrent_readiness_writers_are_followed_without_a_row_skipped")
    else {
        return;
    };
    let stores = Stores::new(&pg, Duration::from_secs(3600));
    let (runtime, connect) = (&stores.runtime, |who: &str| stores.connect(who));
    let follower = connect("follow/reader");
    let seen: Arc<Mutex<BTreeMap<DataplaneId, StoredHealth>>> = Arc::default();
    {
        let seen = seen.clone();
        runtime.spawn(follower.clone().follow_readiness(
            move |rows, _| {
                let mut seen = seen.lock().unwrap();
                for (id, health) in rows {
                    seen.insert(id, health);
                }
                std::future::ready(Vec::new())
            },
            |_| {},
        ));
    }
    let at = |n: i64| StoredHealth {
        inbounds: Vec::new(),
        last_report_at: chrono::DateTime::from_timestamp(1_700_000_000 + n, 0),
        reattached_at: None,
    };
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let store = connect(&format!("follow/writer-{w}"));
            std::thread::spawn(move || {
                for round in 0..200i64 {
                    // Each row written once: a row skipped is never
                    // written again to hide it.
                    let batch: Vec<_> = (0..5)
                        .map(|d| {
                            let name = format!("w{w}-r{round}-{d}");
                            (DataplaneId::new("default", name), Some(at(round * 10 + w)))
                        })
                        .collect();
                    store.write(&batch).expect("write");
                }
            })
        })
        .collect();
    for writer in writers {
        writer.join().expect("writer");
    }
    let stored = runtime
        .block_on(async { tokio::task::spawn_blocking(move || follower.load()).await })
        .unwrap()
        .expect("load");
    assert_eq!(stored.len(), 4 * 200 * 5);
    wait_for(
        "the follower to see every last write",
        Duration::from_secs(10),
        || {
            let seen = seen.lock().unwrap();
            if *seen == stored {
                Ok(())
            } else {
                let differ: Vec<_> = stored
                    .iter()
                    .filter(|(id, h)| seen.get(*id) != Some(*h))
                    .map(|(id, _)| id.to_string())
                    .collect();
                Err(format!("the follower differs on {differ:?}"))
            }
        },
    );
}

/// The periodic check of the readiness follower fetches only what it has
/// not handed on: a row its observer could not apply (a dataplane defined
/// after its readiness was written) is read again at the next check, and a
/// row applied is not read again.
#[test]
fn a_readiness_row_not_applied_is_read_again_at_the_next_check_and_no_other() {
    use hdsd::dataplane::DataplaneId;
    use hdsd::store::{ReadinessStore, StoredHealth};
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    let Some(pg) = Postgres::start("a_readiness_row_not_applied_is_read_again") else {
        return;
    };
    let stores = Stores::new(&pg, Duration::from_millis(200));
    let (runtime, connect) = (&stores.runtime, |who: &str| stores.connect(who));
    let (a, b) = (
        DataplaneId::new("default", "late"),
        DataplaneId::new("default", "known"),
    );
    // Deliveries per dataplane, and the checks seen (a check hands no
    // watermark: 0).
    #[derive(Default)]
    struct Seen {
        delivered: BTreeMap<DataplaneId, u32>,
        checks: u32,
    }
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let follower = connect("check/reader");
    {
        let (seen, late) = (seen.clone(), a.clone());
        runtime.spawn(follower.follow_readiness(
            move |rows, watermark| {
                let mut seen = seen.lock().unwrap();
                if watermark == 0 {
                    seen.checks += 1;
                }
                let mut unknown = Vec::new();
                for (id, _) in rows {
                    let n = seen.delivered.entry(id.clone()).or_default();
                    *n += 1;
                    // The first time, `late` is not defined here yet.
                    if id == late && *n == 1 {
                        unknown.push(id);
                    }
                }
                std::future::ready(unknown)
            },
            |_| {},
        ));
    }
    let writer = connect("check/writer");
    let health = StoredHealth {
        inbounds: Vec::new(),
        last_report_at: chrono::DateTime::from_timestamp(1_700_000_000, 0),
        reattached_at: None,
    };
    let write = |id: &DataplaneId| {
        let (writer, batch) = (writer.clone(), vec![(id.clone(), Some(health.clone()))]);
        runtime
            .block_on(async { tokio::task::spawn_blocking(move || writer.write(&batch)).await })
            .unwrap()
            .expect("write");
    };
    let delivered = |id: &DataplaneId| seen.lock().unwrap().delivered.get(id).copied();
    write(&a);
    wait_for(
        "the row not applied to be read again by a check",
        Duration::from_secs(10),
        || match delivered(&a) {
            Some(2) => Ok(()),
            n => Err(format!("delivered {n:?} times")),
        },
    );
    write(&b);
    wait_for("the second row", Duration::from_secs(10), || {
        delivered(&b).ok_or("not delivered".to_string())
    });
    let checks = seen.lock().unwrap().checks;
    wait_for("three more checks", Duration::from_secs(10), || {
        let now = seen.lock().unwrap().checks;
        (now >= checks + 3)
            .then_some(())
            .ok_or(format!("{now} checks"))
    });
    assert_eq!(
        (delivered(&a), delivered(&b)),
        (Some(2), Some(1)),
        "a check reads again only the row not applied"
    );
}

/// The lease contract (the same test the single-instance cluster passes),
/// then what two instances sharing the database see of one lease: one
/// holder, a release handed over at once, a silent holder replaced with a
/// higher epoch.
#[test]
fn the_lease_contract_holds_on_postgres() {
    use hdsd::cluster::{conformance, PgCluster};
    use hdsd::store::postgres::PgStore;
    let Some(pg) = Postgres::start("the_lease_contract_holds_on_postgres") else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let settings = hdsd::config::PostgresConfig {
            url: pg.url(),
            ..Default::default()
        };
        let slack = std::time::Duration::from_secs(10);
        let a = PgStore::connect_as(&settings, "lease/a".into());
        let b = PgStore::connect_as(&settings, "lease/b".into());
        let (a, b) = tokio::join!(a, b);
        let (a, b) = (
            PgCluster::new(std::sync::Arc::new(a.expect("store a")), slack),
            PgCluster::new(std::sync::Arc::new(b.expect("store b")), slack),
        );
        conformance::one_lease(&a).await;
        conformance::two_leases(&a, &b).await;
    });
}

#[test]
fn each_publisher_rewrites_only_its_own_shared_keys() {
    use hdsd::store::postgres::KeyPublication::{Changed, Contested, Unchanged};
    let Some(pg) = Postgres::start("each_publisher_rewrites_only_its_own_shared_keys") else {
        return;
    };
    let keys = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, p)| (k.to_string(), p.to_string()))
            .collect()
    };
    let alive = Duration::from_secs(10);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let rows = runtime.block_on(async {
        let settings = hdsd::config::PostgresConfig {
            url: pg.url(),
            ..Default::default()
        };
        let store = hdsd::store::postgres::PgStore::connect(&settings)
            .await
            .expect("store");
        let publish = |publisher: &'static str, set| {
            let store = &store;
            async move { store.publish_keys(publisher, &set, alive).await.unwrap() }
        };
        assert_eq!(publish("a", keys(&[("k1", "pem1"), ("k2", "pem2")])).await, Changed);
        assert_eq!(publish("b", keys(&[("k1", "pem1")])).await, Changed);
        // The same set again: nothing changes, nothing is announced.
        assert_eq!(publish("a", keys(&[("k1", "pem1"), ("k2", "pem2")])).await, Unchanged);
        // a withdraws k1 and replaces k2: b's k1 stays.
        assert_eq!(publish("a", keys(&[("k2", "pem2-new")])).await, Changed);
        let mut rows: Vec<(String, String, String)> = store
            .shared_keys()
            .await
            .unwrap()
            .into_iter()
            .map(|k| (k.kid, k.publisher, k.public_pem))
            .collect();
        rows.sort();
        // An empty set withdraws everything of a publisher.
        assert_eq!(publish("b", keys(&[])).await, Changed);
        assert_eq!(store.shared_keys().await.unwrap().len(), 1);
        // Another live instance wrote a's rows (a copied state directory):
        // a writes nothing, so neither withdraws the other's keys.
        pg.psql(
            "INSERT INTO hdsd_instances (instance) VALUES ('twin/1');
             UPDATE hdsd_signing_keys SET instance = 'twin/1' WHERE publisher = 'a'",
        );
        assert_eq!(
            publish("a", keys(&[])).await,
            Contested {
                by: "twin/1".to_string()
            }
        );
        assert_eq!(store.shared_keys().await.unwrap().len(), 1);
        // Once that instance is silent for longer than `alive`, a takes its rows back.
        pg.psql("UPDATE hdsd_instances SET heartbeat_at = now() - interval '11 seconds' WHERE instance = 'twin/1'");
        assert_eq!(publish("a", keys(&[])).await, Changed);
        assert!(store.shared_keys().await.unwrap().is_empty());
        rows
    });
    let row = |k: &str, p: &str, pem: &str| (k.to_string(), p.to_string(), pem.to_string());
    assert_eq!(
        rows,
        vec![row("k1", "b", "pem1"), row("k2", "a", "pem2-new")]
    );
}

#[test]
fn definitions_through_the_api_on_the_embedded_store() {
    let hdsd = Hdsd::start_with(|c| c.dataplanes.source = DataplanesSource::Api);
    let path = "/api/v1/dataplanes/default/web-01";

    // Created from YAML: 200 with the revision as ETag; visible in the registry.
    let yaml = dataplane_yaml("web-01", &[(10001, 8080)]);
    let (status, etag, body) = send(&hdsd, path, Some(("application/yaml", &yaml)), &[]);
    assert_eq!(status, 200, "{body}");
    let etag = etag.expect("an ETag");
    assert_eq!(etag, format!("\"{}\"", body["revision"]));
    wait_for("web-01 in the registry", Duration::from_secs(5), || {
        hdsd.dataplane("default.web-01").map(|_| ())
    });
    // GET carries the same ETag.
    let got = ureq::get(&hdsd.api_url(path)).call().unwrap();
    assert_eq!(got.headers().get("etag").unwrap().to_str().unwrap(), etag);

    // Replaced from JSON with the right If-Match; a stale one is refused (412).
    let json = r#"{"type": "Dataplane", "mesh": "default", "name": "web-01",
        "networking": {"address": "127.0.0.1", "inbound": [{"port": 10002, "servicePort": 8081}]}}"#;
    let (status, new_etag, body) = send(
        &hdsd,
        path,
        Some(("application/json", json)),
        &[("If-Match", &etag)],
    );
    assert_eq!(status, 200, "{body}");
    let new_etag = new_etag.unwrap();
    assert_ne!(new_etag, etag);
    let (status, current, body) = send(
        &hdsd,
        path,
        Some(("application/json", json)),
        &[("If-Match", &etag)],
    );
    assert_eq!(status, 412, "{body}");
    assert_eq!(current.as_deref(), Some(new_etag.as_str()));
    assert!(
        body["error"].as_str().unwrap().contains("If-Match"),
        "{body}"
    );
    wait_for(
        "the JSON definition in force",
        Duration::from_secs(5),
        || {
            let dp = hdsd.dataplane("default.web-01")?;
            match dp.inbounds.as_slice() {
                [i] if i.port == 10002 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    );

    // Invalid: 422 with each rule's message; nothing changes.
    let bad = "type: Dataplane\nmesh: default\nname: web-01\nnetworking:\n  address: db.local\n";
    let (status, _, body) = send(&hdsd, path, Some(("application/yaml", bad)), &[]);
    assert_eq!(status, 422, "{body}");
    assert!(
        body["problems"][0]
            .as_str()
            .unwrap()
            .contains("not an IP literal"),
        "{body}"
    );
    let (status, _, body) = send(
        &hdsd,
        "/api/v1/dataplanes/default/other",
        Some(("application/yaml", &yaml)),
        &[],
    );
    assert_eq!(status, 422, "{body}");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("the URL names default.other"),
        "{body}"
    );

    // `hdsd apply -f DIR`: a Mesh is skipped and named, each Dataplane applied.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("fleet.yaml"),
        format!(
            "type: Mesh\nname: default\n---\n{}---\n{}",
            dataplane_yaml("web-02", &[(10003, 8082)]),
            dataplane_yaml("web-03", &[(10004, 8083)])
        ),
    )
    .unwrap();
    let api = hdsd.api_url("");
    let out = hdsd_cli(&["apply", "-f", dir.path().to_str().unwrap(), "--api", &api]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("skipped Mesh default"), "{stdout}");
    assert!(
        stdout.contains("dataplane default.web-02 applied (revision"),
        "{stdout}"
    );
    assert!(
        stdout.contains("dataplane default.web-03 applied"),
        "{stdout}"
    );
    wait_for("three dataplanes", Duration::from_secs(5), || {
        let n = names(&hdsd)?;
        (n.len() == 3).then_some(()).ok_or(format!("{n:?}"))
    });
    // A file the server refuses: exit 1 with the server's message.
    std::fs::write(
        dir.path().join("fleet.yaml"),
        bad.replace("web-01", "web-04"),
    )
    .unwrap();
    let out = hdsd_cli(&["apply", "-f", dir.path().to_str().unwrap(), "--api", &api]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("not an IP literal"), "{stderr}");

    // `hdsd delete`, then DELETE of what is gone: 404.
    let out = hdsd_cli(&["delete", "default", "web-02", "--api", &api]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (status, _, _) = send(&hdsd, path, None, &[("If-Match", &etag)]);
    assert_eq!(status, 412, "a stale If-Match protects deletes too");
    let (status, _, _) = send(&hdsd, path, None, &[("If-Match", &new_etag)]);
    assert_eq!(status, 204);
    let (status, _, body) = send(&hdsd, path, None, &[]);
    assert_eq!(status, 404, "{body}");
    wait_for("only web-03 left", Duration::from_secs(5), || {
        let n = names(&hdsd)?;
        (n == ["default.web-03"])
            .then_some(())
            .ok_or(format!("{n:?}"))
    });
}

#[test]
fn writes_are_refused_when_definitions_come_from_files() {
    let hdsd = Hdsd::start(HdsdOptions::default());
    let yaml = dataplane_yaml("web-01", &[(10001, 8080)]);
    let (status, _, body) = send(
        &hdsd,
        "/api/v1/dataplanes/default/web-01",
        Some(("application/yaml", &yaml)),
        &[],
    );
    assert_eq!(status, 409, "{body}");
    let message = body["error"].as_str().unwrap();
    assert!(
        message.contains("dataplanes.source is \"dir\""),
        "{message}"
    );
    assert!(
        message.contains(&hdsd.dataplanes_dir().display().to_string()),
        "{message}"
    );
}

#[test]
fn a_definition_applied_on_one_instance_is_served_by_another_within_a_second() {
    let Some(pg) = Postgres::start(
        "a_definition_applied_on_one_instance_is_served_by_another_within_a_second",
    ) else {
        return;
    };
    // Two instances starting together on a new database (migrations race).
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| Hdsd::start_with(|c| on_postgres(c, pg.url())));
        let b = s.spawn(|| Hdsd::start_with(|c| on_postgres(c, pg.url())));
        (a.join().unwrap(), b.join().unwrap())
    });
    let app = App::start();
    // The Envoy is on B, waiting for its definition (unknown dataplane grace).
    let _envoy = Envoy::start(b.hds, "default.web-01", None);
    wait_for(
        "B to hold web-01's waiting stream",
        Duration::from_secs(20),
        || {
            let waiting = b.metric("hdsd_streams_waiting");
            (waiting == Some(1.0))
                .then_some(())
                .ok_or_else(|| format!("hdsd_streams_waiting = {waiting:?}"))
        },
    );

    let yaml = dataplane_yaml("web-01", &[(10001, app.port)]);
    let started = Instant::now();
    let (status, _, body) = send(
        &a,
        "/api/v1/dataplanes/default/web-01",
        Some(("application/yaml", &yaml)),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    wait_for("web-01 on instance B", Duration::from_secs(5), || {
        b.dataplane("default.web-01").map(|_| ())
    });
    let seen_after = started.elapsed();
    eprintln!("a definition written on A was visible on B after {seen_after:?}");
    assert!(seen_after < Duration::from_secs(1), "{seen_after:?}");
    // B serves it to its Envoy: the inbound turns healthy from Envoy's reports.
    b.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(20));

    // Deleted on B: gone on A within a second too.
    let started = Instant::now();
    let (status, _, _) = send(&b, "/api/v1/dataplanes/default/web-01", None, &[]);
    assert_eq!(status, 204);
    wait_for("web-01 gone from A", Duration::from_secs(5), || {
        let n = names(&a)?;
        n.is_empty().then_some(()).ok_or(format!("{n:?}"))
    });
    let gone_after = started.elapsed();
    eprintln!("a delete on B was visible on A after {gone_after:?}");
    assert!(gone_after < Duration::from_secs(1), "{gone_after:?}");

    // A row written behind hdsd's back (no NOTIFY) is healed by the
    // periodic reconcile (1 s here).
    let doc = dataplane_yaml("web-09", &[(10009, 8089)]).replace('\'', "''");
    pg.psql(&format!(
        "INSERT INTO hdsd_definitions (mesh, name, format, document, revision) \
         VALUES ('default', 'web-09', 'yaml', '{doc}', nextval('hdsd_revision'))"
    ));
    for instance in [&a, &b] {
        wait_for(
            "the reconcile to find web-09",
            Duration::from_secs(5),
            || instance.dataplane("default.web-09").map(|_| ()),
        );
    }
}

#[test]
fn instances_outlive_a_postgres_outage_and_catch_up() {
    let Some(mut pg) = Postgres::start("instances_outlive_a_postgres_outage_and_catch_up") else {
        return;
    };
    // Stale only after 30 s: B's copy of readiness must not expire during
    // the outage, so that the transition it missed is visible as such.
    // An instance timeout far shorter than the outage: when PostgreSQL
    // returns, every heartbeat is old, and still no instance is taken for dead.
    let options = |c: &mut Config| {
        on_postgres_with_timeout(c, pg.url(), Duration::from_secs(2));
        c.hds.stale_after = Some(Duration::from_secs(30));
    };
    let a = Hdsd::start_with(options);
    let b = Hdsd::start_with(options);
    let mut app = App::start();
    let path = "/api/v1/dataplanes/default/web-01";
    let yaml = dataplane_yaml("web-01", &[(10001, app.port)]);
    let (status, _, _) = send(&a, path, Some(("application/yaml", &yaml)), &[]);
    assert_eq!(status, 200);
    let _envoy = Envoy::start(a.hds, "default.web-01", None);
    a.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(20));
    b.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(5));
    let holder = format!("/{}", a.pid());
    wait_for(
        "B to know that A holds web-01",
        Duration::from_secs(5),
        || {
            let dp = b.dataplane("default.web-01")?;
            dp.connection
                .held_by
                .as_deref()
                .is_some_and(|h| h.ends_with(&holder))
                .then_some(())
                .ok_or(format!("{:?}", dp.connection))
        },
    );
    for instance in [&a, &b] {
        let (status, body) = instance.readyz();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("reachable"), "{body}");
        assert!(!body.contains("unreachable"), "{body}");
        assert_eq!(instance.metric("hdsd_store_up"), Some(1.0));
    }

    pg.stop();
    let stopped = Instant::now();
    // A transition during the outage: A folds it from memory at once.
    app.stop();
    a.wait_inbound(
        "default.web-01",
        10001,
        "unhealthy",
        Duration::from_secs(10),
    );
    // A write cannot be stored: 503 saying so; what is in force stays.
    let (status, _, body) = send(
        &a,
        "/api/v1/dataplanes/default/web-02",
        Some((
            "application/yaml",
            &dataplane_yaml("web-02", &[(10002, 8081)]),
        )),
        &[],
    );
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("PostgreSQL"),
        "{body}"
    );
    wait_for("B to notice the outage", Duration::from_secs(10), || {
        b.log()
            .contains("lost the connection that listens for definition changes")
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    });
    let (status, _, _) = inbound_status(&b).expect("B keeps serving");
    assert_eq!(status, "healthy", "B cannot have heard of it yet");
    // Each instance reports the outage: still ready (it serves), the body
    // says since when and what it means, and the metrics say so.
    for instance in [&a, &b] {
        let started = Instant::now();
        let body = wait_for(
            "/readyz and hdsd_store_up to report the outage",
            Duration::from_secs(10),
            || {
                let (status, body) = instance.readyz();
                assert_eq!(status, 200, "still ready during the outage: {body}");
                (body.contains("unreachable since")
                    && instance.metric("hdsd_store_up") == Some(0.0))
                .then_some(body.clone())
                .ok_or(body)
            },
        );
        eprintln!(
            "outage reported {:?} after the stop ({:?} after this wait began): {body}",
            stopped.elapsed(),
            started.elapsed()
        );
        assert!(body.contains("still serving HDS"), "{body}");
    }
    // A kept the transition it could not write.
    wait_for(
        "A to count the write it keeps",
        Duration::from_secs(5),
        || {
            let pending = a.metric("hdsd_store_pending_writes").unwrap_or(0.0);
            let failures = a.metric("hdsd_store_write_failures_total").unwrap_or(0.0);
            (pending >= 1.0 && failures >= 1.0)
                .then_some(())
                .ok_or(format!("pending {pending}, failures {failures}"))
        },
    );
    let (_, body) = a.readyz();
    assert!(body.contains("1 readiness update(s) queued"), "{body}");
    // The outage the issue names lasts 10 s; all along, both instances keep
    // serving and keep reporting it (checked throughout, not slept through).
    loop {
        for instance in [&a, &b] {
            let (status, body) = instance.readyz();
            assert_eq!(status, 200, "{body}");
            assert!(body.contains("still serving HDS"), "{body}");
            assert_eq!(instance.metric("hdsd_store_up"), Some(0.0));
        }
        if stopped.elapsed() >= Duration::from_secs(10) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200)); // between checks
    }
    pg.start_again();
    eprintln!("PostgreSQL was down for {:?}", stopped.elapsed());
    // The transition written meanwhile reaches B: the instances converge.
    b.wait_inbound(
        "default.web-01",
        10001,
        "unhealthy",
        Duration::from_secs(15),
    );

    // Writes go through again, and B hears of them again.
    let yaml2 = dataplane_yaml("web-02", &[(10002, 8081)]);
    wait_for("a write after the outage", Duration::from_secs(15), || {
        let (status, _, body) = send(
            &a,
            "/api/v1/dataplanes/default/web-02",
            Some(("application/yaml", &yaml2)),
            &[],
        );
        (status == 200)
            .then_some(())
            .ok_or(format!("{status} {body}"))
    });
    wait_for(
        "web-02 on B after the outage",
        Duration::from_secs(10),
        || b.dataplane("default.web-02").map(|_| ()),
    );
    for instance in [&a, &b] {
        wait_for(
            "/readyz and the metrics to report the store back",
            Duration::from_secs(10),
            || {
                let (status, body) = instance.readyz();
                let up = instance.metric("hdsd_store_up");
                let pending = instance.metric("hdsd_store_pending_writes");
                (status == 200
                    && !body.contains("unreachable")
                    && up == Some(1.0)
                    && pending.unwrap_or(0.0) == 0.0)
                    .then_some(())
                    .ok_or(format!("{status} {body} up {up:?} pending {pending:?}"))
            },
        );
    }
    // Both heartbeats were 10 s old when PostgreSQL returned, five times the
    // instance timeout: neither instance took the other for dead.
    let (_, _, connected) = inbound_status(&a).unwrap();
    assert!(connected, "A still holds web-01");
    let dp = b.dataplane("default.web-01").unwrap();
    assert!(
        dp.connection
            .held_by
            .as_deref()
            .is_some_and(|h| h.ends_with(&holder)),
        "{:?}",
        dp.connection
    );
    assert_eq!(count(&pg, "hdsd_instances"), 2);
    // Claims made during an outage are lost: each instance claimed again.
    assert!(
        a.log().contains("claiming the streams held here again"),
        "{}",
        a.log()
    );
    for instance in [&a, &b] {
        let log = instance.log();
        assert!(!log.contains("panicked"), "{log}");
        assert!(!log.contains("marked the dataplanes it held"), "{log}");
        // One line when it went, one when it came back: not one per write.
        assert_eq!(log.matches(" unreachable (").count(), 1, "{log}");
        assert_eq!(log.matches("reachable again after").count(), 1, "{log}");
    }
    assert!(
        b.log().contains("listening for definition changes again"),
        "{}",
        b.log()
    );
}

#[test]
fn a_dead_instances_dataplanes_are_marked_disconnected_by_one_live_instance() {
    let Some(pg) =
        Postgres::start("a_dead_instances_dataplanes_are_marked_disconnected_by_one_live_instance")
    else {
        return;
    };
    let timeout = Duration::from_secs(2);
    let options = |c: &mut Config| {
        on_postgres_with_timeout(c, pg.url(), Duration::from_secs(2));
        c.hds.stale_after = Some(Duration::from_secs(3));
    };
    let mut a = Hdsd::start_with(options);
    let mut others = [Hdsd::start_with(options), Hdsd::start_with(options)];
    let app = App::start();
    // An Envoy that knows only A: it cannot reconnect elsewhere.
    let _envoy = web01_served_by(&a, &app);
    let holder = format!("/{}", a.pid());
    for other in &others {
        other.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(5));
        wait_for(
            "the others to know that A holds web-01",
            Duration::from_secs(5),
            || {
                let dp = other.dataplane("default.web-01")?;
                dp.connection
                    .held_by
                    .as_deref()
                    .is_some_and(|h| h.ends_with(&holder))
                    .then_some(())
                    .ok_or(format!("{:?}", dp.connection))
            },
        );
    }
    assert_eq!(count(&pg, "hdsd_instances"), 3);
    // A taken for dead by mistake (its rows deleted behind its back, as a
    // sweep would while it cannot reach the database): its next heartbeat
    // registers it again and claims its stream again.
    pg.psql(&format!(
        "DELETE FROM hdsd_streams; DELETE FROM hdsd_instances WHERE instance LIKE '%{holder}'"
    ));
    wait_for("A to claim web-01 again", Duration::from_secs(5), || {
        let rows = pg.psql("SELECT instance FROM hdsd_streams");
        (rows.trim().ends_with(&holder) && count(&pg, "hdsd_instances") == 3)
            .then_some(())
            .ok_or(rows)
    });
    assert!(a.log().contains("registered again"), "{}", a.log());

    a.kill();
    let killed = Instant::now();
    for other in &others {
        wait_for(
            "web-01 marked disconnected on the live instances",
            Duration::from_secs(15),
            || {
                let dp = other.dataplane("default.web-01")?;
                dp.connection
                    .held_by
                    .is_none()
                    .then_some(())
                    .ok_or(format!("{:?}", dp.connection))
            },
        );
    }
    let marked = killed.elapsed();
    eprintln!("SIGKILL of A -> web-01 disconnected on both live instances after {marked:?}");
    // Silent for the timeout, found by the next sweep (every timeout / 4),
    // with a second for the notification and the polling.
    assert!(marked >= timeout - timeout / 4, "{marked:?}");
    assert!(
        marked < timeout + timeout / 4 + Duration::from_secs(1),
        "{marked:?}"
    );
    // The stale rule of stored readiness applies from the last report time
    // A wrote: twice stale_after (A moved it once it trailed by 3 s).
    for other in &others {
        other.wait_inbound("default.web-01", 10001, "stale", Duration::from_secs(8));
        let (_, ready, connected) = inbound_status(other).unwrap();
        assert!(!ready && !connected);
    }
    // One live instance swept (the advisory lock), naming A.
    let sweepers: Vec<String> = others
        .iter()
        .map(|o| o.log())
        .filter(|log| log.contains("marked the dataplanes it held disconnected"))
        .collect();
    assert_eq!(sweepers.len(), 1, "exactly one instance sweeps");
    assert!(sweepers[0].contains(&holder), "{}", sweepers[0]);
    assert_eq!(count(&pg, "hdsd_instances"), 2);
    assert_eq!(count(&pg, "hdsd_streams"), 0);

    // A graceful shutdown leaves at once, without waiting for the timeout.
    let status = others[0].terminate(Duration::from_secs(15));
    assert!(status.success(), "{status}");
    assert_eq!(count(&pg, "hdsd_instances"), 1);
    assert!(
        others[0].log().contains("left the cluster"),
        "{}",
        others[0].log()
    );
}

#[test]
fn an_envoy_listing_two_instances_moves_to_the_other_when_its_instance_dies() {
    let Some(pg) =
        Postgres::start("an_envoy_listing_two_instances_moves_to_the_other_when_its_instance_dies")
    else {
        return;
    };
    let mut instances = [
        Hdsd::start_with(|c| on_postgres(c, pg.url())),
        Hdsd::start_with(|c| on_postgres(c, pg.url())),
    ];
    let app = App::start();
    // One bootstrap naming both instances.
    let _envoy = web01_envoy_on_all(&instances, app.port);

    let holder = wait_for(
        "one instance to hold web-01's stream",
        Duration::from_secs(30),
        || {
            instances
                .iter()
                .position(|h| {
                    h.dataplane("default.web-01")
                        .is_ok_and(|d| d.connection.connected)
                })
                .ok_or_else(|| "no instance has it".to_string())
        },
    );
    instances[holder].wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(20));

    // SIGKILL the instance holding the stream: Envoy reconnects to the other,
    // which has the definition from the shared store and serves it.
    instances[holder].kill();
    let started = Instant::now();
    let other = &instances[1 - holder];
    other.wait_connected("default.web-01", true, Duration::from_secs(60));
    other.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(20));
    eprintln!(
        "after SIGKILL of its instance, the Envoy was served healthy by the other after {:?}",
        started.elapsed()
    );
}

/// The status of web-01's inbound 10001 on `hdsd`, and whether its stream
/// is held there (connected, and held by no other instance).
fn inbound_status(hdsd: &Hdsd) -> Result<(String, bool, bool), String> {
    let dp = hdsd.dataplane("default.web-01")?;
    let inbound = dp
        .inbounds
        .iter()
        .find(|i| i.port == 10001)
        .ok_or("no inbound 10001")?;
    Ok((
        inbound.health.status.clone(),
        inbound.health.ready,
        dp.connection.connected && dp.connection.held_by.is_none(),
    ))
}

/// Waits until `hdsd` answers for the fleet that web-01 is connected, held
/// by the instance with `pid` (another one).
fn wait_held_elsewhere(hdsd: &Hdsd, pid: u32, timeout: Duration) -> Duration {
    let started = Instant::now();
    let suffix = format!("/{pid}");
    wait_for(
        "web-01 connected, held by the other instance",
        timeout,
        || {
            let c = hdsd.dataplane("default.web-01")?.connection;
            (c.connected && c.held_by.as_deref().is_some_and(|h| h.ends_with(&suffix)))
                .then_some(())
                .ok_or_else(|| format!("{c:?}"))
        },
    );
    started.elapsed()
}

#[test]
fn every_instance_answers_for_the_whole_fleet_and_a_failover_never_reads_not_ready() {
    let Some(pg) = Postgres::start(
        "every_instance_answers_for_the_whole_fleet_and_a_failover_never_reads_not_ready",
    ) else {
        return;
    };
    let options = |c: &mut Config| {
        on_postgres_with_timeout(c, pg.url(), Duration::from_secs(2));
        c.hds.stale_after = Some(Duration::from_secs(3));
    };
    let mut instances = [Hdsd::start_with(options), Hdsd::start_with(options)];
    let mut app = App::start();
    let _envoy = web01_envoy_on_all(&instances, app.port);
    let holder = wait_for(
        "one instance to hold the stream",
        Duration::from_secs(30),
        || {
            instances
                .iter()
                .position(|h| inbound_status(h).is_ok_and(|(_, _, connected)| connected))
                .ok_or_else(|| "none yet".to_string())
        },
    );
    let other = 1 - holder;
    instances[holder].wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(20));
    // The other instance answers the same, from what the holder writes.
    let started = Instant::now();
    instances[other].wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(5));
    eprintln!(
        "healthy on the other instance {:?} after the holder",
        started.elapsed()
    );
    // Connected for the fleet there too, naming the holder.
    let took = wait_held_elsewhere(
        &instances[other],
        instances[holder].pid(),
        Duration::from_secs(1),
    );
    eprintln!("the other instance read web-01 connected (held by the holder) {took:?} later");

    // A transition travels too: the app stops, both read unhealthy.
    let commits_before = instances[holder]
        .metric("hdsd_store_commits_total")
        .unwrap_or(0.0);
    let measured_from = Instant::now();
    app.stop();
    instances[holder].wait_inbound(
        "default.web-01",
        10001,
        "unhealthy",
        Duration::from_secs(10),
    );
    let started = Instant::now();
    instances[other].wait_inbound("default.web-01", 10001, "unhealthy", Duration::from_secs(5));
    let lag = started.elapsed();
    eprintln!("a transition reached the other instance {lag:?} after the holder showed it");
    assert!(lag < Duration::from_secs(1), "{lag:?}");
    app.resume();
    instances[holder].wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(10));
    instances[other].wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(5));
    let commits = instances[holder]
        .metric("hdsd_store_commits_total")
        .unwrap_or(0.0)
        - commits_before;
    let per_second = commits / measured_from.elapsed().as_secs_f64();
    eprintln!(
        "holder: {commits} store transactions in {:?} ({per_second:.1}/s) with reports every 200 ms",
        measured_from.elapsed()
    );
    assert!(
        per_second <= 5.0,
        "at most one transaction per 200 ms: {per_second}/s"
    );

    // SIGKILL the holder: the Envoy moves to the other instance, whose API
    // never reads the inbound not ready meanwhile, also once the dead
    // instance was swept (instance_timeout 2 s): the dataplane was claimed
    // since, so the sweep leaves it alone.
    instances[holder].kill();
    let started = Instant::now();
    let mut observations = 0;
    let mut moved = None;
    wait_for(
        "the other instance to hold the stream and the dead one to be swept",
        Duration::from_secs(60),
        || {
            let (status, ready, connected) = inbound_status(&instances[other])?;
            observations += 1;
            assert!(
                ready,
                "read {status} (not ready) on the surviving instance during the failover"
            );
            if connected && status == "healthy" && moved.is_none() {
                moved = Some(started.elapsed());
            }
            let swept = instances[other]
                .log()
                .contains("marked the dataplanes it held disconnected");
            (moved.is_some() && swept)
                .then_some(())
                .ok_or_else(|| format!("{status}, connected {connected}, swept {swept}"))
        },
    );
    eprintln!(
        "failover: the other instance held the stream after {moved:?}, swept the dead one after {:?}; {observations} reads, all ready",
        started.elapsed()
    );
    let (status, ready, connected) = inbound_status(&instances[other]).unwrap();
    assert!(ready && connected, "{status}");
    let survivor = format!("/{}", instances[other].pid());
    let row = pg.psql("SELECT instance FROM hdsd_streams");
    assert!(row.trim().ends_with(&survivor), "{row}");
}

/// The revision of a watch event (its SSE `id`).
fn event_revision(event: &(String, String, String)) -> u64 {
    event
        .1
        .parse()
        .unwrap_or_else(|_| panic!("no revision: {event:?}"))
}

/// Dataplane `name` (mesh, name, revision, ready) in a snapshot event.
fn in_snapshot(event: &(String, String, String), name: &str) -> serde_json::Value {
    assert_eq!(event.0, "snapshot", "{event:?}");
    let data: serde_json::Value = serde_json::from_str(&event.2).unwrap();
    data["snapshot"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["name"] == name))
        .unwrap_or_else(|| panic!("{name} not in {data}"))
        .clone()
}

#[test]
fn a_watch_resumes_on_another_instance_from_its_revision_without_a_snapshot() {
    let Some(pg) =
        Postgres::start("a_watch_resumes_on_another_instance_from_its_revision_without_a_snapshot")
    else {
        return;
    };
    const SLACK: u64 = 2_000_000; // resume_slack = "2s", in revisions (microseconds)
    let options = |c: &mut Config| {
        on_postgres(c, pg.url());
        c.cluster.resume_slack = Duration::from_secs(2);
    };
    let instances = [Hdsd::start_with(options), Hdsd::start_with(options)];
    let (a, b) = (&instances[0], &instances[1]);
    // web-02 never changes (no Envoy); web-01 is probed by a real Envoy.
    let (status, _, body) = send(
        a,
        "/api/v1/dataplanes/default/web-02",
        Some(("application/yaml", &dataplane_yaml("web-02", &[(10002, 1)]))),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    let mut app = App::start();
    let _envoy = web01_envoy_on_all(&instances, app.port);
    for h in &instances {
        h.wait_inbound("default.web-01", 10001, "healthy", Duration::from_secs(30));
    }

    // The consumer watches on A until it is up to date at revision R, and
    // disconnects. R is taken once web-02's last change on B is older than
    // R minus the slack, so that the resumption shows what it leaves out.
    let web02_on_b = in_snapshot(&b.sse(None, None, "synced")[0], "web-02")["revision"]
        .as_u64()
        .unwrap();
    let (r, on_a) = wait_for(
        "A's revision to pass web-02's on B by the slack",
        Duration::from_secs(20),
        || {
            let events = a.sse(None, None, "synced");
            let r = event_revision(events.last().unwrap());
            (r > web02_on_b + SLACK)
                .then_some((r, events.clone()))
                .ok_or_else(|| format!("R {r}, web-02 on B at {web02_on_b}: {events:?}"))
        },
    );
    assert_eq!(in_snapshot(&on_a[0], "web-01")["ready"], true, "{on_a:?}");
    // Revisions are cluster time: the database clock in microseconds.
    let db_now: u64 = pg
        .psql("SELECT (extract(epoch FROM now()) * 1000000)::bigint")
        .trim()
        .parse()
        .unwrap();
    assert!(
        r <= db_now && db_now - r < 60_000_000,
        "R {r} is not the database's clock ({db_now})"
    );

    // While it is away, web-01's app stops: both instances read unhealthy.
    app.stop();
    for h in &instances {
        h.wait_inbound(
            "default.web-01",
            10001,
            "unhealthy",
            Duration::from_secs(10),
        );
    }

    // It resumes on B from R: the change it missed, with the current state,
    // and neither RESYNC nor a snapshot.
    let events = b.sse(None, Some(&r.to_string()), "synced");
    eprintln!("resumed on B from A's revision {r}: {events:?}");
    assert!(
        events.iter().all(|e| e.0 == "changed" || e.0 == "synced"),
        "no RESYNC, no snapshot: {events:?}"
    );
    assert_eq!(events.last().unwrap().0, "synced", "{events:?}");
    let web01: Vec<_> = events
        .iter()
        .filter(|e| e.0 == "changed" && e.2.contains(r#""name":"web-01""#))
        .collect();
    assert_eq!(web01.len(), 1, "one event for web-01: {events:?}");
    assert!(web01[0].2.contains(r#""ready":false"#), "{events:?}");
    assert!(
        !events.iter().any(|e| e.2.contains(r#""name":"web-02""#)),
        "web-02 changed before R minus the slack: {events:?}"
    );
    for e in &events[..events.len() - 1] {
        assert!(event_revision(e) > r - SLACK, "{events:?}");
    }

    // A revision far ahead of B (an hour) is not B's: RESYNC, then a snapshot.
    let far = (r + 3_600_000_000).to_string();
    let events = b.sse(None, Some(&far), "synced");
    assert_eq!(events[0].0, "resync", "{events:?}");
    assert!(events[0].2.contains("unknown_revision"), "{events:?}");
    assert_eq!(
        in_snapshot(&events[1], "web-01")["ready"],
        false,
        "{events:?}"
    );
    assert_eq!(events[2].0, "synced", "{events:?}");
}

#[test]
fn serve_refuses_to_start_when_postgres_cannot_be_reached() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("hdsd.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = {state:?}\n[hds]\nlisten = \"127.0.0.1:0\"\n[api]\nlisten = \"127.0.0.1:0\"\n\
             [auth]\nmode = \"none\"\n[dataplanes]\nsource = \"api\"\n[store]\nkind = \"postgres\"\n\
             [store.postgres]\nurl = \"host={socket} dbname=hdsd\"\nconnect_timeout = \"1s\"\n",
            state = dir.path().join("state").display().to_string(),
            // A socket directory with no server in it.
            socket = dir.path().display(),
        ),
    )
    .unwrap();
    let out = hdsd_cli(&["serve", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read the dataplane definitions: PostgreSQL store"),
        "{stderr}"
    );
    assert!(
        stderr.contains("check that the database named by store.postgres.url is up"),
        "{stderr}"
    );
}

#[test]
fn a_newer_stream_on_another_instance_ends_the_older_one_within_a_second() {
    use crate::support::grpc::GrpcClient;
    let Some(pg) =
        Postgres::start("a_newer_stream_on_another_instance_ends_the_older_one_within_a_second")
    else {
        return;
    };
    let a = Hdsd::start_with(|c| on_postgres(c, pg.url()));
    let b = Hdsd::start_with(|c| on_postgres(c, pg.url()));
    define_web01_seen_by(&a, &b);

    let on_a = GrpcClient::connect(a.hds);
    let mut older = on_a.open_as("default.web-01");
    older.expect_specifier(Duration::from_secs(5));
    a.wait_connected("default.web-01", true, Duration::from_secs(5));

    let on_b = GrpcClient::connect(b.hds);
    let mut newer = on_b.open_as("default.web-01");
    newer.expect_specifier(Duration::from_secs(5));
    let started = Instant::now();
    let status = older.expect_status(tonic::Code::Aborted, Duration::from_secs(1));
    eprintln!(
        "the older stream on A ended {:?} after the newer one on B got its specifier",
        started.elapsed()
    );
    assert!(
        status
            .message()
            .contains("replaced by a newer stream for dataplane default.web-01 on "),
        "{status:?}"
    );
    // The newer stream stays (it reports nothing: stale_after is 600 ms).
    newer.expect_nothing(Duration::from_millis(300));
    // A answers for the fleet: connected, held by B.
    wait_held_elsewhere(&a, b.pid(), Duration::from_secs(5));
    b.wait_connected("default.web-01", true, Duration::from_secs(1));
}

#[test]
fn a_revocation_through_one_instance_ends_a_stream_held_by_another_within_a_second() {
    use crate::support::grpc::{hc_request, GrpcClient, Next};
    let Some(pg) = Postgres::start(
        "a_revocation_through_one_instance_ends_a_stream_held_by_another_within_a_second",
    ) else {
        return;
    };
    let options = |c: &mut Config| token_auth_on_postgres(c, &pg);
    let a = Hdsd::start_with(options);
    let b = Hdsd::start_with(options);
    define_web01_seen_by(&a, &b);

    // A stream on B with a token of B's.
    let token = b.issue_token("default.web-01", "1h");
    let client = GrpcClient::connect(b.hds);
    let mut stream = client.open_with_token(Some(&token));
    stream.send(hc_request(Some("default.web-01")));
    stream.expect_specifier(Duration::from_secs(5));
    let jti = b
        .cli(&["token", "inspect", &token])
        .lines()
        .find_map(|l| l.trim().strip_prefix("jti:").map(|j| j.trim().to_string()))
        .expect("inspect prints the jti");

    // Revoked through A (its config, its revocation file, the shared store).
    let revoked_at = Instant::now();
    let said = a.cli(&["token", "revoke", &jti]);
    assert!(said.contains("in the PostgreSQL store"), "{said}");
    match stream.next(Duration::from_secs(1)) {
        Next::Status(s) => assert!(s.message().contains("revoked"), "{s:?}"),
        other => panic!("expected B to end the stream within a second, got {other:?}"),
    }
    eprintln!(
        "a revocation through A ended B's stream {:?} after the command started",
        revoked_at.elapsed()
    );
    b.wait_connected("default.web-01", false, Duration::from_secs(1));
    // The command is no instance: it never registered a heartbeat.
    assert_eq!(count(&pg, "hdsd_instances"), 2);
}

/// The kids of the private keys in an instance's key directory.
fn private_kids(hdsd: &Hdsd) -> Vec<String> {
    let mut kids: Vec<String> = std::fs::read_dir(hdsd.dir.path().join("state").join("keys"))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().ok()?;
            name.strip_suffix(".key.pem").map(str::to_string)
        })
        .collect();
    kids.sort();
    kids
}

/// Opens a stream on `hds` with `token` until one gets its specifier within
/// `within`: the instance may not trust the token's key yet.
fn accepted_within(
    hds: std::net::SocketAddr,
    token: &str,
    within: Duration,
) -> crate::support::grpc::HdsStream {
    use crate::support::grpc::{hc_request, GrpcClient, Next};
    wait_for("the token accepted", within, || {
        let client = GrpcClient::connect(hds);
        let mut stream = client
            .try_open_with_token(Some(token))
            .map_err(|s| format!("{s:?}"))?;
        stream.send(hc_request(Some("default.web-01")));
        match stream.next(Duration::from_secs(2)) {
            Next::Specifier(_) => Ok(stream),
            other => Err(format!("{other:?}")),
        }
    })
}

#[test]
fn a_token_signed_by_one_instances_key_verifies_on_another_until_the_key_is_removed() {
    use crate::support::grpc::{hc_request, GrpcClient, Next};
    let Some(pg) = Postgres::start(
        "a_token_signed_by_one_instances_key_verifies_on_another_until_the_key_is_removed",
    ) else {
        return;
    };
    let options = |c: &mut Config| token_auth_on_postgres(c, &pg);
    // Two instances, each with its own state directory and first key.
    let a = Hdsd::start_with(options);
    let b = Hdsd::start_with(options);
    let (kids_a, kids_b) = (private_kids(&a), private_kids(&b));
    assert_eq!(kids_a.len(), 1, "{kids_a:?}");
    assert_ne!(kids_a, kids_b);
    define_web01_seen_by(&a, &b);
    // Each published its public key, and nothing private.
    wait_for(
        "both keys published",
        Duration::from_secs(5),
        || match count(&pg, "hdsd_signing_keys") {
            2 => Ok(()),
            n => Err(format!("{n} rows")),
        },
    );
    let published = pg.psql("SELECT kid, public_key FROM hdsd_signing_keys ORDER BY kid");
    assert!(published.contains(&kids_a[0]), "{published}");
    assert!(published.contains("BEGIN PUBLIC KEY"), "{published}");
    assert!(!published.contains("PRIVATE"), "{published}");

    // A token issued with A's key (A's config) opens a stream on B.
    let token = a.issue_token("default.web-01", "1h");
    let mut stream = accepted_within(b.hds, &token, Duration::from_secs(5));
    b.wait_connected("default.web-01", true, Duration::from_secs(5));

    // Rotation on A: a new key, then the old one's files deleted. A
    // withdraws the old key: B ends the live stream and refuses new ones.
    let said = a.cli(&["token", "keygen"]);
    assert!(said.contains("created key"), "{said}");
    let keys_dir = a.dir.path().join("state").join("keys");
    let removed_at = Instant::now();
    for suffix in [".key.pem", ".pub.pem"] {
        std::fs::remove_file(keys_dir.join(format!("{}{suffix}", kids_a[0]))).unwrap();
    }
    match stream.next(Duration::from_secs(1)) {
        Next::Status(s) => assert!(s.message().contains("unknown signing key"), "{s:?}"),
        other => panic!("expected B to end the stream within a second, got {other:?}"),
    }
    eprintln!(
        "removing the key from A's directory ended B's stream {:?} later",
        removed_at.elapsed()
    );
    b.wait_connected("default.web-01", false, Duration::from_secs(1));
    let client = GrpcClient::connect(b.hds);
    let refused = match client.try_open_with_token(Some(&token)) {
        Err(status) => status,
        Ok(mut stream) => {
            stream.send(hc_request(Some("default.web-01")));
            match stream.next(Duration::from_secs(2)) {
                Next::Status(s) => s,
                other => panic!("expected B to refuse the token of the removed key, got {other:?}"),
            }
        }
    };
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    assert!(
        refused.message().contains("unknown signing key"),
        "{refused:?}"
    );
    let published = pg.psql("SELECT kid FROM hdsd_signing_keys");
    assert!(!published.contains(&kids_a[0]), "{published}");
    assert_eq!(count(&pg, "hdsd_signing_keys"), 2, "{published}");

    // A's new key is trusted on B too.
    let token = a.issue_token("default.web-01", "1h");
    accepted_within(b.hds, &token, Duration::from_secs(5));
}

/// The findings of the attack review, at the API: a name that carries the
/// old claim separators, a 7,990-byte name and a NUL are refused with a 400
/// naming the rule (not a 503 "check the database"), and nothing is written:
/// the other dataplanes stay served.
#[test]
fn names_that_break_the_rules_are_refused_at_the_api_with_the_rule() {
    let hdsd = Hdsd::start_with(|c| c.dataplanes.source = DataplanesSource::Api);
    let good = dataplane_yaml("web-01", &[(10001, 8080)]);
    let (status, _, body) = send(
        &hdsd,
        "/api/v1/dataplanes/default/web-01",
        Some(("application/yaml", &good)),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    let long = "a".repeat(7_990);
    for (name, why) in [
        (
            "victim%09fake-host%2F1%092099-01-01T00:00:00%2B00:00",
            "contains '\\t'",
        ),
        (long.as_str(), "more than 253"),
        ("a%00b", "contains '\\0'"),
        ("Web", "contains 'W'"),
    ] {
        let (status, _, body) = send(
            &hdsd,
            &format!("/api/v1/dataplanes/default/{name}"),
            Some(("application/yaml", &good)),
            &[],
        );
        assert_eq!(status, 400, "{name}: {body}");
        let error = body["error"].as_str().unwrap_or_default();
        assert!(error.contains(why), "{name}: {body}");
        assert!(error.contains("a dataplane name is"), "{body}");
    }
    // The definition store's watcher hands the good one to the registry
    // on its own schedule: wait for it, then nothing else is there.
    let listed = wait_for("web-01 listed", Duration::from_secs(10), || {
        let listed = hdsd.dataplanes("")?;
        match listed.len() {
            0 => Err(format!("{listed:?}")),
            _ => Ok(listed),
        }
    });
    assert_eq!(listed.len(), 1, "{listed:?}");
}
