//! What the global holds of one zone, across its streams: the zone's
//! dataplanes, the zone revision it holds them complete at, the uplink
//! lease (which stream holds it, the highest epoch accepted) and the
//! liveness inputs. Plain data with one writer (the driver of the zone's
//! streams), fed with the [`session::Action`]s of the stream that holds the
//! uplink.
//!
//! The rules it keeps:
//!
//! - A snapshot deletes only once it is complete, and only what it did not
//!   name: a reconnecting zone's dataplanes that were merely not sent again
//!   *yet* never get a deletion.
//! - While a snapshot is in progress, or after one was abandoned (its
//!   stream ended first), the global holds no complete state: the next
//!   stream gets no `resume_from`, so it sends a snapshot.
//! - The uplink goes to the stream with the highest epoch; an equal epoch
//!   takes over too (the same instance reconnecting). A lower epoch is
//!   refused while the zone is online; once it is offline any epoch may
//!   claim (a zone whose lease store was reset must not be locked out).
//! - Actions of a stream that does not hold the uplink change nothing: a
//!   superseded stream's late actions are dropped.
//! - Claiming drops the dataplanes of meshes the stream's credential no
//!   longer allows.
//! - A claim from another source (another zone instance, or another
//!   address) while the holder is online is a contest: one now and then
//!   is a takeover (a failover). [`STORM_CONTESTS`] within
//!   [`STORM_WINDOW`] is a supersede storm, two holders of one credential
//!   dialing in turn: from then on the online holder keeps the uplink and
//!   the claim is refused ([`Claim::Contested`], naming both sources), so
//!   the zone does not flap between them; the storm ends once no contest
//!   came for [`STORM_WINDOW`].
//!
//! [`session::Action`]: super::session::Action

use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use super::liveness::{self, Liveness, LivenessInputs, ZoneState};
use super::session::Action;
use super::Meshes;
use crate::clock::Timestamp;
use crate::dataplane::DataplaneId;
use crate::pb;

/// Names one stream of the global (the driver numbers them, growing).
pub type StreamId = u64;

/// A dataplane of the zone that the global's readers must look at again.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Applied {
    /// Created or changed.
    Changed(DataplaneId),
    /// Deleted.
    Deleted(DataplaneId),
}

/// The answer to [`RemoteZone::claim`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The stream holds the uplink now.
    Won {
        /// The revision to resume from (for [`Event::Claimed`]).
        ///
        /// [`Event::Claimed`]: super::session::Event::Claimed
        resume_from: Option<u64>,
        /// The stream that held it before, which must now be told
        /// [`Event::Superseded`](super::session::Event::Superseded).
        replaced: Option<StreamId>,
        /// Dataplanes dropped because the credential no longer allows their mesh.
        pruned: Vec<Applied>,
    },
    /// A higher epoch holds it (for [`Event::ClaimLost`]).
    ///
    /// [`Event::ClaimLost`]: super::session::Event::ClaimLost
    Lost {
        /// The epoch held.
        epoch: u64,
        /// The instance that holds it.
        instance: String,
    },
    /// A supersede storm: another source holds the uplink, online, and
    /// claims of other sources came [`STORM_CONTESTS`] times within
    /// [`STORM_WINDOW`]; the holder keeps it (for
    /// [`Event::Contested`](super::session::Event::Contested)).
    Contested {
        /// The holder, as messages name it (`instance at address`).
        holder: String,
        /// The claimant, named the same way.
        claimant: String,
        /// Contests within the window, this one included.
        contests: usize,
    },
}

/// Claims from another source while the holder is online, within
/// [`STORM_WINDOW`], that make a supersede storm.
pub const STORM_CONTESTS: usize = 3;

/// How far back contests count, and how long a storm outlives its last one.
pub const STORM_WINDOW: Duration = Duration::from_secs(600);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Holder {
    stream: StreamId,
    epoch: u64,
    instance: String,
    /// The address the stream came from, when the driver knows it.
    peer: Option<IpAddr>,
}

/// A stream's source as messages name it.
fn source(instance: &str, peer: Option<IpAddr>) -> String {
    match peer {
        Some(ip) => format!("instance {} at {ip}", crate::names::shown(instance)),
        None => format!("instance {}", crate::names::shown(instance)),
    }
}

/// A zone's dataplanes as the global holds them: a persistent map, so a
/// view takes it without a copy and a reader finds what changed between two
/// views without visiting what they share ([`imbl::OrdMap::diff`]).
pub type Dataplanes = imbl::OrdMap<DataplaneId, Arc<pb::Dataplane>>;

/// What the global holds of one zone.
#[derive(Debug, Clone)]
pub struct RemoteZone {
    zone: String,
    zone_timeout: Duration,
    dataplanes: Dataplanes,
    /// Inbounds of `dataplanes` that report ready, and in all (kept as they
    /// change, so a summary costs no walk of the zone).
    inbounds: (usize, usize),
    /// Complete as of this zone revision.
    held: Option<u64>,
    snapshot: bool,
    holder: Option<Holder>,
    /// The highest epoch accepted, and from which instance.
    epoch: Option<(u64, String)>,
    liveness: LivenessInputs,
    /// While another instance of the global holds the zone's stream: that
    /// instance (from the shared store; see [`RemoteZone::observe_link`]).
    elsewhere: Option<String>,
    /// When claims of another source contested an online holder, within
    /// [`STORM_WINDOW`] (at most [`STORM_CONTESTS`] kept).
    contests: VecDeque<Timestamp>,
}

/// A zone's link as another instance of the global wrote it, its times
/// put on this instance's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedLink {
    /// The lease epoch held, and the zone instance holding it.
    pub epoch: u64,
    pub zone_instance: String,
    /// The revision held complete, and whether a snapshot is in progress.
    pub held: Option<u64>,
    pub snapshot: bool,
    /// The liveness times (the `disabled` flag is this instance's own).
    pub liveness: LivenessInputs,
    /// The instance of the global holding the stream; `None`: nobody.
    pub holder: Option<String>,
}

/// The link as a stream of this instance holds it, for the other instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnLink {
    /// The holding stream.
    pub stream: StreamId,
    pub epoch: u64,
    pub zone_instance: String,
    pub held: Option<u64>,
    pub snapshot: bool,
    pub liveness: LivenessInputs,
}

impl RemoteZone {
    /// A zone of which the global holds nothing yet.
    pub fn new(zone: impl Into<String>, zone_timeout: Duration) -> RemoteZone {
        RemoteZone {
            zone: zone.into(),
            zone_timeout,
            dataplanes: Dataplanes::new(),
            inbounds: (0, 0),
            held: None,
            snapshot: false,
            holder: None,
            epoch: None,
            liveness: LivenessInputs::default(),
            elsewhere: None,
            contests: VecDeque::new(),
        }
    }

    /// The zone's name.
    pub fn zone(&self) -> &str {
        &self.zone
    }

    /// The revision a new stream may resume from: the one the global holds
    /// the zone complete at, `None` while a snapshot is in progress or none
    /// was ever completed.
    pub fn resume_from(&self) -> Option<u64> {
        self.held.filter(|_| !self.snapshot)
    }

    /// True while a snapshot is in progress.
    pub fn snapshot_in_progress(&self) -> bool {
        self.snapshot
    }

    /// The stream holding the uplink, if any.
    pub fn holder(&self) -> Option<StreamId> {
        self.holder.as_ref().map(|h| h.stream)
    }

    /// The zone instance whose stream holds the uplink, if any (here or
    /// on another instance of the global).
    pub fn uplink_instance(&self) -> Option<&str> {
        match (&self.holder, &self.elsewhere, &self.epoch) {
            (Some(h), _, _) => Some(h.instance.as_str()),
            (None, Some(_), Some((_, instance))) => Some(instance.as_str()),
            _ => None,
        }
    }

    /// The instance of the global holding the zone's stream, when it is
    /// another one.
    pub fn elsewhere(&self) -> Option<&str> {
        self.elsewhere.as_deref()
    }

    /// The link a stream of this instance holds, for the other instances.
    pub fn own_link(&self) -> Option<OwnLink> {
        let h = self.holder.as_ref()?;
        Some(OwnLink {
            stream: h.stream,
            epoch: h.epoch,
            zone_instance: h.instance.clone(),
            held: self.held,
            snapshot: self.snapshot,
            liveness: self.liveness.clone(),
        })
    }

    /// What another instance of the global wrote of the link. Ignored
    /// while a stream here holds it (its own news are newer); false then.
    pub fn observe_link(&mut self, link: ObservedLink) -> bool {
        if self.holder.is_some() {
            return false;
        }
        self.held = link.held;
        self.snapshot = link.snapshot;
        self.epoch = Some((link.epoch, link.zone_instance));
        self.liveness = LivenessInputs {
            disabled: None,
            ..link.liveness
        };
        self.elsewhere = link.holder;
        true
    }

    /// A dataplane another instance of the global wrote (`None`: deleted);
    /// ignored while a stream here holds the zone.
    pub fn observe_dataplane(
        &mut self,
        id: DataplaneId,
        dataplane: Option<pb::Dataplane>,
    ) -> Option<Applied> {
        if self.holder.is_some() {
            return None;
        }
        match dataplane {
            Some(dp) if self.get(&id) != Some(&dp) => {
                self.put(id.clone(), dp);
                Some(Applied::Changed(id))
            }
            Some(_) => None,
            None => self.take(&id).then_some(Applied::Deleted(id)),
        }
    }

    /// Every dataplane of the zone as the shared store has it (a full
    /// read): what is not in `all` is deleted. Ignored while a stream here
    /// holds the zone.
    pub fn observe_all(&mut self, all: Vec<(DataplaneId, pb::Dataplane)>) -> Vec<Applied> {
        if self.holder.is_some() {
            return Vec::new();
        }
        let keep: std::collections::BTreeSet<DataplaneId> =
            all.iter().map(|(id, _)| id.clone()).collect();
        let gone: Vec<DataplaneId> = self
            .dataplanes
            .keys()
            .filter(|id| !keep.contains(*id))
            .cloned()
            .collect();
        let mut applied: Vec<Applied> = gone
            .into_iter()
            .filter_map(|id| self.take(&id).then_some(Applied::Deleted(id)))
            .collect();
        for (id, dp) in all {
            applied.extend(self.observe_dataplane(id, Some(dp)));
        }
        applied
    }

    /// One dataplane of the zone.
    pub fn get(&self, id: &DataplaneId) -> Option<&pb::Dataplane> {
        self.dataplanes.get(id).map(Arc::as_ref)
    }

    /// Every dataplane of the zone, sorted by mesh, then name.
    pub fn dataplanes(&self) -> impl Iterator<Item = (&DataplaneId, &pb::Dataplane)> {
        self.dataplanes.iter().map(|(id, dp)| (id, dp.as_ref()))
    }

    /// The zone's dataplanes, shared (no copy).
    pub fn shared(&self) -> Dataplanes {
        self.dataplanes.clone()
    }

    /// Inbounds that report ready, and in all.
    pub fn inbounds(&self) -> (usize, usize) {
        self.inbounds
    }

    fn put(&mut self, id: DataplaneId, dataplane: pb::Dataplane) {
        let (ready, total) = inbound_counts(&dataplane);
        self.inbounds.0 += ready;
        self.inbounds.1 += total;
        if let Some(old) = self.dataplanes.insert(id, Arc::new(dataplane)) {
            self.uncount(&old);
        }
    }

    fn take(&mut self, id: &DataplaneId) -> bool {
        match self.dataplanes.remove(id) {
            Some(old) => {
                self.uncount(&old);
                true
            }
            None => false,
        }
    }

    fn uncount(&mut self, dataplane: &pb::Dataplane) {
        let (ready, total) = inbound_counts(dataplane);
        self.inbounds.0 = self.inbounds.0.saturating_sub(ready);
        self.inbounds.1 = self.inbounds.1.saturating_sub(total);
    }

    /// How many dataplanes the global holds of the zone.
    pub fn len(&self) -> usize {
        self.dataplanes.len()
    }

    /// True when the global holds no dataplane of the zone.
    pub fn is_empty(&self) -> bool {
        self.dataplanes.is_empty()
    }

    /// The liveness inputs recorded from the holder's actions.
    pub fn liveness_inputs(&self) -> &LivenessInputs {
        &self.liveness
    }

    /// The zone's state at `now`; `disabled`: when an operator disabled it.
    pub fn liveness(&self, now: Timestamp, disabled: Option<Timestamp>) -> Liveness {
        let inputs = LivenessInputs {
            disabled,
            ..self.liveness.clone()
        };
        liveness::state(&inputs, now, self.zone_timeout)
    }

    /// `stream` (whose Hello named `epoch` and `instance`, and whose
    /// credential allows `allowed`) asks for the uplink at `now`.
    pub fn claim(
        &mut self,
        stream: StreamId,
        epoch: u64,
        instance: &str,
        allowed: &Meshes,
        now: Timestamp,
    ) -> Claim {
        self.claim_from(stream, epoch, instance, None, allowed, now)
    }

    /// [`RemoteZone::claim`] by a stream from `peer`: a source is its
    /// instance and its address.
    pub fn claim_from(
        &mut self,
        stream: StreamId,
        epoch: u64,
        instance: &str,
        peer: Option<IpAddr>,
        allowed: &Meshes,
        now: Timestamp,
    ) -> Claim {
        let online = self.liveness(now, None).state == ZoneState::Online;
        let contested = (self.holder.as_ref())
            .filter(|h| online && h.stream != stream)
            .filter(|h| {
                h.instance != instance || (h.peer.is_some() && peer.is_some() && h.peer != peer)
            })
            .map(|h| source(&h.instance, h.peer));
        if let Some(holder) = contested {
            self.contests
                .retain(|t| super::elapsed(*t, now).is_some_and(|e| e < STORM_WINDOW));
            if self.contests.len() == STORM_CONTESTS {
                self.contests.pop_front();
            }
            self.contests.push_back(now);
            if self.contests.len() >= STORM_CONTESTS {
                return Claim::Contested {
                    holder,
                    claimant: source(instance, peer),
                    contests: self.contests.len(),
                };
            }
        }
        if let Some((held, by)) = &self.epoch {
            if epoch < *held && (online || self.holder.is_some()) {
                return Claim::Lost {
                    epoch: *held,
                    instance: by.clone(),
                };
            }
        }
        let replaced = self
            .holder
            .take()
            .filter(|h| h.stream != stream)
            .map(|h| h.stream);
        if replaced.is_some() {
            self.abandon_snapshot();
        }
        self.holder = Some(Holder {
            stream,
            epoch,
            instance: instance.to_string(),
            peer,
        });
        self.elsewhere = None;
        self.epoch = Some((epoch, instance.to_string()));
        let gone: Vec<DataplaneId> = self
            .dataplanes
            .keys()
            .filter(|id| !allowed.allows(&id.mesh))
            .cloned()
            .collect();
        let pruned = gone
            .into_iter()
            .map(|id| {
                self.take(&id);
                Applied::Deleted(id)
            })
            .collect();
        Claim::Won {
            resume_from: self.resume_from(),
            replaced,
            pruned,
        }
    }

    /// Applies one action of `stream`'s session; returns the dataplanes the
    /// global's readers must look at again. Nothing changes for a stream
    /// that does not hold the uplink.
    pub fn apply(&mut self, stream: StreamId, action: &Action) -> Vec<Applied> {
        if self.holder() != Some(stream) {
            return Vec::new();
        }
        match action {
            Action::Connected(at) => self.liveness.opened(*at, self.zone_timeout),
            Action::Heartbeat(at) => self.liveness.heartbeat(*at, self.zone_timeout),
            Action::Upsert {
                id,
                dataplane,
                revision,
            } => {
                self.advance(*revision);
                let mut dataplane = pb::Dataplane::clone(dataplane);
                dataplane.revision = *revision;
                if self.get(id) != Some(&dataplane) {
                    self.put(id.clone(), dataplane);
                    return vec![Applied::Changed(id.clone())];
                }
            }
            Action::Delete { id, revision } => {
                self.advance(*revision);
                if self.take(id) {
                    return vec![Applied::Deleted(id.clone())];
                }
            }
            Action::SnapshotBegun => {
                self.snapshot = true;
                self.held = None;
            }
            Action::SnapshotComplete { keep, revision } => {
                self.snapshot = false;
                self.held = Some(*revision);
                let gone: Vec<DataplaneId> = self
                    .dataplanes
                    .keys()
                    .filter(|id| !keep.contains(*id))
                    .cloned()
                    .collect();
                return gone
                    .into_iter()
                    .map(|id| {
                        self.take(&id);
                        Applied::Deleted(id)
                    })
                    .collect();
            }
            Action::Synced { revision } => self.advance(*revision),
            Action::End { .. } => {
                self.holder = None;
                self.abandon_snapshot();
            }
            Action::Send(_) | Action::Register | Action::Claim { .. } => {}
        }
        Vec::new()
    }

    /// A live change moves the revision held (never during a snapshot, and
    /// never from nothing: only a snapshot makes the state complete).
    fn advance(&mut self, revision: u64) {
        if !self.snapshot {
            self.held = self.held.map(|h| h.max(revision));
        }
    }

    /// An unfinished snapshot leaves no complete state behind.
    fn abandon_snapshot(&mut self) {
        if self.snapshot {
            self.snapshot = false;
            self.held = None;
        }
    }
}

/// A dataplane's inbounds that report ready, and in all.
fn inbound_counts(dataplane: &pb::Dataplane) -> (usize, usize) {
    let ready = dataplane
        .inbounds
        .iter()
        .filter(|i| i.health.as_ref().is_some_and(|h| h.ready))
        .count();
    (ready, dataplane.inbounds.len())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use crate::zones::session::{Event, Registration, Session, SessionSettings, ZoneCredential};
    use crate::zones::uplink::{self, Uplink, UplinkSettings};
    use crate::zones::{plus, Code};

    const TIMEOUT: Duration = Duration::from_secs(15);

    fn t0() -> Timestamp {
        "2025-01-01T00:00:00Z".parse().unwrap()
    }

    fn at(secs: u64) -> Timestamp {
        plus(t0(), Duration::from_secs(secs))
    }

    fn id(name: &str) -> DataplaneId {
        DataplaneId::new("default", name)
    }

    fn dp(name: &str, revision: u64) -> pb::Dataplane {
        pb::Dataplane {
            mesh: "default".into(),
            name: name.into(),
            revision,
            ..Default::default()
        }
    }

    fn upsert(name: &str, revision: u64) -> Action {
        Action::Upsert {
            id: id(name),
            dataplane: Box::new(dp(name, revision)),
            revision,
        }
    }

    fn won(claim: Claim) -> (Option<u64>, Option<StreamId>, Vec<Applied>) {
        match claim {
            Claim::Won {
                resume_from,
                replaced,
                pruned,
            } => (resume_from, replaced, pruned),
            Claim::Lost { .. } | Claim::Contested { .. } => panic!("lost: {claim:?}"),
        }
    }

    /// A zone held complete at 10 with web and db, by stream 1.
    fn held() -> RemoteZone {
        let mut z = RemoteZone::new("eu-1", TIMEOUT);
        won(z.claim(1, 1, "zone-a", &Meshes::All, t0()));
        for a in [
            Action::Connected(t0()),
            Action::SnapshotBegun,
            upsert("web", 5),
            upsert("db", 6),
            Action::SnapshotComplete {
                keep: [id("web"), id("db")].into(),
                revision: 10,
            },
        ] {
            z.apply(1, &a);
        }
        z
    }

    fn end() -> Action {
        Action::End {
            code: Code::StreamClosed,
            reason: "closed".into(),
        }
    }

    #[test]
    fn a_reconnects_snapshot_deletes_only_missing_dataplanes_and_only_once_complete() {
        let mut z = held();
        z.apply(1, &end());
        assert_eq!(
            z.resume_from(),
            Some(10),
            "a complete state survives its stream"
        );
        // A new stream, with a snapshot (e.g. the zone could not resume).
        won(z.claim(2, 1, "zone-a", &Meshes::All, at(1)));
        assert!(z.apply(2, &Action::SnapshotBegun).is_empty());
        assert_eq!(z.resume_from(), None);
        assert_eq!(
            z.apply(2, &upsert("web", 12)),
            [Applied::Changed(id("web"))]
        );
        // db is not sent again yet: still there, no deletion.
        assert!(z.get(&id("db")).is_some());
        assert_eq!(
            z.apply(2, &upsert("api", 13)),
            [Applied::Changed(id("api"))]
        );
        let deleted = z.apply(
            2,
            &Action::SnapshotComplete {
                keep: [id("web"), id("api")].into(),
                revision: 14,
            },
        );
        assert_eq!(deleted, [Applied::Deleted(id("db"))]);
        let names: Vec<&str> = z.dataplanes().map(|(id, _)| id.name.as_str()).collect();
        assert_eq!(names, ["api", "web"]);
        assert_eq!(z.resume_from(), Some(14));
    }

    #[test]
    fn an_abandoned_snapshot_deletes_nothing_and_asks_for_a_new_one() {
        let mut z = held();
        z.apply(1, &Action::SnapshotBegun);
        z.apply(1, &upsert("web", 12));
        assert!(z.apply(1, &end()).is_empty());
        assert_eq!(z.len(), 2, "nothing deleted");
        assert!(!z.snapshot_in_progress());
        assert_eq!(
            z.resume_from(),
            None,
            "no complete state: the next stream sends a snapshot"
        );
        let (resume_from, _, _) = won(z.claim(2, 1, "zone-a", &Meshes::All, at(1)));
        assert_eq!(resume_from, None);
    }

    #[test]
    fn live_changes_move_the_revision_and_report_only_real_changes() {
        let mut z = held();
        assert!(
            z.apply(1, &upsert("web", 5)).is_empty(),
            "the same state again changes nothing"
        );
        assert_eq!(
            z.apply(1, &upsert("web", 11)),
            [Applied::Changed(id("web"))]
        );
        assert_eq!(
            z.apply(
                1,
                &Action::Delete {
                    id: id("db"),
                    revision: 12
                }
            ),
            [Applied::Deleted(id("db"))]
        );
        assert!(z
            .apply(
                1,
                &Action::Delete {
                    id: id("nope"),
                    revision: 13
                }
            )
            .is_empty());
        assert_eq!(z.resume_from(), Some(13));
        z.apply(1, &Action::Synced { revision: 20 });
        assert_eq!(z.resume_from(), Some(20));
        z.apply(1, &upsert("web", 15));
        assert_eq!(z.resume_from(), Some(20), "never moves back");
        assert_eq!(z.get(&id("web")).map(|d| d.revision), Some(15));
    }

    #[test]
    fn changes_before_any_snapshot_never_make_the_state_complete() {
        let mut z = RemoteZone::new("eu-1", TIMEOUT);
        won(z.claim(1, 1, "zone-a", &Meshes::All, t0()));
        z.apply(1, &upsert("web", 5));
        z.apply(1, &Action::Synced { revision: 9 });
        assert_eq!(z.resume_from(), None);
    }

    #[test]
    fn the_highest_epoch_holds_the_uplink_and_late_actions_of_others_are_dropped() {
        let mut z = held();
        // Epoch 2 from another instance takes over stream 1 (epoch 1).
        let (resume_from, replaced, _) = won(z.claim(2, 2, "zone-b", &Meshes::All, at(1)));
        assert_eq!((resume_from, replaced), (Some(10), Some(1)));
        assert_eq!(z.holder(), Some(2));
        // Stream 1's late actions change nothing, its End does not release stream 2.
        assert!(z.apply(1, &upsert("web", 99)).is_empty());
        z.apply(1, &end());
        assert_eq!(z.holder(), Some(2));
        // Epoch 1 again, while the zone is online: refused, naming the holder.
        assert_eq!(
            z.claim(3, 1, "zone-a", &Meshes::All, at(2)),
            Claim::Lost {
                epoch: 2,
                instance: "zone-b".into()
            }
        );
        // The same epoch takes over (the holder reconnecting).
        let (_, replaced, _) = won(z.claim(4, 2, "zone-b", &Meshes::All, at(3)));
        assert_eq!(replaced, Some(2));
    }

    #[test]
    fn a_takeover_during_a_snapshot_abandons_it() {
        let mut z = held();
        z.apply(1, &Action::SnapshotBegun);
        let (resume_from, _, _) = won(z.claim(2, 2, "zone-b", &Meshes::All, at(1)));
        assert_eq!(resume_from, None);
        assert!(!z.snapshot_in_progress());
    }

    /// Issue 56, item 6: two holders of one credential dialing in turn.
    /// A takeover now and then is a failover; the third contest of an
    /// online holder by another source within the window is a storm: the
    /// holder keeps the uplink and the claim names both sources, until no
    /// contest came for the window. The holder reconnecting is no contest.
    #[test]
    fn a_supersede_storm_keeps_the_online_holder_and_names_both_sources() {
        let a: Option<IpAddr> = Some("10.0.0.1".parse().unwrap());
        let b: Option<IpAddr> = Some("10.0.0.2".parse().unwrap());
        let mut z = RemoteZone::new("eu-1", TIMEOUT);
        let claim = |z: &mut RemoteZone, stream, epoch, instance, peer, t| {
            let claim = z.claim_from(stream, epoch, instance, peer, &Meshes::All, at(t));
            if matches!(claim, Claim::Won { .. }) {
                z.apply(stream, &Action::Connected(at(t)));
            }
            claim
        };
        won(claim(&mut z, 1, 1, "zone-a", a, 0));
        // Contests 1 and 2: takeovers, each by the higher epoch.
        let (_, replaced, _) = won(claim(&mut z, 2, 2, "zone-b", b, 10));
        assert_eq!(replaced, Some(1));
        let (_, replaced, _) = won(claim(&mut z, 3, 3, "zone-a", a, 20));
        assert_eq!(replaced, Some(2));
        // Contest 3 within the window: a storm; the online holder keeps it.
        let storm = Claim::Contested {
            holder: "instance \"zone-a\" at 10.0.0.1".into(),
            claimant: "instance \"zone-b\" at 10.0.0.2".into(),
            contests: 3,
        };
        assert_eq!(claim(&mut z, 4, 4, "zone-b", b, 30), storm);
        assert_eq!(z.holder(), Some(3));
        z.apply(3, &Action::Heartbeat(at(40)));
        assert_eq!(claim(&mut z, 5, 5, "zone-b", b, 45), storm);
        // The holder itself reconnecting (same instance, same address) is
        // no contest.
        let (_, replaced, _) = won(claim(&mut z, 6, 6, "zone-a", a, 50));
        assert_eq!(replaced, Some(3));
        // Once the holder is offline, the other source may claim.
        z.apply(6, &end());
        won(claim(&mut z, 7, 7, "zone-b", b, 50 + 16));
        // No contest for the window: a storm no more, a takeover again.
        let later = 66 + STORM_WINDOW.as_secs();
        z.apply(7, &Action::Heartbeat(at(later)));
        let (_, replaced, _) = won(claim(&mut z, 8, 8, "zone-a", a, later));
        assert_eq!(replaced, Some(7));
    }

    #[test]
    fn once_offline_any_epoch_may_claim() {
        let mut z = held();
        won(z.claim(2, 5, "zone-b", &Meshes::All, at(1)));
        z.apply(2, &Action::Connected(at(1)));
        z.apply(2, &end());
        // Offline (no holder, silent for longer than the timeout): a lease store reset is no lock-out.
        let (_, replaced, _) = won(z.claim(3, 1, "zone-a", &Meshes::All, at(100)));
        assert_eq!(replaced, None);
    }

    #[test]
    fn a_claim_drops_the_dataplanes_of_meshes_no_longer_allowed() {
        let mut z = held();
        z.apply(
            1,
            &Action::Upsert {
                id: DataplaneId::new("payments", "api"),
                dataplane: Box::new(pb::Dataplane {
                    mesh: "payments".into(),
                    name: "api".into(),
                    ..Default::default()
                }),
                revision: 11,
            },
        );
        let only_default = Meshes::Only(BTreeSet::from(["default".to_string()]));
        let (_, _, pruned) = won(z.claim(2, 1, "zone-a", &only_default, at(1)));
        assert_eq!(
            pruned,
            [Applied::Deleted(DataplaneId::new("payments", "api"))]
        );
        assert_eq!(z.len(), 2);
    }

    #[test]
    fn liveness_follows_the_holders_signs_of_life() {
        let mut z = RemoteZone::new("eu-1", TIMEOUT);
        assert_eq!(z.liveness(t0(), None).state, ZoneState::NeverConnected);
        won(z.claim(1, 1, "zone-a", &Meshes::All, t0()));
        z.apply(1, &Action::Connected(at(1)));
        z.apply(1, &Action::Heartbeat(at(10)));
        let l = z.liveness(at(20), None);
        assert_eq!(
            (l.state, l.since, l.last_seen),
            (ZoneState::Online, Some(at(1)), Some(at(10)))
        );
        assert_eq!(z.liveness(at(26), None).state, ZoneState::Offline);
        assert_eq!(z.liveness(at(20), Some(at(15))).state, ZoneState::Disabled);
        // Signs of life of a stream that does not hold the uplink do not count.
        z.apply(9, &Action::Heartbeat(at(30)));
        assert_eq!(z.liveness_inputs().last_heartbeat, Some(at(10)));
    }

    /// The zone's machine, the global's machine and the remote zone wired
    /// together without a network: what one sends, the other receives.
    struct Wire {
        uplink: Uplink,
        session: Session,
        zone: RemoteZone,
        stream: StreamId,
        now: Timestamp,
        /// What the zone asked the feed for.
        subscriptions: Vec<Option<u64>>,
        applied: Vec<Applied>,
        closed: Option<(String, bool)>,
    }

    impl Wire {
        fn new(zone: RemoteZone, stream: StreamId, capabilities: Option<Vec<String>>) -> Wire {
            let mut settings = UplinkSettings::new("eu-1", "zone-a");
            if let Some(c) = capabilities {
                settings.capabilities = c;
            }
            let credential = ZoneCredential {
                zone: "eu-1".into(),
                meshes: Meshes::All,
                issued_at: None,
            };
            let global = Arc::new(SessionSettings::new(Duration::from_secs(5), TIMEOUT));
            Wire {
                uplink: Uplink::new(settings, 1),
                session: Session::new(global, credential, Registration::Registered, t0()),
                zone,
                stream,
                now: t0(),
                subscriptions: Vec::new(),
                applied: Vec::new(),
                closed: None,
            }
        }

        /// Delivers `event` to the zone and carries everything through.
        fn zone_event(&mut self, event: uplink::Event) {
            let mut actions = Vec::new();
            self.uplink.handle(event, self.now, &mut actions);
            let mut batch = Vec::new();
            for a in actions {
                match a {
                    uplink::Action::Send(m) => batch.push(m),
                    uplink::Action::Subscribe { since } => self.subscriptions.push(since),
                    uplink::Action::Close { code, retry, .. } => self.closed = Some((code, retry)),
                    uplink::Action::Connected
                    | uplink::Action::Problem { .. }
                    | uplink::Action::Acknowledged { .. } => {}
                }
            }
            if !batch.is_empty() {
                self.global_event(Event::Received(batch));
            }
        }

        fn global_event(&mut self, event: Event) {
            let mut actions = Vec::new();
            self.session.handle(event, self.now, &mut actions);
            for a in actions {
                match &a {
                    Action::Claim { epoch, instance } => {
                        let (resume_from, _, _) = won(self.zone.claim(
                            self.stream,
                            *epoch,
                            instance,
                            &Meshes::All,
                            self.now,
                        ));
                        self.global_event(Event::Claimed { resume_from });
                    }
                    Action::Send(m) => self.zone_event(uplink::Event::Received(m.clone())),
                    other => self.applied.extend(self.zone.apply(self.stream, other)),
                }
            }
        }
    }

    #[test]
    fn zone_and_global_sync_a_snapshot_then_resume_without_one() {
        let mut w = Wire::new(RemoteZone::new("eu-1", TIMEOUT), 1, None);
        w.zone_event(uplink::Event::Opened);
        assert_eq!(w.subscriptions, [None]);
        w.zone_event(uplink::Event::FeedSnapshot {
            revision: 10,
            items: vec![dp("web", 4), dp("db", 9)],
        });
        assert_eq!(w.zone.resume_from(), Some(10));
        assert_eq!(w.uplink.acked(), 10);
        w.zone_event(uplink::Event::FeedDeleted {
            mesh: "default".into(),
            name: "db".into(),
            revision: 11,
        });
        w.now = at(5);
        w.zone_event(uplink::Event::Tick);
        assert_eq!(w.uplink.acked(), 11, "the heartbeat's Ack");
        assert_eq!(w.zone.liveness(at(5), None).state, ZoneState::Online);
        w.zone_event(uplink::Event::Closed { error: None });
        w.global_event(Event::Closed { error: None });
        assert_eq!(w.closed, Some(("stream_closed".to_string(), true)));

        // The next stream resumes from 11: no snapshot, nothing deleted.
        let zone = w.zone.clone();
        let mut w = Wire::new(zone, 2, None);
        w.now = at(6);
        w.zone_event(uplink::Event::Opened);
        assert_eq!(w.subscriptions, [Some(11)]);
        w.zone_event(uplink::Event::FeedChange(dp("api", 12)));
        w.zone_event(uplink::Event::FeedSynced { revision: 12 });
        assert_eq!(w.applied, [Applied::Changed(id("api"))]);
        let names: Vec<&str> = w
            .zone
            .dataplanes()
            .map(|(id, _)| id.name.as_str())
            .collect();
        assert_eq!(names, ["api", "web"]);
    }

    #[test]
    fn a_zone_that_cannot_resume_sends_a_snapshot_and_the_global_deletes_what_it_lacks() {
        let mut w = Wire::new(held(), 2, Some(vec![]));
        w.zone_event(uplink::Event::Opened);
        assert_eq!(w.subscriptions, [None]);
        w.zone_event(uplink::Event::FeedSnapshot {
            revision: 20,
            items: vec![dp("web", 5)],
        });
        assert_eq!(w.applied, [Applied::Deleted(id("db"))]);
    }

    #[test]
    fn an_unregistered_zone_closes_for_good_and_the_global_holds_nothing() {
        let mut w = Wire::new(RemoteZone::new("eu-1", TIMEOUT), 1, None);
        w.session = Session::new(
            Arc::new(SessionSettings::new(Duration::from_secs(5), TIMEOUT)),
            ZoneCredential {
                zone: "eu-1".into(),
                meshes: Meshes::All,
                issued_at: None,
            },
            Registration::Unknown,
            t0(),
        );
        w.zone_event(uplink::Event::Opened);
        assert_eq!(w.closed, Some(("zone_unregistered".to_string(), false)));
        assert_eq!(w.zone.holder(), None);
        assert_eq!(w.zone.liveness(t0(), None).state, ZoneState::NeverConnected);
    }

    #[test]
    fn a_chunked_snapshot_arrives_whole() {
        let mut w = Wire::new(RemoteZone::new("eu-1", TIMEOUT), 1, None);
        w.zone_event(uplink::Event::Opened);
        let items: Vec<pb::Dataplane> = (0..1234).map(|i| dp(&format!("web-{i}"), i)).collect();
        w.zone_event(uplink::Event::FeedSnapshot {
            revision: 2000,
            items,
        });
        assert_eq!(w.zone.len(), 1234);
        assert_eq!(w.zone.resume_from(), Some(2000));
    }
}
