//! The layered client is used the way a bare hyper-util client is, inside spawned tasks.

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::RetryLayer;

type Body = BoxBody<Bytes, BoxError>;

#[tokio::test]
async fn ready_then_call_inside_spawn_compiles_and_runs() {
    let client =
        Client::builder(TokioExecutor::new()).build_http::<tower_http_retry::ReplayBody<Body>>();
    let svc = RetryLayer::new().layer(client);
    let task = tokio::spawn(async move {
        let mut svc = svc;
        let req = Request::get("http://127.0.0.1:9/")
            .body(Full::new(Bytes::new()).map_err(BoxError::from).boxed())
            .unwrap();
        svc.ready().await?.call(req).await
    });
    let _ = task.await.unwrap();
}
