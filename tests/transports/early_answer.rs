//! A proxy that answers before it has read the request body: a real nginx on 127.0.0.1,
//! over cleartext HTTP/2, answers `return 503;` to the first attempt as soon as its headers
//! are in (the `if` runs in the rewrite phase, before the body is read), and passes the
//! retry to a hyper HTTP/1 upstream that reads the body whole. The retry must go out, and
//! carry the whole body: the recorded first chunk, then the rest read from the caller's
//! body, which the first attempt never got to send.
//!
//! The body is a streamed PUT of exactly the default replay cap (64 KiB): one 16 KiB chunk,
//! a pause of `PAUSE`, then three more. nginx's 503 comes during the pause, so the first
//! attempt's transport has taken one chunk of four from the caller's body when the answer
//! arrives. A service between the layer and the client notes how many bytes had been taken
//! when each answer came, so the test knows how many runs really were early answers, and
//! fails if none was (then it would not test what it is for).
//!
//! Both runtimes, awaited directly and from spawned tasks, `RUNS` times each way, each run
//! bounded. nginx comes from Debian's `nginx-light` (`.ci/run` installs it); without it the
//! test fails under `CI=true`, and elsewhere says on the terminal that it skipped.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;
use tower::ServiceExt;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use common::nginx::Nginx;
use common::transport::{Proto, Script, Step, apply, hyper_server, on_every_runtime, repeat};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tower::ServiceBuilder;
use tower_http_retry::classify::RetryReason;
use tower_http_retry::{
    Backoff, Jitter, ReplayBody, RetryInfo, RetryLayer, RetryPolicy, StopReason,
};

/// Each way (runtime and mode) runs the case this many times.
const RUNS: usize = 20;
/// One runtime and mode, all its runs.
const LIMIT: Duration = Duration::from_secs(60);
/// One request, its retry included.
const RUN_LIMIT: Duration = Duration::from_secs(10);
/// The body: `CHUNKS` chunks of `CHUNK` bytes, in all the default replay cap.
const CHUNK: usize = 16 * 1024;
const CHUNKS: usize = 4;
const TOTAL: usize = CHUNK * CHUNKS;
/// The wait after the first chunk, during which nginx's 503 arrives.
const PAUSE: Duration = Duration::from_millis(50);

/// The body's bytes: a pattern that does not repeat at a chunk's length, so a chunk sent
/// twice, dropped or out of order changes what the upstream receives.
static BODY: [u8; TOTAL] = pattern();

const fn pattern() -> [u8; TOTAL] {
    let mut out = [0u8; TOTAL];
    let mut i = 0;
    while i < TOTAL {
        out[i] = (i % 251) as u8;
        i += 1;
    }
    out
}

fn steps() -> Vec<Step> {
    let mut steps = vec![Step::Data(&BODY[..CHUNK]), Step::Wait(PAUSE)];
    for chunk in 1..CHUNKS {
        steps.push(Step::Data(&BODY[chunk * CHUNK..(chunk + 1) * CHUNK]));
    }
    steps
}

/// A [`Script`] that counts the data bytes taken from it, by any attempt.
struct Counted {
    script: Script,
    taken: Arc<AtomicUsize>,
}

impl Body for Counted {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.script).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.taken.fetch_add(data.len(), Ordering::SeqCst);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.script.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.script.size_hint()
    }
}

/// nginx on one h2c port: the first attempt (`x-attempt: 1`) gets `return 503;` before
/// any of its body is read; any other is proxied to `upstream`. The access log has the
/// case, the attempt, the status and `$request_length` (what nginx read of the request,
/// its body included).
fn start_nginx(binary: &std::path::Path, upstream: u16) -> Nginx {
    Nginx::start(
        binary,
        1,
        "$http_x_case $http_x_attempt $status $request_length",
        |ports| {
            let port = ports[0];
            format!(
                r#"    server {{
        listen 127.0.0.1:{port} http2;
        location / {{
            if ($http_x_attempt = "1") {{ return 503; }}
            proxy_pass http://127.0.0.1:{upstream};
        }}
    }}"#
            )
        },
    )
}

/// What one run found, beyond its assertions.
struct Outcome {
    /// The bytes taken from the caller's body when the 503 arrived.
    taken_at_503: usize,
}

/// One PUT through the layer to nginx; asserts the retry and the body the upstream got.
async fn case(port: u16, upstream: common::transport::Log, id: String) -> Outcome {
    let taken = Arc::new(AtomicUsize::new(0));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let note = {
        let (taken, answers) = (Arc::clone(&taken), Arc::clone(&answers));
        move |response: Response<Incoming>| {
            let at = taken.load(Ordering::SeqCst);
            answers
                .lock()
                .unwrap()
                .push((response.status().as_u16(), at));
            response
        }
    };
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, ReplayBody<Counted>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(connector);
    // Room for a third attempt, so that exactly two is a finding; no budget to refuse.
    let layer = RetryLayer::new()
        .policy(RetryPolicy::new().no_gates())
        .attempt_header(http::HeaderName::from_static("x-attempt"))
        .policy(
            RetryPolicy::default().max_attempts(3).backoff(
                Backoff::exponential(Duration::from_millis(1), Duration::from_millis(4))
                    .jitter(Jitter::None),
            ),
        );
    let service = ServiceBuilder::new()
        .layer(layer)
        .map_response(note)
        .service(client);
    let request = Request::put(format!("http://127.0.0.1:{port}/doc"))
        .header("x-case", id.as_str())
        .body(Counted {
            script: Script::new(&steps()),
            taken: Arc::clone(&taken),
        })
        .unwrap();
    let result = tokio::time::timeout(RUN_LIMIT, service.oneshot(request))
        .await
        .unwrap_or_else(|_| panic!("{id}: no outcome within {RUN_LIMIT:?}"));
    let response = result.unwrap_or_else(|e| panic!("{id}: failed: {e}"));
    let answers = answers.lock().unwrap().clone();
    let info = response
        .extensions()
        .get::<RetryInfo>()
        .cloned()
        .unwrap_or_else(|| panic!("{id}: no RetryInfo"));
    assert_eq!(
        (response.status().as_u16(), info.attempts(), info.stop()),
        (200, 2, StopReason::Final),
        "{id}: {info:#}; answers (status, bytes taken): {answers:?}"
    );
    assert_eq!(
        info.retries()[0].reason,
        RetryReason::Status(http::StatusCode::SERVICE_UNAVAILABLE),
        "{id}: {info:#}"
    );
    let echoed = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        &echoed[..],
        b"status 200",
        "{id}: not the upstream's answer"
    );

    // The upstream got this case once, from the second attempt, whole.
    let got: Vec<_> = upstream
        .applied()
        .into_iter()
        .filter(|applied| {
            applied
                .headers
                .get("x-case")
                .is_some_and(|v| v == id.as_str())
        })
        .collect();
    assert_eq!(got.len(), 1, "{id}: the upstream got {} bodies", got.len());
    assert_eq!(
        got[0].headers.get("x-attempt").map(|v| v.to_str().unwrap()),
        Some("2"),
        "{id}"
    );
    assert!(
        got[0].body == BODY[..],
        "{id}: the upstream got {} bytes, not the body's {TOTAL} (first difference at {:?})",
        got[0].body.len(),
        got[0]
            .body
            .iter()
            .zip(BODY.iter())
            .position(|(a, b)| a != b)
    );
    assert_eq!(taken.load(Ordering::SeqCst), TOTAL, "{id}: bytes taken");
    assert_eq!(answers.len(), 2, "{id}: answers {answers:?}");
    assert_eq!(answers[0].0, 503, "{id}: answers {answers:?}");
    Outcome {
        taken_at_503: answers[0].1,
    }
}

#[test]
fn nginx_answering_503_before_reading_the_body_is_retried_with_the_whole_body() {
    let name = "nginx_answering_503_before_reading_the_body_is_retried_with_the_whole_body";
    let Some(binary) = common::nginx::binary(name) else {
        return;
    };
    // The upstream lives on a runtime of its own for the whole test (nginx's config names
    // its port), declared first so that it is dropped last.
    let upstream_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let upstream = upstream_runtime.block_on(hyper_server(
        Proto::H1,
        |req: Request<Incoming>, _, log| async move { apply(req, &log, 200).await },
    ));
    let nginx = start_nginx(&binary, upstream.addr.port());
    let port = nginx.ports[0];

    // Per run, the bytes of the body taken when the 503 came.
    let early = Arc::new(Mutex::new(Vec::new()));
    let way = AtomicUsize::new(0);
    on_every_runtime(LIMIT, |mode| {
        let way = way.fetch_add(1, Ordering::SeqCst);
        let (log, early) = (upstream.log.clone(), Arc::clone(&early));
        repeat(mode, RUNS, move |run| {
            let (log, early) = (log.clone(), Arc::clone(&early));
            async move {
                let id = format!("{way}-{mode:?}-{run}");
                let outcome = case(port, log, id).await;
                early.lock().unwrap().push(outcome.taken_at_503);
            }
        })
    });

    // nginx's view: each case's attempt 1 answered 503, its attempt 2 proxied (200). nginx
    // logs a request when it is done with it, maybe a moment after the client's answer.
    let cases = 4 * RUNS;
    let mut log = String::new();
    for _ in 0..200 {
        log = nginx.access_log();
        if log.lines().count() >= 2 * cases {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let mut by_case: HashMap<&str, Vec<(&str, &str, usize)>> = HashMap::new();
    for line in log.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [case, attempt, status, length] = fields[..] else {
            panic!("access log line {line:?}");
        };
        let length = length.parse().unwrap_or(0);
        by_case
            .entry(case)
            .or_default()
            .push((attempt, status, length));
    }
    assert_eq!(by_case.len(), cases, "cases in nginx's log: {log}");
    let mut read_at_503 = Vec::new();
    for (case, lines) in &by_case {
        let mut shape: Vec<(&str, &str)> = lines.iter().map(|(a, s, _)| (*a, *s)).collect();
        shape.sort_unstable();
        assert_eq!(shape, [("1", "503"), ("2", "200")], "{case}: {lines:?}");
        read_at_503.extend(lines.iter().filter(|(a, ..)| *a == "1").map(|(.., n)| *n));
    }

    let early = early.lock().unwrap().clone();
    let before_the_end = early.iter().filter(|taken| **taken < TOTAL).count();
    read_at_503.sort_unstable();
    eprintln!(
        "nginx return 503: {before_the_end} of {} answers came before the body was taken \
         whole (bytes taken then: min {:?}, max {:?}); nginx's $request_length of the 503s: \
         min {:?}, median {:?}, max {:?} (the body is {TOTAL} bytes)",
        early.len(),
        early.iter().min(),
        early.iter().max(),
        read_at_503.first(),
        read_at_503.get(read_at_503.len() / 2),
        read_at_503.last(),
    );
    assert!(
        before_the_end > 0,
        "no 503 came before the body was sent whole: the case was not exercised ({early:?})"
    );
}
