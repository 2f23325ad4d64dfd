//! One watch: pumps the feed's first messages and live batches to one
//! consumer (a gRPC stream or an SSE response) through a bounded buffer.
//!
//! A consumer that reads too slowly fills its buffer; the pump then stops
//! reading the feed's broadcast, falls behind it and, instead of slowing hdsd
//! down, tells the consumer RESYNC and starts over with a fresh snapshot.

use tokio::sync::{broadcast, mpsc};

use crate::feed::{FeedHandle, Filter, Message, ResyncReason, Revision};

/// Messages a consumer's buffer holds before the pump waits for it.
pub const CONSUMER_BUFFER: usize = 256;

/// Starts a watch: the receiver yields its messages until it is dropped or
/// the feed stops.
pub fn watch(
    feed: FeedHandle,
    filter: Filter,
    since: Option<Revision>,
    buffer: usize,
) -> mpsc::Receiver<Message> {
    let (tx, rx) = mpsc::channel(buffer.max(1));
    tokio::spawn(pump(feed, filter, since, tx));
    rx
}

async fn pump(
    feed: FeedHandle,
    filter: Filter,
    since: Option<Revision>,
    tx: mpsc::Sender<Message>,
) {
    let _active = crate::metrics::ActiveWatcher::new();
    tokio::select! {
        () = pump_until_closed(&feed, &filter, since, &tx) => {}
        () = feed.drained() => {}
    }
}

async fn pump_until_closed(
    feed: &FeedHandle,
    filter: &Filter,
    mut since: Option<Revision>,
    tx: &mpsc::Sender<Message>,
) {
    loop {
        let Ok((first, mut live)) = feed.subscribe(since, filter.clone()).await else {
            return;
        };
        for message in first {
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
}
