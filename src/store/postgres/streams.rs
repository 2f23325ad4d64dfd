//! Who holds which dataplane's stream (`hdsd_streams`): claims announced in
//! bursts, encoded so that no name can forge another field, and read whole
//! to heal a missed announcement.

use std::collections::BTreeMap;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::broadcast;

use super::schema::*;
use super::{millis, pg_error, PgStore};
use crate::dataplane::DataplaneId;
use crate::readiness::Timestamp;
use crate::store::StoreError;

/// A stream that attached on another instance: dataplane, instance, when.
pub type Claim = (DataplaneId, String, Timestamp);

/// This instance's claims on their way to [`announce_claims`].
pub type ClaimSender = tokio::sync::mpsc::UnboundedSender<(DataplaneId, Option<Timestamp>)>;

/// One announcement of `hdsd_streams` (see [`STREAMS_CHANNEL`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct StreamPayload<'a> {
    mesh: std::borrow::Cow<'a, str>,
    name: std::borrow::Cow<'a, str>,
    instance: std::borrow::Cow<'a, str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    at: Option<Timestamp>,
}

/// The longest instance name (`<host>/<pid>`) sent to other instances.
pub const MAX_INSTANCE: usize = 200;

/// The largest payload [`stream_payload`] makes: JSON escapes any character
/// in at most 6 bytes; names are checked ASCII, so 1 byte each, the
/// instance name is cut to [`MAX_INSTANCE`] ASCII characters, and the rest
/// is the keys and a timestamp. Under PostgreSQL's 8,000-byte limit.
pub const MAX_STREAM_PAYLOAD: usize =
    crate::names::MAX_LABEL + crate::names::MAX_NAME + MAX_INSTANCE + 128;

fn stream_payload(id: &DataplaneId, instance: &str, at: Option<Timestamp>) -> String {
    serde_json::to_string(&StreamPayload {
        mesh: id.mesh.as_str().into(),
        name: id.name.as_str().into(),
        instance: instance.into(),
        at,
    })
    .unwrap_or_default()
}

/// A stream of the dataplane attached on `instance` at `at`.
fn claim_payload(id: &DataplaneId, instance: &str, at: Timestamp) -> String {
    stream_payload(id, instance, Some(at))
}

/// `instance` no longer holds the dataplane's stream.
pub(super) fn release_payload(id: &DataplaneId, instance: &str) -> String {
    stream_payload(id, instance, None)
}

/// What another instance announced about a dataplane's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamNote {
    /// A stream for the dataplane attached on that instance.
    Claimed(Claim),
    /// That instance no longer holds the dataplane's stream.
    Released(DataplaneId, String),
}

impl StreamNote {
    /// The instance the note is about.
    pub fn instance(&self) -> &str {
        match self {
            StreamNote::Claimed((_, instance, _)) | StreamNote::Released(_, instance) => instance,
        }
    }
}

pub(super) fn parse_stream_note(payload: &str) -> Option<StreamNote> {
    let p: StreamPayload<'_> = serde_json::from_str(payload).ok()?;
    let id = DataplaneId::try_new(p.mesh, p.name).ok()?;
    let instance = p.instance.into_owned();
    Some(match p.at {
        Some(at) => StreamNote::Claimed((id, instance, at)),
        None => StreamNote::Released(id, instance),
    })
}

/// `<host>/<pid>`: how other instances name this one.
pub(super) fn instance_name() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| sanitized_host(h.trim()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "hdsd".to_string());
    format!("{host}/{}", std::process::id())
}

/// A host name as other instances are told it: printable ASCII without
/// spaces, at most [`MAX_INSTANCE`] less room for the pid.
fn sanitized_host(host: &str) -> String {
    host.chars()
        .filter(|c| c.is_ascii_graphic())
        .take(MAX_INSTANCE - 12)
        .collect()
}

/// The longest wait between two tries of a stream announcement that failed.
const MAX_ANNOUNCE_BACKOFF: Duration = Duration::from_secs(5);

/// Records and announces the streams that attach and end here: a burst in
/// one transaction (the newest event per dataplane), whose `pg_notify`s are
/// sent when it commits. A row of `hdsd_streams` names the instance holding
/// the dataplane's stream; an attach never overwrites a newer one.
pub(super) async fn announce_claims(
    pool: Pool,
    instance: String,
    mut claims: tokio::sync::mpsc::UnboundedReceiver<(DataplaneId, Option<Timestamp>)>,
) {
    // A burst that failed is kept and written with the next one (the
    // newest event per dataplane wins), after a backoff: a failure is the
    // database's (names are checked and payloads bounded, so no row can
    // fail alone), and nothing is dropped.
    let mut burst: BTreeMap<DataplaneId, Option<Timestamp>> = BTreeMap::new();
    let mut backoff = Duration::from_millis(100);
    let mut failing = false;
    loop {
        if burst.is_empty() {
            let Some((id, at)) = claims.recv().await else {
                return;
            };
            burst.insert(id, at);
        }
        while let Ok((id, at)) = claims.try_recv() {
            burst.insert(id, at);
        }
        let count = burst.len();
        match record_streams(&pool, &instance, burst.clone()).await {
            Ok(()) => {
                if failing {
                    tracing::info!("stream changes reach other instances again ({count} written)");
                }
                burst.clear();
                backoff = Duration::from_millis(100);
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(
                        "cannot announce {count} stream change(s) to other instances, retrying every {} at most: {e}",
                        humantime::format_duration(MAX_ANNOUNCE_BACKOFF)
                    );
                }
                failing = true;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_ANNOUNCE_BACKOFF);
            }
        }
    }
}

async fn record_streams(
    pool: &Pool,
    instance: &str,
    burst: BTreeMap<DataplaneId, Option<Timestamp>>,
) -> Result<(), StoreError> {
    let (mut attached, mut released) = ((vec![], vec![], vec![]), (vec![], vec![]));
    let mut payloads = Vec::with_capacity(burst.len());
    for (id, at) in burst {
        match at {
            Some(at) => {
                payloads.push(claim_payload(&id, instance, at));
                attached.0.push(id.mesh);
                attached.1.push(id.name);
                attached.2.push(at.to_rfc3339());
            }
            None => {
                payloads.push(release_payload(&id, instance));
                released.0.push(id.mesh);
                released.1.push(id.name);
            }
        }
    }
    let mut client = pool.get().await.map_err(pg_error)?;
    let tx = client.transaction().await.map_err(pg_error)?;
    if !attached.0.is_empty() {
        tx.execute(
            "INSERT INTO hdsd_streams (mesh, name, instance, attached_at)
             SELECT mesh, name, $1, at::timestamptz
             FROM unnest($2::text[], $3::text[], $4::text[]) AS c(mesh, name, at)
             ON CONFLICT (mesh, name) DO UPDATE
                 SET instance = EXCLUDED.instance, attached_at = EXCLUDED.attached_at
                 WHERE hdsd_streams.attached_at <= EXCLUDED.attached_at",
            &[&instance, &attached.0, &attached.1, &attached.2],
        )
        .await
        .map_err(pg_error)?;
    }
    if !released.0.is_empty() {
        tx.execute(
            "DELETE FROM hdsd_streams s USING unnest($2::text[], $3::text[]) AS r(mesh, name)
             WHERE s.mesh = r.mesh AND s.name = r.name AND s.instance = $1",
            &[&instance, &released.0, &released.1],
        )
        .await
        .map_err(pg_error)?;
    }
    tx.execute(
        "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p",
        &[&STREAMS_CHANNEL, &payloads],
    )
    .await
    .map_err(pg_error)?;
    tx.commit().await.map_err(pg_error)
}

impl PgStore {
    /// Where this instance's stream claims go to be announced: a dataplane
    /// and when its stream attached here, or `None` when it ended here.
    pub fn claim_sender(&self) -> ClaimSender {
        self.claims.clone()
    }

    /// Streams that attached on, or were released by, other instances.
    pub fn replaced(&self) -> broadcast::Receiver<StreamNote> {
        self.replaced.subscribe()
    }

    /// Which instance holds each dataplane's stream (`hdsd_streams`).
    pub async fn holders(&self) -> Result<BTreeMap<DataplaneId, (String, Timestamp)>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT mesh, name, instance,
                     floor(extract(epoch FROM attached_at) * 1000)::bigint
                 FROM hdsd_streams",
                &[],
            )
            .await
            .map_err(pg_error)?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let id = super::row_id(row, 0)?;
                Some((id, (row.get(2), millis(row.get(3)))))
            })
            .collect())
    }

    /// This instance's name in stream claims.
    pub fn instance(&self) -> &str {
        &self.instance
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn a_claim_round_trips_through_its_payload() {
        let id = DataplaneId::new("default", "web.01");
        let at = chrono::Utc.timestamp_millis_opt(1_700_000_000_123).unwrap();
        let payload = claim_payload(&id, "host-a/7", at);
        assert_eq!(
            parse_stream_note(&payload),
            Some(StreamNote::Claimed((
                id.clone(),
                "host-a/7".to_string(),
                at
            )))
        );
        assert_eq!(
            parse_stream_note(&release_payload(&id, "host-a/7")),
            Some(StreamNote::Released(id, "host-a/7".to_string()))
        );
        assert_eq!(parse_stream_note("default.web\thost\tnot a time"), None);
        assert_eq!(parse_stream_note("no-dot\thost"), None);
    }

    /// The forgery of the attack review: a name that carries the old
    /// separators is refused where it enters, and even unchecked it cannot
    /// turn into another dataplane's claim; the longest names fit.
    #[test]
    fn a_payload_cannot_be_forged_and_always_fits() {
        assert!(
            DataplaneId::try_new("default", "victim\tfake-host/1\t2099-01-01T00:00:00+00:00")
                .is_err()
        );
        let forged = DataplaneId::new("default", "victim\tfake-host/1\t2099-01-01T00:00:00+00:00");
        let payload = release_payload(&forged, "host-a/7");
        // Parsed back, it names no dataplane (the name fails the rules),
        // certainly not default.victim.
        assert_eq!(parse_stream_note(&payload), None);
        let longest = DataplaneId::new(
            "m".repeat(crate::names::MAX_LABEL),
            "n".repeat(crate::names::MAX_NAME),
        );
        let instance = format!("{}/{}", sanitized_host(&"h".repeat(10_000)), u32::MAX);
        assert!(instance.len() <= MAX_INSTANCE);
        let at = chrono::Utc
            .timestamp_millis_opt(i64::from(i32::MAX) * 1000)
            .unwrap();
        let payload = claim_payload(&longest, &instance, at);
        assert!(payload.len() <= MAX_STREAM_PAYLOAD, "{}", payload.len());
        const { assert!(MAX_STREAM_PAYLOAD < 8000) };
        assert!(matches!(
            parse_stream_note(&payload),
            Some(StreamNote::Claimed(_))
        ));
        assert_eq!(sanitized_host("a b\tc\u{7f}d"), "abcd");
    }
}
