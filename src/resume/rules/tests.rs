use http::{HeaderMap, HeaderValue, StatusCode};
use proptest::prelude::*;

use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn range(value: &str) -> Option<ContentRange> {
    content_range(&HeaderValue::from_str(value).unwrap())
}

const ETAG: (&str, &str) = ("etag", "\"v1\"");

/// A 200 of 1,000 bytes with a strong ETag, as a first response.
fn whole() -> Origin {
    origin(
        CallerRange::Whole,
        StatusCode::OK,
        &headers(&[ETAG, ("content-length", "1000")]),
    )
    .unwrap()
}

fn partial(content_range: &str, extra: &[(&str, &str)]) -> HeaderMap {
    let mut map = headers(extra);
    map.insert(
        "content-range",
        HeaderValue::from_str(content_range).unwrap(),
    );
    map
}

// Content-Range.

#[test]
fn only_identity_is_identity_only() {
    for value in [
        "identity",
        "IDENTITY",
        "identity;q=1",
        " identity , identity;q=0.5",
    ] {
        assert!(identity_only(&HeaderValue::from_static(value)), "{value}");
    }
    for value in [
        "gzip",
        "*",
        "identity, gzip",
        "br;q=1, identity",
        "",
        "gzip;q=0",
    ] {
        assert!(!identity_only(&HeaderValue::from_static(value)), "{value}");
    }
}

#[test]
fn content_range_reads_the_three_forms() {
    assert_eq!(
        range("bytes 0-499/1000"),
        Some(ContentRange::Bytes {
            first: 0,
            last: 499,
            complete: Some(1000)
        })
    );
    assert_eq!(
        range("bytes 500-999/*"),
        Some(ContentRange::Bytes {
            first: 500,
            last: 999,
            complete: None
        })
    );
    assert_eq!(
        range("bytes */1000"),
        Some(ContentRange::Unsatisfied { complete: 1000 })
    );
    // The unit is case-insensitive.
    assert_eq!(
        range("Bytes 1-1/2"),
        Some(ContentRange::Bytes {
            first: 1,
            last: 1,
            complete: Some(2)
        })
    );
}

#[test]
fn a_malformed_content_range_is_none() {
    for value in [
        "",
        "bytes",
        "bytes ",
        "bytes 0-499",
        "bytes=0-499/1000",
        "items 0-499/1000",
        "bytes 500-499/1000",
        "bytes 0-1000/1000",
        "bytes -1-5/10",
        "bytes 0--5/10",
        "bytes +1-5/10",
        "bytes 1-5/ 10",
        "bytes  1-5/10",
        "bytes */*",
        "bytes 0-18446744073709551616/*",
        "bytes 0-1/1000, 5-6/1000",
        "bytes 0x1-5/10",
    ] {
        assert_eq!(range(value), None, "{value:?}");
    }
}

// The caller's Range.

#[test]
fn caller_range_reads_one_range_and_refuses_the_rest() {
    let of = |value: &str| caller_range(&headers(&[("range", value)]));
    assert_eq!(caller_range(&HeaderMap::new()), CallerRange::Whole);
    assert_eq!(
        of("bytes=100-199"),
        CallerRange::One(Asked {
            first: 100,
            last: Some(199)
        })
    );
    assert_eq!(
        of("bytes=100-"),
        CallerRange::One(Asked {
            first: 100,
            last: None
        })
    );
    assert_eq!(
        of("BYTES= 5 - 9"),
        CallerRange::One(Asked {
            first: 5,
            last: Some(9)
        })
    );
    for value in [
        "bytes=-500",
        "bytes=0-1,5-6",
        "items=0-1",
        "bytes=9-5",
        "bytes=",
        "bytes=a-",
    ] {
        assert_eq!(of(value), CallerRange::Unsupported, "{value:?}");
    }
    // Two Range fields, or an If-Range of the caller's own: not resumed.
    let two = headers(&[("range", "bytes=0-1"), ("range", "bytes=5-6")]);
    assert_eq!(caller_range(&two), CallerRange::Unsupported);
    let own = headers(&[("range", "bytes=0-1"), ("if-range", "\"x\"")]);
    assert_eq!(caller_range(&own), CallerRange::Unsupported);
}

// The validator.

#[test]
fn a_strong_etag_is_the_validator() {
    let found = validator(&headers(&[
        ETAG,
        ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
    ]));
    assert_eq!(
        found,
        Some(Validator::ETag(HeaderValue::from_static("\"v1\"")))
    );
}

#[test]
fn a_weak_etag_means_no_validator_even_beside_a_strong_last_modified() {
    let found = validator(&headers(&[
        ("etag", "W/\"v1\""),
        ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ("date", "Sun, 06 Nov 1994 09:49:37 GMT"),
    ]));
    assert_eq!(found, None);
    assert_eq!(validator(&headers(&[("etag", "v1")])), None, "malformed");
}

#[test]
fn last_modified_is_a_validator_only_a_second_before_date() {
    let at = |date: &str| {
        validator(&headers(&[
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("date", date),
        ]))
    };
    let strong = Some(Validator::LastModified(HeaderValue::from_static(
        "Sun, 06 Nov 1994 08:49:37 GMT",
    )));
    assert_eq!(at("Sun, 06 Nov 1994 08:49:38 GMT"), strong);
    assert_eq!(at("Sun, 06 Nov 1994 08:49:37 GMT"), None, "too recent");
    assert_eq!(
        at("Sun, 06 Nov 1994 08:49:36 GMT"),
        None,
        "modified after the date"
    );
    assert_eq!(at("yesterday"), None);
    let no_date = headers(&[("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT")]);
    assert_eq!(validator(&no_date), None);
}

// The first response.

#[test]
fn the_origin_of_a_200_and_of_a_206_to_the_callers_range() {
    let o = whole();
    assert_eq!(
        (o.start, o.end, o.closed, o.complete),
        (0, Some(1000), false, Some(1000))
    );
    let asked = CallerRange::One(Asked {
        first: 100,
        last: Some(199),
    });
    let o = origin(
        asked,
        StatusCode::PARTIAL_CONTENT,
        &partial("bytes 100-199/1000", &[ETAG]),
    )
    .unwrap();
    assert_eq!(
        (o.start, o.end, o.closed, o.complete),
        (100, Some(200), true, Some(1000))
    );
    // A multipart answer, a 206 nobody asked for, a 206 without Content-Range, a 404:
    // nothing to continue.
    let multipart = partial(
        "bytes 100-199/1000",
        &[("content-type", "multipart/byteranges; boundary=x")],
    );
    assert_eq!(origin(asked, StatusCode::PARTIAL_CONTENT, &multipart), None);
    assert_eq!(
        origin(
            CallerRange::Whole,
            StatusCode::PARTIAL_CONTENT,
            &partial("bytes 0-1/2", &[])
        ),
        None
    );
    assert_eq!(
        origin(asked, StatusCode::PARTIAL_CONTENT, &HeaderMap::new()),
        None
    );
    assert_eq!(
        origin(CallerRange::Whole, StatusCode::NOT_FOUND, &HeaderMap::new()),
        None
    );
}

// The continuation's request.

#[test]
fn the_continuation_asks_from_the_next_byte_with_if_range() {
    assert_eq!(
        next(&whole(), 400),
        Ok(Next::Range {
            range: HeaderValue::from_static("bytes=400-"),
            if_range: HeaderValue::from_static("\"v1\""),
        })
    );
}

#[test]
fn inside_the_callers_own_range_the_continuation_keeps_its_end() {
    // The caller asked for bytes=100-199 and had 30 of them: bytes=130-199.
    let asked = CallerRange::One(Asked {
        first: 100,
        last: Some(199),
    });
    let o = origin(
        asked,
        StatusCode::PARTIAL_CONTENT,
        &partial("bytes 100-199/1000", &[ETAG]),
    )
    .unwrap();
    assert_eq!(
        next(&o, 30),
        Ok(Next::Range {
            range: HeaderValue::from_static("bytes=130-199"),
            if_range: HeaderValue::from_static("\"v1\""),
        })
    );
    // All 100 arrived: nothing is sent, never bytes=200-199.
    assert_eq!(next(&o, 100), Ok(Next::Done));
    // A continuation of the range that answers 206 for bytes 130-199 is accepted as is.
    let answer = partial("bytes 130-199/1000", &[ETAG]);
    assert_eq!(
        judge(&o, 30, StatusCode::PARTIAL_CONTENT, &answer),
        Verdict::Accept {
            first: 130,
            skip: 0
        }
    );
}

#[test]
fn every_byte_arrived_means_done_and_nothing_sent() {
    assert_eq!(next(&whole(), 1000), Ok(Next::Done));
}

#[test]
fn without_a_validator_only_a_body_that_handed_nothing_is_sent_again() {
    let o = origin(
        CallerRange::Whole,
        StatusCode::OK,
        &headers(&[("content-length", "10")]),
    )
    .unwrap();
    assert_eq!(next(&o, 0), Ok(Next::Again));
    assert_eq!(next(&o, 1), Err(StopReason::NoValidator));
    let weak = origin(
        CallerRange::Whole,
        StatusCode::OK,
        &headers(&[("etag", "W/\"v1\"")]),
    )
    .unwrap();
    assert_eq!(next(&weak, 1), Err(StopReason::NoValidator));
}

#[test]
fn a_strong_last_modified_goes_in_if_range() {
    let o = origin(
        CallerRange::Whole,
        StatusCode::OK,
        &headers(&[
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("date", "Sun, 06 Nov 1994 09:00:00 GMT"),
        ]),
    )
    .unwrap();
    assert_eq!(
        next(&o, 7),
        Ok(Next::Range {
            range: HeaderValue::from_static("bytes=7-"),
            if_range: HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
        })
    );
}

// The continuation's answer.

#[test]
fn a_206_at_the_next_byte_is_accepted() {
    let answer = partial("bytes 400-999/1000", &[ETAG]);
    assert_eq!(
        judge(&whole(), 400, StatusCode::PARTIAL_CONTENT, &answer),
        Verdict::Accept {
            first: 400,
            skip: 0
        }
    );
    // `*` for the complete length is no contradiction.
    let answer = partial("bytes 400-999/*", &[]);
    assert_eq!(
        judge(&whole(), 400, StatusCode::PARTIAL_CONTENT, &answer),
        Verdict::Accept {
            first: 400,
            skip: 0
        }
    );
}

#[test]
fn a_206_that_starts_before_the_next_byte_has_its_overlap_skipped() {
    let answer = partial("bytes 300-999/1000", &[ETAG]);
    assert_eq!(
        judge(&whole(), 400, StatusCode::PARTIAL_CONTENT, &answer),
        Verdict::Accept {
            first: 300,
            skip: 100
        }
    );
}

/// arrow-rs-object-store's issue 654: a retried range request whose answer's range was
/// not checked, so bytes from the wrong offset were spliced into the body. Every answer
/// whose range does not provably continue at the next byte ends the body instead.
#[test]
fn object_store_654_a_continuations_range_is_checked_before_any_byte_is_used() {
    let o = whole();
    // Starts after the next byte: a hole.
    let after = partial("bytes 500-999/1000", &[ETAG]);
    assert_eq!(
        judge(&o, 400, StatusCode::PARTIAL_CONTENT, &after),
        Verdict::Refuse(StopReason::RangeMismatch)
    );
    // Ends before it: nothing new, not a continuation.
    let before = partial("bytes 0-399/1000", &[ETAG]);
    assert_eq!(
        judge(&o, 400, StatusCode::PARTIAL_CONTENT, &before),
        Verdict::Refuse(StopReason::RangeMismatch)
    );
    // No Content-Range, or a malformed one.
    for answer in [
        HeaderMap::new(),
        partial("bytes 400-999", &[]),
        partial("bytes=400-999/1000", &[]),
    ] {
        assert_eq!(
            judge(&o, 400, StatusCode::PARTIAL_CONTENT, &answer),
            Verdict::Refuse(StopReason::RangeMismatch)
        );
    }
    // From the start, as the whole representation without a matching tag: ignored.
    assert_eq!(
        judge(
            &o,
            400,
            StatusCode::OK,
            &headers(&[("content-length", "1000")])
        ),
        Verdict::Refuse(StopReason::RangeIgnored)
    );
}

#[test]
fn a_multipart_206_is_not_a_continuation() {
    let answer = partial(
        "bytes 400-999/1000",
        &[("content-type", "multipart/byteranges; boundary=b")],
    );
    assert_eq!(
        judge(&whole(), 400, StatusCode::PARTIAL_CONTENT, &answer),
        Verdict::Refuse(StopReason::RangeMismatch)
    );
}

#[test]
fn another_complete_length_is_a_changed_length() {
    let answer = partial("bytes 400-1099/1100", &[]);
    assert_eq!(
        judge(&whole(), 400, StatusCode::PARTIAL_CONTENT, &answer),
        Verdict::Refuse(StopReason::LengthChanged)
    );
    let answer = headers(&[ETAG, ("content-length", "1100")]);
    assert_eq!(
        judge(&whole(), 400, StatusCode::OK, &answer),
        Verdict::Refuse(StopReason::LengthChanged)
    );
}

#[test]
fn another_etag_or_encoding_is_another_representation() {
    let answer = partial("bytes 400-999/1000", &[("etag", "\"v2\"")]);
    assert_eq!(
        judge(&whole(), 400, StatusCode::PARTIAL_CONTENT, &answer),
        Verdict::Refuse(StopReason::RepresentationChanged)
    );
    let answer = headers(&[("etag", "\"v2\""), ("content-length", "1000")]);
    assert_eq!(
        judge(&whole(), 400, StatusCode::OK, &answer),
        Verdict::Refuse(StopReason::RepresentationChanged)
    );
    let answer = partial("bytes 400-999/1000", &[ETAG, ("content-encoding", "gzip")]);
    assert_eq!(
        judge(&whole(), 400, StatusCode::PARTIAL_CONTENT, &answer),
        Verdict::Refuse(StopReason::RepresentationChanged)
    );
    // `identity` is no coding.
    let answer = partial(
        "bytes 400-999/1000",
        &[ETAG, ("content-encoding", "identity")],
    );
    assert_eq!(
        judge(&whole(), 400, StatusCode::PARTIAL_CONTENT, &answer),
        Verdict::Accept {
            first: 400,
            skip: 0
        }
    );
}

#[test]
fn a_200_with_the_same_strong_etag_has_its_first_bytes_skipped() {
    let answer = headers(&[ETAG, ("content-length", "1000")]);
    assert_eq!(
        judge(&whole(), 400, StatusCode::OK, &answer),
        Verdict::Accept {
            first: 0,
            skip: 400
        }
    );
}

#[test]
fn a_200_without_a_validator_is_accepted_only_before_any_byte() {
    let o = origin(
        CallerRange::Whole,
        StatusCode::OK,
        &headers(&[("content-length", "10")]),
    )
    .unwrap();
    let answer = headers(&[("content-length", "10")]);
    assert_eq!(
        judge(&o, 0, StatusCode::OK, &answer),
        Verdict::Accept { first: 0, skip: 0 }
    );
    assert_eq!(
        judge(&o, 3, StatusCode::OK, &answer),
        Verdict::Refuse(StopReason::RangeIgnored)
    );
}

#[test]
fn a_200_to_a_last_modified_validator_with_another_date_changed() {
    let lm = "Sun, 06 Nov 1994 08:49:37 GMT";
    let o = origin(
        CallerRange::Whole,
        StatusCode::OK,
        &headers(&[
            ("last-modified", lm),
            ("date", "Sun, 06 Nov 1994 09:00:00 GMT"),
        ]),
    )
    .unwrap();
    let answer = headers(&[("last-modified", "Mon, 07 Nov 1994 08:49:37 GMT")]);
    assert_eq!(
        judge(&o, 5, StatusCode::OK, &answer),
        Verdict::Refuse(StopReason::RepresentationChanged)
    );
    // The same date on a 200: the range was ignored, and a date does not prove the bytes.
    let answer = headers(&[("last-modified", lm)]);
    assert_eq!(
        judge(&o, 5, StatusCode::OK, &answer),
        Verdict::Refuse(StopReason::RangeIgnored)
    );
}

#[test]
fn a_416_at_the_end_ends_cleanly() {
    // No Content-Length: the body broke after its last byte, unknown to the layer.
    let o = origin(CallerRange::Whole, StatusCode::OK, &headers(&[ETAG])).unwrap();
    let answer = partial("bytes */1000", &[]);
    assert_eq!(
        judge(&o, 1000, StatusCode::RANGE_NOT_SATISFIABLE, &answer),
        Verdict::End
    );
    // Short of the end, or past another length: not an end.
    assert_eq!(
        judge(&o, 999, StatusCode::RANGE_NOT_SATISFIABLE, &answer),
        Verdict::Refuse(StopReason::RangeMismatch)
    );
    assert_eq!(
        judge(&o, 1001, StatusCode::RANGE_NOT_SATISFIABLE, &answer),
        Verdict::Refuse(StopReason::LengthChanged)
    );
    assert_eq!(
        judge(
            &o,
            1000,
            StatusCode::RANGE_NOT_SATISFIABLE,
            &HeaderMap::new()
        ),
        Verdict::Refuse(StopReason::RangeMismatch)
    );
}

#[test]
fn retryable_statuses_ask_again_and_others_end_the_body() {
    for status in [408, 429, 500, 502, 503, 504] {
        let status = StatusCode::from_u16(status).unwrap();
        assert_eq!(
            judge(&whole(), 400, status, &HeaderMap::new()),
            Verdict::Again
        );
    }
    for status in [201, 204, 301, 304, 404, 412, 501] {
        let status = StatusCode::from_u16(status).unwrap();
        assert_eq!(
            judge(&whole(), 400, status, &HeaderMap::new()),
            Verdict::Refuse(StopReason::Final),
            "{status}"
        );
    }
}

proptest! {
    /// Parsing never panics, and whatever parses is consistent.
    #[test]
    fn content_range_never_panics(value in "[ -~]{0,40}") {
        if let Ok(value) = HeaderValue::from_str(&value) {
            if let Some(ContentRange::Bytes { first, last, complete }) = content_range(&value) {
                prop_assert!(first <= last);
                prop_assert!(complete.is_none_or(|c| last < c));
            }
        }
    }

    /// Every accepted answer continues at exactly the next byte: its first byte plus the
    /// bytes skipped is where the caller's body stopped.
    #[test]
    fn an_accepted_answer_continues_at_the_next_byte(
        handed in 0u64..2000,
        first in 0u64..2000,
        len in 1u64..2000,
        complete in proptest::option::of(0u64..4000),
    ) {
        let o = whole();
        let last = first + len - 1;
        let mut answer = HeaderMap::new();
        let stated = complete.map_or("*".to_string(), |c| c.to_string());
        answer.insert(
            "content-range",
            HeaderValue::try_from(format!("bytes {first}-{last}/{stated}")).unwrap(),
        );
        if let Verdict::Accept { first: at, skip } = judge(&o, handed, StatusCode::PARTIAL_CONTENT, &answer) {
            prop_assert_eq!(at + skip, handed);
            prop_assert!(last >= handed);
            prop_assert!(complete.is_none_or(|c| c == 1000));
        }
    }
}
