//! The `opentelemetry` feature: the four retry histograms of `RetryLayer::otel_meter`, in
//! the shape of gRPC's retry metrics (grpc/proposal A96, at commit
//! 1fd061ad8e7c46422b326e5a60cf68d042476205): names, units, descriptions, attributes,
//! bucket boundaries, values, and nothing recorded for a request that was not retried.
//! Read back through the SDK's in-memory exporter, from a provider of each test's own (no
//! global provider).
#![cfg(feature = "opentelemetry")]

mod common;

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use common::{Mock, Reply, get};
use http::{Method, Request};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, HistogramDataPoint, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tower::{Layer, ServiceExt};
use tower_http_retry::classify::{Recognized, RetryReason};
use tower_http_retry::{Backoff, Hedging, Jitter, RetryLayer, RetryPolicy};

const RETRIES: &str = "tower_http_retry.call.retries";
const TRANSPARENT: &str = "tower_http_retry.call.transparent_retries";
const HEDGES: &str = "tower_http_retry.call.hedges";
const DELAY: &str = "tower_http_retry.call.retry_delay";
const ALL: [&str; 4] = [RETRIES, TRANSPARENT, HEDGES, DELAY];

/// A66's latency boundaries, which A96 gives the retry delay.
const LATENCY: [f64; 41] = [
    0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
];

/// One histogram's data point, as exported.
#[derive(Debug, Clone, PartialEq)]
struct Point {
    attributes: BTreeMap<String, String>,
    bounds: Vec<f64>,
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

/// One instrument as exported: unit, description, data points.
#[derive(Debug, Clone)]
struct Exported {
    unit: String,
    description: String,
    points: Vec<Point>,
}

fn point<T: Copy>(p: &HistogramDataPoint<T>, sum: impl Fn(T) -> f64) -> Point {
    Point {
        attributes: p
            .attributes()
            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect(),
        bounds: p.bounds().collect(),
        buckets: p.bucket_counts().collect(),
        count: p.count(),
        sum: sum(p.sum()),
    }
}

/// A meter of a provider of the test's own, and a way to read what it exported.
struct Metrics {
    provider: SdkMeterProvider,
    exporter: InMemoryMetricExporter,
}

impl Metrics {
    fn new() -> Self {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        Self { provider, exporter }
    }

    fn layer(&self, policy: RetryPolicy) -> RetryLayer {
        RetryLayer::new()
            .policy(RetryPolicy::new().no_gates())
            .policy(policy)
            .otel_meter(self.provider.meter("tower-http-retry"))
    }

    /// Every instrument with data, by name.
    fn collect(&self) -> BTreeMap<String, Exported> {
        self.provider.force_flush().unwrap();
        let mut all = BTreeMap::new();
        let exported = self.exporter.get_finished_metrics().unwrap();
        // Cumulative: the last export has everything.
        let Some(last) = exported.last() else {
            return all;
        };
        for scope in last.scope_metrics() {
            for metric in scope.metrics() {
                let points: Vec<Point> = match metric.data() {
                    AggregatedMetrics::U64(MetricData::Histogram(h)) => {
                        h.data_points().map(|p| point(p, |s| s as f64)).collect()
                    }
                    AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                        h.data_points().map(|p| point(p, |s| s)).collect()
                    }
                    other => panic!("{} is not a histogram: {other:?}", metric.name()),
                };
                if points.is_empty() {
                    continue;
                }
                all.insert(
                    metric.name().to_owned(),
                    Exported {
                        unit: metric.unit().to_owned(),
                        description: metric.description().to_owned(),
                        points,
                    },
                );
            }
        }
        all
    }
}

fn fixed(attempts: u32, wait_ms: u64) -> RetryPolicy {
    let wait = Duration::from_millis(wait_ms);
    RetryPolicy::new()
        .max_attempts(attempts)
        .backoff(Backoff::exponential(wait, wait).jitter(Jitter::None))
}

fn attrs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const API_TEST: [(&str, &str); 3] = [
    ("http.request.method", "GET"),
    ("server.address", "api.test"),
    ("server.port", "80"),
];

/// 503, 503, 200 with 100 ms of backoff each time: 2 retries, 0.2 s with no attempt in
/// flight; no transparent retry, no hedge, so neither is recorded.
#[tokio::test(start_paused = true)]
async fn a_retried_request_records_its_retries_and_delay() {
    let metrics = Metrics::new();
    let client = metrics
        .layer(fixed(3, 100))
        .layer(Mock::statuses(&[503, 503]));
    let response = client
        .oneshot(get("http://api.test/v1/items"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let all = metrics.collect();
    assert_eq!(all.keys().collect::<Vec<_>>(), [RETRIES, DELAY]);
    let retries = &all[RETRIES];
    assert_eq!(retries.unit, "{retry}");
    assert_eq!(
        retries.description,
        "Number of retries during the request. If there were no retries, 0 is not reported."
    );
    assert_eq!(
        retries.points,
        [Point {
            attributes: attrs(&API_TEST),
            bounds: vec![1.0, 2.0, 3.0, 4.0, 5.0],
            buckets: vec![0, 1, 0, 0, 0, 0],
            count: 1,
            sum: 2.0,
        }]
    );
    let delay = &all[DELAY];
    assert_eq!(delay.unit, "s");
    assert_eq!(
        delay.description,
        "Total time of delay while there is no active attempt during the request. \
         Not reported for a request with no retry or hedge."
    );
    let [point] = delay.points.as_slice() else {
        panic!("{:?}", delay.points)
    };
    assert_eq!(point.attributes, attrs(&API_TEST));
    assert_eq!(point.bounds, LATENCY);
    assert_eq!(point.count, 1);
    assert!((point.sum - 0.2).abs() < 1e-9, "{}", point.sum);
    // 0.2 s falls in (0.16, 0.2]: the bucket after the 27th boundary.
    let bucket = LATENCY.iter().position(|&b| b >= 0.2).unwrap();
    assert_eq!(point.buckets[bucket], 1, "{:?}", point.buckets);
}

/// A request answered at once, and one whose answer is final (a 404), record nothing in
/// any of the four: a count of 0 is not recorded, nor a delay without a retry.
#[tokio::test(start_paused = true)]
async fn a_request_not_retried_records_nothing() {
    let metrics = Metrics::new();
    let client = metrics.layer(fixed(3, 100));
    let ok = client.clone().layer(Mock::statuses(&[200]));
    ok.oneshot(get("http://api.test/")).await.unwrap();
    let not_found = client.clone().layer(Mock::statuses(&[404]));
    let response = not_found.oneshot(get("http://api.test/")).await.unwrap();
    assert_eq!(response.status(), 404);
    let all = metrics.collect();
    for name in ALL {
        assert!(!all.contains_key(name), "{name}: {:?}", all[name]);
    }
    // The same layer records a request that is retried: the silence above was the rule's.
    let retried = client.layer(Mock::statuses(&[503]));
    retried.oneshot(get("http://api.test/")).await.unwrap();
    let all = metrics.collect();
    assert_eq!(all.keys().collect::<Vec<_>>(), [RETRIES, DELAY]);
    assert_eq!(all[RETRIES].points[0].count, 1);
}

/// A stream refused before it left is sent again at once: a transparent retry, counted
/// apart from the retries, with A96's boundaries for it. Transparent retries alone record
/// no delay.
#[tokio::test(start_paused = true)]
async fn a_transparent_retry_is_counted_apart() {
    let metrics = Metrics::new();
    let refused = Reply::error(|| {
        Recognized::new(
            io::Error::other("stream refused"),
            Some(RetryReason::RefusedStream),
        )
    });
    let client = metrics
        .layer(fixed(1, 100).transparent_retry(true))
        .layer(Mock::new([refused]));
    client.oneshot(get("https://api.test/")).await.unwrap();
    let all = metrics.collect();
    assert_eq!(all.keys().collect::<Vec<_>>(), [TRANSPARENT]);
    let transparent = &all[TRANSPARENT];
    assert_eq!(transparent.unit, "{transparent_retry}");
    assert_eq!(
        transparent.description,
        "Number of transparent retries during the request. If there were no transparent \
         retries, 0 is not reported."
    );
    let https = attrs(&[
        ("http.request.method", "GET"),
        ("server.address", "api.test"),
        ("server.port", "443"),
    ]);
    assert_eq!(
        transparent.points,
        [Point {
            attributes: https,
            bounds: vec![1.0, 2.0, 3.0, 4.0, 5.0, 10.0],
            buckets: vec![1, 0, 0, 0, 0, 0, 0],
            count: 1,
            sum: 1.0,
        }]
    );
}

/// A hedge sent while the first attempt is out: one hedge, no retry; it overlapped the
/// first attempt, so the delay recorded is 0 (in A66's first bucket).
#[tokio::test(start_paused = true)]
async fn a_hedge_is_counted_and_its_overlap_is_no_delay() {
    let metrics = Metrics::new();
    let slow = Reply::Slow(Duration::from_secs(5), Box::new(Reply::Status(200)));
    let policy = fixed(2, 100).hedge(Hedging::after(Duration::from_millis(100)));
    let client = metrics.layer(policy).layer(Mock::new([slow]));
    client.oneshot(get("http://api.test/")).await.unwrap();
    let all = metrics.collect();
    assert_eq!(all.keys().collect::<Vec<_>>(), [HEDGES, DELAY]);
    let hedges = &all[HEDGES];
    assert_eq!(hedges.unit, "{hedge}");
    assert_eq!(
        hedges.description,
        "Number of hedges during the request. If there were no hedges, 0 is not reported."
    );
    assert_eq!(
        hedges.points,
        [Point {
            attributes: attrs(&API_TEST),
            bounds: vec![1.0, 2.0, 3.0, 4.0, 5.0],
            buckets: vec![1, 0, 0, 0, 0, 0],
            count: 1,
            sum: 1.0,
        }]
    );
    let [delay] = all[DELAY].points.as_slice() else {
        panic!()
    };
    assert_eq!((delay.count, delay.sum, delay.buckets[0]), (1, 0.0, 1));
}

/// A request that fails for good is recorded at its error. A method the conventions do
/// not know is `_OTHER`; a path-only URI takes its server from `Host`.
#[tokio::test(start_paused = true)]
async fn a_failed_request_is_recorded_at_its_error() {
    let metrics = Metrics::new();
    let refused = || {
        Reply::error(|| Recognized::new(io::Error::other("refused"), Some(RetryReason::Connect)))
    };
    let client = metrics
        .layer(fixed(3, 100))
        .layer(Mock::new([refused(), refused(), refused()]));
    let request = Request::builder()
        .method(Method::from_bytes(b"PURGE").unwrap())
        .uri("/cache/item")
        .header("host", "cache.test:8080")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let error = client.oneshot(request).await.unwrap_err();
    assert!(error.is::<tower_http_retry::RetryError>(), "{error}");
    let all = metrics.collect();
    assert_eq!(all.keys().collect::<Vec<_>>(), [RETRIES, DELAY]);
    let expected = attrs(&[
        ("http.request.method", "_OTHER"),
        ("server.address", "cache.test"),
        ("server.port", "8080"),
    ]);
    let [retries] = all[RETRIES].points.as_slice() else {
        panic!()
    };
    assert_eq!((&retries.attributes, retries.sum), (&expected, 2.0));
    let [delay] = all[DELAY].points.as_slice() else {
        panic!()
    };
    assert_eq!(delay.attributes, expected);
    assert!((delay.sum - 0.2).abs() < 1e-9, "{}", delay.sum);
}

/// Several requests of one layer land in one data point per attribute set.
#[tokio::test(start_paused = true)]
async fn requests_add_up_per_attribute_set() {
    let metrics = Metrics::new();
    let layer = metrics.layer(fixed(3, 100));
    for (uri, script) in [
        ("http://api.test/a", &[503][..]),
        ("http://api.test/b", &[503, 503][..]),
        ("http://other.test:8080/", &[503][..]),
    ] {
        let client = layer.clone().layer(Mock::statuses(script));
        client.oneshot(get(uri)).await.unwrap();
    }
    let all = metrics.collect();
    let mut points = all[RETRIES].points.clone();
    points.sort_by(|a, b| a.attributes.cmp(&b.attributes));
    assert_eq!(points.len(), 2, "{points:?}");
    assert_eq!(points[0].attributes, attrs(&API_TEST));
    assert_eq!((points[0].count, points[0].sum), (2, 3.0));
    assert_eq!(points[0].buckets, [1, 1, 0, 0, 0, 0]);
    assert_eq!(points[1].attributes["server.address"], "other.test");
    assert_eq!(points[1].attributes["server.port"], "8080");
    assert_eq!((points[1].count, points[1].sum), (1, 1.0));
}

/// The attributes are named as the attempts' spans name them: an IPv6 address without its
/// brackets, the scheme's port when neither the URI nor `Host` has one, `QUERY` (in the
/// conventions' list) as it is.
#[tokio::test(start_paused = true)]
async fn attributes_agree_with_the_spans() {
    let metrics = Metrics::new();
    let layer = metrics.layer(fixed(2, 100));
    let ipv6 = get("http://[::1]:8080/a");
    let origin_form = Request::builder()
        .uri("/b")
        .header("host", "origin.test")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let query = Request::builder()
        .method(Method::from_bytes(b"QUERY").unwrap())
        .uri("https://search.test/c")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    for request in [ipv6, origin_form, query] {
        let client = layer.clone().layer(Mock::statuses(&[503]));
        client.oneshot(request).await.unwrap();
    }
    let all = metrics.collect();
    let mut got: Vec<_> = all[RETRIES]
        .points
        .iter()
        .map(|p| p.attributes.clone())
        .collect();
    got.sort();
    let mut expected = vec![
        attrs(&[
            ("http.request.method", "GET"),
            ("server.address", "::1"),
            ("server.port", "8080"),
        ]),
        attrs(&[
            ("http.request.method", "GET"),
            ("server.address", "origin.test"),
            ("server.port", "80"),
        ]),
        attrs(&[
            ("http.request.method", "QUERY"),
            ("server.address", "search.test"),
            ("server.port", "443"),
        ]),
    ];
    expected.sort();
    assert_eq!(got, expected);
}
