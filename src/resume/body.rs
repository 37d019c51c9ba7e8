// `ResumeBody`: the response body of a resumable layer. A body under no resumption (not a
// GET, a route that turned it off, an answer that cannot be continued) passes its inner
// body through; a resumable one streams its inner body, counts the bytes it hands over,
// and when the inner body fails (or stalls past the idle timeout) sends a continuation
// through a clone of the inner service, judges its answer (`rules.rs`), skips the overlap
// and streams on. Everything a continuation needs is boxed (`Machine`), so the plain case
// carries one pointer.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Response, StatusCode, header, request};
use http_body::{Body, Frame, SizeHint};
use tower::BoxError;

use super::rules::{self, Next, Origin, Verdict};
use crate::backoff::JitterRng;
use crate::classify::{Classification, RetryReason};
use crate::config::Plan;
use crate::decision::{self, Limits, Schedule};
use crate::gate::{Gates, Heard, Ticket};
use crate::hints::Hint;
use crate::hook::{Attempt, AttemptKind};
use crate::info::{AttemptOutcome, RetryInfo, RetryRecord, StopReason};
use crate::time::{Instant, Sleep};
use crate::trace::Slot;

/// The answer to a continuation, from the inner service made ready.
pub(crate) type Answer<B> = Pin<Box<dyn Future<Output = Result<Response<B>, BoxError>> + Send>>;

/// Sends a continuation through a clone of the inner service, driven to readiness first.
/// Erased, so that the body's type names only the inner body.
pub(crate) trait Sender<B>: Send {
    fn send(&mut self, head: request::Parts) -> Answer<B>;
}

/// The response body of a layer made resumable with
/// [`RetryLayer::resume`](crate::RetryLayer::resume): the inner service's body, continued
/// when it breaks.
///
/// A GET whose policy resumes bodies, answered 200 (or 206 to the caller's own range), is
/// continued when its body fails or stalls: the layer sends the request again with `Range`
/// from the next byte the caller has not had, and `If-Range` with the first response's
/// validator, checks that the answer continues the same representation, skips what the
/// caller already had, and streams on. The caller sees one body, whole, or an error; never
/// bytes of two representations spliced together. Every other body passes through.
///
/// Its data is [`Bytes`]; its error is the inner body's, boxed, where it is not continued,
/// or a [`RetryError`](crate::RetryError) when it could not be continued: its record is the
/// request's, the continuations booked as retries of kind [`AttemptKind::Continuation`]
/// and the reason in [`stop`](crate::RetryInfo::stop); its source is the last failure (the
/// inner body's error, or the continuation's).
///
/// The reasons it was not continued: the answer was another representation
/// ([`StopReason::RepresentationChanged`]), stated another length
/// ([`StopReason::LengthChanged`]), ignored the range with nothing to prove it the same
/// representation ([`StopReason::RangeIgnored`]), or had a range that does not continue the
/// body ([`StopReason::RangeMismatch`]); the first response had no validator and bytes were
/// already handed over ([`StopReason::NoValidator`]); the policy's limit
/// ([`StopReason::MaxContinuations`]), a gate ([`StopReason::BudgetExhausted`],
/// [`StopReason::Throttled`]) or the deadline ([`StopReason::Deadline`]) allowed no more;
/// or the continuation was answered with a status that is neither a continuation nor worth
/// another ([`StopReason::Final`]; the status is the record's last outcome).
///
/// ```
/// # use bytes::Bytes;
/// # use http::{Request, Response};
/// # use http_body_util::{BodyExt, Full};
/// # use tower::{Layer, ServiceExt};
/// # use tower_http_retry::{ReplayBody, ResumeInfo, RetryLayer};
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tower::BoxError> {
/// # let inner = tower::service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
/// #     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
/// # });
/// let client = RetryLayer::new().resume().layer(inner);
/// let request = Request::get("http://127.0.0.1:3000/file").body(Full::new(Bytes::new()))?;
/// let response = client.oneshot(request).await?;
/// let resumed = response.extensions().get::<ResumeInfo>().cloned();
/// assert_eq!(response.into_body().collect().await?.to_bytes(), "hello");
/// // No continuation was needed.
/// assert_eq!(resumed.map(|info| info.continuations().len()), Some(0));
/// # Ok(())
/// # }
/// ```
///
/// A body that could not be continued:
///
/// ```
/// # use bytes::Bytes;
/// # use http::{Request, Response};
/// # use http_body::Frame;
/// # use http_body_util::{BodyExt, Full, StreamBody};
/// # use tower::{Layer, ServiceExt};
/// use tower_http_retry::{ReplayBody, RetryError, RetryLayer, StopReason};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tower::BoxError> {
/// // A server with no ETag and no Last-Modified cuts the body after 5 bytes: nothing
/// // could prove a continuation the same file, so none is sent.
/// # let inner = tower::service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
/// #     let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
/// #         Ok(Frame::data(Bytes::from_static(b"hello"))),
/// #         Err(std::io::ErrorKind::ConnectionReset.into()),
/// #     ];
/// #     Ok::<_, std::convert::Infallible>(Response::new(StreamBody::new(futures_util::stream::iter(frames))))
/// # });
/// let client = RetryLayer::new().resume().layer(inner);
/// let request = Request::get("http://127.0.0.1:3000/file").body(Full::new(Bytes::new()))?;
/// let error = client.oneshot(request).await?.into_body().collect().await.unwrap_err();
/// let error = error.downcast_ref::<RetryError>().expect("not continued");
/// assert_eq!(error.info().stop(), StopReason::NoValidator);
/// // The inner body's own error is its source.
/// assert!(error.get_ref().is::<std::io::Error>());
/// # Ok(())
/// # }
/// ```
pub struct ResumeBody<B> {
    kind: Kind<B>,
}

enum Kind<B> {
    /// Not continued: the inner body as it is.
    Plain(B),
    Resuming(Box<Machine<B>>),
}

impl<B> ResumeBody<B> {
    pub(crate) fn plain(body: B) -> Self {
        Self {
            kind: Kind::Plain(body),
        }
    }
}

impl<B> fmt::Debug for ResumeBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("ResumeBody");
        if let Kind::Resuming(machine) = &self.kind {
            s.field("handed", &machine.handed)
                .field("info", &machine.info);
        }
        s.finish_non_exhaustive()
    }
}

/// What a body's continuations did: a handle in the response's extensions, which the body
/// updates as it goes, readable after the body was consumed (or dropped). Only a body that
/// may be continued has one.
///
/// ```
/// # use bytes::Bytes;
/// # use http::{Request, Response};
/// # use http_body_util::{BodyExt, Full};
/// # use tower::{Layer, ServiceExt};
/// # use tower_http_retry::{ReplayBody, ResumeInfo, RetryLayer};
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), tower::BoxError> {
/// # let inner = tower::service_fn(|_: Request<ReplayBody<Full<Bytes>>>| async {
/// #     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"hello"))))
/// # });
/// # let client = RetryLayer::new().resume().layer(inner);
/// # let request = Request::get("http://127.0.0.1:3000/file").body(Full::new(Bytes::new()))?;
/// let response = client.oneshot(request).await?;
/// let info = response.extensions().get::<ResumeInfo>().cloned();
/// let bytes = response.into_body().collect().await?.to_bytes();
/// // After the body is gone, its record is still there.
/// for continuation in info.map(|info| info.continuations()).unwrap_or_default() {
///     println!("continued after {} ({:?} later)", continuation.reason, continuation.wait);
/// }
/// # assert_eq!(bytes, "hello");
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Default)]
pub struct ResumeInfo {
    record: Arc<Mutex<Record>>,
}

#[derive(Debug, Default)]
struct Record {
    continuations: Vec<RetryRecord>,
    stop: Option<StopReason>,
}

impl ResumeInfo {
    fn with<T>(&self, f: impl FnOnce(&mut Record) -> T) -> T {
        f(&mut self.record.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Every continuation the body took so far, in order: why (the failure of the body or
    /// of the continuation before), the wait before it, and what it got. Their
    /// [`kind`](RetryRecord::kind) is [`AttemptKind::Continuation`].
    pub fn continuations(&self) -> Vec<RetryRecord> {
        self.with(|record| record.continuations.clone())
    }
}

impl fmt::Debug for ResumeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.with(|record| {
            f.debug_struct("ResumeInfo")
                .field("continuations", &record.continuations)
                .field("stop", &record.stop)
                .finish()
        })
    }
}

/// Everything a resumable body needs to send its continuations.
pub(crate) struct Continuer<B> {
    pub(crate) sender: Box<dyn Sender<B>>,
    /// The caller's request head (with `Accept-Encoding` set), that continuations are
    /// built from.
    pub(crate) head: request::Parts,
    pub(crate) plan: Arc<Plan>,
    pub(crate) limits: Limits,
    pub(crate) gates: Gates,
}

/// A resumable body's state and what it carries between continuations.
struct Machine<B> {
    state: State<B>,
    origin: Origin,
    /// Bytes handed to the caller.
    handed: u64,
    /// Bytes of the current inner body still to drop: the overlap with what the caller had.
    skip: u64,
    /// Whether the current inner body is a 206's (its early end is a short range's).
    partial: bool,
    info: ResumeInfo,
    // In a `Mutex` only so that the body is `Sync` whatever the service is: the body
    // reaches it through `&mut`, never locking.
    sender: Mutex<Box<dyn Sender<B>>>,
    head: request::Parts,
    plan: Arc<Plan>,
    limits: Limits,
    gates: Gates,
    ticket: Ticket,
    rng: JitterRng,
    /// The wait before the last continuation (for decorrelated jitter).
    previous: Duration,
    /// Attempts of the request before its first continuation.
    attempts: u32,
    /// The request's record when its head arrived: the start of the error's, if the body
    /// cannot go on.
    record: RetryInfo,
    /// The one timer: the idle timeout while streaming, the wait, the continuation's end.
    timer: Option<Pin<Box<Sleep>>>,
    /// The last failure, the source of the error if the body cannot go on.
    last: Option<BoxError>,
    /// The continuation in flight's OpenTelemetry span (nothing without the feature).
    span: Slot,
}

enum State<B> {
    Streaming(B),
    Waiting(request::Parts),
    Sending(Mutex<Answer<B>>),
    Done,
}

impl<B> ResumeBody<B> {
    /// A body that may be continued: the first response's `origin`, whose head came with
    /// `record`.
    pub(crate) fn resuming(
        body: B,
        origin: Origin,
        continuer: Continuer<B>,
        record: RetryInfo,
        info: ResumeInfo,
    ) -> Self {
        let Continuer {
            sender,
            head,
            plan,
            limits,
            gates,
        } = continuer;
        let policy = &plan.policy;
        let origin_partial = origin.closed();
        let mut machine = Machine {
            state: State::Streaming(body),
            origin,
            handed: 0,
            skip: 0,
            partial: origin_partial,
            info,
            sender: Mutex::new(sender),
            head,
            rng: policy.jitter_rng(),
            previous: policy.backoff.base(),
            limits,
            gates,
            ticket: Ticket::default(),
            attempts: record.attempts(),
            record,
            timer: None,
            last: None,
            plan,
            span: Slot::none(),
        };
        machine.arm_idle();
        Self {
            kind: Kind::Resuming(Box::new(machine)),
        }
    }
}

type Polled = Poll<Option<Result<Frame<Bytes>, BoxError>>>;

impl<B> Machine<B> {
    fn arm(&mut self, at: Instant) {
        match &mut self.timer {
            Some(timer) => timer.as_mut().reset(at),
            None => self.timer = Some(self.plan.clock.sleep_until(at)),
        }
    }

    fn arm_idle(&mut self) {
        match self.plan.policy.body_idle_timeout {
            Some(idle) => self.arm(decision::after(self.plan.clock.now(), idle)),
            None => self.timer = None,
        }
    }

    fn timer_fired(&mut self, cx: &mut Context<'_>) -> bool {
        self.timer
            .as_mut()
            .is_some_and(|timer| timer.as_mut().poll(cx).is_ready())
    }
}

impl<B> Machine<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Polled {
        loop {
            match &mut self.state {
                State::Streaming(body) => match Pin::new(body).poll_frame(cx) {
                    Poll::Ready(Some(Ok(frame))) => {
                        if self.timer.is_some() {
                            self.arm_idle();
                        }
                        match frame.into_data() {
                            Ok(data) => {
                                if let Some(data) = self.hand(data) {
                                    return Poll::Ready(Some(Ok(Frame::data(data))));
                                }
                            }
                            Err(frame) => match frame.into_trailers() {
                                Ok(trailers) => {
                                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                                }
                                Err(_) => continue,
                            },
                        }
                    }
                    Poll::Ready(Some(Err(error))) => {
                        let error: BoxError = error.into();
                        let reason = reason_of(&*error);
                        self.last = Some(error);
                        if let Some(end) = self.broke(reason, None) {
                            return Poll::Ready(end);
                        }
                    }
                    Poll::Ready(None) => {
                        // An end before the caller's: a short 206 gets another continuation,
                        // and so does a body that ended early without saying why.
                        let end = self.origin.end;
                        if end.is_some_and(|end| self.origin.start + self.handed < end) {
                            let reason = match self.partial {
                                true => RetryReason::Status(StatusCode::PARTIAL_CONTENT),
                                false => RetryReason::ConnectionClosed,
                            };
                            self.last = Some(Box::new(EndedEarly));
                            if let Some(end) = self.broke(reason, None) {
                                return Poll::Ready(end);
                            }
                            continue;
                        }
                        self.state = State::Done;
                        return Poll::Ready(None);
                    }
                    Poll::Pending => {
                        if self.timer_fired(cx) {
                            self.last = Some(Box::new(IdleTimeout));
                            if let Some(end) = self.broke(RetryReason::Timeout, None) {
                                return Poll::Ready(end);
                            }
                            continue;
                        }
                        return Poll::Pending;
                    }
                },
                State::Waiting(_) => {
                    if !self.timer_fired(cx) {
                        return Poll::Pending;
                    }
                    if let State::Waiting(head) = std::mem::replace(&mut self.state, State::Done) {
                        self.send(head);
                    }
                }
                State::Sending(answer) => {
                    let answer = answer.get_mut().unwrap_or_else(PoisonError::into_inner);
                    let result = match answer.as_mut().poll(cx) {
                        Poll::Ready(result) => result,
                        Poll::Pending => {
                            if !self.timer_fired(cx) {
                                return Poll::Pending;
                            }
                            self.span.abandoned();
                            if self.limits.past_deadline(self.plan.clock.now()) {
                                self.outcome(AttemptOutcome::Abandoned);
                                self.last = Some(self.limits.deadline_exceeded());
                            } else {
                                self.outcome(AttemptOutcome::TimedOut);
                                let timeout = self.plan.policy.attempt_timeout.unwrap_or_default();
                                self.last =
                                    Some(Box::new(crate::error::AttemptTimedOut::new(timeout)));
                            }
                            if let Some(end) = self.broke(RetryReason::Timeout, None) {
                                return Poll::Ready(end);
                            }
                            continue;
                        }
                    };
                    self.state = State::Done;
                    let outcome = match &result {
                        Ok(response) => AttemptOutcome::Response(response.status()),
                        Err(_) => AttemptOutcome::Error,
                    };
                    self.span.end(outcome, &result);
                    match result {
                        Ok(response) => {
                            let status = response.status();
                            self.outcome(AttemptOutcome::Response(status));
                            let verdict =
                                rules::judge(&self.origin, self.handed, status, response.headers());
                            self.hear(match verdict {
                                Verdict::Accept { .. } | Verdict::End => Heard::Success,
                                Verdict::Again => {
                                    Heard::Failure(RetryReason::Status(status).kind())
                                }
                                Verdict::Refuse(_) => Heard::Neither,
                            });
                            match verdict {
                                Verdict::Accept { skip, .. } => {
                                    self.skip = skip;
                                    self.partial = status == StatusCode::PARTIAL_CONTENT;
                                    self.state = State::Streaming(response.into_body());
                                    self.arm_idle();
                                }
                                Verdict::Again => {
                                    // The server's `Retry-After` (or RateLimit) is a floor,
                                    // as for a retry.
                                    let hint = Hint::from_headers(
                                        response.headers(),
                                        self.plan.clock.wall_now(),
                                    );
                                    let reason = RetryReason::Status(status);
                                    if let Some(end) = self.broke(reason, hint) {
                                        return Poll::Ready(end);
                                    }
                                }
                                Verdict::End => return Poll::Ready(None),
                                Verdict::Refuse(stop) => {
                                    return Poll::Ready(Some(Err(self.fail(stop))));
                                }
                            }
                        }
                        Err(error) => {
                            self.outcome(AttemptOutcome::Error);
                            let reason = reason_of(&*error);
                            self.hear(Heard::Failure(reason.kind()));
                            self.last = Some(error);
                            if let Some(end) = self.broke(reason, None) {
                                return Poll::Ready(end);
                            }
                        }
                    }
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }

    /// Sends the continuation `head` through a clone of the inner service, bounded by the
    /// attempt timeout or the deadline.
    fn send(&mut self, mut head: request::Parts) {
        self.span = Slot::continuation(&self.plan.log, &mut head);
        let answer = self
            .sender
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .send(head);
        match self.limits.attempt_end(self.plan.clock.now()) {
            Some(end) => self.arm(end),
            None => self.timer = None,
        }
        self.state = State::Sending(Mutex::new(answer));
    }

    /// Hands over what the caller has not had of `data`, within the caller's end.
    fn hand(&mut self, mut data: B::Data) -> Option<Bytes> {
        let mut data = data.copy_to_bytes(data.remaining());
        let skipped = self.skip.min(data.len() as u64);
        data.advance(skipped as usize);
        self.skip -= skipped;
        if let Some(end) = self.origin.end {
            let left = end.saturating_sub(self.origin.start + self.handed);
            data.truncate(left.min(data.len() as u64) as usize);
        }
        self.handed += data.len() as u64;
        (!data.is_empty()).then_some(data)
    }

    /// The continuations taken so far.
    fn taken(&self) -> u32 {
        self.info.with(|record| record.continuations.len()) as u32
    }

    /// Books what the last continuation got.
    fn outcome(&mut self, outcome: AttemptOutcome) {
        self.info.with(|record| {
            if let Some(last) = record.continuations.last_mut() {
                last.outcome = outcome;
            }
        });
    }

    /// Tells the gates what a continuation got, as the retry machinery tells them of an
    /// attempt's outcome (what a refusal after it means is left to the next ask).
    fn hear(&self, heard: Heard) {
        let _ = self.gates.on_outcome(heard, Some(&self.ticket));
    }

    /// The body broke for `reason` (with the server's `hint` if a continuation was answered
    /// with one): schedules a continuation, or ends the body (`Some`: the end to return,
    /// cleanly or with an error).
    fn broke(
        &mut self,
        reason: RetryReason,
        hint: Option<Hint>,
    ) -> Option<Option<Result<Frame<Bytes>, BoxError>>> {
        self.state = State::Done;
        let head = match rules::next(&self.origin, self.handed) {
            Ok(Next::Done) => return Some(None),
            Err(stop) => return Some(Some(Err(self.fail(stop)))),
            Ok(next) => next,
        };
        let taken = self.taken();
        if taken >= self.plan.policy.max_continuations {
            return Some(Some(Err(self.fail(StopReason::MaxContinuations))));
        }
        let now = self.plan.clock.now();
        let policy = &self.plan.policy;
        // Numbered as retries are: 1 for the first.
        let backoff = self.rng.draw(&policy.backoff, taken + 1, self.previous);
        let schedule = Schedule {
            reason,
            backoff,
            hint,
            max_hint: policy.max_retry_after,
            now,
            deadline: self.limits.start_by(now),
            transparent: false,
        };
        let mut record = match decision::schedule_retry(&schedule, &self.gates, &mut self.ticket) {
            Ok(record) => record,
            Err(stop) => {
                if stop == StopReason::BudgetExhausted {
                    crate::trace::budget_refused(&reason);
                }
                return Some(Some(Err(self.fail(stop))));
            }
        };
        record.kind = AttemptKind::Continuation;
        crate::trace::retried(&record);
        self.previous = record.wait;
        let number = self.attempts + taken + 1;
        let wait = record.wait;
        crate::trace::Trace::continuing(&self.plan.log, &self.head, number, &record, self.handed);
        self.info.with(|r| r.continuations.push(record));
        let head = self.request(head, number, decision::after(now, wait));
        self.state = State::Waiting(head);
        self.arm(decision::after(now, wait));
        None
    }

    /// The continuation's request head, as attempt `number`, sent at `at`.
    fn request(&self, next: Next, number: u32, at: Instant) -> request::Parts {
        let mut head = clone_head(&self.head);
        if let Next::Range { range, if_range } = next {
            head.headers.insert(header::RANGE, range);
            head.headers.insert(header::IF_RANGE, if_range);
        }
        let attempt = Attempt::of(
            number,
            number - 1,
            self.limits.time_left(Some(at)),
            self.limits.attempt_timeout(),
            AttemptKind::Continuation,
        );
        if !self.plan.hooks.is_empty() {
            self.plan.hooks.before_attempt(&attempt, &mut head.headers);
        }
        head.extensions.insert(attempt);
        head
    }

    /// Ends the body for `stop`: the request's record, its continuations booked, and the
    /// last failure.
    fn fail(&mut self, stop: StopReason) -> BoxError {
        self.state = State::Done;
        self.timer = None;
        let mut record = std::mem::take(&mut self.record);
        self.info.with(|info| {
            info.stop = Some(stop);
            for continuation in &info.continuations {
                record.push_retry(*continuation);
            }
        });
        record.set_stop(stop);
        crate::trace::Trace::not_continued(&self.plan.log, &self.head, stop, self.handed);
        let source = self.last.take().unwrap_or_else(|| Box::new(EndedEarly));
        Box::new(crate::error::RetryError::new(record, source))
    }
}

/// A copy of a request head (its extensions too).
pub(crate) fn clone_head(head: &request::Parts) -> request::Parts {
    let mut request = http::Request::new(());
    *request.method_mut() = head.method.clone();
    *request.uri_mut() = head.uri.clone();
    *request.version_mut() = head.version;
    *request.headers_mut() = head.headers.clone();
    *request.extensions_mut() = head.extensions.clone();
    request.into_parts().0
}

/// Why a body or a continuation failed, as the default classification reads errors; a
/// failure it does not name is taken as the connection's.
fn reason_of(error: &(dyn StdError + 'static)) -> RetryReason {
    match crate::classify::classify_error(error) {
        Classification::Retry(reason) | Classification::RetryOnce(reason) => reason,
        _ => RetryReason::ConnectionClosed,
    }
}

/// The inner body sent nothing for the policy's `body_idle_timeout`.
#[derive(Debug)]
struct IdleTimeout;

impl fmt::Display for IdleTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("response body idle timeout")
    }
}

impl StdError for IdleTimeout {}

/// The inner body ended before the length its response stated.
#[derive(Debug)]
struct EndedEarly;

impl fmt::Display for EndedEarly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("response body ended before its stated length")
    }
}

impl StdError for EndedEarly {}

impl<B> Body for ResumeBody<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        match &mut self.get_mut().kind {
            Kind::Plain(body) => {
                let frame = ready!(Pin::new(body).poll_frame(cx));
                Poll::Ready(frame.map(|r| match r {
                    Ok(f) => Ok(f.map_data(|mut d| d.copy_to_bytes(d.remaining()))),
                    Err(error) => Err(error.into()),
                }))
            }
            Kind::Resuming(machine) => machine.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Plain(body) => body.is_end_stream(),
            Kind::Resuming(machine) => match &machine.state {
                State::Done => true,
                State::Streaming(body) => {
                    body.is_end_stream()
                        && machine
                            .origin
                            .end
                            .is_none_or(|end| machine.origin.start + machine.handed >= end)
                }
                _ => false,
            },
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Plain(body) => body.size_hint(),
            Kind::Resuming(machine) => match machine.origin.end {
                Some(end) => {
                    SizeHint::with_exact(end.saturating_sub(machine.origin.start + machine.handed))
                }
                None => SizeHint::new(),
            },
        }
    }
}
