use std::convert::Infallible;

use tower::ServiceExt;

use super::*;
use crate::deadline::*;
use crate::hook::AttemptKind;

fn attempt(time_left: Option<Duration>, timeout: Option<Duration>) -> Attempt {
    Attempt::of(1, 0, time_left, timeout, AttemptKind::First)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn millis_round_up_and_never_write_zero() {
    assert_eq!(millis(ms(250)), "250");
    assert_eq!(millis(Duration::from_micros(250_001)), "251");
    assert_eq!(millis(Duration::from_nanos(1)), "1");
    // The time is gone: 1, as Envoy writes, never 0 (Envoy's "no timeout").
    assert_eq!(millis(Duration::ZERO), "1");
    // Ten digits at most: what a reader here accepts.
    assert_eq!(
        millis(Duration::from_secs(86_400 * 365 * 100)),
        "9999999999"
    );
    assert_eq!(millis(Duration::MAX), "9999999999");
}

#[test]
fn only_plain_digits_are_read() {
    let read = |value: &'static str| parse_millis(&HeaderValue::from_static(value));
    assert_eq!(read("0"), Some(Duration::ZERO));
    assert_eq!(read("250"), Some(ms(250)));
    assert_eq!(read("9999999999"), Some(ms(9_999_999_999)));
    for garbage in [
        "",
        " 250",
        "250 ",
        "+250",
        "-1",
        "2.5",
        "250ms",
        "1e3",
        "99999999999",
        "0x10",
    ] {
        assert_eq!(read(garbage), None, "{garbage:?}");
    }
    let mut headers = HeaderMap::new();
    let name = HeaderName::from_static("x-timeout-ms");
    assert_eq!(super::read(&headers, &name), None);
    headers.append(&name, HeaderValue::from_static("100"));
    assert_eq!(super::read(&headers, &name), Some(ms(100)));
    // Twice is ambiguous: ignored.
    headers.append(&name, HeaderValue::from_static("100"));
    assert_eq!(super::read(&headers, &name), None);
}

#[test]
fn the_hook_writes_the_lesser_of_the_time_left_and_the_attempt_timeout() {
    let hook = DeadlineHeader(HeaderName::from_static("x-timeout-ms"));
    let mut headers = HeaderMap::new();
    hook.before_attempt(&attempt(None, None), &mut headers);
    assert!(headers.is_empty(), "no limit, no header");
    headers.insert("x-timeout-ms", HeaderValue::from_static("caller's"));
    hook.before_attempt(&attempt(None, None), &mut headers);
    assert_eq!(headers["x-timeout-ms"], "caller's");
    hook.before_attempt(&attempt(Some(ms(900)), None), &mut headers);
    assert_eq!(headers["x-timeout-ms"], "900");
    hook.before_attempt(&attempt(Some(ms(900)), Some(ms(300))), &mut headers);
    assert_eq!(headers["x-timeout-ms"], "300");
    hook.before_attempt(&attempt(None, Some(ms(300))), &mut headers);
    assert_eq!(headers["x-timeout-ms"], "300");
    hook.before_attempt(
        &attempt(Some(Duration::from_micros(10)), Some(ms(300))),
        &mut headers,
    );
    assert_eq!(headers["x-timeout-ms"], "1");
    assert_eq!(headers.len(), 1);
}

/// A handler that answers with the time it was given, in ms, and whether the header
/// reached it.
fn echo() -> impl Service<
    Request<()>,
    Response = Response<String>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<String>, Infallible>> + Send,
> + Clone {
    tower::service_fn(|request: Request<()>| async move {
        let RequestDeadline(at) = *request.extensions().get::<RequestDeadline>().unwrap();
        let left = at.saturating_duration_since(crate::time::default_now());
        let seen = request.headers().contains_key("x-timeout-ms");
        Ok(Response::new(format!("{} {seen}", left.as_millis())))
    })
}

use std::future::Future;

async fn given<S>(
    service: S,
    header: Option<&'static str>,
    trusted: bool,
) -> Result<Response<String>, BoxError>
where
    S: Service<Request<()>, Response = Response<String>, Error = BoxError>,
{
    let mut request = Request::new(());
    if let Some(value) = header {
        request
            .headers_mut()
            .insert("x-timeout-ms", HeaderValue::from_static(value));
    }
    if trusted {
        request
            .headers_mut()
            .insert("x-inside", HeaderValue::from_static("1"));
    }
    service.oneshot(request).await
}

#[tokio::test(start_paused = true)]
async fn the_layer_clamps_a_trusted_caller_s_time_to_its_limit() {
    let layer = DeadlineLayer::new(ms(1000))
        .header(HeaderName::from_static("x-timeout-ms"))
        .trust(|head| head.headers.contains_key("x-inside"));
    let body = |r: Result<Response<String>, BoxError>| r.unwrap().into_body();
    let server = || layer.layer(echo());
    // Trusted: the caller's time, within the limit; the header is not passed on.
    assert_eq!(body(given(server(), Some("250"), true).await), "250 false");
    assert_eq!(
        body(given(server(), Some("5000"), true).await),
        "1000 false"
    );
    // Garbage and absence: the limit.
    assert_eq!(body(given(server(), Some("25o"), true).await), "1000 false");
    assert_eq!(body(given(server(), None, true).await), "1000 false");
    // Not trusted: the limit, and the header still removed.
    assert_eq!(
        body(given(server(), Some("250"), false).await),
        "1000 false"
    );
    // Trusting nobody is the default.
    let default = DeadlineLayer::new(ms(1000)).header(HeaderName::from_static("x-timeout-ms"));
    assert_eq!(
        body(given(default.layer(echo()), Some("250"), true).await),
        "1000 false"
    );
    // Without a header to read, the caller's is left alone.
    let plain = DeadlineLayer::new(ms(1000)).trust(|_| true);
    assert_eq!(
        body(given(plain.layer(echo()), Some("250"), true).await),
        "1000 true"
    );
}

#[tokio::test(start_paused = true)]
async fn no_time_left_is_answered_at_once_and_a_slow_handler_is_cut_off() {
    let called = Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = Arc::clone(&called);
    let slow = tower::service_fn(move |_: Request<()>| {
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Infallible>(Response::new(String::new()))
        }
    });
    let layer = DeadlineLayer::new(ms(1000)).envoy().trust(|_| true);
    let server = layer.layer(slow);
    let zero = Request::builder()
        .header("x-envoy-expected-rq-timeout-ms", "0")
        .body(())
        .unwrap();
    let response = server.clone().oneshot(zero).await.unwrap();
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), 0);

    let start = tokio::time::Instant::now();
    let short = Request::builder()
        .header("x-envoy-expected-rq-timeout-ms", "30")
        .body(())
        .unwrap();
    let error = server.clone().oneshot(short).await.unwrap_err();
    assert!(error.is::<tower::timeout::error::Elapsed>(), "{error}");
    assert_eq!(start.elapsed(), ms(30));
    let error = server.oneshot(Request::new(())).await.unwrap_err();
    assert!(error.is::<tower::timeout::error::Elapsed>());
    assert_eq!(start.elapsed(), ms(1030));
    assert_eq!(called.load(std::sync::atomic::Ordering::SeqCst), 2);
}

#[test]
fn the_layer_shows_its_settings() {
    let layer = DeadlineLayer::new(ms(1000)).envoy();
    assert_eq!(
        format!("{layer:?}"),
        r#"DeadlineLayer { limit: 1s, header: Some("x-envoy-expected-rq-timeout-ms"), trusts: None }"#
    );
    let layer = layer.header(None).trust(|_| true);
    assert_eq!(
        format!("{layer:?}"),
        r#"DeadlineLayer { limit: 1s, header: None, trusts: Some("some") }"#
    );
}
