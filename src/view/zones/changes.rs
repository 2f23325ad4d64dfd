//! What a global's watchers must hear of its zones: the difference between
//! two [`ZonesView`]s as change-feed entries, so the gRPC `Watch` and the
//! SSE watch carry every zone's dataplanes and the zones' states under the
//! one revision contract of the global's own dataplanes.
//!
//! - A zone that appears, or whose state moves (online, offline, disabled,
//!   never connected), is one zone event.
//! - A zone that leaves the view (deleted) is one zone deletion: its
//!   dataplanes go with it, with no deletion of their own.
//! - A dataplane added, changed or removed is one event; unchanged ones cost
//!   nothing (the views share their persistent maps).
//! - When a zone's data is withdrawn (disabled, or offline longer than
//!   `global.offline_ttl`) or comes back, each of its dataplanes is one
//!   event, since each one's readiness moved. A zone merely going offline
//!   moves no dataplane: it keeps its last readiness until the TTL.
//!
//! Pure: the caller publishes what [`changes`] returns.

use std::cmp::Ordering;
use std::sync::Arc;

use super::{ZoneView, ZonesView};
use crate::feed::{Change, ChangeKind, Subject};
use crate::pb;

/// Whether a zone's dataplane reads ready as the view shows it.
fn ready(zone: &ZoneView, dp: &pb::Dataplane) -> bool {
    !zone.summary.withdrawn
        && dp
            .inbounds
            .iter()
            .all(|i| i.health.as_ref().is_some_and(|h| h.ready))
}

fn dataplane(
    zone: &Arc<str>,
    view: &ZoneView,
    dp: &Arc<pb::Dataplane>,
    kind: ChangeKind,
) -> Change {
    Change {
        subject: Subject::Remote {
            zone: zone.clone(),
            dataplane: dp.clone(),
        },
        incarnation: 0,
        kind,
        ready: kind == ChangeKind::Changed && ready(view, dp),
        at_least: 0,
    }
}

fn zone_change(zone: &Arc<str>, view: &ZoneView, kind: ChangeKind) -> Change {
    Change {
        subject: Subject::Zone {
            zone: zone.clone(),
            state: view.summary.liveness.state.as_str(),
        },
        incarnation: 0,
        kind,
        ready: false,
        at_least: 0,
    }
}

/// One zone that is in both views.
fn zone_moved(prev: &ZoneView, next: &ZoneView, out: &mut Vec<Change>) {
    let name: Arc<str> = Arc::from(next.summary.name.as_str());
    if prev.summary.liveness.state != next.summary.liveness.state {
        out.push(zone_change(&name, next, ChangeKind::Changed));
    }
    if prev.summary.withdrawn != next.summary.withdrawn {
        // Every dataplane's readiness moved.
        for (id, dp) in &prev.dataplanes {
            if !next.dataplanes.contains_key(id) {
                out.push(dataplane(&name, prev, dp, ChangeKind::Deleted));
            }
        }
        for dp in next.dataplanes.values() {
            out.push(dataplane(&name, next, dp, ChangeKind::Changed));
        }
        return;
    }
    for item in prev.dataplanes.diff(&next.dataplanes) {
        match item {
            imbl::ordmap::DiffItem::Add(_, dp)
            | imbl::ordmap::DiffItem::Update { new: (_, dp), .. } => {
                out.push(dataplane(&name, next, dp, ChangeKind::Changed));
            }
            imbl::ordmap::DiffItem::Remove(_, dp) => {
                out.push(dataplane(&name, prev, dp, ChangeKind::Deleted));
            }
        }
    }
}

/// What changed from `prev` to `next`, in the order a watcher should see
/// it: zone by zone (sorted by name), each zone's state before its
/// dataplanes.
pub fn changes(prev: &ZonesView, next: &ZonesView) -> Vec<Change> {
    let mut out = Vec::new();
    let (mut a, mut b) = (prev.zones.iter().peekable(), next.zones.iter().peekable());
    loop {
        let order = match (a.peek(), b.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(p), Some(n)) => p.summary.name.cmp(&n.summary.name),
        };
        match order {
            Ordering::Less => {
                // Gone from the view: deleted, and its dataplanes with it.
                let gone = a.next().expect("peeked");
                let name: Arc<str> = Arc::from(gone.summary.name.as_str());
                out.push(zone_change(&name, gone, ChangeKind::Deleted));
            }
            Ordering::Greater => {
                let new = b.next().expect("peeked");
                let name: Arc<str> = Arc::from(new.summary.name.as_str());
                out.push(zone_change(&name, new, ChangeKind::Changed));
                for dp in new.dataplanes.values() {
                    out.push(dataplane(&name, new, dp, ChangeKind::Changed));
                }
            }
            Ordering::Equal => {
                let (p, n) = (a.next().expect("peeked"), b.next().expect("peeked"));
                zone_moved(p, n, &mut out);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::DataplaneId;
    use crate::view::zones::ZoneSummary;
    use crate::view::zones::{Liveness, ZoneState};

    fn dp(name: &str, ready: bool) -> Arc<pb::Dataplane> {
        Arc::new(pb::Dataplane {
            mesh: "default".into(),
            name: name.into(),
            inbounds: vec![pb::Inbound {
                port: 10001,
                health: Some(pb::Health {
                    ready,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    fn zone(name: &str, state: ZoneState, withdrawn: bool, dps: &[Arc<pb::Dataplane>]) -> ZoneView {
        ZoneView {
            summary: ZoneSummary {
                name: name.into(),
                liveness: Liveness {
                    state,
                    since: None,
                    last_seen: None,
                    offline_at: None,
                },
                registered: true,
                registered_by: Some("config"),
                instance: None,
                held_by: None,
                held: None,
                dataplanes: dps.len(),
                inbounds_ready: 0,
                inbounds_total: dps.len(),
                withdrawn,
                counters: Default::default(),
            },
            dataplanes: dps
                .iter()
                .map(|d| (DataplaneId::new(d.mesh.clone(), d.name.clone()), d.clone()))
                .collect(),
        }
    }

    fn view(zones: Vec<ZoneView>) -> ZonesView {
        ZonesView {
            zones,
            synced: true,
        }
    }

    /// (kind, zone, dataplane name or "", ready) of each change.
    fn said(changes: &[Change]) -> Vec<(ChangeKind, String, String, bool)> {
        changes
            .iter()
            .map(|c| {
                let zone = c.subject.zone().map(|z| z.to_string()).unwrap_or_default();
                let name = c
                    .subject
                    .mesh_name()
                    .map(|(_, n)| n.to_string())
                    .unwrap_or_default();
                (c.kind, zone, name, c.ready)
            })
            .collect()
    }

    use ChangeKind::{Changed as C, Deleted as D};

    fn s(
        kind: ChangeKind,
        zone: &str,
        name: &str,
        ready: bool,
    ) -> (ChangeKind, String, String, bool) {
        (kind, zone.into(), name.into(), ready)
    }

    #[test]
    fn a_new_zone_is_one_zone_event_then_each_of_its_dataplanes() {
        let next = view(vec![zone(
            "eu-1",
            ZoneState::Online,
            false,
            &[dp("a", true), dp("b", false)],
        )]);
        let out = changes(&ZonesView::default(), &next);
        assert_eq!(
            said(&out),
            [
                s(C, "eu-1", "", false),
                s(C, "eu-1", "a", true),
                s(C, "eu-1", "b", false)
            ]
        );
        assert!(matches!(
            &out[0].subject,
            Subject::Zone {
                state: "online",
                ..
            }
        ));
    }

    #[test]
    fn only_what_moved_is_said() {
        let (a, b) = (dp("a", true), dp("b", true));
        let prev = view(vec![
            zone("eu-1", ZoneState::Online, false, &[a.clone(), b.clone()]),
            zone("us-1", ZoneState::Online, false, &[dp("c", true)]),
        ]);
        // In eu-1: b flips, a stays, d arrives; us-1 goes offline (its
        // dataplanes keep their readiness until the TTL).
        let next = view(vec![
            zone(
                "eu-1",
                ZoneState::Online,
                false,
                &[a, dp("b", false), dp("d", true)],
            ),
            zone("us-1", ZoneState::Offline, false, &[dp("c", true)]),
        ]);
        assert_eq!(
            said(&changes(&prev, &next)),
            [
                s(C, "eu-1", "b", false),
                s(C, "eu-1", "d", true),
                s(C, "us-1", "", false),
            ]
        );
        assert!(
            changes(&next, &next).is_empty(),
            "nothing moved, nothing said"
        );
    }

    #[test]
    fn a_withdrawn_zone_moves_every_dataplane_and_a_deleted_one_is_one_event() {
        let prev = view(vec![zone(
            "eu-1",
            ZoneState::Offline,
            false,
            &[dp("a", true), dp("b", true)],
        )]);
        let withdrawn = view(vec![zone(
            "eu-1",
            ZoneState::Offline,
            true,
            &[dp("a", true), dp("b", true)],
        )]);
        assert_eq!(
            said(&changes(&prev, &withdrawn)),
            [s(C, "eu-1", "a", false), s(C, "eu-1", "b", false)]
        );
        let back = view(vec![zone(
            "eu-1",
            ZoneState::Online,
            false,
            &[dp("a", true)],
        )]);
        assert_eq!(
            said(&changes(&withdrawn, &back)),
            [
                s(C, "eu-1", "", false),
                s(D, "eu-1", "b", false),
                s(C, "eu-1", "a", true)
            ]
        );
        assert_eq!(
            said(&changes(&back, &ZonesView::default())),
            [s(D, "eu-1", "", false)],
            "a deleted zone is one event, not one per dataplane"
        );
    }
}
