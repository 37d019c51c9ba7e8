//! Resumable response bodies (`RetryLayer::resume`) against an in-process file server
//! (`tower::service_fn`) that cuts or stalls bodies on a script, under paused time: the
//! continuation's request, what is accepted, what ends the body and why, the limits.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::{BoxError, Layer, ServiceExt};
use tower_http_retry::{
    AttemptKind, Backoff, Jitter, ReplayBody, ResumeBody, ResumeInfo, RetryBudget, RetryError,
    RetryLayer, RetryPolicy, RouteMatch, StopReason, classify::RetryReason,
};

use crate::common::files::{Cut, File, FileBody, FileServer};

type Client = tower_http_retry::Retry<FileServer, tower_http_retry::Resume>;

fn client(layer: RetryLayer, files: &FileServer) -> Client {
    layer
        .policy(RetryPolicy::new().backoff(Backoff::exponential(
            Duration::from_millis(100),
            Duration::from_secs(1),
        )))
        .resume()
        .layer(files.clone())
}

fn get(uri: &str) -> Request<Full<Bytes>> {
    Request::get(uri).body(Full::new(Bytes::new())).unwrap()
}

/// Reads the whole body: the bytes handed over, and how it ended.
async fn read(body: ResumeBody<FileBody>) -> (Vec<u8>, Result<(), BoxError>) {
    let mut body = body;
    let mut bytes = Vec::new();
    loop {
        match body.frame().await {
            None => return (bytes, Ok(())),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    bytes.extend_from_slice(&data);
                }
            }
            Some(Err(error)) => return (bytes, Err(error)),
        }
    }
}

async fn download(
    client: Client,
    request: Request<Full<Bytes>>,
) -> (Vec<u8>, Result<(), BoxError>, ResumeInfo) {
    let response = client.oneshot(request).await.unwrap();
    let info = response
        .extensions()
        .get::<ResumeInfo>()
        .cloned()
        .expect("resumable");
    let (bytes, end) = read(response.into_body()).await;
    (bytes, end, info)
}

fn stop(end: Result<(), BoxError>) -> StopReason {
    let error = end.expect_err("the body ends with an error");
    error
        .downcast_ref::<RetryError>()
        .expect("a RetryError")
        .info()
        .stop()
}

#[tokio::test(start_paused = true)]
async fn a_body_cut_twice_is_continued_whole() {
    let files = FileServer::new(File::new(1000), &[Cut::After(300), Cut::After(400)]);
    let (bytes, end, info) =
        download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    assert_eq!(
        files.ranges(),
        [None, Some("bytes=300-".into()), Some("bytes=700-".into())]
    );
    for seen in &files.seen()[1..] {
        assert_eq!(seen["if-range"], "\"v1\"");
    }
    // Asked unencoded: the range counts the bytes as sent.
    assert!(
        files
            .seen()
            .iter()
            .all(|h| h["accept-encoding"] == "identity")
    );
    let continuations = info.continuations();
    assert_eq!(continuations.len(), 2);
    for c in &continuations {
        assert_eq!(c.kind, AttemptKind::Continuation);
        assert_eq!(c.reason, RetryReason::ConnectionClosed);
        assert_eq!(
            c.outcome,
            tower_http_retry::AttemptOutcome::Response(http::StatusCode::PARTIAL_CONTENT)
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_callers_own_range_is_continued_within_it() {
    let files = FileServer::new(File::new(1000), &[Cut::After(30)]);
    let mut request = get("http://h/file");
    request
        .headers_mut()
        .insert("range", "bytes=100-199".parse().unwrap());
    let (bytes, end, info) = download(client(RetryLayer::new(), &files), request).await;
    end.unwrap();
    assert_eq!(bytes, files.content()[100..200]);
    assert_eq!(
        files.ranges(),
        [Some("bytes=100-199".into()), Some("bytes=130-199".into())]
    );
    assert_eq!(info.continuations().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_caller_chosen_accept_encoding_is_kept() {
    let files = FileServer::new(File::new(10), &[]);
    let mut request = get("http://h/file");
    request
        .headers_mut()
        .insert("accept-encoding", "identity".parse().unwrap());
    let (_, end, _) = download(client(RetryLayer::new(), &files), request).await;
    end.unwrap();
    assert_eq!(files.seen()[0]["accept-encoding"], "identity");
}

/// A caller that asked for an encoding, answered with none named: the bytes may have been
/// decoded below the layer (a decompressing client or layer hides `Content-Encoding`), and
/// a range could not say where they stand, so the body passes through, not continued.
#[tokio::test(start_paused = true)]
async fn an_asked_encoding_answered_with_none_named_is_not_continued() {
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]);
    let mut request = get("http://h/file");
    request
        .headers_mut()
        .insert("accept-encoding", "gzip".parse().unwrap());
    let response = client(RetryLayer::new(), &files)
        .oneshot(request)
        .await
        .unwrap();
    assert!(response.extensions().get::<ResumeInfo>().is_none());
    let (bytes, end) = read(response.into_body()).await;
    // The inner body's own failure, as it is.
    let error = end.unwrap_err();
    assert!(error.downcast_ref::<RetryError>().is_none(), "{error}");
    assert_eq!(bytes.len(), 300);
    assert_eq!(files.seen().len(), 1);
    assert_eq!(files.seen()[0]["accept-encoding"], "gzip");
}

#[tokio::test(start_paused = true)]
async fn a_changed_etag_mid_download_ends_the_body_never_spliced() {
    let mut v2 = File::new(1000);
    v2.etag = Some("\"v2\"");
    v2.content = vec![7u8; 1000].into();
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]).replace_after(1, v2);
    let (bytes, end, info) =
        download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    // The server saw another validator and answered 200 with the new file.
    assert_eq!(stop(end), StopReason::RepresentationChanged);
    assert_eq!(bytes, File::new(1000).content[..300]);
    assert_eq!(info.continuations().len(), 1);
}

/// A body that cannot be continued ends with the layer's one error: the request's record,
/// the continuations booked in it as retries, why it stopped, and the body's last failure
/// as its source.
#[tokio::test(start_paused = true)]
async fn a_body_not_continued_ends_with_the_requests_record() {
    let mut v2 = File::new(1000);
    v2.etag = Some("\"v2\"");
    v2.content = vec![7u8; 1000].into();
    // The body cut after 300 bytes, the continuation answered with another file.
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]).replace_after(1, v2);
    let (_, end, _) = download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    let error = end.unwrap_err();
    let error = error
        .downcast_ref::<RetryError>()
        .expect("the layer's error");
    let info = error.info();
    assert_eq!(info.stop(), StopReason::RepresentationChanged);
    // The head's attempt and the continuation, which got the other file's 200.
    assert_eq!(info.attempts(), 2, "{info:?}");
    let kinds: Vec<_> = info.retries().iter().map(|r| r.kind).collect();
    assert_eq!(kinds, [AttemptKind::Continuation]);
    assert_eq!(info.retries()[0].reason, RetryReason::ConnectionClosed);
    let outcomes: Vec<_> = info.outcomes().collect();
    let ok = tower_http_retry::AttemptOutcome::Response(http::StatusCode::OK);
    assert_eq!(outcomes, [ok, ok]);
    // The body's own failure is the source, and the message says why it stopped.
    assert_eq!(
        error
            .get_ref()
            .downcast_ref::<std::io::Error>()
            .map(|e| e.kind()),
        Some(std::io::ErrorKind::ConnectionReset)
    );
    assert!(
        error
            .to_string()
            .ends_with("(after 2 attempt(s); stopped: representation changed)"),
        "{error}"
    );
}

/// The resumable mode is the same layer: it is configured before or after `resume()`.
#[tokio::test(start_paused = true)]
async fn a_resumable_layer_is_configured_after_resume_too() {
    let files = FileServer::new(File::new(1000), &[Cut::After(100); 10]);
    let client: Client = RetryLayer::new()
        .resume()
        .policy(RetryPolicy::new().max_continuations(1))
        .layer(files.clone());
    let (bytes, end, info) = download(client, get("http://h/file")).await;
    assert_eq!(stop(end), StopReason::MaxContinuations);
    assert_eq!(bytes, files.content()[..200]);
    assert_eq!(info.continuations().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_200_with_the_same_etag_has_what_was_had_skipped() {
    let mut file = File::new(1000);
    file.ignore_range = true;
    let files = FileServer::new(file, &[Cut::After(450)]);
    let (bytes, end, _) = download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
}

#[tokio::test(start_paused = true)]
async fn a_200_without_a_validator_after_bytes_is_never_spliced() {
    let mut file = File::new(1000);
    file.etag = None;
    file.ignore_range = true;
    let files = FileServer::new(file, &[Cut::After(0), Cut::After(200)]);
    let (bytes, end, info) =
        download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    // Nothing handed over at the first cut: sent again as it was; after 200 bytes, no
    // validator to ask with, so nothing is sent.
    assert_eq!(stop(end), StopReason::NoValidator);
    assert_eq!(bytes, files.content()[..200]);
    assert_eq!(files.ranges(), [None, None]);
    assert_eq!(info.continuations().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_weak_etag_is_no_validator() {
    let mut file = File::new(100);
    file.etag = Some("W/\"v1\"");
    let files = FileServer::new(file, &[Cut::After(50)]);
    let (_, end, _) = download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    assert_eq!(stop(end), StopReason::NoValidator);
    assert_eq!(files.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_strong_last_modified_is_sent_in_if_range() {
    let mut file = File::new(500);
    file.etag = None;
    file.last_modified = Some("Sun, 06 Nov 1994 08:49:37 GMT");
    file.date = Some("Sun, 06 Nov 1994 09:49:37 GMT");
    let files = FileServer::new(file, &[Cut::After(100)]);
    let (bytes, end, _) = download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    assert_eq!(files.seen()[1]["if-range"], "Sun, 06 Nov 1994 08:49:37 GMT");
}

#[tokio::test(start_paused = true)]
async fn a_short_206_gets_another_continuation() {
    let mut file = File::new(1000);
    file.short = Some(300);
    let files = FileServer::new(file, &[Cut::After(100)]);
    let (bytes, end, info) =
        download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    // 100, then 300 at a time: 400, 700, 1000.
    assert_eq!(
        files.ranges(),
        [
            None,
            Some("bytes=100-".into()),
            Some("bytes=400-".into()),
            Some("bytes=700-".into())
        ]
    );
    let reasons: Vec<_> = info.continuations().iter().map(|c| c.reason).collect();
    assert_eq!(reasons[0], RetryReason::ConnectionClosed);
    assert!(
        reasons[1..]
            .iter()
            .all(|r| *r == RetryReason::Status(http::StatusCode::PARTIAL_CONTENT))
    );
}

#[tokio::test(start_paused = true)]
async fn a_416_after_the_last_byte_ends_cleanly() {
    // No Content-Length: the body failed after its last byte, which the layer cannot know.
    let mut file = File::new(500);
    file.chunked = true;
    let files = FileServer::new(file, &[Cut::After(500)]);
    let (bytes, end, info) =
        download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    assert_eq!(files.ranges(), [None, Some("bytes=500-".into())]);
    assert_eq!(
        info.continuations()[0].outcome,
        tower_http_retry::AttemptOutcome::Response(http::StatusCode::RANGE_NOT_SATISFIABLE)
    );
}

#[tokio::test(start_paused = true)]
async fn every_byte_arrived_sends_nothing() {
    // The error came after the Content-Length's last byte: nothing is sent, the body ends.
    let files = FileServer::new(File::new(500), &[Cut::After(500)]);
    let (bytes, end, info) =
        download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    end.unwrap();
    assert_eq!(bytes.len(), 500);
    assert_eq!(files.seen().len(), 1);
    assert!(info.continuations().is_empty());
}

#[tokio::test(start_paused = true)]
async fn max_continuations_bounds_a_body() {
    let files = FileServer::new(File::new(1000), &[Cut::After(100); 10]);
    let layer = RetryLayer::new().policy(RetryPolicy::new().max_continuations(2));
    let (bytes, end, info) = download(client(layer, &files), get("http://h/file")).await;
    assert_eq!(stop(end), StopReason::MaxContinuations);
    assert_eq!(bytes, files.content()[..300]);
    assert_eq!(files.seen().len(), 3);
    assert_eq!(info.continuations().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_body_is_continued_after_the_idle_timeout() {
    let files = FileServer::new(File::new(1000), &[Cut::Stall(500)]);
    let layer =
        RetryLayer::new().policy(RetryPolicy::new().body_idle_timeout(Duration::from_secs(5)));
    let start = Instant::now();
    let (bytes, end, info) = download(client(layer, &files), get("http://h/file")).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    assert_eq!(info.continuations()[0].reason, RetryReason::Timeout);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(7),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn without_an_idle_timeout_a_stalled_body_waits() {
    let files = FileServer::new(File::new(1000), &[Cut::Stall(500)]);
    let response = client(RetryLayer::new(), &files)
        .oneshot(get("http://h/file"))
        .await
        .unwrap();
    let read = tokio::time::timeout(Duration::from_secs(3600), read(response.into_body())).await;
    assert!(read.is_err(), "still waiting after an hour");
    assert_eq!(files.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_continuation_waits_the_policys_backoff() {
    let files = FileServer::new(File::new(1000), &[Cut::After(100), Cut::After(100)]);
    let layer = RetryLayer::new();
    let backoff = Backoff::exponential(Duration::from_millis(400), Duration::from_secs(10))
        .jitter(Jitter::None);
    let client = layer
        .policy(RetryPolicy::new().backoff(backoff))
        .resume()
        .layer(files.clone());
    let start = Instant::now();
    let response = client.oneshot(get("http://h/file")).await.unwrap();
    let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, files.content());
    let waits: Vec<_> = info.continuations().iter().map(|c| c.wait).collect();
    // Numbered as retries are: the first waits `ceiling(1)`.
    assert_eq!(waits, [backoff.ceiling(1), backoff.ceiling(2)]);
    assert_eq!(
        waits,
        [Duration::from_millis(800), Duration::from_millis(1600)]
    );
    assert_eq!(start.elapsed(), Duration::from_millis(2400));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_continuations() {
    let files = FileServer::new(File::new(1000), &[Cut::After(100)]);
    let backoff =
        Backoff::exponential(Duration::from_secs(5), Duration::from_secs(5)).jitter(Jitter::None);
    let layer = RetryLayer::new().policy(RetryPolicy::new().deadline(Duration::from_secs(2)));
    let client = layer
        .policy(RetryPolicy::new().backoff(backoff))
        .resume()
        .layer(files.clone());
    let response = client.oneshot(get("http://h/file")).await.unwrap();
    let (bytes, end) = read(response.into_body()).await;
    assert_eq!(stop(end), StopReason::Deadline);
    assert_eq!(bytes.len(), 100);
    assert_eq!(files.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_continuation_is_paid_from_the_budget() {
    // A budget of one retry, never refilled: the first continuation takes it.
    let budget = RetryBudget::builder()
        .ratio(0.0)
        .min_per_sec(0.0)
        .max_tokens(1.0)
        .build();
    let files = FileServer::new(File::new(1000), &[Cut::After(100), Cut::After(100)]);
    let layer = RetryLayer::new().policy(RetryPolicy::new().no_gates().gate(budget));
    let (bytes, end, info) = download(client(layer, &files), get("http://h/file")).await;
    assert_eq!(stop(end), StopReason::BudgetExhausted);
    assert_eq!(bytes.len(), 200);
    assert_eq!(info.continuations().len(), 1);
    assert_eq!(files.seen().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_continuation_is_an_attempt_on_the_wire() {
    let files = FileServer::new(File::new(1000), &[Cut::After(100)]);
    let layer = RetryLayer::new().attempt_header(http::HeaderName::from_static("x-attempt"));
    let (_, end, _) = download(client(layer, &files), get("http://h/file")).await;
    end.unwrap();
    let attempts: Vec<_> = files
        .seen()
        .iter()
        .map(|h| h["x-attempt"].clone())
        .collect();
    assert_eq!(attempts, ["1", "2"]);
}

#[tokio::test(start_paused = true)]
async fn a_route_or_a_request_turns_resumption_off() {
    let files = FileServer::new(File::new(1000), &[Cut::After(100), Cut::After(100)]);
    let layer = RetryLayer::new().route(
        RouteMatch::get().path_prefix("/events"),
        RetryPolicy::new().resume(false),
    );
    let client = client(layer, &files);
    let response = client
        .clone()
        .oneshot(get("http://h/events"))
        .await
        .unwrap();
    assert!(response.extensions().get::<ResumeInfo>().is_none());
    assert!(response.extensions().get::<ResumeInfo>().is_none());
    let (bytes, end) = read(response.into_body()).await;
    // The inner body's own error, passed through.
    assert!(end.unwrap_err().downcast_ref::<std::io::Error>().is_some());
    assert_eq!(bytes.len(), 100);

    let mut request = get("http://h/file");
    request
        .extensions_mut()
        .insert(RetryPolicy::new().resume(false));
    let response = client.oneshot(request).await.unwrap();
    assert!(response.extensions().get::<ResumeInfo>().is_none());
    assert!(read(response.into_body()).await.1.is_err());
    assert_eq!(files.seen().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn only_a_get_is_resumed() {
    let files = FileServer::new(File::new(100), &[Cut::After(10)]);
    let client = client(RetryLayer::new(), &files);
    let request = Request::head("http://h/file")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.oneshot(request).await.unwrap();
    assert!(response.extensions().get::<ResumeInfo>().is_none());
    assert!(files.seen()[0].get("accept-encoding").is_none());
}

#[tokio::test(start_paused = true)]
async fn suffix_and_multiple_ranges_are_not_resumed() {
    for range in ["bytes=-100", "bytes=0-1,5-6"] {
        let files = FileServer::new(File::new(100), &[]);
        let mut request = get("http://h/file");
        request
            .headers_mut()
            .insert("range", range.parse().unwrap());
        let response = client(RetryLayer::new(), &files)
            .oneshot(request)
            .await
            .unwrap();
        assert!(
            response.extensions().get::<ResumeInfo>().is_none(),
            "{range}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_record_stays_readable_after_the_body_is_gone() {
    let files = FileServer::new(File::new(1000), &[Cut::After(100)]);
    let response = client(RetryLayer::new(), &files)
        .oneshot(get("http://h/file"))
        .await
        .unwrap();
    let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    let same = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 1000);
    assert_eq!(info.continuations(), same.continuations());
    assert_eq!(info.continuations().len(), 1);
}

/// A layer without resumption keeps the inner service's response type: code naming it
/// compiles unchanged.
#[tokio::test(start_paused = true)]
async fn a_layer_without_resumption_keeps_the_response_type() {
    let files = FileServer::new(File::new(10), &[]);
    let inner = tower::service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
        std::future::ready(Ok::<_, Infallible>(files.answer(req.headers())))
    });
    let response: Response<FileBody> = RetryLayer::new()
        .layer(inner)
        .oneshot(get("http://h/f"))
        .await
        .unwrap();
    assert_eq!(
        response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .len(),
        10
    );
}

#[tokio::test(start_paused = true)]
async fn a_206_that_starts_before_the_next_byte_has_its_overlap_skipped() {
    let mut file = File::new(1000);
    file.shift = -150;
    let files = FileServer::new(file, &[Cut::After(400)]);
    let (bytes, end, _) = download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
}

/// arrow-rs-object-store's issue 654, end to end: a continuation answered from another
/// offset than asked is never spliced in.
#[tokio::test(start_paused = true)]
async fn object_store_654_a_206_that_starts_after_the_next_byte_ends_the_body() {
    let mut file = File::new(1000);
    file.shift = 100;
    let files = FileServer::new(file, &[Cut::After(400)]);
    let (bytes, end, _) = download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    assert_eq!(stop(end), StopReason::RangeMismatch);
    assert_eq!(bytes, files.content()[..400]);
}

#[tokio::test(start_paused = true)]
async fn a_last_modified_too_recent_is_no_validator() {
    let mut file = File::new(500);
    file.etag = None;
    file.last_modified = Some("Sun, 06 Nov 1994 08:49:37 GMT");
    file.date = Some("Sun, 06 Nov 1994 08:49:37 GMT");
    let files = FileServer::new(file, &[Cut::After(100)]);
    let (_, end, _) = download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    assert_eq!(stop(end), StopReason::NoValidator);
    assert_eq!(files.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_encoded_body_is_continued_as_the_encoded_bytes() {
    // The layer sees `Content-Encoding: gzip` and the bytes as sent: the range counts them.
    let mut file = File::new(1000);
    file.encoding = Some("gzip");
    let files = FileServer::new(file, &[Cut::After(300)]);
    let mut request = get("http://h/file");
    request
        .headers_mut()
        .insert("accept-encoding", "gzip".parse().unwrap());
    let (bytes, end, _) = download(client(RetryLayer::new(), &files), request).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    assert_eq!(files.ranges()[1].as_deref(), Some("bytes=300-"));
}

#[tokio::test(start_paused = true)]
async fn a_continuation_in_another_encoding_is_another_representation() {
    let mut gzip = File::new(1000);
    gzip.encoding = Some("gzip");
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]).replace_after(1, gzip);
    let (bytes, end, _) = download(client(RetryLayer::new(), &files), get("http://h/file")).await;
    assert_eq!(stop(end), StopReason::RepresentationChanged);
    assert_eq!(bytes.len(), 300);
}

#[tokio::test(start_paused = true)]
async fn a_retryable_status_gets_another_continuation() {
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]);
    // A 503 between: the second request is answered so.
    let failing = FailSecond {
        files: files.clone(),
        n: Default::default(),
        hang: false,
        retry_after: None,
    };
    let client = RetryLayer::new().resume().layer(failing);
    let response = client.oneshot(get("http://h/file")).await.unwrap();
    let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    let (bytes, end) = read(response.into_body()).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    let outcomes: Vec<_> = info.continuations().iter().map(|c| c.outcome).collect();
    assert_eq!(
        outcomes,
        [
            tower_http_retry::AttemptOutcome::Response(http::StatusCode::SERVICE_UNAVAILABLE),
            tower_http_retry::AttemptOutcome::Response(http::StatusCode::PARTIAL_CONTENT),
        ]
    );
    assert_eq!(
        info.continuations()[1].reason,
        RetryReason::Status(http::StatusCode::SERVICE_UNAVAILABLE)
    );
}

/// A continuation answered 503 with `Retry-After` waits for it (a floor over the backoff),
/// as a retry does; a longer one than the policy honours ends the body.
#[tokio::test(start_paused = true)]
async fn a_continuations_retry_after_is_a_floor() {
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]);
    let failing = FailSecond {
        files: files.clone(),
        n: Default::default(),
        hang: false,
        retry_after: Some("4"),
    };
    let client = RetryLayer::new().resume().layer(failing.clone());
    let response = client.oneshot(get("http://h/file")).await.unwrap();
    let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    let (bytes, end) = read(response.into_body()).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    let second = info.continuations()[1];
    assert_eq!(
        (second.wait, second.hint),
        (
            Duration::from_secs(4),
            Some(tower_http_retry::hints::HintSource::RetryAfter)
        )
    );

    // Longer than `max_retry_after`: not waited for.
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]);
    let failing = FailSecond {
        files,
        n: Default::default(),
        hang: false,
        retry_after: Some("4"),
    };
    let policy = RetryPolicy::new().max_retry_after(Duration::from_secs(2));
    let client = RetryLayer::new().policy(policy).resume().layer(failing);
    let response = client.oneshot(get("http://h/file")).await.unwrap();
    let (bytes, end) = read(response.into_body()).await;
    assert_eq!(stop(end), StopReason::HintTooLong);
    assert_eq!(bytes.len(), 300);
}

/// The gates hear what each continuation got, as they hear a retry's outcome: gRPC's
/// throttle loses a token for the 503 and earns a share of one for the 206.
#[tokio::test(start_paused = true)]
async fn the_gates_hear_each_continuations_outcome() {
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]);
    let failing = FailSecond {
        files: files.clone(),
        n: Default::default(),
        hang: false,
        retry_after: None,
    };
    let throttle = tower_http_retry::Throttle::builder()
        .max_tokens(10.0)
        .token_ratio(0.5)
        .build();
    let policy = RetryPolicy::new().gate(throttle.clone());
    let client = RetryLayer::new().policy(policy).resume().layer(failing);
    let response = client.oneshot(get("http://h/file")).await.unwrap();
    // The head's 200: a success, at the cap already.
    assert_eq!(throttle.tokens(), 10.0);
    let (bytes, end) = read(response.into_body()).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    // The first continuation's 503: -1; the second's 206: +0.5.
    assert_eq!(throttle.tokens(), 9.5);
}

#[tokio::test(start_paused = true)]
async fn a_continuation_that_never_answers_times_out_and_is_sent_again() {
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]);
    let failing = FailSecond {
        files: files.clone(),
        n: Default::default(),
        hang: true,
        retry_after: None,
    };
    let policy = RetryPolicy::new().attempt_timeout(Duration::from_secs(2));
    let client = RetryLayer::new().policy(policy).resume().layer(failing);
    let response = client.oneshot(get("http://h/file")).await.unwrap();
    let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    let (bytes, end) = read(response.into_body()).await;
    end.unwrap();
    assert_eq!(bytes, files.content());
    let continuations = info.continuations();
    assert_eq!(
        continuations[0].outcome,
        tower_http_retry::AttemptOutcome::TimedOut
    );
    assert_eq!(continuations[1].reason, RetryReason::Timeout);
}

#[tokio::test(start_paused = true)]
async fn a_continuation_the_deadline_cuts_off_ends_the_body() {
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]);
    let failing = FailSecond {
        files: files.clone(),
        n: Default::default(),
        hang: true,
        retry_after: None,
    };
    let policy = RetryPolicy::new().deadline(Duration::from_secs(3));
    let client = RetryLayer::new().policy(policy).resume().layer(failing);
    let response = client.oneshot(get("http://h/file")).await.unwrap();
    let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    let start = Instant::now();
    let (bytes, end) = read(response.into_body()).await;
    let error = end.unwrap_err();
    let error = error.downcast_ref::<RetryError>().unwrap();
    assert_eq!(error.info().stop(), StopReason::Deadline);
    let source = std::error::Error::source(error).unwrap();
    assert!(
        source.is::<tower_http_retry::DeadlineExceeded>(),
        "{source}"
    );
    assert_eq!(bytes.len(), 300);
    assert_eq!(
        info.continuations()[0].outcome,
        tower_http_retry::AttemptOutcome::Abandoned
    );
    assert!(start.elapsed() <= Duration::from_secs(3));
}

/// The file server, but the second request is answered 503 (with `retry_after`, if
/// given), or never (`hang`).
#[derive(Clone)]
struct FailSecond {
    files: FileServer,
    n: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    hang: bool,
    retry_after: Option<&'static str>,
}

impl tower::Service<Request<ReplayBody<Full<Bytes>>>> for FailSecond {
    type Response = Response<FileBody>;
    type Error = Infallible;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<FileBody>, Infallible>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReplayBody<Full<Bytes>>>) -> Self::Future {
        if self.n.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 1 {
            if self.hang {
                return Box::pin(std::future::pending());
            }
            let body = Full::new(Bytes::new()).map_err(|e| match e {}).boxed();
            let mut response = Response::builder().status(503);
            if let Some(seconds) = self.retry_after {
                response = response.header("retry-after", seconds);
            }
            return Box::pin(std::future::ready(Ok(response.body(body).unwrap())));
        }
        Box::pin(std::future::ready(Ok(self.files.answer(request.headers()))))
    }
}
