//! The `opentelemetry` feature: a CLIENT span per attempt, exported through the real
//! OpenTelemetry SDK (its in-memory exporter) by tracing-opentelemetry, against a real
//! hyper server on 127.0.0.1 that records each attempt's `traceparent`.
//!
//! The expected names, kinds, attributes and types are those of the HTTP client span in
//! the OpenTelemetry semantic conventions v1.44.0 (open-telemetry/semantic-conventions tag
//! v1.44.0, commit e10a930844c6951757a43b849d364f7d056ac32b: `docs/http/http-spans.md`,
//! `model/http/spans.yaml`, and the `http`, `server`, `url`, `error` and `network`
//! registries): integers as `i64`, strings as strings.
//!
//! Alone in its binary: it sets the process's global text-map propagator. Each test sets
//! its own subscriber on its thread, and runs on a current-thread runtime, so that every
//! span it makes (the client's connection tasks included) is seen by its subscriber alone.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time
#![cfg(feature = "opentelemetry")]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use common::server::{client, client_h2, respond, serve, serve_h2};
use http::{Method, Request};
use http_body_util::Full;
use opentelemetry::trace::{SpanId, SpanKind, Status, TraceId, TracerProvider as _};
use opentelemetry::{Value, global};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tower::{Layer, ServiceExt};
use tower_http_retry::{Backoff, Hedging, Jitter, RetryLayer, RetryPolicy};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

/// The SDK's spans, exported as each ends, for the test's thread.
struct Otel {
    exporter: InMemorySpanExporter,
    _provider: SdkTracerProvider,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Otel {
    fn new() -> Self {
        global::set_text_map_propagator(TraceContextPropagator::new());
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        // Without the attributes tracing-opentelemetry adds of its own (code location,
        // thread, target, busy and idle times): the spans carry the conventions' alone.
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("otel_spans"))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false);
        let guard = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
        Otel {
            exporter,
            _provider: provider,
            _guard: guard,
        }
    }

    fn spans(&self) -> Vec<SpanData> {
        self.exporter.get_finished_spans().unwrap()
    }

    /// The exported attempt spans (kind CLIENT), in the order they started.
    fn attempts(&self) -> Vec<SpanData> {
        let mut attempts: Vec<_> = self
            .spans()
            .into_iter()
            .filter(|s| s.span_kind == SpanKind::Client)
            .collect();
        attempts.sort_by_key(|s| s.start_time);
        attempts
    }

    fn named(&self, name: &str) -> SpanData {
        let spans = self.spans();
        let found = spans.iter().find(|s| s.name == name);
        found
            .unwrap_or_else(|| panic!("no span {name} in {spans:?}"))
            .clone()
    }
}

/// A span's attributes by name.
fn attributes(span: &SpanData) -> BTreeMap<String, Value> {
    span.attributes
        .iter()
        .map(|kv| (kv.key.as_str().to_owned(), kv.value.clone()))
        .collect()
}

fn s(value: &str) -> Value {
    Value::String(value.to_owned().into())
}

fn quick(max_attempts: u32) -> RetryLayer {
    RetryLayer::new().policy(
        RetryPolicy::default().max_attempts(max_attempts).backoff(
            Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
                .jitter(Jitter::None),
        ),
    )
}

fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::new(Bytes::new())).unwrap()
}

/// A `traceparent` (W3C trace context, version 00): its trace id and span id.
fn traceparent(value: &http::HeaderValue) -> (TraceId, SpanId) {
    let parts: Vec<_> = value.to_str().unwrap().split('-').collect();
    assert_eq!((parts.len(), parts[0]), (4, "00"), "{value:?}");
    (
        TraceId::from_hex(parts[1]).unwrap(),
        SpanId::from_hex(parts[2]).unwrap(),
    )
}

/// What one attempt's span records beside the attributes every attempt shares.
struct Row {
    /// `http.response.status_code`.
    code: i64,
    /// `error.type`, if any.
    error: Option<&'static str>,
    /// `http.request.resend_count`, absent on the first attempt.
    resends: Option<i64>,
    /// `tower_http_retry.attempt.kind`, absent on the first attempt.
    kind: Option<&'static str>,
    /// Status `Error` (else unset).
    failed: bool,
}

/// 503, 503, then 200, over HTTP/1 or HTTP/2: three CLIENT spans, children of the
/// request's span, each as the conventions' table says, each the parent the server saw.
async fn three_attempts(h2: bool) {
    let otel = Otel::new();
    let handler = |hit: common::server::Hit| async move {
        if hit.index < 2 {
            respond(503)
        } else {
            respond(200)
        }
    };
    let server = match h2 {
        true => serve_h2(handler).await,
        false => serve(handler).await,
    };
    let svc = quick(3).layer(if h2 { client_h2() } else { client() });
    let mut request = get(&server.url("/items?token=secret"));
    // A caller's own `traceparent` is replaced on every attempt, never repeated.
    request.headers_mut().insert(
        "traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            .parse()
            .unwrap(),
    );
    let caller = tracing::info_span!("caller");
    let response = svc.oneshot(request).instrument(caller).await.unwrap();
    assert_eq!(response.status(), 200);
    drop(response);

    let caller = otel.named("caller");
    let logical = otel.named("http_retry");
    assert_eq!(logical.span_kind, SpanKind::Internal);
    assert_eq!(logical.parent_span_id, caller.span_context.span_id());
    let trace = caller.span_context.trace_id();

    let port = i64::from(server.addr.port());
    let url = format!("http://127.0.0.1:{port}/items");
    let version = if h2 { "2" } else { "1.1" };
    let common = [
        ("http.request.method", s("GET")),
        ("server.address", s("127.0.0.1")),
        ("server.port", Value::I64(port)),
        ("url.full", s(&url)),
        ("network.protocol.version", s(version)),
    ];
    let table = [
        Row {
            code: 503,
            error: Some("503"),
            resends: None,
            kind: None,
            failed: true,
        },
        Row {
            code: 503,
            error: Some("503"),
            resends: Some(1),
            kind: Some("retry"),
            failed: true,
        },
        Row {
            code: 200,
            error: None,
            resends: Some(2),
            kind: Some("retry"),
            failed: false,
        },
    ];
    let attempts = otel.attempts();
    assert_eq!(attempts.len(), 3, "{attempts:#?}");
    let hits = server.hits();
    assert_eq!(hits.len(), 3);
    for (i, (row, span)) in table.iter().zip(&attempts).enumerate() {
        assert_eq!(span.name, "GET", "attempt {}", i + 1);
        assert_eq!(span.span_kind, SpanKind::Client);
        assert_eq!(span.parent_span_id, logical.span_context.span_id());
        assert_eq!(span.span_context.trace_id(), trace);
        match row.failed {
            true => assert!(
                matches!(span.status, Status::Error { .. }),
                "{:?}",
                span.status
            ),
            false => assert_eq!(span.status, Status::Unset),
        }
        let mut expected: BTreeMap<String, Value> = common
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        expected.insert("http.response.status_code".into(), Value::I64(row.code));
        if let Some(error) = row.error {
            expected.insert("error.type".into(), s(error));
        }
        if let Some(resends) = row.resends {
            expected.insert("http.request.resend_count".into(), Value::I64(resends));
        }
        if let Some(kind) = row.kind {
            expected.insert("tower_http_retry.attempt.kind".into(), s(kind));
        }
        assert_eq!(attributes(span), expected, "attempt {}", i + 1);

        // The server saw this attempt's span as its parent, in the caller's trace.
        let sent: Vec<_> = hits[i].headers.get_all("traceparent").iter().collect();
        assert_eq!(sent.len(), 1, "attempt {}: {sent:?}", i + 1);
        assert_eq!(traceparent(sent[0]), (trace, span.span_context.span_id()));
    }
    let parents: Vec<_> = hits
        .iter()
        .map(|h| h.headers["traceparent"].clone())
        .collect();
    assert!(parents[0] != parents[1] && parents[1] != parents[2] && parents[0] != parents[2]);
}

#[tokio::test(flavor = "current_thread")]
async fn each_attempt_is_a_client_span_over_http1() {
    three_attempts(false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn each_attempt_is_a_client_span_over_http2() {
    three_attempts(true).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_hedge_is_marked_and_the_loser_ends_unset() {
    let otel = Otel::new();
    // The first attempt is answered long after the hedge; the hedge at once.
    let server = serve(|hit| async move {
        if hit.index == 0 {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        respond(200)
    })
    .await;
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .hedge(Hedging::after(Duration::from_millis(20)));
    let svc = RetryLayer::new().policy(policy).layer(client());
    let response = svc.oneshot(get(&server.url("/slow"))).await.unwrap();
    assert_eq!(response.status(), 200);
    drop(response);

    let attempts = otel.attempts();
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    let (loser, hedge) = (attributes(&attempts[0]), attributes(&attempts[1]));
    // Cancelled by the layer: no error, no status code, status unset.
    assert_eq!(attempts[0].status, Status::Unset);
    assert!(!loser.contains_key("error.type"), "{loser:?}");
    assert!(!loser.contains_key("http.response.status_code"));
    assert!(!loser.contains_key("http.request.resend_count"));
    assert_eq!(hedge["tower_http_retry.attempt.kind"], s("hedge"));
    assert_eq!(hedge["http.request.resend_count"], Value::I64(1));
    assert_eq!(hedge["http.response.status_code"], Value::I64(200));
    assert_eq!(attempts[1].status, Status::Unset);
    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    for (hit, span) in hits.iter().zip(&attempts) {
        assert_eq!(
            traceparent(&hit.headers["traceparent"]).1,
            span.span_context.span_id()
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_refused_connection_is_an_error_of_a_listed_type() {
    let otel = Otel::new();
    // A port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let svc = quick(2).layer(client());
    let url = format!("http://127.0.0.1:{port}/down");
    svc.oneshot(get(&url)).await.unwrap_err();

    let attempts = otel.attempts();
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    for span in &attempts {
        let attributes = attributes(span);
        assert!(
            matches!(span.status, Status::Error { .. }),
            "{:?}",
            span.status
        );
        assert_eq!(attributes["error.type"], s("connect"));
        assert_eq!(attributes["url.full"], s(&url));
        assert!(!attributes.contains_key("http.response.status_code"));
    }
    assert_eq!(
        attributes(&attempts[1])["http.request.resend_count"],
        Value::I64(1)
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_whole_url_has_its_secret_parameters_redacted() {
    let otel = Otel::new();
    let server = serve(|_| async { respond(200) }).await;
    let svc = quick(2).otel_full_url(true).layer(client());
    let path = "/f?X-Amz-Signature=abc&part=2&sig=s";
    svc.oneshot(get(&server.url(path))).await.unwrap();

    let attempts = otel.attempts();
    assert_eq!(attempts.len(), 1);
    let expected = format!(
        "http://127.0.0.1:{}/f?X-Amz-Signature=REDACTED&part=2&sig=REDACTED",
        server.addr.port()
    );
    assert_eq!(attributes(&attempts[0])["url.full"], s(&expected));
}

#[tokio::test(flavor = "current_thread")]
async fn an_unknown_method_is_other_and_its_span_is_named_http() {
    let otel = Otel::new();
    let server = serve(|_| async { respond(204) }).await;
    let svc = quick(2).layer(client());
    let request = Request::builder()
        .method(Method::from_bytes(b"PURGE").unwrap())
        .uri(server.url("/cache/a"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    svc.oneshot(request).await.unwrap();

    let attempts = otel.attempts();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].name, "HTTP");
    let attributes = attributes(&attempts[0]);
    assert_eq!(attributes["http.request.method"], s("_OTHER"));
    assert_eq!(attributes["http.request.method_original"], s("PURGE"));
    assert_eq!(attributes["http.response.status_code"], Value::I64(204));
    assert_eq!(attempts[0].status, Status::Unset);
    assert!(server.hits()[0].headers.contains_key("traceparent"));
}

#[tokio::test(flavor = "current_thread")]
async fn an_attempt_past_its_timeout_is_an_error_of_type_timeout() {
    let otel = Otel::new();
    // The first attempt is not answered within its timeout; the retry is, at once.
    let server = serve(|hit| async move {
        if hit.index == 0 {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        respond(200)
    })
    .await;
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .attempt_timeout(Duration::from_millis(50))
        .backoff(
            Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
                .jitter(Jitter::None),
        );
    let svc = RetryLayer::new().policy(policy).layer(client());
    let response = svc.oneshot(get(&server.url("/slow"))).await.unwrap();
    assert_eq!(response.status(), 200);
    drop(response);

    let attempts = otel.attempts();
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    let first = attributes(&attempts[0]);
    assert!(matches!(attempts[0].status, Status::Error { .. }));
    assert_eq!(first["error.type"], s("timeout"));
    assert!(!first.contains_key("http.response.status_code"));
    assert_eq!(
        attributes(&attempts[1])["http.response.status_code"],
        Value::I64(200)
    );
    assert_eq!(attempts[1].status, Status::Unset);
}

#[tokio::test(flavor = "current_thread")]
async fn a_body_continuation_is_an_attempt_span_of_its_own() {
    use http_body_util::{BodyExt, StreamBody};
    type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

    let otel = Otel::new();
    // The first body breaks after "hello "; the continuation answers `Range: bytes=6-`.
    let inner = tower::service_fn(
        |req: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| async move {
            assert!(req.headers().contains_key("traceparent"));
            let response = match req.headers().get("range") {
                None => {
                    let frames: Vec<Result<http_body::Frame<Bytes>, std::io::Error>> = vec![
                        Ok(http_body::Frame::data(Bytes::from_static(b"hello "))),
                        Err(std::io::ErrorKind::ConnectionReset.into()),
                    ];
                    http::Response::builder()
                        .header("etag", "\"v1\"")
                        .header("content-length", "11")
                        .body(StreamBody::new(futures_util::stream::iter(frames)).boxed())
                }
                Some(_) => http::Response::builder()
                    .status(206)
                    .header("etag", "\"v1\"")
                    .header("content-range", "bytes 6-10/11")
                    .body(
                        Full::new(Bytes::from_static(b"world"))
                            .map_err(|e| match e {})
                            .boxed(),
                    ),
            };
            Ok::<http::Response<Body>, std::convert::Infallible>(response.unwrap())
        },
    );
    let svc = RetryLayer::new().resume().layer(inner);
    let response = svc.oneshot(get("http://127.0.0.1:9/file")).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "hello world");

    let attempts = otel.attempts();
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    let continuation = attributes(&attempts[1]);
    assert_eq!(
        continuation["tower_http_retry.attempt.kind"],
        s("continuation")
    );
    assert_eq!(continuation["http.request.resend_count"], Value::I64(1));
    assert_eq!(continuation["http.response.status_code"], Value::I64(206));
    assert_eq!(attempts[1].status, Status::Unset);
    assert_eq!(
        attributes(&attempts[0])["http.response.status_code"],
        Value::I64(200)
    );
}
