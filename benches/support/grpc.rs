//! An in-process tonic server for `benches/grpc.rs`: one raw-bytes unary method that
//! echoes its request, written by hand (no protobuf compiler), and the client call the
//! bench makes against it.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::NamedService;
use tonic::transport::{Channel, Endpoint};
use tower::Service;

/// The echo method's path.
pub const ECHO: &str = "/bench.Raw/Echo";

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

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The server's service: `bench.Raw/Echo` through tonic's own unary handling (framing,
/// trailers), anything else UNIMPLEMENTED.
#[derive(Clone, Copy)]
struct Raw;

impl NamedService for Raw {
    const NAME: &'static str = "bench.Raw";
}

impl Service<http::Request<tonic::body::Body>> for Raw {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(async move {
            if request.uri().path() != ECHO {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            Ok(tonic::server::Grpc::new(RawCodec)
                .unary(Echo, request)
                .await)
        })
    }
}

/// Calls the server has answered, over the whole run: with a run's total instruction
/// count under callgrind it gives the cost per call (BENCHMARKS.md).
pub static SERVED: AtomicU64 = AtomicU64::new(0);

/// The echo handler.
struct Echo;

impl Service<tonic::Request<Bytes>> for Echo {
    type Response = tonic::Response<Bytes>;
    type Error = Status;
    type Future = std::future::Ready<Result<tonic::Response<Bytes>, Status>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        SERVED.fetch_add(1, Ordering::Relaxed);
        std::future::ready(Ok(tonic::Response::new(request.into_inner())))
    }
}

/// Starts the server on a free port of 127.0.0.1 on the current runtime; returns its
/// address. It runs until the runtime stops.
pub async fn serve() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(Raw)
            .serve_with_incoming(incoming),
    );
    addr
}

/// A connected `Channel` to `addr` (one HTTP/2 connection, `TCP_NODELAY`).
pub async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid URI")
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect to the bench server")
}

/// One unary echo call through any tonic-compatible service; checks the reply.
pub async fn echo<T>(service: T, message: Bytes)
where
    T: tonic::client::GrpcService<tonic::body::Body>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower::BoxError> + Send,
{
    let mut client = tonic::client::Grpc::new(service);
    client
        .ready()
        .await
        .map_err(Into::into)
        .expect("client ready");
    let len = message.len();
    let reply = client
        .unary(
            tonic::Request::new(message),
            http::uri::PathAndQuery::from_static(ECHO),
            RawCodec,
        )
        .await
        .expect("an OK reply from 127.0.0.1");
    assert_eq!(reply.get_ref().len(), len);
}

/// Nanoseconds on the CPU, user and kernel, of every thread of the process so far: the
/// first field of each `/proc/self/task/<tid>/schedstat` (Linux only).
pub fn process_cpu_ns() -> u64 {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task (Linux only)");
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|line| line.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}
