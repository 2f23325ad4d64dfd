//! The supervised set: every long-lived task of a running hdsd, by name.
//!
//! The owners of long-lived tasks (the feed, the readiness store's writer,
//! the registry, the EDS index, the cluster's followers...) hand their
//! task to the server, which spawns it here under a name. hdsd is
//! crash-only: the first task to end, by returning or by a panic, is a
//! failed server ([`Stopped`]). `/readyz` then reads 503 naming it, the
//! log says which task and why, the streams are drained, and hdsd exits
//! with code 2 for its service manager (systemd, Kubernetes) to start it
//! again.
//!
//! Why not restart the task in place: a task is the single writer of its
//! state, and the readers downstream of it (watches, the EDS index, the
//! counts) hold positions in what it wrote. A new feed task would number
//! revisions anew under watchers that resume by revision; a new registry
//! would rebuild dataplane tasks under streams attached to the old ones.
//! Getting every reader back in line is a second, rarely run start-up path;
//! the process's own start is the one that is tested every time, and it
//! restores readiness from the store. Work of one dataplane or of one
//! zone's stream is the exception: a panic there is contained by its owner
//! (the registry, the global's zone server), since the data that caused it
//! is shared by every instance and exiting would crash-loop them all.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::task::JoinSet;

use crate::task::{catch_panic, fault, Ended};

/// A supervised task that ended: which one, and how.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {task} task {ended}")]
pub struct Stopped {
    pub task: &'static str,
    pub ended: Ended,
}

impl Stopped {
    /// `task` returned.
    pub fn returned(task: &'static str) -> Stopped {
        Stopped {
            task,
            ended: Ended::Returned,
        }
    }
}

/// How one task left the set: with the order in which tasks ended.
struct Exit {
    task: &'static str,
    order: u64,
    ended: Ended,
}

/// The long-lived tasks of a running server.
#[derive(Default)]
pub struct Supervisor {
    set: JoinSet<Exit>,
    names: HashMap<tokio::task::Id, &'static str>,
    ended: Arc<AtomicU64>,
}

impl Supervisor {
    pub fn new() -> Supervisor {
        Supervisor::default()
    }

    /// Spawns `task` under `name` (with its fault, in a build with the
    /// `fault-injection` feature and `HDSD_FAULT` set for it).
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let task = fault::inject(name, task);
        let ended = self.ended.clone();
        let handle = self.set.spawn(async move {
            let mut caught = catch_panic(task);
            let outcome = (&mut caught).await;
            // Numbered before the task's future is dropped (a panicked one
            // still holds its channels here): a task that ends because this
            // one closed its input is numbered after it.
            let order = ended.fetch_add(1, Ordering::SeqCst);
            drop(caught);
            Exit {
                task: name,
                order,
                ended: match outcome {
                    Ok(()) => Ended::Returned,
                    Err(message) => Ended::Panicked(message),
                },
            }
        });
        self.names.insert(handle.id(), name);
    }

    /// The names of the tasks spawned, in no order.
    pub fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.names.values().copied()
    }

    /// The first task to end. Never completes while none does (nor with no
    /// task at all). Tasks that ended at once (one closed the other's
    /// input) are reported as the one that ended first.
    pub async fn stopped(&mut self) -> Stopped {
        let Some(first) = self.set.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let mut first = self.exit_of(first);
        // Give the tasks that the first one's end woke a moment to finish.
        tokio::task::yield_now().await;
        while let Some(next) = self.set.try_join_next_with_id() {
            let next = self.exit_of(next);
            if next.order < first.order {
                first = next;
            }
        }
        Stopped {
            task: first.task,
            ended: first.ended,
        }
    }

    fn exit_of(&self, joined: Result<(tokio::task::Id, Exit), tokio::task::JoinError>) -> Exit {
        match joined {
            Ok((_, exit)) => exit,
            // Only an abort gets here (the panic is caught inside): none is
            // made before `shutdown`.
            Err(e) => Exit {
                task: self.names.get(&e.id()).copied().unwrap_or("unknown"),
                order: u64::MAX,
                ended: Ended::Panicked(e.to_string()),
            },
        }
    }

    /// Ends every task still running.
    pub async fn shutdown(mut self) {
        self.set.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_returns_is_named_and_said_to_have_returned() {
        let mut s = Supervisor::new();
        s.spawn("forever", std::future::pending());
        s.spawn("feed", async {});
        let stopped = s.stopped().await;
        assert_eq!(
            stopped,
            Stopped {
                task: "feed",
                ended: Ended::Returned
            }
        );
        assert_eq!(stopped.to_string(), "the feed task returned");
        s.shutdown().await;
    }

    #[tokio::test]
    async fn a_panic_is_named_with_its_message() {
        let mut s = Supervisor::new();
        s.spawn("forever", std::future::pending());
        s.spawn("registry", async { panic!("the catalog broke") });
        let stopped = s.stopped().await;
        assert_eq!(stopped.task, "registry");
        assert_eq!(
            stopped.to_string(),
            "the registry task panicked: the catalog broke"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_task_that_ends_because_another_did_is_not_the_one_named() {
        for _ in 0..50 {
            let mut s = Supervisor::new();
            let (tx, mut rx) = tokio::sync::mpsc::channel::<()>(1);
            let (go, wait) = tokio::sync::oneshot::channel::<()>();
            // The reader ends as soon as the writer's sender is dropped.
            s.spawn("reader", async move { while rx.recv().await.is_some() {} });
            s.spawn("writer", async move {
                let _tx = tx;
                let _ = wait.await;
                panic!("the writer broke");
            });
            go.send(()).unwrap();
            assert_eq!(s.stopped().await.task, "writer");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_task_nothing_stops() {
        let mut s = Supervisor::new();
        let waited = tokio::time::timeout(std::time::Duration::from_secs(3600), s.stopped()).await;
        assert!(waited.is_err());
    }

    #[tokio::test]
    async fn shutdown_ends_the_tasks_still_running() {
        let mut s = Supervisor::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        s.spawn("holder", async move {
            let _tx = tx;
            std::future::pending::<()>().await
        });
        assert_eq!(s.names().collect::<Vec<_>>(), vec!["holder"]);
        s.shutdown().await;
        assert!(rx.await.is_err(), "the task was dropped");
    }
}
