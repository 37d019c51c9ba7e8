//! Resumable response bodies through reqwest, against a real hyper server on 127.0.0.1 that
//! cuts its bodies on a script (`tests/common/files.rs`): the resumable layer over a
//! `ReqwestService` (with `oneshot` and with `send_with`), and `RetryMiddleware::resume`,
//! whose `reqwest::Response` is read with `bytes()`, `chunk()` and `bytes_stream()`. Then
//! encodings: this binary's reqwest decompresses gzip itself (the `gzip` feature of the
//! dev-dependency). On both runtimes, each awaited and spawned.

use std::io::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tower::{Layer, ServiceExt};
use tower_http_retry::{Backoff, ResumeInfo, RetryLayer, RetryPolicy, StopReason};
use tower_http_retry_reqwest::{Error, RequestBuilderExt, ReqwestService};

use crate::common::files::{Cut, File, FileServer, serve_files};

on_both_runtimes!(
    the_layer_over_reqwest_service_continues_a_cut_body,
    send_with_continues_a_cut_body_read_with_chunk,
    a_body_not_continued_fails_reqwests_read_with_the_record,
    a_gzip_capable_reqwest_is_sent_identity_and_resumes,
    a_gzip_body_reqwest_decoded_is_never_spliced,
    a_gzip_body_reqwest_leaves_encoded_is_continued_as_its_bytes,
);

fn reqwest_client() -> reqwest::Client {
    // No proxy from the environment: every request goes straight to 127.0.0.1. gzip is on
    // (the feature's default when it is built in).
    reqwest::Client::builder().no_proxy().build().unwrap()
}

fn layer() -> RetryLayer {
    let backoff = Backoff::exponential(Duration::from_millis(5), Duration::from_millis(20));
    RetryLayer::new().policy(RetryPolicy::new().backoff(backoff))
}

/// `len` bytes that gzip does not shrink much, so that a cut in the encoded bytes falls
/// as far into the decoded ones.
fn noise(len: usize) -> File {
    let mut x: u32 = 0x2545_f491;
    let content: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect();
    File {
        content: content.into(),
        ..File::new(0)
    }
}

fn gzip(content: &[u8]) -> Bytes {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(content).unwrap();
    encoder.finish().unwrap().into()
}

/// The file with a gzip representation (ETag `"v1-gz"`) served to a request that asks.
fn with_gzip(mut file: File) -> File {
    file.gzip = Some((gzip(&file.content), "\"v1-gz\""));
    file
}

/// Runs `work` awaited, then spawned.
async fn both_ways<F, Fut>(work: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    work().await;
    tokio::spawn(work()).await.unwrap();
}

/// The start of each continuation's `Range: bytes=N-` the server saw.
fn range_starts(files: &FileServer) -> Vec<u64> {
    files
        .ranges()
        .iter()
        .flatten()
        .map(|range| range["bytes=".len()..range.len() - 1].parse().unwrap())
        .collect()
}

/// `RetryLayer::new().resume().layer(ReqwestService::new(client))` with `oneshot`: the
/// body, cut twice, comes out whole; and back in a `reqwest::Response`.
async fn the_layer_over_reqwest_service_continues_a_cut_body() {
    both_ways(|| async {
        let files = FileServer::new(
            File::new(100_000),
            &[Cut::After(30_000), Cut::After(20_000)],
        );
        let server = serve_files(files.clone(), false).await;
        let service = layer()
            .resume()
            .layer(ReqwestService::new(reqwest_client()));
        let request = http::Request::get(server.url("/big"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = service.clone().oneshot(request).await.unwrap();
        let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(bytes, files.content());
        assert_eq!(info.continuations().len(), 2);
        let starts = range_starts(&files);
        assert_eq!(starts.len(), 2, "{:?}", files.ranges());
        assert!(0 < starts[0] && starts[0] <= 30_000, "{starts:?}");
        assert!(starts[0] < starts[1] && starts[1] <= starts[0] + 20_000);
        // Identity asked on every request: the layer's default.
        assert!(
            files
                .seen()
                .iter()
                .all(|h| h["accept-encoding"] == "identity")
        );

        // The same, as a `reqwest::Response` (the body wrapped in reqwest's).
        let files = FileServer::new(File::new(50_000), &[Cut::After(10_000)]);
        let server = serve_files(files.clone(), false).await;
        let request = http::Request::get(server.url("/big"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        let response = reqwest::Response::from(response.map(reqwest::Body::wrap));
        assert_eq!(response.bytes().await.unwrap(), files.content());
        assert_eq!(files.ranges().len(), 2);
    })
    .await;
}

/// `send_with` through the resumable layer: a `reqwest::Response` whose `chunk()` goes on
/// across the cuts, with the `ResumeInfo` in its extensions.
async fn send_with_continues_a_cut_body_read_with_chunk() {
    both_ways(|| async {
        let files = FileServer::new(
            File::new(200_000),
            &[Cut::After(50_000), Cut::After(1), Cut::After(70_000)],
        );
        let server = serve_files(files.clone(), false).await;
        let client = reqwest_client();
        let service = layer().resume().layer(ReqwestService::new(client.clone()));
        let mut response = client
            .get(server.url("/big"))
            .send_with(&service)
            .await
            .unwrap();
        let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
        let mut bytes = Vec::new();
        let mut chunks = 0;
        while let Some(chunk) = response.chunk().await.unwrap() {
            bytes.extend_from_slice(&chunk);
            chunks += 1;
            assert!(chunks < 100_000, "bounded");
        }
        assert_eq!(Bytes::from(bytes), files.content());
        assert_eq!(info.continuations().len(), 3);
        assert_eq!(files.ranges().len(), 4);
    })
    .await;
}

/// A file replaced mid-download: reqwest's read fails, and `Error::from` finds the layer's
/// record in its source chain (why: the representation changed); only old bytes came.
async fn a_body_not_continued_fails_reqwests_read_with_the_record() {
    both_ways(|| async {
        let mut v2 = File::new(100_000);
        v2.etag = Some("\"v2\"");
        v2.content = vec![9u8; 100_000].into();
        let files = FileServer::new(File::new(100_000), &[Cut::After(40_000)]).replace_after(1, v2);
        let server = serve_files(files.clone(), false).await;
        let client = reqwest_client();
        let service = layer().resume().layer(ReqwestService::new(client.clone()));
        let mut response = client
            .get(server.url("/big"))
            .send_with(&service)
            .await
            .unwrap();
        let mut bytes = Vec::new();
        let error = loop {
            match response.chunk().await {
                Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
                Ok(None) => panic!("the body ended without its error"),
                Err(error) => break error,
            }
        };
        assert_eq!(
            Bytes::from(bytes),
            File::new(100_000).content.slice(..40_000)
        );
        let error = Error::from(error);
        assert_eq!(
            error.info().map(|info| info.stop()),
            Some(StopReason::RepresentationChanged),
            "{error:?}"
        );
    })
    .await;
}

/// A reqwest that decompresses gzip, and a server that gzips when asked: the resumable
/// layer asks for identity, gets the file's own bytes and continues them across a cut.
/// The same client without the layer asks for gzip (reqwest's own header) and decodes it:
/// both halves of the setting are real.
async fn a_gzip_capable_reqwest_is_sent_identity_and_resumes() {
    both_ways(|| async {
        let file = with_gzip(noise(100_000));
        let files = FileServer::new(file.clone(), &[Cut::Whole, Cut::After(30_000)]);
        let server = serve_files(files.clone(), false).await;
        let client = reqwest_client();

        let plain = client.get(server.url("/big")).send().await.unwrap();
        assert_eq!(plain.headers().get("content-encoding"), None); // decoded by reqwest
        assert_eq!(plain.bytes().await.unwrap(), file.content);
        assert_eq!(files.seen()[0]["accept-encoding"], "gzip");

        let service = layer().resume().layer(ReqwestService::new(client.clone()));
        let response = client
            .get(server.url("/big"))
            .send_with(&service)
            .await
            .unwrap();
        assert_eq!(response.headers()["etag"], "\"v1\"");
        assert_eq!(response.bytes().await.unwrap(), file.content);
        let seen = files.seen();
        assert_eq!(seen.len(), 3);
        assert!(seen[1..].iter().all(|h| h["accept-encoding"] == "identity"));
        assert_eq!(range_starts(&files).len(), 1);
    })
    .await;
}

/// The caller asks for gzip itself, and reqwest decompresses it below the layer, removing
/// `Content-Encoding` and `Content-Length`: the layer counts decoded bytes, and asks the
/// continuation from there; the server's 206 is a cut into the gzip stream, which reqwest
/// decodes too. `ReqwestService` withholds such a 206's range (no `Content-Length`, no
/// `Content-Encoding`: it cannot be shown to be the bytes asked for), so the body ends with
/// the layer's error: decoded bytes of the first answer only, never a splice.
async fn a_gzip_body_reqwest_decoded_is_never_spliced() {
    both_ways(|| async {
        let file = with_gzip(noise(100_000));
        let files = FileServer::new(file.clone(), &[Cut::After(40_000)]);
        let server = serve_files(files.clone(), false).await;
        let client = reqwest_client();
        let service = layer().resume().layer(ReqwestService::new(client.clone()));
        let response = client
            .get(server.url("/big"))
            .header("accept-encoding", "gzip")
            .send_with(&service)
            .await
            .unwrap();
        assert_eq!(response.headers()["etag"], "\"v1-gz\"");
        let (bytes, error) = read_to_error(response).await;
        let error = Error::from(error);
        let info = error.info().expect("the layer's record");
        assert_eq!(info.stop(), StopReason::RangeMismatch, "{error:?}");
        assert!(!bytes.is_empty() && bytes.len() < file.content.len());
        assert_eq!(bytes, file.content.slice(..bytes.len()), "a prefix only");
        // One continuation was sent, from the decoded count, and its answer refused.
        assert_eq!(range_starts(&files), [bytes.len() as u64]);
        assert_eq!(files.seen()[1]["if-range"], "\"v1-gz\"");
    })
    .await;
}

/// The caller asks for gzip, and a reqwest told not to decompress it (`no_gzip`) hands the
/// gzip bytes and their `Content-Encoding` to the layer: continued as the encoded bytes,
/// and whole once decoded.
async fn a_gzip_body_reqwest_leaves_encoded_is_continued_as_its_bytes() {
    both_ways(|| async {
        let file = with_gzip(noise(100_000));
        let encoded = file.gzip.clone().unwrap().0;
        let files = FileServer::new(file.clone(), &[Cut::After(30_000), Cut::After(20_000)]);
        let server = serve_files(files.clone(), false).await;
        let client = reqwest::Client::builder()
            .no_proxy()
            .no_gzip()
            .build()
            .unwrap();
        let service = layer().resume().layer(ReqwestService::new(client.clone()));
        let response = client
            .get(server.url("/big"))
            .header("accept-encoding", "gzip")
            .send_with(&service)
            .await
            .unwrap();
        assert_eq!(response.headers()["content-encoding"], "gzip");
        let bytes = response.bytes().await.unwrap();
        assert_eq!(bytes, encoded);
        let mut decoded = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut decoded)
            .unwrap();
        assert_eq!(decoded, file.content);
        assert_eq!(range_starts(&files).len(), 2);
        assert!(files.seen().iter().all(|h| h["accept-encoding"] == "gzip"));
    })
    .await;
}

/// Reads `response` with `chunk()` to its error: the bytes before it, and the error.
async fn read_to_error(mut response: reqwest::Response) -> (Bytes, reqwest::Error) {
    let mut bytes = Vec::new();
    for _ in 0..1_000_000 {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            Ok(None) => panic!("the body ended without an error"),
            Err(error) => return (bytes.into(), error),
        }
    }
    panic!("more than a million chunks");
}

#[cfg(feature = "middleware")]
mod through_the_middleware {
    use super::*;
    use futures_util::StreamExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http::Extensions;
    use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
    use tower_http_retry_reqwest::RetryMiddleware;

    /// Counts the calls that reach it; fails the first `fail` of them with a connection
    /// reset (raised by this middleware, nothing sent).
    #[derive(Clone, Default)]
    struct Below {
        calls: Arc<AtomicUsize>,
        fail: usize,
    }

    impl Below {
        fn calls(&self) -> usize {
            self.calls.load(Ordering::SeqCst)
        }
    }

    #[async_trait::async_trait]
    impl Middleware for Below {
        async fn handle(
            &self,
            req: reqwest::Request,
            extensions: &mut Extensions,
            next: Next<'_>,
        ) -> reqwest_middleware::Result<reqwest::Response> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst);
            if n < self.fail {
                let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
                return Err(reqwest_middleware::Error::middleware(reset));
            }
            next.run(req, extensions).await
        }
    }

    /// `RetryMiddleware::new(layer).resume(client) -> below -> client`.
    fn client(fail: usize) -> (ClientWithMiddleware, Below) {
        let below = Below {
            fail,
            ..Below::default()
        };
        let reqwest_client = reqwest_client();
        let client = ClientBuilder::new(reqwest_client.clone())
            .with(RetryMiddleware::new(layer()).resume(reqwest_client))
            .with(below.clone())
            .build();
        (client, below)
    }

    on_both_runtimes!(
        the_middleware_continues_a_cut_body_read_with_bytes_stream,
        the_middlewares_head_retries_go_down_the_chain_and_continuations_to_the_client,
        a_gzip_body_reqwest_decoded_is_never_spliced_through_the_middleware,
        a_hedged_head_runs_beside_the_first_attempt_down_the_chain,
        what_is_not_resumed_passes_through_the_middleware,
    );

    /// Through the resumable middleware, a POST's answer and a GET whose request turned
    /// resumption off (`with_extension(RetryPolicy::new().resume(false))`) come as they
    /// are: no `ResumeInfo`, and a cut body fails as reqwest's own read would, with no
    /// continuation sent.
    async fn what_is_not_resumed_passes_through_the_middleware() {
        both_ways(|| async {
            let files = FileServer::new(File::new(20_000), &[Cut::Whole, Cut::After(5_000)]);
            let server = serve_files(files.clone(), false).await;
            let (client, _) = client(0);
            let response = client.post(server.url("/big")).send().await.unwrap();
            assert!(response.extensions().get::<ResumeInfo>().is_none());
            assert_eq!(response.bytes().await.unwrap(), files.content());

            let response = client
                .get(server.url("/big"))
                .with_extension(RetryPolicy::new().resume(false))
                .send()
                .await
                .unwrap();
            assert!(response.extensions().get::<ResumeInfo>().is_none());
            let (bytes, error) = read_to_error(response).await;
            // At most the 5,000 the server wrote before it aborted (what was in flight is
            // lost with the connection).
            assert!(bytes.len() <= 5_000, "{}", bytes.len());
            assert!(bytes == files.content().slice(..bytes.len()), "a prefix");
            assert!(Error::from(error).info().is_none(), "not the layer's");
            assert_eq!(files.seen().len(), 2);
            assert!(
                files.seen()[1]
                    .get("accept-encoding")
                    .is_none_or(|v| v != "identity")
            );
        })
        .await;
    }

    /// Holds the first call until a second one came (at most 10 s), then fails it with a
    /// reset; lets every other call through.
    #[derive(Clone, Default)]
    struct HoldFirst {
        calls: Arc<AtomicUsize>,
        second: Arc<tokio::sync::Notify>,
    }

    #[async_trait::async_trait]
    impl Middleware for HoldFirst {
        async fn handle(
            &self,
            req: reqwest::Request,
            extensions: &mut Extensions,
            next: Next<'_>,
        ) -> reqwest_middleware::Result<reqwest::Response> {
            if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
                let came = tokio::time::timeout(Duration::from_secs(10), self.second.notified());
                assert!(came.await.is_ok(), "no second attempt beside the first");
                let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
                return Err(reqwest_middleware::Error::middleware(reset));
            }
            self.second.notify_one();
            next.run(req, extensions).await
        }
    }

    /// A hedge goes down the chain while the first attempt is still running there (the
    /// first is held until the hedge came: were attempts run one after the other, it would
    /// wait its 10 s and fail the test); the hedge's answer, cut, is continued.
    async fn a_hedged_head_runs_beside_the_first_attempt_down_the_chain() {
        both_ways(|| async {
            let files = FileServer::new(File::new(100_000), &[Cut::After(30_000)]);
            let server = serve_files(files.clone(), false).await;
            let hold = HoldFirst::default();
            let reqwest_client = reqwest_client();
            let policy = RetryPolicy::new()
                .max_attempts(2)
                .hedge(tower_http_retry::Hedging::after(Duration::from_millis(20)));
            let client = ClientBuilder::new(reqwest_client.clone())
                .with(RetryMiddleware::new(layer().policy(policy)).resume(reqwest_client))
                .with(hold.clone())
                .build();
            let response = client.get(server.url("/big")).send().await.unwrap();
            let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
            assert_eq!(response.bytes().await.unwrap(), files.content());
            assert_eq!(hold.calls.load(Ordering::SeqCst), 2);
            assert_eq!(info.continuations().len(), 1);
            // The hedge's request, then its continuation.
            assert_eq!(files.seen().len(), 2);
        })
        .await;
    }

    /// `RetryMiddleware::resume`: reqwest's `bytes_stream()` goes on across two cuts.
    async fn the_middleware_continues_a_cut_body_read_with_bytes_stream() {
        both_ways(|| async {
            let files = FileServer::new(
                File::new(150_000),
                &[Cut::After(40_000), Cut::After(40_000)],
            );
            let server = serve_files(files.clone(), false).await;
            let (client, _) = client(0);
            let response = client.get(server.url("/big")).send().await.unwrap();
            let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
            assert_eq!(response.url().path(), "/big");
            let mut stream = response.bytes_stream();
            let mut bytes = Vec::new();
            while let Some(chunk) = stream.next().await {
                bytes.extend_from_slice(&chunk.unwrap());
                assert!(bytes.len() <= 150_000);
            }
            assert_eq!(Bytes::from(bytes), files.content());
            assert_eq!(info.continuations().len(), 2);
            assert_eq!(range_starts(&files).len(), 2);
        })
        .await;
    }

    /// The head's retries go down the middleware chain (the middleware below sees them); the
    /// body's continuations, sent after the middleware returned, go to the client (the
    /// middleware below does not see them; the server does).
    async fn the_middlewares_head_retries_go_down_the_chain_and_continuations_to_the_client() {
        both_ways(|| async {
            let files = FileServer::new(File::new(100_000), &[Cut::After(30_000)]);
            let server = serve_files(files.clone(), false).await;
            let (client, below) = client(1);
            let response = client.get(server.url("/big")).send().await.unwrap();
            let record = response
                .extensions()
                .get::<tower_http_retry::RetryInfo>()
                .cloned()
                .unwrap();
            assert_eq!(record.attempts(), 2); // the reset below, then the answer
            assert_eq!(response.bytes().await.unwrap(), files.content());
            assert_eq!(below.calls(), 2);
            assert_eq!(files.seen().len(), 2); // the answer, its continuation
            assert_eq!(range_starts(&files).len(), 1);
        })
        .await;
    }

    /// As `a_gzip_body_reqwest_decoded_is_never_spliced`, through the middleware.
    async fn a_gzip_body_reqwest_decoded_is_never_spliced_through_the_middleware() {
        both_ways(|| async {
            let file = with_gzip(noise(100_000));
            let files = FileServer::new(file.clone(), &[Cut::After(40_000)]);
            let server = serve_files(files.clone(), false).await;
            let (client, _) = client(0);
            let response = client
                .get(server.url("/big"))
                .header("accept-encoding", "gzip")
                .send()
                .await
                .unwrap();
            let (bytes, error) = read_to_error(response).await;
            let error = Error::from(error);
            assert_eq!(
                error.info().map(|info| info.stop()),
                Some(StopReason::RangeMismatch),
                "{error:?}"
            );
            assert_eq!(bytes, file.content.slice(..bytes.len()), "a prefix only");
            assert_eq!(range_starts(&files), [bytes.len() as u64]);
        })
        .await;
    }
}
