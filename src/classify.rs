//! Which outcomes are worth another attempt.
//!
//! The default table (see [`DefaultClassifier`]):
//!
//! | outcome | classification |
//! | --- | --- |
//! | connect error, connection refused | [`Classification::Retry`], [`RetryReason::Connect`]: the server never saw the request |
//! | HTTP/2 `RST_STREAM(REFUSED_STREAM)` received on the request's own stream | [`Classification::Retry`], [`RetryReason::RefusedStream`]: the server did not process it |
//! | hyper's canceled error: the connection closed, or was not ready, before the request was started | [`Classification::Retry`], [`RetryReason::NotSent`]: the server never saw it |
//! | HTTP/2 `GOAWAY` (any code) | [`Classification::Retry`], [`RetryReason::GoAway`]: the connection is going away, and the stream may have been processed |
//! | connection reset / aborted, broken pipe, unexpected EOF, incomplete message, hyper's "dispatch task is gone" error, an HTTP/2 `RST_STREAM` with any other code received before the answer | [`Classification::Retry`], [`RetryReason::ConnectionClosed`] |
//! | any other I/O error that broke the connection, as hyper or h2 reports it (an HTTP/2 connection that ends in the middle of a frame) | [`Classification::Retry`], [`RetryReason::ConnectionClosed`] |
//! | a timeout: tower's `Elapsed`, `io::ErrorKind::TimedOut`, [`AttemptTimedOut`] | [`Classification::Retry`], [`RetryReason::Timeout`] |
//! | 408, 429, 502, 503, 504 | [`Classification::Retry`], [`RetryReason::Status`] |
//! | 500 | [`Classification::RetryOnce`]: at most one retry per logical request |
//! | any other status below 400 | [`Classification::Success`] |
//! | any other status, any other error | [`Classification::Done`] |
//!
//! Whether a retryable outcome is actually retried also depends on the request: see
//! [`RetryReason::request_not_processed`] and the crate docs on idempotency. Only a connect
//! error, a request hyper never started, and a `REFUSED_STREAM` on the request's own stream
//! prove that the server never saw the request, so only those are retried for a request that may not be repeated (a POST
//! without an idempotency key). A `GOAWAY` is no such proof: hyper hands the connection's
//! `GOAWAY` error to every stream still open on it, the last one the server processed
//! included (against nginx, which closes a connection with `GOAWAY` after its
//! `keepalive_requests`, keyless POSTs were applied twice when `GOAWAY` was taken as proof).
//!
//! An error raised by the caller's own request body is not retried either; the retry loop
//! knows it from the [`ReplayBody`](crate::ReplayBody) that carried the body, not from
//! hyper's "user error" class (which also holds "dispatch task is gone", a connection
//! failure).
//!
//! Errors are recognised by walking the whole [`std::error::Error::source`] chain (and the
//! payload of every custom [`std::io::Error`], and the I/O error inside an `h2::Error`,
//! which has no source) and downcasting at each step, never by the depth at which they sit
//! and never by their text. The first link recognised decides. A connection's own I/O
//! failure (hyper's error with an I/O error as its cause, h2's error of the I/O kind) is
//! judged by that I/O error's kind like any other; when nothing in the chain says more,
//! it is still a connection that broke under the request.
//!
//! hyper's and hyper-util's errors are recognised with the `hyper` feature, h2's (the
//! HTTP/2 rows above: `REFUSED_STREAM`, `GOAWAY`, another `RST_STREAM`, and a connection's
//! I/O failure as h2 reports it) with the `h2` feature; both are on by default. An
//! HTTP/1-only client can leave `h2` off. Without a feature, that crate's errors are
//! judged by the I/O errors their chains hold, if any.
//!
//! Clients and protocols above the core hand their own error types to it already
//! recognised, as a [`Recognized`] error with its reason: the reqwest client's service
//! does so for reqwest's errors (a connect error, a timeout), so nothing here needs to know
//! them.

use std::error::Error as StdError;
use std::io;

use http::{HeaderMap, StatusCode, request};

use crate::error::{AttemptTimedOut, DeadlineExceeded, RetryError};
use crate::hints::Hint;
pub(crate) use crate::reason::unwrap_recognized;
pub use crate::reason::{FailureKind, Recognized, RetryReason};

/// What one attempt produced, as a classifier sees it.
///
/// Non-exhaustive: a classifier's `match` needs a last arm, usually the
/// [`DefaultClassifier`].
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
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
///
/// Besides whether the outcome is retried, it tells the layer's gates (the
/// [`RetryBudget`](crate::RetryBudget), the [`Throttle`](crate::Throttle)) what the outcome
/// was: a success, a failure of some [`FailureKind`] (every retryable verdict, and
/// [`Classification::Stop`]), or neither ([`Classification::Done`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Classification {
    /// A success: returned as is, and counted as one by the gates that count successes.
    /// The default classification gives it to every status below 400.
    Success,
    /// Final, but not a success: returned as is, and neither a success nor a failure for
    /// the gates (a 404, an error no rule recognises, gRPC's `INVALID_ARGUMENT`).
    Done,
    /// Worth another attempt, if the request, the limits and the gates allow it.
    Retry(RetryReason),
    /// Worth another attempt only if no earlier retry of this logical request had the same
    /// reason (the default for a 500).
    RetryOnce(RetryReason),
    /// Worth another attempt, with a wait the classifier read itself (from an API's own
    /// header, a JSON error body the caller parsed, gRPC's pushback). It takes precedence
    /// over the server hints the layer reads: a [`Hint::new`](crate::hints::Hint::new) is a
    /// floor (the wait is the longer of it and the backoff, and a hint above
    /// `max_retry_after` or past the deadline stops retrying at once); a
    /// [`Hint::exact`](crate::hints::Hint::exact) is the wait itself, bounded only by the
    /// deadline, and the backoff starts again after it.
    RetryWithHint(RetryReason, Hint),
    /// A failure that would be retried, but the server said not to retry it (gRPC's
    /// negative pushback): returned at once, with [`StopReason::ServerSaidStop`], and
    /// counted as a failure by the gates.
    ///
    /// [`StopReason::ServerSaidStop`]: crate::StopReason::ServerSaidStop
    Stop(RetryReason),
}

impl Classification {
    /// The reason of a verdict that names one (every one but [`Success`](Self::Success)
    /// and [`Done`](Self::Done)).
    pub fn reason(&self) -> Option<RetryReason> {
        match *self {
            Classification::Retry(reason)
            | Classification::RetryOnce(reason)
            | Classification::RetryWithHint(reason, _)
            | Classification::Stop(reason) => Some(reason),
            Classification::Success | Classification::Done => None,
        }
    }
}

/// Decides which outcomes are retried. Replaces the default with
/// [`RetryPolicy::classifier`](crate::RetryPolicy::classifier) (a closure, its argument
/// types inferred) or [`RetryPolicy::custom_classifier`](crate::RetryPolicy::custom_classifier)
/// (any implementation of this trait).
///
/// It sees the request's head (method, URI, headers) and the outcome: a response's status
/// and headers, or the error. Closures with the same signature implement it. A custom
/// classifier can fall back to [`DefaultClassifier`]; here, a server that marks a 503 it
/// will not recover from with a header of its own:
///
/// ```
/// use http::{request, StatusCode};
/// use tower_http_retry::RetryPolicy;
/// use tower_http_retry::classify::{Classification, Classify, DefaultClassifier, Outcome};
///
/// /// A 503 that says `x-retryable: false` is final.
/// struct HonourNoRetry;
///
/// impl Classify for HonourNoRetry {
///     fn classify(&self, head: &request::Parts, outcome: Outcome<'_>) -> Classification {
///         match outcome {
///             Outcome::Response { status: StatusCode::SERVICE_UNAVAILABLE, headers }
///                 if headers.get("x-retryable").is_some_and(|v| v == "false") =>
///             {
///                 Classification::Done
///             }
///             _ => DefaultClassifier.classify(head, outcome),
///         }
///     }
/// }
///
/// let policy = RetryPolicy::default().custom_classifier(HonourNoRetry);
///
/// // Classifiers are plain functions of their inputs: test them without a service.
/// let head = http::Request::get("http://h/").body(()).unwrap().into_parts().0;
/// let mut headers = http::HeaderMap::new();
/// let status = StatusCode::SERVICE_UNAVAILABLE;
/// assert!(matches!(
///     HonourNoRetry.classify(&head, Outcome::Response { status, headers: &headers }),
///     Classification::Retry(_)
/// ));
/// headers.insert("x-retryable", "false".parse().unwrap());
/// assert_eq!(
///     HonourNoRetry.classify(&head, Outcome::Response { status, headers: &headers }),
///     Classification::Done
/// );
/// # let _ = policy;
/// ```
///
/// The gates hear of an outcome by its verdict: [`Classification::Success`] refills a
/// [`Throttle`](crate::Throttle); a retryable verdict or [`Classification::Stop`] drains it;
/// [`Classification::Done`] counts neither way. A classifier that answers `Done` for its
/// successes leaves a throttle to drain: fall back to the default (or a protocol's
/// classifier) for them.
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

/// The head a classifier that does not look at the request is given: `GET /`, no fields.
pub(crate) fn empty_head() -> &'static request::Parts {
    static EMPTY: std::sync::OnceLock<request::Parts> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| http::Request::new(()).into_parts().0)
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

/// The status part of the default table: [`Classification::Success`] below 400.
pub(crate) fn classify_status(status: StatusCode) -> Classification {
    match status.as_u16() {
        408 | 429 | 502 | 503 | 504 => Classification::Retry(RetryReason::Status(status)),
        500 => Classification::RetryOnce(RetryReason::Status(status)),
        0..400 => Classification::Success,
        _ => Classification::Done,
    }
}

/// The error part of the default table: walks the whole chain, first recognised link wins.
pub(crate) fn classify_error(error: &(dyn StdError + 'static)) -> Classification {
    let mut broken_connection = false;
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(verdict) = classify_link(error) {
            return verdict;
        }
        broken_connection |= connection_io(error);
        next = next_link(error);
    }
    if broken_connection {
        // An I/O error whose kind says nothing more (an HTTP/2 connection that ends in the
        // middle of a frame gives `ErrorKind::Other`): the connection broke all the same.
        return Classification::Retry(RetryReason::ConnectionClosed);
    }
    Classification::Done
}

/// True when `error` is a connection's own I/O failure, as hyper or h2 reports it (each
/// with its feature; without them, neither's errors are recognised).
#[cfg_attr(not(any(feature = "hyper", feature = "h2")), allow(unused_variables))]
fn connection_io(error: &(dyn StdError + 'static)) -> bool {
    #[cfg(feature = "hyper")]
    if hyper_errors::is_connection_io(error) {
        return true;
    }
    #[cfg(feature = "h2")]
    if h2_errors::is_connection_io(error) {
        return true;
    }
    false
}

/// The link the walk looks at after `error`.
fn next_link<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a (dyn StdError + 'static)> {
    if let Some(io) = error.downcast_ref::<io::Error>() {
        // `io::Error::source` skips the custom payload itself; look at it first.
        return match io.get_ref() {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => io.source(),
        };
    }
    #[cfg(feature = "h2")]
    if let Some(io) = h2_errors::h2_io(error) {
        return Some(io);
    }
    error.source()
}

/// The reason, when `error` is the transport's proof that the request never left the
/// client: an `RST_STREAM(REFUSED_STREAM)` the server sent on its stream (with the `h2`
/// feature), or a request hyper never started (with the `hyper` feature).
pub(crate) fn never_left(error: &(dyn StdError + 'static)) -> Option<RetryReason> {
    match classify_error(error) {
        Classification::Retry(reason @ (RetryReason::RefusedStream | RetryReason::NotSent)) => {
            Some(reason)
        }
        _ => None,
    }
}

fn retry(reason: RetryReason) -> Option<Classification> {
    Some(Classification::Retry(reason))
}

/// tower's `Timeout` ran out (it exists under the `tokio` feature, which brings it).
fn is_tower_timeout(error: &(dyn StdError + 'static)) -> bool {
    #[cfg(feature = "tokio")]
    return error.is::<tower::timeout::error::Elapsed>();
    #[cfg(not(feature = "tokio"))]
    return {
        let _ = error;
        false
    };
}

fn classify_link(error: &(dyn StdError + 'static)) -> Option<Classification> {
    if error.is::<AttemptTimedOut>() || is_tower_timeout(error) {
        return retry(RetryReason::Timeout);
    }
    if error.is::<DeadlineExceeded>() {
        return Some(Classification::Done);
    }
    if let Some(io) = error.downcast_ref::<io::Error>() {
        return classify_io(io.kind());
    }
    // A module above the core recognised its own error type: its reason stands, else the
    // walk goes on into what it wraps. A second layer sees the reason through the first
    // layer's `RetryError`, which keeps it.
    if let Some(recognized) = error.downcast_ref::<Recognized>() {
        return recognized.reason().map(Classification::Retry);
    }
    if let Some(error) = error.downcast_ref::<RetryError>() {
        return error.recognized().map(Classification::Retry);
    }
    #[cfg(feature = "hyper")]
    if let Some(verdict) = hyper_errors::classify(error) {
        return Some(verdict);
    }
    #[cfg(feature = "h2")]
    if let Some(verdict) = h2_errors::classify(error) {
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
    use super::{Classification, RetryReason, StdError, io, retry};

    /// True for a `hyper::Error` whose cause is an I/O error: reading, writing or shutting
    /// down the connection (hyper hands an HTTP/2 connection's I/O error over this way,
    /// without the `h2::Error` around it).
    pub(super) fn is_connection_io(error: &(dyn StdError + 'static)) -> bool {
        let io = error
            .downcast_ref::<hyper::Error>()
            .and_then(StdError::source)
            .and_then(|cause| cause.downcast_ref::<io::Error>());
        io.is_some_and(super::breaks_the_connection)
    }

    pub(super) fn classify(error: &(dyn StdError + 'static)) -> Option<Classification> {
        if let Some(e) = error.downcast_ref::<hyper_util::client::legacy::Error>() {
            // Anything else the legacy client reports is judged by its source.
            return e
                .is_connect()
                .then_some(Classification::Retry(RetryReason::Connect));
        }
        if let Some(e) = error.downcast_ref::<hyper::Error>() {
            if e.is_timeout() {
                return retry(RetryReason::Timeout);
            }
            if e.is_body_write_aborted() {
                // The body's own sender gave up: repeating the request cannot help.
                return Some(Classification::Done);
            }
            if e.is_user() {
                // On a client, hyper's other user errors are the body's own error (which the
                // retry loop knows from the `ReplayBody` before it asks a classifier) and
                // "dispatch task is gone": the connection task ended under the request.
                // hyper has no predicate for the latter, so the class is judged as the
                // connection failure it is; CONNECT and upgrades are never retried.
                return retry(RetryReason::ConnectionClosed);
            }
            if e.is_canceled() {
                // hyper gives this only for a request it never started: its connection
                // closed with the request still queued, or was not ready for it.
                return retry(RetryReason::NotSent);
            }
            if e.is_incomplete_message() || e.is_closed() {
                return retry(RetryReason::ConnectionClosed);
            }
            return None;
        }
        None
    }
}

#[cfg(feature = "h2")]
mod h2_errors {
    use super::{Classification, RetryReason, StdError, retry};

    /// The I/O error inside an `h2::Error` of the I/O kind: h2's errors have no source.
    pub(super) fn h2_io<'a>(
        error: &'a (dyn StdError + 'static),
    ) -> Option<&'a (dyn StdError + 'static)> {
        let io = error.downcast_ref::<h2::Error>()?.get_io()?;
        Some(io)
    }

    /// True for an `h2::Error` of the I/O kind: the connection's own I/O failure.
    pub(super) fn is_connection_io(error: &(dyn StdError + 'static)) -> bool {
        let io = error
            .downcast_ref::<h2::Error>()
            .and_then(h2::Error::get_io);
        io.is_some_and(super::breaks_the_connection)
    }

    pub(super) fn classify(error: &(dyn StdError + 'static)) -> Option<Classification> {
        let e = error.downcast_ref::<h2::Error>()?;
        if e.is_go_away() {
            return retry(RetryReason::GoAway);
        }
        if e.is_reset() && e.is_remote() {
            if e.reason() == Some(h2::Reason::REFUSED_STREAM) {
                // RST_STREAM received on this very stream: the one proof HTTP/2 gives
                // that the server did not process it (RFC 9113, section 8.7).
                return retry(RetryReason::RefusedStream);
            }
            // The server reset the stream before answering: HTTP/2's counterpart of a
            // connection reset under an HTTP/1 request.
            return retry(RetryReason::ConnectionClosed);
        }
        None
    }
}

/// Whether a connection's own I/O error (hyper's or h2's) says no more than that the
/// stream broke: only those kinds (an HTTP/2 connection that ends in the middle of a frame
/// gives `Other`). A kind that says what went wrong (a TLS alert's `InvalidData`,
/// `PermissionDenied`, ...) would fail the same way again.
#[cfg(any(feature = "hyper", feature = "h2"))]
fn breaks_the_connection(io: &io::Error) -> bool {
    matches!(
        io.kind(),
        io::ErrorKind::Other | io::ErrorKind::UnexpectedEof
    )
}

/// Real h2 and hyper errors of an HTTP/2 connection that failed with an I/O error, for the
/// tests here (shared with the gRPC crate's tests).
#[cfg(test)]
#[path = "../tests/common/broken_h2.rs"]
pub(crate) mod broken_h2;

#[cfg(test)]
mod tests {
    use super::*;

    use std::fmt;

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
        for code in [100, 200, 201, 204, 301, 304, 399] {
            let s = StatusCode::from_u16(code).unwrap();
            assert_eq!(classify_status(s), Classification::Success, "{code}");
        }
        for code in [400, 401, 403, 404, 409, 422, 501, 505, 599] {
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
            Box::new(AttemptTimedOut::new(std::time::Duration::from_secs(1))),
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
        let d = DeadlineExceeded::new(std::time::Duration::from_secs(1));
        assert_eq!(classify_error(&d), Classification::Done);
    }

    #[cfg(feature = "h2")]
    #[test]
    fn only_a_received_refused_stream_is_proof() {
        // A reason made locally is not a frame the server sent on this stream; the real
        // RST_STREAM(REFUSED_STREAM) is `reset_by_server`'s below, and the GOAWAY cases run
        // against servers in tests/transports/real_transports.rs, as h2 makes its remote
        // errors only from frames.
        let local = h2::Error::from(h2::Reason::REFUSED_STREAM);
        assert_eq!(
            classify_error(&*nest(Box::new(local), 2)),
            Classification::Done
        );
        assert!(RetryReason::RefusedStream.request_not_processed());
        assert!(RetryReason::Connect.request_not_processed());
        assert!(!RetryReason::GoAway.request_not_processed());
        assert!(!RetryReason::ConnectionClosed.request_not_processed());
        assert!(!RetryReason::Timeout.request_not_processed());
        let other = h2::Error::from(h2::Reason::INTERNAL_ERROR);
        assert_eq!(classify_error(&other), Classification::Done);
    }

    /// The error h2's client gives a GET whose stream an h2 server resets with `reason`
    /// (a real `RST_STREAM` frame, over an in-memory connection).
    async fn reset_by_server(reason: h2::Reason) -> h2::Error {
        let (client_io, server_io) = tokio::io::duplex(16 * 1024);
        tokio::spawn(async move {
            let mut connection = h2::server::handshake(server_io).await.unwrap();
            let (_, mut respond) = connection.accept().await.unwrap().unwrap();
            respond.send_reset(reason);
            // Driven on until the client is gone, so that the frame goes out.
            while connection.accept().await.is_some() {}
        });
        let (client, connection) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(connection);
        let mut client = client.ready().await.unwrap();
        let request = http::Request::get("http://h/").body(()).unwrap();
        let (response, _) = client.send_request(request, true).unwrap();
        response.await.unwrap_err()
    }

    #[cfg(feature = "h2")]
    #[tokio::test]
    async fn a_stream_the_server_refused_never_left_and_another_reset_closed_it() {
        let refused = reset_by_server(h2::Reason::REFUSED_STREAM).await;
        assert!(refused.is_reset() && refused.is_remote(), "{refused:?}");
        let expected = Classification::Retry(RetryReason::RefusedStream);
        assert_eq!(classify_error(&refused), expected);
        assert_eq!(never_left(&refused), Some(RetryReason::RefusedStream));
        let wrapped = nest(Box::new(refused), 2);
        assert_eq!(classify_error(&*wrapped), expected);
        for reason in [h2::Reason::INTERNAL_ERROR, h2::Reason::CANCEL] {
            let reset = reset_by_server(reason).await;
            assert_eq!(
                classify_error(&reset),
                Classification::Retry(RetryReason::ConnectionClosed),
                "{reason:?}"
            );
            assert_eq!(never_left(&reset), None, "{reason:?}");
        }
    }

    /// What an HTTP/1-only build gives up: without the `h2` feature, nothing h2 says is
    /// recognised, not even the proof that a stream never left.
    #[cfg(not(feature = "h2"))]
    #[tokio::test]
    async fn without_the_h2_feature_h2s_errors_are_not_recognised() {
        let refused = reset_by_server(h2::Reason::REFUSED_STREAM).await;
        assert!(refused.is_reset() && refused.is_remote(), "{refused:?}");
        assert_eq!(classify_error(&refused), Classification::Done);
        assert_eq!(never_left(&refused), None);
        for (kind, _) in IO_FAILURES {
            let error = broken_h2::h2_error(io::Error::new(kind, "cut")).await;
            assert_eq!(error.get_io().map(io::Error::kind), Some(kind), "{error:?}");
            assert_eq!(classify_error(&error), Classification::Done, "{kind:?}");
        }
    }

    /// What the walk must make of a connection that failed with an I/O error of `kind`.
    const IO_FAILURES: [(io::ErrorKind, RetryReason); 4] = [
        (io::ErrorKind::UnexpectedEof, RetryReason::ConnectionClosed),
        (
            io::ErrorKind::ConnectionReset,
            RetryReason::ConnectionClosed,
        ),
        (io::ErrorKind::TimedOut, RetryReason::Timeout),
        // An end in the middle of a frame: the codec under h2 says `Other`.
        (io::ErrorKind::Other, RetryReason::ConnectionClosed),
    ];

    #[cfg(feature = "h2")]
    #[tokio::test]
    async fn an_h2_io_error_is_judged_by_the_io_error_inside() {
        for (kind, reason) in IO_FAILURES {
            let error = broken_h2::h2_error(io::Error::new(kind, "cut")).await;
            assert_eq!(error.get_io().map(io::Error::kind), Some(kind), "{error:?}");
            assert!(error.source().is_none(), "h2 gives no source: {error:?}");
            let expected = Classification::Retry(reason);
            assert_eq!(classify_error(&error), expected, "{kind:?}");
            assert_eq!(never_left(&error), None, "{kind:?}");
            let wrapped = nest(Box::new(error), 2);
            assert_eq!(classify_error(&*wrapped), expected, "{kind:?}");
            assert_eq!(never_left(&*wrapped), None, "{kind:?}");
        }
    }

    #[cfg(feature = "hyper")]
    #[tokio::test]
    async fn hyper_hands_an_h2_io_error_over_as_its_own_and_it_is_judged_the_same() {
        for (kind, reason) in IO_FAILURES {
            let error = broken_h2::hyper_h2_error(io::Error::new(kind, "cut")).await;
            let cause = error.source().and_then(|e| e.downcast_ref::<io::Error>());
            assert_eq!(cause.map(io::Error::kind), Some(kind), "{error:?}");
            let expected = Classification::Retry(reason);
            assert_eq!(classify_error(&error), expected, "{kind:?}");
            assert_eq!(never_left(&error), None, "{kind:?}");
            let wrapped = nest(Box::new(error), 2);
            assert_eq!(classify_error(&*wrapped), expected, "{kind:?}");
            assert_eq!(never_left(&*wrapped), None, "{kind:?}");
        }
    }

    /// Without the `hyper` feature, hyper's error is not known to be the connection's own:
    /// the I/O error under it counts by its kind alone, and `Other` says nothing.
    #[cfg(not(feature = "hyper"))]
    #[tokio::test]
    async fn without_the_hyper_feature_only_the_kind_under_hypers_error_counts() {
        for (kind, reason) in IO_FAILURES {
            let error = broken_h2::hyper_h2_error(io::Error::new(kind, "cut")).await;
            let expected = match kind {
                io::ErrorKind::Other => Classification::Done,
                _ => Classification::Retry(reason),
            };
            assert_eq!(classify_error(&error), expected, "{kind:?}");
        }
    }

    /// A connection's I/O error whose kind says what went wrong (a TLS alert read with the
    /// response is `InvalidData`) is no broken connection: it would fail the same again.
    #[tokio::test]
    async fn a_connection_io_error_that_says_what_went_wrong_is_final() {
        for kind in [io::ErrorKind::InvalidData, io::ErrorKind::PermissionDenied] {
            let h2 = broken_h2::h2_error(io::Error::new(kind, "alert")).await;
            assert_eq!(classify_error(&h2), Classification::Done, "{kind:?}");
            let hyper = broken_h2::hyper_h2_error(io::Error::new(kind, "alert")).await;
            assert_eq!(classify_error(&hyper), Classification::Done, "{kind:?}");
        }
    }

    #[test]
    fn an_io_error_of_another_kind_alone_is_not_a_broken_connection() {
        // The connection's own error is what makes an `Other` a connection failure.
        let error = nest(Box::new(io::Error::other("cut")), 2);
        assert_eq!(classify_error(&*error), Classification::Done);
    }
}
