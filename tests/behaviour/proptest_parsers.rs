//! The fuzz targets as property tests, so that `cargo test` checks what the fuzzer
//! checks: the oracles are the fuzz crate's own files, included by path, fed by proptest
//! instead of libFuzzer. The case counts are bounded to keep the whole file well under a
//! second or two in a debug build.

// The fuzz crate's oracles are declared at the binary's root (`main.rs`): they name each
// other through `crate::`.
use crate::{hints_case, replay_case, retry_after_case};

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use http_body_util::{BodyExt, Full};
use proptest::collection::vec;
use proptest::prelude::*;
use tower_http_retry::ReplayBody;

use hints_case::{LimitModel, NameModel, RateLimitModel, ResetModel, ValueModel};
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

// ---- server hints: RateLimit, X-RateLimit-Reset ----

/// Text for names and string values: any characters, the oracle maps them to what the
/// syntax allows.
fn short_text() -> impl Strategy<Value = String> {
    "[ -~]{0,8}|\\PC{0,4}"
}

fn value_model() -> impl Strategy<Value = ValueModel> {
    prop_oneof![
        2 => Just(ValueModel::Missing),
        6 => Just(ValueModel::Integer(0)),
        3 => (0_i64..100_000).prop_map(ValueModel::Integer),
        1 => any::<i64>().prop_map(ValueModel::Integer),
        1 => Just(ValueModel::Integer(hints_case::MAX_SF_INTEGER)),
        1 => any::<i64>().prop_map(ValueModel::Decimal),
        1 => short_text().prop_map(ValueModel::String),
        1 => Just(ValueModel::Token),
        1 => any::<bool>().prop_map(ValueModel::Boolean),
        1 => Just(ValueModel::Overlong),
    ]
}

fn limit_model() -> impl Strategy<Value = LimitModel> {
    let name = prop_oneof![
        4 => short_text().prop_map(NameModel::String),
        3 => short_text().prop_map(NameModel::Token),
        1 => any::<i64>().prop_map(NameModel::Integer),
        1 => Just(NameModel::Bytes),
        1 => Just(NameModel::Boolean),
        1 => Just(NameModel::InnerList),
    ];
    (
        name,
        value_model(),
        prop_oneof![3 => Just(ValueModel::Missing), 1 => value_model()],
        value_model(),
        any::<bool>(),
        any::<u8>(),
    )
        .prop_map(|(name, r, earlier_r, t, t_first, comments)| LimitModel {
            name,
            r,
            earlier_r,
            t,
            t_first,
            comments,
        })
}

fn rate_limit_model() -> impl Strategy<Value = RateLimitModel> {
    (
        vec(limit_model(), 0..6),
        any::<u64>(),
        any::<u64>(),
        prop_oneof![6 => Just(0_u8), 1 => Just(1_u8), 1 => Just(2_u8)],
    )
        .prop_map(|(limits, breaks, spacing, damage)| RateLimitModel {
            limits,
            breaks,
            spacing,
            damage,
        })
}

/// Header text that looks like a `RateLimit` field, then maybe damaged like `date_like`.
fn rate_limit_like() -> impl Strategy<Value = Vec<u8>> {
    (
        rate_limit_model(),
        0..4_u8,
        any::<prop::sample::Index>(),
        any::<u8>(),
    )
        .prop_map(|(model, damage, at, byte)| {
            let (lines, _) = hints_case::rate_limit_lines(&model);
            let mut text = lines.join(", ").into_bytes();
            if !text.is_empty() {
                let i = at.index(text.len());
                match damage {
                    0 => {}
                    1 => text[i] = byte,
                    2 => text.truncate(i),
                    _ => text.insert(i, byte),
                }
            }
            text
        })
}

fn hint_header_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => rate_limit_like(),
        1 => "[ \t]{0,2}[0-9]{1,22}[ \t]{0,2}".prop_map(String::into_bytes),
        1 => "[ \t0-9a-z\";=,:()?*.-]{0,32}".prop_map(String::into_bytes),
        1 => date_like(),
        1 => vec(any::<u8>(), 0..40),
    ]
}

fn lines_of(strategy: impl Strategy<Value = Vec<u8>>) -> impl Strategy<Value = Vec<Vec<u8>>> {
    prop_oneof![
        2 => vec(strategy, 0..2),
        1 => vec(hint_header_bytes(), 2..4),
    ]
}

fn near_or_any_secs() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => 999_999_998..=1_000_000_002_u64,
        1 => 0..=1_000_000_000_u64,
        2 => 1_000_000_001..=4_000_000_000_u64,
        1 => any::<u64>(),
    ]
}

fn reset_model() -> impl Strategy<Value = ResetModel> {
    (
        near_or_any_secs(),
        any::<u8>(),
        any::<u16>(),
        prop::option::of(prop_oneof![0..=4_000_000_000_u64, 0..=LAST_DATE_SECS]),
        any_now(),
        prop::option::of(0_u32..5_000),
        prop::option::weighted(0.2, any::<u32>()),
    )
        .prop_map(
            |(reset, zeros, pad, date, now, rate_limit_t, retry_after)| ResetModel {
                reset,
                zeros,
                pad,
                date,
                now,
                rate_limit_t,
                retry_after,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn hint_readers_keep_their_promises_on_any_bytes(
        rate_limit in lines_of(rate_limit_like()),
        remaining in lines_of("[ \t]{0,1}0{1,3}[ \t]{0,1}|[0-9]{1,3}".prop_map(String::into_bytes)),
        reset in lines_of(near_or_any_secs().prop_map(|n| n.to_string().into_bytes())),
        retry_after in lines_of(header_bytes()),
        date in lines_of(date_like()),
        now in any_now(),
    ) {
        hints_case::check_raw(&hints_case::RawCase {
            rate_limit,
            remaining,
            reset,
            retry_after,
            date,
            now,
        });
    }

    #[test]
    fn rate_limit_gives_the_modelled_wait(model in rate_limit_model()) {
        hints_case::check_rate_limit(&model);
    }

    #[test]
    fn x_rate_limit_reset_gives_the_modelled_wait(model in reset_model()) {
        hints_case::check_reset(&model);
    }
}

#[test]
fn the_hint_oracles_return_the_readers_answers() {
    let secs = |n| Some(Duration::from_secs(n));
    let limit = |name: NameModel, r: ValueModel, t: ValueModel| LimitModel {
        name,
        r,
        earlier_r: ValueModel::Missing,
        t,
        t_first: false,
        comments: 3,
    };
    let model = RateLimitModel {
        limits: vec![
            limit(
                NameModel::String("burst".into()),
                ValueModel::Integer(0),
                ValueModel::Integer(5),
            ),
            limit(
                NameModel::Token("daily".into()),
                ValueModel::Integer(0),
                ValueModel::Integer(3600),
            ),
            limit(
                NameModel::String("hourly".into()),
                ValueModel::Integer(12),
                ValueModel::Integer(86_400),
            ),
        ],
        breaks: 0b1,
        spacing: 12_345,
        damage: 0,
    };
    let (lines, _) = hints_case::rate_limit_lines(&model);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(hints_case::check_rate_limit(&model), secs(3600));
    let damaged = RateLimitModel {
        damage: 2,
        ..model.clone()
    };
    assert_eq!(hints_case::check_rate_limit(&damaged), None);

    let now = retry_after_case::system_time(1_700_000_000, 0);
    let reset = ResetModel {
        reset: 1_700_000_042,
        zeros: 0,
        pad: 0,
        date: None,
        now,
        rate_limit_t: None,
        retry_after: None,
    };
    assert_eq!(hints_case::check_reset(&reset), secs(42));
    let with_date = ResetModel {
        date: Some(1_700_000_040),
        ..reset.clone()
    };
    assert_eq!(hints_case::check_reset(&with_date), secs(2));

    let raw = hints_case::RawCase {
        rate_limit: vec![br#""a";r=0;t=7"#.to_vec()],
        remaining: vec![b"0".to_vec()],
        reset: vec![b"9".to_vec()],
        retry_after: vec![b"soon".to_vec()],
        date: Vec::new(),
        now,
    };
    let hint = hints_case::check_raw(&raw).expect("a hint");
    assert_eq!(hint.wait, Duration::from_secs(9));
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
