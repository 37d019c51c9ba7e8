// The `grpc-*` header fields the retry loop reads and writes: pure functions, no I/O.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use tonic::Code;

/// `grpc-status`: the status code of a finished RPC, in the trailers, or in the response
/// headers of a Trailers-Only response.
pub(crate) const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
/// `grpc-retry-pushback-ms`: the server's instruction on when to retry, or not to (A6).
pub(crate) const GRPC_RETRY_PUSHBACK_MS: HeaderName =
    HeaderName::from_static("grpc-retry-pushback-ms");
/// `grpc-previous-rpc-attempts`: on a retry, how many attempts came before it (A6).
pub(crate) const GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
    HeaderName::from_static("grpc-previous-rpc-attempts");
/// `grpc-timeout`: the time the client gives the server (gRPC over HTTP/2).
pub(crate) const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// The status code in the response headers, when they carry one: a Trailers-Only response.
///
/// A gRPC server that ends an RPC before sending any response message answers with a
/// single HEADERS frame that ends the stream and holds `grpc-status` (and `grpc-message`
/// and the trailing metadata): Trailers-Only. Through a tonic `Channel` the caller sees it
/// as a response whose headers hold `grpc-status` and whose body is empty. Ordinary
/// response headers carry no `grpc-status`: `None` then, and under A6 the RPC is committed
/// (not retried, whatever its trailers say later).
///
/// A value that is not a code (not one of `0` to `16` in plain ASCII digits) reads as
/// [`Code::Unknown`], as the gRPC status code document asks of clients and as tonic does.
///
/// ```
/// use http::HeaderMap;
/// use tonic::Code;
/// use tower_http_retry_grpc::trailers_only_code;
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(trailers_only_code(&headers), None);
/// headers.insert("grpc-status", "14".parse().unwrap());
/// assert_eq!(trailers_only_code(&headers), Some(Code::Unavailable));
/// headers.insert("grpc-status", "99".parse().unwrap());
/// assert_eq!(trailers_only_code(&headers), Some(Code::Unknown));
/// ```
pub fn trailers_only_code(headers: &HeaderMap) -> Option<Code> {
    headers
        .get(GRPC_STATUS)
        .map(|value| code_from_bytes(value.as_bytes()))
}

/// The code of a response that ends the RPC at once, or `None` for one that commits it:
/// the `grpc-status` of a Trailers-Only response; without one, an HTTP status other than
/// 200 (a proxy's or a load balancer's error page) mapped as gRPC's HTTP-to-gRPC table says
/// ([`http_status_code`]); `None` for ordinary headers of a 200. As in C-core, a
/// `grpc-status` wins over the HTTP status.
pub(crate) fn response_code(status: StatusCode, headers: &HeaderMap) -> Option<Code> {
    match trailers_only_code(headers) {
        Some(code) => Some(code),
        None if status == StatusCode::OK => None,
        None => Some(http_status_code(status)),
    }
}

/// gRPC's code for an HTTP status that came without `grpc-status` (gRPC's "HTTP to gRPC
/// Status Code Mapping", which C-core, grpc-go, grpc-java and tonic follow): 400 is
/// `INTERNAL`, 401 `UNAUTHENTICATED`, 403 `PERMISSION_DENIED`, 404 `UNIMPLEMENTED`; 429,
/// 502, 503 and 504 `UNAVAILABLE`; any other `UNKNOWN`.
pub(crate) fn http_status_code(status: StatusCode) -> Code {
    match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    }
}

/// A status code from its decimal form, [`Code::Unknown`] for anything else (leading
/// zeros, signs and spaces included).
fn code_from_bytes(bytes: &[u8]) -> Code {
    let valid = matches!(bytes, [b'0'..=b'9'] | [b'1', b'0'..=b'6']);
    if !valid {
        return Code::Unknown;
    }
    let n = bytes.iter().fold(0, |n, b| n * 10 + i32::from(b - b'0'));
    Code::from_i32(n)
}

/// What `grpc-retry-pushback-ms` tells the client (A6 "Pushback").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pushback {
    /// Retry after exactly this long, if the policy retries this outcome at all and
    /// attempts are left. The backoff starts again from `initialBackoff` after it.
    Wait(Duration),
    /// Do not retry this RPC. Under A6 it also counts as a failure for throttling.
    Stop,
}

/// Reads `grpc-retry-pushback-ms` from a response's headers (a Trailers-Only response
/// carries its trailing metadata there). `None` when absent.
///
/// A6: the value is a signed 32-bit decimal integer of milliseconds. A non-negative one is
/// the exact wait ([`Pushback::Wait`]); a negative, malformed or out-of-range one means do
/// not retry ([`Pushback::Stop`]), and so does a header that appears more than once
/// (grpc-go's reading: the server's intent is unclear).
///
/// ```
/// use std::time::Duration;
/// use http::HeaderMap;
/// use tower_http_retry_grpc::{Pushback, pushback};
///
/// let mut headers = HeaderMap::new();
/// assert_eq!(pushback(&headers), None);
/// headers.insert("grpc-retry-pushback-ms", "250".parse().unwrap());
/// assert_eq!(pushback(&headers), Some(Pushback::Wait(Duration::from_millis(250))));
/// headers.insert("grpc-retry-pushback-ms", "-1".parse().unwrap());
/// assert_eq!(pushback(&headers), Some(Pushback::Stop));
/// ```
pub fn pushback(headers: &HeaderMap) -> Option<Pushback> {
    let mut values = headers.get_all(GRPC_RETRY_PUSHBACK_MS).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return Some(Pushback::Stop);
    }
    Some(parse_pushback(first.as_bytes()))
}

/// Parses one `grpc-retry-pushback-ms` value: see [`pushback`]. Spaces and tabs around
/// the number are ignored; `+`, decimals and anything else that is not an optional `-`
/// followed by ASCII digits give [`Pushback::Stop`], as do values outside `i32`.
pub(crate) fn parse_pushback(value: &[u8]) -> Pushback {
    // A header value holds no other whitespace than spaces and tabs: HTTP's `OWS`.
    let value = value.trim_ascii();
    let (negative, digits) = match value {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, value),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Pushback::Stop;
    }
    // Only ASCII digits: the text is valid, and parsing fails only when out of range.
    let parsed = std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse::<u64>().ok());
    match parsed {
        Some(0) => Pushback::Wait(Duration::ZERO),
        Some(_) if negative => Pushback::Stop,
        Some(ms) if ms <= i32::MAX as u64 => Pushback::Wait(Duration::from_millis(ms)),
        _ => Pushback::Stop,
    }
}

/// The most a `grpc-timeout` value may have: 8 digits.
const MAX_TIMEOUT_VALUE: u64 = 99_999_999;

/// The `grpc-timeout` units, finest first, with their length in nanoseconds.
const TIMEOUT_UNITS: [(u8, u64); 6] = [
    (b'n', 1),
    (b'u', 1_000),
    (b'm', 1_000_000),
    (b'S', 1_000_000_000),
    (b'M', 60 * 1_000_000_000),
    (b'H', 3_600 * 1_000_000_000),
];

/// Formats `timeout` as a `grpc-timeout` value: at most 8 digits and a unit (`n`, `u`,
/// `m`, `S`, `M`, `H`), in the finest unit that fits (gRPC over HTTP/2).
///
/// A time that is not a whole number of that unit is rounded up, as grpc-go does, so the
/// server is never told less time than the client gives the call; the value is then off
/// by less than one unit, which is less than a hundred-thousandth of the time. Zero is
/// `0n`.
/// Anything from 99 999 999 hours up (about 11 400 years) is `99999999H`.
pub(crate) fn format_grpc_timeout(timeout: Duration) -> HeaderValue {
    let nanos = timeout.as_nanos();
    let (value, unit) = TIMEOUT_UNITS
        .iter()
        .find_map(|&(unit, length)| {
            let value = nanos.div_ceil(u128::from(length));
            (value <= u128::from(MAX_TIMEOUT_VALUE)).then_some((value as u64, unit))
        })
        .unwrap_or((MAX_TIMEOUT_VALUE, b'H'));
    let mut text = value.to_string();
    text.push(char::from(unit));
    HeaderValue::from_str(&text).expect("digits and a unit letter are a valid header value")
}

/// Parses a `grpc-timeout` value: 1 to 8 ASCII digits and a unit (`H` hours, `M` minutes,
/// `S` seconds, `m` milliseconds, `u` microseconds, `n` nanoseconds). `None` for anything
/// else: more digits, a sign, spaces, an unknown unit.
pub(crate) fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    let length = TIMEOUT_UNITS
        .iter()
        .find(|(u, _)| u == unit)
        .map(|&(_, length)| length)?;
    // At most 99 999 999 hours: 3.6e20 ns overflows u64, so multiply in u128.
    let nanos = u128::from(amount) * u128::from(length);
    let secs = (nanos / 1_000_000_000) as u64;
    let sub = (nanos % 1_000_000_000) as u32;
    Some(Duration::new(secs, sub))
}

/// Sets (or replaces) `grpc-timeout` to `remaining`, the time left before the call's
/// deadline: what the loop does to each attempt's headers when a deadline is set.
pub(crate) fn set_grpc_timeout(headers: &mut HeaderMap, remaining: Duration) {
    headers.insert(GRPC_TIMEOUT, format_grpc_timeout(remaining));
}

/// The `grpc-previous-rpc-attempts` value for an attempt that `previous` attempts came
/// before: `None` for the first attempt (A6: the header is absent there), else the
/// number. Transparent retries are not attempts in this count (grpc-go sends its count
/// of retries).
pub(crate) fn previous_rpc_attempts(previous: u32) -> Option<HeaderValue> {
    (previous > 0).then(|| HeaderValue::from(previous))
}

/// Sets `grpc-previous-rpc-attempts` for an attempt that `previous` attempts came
/// before, or removes it when `previous` is 0, so a caller's stray value never reaches
/// the server on a first attempt.
pub(crate) fn set_previous_rpc_attempts(headers: &mut HeaderMap, previous: u32) {
    match previous_rpc_attempts(previous) {
        Some(value) => {
            headers.insert(GRPC_PREVIOUS_RPC_ATTEMPTS, value);
        }
        None => {
            headers.remove(GRPC_PREVIOUS_RPC_ATTEMPTS);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn every_code_reads_back_from_its_number() {
        for n in 0..=16 {
            let map = headers(&[("grpc-status", &n.to_string())]);
            assert_eq!(trailers_only_code(&map), Some(Code::from_i32(n)), "{n}");
        }
    }

    #[test]
    fn a_malformed_status_is_unknown() {
        for bad in [
            "",
            "17",
            "014",
            "+1",
            " 1",
            "1 ",
            "-1",
            "UNAVAILABLE",
            "1a",
            "100",
        ] {
            let map = headers(&[("grpc-status", bad)]);
            assert_eq!(trailers_only_code(&map), Some(Code::Unknown), "{bad:?}");
        }
        assert_eq!(trailers_only_code(&HeaderMap::new()), None);
    }

    #[test]
    fn pushback_values() {
        let wait = |ms| Pushback::Wait(Duration::from_millis(ms));
        let cases: [(&str, Pushback); 14] = [
            ("0", wait(0)),
            ("1", wait(1)),
            ("2500", wait(2500)),
            (" 30 ", wait(30)),
            ("007", wait(7)),
            ("2147483647", wait(2_147_483_647)),
            ("2147483648", Pushback::Stop),
            ("-1", Pushback::Stop),
            ("-0", wait(0)),
            ("+5", Pushback::Stop),
            ("1.5", Pushback::Stop),
            ("", Pushback::Stop),
            ("soon", Pushback::Stop),
            ("99999999999999999999999", Pushback::Stop),
        ];
        for (raw, expected) in cases {
            assert_eq!(parse_pushback(raw.as_bytes()), expected, "{raw:?}");
        }
    }

    #[test]
    fn pushback_in_headers() {
        assert_eq!(pushback(&HeaderMap::new()), None);
        assert_eq!(
            pushback(&headers(&[("grpc-retry-pushback-ms", "10")])),
            Some(Pushback::Wait(Duration::from_millis(10)))
        );
        // Twice, even with equal values: the server's intent is unclear, so stop.
        assert_eq!(
            pushback(&headers(&[
                ("grpc-retry-pushback-ms", "10"),
                ("grpc-retry-pushback-ms", "10"),
            ])),
            Some(Pushback::Stop)
        );
        let mut non_utf8 = HeaderMap::new();
        non_utf8.insert(
            GRPC_RETRY_PUSHBACK_MS,
            HeaderValue::from_bytes(b"\xff1").unwrap(),
        );
        assert_eq!(pushback(&non_utf8), Some(Pushback::Stop));
    }

    #[test]
    fn timeouts_use_the_finest_unit_that_fits() {
        let cases = [
            (Duration::ZERO, "0n"),
            (Duration::from_nanos(1), "1n"),
            (Duration::from_nanos(99_999_999), "99999999n"),
            (Duration::from_nanos(100_000_000), "100000u"),
            // Not a whole number of microseconds: rounded up.
            (Duration::from_nanos(100_000_001), "100001u"),
            (Duration::from_secs(99), "99000000u"),
            (Duration::from_secs(100), "100000m"),
            (Duration::from_secs(99_999), "99999000m"),
            (Duration::from_secs(100_000), "100000S"),
            (Duration::from_secs(99_999_999), "99999999S"),
            (Duration::from_secs(100_000_000), "1666667M"),
            (Duration::from_secs(99_999_999 * 60), "99999999M"),
            (Duration::from_secs(6_000_000_000), "1666667H"),
            (Duration::MAX, "99999999H"),
        ];
        for (timeout, text) in cases {
            assert_eq!(format_grpc_timeout(timeout), text, "{timeout:?}");
        }
    }

    #[test]
    fn timeout_values_parse() {
        let cases = [
            ("1n", Some(Duration::from_nanos(1))),
            ("1u", Some(Duration::from_micros(1))),
            ("1m", Some(Duration::from_millis(1))),
            ("1S", Some(Duration::from_secs(1))),
            ("1M", Some(Duration::from_secs(60))),
            ("1H", Some(Duration::from_secs(3600))),
            ("00000005S", Some(Duration::from_secs(5))),
            ("99999999H", Some(Duration::from_secs(99_999_999 * 3600))),
            ("", None),
            ("S", None),
            ("5", None),
            ("123456789n", None),
            ("-5S", None),
            ("+5S", None),
            (" 5S", None),
            ("5 S", None),
            ("5s", None),
            ("5x", None),
            ("5.5S", None),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_grpc_timeout(text.as_bytes()), expected, "{text:?}");
        }
    }

    #[test]
    fn setting_headers() {
        let mut map = HeaderMap::new();
        set_grpc_timeout(&mut map, Duration::from_millis(1500));
        assert_eq!(map[GRPC_TIMEOUT], "1500000u");
        set_grpc_timeout(&mut map, Duration::from_millis(10));
        assert_eq!(map.get_all(GRPC_TIMEOUT).iter().count(), 1);
        assert_eq!(map[GRPC_TIMEOUT], "10000000n");

        set_previous_rpc_attempts(&mut map, 3);
        assert_eq!(map[GRPC_PREVIOUS_RPC_ATTEMPTS], "3");
        set_previous_rpc_attempts(&mut map, 4);
        assert_eq!(map.get_all(GRPC_PREVIOUS_RPC_ATTEMPTS).iter().count(), 1);
        set_previous_rpc_attempts(&mut map, 0);
        assert!(!map.contains_key(GRPC_PREVIOUS_RPC_ATTEMPTS));
        assert_eq!(previous_rpc_attempts(u32::MAX).unwrap(), "4294967295");
    }

    proptest! {
        #[test]
        fn readers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = parse_pushback(&bytes);
            let _ = parse_grpc_timeout(&bytes);
            let _ = code_from_bytes(&bytes);
        }

        /// Formatting then parsing gives the time back, rounded up by less than one of the
        /// unit chosen, well under a ten-thousandth of the time (exactly, for times that
        /// fit in nanoseconds).
        #[test]
        fn format_then_parse_round_trips(nanos in any::<u64>(), secs in 0u64..=359_999_996_400) {
            for timeout in [Duration::from_nanos(nanos), Duration::new(secs, (nanos % 1_000_000_000) as u32)] {
                let value = format_grpc_timeout(timeout);
                prop_assert!(value.len() <= 9);
                let back = parse_grpc_timeout(value.as_bytes()).expect("formatted values parse");
                prop_assert!(back >= timeout, "{:?} -> {:?} -> {:?}", timeout, value, back);
                let slack = back - timeout;
                prop_assert!(slack.as_nanos() * 1_000_000 <= timeout.as_nanos().max(1) * 100,
                    "{:?} -> {:?}: off by {:?}", timeout, value, slack);
                if timeout < Duration::from_nanos(100_000_000) {
                    prop_assert_eq!(back, timeout);
                }
            }
        }

        /// A valid value parses, and the time it means formats to a value that parses to
        /// the same time.
        #[test]
        fn parse_then_format_keeps_the_time(amount in 0u64..=99_999_999, unit in 0usize..6) {
            let text = format!("{amount}{}", char::from(TIMEOUT_UNITS[unit].0));
            let timeout = parse_grpc_timeout(text.as_bytes()).expect("valid");
            let again = format_grpc_timeout(timeout);
            prop_assert_eq!(parse_grpc_timeout(again.as_bytes()), Some(timeout));
        }

        /// Every i32 of milliseconds reads back as itself, or as stop when negative.
        #[test]
        fn pushback_integers(ms in any::<i32>()) {
            let expected = if ms < 0 {
                Pushback::Stop
            } else {
                Pushback::Wait(Duration::from_millis(ms as u64))
            };
            prop_assert_eq!(parse_pushback(ms.to_string().as_bytes()), expected);
        }
    }
}
