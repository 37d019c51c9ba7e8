//! One budget across a chain of services.
//!
//! Three hyper servers on 127.0.0.1, A, B and C: A's handler calls B, and B's calls C,
//! each through a hyper-util client wrapped in the retry layer; C is slow (600 ms of work,
//! which its handler hands to a task of its own, as a query or a worker pool would take
//! it). A caller calls A with a deadline of 200 ms, and the example prints how long C
//! goes on working after that deadline has passed:
//!
//! - without propagation, C learns nothing of the caller's deadline and works its 600 ms;
//! - with it, the caller's layer writes the time each attempt has in a header
//!   ([`RetryPolicy::deadline_header`]), each server's [`DeadlineLayer`] reads it and hands
//!   the handler a [`RequestDeadline`], which the handler puts on its own outgoing request,
//!   whose layer writes what is left of it in turn; C's work ends with C's deadline, which
//!   is the caller's, late by the time the request took to reach C (each hop reads a
//!   relative time on arrival) and a millisecond of rounding per hop.
//!
//! Over HTTP/1 and HTTP/2. Run with `cargo run --release --example deadline_chain`; it ends
//! by itself in a few seconds. `tests/transports/deadline_chain.rs` runs the same chain
//! and bounds its figures.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{
    DeadlineLayer, ReplayBody, RequestDeadline, Retry, RetryLayer, RetryPolicy,
};

/// The caller's deadline.
pub const CALLER_DEADLINE: Duration = Duration::from_millis(200);
/// The work C does for a request when nothing stops it.
pub const C_WORK: Duration = Duration::from_millis(600);
/// Each server's own limit for a request.
const OWN_LIMIT: Duration = Duration::from_secs(5);
/// C works in steps of this, and looks at its deadline between them.
const STEP: Duration = Duration::from_millis(2);
/// The header of the convention, written by the clients and read by the servers.
const HEADER: HeaderName = HeaderName::from_static("x-timeout-ms");

/// What one run of the chain measured.
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// From the caller's call to C's handler.
    pub transit: Duration,
    /// How far past the caller's deadline C's deadline was (zero if before).
    pub c_deadline_late: Duration,
    /// The work C did after the caller's deadline had passed.
    pub after_deadline: Duration,
    /// The work C did in all.
    pub worked: Duration,
}

/// What C reports of a request it worked on.
struct Worked {
    started: Instant,
    deadline: Instant,
    ended: Instant,
}

type Outgoing = Retry<Client<HttpConnector, ReplayBody<Full<Bytes>>>>;

/// A client through the retry layer: writing the deadline header when `propagate`.
fn client(h2: bool, propagate: bool, deadline: Option<Duration>) -> Outgoing {
    let mut builder = Client::builder(TokioExecutor::new());
    builder.http2_only(h2);
    let policy = RetryPolicy::new()
        .deadline(deadline)
        .deadline_header(propagate.then_some(HEADER));
    RetryLayer::new().policy(policy).layer(builder.build_http())
}

/// Serves `service` behind a [`DeadlineLayer`] (reading the header when `propagate`) on
/// 127.0.0.1, over HTTP/2 (prior knowledge) or HTTP/1.
async fn serve<S>(service: S, h2: bool, propagate: bool) -> std::io::Result<SocketAddr>
where
    S: Service<Request<Incoming>, Response = Response<String>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let layer = DeadlineLayer::new(OWN_LIMIT)
        .header(propagate.then_some(HEADER))
        // Every caller here is on the loopback interface: all of them are ours.
        .trust(|_| true);
    let service = layer.layer(service);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service = service.clone();
            let hyper_service =
                hyper::service::service_fn(move |request| service.clone().oneshot(request));
            tokio::spawn(async move {
                let io = TokioIo::new(stream);
                let _ = match h2 {
                    true => {
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, hyper_service)
                            .await
                    }
                    false => {
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, hyper_service)
                            .await
                    }
                };
            });
        }
    });
    Ok(addr)
}

/// A server whose handler calls `next` and answers with its status.
async fn forwarder(next: SocketAddr, h2: bool, propagate: bool) -> std::io::Result<SocketAddr> {
    let client = client(h2, propagate, None);
    let handler = tower::service_fn(move |request: Request<Incoming>| {
        let client = client.clone();
        async move {
            let mut outgoing = Request::get(format!("http://{next}/"))
                .body(Full::new(Bytes::new()))
                .expect("a valid request");
            // The handler's deadline, carried on: the layer's deadline for this call is
            // what is left of it, and the next server is told so.
            if let Some(deadline) = request.extensions().get::<RequestDeadline>() {
                outgoing.extensions_mut().insert(*deadline);
            }
            let status = match client.oneshot(outgoing).await {
                Ok(response) => response.status(),
                Err(_) => StatusCode::GATEWAY_TIMEOUT,
            };
            let mut response = Response::new(String::new());
            *response.status_mut() = status;
            Ok::<_, Infallible>(response)
        }
    });
    serve(handler, h2, propagate).await
}

/// C: hands its work to a task, which works until it is done or the handler's deadline
/// has passed, and reports it.
async fn worker(
    h2: bool,
    propagate: bool,
    report: mpsc::UnboundedSender<Worked>,
) -> std::io::Result<SocketAddr> {
    let handler = tower::service_fn(move |request: Request<Incoming>| {
        let report = report.clone();
        async move {
            let started = Instant::now();
            let deadline = request
                .extensions()
                .get::<RequestDeadline>()
                .map_or(started + OWN_LIMIT, |deadline| {
                    Instant::from_std(deadline.0)
                });
            let work = tokio::spawn(async move {
                let done = started + C_WORK;
                let mut now = Instant::now();
                while now < done && now < deadline {
                    tokio::time::sleep_until((now + STEP).min(done).min(deadline)).await;
                    now = Instant::now();
                }
                let _ = report.send(Worked {
                    started,
                    deadline,
                    ended: now,
                });
            });
            let _ = work.await;
            Ok::<_, Infallible>(Response::new(String::from("done")))
        }
    });
    serve(handler, h2, propagate).await
}

/// Runs the chain once: the caller calls A with its deadline, and the figures come from
/// C's report (waited for at most 5 s).
pub async fn run(h2: bool, propagate: bool) -> Result<Figures, BoxError> {
    let (report, mut reports) = mpsc::unbounded_channel();
    let c = worker(h2, propagate, report).await?;
    let b = forwarder(c, h2, propagate).await?;
    let a = forwarder(b, h2, propagate).await?;
    let caller = client(h2, propagate, Some(CALLER_DEADLINE));
    let request = Request::get(format!("http://{a}/")).body(Full::new(Bytes::new()))?;
    let start = Instant::now();
    let caller_deadline = start + CALLER_DEADLINE;
    // The caller gets its `DeadlineExceeded` (or B's 504, passed on by A) at its deadline.
    let _ = caller.oneshot(request).await;
    let worked = tokio::time::timeout(Duration::from_secs(5), reports.recv())
        .await?
        .ok_or("C reported nothing")?;
    Ok(Figures {
        transit: worked.started.saturating_duration_since(start),
        c_deadline_late: worked.deadline.saturating_duration_since(caller_deadline),
        after_deadline: worked.ended.saturating_duration_since(caller_deadline),
        worked: worked.ended.saturating_duration_since(worked.started),
    })
}

fn ms(time: Duration) -> String {
    format!("{:.1} ms", time.as_secs_f64() * 1e3)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    println!(
        "caller's deadline {}, C's work {}, A -> B -> C on 127.0.0.1\n",
        ms(CALLER_DEADLINE),
        ms(C_WORK)
    );
    println!(
        "{:<8} {:<12} {:>10} {:>10} {:>18} {:>24}",
        "protocol",
        "propagation",
        "transit",
        "C worked",
        "C's deadline late",
        "C's work after deadline"
    );
    for h2 in [false, true] {
        for propagate in [false, true] {
            let figures = run(h2, propagate).await?;
            println!(
                "{:<8} {:<12} {:>10} {:>10} {:>18} {:>24}",
                if h2 { "HTTP/2" } else { "HTTP/1" },
                if propagate { "on" } else { "off" },
                ms(figures.transit),
                ms(figures.worked),
                ms(figures.c_deadline_late),
                ms(figures.after_deadline),
            );
        }
    }
    Ok(())
}
