//! The circuit breaker of the guide on composing (`guide::composing`) stacked outside the
//! layer: the layer returns a last 503 as `Ok`, so a breaker that counts only errors never
//! opens during a 503 outage, and one with the guide's failure classifier does. Paused time, a mock that is down.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::{Mock, get};
use http::Response;
use http_body_util::Full;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_http_retry::{Backoff, Jitter, RetryLayer, RetryPolicy};
use tower_resilience_circuitbreaker::{CircuitBreakerError, CircuitBreakerLayer};

type Outcome = Result<Response<Full<Bytes>>, BoxError>;

fn retry() -> RetryLayer {
    RetryLayer::new().policy(
        RetryPolicy::default().max_attempts(2).backoff(
            Backoff::exponential(Duration::from_millis(10), Duration::from_millis(10))
                .jitter(Jitter::None),
        ),
    )
}

/// Sends 6 requests through `breaker` over the layer over a mock that always answers 503;
/// returns how many the breaker rejected and how many calls reached the mock.
async fn outage<S>(mut stack: S, mock: &Mock) -> (usize, usize)
where
    S: Service<
            http::Request<Full<Bytes>>,
            Response = Response<Full<Bytes>>,
            Error = CircuitBreakerError<BoxError>,
        >,
{
    let mut rejected = 0;
    for _ in 0..6 {
        match stack.ready().await {
            Ok(ready) => match ready.call(get("http://h/status")).await {
                Ok(response) => assert_eq!(response.status(), 503),
                Err(CircuitBreakerError::OpenCircuit) => rejected += 1,
                Err(CircuitBreakerError::Inner(error)) => panic!("{error}"),
            },
            Err(CircuitBreakerError::OpenCircuit) => rejected += 1,
            Err(CircuitBreakerError::Inner(error)) => panic!("{error}"),
        }
    }
    (rejected, mock.calls())
}

#[tokio::test(start_paused = true)]
async fn a_breaker_that_counts_only_errors_never_opens_on_503s() {
    let mock = Mock::statuses(&[503; 32]);
    let breaker = CircuitBreakerLayer::builder()
        .failure_classifier(|result: &Outcome| result.is_err())
        .consecutive_failures(3)
        .wait_duration_in_open(Duration::from_secs(60))
        .build()
        .unwrap();
    let stack = ServiceBuilder::new()
        .layer(breaker)
        .layer(retry())
        .service(mock.clone());
    let (rejected, calls) = outage(stack, &mock).await;
    assert_eq!(rejected, 0, "every 503 came back as Ok");
    assert_eq!(calls, 12, "6 requests, 2 attempts each");
}

#[tokio::test(start_paused = true)]
async fn the_readme_classifier_opens_the_breaker_on_503s() {
    let mock = Mock::statuses(&[503; 32]);
    let breaker = CircuitBreakerLayer::builder()
        .failure_classifier(|result: &Outcome| match result {
            Ok(response) => response.status().is_server_error(),
            Err(_) => true,
        })
        .consecutive_failures(3)
        .wait_duration_in_open(Duration::from_secs(60))
        .build()
        .unwrap();
    let stack = ServiceBuilder::new()
        .layer(breaker)
        .layer(retry())
        .service(mock.clone());
    let (rejected, calls) = outage(stack, &mock).await;
    assert_eq!(rejected, 3, "open after 3 failed logical requests");
    assert_eq!(calls, 6, "the rejected requests never reached the network");
}
