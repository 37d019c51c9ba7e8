//! Parsing of the `Retry-After` response header into a wait hint.
//!
//! A server that answers `503 Service Unavailable`, `429 Too Many Requests`
//! or a redirect may send `Retry-After` to say how long the client ought to
//! wait before it tries again ([RFC 9110, section 10.2.3]). The value is
//! either a number of seconds (`Retry-After: 120`) or an absolute
//! HTTP-date (`Retry-After: Fri, 31 Dec 1999 23:59:59 GMT`).
//!
//! [`parse`] turns that value into a [`Duration`]. The retry middleware uses
//! the result as a *floor* for its own backoff: it never retries sooner than
//! the server asked, but it still applies its own limits (for example a cap
//! on the longest wait it is willing to honour). This module makes no policy
//! decision: a huge value yields a huge [`Duration`], and capping it is up to
//! the caller.
//!
//! # Measuring an HTTP-date
//!
//! An HTTP-date names a moment on the *server's* clock. Subtracting the
//! client's clock from it would mix two clocks, and a client whose clock is
//! an hour behind would wait an hour too long. So when the same response
//! carries a `Date` header that is itself a valid HTTP-date, the hint is
//! `Retry-After - Date`, which only involves the server's clock. Only when
//! `Date` is missing or unusable is the caller's `now` used instead. A date
//! at or before that reference yields [`Duration::ZERO`] (the server allows
//! an immediate retry).
//!
//! [`parse`] is pure: the current time is an argument, and no clock is read
//! inside, which keeps it deterministic and easy to test.
//!
//! # Accepted syntax
//!
//! Surrounding spaces and horizontal tabs are ignored; anything else that
//! does not fit one of the forms below yields `None` ("no hint").
//!
//! * **delta-seconds**: one or more ASCII digits and nothing else, so `-1`,
//!   `+5`, `1.5` and `1 2` are rejected. A number too large for a `u64`
//!   saturates to `u64::MAX` seconds instead of failing.
//! * **HTTP-date**, in each of the three forms a recipient must accept:
//!   IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the obsolete RFC 850 form
//!   (`Sunday, 06-Nov-94 08:49:37 GMT`) and the asctime form
//!   (`Sun Nov  6 08:49:37 1994`).
//!
//! Decisions where the RFC leaves room, or where real servers misbehave:
//!
//! * **Letter case is ignored.** RFC 9110 defines HTTP-date as case
//!   sensitive, but a server that writes `sun, 06 nov 1994 08:49:37 gmt`
//!   still means an unambiguous moment, and honouring it is kinder to that
//!   server than retrying early. Weekday names, month names and `GMT` are
//!   therefore matched without regard to ASCII case.
//! * **The time zone is required.** IMF-fixdate and RFC 850 dates must end in
//!   `GMT` (in any case). A date without it, or with another zone such as
//!   `UTC` or `+0000`, is rejected: without the zone the moment is ambiguous,
//!   and guessing could make the client wait hours too long or too little.
//!   The asctime form never carries a zone and is read as GMT, as the RFC
//!   requires.
//! * **Two-digit years** (RFC 850 form) follow RFC 9110: the year is the
//!   latest one ending in those two digits that is at most 50 years after
//!   the reference year. The comparison is by calendar year: with a
//!   reference in 2026, `76` means 2076 and `77` means 1977. For the
//!   `Retry-After` value the reference is the one described above (`Date`
//!   when valid, else `now`); for the `Date` header itself it is `now`. This
//!   deliberately differs from the `httpdate` crate, which always maps
//!   `70`–`99` to the 1900s and `00`–`69` to the 2000s.
//! * **The weekday must match the date.** `Mon, 06 Nov 1994 ...` is rejected,
//!   since 6 November 1994 was a Sunday; an inconsistent date is more likely
//!   corrupt than meaningful. Impossible dates such as 31 February are
//!   rejected as well.
//! * **Years outside 1970 to 9999 are rejected.** Such a date cannot be
//!   represented by the underlying parser, and a `Retry-After` before 1970 is
//!   certainly stale; either way the caller simply falls back to its own
//!   backoff.
//! * Bytes that are not visible ASCII (obs-text, control characters, or
//!   anything that is not UTF-8) make the whole value invalid.
//!
//! No input makes [`parse`] panic, whatever the value, the `Date`
//! header or `now` (including times before 1970 or far in the future).
//!
//! [RFC 9110, section 10.2.3]: https://www.rfc-editor.org/rfc/rfc9110#section-10.2.3

use std::borrow::Cow;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::HeaderValue;

/// Computes how long to wait before retrying, from a `Retry-After` value.
///
/// * `value` is the `Retry-After` header of the response.
/// * `date` is the `Date` header of the same response, if it has one. When it
///   holds a valid HTTP-date, an HTTP-date in `value` is measured against it
///   rather than against `now`, so that the client's clock skew does not
///   matter.
/// * `now` is the caller's current time; no clock is read here.
///
/// Returns `None` when `value` is neither delta-seconds nor a valid
/// HTTP-date, and `Some(Duration::ZERO)` for a date that is not in the future.
/// See the [module documentation](self) for the exact syntax accepted.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
///
/// use http::HeaderValue;
/// use tower_http_retry::retry_after::parse;
///
/// let now = SystemTime::now();
///
/// // Delta-seconds do not depend on any clock.
/// let value = HeaderValue::from_static("120");
/// assert_eq!(parse(&value, None, now), Some(Duration::from_secs(120)));
///
/// // An HTTP-date is measured against the response's own `Date` header,
/// // whatever the local clock says.
/// let value = HeaderValue::from_static("Sun, 06 Nov 1994 08:50:07 GMT");
/// let date = HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT");
/// assert_eq!(parse(&value, Some(&date), now), Some(Duration::from_secs(30)));
///
/// // Without a `Date` header, `now` is the reference.
/// let now = UNIX_EPOCH + Duration::from_secs(784_111_777); // 08:49:37 that day
/// assert_eq!(parse(&value, None, now), Some(Duration::from_secs(30)));
///
/// // Garbage is not a hint.
/// let value = HeaderValue::from_static("soon");
/// assert_eq!(parse(&value, None, now), None);
/// ```
pub fn parse(value: &HeaderValue, date: Option<&HeaderValue>, now: SystemTime) -> Option<Duration> {
    parse_bytes(value.as_bytes(), date.map(HeaderValue::as_bytes), now)
}

/// Same as [`parse`], for the crate's own tests: values as text.
#[cfg(test)]
pub(crate) fn parse_str(value: &str, date: Option<&str>, now: SystemTime) -> Option<Duration> {
    parse_bytes(value.as_bytes(), date.map(str::as_bytes), now)
}

/// The implementation of [`parse`].
fn parse_bytes(value: &[u8], date: Option<&[u8]>, now: SystemTime) -> Option<Duration> {
    let value = trim_ows(value);
    if !value.is_empty() && value.iter().all(u8::is_ascii_digit) {
        return Some(Duration::from_secs(delta_seconds(value)));
    }

    let reference = date
        .and_then(|date| parse_http_date(date, now))
        .unwrap_or(now);
    let target = parse_http_date(value, reference)?;
    // `duration_since` fails (rather than panicking) when `target` is earlier.
    Some(target.duration_since(reference).unwrap_or(Duration::ZERO))
}

/// Removes leading and trailing spaces and horizontal tabs (HTTP's `OWS`).
pub(crate) fn trim_ows(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

/// Reads a non-empty run of ASCII digits, saturating at `u64::MAX`.
pub(crate) fn delta_seconds(digits: &[u8]) -> u64 {
    digits
        .iter()
        .try_fold(0_u64, |total, digit| {
            total.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
        })
        .unwrap_or(u64::MAX)
}

/// Parses an HTTP-date in any of its three forms, with the leniency
/// documented on the module. `pivot` decides the century of a two-digit year.
pub(crate) fn parse_http_date(raw: &[u8], pivot: SystemTime) -> Option<SystemTime> {
    let raw = trim_ows(raw);
    // Visible ASCII plus the spaces inside the date; this also guarantees
    // the bytes are UTF-8 and that `httpdate` has nothing left to trim.
    if !raw.iter().all(|byte| (b' '..=b'~').contains(byte)) {
        return None;
    }

    let mut text = raw.to_vec();
    normalise_case(&mut text);
    let fixed = rewrite_rfc850(&text, pivot)?;

    // From here on only IMF-fixdate (29 bytes) or asctime (24 bytes) may reach
    // `httpdate`. Its own RFC 850 reader needs at least 30 bytes, so it can
    // never apply its fixed two-digit-year window to our input.
    if fixed.len() != IMF_FIXDATE_LEN && fixed.len() != ASCTIME_LEN {
        return None;
    }
    let fixed = std::str::from_utf8(&fixed).ok()?;
    // `httpdate` checks field ranges, that the day exists in its month, that
    // the weekday matches, and that the year lies within 1970..=9999.
    httpdate::parse_http_date(fixed).ok()
}

/// Length of an IMF-fixdate such as `Sun, 06 Nov 1994 08:49:37 GMT`.
const IMF_FIXDATE_LEN: usize = 29;

/// Length of an asctime date such as `Sun Nov  6 08:49:37 1994`.
const ASCTIME_LEN: usize = 24;

/// Full weekday names, as used by the RFC 850 form.
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Rewrites every run of ASCII letters into the capitalisation HTTP-dates use:
/// `GMT` in capitals, everything else (weekdays, months) as `Title`.
///
/// Words that are neither stay wrong after this and are rejected later.
fn normalise_case(text: &mut [u8]) {
    for word in text.split_mut(|byte| !byte.is_ascii_alphabetic()) {
        if word.eq_ignore_ascii_case(b"GMT") {
            word.make_ascii_uppercase();
        } else if let Some((first, rest)) = word.split_first_mut() {
            first.make_ascii_uppercase();
            rest.make_ascii_lowercase();
        }
    }
}

/// Turns an RFC 850 date (`Sunday, 06-Nov-94 08:49:37 GMT`) into the
/// equivalent IMF-fixdate, choosing the century as RFC 9110 requires.
///
/// Text that does not start with a full weekday name and `", "` is returned
/// unchanged; text that does but is not a well-formed RFC 850 date gives
/// `None`. Expects `text` to have gone through [`normalise_case`].
fn rewrite_rfc850(text: &[u8], pivot: SystemTime) -> Option<Cow<'_, [u8]>> {
    let Some((weekday, rest)) = WEEKDAYS.iter().find_map(|weekday| {
        text.strip_prefix(weekday.as_bytes())
            .and_then(|rest| rest.strip_prefix(b", "))
            .map(|rest| (weekday, rest))
    }) else {
        return Some(Cow::Borrowed(text));
    };

    // `DD-Mon-YY HH:MM:SS GMT`; the day, month and time are checked by
    // `httpdate` once rewritten, only the year needs handling here.
    let body = rest.strip_suffix(b" GMT")?;
    if body.len() != "DD-Mon-YY HH:MM:SS".len()
        || body[2] != b'-'
        || body[6] != b'-'
        || body[9] != b' '
    {
        return None;
    }
    let (day, month, yy, time) = (&body[0..2], &body[3..6], &body[7..9], &body[10..]);
    if !yy.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let two_digits = i64::from((yy[0] - b'0') * 10 + (yy[1] - b'0'));
    let year = resolve_two_digit_year(two_digits, civil_year(pivot));
    if !(1970..=9999).contains(&year) {
        return None;
    }

    let mut fixed = Vec::with_capacity(IMF_FIXDATE_LEN);
    fixed.extend_from_slice(&weekday.as_bytes()[..3]);
    fixed.extend_from_slice(b", ");
    fixed.extend_from_slice(day);
    fixed.push(b' ');
    fixed.extend_from_slice(month);
    fixed.push(b' ');
    fixed.extend_from_slice(format!("{year:04} ").as_bytes());
    fixed.extend_from_slice(time);
    fixed.extend_from_slice(b" GMT");
    Some(Cow::Owned(fixed))
}

/// Picks the latest year ending in `two_digits` (0..=99) that is at most 50
/// years after `reference_year`.
fn resolve_two_digit_year(two_digits: i64, reference_year: i64) -> i64 {
    let latest_allowed = reference_year.saturating_add(50);
    latest_allowed - (latest_allowed - two_digits).rem_euclid(100)
}

/// The proleptic Gregorian year (UTC) in which `time` falls. Works for any
/// `SystemTime`, including ones before 1970.
fn civil_year(time: SystemTime) -> i64 {
    const SECS_PER_DAY: i64 = 86_400;
    let secs = match time.duration_since(UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(err) => {
            let before = err.duration();
            let whole = i64::try_from(before.as_secs()).unwrap_or(i64::MAX);
            // Round towards the past: half a second before 1970 is in 1969.
            (-whole).saturating_sub(i64::from(before.subsec_nanos() > 0))
        }
    };
    let days = secs.div_euclid(SECS_PER_DAY);

    // An average Gregorian year is 146_097 / 400 days; the estimate is off by
    // at most one year, which the loops below correct.
    let mut year = 1970 + days * 400 / 146_097;
    while days_before_year(year) > days {
        year -= 1;
    }
    while days_before_year(year + 1) <= days {
        year += 1;
    }
    year
}

/// Number of days from 1970-01-01 to the first of January of `year`
/// (negative for earlier years).
fn days_before_year(year: i64) -> i64 {
    // Leap years among 1..=y, extended to y <= 0 by flooring division.
    fn leap_years_through(y: i64) -> i64 {
        y.div_euclid(4) - y.div_euclid(100) + y.div_euclid(400)
    }
    365 * (year - 1970) + leap_years_through(year - 1) - leap_years_through(1969)
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    /// `Sun, 06 Nov 1994 08:49:37 GMT`, the RFC's example date.
    const EXAMPLE_SECS: u64 = 784_111_777;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn example() -> SystemTime {
        at(EXAMPLE_SECS)
    }

    fn secs(n: u64) -> Option<Duration> {
        Some(Duration::from_secs(n))
    }

    /// A `now` 90 seconds before the example date.
    fn before_example() -> SystemTime {
        at(EXAMPLE_SECS - 90)
    }

    // ---- delta-seconds ----

    #[test]
    fn delta_seconds_plain() {
        assert_eq!(parse_str("120", None, example()), secs(120));
    }

    #[test]
    fn delta_seconds_surrounding_whitespace() {
        assert_eq!(parse_str(" 120 ", None, example()), secs(120));
        assert_eq!(parse_str("\t120 \t", None, example()), secs(120));
    }

    #[test]
    fn delta_seconds_zero() {
        assert_eq!(parse_str("0", None, example()), Some(Duration::ZERO));
    }

    #[test]
    fn delta_seconds_leading_zeros() {
        assert_eq!(parse_str("007", None, example()), secs(7));
    }

    #[test]
    fn delta_seconds_negative_rejected() {
        assert_eq!(parse_str("-1", None, example()), None);
    }

    #[test]
    fn delta_seconds_fraction_rejected() {
        assert_eq!(parse_str("1.5", None, example()), None);
    }

    #[test]
    fn delta_seconds_plus_sign_rejected() {
        assert_eq!(parse_str("+5", None, example()), None);
    }

    #[test]
    fn empty_rejected() {
        assert_eq!(parse_str("", None, example()), None);
        assert_eq!(parse_str(" \t ", None, example()), None);
    }

    #[test]
    fn letters_rejected() {
        assert_eq!(parse_str("abc", None, example()), None);
    }

    #[test]
    fn inner_whitespace_rejected() {
        assert_eq!(parse_str("1 2", None, example()), None);
    }

    #[test]
    fn other_whitespace_is_not_trimmed() {
        assert_eq!(parse_str("\n120", None, example()), None);
        assert_eq!(parse_str("120\r", None, example()), None);
    }

    #[test]
    fn non_ascii_digits_rejected() {
        // Arabic-Indic digits are Unicode digits but not delta-seconds.
        assert_eq!(parse_str("١٢٠", None, example()), None);
    }

    #[test]
    fn huge_delta_seconds_saturates() {
        assert_eq!(
            parse_str("99999999999999999999", None, example()),
            secs(u64::MAX)
        );
    }

    #[test]
    fn u64_max_is_exact_and_one_more_saturates() {
        assert_eq!(
            parse_str("18446744073709551615", None, example()),
            secs(u64::MAX)
        );
        assert_eq!(
            parse_str("18446744073709551616", None, example()),
            secs(u64::MAX)
        );
        assert_eq!(
            parse_str("18446744073709551614", None, example()),
            secs(u64::MAX - 1)
        );
    }

    #[test]
    fn delta_seconds_ignore_date_header() {
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(parse_str("30", Some(date), at(0)), secs(30));
    }

    // ---- the three HTTP-date forms ----

    #[test]
    fn imf_fixdate() {
        let value = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(parse_str(value, None, before_example()), secs(90));
    }

    #[test]
    fn rfc850_date() {
        let value = "Sunday, 06-Nov-94 08:49:37 GMT";
        assert_eq!(parse_str(value, None, before_example()), secs(90));
    }

    #[test]
    fn asctime_date() {
        let value = "Sun Nov  6 08:49:37 1994";
        assert_eq!(parse_str(value, None, before_example()), secs(90));
    }

    #[test]
    fn asctime_date_with_zero_padded_day() {
        let value = "Sun Nov 06 08:49:37 1994";
        assert_eq!(parse_str(value, None, before_example()), secs(90));
    }

    #[test]
    fn date_with_surrounding_whitespace() {
        let value = " \tSun, 06 Nov 1994 08:49:37 GMT\t ";
        assert_eq!(parse_str(value, None, before_example()), secs(90));
    }

    #[test]
    fn date_with_extra_inner_space_rejected() {
        let value = "Sun,  06 Nov 1994 08:49:37 GMT";
        assert_eq!(parse_str(value, None, before_example()), None);
    }

    #[test]
    fn header_value_entry_point() {
        let value = HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(parse(&value, None, before_example()), secs(90));
        let value = HeaderValue::from_static("120");
        assert_eq!(parse(&value, None, before_example()), secs(120));
    }

    // ---- reference: Date header versus now ----

    #[test]
    fn date_header_beats_skewed_local_clock() {
        let value = HeaderValue::from_static("Sun, 06 Nov 1994 08:50:37 GMT");
        let date = HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT");
        // The local clock runs an hour ahead of the server's...
        let fast = at(EXAMPLE_SECS + 3_600);
        assert_eq!(parse(&value, Some(&date), fast), secs(60));
        // ...or an hour behind it; either way the answer is value - Date.
        let slow = at(EXAMPLE_SECS - 3_600);
        assert_eq!(parse(&value, Some(&date), slow), secs(60));
        // Sanity check: against the slow clock alone it would be 3660 s.
        assert_eq!(parse(&value, None, slow), secs(3_660));
    }

    #[test]
    fn date_header_in_other_forms_is_used() {
        let value = "Sun, 06 Nov 1994 08:50:37 GMT";
        let now = at(EXAMPLE_SECS + 3_600);
        assert_eq!(
            parse_str(value, Some("Sunday, 06-Nov-94 08:49:37 GMT"), now),
            secs(60)
        );
        assert_eq!(
            parse_str(value, Some("Sun Nov  6 08:49:37 1994"), now),
            secs(60)
        );
    }

    #[test]
    fn invalid_date_header_falls_back_to_now() {
        let value = "Sun, 06 Nov 1994 08:49:37 GMT";
        let now = before_example();
        assert_eq!(parse_str(value, Some("yesterday"), now), secs(90));
        assert_eq!(parse_str(value, Some(""), now), secs(90));
        // A `Date` given as seconds is not an HTTP-date either.
        assert_eq!(parse_str(value, Some("784111000"), now), secs(90));
    }

    #[test]
    fn opaque_date_header_falls_back_to_now() {
        let value = HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT");
        let date = HeaderValue::from_bytes(b"Sun, 06 Nov 1994 08:4\xff:37 GMT").unwrap();
        assert_eq!(parse(&value, Some(&date), before_example()), secs(90));
    }

    #[test]
    fn past_date_gives_zero() {
        let value = "Sun, 06 Nov 1994 08:49:37 GMT";
        let later = at(EXAMPLE_SECS + 1);
        assert_eq!(parse_str(value, None, later), Some(Duration::ZERO));
        let much_later = at(2_000_000_000);
        assert_eq!(parse_str(value, None, much_later), Some(Duration::ZERO));
    }

    #[test]
    fn date_equal_to_reference_gives_zero() {
        let value = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(parse_str(value, None, example()), Some(Duration::ZERO));
        assert_eq!(parse_str(value, Some(value), at(0)), Some(Duration::ZERO));
    }

    #[test]
    fn date_before_date_header_gives_zero() {
        let value = "Sun, 06 Nov 1994 08:49:37 GMT";
        let date = "Sun, 06 Nov 1994 08:50:37 GMT";
        // Local clock far behind: only the Date header says "already past".
        assert_eq!(parse_str(value, Some(date), at(0)), Some(Duration::ZERO));
    }

    // ---- documented leniency and strictness ----

    #[test]
    fn lowercase_weekday_accepted() {
        let value = "sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(parse_str(value, None, before_example()), secs(90));
    }

    #[test]
    fn case_is_ignored_in_all_forms() {
        let now = before_example();
        assert_eq!(
            parse_str("SUN, 06 NOV 1994 08:49:37 gmt", None, now),
            secs(90)
        );
        assert_eq!(
            parse_str("sunday, 06-nov-94 08:49:37 Gmt", None, now),
            secs(90)
        );
        assert_eq!(parse_str("sUN nOV  6 08:49:37 1994", None, now), secs(90));
    }

    #[test]
    fn imf_fixdate_without_gmt_rejected() {
        let value = "Sun, 06 Nov 1994 08:49:37";
        assert_eq!(parse_str(value, None, before_example()), None);
    }

    #[test]
    fn rfc850_without_gmt_rejected() {
        let value = "Sunday, 06-Nov-94 08:49:37";
        assert_eq!(parse_str(value, None, before_example()), None);
    }

    #[test]
    fn other_time_zones_rejected() {
        let now = before_example();
        assert_eq!(parse_str("Sun, 06 Nov 1994 08:49:37 UTC", None, now), None);
        assert_eq!(
            parse_str("Sun, 06 Nov 1994 08:49:37 +0000", None, now),
            None
        );
        assert_eq!(parse_str("Sun Nov  6 08:49:37 1994 GMT", None, now), None);
    }

    #[test]
    fn wrong_weekday_rejected() {
        let value = "Mon, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(parse_str(value, None, before_example()), None);
    }

    #[test]
    fn impossible_day_rejected() {
        // 1995-02-29 does not exist (it would be a Wednesday, 1 March).
        let value = "Wed, 29 Feb 1995 00:00:00 GMT";
        assert_eq!(parse_str(value, None, at(0)), None);
    }

    #[test]
    fn out_of_range_time_rejected() {
        let value = "Sun, 06 Nov 1994 24:00:00 GMT";
        assert_eq!(parse_str(value, None, at(0)), None);
    }

    #[test]
    fn opaque_bytes_rejected() {
        let value = HeaderValue::from_bytes(b"Sun, 06 Nov 1994 08:49:37 GMT\xe9").unwrap();
        assert_eq!(parse(&value, None, before_example()), None);
        let value = HeaderValue::from_bytes(b"\x80\x81\xfe").unwrap();
        assert_eq!(parse(&value, None, before_example()), None);
    }

    #[test]
    fn year_9999_does_not_panic() {
        let value = "Fri, 31 Dec 9999 23:59:59 GMT";
        assert_eq!(
            parse_str(value, None, at(0)),
            secs(253_402_300_799),
            "the last representable second"
        );
    }

    #[test]
    fn year_10000_rejected() {
        assert_eq!(
            parse_str("Sat, 01 Jan 10000 00:00:00 GMT", None, at(0)),
            None
        );
    }

    #[test]
    fn dates_before_1970_rejected() {
        let value = "Wed, 31 Dec 1969 23:59:59 GMT";
        assert_eq!(parse_str(value, None, at(0)), None);
        assert_eq!(parse_str("Wed Dec 31 23:59:59 1969", None, at(0)), None);
    }

    #[test]
    fn now_before_1970_does_not_panic() {
        let long_ago = UNIX_EPOCH - Duration::from_secs(100 * 365 * 86_400);
        let value = "Thu, 01 Jan 1970 00:00:00 GMT";
        let expected = UNIX_EPOCH.duration_since(long_ago).ok();
        assert_eq!(parse_str(value, None, long_ago), expected);
        assert_eq!(parse_str("5", None, long_ago), secs(5));
    }

    // ---- two-digit years (RFC 850) ----

    /// 2026-01-01T00:00:00Z.
    const START_OF_2026: u64 = 1_767_225_600;

    #[test]
    fn two_digit_year_up_to_50_years_ahead_is_future() {
        // httpdate alone would read `70` as 1970; RFC 9110 wants 2070.
        let value = "Wednesday, 01-Jan-70 00:00:00 GMT";
        let now = at(START_OF_2026);
        assert_eq!(
            parse_str(value, None, now),
            secs(3_155_760_000 - START_OF_2026)
        );
        let value = "Wednesday, 01-Jan-76 00:00:00 GMT";
        assert_eq!(
            parse_str(value, None, now),
            secs(3_345_062_400 - START_OF_2026)
        );
    }

    #[test]
    fn two_digit_year_more_than_50_years_ahead_is_past() {
        // 2077 is 51 years after 2026, so `77` is 1977, long past.
        let value = "Saturday, 01-Jan-77 00:00:00 GMT";
        assert_eq!(
            parse_str(value, None, at(START_OF_2026)),
            Some(Duration::ZERO)
        );
        // The weekday of 2077-01-01 (a Friday) does not fit 1977.
        let value = "Friday, 01-Jan-77 00:00:00 GMT";
        assert_eq!(parse_str(value, None, at(START_OF_2026)), None);
    }

    #[test]
    fn two_digit_year_moves_with_the_reference() {
        // In 2080, `00` means 2100 (20 years ahead), not 2000.
        let now = at(3_471_292_800); // 2080-01-01
        let value = "Friday, 01-Jan-00 00:00:00 GMT";
        assert_eq!(
            parse_str(value, None, now),
            secs(4_102_444_800 - 3_471_292_800)
        );
    }

    #[test]
    fn two_digit_year_uses_date_header_as_reference() {
        // Local clock says 1994, the server says 2026: `70` is resolved
        // against the server's year, giving 2070.
        let value = "Wednesday, 01-Jan-70 00:00:00 GMT";
        let date = "Thu, 01 Jan 2026 00:00:00 GMT";
        assert_eq!(
            parse_str(value, Some(date), example()),
            secs(3_155_760_000 - START_OF_2026)
        );
    }

    #[test]
    fn rfc850_malformed_rejected() {
        let now = before_example();
        for value in [
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sunday, 06 Nov 94 08:49:37 GMT",
            "Sunday, 06-Nov-9x 08:49:37 GMT",
            "Sunday,06-Nov-94 08:49:37 GMT",
            "Sunday, 06-Nov-94 08:49:3 GMT",
            "Sunday, 06-Nov-94 08:49:37GMT",
            "Sunday, ",
            "Sunday, 06-Nov-94 08:49:37 GMT GMT",
        ] {
            assert_eq!(parse_str(value, None, now), None, "{value:?}");
        }
    }

    #[test]
    fn resolve_two_digit_year_rule() {
        assert_eq!(resolve_two_digit_year(94, 2026), 1994);
        assert_eq!(resolve_two_digit_year(76, 2026), 2076);
        assert_eq!(resolve_two_digit_year(77, 2026), 1977);
        assert_eq!(resolve_two_digit_year(26, 2026), 2026);
        assert_eq!(resolve_two_digit_year(0, 2050), 2100);
        assert_eq!(resolve_two_digit_year(1, 2050), 2001);
        assert_eq!(resolve_two_digit_year(99, 1969), 1999);
        assert_eq!(resolve_two_digit_year(20, 1969), 1920);
    }

    #[test]
    fn civil_year_known_values() {
        assert_eq!(civil_year(UNIX_EPOCH), 1970);
        assert_eq!(civil_year(UNIX_EPOCH - Duration::from_nanos(1)), 1969);
        assert_eq!(civil_year(UNIX_EPOCH - Duration::from_secs(1)), 1969);
        assert_eq!(civil_year(example()), 1994);
        assert_eq!(civil_year(at(START_OF_2026 - 1)), 2025);
        assert_eq!(civil_year(at(START_OF_2026)), 2026);
        // 2000 is a leap year: its last second is still 2000.
        assert_eq!(civil_year(at(978_307_199)), 2000);
        assert_eq!(civil_year(at(978_307_200)), 2001);
        assert_eq!(civil_year(at(253_402_300_799)), 9999);
        assert_eq!(civil_year(at(253_402_300_800)), 10_000);
        // 1900 is not a leap year: 1900-01-01 is 25_567 days before 1970.
        assert_eq!(
            civil_year(UNIX_EPOCH - Duration::from_secs(25_567 * 86_400)),
            1900
        );
        assert_eq!(
            civil_year(UNIX_EPOCH - Duration::from_secs(25_567 * 86_400 + 1)),
            1899
        );
    }

    // ---- properties ----

    /// Any `SystemTime` the platform can hold near the epoch, either side.
    fn any_now() -> impl Strategy<Value = SystemTime> {
        any::<i64>().prop_map(|offset| {
            let magnitude = Duration::from_secs(offset.unsigned_abs() >> 20);
            if offset < 0 {
                UNIX_EPOCH.checked_sub(magnitude).unwrap_or(UNIX_EPOCH)
            } else {
                UNIX_EPOCH.checked_add(magnitude).unwrap_or(UNIX_EPOCH)
            }
        })
    }

    /// Strings shaped roughly like HTTP-dates, to reach the deeper code paths.
    fn date_like() -> impl Strategy<Value = String> {
        prop_oneof![
            "[A-Za-z]{3,9},? [0-9 ]{1,2}[ -][A-Za-z]{3}[ -][0-9]{2,5} [0-9]{2}:[0-9]{2}:[0-9]{2}( [A-Za-z]{3})?",
            "[A-Za-z]{3} [A-Za-z]{3} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2} [0-9]{4}",
            "[ \t]*[0-9+.-]{0,25}[ \t]*",
            any::<String>(),
        ]
    }

    proptest! {
        #[test]
        fn no_string_input_panics(
            value in date_like(),
            date in proptest::option::of(date_like()),
            now in any_now(),
        ) {
            let first = parse_str(&value, date.as_deref(), now);
            // Pure: the same inputs give the same answer.
            prop_assert_eq!(first, parse_str(&value, date.as_deref(), now));
            // Every accepted form contains at least one digit.
            if !value.bytes().any(|byte| byte.is_ascii_digit()) {
                prop_assert_eq!(first, None);
            }
            // Both entry points agree whenever the strings are header values.
            let header = HeaderValue::from_str(&value);
            let date_header = date.as_deref().map(HeaderValue::from_str).transpose();
            if let (Ok(header), Ok(date_header)) = (header, date_header) {
                prop_assert_eq!(parse(&header, date_header.as_ref(), now), first);
            }
        }

        #[test]
        fn no_byte_input_panics(
            value in proptest::collection::vec(any::<u8>(), 0..40),
            date in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..40)),
            now in any_now(),
        ) {
            let result = parse_bytes(&value, date.as_deref(), now);
            prop_assert_eq!(result, parse_bytes(&value, date.as_deref(), now));
            // Both entry points agree whenever the bytes fit in header values.
            let header = HeaderValue::from_bytes(&value);
            let date_header = date.as_deref().map(HeaderValue::from_bytes).transpose();
            if let (Ok(header), Ok(date_header)) = (header, date_header) {
                prop_assert_eq!(parse(&header, date_header.as_ref(), now), result);
            }
            // Anything but visible ASCII, SP and HTAB is never part of a hint.
            if value.iter().any(|byte| !(b' '..=b'~').contains(byte) && *byte != b'\t') {
                prop_assert_eq!(result, None);
            }
        }

        #[test]
        fn any_u32_round_trips(
            n in any::<u32>(),
            before in "[ \t]{0,3}",
            after in "[ \t]{0,3}",
            now in any_now(),
        ) {
            let text = format!("{before}{n}{after}");
            prop_assert_eq!(parse_str(&text, None, now), secs(u64::from(n)));
            let header = HeaderValue::from_str(&text).unwrap();
            prop_assert_eq!(parse(&header, None, now), secs(u64::from(n)));
        }

        #[test]
        fn imf_fixdate_round_trips(
            target in 0_u64..=253_402_300_799,
            reference in 0_u64..=253_402_300_799,
            skew in any::<i32>(),
        ) {
            let value = httpdate::fmt_http_date(at(target));
            let date = httpdate::fmt_http_date(at(reference));
            let expected = secs(target.saturating_sub(reference));
            // Against `now` directly.
            prop_assert_eq!(parse_str(&value, None, at(reference)), expected);
            // Against the Date header, whatever the local clock says.
            let skewed = at(reference.saturating_add_signed(i64::from(skew)));
            prop_assert_eq!(parse_str(&value, Some(&date), skewed), expected);
            // Letter case does not matter.
            let lower = value.to_ascii_lowercase();
            prop_assert_eq!(parse_str(&lower, None, at(reference)), expected);
        }

        #[test]
        fn civil_year_matches_httpdate(secs in 0_u64..=253_402_300_799) {
            let formatted = httpdate::fmt_http_date(at(secs));
            let year: i64 = formatted[12..16].parse().unwrap();
            prop_assert_eq!(civil_year(at(secs)), year);
        }
    }
}
