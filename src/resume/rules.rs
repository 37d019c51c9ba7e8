// The rules of a continuation as plain functions: what the caller's own `Range` asks for,
// what a `Content-Range` says, which validator the first response offers, what the
// continuation's request carries, and whether its answer continues the bytes already
// handed over. Nothing here knows bodies or services: the body (`body.rs`) gathers the
// facts, asks here, and carries out the answer.
//
// Offsets are in the representation's bytes, as sent (before any decoding): `start` is
// where the caller's body begins in it (0, or the first byte of the caller's own range),
// and `handed` counts the bytes already handed to the caller, so the next byte the caller
// needs is at `start + handed`.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderValue, StatusCode, header};

use crate::info::StopReason;

/// The one byte range a caller asked for itself: `bytes=first-last`, or `bytes=first-`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Asked {
    pub(crate) first: u64,
    pub(crate) last: Option<u64>,
}

/// What the caller's own `Range` means for resuming its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CallerRange {
    /// No `Range`: the whole representation.
    Whole,
    /// One range from a known first byte.
    One(Asked),
    /// Not resumed: a suffix range (`bytes=-500`), several ranges (a multipart answer),
    /// another unit, a malformed value, or an `If-Range` of the caller's own.
    Unsupported,
}

/// Reads the caller's `Range` (and `If-Range`).
pub(crate) fn caller_range(headers: &HeaderMap) -> CallerRange {
    if headers.contains_key(header::IF_RANGE) {
        return CallerRange::Unsupported;
    }
    let mut values = headers.get_all(header::RANGE).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return match headers.contains_key(header::RANGE) {
            true => CallerRange::Unsupported,
            false => CallerRange::Whole,
        };
    };
    let Some(spec) = value.to_str().ok().and_then(|v| strip_unit(v.trim(), '=')) else {
        return CallerRange::Unsupported;
    };
    let Some((first, last)) = spec.trim().split_once('-') else {
        return CallerRange::Unsupported;
    };
    let (Some(first), last) = (digits(first.trim()), last.trim()) else {
        return CallerRange::Unsupported;
    };
    let last = match last {
        "" => None,
        last => match digits(last) {
            Some(last) if last >= first => Some(last),
            _ => return CallerRange::Unsupported,
        },
    };
    CallerRange::One(Asked { first, last })
}

/// `bytes` (any case) followed by `sep`, and what comes after.
fn strip_unit(value: &str, sep: char) -> Option<&str> {
    let (unit, rest) = value.split_at_checked(5)?;
    let rest = rest.strip_prefix(sep)?;
    unit.eq_ignore_ascii_case("bytes").then_some(rest)
}

/// A non-empty run of ASCII digits as a number, without overflow.
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A `Content-Range` of the `bytes` unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ContentRange {
    /// `bytes first-last/complete` or `bytes first-last/*`.
    Bytes {
        first: u64,
        last: u64,
        complete: Option<u64>,
    },
    /// `bytes */complete`: the range asked for is not satisfiable (a 416's).
    Unsatisfied { complete: u64 },
}

/// Parses a `Content-Range` value; `None` for anything malformed (another unit, a range
/// whose last byte comes before its first or lies past the complete length, numbers that
/// overflow), which is never a valid continuation.
pub(crate) fn content_range(value: &HeaderValue) -> Option<ContentRange> {
    let rest = strip_unit(value.to_str().ok()?, ' ')?;
    let (range, complete) = rest.split_once('/')?;
    let complete = match complete {
        "*" => None,
        complete => Some(digits(complete)?),
    };
    if range == "*" {
        return Some(ContentRange::Unsatisfied {
            complete: complete?,
        });
    }
    let (first, last) = range.split_once('-')?;
    let (first, last) = (digits(first)?, digits(last)?);
    if last < first || complete.is_some_and(|complete| last >= complete) {
        return None;
    }
    Some(ContentRange::Bytes {
        first,
        last,
        complete,
    })
}

/// What proves that a continuation's bytes belong to the same representation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Validator {
    /// A strong entity tag.
    ETag(HeaderValue),
    /// A `Last-Modified` that is a strong validator: the response's `Date` is at least one
    /// second later.
    LastModified(HeaderValue),
}

impl Validator {
    /// The value of the continuation's `If-Range`.
    pub(crate) fn value(&self) -> &HeaderValue {
        match self {
            Validator::ETag(value) | Validator::LastModified(value) => value,
        }
    }
}

/// The validator a response offers for `If-Range`: its strong `ETag`; with no `ETag` at
/// all, its `Last-Modified` when strong. A weak (or malformed) entity tag is still an
/// entity tag: then there is no validator at all.
pub(crate) fn validator(headers: &HeaderMap) -> Option<Validator> {
    let mut tags = headers.get_all(header::ETAG).iter();
    match (tags.next(), tags.next()) {
        (Some(tag), None) => return is_strong_etag(tag).then(|| Validator::ETag(tag.clone())),
        (Some(_), Some(_)) => return None,
        (None, _) => {}
    }
    let modified = headers.get(header::LAST_MODIFIED)?;
    let date = headers.get(header::DATE)?;
    let at = |value: &HeaderValue| -> Option<SystemTime> {
        httpdate::parse_http_date(value.to_str().ok()?).ok()
    };
    let (modified_at, date_at) = (at(modified)?, at(date)?);
    let strong = date_at
        .duration_since(modified_at)
        .is_ok_and(|later| later >= Duration::from_secs(1));
    strong.then(|| Validator::LastModified(modified.clone()))
}

/// `"..."`, with no `W/` before it and no quote inside.
fn is_strong_etag(tag: &HeaderValue) -> bool {
    let bytes = tag.as_bytes();
    bytes.len() >= 2
        && bytes[0] == b'"'
        && bytes[bytes.len() - 1] == b'"'
        && !bytes[1..bytes.len() - 1].contains(&b'"')
}

/// Whether a response is a multipart one (`multipart/byteranges`), never resumed.
fn is_multipart(headers: &HeaderMap) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|value| {
        value
            .as_bytes()
            .get(..10)
            .is_some_and(|start| start.eq_ignore_ascii_case(b"multipart/"))
    })
}

fn content_length(headers: &HeaderMap) -> Option<u64> {
    digits(headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim())
}

/// What the first response establishes: where the caller's bytes lie in the
/// representation, and what proves a continuation of the same one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Origin {
    /// Where the caller's body begins in the representation.
    pub(crate) start: u64,
    /// Just past the caller's last byte, when known.
    pub(crate) end: Option<u64>,
    /// Whether a continuation's range names its last byte (the first answer was a 206: the
    /// caller's own range).
    closed: bool,
    /// The representation's complete length, when stated.
    complete: Option<u64>,
    pub(crate) validator: Option<Validator>,
    /// The first response's `Content-Encoding`: a continuation must have the same.
    encoding: Option<HeaderValue>,
}

impl Origin {
    /// Whether the first answer was a 206 (to the caller's own range).
    pub(crate) fn closed(&self) -> bool {
        self.closed
    }
}

/// Whether an `Accept-Encoding` admits no coding but identity (`identity`, with or without
/// a weight, alone or repeated); `*`, `gzip`, anything else admits another.
pub(crate) fn identity_only(accept_encoding: &HeaderValue) -> bool {
    accept_encoding.to_str().is_ok_and(|value| {
        value.split(',').all(|coding| {
            let name = coding.split(';').next().unwrap_or("").trim();
            name.eq_ignore_ascii_case("identity")
        })
    })
}

/// The origin of a first response whose body may be continued: a 200 (the whole
/// representation, whatever the caller asked), or a 206 with one `Content-Range` when the
/// caller asked for a range. `None` for anything else (a multipart 206 among them).
pub(crate) fn origin(
    caller: CallerRange,
    status: StatusCode,
    headers: &HeaderMap,
) -> Option<Origin> {
    let encoding = headers.get(header::CONTENT_ENCODING).cloned();
    let validator = validator(headers);
    match status {
        StatusCode::OK => {
            let length = content_length(headers);
            Some(Origin {
                start: 0,
                end: length,
                closed: false,
                complete: length,
                validator,
                encoding,
            })
        }
        StatusCode::PARTIAL_CONTENT if matches!(caller, CallerRange::One(_)) => {
            if is_multipart(headers) {
                return None;
            }
            match content_range(headers.get(header::CONTENT_RANGE)?)? {
                ContentRange::Bytes {
                    first,
                    last,
                    complete,
                } => Some(Origin {
                    start: first,
                    end: Some(last + 1),
                    closed: true,
                    complete,
                    validator,
                    encoding,
                }),
                ContentRange::Unsatisfied { .. } => None,
            }
        }
        _ => None,
    }
}

/// What to do once a body broke after `handed` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Every byte the caller expects arrived: the body ends cleanly, nothing is sent.
    Done,
    /// Send the request again as the caller sent it (nothing was handed over yet).
    Again,
    /// Send the request with this `Range` and `If-Range`.
    Range {
        range: HeaderValue,
        if_range: HeaderValue,
    },
}

/// The continuation's request after `handed` bytes, or why none is sent.
pub(crate) fn next(origin: &Origin, handed: u64) -> Result<Next, StopReason> {
    let at = origin.start.saturating_add(handed);
    if origin.end.is_some_and(|end| at >= end) {
        return Ok(Next::Done);
    }
    if handed == 0 {
        return Ok(Next::Again);
    }
    let Some(validator) = &origin.validator else {
        return Err(StopReason::NoValidator);
    };
    let range = match (origin.closed, origin.end) {
        (true, Some(end)) => format!("bytes={at}-{}", end - 1),
        _ => format!("bytes={at}-"),
    };
    Ok(Next::Range {
        range: HeaderValue::try_from(range).expect("digits and ASCII"),
        if_range: validator.value().clone(),
    })
}

/// The answer to a continuation, judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It continues the same representation: its body begins at `first` in it; skip its
    /// first `skip` bytes (the overlap), then hand the rest over.
    Accept { first: u64, skip: u64 },
    /// A failure worth another continuation (a 408, 429, 500, 502, 503 or 504).
    Again,
    /// Every byte had arrived (a 416 whose complete length is where the body stopped).
    End,
    /// Not a continuation of the same representation, or not one at all: the body ends
    /// with an error that says why.
    Refuse(StopReason),
}

/// Whether the answer to a continuation sent after `handed` bytes continues the first
/// response's representation.
pub(crate) fn judge(
    origin: &Origin,
    handed: u64,
    status: StatusCode,
    headers: &HeaderMap,
) -> Verdict {
    let at = origin.start.saturating_add(handed);
    match status.as_u16() {
        408 | 429 | 500 | 502 | 503 | 504 => return Verdict::Again,
        200 | 206 | 416 => {}
        _ => return Verdict::Refuse(StopReason::Final),
    }
    if status != StatusCode::RANGE_NOT_SATISFIABLE && changed(origin, headers) {
        return Verdict::Refuse(StopReason::RepresentationChanged);
    }
    let length_changed = |complete: u64| origin.complete.is_some_and(|first| first != complete);
    match status {
        StatusCode::PARTIAL_CONTENT => {
            if is_multipart(headers) {
                return Verdict::Refuse(StopReason::RangeMismatch);
            }
            let range = headers.get(header::CONTENT_RANGE).and_then(content_range);
            let Some(ContentRange::Bytes {
                first,
                last,
                complete,
            }) = range
            else {
                return Verdict::Refuse(StopReason::RangeMismatch);
            };
            if complete.is_some_and(length_changed) {
                return Verdict::Refuse(StopReason::LengthChanged);
            }
            // One that starts after the next byte would leave a hole; one that ends before
            // it brings nothing.
            if first > at || last < at {
                return Verdict::Refuse(StopReason::RangeMismatch);
            }
            Verdict::Accept {
                first,
                skip: at - first,
            }
        }
        StatusCode::OK => {
            if content_length(headers).is_some_and(length_changed) {
                return Verdict::Refuse(StopReason::LengthChanged);
            }
            let same_tag = matches!(
                (&origin.validator, headers.get(header::ETAG)),
                (Some(Validator::ETag(tag)), Some(now)) if tag == now
            );
            match same_tag || at == 0 {
                true => Verdict::Accept { first: 0, skip: at },
                false => Verdict::Refuse(StopReason::RangeIgnored),
            }
        }
        // 416: the range starts at or past the end.
        _ => match headers.get(header::CONTENT_RANGE).and_then(content_range) {
            Some(ContentRange::Unsatisfied { complete }) if length_changed(complete) => {
                Verdict::Refuse(StopReason::LengthChanged)
            }
            Some(ContentRange::Unsatisfied { complete }) if complete == at => Verdict::End,
            Some(ContentRange::Unsatisfied { complete }) if complete < at => {
                Verdict::Refuse(StopReason::LengthChanged)
            }
            _ => Verdict::Refuse(StopReason::RangeMismatch),
        },
    }
}

/// Whether the answer names another representation than the first response: another
/// strong entity tag or `Last-Modified` than the validator, or another content coding.
fn changed(origin: &Origin, headers: &HeaderMap) -> bool {
    let differs = |name, value: &HeaderValue| headers.get(name).is_some_and(|now| now != value);
    let validator = match &origin.validator {
        Some(Validator::ETag(tag)) => differs(header::ETAG, tag),
        Some(Validator::LastModified(date)) => differs(header::LAST_MODIFIED, date),
        None => false,
    };
    validator || coding(headers.get(header::CONTENT_ENCODING)) != coding(origin.encoding.as_ref())
}

/// A content coding, `identity` being none.
fn coding(value: Option<&HeaderValue>) -> Option<&[u8]> {
    value
        .map(HeaderValue::as_bytes)
        .filter(|coding| !coding.eq_ignore_ascii_case(b"identity"))
}

#[cfg(test)]
mod tests;
