//! The layer against gRPC's reference client: every scenario runs twice, each time against
//! a fresh grpcio server (`tests/grpcio/server.py`, gRPC's C core underneath) with the same
//! scripted plan,
//!
//! 1. through grpcio's own client (`tests/grpcio/client.py`: a channel made with
//!    `grpc.service_config` set to the scenario's service config and retries enabled, so
//!    every retry rule is C-core's), and
//! 2. through a tonic `Channel` under `RetryLayer::from_service_config` of the same config
//!    (`grpc::status_layer()`, the layer, `grpc::tonic_body_layer()`),
//!
//! and compares what the server saw (the attempts of each call, their order, their
//! `grpc-previous-rpc-attempts`, the gaps between them) and what the caller got (the final
//! code, the time it took). Where nothing reaches a grpcio server (a refused connection, a
//! proxy's error page from nginx), the elapsed time or nginx's access log stands in.
//!
//! Where C-core and the layer disagree C-core is taken as right, unless gRPC's retry
//! design (A6) says otherwise; each test says which, and why. The expectations are written
//! for what is right, so a test fails while the layer is wrong.
//!
//! # Where the layer differs from C-core on purpose
//!
//! | case | C-core (grpcio 1.85.3) | this layer | why |
//! | --- | --- | --- | --- |
//! | backoff jitter | `0.8` to `1.2` times the backoff ceiling | uniform in `[0, ceiling]` | A6: `random(0, min(initialBackoff*backoffMultiplier**(n-1), maxBackoff))`; `Jitter::Proportional` gives C-core's |
//! | `grpc-retry-pushback-ms: 0` | the retry is never sent: the call waits for its deadline, forever without one | retried at once | A6: retry in `n` ms; C-core's retry timer, armed with no delay, fires before its handle is stored and is taken as cancelled |
//! | a stop pushback (`-1`, malformed) on a code not in `retryableStatusCodes`, under `retryThrottling` | takes no token | takes one | A6 counts for throttling every RPC "that receive[s] a pushback response indicating not to retry" |
//! | the method's `timeout` | ends the call 1 to 2 s early, and does not send it to the server | the deadline across all attempts, sent as `grpc-timeout` (the time left) on every attempt | A6: the call deadline applies across all attempts; C-core converts the call's start from its cycle counter against a process epoch set a second and more in the past |
//! | a proxy's error page (HTTP 503, 502, 429 without `grpc-status`), UNAVAILABLE listed | UNAVAILABLE, retried, but now and then (often under load) not: it takes the call as committed | UNAVAILABLE, retried every time | gRPC's HTTP-to-gRPC mapping makes it UNAVAILABLE; an error page is no gRPC Response-Headers, so nothing commits the call; C-core's stop is a race it loses |
//! | the retry buffer of one call | 256 KiB (`grpc.per_rpc_retry_buffer_size`) | 64 KiB (`max_replay_bytes`) | A6 leaves the limits to the client; past either one the call is committed and sent once |
//! | a retry budget | none | the layer's default `RetryBudget` (10% of requests, 10 a second) | the crate's safety net, which none of these scenarios reaches; `.policy(RetryPolicy::new().no_gates().gate(throttle))` removes it and keeps the config's throttle |
//!
//! Everything else these scenarios reach is meant to be the same on both sides, and a
//! test fails where it is not: which codes are retried, A6's cap of 5 attempts,
//! `grpc-previous-rpc-attempts`, positive and stopping pushback, a pushback restarting the
//! backoff, commitment once headers arrive, the replay of a client stream, the caller's
//! deadline, the throttle's arithmetic call by call, a refused connection and a connection
//! closed under a call (UNAVAILABLE, retried only when listed, no transparent retry), and
//! a call sent as its connection goes away (a transparent retry, whatever is listed).
//!
//! grpcio comes from PyPI (`python3 -m pip install grpcio==1.85.3`); without it the tests
//! fail under `CI=true` and skip loudly elsewhere. The proxy test needs nginx likewise.
#![allow(clippy::disallowed_methods)] // measures real waits with std's clock

use crate::common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tower_http_retry::{AttemptKind, AttemptOutcome, RetryError, RetryInfo, RetryLayer};
use tower_http_retry_grpc as grpc;
use tower_http_retry_grpc::GrpcLayerExt;

use common::grpc::{COLLECT, RawCodec, UNARY, stack};
use common::grpcio::{Call, GrpcioServer as Server, python};

/// The server-streaming method of `tests/grpcio/server.py`.
const REPLY: &str = "/test.Raw/Reply";
/// How long any grpcio process of these tests may live.
const LIFETIME_S: &str = "30";
/// Scheduling slack for gaps measured on a loaded machine, in milliseconds (80 ms of
/// delay between the layer's wait and grpcio's handler was seen on two busy cores).
const SLACK_MS: f64 = 120.0;

// ---------------------------------------------------------------------------------------
// The grpcio server, started with server options as well as a plan.
// ---------------------------------------------------------------------------------------

/// Starts `tests/grpcio/server.py` with `plan` and server `options`, off the async threads
/// (the start waits for the script's port).
async fn start_server(python: &'static str, plan: Vec<String>, options: Vec<String>) -> Server {
    tokio::task::spawn_blocking(move || Server::start_with(python, &plan, &options, LIFETIME_S))
        .await
        .expect("the server start did not panic")
}

// ---------------------------------------------------------------------------------------
// One scenario, and the two clients that run it.
// ---------------------------------------------------------------------------------------

/// What the calls of a scenario send.
#[derive(Debug, Clone)]
struct Calls {
    method: &'static str,
    messages: Vec<&'static [u8]>,
    /// The caller's own deadline (grpcio's `timeout=`, tonic's `Request::set_timeout`).
    timeout: Option<Duration>,
    /// One call per entry, each with this `x-step` (the server's `meta` step answers as it
    /// says); empty: `count` calls without one.
    steps: Vec<String>,
    count: usize,
}

impl Calls {
    fn unary(message: &'static [u8]) -> Calls {
        Calls {
            method: UNARY,
            messages: vec![message],
            timeout: None,
            steps: Vec::new(),
            count: 1,
        }
    }

    fn steps(&self) -> Vec<Option<String>> {
        if self.steps.is_empty() {
            vec![None; self.count]
        } else {
            self.steps.iter().cloned().map(Some).collect()
        }
    }
}

/// What the caller got from one call.
#[derive(Debug, Clone)]
struct Outcome {
    code: Code,
    details: String,
    elapsed: Duration,
    reply: Option<Vec<u8>>,
    /// The layer's record, when it reached the caller (tonic side only).
    info: Option<RetryInfo>,
}

impl Outcome {
    /// The layer's attempts that count against `maxAttempts` (transparent retries not).
    fn counted_attempts(&self) -> Option<u32> {
        let info = self.info.as_ref()?;
        let transparent = info
            .retries()
            .iter()
            .filter(|r| r.kind == AttemptKind::Transparent && r.outcome != AttemptOutcome::NotSent)
            .count();
        Some(info.attempts() - transparent as u32)
    }
}

/// One side's run: what the callers got and what the server saw.
#[derive(Debug)]
struct Side {
    name: &'static str,
    outcomes: Vec<Outcome>,
    seen: Vec<Call>,
}

impl Side {
    fn codes(&self) -> Vec<Code> {
        self.outcomes.iter().map(|o| o.code).collect()
    }

    /// The attempts of call `i`, in arrival order (by the `x-call` metadata).
    fn attempts(&self, i: usize) -> Vec<&Call> {
        let tag = i.to_string();
        self.seen
            .iter()
            .filter(|c| c.get("x-call") == Some(tag.as_str()))
            .collect()
    }

    /// The number of attempts the server saw of each call.
    fn attempt_counts(&self) -> Vec<usize> {
        (0..self.outcomes.len())
            .map(|i| self.attempts(i).len())
            .collect()
    }

    /// `grpc-previous-rpc-attempts` of every attempt of call `i`.
    fn previous(&self, i: usize) -> Vec<Option<String>> {
        self.attempts(i)
            .iter()
            .map(|c| c.get("grpc-previous-rpc-attempts").map(str::to_string))
            .collect()
    }

    /// The gaps between the attempts of call `i`, in milliseconds.
    fn gaps(&self, i: usize) -> Vec<f64> {
        let attempts = self.attempts(i);
        attempts
            .windows(2)
            .map(|w| w[1].arrived_ms - w[0].arrived_ms)
            .collect()
    }

    /// Checks that every call's attempts carry A6's numbering: absent, 1, 2, ...
    fn assert_numbered(&self) {
        for i in 0..self.outcomes.len() {
            let expected: Vec<Option<String>> = (0..self.attempts(i).len())
                .map(|n| (n > 0).then(|| n.to_string()))
                .collect();
            assert_eq!(
                self.previous(i),
                expected,
                "{}: call {i}: {self:#?}",
                self.name
            );
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A grpc.StatusCode name as tonic's code.
fn code_named(name: &str) -> Code {
    match name {
        "OK" => Code::Ok,
        "CANCELLED" => Code::Cancelled,
        "UNKNOWN" => Code::Unknown,
        "INVALID_ARGUMENT" => Code::InvalidArgument,
        "DEADLINE_EXCEEDED" => Code::DeadlineExceeded,
        "NOT_FOUND" => Code::NotFound,
        "ALREADY_EXISTS" => Code::AlreadyExists,
        "PERMISSION_DENIED" => Code::PermissionDenied,
        "RESOURCE_EXHAUSTED" => Code::ResourceExhausted,
        "FAILED_PRECONDITION" => Code::FailedPrecondition,
        "ABORTED" => Code::Aborted,
        "OUT_OF_RANGE" => Code::OutOfRange,
        "UNIMPLEMENTED" => Code::Unimplemented,
        "INTERNAL" => Code::Internal,
        "UNAVAILABLE" => Code::Unavailable,
        "DATA_LOSS" => Code::DataLoss,
        "UNAUTHENTICATED" => Code::Unauthenticated,
        other => panic!("not a status code name: {other}"),
    }
}

/// The calls through gRPC's reference client, `tests/grpcio/client.py`, at `target`.
async fn reference_calls(python: &str, target: &str, config: &str, calls: &Calls) -> Vec<Outcome> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpcio/client.py");
    let mut command = tokio::process::Command::new(python);
    command
        .arg(script)
        .args([
            "--target",
            target,
            "--config",
            config,
            "--method",
            calls.method,
        ])
        .args(["--lifetime", LIFETIME_S]);
    for message in &calls.messages {
        command.arg(format!("--message={}", hex(message)));
    }
    if let Some(timeout) = calls.timeout {
        command.arg(format!("--timeout={}", timeout.as_secs_f64()));
    }
    if calls.steps.is_empty() {
        command.arg(format!("--calls={}", calls.count));
    }
    for step in &calls.steps {
        command.arg(format!("--step={step}"));
    }
    let child = command
        .env("GRPC_VERBOSITY", "NONE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start tests/grpcio/client.py");
    let output = tokio::time::timeout(Duration::from_secs(40), child.wait_with_output())
        .await
        .expect("tests/grpcio/client.py ends within 40 s")
        .expect("tests/grpcio/client.py ran");
    assert!(output.status.success(), "client.py failed: {output:?}");
    let answer: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("client.py prints JSON");
    answer["calls"]
        .as_array()
        .expect("calls")
        .iter()
        .map(|call| Outcome {
            code: code_named(call["code"].as_str().expect("code")),
            details: call["details"].as_str().unwrap_or_default().to_string(),
            elapsed: Duration::from_secs_f64(call["elapsed_ms"].as_f64().expect("ms") / 1000.0),
            reply: call["reply"].as_str().map(common::grpcio::unhex),
            info: None,
        })
        .collect()
}

/// The calls through a tonic `Channel` under `RetryLayer::from_service_config(config)`,
/// one layer and one channel for all of them.
async fn our_calls(channel: Channel, config: &str, calls: &Calls) -> Vec<Outcome> {
    our_calls_with(channel, config, calls, |layer| layer).await
}

/// [`our_calls`] with the layer adjusted by `adjust` first.
async fn our_calls_with(
    channel: Channel,
    config: &str,
    calls: &Calls,
    adjust: fn(RetryLayer) -> RetryLayer,
) -> Vec<Outcome> {
    let parsed = grpc::service_config(config).expect("the scenario's config is valid");
    let client = stack(channel, adjust(RetryLayer::from_service_config(&parsed)));
    let mut outcomes = Vec::new();
    for (i, step) in calls.steps().into_iter().enumerate() {
        let start = Instant::now();
        let result = tokio::time::timeout(
            Duration::from_secs(30),
            our_call(client.clone(), calls, i, step.as_deref()),
        )
        .await
        .expect("a call through the layer ends within 30 s");
        let elapsed = start.elapsed();
        outcomes.push(match result {
            Ok(response) => Outcome {
                code: Code::Ok,
                details: String::new(),
                elapsed,
                info: response.extensions().get::<RetryInfo>().cloned(),
                reply: Some(response.into_inner().to_vec()),
            },
            Err(status) => Outcome {
                code: status.code(),
                details: status.message().to_string(),
                elapsed,
                reply: None,
                info: std::error::Error::source(&status)
                    .and_then(|e| e.downcast_ref::<RetryError>())
                    .map(|e| e.info().clone()),
            },
        });
    }
    outcomes
}

async fn our_call<T>(
    service: T,
    calls: &Calls,
    i: usize,
    step: Option<&str>,
) -> Result<tonic::Response<Bytes>, tonic::Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    let mut client = tonic::client::Grpc::new(service);
    client
        .ready()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("not ready: {}", e.into())))?;
    let path = http::uri::PathAndQuery::from_static(calls.method);
    let tag = |request: &mut tonic::metadata::MetadataMap| {
        request.insert("x-call", MetadataValue::try_from(i.to_string()).unwrap());
        if let Some(step) = step {
            request.insert("x-step", MetadataValue::try_from(step).unwrap());
        }
    };
    if calls.method == COLLECT {
        let messages: Vec<Bytes> = calls
            .messages
            .iter()
            .map(|m| Bytes::from_static(m))
            .collect();
        let mut request = tonic::Request::new(tokio_stream::iter(messages));
        tag(request.metadata_mut());
        if let Some(timeout) = calls.timeout {
            request.set_timeout(timeout);
        }
        client.client_streaming(request, path, RawCodec).await
    } else {
        let mut request = tonic::Request::new(Bytes::from_static(calls.messages[0]));
        tag(request.metadata_mut());
        if let Some(timeout) = calls.timeout {
            request.set_timeout(timeout);
        }
        client.unary(request, path, RawCodec).await
    }
}

/// A scenario: the server's plan and options, the service config, the calls.
#[derive(Debug, Clone)]
struct Scenario {
    plan: Vec<String>,
    server_options: Vec<String>,
    /// Applied to the layer `RetryLayer::from_service_config` made.
    adjust: fn(RetryLayer) -> RetryLayer,
    config: String,
    calls: Calls,
}

impl Scenario {
    fn new(plan: &[&str], config: &str, calls: Calls) -> Scenario {
        Scenario {
            plan: plan.iter().map(|s| s.to_string()).collect(),
            server_options: Vec::new(),
            adjust: |layer| layer,
            config: config.to_string(),
            calls,
        }
    }

    /// Runs the scenario through both clients at once, each against its own fresh server.
    async fn run(&self, python: &'static str) -> (Side, Side) {
        let reference = async {
            let server = start_server(python, self.plan.clone(), self.server_options.clone()).await;
            let outcomes =
                reference_calls(python, &server.target(), &self.config, &self.calls).await;
            let seen = server.seen().await;
            Side {
                name: "C-core",
                outcomes,
                seen,
            }
        };
        let ours = async {
            let server = start_server(python, self.plan.clone(), self.server_options.clone()).await;
            let channel = Endpoint::from_shared(format!("http://{}", server.target()))
                .unwrap()
                .connect()
                .await
                .expect("connect to the grpcio server");
            let outcomes = our_calls_with(channel, &self.config, &self.calls, self.adjust).await;
            let seen = server.seen().await;
            Side {
                name: "layer",
                outcomes,
                seen,
            }
        };
        let (reference, ours) = tokio::join!(reference, ours);
        eprintln!(
            "C-core: codes {:?}, attempts {:?}; layer: codes {:?}, attempts {:?}",
            reference.codes(),
            reference.attempt_counts(),
            ours.codes(),
            ours.attempt_counts()
        );
        (reference, ours)
    }
}

/// A config for `test.Raw` retrying `codes` with `max_attempts`, a fixed backoff ceiling of
/// `backoff` seconds (multiplier 1, or `multiplier`), and `extra` fields in the method entry
/// (start it with a comma) and at the top (`top`, likewise).
fn config(
    codes: &str,
    max_attempts: u32,
    backoff: &str,
    multiplier: f64,
    extra: &str,
    top: &str,
) -> String {
    format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "test.Raw"}}]{extra},
            "retryPolicy": {{"maxAttempts": {max_attempts}, "initialBackoff": "{backoff}",
                "maxBackoff": "{max}", "backoffMultiplier": {multiplier},
                "retryableStatusCodes": [{codes}]}}}}]{top}}}"#,
        max = if multiplier == 1.0 {
            backoff.to_string()
        } else {
            "10s".to_string()
        },
    )
}

/// Checks the gaps of call `i` on both sides against the backoff ceilings `bounds` (ms):
/// both within `[0, 1.2 * bound]` plus slack; C-core's at least `0.8 * bound` (its
/// jitter, less a little for the arrivals' own delays). The layer's own waits, where its
/// record reached the caller, are held to A6's `[0, bound]` exactly.
fn assert_backoff(reference: &Side, ours: &Side, i: usize, bounds: &[f64]) {
    for side in [reference, ours] {
        let gaps = side.gaps(i);
        assert_eq!(gaps.len(), bounds.len(), "{}: gaps {gaps:?}", side.name);
        for (gap, bound) in gaps.iter().zip(bounds) {
            assert!(
                *gap >= 0.0 && *gap <= 1.2 * bound + SLACK_MS,
                "{}: gap {gap:.1} ms outside [0, {:.0}] (+{SLACK_MS} ms): {gaps:?}",
                side.name,
                1.2 * bound
            );
            if side.name == "C-core" {
                assert!(
                    *gap >= 0.8 * bound - 20.0,
                    "C-core's jitter is 0.8 to 1.2 times the ceiling: gap {gap:.1} of {bound}"
                );
            }
        }
    }
    if let Some(info) = &ours.outcomes[i].info {
        let waits: Vec<Duration> = info.retries().iter().map(|r| r.wait).collect();
        assert_eq!(waits.len(), bounds.len(), "{info:?}");
        for (wait, bound) in waits.iter().zip(bounds) {
            assert!(
                wait.as_secs_f64() * 1000.0 <= *bound + 0.001,
                "the layer waited {wait:?}, over the ceiling of {bound} ms: {info:?}"
            );
        }
    }
}

macro_rules! python_or_skip {
    ($name:expr) => {
        match python($name) {
            Some(python) => python,
            None => return,
        }
    };
}

// ---------------------------------------------------------------------------------------
// The scenarios.
// ---------------------------------------------------------------------------------------

/// UNAVAILABLE twice, then OK; 4 attempts for UNAVAILABLE, a 50 ms ceiling: three
/// attempts both sides, numbered absent, 1, 2, the waits within the ceiling, the echo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unavailable_twice_then_ok() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("unavailable_twice_then_ok");
    let scenario = Scenario::new(
        &["fail:UNAVAILABLE", "fail:UNAVAILABLE", "ok"],
        &config(r#""UNAVAILABLE""#, 4, "0.05s", 1.0, "", ""),
        Calls::unary(b"hello"),
    );
    for _ in 0..3 {
        let (reference, ours) = scenario.run(python).await;
        for side in [&reference, &ours] {
            assert_eq!(side.codes(), [Code::Ok], "{side:#?}");
            assert_eq!(side.attempt_counts(), [3], "{side:#?}");
            assert_eq!(side.outcomes[0].reply.as_deref(), Some(&b"hello"[..]));
            side.assert_numbered();
            let steps: Vec<_> = side.attempts(0).iter().map(|c| c.step.clone()).collect();
            assert_eq!(steps, ["fail:UNAVAILABLE", "fail:UNAVAILABLE", "ok"]);
        }
        assert_backoff(&reference, &ours, 0, &[50.0, 50.0]);
    }
}

/// A code the policy does not list (INVALID_ARGUMENT): one attempt, the server's code and
/// message, both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_not_listed_is_one_attempt() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_code_not_listed_is_one_attempt");
    let scenario = Scenario::new(
        &["fail:INVALID_ARGUMENT", "ok"],
        &config(r#""UNAVAILABLE""#, 4, "0.01s", 1.0, "", ""),
        Calls::unary(b"x"),
    );
    let (reference, ours) = scenario.run(python).await;
    for side in [&reference, &ours] {
        assert_eq!(side.codes(), [Code::InvalidArgument], "{side:#?}");
        assert_eq!(side.outcomes[0].details, "scripted fail:INVALID_ARGUMENT");
        assert_eq!(side.attempt_counts(), [1], "{side:#?}");
    }
}

/// `maxAttempts: 7` is taken as 5 by both (A6's client-side cap), against a server that
/// always fails; the ceilings double from 10 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_attempts_above_five_is_five() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("max_attempts_above_five_is_five");
    let scenario = Scenario::new(
        &["fail:UNAVAILABLE"; 8],
        &config(r#""UNAVAILABLE""#, 7, "0.01s", 2.0, "", ""),
        Calls::unary(b"x"),
    );
    let (reference, ours) = scenario.run(python).await;
    for side in [&reference, &ours] {
        assert_eq!(side.codes(), [Code::Unavailable], "{side:#?}");
        assert_eq!(side.attempt_counts(), [5], "{side:#?}");
        side.assert_numbered();
    }
    assert_backoff(&reference, &ours, 0, &[10.0, 20.0, 40.0, 80.0]);
}

/// A positive pushback (200 ms) is the exact wait, whatever the backoff (2 s here, which
/// neither side would wait less than 1.6 s of in C-core, and the layer records the wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_positive_pushback_is_the_wait() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_positive_pushback_is_the_wait");
    let scenario = Scenario::new(
        &["pushback:UNAVAILABLE:200", "ok"],
        &config(r#""UNAVAILABLE""#, 4, "2s", 1.0, "", ""),
        Calls::unary(b"x"),
    );
    let (reference, ours) = scenario.run(python).await;
    for side in [&reference, &ours] {
        assert_eq!(side.codes(), [Code::Ok], "{side:#?}");
        assert_eq!(side.attempt_counts(), [2], "{side:#?}");
        side.assert_numbered();
        let gap = side.gaps(0)[0];
        assert!(
            (195.0..200.0 + SLACK_MS).contains(&gap),
            "{}: the retry came {gap:.1} ms after the first attempt",
            side.name
        );
    }
    let info = ours.outcomes[0].info.as_ref().expect("the record");
    assert_eq!(
        info.retries()[0].wait,
        Duration::from_millis(200),
        "{info:?}"
    );
}

/// A pushback of zero: A6 says retry in 0 ms, at once. C-core 1.85.3 never sends that
/// retry: its retry timer, armed with no delay, fires before the timer's handle is stored
/// and is taken as cancelled, so the call waits for its deadline. A6 wins: the layer must
/// retry at once. C-core's answer is checked to be one of the two (the hang is a race it
/// loses nearly always).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_pushback_retries_at_once() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_zero_pushback_retries_at_once");
    let mut calls = Calls::unary(b"x");
    calls.timeout = Some(Duration::from_millis(1000));
    let scenario = Scenario::new(
        &["pushback:UNAVAILABLE:0", "ok"],
        &config(r#""UNAVAILABLE""#, 4, "2s", 1.0, "", ""),
        calls,
    );
    let (reference, ours) = scenario.run(python).await;
    match (reference.codes()[0], reference.attempt_counts()[0]) {
        (Code::Ok, 2) => eprintln!("C-core retried a zero pushback at once"),
        (Code::DeadlineExceeded, 1) => {
            eprintln!("C-core left the call waiting for its deadline after a zero pushback")
        }
        other => panic!("C-core: {other:?}: {reference:#?}"),
    }
    assert_eq!(ours.codes(), [Code::Ok], "{ours:#?}");
    assert_eq!(ours.attempt_counts(), [2], "{ours:#?}");
    let gap = ours.gaps(0)[0];
    assert!(gap < SLACK_MS, "the retry came {gap:.1} ms after the first");
}

/// A negative pushback (`-1`) and a malformed one (`abc`) say stop: one attempt, the
/// server's UNAVAILABLE, both sides (A6: "negative or unparseable").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_negative_or_malformed_pushback_stops() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_negative_or_malformed_pushback_stops");
    let config = config(r#""UNAVAILABLE""#, 4, "0.01s", 1.0, "", "");
    let negative = Scenario::new(
        &["pushback:UNAVAILABLE:-1", "ok"],
        &config,
        Calls::unary(b"x"),
    );
    let malformed = Scenario::new(
        &["pushback:UNAVAILABLE:abc", "ok"],
        &config,
        Calls::unary(b"x"),
    );
    let (negative, malformed) = tokio::join!(negative.run(python), malformed.run(python));
    for (reference, ours) in [negative, malformed] {
        for side in [&reference, &ours] {
            assert_eq!(side.codes(), [Code::Unavailable], "{side:#?}");
            assert_eq!(side.attempt_counts(), [1], "{side:#?}");
            assert!(side.outcomes[0].details.starts_with("scripted pushback"));
        }
    }
}

/// The server sends its headers, then fails: the RPC is committed (A6), not retried,
/// both sides. The same with a reply message before the failure (server streaming).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_rpc_is_not_retried() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_committed_rpc_is_not_retried");
    let config = config(r#""UNAVAILABLE""#, 4, "0.01s", 1.0, "", "");
    let headers = Scenario::new(&["headers:UNAVAILABLE", "ok"], &config, Calls::unary(b"x"));
    let mut reply = Calls::unary(b"x");
    reply.method = REPLY;
    let after = Scenario::new(&["after:UNAVAILABLE", "ok"], &config, reply);
    let (headers, after) = tokio::join!(headers.run(python), after.run(python));
    for (reference, ours) in [headers, after] {
        for side in [&reference, &ours] {
            assert_eq!(side.codes(), [Code::Unavailable], "{side:#?}");
            assert_eq!(side.attempt_counts(), [1], "{side:#?}");
        }
    }
}

/// A client stream failed after the server read all of it is retried with the same
/// messages, byte for byte (an empty one and a 20,000-byte one among them), both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_stream_is_replayed_byte_for_byte() {
    static BIG: [u8; 20_000] = [0x5a; 20_000];
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_client_stream_is_replayed_byte_for_byte");
    let messages: Vec<&'static [u8]> = vec![b"one,", &BIG, b"", b"\x00\xfftwo"];
    let calls = Calls {
        method: COLLECT,
        messages: messages.clone(),
        timeout: None,
        steps: Vec::new(),
        count: 1,
    };
    let scenario = Scenario::new(
        &["fail:UNAVAILABLE", "ok"],
        &config(r#""UNAVAILABLE""#, 4, "0.01s", 1.0, "", ""),
        calls,
    );
    let (reference, ours) = scenario.run(python).await;
    for side in [&reference, &ours] {
        assert_eq!(side.codes(), [Code::Ok], "{side:#?}");
        assert_eq!(side.attempt_counts(), [2]);
        assert_eq!(
            side.outcomes[0].reply.as_deref(),
            Some(&messages.concat()[..])
        );
        for call in side.attempts(0) {
            let got: Vec<&[u8]> = call.messages.iter().map(Vec::as_slice).collect();
            assert_eq!(got, messages, "{}: {}", side.name, call.step);
        }
    }
}

/// The caller's deadline (500 ms) across attempts: the first fails at once, the retry
/// meets a server slower than the deadline. DEADLINE_EXCEEDED at the deadline after two
/// attempts, both sides, and each attempt told the time left (the retry less than the
/// first). Three runs: the deadline races the slow attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_callers_deadline_spans_the_attempts() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("the_callers_deadline_spans_the_attempts");
    let mut calls = Calls::unary(b"x");
    calls.timeout = Some(Duration::from_millis(500));
    let scenario = Scenario::new(
        &["fail:UNAVAILABLE", "sleep:5000:ok"],
        &config(r#""UNAVAILABLE""#, 4, "0.02s", 1.0, "", ""),
        calls,
    );
    let runs = futures_util::future::join_all((0..3).map(|_| scenario.run(python))).await;
    for (reference, ours) in runs {
        for side in [&reference, &ours] {
            assert_eq!(side.codes(), [Code::DeadlineExceeded], "{side:#?}");
            assert_eq!(side.attempt_counts(), [2], "{side:#?}");
            side.assert_numbered();
            let took = side.outcomes[0].elapsed;
            assert!(
                took >= Duration::from_millis(490) && took < Duration::from_millis(1500),
                "{}: {took:?}",
                side.name
            );
            let left: Vec<Duration> = side
                .attempts(0)
                .iter()
                .map(|c| c.deadline().expect("a deadline sent on every attempt"))
                .collect();
            assert!(
                left[0] <= Duration::from_millis(510),
                "{}: {left:?}",
                side.name
            );
            assert!(left[1] < left[0], "{}: {left:?}", side.name);
        }
    }
}

/// The service config's `timeout` (2.5 s) against a server that sleeps 10 s. A6: the call
/// deadline applies across all attempts; the layer ends the call at 2.5 s and sends the
/// deadline (`grpc-timeout`). C-core 1.85.3 (through grpcio) ends it 1 to 2 s early: it
/// adds the timeout to the call's start read from its cycle counter, converted against a
/// process epoch it sets a whole second and more in the past; and it does not send that
/// deadline to the server. C-core is wrong here, so only its code is held to (and its
/// time to at most the timeout); the layer is held to the timeout itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configs_timeout_is_the_deadline() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("the_configs_timeout_is_the_deadline");
    let scenario = Scenario::new(
        &["sleep:10000:ok", "ok"],
        &config(
            r#""UNAVAILABLE""#,
            4,
            "0.02s",
            1.0,
            r#", "timeout": "2.5s""#,
            "",
        ),
        Calls::unary(b"x"),
    );
    let (reference, ours) = scenario.run(python).await;
    for side in [&reference, &ours] {
        assert_eq!(side.codes(), [Code::DeadlineExceeded], "{side:#?}");
        assert_eq!(side.attempt_counts(), [1], "{side:#?}");
        assert!(side.outcomes[0].elapsed < Duration::from_millis(2500 + 500));
    }
    eprintln!(
        "the config's 2.5 s timeout: C-core ended the call after {:?}, the deadline sent: {:?}",
        reference.outcomes[0].elapsed,
        reference.attempts(0)[0].deadline()
    );
    let took = ours.outcomes[0].elapsed;
    assert!(took >= Duration::from_millis(2490), "{took:?}");
    let left = ours.attempts(0)[0].deadline().expect("grpc-timeout sent");
    assert!(left <= Duration::from_millis(2510), "{left:?}");
}

/// A6's throttle (10 tokens, 0.1 a success, retries while more than 5 are left) on one
/// channel and one layer, 81 calls with 3 attempts each for UNAVAILABLE, each call's
/// answer chosen by the call (`x-step`), so that both sides' server answers match call
/// by call whatever the other calls' retries took:
///
/// - 8 failing calls drain it: 3 attempts (10 to 7), 2 (6, then 5: no retry), then one
///   each (4, 3, 2, 1, 0, and 0: never below zero);
/// - 60 successes refill it to exactly 6; a failing call takes it to exactly 5, which is
///   not more than half: one attempt (C-core counts milli-tokens, so its 5 is exact);
/// - 11 successes more (6.1); a failing call: 5.1, retried; 4.1, not: two attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttle_drained_and_refilled_call_by_call() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_throttle_drained_and_refilled_call_by_call");
    let fail = "fail:UNAVAILABLE".to_string();
    let ok = "ok".to_string();
    let mut steps = vec![fail.clone(); 8];
    steps.extend(vec![ok.clone(); 60]);
    steps.push(fail.clone());
    steps.extend(vec![ok; 11]);
    steps.push(fail);
    let mut expected = vec![3, 2, 1, 1, 1, 1, 1, 1];
    expected.extend(vec![1; 60]);
    expected.push(1);
    expected.extend(vec![1; 11]);
    expected.push(2);
    let calls = Calls {
        method: UNARY,
        messages: vec![b"x"],
        timeout: None,
        count: steps.len(),
        steps,
    };
    let mut scenario = Scenario::new(
        &[],
        &config(
            r#""UNAVAILABLE""#,
            3,
            "0.005s",
            1.0,
            "",
            r#", "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}"#,
        ),
        calls,
    );
    scenario.plan = vec!["meta".to_string(); 120];
    let (reference, ours) = scenario.run(python).await;
    for side in [&reference, &ours] {
        side.assert_numbered();
        let counts = side.attempt_counts();
        for (i, (got, want)) in counts.iter().zip(&expected).enumerate() {
            assert_eq!(
                got, want,
                "{}: call {i}: attempts per call {counts:?}",
                side.name
            );
        }
        assert_eq!(counts.len(), expected.len());
    }
    assert_eq!(reference.codes(), ours.codes());
}

/// A stop pushback on a code the policy does not list, under a throttle (10 tokens, 0.1;
/// 2 attempts for UNAVAILABLE): five such calls (three `-1`, two `abc`), then a failing
/// call. A6: "The only RPCs that are counted as failures for the throttling policy are
/// RPCs that fail with a status code that qualifies as retryable ..., or that receive a
/// pushback response indicating not to retry", so the five take 5 tokens, the sixth call
/// finds 5 left, takes one, and is not retried: one attempt. C-core 1.85.3 returns before
/// counting anything for a code not listed, so it retries the sixth call. A6 wins: the
/// layer is held to one attempt, C-core to what it does. The control: the same stop
/// pushbacks on UNAVAILABLE (listed) drain the throttle on both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_pushback_on_a_code_not_listed_takes_a_throttle_token() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_stop_pushback_on_a_code_not_listed_takes_a_throttle_token");
    let config = config(
        r#""UNAVAILABLE""#,
        2,
        "0.005s",
        1.0,
        "",
        r#", "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}"#,
    );
    let scenario = |code: &str| {
        let mut steps: Vec<String> = (0..5)
            .map(|n| format!("pushback:{code}:{}", if n < 3 { "-1" } else { "abc" }))
            .collect();
        steps.push("fail:UNAVAILABLE".to_string());
        let calls = Calls {
            method: UNARY,
            messages: vec![b"x"],
            timeout: None,
            count: steps.len(),
            steps,
        };
        let mut scenario = Scenario::new(&[], &config, calls);
        scenario.plan = vec!["meta".to_string(); 20];
        scenario
    };
    let (unlisted, listed) = (scenario("INVALID_ARGUMENT"), scenario("UNAVAILABLE"));
    let ((reference, ours), (listed_reference, listed_ours)) =
        tokio::join!(unlisted.run(python), listed.run(python));

    assert_eq!(listed_reference.attempt_counts(), [1, 1, 1, 1, 1, 1]);
    assert_eq!(listed_ours.attempt_counts(), [1, 1, 1, 1, 1, 1]);

    let codes = [Code::InvalidArgument; 5]
        .into_iter()
        .chain([Code::Unavailable])
        .collect::<Vec<_>>();
    assert_eq!(reference.codes(), codes);
    assert_eq!(ours.codes(), codes);
    assert_eq!(
        reference.attempt_counts(),
        [1, 1, 1, 1, 1, 2],
        "C-core counts no token for a code not listed"
    );
    assert_eq!(
        ours.attempt_counts(),
        [1, 1, 1, 1, 1, 1],
        "A6: a pushback saying stop counts as a failure for the throttle"
    );
}

/// A pushback restarts the backoff (A6: "If this attempt also fails, retry delay will
/// reset to initial backoff"): UNAVAILABLE twice (ceilings 50 and 200 ms, multiplier 4),
/// a 100 ms pushback, UNAVAILABLE again, then OK. The wait after the pushback is the first
/// ceiling's again (50 ms), not the fourth's (3.2 s), both sides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pushback_restarts_the_backoff() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_pushback_restarts_the_backoff");
    let scenario = Scenario::new(
        &[
            "fail:UNAVAILABLE",
            "fail:UNAVAILABLE",
            "pushback:UNAVAILABLE:100",
            "fail:UNAVAILABLE",
            "ok",
        ],
        &config(r#""UNAVAILABLE""#, 5, "0.05s", 4.0, "", ""),
        Calls::unary(b"x"),
    );
    let (reference, ours) = scenario.run(python).await;
    for side in [&reference, &ours] {
        assert_eq!(side.codes(), [Code::Ok], "{side:#?}");
        assert_eq!(side.attempt_counts(), [5], "{side:#?}");
        side.assert_numbered();
        let pushed = side.gaps(0)[2];
        assert!(
            (99.0..100.0 + SLACK_MS).contains(&pushed),
            "{}: the pushback's wait was {pushed:.1} ms",
            side.name
        );
    }
    let info = ours.outcomes[0].info.as_ref().expect("the record");
    let waits: Vec<Duration> = info.retries().iter().map(|r| r.wait).collect();
    eprintln!(
        "the layer's waits: {waits:?}; C-core's gaps: {:?}",
        reference.gaps(0)
    );
    assert_eq!(waits[2], Duration::from_millis(100), "{info:?}");
    assert!(
        waits[3] <= Duration::from_millis(50),
        "the backoff restarted: {info:?}"
    );
    assert_backoff(&reference, &ours, 0, &[50.0, 200.0, 100.0, 50.0]);
}

/// A6 leaves the retry buffer's size to the client. C-core's per-RPC limit is 256 KiB
/// (`grpc.per_rpc_retry_buffer_size`): a client stream of 120,000 bytes (six messages of
/// 20,000) is kept and retried, one of 300,000 overflows it, and the call is committed:
/// one attempt, UNAVAILABLE. The layer's default replay cap is 64 KiB, so on purpose it
/// sends the 120,000 bytes once; with `max_replay_bytes(256 KiB)` it does as C-core does,
/// both sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_buffer_limit_commits_a_long_client_stream() {
    static CHUNK: [u8; 20_000] = [0x5a; 20_000];
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("the_retry_buffer_limit_commits_a_long_client_stream");
    let stream = |messages: usize| Calls {
        method: COLLECT,
        messages: vec![&CHUNK[..]; messages],
        timeout: None,
        steps: Vec::new(),
        count: 1,
    };
    let config = config(r#""UNAVAILABLE""#, 4, "0.01s", 1.0, "", "");
    let plan = ["fail:UNAVAILABLE", "ok"];
    let as_c_core: fn(RetryLayer) -> RetryLayer = |layer| layer.max_replay_bytes(256 * 1024);
    let default_cap = Scenario::new(&plan, &config, stream(6));
    let mut within = default_cap.clone();
    within.adjust = as_c_core;
    let mut beyond = Scenario::new(&plan, &config, stream(15));
    beyond.adjust = as_c_core;
    let ((reference, ours), (within_reference, within_ours), (beyond_reference, beyond_ours)) = tokio::join!(
        default_cap.run(python),
        within.run(python),
        beyond.run(python)
    );
    for side in [&reference, &within_reference, &within_ours] {
        assert_eq!(side.codes(), [Code::Ok], "{}", side.name);
        assert_eq!(side.attempt_counts(), [2], "{}", side.name);
        assert_eq!(
            side.outcomes[0].reply.as_ref().map(Vec::len),
            Some(120_000),
            "{}",
            side.name
        );
    }
    for side in [&ours, &beyond_reference, &beyond_ours] {
        assert_eq!(side.codes(), [Code::Unavailable], "{}", side.name);
        assert_eq!(side.attempt_counts(), [1], "{}", side.name);
    }
}

/// Nothing listens on the port. C-core (waitForReady off) fails the pick at once with
/// UNAVAILABLE and hands that to the retry policy: with UNAVAILABLE listed it retries up
/// to maxAttempts after the backoff (4 attempts, 3 waits of 80 to 120 ms, so about 0.3 s),
/// without it the call ends at once. The layer: the same final code; its counted attempts
/// are checked in its record (a transparent retry, sent at once, is allowed on top), and
/// the time must fit the same shape: at most the three ceilings, and quick when
/// UNAVAILABLE is not listed. Three runs each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_goes_to_the_retry_policy() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_refused_connection_goes_to_the_retry_policy");
    for (codes, counted) in [(r#""UNAVAILABLE""#, 4), (r#""INVALID_ARGUMENT""#, 1)] {
        let config = config(codes, 4, "0.1s", 1.0, "", "");
        for _ in 0..3 {
            let port = common::nginx::free_port();
            let target = format!("127.0.0.1:{port}");
            let calls = Calls::unary(b"x");
            let channel = Endpoint::from_shared(format!("http://{target}"))
                .unwrap()
                .connect_lazy();
            let (reference, ours) = tokio::join!(
                reference_calls(python, &target, &config, &calls),
                our_calls(channel, &config, &calls)
            );
            eprintln!(
                "refused, {codes}: C-core {:?} after {:?}; layer {:?} after {:?}, {:?}",
                reference[0].code,
                reference[0].elapsed,
                ours[0].code,
                ours[0].elapsed,
                ours[0].info
            );
            assert_eq!(reference[0].code, Code::Unavailable, "{reference:?}");
            assert_eq!(ours[0].code, Code::Unavailable, "{ours:?}");
            if counted == 4 {
                let took = reference[0].elapsed;
                assert!(
                    took >= Duration::from_millis(240) && took < Duration::from_millis(1000),
                    "C-core: {took:?}"
                );
                assert!(
                    ours[0].elapsed < Duration::from_millis(300 + 300),
                    "{ours:?}"
                );
            } else {
                assert!(
                    reference[0].elapsed < Duration::from_millis(100),
                    "{reference:?}"
                );
                assert!(ours[0].elapsed < Duration::from_millis(100), "{ours:?}");
            }
            assert_eq!(
                ours[0].counted_attempts(),
                Some(counted),
                "the layer's record: {:?}",
                ours[0].info
            );
        }
    }
}

/// The server closes connections 300 ms old (`grpc.max_connection_age_ms`: GOAWAY, then
/// the connection closes after a 100 ms grace) while a call sleeps 1.5 s on it. C-core
/// gets UNAVAILABLE ("max connection age") for it: with UNAVAILABLE listed, the retry on a
/// new connection succeeds (2 attempts); with only INTERNAL listed, the call ends
/// UNAVAILABLE after one attempt. The server saw the first attempt, so this is the
/// policy's to decide, not a transparent retry's. Three runs each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_under_a_call_is_the_policys_to_retry() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("a_connection_closed_under_a_call_is_the_policys_to_retry");
    let options = vec![
        "grpc.max_connection_age_ms=300".to_string(),
        "grpc.max_connection_age_grace_ms=100".to_string(),
    ];
    let mut scenarios = Vec::new();
    for (codes, expected) in [
        (r#""UNAVAILABLE""#, (Code::Ok, 2)),
        (r#""INTERNAL""#, (Code::Unavailable, 1)),
    ] {
        let mut scenario = Scenario::new(
            &["sleep:1500:ok", "ok"],
            &config(codes, 4, "0.01s", 1.0, "", ""),
            Calls::unary(b"x"),
        );
        scenario.server_options = options.clone();
        for _ in 0..3 {
            scenarios.push((scenario.clone(), expected));
        }
    }
    let runs = futures_util::future::join_all(
        scenarios
            .iter()
            .map(|(scenario, expected)| async move { (scenario.run(python).await, *expected) }),
    )
    .await;
    for ((reference, ours), (code, attempts)) in runs {
        for side in [&reference, &ours] {
            assert_eq!(side.codes(), [code], "{side:#?}");
            assert_eq!(side.attempt_counts(), [attempts], "{side:#?}");
            side.assert_numbered();
        }
    }
}

/// GOAWAY between calls: the server ages connections out every 30 ms (a second of grace)
/// while 150 calls go one after another; four runs at once, two with only INTERNAL
/// listed, two with UNAVAILABLE. Every call succeeds with one attempt the server saw,
/// without `grpc-previous-rpc-attempts`, on both sides: a call sent as the connection
/// goes away, which never left the client, is A6's transparent retry ("the RPC never
/// leaves the client ... retried ... regardless of the retry configuration", and not
/// counted as an attempt), and C-core does just that. The layer does too where hyper says
/// so: its "operation was canceled" for a request its connection dropped before sending
/// it is such a call (the server saw nothing of it). A stream the GOAWAY itself refused is
/// not: h2 reports it as the GOAWAY, as it may a stream the server did process, and the
/// layer takes no GOAWAY as proof. Those calls are the layer's known divergence, reported
/// and bounded (at most one in twenty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_between_calls_is_not_a_failure() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("goaway_between_calls_is_not_a_failure");
    const CALLS: usize = 150;
    let mut calls = Calls::unary(b"x");
    calls.count = CALLS;
    let scenario = |codes: &str| {
        let mut scenario =
            Scenario::new(&[], &config(codes, 4, "0.01s", 1.0, "", ""), calls.clone());
        scenario.server_options = vec![
            "grpc.max_connection_age_ms=30".to_string(),
            "grpc.max_connection_age_grace_ms=1000".to_string(),
        ];
        scenario
    };
    let scenarios = [
        scenario(r#""INTERNAL""#),
        scenario(r#""INTERNAL""#),
        scenario(r#""UNAVAILABLE""#),
        scenario(r#""UNAVAILABLE""#),
    ];
    let runs = futures_util::future::join_all(scenarios.iter().map(|s| s.run(python))).await;
    let mut failures = Vec::new();
    let mut goaways = 0;
    for (scenario, (reference, ours)) in scenarios.iter().zip(&runs) {
        let listed = if scenario.config.contains("UNAVAILABLE") {
            "UNAVAILABLE listed"
        } else {
            "INTERNAL listed"
        };
        for side in [reference, ours] {
            for (i, outcome) in side.outcomes.iter().enumerate() {
                let previous = side.previous(i);
                // The layer's known divergence: a stream the GOAWAY refused (above its
                // last stream id) reaches it as h2's GOAWAY error, which hyper also
                // reports for a stream the server did process, so the layer does not take
                // it as proof: the call fails (its code not listed) or is retried
                // counted, where C-core retries it transparently. Rare; bounded below.
                let went_away = side.name == "layer"
                    && outcome.info.as_ref().is_some_and(|info| {
                        info.outcomes().next().unwrap() == AttemptOutcome::Error
                            && (info.retries().is_empty() && outcome.details.contains("max_age")
                                || info.retries().first().is_some_and(|r| {
                                    r.reason == tower_http_retry::classify::RetryReason::GoAway
                                }))
                    });
                if went_away {
                    eprintln!(
                        "{listed}: layer: call {i} met the GOAWAY: {:?}",
                        outcome.info
                    );
                    goaways += 1;
                    continue;
                }
                if outcome.code != Code::Ok || previous != [None] {
                    failures.push(format!(
                        "{listed}: {}: call {i}: {:?} {:?}; the server saw attempts with \
                         grpc-previous-rpc-attempts {previous:?}; the record: {:?}",
                        side.name, outcome.code, outcome.details, outcome.info
                    ));
                }
            }
        }
    }
    // Four runs of 150 calls: a few may meet the GOAWAY, not many.
    if goaways > 4 * CALLS / 20 {
        failures.push(format!("{goaways} of the layer's calls met the GOAWAY"));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// nginx in front answers `return 503;`, `502`, `429` (no `grpc-status`) on h2c listeners,
/// and `404` as a control; four calls each, one after another on one channel.
/// gRPC's HTTP-to-gRPC mapping makes the first three UNAVAILABLE, which is listed: every
/// call is retried to its 3 attempts, numbered absent, 1, 2 in nginx's log; 404 is
/// UNIMPLEMENTED, not listed: one attempt.
///
/// C-core 1.85.3 does that often, but not always: now and then (one call in six run
/// alone, nearer one in two with four clients at once) it stops after an attempt that got
/// the proxy's error page, within 2 ms, with no backoff: it loses a race between the
/// headers it fails the attempt on and the rest of the response, and takes the call as
/// committed. A6 commits a call on the server's Response-Headers; a proxy's error page is
/// no gRPC response, and C-core retries it whenever it wins the race. So C-core is held to
/// its attempts being a numbered prefix of the three, with all three made by at least one
/// of its twelve calls, and the layer to three every time, also for a call nginx answered
/// before hyper sent its body (nginx's `return` answers without reading it): the retry
/// sends the whole body, as C-core does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_http_errors_are_unavailable_and_retried() {
    let _heavy = common::grpcio::one_at_a_time().await;
    let python = python_or_skip!("proxy_http_errors_are_unavailable_and_retried");
    let Some(nginx) = common::nginx::binary("proxy_http_errors_are_unavailable_and_retried") else {
        return;
    };
    const STATUSES: [u16; 4] = [503, 502, 429, 404];
    const CALLS: usize = 4;
    // Ports 0..4 for C-core, 4..8 for the layer, in the order of STATUSES.
    let nginx = common::nginx::Nginx::start(
        &nginx,
        8,
        r#"$server_port $http_x_call $status "$http_grpc_previous_rpc_attempts""#,
        |ports| {
            ports
                .iter()
                .enumerate()
                .map(|(i, port)| {
                    format!(
                        "    server {{ listen 127.0.0.1:{port} http2; return {}; }}\n",
                        STATUSES[i % 4]
                    )
                })
                .collect()
        },
    );
    let config = config(r#""UNAVAILABLE""#, 3, "0.01s", 1.0, "", "");
    let mut calls = Calls::unary(b"x");
    calls.count = CALLS;
    let reference = futures_util::future::join_all(nginx.ports[..4].iter().map(|port| {
        let target = format!("127.0.0.1:{port}");
        let (config, calls) = (&config, &calls);
        async move { reference_calls(python, &target, config, calls).await }
    }));
    let ours = futures_util::future::join_all(nginx.ports[4..].iter().map(|port| {
        let (config, calls) = (&config, &calls);
        async move {
            let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
                .unwrap()
                .connect()
                .await
                .expect("connect to nginx");
            our_calls(channel, config, calls).await
        }
    }));
    let (reference, ours) = tokio::join!(reference, ours);
    // nginx logs a request when it is done with it, which may be a moment after the client
    // saw the answer: wait, bounded, for every line the callers' codes account for.
    let mut log = String::new();
    for _ in 0..200 {
        log = nginx.access_log();
        if log.lines().count() >= 2 * CALLS * (3 * 3 + 1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // The `grpc-previous-rpc-attempts` nginx saw, per call, on `port`.
    let seen = |port: u16, call: usize| -> Vec<String> {
        let prefix = format!("{port} {call} ");
        log.lines()
            .filter_map(|line| line.strip_prefix(&prefix))
            .map(str::to_string)
            .collect()
    };
    let mut failures = Vec::new();
    let mut whole = 0;
    for (side, outcomes, ports) in [
        ("C-core", &reference, &nginx.ports[..4]),
        ("layer", &ours, &nginx.ports[4..]),
    ] {
        for ((status, outcomes), port) in STATUSES.iter().zip(outcomes).zip(ports) {
            let (code, full) = if *status == 404 {
                (Code::Unimplemented, vec![r#"404 "-""#.to_string()])
            } else {
                let full = ["-", "1", "2"]
                    .iter()
                    .map(|p| format!(r#"{status} "{p}""#))
                    .collect();
                (Code::Unavailable, full)
            };
            for (i, outcome) in outcomes.iter().enumerate() {
                let got = seen(*port, i);
                eprintln!(
                    "{side}: HTTP {status}, call {i}: {:?} {:?}; nginx saw {got:?}",
                    outcome.code, outcome.details
                );
                let fits = if side == "C-core" {
                    !got.is_empty() && full.starts_with(&got)
                } else {
                    got == full
                };
                if side == "C-core" && *status != 404 {
                    whole += usize::from(got == full);
                }
                if outcome.code != code || !fits {
                    failures.push(format!(
                        "{side}: HTTP {status}, call {i}: got {:?} ({:?}) after {got:?}; \
                         expected {code:?} after {full:?}; the record: {}",
                        outcome.code,
                        outcome.details,
                        outcome
                            .info
                            .as_ref()
                            .map_or("none".to_string(), |info| format!("{info:#}"))
                    ));
                }
            }
        }
    }
    if whole == 0 {
        failures.push("C-core: no call retried a proxy's error to the end".to_string());
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
