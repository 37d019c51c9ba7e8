//! Per-route retry policies.
//!
//! - Payments POSTs: the payments API de-duplicates on `Idempotency-Key`, so keys are on
//!   for this route alone; 5 attempts and a budget of their own, so a payments outage
//!   cannot drain the retries the rest of the traffic relies on.
//! - Search POSTs: `assume_idempotent(true)`: a POST-based query API, retried like a GET and
//!   sent without an idempotency key.
//! - GETs: the layer's policy (3 attempts) and its shared budget.
//! - Every route's policy is laid over the layer's: it inherits the layer's backoff,
//!   deadline and shared budget, and changes only what it sets.
//! - Health checks: `RetryPolicy::never()`: a health check that fails must say so at once.
//! - One request overrides its route with a policy in its extensions.
//!
//! Run with `cargo run --example per_route`. It ends by itself in about a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_http_retry::{
    Backoff, IdempotencyKey, RetryBudget, RetryInfo, RetryLayer, RetryPolicy, RouteMatch,
};

/// Payments fail three times per key before they go through; every item fails once; the
/// health check always fails.
async fn start_server() -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |req: Request<Incoming>| {
                        let seen = Arc::clone(&seen);
                        async move {
                            let key = req
                                .headers()
                                .get("idempotency-key")
                                .and_then(|k| k.to_str().ok())
                                .unwrap_or_default()
                                .to_owned();
                            let (method, path) =
                                (req.method().clone(), req.uri().path().to_owned());
                            let _ = req.into_body().collect().await;
                            let n = {
                                let mut seen = seen.lock().unwrap();
                                let n = seen.entry(format!("{method} {path} {key}")).or_default();
                                *n += 1;
                                *n
                            };
                            let status =
                                match (method, path.as_str()) {
                                    (Method::POST, p) if p.starts_with("/v1/payments") => {
                                        if n <= 3 { 503 } else { 201 }
                                    }
                                    // A keyed search would be a client bug here.
                                    (Method::POST, "/v1/search") if !key.is_empty() => 400,
                                    (Method::POST, "/v1/search") if n == 1 => 503,
                                    (Method::GET, "/health") => 503,
                                    (Method::GET, _) if n == 1 => 503,
                                    _ => 200,
                                };
                            Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::new()))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr = start_server().await?;
    println!("per-route policies against http://{addr}\n");

    let quick = Backoff::exponential(Duration::from_millis(10), Duration::from_millis(100));
    let shared = RetryBudget::builder()
        .ratio(0.1)
        .min_per_sec(10.0)
        .max_tokens(100.0)
        .build();
    let payments = RetryBudget::builder()
        .ratio(0.2)
        .min_per_sec(5.0)
        .max_tokens(20.0)
        .build();
    let layer = RetryLayer::new()
        .policy(
            RetryPolicy::new()
                .backoff(quick)
                .deadline(Duration::from_secs(2))
                .gate(shared.clone()),
        )
        // The layer's backoff and deadline; the payments budget in place of the shared one.
        .route(
            RouteMatch::post().path_prefix("/v1/payments"),
            RetryPolicy::new()
                .max_attempts(5)
                .gate(payments.clone())
                .idempotency_key(IdempotencyKey::default()),
        )
        .route(
            RouteMatch::post().path_prefix("/v1/search"),
            RetryPolicy::new().assume_idempotent(true),
        )
        .route(
            RouteMatch::get().path_prefix("/health"),
            RetryPolicy::never(),
        );
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut svc = ServiceBuilder::new().layer(layer).service(client);

    let mut plan: Vec<(&str, Request<Full<Bytes>>)> = Vec::new();
    for (route, method, path) in [
        (
            "payments route (keys, 5 attempts, own budget)",
            Method::POST,
            "/v1/payments",
        ),
        (
            "payments route (keys, 5 attempts, own budget)",
            Method::POST,
            "/v1/payments/refunds",
        ),
        (
            "search route (repeatable POST, no key)",
            Method::POST,
            "/v1/search",
        ),
        (
            "default policy (3 attempts, shared budget)",
            Method::GET,
            "/items/1",
        ),
        (
            "default policy (3 attempts, shared budget)",
            Method::GET,
            "/items/2",
        ),
        ("health route (never)", Method::GET, "/health"),
    ] {
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::from_static(b"{}")))?;
        plan.push((route, request));
    }
    let mut overridden =
        Request::get(format!("http://{addr}/items/3")).body(Full::new(Bytes::new()))?;
    overridden.extensions_mut().insert(RetryPolicy::never());
    plan.push(("request override: never() in its extensions", overridden));

    for (route, request) in plan {
        let line = format!("{} {}", request.method(), request.uri().path());
        let response = svc.ready().await?.call(request).await?;
        let info = response
            .extensions()
            .get::<RetryInfo>()
            .cloned()
            .unwrap_or_default();
        println!("{line:<28} {route}");
        let key = if info.idempotency_key().is_some() {
            "with a key"
        } else {
            "no key"
        };
        // The record's one-line summary: attempts, outcomes, waits, why it stopped.
        println!("    -> {}, {key}: {info}", response.status());
    }
    println!(
        "\nbudgets after the run: payments {:.1} tokens, shared {:.1} tokens (each route spent its own)",
        payments.tokens(),
        shared.tokens()
    );
    Ok(())
}
