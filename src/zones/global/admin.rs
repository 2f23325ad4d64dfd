//! Registering, disabling, enabling and deleting a global's zones through
//! its API (`PUT`, `DELETE /api/v1/zones/NAME`, `POST .../disable`,
//! `.../enable`; `hdsd zone add|delete|disable|enable`), without a restart.
//!
//! A change is written to the cluster first ([`Cluster::change_zone_registration`]:
//! the redb file of `state_dir` alone, PostgreSQL with several instances,
//! which read it from there), then handed to this instance's hub, which
//! applies it at once and answers with the zone as readers now see it.
//!
//! The configuration wins ([`conflict`]): a zone named in `global.zones` or
//! `global.disabled` is changed by editing the configuration and restarting
//! the global; asking the API for what the configuration already says is
//! no change and succeeds.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::ledger::record_of;
use super::server::HubHandle;
use crate::clock::Timestamp;
use crate::cluster::{Cluster, RegistrationChange, RegistrationState};
use crate::store::StoreError;
use crate::view::zones::ZoneSummary;

/// What an operator asks of a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Register it (`disabled`: disabled from the start).
    Add {
        disabled: bool,
    },
    Disable,
    Enable,
    Delete,
}

impl Op {
    fn verb(self) -> &'static str {
        match self {
            Op::Add { .. } => "register",
            Op::Disable => "disable",
            Op::Enable => "enable",
            Op::Delete => "delete",
        }
    }

    /// Whether the zone ends up disabled (`None`: deleted).
    fn disabled(self) -> Option<bool> {
        match self {
            Op::Add { disabled } => Some(disabled),
            Op::Disable => Some(true),
            Op::Enable => Some(false),
            Op::Delete => None,
        }
    }
}

/// How the configuration names a zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InConfig {
    /// Not at all: the API manages it.
    No,
    /// In `global.zones`.
    Listed,
    /// In `global.disabled`.
    Disabled,
}

/// Why the API cannot do `op` to `zone`, which the configuration names as
/// `config`; `None` when the API may write it (`InConfig::No`) or when the
/// configuration already says what is asked (no change: succeeds without
/// a write, see [`ZoneAdmin::change`]).
pub fn conflict(zone: &str, config: InConfig, op: Op) -> Option<String> {
    let (key, fix) = match (config, op.disabled()) {
        (InConfig::No, _) => return None,
        (InConfig::Listed, Some(false)) | (InConfig::Disabled, Some(true)) => return None,
        (InConfig::Listed, Some(true)) => (
            "global.zones",
            "to disable it, move it from global.zones to global.disabled in the global's configuration and restart the global".to_string(),
        ),
        (InConfig::Disabled, Some(false)) => (
            "global.disabled",
            format!("to enable it, remove it from global.disabled in the global's configuration (listing it in global.zones, or registering it with `hdsd zone add {zone}` after the restart) and restart the global"),
        ),
        (InConfig::Listed, None) => (
            "global.zones",
            "to delete it, remove it from global.zones in the global's configuration and restart the global".to_string(),
        ),
        (InConfig::Disabled, None) => (
            "global.disabled",
            "to delete it, remove it from global.disabled in the global's configuration and restart the global".to_string(),
        ),
    };
    Some(format!(
        "zone {zone:?} is in {key} of the global's configuration, and the configuration wins: the API cannot {} it; {fix}",
        op.verb()
    ))
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The name breaks the zone naming rule.
    #[error("{0:?} is not a zone name: {1}")]
    InvalidName(String, String),
    /// The configuration names the zone ([`conflict`]).
    #[error("{0}")]
    InConfig(String),
    /// The zone is not registered here.
    #[error("zone {zone:?} is not registered at this global; {hint}")]
    Unknown { zone: String, hint: &'static str },
    /// The store did not take the change.
    #[error("the zone registration was not written: {0}; nothing changed, retry later")]
    Store(#[from] StoreError),
}

/// What a change did.
#[derive(Debug, Clone)]
pub struct Changed {
    /// True when the zone was not registered (through the API, or at all) before.
    pub created: bool,
    /// The zone as readers now see it (`None`: deleted).
    pub zone: Option<ZoneSummary>,
    /// After a deletion: zone tokens issued at or before this time are refused.
    pub tokens_not_before: Option<Timestamp>,
}

/// The API's way to a global's zone registrations.
#[derive(Debug, Clone)]
pub struct ZoneAdmin {
    hub: HubHandle,
    cluster: Arc<dyn Cluster>,
    listed: Arc<BTreeSet<String>>,
    disabled: Arc<BTreeSet<String>>,
}

impl ZoneAdmin {
    /// Changes written to `cluster` and applied by `hub`; `listed` and
    /// `disabled`: `global.zones` and `global.disabled`.
    pub fn new(
        hub: HubHandle,
        cluster: Arc<dyn Cluster>,
        listed: &[String],
        disabled: &[String],
    ) -> ZoneAdmin {
        ZoneAdmin {
            hub,
            cluster,
            listed: Arc::new(listed.iter().cloned().collect()),
            disabled: Arc::new(disabled.iter().cloned().collect()),
        }
    }

    fn in_config(&self, zone: &str) -> InConfig {
        if self.disabled.contains(zone) {
            InConfig::Disabled
        } else if self.listed.contains(zone) {
            InConfig::Listed
        } else {
            InConfig::No
        }
    }

    /// Does `op` to `zone`: checks the name, the configuration and (but to
    /// register) that the zone is registered, writes the change, and
    /// answers once this instance's readers see it.
    pub async fn change(&self, zone: &str, op: Op) -> Result<Changed, AdminError> {
        crate::names::check_zone(zone)
            .map_err(|problem| AdminError::InvalidName(zone.to_string(), problem))?;
        let config = self.in_config(zone);
        if let Some(message) = conflict(zone, config, op) {
            return Err(AdminError::InConfig(message));
        }
        let view = self.hub.view();
        let current = view.get(zone).map(|z| z.summary.clone());
        if config != InConfig::No {
            // The configuration already says it: nothing to write.
            return Ok(Changed {
                created: false,
                zone: current,
                tokens_not_before: None,
            });
        }
        let registered = current.as_ref().is_some_and(|z| z.registered);
        let change = match op {
            Op::Add { disabled } => RegistrationChange::Register { disabled },
            Op::Disable | Op::Enable if !registered => {
                return Err(AdminError::Unknown {
                    zone: zone.to_string(),
                    hint: "`hdsd zone add NAME` registers it (with --disabled, disabled from the start); GET /api/v1/zones lists the zones it knows",
                })
            }
            Op::Disable => RegistrationChange::Register { disabled: true },
            Op::Enable => RegistrationChange::Register { disabled: false },
            Op::Delete if !registered => {
                return Err(AdminError::Unknown {
                    zone: zone.to_string(),
                    hint: "GET /api/v1/zones lists the zones it knows",
                })
            }
            Op::Delete => RegistrationChange::Delete,
        };
        let written = self.cluster.change_zone_registration(zone, change).await?;
        let created = !matches!(
            written.before,
            Some(RegistrationState::Registered | RegistrationState::Disabled)
        ) && !registered;
        let tokens_not_before = (op == Op::Delete)
            .then_some(written.registration.tokens_not_before)
            .flatten();
        tracing::info!(
            zone,
            change = op.verb(),
            "zone registration written through the API"
        );
        let zone = self.hub.record(record_of(written.registration)).await;
        Ok(Changed {
            created,
            zone,
            tokens_not_before,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration wins: what it already says succeeds, what would
    /// change it is refused with the fix; zones it does not name are the
    /// API's.
    #[test]
    fn the_configuration_wins() {
        use InConfig::*;
        for op in [
            Op::Add { disabled: false },
            Op::Add { disabled: true },
            Op::Disable,
            Op::Enable,
            Op::Delete,
        ] {
            assert_eq!(conflict("ap-1", No, op), None, "{op:?}");
        }
        assert_eq!(conflict("eu-1", Listed, Op::Add { disabled: false }), None);
        assert_eq!(conflict("eu-1", Listed, Op::Enable), None);
        assert_eq!(conflict("off-1", Disabled, Op::Disable), None);
        assert_eq!(
            conflict("off-1", Disabled, Op::Add { disabled: true }),
            None
        );
        let m = conflict("eu-1", Listed, Op::Disable).unwrap();
        assert!(
            m.contains("zone \"eu-1\" is in global.zones")
                && m.contains("the API cannot disable it")
                && m.contains("move it from global.zones to global.disabled"),
            "{m}"
        );
        let m = conflict("eu-1", Listed, Op::Delete).unwrap();
        assert!(m.contains("remove it from global.zones"), "{m}");
        let m = conflict("off-1", Disabled, Op::Enable).unwrap();
        assert!(
            m.contains("cannot enable it") && m.contains("remove it from global.disabled"),
            "{m}"
        );
        let m = conflict("off-1", Disabled, Op::Delete).unwrap();
        assert!(m.contains("remove it from global.disabled"), "{m}");
    }
}
