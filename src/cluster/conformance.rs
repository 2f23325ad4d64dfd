//! The contract every [`Cluster`] keeps, as tests the implementations run:
//! [`one_instance`] against each one alone, [`two_instances`] against two
//! instances sharing one store (PostgreSQL). Public so that the integration
//! tests, which start a database, can run them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{Cluster, KeyPublication, StreamNote};
use crate::dataplane::DataplaneId;
use crate::feed::{Filter, HistoryLimits, Message};
use crate::readiness::Timestamp;

/// How long an announcement may take to be seen.
const SEEN_WITHIN: Duration = Duration::from_secs(10);

/// A dataplane of the conformance tests; `n` picks one. The longest name
/// the rules allow is among them: every announcement must fit.
fn dataplane(n: usize) -> DataplaneId {
    match n {
        0 => DataplaneId::try_new("default", "c".repeat(crate::names::MAX_NAME)),
        n => DataplaneId::try_new("default", format!("conformance-{n:02}.web")),
    }
    .expect("a valid name")
}

fn at(ms: i64) -> Timestamp {
    chrono::DateTime::from_timestamp_millis(1_800_000_000_000 + ms).expect("a valid time")
}

/// Polls `check` until it holds, or panics naming `what` after `SEEN_WITHIN`.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + SEEN_WITHIN;
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "not within {SEEN_WITHIN:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The next stream note, or a panic after `SEEN_WITHIN`.
async fn next_note(notes: &mut tokio::sync::broadcast::Receiver<StreamNote>) -> StreamNote {
    tokio::time::timeout(SEEN_WITHIN, notes.recv())
        .await
        .expect("a note within the deadline")
        .expect("a note")
}

/// Publishes `keys` as publisher `pub-a`.
async fn publish(
    cluster: &dyn Cluster,
    keys: &BTreeMap<String, String>,
    alive: Duration,
) -> KeyPublication {
    cluster
        .publish_keys("pub-a", keys, alive)
        .await
        .expect("publish")
}

/// What one instance must see of its own duties.
pub async fn one_instance(cluster: &dyn Cluster) {
    // Membership: the first heartbeat registers, the next ones find the
    // registration.
    assert!(
        cluster.heartbeat().await.expect("heartbeat"),
        "first beat registers"
    );
    assert!(
        !cluster.heartbeat().await.expect("heartbeat"),
        "then it is known"
    );

    // Claims: a burst of 20 attaches and 14 releases, the longest name
    // among them, lands whole (no claim takes another with it).
    let claims = cluster.claims();
    for n in 0..20 {
        (claims.0)(&dataplane(n), Some(at(n as i64)));
    }
    for n in 6..20 {
        (claims.0)(&dataplane(n), None);
    }
    let mut expected: BTreeMap<DataplaneId, String> = (0..6)
        .map(|n| (dataplane(n), cluster.instance().to_string()))
        .collect();
    eventually(
        "the 6 claims left, and only those, are the holders",
        || async {
            let holders = cluster.holders().await.unwrap_or_default();
            let have: BTreeMap<DataplaneId, String> = holders
                .into_iter()
                .filter(|(id, _)| id.name.starts_with("conformance-") || id.name.starts_with('c'))
                .map(|(id, (instance, _))| (id, instance))
                .collect();
            have == expected
        },
    )
    .await;
    let holders = cluster.holders().await.expect("holders");
    assert_eq!(holders[&dataplane(3)].1, at(3), "the attach time is kept");

    // A newer attach replaces the holder's time; nothing else moves.
    (claims.0)(&dataplane(3), Some(at(1_000)));
    eventually("a newer attach is the one held", || async {
        cluster
            .holders()
            .await
            .unwrap_or_default()
            .get(&dataplane(3))
            .map(|h| h.1)
            == Some(at(1_000))
    })
    .await;

    // Revocations: once, then already.
    assert!(cluster.revoke("jti-conformance").await.expect("revoke"));
    assert!(!cluster
        .revoke("jti-conformance")
        .await
        .expect("revoke again"));
    assert!(cluster
        .revocations()
        .await
        .expect("revocations")
        .contains(&"jti-conformance".to_string()));

    // Public keys: published, unchanged, replaced; only this publisher's.
    let keys = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let alive = Duration::from_secs(10);
    let one = keys(&[("kid-1", "pem-1")]);
    assert_eq!(publish(cluster, &one, alive).await, KeyPublication::Changed);
    assert_eq!(
        publish(cluster, &one, alive).await,
        KeyPublication::Unchanged
    );
    let two = keys(&[("kid-2", "pem-2")]);
    assert_eq!(publish(cluster, &two, alive).await, KeyPublication::Changed);
    let shared: Vec<(String, String)> = cluster
        .shared_keys()
        .await
        .expect("shared keys")
        .into_iter()
        .filter(|k| k.publisher == "pub-a")
        .map(|k| (k.kid, k.public_pem))
        .collect();
    assert_eq!(shared, vec![("kid-2".to_string(), "pem-2".to_string())]);

    // Revisions: a fresh instance cannot prove any resume complete (it has
    // not seen the deletions before it started): RESYNC, then a snapshot.
    let feed = cluster.feed(HistoryLimits::default(), chrono::Utc::now());
    let start = feed.subscribe(Some(1), &Filter::default());
    assert!(
        matches!(start.first(), Some(Message::Resync(_))),
        "a resume on a fresh instance starts with RESYNC: {start:?}"
    );

    // Leaving releases every stream held here.
    cluster.leave().await.expect("leave");
    expected.clear();
    eventually("no stream is held after leaving", || async {
        !cluster
            .holders()
            .await
            .unwrap_or_default()
            .values()
            .any(|(instance, _)| instance == cluster.instance())
    })
    .await;
}

/// What two instances sharing a store must see of each other.
pub async fn two_instances(a: &dyn Cluster, b: &dyn Cluster) {
    assert_ne!(a.instance(), b.instance(), "two instances, two names");
    a.heartbeat().await.expect("a beats");
    b.heartbeat().await.expect("b beats");

    // A claim on A reaches B as a note and as a holder row, with A's name
    // and nothing a name could forge; a release reaches B too.
    let mut notes = b.stream_notes();
    let longest = dataplane(0);
    (a.claims().0)(&longest, Some(at(7)));
    let note = next_note(&mut notes).await;
    assert_eq!(
        note,
        StreamNote::Claimed((longest.clone(), a.instance().to_string(), at(7)))
    );
    eventually("B reads A as the holder", || async {
        b.holders()
            .await
            .unwrap_or_default()
            .get(&longest)
            .map(|h| h.0.clone())
            == Some(a.instance().to_string())
    })
    .await;
    (a.claims().0)(&longest, None);
    let note = next_note(&mut notes).await;
    assert_eq!(
        note,
        StreamNote::Released(longest.clone(), a.instance().to_string())
    );

    // A revocation through A is one for B.
    assert!(a.revoke("jti-shared").await.expect("revoke"));
    assert!(b
        .revocations()
        .await
        .expect("revocations")
        .contains(&"jti-shared".to_string()));

    // Two live instances cannot rewrite one publisher's keys.
    let keys: BTreeMap<String, String> = [("kid-s".to_string(), "pem-s".to_string())].into();
    let alive = Duration::from_secs(60);
    a.publish_keys("pub-shared", &keys, alive)
        .await
        .expect("a publishes");
    assert_eq!(
        b.publish_keys("pub-shared", &keys, alive)
            .await
            .expect("b publishes"),
        KeyPublication::Contested {
            by: a.instance().to_string()
        }
    );

    // An instance that stops beating is swept once silent for the timeout:
    // its streams are released (announced), and it learns so on its next beat.
    (a.claims().0)(&dataplane(1), Some(at(9)));
    eventually("B reads A's new claim", || async {
        b.holders()
            .await
            .unwrap_or_default()
            .contains_key(&dataplane(1))
    })
    .await;
    let timeout = Duration::from_millis(300);
    let swept = std::sync::Mutex::new(Vec::new());
    eventually("B sweeps the silent A", || async {
        let _ = b.heartbeat().await;
        let found = b.sweep(timeout).await.unwrap_or_default();
        let done = !found.is_empty();
        *swept.lock().unwrap() = found;
        done
    })
    .await;
    let swept = swept.into_inner().unwrap();
    assert!(
        swept
            .iter()
            .any(|(instance, streams)| instance == a.instance() && *streams >= 1),
        "A swept with its stream: {swept:?}"
    );
    assert!(!b
        .holders()
        .await
        .expect("holders")
        .contains_key(&dataplane(1)));
    assert!(
        a.heartbeat().await.expect("a beats again"),
        "A finds itself swept"
    );
}
