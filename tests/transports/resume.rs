//! Resumable response bodies over real hyper connections on 127.0.0.1: a server that aborts
//! an HTTP/1 connection in the middle of a body (hyper's client then fails the body: "end
//! of file before message length reached"), resets an HTTP/2 stream
//! (`RST_STREAM(INTERNAL_ERROR)`), or stalls a body; the layer over a hyper-util client
//! continues it. On both runtimes, awaited and spawned.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{
    Backoff, ReplayBody, Resume, ResumeInfo, Retry, RetryError, RetryLayer, RetryPolicy, StopReason,
};

use crate::common::files::{Cut, File, FileServer, serve_files};

type Body = BoxBody<Bytes, BoxError>;
type HyperClient = Client<HttpConnector, ReplayBody<Body>>;

fn client(policy: RetryPolicy) -> Retry<HyperClient, Resume> {
    client_over(policy, false)
}

fn client_over(policy: RetryPolicy, h2: bool) -> Retry<HyperClient, Resume> {
    let backoff = Backoff::exponential(Duration::from_millis(5), Duration::from_millis(20));
    RetryLayer::new()
        .policy(RetryPolicy::new().backoff(backoff))
        .policy(policy)
        .resume()
        .layer(
            Client::builder(TokioExecutor::new())
                .http2_only(h2)
                .build_http(),
        )
}

fn get(url: &str) -> Request<Body> {
    Request::get(url)
        .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
        .unwrap()
}

/// Downloads `url`: the bytes, how the body ended, and its record.
async fn download(
    client: Retry<HyperClient, Resume>,
    url: String,
) -> (Bytes, Result<(), BoxError>, ResumeInfo) {
    download_request(client, get(&url)).await
}

/// Sends `request` and reads the body: the bytes, how the body ended, and its record.
async fn download_request(
    mut client: Retry<HyperClient, Resume>,
    request: Request<Body>,
) -> (Bytes, Result<(), BoxError>, ResumeInfo) {
    let response = client.ready().await.unwrap().call(request).await.unwrap();
    let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    let mut body = response.into_body();
    let mut bytes = Vec::new();
    let end = loop {
        match body.frame().await {
            None => break Ok(()),
            Some(Ok(frame)) => bytes.extend_from_slice(&frame.into_data().unwrap_or_default()),
            Some(Err(error)) => break Err(error),
        }
    };
    (bytes.into(), end, info)
}

async fn cut_download_is_whole(spawned: bool) {
    let files = FileServer::new(
        File::new(100_000),
        &[Cut::After(30_000), Cut::After(20_000)],
    );
    let server = serve_files(files.clone(), false).await;
    let work = download(client(RetryPolicy::new()), server.url("/big"));
    let (bytes, end, info) = match spawned {
        true => tokio::spawn(work).await.unwrap(),
        false => work.await,
    };
    end.unwrap();
    assert_eq!(bytes, files.content());
    // Each continuation asks from the bytes the caller had: at most what the server wrote
    // before its cut (what was in flight in the connection's buffers was lost with it).
    let ranges = files.ranges();
    let from = |i: usize| -> u64 {
        let range = ranges[i].as_deref().unwrap();
        range["bytes=".len()..range.len() - 1].parse().unwrap()
    };
    assert_eq!((ranges.len(), ranges[0].as_deref()), (3, None));
    assert!(0 < from(1) && from(1) <= 30_000, "{ranges:?}");
    assert!(
        from(1) < from(2) && from(2) <= from(1) + 20_000,
        "{ranges:?}"
    );
    let continuations = info.continuations();
    assert_eq!(continuations.len(), 2);
}

async fn stalled_download_is_continued(spawned: bool) {
    let files = FileServer::new(File::new(50_000), &[Cut::Stall(10_000)]);
    let server = serve_files(files.clone(), false).await;
    let policy = RetryPolicy::new().body_idle_timeout(Duration::from_millis(200));
    let work = download(client(policy), server.url("/big"));
    let (bytes, end, info) = match spawned {
        true => tokio::spawn(work).await.unwrap(),
        false => work.await,
    };
    end.unwrap();
    assert_eq!(bytes, files.content());
    assert_eq!(files.ranges()[1].as_deref(), Some("bytes=10000-"));
    assert_eq!(info.continuations().len(), 1);
}

async fn a_file_replaced_mid_download_is_never_spliced(spawned: bool) {
    let mut v2 = File::new(100_000);
    v2.etag = Some("\"v2\"");
    v2.content = vec![9u8; 100_000].into();
    let files = FileServer::new(File::new(100_000), &[Cut::After(40_000)]).replace_after(1, v2);
    let server = serve_files(files.clone(), false).await;
    let work = download(client(RetryPolicy::new()), server.url("/big"));
    let (bytes, end, _) = match spawned {
        true => tokio::spawn(work).await.unwrap(),
        false => work.await,
    };
    let error = end.unwrap_err();
    let error = error.downcast_ref::<RetryError>().expect("a RetryError");
    assert_eq!(error.info().stop(), StopReason::RepresentationChanged);
    // Only bytes of the old file: its first 40,000.
    assert_eq!(bytes, File::new(100_000).content.slice(..40_000));
}

async fn a_reset_http2_stream_is_continued(spawned: bool) {
    let files = FileServer::new(File::new(100_000), &[Cut::Later(30_000)]);
    let server = serve_files(files.clone(), true).await;
    let work = download(client_over(RetryPolicy::new(), true), server.url("/big"));
    let (bytes, end, info) = match spawned {
        true => tokio::spawn(work).await.unwrap(),
        false => work.await,
    };
    end.unwrap();
    assert_eq!(bytes, files.content());
    let continuations = info.continuations();
    assert_eq!(continuations.len(), 1, "{:?} {info:?}", files.ranges());
    assert!(
        files
            .seen()
            .iter()
            .all(|h| h["accept-encoding"] == "identity")
    );
}

/// Runs `work` in this task or a spawned one.
async fn run<T: Send + 'static>(
    spawned: bool,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    match spawned {
        true => tokio::spawn(work).await.unwrap(),
        false => work.await,
    }
}

fn reason(end: Result<(), BoxError>) -> StopReason {
    let error = end.unwrap_err();
    error
        .downcast_ref::<RetryError>()
        .unwrap_or_else(|| panic!("a RetryError: {error}"))
        .info()
        .stop()
}

/// A server that ignores `Range` answers the continuation with a 200 of the whole file and
/// the same strong ETag: the layer drops the bytes the caller already had, read off a real
/// connection (HTTP/1, and HTTP/2 with a reset stream).
async fn a_200_with_the_same_etag_is_skipped(spawned: bool) {
    for h2 in [false, true] {
        let mut file = File::new(100_000);
        file.ignore_range = true;
        let cut = match h2 {
            false => Cut::After(40_000),
            true => Cut::Later(40_000),
        };
        let files = FileServer::new(file, &[cut]);
        let server = serve_files(files.clone(), h2).await;
        let work = download(client_over(RetryPolicy::new(), h2), server.url("/big"));
        let (bytes, end, info) = run(spawned, work).await;
        end.unwrap();
        assert_eq!(bytes, files.content(), "h2={h2}");
        assert_eq!(info.continuations().len(), 1);
        assert_eq!(
            info.continuations()[0].outcome,
            tower_http_retry::AttemptOutcome::Response(http::StatusCode::OK)
        );
    }
}

/// No `Content-Length` (HTTP/1 chunked): a connection aborted mid-chunk is continued, and
/// one aborted after the last byte (before the last chunk) gets its continuation answered
/// with a 416 (the layer could not know every byte had come), which ends the body cleanly.
async fn a_chunked_download_is_continued(spawned: bool) {
    let mut file = File::new(100_000);
    file.chunked = true;
    let files = FileServer::new(file.clone(), &[Cut::After(30_000)]);
    let server = serve_files(files.clone(), false).await;
    let (bytes, end, info) = run(
        spawned,
        download(client(RetryPolicy::new()), server.url("/big")),
    )
    .await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    assert!(files.seen()[1].get(http::header::RANGE).is_some());
    assert_eq!(info.continuations().len(), 1);

    // Every byte written, the failure 50 ms later: the client has read them all.
    let files = FileServer::new(file, &[Cut::Later(100_000)]);
    let server = serve_files(files.clone(), false).await;
    let (bytes, end, info) = run(
        spawned,
        download(client(RetryPolicy::new()), server.url("/big")),
    )
    .await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    assert_eq!(files.ranges(), [None, Some("bytes=100000-".into())]);
    assert_eq!(
        info.continuations()[0].outcome,
        tower_http_retry::AttemptOutcome::Response(http::StatusCode::RANGE_NOT_SATISFIABLE)
    );
}

/// Short 206s over a kept-alive HTTP/1 connection: each clean early end gets another
/// continuation.
async fn short_206s_are_continued(spawned: bool) {
    let mut file = File::new(100_000);
    file.short = Some(25_000);
    let files = FileServer::new(file, &[Cut::After(10_000)]);
    let server = serve_files(files.clone(), false).await;
    let (bytes, end, info) = run(
        spawned,
        download(client(RetryPolicy::new()), server.url("/big")),
    )
    .await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    // The first from what the caller had (at most the 10,000 bytes written: what was in
    // flight is lost with the aborted connection), then 25,000 further each time.
    let ranges = files.ranges();
    let starts: Vec<u64> = ranges[1..]
        .iter()
        .map(|r| {
            let r = r.as_deref().unwrap();
            r["bytes=".len()..r.len() - 1].parse().unwrap()
        })
        .collect();
    assert!(0 < starts[0] && starts[0] <= 10_000, "{ranges:?}");
    assert!(
        starts.windows(2).all(|w| w[1] == w[0] + 25_000),
        "{ranges:?}"
    );
    assert_eq!(
        starts.len(),
        (100_000 - starts[0] as usize).div_ceil(25_000)
    );
    assert_eq!(info.continuations().len(), starts.len());
}

/// The caller's own range, cut over a real connection: the continuation keeps its end.
async fn the_callers_range_is_continued_within_it(spawned: bool) {
    let files = FileServer::new(File::new(100_000), &[Cut::After(20_000)]);
    let server = serve_files(files.clone(), false).await;
    let mut request = get(&server.url("/big"));
    request
        .headers_mut()
        .insert(http::header::RANGE, "bytes=10000-59999".parse().unwrap());
    let (bytes, end, _) = run(
        spawned,
        download_request(client(RetryPolicy::new()), request),
    )
    .await;
    end.unwrap();
    assert_eq!(bytes, files.content().slice(10_000..60_000));
    let ranges = files.ranges();
    assert_eq!(ranges[0].as_deref(), Some("bytes=10000-59999"));
    // From what the caller had, at most the 20,000 bytes the server wrote.
    let from: u64 = ranges[1].as_deref().unwrap()["bytes=".len()..]
        .split_once('-')
        .unwrap()
        .0
        .parse()
        .unwrap();
    assert!((10_000..=30_000).contains(&from), "{ranges:?}");
    assert!(
        ranges[1].as_deref().unwrap().ends_with("-59999"),
        "{ranges:?}"
    );
}

/// Validators over the wire: a weak ETag is none (the body ends, nothing is sent); a
/// strong Last-Modified goes in `If-Range` and the download is continued; one too recent
/// (`Date` within a second of it) is none.
async fn validators_over_the_wire(spawned: bool) {
    let mut weak = File::new(100_000);
    weak.etag = Some("W/\"v1\"");
    let files = FileServer::new(weak, &[Cut::After(30_000)]);
    let server = serve_files(files.clone(), false).await;
    let (bytes, end, _) = run(
        spawned,
        download(client(RetryPolicy::new()), server.url("/big")),
    )
    .await;
    assert_eq!(reason(end), StopReason::NoValidator);
    assert_eq!(bytes, files.content().slice(..bytes.len()));
    assert_eq!(files.seen().len(), 1);

    let mut dated = File::new(100_000);
    dated.etag = None;
    dated.last_modified = Some("Sun, 06 Nov 1994 08:49:37 GMT");
    dated.date = Some("Sun, 06 Nov 1994 09:49:37 GMT");
    let files = FileServer::new(dated.clone(), &[Cut::After(30_000)]);
    let server = serve_files(files.clone(), false).await;
    let (bytes, end, _) = run(
        spawned,
        download(client(RetryPolicy::new()), server.url("/big")),
    )
    .await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    assert_eq!(files.seen()[1]["if-range"], "Sun, 06 Nov 1994 08:49:37 GMT");

    dated.date = Some("Sun, 06 Nov 1994 08:49:37 GMT");
    let files = FileServer::new(dated, &[Cut::After(30_000)]);
    let server = serve_files(files.clone(), false).await;
    let (_, end, _) = run(
        spawned,
        download(client(RetryPolicy::new()), server.url("/big")),
    )
    .await;
    assert_eq!(reason(end), StopReason::NoValidator);
    assert_eq!(files.seen().len(), 1);
}

/// A continuation's `Content-Range` that starts before the next byte has the overlap
/// dropped; one that starts after it (object_store 654) ends the body.
async fn content_range_before_and_after(spawned: bool) {
    let mut before = File::new(100_000);
    before.shift = -1000;
    let files = FileServer::new(before, &[Cut::After(30_000)]);
    let server = serve_files(files.clone(), false).await;
    let (bytes, end, _) = run(
        spawned,
        download(client(RetryPolicy::new()), server.url("/big")),
    )
    .await;
    end.unwrap();
    assert_eq!(bytes, files.content());

    let mut after = File::new(100_000);
    after.shift = 100;
    let files = FileServer::new(after, &[Cut::After(30_000)]);
    let server = serve_files(files.clone(), false).await;
    let (bytes, end, _) = run(
        spawned,
        download(client(RetryPolicy::new()), server.url("/big")),
    )
    .await;
    assert_eq!(reason(end), StopReason::RangeMismatch);
    assert_eq!(bytes, files.content().slice(..bytes.len()));
}

/// Without `body_idle_timeout`, a body stalled on a real connection waits: nothing is sent
/// again within half a second.
async fn a_stall_without_idle_timeout_waits(spawned: bool) {
    let files = FileServer::new(File::new(50_000), &[Cut::Stall(10_000)]);
    let server = serve_files(files.clone(), false).await;
    let work = download(client(RetryPolicy::new()), server.url("/big"));
    let waited = run(spawned, async move {
        tokio::time::timeout(Duration::from_millis(500), work)
            .await
            .is_err()
    })
    .await;
    assert!(waited, "still waiting after 500 ms");
    assert_eq!(files.seen().len(), 1);
}

/// gzip the caller asked for, cut: continued as the encoded bytes the layer sees, every
/// request with the caller's `Accept-Encoding` (HTTP/1 and HTTP/2).
async fn a_gzip_download_is_continued_as_encoded_bytes(spawned: bool) {
    for h2 in [false, true] {
        let mut file = File::new(100_000);
        file.encoding = Some("gzip");
        let cut = match h2 {
            false => Cut::After(30_000),
            true => Cut::Later(30_000),
        };
        let files = FileServer::new(file, &[cut]);
        let server = serve_files(files.clone(), h2).await;
        let mut request = get(&server.url("/big"));
        request
            .headers_mut()
            .insert(http::header::ACCEPT_ENCODING, "gzip".parse().unwrap());
        let (bytes, end, info) = run(
            spawned,
            download_request(client_over(RetryPolicy::new(), h2), request),
        )
        .await;
        end.unwrap();
        assert_eq!(bytes, files.content(), "h2={h2}");
        assert_eq!(info.continuations().len(), 1);
        assert!(files.seen().iter().all(|h| h["accept-encoding"] == "gzip"));
    }
}

on_both_runtimes! {
    a_cut_http1_download_is_continued_whole => cut_download_is_whole,
    a_stalled_http1_download_is_continued_after_the_idle_timeout => stalled_download_is_continued,
    a_file_replaced_mid_http1_download_ends_with_representation_changed => a_file_replaced_mid_download_is_never_spliced,
    a_reset_http2_stream_mid_body_is_continued => a_reset_http2_stream_is_continued,
    a_200_with_the_same_etag_over_a_real_connection_is_skipped => a_200_with_the_same_etag_is_skipped,
    a_chunked_http1_download_is_continued_and_ended_by_a_416 => a_chunked_download_is_continued,
    short_206s_over_http1_are_continued => short_206s_are_continued,
    the_callers_own_range_over_http1_is_continued_within_it => the_callers_range_is_continued_within_it,
    weak_etags_and_last_modified_over_http1 => validators_over_the_wire,
    object_store_654_content_ranges_before_and_after_the_next_byte_over_http1 => content_range_before_and_after,
    without_an_idle_timeout_a_stalled_http1_body_waits => a_stall_without_idle_timeout_waits,
    a_gzip_download_is_continued_as_its_encoded_bytes => a_gzip_download_is_continued_as_encoded_bytes,
}

/// The body can be boxed as hyper and axum box bodies (`Send + Sync`), and the future of
/// the service over a hyper-util client can be spawned.
#[test]
fn the_body_and_the_future_are_send_and_the_body_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<tower_http_retry::ResumeBody<hyper::body::Incoming>>();
    send_sync::<Retry<HyperClient, Resume>>();
    send::<<Retry<HyperClient, Resume> as Service<Request<Body>>>::Future>();
}
