//! Resumable bodies and content codings: tower-http's `DecompressionLayer` below the
//! resumable layer (between it and a hyper-util client: the layer sees decoded bytes) and
//! above it (the layer sees the encoded bytes), against a real hyper server on 127.0.0.1
//! that gzips when asked (a gzip representation with its own strong ETag, ranges counted
//! in its bytes) and cuts its bodies on a script. HTTP/1 and HTTP/2, both runtimes, awaited
//! and spawned. Every body is whole and byte for byte the file, or ends with the layer's
//! error holding a prefix of it: never a splice.

use std::io::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body::Body as _;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};
use tower_http::decompression::{Decompression, DecompressionLayer};
use tower_http_retry::{
    Backoff, ReplayBody, Resume, ResumeInfo, Retry, RetryError, RetryLayer, RetryPolicy, StopReason,
};

use crate::common::files::{Cut, File, FileServer, serve_files};

type Body = BoxBody<Bytes, BoxError>;
type HyperClient = Client<HttpConnector, ReplayBody<Body>>;

type Below = Retry<Decompression<HyperClient>, Resume>;
type Above = Decompression<Retry<HyperClient, Resume>>;

/// What a download got: the response's head, its bytes, how its body ended, its record.
struct Got {
    headers: http::HeaderMap,
    bytes: Bytes,
    end: Result<(), BoxError>,
    info: Option<ResumeInfo>,
}

/// Sends `request` through the decompression layer under the retry layer, and reads the
/// body.
async fn through_below(mut client: Below, request: Request<Body>) -> Got {
    let response = client.ready().await.unwrap().call(request).await.unwrap();
    let (parts, body) = response.into_parts();
    let (bytes, end) = read(body).await;
    let info = parts.extensions.get::<ResumeInfo>().cloned();
    Got {
        headers: parts.headers,
        bytes,
        end,
        info,
    }
}

/// Sends `request` through the decompression layer over the retry layer, and reads the
/// decoded body (its size unknown: decoded).
async fn through_above(mut client: Above, request: Request<Body>) -> Got {
    let response = client.ready().await.unwrap().call(request).await.unwrap();
    let (parts, body) = response.into_parts();
    assert!(body.size_hint().exact().is_none(), "decoded");
    let (bytes, end) = read(body).await;
    let info = parts.extensions.get::<ResumeInfo>().cloned();
    Got {
        headers: parts.headers,
        bytes,
        end,
        info,
    }
}

on_both_runtimes! {
    decompression_below_with_identity_asked_resumes_the_files_bytes => below_identity,
    decompression_below_decoding_the_callers_gzip_is_never_spliced => below_callers_gzip,
    decompression_above_the_layer_resumes_the_encoded_bytes => above_resumes_encoded,
    decompression_above_a_changed_gzip_representation_ends_with_the_error => above_changed,
}

fn layer() -> RetryLayer<Resume> {
    let backoff = Backoff::exponential(Duration::from_millis(5), Duration::from_millis(20));
    RetryLayer::new()
        .policy(RetryPolicy::new().backoff(backoff))
        .resume()
}

fn hyper_client(h2: bool) -> HyperClient {
    Client::builder(TokioExecutor::new())
        .http2_only(h2)
        .build_http()
}

/// How a body is cut over each protocol: an aborted HTTP/1 connection, a reset HTTP/2
/// stream (after the bytes went out).
fn cut(h2: bool, after: usize) -> Cut {
    match h2 {
        false => Cut::After(after),
        true => Cut::Later(after),
    }
}

/// `len` bytes gzip hardly shrinks, with a gzip representation (ETag `"v1-gz"`) served to a
/// request that asks for it.
fn file_with_gzip(len: usize) -> File {
    let mut x: u32 = 0x2545_f491;
    let content: Bytes = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect::<Vec<u8>>()
        .into();
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(&content).unwrap();
    let gzip = encoder.finish().unwrap().into();
    File {
        content,
        gzip: Some((gzip, "\"v1-gz\"")),
        ..File::new(0)
    }
}

fn get(url: &str, accept_encoding: Option<&str>) -> Request<Body> {
    let mut request = Request::get(url);
    if let Some(value) = accept_encoding {
        request = request.header("accept-encoding", value);
    }
    request
        .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
        .unwrap()
}

/// Reads `body` to its end or its error (at most a million frames).
async fn read<B>(body: B) -> (Bytes, Result<(), BoxError>)
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut bytes = Vec::new();
    for _ in 0..1_000_000 {
        match body.frame().await {
            None => return (bytes.into(), Ok(())),
            Some(Ok(frame)) => bytes.extend_from_slice(&frame.into_data().unwrap_or_default()),
            Some(Err(error)) => return (bytes.into(), Err(error.into())),
        }
    }
    panic!("more than a million frames");
}

async fn run<T: Send + 'static>(
    spawned: bool,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    match spawned {
        true => tokio::spawn(work).await.unwrap(),
        false => work.await,
    }
}

/// The layer's error in `error` or its sources (a decompressing body passes it on).
fn stop(error: &BoxError) -> StopReason {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(&**error);
    while let Some(e) = current {
        if let Some(error) = e.downcast_ref::<RetryError>() {
            return error.info().stop();
        }
        current = e.source();
    }
    panic!("no RetryError in {error:?}");
}

/// `RetryLayer<Resume> -> DecompressionLayer -> client`, nothing asked by the caller: the
/// layer asks for identity (the decompression layer adds its own `Accept-Encoding` only
/// where there is none), the server sends the file's own bytes, and the cut body is
/// continued whole.
async fn below_identity(spawned: bool) {
    for h2 in [false, true] {
        let file = file_with_gzip(100_000);
        let files = FileServer::new(file.clone(), &[cut(h2, 30_000), cut(h2, 20_000)]);
        let server = serve_files(files.clone(), h2).await;
        let client = layer().layer(Decompression::new(hyper_client(h2)));
        let request = get(&server.url("/big"), None);
        let got = run(spawned, through_below(client, request)).await;
        let (bytes, info) = (got.bytes, got.info.unwrap());
        got.end.unwrap();
        assert_eq!(bytes, file.content, "h2={h2}");
        assert_eq!(info.continuations().len(), 2);
        assert!(
            files
                .seen()
                .iter()
                .all(|h| h["accept-encoding"] == "identity")
        );
    }
}

/// `RetryLayer<Resume> -> DecompressionLayer -> client` with the caller's own
/// `Accept-Encoding: gzip`: the decompression layer decodes below the retry layer and
/// removes `Content-Encoding` and `Content-Length`, so the layer counts decoded bytes and
/// asks the continuation from there; the server's 206 is a cut into the gzip stream, which
/// the decompression layer cannot decode ("invalid gzip header"). Each continuation fails
/// so, up to the limit: the body ends with the layer's error (`MaxContinuations`) and a
/// prefix of the file. This is the case `RetryLayer::resume` tells callers to avoid (keep
/// `Accept-Encoding` unset with a decompressing layer below).
async fn below_callers_gzip(spawned: bool) {
    for h2 in [false, true] {
        let file = file_with_gzip(100_000);
        let files = FileServer::new(file.clone(), &[cut(h2, 40_000)]);
        let server = serve_files(files.clone(), h2).await;
        let client = layer()
            .policy(RetryPolicy::new().max_continuations(2))
            .layer(Decompression::new(hyper_client(h2)));
        let request = get(&server.url("/big"), Some("gzip"));
        let got = run(spawned, through_below(client, request)).await;
        assert_eq!(got.headers["etag"], "\"v1-gz\"");
        assert!(got.headers.get("content-encoding").is_none());
        let (bytes, end) = (got.bytes, got.end);
        assert_eq!(stop(&end.unwrap_err()), StopReason::MaxContinuations);
        assert!(!bytes.is_empty() && bytes.len() < file.content.len());
        assert_eq!(bytes, file.content.slice(..bytes.len()), "a prefix only");
        // Every continuation asked from the decoded count: the layer never had more.
        let ranges = files.ranges();
        assert_eq!(ranges.len(), 3, "{ranges:?}");
        let from = format!("bytes={}-", bytes.len());
        assert!(ranges[1..].iter().all(|r| r.as_deref() == Some(&from)));
    }
}

/// `DecompressionLayer -> RetryLayer<Resume> -> client`: the decompression layer asks for
/// gzip, the retry layer keeps that `Accept-Encoding` (the caller's, as it sees it) and
/// continues the gzip bytes it sees, by ranges of the gzip representation; the caller
/// reads the file decoded, whole.
async fn above_resumes_encoded(spawned: bool) {
    for h2 in [false, true] {
        let file = file_with_gzip(150_000);
        let files = FileServer::new(file.clone(), &[cut(h2, 40_000), cut(h2, 50_000)]);
        let server = serve_files(files.clone(), h2).await;
        let client: Above = ServiceBuilder::new()
            .layer(DecompressionLayer::new())
            .layer(layer())
            .service(hyper_client(h2));
        let request = get(&server.url("/big"), None);
        let got = run(spawned, through_above(client, request)).await;
        let (bytes, info) = (got.bytes, got.info.unwrap());
        got.end.unwrap();
        assert_eq!(bytes, file.content, "h2={h2}");
        assert_eq!(info.continuations().len(), 2);
        assert!(files.seen().iter().all(|h| h["accept-encoding"] == "gzip"));
        // The continuations' ranges are in the gzip bytes: past the first cut's 40,000.
        let ranges = files.ranges();
        let start = |i: usize| -> u64 {
            let range = ranges[i].as_deref().unwrap();
            range["bytes=".len()..range.len() - 1].parse().unwrap()
        };
        assert!(0 < start(1) && start(1) <= 40_000, "{ranges:?}");
        assert!(start(1) < start(2) && start(2) <= start(1) + 50_000);
        assert!(
            files.seen()[1..]
                .iter()
                .all(|h| h["if-range"] == "\"v1-gz\"")
        );
    }
}

/// `DecompressionLayer -> RetryLayer<Resume> -> client`, the gzip file replaced (another
/// ETag) before the continuation: the body ends with the layer's error
/// (`RepresentationChanged`), passed on by the decompressing body, after a decoded prefix
/// of the old file only.
async fn above_changed(spawned: bool) {
    for h2 in [false, true] {
        let file = file_with_gzip(100_000);
        let mut v2 = file_with_gzip(100_000);
        v2.content = vec![7u8; 100_000].into();
        v2.gzip = Some((v2.gzip.unwrap().0, "\"v2-gz\""));
        let files = FileServer::new(file.clone(), &[cut(h2, 40_000)]).replace_after(1, v2);
        let server = serve_files(files.clone(), h2).await;
        let client: Above = ServiceBuilder::new()
            .layer(DecompressionLayer::new())
            .layer(layer())
            .service(hyper_client(h2));
        let request = get(&server.url("/big"), None);
        let got = run(spawned, through_above(client, request)).await;
        let (bytes, end) = (got.bytes, got.end);
        assert_eq!(
            stop(&end.unwrap_err()),
            StopReason::RepresentationChanged,
            "h2={h2}"
        );
        assert_eq!(bytes, file.content.slice(..bytes.len()), "a prefix only");
    }
}
