//! Fuzzes the `hints` readers through `Hint::from_headers`: the `RateLimit` and
//! `X-RateLimit-Reset` fields each alone in a response, and whole responses with
//! `Retry-After` beside them. No input may panic, raw bytes keep the documented
//! properties, and modelled `RateLimit` and `X-RateLimit-Reset` fields give exactly the
//! wait the model says.
//!
//! Input layout: a flag byte, the caller's clock (8 + 4 bytes), a `RateLimit` model (a
//! count, then per member a few bytes for its name and parameters, then line breaks,
//! spacing and damage), an `X-RateLimit-Reset` model; every remaining byte is raw header
//! text, cut at each `\n` into field lines, whose first byte picks the header.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tower_http_retry_fuzz::hints_case::{
    LimitModel, NameModel, RateLimitModel, RawCase, ResetModel, ValueModel, check_rate_limit,
    check_raw, check_reset,
};
use tower_http_retry_fuzz::retry_after_case::{LAST_DATE_SECS, system_time};

fuzz_target!(|data: &[u8]| {
    // Running out of bytes only means the remaining fields are zero: never an error here.
    let _ = run(data);
});

/// Up to 8 bytes of text, from a number.
fn text(u: &mut Unstructured<'_>) -> Result<String> {
    let bytes: u64 = u.arbitrary()?;
    let len: u8 = u.arbitrary()?;
    let len = usize::from(len % 9);
    Ok(String::from_utf8_lossy(&bytes.to_le_bytes()[..len]).into_owned())
}

fn value(u: &mut Unstructured<'_>) -> Result<ValueModel> {
    let kind: u8 = u.arbitrary()?;
    Ok(match kind {
        255 => ValueModel::Overlong,
        _ => match kind % 8 {
            0 => ValueModel::Missing,
            1 => ValueModel::Integer(0),
            2 => ValueModel::Integer(i64::from(u.arbitrary::<u16>()?)),
            3 => ValueModel::Integer(u.arbitrary()?),
            4 => ValueModel::Decimal(u.arbitrary()?),
            5 => ValueModel::String(text(u)?),
            6 => ValueModel::Token,
            _ => ValueModel::Boolean(u.arbitrary()?),
        },
    })
}

fn limit(u: &mut Unstructured<'_>) -> Result<LimitModel> {
    let kind: u8 = u.arbitrary()?;
    let name = match kind % 10 {
        0..=3 => NameModel::String(text(u)?),
        4..=5 => NameModel::Token(text(u)?),
        6 => NameModel::Integer(u.arbitrary()?),
        7 => NameModel::Bytes,
        8 => NameModel::Boolean,
        _ => NameModel::InnerList,
    };
    Ok(LimitModel {
        name,
        r: value(u)?,
        earlier_r: value(u)?,
        t: value(u)?,
        t_first: u.arbitrary()?,
        comments: u.arbitrary()?,
    })
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let flags: u8 = u.arbitrary()?;
    let now_secs: i64 = u.arbitrary()?;
    let now = system_time(now_secs, u.arbitrary()?);

    let count: u8 = u.arbitrary()?;
    let mut limits = Vec::new();
    for _ in 0..count % 6 {
        limits.push(limit(&mut u)?);
    }
    let damage: u8 = u.arbitrary()?;
    check_rate_limit(&RateLimitModel {
        limits,
        breaks: u.arbitrary()?,
        spacing: u.arbitrary()?,
        damage: damage % 4,
    });

    let reset: u64 = u.arbitrary()?;
    let offset: i16 = u.arbitrary()?;
    let reset = match flags >> 1 & 3 {
        0 => reset,
        1 => reset % 2_000_000_000,
        // Near the clock, where past and future meet.
        _ => u64::try_from(i128::from(now_secs) + i128::from(offset)).unwrap_or(0),
    };
    let date: u64 = u.arbitrary()?;
    let date = match flags >> 3 & 3 {
        0 => None,
        1 => Some(date % (LAST_DATE_SECS + 1)),
        _ => Some(reset.saturating_add_signed(i64::from(offset / 4))),
    };
    let rate_limit_t: u32 = u.arbitrary()?;
    let retry_after: u32 = u.arbitrary()?;
    check_reset(&ResetModel {
        reset,
        zeros: u.arbitrary()?,
        pad: u.arbitrary()?,
        date,
        now,
        rate_limit_t: (flags & 0x20 != 0).then_some(rate_limit_t),
        retry_after: (flags & 0x40 != 0).then_some(retry_after),
    });

    let mut case = RawCase {
        rate_limit: Vec::new(),
        remaining: Vec::new(),
        reset: Vec::new(),
        retry_after: Vec::new(),
        date: Vec::new(),
        now,
    };
    for segment in u.take_rest().split(|byte| *byte == b'\n') {
        let Some((role, line)) = segment.split_first() else {
            continue;
        };
        let lines = match role % 8 {
            0..=3 => &mut case.rate_limit,
            4 => &mut case.remaining,
            5 => &mut case.reset,
            6 => &mut case.retry_after,
            _ => &mut case.date,
        };
        lines.push(line.to_vec());
    }
    check_raw(&case);
    Ok(())
}
