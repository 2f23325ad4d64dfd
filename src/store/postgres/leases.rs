//! Named leases (`hdsd_leases`): one live instance holds each, with an
//! epoch that only grows. A zone of several instances holds its uplink to
//! the global this way.
//!
//! - **Liveness is membership's**: the holder is alive while its heartbeat
//!   row (`hdsd_instances`) is younger than the timeout, on the database's
//!   clock; a holder's lease is renewed by its heartbeats (and by each
//!   [`PgStore::acquire_lease`] of its own, which beats too). A holder swept
//!   as dead, or gone without leaving, loses the lease to the first live
//!   instance that asks.
//! - **Epochs grow** across holders and restarts: a new holder's epoch is
//!   `greatest(epoch + 1, now in microseconds)`, taken in the transaction
//!   that locks the row. Starting from the time keeps epochs above those of
//!   instances that dialed with their start time.
//! - **Announced**: every change of holder is a `pg_notify` on
//!   [`LEASES_CHANNEL`] in the same transaction, so instances waiting for the
//!   lease try again at once (a clean shutdown hands over at once).

use std::time::Duration;

use super::schema::*;
use super::{pg_error, PgStore};
use crate::store::StoreError;

/// Who holds a lease after a call of [`PgStore::acquire_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The instance holding it (`<host>/<pid>`); `None` when nobody does
    /// (never taken, released, or this instance could not take it).
    pub holder: Option<String>,
    /// The holder's epoch (the last holder's when nobody holds it; 0 when
    /// it was never taken). Higher for every new holder.
    pub epoch: u64,
    /// How long the holder had been silent (its last heartbeat) when the
    /// store answered, on the store's clock: it is taken for dead once
    /// silent for longer than the timeout. Zero for this instance.
    pub holder_silent: Option<Duration>,
}

impl Lease {
    /// Whether `instance` holds it.
    pub fn held_by(&self, instance: &str) -> bool {
        self.holder.as_deref() == Some(instance)
    }
}

/// What one acquisition does to the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseDecision {
    /// This instance holds it: keep it (same epoch).
    Keep,
    /// Free, or its holder is dead: this instance takes it (a new epoch).
    Take,
    /// Another live instance holds it.
    Elsewhere,
    /// This instance is not a live member (no heartbeat row yet, or swept
    /// as dead) and takes nothing; if it held the lease, it gives it up.
    NotAMember {
        /// It held the lease: the holder is cleared.
        vacate: bool,
    },
}

/// The rule of a lease, from what the store says: `holder` the instance
/// holding it, if any; `silent(x)` how long instance `x` has been silent,
/// `None` when it has no heartbeat row. An instance silent for longer than
/// `timeout` is dead (exactly at the timeout it is still alive).
pub fn decide(
    holder: Option<&str>,
    me: &str,
    silent: impl Fn(&str) -> Option<Duration>,
    timeout: Duration,
) -> LeaseDecision {
    let alive = |instance: &str| silent(instance).is_some_and(|s| s <= timeout);
    if !alive(me) {
        return LeaseDecision::NotAMember {
            vacate: holder == Some(me),
        };
    }
    match holder {
        Some(h) if h == me => LeaseDecision::Keep,
        Some(h) if alive(h) => LeaseDecision::Elsewhere,
        _ => LeaseDecision::Take,
    }
}

impl PgStore {
    /// Takes the lease `name` for this instance when it is free or its
    /// holder has been silent for longer than `timeout`, keeps it when this
    /// instance holds it (and writes this instance's heartbeat: holding is
    /// being alive), and answers who holds it now. Takes nothing while this
    /// instance has no live heartbeat row ([`LeaseDecision::NotAMember`]).
    pub async fn acquire_lease(&self, name: &str, timeout: Duration) -> Result<Lease, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        tx.execute(
            "INSERT INTO hdsd_leases (name, holder, epoch) VALUES ($1, NULL, 0)
             ON CONFLICT (name) DO NOTHING",
            &[&name],
        )
        .await
        .map_err(pg_error)?;
        let row = tx
            .query_one(
                "SELECT holder, epoch FROM hdsd_leases WHERE name = $1 FOR UPDATE",
                &[&name],
            )
            .await
            .map_err(pg_error)?;
        let (holder, epoch): (Option<String>, i64) = (row.get(0), row.get(1));
        // Silences in milliseconds on the database's clock, of this
        // instance and of the holder.
        let names: Vec<&str> = [Some(self.instance.as_str()), holder.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        let silences: Vec<(String, Duration)> = tx
            .query(
                "SELECT instance, greatest(0, floor(extract(epoch FROM now() - heartbeat_at) * 1000))::bigint
                 FROM hdsd_instances WHERE instance = ANY($1)",
                &[&names],
            )
            .await
            .map_err(pg_error)?
            .iter()
            .map(|r| {
                let ms: i64 = r.get(1);
                (r.get(0), Duration::from_millis(ms.max(0) as u64))
            })
            .collect();
        let silent = |instance: &str| {
            silences
                .iter()
                .find(|(i, _)| i == instance)
                .map(|(_, s)| *s)
        };
        let decision = decide(holder.as_deref(), &self.instance, silent, timeout);
        let lease = match decision {
            LeaseDecision::Keep | LeaseDecision::Take => {
                let epoch: i64 = if decision == LeaseDecision::Take {
                    tx.query_one(
                        "UPDATE hdsd_leases
                         SET holder = $2, changed_at = now(),
                             epoch = greatest(epoch + 1, floor(extract(epoch FROM now()) * 1000000)::bigint)
                         WHERE name = $1 RETURNING epoch",
                        &[&name, &self.instance],
                    )
                    .await
                    .map_err(pg_error)?
                    .get(0)
                } else {
                    epoch
                };
                tx.execute(
                    "UPDATE hdsd_instances SET heartbeat_at = now() WHERE instance = $1",
                    &[&self.instance],
                )
                .await
                .map_err(pg_error)?;
                Lease {
                    holder: Some(self.instance.clone()),
                    epoch: epoch.max(0) as u64,
                    holder_silent: Some(Duration::ZERO),
                }
            }
            LeaseDecision::Elsewhere => Lease {
                holder_silent: holder.as_deref().and_then(silent),
                holder,
                epoch: epoch.max(0) as u64,
            },
            LeaseDecision::NotAMember { vacate } => {
                if vacate {
                    tx.execute(
                        "UPDATE hdsd_leases SET holder = NULL, changed_at = now() WHERE name = $1",
                        &[&name],
                    )
                    .await
                    .map_err(pg_error)?;
                }
                let holder = holder.filter(|_| !vacate);
                Lease {
                    holder_silent: holder.as_deref().and_then(silent),
                    holder,
                    epoch: epoch.max(0) as u64,
                }
            }
        };
        if matches!(
            decision,
            LeaseDecision::Take | LeaseDecision::NotAMember { vacate: true }
        ) {
            tx.execute("SELECT pg_notify($1, $2)", &[&LEASES_CHANNEL, &name])
                .await
                .map_err(pg_error)?;
        }
        tx.commit().await.map_err(pg_error)?;
        Ok(lease)
    }

    /// Gives the lease `name` up if this instance holds it (announced, so
    /// the instances waiting for it take it at once); false when it did not.
    pub async fn release_lease(&self, name: &str) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_error)?;
        let released = tx
            .execute(
                "UPDATE hdsd_leases SET holder = NULL, changed_at = now()
                 WHERE name = $1 AND holder = $2",
                &[&name, &self.instance],
            )
            .await
            .map_err(pg_error)?;
        if released > 0 {
            tx.execute("SELECT pg_notify($1, $2)", &[&LEASES_CHANNEL, &name])
                .await
                .map_err(pg_error)?;
        }
        tx.commit().await.map_err(pg_error)?;
        Ok(released > 0)
    }

    /// Poked when a lease changes holder, and on every reconnect.
    pub fn leases_signal(&self) -> tokio::sync::watch::Receiver<()> {
        self.leases_signal.subscribe()
    }
}

/// Releases every lease `instance` holds, in `tx` (a graceful leave),
/// announcing each.
pub(super) async fn release_all(
    tx: &deadpool_postgres::Transaction<'_>,
    instance: &str,
) -> Result<(), tokio_postgres::Error> {
    let released = tx
        .query(
            "UPDATE hdsd_leases SET holder = NULL, changed_at = now()
             WHERE holder = $1 RETURNING name",
            &[&instance],
        )
        .await?;
    let names: Vec<String> = released.iter().map(|r| r.get(0)).collect();
    tx.execute(
        "SELECT pg_notify($1, n) FROM unnest($2::text[]) AS n",
        &[&LEASES_CHANNEL, &names],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(10);

    /// How long each instance of `known` (name, milliseconds) is silent.
    fn silences<'a>(known: &'a [(&'a str, u64)]) -> impl Fn(&str) -> Option<Duration> + 'a {
        move |i: &str| {
            known
                .iter()
                .find(|(k, _)| *k == i)
                .map(|(_, ms)| Duration::from_millis(*ms))
        }
    }

    #[test]
    fn a_live_member_takes_a_free_lease_and_keeps_its_own() {
        let s = [("a/1", 100)];
        assert_eq!(decide(None, "a/1", silences(&s), T), LeaseDecision::Take);
        assert_eq!(
            decide(Some("a/1"), "a/1", silences(&s), T),
            LeaseDecision::Keep
        );
    }

    #[test]
    fn a_holder_is_dead_only_once_silent_for_longer_than_the_timeout() {
        // Exactly at the timeout the holder is alive.
        let s = [("a/1", 100), ("b/2", 10_000)];
        assert_eq!(
            decide(Some("b/2"), "a/1", silences(&s), T),
            LeaseDecision::Elsewhere
        );
        let s = [("a/1", 100), ("b/2", 10_001)];
        assert_eq!(
            decide(Some("b/2"), "a/1", silences(&s), T),
            LeaseDecision::Take
        );
        // Swept (no row) or gone: dead too.
        let s = [("a/1", 100)];
        assert_eq!(
            decide(Some("b/2"), "a/1", silences(&s), T),
            LeaseDecision::Take
        );
    }

    #[test]
    fn an_instance_that_is_not_a_live_member_takes_nothing_and_gives_up_its_own() {
        // Not registered yet: a free lease stays free.
        assert_eq!(
            decide(None, "a/1", silences(&[]), T),
            LeaseDecision::NotAMember { vacate: false }
        );
        // Silent for longer than the timeout (it froze): its own lease goes.
        let s = [("a/1", 10_500)];
        assert_eq!(
            decide(Some("a/1"), "a/1", silences(&s), T),
            LeaseDecision::NotAMember { vacate: true }
        );
        // Another's lease stays with it.
        let s = [("b/2", 5)];
        assert_eq!(
            decide(Some("b/2"), "a/1", silences(&s), T),
            LeaseDecision::NotAMember { vacate: false }
        );
    }
}
