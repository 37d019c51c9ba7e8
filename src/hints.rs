//! Reading how long a server asks the client to wait, from the headers it sends besides
//! (or instead of) `Retry-After`.
//!
//! Rate-limited APIs often say when to come back with rate-limit fields rather than
//! `Retry-After`. The layer reads the common ones into a wait, on every response it may
//! retry, and so does [`Hint::from_headers`]:
//!
//! * the IETF `RateLimit` field ([draft-ietf-httpapi-ratelimit-headers], draft 10 and the
//!   editors' copy after it, which agree on everything read here), such as
//!   `RateLimit: "default";r=0;t=30`;
//! * the widespread, unstandardised `X-RateLimit-Reset` together with
//!   `X-RateLimit-Remaining: 0`;
//! * and `Retry-After` ([`retry_after`](crate::retry_after)), in the order of precedence
//!   described [below](#precedence), with the [`HintSource`] that gave the wait.
//!
//! Like [`retry_after::parse`](crate::retry_after::parse), the reading is pure:
//! the current time is an argument and no clock is read inside. They make no policy
//! decision either: a huge value gives a huge [`Duration`] (saturating, never wrapping),
//! and whether to honour it (`max_retry_after`, the deadline) is up to the caller. A value
//! that cannot be read is no hint (`None`), never an error. No input makes them panic.
//!
//! # `RateLimit`
//!
//! The field is a Structured Field List ([RFC 9651]) of service limits, one per quota
//! policy, each naming its policy and carrying parameters: `r`, the quota still
//! available, and `t`, the number of seconds the effective window still lasts. When `r` is
//! 0 the client has nothing left to spend until `t` seconds have passed, so that is the
//! wait. For example
//!
//! ```text
//! RateLimit: "burst";r=0;t=5, "daily";r=0;t=3600, "hourly";r=12;t=600
//! ```
//!
//! waits 3600 seconds: the longest wait among the exhausted policies, since every one of
//! them must have room again before a request can pass.
//!
//! What is read, and the decisions where the draft leaves room:
//!
//! * **Structured-field syntax is checked in full**: strings with their escapes, tokens,
//!   integers, decimals, byte sequences, booleans, dates, display strings, inner lists,
//!   parameters, and where spaces and tabs may stand. A field value that is not a valid
//!   List is ignored whole, as RFC 9651 requires (section 4.2); so is one with an integer
//!   of more than 15 digits, which the RFC does not allow (so no `t` can exceed
//!   999,999,999,999,999 seconds, and none needs to saturate).
//! * **Several field lines are one list**: they are joined with commas before parsing, as
//!   RFC 9651 specifies. Lines that are empty (or only spaces and tabs) add nothing.
//! * **Each service limit is judged on its own.** One that is malformed (its `r` missing
//!   or not a non-negative Integer, its `t` not a non-negative Integer: `t=-1`, `t=1.5`,
//!   `t="30"`), or that is an inner list, gives no wait, and the others still count. A
//!   limit with `r` above 0 gives no wait, nor does one with `r=0` and no `t` (the server
//!   did not say for how long). If a parameter appears twice, its last value counts (RFC
//!   9651, section 4.2.3.2). Other parameters (`pk`, vendor ones) are ignored.
//! * **Policy names may be Strings or Tokens.** The drafts name policies with a String
//!   (`"default"`); allowing a Token (`default`) as well has been proposed by the editors,
//!   and it is an easy mistake for a server to make. The name does not change the wait,
//!   so both are accepted. A service limit named by anything else (a number, a byte
//!   sequence) is malformed.
//! * **`RateLimit-Policy` is not read.** It describes each policy's quota (`q`) and window
//!   (`w`), which stay the same from response to response; the draft calls it informative
//!   and lets a client ignore it. It says nothing about when the current window ends: a
//!   `w` is the length of a whole window, not what is left of it, so waiting `w` would
//!   overstate the wait, and `RateLimit` alone carries `r` and `t`. The wait is thus
//!   computed from `RateLimit` only, whether or not the policies it names are described
//!   in `RateLimit-Policy` (the draft allows `RateLimit` without it).
//! * `t` is a number of seconds from when the response was generated; like
//!   delta-seconds in `Retry-After`, it needs no clock.
//!
//! # `X-RateLimit-Reset`
//!
//! Many APIs (GitHub's among them) send `X-RateLimit-Remaining` and `X-RateLimit-Reset`.
//! There is no specification; the common reading, followed here, is:
//!
//! * there is a wait only when `X-RateLimit-Remaining` is `0` (any number of zeros);
//!   missing, not zero, or malformed, there is none;
//! * `X-RateLimit-Reset` is one or more ASCII digits between optional spaces and tabs, like
//!   delta-seconds (no sign, no fraction); a number too large for a `u64` saturates;
//! * a value above 10^9 (1,000,000,000, in 2001) is a Unix time in seconds: servers send
//!   the moment the window resets. Since it names a moment on the server's clock, it is
//!   measured like an HTTP-date in `Retry-After`: against the response's `Date` header when
//!   that is a valid HTTP-date, else against the caller's `now`; a moment already past
//!   waits [`Duration::ZERO`];
//! * a value of at most 10^9 is a number of seconds to wait (some servers send that
//!   instead; 10^9 seconds is over 31 years, so no real delay is mistaken for a time);
//! * each of the two fields must appear exactly once: with no
//!   specification saying how to combine repeated lines, two lines (say one from a proxy
//!   and one from the origin) are ambiguous and give no hint.
//!
//! # Precedence
//!
//! [`Hint::from_headers`] picks one hint from the headers in this order (a custom classifier's
//! own hint, where there is one, is meant to come before all of these; it is not read
//! from headers, so it is not this function's business):
//!
//! 1. a valid `Retry-After`: the RateLimit draft says it takes precedence over the
//!    RateLimit fields, and it is the standard way to say "wait";
//! 2. else the longest of the other hints (every exhausted `RateLimit` policy, and
//!    `X-RateLimit-Reset`); on a tie the source is [`HintSource::RateLimit`].
//!
//! A malformed `Retry-After` does not hide the other fields: it is as if it were absent.
//!
//! [draft-ietf-httpapi-ratelimit-headers]: https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/
//! [RFC 9651]: https://www.rfc-editor.org/rfc/rfc9651

use std::borrow::Cow;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::header::{DATE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue};

use crate::retry_after::{delta_seconds, parse_http_date, trim_ows};

mod structured;

use structured::{Bare, Member};

/// The `RateLimit` field name.
const RATELIMIT: &str = "ratelimit";
/// The `X-RateLimit-Remaining` field name.
const X_RATELIMIT_REMAINING: &str = "x-ratelimit-remaining";
/// The `X-RateLimit-Reset` field name.
const X_RATELIMIT_RESET: &str = "x-ratelimit-reset";

/// An `X-RateLimit-Reset` above this many seconds is a Unix time, not a delay.
const UNIX_TIME_ABOVE: u64 = 1_000_000_000;

/// A wait the server asked for, and where it was read.
///
/// A hint is a floor by default ([`Hint::new`]): the retry waits the longer of it and the
/// backoff, and a hint above `max_retry_after` stops retrying. An exact hint
/// ([`Hint::exact`], gRPC's pushback) is the wait itself, bounded only by the deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Hint {
    /// How long to wait before the next attempt.
    pub wait: Duration,
    /// Which header (or which part of the stack) asked for it.
    pub source: HintSource,
    /// The wait is exact, not a floor.
    pub exact: bool,
}

impl Hint {
    /// A hint of at least `wait`, from `source`.
    pub const fn new(wait: Duration, source: HintSource) -> Self {
        Self {
            wait,
            source,
            exact: false,
        }
    }

    /// A hint of exactly `wait`, from `source`.
    pub const fn exact(wait: Duration, source: HintSource) -> Self {
        Self {
            wait,
            source,
            exact: true,
        }
    }

    /// The server's wait hint in a response's headers, by the precedence described in the
    /// [module documentation](self): a valid `Retry-After`, else the longest of the
    /// `RateLimit` and `X-RateLimit-Reset` waits.
    ///
    /// `now` is the caller's current time, used only when a date or a Unix time has to be
    /// measured and the response has no valid `Date` header. `None` when no header gives a
    /// usable wait.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    ///
    /// use http::HeaderMap;
    /// use tower_http_retry::hints::{Hint, HintSource};
    ///
    /// let now = SystemTime::now();
    /// let mut headers = HeaderMap::new();
    /// headers.insert("ratelimit", r#""burst";r=0;t=5, "daily";r=0;t=60"#.parse().unwrap());
    ///
    /// let hint = Hint::from_headers(&headers, now).unwrap();
    /// assert_eq!(hint.wait, Duration::from_secs(60));
    /// assert_eq!(hint.source, HintSource::RateLimit);
    ///
    /// // `Retry-After` takes precedence, even when shorter.
    /// headers.insert("retry-after", "2".parse().unwrap());
    /// let hint = Hint::from_headers(&headers, now).unwrap();
    /// assert_eq!((hint.wait, hint.source), (Duration::from_secs(2), HintSource::RetryAfter));
    ///
    /// // `X-RateLimit-Reset` with nothing remaining: a Unix time, measured against the
    /// // response's `Date` (1700000010) when it has one.
    /// let mut headers = HeaderMap::new();
    /// headers.insert("x-ratelimit-remaining", "0".parse().unwrap());
    /// headers.insert("x-ratelimit-reset", "1700000042".parse().unwrap());
    /// headers.insert("date", "Tue, 14 Nov 2023 22:13:30 GMT".parse().unwrap());
    /// let hint = Hint::from_headers(&headers, now).unwrap();
    /// assert_eq!((hint.wait, hint.source), (Duration::from_secs(32), HintSource::XRateLimitReset));
    /// ```
    pub fn from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Hint> {
        server_hint(headers, now)
    }
}

/// Where a [`Hint`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HintSource {
    /// The `Retry-After` header ([RFC 9110, section 10.2.3]).
    ///
    /// [RFC 9110, section 10.2.3]: https://www.rfc-editor.org/rfc/rfc9110#section-10.2.3
    RetryAfter,
    /// The `RateLimit` header of the IETF RateLimit fields draft: the longest `t` among the
    /// policies whose `r` is 0.
    RateLimit,
    /// `X-RateLimit-Reset`, with `X-RateLimit-Remaining: 0`.
    XRateLimitReset,
    /// A custom classifier gave the wait along with its verdict.
    Classifier,
    /// A protocol's classifier read the wait from this response header (gRPC's
    /// `grpc-retry-pushback-ms`).
    Header(&'static str),
}

impl HintSource {
    /// A short, stable name, for logs and metrics labels (a header's name for
    /// [`HintSource::Header`]).
    pub fn as_str(&self) -> &'static str {
        match self {
            HintSource::RetryAfter => "retry_after",
            HintSource::RateLimit => "ratelimit",
            HintSource::XRateLimitReset => "x_ratelimit_reset",
            HintSource::Classifier => "classifier",
            HintSource::Header(name) => name,
        }
    }
}

impl fmt::Display for HintSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HintSource::RetryAfter => "Retry-After",
            HintSource::RateLimit => "RateLimit",
            HintSource::XRateLimitReset => "X-RateLimit-Reset",
            HintSource::Classifier => "classifier",
            HintSource::Header(name) => name,
        })
    }
}

/// The server's wait hint: see [`Hint::from_headers`].
pub(crate) fn server_hint(headers: &HeaderMap, now: SystemTime) -> Option<Hint> {
    let date = headers.get(DATE);
    if let Some(wait) = headers
        .get(RETRY_AFTER)
        .and_then(|value| crate::retry_after::parse(value, date, now))
    {
        return Some(Hint::new(wait, HintSource::RetryAfter));
    }

    let rate_limit =
        rate_limit(headers.get_all(RATELIMIT)).map(|wait| Hint::new(wait, HintSource::RateLimit));
    let x_rate_limit = match (
        single(headers, X_RATELIMIT_REMAINING),
        single(headers, X_RATELIMIT_RESET),
    ) {
        (Some(remaining), Some(reset)) => x_rate_limit_reset(remaining, reset, date, now)
            .map(|wait| Hint::new(wait, HintSource::XRateLimitReset)),
        _ => None,
    };
    match (rate_limit, x_rate_limit) {
        (Some(a), Some(b)) if b.wait > a.wait => Some(b),
        (Some(a), _) => Some(a),
        (None, b) => b,
    }
}

/// The value of a field that appears exactly once.
fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a HeaderValue> {
    let mut values = headers.get_all(name).iter();
    let first = values.next()?;
    values.next().is_none().then_some(first)
}

/// The wait a `RateLimit` field asks for: the longest `t` among its service limits whose
/// `r` is 0.
///
/// `lines` are the field's lines in the response, in order (`headers.get_all("ratelimit")`
/// gives them); they form one list. `None` when the field is not a valid Structured Field
/// List, or when no service limit has both `r=0` and a valid `t`. See the
/// [module documentation](self) for what is accepted.
pub(crate) fn rate_limit<'a, I>(lines: I) -> Option<Duration>
where
    I: IntoIterator<Item = &'a HeaderValue>,
{
    let value = combine_lines(lines.into_iter().map(HeaderValue::as_bytes));
    rate_limit_bytes(&value)
}

/// Joins a list field's lines with `", "`, leaving out empty ones, as RFC 9651 (section
/// 4.2) combines them. Borrows when there is a single line.
fn combine_lines<'a>(lines: impl Iterator<Item = &'a [u8]>) -> Cow<'a, [u8]> {
    let mut combined = Cow::Borrowed(&b""[..]);
    for line in lines.map(trim_ows).filter(|line| !line.is_empty()) {
        if combined.is_empty() {
            combined = Cow::Borrowed(line);
        } else {
            let joined = combined.to_mut();
            joined.extend_from_slice(b", ");
            joined.extend_from_slice(line);
        }
    }
    combined
}

/// [`rate_limit`] on a field value whose lines are already combined.
fn rate_limit_bytes(value: &[u8]) -> Option<Duration> {
    structured::parse_list(value)?
        .iter()
        .filter_map(|member| match member {
            Member::Item(item) => Some(item),
            Member::InnerList => None,
        })
        .filter(|item| matches!(item.bare, Bare::String(_) | Bare::Token(_)))
        .filter_map(|item| match (item.param("r"), item.param("t")) {
            (Some(Bare::Integer(0)), Some(Bare::Integer(t))) => u64::try_from(t).ok(),
            _ => None,
        })
        .max()
        .map(Duration::from_secs)
}

/// The wait `X-RateLimit-Reset` asks for, given `X-RateLimit-Remaining`.
///
/// * `remaining` is `X-RateLimit-Remaining`: there is a wait only when it is 0.
/// * `reset` is `X-RateLimit-Reset`: above 10^9 a Unix time in seconds, else a number of
///   seconds.
/// * `date` is the response's `Date` header, if it has one: a Unix time is measured
///   against it when it is a valid HTTP-date, so that the client's clock skew does not
///   matter.
/// * `now` is the caller's current time, the reference for a Unix time when `date` is
///   missing or invalid; no clock is read here.
///
/// `None` when `remaining` is not 0 or either value is malformed; `Some(Duration::ZERO)`
/// for a Unix time that is not in the future. See the [module documentation](self) for
/// the syntax accepted.
pub(crate) fn x_rate_limit_reset(
    remaining: &HeaderValue,
    reset: &HeaderValue,
    date: Option<&HeaderValue>,
    now: SystemTime,
) -> Option<Duration> {
    x_rate_limit_reset_bytes(
        remaining.as_bytes(),
        reset.as_bytes(),
        date.map(HeaderValue::as_bytes),
        now,
    )
}

fn x_rate_limit_reset_bytes(
    remaining: &[u8],
    reset: &[u8],
    date: Option<&[u8]>,
    now: SystemTime,
) -> Option<Duration> {
    if digits(remaining)? != 0 {
        return None;
    }
    let reset = digits(reset)?;
    if reset <= UNIX_TIME_ABOVE {
        return Some(Duration::from_secs(reset));
    }
    let reference = date
        .and_then(|date| parse_http_date(date, now))
        .unwrap_or(now);
    Some(until_unix_time(reset, reference))
}

/// One or more ASCII digits between optional spaces and tabs, saturating at `u64::MAX`.
fn digits(value: &[u8]) -> Option<u64> {
    let value = trim_ows(value);
    (!value.is_empty() && value.iter().all(u8::is_ascii_digit)).then(|| delta_seconds(value))
}

/// From `reference` to `unix_secs` seconds after 1970, zero when that is not later.
/// Works for any `reference`, before 1970 included, and saturates instead of overflowing.
fn until_unix_time(unix_secs: u64, reference: SystemTime) -> Duration {
    let target = Duration::from_secs(unix_secs);
    match reference.duration_since(UNIX_EPOCH) {
        Ok(since_epoch) => target.saturating_sub(since_epoch),
        Err(before_epoch) => target.saturating_add(before_epoch.duration()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Sun, 06 Nov 1994 08:49:37 GMT`, the RFC's example date.
    const EXAMPLE_SECS: u64 = 784_111_777;
    const EXAMPLE_DATE: &str = "Sun, 06 Nov 1994 08:49:37 GMT";
    /// A server's `Date` late enough for Unix times in `X-RateLimit-Reset` (above 10^9).
    const SERVER_SECS: u64 = 1_700_000_010;
    const SERVER_DATE: &str = "Tue, 14 Nov 2023 22:13:30 GMT";

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn secs(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
    }

    fn value(text: &str) -> HeaderValue {
        HeaderValue::from_str(text).expect("a valid header value")
    }

    /// `rate_limit` on one field line.
    fn rl(line: &str) -> Option<Duration> {
        rate_limit([&value(line)])
    }

    /// `rate_limit` on several field lines.
    fn rl_lines(lines: &[&str]) -> Option<Duration> {
        let values: Vec<HeaderValue> = lines.iter().map(|line| value(line)).collect();
        rate_limit(&values)
    }

    fn xrl(remaining: &str, reset: &str, date: Option<&str>, now: SystemTime) -> Option<Duration> {
        let date = date.map(value);
        x_rate_limit_reset(&value(remaining), &value(reset), date.as_ref(), now)
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, text) in pairs {
            map.append(*name, value(text));
        }
        map
    }

    // ---- RateLimit ----

    #[test]
    fn rate_limit_exhausted_policy_waits_t() {
        assert_eq!(rl(r#""default";r=0;t=30"#), secs(30));
        assert_eq!(rl(r#""default";t=30;r=0"#), secs(30));
        assert_eq!(rl(r#""default";r=0;t=0"#), secs(0));
    }

    #[test]
    fn rate_limit_with_quota_left_is_no_hint() {
        assert_eq!(rl(r#""default";r=50;t=30"#), None);
        assert_eq!(rl(r#""default";r=1;t=7"#), None);
    }

    #[test]
    fn rate_limit_without_t_or_r_is_no_hint() {
        assert_eq!(rl(r#""default";r=0"#), None);
        assert_eq!(rl(r#""default";t=30"#), None);
        assert_eq!(rl(r#""default""#), None);
        assert_eq!(rl(r#""default";r=0;pk=:dHJpYWwxMjEzMjM=:"#), None);
    }

    #[test]
    fn rate_limit_token_and_string_names() {
        assert_eq!(rl("default;r=0;t=30"), secs(30));
        assert_eq!(rl(r#""per user";r=0;t=30"#), secs(30));
        assert_eq!(rl(r#""a \"quoted\" \\ name";r=0;t=9"#), secs(9));
        assert_eq!(rl("acme/api:v1;r=0;t=4"), secs(4));
        // Other bare items do not name a policy.
        assert_eq!(rl("1;r=0;t=30"), None);
        assert_eq!(rl(":ZGVmYXVsdA==:;r=0;t=30"), None);
        assert_eq!(rl("?1;r=0;t=30"), None);
        assert_eq!(rl(r#"%"default";r=0;t=30"#), None);
    }

    #[test]
    fn rate_limit_several_policies_take_the_longest_wait() {
        assert_eq!(
            rl(r#""burst";r=0;t=5, "daily";r=0;t=3600, "hourly";r=12;t=600"#),
            secs(3600)
        );
        // A policy with quota left does not wait, however long its window.
        assert_eq!(rl(r#""burst";r=0;t=5, "daily";r=9;t=86400"#), secs(5));
        assert_eq!(rl(r#""a";r=3;t=5, "b";r=9;t=86400"#), None);
    }

    #[test]
    fn rate_limit_lines_combine_into_one_list() {
        assert_eq!(
            rl_lines(&[r#""minute";r=0;t=20"#, r#""hour";r=0;t=1800"#]),
            secs(1800)
        );
        assert_eq!(rl_lines(&[r#""a";r=1;t=20"#, r#""b";r=0;t=3"#]), secs(3));
        // Empty lines add nothing.
        assert_eq!(rl_lines(&["", r#""b";r=0;t=3"#, "  "]), secs(3));
        assert_eq!(rl_lines(&[]), None);
        // One broken line breaks the whole field.
        assert_eq!(rl_lines(&[r#""a";r=0;t=20"#, r#""b;r=0;t=3"#]), None);
        // A string cannot be closed on another line... except by the joining ", ", as
        // RFC 9651 defines the combined value.
        assert_eq!(rl_lines(&[r#""a"#, r#"b";r=0;t=3"#]), secs(3));
    }

    #[test]
    fn rate_limit_t_must_be_a_non_negative_integer() {
        for bad in [
            "-1", "1.5", "30.0", r#""30""#, "thirty", "?1", "@30", ":MzA=:",
        ] {
            assert_eq!(rl(&format!(r#""default";r=0;t={bad}"#)), None, "t={bad}");
        }
        // The bad limit is ignored; the good one still counts.
        assert_eq!(rl(r#""a";r=0;t=-1, "b";r=0;t=7"#), secs(7));
        assert_eq!(rl(r#""a";r=0;t=9.5, "b";r=0;t=7"#), secs(7));
    }

    #[test]
    fn rate_limit_r_must_be_a_non_negative_integer() {
        for bad in ["-0", "0.0", "-1", r#""0""#, "?0", "zero"] {
            let expected = if bad == "-0" { secs(30) } else { None };
            assert_eq!(
                rl(&format!(r#""default";r={bad};t=30"#)),
                expected,
                "r={bad}"
            );
        }
    }

    #[test]
    fn rate_limit_last_parameter_value_counts() {
        assert_eq!(rl(r#""default";r=5;t=30;r=0"#), secs(30));
        assert_eq!(rl(r#""default";r=0;t=30;r=5"#), None);
        assert_eq!(rl(r#""default";r=0;t=30;t=2"#), secs(2));
    }

    #[test]
    fn rate_limit_other_parameters_are_comments() {
        assert_eq!(
            rl(r#""peruser";r=0;t=10;pk=:cHsdsRa894==:;acme-burst=?1;qu="requests";x=1.5"#),
            secs(10)
        );
    }

    #[test]
    fn rate_limit_whitespace_rules() {
        assert_eq!(rl(r#"  "a";r=0;t=3  "#), secs(3));
        assert_eq!(rl("\t\"a\";r=0;t=3\t"), secs(3));
        assert_eq!(rl(r#""a";r=0;t=3 ,	"b";r=0;t=4"#), secs(4));
        assert_eq!(rl(r#""a";r=0;t=3,"b";r=0;t=4"#), secs(4));
        assert_eq!(rl(r#""a"; r=0; t=3"#), secs(3));
        // Not allowed by RFC 9651: the whole field is ignored.
        assert_eq!(rl(r#""a" ;r=0;t=3"#), None);
        assert_eq!(rl(r#""a";r = 0;t=3"#), None);
        assert_eq!(rl(r#""a";r=0;t= 3"#), None);
        assert_eq!(rl(r#""a";r=0;t=3,"#), None);
        assert_eq!(rl(r#""a";r=0;t=3 "b";r=0;t=4"#), None);
        assert_eq!(rl("\"a\";\tr=0;t=3"), None);
    }

    #[test]
    fn rate_limit_malformed_syntax_is_ignored_whole() {
        for bad in [
            r#""default;r=0;t=30"#,
            r#""default";r=0;t=30;"#,
            r#""default";R=0;t=30"#,
            r#"'default';r=0;t=30"#,
            r#""de\fault";r=0;t=30"#,
            r#""default";r=0;t=30, "other";r=0;t=1000000000000000"#,
            r#""default";r=0;t=30, ("a" "b"";r=0;t=3"#,
            r#"default=1;r=0;t=30"#,
            "r=0;t=30",
            ";r=0;t=30",
        ] {
            assert_eq!(rl(bad), None, "{bad:?}");
        }
        assert_eq!(
            rate_limit([&HeaderValue::from_bytes(b"\"caf\xe9\";r=0;t=3").unwrap()]),
            None
        );
    }

    #[test]
    fn rate_limit_inner_lists_do_not_name_a_policy() {
        assert_eq!(rl(r#"("a" "b");r=0;t=30"#), None);
        assert_eq!(rl(r#"("a" "b");r=0;t=30, "c";r=0;t=2"#), secs(2));
    }

    #[test]
    fn rate_limit_largest_t_is_exact() {
        assert_eq!(
            rl(r#""default";r=0;t=999999999999999"#),
            secs(999_999_999_999_999)
        );
        assert_eq!(rl(r#""default";r=0;t=0000000000030"#), secs(30));
    }

    #[test]
    fn rate_limit_empty_field_is_no_hint() {
        assert_eq!(rl(""), None);
        assert_eq!(rl(" "), None);
    }

    // ---- X-RateLimit-Reset ----

    #[test]
    fn x_rate_limit_small_values_are_delays() {
        let now = at(EXAMPLE_SECS);
        assert_eq!(xrl("0", "30", None, now), secs(30));
        assert_eq!(xrl("0", "0", None, now), secs(0));
        assert_eq!(xrl("0", "1000000000", None, now), secs(1_000_000_000));
        // The `Date` header does not matter for a delay.
        assert_eq!(xrl("0", "30", Some(EXAMPLE_DATE), at(0)), secs(30));
    }

    #[test]
    fn x_rate_limit_large_values_are_unix_times_against_now() {
        let now = at(1_700_000_000);
        assert_eq!(xrl("0", "1700000042", None, now), secs(42));
        assert_eq!(xrl("0", "1000000001", None, at(1_000_000_000)), secs(1));
        // Sub-second parts of `now` count.
        let now = at(1_700_000_000) + Duration::from_millis(250);
        assert_eq!(
            xrl("0", "1700000002", None, now),
            Some(Duration::from_millis(1750))
        );
    }

    #[test]
    fn x_rate_limit_unix_times_in_the_past_wait_zero() {
        let now = at(1_700_000_000);
        assert_eq!(xrl("0", "1699999999", None, now), secs(0));
        assert_eq!(xrl("0", "1700000000", None, now), secs(0));
        assert_eq!(xrl("0", "1000000001", None, now), secs(0));
    }

    #[test]
    fn x_rate_limit_unix_times_against_the_date_header() {
        // 1 hour ahead of the server's clock, or 1 hour behind: `Date` decides.
        let reset = SERVER_SECS + 90;
        let reset = reset.to_string();
        for skew in [0, 3600, SERVER_SECS] {
            assert_eq!(
                xrl("0", &reset, Some(SERVER_DATE), at(SERVER_SECS + skew)),
                secs(90)
            );
            assert_eq!(
                xrl("0", &reset, Some(SERVER_DATE), at(SERVER_SECS - skew)),
                secs(90)
            );
        }
        // The other HTTP-date forms are dates too (a two-digit year is read against
        // `now`, here an hour off).
        let skewed = at(SERVER_SECS + 3600);
        assert_eq!(
            xrl("0", &reset, Some("Tuesday, 14-Nov-23 22:13:30 GMT"), skewed),
            secs(90)
        );
        assert_eq!(
            xrl("0", &reset, Some("Tue Nov 14 22:13:30 2023"), skewed),
            secs(90)
        );
        // Before the server's `Date`: zero.
        let past = (SERVER_SECS - 1).to_string();
        assert_eq!(xrl("0", &past, Some(SERVER_DATE), at(0)), secs(0));
    }

    #[test]
    fn x_rate_limit_invalid_date_falls_back_to_now() {
        let reset = (SERVER_SECS + 90).to_string();
        let now = at(SERVER_SECS + 30);
        for bad in [
            "yesterday",
            "",
            "Mon, 14 Nov 2023 22:13:30 GMT",
            "1700000010",
        ] {
            assert_eq!(xrl("0", &reset, Some(bad), now), secs(60), "Date {bad:?}");
        }
    }

    #[test]
    fn x_rate_limit_remaining_must_be_zero() {
        let now = at(EXAMPLE_SECS);
        assert_eq!(xrl("000", "30", None, now), secs(30));
        assert_eq!(xrl(" 0\t", "30", None, now), secs(30));
        for other in ["1", "10", "-0", "0.0", "", " ", "zero", "0 0", "+0", "0,0"] {
            assert_eq!(xrl(other, "30", None, now), None, "remaining {other:?}");
        }
    }

    #[test]
    fn x_rate_limit_reset_malformed_is_no_hint() {
        let now = at(1_700_000_000);
        for bad in [
            "",
            " ",
            "-30",
            "+30",
            "30.5",
            "1700000042.123",
            "30s",
            "3 0",
            EXAMPLE_DATE,
            "0x1e",
        ] {
            assert_eq!(xrl("0", bad, None, now), None, "reset {bad:?}");
        }
        assert_eq!(xrl("0", " 30 ", None, now), secs(30));
        assert_eq!(xrl("0", "\t30", None, now), secs(30));
    }

    #[test]
    fn x_rate_limit_non_ascii_is_no_hint() {
        let zero = value("0");
        let reset = HeaderValue::from_bytes(b"3\xb90").unwrap();
        assert_eq!(x_rate_limit_reset(&zero, &reset, None, at(0)), None);
        let remaining = HeaderValue::from_bytes(b"\xb0").unwrap();
        assert_eq!(
            x_rate_limit_reset(&remaining, &value("3"), None, at(0)),
            None
        );
    }

    #[test]
    fn x_rate_limit_huge_values_saturate() {
        // Far past any clock: a wait of (almost) u64::MAX seconds, never a panic.
        let now = at(1_700_000_000);
        let max = u64::MAX.to_string();
        assert_eq!(xrl("0", &max, None, now), secs(u64::MAX - 1_700_000_000));
        assert_eq!(
            xrl("0", "99999999999999999999999999", None, now),
            secs(u64::MAX - 1_700_000_000)
        );
        assert_eq!(
            xrl("99999999999999999999999999", "30", None, now),
            None,
            "a huge remaining count is not zero"
        );
    }

    #[test]
    fn x_rate_limit_any_clock() {
        // Before 1970, and at the edges of what `SystemTime` holds.
        let before_1970 = UNIX_EPOCH - Duration::from_secs(10);
        assert_eq!(
            xrl("0", "1000000005", None, before_1970),
            secs(1_000_000_015)
        );
        assert_eq!(
            xrl("0", &u64::MAX.to_string(), None, before_1970),
            Some(Duration::MAX)
        );
        let far = UNIX_EPOCH + Duration::from_secs(u64::MAX / 4);
        assert_eq!(xrl("0", "1000000005", None, far), secs(0));
        assert_eq!(until_unix_time(5, UNIX_EPOCH), Duration::from_secs(5));
    }

    // ---- server_hint ----

    #[test]
    fn no_hint_headers_no_hint() {
        assert_eq!(server_hint(&HeaderMap::new(), at(0)), None);
        let map = headers(&[("date", EXAMPLE_DATE), ("content-type", "text/plain")]);
        assert_eq!(server_hint(&map, at(0)), None);
    }

    #[test]
    fn retry_after_comes_first() {
        let map = headers(&[
            ("retry-after", "2"),
            ("ratelimit", r#""default";r=0;t=60"#),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "90"),
        ]);
        assert_eq!(
            server_hint(&map, at(0)),
            Some(Hint::new(Duration::from_secs(2), HintSource::RetryAfter))
        );
        // An HTTP-date in Retry-After, measured against `Date`.
        let map = headers(&[
            ("retry-after", "Sun, 06 Nov 1994 08:50:07 GMT"),
            ("date", EXAMPLE_DATE),
            ("ratelimit", r#""default";r=0;t=60"#),
        ]);
        assert_eq!(
            server_hint(&map, at(0)),
            Some(Hint::new(Duration::from_secs(30), HintSource::RetryAfter))
        );
    }

    #[test]
    fn a_malformed_retry_after_does_not_hide_the_others() {
        let map = headers(&[
            ("retry-after", "soon"),
            ("ratelimit", r#""default";r=0;t=60"#),
        ]);
        assert_eq!(
            server_hint(&map, at(0)),
            Some(Hint::new(Duration::from_secs(60), HintSource::RateLimit))
        );
    }

    #[test]
    fn the_longest_of_the_others_wins() {
        let map = headers(&[
            ("ratelimit", r#""default";r=0;t=60"#),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "90"),
        ]);
        assert_eq!(
            server_hint(&map, at(0)),
            Some(Hint::new(
                Duration::from_secs(90),
                HintSource::XRateLimitReset
            ))
        );
        let map = headers(&[
            ("ratelimit", r#""default";r=0;t=120"#),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "90"),
        ]);
        assert_eq!(
            server_hint(&map, at(0)),
            Some(Hint::new(Duration::from_secs(120), HintSource::RateLimit))
        );
        // A tie goes to RateLimit.
        let map = headers(&[
            ("ratelimit", r#""default";r=0;t=90"#),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "90"),
        ]);
        assert_eq!(
            server_hint(&map, at(0)).map(|hint| hint.source),
            Some(HintSource::RateLimit)
        );
    }

    #[test]
    fn each_reader_alone() {
        let map = headers(&[
            ("ratelimit", r#""a";r=0;t=5"#),
            ("ratelimit", r#""b";r=0;t=8"#),
        ]);
        assert_eq!(
            server_hint(&map, at(0)),
            Some(Hint::new(Duration::from_secs(8), HintSource::RateLimit))
        );
        let map = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &(SERVER_SECS + 40).to_string()),
            ("date", SERVER_DATE),
        ]);
        assert_eq!(
            server_hint(&map, at(0)),
            Some(Hint::new(
                Duration::from_secs(40),
                HintSource::XRateLimitReset
            ))
        );
    }

    #[test]
    fn x_rate_limit_needs_both_fields_once() {
        let map = headers(&[("x-ratelimit-reset", "90")]);
        assert_eq!(server_hint(&map, at(0)), None);
        let map = headers(&[("x-ratelimit-remaining", "0")]);
        assert_eq!(server_hint(&map, at(0)), None);
        let map = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "90"),
        ]);
        assert_eq!(server_hint(&map, at(0)), None);
        let map = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "90"),
            ("x-ratelimit-reset", "30"),
        ]);
        assert_eq!(server_hint(&map, at(0)), None);
        let map = headers(&[("x-ratelimit-remaining", "5"), ("x-ratelimit-reset", "90")]);
        assert_eq!(server_hint(&map, at(0)), None);
    }

    #[test]
    fn ratelimit_policy_does_not_change_the_wait() {
        // A policy alone gives no wait, and `w` never replaces a missing `t`.
        let map = headers(&[("ratelimit-policy", r#""default";q=100;w=60"#)]);
        assert_eq!(server_hint(&map, at(0)), None);
        let map = headers(&[
            ("ratelimit-policy", r#""default";q=100;w=60"#),
            ("ratelimit", r#""default";r=0"#),
        ]);
        assert_eq!(server_hint(&map, at(0)), None);
        // A limit whose policy is not advertised still counts.
        let map = headers(&[
            ("ratelimit-policy", r#""other";q=100;w=60"#),
            ("ratelimit", r#""default";r=0;t=7"#),
        ]);
        assert_eq!(
            server_hint(&map, at(0)),
            Some(Hint::new(Duration::from_secs(7), HintSource::RateLimit))
        );
    }

    #[test]
    fn hint_sources_have_stable_names() {
        let all = [
            (HintSource::RetryAfter, "retry_after", "Retry-After"),
            (HintSource::RateLimit, "ratelimit", "RateLimit"),
            (
                HintSource::XRateLimitReset,
                "x_ratelimit_reset",
                "X-RateLimit-Reset",
            ),
            (HintSource::Classifier, "classifier", "classifier"),
        ];
        for (source, label, shown) in all {
            assert_eq!(source.as_str(), label);
            assert_eq!(source.to_string(), shown);
        }
    }
}
