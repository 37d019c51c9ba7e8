// A hyper-util client built for the caller's body, not for `ReplayBody` of it: the inner
// service of `Retry` must take `Request<ReplayBody<B>>`. Every line marked `ERROR` must be
// reported with the `InnerService` message, and the line marked `E0599` as a method whose
// bounds `Retry` does not meet (tests/compile_fail.rs).

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_http_retry::RetryLayer;

type Body = BoxBody<Bytes, BoxError>;

fn send<S>(_client: S)
where
    S: Service<Request<Body>, Response = Response<Incoming>>,
{
}

fn main() {
    // Should be `build_http::<tower_http_retry::ReplayBody<Body>>()`.
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new())
        .service(client);
    let request = Request::get("http://127.0.0.1:3000/")
        .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
        .unwrap();

    let second = Request::get("http://127.0.0.1:3000/")
        .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
        .unwrap();

    send(client.clone()); // ERROR
    // tower's method syntax: E0599, the method's bounds not met, naming `Retry`.
    let _ = client.clone().oneshot(second); // E0599
    let _ = ServiceExt::oneshot(client, request); // ERROR
}
