// Gates kept per authority: a server that fails spends its own retries, never a healthy
// one's; the map of authorities stays bounded, and a failing authority is never forgotten
// back to a full state. Moved here from the behaviour tests: how many authorities a gate
// tracks is crate-private (`Scoped::authorities`). The budget and the quota are driven
// through the layer; the throttle's map directly, by telling its partitions what the layer
// tells them (an attempt's failure or success) and asking what the layer asks (may a hedge
// go, which needs more than half of the tokens left).

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, StatusCode};
use http_body_util::Full;
use tower::{BoxError, Layer, Service, ServiceExt};

use super::{Admission, Ask, Gate, Heard, Kind, RetryBudget, RetryQuota, Throttle};
use crate::classify::FailureKind;
use crate::{Backoff, Jitter, ReplayBody, RetryInfo, RetryLayer, RetryPolicy};

type Inner = Request<ReplayBody<Full<Bytes>>>;

fn respond(status: u16) -> std::future::Ready<Result<Response<()>, BoxError>> {
    let mut response = Response::new(());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    std::future::ready(Ok(response))
}

/// Two servers behind one client: `down.example` answers 503 always, `up.example` fails
/// the first attempt of every request (503, then 200 on the retry; the layer numbers the
/// attempts in `x-attempt`).
fn two_servers()
-> impl Service<Inner, Response = Response<()>, Error = BoxError, Future = impl Send> + Clone {
    tower::service_fn(|request: Inner| {
        let first = request.headers().get("x-attempt").is_none_or(|v| v == "1");
        match (request.uri().host(), first) {
            (Some("down.example"), _) | (_, true) => respond(503),
            _ => respond(200),
        }
    })
}

/// Answers with `statuses` in turn, then 200.
fn script(
    statuses: &[u16],
) -> impl Service<Inner, Response = Response<()>, Error = BoxError, Future = impl Send> + Clone {
    let statuses = Arc::new(Mutex::new(
        statuses.iter().copied().collect::<VecDeque<_>>(),
    ));
    tower::service_fn(move |_: Inner| respond(statuses.lock().unwrap().pop_front().unwrap_or(200)))
}

fn get(host: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{host}/"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn uri(host: &str) -> http::Uri {
    format!("http://{host}/").parse().unwrap()
}

/// `attempts` attempts, 1 ms apart.
fn quick(attempts: u32) -> RetryPolicy {
    RetryPolicy::new().max_attempts(attempts).backoff(
        Backoff::exponential(Duration::from_millis(1), Duration::from_millis(1))
            .jitter(Jitter::None),
    )
}

/// How many of `up.example`'s 20 requests succeed after 50 to `down.example` under `budget`.
async fn healthy_goodput(budget: RetryBudget) -> usize {
    let client = RetryLayer::new()
        .attempt_header(HeaderName::from_static("x-attempt"))
        .policy(quick(2).gate(budget))
        .layer(two_servers());
    for _ in 0..50 {
        let response = client.clone().oneshot(get("down.example")).await.unwrap();
        assert_eq!(response.status(), 503);
    }
    let mut ok = 0;
    for _ in 0..20 {
        let response = client.clone().oneshot(get("up.example")).await.unwrap();
        let info = response.extensions().get::<RetryInfo>().unwrap();
        if response.status() == 200 {
            ok += 1;
            assert_eq!(info.attempts(), 2);
        }
    }
    ok
}

#[tokio::test(start_paused = true)]
async fn a_failing_authority_cannot_spend_a_healthy_ones_retries() {
    // 10 retries saved up, none earned by traffic or time.
    let settings = || {
        RetryBudget::builder()
            .ratio(0.0)
            .min_per_sec(0.0)
            .max_tokens(10.0)
    };
    // Shared: the outage drains the one bucket, the healthy server's failures are final.
    assert_eq!(healthy_goodput(settings().build()).await, 0);
    // Per authority: the outage drains its own bucket only.
    let budget = settings().per_authority().build();
    assert_eq!(healthy_goodput(budget.clone()).await, 10);
    assert_eq!(budget.inner.authorities(), 2);
    assert_eq!(budget.partition(&uri("down.example")).tokens(), 0.0);
    // The healthy server spent its 10 on its own failures.
    assert_eq!(budget.partition(&uri("up.example")).tokens(), 0.0);
    // The budget's own bucket (requests without an authority) was never touched.
    assert_eq!(budget.tokens(), 10.0);
}

/// Per authority, a server that fails spends its own pool only.
#[tokio::test(start_paused = true)]
async fn a_per_authority_quota_keeps_each_servers_pool() {
    let quota = RetryQuota::builder()
        .max_tokens(20.0)
        .per_authority()
        .build();
    let client = RetryLayer::new()
        .policy(quick(4).no_gates().gate(quota.clone()))
        .layer(script(&[503, 503, 503, 503, 200]));
    // Down: 503, retry (10), 503, retry (10), 503: out of tokens.
    let response = client.clone().oneshot(get("down.test")).await.unwrap();
    assert_eq!(response.status(), 503);
    // The other server's pool is whole: its 503 is retried (10), then 200 refunds it.
    let response = client.oneshot(get("up.test")).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    assert_eq!(response.status(), 200, "{info:?}");
    assert_eq!(quota.partition(&uri("down.test")).tokens(), 0.0);
    assert_eq!(quota.partition(&uri("up.test")).tokens(), 20.0);
    assert_eq!(quota.inner.authorities(), 2);
}

/// A failed attempt, as the layer tells the throttle of one.
fn fail(throttle: &Throttle) {
    let _ = throttle
        .inner
        .on_outcome(Heard::Failure(FailureKind::Transient), None);
}

/// A successful attempt.
fn succeed(throttle: &Throttle) {
    assert_eq!(throttle.inner.on_outcome(Heard::Success, None), Ok(()));
}

/// Whether the throttle lets a retry go: more than half of its tokens left (what it
/// answers for a hedge, which only looks).
fn allows_retry(throttle: &Throttle) -> bool {
    matches!(
        throttle.inner.admit(Ask::Hedge(FailureKind::Transient)),
        Admission::Admit { .. }
    )
}

#[test]
fn the_map_is_bounded_and_forgets_only_partitions_at_rest() {
    let throttle = Throttle::builder()
        .max_tokens(10.0)
        .max_authorities(2)
        .build();
    let at = |host: &str| throttle.partition(&uri(host));
    fail(&at("failing"));
    assert_eq!(at("healthy").tokens(), 10.0);
    assert_eq!(throttle.inner.authorities(), 2);
    // A third authority takes the healthy one's place: it was at rest.
    fail(&at("third"));
    assert_eq!(throttle.inner.authorities(), 2);
    // The failing one was kept, still down a token.
    assert_eq!(at("failing").tokens(), 9.0);
    // Both now failing: no room, newcomers share the overflow count.
    let (a, b) = (at("newcomer-a"), at("newcomer-b"));
    fail(&a);
    assert_eq!(b.tokens(), 9.0, "one shared overflow count");
    assert_eq!(throttle.inner.authorities(), 2);
    assert_eq!(at("failing").tokens(), 9.0);
    assert_eq!(at("third").tokens(), 9.0);
    // A full partition held by a request in flight is not forgotten either.
    let held = Throttle::builder().max_authorities(1).build();
    let one = held.partition(&uri("one"));
    let two = held.partition(&uri("two"));
    fail(&two);
    assert!(one.tokens() == 10.0 && two.tokens() == 9.0);
    drop(one);
    // Now `one` is at rest: a newcomer replaces it, starting from the overflow's count,
    // which `two` drained a token of: `two` may be that newcomer one day, and must not get
    // a full count by moving out of the overflow.
    let three = held.partition(&uri("three"));
    assert_eq!(held.inner.authorities(), 1);
    assert_eq!(three.tokens(), 9.0);
    fail(&three);
    assert_eq!(held.partition(&uri("three")).tokens(), 8.0);
    // Build errors name the setting.
    let error = Throttle::builder()
        .max_authorities(0)
        .try_build()
        .unwrap_err();
    assert!(
        error.to_string().contains("max_authorities is 0"),
        "{error}"
    );
    let error = RetryBudget::builder()
        .max_authorities(0)
        .try_build()
        .unwrap_err();
    assert!(
        error.to_string().contains("max_authorities is 0"),
        "{error}"
    );
}

/// A server that failed in the overflow keeps its failures when it gets a place of its own.
#[tokio::test(start_paused = true)]
async fn leaving_the_overflow_resets_nothing() {
    let throttle = Throttle::builder()
        .max_tokens(4.0)
        .token_ratio(1.0)
        .max_authorities(1)
        .build();
    let at = |host: &str| throttle.partition(&uri(host));
    fail(&at("a"));
    // `b` finds no room: the overflow, which it drains to its threshold.
    fail(&at("b"));
    fail(&at("b"));
    assert!(!allows_retry(&at("b")));
    // `a` recovers and rests; `b` takes its place, but not with a full count.
    succeed(&at("a"));
    assert_eq!(at("a").tokens(), 4.0);
    // Past the interval between two scans of a full map for a partition at rest.
    tokio::time::advance(Duration::from_millis(120)).await;
    let b = at("b");
    assert_eq!(throttle.inner.authorities(), 1);
    assert_eq!(b.tokens(), 2.0);
    assert!(!allows_retry(&b));
    // It is `b`'s own count now: its success does not reach the overflow's.
    succeed(&b);
    assert_eq!(b.tokens(), 3.0);
    assert_eq!(at("c").tokens(), 2.0, "a newcomer shares the overflow");
}

/// Threads creating, draining and looking up partitions at once: the map never tracks more
/// than its bound, and an authority once drained is never found full again.
#[test]
fn under_concurrent_use_the_bound_holds_and_drained_authorities_stay_drained() {
    const MAX: usize = 64;
    const THREADS: usize = 4;
    const ROUNDS: usize = 4_000;
    let throttle = Throttle::builder()
        .max_tokens(1_000.0)
        .token_ratio(0.001)
        .max_authorities(MAX)
        .build();
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let throttle = throttle.clone();
            std::thread::spawn(move || {
                let mut drained = HashSet::new();
                let mut state = 0x9e37_79b9_u64 + t as u64;
                for round in 0..ROUNDS {
                    // A small xorshift: authorities 0..4*MAX, each thread its own sequence.
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let host = state % (4 * MAX as u64);
                    let part = throttle.partition(&uri(&format!("h{host}")));
                    // Thread-private authorities are drained; the rest are only looked up.
                    if host % THREADS as u64 == t as u64 && round % 3 == 0 {
                        fail(&part);
                        drained.insert(host);
                    }
                    assert!(throttle.inner.authorities() <= MAX);
                }
                drained
            })
        })
        .collect();
    let drained: Vec<HashSet<u64>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(throttle.inner.authorities() <= MAX);
    for host in drained.iter().flatten() {
        let part = throttle.partition(&uri(&format!("h{host}")));
        assert!(
            part.tokens() < 1_000.0,
            "h{host} was drained and must stay so"
        );
    }
}
