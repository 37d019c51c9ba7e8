// Resumable response bodies: `RetryLayer::resume` makes a `ResumeLayer`, whose service
// (`Resume`) wraps the layer's `Retry` and answers with `ResumeBody`. The retry machinery
// is the same (the head of a response is retried as before); a resumable GET's body is
// then continued when it breaks, each continuation an attempt of the same logical request
// (its gates, its backoff, its deadline, the record).
//
// Why a layer of its own and not a setting of `RetryLayer`: resumption changes the
// response body's type, and a layer without it must keep `S::Response`, with nothing added
// to `Retry::call` and its future. The resumable layer does its work around them: it
// chooses the plan (a second time: `Retry::call` chooses it again), copies the head of a
// resumable request, and wraps the body once the head arrived.

mod body;
mod rules;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{HeaderValue, Method, Request, Response, header, request};
use http_body::Body;
use pin_project_lite::pin_project;
use tower::BoxError;
use tower_layer::Layer;
use tower_service::Service;

use self::body::{Answer, Continuer, Sender};
pub use self::body::{ResumeBody, ResumeError, ResumeInfo};
use self::rules::CallerRange;
use crate::config::Plans;
use crate::decision::Limits;
use crate::info::RetryInfo;
use crate::layer::RetryLayer;
use crate::replay::ReplayBody;
use crate::service::{InnerService, Retry};

/// A [`RetryLayer`] whose GET response bodies are continued when they break: made by
/// [`RetryLayer::resume`]. Its service is [`Resume`], and its responses' body
/// [`ResumeBody`].
///
/// It is a layer of its own type because it changes the response's type: a
/// [`RetryLayer`] without it keeps the inner service's, and code naming
/// `Response<Incoming>` is unchanged. Configure the [`RetryLayer`] first (policies,
/// routes, gates): this layer shares them.
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
///             .policy(RetryPolicy::new().max_continuations(10).body_idle_timeout(Duration::from_secs(30)))
///             .resume(),
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
#[derive(Clone)]
pub struct ResumeLayer {
    retry: RetryLayer,
}

impl ResumeLayer {
    pub(crate) fn new(retry: RetryLayer) -> Self {
        Self { retry }
    }
}

impl fmt::Debug for ResumeLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ResumeLayer").field(&self.retry).finish()
    }
}

impl<S: Clone> Layer<S> for ResumeLayer {
    type Service = Resume<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Resume {
            continuations: inner.clone(),
            retry: Retry::from_plans(inner, self.retry.plans()),
        }
    }
}

/// [`Retry`] whose GET response bodies are continued when they break: the service of a
/// [`ResumeLayer`] ([`RetryLayer::resume`]). Requests are retried as [`Retry`] retries
/// them; a response's body is a [`ResumeBody`], and a resumable one carries a
/// [`ResumeInfo`] in its extensions.
///
/// ```
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tower::{Layer, ServiceExt};
/// use tower_http_retry::{ReplayBody, Resume, ResumeBody, RetryLayer};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tower::BoxError> {
/// let inner = tower::service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
///     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"data"))))
/// });
/// let client: Resume<_> = RetryLayer::new().resume().layer(inner);
/// let request = Request::get("http://127.0.0.1:3000/file").body(Full::new(Bytes::new()))?;
/// // The inner body, wrapped.
/// let response: Response<ResumeBody<Full<Bytes>>> = client.oneshot(request).await?;
/// # let _ = response;
/// # Ok(())
/// # }
/// ```
///
/// Requests are sent with `Accept-Encoding: identity` where the caller set none, and a
/// continuation carries the caller's request head (its extensions too) with `Range` and
/// `If-Range` set. Continuations are sent from the body, so the inner service and its
/// future must be `Send + 'static` (a hyper-util client's are), and the inner body `Unpin`
/// (hyper's `Incoming` is).
///
/// # Clone
///
/// Clones share the configuration and the gates, as [`Retry`]'s do. Continuations go to a
/// clone of the inner service kept when the layer wrapped it, driven to readiness before
/// each.
#[derive(Clone)]
pub struct Resume<S> {
    retry: Retry<S>,
    /// Cloned for each continuation.
    continuations: S,
}

impl<S> Resume<S> {
    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        self.retry.get_ref()
    }

    /// A mutable reference to the inner service. Changes made through it reach the first
    /// attempt of later requests, not retries or continuations.
    pub fn get_mut(&mut self) -> &mut S {
        self.retry.get_mut()
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.retry.into_inner()
    }
}

impl<S: fmt::Debug> fmt::Debug for Resume<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Resume").field(&self.retry).finish()
    }
}

impl<S, B, RB> Service<Request<B>> for Resume<S>
where
    S: InnerService<B, ResponseBody = RB> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body + Unpin + Send + 'static,
    RB: Body + Unpin,
    RB::Error: Into<BoxError>,
{
    type Response = Response<ResumeBody<RB>>;
    type Error = BoxError;
    type Future = ResumeFuture<<Retry<S> as Service<Request<B>>>::Future, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.retry.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let setup = self.setup(&mut request);
        ResumeFuture {
            inner: self.retry.call(request),
            setup,
        }
    }
}

impl<S: Clone> Resume<S> {
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
        let plans: &Arc<Plans> = self.retry.plans();
        let plan = plans.select(request);
        if !plan.policy.resume {
            return None;
        }
        let caller = rules::caller_range(request.headers());
        if caller == CallerRange::Unsupported {
            return None;
        }
        request
            .headers_mut()
            .entry(header::ACCEPT_ENCODING)
            .or_insert(HeaderValue::from_static("identity"));
        let head = copy_head(request);
        let bound = match plan.hooks.is_empty() {
            true => None,
            false => plan.hooks.time_limit(request.headers()),
        };
        let limits = Limits::start(&plan.policy, bound);
        // What counts requests in flight has no part in continuations: they come after
        // their request ended.
        let gates = match plan.own_gates {
            true => plan.gates.for_request(request.uri(), request.headers()),
            false => plan.gates.clone(),
        }
        .without_flight();
        let sender: Box<dyn Sender<RB>> = Box::new(Continuations::<S, B> {
            service: self.continuations.clone(),
            body: std::marker::PhantomData,
        });
        Some(Box::new(Setup {
            caller,
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
    continuer: Continuer<RB>,
}

/// Sends continuations through clones of the inner service, each driven to readiness.
struct Continuations<S, B> {
    service: S,
    body: std::marker::PhantomData<fn() -> B>,
}

impl<S, B, RB> Sender<RB> for Continuations<S, B>
where
    S: InnerService<B, ResponseBody = RB> + Clone + Send + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
{
    fn send(&mut self, head: request::Parts) -> Answer<RB> {
        let mut service = self.service.clone();
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
    /// The future of [`Resume`]: [`Retry`]'s, whose response body it wraps.
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
        let Setup { caller, continuer } = *setup;
        let Some(origin) = rules::origin(caller, response.status(), response.headers()) else {
            return Poll::Ready(Ok(response.map(ResumeBody::plain)));
        };
        let attempts = response
            .extensions()
            .get::<RetryInfo>()
            .map_or(1, RetryInfo::attempts);
        let info = ResumeInfo::default();
        response.extensions_mut().insert(info.clone());
        let response =
            response.map(|body| ResumeBody::resuming(body, origin, continuer, attempts, info));
        Poll::Ready(Ok(response))
    }
}
