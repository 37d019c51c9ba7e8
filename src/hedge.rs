// Hedging: when a request that may be repeated is merely slow, another copy of it is sent
// while the first is still in flight, and the first outcome worth returning wins.

use std::time::Duration;

/// How a policy hedges: when it sends another copy of a request that has not answered yet.
///
/// A hedged request's first attempt goes out at once; while none of its attempts has
/// answered, another one follows every `delay`, up to the policy's
/// [`max_attempts`](crate::RetryPolicy::max_attempts) in all (the first included). The
/// first outcome that is not a non-fatal failure is returned and the other attempts are
/// dropped (hyper resets their HTTP/2 streams, or closes their HTTP/1 connections). A
/// non-fatal failure (an outcome the policy's classifier would retry: a 503, a connection
/// failure, a first 500; for gRPC a code of the route's `nonFatalStatusCodes`) sends the
/// next hedge at once, or after the server's hint (an exact pushback, or `Retry-After` as
/// a floor), and the delay then counts from that hedge. When every attempt failed so, the
/// last failure is returned.
///
/// Only requests that may be repeated concurrently are hedged: idempotent methods, and
/// every request under a policy with
/// [`assume_idempotent`](crate::RetryPolicy::assume_idempotent) (gRPC methods with a hedging
/// policy). A keyed POST is not: a de-duplicating server answers a concurrent duplicate
/// with an error (409) rather than the first one's outcome. Such requests get the policy's
/// ordinary retries instead.
///
/// Every hedge is paid for like a retry: the budget (or quota) is asked before it is sent,
/// and it is not sent when refused; a [`Throttle`](crate::Throttle) is only checked (no
/// hedge while it refuses retries), and hears each attempt's failure. The body is recorded
/// once and replayed to each hedge; a hedge waits until the first attempt has sent the
/// whole body, and none is sent for a body over the replay cap.
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::{Hedging, RetryPolicy};
///
/// // Up to 3 copies in flight: the second after 10 ms without an answer, the third 10 ms later.
/// let policy = RetryPolicy::default()
///     .max_attempts(3)
///     .hedge(Hedging::after(Duration::from_millis(10)));
/// assert_eq!(policy.get_hedging().unwrap().get_delay(), Duration::from_millis(10));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hedging {
    delay: Duration,
}

impl Hedging {
    /// Sends a hedge every `delay` while no attempt has answered. A zero delay sends all of
    /// the policy's attempts at once (gRPC's `hedgingDelay` of `0s`, or none).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::Hedging;
    ///
    /// assert_eq!(Hedging::after(Duration::ZERO).get_delay(), Duration::ZERO);
    /// ```
    pub fn after(delay: Duration) -> Self {
        Self { delay }
    }

    /// The delay between one attempt and the next hedge.
    pub fn get_delay(&self) -> Duration {
        self.delay
    }
}
