//! The contract every [`Cluster`] keeps, as tests the implementations run:
//! [`one_instance`] against each one alone, [`two_instances`] against two
//! instances sharing one store (PostgreSQL). Public so that the integration
//! tests, which start a database, can run them; behind the `test-util`
//! feature (on in test builds), so a release build does not compile them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{
    Cluster, KeyPublication, LinkChange, LinkState, RegistrationChange, RegistrationState,
    StreamNote, Topic, Written, ZoneRegistration, ZoneWrite,
};
use crate::clock::{Clock as _, SystemClock};
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

    zone_registrations(cluster, "conformance-1").await;

    // Revisions: a fresh instance cannot prove any resume complete (it has
    // not seen the deletions before it started): RESYNC, then a snapshot.
    let feed = cluster.feed(HistoryLimits::default(), SystemClock.now());
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

/// The row of `zone` among `rows`.
fn row_of<'a>(rows: &'a [ZoneRegistration], zone: &str) -> Option<&'a ZoneRegistration> {
    rows.iter().find(|r| r.zone == zone)
}

/// Zone registrations: registered once (again: no change, no new number),
/// disabled, deleted (a tombstone with the time before which the zone's
/// tokens are refused), registered again (keeping that time); each change
/// numbered after the last and announced on the zones signal; a read from
/// a number returns the rows changed after it.
async fn zone_registrations(cluster: &dyn Cluster, zone: &str) {
    use RegistrationChange::*;
    use RegistrationState as S;
    let mut poked = cluster.signal(Topic::Zones);
    poked.borrow_and_update();
    let first = cluster
        .change_zone_registration(zone, Register { disabled: false })
        .await
        .expect("register");
    assert_eq!(first.before, None);
    let r = &first.registration;
    assert_eq!((r.zone.as_str(), r.state), (zone, S::Registered));
    assert_eq!(r.tokens_not_before, None);
    eventually("a registration pokes the zones signal", || {
        let changed = poked.has_changed().unwrap_or(false);
        async move { changed }
    })
    .await;
    let again = cluster
        .change_zone_registration(zone, Register { disabled: false })
        .await
        .expect("register again");
    assert_eq!(again.before, Some(S::Registered));
    assert_eq!(again.registration.seq, r.seq, "no change, no new number");
    let disabled = cluster
        .change_zone_registration(zone, Register { disabled: true })
        .await
        .expect("disable");
    assert_eq!(disabled.registration.state, S::Disabled);
    assert!(disabled.registration.seq > r.seq);
    let deleted = cluster
        .change_zone_registration(zone, Delete)
        .await
        .expect("delete");
    assert_eq!(deleted.before, Some(S::Disabled));
    assert_eq!(deleted.registration.state, S::Deleted);
    let not_before = deleted
        .registration
        .tokens_not_before
        .expect("a deletion retires the tokens issued until then");
    let age = SystemClock.now() - not_before;
    assert!(
        age < chrono::Duration::seconds(60) && age > chrono::Duration::seconds(-60),
        "the deletion's time is now: {not_before}"
    );
    let back = cluster
        .change_zone_registration(zone, Register { disabled: false })
        .await
        .expect("register after the deletion");
    assert_eq!(back.before, Some(S::Deleted));
    assert_eq!(back.registration.tokens_not_before, Some(not_before));
    let all = cluster.zone_registrations(0).await.expect("read all");
    assert_eq!(row_of(&all, zone), Some(&back.registration), "{all:?}");
    let since = cluster
        .zone_registrations(disabled.registration.seq)
        .await
        .expect("read since");
    assert_eq!(
        since.iter().filter(|r| r.zone == zone).count(),
        1,
        "one row per zone: {since:?}"
    );
    assert!(since.iter().all(|r| r.seq > disabled.registration.seq));
    assert!(cluster
        .zone_registrations(back.registration.seq)
        .await
        .expect("read after the last")
        .iter()
        .all(|r| r.zone != zone));
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

    // A zone registered through A is one for B; deleting it through A
    // drops the link and dataplane rows A wrote for the zone's stream.
    let zone = "conformance-2";
    let registered = a
        .change_zone_registration(zone, RegistrationChange::Register { disabled: false })
        .await
        .expect("a registers");
    eventually("B reads A's registration", || async {
        row_of(&b.zone_registrations(0).await.unwrap_or_default(), zone)
            == Some(&registered.registration)
    })
    .await;
    let link = LinkState {
        epoch: 1,
        zone_instance: "zone/1".into(),
        held: Some(3),
        snapshot: false,
        opened_age: Some(Duration::from_secs(1)),
        heartbeat_age: Some(Duration::ZERO),
        online_since_age: Some(Duration::from_secs(1)),
    };
    let written = a
        .write_zones(
            &[ZoneWrite {
                zone: zone.into(),
                claim: format!("{}#1", a.instance()),
                link: LinkChange::Claim(link),
                upserts: vec![(dataplane(1), vec![1, 2, 3])],
                deletes: Vec::new(),
            }],
            Duration::from_secs(15),
            false,
        )
        .await
        .expect("a writes the zone");
    assert!(matches!(written[..], [Written::Kept { .. }]), "{written:?}");
    let read = b.zones_since(0).await.expect("b reads the zones");
    assert!(read.links.iter().any(|l| l.zone == zone), "{read:?}");
    assert!(read.dataplanes.iter().any(|d| d.zone == zone), "{read:?}");
    let deleted = a
        .change_zone_registration(zone, RegistrationChange::Delete)
        .await
        .expect("a deletes");
    let read = b.zones_since(0).await.expect("b reads the zones");
    assert!(
        read.links.iter().all(|l| l.zone != zone) && read.dataplanes.iter().all(|d| d.zone != zone),
        "the deleted zone's rows are gone: {read:?}"
    );
    let tombstone = b
        .zone_registrations(registered.registration.seq)
        .await
        .expect("b reads the deletion");
    assert_eq!(row_of(&tombstone, zone), Some(&deleted.registration));

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

/// The lease every lease test of one store uses.
const LEASE: &str = "conformance-lease";

/// What one instance must see of a lease: taken with an epoch, kept with
/// the same one, released (announced), taken again with a higher one;
/// leaving the cluster gives it up too.
pub async fn one_lease(cluster: &dyn Cluster) {
    let timeout = Duration::from_secs(10);
    cluster.heartbeat().await.expect("heartbeat");
    let me = cluster.instance().to_string();
    let first = cluster
        .acquire_lease(LEASE, timeout)
        .await
        .expect("acquire");
    assert_eq!(first.holder.as_deref(), Some(me.as_str()), "{first:?}");
    assert!(first.epoch > 0, "{first:?}");
    let kept = cluster.acquire_lease(LEASE, timeout).await.expect("keep");
    assert_eq!(kept, first, "kept with the same epoch");

    let mut poked = cluster.signal(super::Topic::Leases);
    poked.borrow_and_update();
    assert!(cluster.release_lease(LEASE).await.expect("release"));
    assert!(
        !cluster.release_lease(LEASE).await.expect("release again"),
        "released already"
    );
    eventually("a release pokes the leases signal", || {
        let changed = poked.has_changed().unwrap_or(false);
        async move { changed }
    })
    .await;
    let second = cluster.acquire_lease(LEASE, timeout).await.expect("take");
    assert!(second.held_by(&me), "{second:?}");
    assert!(
        second.epoch > first.epoch,
        "a new holding, a higher epoch: {second:?} after {first:?}"
    );

    // Leaving gives every lease up: held again, with a higher epoch.
    cluster.leave().await.expect("leave");
    cluster.heartbeat().await.expect("heartbeat after leaving");
    let third = cluster.acquire_lease(LEASE, timeout).await.expect("take");
    assert!(third.held_by(&me), "{third:?}");
    assert!(third.epoch > second.epoch, "{third:?} after {second:?}");
    assert!(cluster.release_lease(LEASE).await.expect("release"));
}

/// What two instances sharing a store must see of one lease: one holder at
/// a time, the other told who holds it and how long that one has been
/// silent; a release hands it over (announced); a holder silent for the
/// timeout loses it to a live instance, with a higher epoch; an instance
/// without a live heartbeat takes nothing.
pub async fn two_leases(a: &dyn Cluster, b: &dyn Cluster) {
    let long = Duration::from_secs(30);
    a.heartbeat().await.expect("a beats");
    b.heartbeat().await.expect("b beats");
    let on_a = a.acquire_lease(LEASE, long).await.expect("a acquires");
    assert!(on_a.held_by(a.instance()), "{on_a:?}");
    let on_b = b.acquire_lease(LEASE, long).await.expect("b asks");
    assert_eq!(on_b.holder.as_deref(), Some(a.instance()), "{on_b:?}");
    assert_eq!(on_b.epoch, on_a.epoch);
    assert!(
        on_b.holder_silent.is_some_and(|s| s < long),
        "b is told how long a has been silent: {on_b:?}"
    );

    // A release is announced to B, which takes the lease at once.
    let mut poked = b.signal(super::Topic::Leases);
    poked.borrow_and_update();
    assert!(a.release_lease(LEASE).await.expect("a releases"));
    eventually("A's release pokes B", || {
        let changed = poked.has_changed().unwrap_or(false);
        async move { changed }
    })
    .await;
    let taken = b.acquire_lease(LEASE, long).await.expect("b takes");
    assert!(taken.held_by(b.instance()), "{taken:?}");
    assert!(taken.epoch > on_a.epoch, "{taken:?} after {on_a:?}");
    let told = a.acquire_lease(LEASE, long).await.expect("a asks");
    assert_eq!(told.holder.as_deref(), Some(b.instance()), "{told:?}");

    // B falls silent: A, beating, takes the lease once B has been silent
    // for the timeout, with a higher epoch.
    let timeout = Duration::from_millis(300);
    let over = std::sync::Mutex::new(None);
    eventually("A takes the lease of the silent B", || async {
        let _ = a.heartbeat().await;
        let lease = a.acquire_lease(LEASE, timeout).await.ok();
        let done = lease.as_ref().is_some_and(|l| l.held_by(a.instance()));
        *over.lock().unwrap() = lease;
        done
    })
    .await;
    let over = over.into_inner().unwrap().expect("a lease");
    assert!(over.epoch > taken.epoch, "{over:?} after {taken:?}");
    // B, silent itself for longer than the timeout, takes nothing back.
    let late = b.acquire_lease(LEASE, timeout).await.expect("b asks late");
    assert_eq!(late.holder.as_deref(), Some(a.instance()), "{late:?}");
    assert_eq!(late.epoch, over.epoch);
    // Nor a free lease.
    assert!(a.release_lease(LEASE).await.expect("a releases"));
    let free = b.acquire_lease(LEASE, timeout).await.expect("b asks");
    assert_eq!(free.holder, None, "no live heartbeat, no lease: {free:?}");
    // Once B beats again, it is a member and takes it.
    b.heartbeat().await.expect("b beats again");
    let back = b.acquire_lease(LEASE, timeout).await.expect("b takes");
    assert!(back.held_by(b.instance()), "{back:?}");
    assert!(back.epoch > over.epoch, "{back:?} after {over:?}");
    assert!(b.release_lease(LEASE).await.expect("b releases"));
}
