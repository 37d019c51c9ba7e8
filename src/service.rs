// `Retry`: readiness, policy choice, the idempotency key, the first attempt's hooks, body
// wrapping, and telling the gates of the request.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::header::Entry;
use http::{HeaderName, HeaderValue, Method, Request, Response};
use http_body::Body;
use tower::BoxError;
use tower_service::Service;

use crate::config::{Plan, Plans};
use crate::decision::{self, Limits, Repeat};
use crate::future::{Held, Prototype, Report, ResponseFuture, Retrying, Then};
use crate::gate::Own;
use crate::head::Head;
use crate::hook::AttemptKind;
use crate::hook::Hooks;
use crate::info::{RetryInfo, StopReason};
use crate::replay::ReplayBody;
use crate::trace::{Slot, Trace};

/// Retries requests to the inner service when it is safe and worth it.
///
/// Made by [`RetryLayer`](crate::RetryLayer). The inner service receives `Request<ReplayBody<B>>`.
///
/// # Errors
///
/// A response, retryable or not, is returned as `Ok` (a last 503 included), with a
/// [`RetryInfo`](crate::RetryInfo) in its extensions. An error is a [`tower::BoxError`]
/// holding a [`RetryError`](crate::RetryError): the same record, and the last attempt's
/// error as its source, from the inner service unchanged, or the layer's own
/// [`DeadlineExceeded`](crate::DeadlineExceeded),
/// [`AttemptTimedOut`](crate::AttemptTimedOut) or
/// [`ServiceNotReady`](crate::ServiceNotReady). The one exception is `poll_ready`: before
/// any request exists, it returns the inner service's readiness error as it is (a
/// [`Recognized`](crate::classify::Recognized) unwrapped), with no record.
///
/// Downcast the source to tell them apart:
///
/// ```
/// use std::io;
/// use bytes::Bytes;
/// use http::{Request, Response};
/// use http_body_util::Full;
/// use tower::ServiceExt;
/// use tower_http_retry::{DeadlineExceeded, Retry, RetryError};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let inner = tower::service_fn(|_: Request<tower_http_retry::ReplayBody<Full<Bytes>>>| async {
///     Err::<Response<()>, _>(io::Error::from(io::ErrorKind::PermissionDenied))
/// });
/// let request = Request::get("http://127.0.0.1:3000/").body(Full::new(Bytes::new())).unwrap();
/// let error = Retry::new(inner).oneshot(request).await.unwrap_err();
/// let error = error.downcast::<RetryError>().expect("every error carries the record");
/// assert_eq!(error.info().attempts(), 1);
/// let error = error.into_source();
/// if let Some(io) = error.downcast_ref::<io::Error>() {
///     // The inner service's error, passed through (not retried: not a connection failure).
///     assert_eq!(io.kind(), io::ErrorKind::PermissionDenied);
/// } else if error.is::<DeadlineExceeded>() {
///     unreachable!("no deadline was set");
/// }
/// # assert!(error.is::<io::Error>());
/// # }
/// ```
///
/// # Clone
///
/// Clones share the configuration and the retry budget (an `Arc` each): a budget spent
/// by one clone is spent for all of them, which is what stops a fleet of tasks, each with
/// its own clone, from turning an outage into a retry storm.
///
/// The first attempt goes to the inner service that `poll_ready` readied. A retry goes to
/// a clone of the inner service, taken when the first retry is decided (from a copy kept
/// when the layer wrapped the service, so changes made through [`Retry::get_mut`] later
/// do not reach retries) and driven to readiness before every retry. A request that
/// succeeds at once clones nothing.
///
/// # Modes
///
/// `M` is the mode of the layer that made it: `()` answers with the inner service's
/// response; [`Resume`](crate::Resume) (from [`RetryLayer::resume`](crate::RetryLayer::resume))
/// with a [`ResumeBody`](crate::ResumeBody) that continues a GET's body when it breaks.
pub struct Retry<S, M = ()> {
    inner: S,
    prototype: Prototype<S>,
    plans: Arc<Plans>,
    mode: PhantomData<fn() -> M>,
}

impl<S: Clone, M> Clone for Retry<S, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            prototype: self.prototype.clone(),
            plans: Arc::clone(&self.plans),
            mode: PhantomData,
        }
    }
}

impl<S: Clone, M> Retry<S, M> {
    pub(crate) fn from_plans(inner: S, plans: Arc<Plans>) -> Self {
        let prototype = Prototype::new(&inner);
        Self {
            inner,
            prototype,
            plans,
            mode: PhantomData,
        }
    }
}

impl<S, M> Retry<S, M> {
    /// Every plan of the layer that made this service.
    pub(crate) fn plans(&self) -> &Arc<Plans> {
        &self.plans
    }

    /// The copy of the inner service that retries clone.
    pub(crate) fn prototype(&self) -> &Prototype<S> {
        &self.prototype
    }

    /// A reference to the inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A mutable reference to the inner service.
    ///
    /// Changes made through it reach the first attempt of later requests; retries clone
    /// the copy kept when the layer wrapped the service.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

mod sealed {
    pub trait Sealed<B> {}
}

impl<S, B> sealed::Sealed<B> for S where S: Service<Request<ReplayBody<B>>> {}

/// The services [`Retry`] can wrap: every `tower::Service` that takes
/// `http::Request<ReplayBody<B>>`, answers with an `http::Response` and fails with an error
/// that converts into [`tower::BoxError`], where `B` is the body of the requests the caller
/// sends through the layer.
///
/// Implemented for every such service, and for nothing else (it cannot be implemented
/// outside this crate). It exists so that a service taking the caller's body type itself
/// (a hyper-util client built with `build_http::<Full<Bytes>>()` where
/// `build_http::<ReplayBody<Full<Bytes>>>()` was needed) is reported as such, where the
/// compiler checks the bound, instead of as a `Service` bound deep in the layer:
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::Full;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use tower_http_retry::{InnerService, ReplayBody};
///
/// fn wrappable<S: InnerService<Full<Bytes>>>(_: &S) {}
///
/// // The client sends what the layer gives it: the caller's body, wrapped for replays.
/// let client = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Full<Bytes>>>();
/// wrappable(&client);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the inner service of `tower_http_retry::Retry`: it must be a `Service<http::Request<ReplayBody<{B}>>>` answering with an `http::Response`, with an error that converts into `BoxError`",
    label = "the layer sends this service `http::Request<ReplayBody<{B}>>`",
    note = "`Retry` wraps the request body in `tower_http_retry::ReplayBody` so that it can be sent again: the inner service receives `http::Request<ReplayBody<B>>`, where `B` is the body the caller sends",
    note = "for a hyper-util client, name that body when building it: `Client::builder(TokioExecutor::new()).build_http::<ReplayBody<B>>()` (with `B = BoxBody<Bytes, BoxError>`, build requests with `Full::new(bytes).map_err(|e| match e {{}}).boxed()`)"
)]
pub trait InnerService<B>:
    Service<
        Request<ReplayBody<B>>,
        Response = Response<Self::ResponseBody>,
        Error = Self::InnerError,
    > + sealed::Sealed<B>
{
    /// The body of the inner service's responses.
    type ResponseBody;
    /// The inner service's error.
    type InnerError: Into<BoxError>;
}

// Not recommended, so that a service that does not fit is reported as not being an
// `InnerService` (with the message above), not as missing one of this impl's bounds.
#[diagnostic::do_not_recommend]
impl<S, B, RB> InnerService<B> for S
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
{
    type ResponseBody = RB;
    type InnerError = S::Error;
}

// Every bound on the inner service is in `InnerService` (a bound on one of its associated
// types here would be reported, for a service that does not fit, instead of the
// `InnerService` message).
impl<S, B, RB> Service<Request<B>> for Retry<S>
where
    S: InnerService<B, ResponseBody = RB> + Clone,
    B: Body + Unpin,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, S, B, Response<RB>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|error| crate::classify::unwrap_recognized(error.into()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.send(request)
    }
}

/// What every logical request starts with, whatever its repeatability: its limits, its
/// trace, its gates told of it, its idempotency key.
struct Start {
    limits: Limits,
    trace: Trace,
    /// The request's own gates, when it needs any.
    own: Option<Box<Own>>,
    /// The key the request carries: stamped here, or the caller's own.
    key: Option<HeaderValue>,
}

impl Start {
    #[inline]
    fn new<B>(plan: &Plan, request: &mut Request<B>) -> Start {
        // A time limit the caller's request sets itself (gRPC's `grpc-timeout`, a handler's
        // `RequestDeadline`) bounds the deadline too, across all attempts; the shorter
        // applies.
        let limits = Limits::start(&plan.policy, plan.time_limit(request), &plan.clock);
        let trace = Trace::new(request, &plan.log);
        // Every logical request is the client's traffic, retried or not; a gate kept per
        // authority is found for this request's once.
        let own = match plan.own_gates {
            true => Some(Own::start(&plan.gates, request.uri(), request.headers())),
            false => {
                plan.gates.on_request();
                None
            }
        };
        Start {
            limits,
            trace,
            own,
            key: key(plan, request),
        }
    }
}

impl<S: Clone, M> Retry<S, M> {
    /// A logical request: sent once, or under the retry machinery.
    #[inline]
    pub(crate) fn send<B, RB>(
        &mut self,
        mut request: Request<B>,
    ) -> ResponseFuture<S::Future, S, B, Response<RB>>
    where
        S: InnerService<B, ResponseBody = RB>,
        B: Body + Unpin,
    {
        let plan = self.plans.select(&request);
        let start = Start::new(&plan, &mut request);
        if start.limits.no_time_at_start() {
            return Self::no_time(start);
        }
        match decision::repeat(&plan, request.method(), start.key.is_some()) {
            Repeat::Once => self.call_once(request, plan, start),
            repeat => self.call_retrying(request, plan, start, repeat),
        }
    }

    /// A request whose deadline leaves less than the floor for its first attempt: nothing
    /// is sent ([`RetryPolicy::min_time_left`](crate::RetryPolicy::min_time_left)).
    #[cold]
    #[inline(never)]
    fn no_time<B, RB>(start: Start) -> ResponseFuture<S::Future, S, B, Response<RB>>
    where
        S: InnerService<B, ResponseBody = RB>,
        B: Body + Unpin,
    {
        let Start {
            limits,
            trace,
            own,
            key,
        } = start;
        if let Some(own) = own {
            Own::end(own);
        }
        let mut info = RetryInfo::default();
        info.set_idempotency_key(key);
        ResponseFuture::refused(StopReason::Deadline, limits, info, trace)
    }

    /// A request sent once: as it is, its body passed through. Under a gate that hears
    /// outcomes (a throttle, a quota) its outcome is still reported, unless it is `never()`
    /// or a `CONNECT`; under one that paces first attempts, it is asked first; under one
    /// that counts what is in flight, it is counted.
    #[inline]
    fn call_once<B, RB>(
        &mut self,
        mut request: Request<B>,
        plan: Arc<Plan>,
        start: Start,
    ) -> ResponseFuture<S::Future, S, B, Response<RB>>
    where
        S: InnerService<B, ResponseBody = RB>,
        B: Body + Unpin,
    {
        let Start {
            limits,
            trace,
            own,
            key,
        } = start;
        let mut info = RetryInfo::default();
        info.set_stop(StopReason::Disabled);
        info.set_idempotency_key(key);
        if plan.reports_once && (request.method() != Method::CONNECT || Own::counted(&own)) {
            return self.call_reported(request, plan, limits, trace, own, info);
        }
        if let Some(own) = own {
            Own::end(own);
        }
        first_attempt(&plan.hooks, &limits, request.headers_mut());
        let span = Slot::start(&trace, &plan.log, 1, AttemptKind::First, &mut request);
        let future = self.inner.call(request.map(ReplayBody::passthrough));
        ResponseFuture::once(future, span, limits, info, trace, &plan.clock)
    }

    /// A request that may be sent again: its head copied, its body wrapped for replays,
    /// the first attempt sent to the service `poll_ready` readied.
    #[inline]
    fn call_retrying<B, RB>(
        &mut self,
        request: Request<B>,
        plan: Arc<Plan>,
        start: Start,
        repeat: Repeat,
    ) -> ResponseFuture<S::Future, S, B, Response<RB>>
    where
        S: InnerService<B, ResponseBody = RB>,
        B: Body + Unpin,
    {
        let (mut parts, body) = request.into_parts();
        // A hedged request's attempts share the caller's body: a hedge need not wait for a
        // first attempt that has not started sending.
        let hedged = repeat == Repeat::Hedge;
        let (body, replay) = ReplayBody::with_handle(body, self.plans.max_replay_bytes(), hedged);
        // Retries start from the caller's head (with its key): the hooks write on each
        // attempt's own copy.
        let head = Head::copy(&parts, plan.policy.classifier_needs_request());
        let mut info = RetryInfo::default();
        info.set_idempotency_key(start.key);
        // Under a gate that paces first attempts or counts what is in flight, the first
        // attempt goes out of line (its hooks then run when it is sent).
        if plan.watched {
            let retry = Retrying {
                prototype: self.prototype.clone(),
                head,
                replay,
                plan,
                own: start.own,
                any_outcome: repeat.any_outcome(),
            };
            let request = Request::from_parts(parts, body);
            return self.call_retrying_watched(
                request,
                retry,
                hedged,
                start.limits,
                info,
                start.trace,
            );
        }
        first_attempt(&plan.hooks, &start.limits, &mut parts.headers);
        // The service that `poll_ready` readied takes the first attempt; retries clone
        // from the prototype, and only if they happen.
        let span = Slot::start_parts(&start.trace, &plan.log, 1, AttemptKind::First, &mut parts);
        let future = self.inner.call(Request::from_parts(parts, body));
        let retry = Retrying {
            prototype: self.prototype.clone(),
            head,
            replay,
            plan,
            own: start.own,
            any_outcome: repeat.any_outcome(),
        };
        // A body that can never be kept (over the cap by its size) is not hedged.
        if hedged && !retry.replay.is_never() {
            return ResponseFuture::hedged(future, span, retry, start.limits, info, start.trace);
        }
        ResponseFuture::first(future, span, retry, start.limits, info, start.trace)
    }

    /// [`Self::call_retrying`] under a gate that paces first attempts or counts what is in
    /// flight.
    #[cold]
    #[inline(never)]
    fn call_retrying_watched<B, RB>(
        &mut self,
        request: Request<ReplayBody<B>>,
        retry: Retrying<S, B>,
        hedged: bool,
        limits: Limits,
        info: RetryInfo,
        trace: Trace,
    ) -> ResponseFuture<S::Future, S, B, Response<RB>>
    where
        S: InnerService<B, ResponseBody = RB>,
        B: Body + Unpin,
    {
        let hedged = hedged && !retry.replay.is_never();
        let asks = retry.plan.asks_first;
        self.call_watched(
            request,
            Then::Retrying(retry, hedged),
            asks,
            limits,
            info,
            trace,
        )
    }

    /// A request sent once whose gates hear outcomes, pace first attempts or count what
    /// is in flight: its body watched (a failure of the caller's own body is the caller's,
    /// unheard), its head copied only for a classifier that reads it, and its outcome
    /// reported (not under `never()`, nor for a `CONNECT`, which are not asked first
    /// either).
    #[cold]
    #[inline(never)]
    fn call_reported<B, RB>(
        &mut self,
        request: Request<B>,
        plan: Arc<Plan>,
        limits: Limits,
        trace: Trace,
        own: Option<Box<Own>>,
        info: RetryInfo,
    ) -> ResponseFuture<S::Future, S, B, Response<RB>>
    where
        S: InnerService<B, ResponseBody = RB>,
        B: Body + Unpin,
    {
        let head = Report::head(&plan, &request);
        let told = !plan.policy.never && request.method() != Method::CONNECT;
        let asks = told && plan.asks_first;
        let watched = asks || Own::counted(&own);
        let (mut parts, body) = request.into_parts();
        let (body, watch) = ReplayBody::watched(body);
        let mut span = Slot::none();
        if !watched {
            first_attempt(&plan.hooks, &limits, &mut parts.headers);
            span = Slot::start_parts(&trace, &plan.log, 1, AttemptKind::First, &mut parts);
        }
        let report = Report::new(plan, own, head, watch, told);
        let request = Request::from_parts(parts, body);
        if watched {
            return self.call_watched(request, Then::Once(report), asks, limits, info, trace);
        }
        let future = self.inner.call(request);
        ResponseFuture::reported(future, span, limits, info, trace, report)
    }

    /// A first attempt under a gate that paces first attempts (`asks`) or counts what is
    /// in flight: asked of the gates before it is sent, then sent at once, or held for the
    /// wait they asked for (with the service `poll_ready` readied, a clone taking its place
    /// here), or not sent at all.
    #[cold]
    #[inline(never)]
    fn call_watched<B, RB>(
        &mut self,
        request: Request<ReplayBody<B>>,
        then: Then<S, B>,
        asks: bool,
        limits: Limits,
        info: RetryInfo,
        trace: Trace,
    ) -> ResponseFuture<S::Future, S, B, Response<RB>>
    where
        S: InnerService<B, ResponseBody = RB>,
        B: Body + Unpin,
    {
        let now = then.plan().clock.now();
        let admitted = match asks {
            true => decision::admit_first(then.gates(), &limits, now),
            false => Ok(None),
        };
        match admitted {
            // The request ends here: its presence in the gates with it.
            Err(stop) => ResponseFuture::refused(stop, limits, info, trace),
            Ok(None) => {
                let mut future = ResponseFuture::starting(limits, info, trace);
                future.launch(&mut self.inner, request, then, now);
                future
            }
            Ok(Some(admitted)) => {
                let ready = self.inner.clone();
                let service = std::mem::replace(&mut self.inner, ready);
                let held = Held::new(service, request, then, admitted);
                ResponseFuture::admitting(held, now, limits, info, trace)
            }
        }
    }
}

/// Runs the hooks on the first attempt's headers.
#[inline]
fn first_attempt(hooks: &Hooks, limits: &Limits, headers: &mut http::HeaderMap) {
    if !hooks.is_empty() {
        hooks.before_attempt(&decision::first_attempt(limits), headers);
    }
}

/// The request's idempotency key: where the plan stamps keys on its method, the caller's
/// own or a new one (the one lookup that finds or inserts it); elsewhere, the caller's.
#[inline]
// Without `tracing`, the failure's arm only returns `None`.
#[cfg_attr(not(feature = "tracing"), allow(clippy::manual_map))]
fn key<B>(plan: &Plan, request: &mut Request<B>) -> Option<HeaderValue> {
    // Whether a key is stamped depends on the key configuration alone, never on whether
    // retries are on.
    match &plan.key {
        Some(key) if key.applies_to(request.method()) => {
            match request.headers_mut().entry(key.get_header_name()) {
                Entry::Occupied(caller) => Some(caller.get().clone()),
                Entry::Vacant(slot) => match key.make_value() {
                    Some(value) => Some(slot.insert(value).clone()),
                    None => {
                        #[cfg(feature = "tracing")]
                        tracing::warn!(
                            target: "tower_http_retry",
                            "idempotency key generator made an invalid header value; sending without a key"
                        );
                        None
                    }
                },
            }
        }
        _ => field(request.headers(), &plan.key_header).cloned(),
    }
}

/// The first value of the field `name`, as `HeaderMap::get` finds it. The names of a short
/// map are scanned first: comparing a few names costs less than hashing one (the layer
/// looks up its key header on every request, and most requests carry a handful of fields,
/// seldom the key), and the names alone are cheaper to walk than the fields.
fn field<'a>(headers: &'a http::HeaderMap, name: &HeaderName) -> Option<&'a http::HeaderValue> {
    if headers.keys_len() <= 8 && !headers.keys().any(|field| field == name) {
        return None;
    }
    headers.get(name)
}

impl<S: fmt::Debug, M> fmt::Debug for Retry<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .field("plans", &self.plans)
            .finish()
    }
}
