//! The server of the wasm32 end-to-end test (tests/wasm.rs), natively: a hyper HTTP/1
//! server on 127.0.0.1 that answers each path's first request 503 with `Retry-After: 1`
//! and its second 200, with the time between the two arrivals as the server measured it
//! and the second request's body: `gap_ms=1003 body=hello`.
//!
//! It prints its address (`127.0.0.1:PORT`) as its first line, then serves until it has
//! answered `MAX_REQUESTS` requests (the first argument, 4 by default: two paths, two
//! requests each) or `MAX_SECONDS` seconds have passed (the second, 120), and exits.
//!
//! ```text
//! cargo run -p tower-http-retry-reqwest --example wasm_server -- 4 120
//! ```
#![allow(clippy::disallowed_methods)] // measures the real gap between two arrivals

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
#[tokio::main(flavor = "current_thread")]
async fn main() {
    server::main().await
}

// The server is native; on wasm32 the example is empty.
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
fn main() {}

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
mod server {
    use std::collections::HashMap;
    use std::convert::Infallible;
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;
    use tokio::sync::mpsc;

    /// When each path's first request arrived.
    type Arrivals = Arc<Mutex<HashMap<String, Instant>>>;

    pub(crate) async fn main() {
        let mut args = std::env::args().skip(1);
        let max_requests: usize = args.next().map_or(4, |n| n.parse().expect("a count"));
        let max_seconds: u64 = args.next().map_or(120, |n| n.parse().expect("seconds"));

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut stdout = std::io::stdout();
        writeln!(stdout, "{addr}").unwrap();
        stdout.flush().unwrap();

        let arrivals = Arrivals::default();
        // One message per answered request.
        let (answered, mut answers) = mpsc::unbounded_channel::<()>();
        let serve = async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (arrivals, answered) = (arrivals.clone(), answered.clone());
                let service = hyper::service::service_fn(move |request| {
                    let (arrivals, answered) = (arrivals.clone(), answered.clone());
                    async move {
                        let response = answer(&arrivals, request).await;
                        let _ = answered.send(());
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        };
        let count = async move {
            for _ in 0..max_requests {
                answers.recv().await;
            }
        };
        tokio::select! {
            () = serve => {}
            () = count => eprintln!("wasm_server: answered {max_requests} requests"),
            () = tokio::time::sleep(Duration::from_secs(max_seconds)) => {
                eprintln!("wasm_server: {max_seconds} s passed, stopping");
            }
        }
        // The last answer's bytes leave before the process ends.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    async fn answer(
        arrivals: &Arrivals,
        request: http::Request<Incoming>,
    ) -> http::Response<Full<Bytes>> {
        let arrived = Instant::now();
        let path = request.uri().path().to_owned();
        let first = *arrivals.lock().unwrap().entry(path).or_insert(arrived);
        let body = request
            .into_body()
            .collect()
            .await
            .map(|body| body.to_bytes());
        let body = String::from_utf8_lossy(&body.unwrap_or_default()).into_owned();
        // `fetch` in Node asks for CORS; the answers allow any origin, the header read too.
        let builder = http::Response::builder()
            .header("access-control-allow-origin", "*")
            .header("access-control-expose-headers", "retry-after");
        let response = match first == arrived {
            true => builder
                .status(503)
                .header("retry-after", "1")
                .body(Full::new(Bytes::from_static(b"busy"))),
            false => {
                let gap = arrived.duration_since(first).as_millis();
                builder
                    .status(200)
                    .body(Full::new(Bytes::from(format!("gap_ms={gap} body={body}"))))
            }
        };
        response.unwrap()
    }
}
