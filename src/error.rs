// Errors the layer itself causes.
//
// Everything else (the inner service's errors, the last response) is passed through
// unchanged; these are the only errors that originate here, and callers can downcast the
// [`tower::BoxError`] they receive to them.

use std::fmt;
use std::time::Duration;

use tower::BoxError;

use crate::info::{RetryInfo, StopReason};
use crate::reason::{Recognized, RetryReason};

/// The error a [`Retry`](crate::Retry) service returns: the last attempt's error, with the
/// record of the whole logical request.
///
/// Its [`source`](std::error::Error::source) is the last error unchanged (the inner
/// service's, or the layer's own [`DeadlineExceeded`], [`AttemptTimedOut`] or
/// [`ServiceNotReady`]), so
/// classifiers that walk the source chain (tonic's status mapping, a circuit breaker, a
/// second retry layer) see through it. [`RetryError::into_source`] gives it back.
///
/// ```
/// use bytes::Bytes;
/// use http::Request;
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use tower_http_retry::{ReplayBody, RetryError, RetryLayer, StopReason};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // A server whose connection is always refused.
/// let inner = tower::service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
///     Err::<http::Response<()>, _>(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
/// });
/// let error = RetryLayer::new()
///     .layer(inner)
///     .oneshot(Request::get("http://127.0.0.1:9/").body(Full::new(Bytes::new())).unwrap())
///     .await
///     .unwrap_err();
/// let error = error.downcast::<RetryError>().unwrap();
/// assert_eq!(error.info().attempts(), 3);
/// assert_eq!(error.info().stop(), StopReason::MaxAttempts);
/// assert_eq!(error.to_string(), "connection refused (after 3 attempt(s); stopped: max attempts)");
/// let io = error.into_source().downcast::<std::io::Error>().unwrap();
/// assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
/// # }
/// ```
#[derive(Debug)]
pub struct RetryError {
    info: RetryInfo,
    source: BoxError,
    /// The reason a module above the core recognised in the source, which the source
    /// itself no longer carries (see [`Recognized`](crate::classify::Recognized)).
    recognized: Option<RetryReason>,
}

impl RetryError {
    /// The record and the last error; a [`Recognized`] error is unwrapped, its reason kept.
    ///
    /// The layer makes one for every failed request. Make one yourself where a service
    /// above the layer turns an outcome into an error and the caller should keep the
    /// record (a gRPC adapter turning a final Trailers-Only response into a `Status`).
    ///
    /// ```
    /// use std::io;
    /// use tower_http_retry::{RetryError, RetryInfo};
    ///
    /// let error = RetryError::new(RetryInfo::default(), Box::new(io::Error::other("gone")));
    /// assert_eq!(error.info().attempts(), 1);
    /// assert!(error.get_ref().is::<io::Error>());
    /// ```
    pub fn new(info: RetryInfo, source: BoxError) -> Self {
        let (source, recognized) = match source.downcast::<Recognized>() {
            Ok(recognized) => recognized.into_parts(),
            Err(source) => (source, None),
        };
        Self {
            info,
            source,
            recognized,
        }
    }

    /// The reason recognised in the source by the module that raised it, if any.
    pub(crate) fn recognized(&self) -> Option<RetryReason> {
        self.recognized
    }

    /// What happened: attempts, waits, why retrying stopped.
    pub fn info(&self) -> &RetryInfo {
        &self.info
    }

    /// The last error, as the inner service (or the layer's own limit) raised it.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }

    /// The last error, given back.
    pub fn into_source(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for RetryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (after {} attempt(s); stopped: {})",
            self.source,
            self.info.attempts(),
            self.info.stop()
        )
    }
}

impl std::error::Error for RetryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// The overall deadline of a logical request passed while an attempt was still in flight.
///
/// The attempt was dropped. Set with [`RetryPolicy::deadline`](crate::RetryPolicy::deadline).
/// The caller gets it inside a [`RetryError`]:
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use tower_http_retry::{DeadlineExceeded, RetryError, RetryLayer, RetryPolicy, StopReason};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // A server that never answers.
/// let inner = tower::service_fn(|_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| {
///     std::future::pending::<Result<Response<()>, std::convert::Infallible>>()
/// });
/// let client = RetryLayer::new()
///     .policy(RetryPolicy::default().deadline(Duration::from_secs(2)))
///     .layer(inner);
///
/// let request = Request::get("http://127.0.0.1:3000/").body(Full::new(Bytes::new())).unwrap();
/// let error = client.oneshot(request).await.unwrap_err();
/// let error = error.downcast_ref::<RetryError>().expect("the layer's error");
/// assert_eq!(error.info().stop(), StopReason::Deadline);
/// let deadline = error.get_ref().downcast_ref::<DeadlineExceeded>().expect("the deadline passed");
/// assert_eq!(deadline.deadline(), Duration::from_secs(2));
/// assert_eq!(error.info().attempts(), 1);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct DeadlineExceeded {
    deadline: Duration,
    /// The floor that was not left, when an attempt was not started for it
    /// ([`RetryPolicy::min_time_left`](crate::RetryPolicy::min_time_left)).
    floor: Option<Duration>,
}

impl DeadlineExceeded {
    /// The error of a request whose `deadline` passed, as the layer makes it: for a
    /// service that stands in for the layer (a test double) or maps its errors. How many
    /// attempts it took is the record's ([`RetryError::info`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::DeadlineExceeded;
    ///
    /// let error = DeadlineExceeded::new(Duration::from_secs(2));
    /// assert_eq!(error.to_string(), "request deadline of 2s exceeded");
    /// ```
    pub fn new(deadline: Duration) -> Self {
        Self {
            deadline,
            floor: None,
        }
    }

    /// The error of a request whose next attempt was not started: less than `floor` was
    /// left before the `deadline`.
    pub(crate) fn with_floor(deadline: Duration, floor: Duration) -> Self {
        Self {
            deadline,
            floor: Some(floor),
        }
    }

    /// The deadline that passed, measured from the start of the logical request.
    pub fn deadline(&self) -> Duration {
        self.deadline
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request deadline of {:?} exceeded", self.deadline)?;
        match self.floor {
            Some(floor) => write!(
                f,
                ": less than the {floor:?} floor was left to start an attempt"
            ),
            None => Ok(()),
        }
    }
}

impl std::error::Error for DeadlineExceeded {}

/// One attempt took longer than its per-attempt timeout and was dropped.
///
/// The default classification treats it as a retryable timeout. Set with
/// [`RetryPolicy::attempt_timeout`](crate::RetryPolicy::attempt_timeout). When the last
/// attempt timed out too, the caller gets it inside a [`RetryError`]:
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use tower_http_retry::{AttemptTimedOut, RetryError, RetryLayer, RetryPolicy};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // A server that takes a minute to answer.
/// let inner = tower::service_fn(|_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| async {
///     tokio::time::sleep(Duration::from_secs(60)).await;
///     Ok::<_, std::convert::Infallible>(Response::new(()))
/// });
/// let client = RetryLayer::new()
///     .policy(RetryPolicy::default().max_attempts(2).attempt_timeout(Duration::from_secs(1)))
///     .layer(inner);
///
/// let request = Request::get("http://127.0.0.1:3000/").body(Full::new(Bytes::new())).unwrap();
/// let error = client.oneshot(request).await.unwrap_err();
/// let error = error.downcast_ref::<RetryError>().expect("the layer's error");
/// let timed_out = error.get_ref().downcast_ref::<AttemptTimedOut>().expect("both attempts timed out");
/// assert_eq!(timed_out.timeout(), Duration::from_secs(1));
/// assert_eq!(error.info().returned(), Some(2)); // the second attempt's
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct AttemptTimedOut {
    timeout: Duration,
}

impl AttemptTimedOut {
    /// The error of an attempt cut off after `timeout`, as the layer makes it: for a
    /// service that stands in for the layer (a test double) or maps its errors. Which
    /// attempt it was is the record's ([`RetryInfo::returned`](crate::RetryInfo::returned)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::AttemptTimedOut;
    ///
    /// let error = AttemptTimedOut::new(Duration::from_millis(500));
    /// assert_eq!(error.to_string(), "attempt timed out after 500ms");
    /// ```
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }

    /// The time the attempt was given.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl fmt::Display for AttemptTimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "attempt timed out after {:?}", self.timeout)
    }
}

impl std::error::Error for AttemptTimedOut {}

/// A retry was decided, but the inner service did not become ready for it within the
/// attempt timeout, so it was never sent.
///
/// Waiting for the retry's service to become ready (`poll_ready` on a clone of it) is
/// bounded by the deadline, else by the attempt timeout; when the deadline passes first the
/// caller gets [`DeadlineExceeded`] instead. The record
/// ([`RetryError::info`]) keeps the retry that was decided, with what asked for it (the
/// 503, say), and says [`StopReason::ServiceNotReady`](crate::StopReason::ServiceNotReady).
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http::{Request, Response, StatusCode};
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use tower_http_retry::{RetryError, RetryLayer, RetryPolicy, ServiceNotReady, StopReason};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // Answers 503, then is never ready again (a pool whose every connection is busy).
/// # #[derive(Clone)]
/// # struct Busy(std::sync::Arc<std::sync::atomic::AtomicBool>);
/// # impl tower::Service<Request<tower_http_retry::ReplayBody<Full<Bytes>>>> for Busy {
/// #     type Response = Response<()>;
/// #     type Error = std::convert::Infallible;
/// #     type Future = std::future::Ready<Result<Response<()>, std::convert::Infallible>>;
/// #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
/// #         if self.0.load(std::sync::atomic::Ordering::SeqCst) { std::task::Poll::Pending } else { std::task::Poll::Ready(Ok(())) }
/// #     }
/// #     fn call(&mut self, _: Request<tower_http_retry::ReplayBody<Full<Bytes>>>) -> Self::Future {
/// #         self.0.store(true, std::sync::atomic::Ordering::SeqCst);
/// #         std::future::ready(Ok(Response::builder().status(StatusCode::SERVICE_UNAVAILABLE).body(()).unwrap()))
/// #     }
/// # }
/// # let inner = Busy(Default::default());
/// let client = RetryLayer::new()
///     .policy(RetryPolicy::default().attempt_timeout(Duration::from_secs(1)))
///     .layer(inner);
/// let request = Request::get("http://127.0.0.1:3000/").body(Full::new(Bytes::new())).unwrap();
/// let error = client.oneshot(request).await.unwrap_err();
/// let error = error.downcast_ref::<RetryError>().unwrap();
/// assert!(error.get_ref().is::<ServiceNotReady>());
/// assert_eq!(error.info().stop(), StopReason::ServiceNotReady);
/// assert_eq!(error.info().attempts(), 1);
/// assert_eq!(error.info().retries().len(), 1); // the retry the 503 asked for
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct ServiceNotReady {
    timeout: Duration,
}

impl ServiceNotReady {
    /// The error of a retry whose service was not ready within `timeout`, as the layer
    /// makes it: for a service that stands in for the layer (a test double) or maps its
    /// errors. The retry that was not sent is the record's last
    /// ([`RetryInfo::retries`](crate::RetryInfo::retries)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::ServiceNotReady;
    ///
    /// let error = ServiceNotReady::new(Duration::from_secs(1));
    /// assert_eq!(error.to_string(), "the inner service was not ready for a retry within 1s");
    /// ```
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }

    /// How long the layer waited for the service to become ready.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl fmt::Display for ServiceNotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the inner service was not ready for a retry within {:?}",
            self.timeout
        )
    }
}

impl std::error::Error for ServiceNotReady {}

/// A request the client's own rate limit refused to send: not one attempt went out, so the
/// server never saw it and nothing is retried. The record says so
/// ([`RetryInfo::attempts`](crate::RetryInfo::attempts) is 0, written "no attempt sent")
/// and why ([`RetryInfo::stop`](crate::RetryInfo::stop): [`StopReason::Throttled`]).
///
/// A gate asked before first attempts makes it: an
/// [`AdaptiveLimiter`](crate::AdaptiveLimiter) whose wait for a token would be longer than
/// its `max_wait`, or an [`AdaptiveThrottle`](crate::AdaptiveThrottle) that rejected the
/// attempt. (A retry they refuse returns the last outcome instead, as a budget's refusal
/// does.) Like the layer's other errors it
/// comes inside a [`RetryError`], which carries the record.
///
/// ```
/// use std::time::Duration;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use bytes::Bytes;
/// use tower::{Layer, ServiceExt};
/// use tower_http_retry::{
///     AdaptiveLimiter, LocallyRefused, RetryError, RetryLayer, RetryPolicy, StopReason,
/// };
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// // A server that throttles everything, and a limiter that never waits.
/// let server = tower::service_fn(|_: Request<_>| async {
///     Ok::<_, std::convert::Infallible>(Response::builder().status(429).body(()).unwrap())
/// });
/// let limiter = AdaptiveLimiter::builder().max_wait(Duration::ZERO).build();
/// let policy = RetryPolicy::new().max_attempts(1).gate(limiter);
/// let client = RetryLayer::new().policy(policy).layer(server);
/// let get = || Request::get("http://api.test/").body(Full::new(Bytes::new())).unwrap();
/// // The first request is sent and throttled; the limiter is on, its bucket empty.
/// assert_eq!(client.clone().oneshot(get()).await.unwrap().status(), 429);
/// let error = client.oneshot(get()).await.unwrap_err();
/// let error = error.downcast_ref::<RetryError>().unwrap();
/// assert!(error.get_ref().is::<LocallyRefused>());
/// assert_eq!(error.info().attempts(), 0);
/// assert_eq!(error.info().stop(), StopReason::Throttled);
/// assert_eq!(error.info().to_string(), "no attempt sent; stopped: throttled");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct LocallyRefused {
    stop: StopReason,
}

impl LocallyRefused {
    pub(crate) fn new(stop: StopReason) -> Self {
        Self { stop }
    }
}

impl fmt::Display for LocallyRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request not sent: the client's own rate limit refused it ({})",
            self.stop
        )
    }
}

impl std::error::Error for LocallyRefused {}

/// A configuration value was refused at construction: the one error type of every `try_`
/// constructor ([`RetryPolicy::try_max_attempts`](crate::RetryPolicy::try_max_attempts),
/// [`Backoff::try_exponential`](crate::Backoff::try_exponential),
/// [`GateBuilder::try_build`](crate::GateBuilder::try_build), ...). The plain constructors
/// panic with the same message, which names the value at fault and says what is accepted.
///
/// ```
/// use tower_http_retry::{RetryBudget, RetryPolicy};
///
/// let error = RetryBudget::builder().ratio(f64::NAN).try_build().unwrap_err();
/// assert_eq!(
///     error.to_string(),
///     "invalid retry budget: ratio is NaN; it must be a finite number from 0 to 1000",
/// );
/// let error = RetryPolicy::new().try_max_attempts(0).unwrap_err();
/// assert!(error.to_string().contains("max_attempts"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidConfig {
    message: String,
}

impl InvalidConfig {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

impl fmt::Display for InvalidConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The gates' messages name their kind ("invalid retry budget: ..."); the rest say
        // which setting.
        match self.message.starts_with("invalid ") {
            true => f.write_str(&self.message),
            false => write!(f, "invalid retry configuration: {}", self.message),
        }
    }
}

impl std::error::Error for InvalidConfig {}
