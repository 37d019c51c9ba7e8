// The latency record of a route that hedges by percentile: a lock-free histogram of the
// attempts' latencies over the last two periods, shared by every clone of the service.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::time::Instant;

/// How long a period lasts: samples count for one to two periods.
const PERIOD: Duration = Duration::from_secs(10);
/// How long a computed delay is reused before the histogram is read again.
const REFRESH: Duration = Duration::from_millis(50);
/// Sub-buckets per power of two: a bucket's upper bound is within 1/16 of its values.
const SUB: u64 = 16;
const SUB_BITS: u32 = 4;
/// Microseconds up to 2^32 (about 71 minutes) have buckets; longer ones count in the last.
const MAX_EXPONENT: u32 = 32;
const BUCKETS: usize = (SUB + (MAX_EXPONENT as u64 - SUB_BITS as u64) * SUB) as usize;

/// The bucket of a latency of `micros` microseconds.
fn bucket(micros: u64) -> usize {
    if micros < SUB {
        return micros as usize;
    }
    let exponent = 63 - micros.leading_zeros();
    if exponent >= MAX_EXPONENT {
        return BUCKETS - 1;
    }
    let sub = (micros >> (exponent - SUB_BITS)) & (SUB - 1);
    (SUB + u64::from(exponent - SUB_BITS) * SUB + sub) as usize
}

/// The largest latency, in microseconds, of bucket `index`.
fn upper_bound(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB {
        return index;
    }
    let exponent = (index - SUB) / SUB + u64::from(SUB_BITS);
    let sub = (index - SUB) % SUB;
    ((SUB + sub + 1) << (exponent - u64::from(SUB_BITS))) - 1
}

/// One period's counts.
struct Window {
    /// The period these counts belong to, plus one (zero: never used).
    epoch: AtomicU64,
    counts: Box<[AtomicU32]>,
    total: AtomicU64,
}

impl Window {
    fn new() -> Self {
        Self {
            epoch: AtomicU64::new(0),
            counts: (0..BUCKETS).map(|_| AtomicU32::new(0)).collect(),
            total: AtomicU64::new(0),
        }
    }
}

/// The latencies of one route's attempts: two windows, the current period's and the one
/// before, so that a delay is known from the first samples on and ages out after two
/// periods of silence. A writer that finds its window holding an older period clears it
/// first; a few counts racing with that clearing may be lost, which a statistic can bear.
pub(crate) struct LatencyRecord {
    origin: Instant,
    windows: [Window; 2],
    /// The last delay computed (microseconds, `u64::MAX` for none) and until when it holds
    /// (microseconds since `origin`).
    cached: AtomicU64,
    cached_until: AtomicU64,
    /// The percentile (its bits) and the minimum of samples the cached delay is for: a
    /// request whose policy comes in its extensions may read its route's record with its own.
    cached_p: AtomicU64,
    cached_min: AtomicU64,
}

impl std::fmt::Debug for LatencyRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyRecord").finish_non_exhaustive()
    }
}

impl LatencyRecord {
    /// An empty record, its periods counted from `origin` (the layer's clock's time).
    pub(crate) fn new(origin: Instant) -> Self {
        Self {
            origin,
            windows: [Window::new(), Window::new()],
            cached: AtomicU64::new(u64::MAX),
            cached_until: AtomicU64::new(0),
            cached_p: AtomicU64::new(0),
            cached_min: AtomicU64::new(0),
        }
    }

    /// The period `now` falls in, plus one.
    fn epoch(&self, now: Instant) -> u64 {
        let elapsed = now.saturating_duration_since(self.origin);
        (elapsed.as_micros() / PERIOD.as_micros()) as u64 + 1
    }

    /// Counts one attempt that took `latency`.
    pub(crate) fn record(&self, latency: Duration, now: Instant) {
        let epoch = self.epoch(now);
        let window = &self.windows[(epoch % 2) as usize];
        let seen = window.epoch.load(Ordering::Acquire);
        if seen != epoch
            && window
                .epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            // This writer moved the window on: the older period's counts go.
            for count in window.counts.iter() {
                count.store(0, Ordering::Relaxed);
            }
            window.total.store(0, Ordering::Release);
        }
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        window.counts[bucket(micros)].fetch_add(1, Ordering::Relaxed);
        window.total.fetch_add(1, Ordering::Release);
    }

    /// The `p` quantile of the latencies counted in this period and the one before, or
    /// `None` while fewer than `min_samples` were counted. Read again at most every 50 ms;
    /// in between, the last answer for the same `p` and minimum.
    pub(crate) fn delay(&self, p: f64, min_samples: u64, now: Instant) -> Option<Duration> {
        let at = u64::try_from(now.saturating_duration_since(self.origin).as_micros())
            .unwrap_or(u64::MAX);
        if at < self.cached_until.load(Ordering::Acquire)
            && self.cached_p.load(Ordering::Relaxed) == p.to_bits()
            && self.cached_min.load(Ordering::Relaxed) == min_samples
        {
            return match self.cached.load(Ordering::Relaxed) {
                u64::MAX => None,
                micros => Some(Duration::from_micros(micros)),
            };
        }
        let delay = self.quantile(p, min_samples, now);
        self.cached.store(
            delay.map_or(u64::MAX, |d| d.as_micros() as u64),
            Ordering::Relaxed,
        );
        self.cached_p.store(p.to_bits(), Ordering::Relaxed);
        self.cached_min.store(min_samples, Ordering::Relaxed);
        self.cached_until.store(
            at.saturating_add(REFRESH.as_micros() as u64),
            Ordering::Release,
        );
        delay
    }

    /// The `p` quantile, read from the histogram now.
    pub(crate) fn quantile(&self, p: f64, min_samples: u64, now: Instant) -> Option<Duration> {
        let epoch = self.epoch(now);
        let live: Vec<&Window> = self
            .windows
            .iter()
            .filter(|w| {
                let e = w.epoch.load(Ordering::Acquire);
                e == epoch || e + 1 == epoch
            })
            .collect();
        let total: u64 = live.iter().map(|w| w.total.load(Ordering::Acquire)).sum();
        if total == 0 || total < min_samples {
            return None;
        }
        // The smallest latency at or above which no more than 1 - p of them lie.
        let rank = ((p * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0u64;
        for index in 0..BUCKETS {
            seen += live
                .iter()
                .map(|w| u64::from(w.counts[index].load(Ordering::Relaxed)))
                .sum::<u64>();
            if seen >= rank {
                return Some(Duration::from_micros(upper_bound(index)));
            }
        }
        // Counts moved under the walk: the largest bucket seen.
        Some(Duration::from_micros(upper_bound(BUCKETS - 1)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_their_bounds_within_a_sixteenth() {
        let mut last = 0;
        for micros in (0..100_000u64).chain([1 << 20, (1 << 31) + 5, u64::MAX / 2]) {
            let index = bucket(micros);
            assert!(index >= last || micros >= 1 << 20, "{micros}");
            last = index;
            let bound = upper_bound(index);
            assert!(
                bound >= micros || index == BUCKETS - 1,
                "{micros} -> {bound}"
            );
            assert!(
                index == BUCKETS - 1 || (bound - micros) * 16 <= micros.max(16),
                "{micros} -> {bound}"
            );
        }
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_percentile_comes_from_the_first_samples_and_ages_out() {
        let record = LatencyRecord::new(crate::time::default_now());
        let now = crate::time::default_now();
        for ms in 1..=9 {
            record.record(Duration::from_millis(ms), now);
        }
        assert_eq!(
            record.quantile(0.9, 10, now),
            None,
            "fewer than min_samples"
        );
        record.record(Duration::from_millis(200), now);
        // 10 samples: the 9th is 9 ms.
        let p90 = record.quantile(0.9, 10, now).unwrap();
        assert!(
            p90 >= Duration::from_millis(9) && p90 < Duration::from_micros(9_600),
            "{p90:?}"
        );
        // Next period: still counted.
        let later = now + PERIOD;
        assert_eq!(record.quantile(0.9, 10, later), Some(p90));
        // Two periods on, nothing new: gone.
        assert_eq!(record.quantile(0.9, 10, now + PERIOD * 2), None);
        // A window reused for a new period starts empty.
        record.record(Duration::from_millis(50), now + PERIOD * 2);
        let fresh = LatencyRecord::new(crate::time::default_now());
        fresh.record(Duration::from_millis(50), now);
        assert_eq!(
            record.quantile(0.9, 10, now + PERIOD * 2),
            None,
            "one sample is below the minimum of 10"
        );
        assert!(fresh.quantile(0.5, 1, now).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_delay_is_cached_for_a_moment() {
        let record = LatencyRecord::new(crate::time::default_now());
        let now = crate::time::default_now();
        record.record(Duration::from_millis(10), now);
        let first = record.delay(0.5, 1, now).unwrap();
        record.record(Duration::from_millis(500), now);
        record.record(Duration::from_millis(500), now);
        assert_eq!(
            record.delay(0.5, 1, now + Duration::from_millis(10)),
            Some(first)
        );
        let fresh = record.delay(0.5, 1, now + REFRESH).unwrap();
        assert!(fresh > Duration::from_millis(400), "{fresh:?}");
        // Another percentile is not served the cached answer.
        let low = record.delay(0.1, 1, now + REFRESH).unwrap();
        assert!(low < Duration::from_millis(11), "{low:?}");
    }

    proptest::proptest! {
        #[test]
        fn the_quantile_is_within_a_sixteenth_of_the_exact_one(
            mut samples in proptest::collection::vec(1u64..5_000_000, 1..300),
            p in 0.01f64..0.99,
        ) {
            let now = crate::time::default_now();
            let record = LatencyRecord::new(crate::time::default_now());
            for &micros in &samples {
                record.record(Duration::from_micros(micros), now);
            }
            samples.sort_unstable();
            let rank = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len());
            let exact = samples[rank - 1];
            let read = record.quantile(p, 1, now).unwrap().as_micros() as u64;
            proptest::prop_assert!(read >= exact, "{read} < {exact}");
            proptest::prop_assert!((read - exact) * 16 <= exact.max(16), "{read} vs {exact}");
        }
    }
}
