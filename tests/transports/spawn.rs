//! A client made with the layer is used the way the bare hyper-util client is: driven
//! from inside `tokio::spawn`, with `BoxBody<Bytes, BoxError>` request bodies, as the bare client can.
//! These tests are first of all a compile check: a response future that names the inner
//! service's future type inside a struct generic over the service and the body made them
//! fail with "implementation of `Service` is not general enough". (`oneshot` inside
//! `tokio::spawn` fails the same way for the bare client itself, as tower's `Oneshot` names
//! the service's future: not a call style the layer can give back.)

use crate::common;

use bytes::Bytes;
use common::server::{respond, serve};
use http::Request;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Layer, Service, ServiceExt};
use tower_http_retry::{ReplayBody, RetryError, RetryInfo, RetryLayer};

type Body = BoxBody<Bytes, BoxError>;

fn body(text: &'static str) -> Body {
    Full::new(Bytes::from_static(text.as_bytes()))
        .map_err(BoxError::from)
        .boxed()
}

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, ReplayBody<Body>> {
    Client::builder(TokioExecutor::new()).build_http()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_then_call_inside_spawn() {
    let server = serve(|hit| async move { respond(if hit.index == 0 { 503 } else { 200 }) }).await;
    let svc = RetryLayer::new().layer(client());
    let url = server.url("/doc");
    let task = tokio::spawn(async move {
        let mut svc = svc;
        let req = Request::put(url).body(body("v2")).unwrap();
        svc.ready().await?.call(req).await
    });
    let response = task.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.extensions().get::<RetryInfo>().unwrap().attempts(),
        2
    );
    assert!(
        server
            .hits()
            .iter()
            .all(|h| h.body == Bytes::from_static(b"v2"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_call_fails_with_the_record_and_hyper_in_its_chain() {
    // A port nobody listens on: every attempt is a connect error.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut svc = RetryLayer::new().layer(client());
    let task = tokio::spawn(async move {
        let req = Request::get(format!("http://127.0.0.1:{port}/"))
            .body(body(""))
            .unwrap();
        svc.ready().await?.call(req).await
    });
    let error = task.await.unwrap().unwrap_err();
    let retry = error.downcast_ref::<RetryError>().expect("a RetryError");
    assert_eq!(retry.info().attempts(), 3);
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&*error);
    let mut connect = false;
    while let Some(e) = source {
        connect |= e
            .downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(|e| e.is_connect());
        source = e.source();
    }
    assert!(
        connect,
        "hyper-util's connect error is in the chain: {error:?}"
    );
}
