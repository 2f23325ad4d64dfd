//! Holding a named lease of the cluster over time: one live instance holds
//! it, with an epoch that grows with every new holder (a zone of several
//! instances holds its uplink to the global this way, [`UPLINK`]).
//!
//! [`Keeper`] is the rule, as a machine over plain times: when to ask the
//! store ([`Cluster::acquire_lease`]), what an answer means, and when a
//! holder that cannot confirm its lease must take itself for a holder no
//! more. [`keep`] runs it as a task against a cluster and publishes the
//! [`LeaseStatus`] on a watch channel; [`LeaseHandle::release`] gives the
//! lease up at a graceful shutdown, so another instance takes it at once.
//!
//! The timing, with `timeout` = `cluster.instance_timeout`:
//!
//! - a holder confirms its lease every `timeout / 4` (each confirmation is
//!   a heartbeat too) and, when the store stops answering, takes itself for
//!   a holder no more `timeout` after the last confirmation it sent: by
//!   then another instance may have taken the lease;
//! - an instance waiting for the lease asks every `timeout / 4`, and also
//!   at the moment the holder turns dead if it stays silent (its silence
//!   is in each answer), and at once when a lease changes holder (the
//!   store announces it): a dead holder is replaced within `timeout` of
//!   its last heartbeat plus one round trip to the store, a holder that
//!   leaves cleanly at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::{Cluster, Lease, Topic};

/// The lease of a zone's uplink to the global.
pub const UPLINK: &str = "uplink";

/// Added to the moment a silent holder turns dead before asking: the
/// store's clock and this instance's timers tick a little apart.
pub const MARGIN: Duration = Duration::from_millis(50);

/// How soon an instance that has no live heartbeat yet asks again (it
/// registers with its first heartbeat, at start).
pub const NOT_A_MEMBER_RETRY: Duration = Duration::from_millis(200);

/// Who holds the lease, as this instance knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStatus {
    /// Not known yet: the store has not answered.
    Unknown,
    /// This instance holds it with this epoch, until `until` unless
    /// confirmed again: past it, another instance may hold the lease, so a
    /// reader takes it for not held even before the keeper says so (a
    /// process frozen past its lease wakes with this status and must not
    /// dial before its keeper has asked the store again).
    Held {
        /// The epoch: higher for every new holder.
        epoch: u64,
        /// The end of the lease as last confirmed (the confirming call's
        /// send time + `cluster.instance_timeout`); `None`: never ends.
        until: Option<Instant>,
    },
    /// Another live instance holds it.
    Elsewhere {
        /// That instance (`<host>/<pid>`).
        holder: String,
        /// Its epoch.
        epoch: u64,
    },
    /// This instance does not hold it and cannot tell who does.
    Unconfirmed {
        /// Why, and what to check.
        problem: String,
    },
}

impl LeaseStatus {
    /// The epoch, while this instance holds the lease at `now`.
    pub fn held_at(&self, now: Instant) -> Option<u64> {
        match self {
            LeaseStatus::Held { epoch, until } if until.is_none_or(|until| now < until) => {
                Some(*epoch)
            }
            _ => None,
        }
    }

    /// The epoch, while this instance holds the lease now.
    pub fn held(&self) -> Option<u64> {
        self.held_at(Instant::now())
    }

    /// When a held lease ends unless confirmed again.
    pub fn until(&self) -> Option<Instant> {
        match self {
            LeaseStatus::Held { until, .. } => *until,
            _ => None,
        }
    }
}

/// The lease rule over time for one instance: events in (an answer, a
/// poke, time passing), the status and the next deadline out.
#[derive(Debug, Clone)]
pub struct Keeper {
    name: String,
    instance: String,
    timeout: Duration,
    interval: Duration,
    status: LeaseStatus,
    /// While held: until when this instance may take itself for the holder
    /// (the last confirming call's send time + `timeout`).
    held_until: Option<Instant>,
    /// When to ask next.
    next: Instant,
    /// When the call in flight was sent.
    asked: Option<Instant>,
    /// When the keeper started: an instance that has not registered yet
    /// is only starting for the first `timeout`.
    started: Instant,
}

impl Keeper {
    /// The keeper of lease `name` for `instance`, whose holder is dead once
    /// silent for `timeout`; it asks at once.
    pub fn new(
        name: impl Into<String>,
        instance: impl Into<String>,
        timeout: Duration,
        now: Instant,
    ) -> Keeper {
        Keeper {
            name: name.into(),
            instance: instance.into(),
            timeout,
            interval: timeout / 4,
            status: LeaseStatus::Unknown,
            held_until: None,
            next: now,
            asked: None,
            started: now,
        }
    }

    /// Who holds the lease.
    pub fn status(&self) -> &LeaseStatus {
        &self.status
    }

    /// How often the lease is confirmed or asked for: a quarter of the timeout.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Whether to ask the store now.
    pub fn due(&self, now: Instant) -> bool {
        self.asked.is_none() && now >= self.next
    }

    /// When to ask next, or to give a lease that was not confirmed up,
    /// whichever comes first.
    pub fn deadline(&self) -> Instant {
        match self.held_until {
            Some(until) => self.next.min(until),
            None => self.next,
        }
    }

    /// The driver asks the store now.
    pub fn asking(&mut self, now: Instant) {
        self.asked = Some(now);
    }

    /// A lease changed holder somewhere: ask at once.
    pub fn poked(&mut self, now: Instant) {
        self.next = self.next.min(now);
    }

    /// The store's answer (or why there is none) to the call sent at
    /// [`Keeper::asking`].
    pub fn answered(&mut self, answer: Result<Lease, String>, now: Instant) {
        let sent = self.asked.take().unwrap_or(now);
        self.next = now + self.interval;
        match answer {
            Ok(lease) if lease.held_by(&self.instance) => {
                self.held_until = Some(sent + self.timeout);
                self.status = LeaseStatus::Held {
                    epoch: lease.epoch,
                    until: self.held_until,
                };
            }
            Ok(Lease {
                holder: Some(holder),
                epoch,
                holder_silent,
            }) => {
                self.held_until = None;
                self.status = LeaseStatus::Elsewhere { holder, epoch };
                // Ask again when the holder turns dead if it stays silent.
                if let Some(silent) = holder_silent {
                    let dead_in = self.timeout.saturating_sub(silent) + MARGIN;
                    self.next = now + self.interval.min(dead_in);
                }
            }
            Ok(Lease { holder: None, .. }) => {
                self.held_until = None;
                self.next = now + self.interval.min(NOT_A_MEMBER_RETRY);
                if self.status == LeaseStatus::Unknown && now < self.started + self.timeout {
                    // Starting: its first heartbeat is on its way.
                    return;
                }
                self.status = LeaseStatus::Unconfirmed {
                    problem: format!(
                        "this instance cannot take the lease {:?} yet: it has no live heartbeat in the store (it registers with its first heartbeat, at start, and again after another instance took it for dead)",
                        self.name
                    ),
                };
            }
            Err(e) => {
                if self.held_until.is_some_and(|until| now < until) {
                    // Still ours for a while: ask again at the next beat.
                    return;
                }
                self.held_until = None;
                self.status = LeaseStatus::Unconfirmed {
                    problem: format!(
                        "cannot read the lease {:?} in the store: {e}; this instance waits until the store answers (check the store and store.postgres.url)",
                        self.name
                    ),
                };
            }
        }
    }

    /// Time passed: a lease not confirmed for `timeout` is held no more.
    pub fn tick(&mut self, now: Instant) {
        if self.held_until.is_some_and(|until| now >= until) {
            self.held_until = None;
            self.status = LeaseStatus::Unconfirmed {
                problem: format!(
                    "could not confirm the lease {:?} in the store for {} (cluster.instance_timeout): this instance gave it up, since another instance may hold it by now; it asks again until the store answers",
                    self.name,
                    humantime::format_duration(self.timeout)
                ),
            };
        }
    }
}

/// A lease kept by a task: its status, and the way to give it up.
#[derive(Debug)]
pub struct LeaseHandle {
    status: watch::Receiver<LeaseStatus>,
    release: Option<oneshot::Sender<oneshot::Sender<()>>>,
}

impl LeaseHandle {
    /// A handle whose lease is always held with `epoch` (no task).
    pub fn always(epoch: u64) -> LeaseHandle {
        LeaseHandle {
            status: watch::channel(LeaseStatus::Held { epoch, until: None }).1,
            release: None,
        }
    }

    /// Who holds the lease, as it changes.
    pub fn status(&self) -> watch::Receiver<LeaseStatus> {
        self.status.clone()
    }

    /// Stops keeping the lease and gives it up if held; completes once the
    /// store answered (or did not, within the keeper's call timeout).
    pub async fn release(mut self) {
        if let Some(release) = self.release.take() {
            let (done, released) = oneshot::channel();
            if release.send(done).is_ok() {
                let _ = released.await;
            }
        }
    }
}

/// Keeps the lease `name` for this instance of `cluster` (a holder is
/// dead once silent for `timeout`) until the handle is released or dropped
/// (either gives the lease up): the handle and the keeper's task, for the
/// caller to run (the server supervises it). The task ends once the lease
/// is given up.
pub fn keep(
    cluster: Arc<dyn Cluster>,
    name: &str,
    timeout: Duration,
) -> (
    LeaseHandle,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (tx, status) = watch::channel(LeaseStatus::Unknown);
    let (release, released) = oneshot::channel();
    let task = run(cluster, name.to_string(), timeout, tx, released);
    (
        LeaseHandle {
            status,
            release: Some(release),
        },
        task,
    )
}

async fn run(
    cluster: Arc<dyn Cluster>,
    name: String,
    timeout: Duration,
    status: watch::Sender<LeaseStatus>,
    mut release: oneshot::Receiver<oneshot::Sender<()>>,
) {
    let mut keeper = Keeper::new(&name, cluster.instance(), timeout, Instant::now());
    // A call answers within half the timeout, as a heartbeat does, or
    // counts as unanswered.
    let call_timeout = timeout / 2;
    let mut signal = Some(cluster.signal(Topic::Leases));
    let done = loop {
        // Time first: a holder frozen past its lease gives it up before it
        // asks again (readers see the end in the status itself, too).
        keeper.tick(Instant::now());
        publish(&status, &keeper, &name);
        if keeper.due(Instant::now()) {
            keeper.asking(Instant::now());
            let call = tokio::time::timeout(call_timeout, cluster.acquire_lease(&name, timeout));
            let answer = tokio::select! {
                answer = call => match answer {
                    Ok(Ok(lease)) => Ok(lease),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!(
                        "no answer within {}",
                        humantime::format_duration(call_timeout)
                    )),
                },
                done = &mut release => break done.ok(),
            };
            keeper.answered(answer, Instant::now());
        }
        keeper.tick(Instant::now());
        publish(&status, &keeper, &name);
        tokio::select! {
            () = tokio::time::sleep_until(keeper.deadline()) => {}
            changed = poked(&mut signal) => match changed {
                true => keeper.poked(Instant::now()),
                false => signal = None,
            },
            done = &mut release => break done.ok(),
        }
    };
    if keeper.status().held().is_some() {
        match tokio::time::timeout(call_timeout, cluster.release_lease(&name)).await {
            Ok(Ok(_)) => tracing::info!(
                lease = name,
                "gave the lease up: another instance may take it at once"
            ),
            Ok(Err(e)) => tracing::warn!(
                lease = name,
                "cannot give the lease up ({e}); another instance takes it once this one has been silent for cluster.instance_timeout"
            ),
            Err(_) => tracing::warn!(
                lease = name,
                "the store did not answer the lease's release within {}; another instance takes it once this one has been silent for cluster.instance_timeout",
                humantime::format_duration(call_timeout)
            ),
        }
    }
    status.send_replace(LeaseStatus::Unknown);
    if let Some(done) = done {
        let _ = done.send(());
    }
}

fn publish(status: &watch::Sender<LeaseStatus>, keeper: &Keeper, name: &str) {
    status.send_if_modified(|s| {
        let changed = s != keeper.status();
        if changed {
            tracing::debug!(lease = name, status = ?keeper.status(), "lease");
            *s = keeper.status().clone();
        }
        changed
    });
}

/// Completes once the lease is no longer held with `epoch` at the time
/// (lost, held again with another epoch, or past its confirmed end), or
/// its keeper is gone.
pub async fn moved(leases: &mut watch::Receiver<LeaseStatus>, epoch: u64) {
    loop {
        let until = {
            let s = leases.borrow_and_update();
            if s.held() != Some(epoch) {
                return;
            }
            s.until()
        };
        let end = async {
            match until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = leases.changed() => if changed.is_err() { return },
            () = end => return,
        }
    }
}

/// True when `signal` was poked; false when its sender is gone (then the
/// keeper asks on its timer only). Pending forever without a signal.
async fn poked(signal: &mut Option<watch::Receiver<()>>) -> bool {
    match signal {
        Some(rx) => rx.changed().await.is_ok(),
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock as _, SystemClock};
    use crate::cluster::Solo;

    const T: Duration = Duration::from_secs(1);

    fn mine(epoch: u64) -> Result<Lease, String> {
        Ok(Lease {
            holder: Some("a/1".to_string()),
            epoch,
            holder_silent: Some(Duration::ZERO),
        })
    }

    fn theirs(epoch: u64, silent_ms: u64) -> Result<Lease, String> {
        Ok(Lease {
            holder: Some("b/2".to_string()),
            epoch,
            holder_silent: Some(Duration::from_millis(silent_ms)),
        })
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_confirms_every_quarter_and_gives_up_a_lease_it_cannot_confirm() {
        let start = Instant::now();
        let mut k = Keeper::new(UPLINK, "a/1", T, start);
        assert_eq!(k.status(), &LeaseStatus::Unknown);
        assert!(k.due(start), "the first ask is at once");
        k.asking(start);
        assert!(!k.due(start), "one call at a time");
        tokio::time::advance(ms(10)).await;
        k.answered(mine(7), Instant::now());
        assert_eq!(k.status().held(), Some(7));
        assert_eq!(
            k.deadline(),
            Instant::now() + ms(250),
            "a quarter of the timeout"
        );

        // The store stops answering: still held until the timeout from the
        // last confirmation's send (at `start`), then given up.
        tokio::time::advance(ms(250)).await;
        assert!(k.due(Instant::now()));
        k.asking(Instant::now());
        tokio::time::advance(ms(500)).await;
        k.answered(Err("no answer within 500ms".into()), Instant::now());
        assert_eq!(
            k.status().held(),
            Some(7),
            "760 ms after the last confirmation"
        );
        assert_eq!(k.deadline(), start + T, "the end of the lease comes first");
        tokio::time::advance(ms(239)).await;
        k.tick(Instant::now());
        assert_eq!(k.status().held(), Some(7), "999 ms");
        tokio::time::advance(ms(1)).await;
        k.tick(Instant::now());
        match k.status() {
            LeaseStatus::Unconfirmed { problem } => assert!(
                problem.contains("could not confirm the lease \"uplink\"")
                    && problem.contains("1s (cluster.instance_timeout)"),
                "{problem}"
            ),
            other => panic!("{other:?}"),
        }

        // The store answers again, and nobody took it: held again.
        k.asking(Instant::now());
        k.answered(mine(7), Instant::now());
        assert_eq!(k.status().held(), Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_holder_frozen_past_its_lease_reads_it_as_not_held_before_its_keeper_runs() {
        let start = Instant::now();
        let mut k = Keeper::new(UPLINK, "a/1", T, start);
        k.asking(start);
        k.answered(mine(9), start);
        let status = k.status().clone();
        assert_eq!(status.until(), Some(start + T));
        assert_eq!(status.held_at(start + ms(999)), Some(9));
        // The process was stopped for longer than the timeout: the status
        // it published before says by itself that the lease is over.
        assert_eq!(status.held_at(start + T), None);
        assert_eq!(
            LeaseHandle::always(3)
                .status()
                .borrow()
                .held_at(start + T * 1000),
            Some(3)
        );

        // A stream kept while holding ends at the lease's end even if the
        // keeper never publishes again (it is frozen, or its store is gone).
        let (tx, mut rx) = watch::channel(status);
        let moved = tokio::spawn(async move {
            moved(&mut rx, 9).await;
            Instant::now()
        });
        tokio::time::advance(ms(999)).await;
        tokio::task::yield_now().await;
        assert!(!moved.is_finished(), "still held at 999 ms");
        tokio::time::advance(ms(1)).await;
        assert_eq!(moved.await.unwrap(), start + T);
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_call_while_not_holding_says_why() {
        let mut k = Keeper::new(UPLINK, "a/1", T, Instant::now());
        k.asking(Instant::now());
        k.answered(Err("connection refused".into()), Instant::now());
        match k.status() {
            LeaseStatus::Unconfirmed { problem } => {
                assert!(problem.contains("connection refused"), "{problem}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(k.deadline(), Instant::now() + ms(250));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_instance_asks_when_the_silent_holder_turns_dead() {
        let mut k = Keeper::new(UPLINK, "a/1", T, Instant::now());
        k.asking(Instant::now());
        // The holder beat 100 ms ago: it is alive for 900 ms more at least,
        // and the next regular ask comes first.
        k.answered(theirs(3, 100), Instant::now());
        assert_eq!(
            k.status(),
            &LeaseStatus::Elsewhere {
                holder: "b/2".into(),
                epoch: 3
            }
        );
        assert_eq!(k.deadline(), Instant::now() + ms(250));
        // Silent for 900 ms: dead 100 ms from now; asked then (plus the margin).
        tokio::time::advance(ms(250)).await;
        k.asking(Instant::now());
        k.answered(theirs(3, 900), Instant::now());
        assert_eq!(k.deadline(), Instant::now() + ms(100) + MARGIN);
        tokio::time::advance(ms(150)).await;
        assert!(k.due(Instant::now()));
        k.asking(Instant::now());
        k.answered(mine(4), Instant::now());
        assert_eq!(k.status().held(), Some(4), "taken over with a higher epoch");
    }

    #[tokio::test(start_paused = true)]
    async fn a_poke_asks_at_once_and_losing_the_lease_ends_holding_it() {
        let mut k = Keeper::new(UPLINK, "a/1", T, Instant::now());
        k.asking(Instant::now());
        k.answered(mine(5), Instant::now());
        tokio::time::advance(ms(20)).await;
        assert!(!k.due(Instant::now()));
        k.poked(Instant::now());
        assert!(k.due(Instant::now()));
        // Another instance took it (this one was frozen past the timeout).
        k.asking(Instant::now());
        k.answered(theirs(6, 0), Instant::now());
        assert_eq!(k.status().held(), None);
        tokio::time::advance(T * 3).await;
        k.tick(Instant::now());
        assert!(
            matches!(k.status(), LeaseStatus::Elsewhere { epoch: 6, .. }),
            "no timeout to give up a lease not held: {:?}",
            k.status()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_instance_without_a_heartbeat_asks_again_soon() {
        let mut k = Keeper::new(UPLINK, "a/1", T * 40, Instant::now());
        let not_a_member = || {
            Ok(Lease {
                holder: None,
                epoch: 0,
                holder_silent: None,
            })
        };
        k.asking(Instant::now());
        k.answered(not_a_member(), Instant::now());
        assert_eq!(
            k.status(),
            &LeaseStatus::Unknown,
            "starting: not a problem yet"
        );
        assert_eq!(k.deadline(), Instant::now() + NOT_A_MEMBER_RETRY);
        // Still no heartbeat a whole timeout after the start: say so.
        tokio::time::advance(T * 40).await;
        k.asking(Instant::now());
        k.answered(not_a_member(), Instant::now());
        assert!(
            matches!(k.status(), LeaseStatus::Unconfirmed { problem } if problem.contains("no live heartbeat")),
            "{:?}",
            k.status()
        );
        assert_eq!(k.deadline(), Instant::now() + NOT_A_MEMBER_RETRY);
    }

    #[tokio::test(start_paused = true)]
    async fn alone_the_lease_is_held_at_once_and_given_up_on_release() {
        let solo = Arc::new(Solo::new("solo/1"));
        let (handle, task) = keep(solo.clone(), UPLINK, T);
        tokio::spawn(task);
        let mut status = handle.status();
        let held = status
            .wait_for(|s| s.held().is_some())
            .await
            .expect("held")
            .held()
            .unwrap();
        let now = u64::try_from(SystemClock.now().timestamp_micros()).unwrap();
        assert!(
            held <= now && now - held < 60_000_000,
            "the epoch is the time it was taken: {held}"
        );
        handle.release().await;
        assert!(
            !solo.release_lease(UPLINK).await.unwrap(),
            "released already"
        );
        let again = solo.acquire_lease(UPLINK, T).await.expect("acquire").epoch;
        assert!(
            again > held,
            "a new holding, a higher epoch: {again} > {held}"
        );
    }
}
