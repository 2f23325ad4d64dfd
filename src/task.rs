//! Long-lived tasks as their owners hand them over, and a panic caught as a
//! value.
//!
//! The owner of a long-lived task (the feed, the readiness store's writer,
//! the registry, the EDS index...) does not spawn it: it returns the task
//! beside its handle, and the server spawns it, under a name, into the one
//! set it supervises (`server::supervisor`). A task there that ends or
//! panics stops the process (crash-only). Work of one dataplane or of one
//! zone's stream is spawned by its owner, and a panic in it is caught
//! ([`catch_panic`]) and contained: that dataplane or stream is marked
//! failed, the rest is served.

pub mod fault;

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A long-lived task, boxed: what the server spawns and watches.
pub type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Boxes `future` as a [`Task`].
pub fn task(future: impl Future<Output = ()> + Send + 'static) -> Task {
    Box::pin(future)
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Its future completed.
    Returned,
    /// It panicked, with this message.
    Panicked(String),
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Ended::Returned => f.write_str("returned"),
            Ended::Panicked(message) => write!(f, "panicked: {message}"),
        }
    }
}

/// The message of a panic's payload (`panic!` with a literal or a format).
pub fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// `future`, with a panic while it is polled turned into `Err(message)`.
/// The future is dropped right after the panic, so whatever it held
/// (channels, handles) closes as it would have.
pub fn catch_panic<F: Future>(future: F) -> CatchPanic<F> {
    CatchPanic {
        inner: Some(Box::pin(future)),
    }
}

/// See [`catch_panic`].
pub struct CatchPanic<F> {
    inner: Option<Pin<Box<F>>>,
}

impl<F: Future> Future for CatchPanic<F> {
    type Output = Result<F::Output, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(Err("polled after it ended".to_string()));
        };
        let polled =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| inner.as_mut().poll(cx)));
        match polled {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => {
                self.inner = None;
                Poll::Ready(Ok(output))
            }
            Err(payload) => {
                self.inner = None;
                Poll::Ready(Err(panic_message(&*payload)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_future_that_completes_gives_its_output() {
        assert_eq!(catch_panic(async { 7 }).await, Ok(7));
    }

    #[tokio::test]
    async fn a_panic_becomes_its_message() {
        let literal = catch_panic(async { panic!("the feed broke") }).await;
        assert_eq!(literal, Err::<(), _>("the feed broke".to_string()));
        let n = 3;
        let formatted = catch_panic(async move { panic!("overflow at {n}") }).await;
        assert_eq!(formatted, Err::<(), _>("overflow at 3".to_string()));
    }

    #[tokio::test]
    async fn a_panic_after_a_wait_is_caught_and_drops_what_the_future_held() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (held, mut closed) = tokio::sync::mpsc::channel::<()>(1);
        let caught = tokio::spawn(catch_panic(async move {
            let _held = held;
            let _ = rx.await;
            panic!("after the wait");
        }));
        tx.send(()).unwrap();
        assert_eq!(
            caught.await.unwrap(),
            Err::<(), _>("after the wait".to_string())
        );
        assert!(closed.recv().await.is_none(), "the sender was dropped");
    }

    #[test]
    fn a_payload_without_a_message_says_so() {
        assert_eq!(panic_message(&42u8), "a panic without a message");
    }

    #[test]
    fn ended_reads_as_a_sentence_end() {
        assert_eq!(Ended::Returned.to_string(), "returned");
        assert_eq!(Ended::Panicked("boom".into()).to_string(), "panicked: boom");
    }
}
