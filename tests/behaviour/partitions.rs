//! Gates kept per authority through the layer: each server's count apart. (The tests that
//! read how many authorities a gate tracks, which is not public, are the core's own, in
//! `src/gate/partition_tests.rs`.)

use std::time::Duration;
use tower::ServiceExt;

use bytes::Bytes;
use http::{HeaderName, Request, Response};
use http_body_util::Full;
use tower::{BoxError, Layer, Service};
use tower_http_retry::{
    Backoff, Gate, Hedging, ReplayBody, RetryInfo, RetryLayer, RetryPolicy, StopReason, Throttle,
};

/// Two servers behind one client: `down.example` answers 503 always, `up.example` fails
/// the first attempt of every request (503, then 200 on the retry; the layer numbers the
/// attempts in `x-attempt`).
fn two_servers() -> impl Service<
    Request<ReplayBody<Full<Bytes>>>,
    Response = Response<Full<Bytes>>,
    Error = BoxError,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |request: Request<ReplayBody<Full<Bytes>>>| {
        let first = request.headers().get("x-attempt").is_none_or(|v| v == "1");
        let status = match (request.uri().host(), first) {
            (Some("down.example"), _) | (_, true) => 503,
            _ => 200,
        };
        async move {
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = http::StatusCode::from_u16(status).unwrap();
            Ok::<_, BoxError>(response)
        }
    })
}

fn get(host: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{host}/"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_per_authority_throttle_counts_each_server_apart() {
    let throttle = Throttle::builder()
        .max_tokens(4.0)
        .token_ratio(1.0)
        .per_authority()
        .build();
    let client = RetryLayer::new()
        .attempt_header(HeaderName::from_static("x-attempt"))
        .policy(
            RetryPolicy::default()
                .max_attempts(3)
                .backoff(Backoff::exponential(
                    Duration::from_millis(1),
                    Duration::from_millis(1),
                ))
                .no_gates()
                .gate(throttle.clone()),
        )
        .layer(two_servers());
    let response = client.clone().oneshot(get("down.example")).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    // 4 tokens: the first failure leaves 3 (above half), the second 2 (not above).
    assert_eq!(info.attempts(), 2);
    let down = throttle.partition(&"http://down.example/".parse().unwrap());
    assert_eq!(down.tokens(), 2.0);
    // Half or less left: no retry, not even a hedge (which only looks at the count) goes.
    let mut hedged = get("down.example");
    hedged
        .extensions_mut()
        .insert(RetryPolicy::new().hedge(Hedging::after(Duration::ZERO)));
    let response = client.clone().oneshot(hedged).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        (
            info.attempts(),
            info.retries()
                .iter()
                .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
                .count()
        ),
        (1, 0),
        "{info:?}"
    );
    assert_eq!(info.stop(), StopReason::Throttled);
    assert_eq!(down.tokens(), 1.0, "its failure took one more");
    // The other server's count is full: its failure is retried.
    let response = client.oneshot(get("up.example")).await.unwrap();
    assert_eq!(response.status(), 200);
    let up = throttle.partition(&"http://up.example/".parse().unwrap());
    assert_eq!(up.tokens(), 4.0, "one failure, one success at 1.0");
}
