//! Which outcomes are worth another attempt.
//!
//! The default table (see [`DefaultClassifier`]):
//!
//! | outcome | classification |
//! | --- | --- |
//! | connect error, connection refused | [`Classification::Retry`], [`RetryReason::Connect`]: the server never saw the request |
//! | HTTP/2 `REFUSED_STREAM`, `GOAWAY` with `NO_ERROR` | [`Classification::Retry`]: the server never processed the stream |
//! | connection reset / aborted, broken pipe, unexpected EOF, incomplete message, other `GOAWAY` | [`Classification::Retry`], [`RetryReason::ConnectionClosed`] |
//! | a timeout: tower's `Elapsed`, `io::ErrorKind::TimedOut`, [`AttemptTimedOut`] | [`Classification::Retry`], [`RetryReason::Timeout`] |
//! | 408, 429, 502, 503, 504 | [`Classification::Retry`], [`RetryReason::Status`] |
//! | 500 | [`Classification::RetryOnce`]: at most one retry per logical request |
//! | any other status, any other error | [`Classification::Done`] |
//!
//! Whether a retryable outcome is actually retried also depends on the request: see
//! [`RetryReason::request_not_processed`] and the crate docs on idempotency.
//!
//! Errors are recognised by walking the whole [`std::error::Error::source`] chain (and the
//! payload of every custom [`std::io::Error`]) and downcasting at each step, never by the
//! depth at which they sit and never by their text.
//!
//! With the `reqwest` feature, a `reqwest::Error` whose `is_connect()` is true counts as a
//! connect error (a connect timeout too), one whose `is_timeout()` is true as a timeout
//! (reqwest's own timeout error is a private type), and any other is judged by its source.

use std::error::Error as StdError;
use std::fmt;
use std::io;

use http::{HeaderMap, StatusCode, request};

use crate::error::{AttemptTimedOut, DeadlineExceeded};

/// What one attempt produced, as a classifier sees it.
#[derive(Debug, Clone, Copy)]
pub enum Outcome<'a> {
    /// The inner service answered.
    Response {
        /// The response's status.
        status: StatusCode,
        /// The response's headers.
        headers: &'a HeaderMap,
    },
    /// The inner service failed.
    Error(&'a (dyn StdError + 'static)),
}

/// A classifier's verdict on one outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Classification {
    /// Worth another attempt, if the request, the limits and the budget allow it.
    Retry(RetryReason),
    /// Worth another attempt only if no earlier retry of this logical request had the same
    /// reason (the default for a 500).
    RetryOnce(RetryReason),
    /// Final: returned to the caller as is.
    Done,
}

/// Why an attempt was retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryReason {
    /// The response had this status.
    Status(StatusCode),
    /// The connection could not be established: the server never saw the request.
    Connect,
    /// HTTP/2 `REFUSED_STREAM`: the server did not process the request.
    RefusedStream,
    /// HTTP/2 `GOAWAY` with `NO_ERROR` for a stream the server did not process.
    GoAway,
    /// The connection was reset, aborted or closed before the response was complete.
    ConnectionClosed,
    /// A timeout: tower's `Elapsed`, an I/O timeout, or this layer's
    /// [`AttemptTimedOut`].
    Timeout,
    /// A reason given by a custom classifier.
    Custom(&'static str),
}

impl RetryReason {
    /// True when the failure proves the server never processed the request, which makes
    /// a retry safe whatever the method.
    pub fn request_not_processed(&self) -> bool {
        matches!(
            self,
            RetryReason::Connect | RetryReason::RefusedStream | RetryReason::GoAway
        )
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
            RetryReason::GoAway => "goaway",
            RetryReason::ConnectionClosed => "connection_closed",
            RetryReason::Timeout => "timeout",
            RetryReason::Custom(name) => name,
        }
    }
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RetryReason::Status(s) => write!(f, "status {}", s.as_u16()),
            RetryReason::Connect => f.write_str("connect error"),
            RetryReason::RefusedStream => f.write_str("HTTP/2 stream refused"),
            RetryReason::GoAway => f.write_str("HTTP/2 GOAWAY before processing"),
            RetryReason::ConnectionClosed => f.write_str("connection closed"),
            RetryReason::Timeout => f.write_str("timeout"),
            RetryReason::Custom(name) => f.write_str(name),
        }
    }
}

/// Decides which outcomes are retried. Replaces the default with
/// [`RetryPolicy::classifier`](crate::RetryPolicy::classifier).
///
/// It sees the request's head (method, URI, headers) and the outcome. Closures with the
/// same signature implement it; a custom classifier can fall back to
/// [`DefaultClassifier`]:
///
/// ```
/// use http::{request, StatusCode};
/// use tower_http_retry::classify::{Classification, Classify, DefaultClassifier, Outcome, RetryReason};
///
/// // Also retry 409 Conflict on this API, once.
/// let classifier = |head: &request::Parts, outcome: Outcome<'_>| match outcome {
///     Outcome::Response { status: StatusCode::CONFLICT, .. } => {
///         Classification::RetryOnce(RetryReason::Custom("conflict"))
///     }
///     _ => DefaultClassifier.classify(head, outcome),
/// };
/// # let _ = tower_http_retry::RetryPolicy::default().classifier(classifier);
/// ```
pub trait Classify: Send + Sync + 'static {
    /// Classifies one outcome of the request whose head is `request`.
    fn classify(&self, request: &request::Parts, outcome: Outcome<'_>) -> Classification;
}

impl<F> Classify for F
where
    F: Fn(&request::Parts, Outcome<'_>) -> Classification + Send + Sync + 'static,
{
    fn classify(&self, request: &request::Parts, outcome: Outcome<'_>) -> Classification {
        self(request, outcome)
    }
}

/// The default classification of the [module docs](self).
#[derive(Debug, Clone, Copy, Default)]
pub struct DefaultClassifier;

impl Classify for DefaultClassifier {
    fn classify(&self, _request: &request::Parts, outcome: Outcome<'_>) -> Classification {
        classify_outcome(outcome)
    }
}

/// The default table applied to one outcome: it needs nothing of the request.
pub(crate) fn classify_outcome(outcome: Outcome<'_>) -> Classification {
    match outcome {
        Outcome::Response { status, .. } => classify_status(status),
        Outcome::Error(error) => classify_error(error),
    }
}

/// The status part of the default table.
pub fn classify_status(status: StatusCode) -> Classification {
    match status.as_u16() {
        408 | 429 | 502 | 503 | 504 => Classification::Retry(RetryReason::Status(status)),
        500 => Classification::RetryOnce(RetryReason::Status(status)),
        _ => Classification::Done,
    }
}

/// The error part of the default table: walks the whole chain, first recognised link wins.
pub fn classify_error(error: &(dyn StdError + 'static)) -> Classification {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(verdict) = classify_link(error) {
            return verdict;
        }
        next = match error.downcast_ref::<io::Error>() {
            // `io::Error::source` skips the custom payload itself; look at it first.
            Some(io) => match io.get_ref() {
                Some(inner) => Some(inner as &(dyn StdError + 'static)),
                None => io.source(),
            },
            None => error.source(),
        };
    }
    Classification::Done
}

fn retry(reason: RetryReason) -> Option<Classification> {
    Some(Classification::Retry(reason))
}

fn classify_link(error: &(dyn StdError + 'static)) -> Option<Classification> {
    if error.is::<AttemptTimedOut>() || error.is::<tower::timeout::error::Elapsed>() {
        return retry(RetryReason::Timeout);
    }
    if error.is::<DeadlineExceeded>() {
        return Some(Classification::Done);
    }
    if let Some(io) = error.downcast_ref::<io::Error>() {
        return classify_io(io.kind());
    }
    #[cfg(feature = "reqwest")]
    if let Some(verdict) = reqwest_errors::classify(error) {
        return Some(verdict);
    }
    #[cfg(feature = "hyper")]
    if let Some(verdict) = hyper_errors::classify(error) {
        return Some(verdict);
    }
    None
}

fn classify_io(kind: io::ErrorKind) -> Option<Classification> {
    use io::ErrorKind::*;
    match kind {
        ConnectionRefused => retry(RetryReason::Connect),
        ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof | NotConnected => {
            retry(RetryReason::ConnectionClosed)
        }
        TimedOut => retry(RetryReason::Timeout),
        _ => None,
    }
}

#[cfg(feature = "hyper")]
mod hyper_errors {
    use super::{Classification, RetryReason, StdError, retry};

    pub(super) fn classify(error: &(dyn StdError + 'static)) -> Option<Classification> {
        if let Some(e) = error.downcast_ref::<hyper_util::client::legacy::Error>() {
            // Anything else the legacy client reports is judged by its source.
            return e
                .is_connect()
                .then_some(Classification::Retry(RetryReason::Connect));
        }
        if let Some(e) = error.downcast_ref::<hyper::Error>() {
            if e.is_user() {
                // The caller's own body or head was at fault: repeating it cannot help.
                return Some(Classification::Done);
            }
            if e.is_timeout() {
                return retry(RetryReason::Timeout);
            }
            if e.is_incomplete_message() || e.is_canceled() || e.is_closed() {
                return retry(RetryReason::ConnectionClosed);
            }
            return None;
        }
        if let Some(e) = error.downcast_ref::<h2::Error>() {
            let reason = e.reason();
            if reason == Some(h2::Reason::REFUSED_STREAM) {
                return retry(RetryReason::RefusedStream);
            }
            if e.is_go_away() {
                return if reason == Some(h2::Reason::NO_ERROR) && e.is_remote() {
                    retry(RetryReason::GoAway)
                } else {
                    retry(RetryReason::ConnectionClosed)
                };
            }
            return None;
        }
        None
    }
}

#[cfg(feature = "reqwest")]
mod reqwest_errors {
    use super::{Classification, RetryReason, StdError, retry};

    pub(super) fn classify(error: &(dyn StdError + 'static)) -> Option<Classification> {
        let e = error.downcast_ref::<reqwest::Error>()?;
        // A connect timeout is both: the connection never existed, which is the stronger
        // claim.
        if e.is_connect() {
            return retry(RetryReason::Connect);
        }
        // reqwest's own timeout error is a private type: only `is_timeout` can tell.
        if e.is_timeout() {
            return retry(RetryReason::Timeout);
        }
        // Anything else is judged by its source (a reset, a closed connection, ...).
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapper(Box<dyn StdError + Send + Sync>);
    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapper")
        }
    }
    impl StdError for Wrapper {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }

    fn nest(
        mut e: Box<dyn StdError + Send + Sync>,
        depth: usize,
    ) -> Box<dyn StdError + Send + Sync> {
        for _ in 0..depth {
            e = Box::new(Wrapper(e));
        }
        e
    }

    #[test]
    fn status_table() {
        for code in [408, 429, 502, 503, 504] {
            let s = StatusCode::from_u16(code).unwrap();
            assert_eq!(
                classify_status(s),
                Classification::Retry(RetryReason::Status(s))
            );
        }
        assert_eq!(
            classify_status(StatusCode::INTERNAL_SERVER_ERROR),
            Classification::RetryOnce(RetryReason::Status(StatusCode::INTERNAL_SERVER_ERROR))
        );
        for code in [
            200, 201, 204, 301, 304, 400, 401, 403, 404, 409, 422, 501, 505,
        ] {
            let s = StatusCode::from_u16(code).unwrap();
            assert_eq!(classify_status(s), Classification::Done, "{code}");
        }
    }

    #[test]
    fn io_errors_are_found_at_any_depth() {
        for depth in [0, 1, 5, 40] {
            let e = nest(
                Box::new(io::Error::from(io::ErrorKind::ConnectionReset)),
                depth,
            );
            assert_eq!(
                classify_error(&*e),
                Classification::Retry(RetryReason::ConnectionClosed),
                "depth {depth}"
            );
        }
    }

    #[test]
    fn io_kinds() {
        let cases = [
            (
                io::ErrorKind::ConnectionRefused,
                Classification::Retry(RetryReason::Connect),
            ),
            (
                io::ErrorKind::ConnectionAborted,
                Classification::Retry(RetryReason::ConnectionClosed),
            ),
            (
                io::ErrorKind::BrokenPipe,
                Classification::Retry(RetryReason::ConnectionClosed),
            ),
            (
                io::ErrorKind::UnexpectedEof,
                Classification::Retry(RetryReason::ConnectionClosed),
            ),
            (
                io::ErrorKind::TimedOut,
                Classification::Retry(RetryReason::Timeout),
            ),
            (io::ErrorKind::PermissionDenied, Classification::Done),
            (io::ErrorKind::InvalidData, Classification::Done),
        ];
        for (kind, expected) in cases {
            assert_eq!(classify_error(&io::Error::from(kind)), expected, "{kind:?}");
        }
    }

    #[test]
    fn custom_io_payload_is_walked() {
        let inner = io::Error::from(io::ErrorKind::ConnectionReset);
        let outer = io::Error::other(Wrapper(Box::new(inner)));
        assert_eq!(
            classify_error(&outer),
            Classification::Retry(RetryReason::ConnectionClosed)
        );
    }

    #[test]
    fn timeouts() {
        let e = nest(Box::new(tower::timeout::error::Elapsed::new()), 2);
        assert_eq!(
            classify_error(&*e),
            Classification::Retry(RetryReason::Timeout)
        );
        let e = nest(
            Box::new(AttemptTimedOut::new(std::time::Duration::from_secs(1), 1)),
            1,
        );
        assert_eq!(
            classify_error(&*e),
            Classification::Retry(RetryReason::Timeout)
        );
    }

    #[test]
    fn unknown_errors_and_text_are_not_retried() {
        let e: Box<dyn StdError + Send + Sync> = "connection reset by peer".into();
        assert_eq!(classify_error(&*nest(e, 3)), Classification::Done);
        let d = DeadlineExceeded::new(std::time::Duration::from_secs(1), 2);
        assert_eq!(classify_error(&d), Classification::Done);
    }

    #[cfg(feature = "hyper")]
    #[test]
    fn h2_refused_stream_and_goaway() {
        let refused = h2::Error::from(h2::Reason::REFUSED_STREAM);
        assert_eq!(
            classify_error(&*nest(Box::new(refused), 2)),
            Classification::Retry(RetryReason::RefusedStream)
        );
        assert!(RetryReason::RefusedStream.request_not_processed());
        assert!(!RetryReason::ConnectionClosed.request_not_processed());
        let other = h2::Error::from(h2::Reason::INTERNAL_ERROR);
        assert_eq!(classify_error(&other), Classification::Done);
    }
}
