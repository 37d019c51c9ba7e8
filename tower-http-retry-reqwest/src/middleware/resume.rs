// The resumable mode, `RetryMiddleware<Resume>` (native only: its continuations are `Send`
// tasks of the layer, reading `http_body` bodies).
//
// It cannot hand the layer the `Chain` service: `Next` borrows reqwest-middleware's chain
// for the length of `handle`, while a body's continuations are sent after `handle`
// returned, from clones of the service the layer wraps, which must be `'static`. So the
// layer wraps `Bottom`: a head attempt is a job sent over a channel to `serve`, polled
// beside the layer's future inside `handle`, which runs it down the chain (`Chain`); a
// continuation goes to the client the middleware was given (through `ReqwestService`).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};

use futures_channel::{mpsc, oneshot};
use futures_core::Stream;
use http::Extensions;
use reqwest_middleware::Next;
use tower::{BoxError, Layer};
use tower_http_retry::{ReplayBody, Resume, Retry, RetryPolicy};
use tower_service::Service;

use super::{Carried, Chain, RetryMiddleware, from_box, uncarry};
use crate::ReqwestService;

impl RetryMiddleware<Resume> {
    pub(super) async fn run<'a>(
        &'a self,
        request: ::reqwest::Request,
        extensions: &'a mut Extensions,
        next: Next<'a>,
    ) -> reqwest_middleware::Result<::reqwest::Response> {
        let url = request.url().clone();
        let timeout = request.timeout().copied();
        // reqwest's own conversion, which keeps the request's timeout in its extensions:
        // a continuation's head is a copy of this request's, sent by the client.
        let mut request = http::Request::try_from(request)?;
        if let Some(policy) = extensions.get::<RetryPolicy>() {
            request.extensions_mut().insert(policy.clone());
        }
        let client = self
            .client
            .clone()
            .expect("a resumable RetryMiddleware has its client");
        let (jobs, queue) = mpsc::unbounded();
        let last = Mutex::new(None);
        let chain = Chain {
            next,
            extensions: extensions.clone(),
            last: &last,
            url: &url,
            timeout,
        };
        let mut service: Retry<Bottom, Resume> = Layer::layer(&self.layer, Bottom { jobs, client });
        let retry = async {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
            service.call(request).await
        };
        let result = beside(retry, serve(queue, chain)).await;
        if let Some(last) = last.into_inner().unwrap_or_else(PoisonError::into_inner) {
            *extensions = last;
        }
        match result {
            Ok(response) => Ok(::reqwest::Response::from(
                response.map(crate::native::into_reqwest),
            )),
            Err(error) => Err(from_box(error)),
        }
    }
}

/// Polls `main` to its end, and `side` beside it while it runs.
async fn beside<F: Future, G: Future<Output = ()>>(main: F, side: G) -> F::Output {
    let (mut main, mut side) = (std::pin::pin!(main), std::pin::pin!(side));
    let mut side_done = false;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = main.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        if !side_done && side.as_mut().poll(cx).is_ready() {
            side_done = true;
            // What the side did may have readied the main future.
            if let Poll::Ready(output) = main.as_mut().poll(cx) {
                return Poll::Ready(output);
            }
        }
        Poll::Pending
    })
    .await
}

/// An attempt handed to the middleware chain, and where its answer goes.
type Job = (
    http::Request<ReplayBody<::reqwest::Body>>,
    oneshot::Sender<Result<http::Response<::reqwest::Body>, BoxError>>,
);

/// Runs every attempt handed over down the chain, each as it comes (a hedge runs beside the
/// attempt before it), until the queue closes.
async fn serve(mut queue: mpsc::UnboundedReceiver<Job>, chain: Chain<'_>) {
    let mut running: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = Vec::new();
    let mut open = true;
    std::future::poll_fn(|cx| {
        while open {
            match Pin::new(&mut queue).poll_next(cx) {
                Poll::Ready(Some((request, answer))) => {
                    let attempt = chain.clone().call(request);
                    running.push(Box::pin(async move {
                        let result = attempt.await.map(into_plain);
                        let _ = answer.send(result);
                    }));
                }
                Poll::Ready(None) => open = false,
                Poll::Pending => break,
            }
        }
        running.retain_mut(|attempt| attempt.as_mut().poll(cx).is_pending());
        match open || !running.is_empty() {
            true => Poll::Pending,
            false => Poll::Ready(()),
        }
    })
    .await
}

/// The answer of the chain with reqwest's response turned into an `http::Response` (its
/// final URL kept), for the resumable layer, which reads the body.
fn into_plain(response: http::Response<Carried>) -> http::Response<::reqwest::Body> {
    let response = uncarry(response);
    crate::native::into_http(response)
}

/// The service under a resumable middleware's layer: an attempt of the head goes down the
/// middleware chain (the `serve` beside the layer's future runs it), a continuation of a
/// body, sent after the middleware returned, to the client.
#[derive(Clone)]
struct Bottom {
    jobs: mpsc::UnboundedSender<Job>,
    client: ReqwestService,
}

type Pending =
    Pin<Box<dyn Future<Output = Result<http::Response<::reqwest::Body>, BoxError>> + Send>>;

impl Service<http::Request<ReplayBody<::reqwest::Body>>> for Bottom {
    type Response = http::Response<::reqwest::Body>;
    type Error = BoxError;
    type Future = Pending;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.client.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, mut request: http::Request<ReplayBody<::reqwest::Body>>) -> Pending {
        if !crate::native::is_continuation(&request) {
            let (answer, answered) = oneshot::channel();
            match self.jobs.unbounded_send((request, answer)) {
                Ok(()) => {
                    return Box::pin(async move {
                        answered.await.unwrap_or_else(|_| Err(ChainGone.into()))
                    });
                }
                // The middleware returned: nothing runs the chain any more.
                Err(error) => request = error.into_inner().0,
            }
        }
        let answer = self.client.call(request);
        Box::pin(async move { answer.await.map_err(Into::into) })
    }
}

/// The middleware chain was gone before it answered an attempt (the middleware's call was
/// dropped).
#[derive(Debug)]
struct ChainGone;

impl fmt::Display for ChainGone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the middleware chain ended before the attempt was answered")
    }
}

impl StdError for ChainGone {}
