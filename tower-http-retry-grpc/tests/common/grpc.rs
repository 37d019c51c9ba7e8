//! A real tonic server on 127.0.0.1 for the gRPC tests: one raw-bytes service written by
//! hand (no protobuf compiler), answering each call as a scripted plan says.
//!
//! `test.Raw/Unary` echoes its request message; `test.Raw/Collect` (client streaming)
//! answers with all its request messages joined; `test.Raw/Echo` is a second unary method,
//! and `test.Other` a second service with the same methods, for per-method and per-service
//! configuration. Messages are plain bytes ([`RawCodec`]).
//! Each call takes the next [`Step`] of the plan (`Step::Ok` once the plan is used up)
//! and is recorded ([`Seen`]): its path, its headers, its request bytes.
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::HeaderMap;
use tokio::sync::oneshot;
use tokio_stream::StreamExt;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder, Streaming};
use tonic::metadata::MetadataValue;
use tonic::server::NamedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};
use tower::{Service, ServiceBuilder};
use tower_http_retry::{Backoff, Jitter, Retry, RetryLayer, RetryPolicy};
use tower_http_retry_grpc::GrpcPolicyExt;
use tower_http_retry_grpc::{self as grpc, IntoStatus, TonicBody};

/// The service's name.
pub const SERVICE: &str = "test.Raw";
/// The unary method's path.
pub const UNARY: &str = "/test.Raw/Unary";
/// The client-streaming method's path.
pub const COLLECT: &str = "/test.Raw/Collect";
/// A second unary method of the same service.
pub const ECHO: &str = "/test.Raw/Echo";
/// The second service's name.
pub const OTHER_SERVICE: &str = "test.Other";
/// The second service's unary method.
pub const OTHER_UNARY: &str = "/test.Other/Unary";

/// Four attempts, 1 to 4 ms of backoff without jitter, UNAVAILABLE retried.
pub fn quick() -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(4)
        .backoff(
            Backoff::exponential(Duration::from_millis(1), Duration::from_millis(4))
                .jitter(Jitter::None),
        )
        .grpc_codes([Code::Unavailable])
}

/// The README's client stack: status layer, `layer`, body layer, then the channel.
pub fn stack(channel: Channel, layer: RetryLayer) -> IntoStatus<Retry<TonicBody<Channel>>> {
    ServiceBuilder::new()
        .layer(grpc::status_layer())
        .layer(layer)
        .layer(grpc::tonic_body_layer())
        .service(channel)
}

/// Messages as plain bytes, both ways.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// How the server answers one call.
#[derive(Debug, Clone)]
pub enum Step {
    /// `OK`, with the reply message.
    Ok,
    /// An error before any output: tonic sends it Trailers-Only.
    Fail(Code),
    /// An error before any output with `grpc-retry-pushback-ms` set to this value.
    Pushback(Code, &'static str),
    /// Response headers and the reply message, then this code in the trailers: the RPC
    /// was committed before it failed. (Unary calls only; a client-streaming call gets
    /// `Fail` instead.)
    AfterHeaders(Code),
    /// Wait this long first (after reading the request), then answer as the inner step.
    Slow(Duration, Box<Step>),
}

/// One call as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    /// The request messages, joined.
    pub body: Bytes,
}

#[derive(Default)]
struct State {
    plan: Mutex<VecDeque<Step>>,
    seen: Mutex<Vec<Seen>>,
}

impl State {
    fn next(&self) -> Step {
        self.plan.lock().unwrap().pop_front().unwrap_or(Step::Ok)
    }

    fn record(&self, path: &str, headers: HeaderMap, body: Bytes) {
        self.seen.lock().unwrap().push(Seen {
            path: path.to_string(),
            headers,
            body,
        });
    }
}

/// A running server; it stops when dropped.
pub struct GrpcServer {
    pub addr: SocketAddr,
    state: Arc<State>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl GrpcServer {
    /// Starts a server on a free port of 127.0.0.1, answering calls as `plan` says.
    pub async fn start(plan: impl IntoIterator<Item = Step>) -> GrpcServer {
        let state = Arc::new(State::default());
        state.plan.lock().unwrap().extend(plan);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let (shutdown, stopped) = oneshot::channel::<()>();
        let service = Raw {
            state: state.clone(),
        };
        let other = Other(service.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .add_service(other)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                }),
        );
        GrpcServer {
            addr,
            state,
            shutdown: Some(shutdown),
        }
    }

    /// `http://127.0.0.1:port`.
    pub fn uri(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A tonic `Channel` to this server, connected.
    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(self.uri())
            .unwrap()
            .connect()
            .await
            .expect("connect to the test server")
    }

    /// Appends steps to the plan.
    pub fn push(&self, steps: impl IntoIterator<Item = Step>) {
        self.state.plan.lock().unwrap().extend(steps);
    }

    /// Every call so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// The status a failing step answers with.
fn failure(code: Code, pushback: Option<&'static str>) -> Status {
    let mut status = Status::new(code, format!("scripted {code:?}"));
    if let Some(value) = pushback {
        status
            .metadata_mut()
            .insert("grpc-retry-pushback-ms", MetadataValue::from_static(value));
    }
    status
}

/// Answers `reply` per `step`, after its delay.
async fn answer(step: Step, reply: Bytes) -> Result<tonic::Response<Bytes>, Status> {
    let mut step = step;
    while let Step::Slow(delay, inner) = step {
        tokio::time::sleep(delay).await;
        step = *inner;
    }
    match step {
        Step::Ok => Ok(tonic::Response::new(reply)),
        Step::Fail(code) | Step::AfterHeaders(code) => Err(failure(code, None)),
        Step::Pushback(code, value) => Err(failure(code, Some(value))),
        Step::Slow(..) => unreachable!(),
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The hand-written service: routes by path to tonic's own unary, client-streaming and
/// server-streaming handling, so the framing, Trailers-Only included, is tonic's.
#[derive(Clone)]
struct Raw {
    state: Arc<State>,
}

impl NamedService for Raw {
    const NAME: &'static str = SERVICE;
}

impl Service<http::Request<tonic::body::Body>> for Raw {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let state = self.state.clone();
        Box::pin(async move {
            let path = request.uri().path().to_string();
            let method = path.rsplit('/').next().unwrap_or_default();
            let step = state.next();
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            let response = match (method, step) {
                ("Unary" | "Echo", Step::AfterHeaders(code)) => {
                    let then_fail = ThenFail {
                        state,
                        path: path.clone(),
                        code,
                    };
                    grpc.server_streaming(then_fail, request).await
                }
                ("Unary" | "Echo", step) => {
                    let unary = Unary {
                        state,
                        path: path.clone(),
                        step,
                    };
                    grpc.unary(unary, request).await
                }
                ("Collect", step) => {
                    let collect = Collect {
                        state,
                        path: path.clone(),
                        step,
                    };
                    grpc.client_streaming(collect, request).await
                }
                _ => Status::unimplemented(format!("no method {path}")).into_http(),
            };
            Ok(response)
        })
    }
}

/// The same methods under a second service name, sharing the plan and the record.
#[derive(Clone)]
struct Other(Raw);

impl NamedService for Other {
    const NAME: &'static str = OTHER_SERVICE;
}

impl Service<http::Request<tonic::body::Body>> for Other {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        self.0.call(request)
    }
}

struct Unary {
    state: Arc<State>,
    path: String,
    step: Step,
}

impl Service<tonic::Request<Bytes>> for Unary {
    type Response = tonic::Response<Bytes>;
    type Error = Status;
    type Future = BoxFuture<Result<tonic::Response<Bytes>, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let (metadata, _, message) = request.into_parts();
        self.state
            .record(&self.path, metadata.into_headers(), message.clone());
        Box::pin(answer(self.step.clone(), message))
    }
}

struct Collect {
    state: Arc<State>,
    path: String,
    step: Step,
}

impl Service<tonic::Request<Streaming<Bytes>>> for Collect {
    type Response = tonic::Response<Bytes>;
    type Error = Status;
    type Future = BoxFuture<Result<tonic::Response<Bytes>, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Streaming<Bytes>>) -> Self::Future {
        let state = self.state.clone();
        let path = self.path.clone();
        let step = self.step.clone();
        Box::pin(async move {
            let (metadata, _, mut messages) = request.into_parts();
            let mut joined = BytesMut::new();
            while let Some(message) = messages.next().await {
                joined.extend_from_slice(&message?);
            }
            let joined = joined.freeze();
            state.record(&path, metadata.into_headers(), joined.clone());
            answer(step, joined).await
        })
    }
}

/// Replies with the echo, then fails in the trailers.
struct ThenFail {
    state: Arc<State>,
    path: String,
    code: Code,
}

type Replies = tokio_stream::Iter<std::vec::IntoIter<Result<Bytes, Status>>>;

impl Service<tonic::Request<Bytes>> for ThenFail {
    type Response = tonic::Response<Replies>;
    type Error = Status;
    type Future = BoxFuture<Result<tonic::Response<Replies>, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        let (metadata, _, message) = request.into_parts();
        self.state
            .record(&self.path, metadata.into_headers(), message.clone());
        let replies = vec![Ok(message), Err(failure(self.code, None))];
        Box::pin(async move { Ok(tonic::Response::new(tokio_stream::iter(replies))) })
    }
}

/// A unary call of `path` with `message` through any tonic-compatible service.
pub async fn unary<T>(
    service: T,
    path: &'static str,
    message: &'static [u8],
) -> Result<tonic::Response<Bytes>, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    unary_request(
        service,
        path,
        tonic::Request::new(Bytes::from_static(message)),
    )
    .await
}

/// A unary call with a request of the caller's making (metadata, timeout).
pub async fn unary_request<T>(
    service: T,
    path: &'static str,
    request: tonic::Request<Bytes>,
) -> Result<tonic::Response<Bytes>, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    let mut client = tonic::client::Grpc::new(service);
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {}", e.into())))?;
    client
        .unary(
            request,
            http::uri::PathAndQuery::from_static(path),
            RawCodec,
        )
        .await
}

/// A client-streaming call of [`COLLECT`] sending `messages`.
pub async fn collect<T>(
    service: T,
    messages: &[&'static [u8]],
) -> Result<tonic::Response<Bytes>, Status>
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    let mut client = tonic::client::Grpc::new(service);
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(format!("not ready: {}", e.into())))?;
    let stream = tokio_stream::iter(
        messages
            .iter()
            .map(|m| Bytes::from_static(m))
            .collect::<Vec<_>>(),
    );
    client
        .client_streaming(
            tonic::Request::new(stream),
            http::uri::PathAndQuery::from_static(COLLECT),
            RawCodec,
        )
        .await
}

/// One gRPC message frame: uncompressed flag, length, bytes.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(message.len() as u32);
    out.put_slice(message);
    out.freeze()
}

/// A `grpc-timeout` value as the gRPC spec writes it: up to 8 digits, then the unit.
pub fn grpc_timeout(text: &str) -> Duration {
    let (digits, unit) = text.split_at(text.len() - 1);
    assert!(digits.len() <= 8, "{text:?}");
    let amount: u64 = digits.parse().unwrap();
    match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => panic!("unit of {text:?}"),
    }
}
