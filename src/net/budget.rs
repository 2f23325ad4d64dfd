//! One memory budget for the bytes hdsd holds on behalf of clients, over
//! every listener ([`MemoryBudget`], `limits.client_bytes`).
//!
//! Each limit of a listener bounds one client: a message is at most
//! `max_message_bytes`, a connection carries a few streams, an address a
//! few connections. Their product is not bounded by anything: a thousand
//! streams each sending most of a large message and then waiting hold
//! hundreds of megabytes, each within its limits. The budget bounds the sum.
//!
//! What a client makes hdsd hold, and is counted here, is what it sent
//! that hdsd cannot use yet: on a gRPC stream, the bytes of a message that
//! has not arrived whole ([`GrpcCursor`]); on an HTTP request, the body
//! read so far. A report or request that arrives in one piece, as Envoy's
//! do, is never counted: the budget costs nothing on the path of a report.
//!
//! Past the budget, the largest holders give way first ([`decide`]): the
//! client that asks for more is refused if it holds the most, and
//! otherwise the larger ones are reset so that it fits. A reset or refused
//! gRPC stream ends with `RESOURCE_EXHAUSTED` and a message saying why; an
//! HTTP request fails before its handler runs. Everything else is kept:
//! no connection, no other stream, never the process.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use prost::bytes::Bytes;

/// What [`decide`] says to a holder that asks for more bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the asker gets its bytes (false: it is refused, and gives
    /// back what it held).
    pub admit: bool,
    /// Other holders to reset, largest first, to make room.
    pub reset: Vec<HolderId>,
}

/// One holder of bytes (a stream or a request body).
pub type HolderId = u64;

/// Who gives way when `asker` wants `more` bytes and `used` of `limit` are
/// held by `holders` (each holder's bytes, the asker's included). Pure.
///
/// Within the budget, everyone is admitted. Past it, holders are taken
/// largest first (the asker counted with what it asks for; on a tie, the
/// asker before the others, then the older) until what they hold covers
/// the excess: each of them is reset, and the asker, if it is one of
/// them, is refused.
pub fn decide(
    holders: &[(HolderId, usize)],
    used: usize,
    limit: usize,
    asker: HolderId,
    more: usize,
) -> Decision {
    let after = used.saturating_add(more);
    if after <= limit {
        return Decision {
            admit: true,
            reset: Vec::new(),
        };
    }
    let need = after - limit;
    let mut ranked: Vec<(HolderId, usize)> = holders
        .iter()
        .map(|&(id, bytes)| match id == asker {
            true => (id, bytes + more),
            false => (id, bytes),
        })
        .collect();
    if !holders.iter().any(|&(id, _)| id == asker) {
        ranked.push((asker, more));
    }
    ranked.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then_with(|| (b.0 == asker).cmp(&(a.0 == asker)))
            .then_with(|| a.0.cmp(&b.0))
    });
    let mut freed = 0;
    let mut admit = true;
    let mut reset = Vec::new();
    for (id, bytes) in ranked {
        if freed >= need {
            break;
        }
        freed += bytes;
        match id == asker {
            true => admit = false,
            false => reset.push(id),
        }
    }
    Decision { admit, reset }
}

/// The bytes of the gRPC message under way on a stream: every message is
/// a 5-byte header (a flag and a big-endian length) and its body. Fed the
/// stream's data in order, it says how many bytes of a message that has
/// not arrived whole the stream's decoder holds.
#[derive(Debug, Clone, Default)]
pub struct GrpcCursor {
    header: [u8; 5],
    header_len: usize,
    /// Bytes of the current message's body still to come (0: in a header).
    remaining: usize,
    /// Bytes of the current, incomplete message seen (header included).
    held: usize,
}

impl GrpcCursor {
    /// Takes the next bytes of the stream; returns what is held after them.
    pub fn feed(&mut self, mut data: &[u8]) -> usize {
        while !data.is_empty() {
            if self.remaining == 0 {
                let take = (5 - self.header_len).min(data.len());
                self.header[self.header_len..self.header_len + take].copy_from_slice(&data[..take]);
                self.header_len += take;
                self.held += take;
                data = &data[take..];
                if self.header_len == 5 {
                    let len = u32::from_be_bytes([
                        self.header[1],
                        self.header[2],
                        self.header[3],
                        self.header[4],
                    ]);
                    self.header_len = 0;
                    self.remaining = len as usize;
                    if self.remaining == 0 {
                        self.held = 0;
                    }
                }
            } else {
                let take = self.remaining.min(data.len());
                self.remaining -= take;
                self.held += take;
                data = &data[take..];
                if self.remaining == 0 {
                    self.held = 0;
                }
            }
        }
        self.held
    }
}

#[derive(Debug, Default)]
struct Holder {
    bytes: usize,
    /// Reset to make room for another: the next read fails.
    reset: bool,
    waker: Option<Waker>,
}

#[derive(Debug, Default)]
struct State {
    used: usize,
    next: HolderId,
    holders: HashMap<HolderId, Holder>,
}

/// The budget of bytes held for clients, shared by every listener.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    state: Mutex<State>,
}

/// Why a holder's read failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exceeded {
    /// It asked for more than fits, and held the most.
    Refused,
    /// It was reset to make room for another.
    Reset,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> Arc<MemoryBudget> {
        crate::metrics::client_bytes(0, limit);
        Arc::new(MemoryBudget {
            limit,
            state: Mutex::new(State::default()),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now, over every holder.
    pub fn used(&self) -> usize {
        self.lock().used
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(self: &Arc<Self>) -> Registration {
        let mut state = self.lock();
        let id = state.next;
        state.next += 1;
        state.holders.insert(id, Holder::default());
        Registration {
            budget: self.clone(),
            id,
        }
    }

    /// Sets holder `id`'s bytes to `bytes`: `Err` if it was reset, or is
    /// refused now (its bytes are then given back).
    fn hold(&self, id: HolderId, bytes: usize, cx: &Context<'_>) -> Result<(), Exceeded> {
        let mut wake = Vec::new();
        let (result, used) = {
            let mut guard = self.lock();
            let state = &mut *guard;
            let Some(holder) = state.holders.get_mut(&id) else {
                return Err(Exceeded::Reset);
            };
            if holder.reset {
                return Err(Exceeded::Reset);
            }
            match &holder.waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => holder.waker = Some(cx.waker().clone()),
            }
            let had = holder.bytes;
            let result = if bytes <= had {
                holder.bytes = bytes;
                state.used -= had - bytes;
                Ok(())
            } else {
                let sizes: Vec<(HolderId, usize)> = state
                    .holders
                    .iter()
                    .filter(|(&i, h)| i == id || (!h.reset && h.bytes > 0))
                    .map(|(&i, h)| (i, h.bytes))
                    .collect();
                let decision = decide(&sizes, state.used, self.limit, id, bytes - had);
                for victim in &decision.reset {
                    if let Some(h) = state.holders.get_mut(victim) {
                        h.reset = true;
                        state.used -= std::mem::take(&mut h.bytes);
                        wake.extend(h.waker.take());
                    }
                }
                let holder = state.holders.get_mut(&id).expect("the asker is registered");
                if decision.admit {
                    holder.bytes = bytes;
                    state.used += bytes - had;
                    Ok(())
                } else {
                    holder.reset = true;
                    holder.bytes = 0;
                    state.used -= had;
                    Err(Exceeded::Refused)
                }
            };
            (result, state.used)
        };
        crate::metrics::client_bytes(used, self.limit);
        let resets = wake.len() + usize::from(result.is_err());
        for _ in 0..resets {
            crate::metrics::limit_hit("client_bytes");
        }
        for w in wake {
            w.wake();
        }
        result
    }

    fn release(&self, id: HolderId) {
        let (held, used) = {
            let mut state = self.lock();
            let held = state.holders.remove(&id).map_or(0, |h| h.bytes);
            state.used -= held;
            (held, state.used)
        };
        if held > 0 {
            crate::metrics::client_bytes(used, self.limit);
        }
    }

    /// Whether holder `id` was reset, registering `cx` to hear of it.
    fn was_reset(&self, id: HolderId, cx: &Context<'_>) -> bool {
        let mut state = self.lock();
        match state.holders.get_mut(&id) {
            Some(h) if h.reset => true,
            Some(h) => {
                match &h.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => h.waker = Some(cx.waker().clone()),
                }
                false
            }
            None => true,
        }
    }
}

/// A holder's place in the budget; gives its bytes back when dropped.
#[derive(Debug)]
struct Registration {
    budget: Arc<MemoryBudget>,
    id: HolderId,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.budget.release(self.id);
    }
}

/// How a body's held bytes are counted.
#[derive(Debug)]
enum Framing {
    /// A gRPC stream: the bytes of the message under way.
    Grpc(GrpcCursor),
    /// An HTTP request body, read whole by its handler: every byte so far.
    Whole(usize),
}

/// A request body whose held bytes count against a [`MemoryBudget`].
pub struct Held<B> {
    inner: Pin<Box<B>>,
    framing: Framing,
    registration: Option<Registration>,
}

impl<B> Held<B> {
    /// A gRPC request body (a stream of length-prefixed messages).
    pub fn grpc(inner: B, budget: &Arc<MemoryBudget>) -> Held<B> {
        Held::new(inner, budget, Framing::Grpc(GrpcCursor::default()))
    }

    /// An HTTP request body that its handler reads whole.
    pub fn whole(inner: B, budget: &Arc<MemoryBudget>) -> Held<B> {
        Held::new(inner, budget, Framing::Whole(0))
    }

    fn new(inner: B, budget: &Arc<MemoryBudget>, framing: Framing) -> Held<B> {
        Held {
            inner: Box::pin(inner),
            framing,
            registration: Some(budget.register()),
        }
    }

    fn exceeded(&mut self, why: Exceeded) -> BoxError {
        let limit = self.registration.as_ref().map_or(0, |r| r.budget.limit);
        self.registration = None;
        let message = match why {
            Exceeded::Refused => format!(
                "hdsd holds limits.client_bytes ({limit} bytes) for its clients and this request would hold the most of them; send smaller messages or retry later"
            ),
            Exceeded::Reset => format!(
                "reset to make room: hdsd holds limits.client_bytes ({limit} bytes) for its clients and this request held among the most; send smaller messages or retry later"
            ),
        };
        match self.framing {
            Framing::Grpc(_) => Box::new(tonic::Status::resource_exhausted(message)),
            Framing::Whole(_) => Box::new(BudgetExceeded(message)),
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An HTTP request body refused by the budget.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BudgetExceeded(String);

impl<B> http_body::Body for Held<B>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        let Some(registration) = &self.registration else {
            return Poll::Ready(None);
        };
        let (budget, id) = (registration.budget.clone(), registration.id);
        let frame = match self.inner.as_mut().poll_frame(cx) {
            Poll::Pending => {
                return match budget.was_reset(id, cx) {
                    true => Poll::Ready(Some(Err(self.exceeded(Exceeded::Reset)))),
                    false => Poll::Pending,
                };
            }
            Poll::Ready(None) => {
                self.registration = None;
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(Some(Ok(frame))) => frame,
        };
        if let Some(data) = frame.data_ref() {
            let held = match &mut self.framing {
                Framing::Grpc(cursor) => cursor.feed(data),
                Framing::Whole(read) => {
                    *read += data.len();
                    *read
                }
            };
            if let Err(why) = budget.hold(id, held, cx) {
                return Poll::Ready(Some(Err(self.exceeded(why))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The layer of a tonic server whose request bodies count against a budget.
#[derive(Debug, Clone)]
pub struct BudgetLayer(pub Arc<MemoryBudget>);

impl<S> tower::Layer<S> for BudgetLayer {
    type Service = Budgeted<S>;

    fn layer(&self, inner: S) -> Budgeted<S> {
        Budgeted {
            inner,
            budget: self.0.clone(),
        }
    }
}

/// See [`BudgetLayer`].
#[derive(Debug, Clone)]
pub struct Budgeted<S> {
    inner: S,
    budget: Arc<MemoryBudget>,
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Budgeted<S>
where
    S: tower::Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> S::Future {
        let budget = &self.budget;
        self.inner
            .call(request.map(|body| tonic::body::Body::new(Held::grpc(body, budget))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: usize) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len));
        m
    }

    #[test]
    fn whole_messages_hold_nothing_and_a_split_one_holds_what_came() {
        let mut c = GrpcCursor::default();
        // Two whole messages in one frame, as Envoy's reports arrive.
        let mut two = message(300);
        two.extend(message(0));
        assert_eq!(c.feed(&two), 0);
        // A 100 KB message in pieces, the header itself split.
        let big = message(100_000);
        assert_eq!(c.feed(&big[..3]), 3);
        assert_eq!(c.feed(&big[3..16_384]), 16_384);
        assert_eq!(c.feed(&big[16_384..big.len() - 1]), big.len() - 1);
        assert_eq!(c.feed(&big[big.len() - 1..]), 0);
        // The end of one message and the start of the next in one frame.
        let mut tail_and_head = message(10);
        tail_and_head.extend(&message(50)[..20]);
        assert_eq!(c.feed(&tail_and_head[..7]), 7);
        assert_eq!(c.feed(&tail_and_head[7..]), 20);
    }

    #[test]
    fn within_the_budget_everyone_is_admitted() {
        let d = decide(&[(1, 10), (2, 20)], 30, 100, 1, 70);
        assert_eq!(
            d,
            Decision {
                admit: true,
                reset: vec![]
            }
        );
    }

    #[test]
    fn past_it_the_largest_give_way_first() {
        // The asker would hold the most: it alone is refused.
        let d = decide(&[(1, 40), (2, 30), (3, 20)], 90, 100, 1, 20);
        assert_eq!(
            d,
            Decision {
                admit: false,
                reset: vec![]
            }
        );
        // A small asker: the largest other holder is reset for it.
        let d = decide(&[(1, 5), (2, 60), (3, 25)], 90, 100, 1, 20);
        assert_eq!(
            d,
            Decision {
                admit: true,
                reset: vec![2]
            }
        );
        // Asking makes it the largest: refused, the others kept.
        let d = decide(&[(1, 30), (2, 35), (3, 33)], 98, 100, 1, 10);
        assert_eq!(
            d,
            Decision {
                admit: false,
                reset: vec![]
            }
        );
        // A newcomer that holds nothing yet.
        let d = decide(&[(2, 60), (3, 40)], 100, 100, 9, 1);
        assert_eq!(
            d,
            Decision {
                admit: true,
                reset: vec![2]
            }
        );
        // On a tie the asker goes first, then the older holder.
        let d = decide(&[(1, 50), (2, 40), (3, 50)], 140, 140, 2, 10);
        assert_eq!(
            d,
            Decision {
                admit: false,
                reset: vec![]
            }
        );
        let d = decide(&[(5, 50), (3, 50)], 100, 100, 9, 10);
        assert_eq!(
            d,
            Decision {
                admit: true,
                reset: vec![3]
            }
        );
    }

    struct Frames(std::collections::VecDeque<Bytes>);

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
            match self.0.pop_front() {
                Some(b) => Poll::Ready(Some(Ok(http_body::Frame::data(b)))),
                None => Poll::Pending,
            }
        }
    }

    fn poll(body: &mut Held<Frames>) -> Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        use http_body::Body as _;
        let waker = Waker::noop();
        Pin::new(body).poll_frame(&mut Context::from_waker(waker))
    }

    fn frames(parts: &[&[u8]]) -> Frames {
        Frames(parts.iter().map(|p| Bytes::copy_from_slice(p)).collect())
    }

    /// Three streams each send most of a message and wait; the fourth,
    /// which would pass the budget, resets the largest, whose next read
    /// ends with RESOURCE_EXHAUSTED; dropping a body gives its bytes back.
    #[test]
    fn bodies_hold_their_partial_messages_and_the_largest_is_reset() {
        let budget = MemoryBudget::new(10_000);
        let m = message(9_000);
        let mut a = Held::grpc(frames(&[&m[..4_000]]), &budget);
        let mut b = Held::grpc(frames(&[&m[..3_000]]), &budget);
        let mut c = Held::grpc(frames(&[&m[..2_000], &m[2_000..2_500]]), &budget);
        assert!(matches!(poll(&mut a), Poll::Ready(Some(Ok(_)))));
        assert!(matches!(poll(&mut b), Poll::Ready(Some(Ok(_)))));
        assert!(matches!(poll(&mut c), Poll::Ready(Some(Ok(_)))));
        assert_eq!(budget.used(), 9_000);
        assert!(matches!(poll(&mut a), Poll::Pending));
        // c asks for 500 more: 9,500 fits.
        assert!(matches!(poll(&mut c), Poll::Ready(Some(Ok(_)))));
        assert_eq!(budget.used(), 9_500);
        let mut d = Held::grpc(frames(&[&m[..1_000]]), &budget);
        assert!(matches!(poll(&mut d), Poll::Ready(Some(Ok(_)))));
        // a (4,000) was reset for d.
        assert_eq!(budget.used(), 6_500);
        match poll(&mut a) {
            Poll::Ready(Some(Err(e))) => {
                let status = e.downcast::<tonic::Status>().expect("a gRPC status");
                assert_eq!(status.code(), tonic::Code::ResourceExhausted);
                assert!(status
                    .message()
                    .contains("limits.client_bytes (10000 bytes)"));
            }
            other => panic!("a was not reset: {other:?}"),
        }
        assert!(matches!(poll(&mut a), Poll::Ready(None)));
        drop(b);
        assert_eq!(budget.used(), 3_500);
        drop((c, d));
        assert_eq!(budget.used(), 0);
    }
}
