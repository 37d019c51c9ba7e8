//! [`Retry`]: readiness, policy choice, the idempotency key, body wrapping, the deposit.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::header::Entry;
use http::{Method, Request, Response};
use http_body::Body;
use tower::BoxError;
use tower_service::Service;

use crate::future::{Attempts, ResponseFuture};
use crate::head::Head;
use crate::layer::{Config, RetryLayer};
use crate::replay::ReplayBody;
use crate::trace::Trace;

/// Retries requests to the inner service when it is safe and worth it.
///
/// Made by [`RetryLayer`]. The inner service receives `Request<ReplayBody<B>>`.
///
/// # Errors
///
/// A response, retryable or not, is returned as `Ok` (a last 503 included). An error is a
/// [`tower::BoxError`]: the last attempt's error from the inner service, unchanged, or the
/// layer's own [`DeadlineExceeded`](crate::DeadlineExceeded) or
/// [`AttemptTimedOut`](crate::AttemptTimedOut). Downcast it to tell them apart:
///
/// ```
/// use std::io;
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tower::ServiceExt;
/// use tower_http_retry::{DeadlineExceeded, Retry};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let inner = tower::service_fn(|_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| async {
///     Err::<Response<()>, _>(io::Error::from(io::ErrorKind::PermissionDenied))
/// });
/// let request = Request::get("http://127.0.0.1:3000/").body(Full::new(Bytes::new())).unwrap();
/// let error = Retry::new(inner).oneshot(request).await.unwrap_err();
/// if let Some(io) = error.downcast_ref::<io::Error>() {
///     // The inner service's error, passed through (not retried: not a connection failure).
///     assert_eq!(io.kind(), io::ErrorKind::PermissionDenied);
/// } else if error.is::<DeadlineExceeded>() {
///     unreachable!("no deadline was set");
/// }
/// # assert!(error.is::<io::Error>());
/// # }
/// ```
///
/// # Clone
///
/// Clones share the configuration and the retry budget (an `Arc` each): a budget spent
/// by one clone is spent for all of them, which is what stops a fleet of tasks, each with
/// its own clone, from turning an outage into a retry storm.
///
/// The first attempt goes to the inner service that `poll_ready` readied. A retry goes to
/// a clone of the inner service, taken when the first retry is decided (from a copy kept
/// when the layer wrapped the service, so changes made through [`Retry::get_mut`] later
/// do not reach retries) and driven to readiness before every retry. A request that
/// succeeds at once clones nothing.
#[derive(Clone)]
pub struct Retry<S> {
    inner: S,
    prototype: Prototype<S>,
    config: Arc<Config>,
}

/// The copy of the inner service that retries clone from. Behind a `Mutex` so that the
/// response future stays `Send` for services that are `Send` but not `Sync` (tower's
/// `BoxCloneService`); it is locked only to clone, when a first retry is decided.
pub(crate) struct Prototype<S>(Arc<Mutex<S>>);

impl<S> Clone for Prototype<S> {
    fn clone(&self) -> Self {
        Prototype(Arc::clone(&self.0))
    }
}

impl<S: Clone> Prototype<S> {
    fn new(service: &S) -> Self {
        Prototype(Arc::new(Mutex::new(service.clone())))
    }

    /// A fresh clone of the inner service.
    pub(crate) fn make(&self) -> S {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }
}

impl<S: Clone> Retry<S> {
    /// Wraps `inner` with every default of [`RetryLayer::new`]. For anything else, build
    /// a [`RetryLayer`] and apply it (`ServiceBuilder::layer`, or [`Layer::layer`]).
    ///
    /// [`Layer::layer`]: tower_layer::Layer::layer
    ///
    /// ```
    /// use bytes::Bytes;
    /// use http::{Request, Response, StatusCode};
    /// use http_body_util::Full;
    /// use tower::ServiceExt;
    /// use tower_http_retry::{Retry, RetryInfo};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() {
    /// # let calls = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    /// // `inner` answers 503 once, then 200.
    /// # let inner = tower::service_fn(move |_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| {
    /// #     let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
    /// #     let status = if first { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    /// #     async move { Ok::<_, std::convert::Infallible>(Response::builder().status(status).body(()).unwrap()) }
    /// # });
    /// let client = Retry::new(inner);
    /// let request = Request::get("http://127.0.0.1:3000/").body(Full::new(Bytes::new())).unwrap();
    /// let response = client.oneshot(request).await.unwrap();
    /// assert_eq!(response.status(), StatusCode::OK);
    /// assert_eq!(response.extensions().get::<RetryInfo>().unwrap().attempts, 2);
    /// # }
    /// ```
    pub fn new(inner: S) -> Self {
        tower_layer::Layer::layer(&RetryLayer::new(), inner)
    }

    pub(crate) fn from_config(inner: S, config: Arc<Config>) -> Self {
        let prototype = Prototype::new(&inner);
        Self {
            inner,
            prototype,
            config,
        }
    }
}

impl<S> Retry<S> {
    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    ///
    /// Changes made through it reach the first attempt of later requests; retries clone
    /// the copy kept when the layer wrapped the service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B, RB> Service<Request<B>> for Retry<S>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let config = &self.config;
        let policy_ref = config.select(&request);
        let policy = policy_ref.get(config);
        let attempts = Attempts::start(policy);
        let trace = Trace::new(&request);

        if policy.is_never() || request.method() == Method::CONNECT {
            if let Some(name) = &config.attempt_header {
                request
                    .headers_mut()
                    .insert(name.clone(), http::HeaderValue::from_static("1"));
            }
            let future = self.inner.call(request.map(ReplayBody::passthrough));
            return ResponseFuture::once(future, attempts, trace);
        }

        // The key every attempt carries, for `RetryInfo`. Where keys are stamped, the one
        // lookup that finds or inserts it; elsewhere it is looked for in the head's copy.
        let stamped = match config.key_for(policy) {
            Some(key) if key.applies_to(request.method()) => {
                Some(match request.headers_mut().entry(key.header()) {
                    Entry::Occupied(caller) => Some(caller.get().clone()),
                    Entry::Vacant(slot) => match key.make_value() {
                        Some(value) => Some(slot.insert(value).clone()),
                        None => {
                            #[cfg(feature = "tracing")]
                            tracing::warn!(
                                "idempotency key generator made an invalid header value; sending without a key"
                            );
                            None
                        }
                    },
                })
            }
            _ => None,
        };
        if let Some(budget) = config.budget_for(policy) {
            budget.deposit();
        }
        if let Some(name) = &config.attempt_header {
            request
                .headers_mut()
                .insert(name.clone(), http::HeaderValue::from_static("1"));
        }

        let (parts, body) = request.into_parts();
        // hyper stops sending a body at the request's own `Content-Length` without a last
        // poll; the header is read only when the body does not know its length itself.
        let declared_len = match body.size_hint().exact() {
            Some(_) => None,
            None => content_length(&parts.headers),
        };
        let (body, replay) = ReplayBody::with_handle(body, config.max_replay_bytes, declared_len);
        let head = Head::copy(&parts, policy.has_custom_classifier());
        let key = stamped.unwrap_or_else(|| head.get(config.key_header_for(policy)).cloned());
        // The service that `poll_ready` readied takes the first attempt; retries clone
        // from the prototype, and only if they happen.
        let future = self.inner.call(Request::from_parts(parts, body));
        ResponseFuture::retrying(
            future,
            attempts,
            self.prototype.clone(),
            head,
            key,
            replay,
            Arc::clone(&self.config),
            policy_ref,
            trace,
        )
    }
}

/// The request's `Content-Length`, if it has exactly one valid value.
fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    let mut values = headers.get_all(http::header::CONTENT_LENGTH).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let text = value.to_str().ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

impl<S: fmt::Debug> fmt::Debug for Retry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}
