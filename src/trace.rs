// Spans, events and metrics, or nothing at all without the features.
//
// Every span and event is on the target `tower_http_retry` (set on each, not taken from
// the module path). The levels: each retry, transparent retry and hedge at the layer's
// retry level (INFO unless set), a retry a gate refused at WARN (or at the retry level
// when that is ERROR), the request's span and its end at DEBUG. A request's URI is logged
// without its user info and query unless the layer says to log it whole. The events carry
// the request's method and URI themselves: at INFO the DEBUG span is off.

use crate::classify::RetryReason;
use crate::head::Head;
use crate::info::{RetryInfo, RetryRecord, StopReason};

/// How the layer logs, as set on [`RetryLayer`](crate::RetryLayer): the level of each
/// retry's event, and whether a URI is logged whole.
#[cfg(feature = "tracing")]
#[derive(Clone, Debug)]
pub(crate) struct Log {
    pub(crate) retries: tracing::Level,
    pub(crate) full_uri: bool,
    /// The attempts' OpenTelemetry spans.
    #[cfg(feature = "opentelemetry")]
    pub(crate) otel: otel::Settings,
    /// The OpenTelemetry instruments the layer records to ([`RetryLayer::otel_meter`](crate::RetryLayer::otel_meter)).
    #[cfg(feature = "opentelemetry")]
    pub(crate) meter: Option<std::sync::Arc<crate::otel_metrics::Instruments>>,
}

#[cfg(feature = "tracing")]
impl Default for Log {
    fn default() -> Self {
        Self {
            retries: tracing::Level::INFO,
            full_uri: false,
            #[cfg(feature = "opentelemetry")]
            otel: otel::Settings::default(),
            #[cfg(feature = "opentelemetry")]
            meter: None,
        }
    }
}

/// Nothing: the `tracing` feature is off.
#[cfg(not(feature = "tracing"))]
#[derive(Clone, Debug, Default)]
pub(crate) struct Log {}

#[cfg(feature = "tracing")]
mod imp {
    use std::fmt;
    use std::time::Duration;

    use tracing::Level;
    // Renamed: tracing's macros bring a `display` of their own into their expansion.
    use tracing::field::display as shown;

    use super::*;
    use crate::hook::AttemptKind;

    /// One event at a level known only at run time: tracing's macros take a constant
    /// level (each call site is a static with its own interest), so there is one call
    /// site per level, and a disabled event costs the `match` and its call site's check.
    macro_rules! event_at {
        ($level:expr, $($event:tt)+) => {
            match $level {
                Level::ERROR => tracing::event!(target: "tower_http_retry", Level::ERROR, $($event)+),
                Level::WARN => tracing::event!(target: "tower_http_retry", Level::WARN, $($event)+),
                Level::INFO => tracing::event!(target: "tower_http_retry", Level::INFO, $($event)+),
                Level::DEBUG => tracing::event!(target: "tower_http_retry", Level::DEBUG, $($event)+),
                _ => tracing::event!(target: "tower_http_retry", Level::TRACE, $($event)+),
            }
        };
    }

    /// The span of one logical request, and its part in the OpenTelemetry metrics.
    pub(crate) struct Trace(tracing::Span, crate::otel_metrics::Call);

    impl Trace {
        #[inline]
        pub(crate) fn new<B>(request: &http::Request<B>, log: &Log) -> Self {
            Trace(
                tracing::span!(
                    target: "tower_http_retry",
                    Level::DEBUG,
                    "http_retry",
                    method = %request.method(),
                    uri = %Uri::new(request.uri(), log),
                ),
                crate::otel_metrics::Call::new(),
            )
        }

        pub(crate) fn enter(&self) -> tracing::span::Entered<'_> {
            self.0.enter()
        }

        /// The request's span, the parent of its attempts'.
        #[cfg(feature = "opentelemetry")]
        pub(crate) fn span(&self) -> &tracing::Span {
            &self.0
        }

        /// A retry, a transparent retry or a hedge decided: it is sent as attempt
        /// `attempt` (2 for the first retry).
        pub(crate) fn retry(&self, log: &Log, head: &Head, attempt: u32, record: &RetryRecord) {
            self.1.retried(log, head);
            let hedge = record.kind == AttemptKind::Hedge;
            event_at!(
                log.retries,
                attempt,
                reason = Text::reason(&record.reason).as_str(),
                // The wait before a retry; a hedge's time since the attempt before it.
                wait = (!hedge).then(|| shown(Wait(record.wait))),
                after = hedge.then(|| shown(Wait(record.wait))),
                hint = record.hint.map(shown),
                method = %head.method(),
                uri = %Uri::new(head.uri(), log),
                "{}",
                match record.kind {
                    AttemptKind::Hedge => "hedging",
                    AttemptKind::Transparent => "retrying transparently",
                    _ => "retrying",
                },
            );
        }

        /// A resumable response body broke after `handed` bytes, and its continuation is
        /// sent as attempt `attempt` after `record.wait`. Outside any request's span: the
        /// body is read after the request ended.
        pub(crate) fn continuing(
            log: &Log,
            head: &http::request::Parts,
            attempt: u32,
            record: &RetryRecord,
            handed: u64,
        ) {
            event_at!(
                log.retries,
                attempt,
                reason = Text::reason(&record.reason).as_str(),
                wait = %Wait(record.wait),
                handed,
                method = %head.method,
                uri = %Uri::new(&head.uri, log),
                "continuing the response body",
            );
        }

        /// A resumable body ends with an error after `handed` bytes: not continued, for
        /// `stop`.
        pub(crate) fn not_continued(
            log: &Log,
            head: &http::request::Parts,
            stop: StopReason,
            handed: u64,
        ) {
            event_at!(
                log.retries.min(Level::WARN),
                handed,
                method = %head.method,
                uri = %Uri::new(&head.uri, log),
                "not continuing the response body: {}",
                stop,
            );
        }

        /// A gate refused the retry (or hedge) that `reason` called for, after `attempts`
        /// attempts: the request stops there (a hedged one sends no more).
        pub(crate) fn refused(
            &self,
            log: &Log,
            head: &Head,
            attempts: u32,
            reason: &RetryReason,
            stop: StopReason,
        ) {
            event_at!(
                log.retries.min(Level::WARN),
                attempts,
                reason = Text::reason(reason).as_str(),
                method = %head.method(),
                uri = %Uri::new(head.uri(), log),
                "not retrying: {}",
                stop,
            );
        }

        /// The request's end, whatever it was.
        pub(crate) fn finish(&self, info: &RetryInfo) {
            self.1.finish(info);
            tracing::event!(
                target: "tower_http_retry",
                Level::DEBUG,
                attempts = info.attempts(),
                hedges = (info.hedges() > 0).then(|| info.hedges()),
                outcome = info
                    .returned()
                    .and_then(|n| info.outcomes().nth(n as usize - 1))
                    .map(shown),
                stop = %info.stop().as_str(),
                waited = %Wait(info.total_wait()),
                "done",
            );
        }
    }

    /// A URI as the logs show it: without its user info and query string unless the
    /// layer logs URIs whole. Written straight to the formatter: nothing is allocated.
    pub(crate) struct Uri<'a> {
        uri: &'a http::Uri,
        full: bool,
    }

    impl<'a> Uri<'a> {
        pub(crate) fn new(uri: &'a http::Uri, log: &Log) -> Self {
            Self {
                uri,
                full: log.full_uri,
            }
        }
    }

    impl fmt::Display for Uri<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            if self.full {
                return fmt::Display::fmt(self.uri, f);
            }
            if let Some(scheme) = self.uri.scheme_str() {
                write!(f, "{scheme}://")?;
            }
            if let Some(authority) = self.uri.authority() {
                f.write_str(authority.host())?;
                if let Some(port) = authority.port() {
                    write!(f, ":{port}")?;
                }
            }
            f.write_str(self.uri.path())
        }
    }

    /// A wait as the logs show it, one word: `0ms`, `450µs`, `150ms`, `1.25s`, `3600s`.
    pub(crate) struct Wait(pub(crate) Duration);

    impl fmt::Display for Wait {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let micros = self.0.as_micros();
            if self.0.is_zero() {
                return f.write_str("0ms");
            }
            if micros < 1000 {
                return write!(f, "{}µs", micros.max(1));
            }
            // Rounded to the millisecond, and from a second on to the hundredth of one.
            let millis = (micros + 500) / 1000;
            if millis < 1000 {
                return write!(f, "{millis}ms");
            }
            let hundredths = (millis + 5) / 10;
            let (whole, frac) = (hundredths / 100, hundredths % 100);
            match frac {
                0 => write!(f, "{whole}s"),
                _ if frac % 10 == 0 => write!(f, "{whole}.{}s", frac / 10),
                _ => write!(f, "{whole}.{frac:02}s"),
            }
        }
    }

    /// A short text written on the stack, so that it is recorded as a string (quoted by a
    /// text formatter, a string in JSON) without allocating: a reason such as
    /// `status 503` or `gRPC UNAVAILABLE`. Cut at a character's end if it is longer.
    pub(crate) struct Text {
        /// A custom reason's name, given as it is, whatever its length.
        fixed: Option<&'static str>,
        bytes: [u8; 64],
        len: usize,
        cut: bool,
    }

    impl Text {
        pub(crate) fn of(value: &dyn fmt::Display) -> Self {
            let mut text = Text {
                fixed: None,
                bytes: [0; 64],
                len: 0,
                cut: false,
            };
            let _ = fmt::write(&mut text, format_args!("{value}"));
            text
        }

        /// `reason` as its `Display` writes it.
        pub(crate) fn reason(reason: &RetryReason) -> Self {
            match reason {
                RetryReason::Custom(name) => Text {
                    fixed: Some(name),
                    bytes: [0; 64],
                    len: 0,
                    cut: false,
                },
                _ => Self::of(reason),
            }
        }

        pub(crate) fn as_str(&self) -> &str {
            match self.fixed {
                Some(name) => name,
                // Only whole characters are ever written.
                None => std::str::from_utf8(&self.bytes[..self.len]).unwrap_or_default(),
            }
        }
    }

    impl fmt::Write for Text {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            if self.cut {
                return Ok(());
            }
            let room = self.bytes.len() - self.len;
            let mut take = s.len().min(room);
            while !s.is_char_boundary(take) {
                take -= 1;
            }
            self.bytes[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
            self.len += take;
            self.cut = take < s.len();
            Ok(())
        }
    }
}

#[cfg(not(feature = "tracing"))]
mod imp {
    use super::*;

    /// Nothing: the `tracing` feature is off.
    pub(crate) struct Trace;

    /// Nothing entered.
    pub(crate) struct Entered;

    impl Trace {
        pub(crate) fn new<B>(_: &http::Request<B>, _: &Log) -> Self {
            Trace
        }
        pub(crate) fn enter(&self) -> Entered {
            Entered
        }
        pub(crate) fn retry(&self, _: &Log, _: &Head, _: u32, _: &RetryRecord) {}
        pub(crate) fn continuing(
            _: &Log,
            _: &http::request::Parts,
            _: u32,
            _: &RetryRecord,
            _: u64,
        ) {
        }
        pub(crate) fn not_continued(_: &Log, _: &http::request::Parts, _: StopReason, _: u64) {}
        pub(crate) fn refused(&self, _: &Log, _: &Head, _: u32, _: &RetryReason, _: StopReason) {}
        pub(crate) fn finish(&self, _: &RetryInfo) {}
    }
}

pub(crate) use imp::Trace;

#[cfg(feature = "opentelemetry")]
mod otel;
#[cfg(feature = "opentelemetry")]
pub(crate) use otel::{Slot, Target, known_method};

/// Nothing: the `opentelemetry` feature is off, and no attempt has a span.
#[cfg(not(feature = "opentelemetry"))]
pub(crate) struct Slot;

/// Nothing entered.
#[cfg(not(feature = "opentelemetry"))]
pub(crate) struct NotEntered;

#[cfg(not(feature = "opentelemetry"))]
impl Slot {
    #[inline(always)]
    pub(crate) fn none() -> Slot {
        Slot
    }

    #[inline(always)]
    pub(crate) fn start<B>(
        _: &Trace,
        _: &Log,
        _: u32,
        _: crate::hook::AttemptKind,
        _: &mut http::Request<B>,
    ) -> Slot {
        Slot
    }

    #[inline(always)]
    pub(crate) fn start_parts(
        _: &Trace,
        _: &Log,
        _: u32,
        _: crate::hook::AttemptKind,
        _: &mut http::request::Parts,
    ) -> Slot {
        Slot
    }

    #[inline(always)]
    pub(crate) fn continuation(_: &Log, _: &mut http::request::Parts) -> Slot {
        Slot
    }

    #[inline(always)]
    pub(crate) fn enter(&self) -> NotEntered {
        NotEntered
    }

    #[inline(always)]
    pub(crate) fn abandoned(&mut self) {}

    #[inline(always)]
    pub(crate) fn end<RB>(
        &mut self,
        _: crate::info::AttemptOutcome,
        _: &Result<http::Response<RB>, tower::BoxError>,
    ) {
    }
}

/// Metric names, for dashboards.
pub(crate) mod names {
    pub(crate) const RETRIES: &str = "http_retry_retries_total";
    pub(crate) const BUDGET_REFUSALS: &str = "http_retry_budget_refusals_total";
    pub(crate) const WAIT_SECONDS: &str = "http_retry_wait_seconds";
    pub(crate) const HEDGES: &str = "http_retry_hedges_total";
    pub(crate) const HEDGE_WINS: &str = "http_retry_hedge_wins_total";
    pub(crate) const LOCAL_REFUSALS: &str = "http_retry_local_refusals_total";
    pub(crate) const CONTINUATIONS: &str = "http_retry_continuations_total";
}

/// One retry decided: the metrics (its event is [`Trace::retry`]). A hedge counts as a
/// hedge, not a retry, and its wait (the time since the attempt before it) is no wait; a
/// body's continuation counts as a continuation, and its wait as a wait.
pub(crate) fn retried(record: &RetryRecord) {
    #[cfg(feature = "metrics")]
    {
        if record.kind == crate::AttemptKind::Hedge {
            metrics::counter!(names::HEDGES, "reason" => record.reason.as_str()).increment(1);
        } else if record.kind == crate::AttemptKind::Continuation {
            metrics::counter!(names::CONTINUATIONS, "reason" => record.reason.as_str())
                .increment(1);
            metrics::histogram!(names::WAIT_SECONDS).record(record.wait.as_secs_f64());
        } else {
            metrics::counter!(names::RETRIES, "reason" => record.reason.as_str()).increment(1);
            metrics::histogram!(names::WAIT_SECONDS).record(record.wait.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (
        record,
        names::RETRIES,
        names::WAIT_SECONDS,
        names::HEDGES,
        names::CONTINUATIONS,
    );
}

/// A hedged request returned the outcome of attempt `returned` (1 for the first): a win
/// for hedging when it was a hedge.
pub(crate) fn hedge_returned(returned: u32) {
    #[cfg(feature = "metrics")]
    if returned > 1 {
        metrics::counter!(names::HEDGE_WINS).increment(1);
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (returned, names::HEDGE_WINS);
}

/// The budget (or a quota) refused a retry: a counter (its event, for every gate's
/// refusal, is [`Trace::refused`]).
pub(crate) fn budget_refused(reason: &RetryReason) {
    #[cfg(feature = "metrics")]
    metrics::counter!(names::BUDGET_REFUSALS, "reason" => reason.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (reason, names::BUDGET_REFUSALS);
}

/// A gate that paces first attempts refused one, for `stop`: nothing was sent. A counter
/// (the record says so too).
pub(crate) fn locally_refused(stop: StopReason) {
    #[cfg(feature = "metrics")]
    metrics::counter!(names::LOCAL_REFUSALS, "stop" => stop.as_str()).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (stop, names::LOCAL_REFUSALS);
}

#[cfg(all(test, feature = "tracing"))]
mod tests {
    use std::time::Duration;

    use super::imp::{Text, Uri, Wait};
    use super::*;

    #[test]
    fn a_wait_is_one_rounded_word() {
        let cases = [
            (Duration::ZERO, "0ms"),
            (Duration::from_nanos(300), "1µs"),
            (Duration::from_micros(450), "450µs"),
            (Duration::from_micros(28_050), "28ms"),
            (Duration::from_nanos(28_050_614), "28ms"),
            (Duration::from_micros(149_500), "150ms"),
            (Duration::from_micros(999_600), "1s"),
            (Duration::from_millis(1250), "1.25s"),
            (Duration::from_millis(1500), "1.5s"),
            (Duration::from_millis(2004), "2s"),
            (Duration::from_secs(3600), "3600s"),
        ];
        for (wait, text) in cases {
            assert_eq!(Wait(wait).to_string(), text, "{wait:?}");
        }
    }

    #[test]
    fn a_uri_is_logged_without_user_info_and_query_unless_whole() {
        let short = Log::default();
        let whole = Log {
            full_uri: true,
            ..Log::default()
        };
        let cases = [
            (
                "https://user:secret@api.example:8443/v1/items?token=abc&email=a%40b",
                "https://api.example:8443/v1/items",
            ),
            ("http://[::1]:3000/a?b", "http://[::1]:3000/a"),
            ("http://h", "http://h/"),
            ("/only/a/path?q=1", "/only/a/path"),
            ("*", "*"),
            ("example.org:443", "example.org:443"),
        ];
        for (uri, logged) in cases {
            let uri: http::Uri = uri.parse().unwrap();
            assert_eq!(Uri::new(&uri, &short).to_string(), logged);
            assert_eq!(Uri::new(&uri, &whole).to_string(), uri.to_string());
        }
    }

    #[test]
    fn a_reason_is_written_whole_or_cut_at_a_character() {
        let status = RetryReason::Status(http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(Text::reason(&status).as_str(), "status 503");
        let long = "a custom reason's name is given whole, however long it may be: a name";
        assert_eq!(Text::reason(&RetryReason::Custom(long)).as_str(), long);
        // 63 ASCII bytes, then a character of two bytes across the 64th.
        let text = format!("{}é and more", "x".repeat(63));
        let cut = Text::of(&text);
        assert_eq!(cut.as_str(), "x".repeat(63));
        let fits = "y".repeat(64);
        assert_eq!(Text::of(&fits).as_str(), fits);
    }
}
