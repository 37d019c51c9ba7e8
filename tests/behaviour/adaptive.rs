//! The adaptive rate limiter through the layer, under paused time: off until a 429, then
//! every first attempt waits for its token (the wait bounded by `max_wait` and the
//! deadline, a first attempt past it refused locally and never sent), a token taken for an
//! attempt another gate refuses given back, one state shared by every clone, one per
//! server when kept per authority. (Its arithmetic, against smithy-rs's vectors, is the
//! core's unit tests: `src/gate/adaptive/tests.rs`.)
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::time::Duration;

use common::{Mock, Reply, get};
use tokio::time::Instant;
use tower::{BoxError, Layer};
use tower_http_retry::{
    AdaptiveLimiter, Backoff, DeadlineExceeded, Gate, Hedging, Jitter, LocallyRefused, RetryError,
    RetryInfo, RetryLayer, RetryPolicy, RetryQuota, StopReason,
};

/// At most `attempts` attempts, 1 ms apart, under the limiter alone.
fn policy(limiter: &AdaptiveLimiter, attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .backoff(
            Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
                .jitter(Jitter::None),
        )
        .no_gates()
        .gate(limiter.clone())
}

fn limiter(max_wait: Duration) -> AdaptiveLimiter {
    AdaptiveLimiter::builder().max_wait(max_wait).build()
}

/// When the mock saw each request, from `start`, in whole milliseconds.
fn sent_at(mock: &Mock, start: Instant) -> Vec<u128> {
    mock.seen()
        .iter()
        .map(|seen| (seen.at - start).as_millis())
        .collect()
}

fn refused(error: &BoxError) -> &RetryError {
    error
        .downcast_ref::<RetryError>()
        .expect("the layer's error")
}

#[tokio::test(start_paused = true)]
async fn first_attempts_go_at_once_until_a_429_then_at_the_limiter_s_rate() {
    let limiter = limiter(Duration::from_secs(20));
    let mock = Mock::statuses(&[200, 200, 429]);
    let client = RetryLayer::new()
        .policy(policy(&limiter, 1))
        .layer(mock.clone());
    let start = Instant::now();
    // Off: three requests at once, none waits, even the one throttled.
    for _ in 0..3 {
        client
            .clone()
            .oneshot(get("http://api.test/"))
            .await
            .unwrap();
    }
    assert_eq!(sent_at(&mock, start), [0, 0, 0]);
    // The 429 turned it on, at its least rate (0.5 a second) with no token in the bucket:
    // three requests at once leave 2 s apart, each first attempt held until its token.
    assert_eq!(limiter.rate(), Some(0.5));
    let send = || client.clone().oneshot(get("http://api.test/"));
    let (a, b, c) = tokio::join!(send(), send(), send());
    for response in [a, b, c] {
        let response = response.unwrap();
        let info = response.extensions().get::<RetryInfo>().unwrap();
        assert_eq!((info.attempts(), info.stop()), (1, StopReason::Disabled));
    }
    assert_eq!(sent_at(&mock, start)[3..], [2_000, 4_000, 6_000]);
    // The successes let the rate grow back.
    assert!(limiter.rate().unwrap() > 0.5, "{:?}", limiter.rate());
}

#[tokio::test(start_paused = true)]
async fn past_the_bound_a_retry_returns_the_last_outcome_and_a_first_attempt_is_refused() {
    let limiter = limiter(Duration::from_secs(1));
    let mock = Mock::statuses(&[429]);
    let client = RetryLayer::new()
        .policy(policy(&limiter, 3))
        .layer(mock.clone());
    let start = Instant::now();
    // The 429 turns the limiter on with an empty bucket: its retry would wait 2 s, past the
    // bound, so the 429 is returned, as a budget's refusal returns it.
    let response = client
        .clone()
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        (response.status().as_u16(), info.attempts(), info.stop()),
        (429, 1, StopReason::Throttled)
    );
    // The next request's first attempt would wait as long: it ends at once with the
    // layer's own error, never sent, and the record says so.
    let error = client
        .clone()
        .oneshot(get("http://api.test/"))
        .await
        .unwrap_err();
    assert_eq!(Instant::now(), start, "ended at once");
    let error = refused(&error);
    assert!(
        error.get_ref().is::<LocallyRefused>(),
        "{}",
        error.get_ref()
    );
    assert_eq!(
        (error.info().attempts(), error.info().stop()),
        (0, StopReason::Throttled)
    );
    assert_eq!(
        error.info().to_string(),
        "no attempt sent; stopped: throttled"
    );
    assert_eq!(
        error.get_ref().to_string(),
        "request not sent: the client's own rate limit refused it (throttled)"
    );
    assert_eq!(mock.calls(), 1);
    // 2 s later the bucket holds a token: sent at once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    client.oneshot(get("http://api.test/")).await.unwrap();
    assert_eq!(sent_at(&mock, start), [0, 2_000]);
}

#[tokio::test(start_paused = true)]
async fn of_requests_at_once_those_whose_wait_fits_go_in_turn_and_the_rest_end_at_once() {
    let limiter = limiter(Duration::from_secs(5));
    let mock = Mock::statuses(&[429]);
    let client = RetryLayer::new()
        .policy(policy(&limiter, 1))
        .layer(mock.clone());
    let start = Instant::now();
    client
        .clone()
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    // Four at once: waits of 2 s and 4 s fit in 5 s; 6 s and 8 s do not.
    let send = || client.clone().oneshot(get("http://api.test/"));
    let ended = |result: &Result<_, BoxError>| match result {
        Ok(_) => None,
        Err(error) => Some(refused(error).get_ref().is::<LocallyRefused>()),
    };
    let (a, b, c, d) = tokio::join!(send(), send(), send(), send());
    let ends = [&a, &b, &c, &d].map(ended);
    assert_eq!(ends, [None, None, Some(true), Some(true)]);
    assert_eq!(sent_at(&mock, start), [0, 2_000, 4_000]);
}

#[tokio::test(start_paused = true)]
async fn a_wait_the_deadline_cannot_hold_ends_at_once_and_gives_the_token_back() {
    let limiter = limiter(Duration::from_secs(20));
    let mock = Mock::statuses(&[429]);
    let client = RetryLayer::new()
        .policy(policy(&limiter, 1).deadline(Duration::from_secs(1)))
        .layer(mock.clone());
    client
        .clone()
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    // The next would wait 2 s: more than its deadline leaves.
    let start = Instant::now();
    let error = client
        .clone()
        .oneshot(get("http://api.test/"))
        .await
        .unwrap_err();
    assert_eq!(Instant::now(), start, "ended at once");
    let error = refused(&error);
    assert!(error.get_ref().is::<DeadlineExceeded>());
    assert_eq!(
        (error.info().attempts(), error.info().stop()),
        (0, StopReason::Deadline)
    );
    // Its token went back: a request without a deadline waits 2 s, not 4 s.
    let patient = RetryLayer::new()
        .policy(policy(&limiter, 1))
        .layer(mock.clone());
    patient.oneshot(get("http://api.test/")).await.unwrap();
    assert_eq!(sent_at(&mock, start), [0, 2_000]);
}

#[tokio::test(start_paused = true)]
async fn a_retry_another_gate_refuses_gives_the_limiter_s_token_back() {
    let limiter = limiter(Duration::from_secs(20));
    // A quota of nothing refuses every retry; the limiter is asked before it.
    let quota = RetryQuota::builder().max_tokens(0.0).build();
    let mock = Mock::statuses(&[429]);
    let client = RetryLayer::new()
        .policy(policy(&limiter, 3).gate(quota))
        .layer(mock.clone());
    let start = Instant::now();
    // The 429 turns the limiter on; its retry takes a token (to wait 2 s), then the quota
    // refuses it: the 429 is returned, and the token goes back.
    let response = client
        .clone()
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        (response.status().as_u16(), info.attempts(), info.stop()),
        (429, 1, StopReason::BudgetExhausted)
    );
    assert_eq!(Instant::now(), start, "returned at once");
    // So the next first attempt waits 2 s, as for the first token, not 4 s.
    client.oneshot(get("http://api.test/")).await.unwrap();
    assert_eq!(sent_at(&mock, start), [0, 2_000]);
}

#[tokio::test(start_paused = true)]
async fn every_clone_and_every_client_given_the_handle_share_one_limiter() {
    let limiter = limiter(Duration::from_secs(20));
    let first = Mock::statuses(&[429]);
    let second = Mock::statuses(&[]);
    let throttled = RetryLayer::new()
        .policy(policy(&limiter.clone(), 1))
        .layer(first.clone());
    let other = RetryLayer::new()
        .policy(policy(&limiter, 1))
        .layer(second.clone());
    let start = Instant::now();
    throttled.oneshot(get("http://a.test/")).await.unwrap();
    // Another client, another server, the same handle: paced all the same.
    other.clone().oneshot(get("http://b.test/")).await.unwrap();
    // Its success at 2 s is heard by the one limiter: two outcomes in 2 s, a measured rate
    // of 0.8 a second, and the rate grows back to twice that, 1.6: the next token in 625 ms.
    other.oneshot(get("http://b.test/")).await.unwrap();
    assert_eq!(sent_at(&first, start), [0]);
    assert_eq!(sent_at(&second, start), [2_000, 2_625]);
    // (Heard at 2.625 s, in the next half second, the third success raised it again.)
    assert!(limiter.rate().unwrap() > 1.6, "{:?}", limiter.rate());
    assert_eq!(limiter.clone().rate(), limiter.rate());
}

#[tokio::test(start_paused = true)]
async fn kept_per_authority_each_server_has_its_own_limiter() {
    let limiter = AdaptiveLimiter::builder().per_authority().build();
    let mock = Mock::statuses(&[429]);
    let client = RetryLayer::new()
        .policy(policy(&limiter, 1))
        .layer(mock.clone());
    let start = Instant::now();
    let throttled: http::Uri = "http://a.test/".parse().unwrap();
    let healthy: http::Uri = "http://b.test/".parse().unwrap();
    client.clone().oneshot(get("http://a.test/")).await.unwrap();
    assert_eq!(limiter.partition(&throttled).rate(), Some(0.5));
    assert_eq!(limiter.partition(&healthy).rate(), None);
    assert_eq!(limiter.rate(), None, "the gate's own state is untouched");
    // b.test goes at once; a.test waits for its token.
    client.clone().oneshot(get("http://b.test/")).await.unwrap();
    client.oneshot(get("http://a.test/")).await.unwrap();
    assert_eq!(sent_at(&mock, start), [0, 0, 2_000]);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_the_limiter_would_delay_is_not_sent() {
    let limiter = limiter(Duration::from_secs(20));
    let mock = Mock::new([
        Reply::Status(429),
        Reply::Slow(Duration::from_secs(1), Box::new(Reply::Status(200))),
    ]);
    let hedged = policy(&limiter, 2).hedge(Hedging::after(Duration::from_millis(100)));
    let client = RetryLayer::new().policy(hedged).layer(mock.clone());
    let start = Instant::now();
    // The 429 turns the limiter on; the hedge it calls for would wait for a token: a hedge
    // is for latency, so it is not sent, and the 429 is returned.
    let response = client
        .clone()
        .oneshot(get("http://api.test/"))
        .await
        .unwrap();
    assert_eq!(response.status(), 429);
    // The next request's first attempt waits 2 s for its token and answers in 1 s; its
    // hedge, due 100 ms after it was sent, would wait too: not sent.
    let response = client.oneshot(get("http://api.test/")).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(
        (
            response.status().as_u16(),
            info.attempts(),
            info.retries()
                .iter()
                .filter(|r| r.kind == tower_http_retry::AttemptKind::Hedge)
                .count()
        ),
        (200, 1, 0)
    );
    assert_eq!(sent_at(&mock, start), [0, 2_000]);
    assert_eq!(Instant::now() - start, Duration::from_secs(3));
}
