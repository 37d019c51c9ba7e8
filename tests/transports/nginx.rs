//! An HTTP/2 load test against a real nginx on 127.0.0.1.
//!
//! nginx closes an HTTP/2 connection with GOAWAY once it has served `keepalive_requests`
//! requests on it. hyper hands that GOAWAY (or the close after it) to streams still open
//! on the connection, the one nginx processed last included. Taking GOAWAY as proof that
//! a request was never processed had keyless POSTs applied twice here, in every run.
//!
//! The test starts its own nginx (its own config, port, logs and temporary directories),
//! sends keyless POSTs and GETs through the layer, and reads nginx's own access log: no id
//! may be applied twice, and every GET must succeed. The same load through the bare client
//! in the same run shows the fault is exercised.
//!
//! nginx comes from Debian's `nginx-light` (`.ci/run` installs it). Without it the test
//! fails under `CI=true`, and elsewhere says loudly that it skipped.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{Backoff, ReplayBody, RetryLayer, RetryPolicy};

use crate::common;

use common::nginx::Nginx;

/// The GOAWAY storm: nginx sends GOAWAY after every `STORM_KEEPALIVE` requests on a
/// connection, and the client keeps `STORM_CONCURRENCY` keyless POSTs in flight over its one
/// multiplexed connection, `STORM_POSTS` of them.
const STORM_KEEPALIVE: usize = 2;
const STORM_CONCURRENCY: usize = 16;
const STORM_POSTS: usize = 1_000;
/// Mixed traffic: GOAWAY every `MIXED_KEEPALIVE` requests, `MIXED_REQUESTS` POSTs and as
/// many GETs, `MIXED_CONCURRENCY` at a time; every GET must succeed.
const MIXED_KEEPALIVE: usize = 16;
const MIXED_CONCURRENCY: usize = 4;
const MIXED_REQUESTS: usize = 3_000;

/// nginx with two HTTP/2 servers: GOAWAY after `STORM_KEEPALIVE` requests on the first
/// port, after `MIXED_KEEPALIVE` on the second.
fn start_nginx(binary: &std::path::Path) -> Nginx {
    Nginx::start(binary, 2, "$request_method $arg_id $status", |ports| {
        let (storm, mixed) = (ports[0], ports[1]);
        format!(
            r#"    server {{
        listen 127.0.0.1:{storm} http2;
        keepalive_requests {STORM_KEEPALIVE};
        location / {{ return 200 "applied\n"; }}
    }}
    server {{
        listen 127.0.0.1:{mixed} http2;
        keepalive_requests {MIXED_KEEPALIVE};
        location / {{ return 200 "applied\n"; }}
    }}"#
        )
    })
}

type Body = ReplayBody<Full<Bytes>>;

/// What one load sends: `posts` keyless POSTs and `gets` GETs, interleaved, `concurrency`
/// at a time, with ids from `first_id` on.
#[derive(Clone, Copy)]
struct Load {
    port: u16,
    posts: usize,
    gets: usize,
    concurrency: usize,
    first_id: usize,
}

/// A request not answered within this is counted as hung (and as failed).
const HUNG: Duration = Duration::from_secs(10);

/// Runs `load` through `svc`; returns (POST failures, GET failures, hung requests).
async fn load<S>(svc: S, load: Load) -> (usize, usize, usize)
where
    S: Service<Request<Full<Bytes>>, Error = BoxError> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send,
{
    let next = Arc::new(AtomicUsize::new(0));
    let post_failures = Arc::new(AtomicUsize::new(0));
    let get_failures = Arc::new(AtomicUsize::new(0));
    let hung = Arc::new(AtomicUsize::new(0));
    let total = load.posts + load.gets;
    let workers: Vec<_> = (0..load.concurrency)
        .map(|_| {
            let (svc, next) = (svc.clone(), Arc::clone(&next));
            let (posts, gets) = (Arc::clone(&post_failures), Arc::clone(&get_failures));
            let hung = Arc::clone(&hung);
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    if i >= total {
                        return;
                    }
                    let id = load.first_id + i;
                    // POSTs and GETs alternate while both last.
                    let post = if load.gets == 0 {
                        true
                    } else if load.posts == 0 {
                        false
                    } else {
                        i % 2 == 0 && i / 2 < load.posts || i >= 2 * load.gets
                    };
                    let (method, body, failures) = if post {
                        (Method::POST, Bytes::from(format!("order {id}")), &posts)
                    } else {
                        (Method::GET, Bytes::new(), &gets)
                    };
                    let req = Request::builder()
                        .method(method)
                        .uri(format!("http://127.0.0.1:{}/apply?id={id}", load.port))
                        .body(Full::new(body))
                        .unwrap();
                    let ok = match tokio::time::timeout(HUNG, svc.clone().oneshot(req)).await {
                        Ok(result) => result.is_ok(),
                        Err(_) => {
                            let method = if post { "POST" } else { "GET" };
                            eprintln!("request {id} ({method}) not answered within {HUNG:?}");
                            hung.fetch_add(1, Ordering::SeqCst);
                            false
                        }
                    };
                    if !ok {
                        failures.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    (
        post_failures.load(Ordering::SeqCst),
        get_failures.load(Ordering::SeqCst),
        hung.load(Ordering::SeqCst),
    )
}

/// Counts, per id, the requests nginx logged with status 200.
fn applied(log: &str) -> HashMap<(String, usize), usize> {
    let mut counts = HashMap::new();
    for line in log.lines() {
        let mut fields = line.split(' ');
        let (Some(method), Some(id), Some("200")) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if let Ok(id) = id.parse::<usize>() {
            *counts.entry((method.to_string(), id)).or_insert(0) += 1;
        }
    }
    counts
}

#[test]
fn keyless_posts_are_never_applied_twice_against_nginx_over_http2() {
    let Some(binary) =
        common::nginx::binary("keyless_posts_are_never_applied_twice_against_nginx_over_http2")
    else {
        return;
    };
    let nginx = start_nginx(&binary);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let storm = Load {
        port: nginx.ports[0],
        posts: STORM_POSTS,
        gets: 0,
        concurrency: STORM_CONCURRENCY,
        first_id: 0,
    };
    let mixed = Load {
        port: nginx.ports[1],
        posts: MIXED_REQUESTS,
        gets: MIXED_REQUESTS,
        concurrency: MIXED_CONCURRENCY,
        first_id: 500_000,
    };
    // Ids: the bare client's below LAYER, the layer's from LAYER on (one access log).
    const LAYER: usize = 1_000_000;
    let figures = runtime.block_on(async move {
        let client = || {
            Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http::<Body>()
        };
        let bare = tower::service_fn({
            let client = client();
            move |req: Request<Full<Bytes>>| {
                let client = client.clone();
                async move {
                    let req = req.map(|b| ReplayBody::new(b, 0));
                    client.request(req).await.map_err(BoxError::from)
                }
            }
        });
        // Keyless POSTs, a quick backoff, no budget to refuse: only the classification
        // stands between a GOAWAY and a second copy of a POST.
        let layer = RetryLayer::new().policy(
            RetryPolicy::default()
                .idempotency_key(None)
                .no_gates()
                .max_attempts(10)
                // hyper-util's HTTP/2 client leaves an odd request unanswered in a GOAWAY
                // storm (the bare client's hung count shows it); the attempt timeout is
                // what a user sets against that.
                .attempt_timeout(Duration::from_secs(2))
                .backoff(Backoff::exponential(
                    Duration::from_millis(5),
                    Duration::from_millis(50),
                )),
        );
        let layered = tower::util::BoxCloneSyncService::new(layer.layer(client()));
        let limit = Duration::from_secs(120);
        let mut figures = Vec::new();
        for run in [storm, mixed] {
            let bare = tokio::time::timeout(limit, load(bare.clone(), run)).await;
            let ours = Load {
                first_id: run.first_id + LAYER,
                ..run
            };
            let ours = tokio::time::timeout(limit, load(layered.clone(), ours)).await;
            figures.push((
                bare.expect("the bare load ends"),
                ours.expect("the load ends"),
            ));
        }
        figures
    });
    let [(storm_bare, storm_ours), (mixed_bare, mixed_ours)] = figures[..] else {
        unreachable!()
    };
    // nginx writes a request's line to its access log after it has sent the answer, so the
    // client may hold the last answers before their lines are written: read the log until
    // every GET is in it, 250 reads 20 ms apart at most.
    let mut reads = 0;
    let counts = loop {
        let counts = applied(&nginx.access_log());
        let gets = counts
            .keys()
            .filter(|(method, id)| method == "GET" && *id >= LAYER)
            .count();
        reads += 1;
        if gets >= MIXED_REQUESTS || reads == 250 {
            break counts;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut twice: Vec<usize> = counts
        .iter()
        .filter(|((method, id), n)| method == "POST" && *id >= LAYER && **n > 1)
        .map(|((_, id), _)| *id)
        .collect();
    twice.sort_unstable();
    let gets_applied = counts
        .keys()
        .filter(|(method, id)| method == "GET" && *id >= LAYER)
        .count();
    eprintln!(
        "nginx over HTTP/2, failures (POST, GET): \
         storm (keepalive_requests {STORM_KEEPALIVE}, {STORM_CONCURRENCY} at a time, {STORM_POSTS} POSTs): bare {storm_bare:?}, layer {storm_ours:?}; \
         mixed (keepalive_requests {MIXED_KEEPALIVE}, {MIXED_CONCURRENCY} at a time, {MIXED_REQUESTS} POSTs + {MIXED_REQUESTS} GETs): bare {mixed_bare:?}, layer {mixed_ours:?}; \
         keyless POSTs applied twice through the layer: {}",
        twice.len()
    );
    assert!(
        storm_bare.0 > 0 && mixed_bare.0 + mixed_bare.1 > 0,
        "the bare client never failed: GOAWAY was not exercised ({storm_bare:?}, {mixed_bare:?})"
    );
    assert!(
        twice.is_empty(),
        "keyless POSTs applied twice: ids {twice:?}"
    );
    assert_eq!(storm_ours.2 + mixed_ours.2, 0, "requests hung in the layer");
    assert_eq!(mixed_ours.1, 0, "GETs failed through the layer");
    assert_eq!(gets_applied, MIXED_REQUESTS, "every GET reached nginx");
}
