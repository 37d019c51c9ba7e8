// Retry metrics through the OpenTelemetry metrics API (the `opentelemetry` feature): four
// histograms per logical request, recorded once at its end, in the shape of gRPC's retry
// metrics (grpc/proposal A96) under the crate's own names and HTTP's attributes. Without
// the feature, `Call` is nothing and its methods do nothing.

#[cfg(feature = "opentelemetry")]
pub(crate) use imp::{Call, Instruments};

#[cfg(all(feature = "tracing", not(feature = "opentelemetry")))]
pub(crate) use off::Call;

/// The instruments' names, units, descriptions and bucket boundaries.
#[cfg(feature = "opentelemetry")]
pub(crate) mod names {
    pub(crate) const RETRIES: &str = "tower_http_retry.call.retries";
    pub(crate) const TRANSPARENT_RETRIES: &str = "tower_http_retry.call.transparent_retries";
    pub(crate) const HEDGES: &str = "tower_http_retry.call.hedges";
    pub(crate) const RETRY_DELAY: &str = "tower_http_retry.call.retry_delay";

    pub(crate) const RETRIES_DESCRIPTION: &str =
        "Number of retries during the request. If there were no retries, 0 is not reported.";
    pub(crate) const TRANSPARENT_RETRIES_DESCRIPTION: &str = "Number of transparent retries \
         during the request. If there were no transparent retries, 0 is not reported.";
    pub(crate) const HEDGES_DESCRIPTION: &str =
        "Number of hedges during the request. If there were no hedges, 0 is not reported.";
    pub(crate) const RETRY_DELAY_DESCRIPTION: &str = "Total time of delay while there is no \
         active attempt during the request. Not reported for a request with no retry or hedge.";

    /// A96's boundaries for the retries and the hedges.
    pub(crate) const COUNT_BUCKETS: [f64; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];
    /// A96's boundaries for the transparent retries.
    pub(crate) const TRANSPARENT_BUCKETS: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0];
    /// A66's latency boundaries (seconds), which A96 gives the retry delay.
    pub(crate) const LATENCY_BUCKETS: [f64; 41] = [
        0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
        0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13,
        0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
    ];
}

#[cfg(feature = "opentelemetry")]
mod imp {
    use std::fmt;
    use std::sync::{Arc, OnceLock};

    use opentelemetry::KeyValue;
    use opentelemetry::metrics::{Histogram, Meter};

    use super::names::*;
    use crate::head::Head;
    use crate::hook::AttemptKind;
    use crate::info::{AttemptOutcome, RetryInfo};
    use crate::trace::Log;
    use crate::trace::{Target, known_method};

    /// The four histograms, made once from the meter the layer was given.
    pub(crate) struct Instruments {
        retries: Histogram<u64>,
        transparent: Histogram<u64>,
        hedges: Histogram<u64>,
        delay: Histogram<f64>,
    }

    impl fmt::Debug for Instruments {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Instruments")
        }
    }

    impl Instruments {
        pub(crate) fn new(meter: &Meter) -> Self {
            let count = |name, unit, description, buckets: &[f64]| {
                meter
                    .u64_histogram(name)
                    .with_unit(unit)
                    .with_description(description)
                    .with_boundaries(buckets.to_vec())
                    .build()
            };
            Self {
                retries: count(RETRIES, "{retry}", RETRIES_DESCRIPTION, &COUNT_BUCKETS),
                transparent: count(
                    TRANSPARENT_RETRIES,
                    "{transparent_retry}",
                    TRANSPARENT_RETRIES_DESCRIPTION,
                    &TRANSPARENT_BUCKETS,
                ),
                hedges: count(HEDGES, "{hedge}", HEDGES_DESCRIPTION, &COUNT_BUCKETS),
                delay: meter
                    .f64_histogram(RETRY_DELAY)
                    .with_unit("s")
                    .with_description(RETRY_DELAY_DESCRIPTION)
                    .with_boundaries(LATENCY_BUCKETS.to_vec())
                    .build(),
            }
        }
    }

    /// A logical request's part in the metrics: nothing until its first retry or hedge is
    /// sent, when its attributes are taken from its head (a request that is not retried
    /// records nothing, and pays only for this empty cell).
    pub(crate) struct Call(OnceLock<(Arc<Instruments>, Vec<KeyValue>)>);

    impl Call {
        pub(crate) fn new() -> Self {
            Call(OnceLock::new())
        }

        /// A retry, transparent retry or hedge of the request `head` is sent.
        pub(crate) fn retried(&self, log: &Log, head: &Head) {
            if let Some(instruments) = &log.meter {
                self.0
                    .get_or_init(|| (Arc::clone(instruments), attributes(head)));
            }
        }

        /// The request's end: its counts, each unless 0, and the time it had no attempt
        /// in flight, if it was retried or hedged.
        pub(crate) fn finish(&self, info: &RetryInfo) {
            let Some((instruments, attributes)) = self.0.get() else {
                return;
            };
            let (mut retries, mut transparent, mut hedges) = (0, 0, 0);
            for retry in info.retries() {
                if retry.outcome == AttemptOutcome::NotSent {
                    continue;
                }
                match retry.kind {
                    AttemptKind::Transparent => transparent += 1,
                    AttemptKind::Hedge => hedges += 1,
                    _ => retries += 1,
                }
            }
            for (histogram, count) in [
                (&instruments.retries, retries),
                (&instruments.transparent, transparent),
                (&instruments.hedges, hedges),
            ] {
                if count > 0 {
                    histogram.record(count, attributes);
                }
            }
            if retries + hedges > 0 {
                instruments
                    .delay
                    .record(info.retry_delay().as_secs_f64(), attributes);
            }
        }
    }

    /// The request's low-cardinality attributes, as OpenTelemetry's HTTP client metrics
    /// have them, and as the attempts' spans name them: `http.request.method` (`_OTHER`
    /// for a method the conventions do not know), `server.address` (from the URI, else the
    /// `Host` header; an IPv6 address without brackets) and `server.port` (its port, else
    /// the scheme's).
    pub(crate) fn attributes(head: &Head) -> Vec<KeyValue> {
        let target = Target::of(head.uri(), head.host());
        vec![
            KeyValue::new(
                "http.request.method",
                known_method(head.method()).to_owned(),
            ),
            KeyValue::new("server.address", target.address().to_owned()),
            KeyValue::new("server.port", i64::from(target.port())),
        ]
    }
}

#[cfg(all(feature = "tracing", not(feature = "opentelemetry")))]
mod off {
    /// Nothing: the `opentelemetry` feature is off.
    pub(crate) struct Call;

    impl Call {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Call
        }

        #[inline(always)]
        pub(crate) fn retried(&self, _: &crate::trace::Log, _: &crate::head::Head) {}
        #[inline(always)]
        pub(crate) fn finish(&self, _: &crate::info::RetryInfo) {}
    }
}
