//! The two fuzz targets as property tests, so that `cargo test` checks what the fuzzer
//! checks: the oracles are the fuzz crate's own files, included by path, fed by proptest
//! instead of libFuzzer. The case counts are bounded to keep the whole file well under a
//! second or two in a debug build.

#[path = "../fuzz/src/replay_case.rs"]
mod replay_case;
#[path = "../fuzz/src/retry_after_case.rs"]
mod retry_after_case;

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full};
use proptest::collection::vec;
use proptest::prelude::*;
use tower_http_retry::ReplayBody;

use replay_case::{Hint, ReplayCase};
use retry_after_case::{LAST_DATE_SECS, RawCase, check_date, check_delta, check_raw, date_forms};

// ---- Retry-After ----

/// Any clock, with most draws near the present so two-digit years and the `Date`
/// reference matter, and some at the extremes a `SystemTime` can hold.
fn any_now() -> impl Strategy<Value = SystemTime> {
    prop_oneof![
        3 => (0_i64..4_000_000_000, any::<u32>()),
        1 => (any::<i64>(), any::<u32>()),
    ]
    .prop_map(|(secs, nanos)| retry_after_case::system_time(secs, nanos))
}

/// A real HTTP-date in one of its three forms, then maybe damaged: one byte replaced, a
/// tail cut off, or letters upper-cased. Reaches the parser's deeper branches far more
/// often than random bytes do.
fn date_like() -> impl Strategy<Value = Vec<u8>> {
    (
        0..=LAST_DATE_SECS,
        0..3_usize,
        0..4_u8,
        any::<prop::sample::Index>(),
        any::<u8>(),
    )
        .prop_map(|(secs, form, damage, at, byte)| {
            let mut text = date_forms(secs)[form].clone().into_bytes();
            let i = at.index(text.len());
            match damage {
                0 => {}
                1 => text[i] = byte,
                2 => text.truncate(i),
                _ => text.make_ascii_uppercase(),
            }
            text
        })
}

fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        2 => date_like(),
        1 => "[ \t]{0,2}[0-9]{1,25}[ \t]{0,2}".prop_map(String::into_bytes),
        1 => "[ \t0-9a-zA-Z,:+.-]{0,32}".prop_map(String::into_bytes),
        1 => vec(any::<u8>(), 0..40),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn retry_after_keeps_its_promises_on_any_bytes(
        value in header_bytes(),
        date in prop::option::of(header_bytes()),
        now in any_now(),
    ) {
        check_raw(&RawCase { value, date, now });
    }

    #[test]
    fn delta_seconds_round_trip(
        n in any::<u64>(),
        zeros in 0_usize..24,
        before in "[ \t]{0,3}",
        after in "[ \t]{0,3}",
        now in any_now(),
        date in prop::option::of(date_like()),
    ) {
        let date = date.and_then(|d| String::from_utf8(d).ok());
        check_delta(n, zeros, &before, &after, now, date.as_deref());
    }

    #[test]
    fn http_dates_round_trip(
        reference in 0..=LAST_DATE_SECS,
        offset in prop_oneof![-100_000_i64..100_000, any::<i64>()],
        skew in any::<i32>(),
    ) {
        let target = reference.saturating_add_signed(offset);
        check_date(target, reference, i64::from(skew));
    }
}

#[test]
fn the_retry_after_oracle_returns_the_parsers_answer() {
    // 90 s before the RFC's example date, `Sun, 06 Nov 1994 08:49:37 GMT`.
    let now = retry_after_case::system_time(784_111_777 - 90, 0);
    let case = |value: &str, date: Option<&str>| RawCase {
        value: value.as_bytes().to_vec(),
        date: date.map(|d| d.as_bytes().to_vec()),
        now,
    };
    let example = "Sun, 06 Nov 1994 08:49:37 GMT";
    assert_eq!(
        check_raw(&case(example, None)),
        Some(Duration::from_secs(90))
    );
    assert_eq!(
        check_raw(&case(example, Some("Sun, 06 Nov 1994 08:49:07 GMT"))),
        Some(Duration::from_secs(30))
    );
    assert_eq!(
        check_raw(&case("99999999999999999999999", None)),
        Some(Duration::from_secs(u64::MAX))
    );
    assert_eq!(check_raw(&case("soon", None)), None);
}

// ---- ReplayBody ----

const TRAILER_NAMES: [&str; 4] = ["x-checksum", "grpc-status", "grpc-message", "x-trace"];

fn trailers() -> impl Strategy<Value = HeaderMap> {
    vec((0..TRAILER_NAMES.len(), "[ -~]{0,12}"), 0..3).prop_map(|entries| {
        let mut map = HeaderMap::new();
        for (name, value) in entries {
            map.append(
                HeaderName::from_static(TRAILER_NAMES[name]),
                HeaderValue::from_str(&value).expect("visible ASCII"),
            );
        }
        map
    })
}

fn hint() -> impl Strategy<Value = Hint> {
    prop_oneof![
        Just(Hint::Unknown),
        Just(Hint::Exact),
        (0_u64..600).prop_map(Hint::Lower),
        (0_u64..600).prop_map(Hint::Upper),
    ]
}

fn replay_case() -> impl Strategy<Value = ReplayCase> {
    (
        vec(vec(any::<u8>(), 0..64), 0..10),
        prop::option::of(trailers()),
        prop_oneof![6 => Just(None), 1 => (0_usize..12).prop_map(Some)],
        (0_u8..5, any::<u16>()),
        hint(),
        vec(0_u8..4, 0..14),
        vec(prop::option::of(0_usize..6), 0..4),
        any::<bool>(),
    )
        .prop_map(
            |(
                chunks,
                trailers,
                fail_after,
                (cap_mode, cap_arg),
                hint,
                stalls,
                replays,
                interleave,
            )| {
                let chunks: Vec<Bytes> = chunks.into_iter().map(Bytes::from).collect();
                let total: usize = chunks.iter().map(Bytes::len).sum();
                let cap = match cap_mode {
                    // Around the total, where off-by-one mistakes live.
                    0 => (total + usize::from(cap_arg % 5)).saturating_sub(2),
                    1 => usize::from(cap_arg % 1024),
                    2 => 0,
                    3 => usize::MAX,
                    _ => total,
                };
                ReplayCase {
                    chunks,
                    trailers,
                    fail_after,
                    cap,
                    hint,
                    stalls,
                    replays,
                    interleave,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn replays_equal_the_first_pass(case in replay_case()) {
        replay_case::check(&case);
    }

}

#[tokio::test]
async fn a_body_over_the_cap_by_its_size_hint_is_sent_complete() {
    let body = ReplayBody::new(Full::new(Bytes::from_static(b"hello")), 2);
    assert!(
        body.try_replay().is_none(),
        "nothing to replay before it is read"
    );
    let sent = body.collect().await.unwrap().to_bytes();
    assert_eq!(sent, Bytes::from_static(b"hello"));
}

#[tokio::test]
async fn a_body_over_the_cap_by_its_size_hint_is_not_replayable_once_read() {
    let mut body = ReplayBody::new(Full::new(Bytes::from_static(b"hello")), 2);
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, Bytes::from_static(b"hello"));
    // The original was sent once and nothing was kept: there is nothing to replay. A
    // replay that sent an empty body in its place would silently drop the payload.
    let replay = body.try_replay();
    assert!(
        replay.is_none(),
        "try_replay offered a body that sends {:?} instead of \"hello\"",
        match replay {
            Some(replay) => replay.collect().await.unwrap().to_bytes(),
            None => Bytes::new(),
        }
    );
}

#[test]
fn the_replay_oracle_exercises_replays() {
    // A fixed case that replays three times, in turns, with trailers and stalls: the
    // oracle must run to its end (it would panic on a broken promise).
    let mut trailers = HeaderMap::new();
    trailers.insert("x-checksum", HeaderValue::from_static("abc"));
    let case = ReplayCase {
        chunks: vec![
            Bytes::from_static(b"ab"),
            Bytes::new(),
            Bytes::from_static(b"cde"),
        ],
        trailers: Some(trailers),
        fail_after: None,
        cap: 5,
        hint: Hint::Exact,
        stalls: vec![1, 2, 0, 3],
        replays: vec![None, Some(0), Some(1)],
        interleave: true,
    };
    replay_case::check(&case);
}
