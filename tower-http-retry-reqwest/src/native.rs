// `ReqwestService` and `RequestBuilderExt::send_with` over reqwest's native client (hyper's
// transport): the request body wrapped as reqwest's (a stream, made `Sync`), the response
// turned into an `http::Response<reqwest::Body>` and back, and a continuation's unproven
// 206 withheld from a resumable layer. The wasm32 counterpart is wasm.rs.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, ready};

use ::reqwest::{Client, ResponseBuilderExt};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower::BoxError;
use tower_http_retry::classify::Recognized;
use tower_http_retry::{Attempt, AttemptKind, ReplayBody};
use tower_service::Service;

use crate::bridge::{Error, ready_call};
use crate::{RequestBuilderExt, ReqwestService, recognized, to_reqwest};

// Its docs say "native only" (a wasm32 impl with other bounds is in wasm.rs): rustdoc
// gives an impl the `cfg` of its own attributes, not of its module.
#[cfg_attr(
    docsrs,
    doc(cfg(not(all(target_arch = "wasm32", target_os = "unknown"))))
)]
impl<B> Service<http::Request<ReplayBody<B>>> for ReqwestService<B>
where
    B: Body + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = http::Response<::reqwest::Body>;
    type Error = Recognized;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Service::<::reqwest::Request>::poll_ready(&mut self.client, cx).map_err(recognized)
    }

    fn call(&mut self, request: http::Request<ReplayBody<B>>) -> Self::Future {
        let continuation = is_continuation(&request);
        let request = request.map(|body| ::reqwest::Body::wrap(SyncBody::new(body)));
        let state = match to_reqwest(&self.origins, request) {
            Ok(request) => State::Sending {
                future: self.client.call(request),
            },
            Err(error) => State::Failed { error: Some(error) },
        };
        ResponseFuture {
            state,
            continuation,
        }
    }
}

type Pending = <Client as Service<::reqwest::Request>>::Future;

pin_project! {
    /// The response future of [`ReqwestService`].
    pub struct ResponseFuture {
        #[pin]
        state: State,
        // The layer's continuation of a response body (`RetryLayer::resume`).
        continuation: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State {
        Sending { #[pin] future: Pending },
        Failed { error: Option<::reqwest::Error> },
    }
}

impl Future for ResponseFuture {
    type Output = Result<http::Response<::reqwest::Body>, Recognized>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Sending { future } => {
                let response = ready!(future.poll(cx)).map_err(recognized)?;
                let mut response = into_http(response);
                if *this.continuation {
                    withhold_unproven_range(&mut response);
                }
                Poll::Ready(Ok(response))
            }
            StateProj::Failed { error } => Poll::Ready(Err(recognized(
                error
                    .take()
                    .expect("ResponseFuture polled after completion"),
            ))),
        }
    }
}

impl fmt::Debug for ResponseFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Sending { .. } => "sending",
            State::Failed { .. } => "failed",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

/// Whether `request` is the layer's continuation of a response body that broke.
pub(crate) fn is_continuation<B>(request: &http::Request<B>) -> bool {
    request
        .extensions()
        .get::<Attempt>()
        .is_some_and(|attempt| attempt.kind == AttemptKind::Continuation)
}

/// A continuation's 206 whose bytes cannot be shown to be the range asked for loses its
/// `Content-Range`, so that the layer does not use it (the body ends with a `RetryError`,
/// `StopReason::RangeMismatch`).
///
/// A reqwest built with `gzip`, `brotli`, `zstd` or `deflate` decompresses a response
/// whose `Content-Encoding` it knows, whoever asked for the encoding, and removes
/// `Content-Encoding` and `Content-Length` from its head: the layer then counts decoded
/// bytes, which a range (counted in the bytes as sent) does not continue, and a 206 it
/// decoded is a stream cut in the middle, decoded from there. Such a 206 has neither field
/// left; one that reqwest did not decode has its `Content-Encoding`, or `Content-Length`
/// (which a server knows for a range of a stored file: nginx sends it). A 206 with neither
/// is refused, whichever it was: a continuation is accepted only where it provably
/// continues the bytes handed over.
fn withhold_unproven_range<B>(response: &mut http::Response<B>) {
    let headers = response.headers();
    if response.status() == http::StatusCode::PARTIAL_CONTENT
        && !headers.contains_key(http::header::CONTENT_LENGTH)
        && !headers.contains_key(http::header::CONTENT_ENCODING)
    {
        response.headers_mut().remove(http::header::CONTENT_RANGE);
    }
}

/// `http::Response::from` drops the response's final URL; it is put back where
/// `reqwest::Response::from` looks for it, so a round trip keeps it.
pub(crate) fn into_http(response: ::reqwest::Response) -> http::Response<::reqwest::Body> {
    let url = response.url().clone();
    let mut response = http::Response::from(response);
    if let Ok(marker) = http::Response::builder().url(url).body(()) {
        response
            .extensions_mut()
            .extend(marker.into_parts().0.extensions);
    }
    response
}

/// `reqwest::Body::wrap` takes only `Sync` bodies, and many tower bodies are only `Send`.
/// reqwest polls the body through `&mut`, so a `Mutex` that is never locked
/// (`Mutex::get_mut`) makes any `Send` body `Sync`; `size_hint` and `is_end_stream`, which
/// take `&self`, answer from copies taken after every poll (nothing else changes them).
pub(crate) struct SyncBody<B> {
    body: Mutex<ReplayBody<B>>,
    hint: SizeHint,
    end: bool,
}

impl<B> SyncBody<B>
where
    B: Body + Unpin,
{
    pub(crate) fn new(body: ReplayBody<B>) -> Self {
        Self {
            hint: body.size_hint(),
            end: body.is_end_stream(),
            body: Mutex::new(body),
        }
    }
}

impl<B> Body for SyncBody<B>
where
    B: Body + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.get_mut();
        let body = this.body.get_mut().unwrap_or_else(PoisonError::into_inner);
        let frame = ready!(Pin::new(&mut *body).poll_frame(cx));
        this.hint = body.size_hint();
        this.end = body.is_end_stream();
        Poll::Ready(frame)
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }

    fn is_end_stream(&self) -> bool {
        self.end
    }
}

impl RequestBuilderExt for ::reqwest::RequestBuilder {
    fn send_with<S, RB>(
        self,
        service: &S,
    ) -> impl Future<Output = Result<::reqwest::Response, Error>> + Send + 'static
    where
        S: Service<http::Request<::reqwest::Body>, Response = http::Response<RB>>
            + Clone
            + Send
            + 'static,
        S::Error: Into<BoxError>,
        S::Future: Send,
        RB: Body + Send + Sync + 'static,
        RB::Data: Into<Bytes>,
        RB::Error: Into<BoxError>,
    {
        // Built now, so that the future holds no builder (and its client).
        let request = self.build().and_then(http::Request::try_from);
        let service = service.clone();
        async move {
            let response = ready_call(service, request?).await?;
            Ok(::reqwest::Response::from(response.map(into_reqwest)))
        }
    }
}

/// A response body as reqwest's: a `reqwest::Body` (what `ReqwestService` answers with) as
/// it is, any other (a resumable layer's `ResumeBody`) wrapped.
pub(crate) fn into_reqwest<B>(body: B) -> ::reqwest::Body
where
    B: Body + Send + Sync + 'static,
    B::Data: Into<Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = Some(body);
    if let Some(body) = (&mut body as &mut dyn Any).downcast_mut::<Option<::reqwest::Body>>() {
        if let Some(body) = body.take() {
            return body;
        }
    }
    match body {
        Some(body) => ::reqwest::Body::wrap(body),
        None => ::reqwest::Body::from(Bytes::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, combinators::UnsyncBoxBody};

    fn sync<T: Sync>(_: &T) {}

    #[tokio::test]
    async fn a_send_only_body_is_made_sync_and_keeps_its_hint_and_end() {
        let body = UnsyncBoxBody::new(Full::new(Bytes::from_static(b"hello")));
        let mut body = SyncBody::new(ReplayBody::new(body, 1024));
        sync(&body);
        assert_eq!(body.size_hint().exact(), Some(5));
        assert!(!body.is_end_stream());
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"hello"));
        assert_eq!(body.size_hint().exact(), Some(0));
        assert!(body.is_end_stream());
    }
}
