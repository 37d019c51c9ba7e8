// `ReqwestService` and `RequestBuilderExt::send_with` over reqwest's wasm32 client (`fetch`,
// in a browser or Node). The native counterpart is native.rs.
//
// reqwest's wasm client is no tower `Service` (`Client::execute` sends), its request body
// is a buffer handed to `fetch` whole (no `http_body::Body`, no `Body::wrap`), and its
// response converts neither to nor from an `http::Response` and has no extensions. So an
// attempt's body is collected into bytes before `execute`, and the answer is an
// `http::Response` whose head (status, headers) is a copy of reqwest's and whose body is
// reqwest's `Response` itself: the layer reads the head and puts its record in the
// extensions; the caller reads the body with reqwest's own `text()`, `bytes()`, `json()`.
//
// Nothing here is `Send`: the browser's futures are not.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tower::BoxError;
use tower_http_retry::ReplayBody;
use tower_http_retry::classify::Recognized;
use tower_service::Service;

use crate::bridge::{Error, ready_call};
use crate::{Origins, RequestBuilderExt, ReqwestService, recognized, to_reqwest};

/// The request body of a [`ReqwestService`] on wasm32 by default, and the one
/// [`RequestBuilderExt::send_with`](crate::RequestBuilderExt::send_with) hands it: the
/// whole body in one buffer, as reqwest's `fetch` client sends it.
pub type RequestBody = Full<Bytes>;

/// The request's own timeout (`RequestBuilder::timeout`), carried by `send_with` to every
/// attempt: reqwest's wasm conversion to an `http::Request` drops it.
#[derive(Clone, Copy)]
pub(crate) struct AttemptTimeout(pub(crate) Duration);

type Answer = Result<http::Response<::reqwest::Response>, Recognized>;

/// The response future of [`ReqwestService`].
pub struct ResponseFuture {
    // One box per attempt: the body's collection and `fetch` in one future, which names
    // no type (a `fetch` costs far more than the allocation).
    future: Pin<Box<dyn Future<Output = Answer>>>,
}

impl Future for ResponseFuture {
    type Output = Answer;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer> {
        self.future.as_mut().poll(cx)
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<B> Service<http::Request<ReplayBody<B>>> for ReqwestService<B>
where
    B: Body + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<::reqwest::Response>;
    type Error = Recognized;
    type Future = ResponseFuture;

    /// Always ready: `fetch` has no pool to wait for.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<ReplayBody<B>>) -> Self::Future {
        let client = self.client.clone();
        let origins = std::sync::Arc::clone(&self.origins);
        ResponseFuture {
            future: Box::pin(send(client, origins, request)),
        }
    }
}

async fn send<B>(
    client: ::reqwest::Client,
    origins: std::sync::Arc<Origins>,
    request: http::Request<ReplayBody<B>>,
) -> Answer
where
    B: Body + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let (parts, body) = request.into_parts();
    let timeout = parts.extensions.get::<AttemptTimeout>().copied();
    // `fetch` takes the body whole. A body the layer can replay comes from its buffer; one
    // it could not keep is read once, and its request sent once.
    let body = body
        .collect()
        .await
        .map_err(|error| Recognized::new(error, None))?
        .to_bytes();
    let request = http::Request::from_parts(parts, ::reqwest::Body::from(body));
    let mut request = to_reqwest(&origins, request).map_err(recognized)?;
    if let Some(AttemptTimeout(timeout)) = timeout {
        *request.timeout_mut() = Some(timeout);
    }
    let response = client.execute(request).await.map_err(recognized)?;
    Ok(into_http(response))
}

/// reqwest's response under an `http::Response` whose head is a copy of its own, for the
/// layer to read and to put its record in.
pub(crate) fn into_http(response: ::reqwest::Response) -> http::Response<::reqwest::Response> {
    let mut head = http::Response::new(());
    *head.status_mut() = response.status();
    *head.headers_mut() = response.headers().clone();
    head.map(|()| response)
}

impl RequestBuilderExt for ::reqwest::RequestBuilder {
    fn send_with<S, RB>(
        self,
        service: &S,
    ) -> impl Future<Output = Result<http::Response<RB>, Error>> + 'static
    where
        S: Service<http::Request<RequestBody>, Response = http::Response<RB>> + Clone + 'static,
        S::Error: Into<BoxError>,
    {
        let request = self.build().map_err(Error::from).and_then(wasm_request);
        let service = service.clone();
        async move { ready_call(service, request?).await }
    }
}

/// reqwest's wasm request as an `http::Request` with its body in one buffer, and its
/// timeout, which reqwest's own conversion drops, in the extensions.
fn wasm_request(request: ::reqwest::Request) -> Result<http::Request<RequestBody>, Error> {
    let timeout = request.timeout().copied();
    let request = http::Request::try_from(request)?;
    let (mut parts, body) = request.into_parts();
    let Some(bytes) = body.as_bytes() else {
        return Err(Error::from(BoxError::from(
            "a multipart body cannot be sent again on wasm32",
        )));
    };
    let body = RequestBody::new(Bytes::copy_from_slice(bytes));
    if let Some(timeout) = timeout {
        parts.extensions.insert(AttemptTimeout(timeout));
    }
    Ok(http::Request::from_parts(parts, body))
}
