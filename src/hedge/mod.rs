// Hedging: when a request that may be repeated is merely slow, another copy of it is sent
// while the first is still in flight, and the first outcome worth returning wins.

mod record;

use std::time::Duration;

pub(crate) use self::record::LatencyRecord;
use crate::error::InvalidConfig;
use crate::time::Instant;

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
/// Only requests that are safe to send twice at once are hedged: the safe methods (GET,
/// HEAD, OPTIONS, TRACE, QUERY), and every request under a policy with
/// [`assume_idempotent`](crate::RetryPolicy::assume_idempotent) (gRPC methods with a hedging
/// policy; a PUT or DELETE route that opts in). Idempotent is not enough: a DELETE that a
/// slow first attempt already applied makes its hedge answer 404, a PUT with `If-Match`
/// makes it answer 412, and that answer would win. A keyed POST is not hedged either: a
/// de-duplicating server answers a concurrent duplicate with an error (409) rather than
/// the first one's outcome. Such requests get the policy's ordinary retries instead.
///
/// Every hedge is paid for like a retry: the budget (or quota) is asked before it is sent,
/// and it is not sent when refused; a [`Throttle`](crate::Throttle) is only checked (no
/// hedge while it refuses retries), and hears each attempt's failure. The body is recorded
/// once and replayed to each hedge, and read from the caller's body by whichever attempt
/// needs it first, so a hedge goes at its delay even when the first attempt has not
/// started sending (stuck connecting, or waiting for a connection). A body that passes the
/// replay cap is sent whole by the attempt that read past the cap, and the attempts that
/// cannot follow it are dropped; no hedge is sent for a body over the cap.
///
/// When every attempt has failed and the next hedge is due, it waits for its service to
/// get ready as a retry does: within the deadline, else the attempt timeout, else without
/// bound; the last failure is returned if that wait runs out.
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry::{Hedging, RetryPolicy};
///
/// // Up to 3 copies in flight: the second after 10 ms without an answer, the third 10 ms later.
/// let policy = RetryPolicy::new()
///     .max_attempts(3)
///     .hedge(Hedging::after(Duration::from_millis(10)));
/// # let _ = policy;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Hedging {
    delay: Delay,
}

/// How the delay before a hedge is found.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Delay {
    Fixed(Duration),
    Percentile {
        p: f64,
        min_samples: u64,
        fallback: Option<Duration>,
    },
}

/// The samples a percentile needs by default before it is trusted.
const DEFAULT_MIN_SAMPLES: u64 = 50;

impl Hedging {
    /// Sends a hedge every `delay` while no attempt has answered. A zero delay sends all of
    /// the policy's attempts at once (gRPC's `hedgingDelay` of `0s`, or none).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{Hedging, RetryPolicy};
    ///
    /// // All three attempts at once.
    /// let policy = RetryPolicy::new().max_attempts(3).hedge(Hedging::after(Duration::ZERO));
    /// # let _ = policy;
    /// ```
    pub fn after(delay: Duration) -> Self {
        Self {
            delay: Delay::Fixed(delay),
        }
    }

    /// Sends a hedge once an attempt has taken longer than the `p` quantile of its route's
    /// recent latencies (`0.9`: slower than 90% of them), read when the request starts.
    ///
    /// Each route keeps its own record, shared by every clone of the service: every attempt
    /// that ended counts (errors and timeouts too) from the moment it was sent, and one that
    /// was dropped (it lost, or the caller gave up) after at least the delay counts as that
    /// long, so the slow originals that hedges beat still weigh in. Samples count for ten
    /// to twenty seconds. Until [`min_samples`](Self::min_samples) are counted (50 by
    /// default), the [`fallback`](Self::fallback) delay is used, and without one nothing is
    /// hedged. A request whose policy comes in its extensions uses the record of the route
    /// it matched.
    ///
    /// An accurate `p` of 0.9 hedges about one request in ten: mind the budget, which pays
    /// for every hedge (give hedged routes a budget of their own if retries must not
    /// compete with them). Choose `p` below one less the share of slow answers (0.9 or 0.95
    /// when one in a hundred is slow): a higher one reads inside the slow answers, which a
    /// winning hedge cuts short and which then count only as long as they were waited
    /// for, so the delay creeps upward towards the slow answers' own latency.
    ///
    /// # Panics
    ///
    /// When `p` is not strictly between 0 and 1 ([`try_percentile`](Self::try_percentile)
    /// returns the error instead).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::Hedging;
    ///
    /// let hedging = Hedging::percentile(0.95)
    ///     .min_samples(100)
    ///     .fallback(Duration::from_millis(20));
    /// # let _ = hedging;
    /// ```
    #[track_caller]
    pub fn percentile(p: f64) -> Self {
        match Self::try_percentile(p) {
            Ok(hedging) => hedging,
            Err(error) => panic!("{error}"),
        }
    }

    /// [`percentile`](Self::percentile), or an error when `p` is not strictly between 0
    /// and 1.
    ///
    /// ```
    /// use tower_http_retry::Hedging;
    ///
    /// assert!(Hedging::try_percentile(1.0).unwrap_err().to_string().contains("percentile"));
    /// assert!(Hedging::try_percentile(f64::NAN).is_err());
    /// assert!(Hedging::try_percentile(0.5).is_ok());
    /// ```
    pub fn try_percentile(p: f64) -> Result<Self, InvalidConfig> {
        if !(p > 0.0 && p < 1.0) {
            return Err(InvalidConfig::new(format!(
                "hedging percentile {p} must be greater than 0 and less than 1"
            )));
        }
        Ok(Self {
            delay: Delay::Percentile {
                p,
                min_samples: DEFAULT_MIN_SAMPLES,
                fallback: None,
            },
        })
    }

    /// The samples a [`percentile`](Self::percentile) needs before it is used (50 by
    /// default; at least 1). No effect on a fixed delay.
    ///
    /// ```
    /// use tower_http_retry::Hedging;
    ///
    /// let hedging = Hedging::percentile(0.9).min_samples(10);
    /// # let _ = hedging;
    /// ```
    pub fn min_samples(mut self, n: u64) -> Self {
        if let Delay::Percentile { min_samples, .. } = &mut self.delay {
            *min_samples = n.max(1);
        }
        self
    }

    /// The delay a [`percentile`](Self::percentile) uses until it has its samples. No
    /// effect on a fixed delay.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::Hedging;
    ///
    /// let hedging = Hedging::percentile(0.9).fallback(Duration::from_millis(10));
    /// # let _ = hedging;
    /// ```
    pub fn fallback(mut self, delay: Duration) -> Self {
        if let Delay::Percentile { fallback, .. } = &mut self.delay {
            *fallback = Some(delay);
        }
        self
    }

    /// Whether this hedging reads its route's latency record (a percentile).
    pub(crate) fn reads_latencies(&self) -> bool {
        matches!(self.delay, Delay::Percentile { .. })
    }

    /// The delay of a request starting at `now`, or `None` when none is known yet (a
    /// percentile without its samples, and no fallback: only a non-fatal failure sends a
    /// hedge then, and the attempts' latencies are counted). `record` is its route's.
    pub(crate) fn delay_at(
        &self,
        record: Option<&LatencyRecord>,
        now: impl FnOnce() -> Instant,
    ) -> Option<Duration> {
        match self.delay {
            Delay::Fixed(delay) => Some(delay),
            Delay::Percentile {
                p,
                min_samples,
                fallback,
            } => record
                .and_then(|record| record.delay(p, min_samples, now()))
                .or(fallback),
        }
    }
}
