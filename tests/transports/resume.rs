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
    Backoff, ReplayBody, Resume, ResumeError, ResumeInfo, RetryLayer, RetryPolicy, StopReason,
};

use crate::common::files::{Cut, File, FileServer, serve_files};

type Body = BoxBody<Bytes, BoxError>;
type HyperClient = Client<HttpConnector, ReplayBody<Body>>;

fn client(policy: RetryPolicy) -> Resume<HyperClient> {
    client_over(policy, false)
}

fn client_over(policy: RetryPolicy, h2: bool) -> Resume<HyperClient> {
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
    mut client: Resume<HyperClient>,
    url: String,
) -> (Bytes, Result<(), BoxError>, ResumeInfo) {
    let response = client.ready().await.unwrap().call(get(&url)).await.unwrap();
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
    let error = error.downcast_ref::<ResumeError>().expect("a ResumeError");
    assert_eq!(error.reason(), StopReason::RepresentationChanged);
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

macro_rules! on_both_runtimes {
    ($($name:ident => $scenario:ident,)*) => {
        mod current_thread {
            $(
                #[tokio::test(flavor = "current_thread")]
                async fn $name() {
                    super::$scenario(false).await;
                    super::$scenario(true).await;
                }
            )*
        }
        mod multi_thread {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$scenario(false).await;
                    super::$scenario(true).await;
                }
            )*
        }
    };
}

on_both_runtimes! {
    a_cut_http1_download_is_continued_whole => cut_download_is_whole,
    a_stalled_http1_download_is_continued_after_the_idle_timeout => stalled_download_is_continued,
    a_file_replaced_mid_http1_download_ends_with_representation_changed => a_file_replaced_mid_download_is_never_spliced,
    a_reset_http2_stream_mid_body_is_continued => a_reset_http2_stream_is_continued,
}

/// The body can be boxed as hyper and axum box bodies (`Send + Sync`), and the future of
/// the service over a hyper-util client can be spawned.
#[test]
fn the_body_and_the_future_are_send_and_the_body_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<tower_http_retry::ResumeBody<hyper::body::Incoming>>();
    send_sync::<Resume<HyperClient>>();
    send::<<Resume<HyperClient> as Service<Request<Body>>>::Future>();
}
