//! The layer at work against a flaky server on 127.0.0.1.
//!
//! Starts a local hyper server that fails in the ways real servers fail (503s, dropped
//! connections, `Retry-After`, a 429 with a `RateLimit` field, a 404, a long maintenance
//! window), sends GET, PUT and POST
//! requests through a hyper-util client wrapped in `RetryLayer`, and prints what happened to
//! each: attempts, every wait and its reason, the idempotency key, the outcome.
//!
//! Run with `cargo run --example demo`. It ends by itself in a few seconds.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_http_retry::{IdempotencyKey, RetryInfo, RetryLayer, RetryPolicy, RouteMatch};

/// What the flaky server remembers: attempts per path, and the work done per key.
#[derive(Default)]
struct ServerState {
    attempts: HashMap<String, u32>,
    applied: HashMap<String, u32>,
}

enum Answer {
    Status(u16, Option<&'static str>),
    /// Drop the connection without answering.
    Hangup,
    /// 429 with this `RateLimit` field (nothing left until the window resets).
    RateLimited(&'static str),
}

fn route(state: &mut ServerState, method: &Method, path: &str, key: Option<String>) -> Answer {
    let n = {
        let n = state
            .attempts
            .entry(format!("{method} {path}"))
            .or_default();
        *n += 1;
        *n
    };
    match (method.as_str(), path) {
        ("GET", "/flaky") if n <= 2 => Answer::Status(503, None),
        ("GET", "/reset") if n == 1 => Answer::Hangup,
        ("PUT", "/items/7") if n == 1 => Answer::Status(503, Some("1")),
        ("GET", "/search") if n == 1 => Answer::RateLimited("\"default\";r=0;t=1"),
        ("GET", "/down") => Answer::Status(503, None),
        ("GET", "/maintenance") => Answer::Status(503, Some("3600")),
        ("GET", "/missing") => Answer::Status(404, None),
        ("POST", "/orders") => {
            // Stores the work per key: a repeated key gets the stored answer.
            let Some(key) = key else {
                return Answer::Status(400, None);
            };
            match state.applied.entry(key) {
                // A repeat of a key already applied: answer from the stored result.
                Entry::Occupied(_) => Answer::Status(201, None),
                // The order is placed, then the connection dies before the answer.
                Entry::Vacant(slot) => {
                    slot.insert(1);
                    Answer::Hangup
                }
            }
        }
        ("POST", "/legacy") => Answer::Status(503, None),
        _ => Answer::Status(200, None),
    }
}

async fn start_server(state: Arc<Mutex<ServerState>>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let state = Arc::clone(&state);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let state = Arc::clone(&state);
                    async move {
                        let key = req
                            .headers()
                            .get("idempotency-key")
                            .and_then(|k| k.to_str().ok())
                            .map(str::to_owned);
                        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
                        let _ = req.into_body().collect().await;
                        let answer = route(&mut state.lock().unwrap(), &method, &path, key);
                        match answer {
                            Answer::Hangup => Err(std::io::Error::other("hang up")),
                            Answer::RateLimited(field) => Ok(Response::builder()
                                .status(429)
                                .header("ratelimit-policy", "\"default\";q=10;w=1")
                                .header("ratelimit", field)
                                .body(Full::new(Bytes::new()))
                                .unwrap()),
                            Answer::Status(code, retry_after) => {
                                let mut response = Response::builder().status(code);
                                if let Some(seconds) = retry_after {
                                    response = response.header("retry-after", seconds);
                                }
                                Ok(response.body(Full::new(Bytes::new())).unwrap())
                            }
                        }
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

struct Tally {
    requests: u32,
    succeeded: u32,
    attempts: u32,
    retries: usize,
    waited: Duration,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let state = Arc::new(Mutex::new(ServerState::default()));
    let addr = start_server(Arc::clone(&state)).await;
    println!("tower-http-retry demo: a flaky server on http://{addr}\n");

    let policy = RetryPolicy::new()
        .max_attempts(3)
        .deadline(Duration::from_secs(5))
        .attempt_timeout(Duration::from_secs(2));
    let hyper_client = Client::builder(TokioExecutor::new()).build_http();
    let client = ServiceBuilder::new()
        .layer(
            RetryLayer::new()
                .policy(policy)
                // The orders API de-duplicates on `Idempotency-Key`: keys on for it alone,
                // with the layer's attempts, deadline and timeout. Every other POST goes
                // without one and is not repeated after a failure the server may have
                // acted on.
                .route(
                    RouteMatch::post().path_prefix("/orders"),
                    RetryPolicy::new().idempotency_key(IdempotencyKey::default()),
                ),
        )
        .service(hyper_client);

    let plan: [(Method, &str, &str); 9] = [
        (Method::GET, "/flaky", "503 twice, then 200"),
        (Method::GET, "/reset", "drops the connection once"),
        (Method::PUT, "/items/7", "503 with Retry-After: 1, then 200"),
        (
            Method::GET,
            "/search",
            "429 with RateLimit: \"default\";r=0;t=1, then 200",
        ),
        (
            Method::POST,
            "/orders",
            "does the work, then drops the connection",
        ),
        (Method::GET, "/missing", "404"),
        (Method::GET, "/down", "always 503"),
        (Method::GET, "/maintenance", "503 with Retry-After: 3600"),
        (
            Method::POST,
            "/legacy",
            "503; a POST without a key may have been applied",
        ),
    ];

    let mut tally = Tally {
        requests: 0,
        succeeded: 0,
        attempts: 0,
        retries: 0,
        waited: Duration::ZERO,
    };
    let started = Instant::now();
    for (method, path, behaviour) in plan {
        let request = Request::builder()
            .method(method.clone())
            .uri(format!("http://{addr}{path}"))
            .body(Full::new(Bytes::from_static(b"{\"qty\":1}")))?;
        let t = Instant::now();
        let result = client.clone().ready().await?.call(request).await;
        let took = t.elapsed();
        tally.requests += 1;
        println!("{:<4} {path:<13} server: {behaviour}", method.as_str());
        match result {
            Ok(response) => {
                let status = response.status();
                let info = response
                    .extensions()
                    .get::<RetryInfo>()
                    .cloned()
                    .unwrap_or_default();
                tally.attempts += info.attempts();
                tally.retries += info.retries().len();
                tally.waited += info.total_wait();
                if status.is_success() {
                    tally.succeeded += 1;
                }
                report(status, &info, took);
                if let Some(key) = &info.idempotency_key() {
                    let applied = state
                        .lock()
                        .unwrap()
                        .applied
                        .get(key.to_str().unwrap_or_default())
                        .copied()
                        .unwrap_or(0);
                    println!(
                        "     the key was on every attempt; the server applied the order {applied} time(s)"
                    );
                    if info.attempts() > 1 && applied == 1 {
                        println!(
                            "     (the retry was answered from the stored result, not applied again)"
                        );
                    }
                }
            }
            Err(error) => {
                println!("  -> error after {took:.1?}: {error}");
            }
        }
        println!();
    }
    println!(
        "summary: {} requests, {} succeeded, {} attempts, {} retries, {:.2?} spent waiting, {:.2?} in all",
        tally.requests,
        tally.succeeded,
        tally.attempts,
        tally.retries,
        tally.waited,
        started.elapsed()
    );
    Ok(())
}

/// The status and the time, then the record (`RetryInfo`'s `{:#}`: the attempts and what
/// each got, every retry's reason and wait, why the layer stopped, the key), indented.
fn report(status: StatusCode, info: &RetryInfo, took: Duration) {
    println!("  -> {status} in {took:.1?}");
    for line in format!("{info:#}").lines() {
        println!("     {line}");
    }
}
