//! What `retry_after::parse` promises, checked on one input.
//!
//! Shared by the `retry_after` fuzz target and by `tests/behaviour/proptest_parsers.rs` (which
//! includes this file by path), so the fuzzer and `cargo test` check the very same
//! properties. Every check panics with the input when it fails.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderValue;
use tower_http_retry::retry_after::parse;

/// The last second an HTTP-date can name, 9999-12-31T23:59:59Z, in seconds since 1970.
pub const LAST_DATE_SECS: u64 = 253_402_300_799;

/// Raw header bytes and the caller's clock.
#[derive(Debug, Clone)]
pub struct RawCase {
    /// The `Retry-After` value.
    pub value: Vec<u8>,
    /// The response's `Date`, if it has one.
    pub date: Option<Vec<u8>>,
    /// The caller's `now`.
    pub now: SystemTime,
}

/// The epoch moved by `secs` seconds (either way) and `nanos` nanoseconds, or the epoch
/// itself where the platform cannot represent that time.
pub fn system_time(secs: i64, nanos: u32) -> SystemTime {
    let magnitude = Duration::new(secs.unsigned_abs(), nanos % 1_000_000_000);
    let moved = if secs < 0 {
        UNIX_EPOCH.checked_sub(magnitude)
    } else {
        UNIX_EPOCH.checked_add(magnitude)
    };
    moved.unwrap_or(UNIX_EPOCH)
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
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

/// `parse` on text: the value must be a header value (the cases built here are); a `Date`
/// that is not one is a response without a usable `Date`.
fn parse_text(value: &str, date: Option<&str>, now: SystemTime) -> Option<Duration> {
    let value = HeaderValue::from_str(value).expect("a valid header value");
    let date = date.and_then(|date| HeaderValue::from_str(date).ok());
    parse(&value, date.as_ref(), now)
}

/// Runs `parse` on these bytes, twice, and checks that it answers the same. `None` when
/// they are not header values.
fn parse_all(value: &[u8], date: Option<&[u8]>, now: SystemTime) -> Option<Option<Duration>> {
    let mut results = Vec::with_capacity(2);
    let value_header = HeaderValue::from_bytes(value).ok();
    let date_header = match date {
        None => Some(None),
        Some(date) => HeaderValue::from_bytes(date).ok().map(Some),
    };
    if let (Some(value), Some(date)) = (&value_header, &date_header) {
        results.push(parse(value, date.as_ref(), now));
        // Pure: nothing but the arguments decides the answer.
        results.push(parse(value, date.as_ref(), now));
    }
    let first = *results.first()?;
    assert!(
        results.iter().all(|result| *result == first),
        "parse answered twice differently on value {:?}, date {:?}, now {now:?}: {results:?}",
        String::from_utf8_lossy(value),
        date.map(String::from_utf8_lossy),
    );
    Some(first)
}

/// Checks arbitrary bytes: no panic, and every documented property that can be judged
/// without parsing a date independently. Returns the parser's answer.
pub fn check_raw(case: &RawCase) -> Option<Duration> {
    let RawCase { value, date, now } = case;
    let result = parse_all(value, date.as_deref(), *now)?;
    let shown = String::from_utf8_lossy(value);

    let trimmed = trim_ows(value);
    if !trimmed.is_empty() && trimmed.iter().all(u8::is_ascii_digit) {
        // delta-seconds: exact, saturating at u64::MAX, whatever `Date` and `now` say.
        let digits = std::str::from_utf8(trimmed).expect("digits are UTF-8");
        let expected = digits.parse::<u64>().unwrap_or(u64::MAX);
        assert_eq!(
            result,
            Some(Duration::from_secs(expected)),
            "delta-seconds {shown:?}"
        );
        return result;
    }
    if !value.iter().any(u8::is_ascii_digit) {
        assert_eq!(result, None, "every accepted form has a digit: {shown:?}");
    }
    if value
        .iter()
        .any(|byte| !(b' '..=b'~').contains(byte) && *byte != b'\t')
    {
        assert_eq!(result, None, "not visible ASCII: {shown:?}");
    }
    if let Some(wait) = result {
        // Here `value` was a date; its reference is either `now` or a valid `Date`, which
        // is never before 1970. So a clock past 1970 bounds the wait.
        if *now >= UNIX_EPOCH {
            assert!(
                wait <= Duration::from_secs(LAST_DATE_SECS),
                "{wait:?} for {shown:?} is later than any HTTP-date"
            );
        }
    }

    // Surrounding spaces and tabs are ignored.
    let mut padded = b" \t".to_vec();
    padded.extend_from_slice(value);
    padded.extend_from_slice(b"\t ");
    if let Some(again) = parse_all(&padded, date.as_deref(), *now) {
        assert_eq!(
            again, result,
            "padding {shown:?} with spaces changed the answer"
        );
    }
    // Letter case is ignored, in both headers.
    let lower = value.to_ascii_lowercase();
    let lower_date = date.as_deref().map(<[u8]>::to_ascii_lowercase);
    if let Some(again) = parse_all(&lower, lower_date.as_deref(), *now) {
        assert_eq!(again, result, "lowercasing {shown:?} changed the answer");
    }
    result
}

/// delta-seconds round-trip: `n`, written with `zeros` leading zeros between `before` and
/// `after` (spaces and tabs only), parses back to exactly `n` seconds, whatever the clock
/// and the `Date` header.
pub fn check_delta(
    n: u64,
    zeros: usize,
    before: &str,
    after: &str,
    now: SystemTime,
    date: Option<&str>,
) {
    assert!(
        before
            .bytes()
            .chain(after.bytes())
            .all(|b| b == b' ' || b == b'\t'),
        "the padding must be spaces and tabs"
    );
    let text = format!("{before}{}{n}{after}", "0".repeat(zeros));
    let expected = Some(Duration::from_secs(n));
    assert_eq!(parse_text(&text, date, now), expected, "{text:?}");
    let header = HeaderValue::from_str(&text).expect("digits and OWS are a header value");
    let date_header = date.and_then(|date| HeaderValue::from_str(date).ok());
    assert_eq!(
        parse(&header, date_header.as_ref(), now),
        expected,
        "{text:?}"
    );
}

/// The three HTTP-date forms of one second (`secs` since 1970, at most
/// [`LAST_DATE_SECS`]): IMF-fixdate, RFC 850 (two-digit year) and asctime.
pub fn date_forms(secs: u64) -> [String; 3] {
    let imf = httpdate::fmt_http_date(at(secs));
    // `Sun, 06 Nov 1994 08:49:37 GMT`
    let (weekday, day, month, year, time) = (
        &imf[0..3],
        &imf[5..7],
        &imf[8..11],
        &imf[12..16],
        &imf[17..25],
    );
    let long_weekday = match weekday {
        "Mon" => "Monday",
        "Tue" => "Tuesday",
        "Wed" => "Wednesday",
        "Thu" => "Thursday",
        "Fri" => "Friday",
        "Sat" => "Saturday",
        _ => "Sunday",
    };
    let rfc850 = format!("{long_weekday}, {day}-{month}-{} {time} GMT", &year[2..]);
    let day: u8 = day.parse().expect("a day of the month");
    let asctime = format!("{weekday} {month} {day:>2} {time} {year}");
    [imf, rfc850, asctime]
}

fn year_of(secs: u64) -> i64 {
    httpdate::fmt_http_date(at(secs))[12..16]
        .parse()
        .expect("a four-digit year")
}

/// HTTP-date round-trip: a date `target` measured against `reference` (both in seconds
/// since 1970, at most [`LAST_DATE_SECS`]) waits `target - reference` (0 when past), in
/// every form, in any letter case, whether `reference` comes from `now` or from the
/// response's `Date` (then whatever `now` says, here `reference + skew`).
pub fn check_date(target: u64, reference: u64, skew: i64) {
    let target = target.min(LAST_DATE_SECS);
    let reference = reference.min(LAST_DATE_SECS);
    let expected = Some(Duration::from_secs(target.saturating_sub(reference)));
    let skewed = system_time(
        i64::try_from(reference)
            .expect("small")
            .saturating_add(skew),
        0,
    );
    let date = httpdate::fmt_http_date(at(reference));
    // RFC 850 names a year by two digits: the latest such year at most 50 years after
    // the reference year. Outside that window it means another year.
    let (target_year, reference_year) = (year_of(target), year_of(reference));
    let two_digits_fit = target_year <= reference_year + 50 && target_year > reference_year - 50;

    for (form, value) in date_forms(target).iter().enumerate() {
        if form == 1 && !two_digits_fit {
            continue;
        }
        assert_eq!(
            parse_text(value, None, at(reference)),
            expected,
            "{value:?}"
        );
        assert_eq!(
            parse_text(value, Some(&date), skewed),
            expected,
            "{value:?} with Date"
        );
        let lower = value.to_ascii_lowercase();
        assert_eq!(
            parse_text(&lower, None, at(reference)),
            expected,
            "{lower:?}"
        );
        let header = HeaderValue::from_str(value).expect("a date is a header value");
        let date_header = HeaderValue::from_str(&date).expect("a date is a header value");
        assert_eq!(
            parse(&header, Some(&date_header), skewed),
            expected,
            "{value:?}"
        );
    }
}
