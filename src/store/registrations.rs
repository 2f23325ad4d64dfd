//! Zones a global registered through its API (`hdsd zone add`, `PUT
//! /api/v1/zones/NAME`): one row per zone that was ever registered, disabled
//! or deleted through the API. Two engines keep them: a table of the redb
//! file in `state_dir` (one instance), and `hdsd_zone_registrations` in
//! PostgreSQL (every instance of a global reads them).
//!
//! The rules, the same in both engines ([`next`]):
//!
//! - **Register** (or enable): the row reads `registered`; **disable**:
//!   `disabled`. Either creates the row when there is none.
//! - **Delete**: the row stays as a tombstone, `deleted`, and its
//!   `tokens_not_before` becomes the time of the deletion: zone tokens of
//!   that zone issued at or before it are refused from then on, also after
//!   the zone is registered again (a registration keeps the tombstone's
//!   time). So "deleting a zone stops its tokens" needs no revocation list
//!   entry per token, and a token issued after the deletion works.
//! - Every write takes the next number of one sequence (`seq`): a reader
//!   that saw `n` reads the rows above it, and a row with a lower number
//!   than one already applied is older news.

use std::collections::BTreeMap;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};

use super::{RedbStore, StoreError};
use crate::readiness::Timestamp;

/// Where a zone registered through the API stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegistrationState {
    /// Registered and enabled.
    Registered,
    /// Registered and disabled: its streams are refused, its data withdrawn.
    Disabled,
    /// Deleted: unknown again; the row keeps `tokens_not_before`.
    Deleted,
}

impl RegistrationState {
    /// The word stored (`registered`, `disabled`, `deleted`).
    pub fn as_str(self) -> &'static str {
        match self {
            RegistrationState::Registered => "registered",
            RegistrationState::Disabled => "disabled",
            RegistrationState::Deleted => "deleted",
        }
    }

    /// The state of a stored word.
    pub fn parse(word: &str) -> Option<RegistrationState> {
        [
            RegistrationState::Registered,
            RegistrationState::Disabled,
            RegistrationState::Deleted,
        ]
        .into_iter()
        .find(|s| s.as_str() == word)
    }
}

/// What an operator asks of a zone's registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegistrationChange {
    /// Register it (or keep it registered), enabled or disabled.
    Register { disabled: bool },
    /// Delete it.
    Delete,
}

/// One zone's row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneRegistration {
    pub zone: String,
    pub state: RegistrationState,
    /// Zone tokens of this zone issued at or before this time are refused
    /// (the zone's last deletion).
    pub tokens_not_before: Option<Timestamp>,
    /// When the row last changed.
    pub changed_at: Timestamp,
    /// Its place in the order of writes.
    pub seq: i64,
}

/// What a write did: the row now, and the state before (`None`: no row).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrationWrite {
    pub registration: ZoneRegistration,
    pub before: Option<RegistrationState>,
}

/// The row after `change` of `current` at `now`, numbered `seq`; `None`
/// when nothing changes (the row is already what is asked: no new number,
/// no news for the readers).
pub fn next(
    zone: &str,
    current: Option<&ZoneRegistration>,
    change: RegistrationChange,
    now: Timestamp,
    seq: i64,
) -> Option<ZoneRegistration> {
    let tokens_not_before = current.and_then(|c| c.tokens_not_before);
    let (state, tokens_not_before) = match change {
        RegistrationChange::Register { disabled: false } => {
            (RegistrationState::Registered, tokens_not_before)
        }
        RegistrationChange::Register { disabled: true } => {
            (RegistrationState::Disabled, tokens_not_before)
        }
        // Deleting again moves the time on: tokens issued since the last
        // deletion stop too.
        RegistrationChange::Delete => (RegistrationState::Deleted, Some(now)),
    };
    if change != RegistrationChange::Delete && current.is_some_and(|c| c.state == state) {
        return None;
    }
    Some(ZoneRegistration {
        zone: zone.to_string(),
        state,
        tokens_not_before,
        changed_at: now,
        seq,
    })
}

const REGISTRATIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("zone_registrations");
const META: TableDefinition<'_, &str, u64> = TableDefinition::new("zone_registration_meta");
const SEQ: &str = "seq";

/// Creates the registrations' tables of a redb store.
pub(super) fn redb_create_tables(db: &Database) -> Result<(), redb::Error> {
    let tx = db.begin_write()?;
    tx.open_table(REGISTRATIONS)?;
    tx.open_table(META)?;
    tx.commit()?;
    Ok(())
}

fn read_all(db: &Database) -> Result<BTreeMap<String, ZoneRegistration>, String> {
    let tx = db.begin_read().map_err(|e| e.to_string())?;
    let table = tx.open_table(REGISTRATIONS).map_err(|e| e.to_string())?;
    let mut out = BTreeMap::new();
    for entry in table.iter().map_err(|e| e.to_string())? {
        let (key, value) = entry.map_err(|e| e.to_string())?;
        match serde_json::from_slice::<ZoneRegistration>(value.value()) {
            Ok(r) => {
                out.insert(key.value().to_string(), r);
            }
            Err(e) => {
                tracing::warn!(
                    zone = key.value(),
                    "ignoring an unreadable stored zone registration: {e}"
                )
            }
        }
    }
    Ok(out)
}

fn write(
    db: &Database,
    zone: &str,
    change: RegistrationChange,
    now: Timestamp,
) -> Result<RegistrationWrite, String> {
    let e = |e: redb::Error| e.to_string();
    let tx = db.begin_write().map_err(|x| e(x.into()))?;
    let written = {
        let mut table = tx.open_table(REGISTRATIONS).map_err(|x| e(x.into()))?;
        let current = table
            .get(zone)
            .map_err(|x| e(x.into()))?
            .and_then(|v| serde_json::from_slice::<ZoneRegistration>(v.value()).ok());
        let before = current.as_ref().map(|c| c.state);
        let mut meta = tx.open_table(META).map_err(|x| e(x.into()))?;
        let seq = meta
            .get(SEQ)
            .map_err(|x| e(x.into()))?
            .map(|v| v.value())
            .unwrap_or(0)
            + 1;
        match next(zone, current.as_ref(), change, now, seq as i64) {
            Some(row) => {
                meta.insert(SEQ, seq).map_err(|x| e(x.into()))?;
                let bytes = serde_json::to_vec(&row).map_err(|x| x.to_string())?;
                table
                    .insert(zone, bytes.as_slice())
                    .map_err(|x| e(x.into()))?;
                RegistrationWrite {
                    registration: row,
                    before,
                }
            }
            None => RegistrationWrite {
                registration: current.expect("nothing changes only with a row"),
                before,
            },
        }
    };
    tx.commit().map_err(|x| e(x.into()))?;
    Ok(written)
}

impl RedbStore {
    /// Every zone registration with a number above `seq`, in order.
    pub async fn zone_registrations(&self, seq: i64) -> Result<Vec<ZoneRegistration>, StoreError> {
        let mut rows: Vec<ZoneRegistration> = self
            .blocking(read_all)
            .await?
            .into_values()
            .filter(|r| r.seq > seq)
            .collect();
        rows.sort_by_key(|r| r.seq);
        Ok(rows)
    }

    /// Applies `change` to `zone`'s registration at `now`, in one transaction.
    pub async fn change_zone_registration(
        &self,
        zone: &str,
        change: RegistrationChange,
        now: Timestamp,
    ) -> Result<RegistrationWrite, StoreError> {
        let zone = zone.to_string();
        self.blocking(move |db| write(db, &zone, change, now)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Timestamp {
        chrono::DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    fn row(state: RegistrationState, not_before: Option<i64>, seq: i64) -> ZoneRegistration {
        ZoneRegistration {
            zone: "eu-1".into(),
            state,
            tokens_not_before: not_before.map(at),
            changed_at: at(0),
            seq,
        }
    }

    /// Registering twice is one change; a deletion keeps the row with the
    /// time before which tokens are refused, and a new registration keeps
    /// that time; a second deletion moves it on.
    #[test]
    fn the_registration_rule() {
        use RegistrationChange::*;
        use RegistrationState as S;
        let r = next("eu-1", None, Register { disabled: false }, at(1), 1).unwrap();
        assert_eq!(
            (r.state, r.tokens_not_before, r.seq),
            (S::Registered, None, 1)
        );
        assert_eq!(
            next("eu-1", Some(&r), Register { disabled: false }, at(2), 2),
            None
        );
        let d = next("eu-1", Some(&r), Register { disabled: true }, at(3), 2).unwrap();
        assert_eq!(d.state, S::Disabled);
        let gone = next("eu-1", Some(&d), Delete, at(4), 3).unwrap();
        assert_eq!(
            (gone.state, gone.tokens_not_before),
            (S::Deleted, Some(at(4)))
        );
        let back = next("eu-1", Some(&gone), Register { disabled: false }, at(5), 4).unwrap();
        assert_eq!(
            (back.state, back.tokens_not_before),
            (S::Registered, Some(at(4)))
        );
        let again = next("eu-1", Some(&row(S::Deleted, Some(4), 5)), Delete, at(9), 6).unwrap();
        assert_eq!(again.tokens_not_before, Some(at(9)));
        // A zone deleted that was never registered still gets its tombstone.
        let fresh = next("ap-1", None, Delete, at(7), 7).unwrap();
        assert_eq!(fresh.tokens_not_before, Some(at(7)));
    }

    #[tokio::test]
    async fn registrations_survive_a_reopen_of_the_redb_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("readiness.redb");
        {
            let store = RedbStore::open(&path).unwrap();
            let w = store
                .change_zone_registration(
                    "eu-1",
                    RegistrationChange::Register { disabled: false },
                    at(1),
                )
                .await
                .unwrap();
            assert_eq!(w.before, None);
            let w = store
                .change_zone_registration(
                    "us-1",
                    RegistrationChange::Register { disabled: true },
                    at(2),
                )
                .await
                .unwrap();
            assert_eq!(w.registration.seq, 2);
            let w = store
                .change_zone_registration("eu-1", RegistrationChange::Delete, at(3))
                .await
                .unwrap();
            assert_eq!(w.before, Some(RegistrationState::Registered));
        }
        let store = RedbStore::open(&path).unwrap();
        let all = store.zone_registrations(0).await.unwrap();
        let states: Vec<_> = all
            .iter()
            .map(|r| (r.zone.as_str(), r.state, r.seq))
            .collect();
        assert_eq!(
            states,
            [
                ("us-1", RegistrationState::Disabled, 2),
                ("eu-1", RegistrationState::Deleted, 3)
            ]
        );
        assert_eq!(all[1].tokens_not_before, Some(at(3)));
        let since = store.zone_registrations(2).await.unwrap();
        assert_eq!(since.len(), 1);
        // Unchanged: no new number.
        let w = store
            .change_zone_registration(
                "us-1",
                RegistrationChange::Register { disabled: true },
                at(4),
            )
            .await
            .unwrap();
        assert_eq!(w.registration.seq, 2);
    }
}
