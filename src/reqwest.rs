//! The layer over a [`reqwest::Client`] (feature `reqwest`).
//!
//! `reqwest::Client` is a `Service<reqwest::Request>`, not a
//! `Service<http::Request<B>>`, so [`RetryLayer`](crate::RetryLayer) cannot wrap it directly.
//! [`ReqwestService`] is the adapter: it takes the `http::Request<ReplayBody<B>>` the layer
//! hands down, converts it with `reqwest::Request::try_from`, sends it with the client, and
//! gives back reqwest's response as an `http::Response<reqwest::Body>`.
//!
//! ```text
//! RetryLayer  ->  ReqwestService  ->  reqwest::Client (pool, DNS, TLS, redirects)
//! ```
//!
//! reqwest's own errors reach the layer already recognised ([`recognize`], handed over as
//! a [`Recognized`] error): a connect error (`is_connect`,
//! also a connect timeout) proves the server never saw the request; a timeout
//! (`is_timeout`: reqwest's own, whose type is private, or one underneath) is a retryable
//! timeout; anything else is judged by what it wraps, so a reset or a closed connection
//! underneath is found too. The caller still gets reqwest's own error back.
//!
//! With the `reqwest-middleware` feature, `RetryMiddleware` runs the same retry loop as a
//! reqwest-middleware `Middleware`, for applications built on `ClientWithMiddleware`.
//!
//! # Things to know
//!
//! - **Timeouts.** Every attempt is a separate `execute`, so reqwest's
//!   `ClientBuilder::timeout` bounds each attempt, and its expiry is retried as a timeout.
//!   It also keeps running while the response body is read, after the layer has returned
//!   the response. [`RetryPolicy::attempt_timeout`](crate::RetryPolicy::attempt_timeout) and
//!   [`RetryPolicy::deadline`](crate::RetryPolicy::deadline) do the same job inside the
//!   layer, with the time left before the deadline taken into account.
//! - **reqwest's own retries stay out of the way.** reqwest retries HTTP/2 protocol
//!   refusals itself only for bodies it can clone; the body handed to it here is a stream,
//!   so it never sends a copy of its own and the layer's limits and budget hold.
//! - **Redirects.** reqwest follows them (unless its redirect policy says otherwise), but a
//!   307 or 308 for a request with a non-empty body is returned as is, since it cannot
//!   clone the body.
//! - **The response.** `reqwest::Response::from(response)` turns it back into a
//!   `reqwest::Response` (`text()`, `json()`, `error_for_status()`), with the final URL
//!   and the [`RetryInfo`](crate::RetryInfo) in its extensions.
//! - **Features.** reqwest is built without its default features here (no TLS, no
//!   HTTP/2); enable what your application needs on your own reqwest dependency (for
//!   example `reqwest = { version = "0.13", features = ["rustls"] }`) and Cargo builds one
//!   reqwest with both.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use ::reqwest::{Client, ResponseBuilderExt};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower::BoxError;
use tower_service::Service;

use crate::ReplayBody;
use crate::classify::{Recognized, RetryReason};

#[cfg(feature = "reqwest-middleware")]
mod middleware;
#[cfg(feature = "reqwest-middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest-middleware")))]
pub use self::middleware::RetryMiddleware;

/// A [`reqwest::Client`] as a `Service<http::Request<ReplayBody<B>>>`,
/// for [`RetryLayer`](crate::RetryLayer) to wrap.
///
/// It returns `http::Response<reqwest::Body>`, and fails with reqwest's own
/// [`reqwest::Error`] inside a [`Recognized`] (what [`recognize`] makes of it, for the
/// layer; the layer's caller gets the `reqwest::Error` itself back): also when the request
/// cannot be converted (`is_builder()`, for example for a URI without a scheme and host),
/// in which case nothing is sent.
///
/// `B` is the caller's request body type (the layer hands down `ReplayBody<B>`), inferred
/// from the requests sent. Any body works: a `Full<Bytes>`, a `String`, a stream, a
/// `reqwest::Body` (the default), also bodies that are `Send` but not `Sync`
/// (`UnsyncBoxBody`, axum's body).
///
/// # Clone
///
/// Cloning is cheap: a `reqwest::Client` is a handle on one shared connection pool, and
/// every clone of this service uses it.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_http_retry::reqwest::ReqwestService;
/// use tower_http_retry::{Backoff, RetryInfo, RetryLayer, RetryPolicy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// # // A server on 127.0.0.1 that answers 503 once, then 200.
/// # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// # let addr = listener.local_addr()?;
/// # let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
/// # tokio::spawn(async move {
/// #     while let Ok((stream, _)) = listener.accept().await {
/// #         let calls = calls.clone();
/// #         let service = hyper::service::service_fn(move |_req| {
/// #             let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
/// #             let status = if n == 0 { 503 } else { 200 };
/// #             async move { http::Response::builder().status(status).body(Full::new(Bytes::from("hello"))) }
/// #         });
/// #         let io = hyper_util::rt::TokioIo::new(stream);
/// #         tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
/// #     }
/// # });
/// let client = reqwest::Client::builder()
///     .timeout(Duration::from_secs(2)) // each attempt's limit
/// #   .no_proxy() // the server is on 127.0.0.1
///     .build()?;
/// let service = ServiceBuilder::new()
///     .layer(RetryLayer::new().policy(
///         RetryPolicy::default()
///             .backoff(Backoff::exponential(Duration::from_millis(10), Duration::from_secs(1)))
///             .deadline(Duration::from_secs(10)),
///     ))
///     .service(ReqwestService::new(client));
///
/// let request = http::Request::get(format!("http://{addr}/greeting"))
///     .body(Full::new(Bytes::new()))?;
/// let response = service.oneshot(request).await?;
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.extensions().get::<RetryInfo>().unwrap().attempts(), 2); // 503, then 200
///
/// // Back to a `reqwest::Response`, for reqwest's own helpers.
/// let response = reqwest::Response::from(response);
/// assert_eq!(response.url().path(), "/greeting");
/// assert_eq!(response.text().await?, "hello");
/// # Ok(())
/// # }
/// ```
pub struct ReqwestService<B = ::reqwest::Body> {
    client: Client,
    /// The request body type, fixed per service so that `svc.ready().await?.call(req)`
    /// needs no annotation. `fn(B)`: the service holds no `B`, and is `Send` and `Sync`
    /// whatever `B` is.
    _body: PhantomData<fn(B)>,
}

impl<B> ReqwestService<B> {
    /// Sends every request through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            _body: PhantomData,
        }
    }

    /// The client.
    pub fn get_ref(&self) -> &Client {
        &self.client
    }

    /// The client, mutably.
    pub fn get_mut(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Gives the client back.
    pub fn into_inner(self) -> Client {
        self.client
    }
}

impl<B> Clone for ReqwestService<B> {
    fn clone(&self) -> Self {
        Self::new(self.client.clone())
    }
}

impl<B> fmt::Debug for ReqwestService<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReqwestService")
            .field("client", &self.client)
            .finish()
    }
}

impl<B> From<Client> for ReqwestService<B> {
    fn from(client: Client) -> Self {
        Self::new(client)
    }
}

impl<B> Service<http::Request<ReplayBody<B>>> for ReqwestService<B>
where
    B: Body + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<::reqwest::Body>;
    type Error = Recognized;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<::reqwest::Request>::poll_ready(&mut self.client, cx).map_err(recognized)
    }

    fn call(&mut self, request: http::Request<ReplayBody<B>>) -> Self::Future {
        let request = request.map(|body| ::reqwest::Body::wrap(SyncBody::new(body)));
        let state = match ::reqwest::Request::try_from(request) {
            Ok(request) => State::Sending {
                future: self.client.call(request),
            },
            Err(error) => State::Failed { error: Some(error) },
        };
        ResponseFuture { state }
    }
}

type Pending = <Client as Service<::reqwest::Request>>::Future;

pin_project! {
    /// The response future of [`ReqwestService`].
    pub struct ResponseFuture {
        #[pin]
        state: State,
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        Sending { #[pin] future: Pending },
        Failed { error: Option<::reqwest::Error> },
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<::reqwest::Body>, Recognized>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Sending { future } => {
                let response = ready!(future.poll(cx)).map_err(recognized)?;
                Poll::Ready(Ok(into_http(response)))
            }
            StateProj::Failed { error } => Poll::Ready(Err(recognized(
                error
                    .take()
                    .expect("ResponseFuture polled after completion"),
            ))),
        }
    }
}

/// What a `reqwest::Error` is, as a failure: a connect error (a connect timeout too: the
/// connection never existed, which is the stronger claim) is
/// [`RetryReason::Connect`], a timeout [`RetryReason::Timeout`] (reqwest's own timeout
/// error is a private type: only `is_timeout` can tell), and anything else `None`: judged
/// by what it wraps (a reset, a closed connection, ...).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use tower_http_retry::RetryReason;
///
/// // Port 9 on 127.0.0.1: nothing listens there.
/// let client = reqwest::Client::builder().no_proxy().build().unwrap();
/// let error = client.get("http://127.0.0.1:9/").send().await.unwrap_err();
/// assert_eq!(tower_http_retry::reqwest::recognize(&error), Some(RetryReason::Connect));
/// # }
/// ```
pub fn recognize(error: &::reqwest::Error) -> Option<RetryReason> {
    if error.is_connect() {
        Some(RetryReason::Connect)
    } else if error.is_timeout() {
        Some(RetryReason::Timeout)
    } else {
        None
    }
}

/// reqwest's error, handed to the layer already recognised.
pub(crate) fn recognized(error: ::reqwest::Error) -> Recognized {
    let reason = recognize(&error);
    Recognized::new(error, reason)
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Sending { .. } => "sending",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

/// `http::Response::from` drops the response's final URL; it is put back where
/// `reqwest::Response::from` looks for it, so a round trip keeps it.
fn into_http(response: ::reqwest::Response) -> http::Response<::reqwest::Body> {
    let url = response.url().clone();
    let mut response = http::Response::from(response);
    if let Ok(marker) = http::Response::builder().url(url).body(()) {
        response
            .extensions_mut()
            .extend(marker.into_parts().0.extensions);
    }
    response
}

/// `reqwest::Body::wrap` takes only `Sync` bodies, and many tower bodies are only `Send`.
/// reqwest polls the body through `&mut`, so a `Mutex` that is never locked
/// (`Mutex::get_mut`) makes any `Send` body `Sync`; `size_hint` and `is_end_stream`, which
/// take `&self`, answer from copies taken after every poll (nothing else changes them).
struct SyncBody<B> {
    body: Mutex<ReplayBody<B>>,
    hint: SizeHint,
    end: bool,
}

impl<B> SyncBody<B>
where
    B: Body + Unpin,
{
    fn new(body: ReplayBody<B>) -> Self {
        Self {
            hint: body.size_hint(),
            end: body.is_end_stream(),
            body: Mutex::new(body),
        }
    }
}

impl<B> Body for SyncBody<B>
where
    B: Body + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let body = this.body.get_mut().unwrap_or_else(PoisonError::into_inner);
        let frame = ready!(Pin::new(&mut *body).poll_frame(cx));
        this.hint = body.size_hint();
        this.end = body.is_end_stream();
        Poll::Ready(frame)
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }

    fn is_end_stream(&self) -> bool {
        self.end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};

    fn sync<T: Sync>(_: &T) {}

    #[tokio::test]
    async fn a_send_only_body_is_made_sync_and_keeps_its_hint_and_end() {
        let body = UnsyncBoxBody::new(Full::new(Bytes::from_static(b"hello")));
        let mut body = SyncBody::new(ReplayBody::new(body, 1024));
        sync(&body);
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"hello"));
        assert_eq!(body.size_hint().exact(), Some(0));
        assert!(body.is_end_stream());
    }
}
