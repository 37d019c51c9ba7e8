//! gRPC retries for a tonic client, configured by a standard gRPC service config.
//!
//! Starts a tonic server on 127.0.0.1 that fails now and then (UNAVAILABLE, a pushback, a
//! code no policy retries, a slow answer), with a stand-in for a proxy in front of one
//! method that answers its first call with an HTTP 503 maintenance page (no `grpc-status`:
//! gRPC reads that as UNAVAILABLE). It builds the retry layer from a service config JSON in
//! one call (`RetryLayer::from_service_config`), puts it over a tonic `Channel`, and prints
//! what happened to each call: attempts, every wait and its reason, the outcome, and what
//! the server saw. Every call's record comes with its result: in a success's extensions,
//! and as the source of a failed call's `Status` (through `grpc::status_layer()`).
//!
//! The service has no `.proto`: its messages are plain bytes (a codec written below), so
//! the example needs no protobuf compiler. Any generated tonic client takes the same stack.
//!
//! Run with `cargo run -p tower-http-retry-grpc --example grpc`. It ends by itself in about a second.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::collections::HashMap;
use std::convert::Infallible;
use std::error::Error as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::metadata::MetadataValue;
use tonic::server::NamedService;
use tonic::{Code, Status};
use tower::{BoxError, Service, ServiceBuilder};
use tower_http_retry::hints::HintSource;
use tower_http_retry::{AttemptKind, RetryError, RetryInfo, RetryLayer};
use tower_http_retry_grpc as grpc;
use tower_http_retry_grpc::GrpcLayerExt;

/// The client's whole retry configuration, as a service owner would publish it.
const SERVICE_CONFIG: &str = r#"{
  "methodConfig": [
    {
      "name": [
        {"service": "demo.Shop", "method": "GetItem"},
        {"service": "demo.Shop", "method": "GetStock"}
      ],
      "timeout": "2s",
      "retryPolicy": {
        "maxAttempts": 4,
        "initialBackoff": "0.05s",
        "maxBackoff": "0.5s",
        "backoffMultiplier": 1.5,
        "retryableStatusCodes": ["UNAVAILABLE"]
      }
    },
    {"name": [{"service": "demo.Shop", "method": "Report"}], "timeout": "0.3s"},
    {"name": [{"service": "demo.Shop"}]}
  ],
  "retryThrottling": {"maxTokens": 20, "tokenRatio": 0.1}
}"#;

// ---- The server ----

/// Messages as plain bytes, both ways.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// What the server remembers: calls per method and message, and the
/// `grpc-previous-rpc-attempts` each call carried.
#[derive(Default)]
struct ServerLog {
    calls: HashMap<String, Vec<Option<String>>>,
    /// Calls of `GetStock` the proxy in front still answers with its maintenance page.
    maintenance: usize,
}

/// How the server answers the `n`th call (1 for the first) of `method` with `message`.
fn behaviour(method: &str, message: &str, n: usize) -> Result<String, Status> {
    let fail = |code, text: &str| Err(Status::new(code, text));
    match (method, message, n) {
        ("GetItem", "apple", 1 | 2) => fail(Code::Unavailable, "warming up"),
        ("GetItem", "pear", 1) => {
            let mut status = Status::unavailable("overloaded: come back in 200 ms");
            let pushback = MetadataValue::from_static("200");
            status
                .metadata_mut()
                .insert("grpc-retry-pushback-ms", pushback);
            Err(status)
        }
        ("GetItem", "plum", _) => fail(Code::NotFound, "no such item"),
        ("GetItem", "fig", _) => fail(Code::Unavailable, "the fig shelf is down"),
        ("PlaceOrder", _, 1) => fail(Code::ResourceExhausted, "order queue full"),
        _ => Ok(format!("{method}({message}): ok")),
    }
}

#[derive(Clone)]
struct Shop {
    log: Arc<Mutex<ServerLog>>,
}

impl NamedService for Shop {
    const NAME: &'static str = "demo.Shop";
}

impl Service<http::Request<tonic::body::Body>> for Shop {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let log = Arc::clone(&self.log);
        let method = request
            .uri()
            .path()
            .rsplit('/')
            .next()
            .unwrap_or("")
            .to_owned();
        if method == "GetStock" && take_maintenance(&log) {
            // What a proxy in maintenance answers: an HTML page, no gRPC at all.
            let page = tonic::body::Body::new(http_body_util::Full::new(Bytes::from_static(
                b"<html><body>Down for maintenance</body></html>",
            )));
            let response = http::Response::builder()
                .status(503)
                .header("content-type", "text/html")
                .body(page)
                .unwrap();
            return Box::pin(async move { Ok(response) });
        }
        let previous = request
            .headers()
            .get("grpc-previous-rpc-attempts")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // tonic's own unary handling: decoding, encoding, Trailers-Only errors.
        let handler = tower::service_fn(move |call: tonic::Request<Bytes>| {
            let message = String::from_utf8_lossy(call.get_ref()).into_owned();
            let key = format!("{method}({message})");
            let n = {
                let mut log = log.lock().unwrap();
                let calls = log.calls.entry(key).or_default();
                calls.push(previous.clone());
                calls.len()
            };
            let method = method.clone();
            async move {
                if method == "Report" {
                    // Slower than the method's timeout allows.
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                behaviour(&method, &message, n).map(|reply| tonic::Response::new(reply.into()))
            }
        });
        Box::pin(async move {
            Ok(tonic::server::Grpc::new(RawCodec)
                .unary(handler, request)
                .await)
        })
    }
}

/// Whether the proxy answers this call with its maintenance page (and one fewer after it).
fn take_maintenance(log: &Mutex<ServerLog>) -> bool {
    let mut log = log.lock().unwrap();
    let answer = log.maintenance > 0;
    log.maintenance = log.maintenance.saturating_sub(1);
    answer
}

async fn start_server(log: Arc<Mutex<ServerLog>>) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().unwrap();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(Shop { log })
            .serve_with_incoming(incoming),
    );
    addr
}

// ---- The client ----

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let log = Arc::new(Mutex::new(ServerLog {
        maintenance: 2,
        ..ServerLog::default()
    }));
    let addr = start_server(Arc::clone(&log)).await;
    println!("tower-http-retry gRPC demo: a flaky tonic server on http://{addr}\n");

    // The whole retry configuration in one call: a route and policy per methodConfig
    // name, the retryThrottling as the throttle every route shares.
    let config = grpc::service_config(SERVICE_CONFIG)?;
    let throttle = config.throttle().expect("the config throttles").clone();
    let max_tokens = f64::from(config.retry_throttling().expect("read").max_tokens);

    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let stack = ServiceBuilder::new()
        // A failed call's `Status`, with the call's own record as its source.
        .layer(grpc::status_layer())
        .layer(RetryLayer::from_service_config(&config))
        .layer(grpc::tonic_body_layer()) // the replayed body as tonic's body
        .service(channel);
    let mut client = tonic::client::Grpc::new(stack);

    let plan: [(&str, &str, &str); 7] = [
        ("GetItem", "apple", "UNAVAILABLE twice, then OK"),
        (
            "GetStock",
            "pears",
            "a proxy's HTTP 503 maintenance page twice (no grpc-status), then OK",
        ),
        (
            "GetItem",
            "pear",
            "UNAVAILABLE with grpc-retry-pushback-ms: 200, then OK",
        ),
        ("GetItem", "plum", "NOT_FOUND (not a retryable code)"),
        ("GetItem", "fig", "always UNAVAILABLE"),
        (
            "PlaceOrder",
            "2 figs",
            "RESOURCE_EXHAUSTED once (the method has no retryPolicy)",
        ),
        (
            "Report",
            "today",
            "answers after 1 s (the method's timeout, 0.3 s, is the call's deadline)",
        ),
    ];

    let started = Instant::now();
    let (mut succeeded, mut attempts, mut waited) = (0, 0, Duration::ZERO);
    for (method, message, behaviour) in plan {
        println!("{method}({message})  server: {behaviour}");
        let path = http::uri::PathAndQuery::try_from(format!("/demo.Shop/{method}"))?;
        let request = tonic::Request::new(Bytes::from(message));
        client.ready().await?;
        let t = Instant::now();
        let result = client.unary(request, path, RawCodec).await;
        let took = t.elapsed();
        // The call's own record: in a success's extensions, in a failure's source.
        let info = match &result {
            Ok(reply) => reply.extensions().get::<RetryInfo>(),
            Err(status) => status
                .source()
                .and_then(|e| e.downcast_ref::<RetryError>())
                .map(RetryError::info),
        }
        .cloned()
        .expect("every call through the stack has its record");
        match &result {
            Ok(reply) => {
                succeeded += 1;
                let text = String::from_utf8_lossy(reply.get_ref()).into_owned();
                println!(
                    "  -> OK {text:?} after {} in {took:.1?}",
                    plural(info.attempts())
                );
            }
            Err(status) => println!(
                "  -> {:?} \"{}\" after {} in {took:.1?}",
                status.code(),
                status.message(),
                plural(info.attempts())
            ),
        }
        report(&info, result.as_ref().err().map(Status::code));
        // None at all when the deadline passed before the server read the call.
        let seen = log
            .lock()
            .unwrap()
            .calls
            .get(&format!("{method}({message})"))
            .cloned()
            .unwrap_or_default();
        if seen.len() < info.attempts() as usize {
            println!(
                "     the proxy answered {} attempt(s) itself",
                info.attempts() as usize - seen.len()
            );
        }
        let previous: Vec<_> = seen.iter().map(|p| p.as_deref().unwrap_or("-")).collect();
        println!(
            "     server saw {} call(s); grpc-previous-rpc-attempts: {}",
            seen.len(),
            previous.join(", ")
        );
        attempts += info.attempts();
        waited += info.total_wait();
        println!();
    }
    println!(
        "summary: {} calls, {succeeded} succeeded, {attempts} attempts, {waited:.2?} spent waiting, {:.2?} in all",
        plan.len(),
        started.elapsed()
    );
    println!(
        "throttle: {:.1} of {} tokens left (retries stop at {} or below)",
        throttle.tokens(),
        max_tokens,
        max_tokens / 2.0
    );
    Ok(())
}

fn plural(attempts: u32) -> String {
    match attempts {
        1 => "1 attempt".to_string(),
        n => format!("{n} attempts"),
    }
}

/// Every retry with its wait, and why the layer stopped; `failed` is the failed call's code.
fn report(info: &RetryInfo, failed: Option<Code>) {
    for (i, retry) in info.retries().iter().enumerate() {
        let source = match (retry.kind == AttemptKind::Transparent, retry.hint) {
            (true, _) => "transparent: the stream never reached the server",
            (false, Some(HintSource::Header("grpc-retry-pushback-ms"))) => {
                "the server's pushback, exactly"
            }
            (false, Some(_)) => "a server hint",
            (false, None) => "A6 backoff, full jitter",
        };
        println!(
            "     retry {}: after {}, waited {:.1?} ({source})",
            i + 1,
            retry.reason,
            retry.wait
        );
    }
    let verdict = match (info.retries().len(), failed) {
        (_, None) => "done".to_string(),
        // The layer sent the time left as `grpc-timeout`; the channel enforces it too, and
        // whichever timer fires first ends the call.
        (_, Some(Code::DeadlineExceeded)) => "out of time: the deadline passed".to_string(),
        (0, Some(_)) => format!("not retried: {}", info.stop()),
        (_, Some(_)) => format!("gave up: {}", info.stop()),
    };
    println!("     {verdict}");
}
