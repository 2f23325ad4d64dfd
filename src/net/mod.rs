//! Connection admission for hdsd's listeners: the one accept loop behind the
//! HDS and the API listeners, plaintext or TLS.
//!
//! - [`Admission`] holds the listener's slots ([`slots::Slots`]): connections
//!   in total and per source IP. A newcomer that finds a cap reached evicts
//!   a connection that has not authenticated (the rule: [`slots`]); it is
//!   refused (closed at once, counted in
//!   `hdsd_connections_refused_total`) only when every connection in the way
//!   has authenticated.
//! - Every admitted connection is an [`Admitted`]: it holds its [`Permit`]
//!   (the slot is freed when the connection is dropped or evicted) and its
//!   [`usage::ConnUse`], and is closed: when the client has not completed the
//!   TLS handshake and sent the HTTP/2 preface (or the first bytes of an
//!   HTTP/1 request) by the handshake deadline; when it has not
//!   authenticated within `unauthenticated_timeout` of its accept; when no
//!   request has been open on it for `idle_timeout` (PINGs do not count);
//!   when it is evicted.
//! - [`usage::Track`] marks a connection authenticated and its requests open;
//!   [`serve_http`] puts it around the API's router, [`usage::TrackLayer`]
//!   around a tonic server's routes.
//! - The accept loop backs off when the process runs out of file
//!   descriptors (`EMFILE`/`ENFILE`) instead of retrying at once, which would
//!   spin a core while the backlog cannot be drained.
//! - [`LogLimiter`] keeps a flood of refusals from one peer from flooding the
//!   log: metrics count every refusal, the log says a few of them.

pub mod budget;
pub mod slots;
pub mod usage;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};

use crate::metrics as m;
pub use slots::Refusal;
use slots::{SlotId, Slots};
pub use usage::{ConnUse, TrackLayer};

/// The limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Connections open at once, from everyone.
    pub max_connections: usize,
    /// Connections open at once from one source IP address.
    pub max_connections_per_ip: usize,
    /// From accept to the end of the TLS handshake and the HTTP/2 preface
    /// (or the first bytes of an HTTP/1 request).
    pub handshake_timeout: Duration,
    /// From accept to the first request answered with success (see
    /// [`usage`]); a connection that has not authenticated by then is
    /// closed. `None`: never (a listener whose routes are not tracked).
    pub unauthenticated_timeout: Option<Duration>,
    /// A connection with no request open for this long is closed.
    pub idle_timeout: Option<Duration>,
}

/// The open connections of one listener, against its caps.
#[derive(Debug)]
pub struct Admission {
    listener: &'static str,
    limits: ConnectionLimits,
    inner: Mutex<Held>,
}

#[derive(Debug)]
struct Held {
    slots: Slots,
    conns: HashMap<SlotId, (SocketAddr, Arc<ConnUse>)>,
    by_peer: HashMap<SocketAddr, SlotId>,
}

/// A connection evicted to admit a newcomer.
#[derive(Debug, Clone, Copy)]
pub struct Eviction {
    pub peer: SocketAddr,
    pub reason: Refusal,
}

impl Admission {
    /// `listener` names it in metrics and logs (`hds`, `api`).
    pub fn new(listener: &'static str, limits: ConnectionLimits) -> Arc<Admission> {
        Arc::new(Admission {
            listener,
            limits,
            inner: Mutex::new(Held {
                slots: Slots::new(limits.max_connections, limits.max_connections_per_ip),
                conns: HashMap::new(),
                by_peer: HashMap::new(),
            }),
        })
    }

    pub fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A permit for one more connection from `peer`: a free slot, or one
    /// taken from a connection that has not authenticated ([`slots`]; it
    /// is closed); refused when every connection in the way has.
    pub fn try_admit(
        self: &Arc<Self>,
        peer: SocketAddr,
    ) -> Result<(Permit, Option<Eviction>), Refusal> {
        let ip = canonical(peer.ip());
        let mut held = self.lock();
        let admitted = held.slots.admit(ip)?;
        let conn = Arc::new(ConnUse::new(admitted.id, Arc::downgrade(self)));
        held.conns.insert(admitted.id, (peer, conn.clone()));
        held.by_peer.insert(peer, admitted.id);
        let evicted = admitted.evicted.and_then(|(victim, reason)| {
            let (peer, conn) = held.conns.remove(&victim)?;
            held.by_peer.remove(&peer);
            Some((peer, conn, reason))
        });
        drop(held);
        m::connection_opened(self.listener);
        let eviction = evicted.map(|(peer, conn, reason)| {
            m::connection_closed(self.listener);
            m::connection_evicted(self.listener, reason.as_str());
            conn.evict(reason);
            Eviction { peer, reason }
        });
        Ok((
            Permit {
                admission: self.clone(),
                conn,
            },
            eviction,
        ))
    }

    /// Connections open now (total, and from `ip`).
    pub fn open(&self, ip: IpAddr) -> (usize, usize) {
        self.lock().slots.open(canonical(ip))
    }

    /// The use of the connection from `peer`, while it holds a slot.
    pub fn conn_of(&self, peer: SocketAddr) -> Option<Arc<ConnUse>> {
        let held = self.lock();
        let id = held.by_peer.get(&peer)?;
        held.conns.get(id).map(|(_, c)| c.clone())
    }

    fn authenticated(&self, slot: SlotId) {
        self.lock().slots.authenticated(slot);
    }

    fn release(&self, slot: SlotId) {
        let mut held = self.lock();
        if !held.slots.release(slot) {
            return; // evicted: released then
        }
        if let Some((peer, _)) = held.conns.remove(&slot) {
            held.by_peer.remove(&peer);
        }
        drop(held);
        m::connection_closed(self.listener);
    }
}

/// An IPv4 client on a dual-stack socket counts as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// One admitted connection's slot; freed on drop.
#[derive(Debug)]
pub struct Permit {
    admission: Arc<Admission>,
    conn: Arc<ConnUse>,
}

impl Permit {
    /// The connection's use.
    pub fn conn(&self) -> &Arc<ConnUse> {
        &self.conn
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.admission.release(self.conn.slot);
    }
}

/// The HTTP/2 connection preface every HTTP/2 client sends first.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What the client has sent of the start of its protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefaceProgress {
    matched: usize,
}

impl PrefaceProgress {
    /// Takes the next bytes read; true once the start is complete: the whole
    /// HTTP/2 preface, or bytes that are not the preface (then it is HTTP/1,
    /// or garbage that the protocol layer refuses at once).
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        for &b in bytes {
            if b != H2_PREFACE[self.matched] {
                return true;
            }
            self.matched += 1;
            if self.matched == H2_PREFACE.len() {
                return true;
            }
        }
        false
    }
}

/// An admitted connection: the stream, its permit, and its deadlines.
pub struct Admitted<IO> {
    io: IO,
    permit: Permit,
    listener: &'static str,
    limits: ConnectionLimits,
    /// Until the protocol's start is read.
    preface: Option<(PrefaceProgress, Pin<Box<Sleep>>)>,
    /// The next time the connection's use is checked against its deadlines.
    check: Pin<Box<Sleep>>,
    /// Why it was closed, once it was (every later read or write fails too).
    closed: Option<&'static str>,
}

impl<IO> std::fmt::Debug for Admitted<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("listener", &self.listener)
            .field("awaiting_preface", &self.preface.is_some())
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

/// What the use of a connection says now: closed (and why), or the next
/// time to look again (none while a request is open on an authenticated
/// connection: the end of a request wakes the connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UseCheck {
    Close(&'static str),
    Next(Option<Instant>),
}

fn check_use(
    state: &usage::UseState,
    accepted: Instant,
    limits: &ConnectionLimits,
    now: Instant,
) -> UseCheck {
    if state.evicted.is_some() {
        return UseCheck::Close("evicted");
    }
    let mut next = None;
    if let (false, Some(timeout)) = (state.authenticated, limits.unauthenticated_timeout) {
        let grace = accepted + timeout;
        if now >= grace {
            return UseCheck::Close("unauthenticated");
        }
        next = Some(grace);
    }
    if let (0, Some(idle)) = (state.open_requests, limits.idle_timeout) {
        let at = state.quiet_since + idle;
        if now >= at {
            return UseCheck::Close("idle");
        }
        next = Some(next.map_or(at, |n: Instant| n.min(at)));
    }
    UseCheck::Next(next)
}

impl<IO> Admitted<IO> {
    fn new(
        io: IO,
        permit: Permit,
        listener: &'static str,
        deadline: Instant,
        limits: ConnectionLimits,
    ) -> Self {
        Admitted {
            io,
            permit,
            listener,
            limits,
            preface: Some((
                PrefaceProgress::default(),
                Box::pin(tokio::time::sleep_until(deadline)),
            )),
            check: Box::pin(tokio::time::sleep_until(deadline)),
            closed: None,
        }
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }

    /// The connection's use (what [`usage::Track`] marks).
    pub fn conn(&self) -> &Arc<ConnUse> {
        self.permit.conn()
    }

    /// Err once the connection must close: evicted, not authenticated in
    /// time, or idle; otherwise arms the timer (and the wake on a change).
    fn poll_use(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if let Some(why) = self.closed {
            return Err(closed_error(why));
        }
        loop {
            let conn = self.permit.conn().clone();
            let verdict = conn.watch(cx, |state| {
                check_use(state, conn.accepted, &self.limits, Instant::now())
            });
            match verdict {
                UseCheck::Close(why) => {
                    self.closed = Some(why);
                    if why != "evicted" {
                        m::connection_timed_out(self.listener, why);
                    }
                    return Err(closed_error(why));
                }
                UseCheck::Next(None) => return Ok(()),
                UseCheck::Next(Some(at)) => {
                    if self.check.deadline() != at {
                        self.check.as_mut().reset(at);
                    }
                    if self.check.as_mut().poll(cx).is_pending() {
                        return Ok(());
                    }
                }
            }
        }
    }
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what.to_string())
}

fn closed_error(why: &str) -> io::Error {
    match why {
        "evicted" => io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "evicted: a newcomer needed the slot of this connection, which had not authenticated",
        ),
        "unauthenticated" => {
            timed_out("no request with a valid credential within unauthenticated_timeout")
        }
        _ => timed_out("no request open within idle_timeout"),
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Admitted<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if let Err(e) = this.poll_use(cx) {
            return Poll::Ready(Err(e));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let new = &buf.filled()[before..];
                if let Some((progress, _)) = &mut this.preface {
                    if new.is_empty() || progress.feed(new) {
                        this.preface = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if let Some((_, deadline)) = &mut this.preface {
                    if deadline.as_mut().poll(cx).is_ready() {
                        this.preface = None;
                        m::connection_timed_out(this.listener, "handshake");
                        return Poll::Ready(Err(timed_out(
                            "the client did not start HTTP within the handshake timeout",
                        )));
                    }
                }
                Poll::Pending
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Admitted<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Err(e) = self.poll_use(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Err(e) = self.poll_use(cx) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Admitted<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// Turns an accepted TCP connection into the listener's stream (plaintext:
/// as it is; TLS: after the handshake, which must end by `deadline`).
pub trait Handshake: Clone + Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// The established stream, or `None` (the failure is logged here).
    fn handshake(
        &self,
        tcp: TcpStream,
        peer: SocketAddr,
        deadline: Instant,
    ) -> impl Future<Output = Option<Self::Io>> + Send;
}

/// Plaintext: the TCP stream itself.
#[derive(Debug, Clone, Copy)]
pub struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;

    async fn handshake(&self, tcp: TcpStream, _: SocketAddr, _: Instant) -> Option<TcpStream> {
        Some(tcp)
    }
}

/// Admitted connections waiting to be taken by the server.
const READY_QUEUE: usize = 64;

/// The admitted connections of one listening socket.
///
/// As a [`Stream`](tokio_stream::Stream) it is the `incoming` of tonic's
/// `Server::serve_with_incoming_shutdown` (it never yields an error: refused
/// and failed connections are counted and skipped). It is also an
/// [`axum::serve::Listener`]. Dropping it closes the listening socket and
/// abandons handshakes in progress.
pub struct Incoming<IO> {
    local_addr: SocketAddr,
    ready: mpsc::Receiver<(Admitted<IO>, SocketAddr)>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl<IO> std::fmt::Debug for Incoming<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl<IO: Send + 'static> Incoming<IO> {
    /// Accepts on `listener` under `admission`. Must be called within a
    /// tokio runtime.
    pub fn new<H: Handshake<Io = IO>>(
        listener: TcpListener,
        admission: Arc<Admission>,
        handshake: H,
    ) -> io::Result<Incoming<IO>> {
        let local_addr = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        let acceptor = tokio::spawn(accept_loop(listener, admission, handshake, tx));
        Ok(Incoming {
            local_addr,
            ready,
            acceptor,
        })
    }

    /// The address the listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The next admitted connection and its peer address.
    pub async fn accept(&mut self) -> (Admitted<IO>, SocketAddr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop only ends when this listener is dropped, or if
            // it panicked: then no connection will ever come.
            None => std::future::pending().await,
        }
    }
}

impl<IO> Drop for Incoming<IO> {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl<IO> tokio_stream::Stream for Incoming<IO> {
    type Item = Result<Admitted<IO>, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.ready.poll_recv(cx) {
            Poll::Ready(Some((stream, _))) => Poll::Ready(Some(Ok(stream))),
            // See `accept`: never end the stream of connections.
            Poll::Ready(None) | Poll::Pending => Poll::Pending,
        }
    }
}

impl<IO> axum::serve::Listener for Incoming<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Io = Admitted<IO>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        Incoming::accept(self).await
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

/// Pauses after accept errors that a retry cannot fix at once: 10 ms,
/// doubling up to 1 s; reset by the next successful accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
}

impl Backoff {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    pub fn new() -> Backoff {
        Backoff { next: Self::FIRST }
    }

    /// The pause to take now.
    pub fn pause(&mut self) -> Duration {
        let pause = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        pause
    }

    pub fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether an accept error means the process or the system is out of file
/// descriptors (`EMFILE`, `ENFILE`) or memory for sockets.
pub fn is_resource_exhaustion(e: &io::Error) -> bool {
    // EMFILE 24, ENFILE 23, ENOBUFS 105, ENOMEM 12 (Linux).
    matches!(e.raw_os_error(), Some(24 | 23 | 105 | 12))
}

async fn accept_loop<H: Handshake>(
    listener: TcpListener,
    admission: Arc<Admission>,
    handshake: H,
    ready: mpsc::Sender<(Admitted<H::Io>, SocketAddr)>,
) {
    let name = admission.listener;
    let limits = admission.limits;
    let mut handshakes = JoinSet::new();
    let mut backoff = Backoff::new();
    let mut refusals = LogLimiter::new(REFUSAL_LOG);
    let mut errors = LogLimiter::new(REFUSAL_LOG);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    backoff.reset();
                    let (permit, eviction) = match admission.try_admit(peer) {
                        Ok(admitted) => admitted,
                        Err(refusal) => {
                            m::connection_refused(name, refusal.as_str());
                            if let Some(suppressed) = refusals.allow(peer.ip(), Instant::now()) {
                                let (open, from_ip) = admission.open(peer.ip());
                                tracing::warn!(
                                    listener = name,
                                    %peer,
                                    open,
                                    from_this_ip = from_ip,
                                    suppressed,
                                    "connection refused: {} reached ({}) and every connection in the way has authenticated; raise {name}.limits.{} if this client is legitimate",
                                    refusal.as_str(),
                                    match refusal {
                                        Refusal::Total => limits.max_connections,
                                        Refusal::PerIp => limits.max_connections_per_ip,
                                    },
                                    refusal.as_str(),
                                );
                            }
                            continue;
                        }
                    };
                    if let Some(evicted) = eviction {
                        if let Some(suppressed) = refusals.allow(evicted.peer.ip(), Instant::now()) {
                            tracing::info!(
                                listener = name,
                                evicted = %evicted.peer,
                                for_peer = %peer,
                                suppressed,
                                "closed a connection that had not authenticated to admit a newcomer: {name}.limits.{} reached",
                                evicted.reason.as_str(),
                            );
                        }
                    }
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                    }
                    let deadline = Instant::now() + limits.handshake_timeout;
                    let ready = ready.clone();
                    let handshake = handshake.clone();
                    handshakes.spawn(async move {
                        let conn = permit.conn().clone();
                        let io = tokio::select! {
                            io = handshake.handshake(tcp, peer, deadline) => io,
                            () = conn.evicted() => None,
                        };
                        if let Some(io) = io {
                            let admitted = Admitted::new(io, permit, name, deadline, limits);
                            let _ = ready.send((admitted, peer)).await;
                        }
                    });
                }
                Err(e) => {
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) {
                        continue;
                    }
                    let exhausted = is_resource_exhaustion(&e);
                    m::accept_error(name, if exhausted { "out_of_file_descriptors" } else { "other" });
                    let pause = backoff.pause();
                    let key = IpAddr::from([0, 0, 0, 0]);
                    if let Some(suppressed) = errors.allow(key, Instant::now()) {
                        if exhausted {
                            tracing::error!(
                                listener = name,
                                error = %e,
                                suppressed,
                                "cannot accept connections: out of file descriptors; retrying in {pause:?}. Raise the open-file limit (LimitNOFILE= in the systemd unit, ulimit -n) or lower {name}.limits.max_connections"
                            );
                        } else {
                            tracing::error!(listener = name, error = %e, suppressed, "accepting a TCP connection failed; retrying in {pause:?}");
                        }
                    }
                    tokio::time::sleep(pause).await;
                }
            },
            // Reap finished handshakes so the set does not grow.
            Some(_) = handshakes.join_next(), if !handshakes.is_empty() => {}
            () = ready.closed() => return,
        }
    }
}

/// How the API listener serves HTTP on its admitted connections.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// HTTP/1: how long a request's headers may take, from the connection's
    /// start or the end of the previous response.
    pub header_read_timeout: Duration,
    /// How long a request's body may take to arrive, from the end of its
    /// headers (HTTP/1 and HTTP/2; not gRPC, whose request bodies are
    /// streams).
    pub body_read_timeout: Duration,
    /// HTTP/2: concurrent streams per connection.
    pub max_streams_per_connection: u32,
    /// HTTP/2: pings on an idle connection, and how long one may go unanswered.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
    /// What the request bodies count against.
    pub budget: Arc<budget::MemoryBudget>,
}

/// Serves `router` on every connection of `incoming` (HTTP/1.1 and HTTP/2)
/// until `signal`, then lets the open connections finish their requests.
/// axum's own `serve` sets no header-read timeout; this does, and a
/// deadline on each request's body, and tracks each connection's use
/// ([`usage::Track`]).
pub async fn serve_http<IO>(
    mut incoming: Incoming<IO>,
    router: axum::Router,
    options: HttpOptions,
    signal: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::service::TowerToHyperService;

    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(options.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(options.max_streams_per_connection)
        .max_pending_accept_reset_streams(H2_MAX_PENDING_RESETS)
        .max_local_error_reset_streams(H2_MAX_LOCAL_RESETS)
        .keep_alive_interval(options.keepalive_interval)
        .keep_alive_timeout(options.keepalive_timeout)
        .enable_connect_protocol();
    let builder = Arc::new(builder);
    // Each connection holds a receiver; shutdown waits until all are dropped.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::pin!(signal);
    loop {
        let (io, peer) = tokio::select! {
            conn = incoming.accept() => conn,
            () = &mut signal => break,
        };
        let body_timeout = options.body_read_timeout;
        let client_budget = options.budget.clone();
        let routes = tower::ServiceExt::map_request(
            router.clone(),
            move |request: http::Request<hyper::body::Incoming>| {
                let grpc = request
                    .headers()
                    .get(http::header::CONTENT_TYPE)
                    .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
                request.map(|body| match grpc {
                    true => axum::body::Body::new(budget::Held::grpc(body, &client_budget)),
                    false => axum::body::Body::new(budget::Held::whole(
                        usage::Deadline::new(body, body_timeout, "api"),
                        &client_budget,
                    )),
                })
            },
        );
        let service = TowerToHyperService::new(usage::Track::conn(routes, io.conn().clone()));
        let builder = builder.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
            tokio::pin!(conn);
            let mut stopping = false;
            loop {
                tokio::select! {
                    r = conn.as_mut() => {
                        if let Err(e) = r {
                            tracing::debug!(%peer, error = %e, "API connection ended with an error");
                        }
                        break;
                    }
                    _ = stop.wait_for(|s| *s), if !stopping => {
                        stopping = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(stop);
        });
    }
    drop(incoming);
    let _ = stop_tx.send(true);
    drop(stop_rx);
    stop_tx.closed().await;
    Ok(())
}

/// h2's protection against reset floods (CVE-2023-44487, "rapid reset"):
/// streams the client opened and reset before hdsd accepted them, and streams
/// hdsd reset for protocol errors, before the connection gets a GOAWAY.
pub const H2_MAX_PENDING_RESETS: usize = 20;
pub const H2_MAX_LOCAL_RESETS: usize = 1024;

/// How often one key may log: lines per window.
#[derive(Debug, Clone, Copy)]
pub struct LogRate {
    pub lines: u32,
    pub window: Duration,
    /// Keys tracked at most; beyond, every new key shares one budget.
    pub max_keys: usize,
}

/// Refusals: 5 lines per peer per minute.
pub const REFUSAL_LOG: LogRate = LogRate {
    lines: 5,
    window: Duration::from_secs(60),
    max_keys: 4096,
};

/// Rate-limits log lines per peer address.
#[derive(Debug)]
pub struct LogLimiter {
    rate: LogRate,
    keys: HashMap<IpAddr, Window>,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    start: Instant,
    lines: u32,
    suppressed: u64,
}

/// The key that new peers share once `max_keys` are tracked.
const OVERFLOW_KEY: IpAddr = IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED);

impl LogLimiter {
    pub fn new(rate: LogRate) -> LogLimiter {
        LogLimiter {
            rate,
            keys: HashMap::new(),
        }
    }

    /// Whether to log this event for `key` now: `Some(n)` where `n` is how
    /// many were suppressed since the last line logged for it, or `None`.
    pub fn allow(&mut self, key: IpAddr, now: Instant) -> Option<u64> {
        let mut key = canonical(key);
        if !self.keys.contains_key(&key) && self.keys.len() >= self.rate.max_keys {
            let window = self.rate.window;
            self.keys
                .retain(|_, w| now.duration_since(w.start) < window);
            if self.keys.len() >= self.rate.max_keys {
                key = OVERFLOW_KEY;
            }
        }
        let w = self.keys.entry(key).or_insert(Window {
            start: now,
            lines: 0,
            suppressed: 0,
        });
        if now.duration_since(w.start) >= self.rate.window {
            w.start = now;
            w.lines = 0;
        }
        if w.lines < self.rate.lines {
            w.lines += 1;
            let suppressed = std::mem::take(&mut w.suppressed);
            Some(suppressed)
        } else {
            w.suppressed += 1;
            None
        }
    }
}

/// A [`LogLimiter`] shared by tasks (the HDS streams' refusals).
#[derive(Debug)]
pub struct SharedLogLimiter(Mutex<LogLimiter>);

impl SharedLogLimiter {
    pub fn new(rate: LogRate) -> SharedLogLimiter {
        SharedLogLimiter(Mutex::new(LogLimiter::new(rate)))
    }

    pub fn allow(&self, key: Option<IpAddr>, now: Instant) -> Option<u64> {
        let key = key.unwrap_or(OVERFLOW_KEY);
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allow(key, now)
    }
}

impl From<&crate::config::HdsLimits> for ConnectionLimits {
    fn from(l: &crate::config::HdsLimits) -> Self {
        ConnectionLimits {
            max_connections: l.max_connections,
            max_connections_per_ip: l.max_connections_per_ip,
            handshake_timeout: l.handshake_timeout,
            unauthenticated_timeout: Some(l.unauthenticated_timeout),
            idle_timeout: Some(l.idle_timeout),
        }
    }
}

impl From<&crate::config::ApiLimits> for ConnectionLimits {
    fn from(l: &crate::config::ApiLimits) -> Self {
        ConnectionLimits {
            max_connections: l.max_connections,
            max_connections_per_ip: l.max_connections_per_ip,
            handshake_timeout: l.handshake_timeout,
            unauthenticated_timeout: Some(l.unauthenticated_timeout),
            idle_timeout: Some(l.idle_timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limits(total: usize, per_ip: usize) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: total,
            max_connections_per_ip: per_ip,
            handshake_timeout: Duration::from_secs(10),
            unauthenticated_timeout: None,
            idle_timeout: None,
        }
    }

    fn peer(ip: &str, port: u16) -> SocketAddr {
        SocketAddr::new(ip.parse().unwrap(), port)
    }

    #[tokio::test]
    async fn admission_evicts_the_oldest_unauthenticated_and_releases_on_drop() {
        let a = Admission::new("test", limits(3, 2));
        let one: IpAddr = "10.0.0.1".parse().unwrap();
        let (p1, none) = a.try_admit(peer("10.0.0.1", 1)).unwrap();
        assert!(none.is_none());
        let (p2, _) = a.try_admit(peer("10.0.0.1", 2)).unwrap();
        // The per-address cap: the oldest of that address gives its slot.
        let (p3, evicted) = a.try_admit(peer("10.0.0.1", 3)).unwrap();
        let evicted = evicted.unwrap();
        assert_eq!(
            (evicted.peer, evicted.reason),
            (peer("10.0.0.1", 1), Refusal::PerIp)
        );
        assert!(p1.conn().lock_state_evicted());
        assert!(a.conn_of(peer("10.0.0.1", 1)).is_none());
        assert_eq!(a.open(one), (2, 2));
        drop(p1);
        assert_eq!(a.open(one), (2, 2), "an evicted slot is not released twice");
        // Authenticated connections are not evicted.
        a.authenticated(p2.conn().slot);
        a.authenticated(p3.conn().slot);
        assert_eq!(
            a.try_admit(peer("10.0.0.1", 4)).unwrap_err(),
            Refusal::PerIp
        );
        let (p4, _) = a.try_admit(peer("10.0.0.2", 1)).unwrap();
        a.authenticated(p4.conn().slot);
        assert_eq!(
            a.try_admit(peer("10.0.0.3", 1)).unwrap_err(),
            Refusal::Total
        );
        drop((p2, p3, p4));
        assert_eq!(a.open(one), (0, 0));
        assert!(
            a.lock().conns.is_empty() && a.lock().by_peer.is_empty(),
            "no entry kept"
        );
    }

    #[tokio::test]
    async fn a_v4_mapped_address_counts_as_its_v4_address() {
        let a = Admission::new("test", limits(10, 1));
        let (p, _) = a.try_admit(peer("10.0.0.1", 1)).unwrap();
        a.authenticated(p.conn().slot);
        assert_eq!(
            a.try_admit(peer("::ffff:10.0.0.1", 2)).unwrap_err(),
            Refusal::PerIp
        );
    }

    #[test]
    fn use_checks_close_unauthenticated_and_idle_connections_only() {
        let t0 = Instant::now();
        let limits = ConnectionLimits {
            unauthenticated_timeout: Some(Duration::from_secs(2)),
            idle_timeout: Some(Duration::from_secs(5)),
            ..limits(10, 10)
        };
        let mut state = usage::UseState::new(t0);
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(
            check_use(&state, t0, &limits, at(1)),
            UseCheck::Next(Some(at(2)))
        );
        // A request open does not extend the grace.
        state.open_requests = 1;
        assert_eq!(
            check_use(&state, t0, &limits, at(2)),
            UseCheck::Close("unauthenticated")
        );
        // Authenticated with a request open (a quiet stream): never closed.
        state.authenticated = true;
        assert_eq!(
            check_use(&state, t0, &limits, at(3600)),
            UseCheck::Next(None)
        );
        // The request ended at 10 s: idle from then.
        state.open_requests = 0;
        state.quiet_since = at(10);
        assert_eq!(
            check_use(&state, t0, &limits, at(11)),
            UseCheck::Next(Some(at(15)))
        );
        assert_eq!(
            check_use(&state, t0, &limits, at(15)),
            UseCheck::Close("idle")
        );
        state.evicted = Some(Refusal::Total);
        assert_eq!(
            check_use(&state, t0, &limits, at(11)),
            UseCheck::Close("evicted")
        );
    }

    #[test]
    fn preface_progress_completes_on_the_preface_or_on_anything_else() {
        let mut p = PrefaceProgress::default();
        assert!(!p.feed(b"PRI * HTTP/2.0\r\n"));
        assert!(!p.feed(b"\r\nSM\r\n"));
        assert!(p.feed(b"\r\n"));
        let mut p = PrefaceProgress::default();
        assert!(p.feed(b"GET / HTTP/1.1\r\n"));
        let mut p = PrefaceProgress::default();
        assert!(!p.feed(b"P"));
        assert!(p.feed(b"X"));
    }

    #[test]
    fn backoff_doubles_to_a_ceiling_and_resets() {
        let mut b = Backoff::new();
        let pauses: Vec<_> = (0..9).map(|_| b.pause().as_millis()).collect();
        assert_eq!(pauses, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        b.reset();
        assert_eq!(b.pause(), Duration::from_millis(10));
    }

    #[test]
    fn resource_exhaustion_is_recognised() {
        assert!(is_resource_exhaustion(&io::Error::from_raw_os_error(24)));
        assert!(is_resource_exhaustion(&io::Error::from_raw_os_error(23)));
        assert!(!is_resource_exhaustion(&io::Error::from_raw_os_error(104)));
    }

    #[test]
    fn log_limiter_allows_a_few_lines_per_window_and_counts_the_rest() {
        let rate = LogRate {
            lines: 2,
            window: Duration::from_secs(60),
            max_keys: 2,
        };
        let mut l = LogLimiter::new(rate);
        let t0 = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(l.allow(a, t0), Some(0));
        assert_eq!(l.allow(a, t0), Some(0));
        for _ in 0..100 {
            assert_eq!(l.allow(a, t0), None);
        }
        // Another peer has its own budget.
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(l.allow(b, t0), Some(0));
        // The next window says how many were suppressed.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(l.allow(a, later), Some(100));
        // Beyond max_keys (and none expired), new peers share one budget.
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let d: IpAddr = "10.0.0.4".parse().unwrap();
        assert_eq!(l.allow(c, t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(l.allow(d, t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(l.allow(d, t0 + Duration::from_secs(1)), None);
        assert!(l.keys.len() <= 3, "{:?}", l.keys.keys());
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_at_the_deadline_and_a_talking_one_is_not() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admission = Admission::new(
            "test",
            ConnectionLimits {
                handshake_timeout: Duration::from_millis(300),
                ..limits(10, 10)
            },
        );
        let mut incoming = Incoming::new(tcp, admission.clone(), Plain).unwrap();
        let addr = incoming.local_addr();

        let mut silent = TcpStream::connect(addr).await.unwrap();
        let (mut server_silent, _) = incoming.accept().await;
        let mut talking = TcpStream::connect(addr).await.unwrap();
        let (mut server_talking, _) = incoming.accept().await;
        talking.write_all(H2_PREFACE).await.unwrap();

        let mut buf = [0u8; 64];
        let e = server_silent.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        let n = server_talking.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], H2_PREFACE);
        drop(server_silent);
        let n = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        assert_eq!(n, 0, "the silent client sees the close");
        assert_eq!(admission.open(addr.ip()).0, 1);
        // After the preface, silence is no longer cut off.
        let quiet = tokio::time::timeout(Duration::from_millis(500), server_talking.read(&mut buf));
        assert!(quiet.await.is_err(), "no timeout after the preface");
    }

    #[tokio::test]
    async fn a_newcomer_evicts_an_unauthenticated_connection_and_is_refused_by_authenticated_ones()
    {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admission = Admission::new("test", limits(10, 1));
        let mut incoming = Incoming::new(tcp, admission.clone(), Plain).unwrap();
        let addr = incoming.local_addr();
        let _first = TcpStream::connect(addr).await.unwrap();
        let (mut held, _) = incoming.accept().await;
        let _second = TcpStream::connect(addr).await.unwrap();
        let (mut newcomer, _) = incoming.accept().await;
        let mut buf = [0u8; 1];
        let e = tokio::time::timeout(Duration::from_secs(5), held.read(&mut buf))
            .await
            .expect("evicted promptly")
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);
        // The newcomer authenticates: a third is refused (closed at once).
        admission.authenticated(newcomer.conn().slot);
        let mut third = TcpStream::connect(addr).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf))
            .await
            .expect("closed promptly")
            .unwrap_or(0);
        assert_eq!(n, 0);
        let quiet = tokio::time::timeout(Duration::from_millis(200), newcomer.read(&mut buf));
        assert!(quiet.await.is_err(), "the authenticated one stays");
    }
}
