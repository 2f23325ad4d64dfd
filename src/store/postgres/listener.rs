//! The one connection per instance that `LISTEN`s: it hands on definition
//! changes, stream claims of other instances, and pokes the followers of
//! readiness, revocations, keys, zones, leases and stream holders.

use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio_postgres::{AsyncMessage, NoTls};

use super::schema::*;
use super::streams::{parse_stream_note, StreamNote};
use crate::dataplane::DataplaneId;
use crate::store::definitions::DefinitionChange;

/// Where the listener passes on what it hears.
pub(super) struct Announcements {
    pub(super) changes: broadcast::Sender<DefinitionChange>,
    pub(super) readiness: watch::Sender<()>,
    pub(super) revocations: watch::Sender<()>,
    pub(super) keys: watch::Sender<()>,
    pub(super) zones: watch::Sender<()>,
    pub(super) leases: watch::Sender<()>,
    pub(super) streams: watch::Sender<()>,
    pub(super) replaced: broadcast::Sender<StreamNote>,
    /// Whether the listener's `LISTEN` is in force.
    pub(super) listening: watch::Sender<bool>,
    /// This instance: its own claims are not news.
    pub(super) instance: String,
}

/// Follows [`CHANNEL`] until `alive`'s sender is dropped, reconnecting as needed.
pub(super) async fn listen(
    config: tokio_postgres::Config,
    listening: tokio::sync::oneshot::Sender<()>,
    heard: Announcements,
    reconcile: Duration,
    mut alive: watch::Receiver<()>,
) {
    const BACKOFF_MAX: Duration = Duration::from_secs(5);
    let mut backoff = Duration::from_millis(100);
    let mut down: Option<String> = None;
    let mut listening = Some(listening);
    loop {
        let session = async {
            let (client, mut connection) = config.connect(NoTls).await?;
            let (notes_tx, notes) = tokio::sync::mpsc::unbounded_channel();
            // The connection delivers notifications only to whoever polls it.
            tokio::spawn(async move {
                loop {
                    match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                        Some(Ok(AsyncMessage::Notification(n))) => {
                            let note = (n.channel().to_string(), n.payload().to_string());
                            if notes_tx.send(Ok(note)).is_err() {
                                return;
                            }
                        }
                        Some(Ok(_)) => {}
                        Some(Err(e)) => {
                            let _ = notes_tx.send(Err(e));
                            return;
                        }
                        None => return,
                    }
                }
            });
            client
                .batch_execute(&format!(
                    "LISTEN {CHANNEL}; LISTEN {READINESS_CHANNEL}; LISTEN {STREAMS_CHANNEL}; LISTEN {REVOCATIONS_CHANNEL}; LISTEN {KEYS_CHANNEL}; LISTEN {ZONES_CHANNEL}; LISTEN {LEASES_CHANNEL}"
                ))
                .await?;
            Ok::<_, tokio_postgres::Error>((client, notes))
        };
        let connected = tokio::select! {
            s = session => s,
            _ = alive.changed() => return,
        };
        match connected {
            Ok((client, mut notes)) => {
                if down.take().is_some() {
                    tracing::info!("PostgreSQL store: listening for definition changes again");
                }
                backoff = Duration::from_millis(100);
                if let Some(listening) = listening.take() {
                    let _ = listening.send(());
                }
                heard.listening.send_replace(true);
                // Whatever changed while nobody listened.
                let _ = heard.changes.send(DefinitionChange::All);
                heard.readiness.send_replace(());
                heard.revocations.send_replace(());
                heard.keys.send_replace(());
                heard.zones.send_replace(());
                heard.leases.send_replace(());
                heard.streams.send_replace(());
                let mut reconcile_tick =
                    tokio::time::interval_at(tokio::time::Instant::now() + reconcile, reconcile);
                let reason = loop {
                    tokio::select! {
                        note = notes.recv() => match note {
                            Some(Ok((channel, _))) if channel == READINESS_CHANNEL => {
                                heard.readiness.send_replace(());
                            }
                            Some(Ok((channel, _))) if channel == REVOCATIONS_CHANNEL => {
                                heard.revocations.send_replace(());
                            }
                            Some(Ok((channel, _))) if channel == KEYS_CHANNEL => {
                                heard.keys.send_replace(());
                            }
                            Some(Ok((channel, _))) if channel == ZONES_CHANNEL => {
                                heard.zones.send_replace(());
                            }
                            Some(Ok((channel, _))) if channel == LEASES_CHANNEL => {
                                heard.leases.send_replace(());
                            }
                            Some(Ok((channel, payload))) if channel == STREAMS_CHANNEL => {
                                if let Some(note) = parse_stream_note(&payload).filter(|n| n.instance() != heard.instance) {
                                    let _ = heard.replaced.send(note);
                                }
                            }
                            Some(Ok((_, payload))) => match payload.parse::<DataplaneId>() {
                                Ok(id) => { let _ = heard.changes.send(DefinitionChange::One(id)); }
                                Err(_) => { let _ = heard.changes.send(DefinitionChange::All); }
                            },
                            Some(Err(e)) => break e.to_string(),
                            None => break "the connection closed".to_string(),
                        },
                        _ = reconcile_tick.tick() => { let _ = heard.changes.send(DefinitionChange::All); }
                        _ = alive.changed() => return,
                    }
                };
                drop(client);
                heard.listening.send_replace(false);
                tracing::warn!(
                    "PostgreSQL store: lost the connection that listens for definition changes ({reason}); reconnecting, then reading every definition again"
                );
                down = Some(reason);
            }
            Err(e) => {
                let reason = e.to_string();
                if down.as_ref() != Some(&reason) {
                    tracing::warn!(
                        "PostgreSQL store: cannot listen for definition changes ({reason}); retrying with a backoff of up to {}s",
                        BACKOFF_MAX.as_secs()
                    );
                }
                down = Some(reason);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = alive.changed() => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}
