//! Fuzzes `retry_after::parse`: no input may panic, the same input gets the same answer, and
//! delta-seconds and HTTP-dates round-trip.
//!
//! Input layout: a flag byte (bit 0: the response has a `Date`), a split point (2 bytes),
//! the caller's clock (8 + 4 bytes), then numbers for the round-trips; every remaining
//! byte is header text, cut at the split point into the `Retry-After` value and the `Date`.
#![no_main]

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tower_http_retry_fuzz::retry_after_case::{
    LAST_DATE_SECS, RawCase, check_date, check_delta, check_raw, system_time,
};

fuzz_target!(|data: &[u8]| {
    // Running out of bytes only means the remaining fields are zero: never an error here.
    let _ = run(data);
});

fn padding(bits: u8) -> String {
    (0..bits & 3)
        .map(|i| if bits >> (2 + i) & 1 == 1 { '\t' } else { ' ' })
        .collect()
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let flags: u8 = u.arbitrary()?;
    let split: u16 = u.arbitrary()?;
    let now = system_time(u.arbitrary()?, u.arbitrary()?);
    let n: u64 = u.arbitrary()?;
    let zeros: u8 = u.arbitrary()?;
    let pad: u16 = u.arbitrary()?;
    let target: u64 = u.arbitrary()?;
    let reference: u64 = u.arbitrary()?;
    let skew: i32 = u.arbitrary()?;
    let text = u.take_rest();

    let split = usize::from(split) % (text.len() + 1);
    let (value, date) = if flags & 1 == 1 {
        (&text[..split], Some(text[split..].to_vec()))
    } else {
        (text, None)
    };
    let case = RawCase {
        value: value.to_vec(),
        date,
        now,
    };
    check_raw(&case);

    let date = case
        .date
        .as_deref()
        .and_then(|d| std::str::from_utf8(d).ok());
    let (before, after) = (padding(pad as u8), padding((pad >> 8) as u8));
    check_delta(n, usize::from(zeros % 24), &before, &after, now, date);
    check_date(
        target % (LAST_DATE_SECS + 1),
        reference % (LAST_DATE_SECS + 1),
        i64::from(skew),
    );
    Ok(())
}
