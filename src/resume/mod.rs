// Resumable response bodies: `RetryLayer::resume` turns the layer to the `Resume` mode,
// whose `Retry<S, Resume>` answers with `ResumeBody`. The retry machinery is the same (the
// head of a response is retried as before); a resumable GET's body is then continued when
// it breaks, each continuation an attempt of the same logical request (its gates, its
// backoff, its deadline, the record).
//
// Why a mode (a type parameter) and not a setting: resumption changes the response body's
// type, and a layer without it must keep `S::Response`, with nothing added to `Retry::call`
// and its future. The resuming service does its work around them: it chooses the plan (a
// second time: the retry machinery chooses it again), copies the head of a resumable
// request, and wraps the body once the head arrived.

mod body;
mod rules;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::header::Entry;
use http::{HeaderValue, Method, Request, Response, header, request};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::BoxError;
use tower_service::Service;

use self::body::{Answer, Continuer, Sender};
pub use self::body::{ResumeBody, ResumeInfo};
use self::rules::CallerRange;
use crate::config::Plans;
use crate::decision::Limits;
use crate::future::{Prototype, ResponseFuture};
use crate::info::RetryInfo;
#[cfg(doc)]
use crate::layer::RetryLayer;
use crate::replay::ReplayBody;
use crate::service::{InnerService, Retry};

/// The mode of a [`RetryLayer`] and its [`Retry`] services whose GET response bodies are
/// continued when they break: `RetryLayer<Resume>`, made by [`RetryLayer::resume`], and
/// the `Retry<S, Resume>` it wraps services in. A type only: it has no values.
///
/// Requests are retried as any [`Retry`] retries them; a response's body is a
/// [`ResumeBody`], and a resumable one carries a [`ResumeInfo`] in its extensions. Requests
/// are sent with `Accept-Encoding: identity` where the caller set none, and a continuation
/// carries the caller's request head (its extensions too) with `Range` and `If-Range`
/// set. Continuations are sent from the body, so the inner service and its future must be
/// `Send + 'static` (a hyper-util client's are), and the inner body `Unpin` (hyper's
/// `Incoming` is). They go to clones of the inner service, taken from the copy retries
/// clone, each driven to readiness first.
///
/// ```
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use tower_http_retry::{ReplayBody, Resume, ResumeBody, Retry, RetryLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tower::BoxError> {
/// let inner = tower::service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"data"))))
/// });
/// let client: Retry<_, Resume> = RetryLayer::new().resume().layer(inner);
/// let request = Request::get("http://127.0.0.1:3000/file").body(Full::new(Bytes::new()))?;
/// // The inner body, wrapped.
/// let response: Response<ResumeBody<Full<Bytes>>> = client.oneshot(request).await?;
/// # let _ = response;
/// # Ok(())
/// # }
/// ```
///
/// With a hyper-util client, configured before or after `resume()`:
///
/// ```no_run
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Empty};
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_http_retry::{ReplayBody, ResumeInfo, RetryLayer, RetryPolicy};
///
/// # #[tokio::main]
/// # async fn main() -> Result<(), tower::BoxError> {
/// let hyper_client = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Empty<Bytes>>>();
/// let client = ServiceBuilder::new()
///     .layer(
///         RetryLayer::new()
///             .resume()
///             .policy(RetryPolicy::new().max_continuations(10).body_idle_timeout(Duration::from_secs(30))),
///     )
///     .service(hyper_client);
///
/// let request = http::Request::get("http://127.0.0.1:8080/big.iso").body(Empty::new())?;
/// let response = client.oneshot(request).await?;
/// let info = response.extensions().get::<ResumeInfo>().cloned();
/// let bytes = response.into_body().collect().await?.to_bytes();
/// let continuations = info.map_or(0, |info| info.continuations().len());
/// println!("{} bytes, {continuations} continuation(s)", bytes.len());
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub enum Resume {}

impl<S, B, RB> Service<Request<B>> for Retry<S, Resume>
where
    S: InnerService<B, ResponseBody = RB> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body + Unpin + Send + 'static,
    RB: Body + Unpin,
    RB::Error: Into<BoxError>,
{
    type Response = Response<ResumeBody<RB>>;
    type Error = BoxError;
    type Future = ResumeFuture<ResponseFuture<S::Future, S, B, Response<RB>>, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.get_mut()
            .poll_ready(cx)
            .map_err(|error| crate::classify::unwrap_recognized(error.into()))
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let setup = self.setup(&mut request);
        ResumeFuture {
            inner: self.send(request),
            setup,
        }
    }
}

impl<S: Clone> Retry<S, Resume> {
    /// What a resumable request's body needs, if it is one: a GET with no body, whose
    /// policy resumes, without a range of a kind that is not resumed. Its `Accept-Encoding`
    /// is set to `identity` unless the caller chose one: the range counts bytes as sent.
    fn setup<B, RB>(&mut self, request: &mut Request<B>) -> Option<Box<Setup<RB>>>
    where
        S: InnerService<B, ResponseBody = RB> + Send + 'static,
        S::Future: Send + 'static,
        B: Body + Send + 'static,
    {
        if request.method() != Method::GET || !request.body().is_end_stream() {
            return None;
        }
        let plans: &Arc<Plans> = self.plans();
        let plan = plans.select(request);
        if !plan.policy.resume {
            return None;
        }
        let caller = rules::caller_range(request.headers());
        if caller == CallerRange::Unsupported {
            return None;
        }
        // A caller that asked for an encoding gets bytes this layer can count only where the
        // answer names its encoding: one that names none may have been decoded below this
        // layer (reqwest's `gzip`, a decompression layer), which hides `Content-Encoding`.
        let encoded = match request.headers_mut().entry(header::ACCEPT_ENCODING) {
            Entry::Occupied(asked) => !rules::identity_only(asked.get()),
            Entry::Vacant(slot) => {
                slot.insert(HeaderValue::from_static("identity"));
                false
            }
        };
        let head = copy_head(request);
        let limits = Limits::start(&plan.policy, plan.time_limit(request), &plan.clock);
        // What counts requests in flight has no part in continuations: they come after
        // their request ended.
        let gates = match plan.own_gates {
            true => plan.gates.for_request(request.uri(), request.headers()),
            false => plan.gates.clone(),
        }
        .without_flight();
        let sender: Box<dyn Sender<RB>> = Box::new(Continuations::<S, B> {
            prototype: self.prototype().clone(),
            body: std::marker::PhantomData,
        });
        Some(Box::new(Setup {
            caller,
            encoded,
            continuer: Continuer {
                sender,
                head,
                plan,
                limits,
                gates,
            },
        }))
    }
}

/// A copy of `request`'s head, its extensions included.
fn copy_head<B>(request: &Request<B>) -> request::Parts {
    let mut copy = Request::new(());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    *copy.extensions_mut() = request.extensions().clone();
    copy.into_parts().0
}

/// A resumable request's setup, until its head arrives.
struct Setup<RB> {
    caller: CallerRange,
    /// The caller asked for an encoding other than identity.
    encoded: bool,
    continuer: Continuer<RB>,
}

/// Sends continuations through clones of the inner service, each driven to readiness.
struct Continuations<S, B> {
    prototype: Prototype<S>,
    body: std::marker::PhantomData<fn() -> B>,
}

impl<S, B, RB> Sender<RB> for Continuations<S, B>
where
    S: InnerService<B, ResponseBody = RB> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
{
    fn send(&mut self, head: request::Parts) -> Answer<RB> {
        let mut service = self.prototype.make();
        Box::pin(async move {
            std::future::poll_fn(|cx| service.poll_ready(cx))
                .await
                .map_err(Into::into)?;
            let request = Request::from_parts(head, ReplayBody::<B>::empty());
            service.call(request).await.map_err(Into::into)
        })
    }
}

pin_project! {
    /// The future of a `Retry<S, `[`Resume`]`>`: the retrying future's, whose response body
    /// it wraps.
    pub struct ResumeFuture<F, RB> {
        #[pin]
        inner: F,
        setup: Option<Box<Setup<RB>>>,
    }
}

impl<F, RB> fmt::Debug for ResumeFuture<F, RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResumeFuture")
            .field("resumable", &self.setup.is_some())
            .finish_non_exhaustive()
    }
}

impl<F, RB> Future for ResumeFuture<F, RB>
where
    F: Future<Output = Result<Response<RB>, BoxError>>,
{
    type Output = Result<Response<ResumeBody<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx))?;
        let Some(setup) = this.setup.take() else {
            return Poll::Ready(Ok(response.map(ResumeBody::plain)));
        };
        let Setup {
            caller,
            encoded,
            continuer,
        } = *setup;
        if encoded && !response.headers().contains_key(header::CONTENT_ENCODING) {
            // Identity bytes, or bytes decoded below this layer: no range could tell.
            return Poll::Ready(Ok(response.map(ResumeBody::plain)));
        }
        let Some(origin) = rules::origin(caller, response.status(), response.headers()) else {
            return Poll::Ready(Ok(response.map(ResumeBody::plain)));
        };
        let record = response
            .extensions()
            .get::<RetryInfo>()
            .cloned()
            .unwrap_or_default();
        let info = ResumeInfo::default();
        response.extensions_mut().insert(info.clone());
        let response =
            response.map(|body| ResumeBody::resuming(body, origin, continuer, record, info));
        Poll::Ready(Ok(response))
    }
}
