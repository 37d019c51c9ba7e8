//! What the `hints` readers promise, checked on one input.
//!
//! Shared by the `hints` fuzz target and by `tests/behaviour/proptest_parsers.rs` (which includes
//! this file by path, next to `retry_after_case.rs`), so the fuzzer and `cargo test` check
//! the very same properties. Every check panics with the input when it fails.
//!
//! Three kinds of case:
//! * [`RawCase`]: arbitrary bytes in every header the readers look at. No panic, the same
//!   answer twice, the properties that can be judged without a second parser, and
//!   `Hint::from_headers` agreeing with the readers under the documented precedence.
//! * [`RateLimitModel`]: a `RateLimit` field described as data (policy names, `r`, `t`,
//!   duplicate and comment parameters, spacing, line breaks, deliberate damage), written
//!   out by a serialiser of this file's own; the reader must return the wait the model
//!   says.
//! * [`ResetModel`]: `X-RateLimit-Remaining: 0` and an `X-RateLimit-Reset` number, with or
//!   without a `Date`, any clock; the reader must return the wait computed here in
//!   128-bit nanoseconds.
//!
//! The readers of each field are the crate's own, reached through its one public entry,
//! [`Hint::from_headers`], given a response that holds only the field under test (and
//! `Date` where it matters): [`rate_limit`] and [`x_rate_limit_reset`] below.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue};
use tower_http_retry::hints::{Hint, HintSource};
use tower_http_retry::retry_after;

use crate::retry_after_case::LAST_DATE_SECS;

/// The largest Integer a Structured Field may hold.
pub const MAX_SF_INTEGER: i64 = 999_999_999_999_999;

/// `X-RateLimit-Reset` above this is a Unix time.
const UNIX_TIME_ABOVE: u64 = 1_000_000_000;

// ---- the readers, one field at a time ----

/// The wait the `RateLimit` field lines ask for: [`Hint::from_headers`] on a response with
/// these lines and no other field (so the hint, if any, is the field's own).
pub fn rate_limit<'a, I>(lines: I) -> Option<Duration>
where
    I: IntoIterator<Item = &'a HeaderValue>,
{
    let mut headers = HeaderMap::new();
    for line in lines {
        headers.append("ratelimit", line.clone());
    }
    // No date is read for a RateLimit wait: any clock gives the same answer.
    let hint = Hint::from_headers(&headers, UNIX_EPOCH)?;
    assert_eq!(
        hint,
        Hint::new(hint.wait, HintSource::RateLimit),
        "{headers:?}"
    );
    Some(hint.wait)
}

/// The wait `X-RateLimit-Reset` asks for with this `X-RateLimit-Remaining` (and `Date`):
/// [`Hint::from_headers`] on a response with these fields alone, once each.
pub fn x_rate_limit_reset(
    remaining: &HeaderValue,
    reset: &HeaderValue,
    date: Option<&HeaderValue>,
    now: SystemTime,
) -> Option<Duration> {
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-remaining", remaining.clone());
    headers.insert("x-ratelimit-reset", reset.clone());
    if let Some(date) = date {
        headers.insert("date", date.clone());
    }
    let hint = Hint::from_headers(&headers, now)?;
    assert_eq!(
        hint,
        Hint::new(hint.wait, HintSource::XRateLimitReset),
        "{headers:?}"
    );
    Some(hint.wait)
}

/// The server's hint in a whole response: Retry-After first, else the longer of the
/// others.
fn server_hint(headers: &HeaderMap, now: SystemTime) -> Option<Hint> {
    Hint::from_headers(headers, now)
}

// ---- arbitrary bytes ----

/// Raw bytes for every header the readers consult, and the caller's clock. Values that
/// are not valid header values are skipped when the headers are built.
#[derive(Debug, Clone)]
pub struct RawCase {
    /// `RateLimit` field lines, in order.
    pub rate_limit: Vec<Vec<u8>>,
    /// `X-RateLimit-Remaining` field lines.
    pub remaining: Vec<Vec<u8>>,
    /// `X-RateLimit-Reset` field lines.
    pub reset: Vec<Vec<u8>>,
    /// `Retry-After` field lines.
    pub retry_after: Vec<Vec<u8>>,
    /// `Date` field lines.
    pub date: Vec<Vec<u8>>,
    /// The caller's `now`.
    pub now: SystemTime,
}

fn values(lines: &[Vec<u8>]) -> Vec<HeaderValue> {
    lines
        .iter()
        .filter_map(|line| HeaderValue::from_bytes(line).ok())
        .collect()
}

fn trim_ows(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

/// Digits only (after trimming spaces and tabs), read as `u64` saturating; `None` otherwise.
fn plain_number(value: &[u8]) -> Option<u64> {
    let value = trim_ows(value);
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let text = std::str::from_utf8(value).expect("digits are UTF-8");
    Some(text.parse::<u64>().unwrap_or(u64::MAX))
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

/// Checks arbitrary bytes: no panic, purity, the readers' documented properties, and
/// the whole response's hint following the precedence. Returns that hint.
pub fn check_raw(case: &RawCase) -> Option<Hint> {
    let now = case.now;
    let rate_limit_lines = values(&case.rate_limit);
    let mut headers = HeaderMap::new();
    for (name, lines) in [
        ("ratelimit", &case.rate_limit),
        ("x-ratelimit-remaining", &case.remaining),
        ("x-ratelimit-reset", &case.reset),
        ("retry-after", &case.retry_after),
        ("date", &case.date),
    ] {
        for value in values(lines) {
            headers.append(name, value);
        }
    }

    // RateLimit.
    let wait = rate_limit(&rate_limit_lines);
    assert_eq!(wait, rate_limit(&rate_limit_lines), "pure: {case:?}");
    assert_eq!(
        wait,
        rate_limit(headers.get_all("ratelimit")),
        "the same lines from a HeaderMap: {case:?}"
    );
    if let Some(wait) = wait {
        assert!(
            wait <= Duration::from_secs(MAX_SF_INTEGER as u64),
            "{wait:?} is more than any Structured Field Integer: {case:?}"
        );
        let all: Vec<u8> = rate_limit_lines
            .iter()
            .flat_map(|line| line.as_bytes().iter().copied())
            .collect();
        assert!(
            all.iter()
                .all(|byte| (b' '..=b'~').contains(byte) || *byte == b'\t'),
            "a byte outside the syntax was accepted: {case:?}"
        );
        assert!(
            contains(&all, b"r=") && contains(&all, b"t="),
            "a wait without both r= and t=: {case:?}"
        );
    }
    // Spaces and tabs around each line change nothing.
    let padded: Vec<HeaderValue> = case
        .rate_limit
        .iter()
        .filter_map(|line| {
            let mut padded = b" \t".to_vec();
            padded.extend_from_slice(line);
            padded.extend_from_slice(b"\t ");
            HeaderValue::from_bytes(&padded).ok()
        })
        .collect();
    assert_eq!(
        rate_limit(&padded),
        wait,
        "padding changed the answer: {case:?}"
    );

    // X-RateLimit-Reset, on every pairing of the first few lines given.
    for remaining in values(&case.remaining).into_iter().take(3) {
        for reset in values(&case.reset).into_iter().take(3) {
            let dates = values(&case.date).into_iter().take(3).map(Some);
            for date in std::iter::once(None).chain(dates) {
                check_raw_reset(&remaining, &reset, date.as_ref(), now);
            }
        }
    }

    // The whole response: Retry-After first, else the longer of the others (RateLimit on a
    // tie).
    let hint = server_hint(&headers, now);
    assert_eq!(hint, server_hint(&headers, now), "pure: {case:?}");
    let date = headers.get("date");
    let expected = match headers
        .get("retry-after")
        .and_then(|value| retry_after::parse(value, date, now))
    {
        Some(wait) => Some(Hint::new(wait, HintSource::RetryAfter)),
        None => {
            let from_rate_limit = wait.map(|wait| Hint::new(wait, HintSource::RateLimit));
            let once = |name: &str| {
                let all: Vec<&HeaderValue> = headers.get_all(name).iter().collect();
                match all.as_slice() {
                    [one] => Some(*one),
                    _ => None,
                }
            };
            let from_reset = match (once("x-ratelimit-remaining"), once("x-ratelimit-reset")) {
                (Some(remaining), Some(reset)) => x_rate_limit_reset(remaining, reset, date, now)
                    .map(|wait| Hint::new(wait, HintSource::XRateLimitReset)),
                _ => None,
            };
            match (from_rate_limit, from_reset) {
                (Some(a), Some(b)) => Some(if b.wait > a.wait { b } else { a }),
                (a, b) => a.or(b),
            }
        }
    };
    assert_eq!(hint, expected, "precedence: {case:?}");
    hint
}

fn check_raw_reset(
    remaining: &HeaderValue,
    reset: &HeaderValue,
    date: Option<&HeaderValue>,
    now: SystemTime,
) {
    let wait = x_rate_limit_reset(remaining, reset, date, now);
    let shown = (remaining, reset, date, now);
    assert_eq!(
        wait,
        x_rate_limit_reset(remaining, reset, date, now),
        "pure: {shown:?}"
    );

    let zero = plain_number(remaining.as_bytes()) == Some(0);
    let Some(number) = plain_number(reset.as_bytes()).filter(|_| zero) else {
        assert_eq!(wait, None, "not remaining 0 and a number: {shown:?}");
        return;
    };
    if number <= UNIX_TIME_ABOVE {
        assert_eq!(
            wait,
            Some(Duration::from_secs(number)),
            "a delay: {shown:?}"
        );
        return;
    }
    let wait = wait.unwrap_or_else(|| panic!("a Unix time is always a wait: {shown:?}"));
    match date {
        None => assert_eq!(wait, until(number, now), "against now: {shown:?}"),
        // Whatever the `Date` says, it is not before 1970 when it is used.
        Some(_) => assert!(
            wait <= Duration::from_secs(number) || wait == until(number, now),
            "{wait:?} is more than {number} s after 1970: {shown:?}"
        ),
    }
    // Spaces and tabs around the values change nothing.
    let pad = |value: &HeaderValue| {
        let mut padded = b"\t ".to_vec();
        padded.extend_from_slice(value.as_bytes());
        padded.extend_from_slice(b" \t");
        HeaderValue::from_bytes(&padded).expect("still a header value")
    };
    assert_eq!(
        x_rate_limit_reset(&pad(remaining), &pad(reset), date, now),
        Some(wait),
        "padding changed the answer: {shown:?}"
    );
}

/// `now` as signed nanoseconds since 1970.
fn signed_nanos(time: SystemTime) -> i128 {
    match time.duration_since(UNIX_EPOCH) {
        Ok(after) => after.as_nanos() as i128,
        Err(before) => -(before.duration().as_nanos() as i128),
    }
}

/// From `reference` to `unix_secs` seconds after 1970, zero when past, saturating at
/// `Duration::MAX`: computed in 128-bit nanoseconds, independently of the crate.
pub fn until(unix_secs: u64, reference: SystemTime) -> Duration {
    let diff = i128::from(unix_secs) * 1_000_000_000 - signed_nanos(reference);
    if diff <= 0 {
        return Duration::ZERO;
    }
    match u64::try_from(diff / 1_000_000_000) {
        Ok(secs) => Duration::new(secs, (diff % 1_000_000_000) as u32),
        Err(_) => Duration::MAX,
    }
}

// ---- RateLimit, from a model ----

/// How a service limit names its policy.
#[derive(Debug, Clone)]
pub enum NameModel {
    /// A String: any text, mapped into printable ASCII and escaped when written.
    String(String),
    /// A Token: any text, mapped into token characters when written.
    Token(String),
    /// An Integer: not a policy name.
    Integer(i64),
    /// A Byte Sequence: not a policy name.
    Bytes,
    /// A Boolean: not a policy name.
    Boolean,
    /// An inner list: not a service limit.
    InnerList,
}

/// A parameter value.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueModel {
    /// Not written.
    Missing,
    /// An Integer, brought within the Structured Field range when written.
    Integer(i64),
    /// Sixteen digits: not a Structured Field Integer, so the whole field is invalid.
    Overlong,
    /// A Decimal, in thousandths, brought within range when written.
    Decimal(i64),
    /// A String.
    String(String),
    /// A Token.
    Token,
    /// A Boolean, written `?1`/`?0` (or bare, for true, as RFC 9651 allows).
    Boolean(bool),
}

/// One member of the `RateLimit` list.
#[derive(Debug, Clone)]
pub struct LimitModel {
    /// The policy name (or what stands in its place).
    pub name: NameModel,
    /// The `r` parameter, written last among the `r`s.
    pub r: ValueModel,
    /// An earlier `r` that the last one (if any) overrides.
    pub earlier_r: ValueModel,
    /// The `t` parameter.
    pub t: ValueModel,
    /// Write `t` before `r`.
    pub t_first: bool,
    /// How many comment parameters (`pk`, vendor ones) to add, at most 7.
    pub comments: u8,
}

/// A whole `RateLimit` field.
#[derive(Debug, Clone)]
pub struct RateLimitModel {
    /// The list members, in order.
    pub limits: Vec<LimitModel>,
    /// Bit `i`: start a new field line after member `i` (bits past 63 are unset).
    pub breaks: u64,
    /// Chooses the spacing around separators and lines.
    pub spacing: u64,
    /// 0 and 3..: none; 1: a trailing comma; 2: a space before the first parameter's `;`.
    pub damage: u8,
}

const TOKEN_FIRST: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz*";
const TOKEN_REST: &[u8] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789!#$%&'*+-.^_`|~:/";

fn write_string(text: &str, out: &mut String) {
    out.push('"');
    for byte in text.bytes() {
        let printable = char::from(b' ' + byte % 95);
        if printable == '"' || printable == '\\' {
            out.push('\\');
        }
        out.push(printable);
    }
    out.push('"');
}

fn write_token(text: &str, out: &mut String) {
    let mut bytes = text.bytes();
    let first = bytes.next().unwrap_or(b'x');
    out.push(char::from(
        TOKEN_FIRST[usize::from(first) % TOKEN_FIRST.len()],
    ));
    for byte in bytes {
        out.push(char::from(TOKEN_REST[usize::from(byte) % TOKEN_REST.len()]));
    }
}

fn clamp_integer(value: i64) -> i64 {
    value % (MAX_SF_INTEGER + 1)
}

/// Starts a parameter: `;`, or ` ;` (not allowed) when damage is still to be done.
fn semicolon(damage: &mut bool, out: &mut String) {
    if std::mem::take(damage) {
        out.push(' ');
    }
    out.push(';');
}

/// Writes `;key=value` (or nothing for `Missing`); `sp` after the `;` when asked.
fn write_param(key: &str, value: &ValueModel, sp: bool, damage: &mut bool, out: &mut String) {
    if *value == ValueModel::Missing {
        return;
    }
    semicolon(damage, out);
    if sp {
        out.push(' ');
    }
    out.push_str(key);
    match value {
        ValueModel::Missing => {}
        ValueModel::Integer(n) => out.push_str(&format!("={}", clamp_integer(*n))),
        ValueModel::Overlong => out.push_str("=1234567890123456"),
        ValueModel::Decimal(thousandths) => {
            let thousandths = clamp_integer(*thousandths);
            let sign = if thousandths < 0 { "-" } else { "" };
            let abs = thousandths.unsigned_abs();
            out.push_str(&format!("={sign}{}.{:03}", abs / 1000, abs % 1000));
        }
        ValueModel::String(text) => {
            out.push('=');
            write_string(text, out);
        }
        ValueModel::Token => out.push_str("=acme"),
        // A bare key is the Boolean true.
        ValueModel::Boolean(true) if sp => {}
        ValueModel::Boolean(value) => out.push_str(if *value { "=?1" } else { "=?0" }),
    }
}

/// Comment parameters, each written after a `;`.
const COMMENTS: [&str; 7] = [
    "pk=:dHJpYWwxMjEzMjM=:",
    "acme-burst=?1",
    "qu=\"requests\"",
    "w=60",
    "x.y*z_1=1.5",
    "flag",
    "when=@1700000000",
];

fn write_limit(limit: &LimitModel, sp: bool, damage: &mut bool, out: &mut String) {
    match &limit.name {
        NameModel::String(text) => write_string(text, out),
        NameModel::Token(text) => write_token(text, out),
        NameModel::Integer(n) => out.push_str(&clamp_integer(*n).to_string()),
        NameModel::Bytes => out.push_str(":ZGVmYXVsdA==:"),
        NameModel::Boolean => out.push_str("?1"),
        NameModel::InnerList => out.push_str("(\"a\" b 1;p=2)"),
    }
    let comments = usize::from(limit.comments % 8);
    let (before, after) = COMMENTS[..comments.min(COMMENTS.len())].split_at(comments / 2);
    let comment = |text: &str, damage: &mut bool, out: &mut String| {
        semicolon(damage, out);
        out.push_str(text);
    };
    for text in before {
        comment(text, damage, out);
    }
    write_param("r", &limit.earlier_r, sp, damage, out);
    if limit.t_first {
        write_param("t", &limit.t, sp, damage, out);
        write_param("r", &limit.r, sp, damage, out);
    } else {
        write_param("r", &limit.r, sp, damage, out);
        write_param("t", &limit.t, sp, damage, out);
    }
    for text in after {
        comment(text, damage, out);
    }
}

/// The wait the model's member stands for, by the rules documented in the crate.
fn expected_wait(limit: &LimitModel) -> Option<u64> {
    if !matches!(limit.name, NameModel::String(_) | NameModel::Token(_)) {
        return None;
    }
    let r = match &limit.r {
        ValueModel::Missing => &limit.earlier_r,
        r => r,
    };
    match (r, &limit.t) {
        (ValueModel::Integer(r), ValueModel::Integer(t)) if clamp_integer(*r) == 0 => {
            u64::try_from(clamp_integer(*t)).ok()
        }
        _ => None,
    }
}

fn overlong(value: &ValueModel) -> bool {
    *value == ValueModel::Overlong
}

/// The field lines the model is written as, and whether the damage asked for was done
/// (a trailing comma always is; a space before a `;` only when some member has a
/// parameter).
pub fn rate_limit_lines(model: &RateLimitModel) -> (Vec<String>, bool) {
    const SEPARATORS: [&str; 5] = [",", ", ", " , ", "\t,\t", ",  "];
    const PADDING: [&str; 4] = ["", " ", "\t", " \t "];
    let mut spacing = model.spacing;
    let mut take = |n: u64| {
        let choice = spacing % n;
        spacing = (spacing / n) ^ spacing.rotate_left(7);
        choice as usize
    };
    let mut lines = vec![String::new()];
    let mut damage = model.damage == 2;
    for (i, limit) in model.limits.iter().enumerate() {
        let line = lines.last_mut().expect("one line at least");
        if i > 0 && !line.is_empty() {
            line.push_str(SEPARATORS[take(5)]);
        }
        write_limit(limit, take(2) == 1, &mut damage, line);
        if i < 64 && (model.breaks >> i) & 1 == 1 {
            lines.push(String::new());
        }
    }
    for line in &mut lines {
        *line = format!("{}{line}{}", PADDING[take(4)], PADDING[take(4)]);
    }
    let damaged = match model.damage {
        1 => {
            lines.last_mut().expect("one line").push(',');
            true
        }
        // Still pending: no member had a parameter to damage.
        2 => !damage,
        _ => false,
    };
    (lines, damaged)
}

/// Checks a modelled `RateLimit` field: the reader returns the longest `t` among the
/// String- or Token-named limits whose last `r` is 0, nothing for an invalid field.
/// Returns the reader's answer.
pub fn check_rate_limit(model: &RateLimitModel) -> Option<Duration> {
    let (lines, damaged) = rate_limit_lines(model);
    let invalid = damaged
        || model
            .limits
            .iter()
            .any(|limit| overlong(&limit.r) || overlong(&limit.earlier_r) || overlong(&limit.t));
    let expected = if invalid {
        None
    } else {
        model
            .limits
            .iter()
            .filter_map(expected_wait)
            .max()
            .map(Duration::from_secs)
    };

    let values: Vec<HeaderValue> = lines
        .iter()
        .map(|line| HeaderValue::from_str(line).expect("the serialiser writes header values"))
        .collect();
    let wait = rate_limit(&values);
    assert_eq!(wait, expected, "lines {lines:?} from {model:?}");

    let mut headers = HeaderMap::new();
    for value in values {
        headers.append("ratelimit", value);
    }
    assert_eq!(
        server_hint(&headers, UNIX_EPOCH),
        expected.map(|wait| Hint::new(wait, HintSource::RateLimit)),
        "server_hint on {lines:?}"
    );
    wait
}

// ---- X-RateLimit-Reset, from a model ----

/// `X-RateLimit-Remaining: 0` and `X-RateLimit-Reset: reset`, maybe a `Date`, maybe
/// other hints beside them.
#[derive(Debug, Clone)]
pub struct ResetModel {
    /// The `X-RateLimit-Reset` number.
    pub reset: u64,
    /// How many zeros `X-RateLimit-Remaining` has, less one (taken modulo 20).
    pub zeros: u8,
    /// Spaces and tabs around both values.
    pub pad: u16,
    /// The response's `Date`, in seconds since 1970 (capped at 9999-12-31).
    pub date: Option<u64>,
    /// The caller's clock.
    pub now: SystemTime,
    /// A `RateLimit` limit with `r=0` and this `t`, beside.
    pub rate_limit_t: Option<u32>,
    /// A `Retry-After` of this many seconds, beside.
    pub retry_after: Option<u32>,
}

fn padding(bits: u16) -> String {
    (0..bits & 3)
        .map(|i| {
            if (bits >> (2 + i)) & 1 == 1 {
                '\t'
            } else {
                ' '
            }
        })
        .collect()
}

/// Checks a modelled `X-RateLimit-Reset`: a delay up to 10^9, else a Unix time measured
/// from `Date` (when given) or `now`; `server_hint` with the other hints beside. Returns
/// the reader's answer.
pub fn check_reset(model: &ResetModel) -> Option<Duration> {
    let (before, after) = (padding(model.pad), padding(model.pad >> 8));
    let remaining = format!(
        "{before}{}{after}",
        "0".repeat(1 + usize::from(model.zeros % 20))
    );
    let reset = format!("{after}{}{before}", model.reset);
    let date_secs = model.date.map(|secs| secs.min(LAST_DATE_SECS));
    let date = date_secs.map(|secs| {
        let text = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs));
        HeaderValue::from_str(&text).expect("an HTTP-date is a header value")
    });
    let expected = if model.reset <= UNIX_TIME_ABOVE {
        Duration::from_secs(model.reset)
    } else {
        let reference = match date_secs {
            Some(secs) => UNIX_EPOCH + Duration::from_secs(secs),
            None => model.now,
        };
        until(model.reset, reference)
    };

    let remaining = HeaderValue::from_str(&remaining).expect("a header value");
    let reset = HeaderValue::from_str(&reset).expect("a header value");
    let wait = x_rate_limit_reset(&remaining, &reset, date.as_ref(), model.now);
    assert_eq!(wait, Some(expected), "{model:?}");

    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-remaining", remaining);
    headers.insert("x-ratelimit-reset", reset);
    if let Some(date) = date {
        headers.insert("date", date);
    }
    let mut hint = Hint::new(expected, HintSource::XRateLimitReset);
    if let Some(t) = model.rate_limit_t {
        let line = format!("\"p\";r=0;t={t}");
        headers.insert(
            "ratelimit",
            HeaderValue::from_str(&line).expect("a header value"),
        );
        if Duration::from_secs(u64::from(t)) >= expected {
            hint = Hint::new(Duration::from_secs(u64::from(t)), HintSource::RateLimit);
        }
    }
    // On a tie with a RateLimit wait, RateLimit is the source.
    if expected.subsec_nanos() == 0 && expected.as_secs() <= MAX_SF_INTEGER as u64 {
        let mut tied = headers.clone();
        let line = format!("\"tie\";r=0;t={}", expected.as_secs());
        tied.insert(
            "ratelimit",
            HeaderValue::from_str(&line).expect("a header value"),
        );
        tied.remove("retry-after");
        assert_eq!(
            server_hint(&tied, model.now),
            Some(Hint::new(expected, HintSource::RateLimit)),
            "a tie on {model:?}"
        );
    }
    if let Some(seconds) = model.retry_after {
        headers.insert("retry-after", HeaderValue::from(seconds));
        hint = Hint::new(
            Duration::from_secs(u64::from(seconds)),
            HintSource::RetryAfter,
        );
    }
    assert_eq!(
        server_hint(&headers, model.now),
        Some(hint),
        "server_hint on {model:?}"
    );
    wait
}
