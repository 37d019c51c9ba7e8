//! A download that survives broken connections: the resumable layer at work.
//!
//! Starts a local hyper server with one 8 MiB file (a strong `ETag`, `Range` and
//! `If-Range` answered as RFC 9110 says), and in front of it a proxy that cuts every
//! connection after a random number of bytes. A hyper-util client wrapped in
//! `RetryLayer::new().resume()` downloads the file through the proxy, drawing a progress bar
//! and printing each continuation: why, after how many bytes, the `Range` it asked for and
//! what the server answered. At the end it checks the bytes against the file.
//!
//! Run with `cargo run --example download`. It ends by itself in a few seconds.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tower::{Layer, ServiceExt};
use tower_http_retry::{
    Backoff, Jitter, ReplayBody, ResumeInfo, RetryError, RetryLayer, RetryPolicy,
};

const SIZE: usize = 8 << 20;
const ETAG: &str = "\"v1-8m\"";

/// The file: a pattern whose every position differs from its neighbours', so a splice
/// would show.
fn file() -> Bytes {
    (0..SIZE)
        .map(|i| (i % 251) as u8 ^ (i / 251 % 7) as u8)
        .collect::<Vec<_>>()
        .into()
}

/// The answer to a GET of the file: 200, or 206 to `Range: bytes=a-` / `bytes=a-b` when
/// `If-Range` (if sent) is the current `ETag`.
fn answer(file: &Bytes, headers: &HeaderMap) -> Response<Full<Bytes>> {
    let len = file.len();
    let if_range_holds = headers
        .get(header::IF_RANGE)
        .is_none_or(|validator| validator == ETAG);
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("bytes="))
        .and_then(|v| v.split_once('-'))
        .and_then(|(a, b)| {
            let first: usize = a.parse().ok()?;
            let last: usize = if b.is_empty() {
                len - 1
            } else {
                b.parse().ok()?
            };
            Some((first, last.min(len - 1)))
        })
        .filter(|_| if_range_holds);
    let response = Response::builder()
        .header(header::ETAG, ETAG)
        .header(header::ACCEPT_RANGES, "bytes");
    match range {
        Some((first, _)) if first >= len => response
            .status(StatusCode::RANGE_NOT_SATISFIABLE)
            .header(header::CONTENT_RANGE, format!("bytes */{len}"))
            .body(Full::new(Bytes::new())),
        Some((first, last)) => response
            .status(StatusCode::PARTIAL_CONTENT)
            .header(header::CONTENT_RANGE, format!("bytes {first}-{last}/{len}"))
            .body(Full::new(file.slice(first..=last))),
        None => response.body(Full::new(file.clone())),
    }
    .expect("a valid response")
}

/// The `Range` and `If-Range` of every request the server saw.
type Seen = Arc<Mutex<Vec<String>>>;

async fn start_server(file: Bytes, seen: Seen) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (file, seen) = (file.clone(), Arc::clone(&seen));
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let field = |name: header::HeaderName| {
                        req.headers()
                            .get(&name)
                            .and_then(|v| v.to_str().ok())
                            .map(|v| format!("{name}: {v}"))
                    };
                    let asked = [field(header::RANGE), field(header::IF_RANGE)];
                    let asked: Vec<String> = asked.into_iter().flatten().collect();
                    seen.lock().unwrap().push(asked.join(", "));
                    let response = answer(&file, req.headers());
                    async move { Ok::<_, std::convert::Infallible>(response) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// A proxy in front of `upstream` that lets each connection carry a random 1-3 MiB of the
/// server's answer, then cuts it (both ways), as an idle-timeout proxy or a flaky network
/// would.
async fn start_cutting_proxy(upstream: SocketAddr, seed: u64) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().unwrap();
    let rng = Arc::new(Mutex::new(seed));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let budget = (1 << 20) + next(&rng) % (2 << 20);
            tokio::spawn(relay(client, upstream, budget));
        }
    });
    addr
}

/// SplitMix64: a seeded draw, so every run cuts at the same places.
fn next(state: &Mutex<u64>) -> usize {
    let mut s = state.lock().unwrap();
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) as usize
}

/// Copies the request up and at most `budget` bytes of the answer down, then drops both.
async fn relay(client: TcpStream, upstream: SocketAddr, mut budget: usize) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
    });
    let mut buffer = vec![0u8; 64 * 1024];
    while budget > 0 {
        let want = buffer.len().min(budget);
        match server_read.read(&mut buffer[..want]).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if client_write.write_all(&buffer[..n]).await.is_err() {
                    break;
                }
                budget -= n;
            }
        }
    }
    up.abort();
}

const WIDTH: usize = 40;

fn progress(done: usize, total: usize, continuations: usize) {
    let filled = done * WIDTH / total;
    print!(
        "\r  [{}{}] {:>5.1} MiB / {:.1} MiB, {continuations} continuation(s)",
        "#".repeat(filled),
        " ".repeat(WIDTH - filled),
        done as f64 / (1 << 20) as f64,
        total as f64 / (1 << 20) as f64,
    );
    let _ = std::io::stdout().flush();
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let content = file();
    let seen = Seen::default();
    let server = start_server(content.clone(), Arc::clone(&seen)).await;
    let proxy = start_cutting_proxy(server, 7).await;
    println!("tower-http-retry download: an 8 MiB file on http://{server}, behind a proxy on");
    println!("http://{proxy} that cuts every connection after 1 to 3 MiB\n");

    let hyper_client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build_http::<ReplayBody<Empty<Bytes>>>();
    let client = RetryLayer::new()
        .resume()
        .policy(
            RetryPolicy::new()
                .max_continuations(10)
                .body_idle_timeout(Duration::from_secs(5))
                .backoff(
                    Backoff::exponential(Duration::from_millis(50), Duration::from_secs(1))
                        .jitter(Jitter::Full),
                ),
        )
        .layer(hyper_client);

    let started = Instant::now();
    let request = Request::get(format!("http://{proxy}/big.bin")).body(Empty::new())?;
    let response = client.oneshot(request).await?;
    let info = response
        .extensions()
        .get::<ResumeInfo>()
        .cloned()
        .expect("a 200 with a strong ETag can be continued");
    println!(
        "  {} {}",
        response.status(),
        response.headers()[header::ETAG].to_str()?
    );

    let mut body = response.into_body();
    let mut received = Vec::with_capacity(SIZE);
    let (mut shown, mut drawn) = (0, usize::MAX);
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                println!();
                if let Some(error) = error.downcast_ref::<RetryError>() {
                    println!("  not continued: {error}");
                }
                return Err(error);
            }
        };
        if let Ok(data) = frame.into_data() {
            received.extend_from_slice(&data);
        }
        let continuations = info.continuations();
        if continuations.len() > shown {
            let asked = seen.lock().unwrap().clone();
            for (n, continuation) in continuations.iter().enumerate().skip(shown) {
                // The server's request n + 1 is the continuation n (the first was the GET).
                let asked = asked.get(n + 1).map_or("", String::as_str);
                println!(
                    "\r  broke ({}), continued {:.0?} later with {asked}: {}{}",
                    continuation.reason,
                    continuation.wait,
                    continuation.outcome,
                    " ".repeat(16),
                );
            }
            shown = continuations.len();
            drawn = usize::MAX;
        }
        // Redrawn when the bar grows, or after a continuation line.
        if received.len() * WIDTH / SIZE != drawn {
            drawn = received.len() * WIDTH / SIZE;
            progress(received.len(), SIZE, shown);
        }
    }
    println!();

    let whole = received == content;
    println!(
        "\n  {} bytes in {:.2?}, {shown} continuation(s); the same bytes as the file: {whole}",
        received.len(),
        started.elapsed(),
    );
    if !whole {
        return Err("the download differs from the file".into());
    }
    Ok(())
}
