//! End to end on wasm32-unknown-unknown, in Node (wasm-bindgen-test's default runner):
//! reqwest's `fetch` client under the retry layer, as a `ReqwestService` and as a
//! `RetryMiddleware`, against the native server of `examples/wasm_server.rs` on 127.0.0.1.
//! Its address comes in at compile time, in `TOWER_HTTP_RETRY_WASM_SERVER`; without it the
//! tests fail under `CI=true` and are skipped otherwise (saying so on the console, shown
//! with `-- --nocapture`). `.ci/wasm-reqwest` starts the server and runs them:
//!
//! ```text
//! TOWER_HTTP_RETRY_WASM_SERVER=127.0.0.1:PORT \
//! CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=wasm-bindgen-test-runner \
//! cargo test -p tower-http-retry-reqwest --target wasm32-unknown-unknown \
//!     --no-default-features --features middleware --test wasm -- --nocapture
//! ```
#![cfg(all(target_arch = "wasm32", target_os = "unknown"))]

use std::time::Duration;

use tower::ServiceBuilder;
use tower_http_retry::{RetryInfo, RetryLayer};
use tower_http_retry_reqwest::{RequestBuilderExt, ReqwestService};
use wasm_bindgen_test::{console_log, wasm_bindgen_test};

/// The server's address; `None` (the test skipped) outside CI when it was not given.
fn server(test: &str) -> Option<&'static str> {
    match option_env!("TOWER_HTTP_RETRY_WASM_SERVER") {
        Some(addr) => Some(addr),
        None if option_env!("CI") == Some("true") => {
            panic!("TOWER_HTTP_RETRY_WASM_SERVER is not set: start examples/wasm_server.rs")
        }
        None => {
            console_log!("{test}: skipped, TOWER_HTTP_RETRY_WASM_SERVER is not set");
            None
        }
    }
}

/// The server's answer to a path's second request: the gap it measured since the first,
/// and the body it received.
fn parse(answer: &str) -> (Duration, &str) {
    let rest = answer.strip_prefix("gap_ms=").expect(answer);
    let (gap, body) = rest.split_once(" body=").expect(answer);
    (Duration::from_millis(gap.parse().expect(answer)), body)
}

/// The wait the record shows and the server measured: `Retry-After: 1`'s second (the
/// server's gap is at least the wait, less a millisecond of its clock's rounding, and
/// well under two).
fn assert_waited_one_second(info: &RetryInfo, gap: Duration) {
    assert_eq!(info.attempts(), 2, "{info}");
    assert_eq!(info.retries().len(), 1, "{info}");
    assert_eq!(info.total_wait(), Duration::from_secs(1), "{info}");
    assert!(
        gap >= Duration::from_millis(999) && gap < Duration::from_millis(1900),
        "the server saw the retry {gap:?} after the first attempt"
    );
}

#[wasm_bindgen_test]
async fn reqwest_service_retries_a_503_after_its_retry_after() {
    let Some(addr) = server("reqwest_service") else {
        return;
    };
    let client = reqwest::Client::new();
    let service = ServiceBuilder::new()
        .layer(RetryLayer::new())
        .service(ReqwestService::new(client.clone()));

    // A PUT (idempotent) with a body: sent again whole.
    let response = client
        .put(format!("http://{addr}/service"))
        .body("hello")
        .send_with(&service)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let info = response.extensions().get::<RetryInfo>().unwrap().clone();
    let text = response.into_body().text().await.unwrap();
    let (gap, body) = parse(&text);
    assert_eq!(body, "hello");
    assert_waited_one_second(&info, gap);
}

#[cfg(feature = "middleware")]
#[wasm_bindgen_test]
async fn retry_middleware_retries_a_503_after_its_retry_after() {
    use tower_http_retry_reqwest::RetryMiddleware;

    let Some(addr) = server("retry_middleware") else {
        return;
    };
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(RetryLayer::new()))
        .build();

    // On wasm32 the record is in the middleware's extensions.
    let request = client
        .get(format!("http://{addr}/middleware"))
        .build()
        .unwrap();
    let mut extensions = http::Extensions::new();
    let response = client
        .execute_with_extensions(request, &mut extensions)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let info = extensions.get::<RetryInfo>().unwrap().clone();
    let text = response.text().await.unwrap();
    let (gap, body) = parse(&text);
    assert_eq!(body, "");
    assert_waited_one_second(&info, gap);
}
