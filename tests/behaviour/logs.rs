//! The log lines a person sees, captured from tracing-subscriber's text formatter (no time,
//! no colours) and compared whole: one event per retry at the layer's retry level, a gate's
//! refusal at WARN, the request's span and end at DEBUG, the URI without its query unless
//! asked, on the target `tower_http_retry`.
#![cfg(feature = "tracing")]

use crate::common;
use tower::ServiceExt;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Mock, Reply, get};
use tower::Layer;
use tower_http_retry::classify::{Classification, FailureKind, Outcome, Recognized, RetryReason};
use tower_http_retry::{
    Backoff, Hedging, Jitter, RetryBudget, RetryLayer, RetryPolicy, StopReason, Throttle,
};
use tracing::Level;
use tracing::subscriber::DefaultGuard;

const URI: &str = "http://api.test/v1/items";

/// What the formatter wrote, shared with the writer it makes.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;

    fn make_writer(&'a self) -> Captured {
        self.clone()
    }
}

impl Captured {
    /// The lines written so far, emptied.
    fn take(&self) -> Vec<String> {
        let bytes = std::mem::take(&mut *self.0.lock().unwrap());
        String::from_utf8(bytes)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

/// The events of this thread (the test's runtime is on it) at `level` and above, until the
/// guard is dropped.
fn capture(level: Level) -> (Captured, DefaultGuard) {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(captured.clone())
        .with_max_level(level)
        .with_ansi(false)
        .without_time()
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

/// 150 ms between attempts, exactly.
fn fixed(attempts: u32) -> RetryPolicy {
    let wait = Duration::from_millis(150);
    RetryPolicy::new()
        .max_attempts(attempts)
        .backoff(Backoff::exponential(wait, wait).jitter(Jitter::None))
}

fn layer(policy: RetryPolicy) -> RetryLayer {
    RetryLayer::new().policy(policy)
}

#[tokio::test(start_paused = true)]
async fn a_retried_503_then_200_is_one_line_at_info() {
    let (logs, _guard) = capture(Level::INFO);
    let client = layer(fixed(3)).layer(Mock::statuses(&[503]));
    let response = client.oneshot(get(URI)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        logs.take(),
        [
            r#" INFO tower_http_retry: retrying attempt=2 reason="status 503" wait=150ms method=GET uri=http://api.test/v1/items"#
        ]
    );

    // A request that succeeds at once says nothing at INFO.
    let client = layer(fixed(3)).layer(Mock::statuses(&[]));
    client.oneshot(get(URI)).await.unwrap();
    assert_eq!(logs.take(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn at_debug_the_request_has_its_span_and_its_end() {
    let (logs, _guard) = capture(Level::DEBUG);
    let client = layer(fixed(3)).layer(Mock::statuses(&[503]));
    client.clone().oneshot(get(URI)).await.unwrap();
    let span = "http_retry{method=GET uri=http://api.test/v1/items}";
    assert_eq!(
        logs.take(),
        [
            format!(
                r#" INFO {span}: tower_http_retry: retrying attempt=2 reason="status 503" wait=150ms method=GET uri=http://api.test/v1/items"#
            ),
            format!(
                "DEBUG {span}: tower_http_retry: done attempts=2 outcome=200 stop=final waited=150ms"
            ),
        ]
    );

    client.oneshot(get(URI)).await.unwrap();
    assert_eq!(
        logs.take(),
        [format!(
            "DEBUG {span}: tower_http_retry: done attempts=1 outcome=200 stop=final waited=0ms"
        )]
    );
}

/// One token: the first retry spends it, the second is refused.
fn one_token() -> RetryBudget {
    RetryBudget::builder()
        .ratio(0.0)
        .min_per_sec(0.0)
        .max_tokens(1.0)
        .build()
}

#[tokio::test(start_paused = true)]
async fn a_retry_a_gate_refuses_is_a_warning() {
    let (logs, _guard) = capture(Level::INFO);
    let client = layer(fixed(3).gate(one_token())).layer(Mock::statuses(&[503, 502, 503]));
    let response = client.oneshot(get(URI)).await.unwrap();
    assert_eq!(response.status(), 502);
    assert_eq!(
        logs.take(),
        [
            r#" INFO tower_http_retry: retrying attempt=2 reason="status 503" wait=150ms method=GET uri=http://api.test/v1/items"#,
            r#" WARN tower_http_retry: not retrying: budget exhausted attempts=2 reason="status 502" method=GET uri=http://api.test/v1/items"#,
        ]
    );

    // The throttle, at half its tokens after one failure, refuses the first retry.
    let throttle = Throttle::builder().max_tokens(2.0).build();
    let client = layer(fixed(3).gate(throttle)).layer(Mock::statuses(&[503]));
    let response = client.oneshot(get(URI)).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        logs.take(),
        [
            r#" WARN tower_http_retry: not retrying: throttled attempts=1 reason="status 503" method=GET uri=http://api.test/v1/items"#
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_hedge_is_logged_with_the_time_since_the_attempt_before_it() {
    let (logs, _guard) = capture(Level::INFO);
    let slow = Reply::Slow(Duration::from_secs(5), Box::new(Reply::Status(200)));
    let policy = fixed(2).hedge(Hedging::after(Duration::from_millis(100)));
    let client = layer(policy).layer(Mock::new([slow, Reply::Status(200)]));
    let response = client.oneshot(get(URI)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        logs.take(),
        [
            r#" INFO tower_http_retry: hedging attempt=2 reason="hedging delay" after=100ms method=GET uri=http://api.test/v1/items"#
        ]
    );

    // A hedge the budget refuses (no token left) is a warning too; the first attempt's
    // answer is returned.
    let empty = one_token();
    let slow = Reply::Slow(Duration::from_secs(5), Box::new(Reply::Status(200)));
    let drain = layer(fixed(2).gate(empty.clone())).layer(Mock::statuses(&[503]));
    drain.oneshot(get(URI)).await.unwrap();
    logs.take();
    let policy = fixed(2)
        .gate(empty)
        .hedge(Hedging::after(Duration::from_millis(100)));
    let client = layer(policy).layer(Mock::new([slow]));
    let response = client.oneshot(get(URI)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        logs.take(),
        [
            r#" WARN tower_http_retry: not retrying: budget exhausted attempts=1 reason="hedging delay" method=GET uri=http://api.test/v1/items"#
        ]
    );

    // A first attempt's 503 would send the next hedge at once, but the throttle, at half
    // its tokens after it, refuses: the 503 is returned.
    let throttle = Throttle::builder().max_tokens(2.0).build();
    let policy = fixed(2)
        .gate(throttle)
        .hedge(Hedging::after(Duration::from_millis(100)));
    let client = layer(policy).layer(Mock::statuses(&[503]));
    let response = client.oneshot(get(URI)).await.unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        logs.take(),
        [
            r#" WARN tower_http_retry: not retrying: throttled attempts=1 reason="status 503" method=GET uri=http://api.test/v1/items"#
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_transparent_retry_and_a_protocol_code_read_as_such() {
    let (logs, _guard) = capture(Level::INFO);
    let refused = Reply::error(|| {
        Recognized::new(
            io::Error::other("stream refused"),
            Some(RetryReason::RefusedStream),
        )
    });
    let client = layer(fixed(1).transparent_retry(true)).layer(Mock::new([refused]));
    client.oneshot(get(URI)).await.unwrap();
    assert_eq!(
        logs.take(),
        [
            r#" INFO tower_http_retry: retrying transparently attempt=2 reason="HTTP/2 stream refused" wait=0ms method=GET uri=http://api.test/v1/items"#
        ]
    );

    // A protocol's classifier (gRPC's, say) names its code, and the server's hint is
    // named when it set the wait.
    const UNAVAILABLE: RetryReason = RetryReason::Code {
        protocol: "gRPC",
        value: 14,
        name: "UNAVAILABLE",
        kind: FailureKind::Transient,
    };
    let unavailable = |_: &http::request::Parts, outcome: Outcome<'_>| match outcome {
        Outcome::Response { status, .. } if status == 503 => Classification::Retry(UNAVAILABLE),
        _ => Classification::Success,
    };
    let busy = Reply::Headers(503, vec![("retry-after", "2".to_owned())]);
    let client = layer(fixed(2).classifier(unavailable)).layer(Mock::new([busy]));
    client.oneshot(get(URI)).await.unwrap();
    assert_eq!(
        logs.take(),
        [
            r#" INFO tower_http_retry: retrying attempt=2 reason="gRPC UNAVAILABLE" wait=2s hint=Retry-After method=GET uri=http://api.test/v1/items"#
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_query_and_user_info_are_left_out_unless_the_layer_logs_uris_whole() {
    let (logs, _guard) = capture(Level::DEBUG);
    let uri = "http://user:secret@api.test:8080/v1/items?token=abc&email=a%40b.test";
    for (whole, logged) in [(false, "http://api.test:8080/v1/items"), (true, uri)] {
        let client = layer(fixed(2))
            .log_full_uri(whole)
            .layer(Mock::statuses(&[503]));
        client.oneshot(get(uri)).await.unwrap();
        let span = format!("http_retry{{method=GET uri={logged}}}");
        assert_eq!(
            logs.take(),
            [
                format!(
                    r#" INFO {span}: tower_http_retry: retrying attempt=2 reason="status 503" wait=150ms method=GET uri={logged}"#
                ),
                format!(
                    "DEBUG {span}: tower_http_retry: done attempts=2 outcome=200 stop=final waited=150ms"
                ),
            ],
            "whole: {whole}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_retry_level_is_the_layers_to_choose() {
    let (logs, _guard) = capture(Level::INFO);
    // As warnings.
    let client = layer(fixed(3))
        .retry_log_level(Level::WARN)
        .layer(Mock::statuses(&[503]));
    client.oneshot(get(URI)).await.unwrap();
    assert_eq!(
        logs.take(),
        [
            r#" WARN tower_http_retry: retrying attempt=2 reason="status 503" wait=150ms method=GET uri=http://api.test/v1/items"#
        ]
    );

    // Out of sight at INFO; a refusal is still a warning.
    let client = layer(fixed(3).gate(one_token()))
        .retry_log_level(Level::DEBUG)
        .layer(Mock::statuses(&[503, 502, 503]));
    let response = client.oneshot(get(URI)).await.unwrap();
    let info = response
        .extensions()
        .get::<tower_http_retry::RetryInfo>()
        .unwrap();
    assert_eq!(info.stop(), StopReason::BudgetExhausted);
    assert_eq!(
        logs.take(),
        [
            r#" WARN tower_http_retry: not retrying: budget exhausted attempts=2 reason="status 502" method=GET uri=http://api.test/v1/items"#
        ]
    );

    // At ERROR, refusals too.
    let client = layer(fixed(3).gate(one_token()))
        .retry_log_level(Level::ERROR)
        .layer(Mock::statuses(&[503, 502, 503]));
    client.oneshot(get(URI)).await.unwrap();
    assert_eq!(
        logs.take(),
        [
            r#"ERROR tower_http_retry: retrying attempt=2 reason="status 503" wait=150ms method=GET uri=http://api.test/v1/items"#,
            r#"ERROR tower_http_retry: not retrying: budget exhausted attempts=2 reason="status 502" method=GET uri=http://api.test/v1/items"#,
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_continued_body_is_one_line_at_info() {
    use crate::common::files::{Cut, File, FileServer};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let (logs, _guard) = capture(Level::INFO);
    let files = FileServer::new(File::new(1000), &[Cut::After(300)]);
    let client = RetryLayer::new()
        .policy(fixed(3))
        .resume()
        .layer(files.clone());
    let uri = format!("{URI}?token=secret");
    let response = client.oneshot(get(&uri)).await.unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 1000);
    assert_eq!(
        logs.take(),
        [
            r#" INFO tower_http_retry: continuing the response body attempt=2 reason="connection closed" wait=150ms handed=300 method=GET uri=http://api.test/v1/items"#
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_body_not_continued_is_a_warning() {
    use crate::common::files::{Cut, File, FileServer};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    let (logs, _guard) = capture(Level::INFO);
    let mut file = File::new(1000);
    file.etag = None;
    let files = FileServer::new(file, &[Cut::After(300)]);
    let client = RetryLayer::new().policy(fixed(3)).resume().layer(files);
    let response = client.oneshot(get(URI)).await.unwrap();
    assert!(response.into_body().collect().await.is_err());
    assert_eq!(
        logs.take(),
        [
            r#" WARN tower_http_retry: not continuing the response body: no validator handed=300 method=GET uri=http://api.test/v1/items"#
        ]
    );
}
