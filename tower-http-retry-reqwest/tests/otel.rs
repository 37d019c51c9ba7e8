//! The core's `opentelemetry` feature through reqwest: each attempt a CLIENT span exported
//! by tracing-opentelemetry (the SDK's in-memory exporter), and that attempt's
//! `traceparent` in the request a real hyper server on 127.0.0.1 receives, through
//! `ReqwestService`, `RequestBuilderExt::send_with` and `RetryMiddleware` (which converts
//! every attempt to an `http::Request` and back).
//!
//! Alone in its binary: it sets the process's global text-map propagator. Each test sets
//! its own subscriber on its thread, and runs on a current-thread runtime, so that every
//! span it makes (reqwest's connection tasks included) is seen by its subscriber alone.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use bytes::Bytes;
use common::server::{Server, serve_failing_first};
use http_body_util::Full;
use opentelemetry::trace::{SpanId, SpanKind, TraceId, TracerProvider as _};
use opentelemetry::{Value, global};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use reqwest_middleware::ClientBuilder;
use tower::{Layer, ServiceExt};
use tower_http_retry::{Backoff, Jitter, RetryLayer, RetryPolicy};
use tower_http_retry_reqwest::{RequestBuilderExt, ReqwestService, RetryMiddleware};
use tracing_subscriber::layer::SubscriberExt;

/// A caller's own `traceparent`, which every attempt's replaces.
const CALLERS: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

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
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("reqwest_otel"));
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
}

/// A client that never asks a proxy: every request goes straight to 127.0.0.1.
fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn quick() -> RetryLayer {
    RetryLayer::new().policy(
        RetryPolicy::default().max_attempts(2).backoff(
            Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
                .jitter(Jitter::None),
        ),
    )
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

/// After a 503 and a 200: two CLIENT spans, children of the request's span in one trace,
/// the second with `http.request.resend_count` 1; each attempt reached the server with one
/// `traceparent`, its own span's, never the caller's.
fn check(otel: &Otel, server: &Server) {
    let spans = otel.spans();
    let logical = spans
        .iter()
        .find(|s| s.name == "http_retry")
        .unwrap_or_else(|| panic!("no request span in {spans:#?}"));
    let mut attempts: Vec<_> = spans
        .iter()
        .filter(|s| s.span_kind == SpanKind::Client)
        .collect();
    attempts.sort_by_key(|s| s.start_time);
    assert_eq!(attempts.len(), 2, "{attempts:#?}");
    let trace = logical.span_context.trace_id();
    let resends = |span: &SpanData| {
        let found = span
            .attributes
            .iter()
            .find(|kv| kv.key.as_str() == "http.request.resend_count");
        found.map(|kv| kv.value.clone())
    };
    assert_eq!(resends(attempts[0]), None);
    assert_eq!(resends(attempts[1]), Some(Value::I64(1)));

    let hits = server.hits();
    assert_eq!(hits.len(), 2);
    let mut sent = Vec::new();
    for (i, (hit, span)) in hits.iter().zip(&attempts).enumerate() {
        assert_eq!(span.parent_span_id, logical.span_context.span_id());
        let all: Vec<_> = hit.headers.get_all("traceparent").iter().collect();
        assert_eq!(all.len(), 1, "attempt {}: {all:?}", i + 1);
        assert_ne!(all[0], CALLERS, "attempt {}", i + 1);
        assert_eq!(traceparent(all[0]), (trace, span.span_context.span_id()));
        sent.push(all[0].clone());
    }
    assert_ne!(sent[0], sent[1]);
}

async fn through_the_service(callers: bool) {
    let otel = Otel::new();
    let server = serve_failing_first(1, 503, 200).await;
    let svc = quick().layer(ReqwestService::new(client()));
    let mut request = http::Request::get(server.url("/items"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    if callers {
        let value = http::HeaderValue::from_static(CALLERS);
        request.headers_mut().insert("traceparent", value);
    }
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 200);
    drop(response);
    check(&otel, &server);
}

async fn through_the_middleware(callers: bool) {
    let otel = Otel::new();
    let server = serve_failing_first(1, 503, 200).await;
    let client = ClientBuilder::new(client())
        .with(RetryMiddleware::new(quick()))
        .build();
    let mut request = client.get(server.url("/items"));
    if callers {
        request = request.header("traceparent", CALLERS);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    drop(response);
    check(&otel, &server);
}

#[tokio::test(flavor = "current_thread")]
async fn each_attempt_carries_its_spans_traceparent_through_reqwest_service() {
    through_the_service(false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_callers_traceparent_is_replaced_through_reqwest_service() {
    through_the_service(true).await;
}

#[tokio::test(flavor = "current_thread")]
async fn each_attempt_carries_its_spans_traceparent_through_send_with() {
    let otel = Otel::new();
    let server = serve_failing_first(1, 503, 200).await;
    let client = client();
    let svc = quick().layer(ReqwestService::new(client.clone()));
    let response = client
        .get(server.url("/items"))
        .header("traceparent", CALLERS)
        .send_with(&svc)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    drop(response);
    check(&otel, &server);
}

#[tokio::test(flavor = "current_thread")]
async fn each_attempt_carries_its_spans_traceparent_through_retry_middleware() {
    through_the_middleware(false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn the_callers_traceparent_is_replaced_through_retry_middleware() {
    through_the_middleware(true).await;
}
