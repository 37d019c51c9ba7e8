// reqwest's call sites over a tower stack: `RequestBuilderExt::send_with`, and the error it
// returns, which hands reqwest's own error back in one call.
//
// `send_with` is what a user would write by hand: `RequestBuilder::build`, reqwest's own
// conversion to an `http::Request` (which keeps what reqwest keeps in a request's
// extensions, its timeout), the service called once it is ready, and
// `reqwest::Response::from` on the answer (which keeps the final URL and the record).
//
// The trait declares `send_with` once per target (their types differ); each target's
// module implements it (native.rs, wasm.rs).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;

use tower::BoxError;
use tower_http_retry::classify::Recognized;
use tower_http_retry::{RetryError, RetryInfo};
use tower_service::Service;

/// Sends a [`reqwest::RequestBuilder`] through a tower service instead of its own client:
/// `client.get(url).send()` becomes `client.get(url).send_with(&service)`, and the answer
/// is still a [`reqwest::Response`].
///
/// The service is typically [`RetryLayer`](tower_http_retry::RetryLayer) (and whatever else
/// your tower stack holds) over a [`ReqwestService`](crate::ReqwestService):
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_http_retry::{RetryInfo, RetryLayer, RetryPolicy};
/// use tower_http_retry_reqwest::{ReqwestService, RequestBuilderExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_http_retry_reqwest::Error> {
/// # // A server on 127.0.0.1 that answers 503 once, then 200.
/// # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
/// # let addr = listener.local_addr().unwrap();
/// # let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
/// # tokio::spawn(async move {
/// #     while let Ok((stream, _)) = listener.accept().await {
/// #         let calls = calls.clone();
/// #         let service = hyper::service::service_fn(move |_req| {
/// #             let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
/// #             let status = if n == 0 { 503 } else { 200 };
/// #             let body = http_body_util::Full::new(bytes::Bytes::from("hello"));
/// #             async move { http::Response::builder().status(status).body(body) }
/// #         });
/// #         let io = hyper_util::rt::TokioIo::new(stream);
/// #         tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
/// #     }
/// # });
/// # let client = reqwest::Client::builder().no_proxy().build()?; // the server is on 127.0.0.1
/// # /*
/// let client = reqwest::Client::new();
/// # */
/// let service = ServiceBuilder::new()
///     .layer(RetryLayer::new().policy(RetryPolicy::new().deadline(Duration::from_secs(10))))
///     .service(ReqwestService::new(client.clone()));
///
/// let response = client
///     .get(format!("http://{addr}/greeting"))
///     .header("accept", "text/plain")
///     .send_with(&service)
///     .await?;
/// assert_eq!(response.extensions().get::<RetryInfo>().unwrap().attempts(), 2); // 503, then 200
/// assert_eq!(response.text().await?, "hello");
/// # Ok(())
/// # }
/// ```
///
/// - **The service's client sends the request**; the client that made the builder only
///   built it. reqwest adds a client's default headers when it sends, so they are the
///   service's client's: make the builders with the same client (as above) and nothing
///   changes.
/// - **What reqwest's builder set holds on every attempt**: headers, body, version, and
///   `RequestBuilder::timeout`, a limit per attempt, as `ClientBuilder::timeout` is.
/// - **The future** owns a clone of the service (cloning a tower service is what `oneshot`
///   callers do anyway; the layer's clones share its budget and records), so it is
///   `'static` and can be spawned, and the service stays usable.
/// - **The service's response body** may be any `Send + Sync` body: a `reqwest::Body`
///   (a [`ReqwestService`](crate::ReqwestService)'s) is handed over as it is, any other
///   wrapped with `reqwest::Body::wrap`: a resumable layer's
///   [`ResumeBody`](tower_http_retry::ResumeBody), read with `bytes()`, `chunk()` or
///   `bytes_stream()`, goes on across a cut (see
///   [Resumable downloads](crate#resumable-downloads)).
/// - **Errors** come back as an [`Error`]: [`Error::as_reqwest`] gives reqwest's own error
///   (`is_timeout()`, `is_connect()`, `status()`, ...), [`Error::info`] the record. A
///   request reqwest cannot build (a bad URL or header) fails without reaching the service.
///
/// **On wasm32** (reqwest's `fetch` client), reqwest's response has no extensions and no
/// conversion from an `http::Response`, so `send_with` answers with the service's
/// `http::Response` as it is: over a [`ReqwestService`](crate::ReqwestService), its
/// extensions hold the record and its body is the `reqwest::Response`
/// (`response.into_body().text()`). The request reaches the service with its body in one
/// buffer (`RequestBody`, an `http_body_util::Full<Bytes>`); a multipart form, which has none, fails
/// without being sent. Of what the builder set beyond the method, URL, headers and body,
/// only the timeout is carried (not its `fetch` options: mode, credentials, cache,
/// referrer). The future is not `Send`, nor need the service be.
pub trait RequestBuilderExt: sealed::Sealed {
    /// Builds the request and sends it through `service`, once `service` is ready; the
    /// answer as a `reqwest::Response`, with the layer's
    /// [`RetryInfo`](tower_http_retry::RetryInfo) in its extensions.
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    fn send_with<S, RB>(
        self,
        service: &S,
    ) -> impl Future<Output = Result<::reqwest::Response, Error>> + Send + 'static
    where
        S: Service<http::Request<::reqwest::Body>, Response = http::Response<RB>>
            + Clone
            + Send
            + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send,
        RB: http_body::Body + Send + Sync + 'static,
        RB::Data: Into<bytes::Bytes>,
        RB::Error: Into<BoxError>;

    /// Builds the request and sends it through `service`, once `service` is ready; the
    /// answer as the service gave it, an `http::Response` with the layer's
    /// [`RetryInfo`](tower_http_retry::RetryInfo) in its extensions.
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    fn send_with<S, RB>(
        self,
        service: &S,
    ) -> impl Future<Output = Result<http::Response<RB>, Error>> + 'static
    where
        S: Service<http::Request<crate::RequestBody>, Response = http::Response<RB>>
            + Clone
            + 'static,
        S::Error: Into<BoxError>;
}

/// `request` sent through `service` once it is ready: what `send_with`'s future does on
/// either target.
pub(crate) async fn ready_call<S, R>(mut service: S, request: R) -> Result<S::Response, Error>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    std::future::poll_fn(|cx| service.poll_ready(cx))
        .await
        .map_err(|error| Error::from(error.into()))?;
    service
        .call(request)
        .await
        .map_err(|error| Error::from(error.into()))
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for ::reqwest::RequestBuilder {}
}

/// The error of [`RequestBuilderExt::send_with`]: reqwest's own error, or the layer's,
/// with the layer's record.
///
/// [`as_reqwest`](Error::as_reqwest) is the one call between this error and the checks a
/// reqwest code base already makes: `error.as_reqwest().is_some_and(|e| e.is_timeout())`,
/// `error.as_reqwest().and_then(|e| e.status())`. It is `None` when the request failed
/// otherwise: the layer's own errors
/// ([`DeadlineExceeded`](tower_http_retry::DeadlineExceeded),
/// [`AttemptTimedOut`](tower_http_retry::AttemptTimedOut),
/// [`ServiceNotReady`](tower_http_retry::ServiceNotReady)), or another layer's; those are
/// told apart with [`get_ref`](Error::get_ref):
///
/// ```
/// use std::time::Duration;
/// use tower::ServiceBuilder;
/// use tower_http_retry::{DeadlineExceeded, RetryLayer, RetryPolicy, StopReason};
/// use tower_http_retry_reqwest::{ReqwestService, RequestBuilderExt};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // Nothing listens there: every attempt's connection is refused.
/// let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
/// let client = reqwest::Client::builder().no_proxy().build().unwrap();
/// let service = ServiceBuilder::new()
///     .layer(RetryLayer::new().policy(RetryPolicy::new().deadline(Duration::from_secs(5))))
///     .service(ReqwestService::new(client.clone()));
///
/// let error = client.get(format!("http://{closed}/")).send_with(&service).await.unwrap_err();
/// assert!(error.as_reqwest().is_some_and(|e| e.is_connect()));
/// assert!(!error.get_ref().is::<DeadlineExceeded>());
/// let info = error.info().unwrap(); // what the layer did: 3 attempts, then it stopped
/// assert_eq!((info.attempts(), info.stop()), (3, StopReason::MaxAttempts));
/// # }
/// ```
///
/// The layer over a [`ReqwestService`](crate::ReqwestService) called with `oneshot` fails
/// with a `BoxError`; `Error::from` reads it the same way. A `reqwest::Error` met later
/// (reading the body with `text()`, `error_for_status()`) converts too, so one `?` serves
/// a whole function.
///
/// Its `Display` and `source()` are those of the error it holds (the layer's
/// [`RetryError`] for a request the layer handled).
#[derive(Debug)]
pub struct Error {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    /// The layer's: the record and the last error.
    Retry(RetryError),
    /// Anything else: a request reqwest could not build, reqwest's error without the layer,
    /// another layer's.
    Other(BoxError),
}

impl Error {
    /// reqwest's own error, if that is what the request failed with: the last attempt's,
    /// or the one that kept the request from being built. Found in the error as raised and
    /// what it wraps, so also below a layer of one's own that wraps errors.
    pub fn as_reqwest(&self) -> Option<&::reqwest::Error> {
        find(self.get_ref())
    }

    /// The record of what the layer did (attempts, waits, why it stopped), when the
    /// request went through the layer (also below a layer that wraps errors): `None` for
    /// a request reqwest could not build, or a service without the layer. Also the record
    /// of a body a resumable layer could not continue, from the `reqwest::Error` its read
    /// (`bytes()`, `chunk()`, ...) failed with: `Error::from(e).info()`, whose
    /// [`stop`](RetryInfo::stop) says why.
    pub fn info(&self) -> Option<&RetryInfo> {
        match &self.inner {
            Inner::Retry(error) => Some(error.info()),
            Inner::Other(error) => find::<RetryError>(&**error).map(RetryError::info),
        }
    }

    /// The error as it was raised: the last attempt's (reqwest's, or the layer's own
    /// limit), for `is::<DeadlineExceeded>()` and other downcasts.
    pub fn get_ref(&self) -> &(dyn StdError + Send + Sync + 'static) {
        match &self.inner {
            Inner::Retry(error) => error.get_ref(),
            Inner::Other(error) => &**error,
        }
    }
}

/// The first `E` in `error` and its sources.
fn find<'a, E: StdError + 'static>(error: &'a (dyn StdError + 'static)) -> Option<&'a E> {
    let mut error = Some(error);
    while let Some(current) = error {
        if let Some(found) = current.downcast_ref::<E>() {
            return Some(found);
        }
        error = current.source();
    }
    None
}

impl From<BoxError> for Error {
    /// What a service failed with: the layer's [`RetryError`] is kept whole; an error the
    /// layer never saw ([`ReqwestService`](crate::ReqwestService)'s own, without the layer)
    /// is taken out of its [`Recognized`].
    fn from(error: BoxError) -> Self {
        let inner = match error.downcast::<RetryError>() {
            Ok(error) => Inner::Retry(*error),
            Err(error) => match error.downcast::<Recognized>() {
                Ok(error) => Inner::Other(error.into_inner()),
                Err(error) => Inner::Other(error),
            },
        };
        Self { inner }
    }
}

impl From<::reqwest::Error> for Error {
    fn from(error: ::reqwest::Error) -> Self {
        Self {
            inner: Inner::Other(Box::new(error)),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Retry(error) => fmt::Display::fmt(error, f),
            Inner::Other(error) => fmt::Display::fmt(error, f),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.inner {
            Inner::Retry(error) => error.source(),
            Inner::Other(error) => error.source(),
        }
    }
}
