// The vocabulary of outcomes that the record, the gates and the classifiers share: why an
// outcome was retried (`RetryReason`, a protocol's own codes included), what kind of
// failure it was (`FailureKind`), and an error handed over already recognised
// (`Recognized`). Public as `classify::*`; a module of its own so that the record and the
// errors need nothing of the classification's error-chain walk.

use std::error::Error as StdError;
use std::fmt;

use http::StatusCode;
use tower::BoxError;

/// What kind of failure an outcome is, for the gates that weigh failures differently (a
/// quota that charges more after a timeout than after a throttling answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The server or the network failed for a moment: a connection failure, a timeout,
    /// 408, 500, 502, 503, 504, gRPC's `UNAVAILABLE`.
    Transient,
    /// The server asked the client to slow down: 429, gRPC's `RESOURCE_EXHAUSTED`.
    Throttling,
    /// Anything else a classifier retries.
    Other,
}

/// Why an attempt was retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryReason {
    /// The response had this status.
    Status(StatusCode),
    /// The connection could not be established: the server never saw the request.
    Connect,
    /// HTTP/2 `RST_STREAM(REFUSED_STREAM)` on the request's own stream: the server did
    /// not process the request.
    RefusedStream,
    /// hyper dropped the request before it started sending it: its connection closed, or
    /// was not ready (hyper's canceled error). The server never saw it.
    NotSent,
    /// HTTP/2 `GOAWAY`: the connection is going away. The stream may have been processed
    /// (hyper reports the connection's `GOAWAY` to the last stream the server processed
    /// too), so this is not proof that the server never saw the request.
    GoAway,
    /// The connection was reset, aborted, closed or broken by another I/O error before the
    /// response was complete, or hyper's connection task went away (its canceled and
    /// "dispatch task is gone" errors).
    ConnectionClosed,
    /// A timeout: tower's `Elapsed`, an I/O timeout, or this layer's
    /// [`AttemptTimedOut`](crate::AttemptTimedOut).
    Timeout,
    /// A protocol's own status code, as its classifier names it (gRPC's `UNAVAILABLE`,
    /// read from `grpc-status`): plain data, written and matched by its fields.
    ///
    /// ```
    /// use tower_http_retry::classify::{FailureKind, RetryReason};
    ///
    /// const UNAVAILABLE: RetryReason = RetryReason::Code {
    ///     protocol: "gRPC",
    ///     value: 14,
    ///     name: "UNAVAILABLE",
    ///     kind: FailureKind::Transient,
    /// };
    /// assert_eq!(UNAVAILABLE.to_string(), "gRPC UNAVAILABLE");
    /// assert_eq!(UNAVAILABLE.as_str(), "UNAVAILABLE");
    /// assert_eq!(UNAVAILABLE.kind(), FailureKind::Transient);
    /// assert!(matches!(UNAVAILABLE, RetryReason::Code { protocol: "gRPC", value: 14, .. }));
    /// ```
    Code {
        /// The protocol's name, such as `"gRPC"`.
        protocol: &'static str,
        /// The code's number.
        value: i32,
        /// The code's name, such as `"UNAVAILABLE"`.
        name: &'static str,
        /// What kind of failure the code is.
        kind: FailureKind,
    },
    /// A reason given by a custom classifier.
    Custom(&'static str),
    /// A hedge sent because its hedging delay passed with no answer yet
    /// ([`RetryPolicy::hedge`](crate::RetryPolicy::hedge)); a hedge sent early after a
    /// non-fatal failure has that failure's reason.
    Hedge,
}

impl RetryReason {
    /// True when the failure proves the server never processed the request, which makes
    /// a retry safe whatever the method: a connect error, or `REFUSED_STREAM` on the
    /// request's own stream. Nothing else is proof; a `GOAWAY` in particular is not.
    pub fn request_not_processed(&self) -> bool {
        matches!(
            self,
            RetryReason::Connect | RetryReason::RefusedStream | RetryReason::NotSent
        )
    }

    /// What kind of failure it is: 429 and throttling codes are
    /// [`Throttling`](FailureKind::Throttling); connection failures, timeouts, 408, 500,
    /// 502, 503 and 504 [`Transient`](FailureKind::Transient); a protocol code what its
    /// classifier says; anything else [`Other`](FailureKind::Other).
    pub fn kind(&self) -> FailureKind {
        match self {
            RetryReason::Status(status) => match status.as_u16() {
                429 => FailureKind::Throttling,
                408 | 500 | 502 | 503 | 504 => FailureKind::Transient,
                _ => FailureKind::Other,
            },
            RetryReason::Connect
            | RetryReason::RefusedStream
            | RetryReason::NotSent
            | RetryReason::GoAway
            | RetryReason::ConnectionClosed
            | RetryReason::Timeout => FailureKind::Transient,
            RetryReason::Code { kind, .. } => *kind,
            RetryReason::Custom(_) => FailureKind::Other,
            // A slow answer: a cost-weighted gate charges it as a transient failure.
            RetryReason::Hedge => FailureKind::Transient,
        }
    }

    /// A short, stable name, for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            RetryReason::Status(s) => match s.as_u16() {
                408 => "status_408",
                429 => "status_429",
                500 => "status_500",
                502 => "status_502",
                503 => "status_503",
                504 => "status_504",
                _ => "status_other",
            },
            RetryReason::Connect => "connect",
            RetryReason::RefusedStream => "refused_stream",
            RetryReason::NotSent => "not_sent",
            RetryReason::GoAway => "goaway",
            RetryReason::ConnectionClosed => "connection_closed",
            RetryReason::Timeout => "timeout",
            RetryReason::Code { name, .. } => name,
            RetryReason::Custom(name) => name,
            RetryReason::Hedge => "hedge",
        }
    }
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryReason::Status(s) => write!(f, "status {}", s.as_u16()),
            RetryReason::Connect => f.write_str("connect error"),
            RetryReason::RefusedStream => f.write_str("HTTP/2 stream refused"),
            RetryReason::NotSent => f.write_str("request not sent"),
            RetryReason::GoAway => f.write_str("HTTP/2 GOAWAY"),
            RetryReason::ConnectionClosed => f.write_str("connection closed"),
            RetryReason::Timeout => f.write_str("timeout"),
            RetryReason::Code { protocol, name, .. } => write!(f, "{protocol} {name}"),
            RetryReason::Custom(name) => f.write_str(name),
            RetryReason::Hedge => f.write_str("hedging delay"),
        }
    }
}

/// An error a client or protocol module recognised before handing it to the layer.
///
/// The core's classification knows std's, tower's, hyper's and h2's errors (hyper's and
/// h2's with the features of those names). A module on top
/// (the reqwest client, a protocol's transport glue) whose own error types it cannot know
/// returns this instead, with the reason it read from its error (reqwest's `is_connect`,
/// say): the [`DefaultClassifier`](crate::classify::DefaultClassifier) takes that reason as the verdict, or, with none, judges
/// the error by its source chain as usual. Nothing is registered anywhere and the user
/// does nothing: the module's service returns it.
///
/// The layer hands the error inside back to the caller, as the module raised it: a
/// [`RetryError`](crate::RetryError)'s source is never a `Recognized`, and the reason is
/// kept in the `RetryError`, so a second layer above still recognises it.
///
/// ```
/// use std::io;
/// use tower_http_retry::classify::{
///     Classification, Classify, DefaultClassifier, Outcome, Recognized, RetryReason,
/// };
///
/// // A client whose own error type says "connect failed" only through a method.
/// let error = Recognized::new(io::Error::other("no route"), Some(RetryReason::Connect));
/// let head = http::Request::new(()).into_parts().0;
/// assert_eq!(
///     DefaultClassifier.classify(&head, Outcome::Error(&error)),
///     Classification::Retry(RetryReason::Connect),
/// );
/// assert!(error.get_ref().is::<io::Error>());
/// ```
#[derive(Debug)]
pub struct Recognized {
    reason: Option<RetryReason>,
    error: BoxError,
}

impl Recognized {
    /// `error`, recognised as a retryable failure for `reason`, or (with `None`) as
    /// nothing the module knows: its source chain is judged as usual.
    pub fn new(error: impl Into<BoxError>, reason: Option<RetryReason>) -> Self {
        Self {
            reason,
            error: error.into(),
        }
    }

    /// The reason the module recognised, if any.
    pub fn reason(&self) -> Option<RetryReason> {
        self.reason
    }

    /// The error itself.
    pub fn get_ref(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.error
    }

    /// The error itself, given back.
    pub fn into_inner(self) -> BoxError {
        self.error
    }

    /// The error and the reason, given back.
    pub(crate) fn into_parts(self) -> (BoxError, Option<RetryReason>) {
        (self.error, self.reason)
    }
}

/// `error` itself, or the error inside it when it is a [`Recognized`].
pub(crate) fn unwrap_recognized(error: BoxError) -> BoxError {
    match error.downcast::<Recognized>() {
        Ok(recognized) => recognized.into_inner(),
        Err(error) => error,
    }
}

impl fmt::Display for Recognized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl StdError for Recognized {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.error)
    }
}
