//! The claims of a dataplane token and the rules that bind a verified token
//! to the dataplane that presents it (identity, then tags).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::rejection::Rejection;

/// The claims of a dataplane token.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The dataplane's mesh (first part of the Envoy node id).
    pub mesh: String,
    /// The dataplane's name (rest of the Envoy node id).
    pub name: String,
    /// Issued at, Unix seconds.
    pub iat: i64,
    /// Expires at, Unix seconds.
    pub exp: i64,
    /// Not before, Unix seconds: hdsd issues none, and refuses a token
    /// before its `nbf` (another issuer's, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    /// Random unique token id (128 bits, hex): what the revocation list holds.
    pub jti: String,
    /// Tags the dataplane must carry on at least one inbound each.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// A zone token: the zone it names (`mesh` and `name` are empty). Only
    /// the global's zone listener accepts it; it connects no dataplane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// A zone token: the meshes whose dataplanes the zone may announce
    /// (empty: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub meshes: Vec<String>,
}

impl Claims {
    /// `mesh.name`, or `zone NAME` for a zone token.
    pub fn identity(&self) -> String {
        match &self.zone {
            Some(zone) => format!("zone {zone}"),
            None => format!("{}.{}", self.mesh, self.name),
        }
    }

    /// `iat` as a time (`None` if out of range).
    pub fn issued_at(&self) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp(self.iat, 0)
    }

    /// `exp` as a time (`None` if out of range).
    pub fn expires_at(&self) -> Option<DateTime<Utc>> {
        DateTime::from_timestamp(self.exp, 0)
    }
}

/// Binds a verified token to the connecting dataplane.
///
/// The token's mesh and name must equal the node's, else
/// [`Rejection::WrongIdentity`] ("token for default.web-01 cannot be used by
/// default.web-02"). Every tag in the token must be present, with the same
/// value, on at least one of the dataplane's inbounds (`inbound_tags`, one
/// map per inbound), else [`Rejection::TagsMismatch`]. A token without tags
/// binds by identity only.
pub fn authorize(
    claims: &Claims,
    node_mesh: &str,
    node_name: &str,
    inbound_tags: &[&BTreeMap<String, String>],
) -> Result<(), Rejection> {
    check_identity(claims, node_mesh, node_name)?;
    for (tag, value) in &claims.tags {
        if !inbound_tags.iter().any(|tags| tags.get(tag) == Some(value)) {
            return Err(Rejection::TagsMismatch {
                tag: tag.clone(),
                value: value.clone(),
            });
        }
    }
    Ok(())
}

/// The first half of [`authorize`]: the token must name this node. Checked
/// on the first request, before the dataplane (and its tags) is known.
pub fn check_identity(claims: &Claims, node_mesh: &str, node_name: &str) -> Result<(), Rejection> {
    if let Some(zone) = &claims.zone {
        return Err(Rejection::WrongIdentity {
            token: format!("zone {zone} (a zone token, for the global's zone listener)"),
            node: format!("{node_mesh}.{node_name}"),
        });
    }
    if claims.mesh != node_mesh || claims.name != node_name {
        return Err(Rejection::WrongIdentity {
            token: format!("{}.{}", claims.mesh, claims.name),
            node: format!("{node_mesh}.{node_name}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::RejectionKind;

    fn claims(tags: &[(&str, &str)]) -> Claims {
        Claims {
            mesh: "default".into(),
            name: "web-01".into(),
            iat: 0,
            exp: 1,
            jti: "j".into(),
            tags: tags
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Claims::default()
        }
    }

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn authorize_identity() {
        assert_eq!(authorize(&claims(&[]), "default", "web-01", &[]), Ok(()));
        let err = authorize(&claims(&[]), "default", "web-02", &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "token for default.web-01 cannot be used by default.web-02"
        );
        assert_eq!(err.reason(), "wrong_identity");
        assert_eq!(err.kind(), RejectionKind::PermissionDenied);
        let err = authorize(&claims(&[]), "other", "web-01", &[]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "token for default.web-01 cannot be used by other.web-01"
        );
    }

    #[test]
    fn authorize_tags_need_one_matching_inbound_each() {
        let web = tags(&[("kuma.io/service", "web"), ("version", "v1")]);
        let admin = tags(&[("kuma.io/service", "admin")]);
        let inbounds = [&web, &admin];
        let ok = claims(&[("kuma.io/service", "web")]);
        assert_eq!(authorize(&ok, "default", "web-01", &inbounds), Ok(()));
        // Tags may be satisfied by different inbounds.
        let ok2 = claims(&[("kuma.io/service", "admin"), ("version", "v1")]);
        assert_eq!(authorize(&ok2, "default", "web-01", &inbounds), Ok(()));

        let wrong_value = claims(&[("kuma.io/service", "db")]);
        let err = authorize(&wrong_value, "default", "web-01", &inbounds).unwrap_err();
        assert_eq!(
            err,
            Rejection::TagsMismatch {
                tag: "kuma.io/service".into(),
                value: "db".into()
            }
        );
        assert_eq!(err.kind(), RejectionKind::PermissionDenied);
        assert_eq!(err.reason(), "tags_mismatch");

        let absent = claims(&[("zone", "eu")]);
        assert!(authorize(&absent, "default", "web-01", &inbounds).is_err());
        // No inbounds at all: any token tag fails.
        assert!(authorize(&ok, "default", "web-01", &[]).is_err());
    }
}
