// Per-attempt request hooks: what each attempt's request carries beyond the caller's.

use std::any::TypeId;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

/// One attempt of a logical request: what an [`AttemptHook`] is given before it is sent,
/// and what every retry's and hedge's request carries in its extensions (the first
/// attempt's carries none: nothing to pay on the success path). An inner tracing or
/// OpenTelemetry layer can record it, as the stable `http.request.resend_count` attribute
/// (`number - 1`) for instance.
///
/// ```
/// use tower_http_retry::Attempt;
///
/// # let request = {
/// #     let mut r = http::Request::new(());
/// #     r.extensions_mut().insert(Attempt::new(3, 2, None, tower_http_retry::AttemptKind::Retry));
/// #     r
/// # };
/// if let Some(attempt) = request.extensions().get::<Attempt>() {
///     let resend_count = attempt.number - 1;
///     assert_eq!((attempt.number, resend_count), (3, 2));
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Attempt {
    /// The attempt's number on the wire: 1 for the first, 2 for the first retry, each
    /// transparent retry included.
    pub number: u32,
    /// How many earlier attempts count against `max_attempts`: all of them but the
    /// transparent retries (what gRPC's `grpc-previous-rpc-attempts` says).
    pub counted_before: u32,
    /// The time left before the request's deadline when the attempt is sent, if it has
    /// one. On the first attempt it is the deadline itself (no clock is read for it).
    pub time_left: Option<Duration>,
    /// The attempt's own limit, if the policy sets one
    /// ([`RetryPolicy::attempt_timeout`](crate::RetryPolicy::attempt_timeout)): the attempt
    /// is dropped after it, deadline or not. The time this attempt has is the lesser of it
    /// and `time_left` (what [`RetryPolicy::deadline_header`](crate::RetryPolicy::deadline_header)
    /// writes).
    pub timeout: Option<Duration>,
    /// Why this attempt is sent.
    pub kind: AttemptKind,
}

impl Attempt {
    /// An attempt as the layer would give it, for testing a hook or a service outside the
    /// layer: attempt `number` (1 for the first), `counted_before` of the earlier attempts
    /// counting against `max_attempts`, `time_left` before the deadline, and its `kind`;
    /// without an attempt timeout (set the public field for one). Under the `test-util`
    /// feature.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{Attempt, AttemptKind};
    ///
    /// let mut retry = Attempt::new(3, 2, Some(Duration::from_secs(1)), AttemptKind::Retry);
    /// assert_eq!((retry.number, retry.counted_before, retry.timeout), (3, 2, None));
    /// retry.timeout = Some(Duration::from_millis(300));
    /// ```
    #[cfg(feature = "test-util")]
    #[cfg_attr(docsrs, doc(cfg(feature = "test-util")))]
    pub fn new(
        number: u32,
        counted_before: u32,
        time_left: Option<Duration>,
        kind: AttemptKind,
    ) -> Self {
        Self::of(number, counted_before, time_left, None, kind)
    }

    /// The attempt the layer gives hooks and puts in a request's extensions.
    pub(crate) fn of(
        number: u32,
        counted_before: u32,
        time_left: Option<Duration>,
        timeout: Option<Duration>,
        kind: AttemptKind,
    ) -> Self {
        Self {
            number,
            counted_before,
            time_left,
            timeout,
            kind,
        }
    }
}

/// Why an attempt is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AttemptKind {
    /// The first attempt.
    First,
    /// A retry after an outcome worth retrying.
    Retry,
    /// A transparent retry ([`RetryPolicy::transparent_retry`](crate::RetryPolicy::transparent_retry)):
    /// the previous attempt provably never reached the server.
    Transparent,
    /// A hedge ([`RetryPolicy::hedge`](crate::RetryPolicy::hedge)): sent while the
    /// attempts before it may still be in flight.
    Hedge,
    /// A continuation of a response body that broke: the same GET with a `Range` from the
    /// next byte ([`RetryLayer::resume`](crate::RetryLayer::resume)).
    Continuation,
}

/// Edits the request of every attempt before it is sent, and may read a time limit from
/// the caller's request.
///
/// The layer calls [`before_attempt`](Self::before_attempt) on the first attempt's request
/// and on every retry's (each retry starts from a copy of the caller's request head, so a
/// hook sees what the caller sent, not what it wrote on the previous attempt). Uses: a
/// header telling the server which attempt this is
/// ([`RetryLayer::attempt_header`](crate::RetryLayer::attempt_header) is one), the time
/// left before the deadline for the server (gRPC's `grpc-timeout`, a deadline-propagation
/// header of your own), the count of earlier attempts (gRPC's
/// `grpc-previous-rpc-attempts`).
///
/// Give it to a policy with [`RetryPolicy::on_attempt`](crate::RetryPolicy::on_attempt).
///
/// ```
/// use std::time::Duration;
/// use http::{HeaderMap, HeaderValue};
/// use tower_http_retry::{Attempt, AttemptHook, RetryPolicy};
///
/// /// Tells the server how long the client will wait, in milliseconds.
/// struct TimeLeft;
///
/// impl AttemptHook for TimeLeft {
///     fn before_attempt(&self, attempt: &Attempt, headers: &mut HeaderMap) {
///         if let Some(left) = attempt.time_left {
///             headers.insert("x-time-left-ms", HeaderValue::from(left.as_millis() as u64));
///         }
///     }
/// }
///
/// let policy = RetryPolicy::default().deadline(Duration::from_secs(2)).on_attempt(TimeLeft);
/// # let _ = policy;
/// ```
pub trait AttemptHook: Send + Sync + 'static {
    /// Edits the headers of the attempt `attempt` before it is sent.
    fn before_attempt(&self, attempt: &Attempt, headers: &mut HeaderMap);

    /// A time limit the caller's request sets for itself (gRPC's `grpc-timeout`, which
    /// tonic's `Request::set_timeout` sets), read once before the first attempt: the
    /// request's deadline is then the shorter of it and the policy's. `None` by default.
    fn time_limit(&self, headers: &HeaderMap) -> Option<Duration> {
        let _ = headers;
        None
    }
}

/// A policy's hooks, at most one of each type (a second one of the same type replaces the
/// first, so building a policy twice from one base adds nothing twice), and whether those
/// beneath are off ([`RetryPolicy::no_hooks`](crate::RetryPolicy::no_hooks)).
#[derive(Clone, Default)]
pub(crate) struct Hooks(Vec<(TypeId, Arc<dyn AttemptHook>)>, bool);

impl Hooks {
    pub(crate) fn add<H: AttemptHook>(&mut self, hook: H) {
        let id = TypeId::of::<H>();
        let hook: Arc<dyn AttemptHook> = Arc::new(hook);
        match self.0.iter_mut().find(|(kind, _)| *kind == id) {
            Some(slot) => slot.1 = hook,
            None => self.0.push((id, hook)),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Turns every hook beneath off, and those added so far.
    pub(crate) fn clear(&mut self) {
        self.0.clear();
        self.1 = true;
    }

    /// Whether the hooks beneath are off.
    pub(crate) fn is_off(&self) -> bool {
        self.1
    }

    /// These hooks, without turning off any beneath: what a policy's overlay left, to lay
    /// over hooks of the layer's own.
    pub(crate) fn kept(&self) -> Hooks {
        Hooks(self.0.clone(), false)
    }

    /// Runs every hook on one attempt's headers.
    pub(crate) fn before_attempt(&self, attempt: &Attempt, headers: &mut HeaderMap) {
        for (_, hook) in &self.0 {
            hook.before_attempt(attempt, headers);
        }
    }

    /// The shortest time limit any hook reads from the caller's request.
    pub(crate) fn time_limit(&self, headers: &HeaderMap) -> Option<Duration> {
        self.0
            .iter()
            .filter_map(|(_, hook)| hook.time_limit(headers))
            .min()
    }

    /// These hooks, then `other`'s (one of a type `other` has replaces this one's; all of
    /// these when `other` turned those beneath off).
    pub(crate) fn then(&self, other: &Hooks) -> Hooks {
        if other.1 {
            return other.clone();
        }
        let mut all = self.clone();
        for (id, hook) in &other.0 {
            match all.0.iter_mut().find(|(kind, _)| kind == id) {
                Some(slot) => slot.1 = Arc::clone(hook),
                None => all.0.push((*id, Arc::clone(hook))),
            }
        }
        all
    }
}

impl fmt::Debug for Hooks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooks")
            .field("count", &self.0.len())
            .finish()
    }
}

/// The attempt number in a header of the layer's choosing
/// ([`RetryLayer::attempt_header`](crate::RetryLayer::attempt_header)).
pub(crate) struct AttemptHeader(pub(crate) HeaderName);

impl AttemptHook for AttemptHeader {
    fn before_attempt(&self, attempt: &Attempt, headers: &mut HeaderMap) {
        let value = match attempt.number {
            1 => HeaderValue::from_static("1"),
            n => HeaderValue::from(n),
        };
        headers.insert(self.0.clone(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Mark(&'static str);
    impl AttemptHook for Mark {
        fn before_attempt(&self, attempt: &Attempt, headers: &mut HeaderMap) {
            headers.append("x-mark", HeaderValue::from_static(self.0));
            headers.insert("x-number", HeaderValue::from(attempt.number));
        }
        fn time_limit(&self, _: &HeaderMap) -> Option<Duration> {
            Some(Duration::from_secs(u64::from(self.0.len() as u8)))
        }
    }

    struct Other;
    impl AttemptHook for Other {
        fn before_attempt(&self, _: &Attempt, headers: &mut HeaderMap) {
            headers.append("x-mark", HeaderValue::from_static("other"));
        }
    }

    fn first() -> Attempt {
        Attempt {
            number: 1,
            counted_before: 0,
            time_left: None,
            timeout: None,
            kind: AttemptKind::First,
        }
    }

    #[test]
    fn one_hook_of_a_type_and_the_shortest_time_limit() {
        let mut hooks = Hooks::default();
        assert!(hooks.is_empty());
        hooks.add(Mark("first"));
        hooks.add(Other);
        hooks.add(Mark("second"));
        let mut headers = HeaderMap::new();
        hooks.before_attempt(&first(), &mut headers);
        let marks: Vec<_> = headers.get_all("x-mark").iter().collect();
        // The second `Mark` replaced the first, in its place.
        assert_eq!(marks, ["second", "other"]);
        assert_eq!(headers["x-number"], "1");
        // "second" is 6 letters: 6 s; `Other` reads none.
        assert_eq!(hooks.time_limit(&headers), Some(Duration::from_secs(6)));
        assert_eq!(Hooks::default().time_limit(&headers), None);

        let mut layer = Hooks::default();
        layer.add(Mark("layer"));
        let mut policy = Hooks::default();
        policy.add(Other);
        let both = layer.then(&policy);
        let mut headers = HeaderMap::new();
        both.before_attempt(&first(), &mut headers);
        let marks: Vec<_> = headers.get_all("x-mark").iter().collect();
        assert_eq!(marks, ["layer", "other"]);
    }

    #[test]
    fn the_attempt_header_numbers_every_attempt() {
        let hook = AttemptHeader(HeaderName::from_static("retry-attempt"));
        let mut headers = HeaderMap::new();
        hook.before_attempt(&first(), &mut headers);
        assert_eq!(headers["retry-attempt"], "1");
        let third = Attempt {
            number: 3,
            counted_before: 1,
            kind: AttemptKind::Retry,
            ..first()
        };
        hook.before_attempt(&third, &mut headers);
        assert_eq!(headers["retry-attempt"], "3");
        assert_eq!(headers.len(), 1);
    }
}
