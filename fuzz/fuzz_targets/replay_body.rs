//! Fuzzes `ReplayBody`: arbitrary chunks of arbitrary bytes, a cap, trailers or an error,
//! a size hint, stalls, and replays read one after the other or in turns. Every replay
//! must equal exactly what the first pass sent; a body over the cap is sent complete and
//! is not replayable. See `src/replay_case.rs` for every property.
#![no_main]

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use tower_http_retry_fuzz::replay_case::{Hint, ReplayCase, check};

fuzz_target!(|data: &[u8]| {
    if let Ok(case) = decode(&mut Unstructured::new(data)) {
        check(&case);
    }
});

const TRAILER_NAMES: [&str; 4] = ["x-checksum", "grpc-status", "grpc-message", "x-trace"];

fn decode(u: &mut Unstructured<'_>) -> Result<ReplayCase> {
    let n_chunks: usize = u.int_in_range(0..=12)?;
    let trailers = if u.arbitrary()? {
        let mut map = HeaderMap::new();
        for _ in 0..u.int_in_range(0..=3)? {
            let name = HeaderName::from_static(TRAILER_NAMES[u.choose_index(TRAILER_NAMES.len())?]);
            let raw: Vec<u8> = u.arbitrary()?;
            let visible: Vec<u8> = raw
                .into_iter()
                .filter(|b| (b' '..=b'~').contains(b))
                .collect();
            map.append(
                name,
                HeaderValue::from_bytes(&visible).expect("visible ASCII"),
            );
        }
        Some(map)
    } else {
        None
    };
    let fail_after = if u.ratio(1, 8)? {
        Some(u.int_in_range(0..=n_chunks)?)
    } else {
        None
    };
    let cap_mode: u8 = u.int_in_range(0..=4)?;
    let cap_arg: u16 = u.arbitrary()?;
    let hint = match u.int_in_range(0..=3)? {
        0 => Hint::Unknown,
        1 => Hint::Exact,
        2 => Hint::Lower(u64::from(u.arbitrary::<u16>()?)),
        _ => Hint::Upper(u64::from(u.arbitrary::<u16>()?)),
    };
    let stalls = (0..n_chunks + 2)
        .map(|_| Ok(u.arbitrary::<u8>()? % 4))
        .collect::<Result<Vec<u8>>>()?;
    let replays = (0..u.int_in_range(0..=4)?)
        .map(|_| Ok(u.arbitrary::<Option<u8>>()?.map(usize::from)))
        .collect::<Result<Vec<_>>>()?;
    let interleave = u.arbitrary()?;
    let mut chunks = Vec::with_capacity(n_chunks);
    for _ in 0..n_chunks {
        let len: usize = u.int_in_range(0..=96)?;
        chunks.push(Bytes::copy_from_slice(u.bytes(len.min(u.len()))?));
    }
    let total: usize = chunks.iter().map(Bytes::len).sum();
    let cap = match cap_mode {
        // Around the total, where off-by-one mistakes live.
        0 => (total + usize::from(cap_arg % 5)).saturating_sub(2),
        1 => usize::from(cap_arg),
        2 => 0,
        3 => usize::MAX,
        _ => total,
    };
    Ok(ReplayCase {
        chunks,
        trailers,
        fail_after,
        cap,
        hint,
        stalls,
        replays,
        interleave,
    })
}
