//! One watch: pumps the feed's first messages and live batches to one
//! consumer (a gRPC stream or an SSE response) through a bounded buffer.
//!
//! A consumer that reads too slowly fills its buffer; the pump then stops
//! reading the feed's broadcast, falls behind it and, instead of slowing hdsd
//! down, tells the consumer RESYNC and starts over with a fresh snapshot.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{broadcast, mpsc};

use crate::feed::{FeedHandle, Filter, Message, ResyncReason, Revision};

/// Messages a consumer's buffer holds before the pump waits for it.
pub const CONSUMER_BUFFER: usize = 256;

/// What the watches of the API (gRPC `Watch` and `GET /api/v1/watch`)
/// may hold: `api.limits.max_watches` and `api.limits.max_watch_names`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchLimits {
    /// Watches open at once, in total.
    pub max_watches: usize,
    /// Dataplane names plus selector tags one watch may name.
    pub max_names: usize,
}

impl Default for WatchLimits {
    fn default() -> Self {
        WatchLimits {
            max_watches: 512,
            max_names: 256,
        }
    }
}

impl From<&crate::config::ApiLimits> for WatchLimits {
    fn from(l: &crate::config::ApiLimits) -> Self {
        WatchLimits {
            max_watches: l.max_watches,
            max_names: l.max_watch_names,
        }
    }
}

/// Why a watch was refused: the limit (the `limit` label of
/// `hdsd_limit_hits_total`) and a message that names the setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRefused {
    pub limit: &'static str,
    pub message: String,
}

/// The watches open now, within [`WatchLimits`]: one per API listener,
/// shared by the gRPC service and the SSE handler.
#[derive(Debug, Clone)]
pub struct Watches {
    limits: WatchLimits,
    open: Arc<AtomicUsize>,
    /// When a refusal was last logged, in seconds since `started`: at most
    /// one line a minute (the counter counts every refusal).
    logged: Arc<AtomicU64>,
    started: std::time::Instant,
}

/// A watch's slot among [`WatchLimits::max_watches`], given back on drop.
#[derive(Debug)]
pub struct WatchSlot(Arc<AtomicUsize>);

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Watches {
    pub fn new(limits: WatchLimits) -> Watches {
        Watches {
            limits,
            open: Arc::new(AtomicUsize::new(0)),
            logged: Arc::new(AtomicU64::new(u64::MAX)),
            started: std::time::Instant::now(),
        }
    }

    /// Watches open now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// A slot for a watch with `filter`, or why not (counted and logged).
    pub fn admit(&self, filter: &Filter) -> Result<WatchSlot, WatchRefused> {
        self.admit_naming(filter.names.len().saturating_add(filter.selector.len()))
    }

    /// [`Watches::admit`] for a watch naming `named` dataplanes and
    /// selector tags, before its filter is built.
    pub fn admit_naming(&self, named: usize) -> Result<WatchSlot, WatchRefused> {
        let refused = if named > self.limits.max_names {
            WatchRefused {
                limit: "max_watch_names",
                message: format!(
                    "the watch names {named} dataplanes and selector tags, more than api.limits.max_watch_names ({}); watch by mesh or selector instead, or raise the limit",
                    self.limits.max_names
                ),
            }
        } else {
            let taken = self
                .open
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                    (n < self.limits.max_watches).then_some(n + 1)
                });
            match taken {
                Ok(_) => return Ok(WatchSlot(Arc::clone(&self.open))),
                Err(_) => WatchRefused {
                    limit: "max_watches",
                    message: format!(
                        "{} watches are open, the most api.limits.max_watches allows; retry later, or raise the limit",
                        self.limits.max_watches
                    ),
                },
            }
        };
        crate::metrics::limit_hit(refused.limit);
        let now = self.started.elapsed().as_secs();
        let last = self.logged.load(Ordering::Acquire);
        if (last == u64::MAX || now >= last.saturating_add(60))
            && self
                .logged
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            tracing::warn!(
                limit = refused.limit,
                "watch refused: {} (logged at most once a minute; hdsd_limit_hits_total counts every refusal)",
                refused.message
            );
        }
        Err(refused)
    }

    /// [`watch`], holding `slot` until the watch ends, its snapshots sent
    /// in pages of `snapshot_page` items (0: whole; see [`pages`]).
    pub fn start(
        &self,
        slot: WatchSlot,
        feed: FeedHandle,
        filter: Filter,
        since: Option<Revision>,
        snapshot_page: usize,
    ) -> mpsc::Receiver<Message> {
        spawn_pump(slot, feed, filter, since, snapshot_page, CONSUMER_BUFFER)
    }
}

/// A feed message as the watch sends it: a snapshot of more than `page`
/// items (dataplanes and zones) becomes consecutive SNAPSHOT messages of at
/// most `page` items each, at the same revision, which together are the
/// snapshot; SYNCED follows the last. `page` 0, and any other message, is
/// sent as it is. A consumer asks for pages (`snapshot_page_size`) and so
/// knows to collect them until SYNCED: at 100k dataplanes one SNAPSHOT is
/// about 3 MB of protobuf, near the 4 MB that gRPC clients accept by
/// default, and a consumer's first message waits for all of it.
pub fn pages(message: Message, page: usize) -> Vec<Message> {
    match message {
        Message::Snapshot { revision, items } if page > 0 && items.len() > page => items
            .chunks(page)
            .map(|chunk| Message::Snapshot {
                revision,
                items: chunk.to_vec(),
            })
            .collect(),
        other => vec![other],
    }
}

/// Starts a watch: the receiver yields its messages until it is dropped or
/// the feed stops.
pub fn watch(
    feed: FeedHandle,
    filter: Filter,
    since: Option<Revision>,
    buffer: usize,
) -> mpsc::Receiver<Message> {
    spawn_pump((), feed, filter, since, 0, buffer)
}

/// Spawns the pump of one watch, which holds `guard` (a watch slot, or
/// nothing) until it ends.
fn spawn_pump<G: Send + 'static>(
    guard: G,
    feed: FeedHandle,
    filter: Filter,
    since: Option<Revision>,
    snapshot_page: usize,
    buffer: usize,
) -> mpsc::Receiver<Message> {
    let (tx, rx) = mpsc::channel(buffer.max(1));
    tokio::spawn(async move {
        let _guard = guard;
        pump(feed, filter, since, snapshot_page, tx).await;
    });
    rx
}

async fn pump(
    feed: FeedHandle,
    filter: Filter,
    since: Option<Revision>,
    snapshot_page: usize,
    tx: mpsc::Sender<Message>,
) {
    let _active = crate::metrics::ActiveWatcher::new();
    tokio::select! {
        () = pump_until_closed(&feed, &filter, since, snapshot_page, &tx) => {}
        () = feed.drained() => {}
    }
}

async fn pump_until_closed(
    feed: &FeedHandle,
    filter: &Filter,
    mut since: Option<Revision>,
    snapshot_page: usize,
    tx: &mpsc::Sender<Message>,
) {
    loop {
        let Ok((first, mut live)) = feed.subscribe(since, filter.clone()).await else {
            return;
        };
        for message in first.into_iter().flat_map(|m| pages(m, snapshot_page)) {
            if !send(tx, message).await {
                return;
            }
        }
        loop {
            let received = tokio::select! {
                r = live.recv() => r,
                () = tx.closed() => return,
            };
            match received {
                Ok(batch) => {
                    for event in batch.iter().filter(|e| filter.matches_subject(&e.subject)) {
                        if !send(tx, Message::Event(event.clone())).await {
                            return;
                        }
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    if !send(tx, Message::Resync(ResyncReason::Overflow)).await {
                        return;
                    }
                    since = None;
                    break;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    }
}

async fn send(tx: &mpsc::Sender<Message>, message: Message) -> bool {
    if let Message::Resync(reason) = &message {
        crate::metrics::watch_resync(reason.as_str());
    }
    let ok = tx.send(message).await.is_ok();
    if ok {
        crate::metrics::watch_event_sent();
    }
    ok
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::dataplane::{parse_documents, Dataplane};
    use crate::feed::{self, Change, ChangeKind, HistoryLimits};

    fn dp(name: &str) -> Arc<Dataplane> {
        let text = format!("type: Dataplane\nmesh: default\nname: {name}\nnetworking:\n  address: 127.0.0.1\n  inbound:\n  - port: 10001\n    servicePort: 8080\n");
        Arc::new(parse_documents(&text).unwrap().remove(0))
    }

    fn change(d: &Arc<Dataplane>) -> Change {
        Change {
            subject: feed::Subject::Local(d.clone()),
            incarnation: 1,
            kind: ChangeKind::Changed,
            ready: true,
            at_least: 0,
        }
    }

    fn revisions(messages: &[Message]) -> Vec<Option<Revision>> {
        messages.iter().map(Message::revision).collect()
    }

    /// Issue 33, finding 4: a watch naming more than `max_names`
    /// dataplanes, or one past `max_watches`, is refused with a message
    /// naming the setting; a slot comes back when its watch ends.
    #[tokio::test]
    async fn watches_are_bounded_in_names_and_number() {
        let feed = feed::spawn(HistoryLimits::default(), 2);
        let watches = Watches::new(WatchLimits {
            max_watches: 2,
            max_names: 3,
        });
        let named = |n: usize| Filter {
            names: (0..n).map(|i| format!("dp-{i}")).collect(),
            ..Filter::default()
        };
        let e = watches.admit(&named(4)).unwrap_err();
        assert_eq!(e.limit, "max_watch_names");
        assert!(
            e.message.contains("api.limits.max_watch_names (3)"),
            "{}",
            e.message
        );
        let mut tagged = named(2);
        tagged.selector.insert("a".into(), "b".into());
        tagged.selector.insert("c".into(), "d".into());
        assert_eq!(watches.admit(&tagged).unwrap_err().limit, "max_watch_names");
        let first = watches.admit(&named(3)).unwrap();
        let second = watches.admit(&named(0)).unwrap();
        let e = watches.admit(&named(0)).unwrap_err();
        assert_eq!(e.limit, "max_watches");
        assert!(
            e.message.contains("api.limits.max_watches"),
            "{}",
            e.message
        );
        assert_eq!(watches.open(), 2);
        drop(first);
        let mut rx = watches.start(second, feed.clone(), named(0), None, 0);
        let third = watches.admit(&named(0)).unwrap();
        assert!(rx.recv().await.is_some(), "the watch runs");
        drop(rx);
        // The pump gives its slot back once its consumer is gone.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while watches.open() != 1 {
            assert!(tokio::time::Instant::now() < deadline, "slot not returned");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        drop(third);
        assert_eq!(watches.open(), 0);
    }

    /// A consumer that does not read loses its place and is told so; one
    /// that reads gets every change, once.
    #[tokio::test]
    async fn a_watcher_that_falls_behind_gets_resync_and_a_reader_misses_nothing() {
        let feed = feed::spawn(HistoryLimits::default(), 2);
        let mut slow = watch(feed.clone(), Filter::default(), None, 1);
        let mut fast = watch(feed.clone(), Filter::default(), None, 64);
        // Both have their snapshot: they are subscribed.
        assert!(matches!(fast.recv().await, Some(Message::Snapshot { .. })));
        assert_eq!(fast.recv().await, Some(Message::Synced { revision: 0 }));
        let sender = feed.sender();
        let dataplanes: Vec<_> = (0..10).map(|i| dp(&format!("dp-{i}"))).collect();
        for d in &dataplanes {
            sender.publish(change(d));
            // One batch per change: wait for it to arrive.
            assert!(matches!(fast.recv().await, Some(Message::Event(_))));
        }
        // The slow consumer: its buffer held the snapshot, the feed moved on.
        let mut got = Vec::new();
        while got.len() < 5 {
            got.push(slow.recv().await.expect("the watch goes on"));
        }
        assert!(matches!(got[0], Message::Snapshot { revision: 0, .. }));
        assert_eq!(got[1], Message::Synced { revision: 0 });
        assert_eq!(got[2], Message::Resync(ResyncReason::Overflow));
        let Message::Snapshot { revision, items } = &got[3] else {
            panic!("a fresh snapshot follows RESYNC: {got:?}");
        };
        assert_eq!((*revision, items.len()), (10, 10));
        assert_eq!(got[4], Message::Synced { revision: 10 });
        // Back to live events.
        sender.publish(change(&dataplanes[3]));
        assert_eq!(revisions(&[slow.recv().await.unwrap()]), [Some(11)]);
        assert_eq!(revisions(&[fast.recv().await.unwrap()]), [Some(11)]);
    }

    #[tokio::test]
    async fn resuming_replays_then_follows_live_changes() {
        let feed = feed::spawn(HistoryLimits::default(), 16);
        let sender = feed.sender();
        let (a, b) = (dp("a"), dp("b"));
        sender.publish(change(&a)); // 1
        sender.publish(change(&b)); // 2 (or coalesced into one batch: still 2 revisions)
        let index = feed.index().await.unwrap();
        assert_eq!(index.revision, 2);
        let mut w = watch(feed.clone(), Filter::default(), Some(1), 16);
        let first = w.recv().await.unwrap();
        assert!(matches!(&first, Message::Event(e) if e.local().unwrap().id.name == "b"));
        assert_eq!(w.recv().await, Some(Message::Synced { revision: 2 }));
        sender.publish(change(&a));
        assert_eq!(revisions(&[w.recv().await.unwrap()]), [Some(3)]);
    }

    /// A snapshot larger than the page is consecutive SNAPSHOTs of the
    /// page's size at the snapshot's revision, together every item in
    /// order; a smaller one, page 0 and other messages pass as they are.
    #[test]
    fn a_snapshot_is_split_into_pages_that_together_are_the_snapshot() {
        let items: Vec<Arc<crate::feed::Event>> = (0..5)
            .map(|n| {
                Arc::new(crate::feed::Event {
                    revision: n,
                    kind: crate::feed::ChangeKind::Changed,
                    ready: true,
                    subject: crate::feed::Subject::Local(dp(&format!("web-{n}"))),
                })
            })
            .collect();
        let snapshot = Message::Snapshot {
            revision: 9,
            items: items.clone(),
        };
        let split = pages(snapshot.clone(), 2);
        let sizes: Vec<usize> = split
            .iter()
            .map(|m| match m {
                Message::Snapshot { revision: 9, items } => items.len(),
                other => panic!("not a snapshot at 9: {other:?}"),
            })
            .collect();
        assert_eq!(sizes, [2, 2, 1]);
        let joined: Vec<_> = split
            .into_iter()
            .flat_map(|m| match m {
                Message::Snapshot { items, .. } => items,
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(joined, items);
        assert_eq!(pages(snapshot.clone(), 0), std::slice::from_ref(&snapshot));
        assert_eq!(pages(snapshot.clone(), 5), [snapshot]);
        let empty = Message::Snapshot {
            revision: 1,
            items: Vec::new(),
        };
        assert_eq!(pages(empty.clone(), 2), [empty]);
        let synced = Message::Synced { revision: 9 };
        assert_eq!(pages(synced.clone(), 1), [synced]);
    }
}
