//! A gRPC client behind a real proxy: nginx on 127.0.0.1 over cleartext HTTP/2, in front of
//! nothing (its own error pages: `return 503;` for maintenance, 502 for an upstream that is
//! down, 429 for a rate limit) or of a grpcio server (`grpc_pass`).
//!
//! A proxy's error page has no `grpc-status`: gRPC's clients give it the code of gRPC's
//! HTTP-to-gRPC mapping (503, 502 and 429 are UNAVAILABLE), and retry it when the method
//! lists that code, as C-core does with the same service config. Through the layer built
//! from that config over a tonic `Channel`, the call must be retried the same way, and the
//! caller must get UNAVAILABLE (tonic alone reports INTERNAL, after failing to read nginx's
//! HTML as gRPC messages) with the layer's record of the call as the status's source.
//!
//! nginx comes from Debian's `nginx-light`, grpcio from PyPI (`.ci/run` installs both).
//! Without them the tests fail under `CI=true`, and elsewhere say loudly that they skipped.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use crate::common;

use std::collections::HashMap;
use std::error::Error as _;

use tonic::Code;
use tonic::transport::Endpoint;
use tower_http_retry::{RetryError, RetryInfo, RetryLayer, StopReason};
use tower_http_retry_grpc::GrpcLayerExt;
use tower_http_retry_grpc::service_config;

use common::grpc::{UNARY, stack, unary};
use common::grpcio::{GrpcioServer, python};
use common::nginx::Nginx;

/// maxAttempts 4 for every method, UNAVAILABLE retried, short backoffs.
const CONFIG: &str = r#"{"methodConfig": [{
    "name": [{}],
    "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}
}]}"#;

fn layer() -> RetryLayer {
    RetryLayer::from_service_config(&service_config(CONFIG).unwrap())
}

/// Requests per port in nginx's access log (`$server_port $status`).
fn per_port(log: &str) -> HashMap<u16, Vec<u16>> {
    let mut seen: HashMap<u16, Vec<u16>> = HashMap::new();
    for line in log.lines() {
        let mut fields = line.split_whitespace();
        if let (Some(Ok(port)), Some(Ok(status))) =
            (fields.next().map(str::parse), fields.next().map(str::parse))
        {
            seen.entry(port).or_default().push(status);
        }
    }
    seen
}

/// The record a failed call's status carries.
fn record(status: &tonic::Status) -> RetryInfo {
    let source = status.source().expect("the record is the status's source");
    let error = source
        .downcast_ref::<RetryError>()
        .expect("the source is the layer's RetryError");
    let beneath = error.get_ref().downcast_ref::<tonic::Status>();
    assert_eq!(
        beneath.map(tonic::Status::code),
        Some(status.code()),
        "the record's own source is the same status"
    );
    error.info().clone()
}

#[tokio::test]
async fn a_proxys_http_error_is_retried_as_unavailable() {
    let Some(binary) = common::nginx::binary("a_proxys_http_error_is_retried_as_unavailable")
    else {
        return;
    };
    let answers = [503, 502, 429, 404, 400];
    let nginx = Nginx::start(&binary, answers.len(), "$server_port $status", |ports| {
        ports
            .iter()
            .zip(answers)
            .map(|(port, status)| {
                format!(
                    "    server {{\n        listen 127.0.0.1:{port} http2;\n        \
                     location / {{ return {status}; }}\n    }}\n"
                )
            })
            .collect()
    });
    for (&port, answer) in nginx.ports.iter().zip(answers) {
        let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
            .unwrap()
            .connect()
            .await
            .expect("connect to nginx");
        let status = unary(stack(channel, layer()), UNARY, b"x")
            .await
            .unwrap_err();
        let (code, attempts, stop) = match answer {
            503 | 502 | 429 => (Code::Unavailable, 4, StopReason::MaxAttempts),
            404 => (Code::Unimplemented, 1, StopReason::Final),
            _ => (Code::Internal, 1, StopReason::Final),
        };
        assert_eq!(status.code(), code, "{answer}: {status:?}");
        assert!(
            status.message().contains(&answer.to_string()),
            "{answer}: {status:?}"
        );
        let info = record(&status);
        assert_eq!((info.attempts(), info.stop()), (attempts, stop), "{answer}");
        // nginx logs a request once it is done with it, which may be a moment after the
        // client saw the answer: wait, bounded, for the lines the record accounts for.
        let mut seen = per_port(&nginx.access_log());
        for _ in 0..200 {
            if seen.get(&port).map_or(0, Vec::len) >= attempts as usize {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            seen = per_port(&nginx.access_log());
        }
        assert_eq!(
            seen.get(&port).map(Vec::len),
            Some(attempts as usize),
            "{answer}"
        );
    }
}

/// grpcio behind nginx's `grpc_pass`, and grpcio alone: a call that fails on its status
/// (Trailers-Only) after its retries reaches the caller as that status, metadata kept,
/// with its own record; a call that succeeds has its record in the response.
#[tokio::test]
async fn a_failed_calls_status_carries_its_own_record() {
    let test = "a_failed_calls_status_carries_its_own_record";
    let (Some(python), Some(binary)) = (python(test), common::nginx::binary(test)) else {
        return;
    };
    let plan = ["fail:UNAVAILABLE"; 4];
    let direct = GrpcioServer::start(python, &plan);
    let behind = GrpcioServer::start(python, &plan);
    let upstream = behind.port;
    let nginx = Nginx::start(&binary, 1, "$server_port $status", |ports| {
        format!(
            "    server {{\n        listen 127.0.0.1:{} http2;\n        \
             location / {{ grpc_pass grpc://127.0.0.1:{upstream}; }}\n    }}\n",
            ports[0]
        )
    });
    for uri in [direct.uri(), format!("http://127.0.0.1:{}", nginx.ports[0])] {
        let channel = Endpoint::from_shared(uri.clone())
            .unwrap()
            .connect()
            .await
            .expect("connect");
        let client = stack(channel, layer());
        let status = unary(client.clone(), UNARY, b"x").await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{uri}: {status:?}");
        assert_eq!(status.message(), "scripted fail:UNAVAILABLE", "{uri}");
        let info = record(&status);
        assert_eq!(
            (info.attempts(), info.stop()),
            (4, StopReason::MaxAttempts),
            "{uri}"
        );
        let waits: Vec<_> = info.retries().iter().map(|r| r.wait).collect();
        assert_eq!(waits.len(), 3, "{uri}");
        // The plan is used up: the next call succeeds at once, its record in the response.
        let reply = unary(client, UNARY, b"y").await.unwrap();
        assert_eq!(reply.extensions().get::<RetryInfo>().unwrap().attempts(), 1);
    }
    assert_eq!(direct.seen().await.len(), 5);
    assert_eq!(behind.seen().await.len(), 5);
    assert_eq!(per_port(&nginx.access_log())[&nginx.ports[0]].len(), 5);
}
