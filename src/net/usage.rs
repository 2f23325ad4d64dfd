//! What each admitted connection is used for, as the requests on it show:
//! [`ConnUse`] is shared by the connection's stream (which closes it at a
//! deadline or when it is evicted), its [`super::Admission`] (which may
//! evict it) and [`Track`], the tower service around hdsd's routes that
//! marks it used.
//!
//! A connection is *authenticated* once a request on it is answered with
//! success: an HTTP status below 400 and no gRPC error in the response
//! headers. Every route that takes a credential checks it before it
//! answers (an HDS or EDS stream's token, `api.tokens`), so a connection
//! that only sent bad or no credentials never is; a route open to all
//! (`/healthz`, the gRPC health service) counts. A request is *open* from
//! the moment hdsd takes it until its response body ends or is dropped: an
//! HDS, EDS or Watch stream stays open for its life, however quiet.
//! HTTP/2 PINGs, SETTINGS and WINDOW_UPDATEs are neither: hdsd's own
//! keepalive cannot keep a connection in use.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};

use tokio::time::Instant;

use super::slots::{Refusal, SlotId};

/// One admitted connection's use.
#[derive(Debug)]
pub struct ConnUse {
    pub(super) slot: SlotId,
    pub(super) accepted: Instant,
    /// To tell the slots when the connection authenticates.
    pub(super) admission: Weak<super::Admission>,
    state: Mutex<UseState>,
}

#[derive(Debug)]
pub(super) struct UseState {
    pub authenticated: bool,
    pub open_requests: usize,
    /// When the last open request ended (at first: the accept).
    pub quiet_since: Instant,
    /// Evicted for a newcomer: closed at once.
    pub evicted: Option<Refusal>,
    /// The task that closes the connection, woken on every change.
    waker: Option<Waker>,
}

impl UseState {
    pub(super) fn new(accepted: Instant) -> UseState {
        UseState {
            authenticated: false,
            open_requests: 0,
            quiet_since: accepted,
            evicted: None,
            waker: None,
        }
    }
}

impl ConnUse {
    pub(super) fn new(slot: SlotId, admission: Weak<super::Admission>) -> ConnUse {
        let now = Instant::now();
        ConnUse {
            slot,
            accepted: now,
            admission,
            state: Mutex::new(UseState::new(now)),
        }
    }

    #[cfg(test)]
    pub(super) fn lock_state_evicted(&self) -> bool {
        self.lock().evicted.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, UseState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the state and wakes the connection's task.
    fn change(&self, f: impl FnOnce(&mut UseState)) {
        let waker = {
            let mut state = self.lock();
            f(&mut state);
            state.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// Reads the state and registers `cx` to be woken on its next change.
    pub(super) fn watch<T>(&self, cx: &Context<'_>, f: impl FnOnce(&UseState) -> T) -> T {
        let mut state = self.lock();
        match &state.waker {
            Some(w) if w.will_wake(cx.waker()) => {}
            _ => state.waker = Some(cx.waker().clone()),
        }
        f(&state)
    }

    pub(super) fn evict(&self, why: Refusal) {
        self.change(|s| s.evicted = Some(why));
    }

    /// Resolves when the connection is evicted (while its TLS handshake runs).
    pub(super) fn evicted(&self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| match self.watch(cx, |s| s.evicted.is_some()) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
    }

    pub fn is_authenticated(&self) -> bool {
        self.lock().authenticated
    }

    fn request_started(self: &Arc<Self>) -> OpenRequest {
        self.lock().open_requests += 1;
        OpenRequest(self.clone())
    }

    fn authenticated(&self) {
        let first = {
            let mut state = self.lock();
            !std::mem::replace(&mut state.authenticated, true)
        };
        if first {
            if let Some(admission) = self.admission.upgrade() {
                admission.authenticated(self.slot);
            }
            self.change(|_| {});
        }
    }
}

/// One open request; it ends when this is dropped.
#[derive(Debug)]
struct OpenRequest(Arc<ConnUse>);

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.change(|s| {
            s.open_requests = s.open_requests.saturating_sub(1);
            s.quiet_since = Instant::now();
        });
    }
}

/// Whether a response shows the request was accepted (see the module).
fn succeeded<B>(response: &http::Response<B>) -> bool {
    let status = response.status();
    (status.is_success() || status.is_redirection() || status.is_informational())
        && response
            .headers()
            .get("grpc-status")
            .is_none_or(|v| v.as_bytes() == b"0")
}

/// Where [`Track`] finds the connection of a request.
#[derive(Debug, Clone)]
enum Source {
    /// Known when the service was made for one connection (the API).
    Conn(Arc<ConnUse>),
    /// Looked up by the peer's address (tonic makes one service for all
    /// connections; each request carries its connection's address).
    Admission(Arc<super::Admission>),
}

/// The tower service that marks the connection of each request in use; see
/// the module.
#[derive(Debug, Clone)]
pub struct Track<S> {
    inner: S,
    source: Source,
}

impl<S> Track<S> {
    /// Around a service made for one connection.
    pub fn conn(inner: S, conn: Arc<ConnUse>) -> Track<S> {
        Track {
            inner,
            source: Source::Conn(conn),
        }
    }
}

/// The layer of a tonic server whose connections `admission` admits.
#[derive(Debug, Clone)]
pub struct TrackLayer(pub Arc<super::Admission>);

impl<S> tower::Layer<S> for TrackLayer {
    type Service = Track<S>;

    fn layer(&self, inner: S) -> Track<S> {
        Track {
            inner,
            source: Source::Admission(self.0.clone()),
        }
    }
}

/// The peer address tonic records in a request's extensions.
fn peer_of<B>(request: &http::Request<B>) -> Option<SocketAddr> {
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let ext = request.extensions();
    ext.get::<TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
        .or_else(|| {
            ext.get::<TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        })
}

impl<S, ReqBody, ResBody> tower::Service<http::Request<ReqBody>> for Track<S>
where
    S: tower::Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Tracked<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let conn = match &self.source {
            Source::Conn(c) => Some(c.clone()),
            Source::Admission(a) => peer_of(&request).and_then(|p| a.conn_of(p)),
        };
        let open = conn.as_ref().map(|c| c.request_started());
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if let Some(conn) = &conn {
                if succeeded(&response) {
                    conn.authenticated();
                }
            }
            Ok(response.map(|body| Tracked {
                inner: Box::pin(body),
                _open: open,
            }))
        })
    }
}

/// A response body that holds its request open until it ends.
pub struct Tracked<B> {
    inner: Pin<Box<B>>,
    _open: Option<OpenRequest>,
}

impl<B: http_body::Body> http_body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let r = self.inner.as_mut().poll_frame(cx);
        if matches!(r, Poll::Ready(None)) {
            self._open = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that must end by a deadline (the API's
/// `body_read_timeout`): past it, reading fails and the connection is
/// closed after the answer (the rest of the body is never read).
pub struct Deadline<B> {
    inner: Pin<Box<B>>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    listener: &'static str,
}

impl<B> Deadline<B> {
    pub fn new(inner: B, timeout: std::time::Duration, listener: &'static str) -> Deadline<B> {
        Deadline {
            inner: Box::pin(inner),
            deadline: Box::pin(tokio::time::sleep(timeout)),
            listener,
        }
    }
}

/// The error of a body that did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within body_read_timeout")]
pub struct BodyTimedOut;

impl<B> http_body::Body for Deadline<B>
where
    B: http_body::Body,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = B::Data;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        match self.inner.as_mut().poll_frame(cx) {
            Poll::Ready(r) => Poll::Ready(r.map(|f| f.map_err(Into::into))),
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    crate::metrics::connection_timed_out(self.listener, "body");
                    Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body as _;

    /// A body that never sends anything (a trickling client's, at its worst).
    struct Silent;

    impl http_body::Body for Silent {
        type Data = axum::body::Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<axum::body::Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_not_in_by_its_deadline_fails() {
        let started = Instant::now();
        let mut body = Box::pin(Deadline::new(
            Silent,
            std::time::Duration::from_secs(3),
            "test",
        ));
        let frame = std::future::poll_fn(|cx| body.as_mut().poll_frame(cx)).await;
        let e = frame.expect("an error frame").unwrap_err();
        assert!(e.is::<BodyTimedOut>(), "{e}");
        assert_eq!(started.elapsed(), std::time::Duration::from_secs(3));
    }

    #[test]
    fn success_is_a_2xx_or_3xx_without_a_grpc_error() {
        let ok = http::Response::builder().status(200).body(()).unwrap();
        assert!(succeeded(&ok));
        let refused = http::Response::builder().status(401).body(()).unwrap();
        assert!(!succeeded(&refused));
        let not_found = http::Response::builder().status(404).body(()).unwrap();
        assert!(!succeeded(&not_found));
        let grpc_refused = http::Response::builder()
            .status(200)
            .header("grpc-status", "16")
            .body(())
            .unwrap();
        assert!(!succeeded(&grpc_refused));
        let grpc_ok = http::Response::builder()
            .status(200)
            .header("grpc-status", "0")
            .body(())
            .unwrap();
        assert!(succeeded(&grpc_ok));
    }
}
