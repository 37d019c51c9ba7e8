//! Budgets and throttles kept per authority: a server that fails spends its own retries,
//! never a healthy one's; the map of authorities stays bounded, and a failing authority is
//! never forgotten back to a full state.

use std::collections::HashSet;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{
    Backoff, ReplayBody, RetryBudget, RetryInfo, RetryLayer, RetryPolicy, Throttle,
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

/// How many of `up.example`'s 20 requests succeed after 50 to `down.example` under `budget`.
async fn healthy_goodput(budget: RetryBudget) -> usize {
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .backoff(Backoff::exponential(
            std::time::Duration::from_millis(1),
            std::time::Duration::from_millis(1),
        ));
    let client = RetryLayer::new()
        .budget(budget)
        .attempt_header("x-attempt")
        .policy(policy)
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
            .min_per_sec(0)
            .max_tokens(10)
    };
    // Shared: the outage drains the one bucket, the healthy server's failures are final.
    assert_eq!(healthy_goodput(settings().build()).await, 0);
    // Per authority: the outage drains its own bucket only.
    let budget = settings().per_authority().build();
    assert_eq!(healthy_goodput(budget.clone()).await, 10);
    assert_eq!(budget.authorities(), 2);
    let down = budget.partition(&"http://down.example/".parse().unwrap());
    assert_eq!(down.tokens(), 0.0);
    // The healthy server spent its 10 on its own failures.
    let up = budget.partition(&"http://up.example/".parse().unwrap());
    assert_eq!(up.tokens(), 0.0);
    // The budget's own bucket (requests without an authority) was never touched.
    assert_eq!(budget.tokens(), 10.0);
}

#[tokio::test(start_paused = true)]
async fn a_per_authority_throttle_counts_each_server_apart() {
    let throttle = Throttle::builder()
        .max_tokens(4.0)
        .token_ratio(1.0)
        .per_authority()
        .build();
    let client = RetryLayer::new()
        .no_budget()
        .attempt_header("x-attempt")
        .throttle(throttle.clone())
        .policy(
            RetryPolicy::default()
                .max_attempts(3)
                .backoff(Backoff::exponential(
                    std::time::Duration::from_millis(1),
                    std::time::Duration::from_millis(1),
                )),
        )
        .layer(two_servers());
    let response = client.clone().oneshot(get("down.example")).await.unwrap();
    let info = response.extensions().get::<RetryInfo>().unwrap();
    // 4 tokens: the first failure leaves 3 (above half), the second 2 (not above).
    assert_eq!(info.attempts(), 2);
    let down = throttle.partition(&"http://down.example/".parse().unwrap());
    assert_eq!(down.tokens(), 2.0);
    assert!(!down.allows_retry());
    // The other server's count is full: its failure is retried.
    let response = client.oneshot(get("up.example")).await.unwrap();
    assert_eq!(response.status(), 200);
    let up = throttle.partition(&"http://up.example/".parse().unwrap());
    assert_eq!(up.tokens(), 4.0, "one failure, one success at 1.0");
}

#[test]
fn the_map_is_bounded_and_forgets_only_partitions_at_rest() {
    let throttle = Throttle::builder()
        .max_tokens(10.0)
        .max_authorities(2)
        .build();
    let at = |host: &str| throttle.partition(&format!("http://{host}/").parse().unwrap());
    at("failing").record_failure();
    assert_eq!(at("healthy").tokens(), 10.0);
    assert_eq!(throttle.authorities(), 2);
    // A third authority takes the healthy one's place: it was at rest.
    at("third").record_failure();
    assert_eq!(throttle.authorities(), 2);
    // The failing one was kept, still down a token.
    assert_eq!(at("failing").tokens(), 9.0);
    // Both now failing: no room, newcomers share the overflow count.
    let (a, b) = (at("newcomer-a"), at("newcomer-b"));
    a.record_failure();
    assert_eq!(b.tokens(), 9.0, "one shared overflow count");
    assert_eq!(throttle.authorities(), 2);
    assert_eq!(at("failing").tokens(), 9.0);
    assert_eq!(at("third").tokens(), 9.0);
    // A full partition held by a request in flight is not forgotten either.
    let held = Throttle::builder().max_authorities(1).build();
    let one = held.partition(&"http://one/".parse().unwrap());
    let two = held.partition(&"http://two/".parse().unwrap());
    two.record_failure();
    assert!(one.tokens() == 10.0 && two.tokens() == 9.0);
    drop(one);
    // Now `one` is at rest: a newcomer replaces it, starting from the overflow's count,
    // which `two` drained a token of: `two` may be that newcomer one day, and must not get
    // a full count by moving out of the overflow.
    let three = held.partition(&"http://three/".parse().unwrap());
    assert_eq!(held.authorities(), 1);
    assert_eq!(three.tokens(), 9.0);
    three.record_failure();
    assert_eq!(
        held.partition(&"http://three/".parse().unwrap()).tokens(),
        8.0
    );
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
    let at = |host: &str| throttle.partition(&format!("http://{host}/").parse().unwrap());
    at("a").record_failure();
    // `b` finds no room: the overflow, which it drains to its threshold.
    at("b").record_failure();
    at("b").record_failure();
    assert!(!at("b").allows_retry());
    // `a` recovers and rests; `b` takes its place, but not with a full count.
    at("a").record_success();
    assert_eq!(at("a").tokens(), 4.0);
    // Past the interval between two scans of a full map for a partition at rest.
    tokio::time::advance(std::time::Duration::from_millis(120)).await;
    let b = at("b");
    assert_eq!(throttle.authorities(), 1);
    assert_eq!(b.tokens(), 2.0);
    assert!(!b.allows_retry());
    // It is `b`'s own count now: its success does not reach the overflow's.
    b.record_success();
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
                    let part = throttle.partition(&format!("http://h{host}/").parse().unwrap());
                    // Thread-private authorities are drained; the rest are only looked up.
                    if host % THREADS as u64 == t as u64 && round % 3 == 0 {
                        part.record_failure();
                        drained.insert(host);
                    }
                    assert!(throttle.authorities() <= MAX);
                }
                drained
            })
        })
        .collect();
    let drained: Vec<HashSet<u64>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(throttle.authorities() <= MAX);
    for host in drained.iter().flatten() {
        let part = throttle.partition(&format!("http://h{host}/").parse().unwrap());
        assert!(
            part.tokens() < 1_000.0,
            "h{host} was drained and must stay so"
        );
    }
}
