//! Resumable response bodies against a real nginx serving static files (its own strong
//! ETag, `Range` and `If-Range`), behind the seeded fault-injecting proxy
//! (`tests/common/cut_proxy.rs`), through the resuming layer over a hyper-util client, over
//! HTTP/1 and prior-knowledge HTTP/2: cut downloads come out whole, each continuation is a
//! `Range`/`If-Range` request nginx answers with a 206, and what nginx's access log says it
//! sent is bounded by the file, the heads, what the proxy held at each cut and the kernel
//! slack `cut_proxy.rs` allows. Then the load (1,000 downloads of 1 MiB, 20% of
//! connections cut, SHA-256 each) and a file replaced by an atomic rename mid-download.
//!
//! The proxy closes a cut connection in order (`CutMode::Close`), so the client reads every
//! byte it was forwarded before the early end: the bytes nginx sends again are then only
//! what never left the proxy or the kernels. (A reset loses what sat unread in the client's
//! receive buffer too; `tests/transports/resume.rs` bounds that case by what the server
//! wrote.)
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use sha2::{Digest, Sha256};
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{
    Backoff, ReplayBody, Resume, ResumeBody, ResumeInfo, Retry, RetryBudget, RetryError,
    RetryLayer, RetryPolicy, StopReason,
};

use crate::common::cut_proxy::{Cut, CutMode, CutPlan, CutProxy};
use crate::common::nginx;
use crate::cut_proxy::{pattern, static_nginx};

type Body = BoxBody<Bytes, BoxError>;
type HyperClient = Client<HttpConnector, ReplayBody<Body>>;

/// What Linux may hold between nginx and the proxy at a cut, beyond what the proxy counts:
/// nginx's send buffer and the proxy's receive buffer, 16 KiB asked of each, doubled.
const KERNEL_SLACK_PER_CUT: u64 = 2 * (2 * 16 * 1024);

/// The resuming layer: at most 10 continuations per body, short backoffs, and `policy`
/// over them.
fn layer(policy: RetryPolicy) -> RetryLayer<Resume> {
    RetryLayer::new()
        .policy(
            RetryPolicy::new()
                .backoff(Backoff::exponential(
                    Duration::from_millis(2),
                    Duration::from_millis(20),
                ))
                .max_continuations(10),
        )
        .policy(policy)
        .resume()
}

/// A hyper-util client; `pooled: false` opens a connection per request over HTTP/1.
fn hyper_client(http2: bool, pooled: bool) -> HyperClient {
    let mut builder = Client::builder(TokioExecutor::new());
    builder.http2_only(http2);
    if !pooled {
        builder.pool_max_idle_per_host(0);
    }
    builder.build_http()
}

/// The resuming layer over a hyper-util client.
fn client(http2: bool, pooled: bool) -> Retry<HyperClient, Resume> {
    layer(RetryPolicy::new()).layer(hyper_client(http2, pooled))
}

fn get(url: &str) -> Request<Body> {
    Request::get(url)
        .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
        .unwrap()
}

fn cut_plan(seed: u64, fraction: f64, min_offset: u64, max_offset: u64) -> CutPlan {
    CutPlan {
        seed,
        fraction,
        min_offset,
        max_offset,
        mode: CutMode::Close,
        upstream_recv_buffer: Some(16 * 1024),
    }
}

/// Reads a body to its end: the bytes, and the error that ended it if one did.
async fn read_all(mut body: ResumeBody<hyper::body::Incoming>) -> (Vec<u8>, Option<BoxError>) {
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => bytes.extend_from_slice(&frame.into_data().unwrap_or_default()),
            Err(error) => return (bytes, Some(error)),
        }
    }
    (bytes, None)
}

/// Downloads `url` whole: its bytes and its record (panics if the body ends with an error).
async fn download(mut client: Retry<HyperClient, Resume>, url: String) -> (Vec<u8>, ResumeInfo) {
    let response = client.ready().await.unwrap().call(get(&url)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    let (bytes, error) = read_all(response.into_body()).await;
    if let Some(error) = error {
        panic!(
            "{url}: ended with {error} after {} bytes, {:?}",
            bytes.len(),
            info.continuations()
        );
    }
    (bytes, info)
}

/// One access-log line of `static_nginx`'s format.
#[derive(Debug)]
struct Logged {
    status: u16,
    bytes_sent: u64,
    body_bytes_sent: u64,
    /// `None` for no `Range`.
    range: Option<String>,
    if_range: Option<String>,
}

fn parse_log(log: &str) -> Vec<Logged> {
    let quoted = |field: &str| {
        // nginx escapes a quote in a logged header as `\x22`.
        let inner = field[1..field.len() - 1].replace("\\x22", "\"");
        (inner != "-").then_some(inner)
    };
    log.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            Logged {
                status: fields[2].parse().unwrap(),
                bytes_sent: fields[3].parse().unwrap(),
                body_bytes_sent: fields[4].parse().unwrap(),
                range: quoted(fields[5]),
                if_range: quoted(fields[6]),
            }
        })
        .collect()
}

/// nginx's log once it has `lines` lines (it writes one when it notices the end of a
/// request, which for a cut connection or over HTTP/2 can come after the client is done);
/// waits at most 10 s.
async fn log_of(nginx: &nginx::Nginx, lines: usize) -> Vec<Logged> {
    let mut log = Vec::new();
    for _ in 0..400 {
        log = parse_log(&nginx.access_log());
        if log.len() >= lines {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    log
}

/// The checks shared by the cut downloads and the load: every request with a `Range` was a
/// continuation nginx answered with a 206 to the ETag in `If-Range`, and what nginx sent is
/// bounded. Returns (body bytes nginx sent, the bound).
///
/// `forwarded` (HTTP/1): the proxy, and what it gave the client over every connection. After
/// orderly closes the client read all of it, so it must be the heads plus the file once per
/// download exactly: each continuation asked from exactly the byte after the last one the
/// connection brought, none was had twice. (The proxy counts a write once it is done, which
/// the client can read first: waited for, bounded.)
async fn check_log(
    log: &[Logged],
    etag: &str,
    downloads: u64,
    len: u64,
    cuts: &[Cut],
    forwarded: Option<&CutProxy>,
) -> (u64, u64) {
    // A continuation before any byte was handed over is the request as it was: a 200.
    let ranged = log.iter().filter(|l| l.range.is_some()).count();
    assert!(log.len() - ranged >= downloads as usize, "{log:?}");
    for line in log {
        match &line.range {
            None => assert_eq!((line.status, line.if_range.as_deref()), (200, None)),
            Some(range) => {
                assert!(
                    range.starts_with("bytes=") && range.ends_with('-'),
                    "{line:?}"
                );
                assert_eq!(line.status, 206, "{line:?}");
                assert_eq!(line.if_range.as_deref(), Some(etag), "{line:?}");
            }
        }
    }
    // The file once per download, what the proxy held at each cut and what the kernels may
    // have; the heads apart (each line's `$bytes_sent` minus its `$body_bytes_sent`).
    let body: u64 = log.iter().map(|l| l.body_bytes_sent).sum();
    let heads: u64 = log.iter().map(|l| l.bytes_sent - l.body_bytes_sent).sum();
    let held: u64 = cuts.iter().map(|c| c.held).sum();
    let bound = downloads * len + held + cuts.len() as u64 * KERNEL_SLACK_PER_CUT;
    assert!(body >= downloads * len, "every byte was sent: {body}");
    assert!(
        body <= bound,
        "nginx sent {body} body bytes (+ {heads} of heads): at most {} x {len} + held {held} \
         + kernel slack for {} cuts; {cuts:?} {log:?}",
        downloads,
        cuts.len()
    );
    let sent: u64 = log.iter().map(|l| l.bytes_sent).sum();
    assert_eq!(sent, body + heads);
    if let Some(proxy) = forwarded {
        let expected = heads + downloads * len;
        for _ in 0..200 {
            if proxy.forwarded() >= expected {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        assert_eq!(
            proxy.forwarded(),
            expected,
            "the proxy forwarded the heads and each download's bytes once"
        );
    }
    (body, bound)
}

/// Four downloads of a 1 MiB file through the proxy, a connection each, about half of the
/// connections cut at seeded offsets (seed 11: the first five): each comes out whole, in at most 10 continuations.
async fn cut_downloads_are_whole(http2: bool, spawned: bool) {
    let Some(binary) = nginx::binary("a_cut_nginx_download_is_continued_whole") else {
        return;
    };
    let file = pattern(1 << 20);
    let (nginx, root) = static_nginx(&binary, &[("file.bin", &file)]);
    let upstream: SocketAddr = format!("127.0.0.1:{}", nginx.ports[usize::from(http2)])
        .parse()
        .unwrap();
    let proxy = CutProxy::start(upstream, cut_plan(11, 0.5, 1000, 1 << 20));
    // A connection per request, so that the seed's plan reaches every download.
    let client = client(http2, false);
    let downloads = 4;
    let mut etag = None;
    let mut continuations = 0;
    for _ in 0..downloads {
        let work = download(client.clone(), proxy.url("/file.bin"));
        let (bytes, info) = match spawned {
            true => tokio::spawn(work).await.unwrap(),
            false => work.await,
        };
        assert!(
            bytes == file,
            "the exact bytes ({} of {})",
            bytes.len(),
            file.len()
        );
        assert!(info.continuations().len() <= 10);
        continuations += info.continuations().len();
        etag.get_or_insert_with(|| {
            let path = root.join("file.bin");
            let meta = std::fs::metadata(path).unwrap();
            // nginx's ETag: the modification time and the length, in hex.
            let mtime = meta
                .modified()
                .unwrap()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            format!("\"{mtime:x}-{:x}\"", meta.len())
        });
    }
    let cuts = proxy.cuts();
    assert!(cuts.len() >= 2, "the seed cuts connections: {cuts:?}");
    assert_eq!(continuations, cuts.len(), "one continuation per cut");
    let log = log_of(&nginx, downloads + continuations).await;
    let (body, bound) = check_log(
        &log,
        etag.as_deref().unwrap(),
        downloads as u64,
        file.len() as u64,
        &cuts,
        (!http2).then_some(&proxy),
    )
    .await;
    eprintln!(
        "http2={http2} spawned={spawned}: {downloads} downloads, {} cuts, {continuations} \
         continuations; nginx sent {body} body bytes, bound {bound}",
        cuts.len()
    );
    drop(nginx);
    let _ = std::fs::remove_dir_all(root);
}

async fn cut_http1(spawned: bool) {
    cut_downloads_are_whole(false, spawned).await;
}

async fn cut_http2(spawned: bool) {
    cut_downloads_are_whole(true, spawned).await;
}

/// The file replaced by an atomic rename while three downloads through a proxy that never
/// cuts and three through one that cuts every connection are in the middle of it: the first
/// three end with the old file whole (nginx keeps the old one open), the others with a
/// `RetryError` naming a changed representation, holding only old bytes.
async fn replaced_file(http2: bool, spawned: bool) {
    let Some(binary) = nginx::binary("a_file_renamed_over_mid_nginx_download") else {
        return;
    };
    let old = pattern(1 << 20);
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x5a).collect();
    let (nginx, root) = static_nginx(&binary, &[("file.bin", &old)]);
    let upstream: SocketAddr = format!("127.0.0.1:{}", nginx.ports[usize::from(http2)])
        .parse()
        .unwrap();
    let whole = CutProxy::start(upstream, CutPlan::never());
    let cutting = CutProxy::start(upstream, cut_plan(5, 1.0, 200_000, 800_000));
    let per_proxy = 3;
    // Every download stops at 64 KiB until the file is replaced.
    let reached = Arc::new(tokio::sync::Barrier::new(2 * per_proxy + 1));
    let replaced = Arc::new(tokio::sync::Barrier::new(2 * per_proxy + 1));
    let one = |url: String| {
        let mut client = client(http2, true);
        let (reached, replaced) = (Arc::clone(&reached), Arc::clone(&replaced));
        async move {
            let response = client.ready().await.unwrap().call(get(&url)).await.unwrap();
            let mut body = response.into_body();
            let mut bytes = Vec::new();
            let mut waited = false;
            let end = loop {
                if !waited && bytes.len() >= 64 * 1024 {
                    reached.wait().await;
                    replaced.wait().await;
                    waited = true;
                }
                match body.frame().await {
                    None => break None,
                    Some(Ok(frame)) => {
                        bytes.extend_from_slice(&frame.into_data().unwrap_or_default())
                    }
                    Some(Err(error)) => break Some(error),
                }
            };
            assert!(waited, "{url}: {} bytes", bytes.len());
            (bytes, end)
        }
    };
    let mut tasks = Vec::new();
    for proxy in [&whole, &cutting] {
        for _ in 0..per_proxy {
            tasks.push(one(proxy.url("/file.bin")));
        }
    }
    let running = async {
        match spawned {
            true => {
                let handles: Vec<_> = tasks.into_iter().map(tokio::spawn).collect();
                let mut ends = Vec::new();
                for handle in handles {
                    ends.push(handle.await.unwrap());
                }
                ends
            }
            false => futures_util::future::join_all(tasks).await,
        }
    };
    let replace = async {
        reached.wait().await;
        let temporary = root.join("file.bin.new");
        std::fs::write(&temporary, &new).unwrap();
        // A later modification time, so that nginx's ETag (time and length) changes though
        // the length does not.
        let later = std::fs::metadata(root.join("file.bin"))
            .unwrap()
            .modified()
            .unwrap()
            + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&temporary)
            .unwrap()
            .set_modified(later)
            .unwrap();
        std::fs::rename(&temporary, root.join("file.bin")).unwrap();
        replaced.wait().await;
    };
    let (ends, ()) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(running, replace)
    })
    .await
    .expect("the downloads end within 60 s");
    for (i, (bytes, end)) in ends.into_iter().enumerate() {
        if i < per_proxy {
            assert!(end.is_none(), "uncut: {end:?}");
            assert!(bytes == old, "uncut: the old file whole");
        } else {
            let error = end.expect("cut after the rename: an error");
            let error = error
                .downcast_ref::<RetryError>()
                .unwrap_or_else(|| panic!("a RetryError: {error}"));
            assert_eq!(error.info().stop(), StopReason::RepresentationChanged);
            assert!(
                bytes.len() < old.len() && bytes[..] == old[..bytes.len()],
                "cut: only old bytes, a prefix ({} bytes)",
                bytes.len()
            );
        }
    }
    assert!(cutting.cuts().len() >= per_proxy);
    // Each continuation nginx saw asked for the old ETag and got the new file whole: a 200.
    let log = parse_log(&nginx.access_log());
    assert!(
        log.iter()
            .filter(|l| l.range.is_some())
            .all(|l| l.status == 200 && l.if_range.is_some()),
        "{log:?}"
    );
    drop(nginx);
    let _ = std::fs::remove_dir_all(root);
}

async fn replaced_http1(spawned: bool) {
    replaced_file(false, spawned).await;
}

async fn replaced_http2(spawned: bool) {
    replaced_file(true, spawned).await;
}

on_both_runtimes! {
    a_cut_nginx_download_is_continued_whole_http1 => cut_http1,
    a_cut_nginx_download_is_continued_whole_http2 => cut_http2,
    a_file_renamed_over_mid_nginx_download_is_never_spliced_http1 => replaced_http1,
    a_file_renamed_over_mid_nginx_download_is_never_spliced_http2 => replaced_http2,
}

/// 1,000 downloads of a 1 MiB file from nginx, a connection each (a client each over
/// HTTP/2), 20% of the connections (continuations' too) cut at seeded offsets, at most 10
/// continuations per body, 16 at a time on spawned tasks: every SHA-256 matches, and
/// nginx's total stays within the bound. Bounded: a timeout on the whole.
async fn thousand_downloads(http2: bool) {
    let Some(binary) = nginx::binary("a_thousand_cut_nginx_downloads_hash_whole") else {
        return;
    };
    let file = pattern(1 << 20);
    let expected = Sha256::digest(&file);
    let (nginx, root) = static_nginx(&binary, &[("file.bin", &file)]);
    let upstream: SocketAddr = format!("127.0.0.1:{}", nginx.ports[usize::from(http2)])
        .parse()
        .unwrap();
    // A cut lands in the first response's body: past its head, short of its end.
    let proxy = CutProxy::start(upstream, cut_plan(1000, 0.2, 1000, (1 << 20) + 100));
    // The default budget (20% of requests, 10 a second) would refuse some of the ~23% of
    // downloads continued within four seconds (a continuation is paid from it, and a
    // refused one ends its body with `BudgetExhausted`): half of them here.
    let layer = layer(RetryPolicy::new().gate(RetryBudget::builder().ratio(0.5).build()));
    let client = layer.layer(hyper_client(http2, false));
    let downloads = 1000;
    let next = Arc::new(AtomicUsize::new(0));
    let url = proxy.url("/file.bin");
    let started = tokio::time::Instant::now();
    let workers: Vec<_> = (0..16)
        .map(|_| {
            let (mut client, next, url) = (client.clone(), Arc::clone(&next), url.clone());
            let layer = layer.clone();
            tokio::spawn(async move {
                let mut most = 0;
                let mut continuations = 0;
                while next.fetch_add(1, Ordering::Relaxed) < downloads {
                    if http2 {
                        // hyper-util shares one HTTP/2 connection among a client's requests:
                        // a client each, under the one layer (and its budget).
                        client = layer.layer(hyper_client(true, false));
                    }
                    let response = client.ready().await.unwrap().call(get(&url)).await.unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
                    let mut body = response.into_body();
                    let mut hash = Sha256::new();
                    let mut len = 0;
                    while let Some(frame) = body.frame().await {
                        let data = frame
                            .unwrap_or_else(|e| panic!("{e} after {len}: {info:?}"))
                            .into_data()
                            .unwrap_or_default();
                        len += data.len();
                        hash.update(&data);
                    }
                    assert_eq!(hash.finalize(), expected, "{len} bytes, {info:?}");
                    let n = info.continuations().len();
                    assert!(n <= 10);
                    most = most.max(n);
                    continuations += n;
                }
                (most, continuations)
            })
        })
        .collect();
    let (most, continuations) = tokio::time::timeout(Duration::from_secs(300), async {
        let mut most = 0;
        let mut continuations = 0;
        for worker in workers {
            let (m, c) = worker.await.unwrap();
            most = most.max(m);
            continuations += c;
        }
        (most, continuations)
    })
    .await
    .expect("1,000 downloads within 300 s");
    let elapsed = started.elapsed();
    let cuts = proxy.cuts();
    assert_eq!(continuations, cuts.len(), "one continuation per cut");
    let connections = proxy.connections();
    assert_eq!(connections as usize, downloads + continuations);
    let share = cuts.len() as f64 / connections as f64;
    assert!(
        (0.15..0.25).contains(&share),
        "{share} of the connections cut"
    );
    let etag = {
        let meta = std::fs::metadata(root.join("file.bin")).unwrap();
        let mtime = meta
            .modified()
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        format!("\"{mtime:x}-{:x}\"", meta.len())
    };
    let log = log_of(&nginx, downloads + continuations).await;
    let (body, bound) = check_log(
        &log,
        &etag,
        downloads as u64,
        file.len() as u64,
        &cuts,
        (!http2).then_some(&proxy),
    )
    .await;
    let held: u64 = cuts.iter().map(|c| c.held).sum();
    eprintln!(
        "http2={http2}: {downloads} downloads in {elapsed:?}: {connections} connections, {} cut ({share:.3}), \
         {continuations} continuations, at most {most} per body; nginx sent {body} body \
         bytes = {downloads} x {} + {}; bound {bound} (held {held})",
        cuts.len(),
        file.len(),
        body - downloads as u64 * file.len() as u64
    );
    drop(nginx);
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_cut_nginx_downloads_hash_whole_http1() {
    thousand_downloads(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_cut_nginx_downloads_hash_whole_http2() {
    thousand_downloads(true).await;
}
