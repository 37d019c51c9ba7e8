//! The layer over a `reqwest::Client`.
//!
//! Starts a flaky hyper server on 127.0.0.1 and sends reqwest's own request builders
//! through `RetryLayer -> ReqwestService -> reqwest::Client` with `send_with`: a GET that
//! meets two 503s, a PUT with a streaming body whose first attempt loses its connection, a
//! POST that gets a generated `Idempotency-Key` and a 429 with `Retry-After`, and a GET
//! slower than the client's timeout once. Each request prints its attempts, waits and
//! reasons, and the body of the `reqwest::Response` it got back.
//!
//! Run with `cargo run -p tower-http-retry-reqwest --example reqwest`. It ends by itself in about
//! two seconds.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tower::{BoxError, ServiceBuilder};
use tower_http_retry::{Backoff, IdempotencyKey, RetryInfo, RetryLayer, RetryPolicy};
use tower_http_retry_reqwest::{RequestBuilderExt, ReqwestService};

/// Attempts per method and path; keys the POST handler has applied.
#[derive(Default)]
struct Seen {
    attempts: HashMap<String, u32>,
    applied: HashMap<String, u32>,
}

async fn start_server() -> std::io::Result<std::net::SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = Arc::clone(&seen);
                    answer(seen, req)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(addr)
}

async fn answer(
    seen: Arc<Mutex<Seen>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, BoxError> {
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|k| k.to_str().ok())
        .map(str::to_owned);
    let body = req.into_body().collect().await?.to_bytes();
    let n = {
        let mut seen = seen.lock().unwrap();
        let n = seen.attempts.entry(format!("{method} {path}")).or_default();
        *n += 1;
        *n
    };
    let reply = |status: u16, text: String| Response::builder().status(status).body(text.into());
    Ok(match (method, path.as_str()) {
        (Method::GET, "/flaky") if n <= 2 => reply(503, "busy".into())?,
        (Method::GET, "/flaky") => reply(200, "fine now".into())?,
        (Method::PUT, "/upload") if n == 1 => return Err("dropping the connection".into()),
        (Method::PUT, "/upload") => reply(200, format!("stored {} bytes", body.len()))?,
        (Method::POST, "/orders") if n == 1 => Response::builder()
            .status(429)
            .header("retry-after", "1")
            .body(Full::new(Bytes::new()))?,
        (Method::POST, "/orders") => {
            let Some(key) = key else {
                return Ok(reply(400, "an idempotency key is required".into())?);
            };
            let mut seen = seen.lock().unwrap();
            let applied = seen.applied.entry(key).or_default();
            *applied += 1;
            reply(201, format!("order applied {applied} time(s)"))?
        }
        (Method::GET, "/slow") if n == 1 => {
            tokio::time::sleep(Duration::from_millis(400)).await;
            reply(200, "late".into())?
        }
        (Method::GET, "/slow") => reply(200, "in time".into())?,
        _ => reply(404, "no such thing".into())?,
    })
}

/// A body of three chunks with no length, as an upload stream would be.
fn upload() -> reqwest::Body {
    let chunks = ["part one, ", "part two, ", "part three"]
        .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from_static(c.as_bytes()))));
    reqwest::Body::wrap(StreamBody::new(futures_util::stream::iter(chunks)))
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let addr = start_server().await?;
    println!("RetryLayer over reqwest::Client against http://{addr}\n");

    let client = reqwest::Client::builder()
        // Each attempt is its own `execute`: this is a per-attempt limit.
        .timeout(Duration::from_millis(200))
        // The server is on 127.0.0.1: no proxy from the environment in between.
        .no_proxy()
        .build()?;
    let service = ServiceBuilder::new()
        .layer(
            RetryLayer::new().policy(
                RetryPolicy::new()
                    .max_attempts(3)
                    .backoff(Backoff::exponential(
                        Duration::from_millis(50),
                        Duration::from_secs(1),
                    ))
                    .deadline(Duration::from_secs(5))
                    // This server de-duplicates its POSTs on the key.
                    .idempotency_key(IdempotencyKey::new()),
            ),
        )
        .service(ReqwestService::new(client.clone()));

    let url = |path: &str| format!("http://{addr}{path}");
    // reqwest's own builders, as an application already makes them.
    let requests = [
        (
            "GET /flaky",
            client.get(url("/flaky")),
            "503 twice, then 200",
        ),
        (
            "PUT /upload",
            client.put(url("/upload")).body(upload()),
            "drops the first connection (streaming body)",
        ),
        (
            "POST /orders",
            client
                .post(url("/orders"))
                .header("content-type", "application/json")
                .body("{\"sku\":7}"),
            "429 with Retry-After: 1, then applies the key",
        ),
        (
            "GET /slow",
            client.get(url("/slow")),
            "slower than the client's 200 ms timeout once",
        ),
    ];
    for (label, builder, behaviour) in requests {
        println!("{label:<13} server: {behaviour}");
        let start = Instant::now();
        // `.send()` would bypass the layer; `.send_with(&service)` goes through it.
        match builder.send_with(&service).await {
            Ok(response) => {
                let took = start.elapsed();
                let info = response.extensions().get::<RetryInfo>().cloned();
                let status = response.status();
                let text = response.text().await?;
                println!("  -> {status} \"{text}\" after {took:.1?}");
                if let Some(info) = info {
                    print_record(&info);
                }
            }
            Err(error) => {
                // reqwest's own error, one call away.
                let timeout = error.as_reqwest().is_some_and(|e| e.is_timeout());
                println!("  -> error (timeout: {timeout}): {error}");
                if let Some(info) = error.info() {
                    print_record(info);
                }
            }
        }
        println!();
    }
    Ok(())
}

/// The record (`RetryInfo`'s `{:#}`: the attempts and what each got, every retry's reason
/// and wait, why the layer stopped, the key), indented.
fn print_record(info: &RetryInfo) {
    for line in format!("{info:#}").lines() {
        println!("     {line}");
    }
}
