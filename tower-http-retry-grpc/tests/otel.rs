//! The `opentelemetry` feature: gRPC's retry metrics against A96's table (grpc/proposal
//! `A96-retry-otel-stats.md` at commit 1fd061ad8e7c46422b326e5a60cf68d042476205; the
//! latency boundaries are A66's, same commit), recorded by the status layer over a tonic
//! `Channel` to a tonic server on 127.0.0.1: names, units, descriptions (grpc-java's),
//! attributes, boundaries, values, and nothing for a call that was not retried. Read back
//! through the SDK's in-memory exporter, from a provider of each test's own.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, HistogramDataPoint, MetricData};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use tonic::Code;
use tower::ServiceBuilder;
use tower_http_retry::{RetryLayer, RetryPolicy};
use tower_http_retry_grpc::{self as grpc, GrpcLayerExt};

use common::grpc::{GrpcServer, Step, UNARY, quick, unary};

const RETRIES: &str = "grpc.client.call.retries";
const TRANSPARENT: &str = "grpc.client.call.transparent_retries";
const HEDGES: &str = "grpc.client.call.hedges";
const DELAY: &str = "grpc.client.call.retry_delay";

/// A96's table: name, unit, description (as grpc-java ships it), boundaries.
fn a96(name: &str) -> (&'static str, &'static str, Vec<f64>) {
    match name {
        RETRIES => (
            "{retry}",
            "Number of retries during the client call. If there were no retries, 0 is not \
             reported.",
            vec![1.0, 2.0, 3.0, 4.0, 5.0],
        ),
        TRANSPARENT => (
            "{transparent_retry}",
            "Number of transparent retries during the client call. If there were no \
             transparent retries, 0 is not reported.",
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 10.0],
        ),
        HEDGES => (
            "{hedge}",
            "Number of hedges during the client call. If there were no hedges, 0 is not \
             reported.",
            vec![1.0, 2.0, 3.0, 4.0, 5.0],
        ),
        DELAY => (
            "s",
            "Total time of delay while there is no active attempt during the client call",
            vec![
                0.0, 0.00001, 0.00005, 0.0001, 0.0003, 0.0006, 0.0008, 0.001, 0.002, 0.003, 0.004,
                0.005, 0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065,
                0.08, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0,
                20.0, 50.0, 100.0,
            ],
        ),
        _ => panic!("not in A96: {name}"),
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Point {
    attributes: BTreeMap<String, String>,
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

fn point<T: Copy>(name: &str, p: &HistogramDataPoint<T>, sum: impl Fn(T) -> f64) -> Point {
    // Every data point has A96's boundaries.
    assert_eq!(p.bounds().collect::<Vec<_>>(), a96(name).2, "{name}");
    Point {
        attributes: p
            .attributes()
            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect(),
        buckets: p.bucket_counts().collect(),
        count: p.count(),
        sum: sum(p.sum()),
    }
}

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

    fn status_layer(&self, target: &str) -> grpc::StatusLayer {
        let meter = self.provider.meter("tower-http-retry-grpc");
        grpc::status_layer().otel_meter(meter, target)
    }

    /// Every instrument with data, by name, its unit and description checked against A96.
    fn collect(&self) -> BTreeMap<String, Vec<Point>> {
        self.provider.force_flush().unwrap();
        let mut all = BTreeMap::new();
        let exported = self.exporter.get_finished_metrics().unwrap();
        let Some(last) = exported.last() else {
            return all;
        };
        for scope in last.scope_metrics() {
            for metric in scope.metrics() {
                let name = metric.name();
                let points: Vec<Point> = match metric.data() {
                    AggregatedMetrics::U64(MetricData::Histogram(h)) => h
                        .data_points()
                        .map(|p| point(name, p, |s| s as f64))
                        .collect(),
                    AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                        h.data_points().map(|p| point(name, p, |s| s)).collect()
                    }
                    other => panic!("{name} is not a histogram: {other:?}"),
                };
                if points.is_empty() {
                    continue;
                }
                let (unit, description, _) = a96(name);
                assert_eq!((metric.unit(), metric.description()), (unit, description));
                all.insert(name.to_owned(), points);
            }
        }
        all
    }
}

fn attributes(server: &GrpcServer) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("grpc.method".to_owned(), "test.Raw/Unary".to_owned()),
        ("grpc.target".to_owned(), format!("dns:///{}", server.addr)),
    ])
}

/// UNAVAILABLE twice, then OK: 2 retries, and the backoff's 1 + 2 ms at least without an
/// attempt in flight; no transparent retry or hedge recorded.
#[tokio::test]
async fn a_retried_call_records_its_retries_and_delay() {
    let server =
        GrpcServer::start([Step::Fail(Code::Unavailable), Step::Fail(Code::Unavailable)]).await;
    let metrics = Metrics::new();
    let stack = ServiceBuilder::new()
        .layer(metrics.status_layer(&server.uri()))
        .layer(RetryLayer::new().policy(quick()))
        .layer(grpc::tonic_body_layer())
        .service(server.channel().await);
    unary(stack, UNARY, b"x").await.unwrap();

    let all = metrics.collect();
    assert_eq!(all.keys().collect::<Vec<_>>(), [RETRIES, DELAY]);
    assert_eq!(
        all[RETRIES],
        [Point {
            attributes: attributes(&server),
            buckets: vec![0, 1, 0, 0, 0, 0],
            count: 1,
            sum: 2.0,
        }]
    );
    let [delay] = all[DELAY].as_slice() else {
        panic!("{:?}", all[DELAY])
    };
    assert_eq!((&delay.attributes, delay.count), (&attributes(&server), 1));
    assert!(delay.sum >= 0.003, "{}", delay.sum);
}

/// A call that fails for good (its status made by the status layer from the last
/// Trailers-Only answer) is recorded from the record in that status: 3 retries.
#[tokio::test]
async fn a_failed_call_is_recorded() {
    let server = GrpcServer::start(std::iter::repeat_n(Step::Fail(Code::Unavailable), 4)).await;
    let metrics = Metrics::new();
    let stack = ServiceBuilder::new()
        .layer(metrics.status_layer("localhost:50051"))
        .layer(RetryLayer::new().policy(quick()))
        .layer(grpc::tonic_body_layer())
        .service(server.channel().await);
    let status = unary(stack, UNARY, b"x").await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let all = metrics.collect();
    assert_eq!(all.keys().collect::<Vec<_>>(), [RETRIES, DELAY]);
    let [retries] = all[RETRIES].as_slice() else {
        panic!()
    };
    assert_eq!(retries.attributes["grpc.target"], "dns:///localhost:50051");
    assert_eq!((retries.count, retries.sum), (1, 3.0));
    assert_eq!(retries.buckets, [0, 0, 1, 0, 0, 0]);
}

/// A call answered OK at once records nothing in any of the four: 0 is not reported, nor
/// a delay without a retry. The same stack then records a retried call.
#[tokio::test]
async fn a_call_not_retried_records_nothing() {
    let server = GrpcServer::start([Step::Ok, Step::Fail(Code::NotFound)]).await;
    let metrics = Metrics::new();
    let stack = ServiceBuilder::new()
        .layer(metrics.status_layer(&server.uri()))
        .layer(RetryLayer::new().policy(quick()))
        .layer(grpc::tonic_body_layer())
        .service(server.channel().await);
    unary(stack.clone(), UNARY, b"x").await.unwrap();
    let status = unary(stack.clone(), UNARY, b"x").await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(metrics.collect().is_empty(), "{:?}", metrics.collect());

    server.push([Step::Fail(Code::Unavailable)]);
    unary(stack, UNARY, b"x").await.unwrap();
    let all = metrics.collect();
    assert_eq!(all.keys().collect::<Vec<_>>(), [RETRIES, DELAY]);
}

/// A hedging policy from a service config: the first attempt is slow, the hedge answers;
/// one hedge, no retry. The hedge overlapped the first attempt, so the delay is 0.
#[tokio::test]
async fn a_hedged_call_records_its_hedge() {
    let slow = Step::Slow(Duration::from_secs(2), Box::new(Step::Ok));
    let server = GrpcServer::start([slow, Step::Ok]).await;
    let config = grpc::service_config(
        r#"{"methodConfig": [{"name": [{"service": "test.Raw"}],
            "hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.05s"}}]}"#,
    )
    .unwrap();
    let metrics = Metrics::new();
    let stack = ServiceBuilder::new()
        .layer(metrics.status_layer(&server.uri()))
        .layer(RetryLayer::from_service_config(&config).policy(RetryPolicy::new().no_gates()))
        .layer(grpc::tonic_body_layer())
        .service(server.channel().await);
    unary(stack, UNARY, b"x").await.unwrap();
    let all = metrics.collect();
    assert_eq!(all.keys().collect::<Vec<_>>(), [HEDGES, DELAY]);
    assert_eq!(
        all[HEDGES],
        [Point {
            attributes: attributes(&server),
            buckets: vec![1, 0, 0, 0, 0, 0],
            count: 1,
            sum: 1.0,
        }]
    );
    let [delay] = all[DELAY].as_slice() else {
        panic!()
    };
    assert_eq!((delay.count, delay.sum, delay.buckets[0]), (1, 0.0, 1));
}

/// A stream the server refused before it left is sent again at once: a transparent retry,
/// counted apart, with no delay recorded for it alone. (A scripted channel: a real server
/// refuses streams only past its concurrency limit.)
#[tokio::test]
async fn a_transparent_retry_is_counted_apart() {
    use tower_http_retry::classify::{Recognized, RetryReason};
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let channel = tower::service_fn(move |_: http::Request<tonic::body::Body>| {
        let first = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        async move {
            if first {
                let refused = Recognized::new(
                    std::io::Error::other("stream refused"),
                    Some(RetryReason::RefusedStream),
                );
                return Err(tower::BoxError::from(refused));
            }
            let mut response = http::Response::new(tonic::body::Body::empty());
            response
                .headers_mut()
                .insert("grpc-status", "0".parse().unwrap());
            Ok(response)
        }
    });
    let metrics = Metrics::new();
    let stack = ServiceBuilder::new()
        .layer(metrics.status_layer("dns:///shop.internal:443"))
        .layer(RetryLayer::grpc())
        .layer(grpc::tonic_body_layer())
        .service(channel);
    let request = http::Request::post("/shop.Cart/Get")
        .body(tonic::body::Body::empty())
        .unwrap();
    tower::ServiceExt::oneshot(stack, request).await.unwrap();
    let all = metrics.collect();
    assert_eq!(all.keys().collect::<Vec<_>>(), [TRANSPARENT]);
    assert_eq!(
        all[TRANSPARENT],
        [Point {
            attributes: BTreeMap::from([
                ("grpc.method".to_owned(), "shop.Cart/Get".to_owned()),
                (
                    "grpc.target".to_owned(),
                    "dns:///shop.internal:443".to_owned()
                ),
            ]),
            buckets: vec![1, 0, 0, 0, 0, 0, 0],
            count: 1,
            sum: 1.0,
        }]
    );
}
