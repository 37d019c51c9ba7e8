//! The fault-injecting proxy (`tests/common/cut_proxy.rs`) and the real nginx it stands in
//! front of, checked on their own before anything is built on them: the proxy cuts where
//! its seed says and reports what it held; nginx serves a static file with a strong ETag,
//! answers `Range` with `If-Range` as RFC 9110 says, and its access log's `$bytes_sent`
//! accounts for what a cut connection cost it.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::common::cut_proxy::{CutMode, CutPlan, CutProxy};
use crate::common::nginx::{self, Nginx};
use crate::common::server::{Action, serve};

type Plain = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

fn plain_client(http2: bool) -> Plain {
    Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build_http()
}

/// Reads a response body to its end: the bytes, and the error that ended it early if one
/// did.
async fn read_all(body: hyper::body::Incoming) -> (Vec<u8>, Option<hyper::Error>) {
    let mut body = body;
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            Err(error) => return (bytes, Some(error)),
        }
    }
    (bytes, None)
}

/// `len` bytes that differ from one offset to the next, so that a splice would show.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i % 251) as u8 ^ (i / 251) as u8)
        .collect()
}

#[test]
fn the_plan_is_seeded_and_keeps_its_share_and_its_range() {
    let plan = CutPlan {
        seed: 7,
        fraction: 0.2,
        min_offset: 1000,
        max_offset: 5000,
        mode: CutMode::Reset,
        upstream_recv_buffer: None,
    };
    let cuts: Vec<Option<u64>> = (0..2000).map(|i| plan.cut_of(i)).collect();
    // The same seed, the same cuts; another seed, other cuts.
    assert_eq!(cuts, (0..2000).map(|i| plan.cut_of(i)).collect::<Vec<_>>());
    let other = CutPlan { seed: 8, ..plan };
    assert_ne!(cuts, (0..2000).map(|i| other.cut_of(i)).collect::<Vec<_>>());
    let cut = cuts.iter().flatten().count();
    assert!((300..500).contains(&cut), "{cut} of 2000 cut at 0.2");
    assert!(cuts.iter().flatten().all(|at| (1000..5000).contains(at)));
    assert_eq!(CutPlan::never().cut_of(3), None);
    assert_eq!(CutPlan::always_at(42).cut_of(3), Some(42));
}

async fn cut_at_the_offset() {
    let body = Bytes::from(pattern(200_000));
    let served = body.clone();
    let server = serve(move |_| {
        let served = served.clone();
        async move {
            Action::Respond(
                http::Response::builder()
                    .header("content-type", "application/octet-stream")
                    .body(Full::new(served))
                    .unwrap(),
            )
        }
    })
    .await;
    let offset = 50_000;
    let proxy = CutProxy::start(server.addr, CutPlan::always_at(offset));
    let client = plain_client(false);
    let response = client
        .request(Request::get(proxy.url("/file")).body(Empty::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let (got, error) = read_all(response.into_body()).await;
    assert!(error.is_some(), "a cut body ends with an error");
    // What the client read is a prefix of the body, and no more than the proxy forwarded.
    assert_eq!(&got[..], &body[..got.len()]);
    let cuts = proxy.cuts();
    assert_eq!(cuts.len(), 1);
    assert_eq!(cuts[0].forwarded, offset);
    assert!(
        (got.len() as u64) < offset && offset - (got.len() as u64) < 300,
        "the head and the body read add up to the forwarded bytes: {} of {offset}",
        got.len()
    );
}

#[tokio::test(flavor = "current_thread")]
async fn cuts_a_body_at_its_offset_current_thread() {
    cut_at_the_offset().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_a_body_at_its_offset_multi_thread() {
    cut_at_the_offset().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cuts_a_body_at_its_offset_spawned() {
    tokio::spawn(cut_at_the_offset()).await.unwrap();
}

/// nginx serving `files` (name, contents) from a directory of its own, over HTTP/1 on its
/// first port and prior-knowledge HTTP/2 on its second, each with a small send buffer so
/// that little of what it counts as sent waits in its kernel.
pub fn static_nginx(binary: &Path, files: &[(&str, &[u8])]) -> (Nginx, std::path::PathBuf) {
    let root = std::env::temp_dir().join(format!(
        "tower-http-retry-static-{}-{}",
        std::process::id(),
        {
            use std::hash::BuildHasher;
            std::collections::hash_map::RandomState::new().hash_one(0u8)
        }
    ));
    std::fs::create_dir_all(&root).unwrap();
    for (name, contents) in files {
        std::fs::write(root.join(name), contents).unwrap();
    }
    let r = root.display().to_string();
    let nginx = Nginx::start(
        binary,
        2,
        "$request_method $uri $status $bytes_sent $body_bytes_sent \"$http_range\" \"$http_if_range\"",
        |ports| {
            let (h1, h2) = (ports[0], ports[1]);
            format!(
                r#"    server {{
        listen 127.0.0.1:{h1} sndbuf=16k;
        root {r};
        location / {{ }}
    }}
    server {{
        listen 127.0.0.1:{h2} http2 sndbuf=16k;
        root {r};
        location / {{ }}
    }}"#
            )
        },
    );
    (nginx, root)
}

/// One access-log line, parsed.
#[derive(Debug)]
struct Logged {
    status: u16,
    bytes_sent: u64,
    body_bytes_sent: u64,
}

fn parse_log(log: &str) -> Vec<Logged> {
    log.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            Logged {
                status: fields[2].parse().unwrap(),
                bytes_sent: fields[3].parse().unwrap(),
                body_bytes_sent: fields[4].parse().unwrap(),
            }
        })
        .collect()
}

async fn nginx_ranges(http2: bool) {
    let Some(binary) = nginx::binary("nginx_answers_ranges_as_rfc_9110_says") else {
        return;
    };
    let file = pattern(1 << 20);
    let (nginx, root) = static_nginx(&binary, &[("file.bin", &file)]);
    let port = nginx.ports[usize::from(http2)];
    let url = format!("http://127.0.0.1:{port}/file.bin");
    let client = plain_client(http2);

    let full = client
        .request(Request::get(&url).body(Empty::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(full.status(), StatusCode::OK);
    let etag = full.headers()[header::ETAG].to_str().unwrap().to_string();
    assert!(
        !etag.starts_with("W/"),
        "nginx's ETag for a static file is strong: {etag}"
    );
    assert!(full.headers().contains_key(header::LAST_MODIFIED));
    assert_eq!(full.headers()[header::ACCEPT_RANGES], "bytes");
    let (got, error) = read_all(full.into_body()).await;
    assert!(error.is_none());
    assert_eq!(got, file);

    // The rest from N, if the representation is still the one the ETag names: a 206.
    let n = 300_000;
    let rest = client
        .request(
            Request::get(&url)
                .header(header::RANGE, format!("bytes={n}-"))
                .header(header::IF_RANGE, &etag)
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(rest.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        rest.headers()[header::CONTENT_RANGE],
        format!("bytes {n}-{}/{}", file.len() - 1, file.len())
    );
    assert_eq!(rest.headers()[header::ETAG], etag.as_str());
    let (got, _) = read_all(rest.into_body()).await;
    assert_eq!(got, &file[n..]);

    // Another ETag in If-Range: the whole file, a 200.
    let changed = client
        .request(
            Request::get(&url)
                .header(header::RANGE, format!("bytes={n}-"))
                .header(header::IF_RANGE, "\"not-this-one\"")
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(changed.status(), StatusCode::OK);
    let (got, _) = read_all(changed.into_body()).await;
    assert_eq!(got.len(), file.len());

    // A weak validator in If-Range never matches (strong comparison): a 200.
    let weak = client
        .request(
            Request::get(&url)
                .header(header::RANGE, format!("bytes={n}-"))
                .header(header::IF_RANGE, format!("W/{etag}"))
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(weak.status(), StatusCode::OK);
    let (got, _) = read_all(weak.into_body()).await;
    assert_eq!(got.len(), file.len());

    // A range past the end: 416, with the complete length.
    let past = client
        .request(
            Request::get(&url)
                .header(header::RANGE, format!("bytes={}-", file.len()))
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(past.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(
        past.headers()[header::CONTENT_RANGE],
        format!("bytes */{}", file.len())
    );
    let _ = read_all(past.into_body()).await;

    drop(client);
    // nginx writes a line once it has finished a request, which over HTTP/2 may come just
    // after the client read the last byte: wait for all five, bounded.
    let mut log = Vec::new();
    for _ in 0..200 {
        log = parse_log(&nginx.access_log());
        if log.len() >= 5 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let statuses: Vec<u16> = log.iter().map(|l| l.status).collect();
    assert_eq!(statuses, [200, 206, 200, 200, 416]);
    assert_eq!(log[0].body_bytes_sent, file.len() as u64);
    assert_eq!(log[1].body_bytes_sent, (file.len() - n) as u64);
    drop(nginx);
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test(flavor = "current_thread")]
async fn nginx_answers_ranges_as_rfc_9110_says_http1() {
    nginx_ranges(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_answers_ranges_as_rfc_9110_says_http2() {
    nginx_ranges(true).await;
}

/// Downloads through the proxy in front of nginx, every connection cut at a seeded offset:
/// what nginx logs as sent is bounded by what the proxy forwarded, what it held at each
/// cut, and what the two kernels between them may have held at each: nginx's send buffer
/// and the proxy's receive buffer, 16 KiB asked of each, which Linux doubles.
async fn bytes_sent_are_accounted(http2: bool) {
    let Some(binary) = nginx::binary("nginx_bytes_sent_are_accounted_for") else {
        return;
    };
    let file = pattern(1 << 20);
    let (nginx, root) = static_nginx(&binary, &[("file.bin", &file)]);
    let upstream: SocketAddr = format!("127.0.0.1:{}", nginx.ports[usize::from(http2)])
        .parse()
        .unwrap();
    let proxy = CutProxy::start(
        upstream,
        CutPlan {
            seed: 11,
            fraction: 1.0,
            min_offset: 1000,
            max_offset: 1 << 20,
            mode: CutMode::Reset,
            upstream_recv_buffer: Some(16 * 1024),
        },
    );
    for _ in 0..8 {
        // A fresh client each time: a cut connection is gone anyway.
        let client = plain_client(http2);
        let Ok(response) = client
            .request(
                Request::get(proxy.url("/file.bin"))
                    .body(Empty::new())
                    .unwrap(),
            )
            .await
        else {
            continue; // cut before the head arrived
        };
        let (got, error) = read_all(response.into_body()).await;
        assert!(error.is_some() || got.len() == file.len());
        assert_eq!(&got[..], &file[..got.len()], "a prefix, never other bytes");
    }
    // nginx writes its log line when it notices the connection is gone; wait, bounded.
    let mut log = Vec::new();
    for _ in 0..200 {
        log = parse_log(&nginx.access_log());
        if log.len() as u64 >= proxy.cuts().len() as u64 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let cuts = proxy.cuts();
    assert_eq!(
        cuts.len() as u64,
        proxy.connections(),
        "every connection was cut"
    );
    let sent: u64 = log.iter().map(|l| l.bytes_sent).sum();
    let forwarded: u64 = cuts.iter().map(|c| c.forwarded).sum();
    let held: u64 = cuts.iter().map(|c| c.held).sum();
    let kernel = cuts.len() as u64 * 2 * (2 * 16 * 1024);
    assert!(
        forwarded <= sent,
        "nginx sent at least what reached the client: {sent} < {forwarded}"
    );
    assert!(
        sent <= forwarded + held + kernel,
        "nginx sent {sent}: forwarded {forwarded} + held {held} + kernel slack {kernel}"
    );
    drop(nginx);
    let _ = std::fs::remove_dir_all(root);
}

#[tokio::test(flavor = "current_thread")]
async fn nginx_bytes_sent_are_accounted_for_http1() {
    bytes_sent_are_accounted(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_bytes_sent_are_accounted_for_http2() {
    bytes_sent_are_accounted(true).await;
}
