// The server's half of deadline propagation: `DeadlineLayer` reads the caller's header,
// clamps it to its own limit, bounds the handler with tower's `Timeout` (hence the `tokio`
// feature) and hands the deadline to the handler as a `RequestDeadline`.

use std::fmt;
use std::future::Ready;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, request};
use tower::BoxError;
use tower::timeout::Timeout;
use tower::timeout::future::ResponseFuture;
use tower::util::Either;
use tower::util::future::EitherResponseFuture;
use tower_layer::Layer;
use tower_service::Service;

use super::RequestDeadline;

/// What Envoy tells its upstream: the time the request is expected to take.
pub(crate) const ENVOY_EXPECTED_TIMEOUT: HeaderName =
    HeaderName::from_static("x-envoy-expected-rq-timeout-ms");

/// The most digits a value has (Connect's bound: about 115 days). A longer one is garbage
/// to the reader, and the writer writes no more.
const MAX_DIGITS: usize = 10;

/// A value in whole milliseconds: 1 to 10 ASCII digits, nothing else (no sign, no space,
/// no unit); anything else is `None`, as if absent.
pub(crate) fn parse_millis(value: &HeaderValue) -> Option<Duration> {
    let bytes = value.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_DIGITS || !bytes.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let ms = bytes
        .iter()
        .fold(0u64, |ms, digit| ms * 10 + u64::from(digit - b'0'));
    Some(Duration::from_millis(ms))
}

/// The one value of `name` in `headers`, read; `None` when it is absent, garbage or given
/// more than once.
fn read(headers: &HeaderMap, name: &HeaderName) -> Option<Duration> {
    let mut values = headers.get_all(name).iter();
    match (values.next(), values.next()) {
        (Some(value), None) => parse_millis(value),
        _ => None,
    }
}

type Trust = Arc<dyn Fn(&request::Parts) -> bool + Send + Sync>;

/// Bounds a server's handler by its own limit, or by the deadline its caller sent, if
/// shorter and the caller is trusted, and tells the handler when that is.
///
/// For each request, the layer:
///
/// 1. reads the [header](Self::header) the caller's client wrote
///    ([`RetryPolicy::deadline_header`](crate::RetryPolicy::deadline_header), or
///    [Envoy's](Self::envoy)): whole milliseconds, relative (1 to 10 ASCII digits; anything
///    else, or more than one value, is ignored as absent), and only from a caller the
///    [`trust`](Self::trust) predicate accepts (by default nobody: the handler gets the
///    layer's limit alone). The header is removed from the request either way, as Envoy
///    removes the one it reads: a handler that copies headers onward does not forward a
///    stale value;
/// 2. takes the lesser of it and the layer's own limit: a caller can shorten the work,
///    never lengthen it;
/// 3. answers `504 Gateway Timeout` at once, without calling the handler, when that is
///    zero (the caller had no time left);
/// 4. puts the deadline in the request's extensions ([`RequestDeadline`]), for the
///    handler's own calls to carry on, and for work it hands elsewhere (a spawned task, a
///    query with a timeout of its own) to end with it;
/// 5. bounds the handler with tower's [`Timeout`]: when the deadline passes, the
///    handler's future is dropped and the service fails with tower's
///    [`Elapsed`](tower::timeout::error::Elapsed) (hyper then closes the connection, or
///    resets the HTTP/2 stream; a framework maps it to a response, axum with
///    `HandleErrorLayer`).
///
/// Why trust nobody by default: the header sets how long this server works for a request,
/// and Envoy, which defines the convention, honours it only from inside: its connection
/// manager strips `x-envoy-*` headers from requests it deems external, and an Envoy at the
/// edge ignores an incoming `x-envoy-expected-rq-timeout-ms` unless told to respect it.
/// A caller can only shorten its own request's work, but work is shared (a response
/// coalesced for many requests, a cache filled), so whom to believe is the operator's
/// call: a peer address range, an mTLS identity, a header set by one's own proxy.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response, StatusCode};
/// use tower::{Layer, ServiceExt};
/// use tower_http_retry::{DeadlineLayer, RequestDeadline};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let layer = DeadlineLayer::new(Duration::from_secs(10))
///     .header(http::HeaderName::from_static("x-timeout-ms"))
///     // Callers inside: those that came through one's own proxy, say.
///     .trust(|head| head.headers.contains_key("x-internal"));
/// // A handler that answers with the time it has, in milliseconds.
/// let handler = tower::service_fn(|request: Request<()>| async move {
///     let RequestDeadline(deadline) = *request.extensions().get::<RequestDeadline>().unwrap();
///     let left = deadline - tokio::time::Instant::now().into_std();
///     Ok::<_, std::convert::Infallible>(Response::new(left.as_millis().to_string()))
/// });
/// let server = layer.layer(handler);
///
/// // A trusted caller with 250 ms left.
/// let request = Request::get("/").header("x-timeout-ms", "250").header("x-internal", "1");
/// let response = server.clone().oneshot(request.body(()).unwrap()).await.unwrap();
/// assert_eq!(response.body(), "250");
///
/// // A caller with no time left: answered at once.
/// let request = Request::get("/").header("x-timeout-ms", "0").header("x-internal", "1");
/// let response = server.clone().oneshot(request.body(()).unwrap()).await.unwrap();
/// assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
///
/// // Anyone else gets the layer's 10 s, whatever they send.
/// let request = Request::get("/").header("x-timeout-ms", "250");
/// let response = server.oneshot(request.body(()).unwrap()).await.unwrap();
/// assert_eq!(response.body(), "10000");
/// # }
/// ```
#[derive(Clone)]
pub struct DeadlineLayer {
    limit: Duration,
    header: Option<HeaderName>,
    trust: Option<Trust>,
}

impl DeadlineLayer {
    /// A layer that bounds every request's handler by `limit`, and reads no header until
    /// given one ([`header`](Self::header), [`envoy`](Self::envoy)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::DeadlineLayer;
    ///
    /// let layer = DeadlineLayer::new(Duration::from_secs(30));
    /// # let _ = layer;
    /// ```
    pub fn new(limit: Duration) -> Self {
        Self {
            limit,
            header: None,
            trust: None,
        }
    }

    /// Reads the caller's deadline from `name`, in whole milliseconds (what
    /// [`RetryPolicy::deadline_header`](crate::RetryPolicy::deadline_header) writes), from
    /// the callers [`trust`](Self::trust) accepts. `None` reads none.
    ///
    /// ```
    /// use std::time::Duration;
    /// use http::HeaderName;
    /// use tower_http_retry::DeadlineLayer;
    ///
    /// let layer = DeadlineLayer::new(Duration::from_secs(30))
    ///     .header(HeaderName::from_static("x-timeout-ms"))
    ///     .trust(|_| true);
    /// # let _ = layer;
    /// ```
    pub fn header(mut self, name: impl Into<Option<HeaderName>>) -> Self {
        self.header = name.into();
        self
    }

    /// [`header`](Self::header) under Envoy's name, `x-envoy-expected-rq-timeout-ms`: the
    /// time an Envoy in front of this server gives the request (its per-try timeout, or
    /// what is left of the route's). Envoy never sends 0 (it sends 1 when the time is
    /// gone).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::DeadlineLayer;
    ///
    /// // Behind Envoy, every caller comes through it.
    /// let layer = DeadlineLayer::new(Duration::from_secs(30)).envoy().trust(|_| true);
    /// # let _ = layer;
    /// ```
    pub fn envoy(self) -> Self {
        self.header(ENVOY_EXPECTED_TIMEOUT)
    }

    /// Believes the header only from the callers `trusted` accepts, given the request's
    /// head (by default, from nobody). Extensions a server or framework put there tell
    /// who the peer is: the remote address (axum's `ConnectInfo`), a TLS identity.
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use std::time::Duration;
    /// use tower_http_retry::DeadlineLayer;
    ///
    /// // Callers on the same host or the private network.
    /// let layer = DeadlineLayer::new(Duration::from_secs(30))
    ///     .envoy()
    ///     .trust(|head| match head.extensions.get::<SocketAddr>() {
    ///         Some(SocketAddr::V4(peer)) => peer.ip().is_loopback() || peer.ip().is_private(),
    ///         Some(SocketAddr::V6(peer)) => peer.ip().is_loopback(),
    ///         None => false,
    ///     });
    /// # let _ = layer;
    /// ```
    pub fn trust<F>(mut self, trusted: F) -> Self
    where
        F: Fn(&request::Parts) -> bool + Send + Sync + 'static,
    {
        self.trust = Some(Arc::new(trusted));
        self
    }
}

impl fmt::Debug for DeadlineLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeadlineLayer")
            .field("limit", &self.limit)
            .field("header", &self.header)
            .field("trusts", &self.trust.as_ref().map(|_| "some"))
            .finish()
    }
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`DeadlineLayer`] makes: the handler, bounded.
///
/// ```
/// use std::time::Duration;
/// use tower::Layer;
/// use tower_http_retry::{Deadline, DeadlineLayer};
///
/// # let handler = tower::service_fn(|_: http::Request<()>| async {
/// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
/// # });
/// let mut service: Deadline<_> = DeadlineLayer::new(Duration::from_secs(30)).layer(handler);
/// let _handler = service.get_mut();
/// # let _ = service.into_inner();
/// ```
#[derive(Clone, Debug)]
pub struct Deadline<S> {
    inner: S,
    layer: DeadlineLayer,
}

impl<S> Deadline<S> {
    /// The inner service.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower::Layer;
    /// # let handler = tower::service_fn(|_: http::Request<()>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// let service = tower_http_retry::DeadlineLayer::new(Duration::from_secs(1)).layer(handler);
    /// let _handler = service.get_ref();
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower::Layer;
    /// # let handler = tower::service_fn(|_: http::Request<()>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// let mut service = tower_http_retry::DeadlineLayer::new(Duration::from_secs(1)).layer(handler);
    /// let _handler = service.get_mut();
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, given back.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use tower::Layer;
    /// # let handler = tower::service_fn(|_: http::Request<()>| async {
    /// #     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// # });
    /// let service = tower_http_retry::DeadlineLayer::new(Duration::from_secs(1)).layer(handler);
    /// let _handler = service.into_inner();
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The time `head`'s handler has: the caller's, if read and trusted, within the
    /// layer's limit. The header is removed.
    fn time(&self, head: &mut request::Parts) -> Duration {
        let Some(name) = &self.layer.header else {
            return self.layer.limit;
        };
        let said = read(&head.headers, name);
        head.headers.remove(name);
        match said {
            Some(said) if self.layer.trust.as_ref().is_some_and(|trust| trust(head)) => {
                said.min(self.layer.limit)
            }
            _ => self.layer.limit,
        }
    }
}

/// The answer to a request whose caller had no time left: `504`, the handler not called.
struct Expired<ResB>(std::marker::PhantomData<fn() -> ResB>);

impl<ReqB, ResB: Default> Service<Request<ReqB>> for Expired<ResB> {
    type Response = Response<ResB>;
    type Error = BoxError;
    type Future = Ready<Result<Response<ResB>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<ReqB>) -> Self::Future {
        let mut response = Response::new(ResB::default());
        *response.status_mut() = StatusCode::GATEWAY_TIMEOUT;
        std::future::ready(Ok(response))
    }
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Deadline<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    ResB: Default,
{
    type Response = Response<ResB>;
    type Error = BoxError;
    type Future =
        EitherResponseFuture<ResponseFuture<S::Future>, Ready<Result<Response<ResB>, BoxError>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqB>) -> Self::Future {
        let (mut head, body) = request.into_parts();
        let time = self.time(&mut head);
        // tower's `Timeout` beneath sleeps on tokio's timer: the deadline is read from it too.
        let now = crate::time::default_now();
        head.extensions
            .insert(RequestDeadline(crate::decision::after(now, time)));
        let request = Request::from_parts(head, body);
        let mut either = match time.is_zero() {
            true => Either::Right(Expired(std::marker::PhantomData)),
            false => Either::Left(Timeout::new(&mut self.inner, time)),
        };
        either.call(request)
    }
}

// The tests of both halves (the header written and read, the layer), here to reach the
// server's private parts.
#[cfg(test)]
#[path = "tests.rs"]
mod tests;
