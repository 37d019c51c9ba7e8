// Request bodies that can be sent again.
//
// [`ReplayBody`] passes the caller's body through frame by frame and keeps a cheap
// [`Bytes`] handle of every data frame it sent (a reference count, not a copy, for
// `Bytes`-backed data), and the trailers, up to a cap. A retry first replays those frames
// and then, if the original body was not finished, goes on reading it where the previous
// attempt stopped. So a retry sends exactly the bytes the first attempt sent, and an
// attempt that reads the original sends it whole, whatever the cap.
//
// Who reads the original. Usually the first attempt's body holds it from the start (so
// reading it takes no lock until there is something to record) and hands it back to the
// recording when it is dropped unfinished; a retry takes it over from there. A hedged
// request's attempts are in flight together, and its first attempt may not have started
// sending (stuck connecting, in the pool, behind a stream limit) when a hedge is due: the
// original stays in the recording, and whichever attempt is at the end of the recording
// polls it there, under the lock, records the frame, and wakes the others, which replay
// it. If the original passes the cap, the attempt that read past it takes it over and
// sends it whole, as a first attempt would; if it fails, the attempt that met the error
// reports it. The others cannot follow, and the hedged request's driver drops those still
// in flight (`Replay::poll_sole`). One already answered whose transport still reads its
// body (a server that answered early and reads on) waits until its transport lets the
// body go (a server ends such a request by its own body timeout): no attempt's body ever
// ends before every byte of the original was sent, which would send a truncated body as
// if it were whole.
//
// A body is not replayed when:
// - its `size_hint` lower bound is above the cap (it is never buffered), or it grew past
//   the cap while streaming (the buffer is freed at once);
// - the caller's body returned an error.
//
// A response that came before its attempt sent the whole body (a server or proxy that
// answers 503 without reading the request) is no obstacle: the rest of the body is still
// unread in the original, and the retry replays what was recorded and reads the rest, under
// the cap.
//
// Transports let go of a body asynchronously: hyper's HTTP/1 connection task and its
// HTTP/2 body pipe may still hold the previous attempt's body when that attempt's response
// future has already failed. The retry loop then waits for the body to be dropped (the drop
// wakes it) before it replays, within a bound: the deadline, else the attempt timeout, else
// a grace of its own (`RELEASE_GRACE` in decision.rs).
//
// An empty body needs no buffer at all.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// A request body that records what it sends so that a retry can send it again.
///
/// This is the body type the inner service receives. Its data frames are [`Bytes`]; its
/// error is the caller's body's error, passed through unchanged.
///
/// ```
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use tower_http_retry::ReplayBody;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let mut first = ReplayBody::new(Full::new(Bytes::from_static(b"hello")), 64 * 1024);
/// // Nothing was sent yet: there is nothing to replay beside a live body.
/// assert!(first.try_replay().is_none());
/// let sent = first.frame().await.unwrap().unwrap().into_data().unwrap();
/// // Read to its end: a replay sends the same bytes again.
/// let again = first.try_replay().unwrap().collect().await.unwrap().to_bytes();
/// assert_eq!(sent, again);
/// # }
/// ```
pub struct ReplayBody<B> {
    inner: Inner<B>,
}

enum Inner<B> {
    /// Sent once, nothing kept.
    Passthrough(B),
    /// Sent once, nothing kept, and whether it failed told to the request's driver (a
    /// caller's failed body is the caller's error, not the server's).
    Watched(B, Arc<AtomicBool>),
    /// Known to be empty.
    Empty,
    /// Recording (first attempt) or replaying (later ones).
    Shared(Cursor<B>),
}

/// One attempt's view of the shared recording.
struct Cursor<B> {
    shared: Arc<Mutex<Recording<B>>>,
    /// The original body, while this attempt alone reads it.
    rest: Option<B>,
    /// The attempt this body belongs to (0 for the first; `u32::MAX` for a body made by
    /// [`ReplayBody::try_replay`]).
    attempt: u32,
    at: Progress,
    /// The original's size hint before anything was read (a copy: it never changes).
    hint: SizeHint,
}

/// How far one attempt's body has got.
#[derive(Default)]
struct Progress {
    /// Next recorded chunk to replay.
    pos: usize,
    trailers_sent: bool,
    /// This attempt's body returned its end: every later poll ends too, without a lock.
    ended: bool,
    /// Data bytes this attempt has produced, for `size_hint`.
    sent: u64,
}

pub(crate) struct Recording<B> {
    /// The original body while no attempt holds it: between attempts, or always when the
    /// attempts share it (`readers`).
    rest: Option<B>,
    chunks: Chunks,
    /// Boxed: rare, and a `HeaderMap` would double the size of every recording.
    trailers: Option<Box<HeaderMap>>,
    len: usize,
    cap: usize,
    /// The original body reached its end: `chunks` and `trailers` are all of it.
    complete: bool,
    /// More than `cap` bytes were sent: the buffer was freed and nothing can be replayed.
    overflowed: bool,
    /// The caller's body failed.
    errored: bool,
    /// The original's size hint before anything was read.
    hint: SizeHint,
    /// The attempts share the original, which stays in `rest` and is polled there by
    /// whichever attempt reaches the end of the recording.
    shares: bool,
    /// The attempts waiting for the shared original's next frame; made when one first
    /// has to wait (a body whose frames are all at hand, such as `Full`, never needs it).
    readers: Option<Arc<Readers>>,
    /// When a shared original passed the cap, the attempt that read past it and reads on
    /// alone; when it failed, the attempt that met the failure. The others cannot follow
    /// it, and are cut off by the driver.
    sole: Option<u32>,
    /// The retry loop, waiting for an attempt body to be dropped or to finish.
    waker: Option<Waker>,
}

impl<B> Recording<B> {
    /// A recording of nothing yet.
    #[inline]
    fn new(rest: Option<B>, cap: usize, hint: SizeHint, shares: bool) -> Self {
        Self {
            rest,
            chunks: Chunks::default(),
            trailers: None,
            len: 0,
            cap,
            complete: false,
            overflowed: false,
            errored: false,
            hint,
            shares,
            readers: None,
            sole: None,
            waker: None,
        }
    }

    /// Wakes the retry loop if it waits for this recording to change.
    fn notify(&mut self) {
        if let Some(waker) = self.waker.take() {
            waker.wake();
        }
    }

    /// Has [`notify`](Self::notify) wake `cx`. Called under the lock the bodies take to
    /// change the recording, so no wake is lost between a check and this.
    fn register(&mut self, cx: &Context<'_>) {
        match &mut self.waker {
            Some(waker) => waker.clone_from(cx.waker()),
            None => self.waker = Some(cx.waker().clone()),
        }
    }

    /// The recording changed (a frame, the end, an error): every attempt waiting for the
    /// original's next frame looks again.
    fn wake_readers(&self) {
        if let Some(readers) = &self.readers {
            readers.wake_all();
        }
    }
}

/// The attempts waiting for the next frame of an original they share. The original is
/// polled with a waker that wakes them all: whichever attempt polled it last, each of them
/// may be the one to read on (the one that polled may have been dropped, or its transport
/// may not poll it again soon).
#[derive(Default)]
struct Readers {
    wakers: Mutex<Vec<Waker>>,
}

impl Readers {
    /// `waker` is woken by the next change of the recording.
    fn register(&self, waker: &Waker) {
        let mut wakers = self
            .wakers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if !wakers.iter().any(|known| known.will_wake(waker)) {
            wakers.push(waker.clone());
        }
    }

    fn wake_all(&self) {
        let wakers = std::mem::take(
            &mut *self
                .wakers
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        for waker in wakers {
            waker.wake();
        }
    }
}

impl Wake for Readers {
    fn wake(self: Arc<Self>) {
        self.wake_all();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_all();
    }
}

/// The recorded data frames. Most request bodies are one frame (`Full`, a buffered
/// JSON document), so the first is kept inline and only later ones need the `Vec`.
#[derive(Default)]
struct Chunks {
    first: Option<Bytes>,
    rest: Vec<Bytes>,
}

impl Chunks {
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    fn get(&self, index: usize) -> Option<&Bytes> {
        match index {
            0 => self.first.as_ref(),
            _ => self.rest.get(index - 1),
        }
    }

    fn push(&mut self, chunk: Bytes) {
        match self.first {
            None => self.first = Some(chunk),
            Some(_) => self.rest.push(chunk),
        }
    }
}

/// Why a body cannot be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotReplayable {
    /// Over the cap, by its size hint or while streaming.
    TooLarge,
    /// The caller's body failed: the error is theirs and is returned as is.
    BodyError,
    /// An earlier attempt's transport still holds the unfinished original.
    InFlight,
}

/// Whether a body sent once ([`ReplayBody::watched`]) failed.
pub(crate) struct BodyWatch(Arc<AtomicBool>);

impl BodyWatch {
    /// True once the caller's body returned an error.
    pub(crate) fn failed(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The retry loop's handle on a request body.
pub(crate) enum Replay<B> {
    /// Nothing kept: the body is sent once.
    Never,
    /// Empty bodies replay as empty bodies.
    Empty,
    Shared(Arc<Mutex<Recording<B>>>),
}

fn lock<B>(shared: &Mutex<Recording<B>>) -> MutexGuard<'_, Recording<B>> {
    // Nothing here can leave the recording half-updated, so a poisoned lock is still sound.
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<B: Body> ReplayBody<B> {
    /// Wraps `body` so that up to `max_replay_bytes` of it can be replayed.
    ///
    /// A body whose size hint says it is larger than the cap is passed through and never
    /// replayed; an empty one needs no buffer.
    pub fn new(body: B, max_replay_bytes: usize) -> Self {
        Self::with_handle(body, max_replay_bytes, false).0
    }

    /// Wraps `body` and returns the retry loop's handle on it. With `concurrent` (a hedged
    /// request, whose attempts may be in flight together), the body is read by whichever
    /// attempt needs it first.
    pub(crate) fn with_handle(body: B, cap: usize, concurrent: bool) -> (Self, Replay<B>) {
        if body.is_end_stream() {
            // Nothing to send, now or later: no frames, no trailers.
            return (Self::empty(), Replay::Empty);
        }
        let hint = body.size_hint();
        if hint.lower() > cap as u64 {
            return (Self::passthrough(body), Replay::Never);
        }
        if concurrent {
            return Self::shared(body, cap, hint);
        }
        // The first attempt's body holds the original from the start, so reading it takes
        // no lock until there is something to record.
        let shared = Arc::new(Mutex::new(Recording::new(None, cap, hint, false)));
        let mut cursor = Cursor::new(Arc::clone(&shared), 0, hint);
        cursor.rest = Some(body);
        (
            Self {
                inner: Inner::Shared(cursor),
            },
            Replay::Shared(shared),
        )
    }

    /// A recording whose original stays in it, read by whichever attempt needs it first.
    #[cold]
    #[inline(never)]
    fn shared(body: B, cap: usize, hint: SizeHint) -> (Self, Replay<B>) {
        let shared = Arc::new(Mutex::new(Recording::new(Some(body), cap, hint, true)));
        let cursor = Cursor::new(Arc::clone(&shared), 0, hint);
        (
            Self {
                inner: Inner::Shared(cursor),
            },
            Replay::Shared(shared),
        )
    }

    /// Passes `body` through without keeping anything.
    pub(crate) fn passthrough(body: B) -> Self {
        Self {
            inner: Inner::Passthrough(body),
        }
    }

    /// Passes `body` through without keeping anything, and tells the handle whether it
    /// failed.
    pub(crate) fn watched(body: B) -> (Self, BodyWatch) {
        let failed = Arc::new(AtomicBool::new(false));
        let body = Self {
            inner: Inner::Watched(body, Arc::clone(&failed)),
        };
        (body, BodyWatch(failed))
    }

    /// A body that sends again what this one sent, if that is still possible.
    ///
    /// Possible when this body was empty, or is within the cap and has either been read to
    /// its end or been dropped (any other attempt body made from the same original too).
    /// Always `None` for a body over the cap or one whose original failed.
    pub fn try_replay(&self) -> Option<Self> {
        match &self.inner {
            Inner::Passthrough(_) | Inner::Watched(..) => None,
            Inner::Empty => Some(Self::empty()),
            Inner::Shared(cursor) => {
                let state = lock(&cursor.shared);
                // This body is alive: only a finished recording can be replayed beside it.
                let ok = state.complete && !state.overflowed && !state.errored;
                drop(state);
                ok.then(|| Self {
                    inner: Inner::Shared(Cursor::attach(&cursor.shared, u32::MAX)),
                })
            }
        }
    }

    pub(crate) fn empty() -> Self {
        Self {
            inner: Inner::Empty,
        }
    }
}

impl<B> Replay<B> {
    /// Checks that the next attempt can send the body again.
    pub(crate) fn check(&self) -> Result<(), NotReplayable> {
        match self {
            Replay::Never => Err(NotReplayable::TooLarge),
            Replay::Empty => Ok(()),
            Replay::Shared(shared) => lock(shared).check(),
        }
    }

    /// Ready once the check no longer says [`NotReplayable::InFlight`], with its result;
    /// until then the drop (or the end) of the attempt body holding the original wakes
    /// `cx`.
    pub(crate) fn poll_released(&self, cx: &mut Context<'_>) -> Poll<Result<(), NotReplayable>> {
        match self {
            Replay::Shared(shared) => {
                let mut state = lock(shared);
                match state.check() {
                    Err(NotReplayable::InFlight) => {
                        state.register(cx);
                        Poll::Pending
                    }
                    other => Poll::Ready(other),
                }
            }
            _ => Poll::Ready(self.check()),
        }
    }

    /// Ready when another attempt may start sending the body beside those in flight (a
    /// hedge): at once for an empty body or one whose attempts share the original, once
    /// the recording is complete, or once no attempt body holds the original (the hedge
    /// takes it over). Until then the end of the recording, its overflow or failure, or
    /// the drop of the body holding the original wakes `cx`. `Err` when it can never be
    /// sent again.
    pub(crate) fn poll_hedge(&self, cx: &mut Context<'_>) -> Poll<Result<(), NotReplayable>> {
        match self {
            Replay::Never => Poll::Ready(Err(NotReplayable::TooLarge)),
            Replay::Empty => Poll::Ready(Ok(())),
            Replay::Shared(shared) => {
                let mut state = lock(shared);
                match state.check() {
                    Err(NotReplayable::InFlight) => {
                        state.register(cx);
                        Poll::Pending
                    }
                    other => Poll::Ready(other),
                }
            }
        }
    }

    /// True for a body that is never kept (over the cap by its size hint).
    pub(crate) fn is_never(&self) -> bool {
        matches!(self, Replay::Never)
    }

    /// True when the caller's own body failed.
    pub(crate) fn body_failed(&self) -> bool {
        match self {
            Replay::Shared(shared) => lock(shared).errored,
            _ => false,
        }
    }

    /// The body of attempt `attempt` (0 for the first). Call [`Replay::check`] first.
    pub(crate) fn body(&self, attempt: u32) -> ReplayBody<B> {
        match self {
            Replay::Never | Replay::Empty => ReplayBody {
                inner: Inner::Empty,
            },
            Replay::Shared(shared) => ReplayBody {
                inner: Inner::Shared(Cursor::attach(shared, attempt)),
            },
        }
    }

    /// True when the attempts share the original (a hedged request whose body may be read
    /// by any of its attempts).
    pub(crate) fn shares(&self) -> bool {
        match self {
            Replay::Shared(shared) => lock(shared).shares,
            _ => false,
        }
    }

    /// For attempts that share the original: the attempt that read past the cap, or that
    /// met the caller's body's error, once one did. It alone can go on (sending the rest,
    /// or failing with the caller's error); every other attempt is stuck and must be cut
    /// off. Until then, a change of the recording (that overflow or failure) wakes `cx`.
    pub(crate) fn poll_sole(&self, cx: &Context<'_>) -> Option<u32> {
        let Replay::Shared(shared) = self else {
            return None;
        };
        let mut state = lock(shared);
        if state.sole.is_none() && !state.complete && !state.errored {
            state.register(cx);
        }
        state.sole
    }
}

impl<B> Recording<B> {
    fn check(&self) -> Result<(), NotReplayable> {
        if self.errored {
            Err(NotReplayable::BodyError)
        } else if self.overflowed {
            Err(NotReplayable::TooLarge)
        } else if self.complete || self.rest.is_some() {
            // All recorded, or the original is back (or always kept) in the recording,
            // where the next attempt reads on after replaying what was recorded.
            Ok(())
        } else {
            // An attempt body still holds the unfinished original.
            Err(NotReplayable::InFlight)
        }
    }
}

impl<B> Cursor<B> {
    /// Another attempt's view of the recording.
    fn attach(shared: &Arc<Mutex<Recording<B>>>, attempt: u32) -> Self {
        let hint = lock(shared).hint;
        Self::new(Arc::clone(shared), attempt, hint)
    }

    /// A view of `shared` for attempt `attempt`.
    fn new(shared: Arc<Mutex<Recording<B>>>, attempt: u32, hint: SizeHint) -> Self {
        Self {
            shared,
            rest: None,
            attempt,
            at: Progress::default(),
            hint,
        }
    }
}

impl<B> Drop for Cursor<B> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        if let Some(rest) = self.rest.take() {
            if !state.complete && !state.overflowed && !state.errored {
                // Hand the unfinished original to the next attempt.
                state.rest = Some(rest);
            }
        }
        state.notify();
    }
}

impl<B> Cursor<B>
where
    B: Body + Unpin,
{
    fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        if self.at.ended {
            return Poll::Ready(None);
        }
        if self.rest.is_some() {
            return self.poll_own(cx);
        }
        let mut state = lock(&self.shared);
        let at = &mut self.at;
        if let Some(chunk) = state.chunks.get(at.pos).filter(|_| !state.overflowed) {
            let chunk = chunk.clone();
            at.pos += 1;
            at.sent += chunk.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if state.overflowed {
            // Not reachable when `Replay::check` passed, but for attempts that shared an
            // original that passed the cap: the attempt that read past it took it over,
            // alone. Ending here would truncate the body, so wait: the hedged request's
            // driver drops this attempt.
            return Poll::Pending;
        }
        if state.complete {
            // The end, or the trailers that end it.
            if !at.trailers_sent {
                at.trailers_sent = true;
                if let Some(trailers) = &state.trailers {
                    return Poll::Ready(Some(Ok(Frame::trailers(HeaderMap::clone(trailers)))));
                }
            }
            at.ended = true;
            return Poll::Ready(None);
        }
        if state.shares {
            return poll_shared(&mut state, self.attempt, at, &mut self.rest, cx);
        }
        match state.rest.take() {
            Some(rest) => self.rest = Some(rest),
            None => {
                // Not reachable when `Replay::check` passed: another attempt holds the
                // original. Ending here would truncate the body, so wait instead.
                debug_assert!(false, "replay started while the original is in use");
                return Poll::Pending;
            }
        }
        drop(state);
        self.poll_own(cx)
    }

    /// Reads the original this attempt holds alone.
    #[inline]
    fn poll_own(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let Some(rest) = self.rest.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match std::task::ready!(Pin::new(&mut *rest).poll_frame(cx)) {
            None => {
                let mut state = lock(&self.shared);
                state.complete = true;
                state.notify();
                drop(state);
                self.rest = None;
                self.at.ended = true;
                return Poll::Ready(None);
            }
            Some(Err(error)) => {
                let mut state = lock(&self.shared);
                state.errored = true;
                state.notify();
                return Poll::Ready(Some(Err(error)));
            }
            Some(Ok(frame)) => frame.map_data(|mut data| data.copy_to_bytes(data.remaining())),
        };
        // Nothing follows a trailers frame: the body ended with it, whatever the original
        // says (hyper drops a body right after its trailers, without another poll).
        let end = frame.is_trailers() || rest.is_end_stream();
        let mut state = lock(&self.shared);
        self.at.record(&mut state, &frame);
        if end {
            state.complete = true;
            state.notify();
            drop(state);
            self.rest = None;
            // Nothing follows the frame the original ended with.
            self.at.ended = true;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        if self.at.ended {
            return true;
        }
        if let Some(rest) = &self.rest {
            // Holding the original means every recorded chunk was sent already (the
            // recording is this body's own, and not complete): what is left is the
            // original's.
            return rest.is_end_stream();
        }
        let state = lock(&self.shared);
        // Past the cap, only the attempt that holds the original can go on (above).
        if state.overflowed || self.at.pos < state.chunks.len() {
            return false;
        }
        if state.complete {
            self.at.trailers_sent || state.trailers.is_none()
        } else {
            state.rest.as_ref().is_some_and(|rest| rest.is_end_stream())
        }
    }

    fn size_hint(&self) -> SizeHint {
        let hint = self.hint;
        let mut left = SizeHint::new();
        left.set_lower(hint.lower().saturating_sub(self.at.sent));
        if let Some(upper) = hint.upper() {
            left.set_upper(upper.saturating_sub(self.at.sent));
        }
        left
    }
}

/// Reads the next frame of an original the attempts share, where it stays in the recording,
/// for every attempt: attempt `attempt`, at `at`, sends it, the others replay it. `rest` is
/// that attempt's own hold on the original, taken only if the original passes the cap.
fn poll_shared<B: Body + Unpin>(
    state: &mut Recording<B>,
    attempt: u32,
    at: &mut Progress,
    rest: &mut Option<B>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
    let Some(source) = state.rest.as_mut() else {
        return Poll::Pending;
    };
    let polled = match &state.readers {
        // Others may be waiting: the original wakes them all. Registered before the poll,
        // so that a frame that comes at once wakes this attempt too.
        Some(readers) => {
            readers.register(cx.waker());
            let waker = Waker::from(Arc::clone(readers));
            Pin::new(&mut *source).poll_frame(&mut Context::from_waker(&waker))
        }
        // No one has waited yet: this attempt's own waker first.
        None => match Pin::new(&mut *source).poll_frame(cx) {
            Poll::Pending => {
                // From now on the original wakes every waiting attempt: polled again
                // with the waker that does (a wake in between came to this attempt).
                let readers = Arc::new(Readers::default());
                readers.register(cx.waker());
                let waker = Waker::from(Arc::clone(&readers));
                state.readers = Some(readers);
                let Some(source) = state.rest.as_mut() else {
                    return Poll::Pending;
                };
                Pin::new(&mut *source).poll_frame(&mut Context::from_waker(&waker))
            }
            ready => ready,
        },
    };
    let Some(source) = state.rest.as_mut() else {
        return Poll::Pending;
    };
    let frame = match polled {
        Poll::Pending => return Poll::Pending,
        Poll::Ready(None) => {
            state.complete = true;
            state.rest = None;
            state.notify();
            state.wake_readers();
            at.ended = true;
            return Poll::Ready(None);
        }
        Poll::Ready(Some(Err(error))) => {
            // The error is this attempt's to report; the others cannot go on, and their
            // driver drops them.
            state.errored = true;
            state.sole = Some(attempt);
            state.rest = None;
            state.notify();
            state.wake_readers();
            return Poll::Ready(Some(Err(error)));
        }
        Poll::Ready(Some(Ok(frame))) => {
            frame.map_data(|mut data| data.copy_to_bytes(data.remaining()))
        }
    };
    let end = frame.is_trailers() || source.is_end_stream();
    at.record(state, &frame);
    if state.overflowed {
        // Past the cap: this attempt reads on alone and sends it whole, as the first
        // attempt would have without a hedge; the others cannot follow, and their driver
        // cuts them off.
        *rest = state.rest.take();
        state.sole = Some(attempt);
    }
    if end {
        state.complete = true;
        state.rest = None;
        *rest = None;
        at.ended = true;
        state.notify();
    }
    state.wake_readers();
    Poll::Ready(Some(Ok(frame)))
}

impl Progress {
    /// Books a frame this attempt read from the original: kept in the recording while
    /// under the cap, and counted as sent by this attempt.
    #[inline]
    fn record<B>(&mut self, state: &mut Recording<B>, frame: &Frame<Bytes>) {
        if let Some(data) = frame.data_ref() {
            self.sent += data.len() as u64;
            if !state.overflowed {
                if state.len + data.len() > state.cap {
                    state.overflowed = true;
                    state.chunks = Chunks::default();
                    state.trailers = None;
                    state.len = 0;
                    // A hedge waiting for the whole body will never get it.
                    state.notify();
                } else {
                    state.len += data.len();
                    state.chunks.push(data.clone());
                    self.pos = state.chunks.len();
                }
            }
        } else if let Some(trailers) = frame.trailers_ref() {
            self.trailers_sent = true;
            if !state.overflowed {
                state.trailers = Some(Box::new(trailers.clone()));
            }
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match &mut self.get_mut().inner {
            Inner::Passthrough(body) => Pin::new(body).poll_frame(cx).map(|frame| {
                frame.map(|r| r.map(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining()))))
            }),
            Inner::Watched(body, failed) => Pin::new(body).poll_frame(cx).map(|frame| {
                frame.map(|r| match r {
                    Ok(f) => Ok(f.map_data(|mut d| d.copy_to_bytes(d.remaining()))),
                    Err(error) => {
                        failed.store(true, Ordering::Release);
                        Err(error)
                    }
                })
            }),
            Inner::Empty => Poll::Ready(None),
            Inner::Shared(cursor) => cursor.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Passthrough(body) | Inner::Watched(body, _) => body.is_end_stream(),
            Inner::Empty => true,
            Inner::Shared(cursor) => cursor.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Passthrough(body) | Inner::Watched(body, _) => body.size_hint(),
            Inner::Empty => SizeHint::with_exact(0),
            Inner::Shared(cursor) => cursor.size_hint(),
        }
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.inner {
            Inner::Passthrough(_) | Inner::Watched(..) => "passthrough",
            Inner::Empty => "empty",
            Inner::Shared(_) => "replayable",
        };
        f.debug_struct("ReplayBody").field("kind", &kind).finish()
    }
}

impl<B> fmt::Debug for Replay<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self {
            Replay::Never => "never",
            Replay::Empty => "empty",
            Replay::Shared(_) => "shared",
        };
        f.debug_tuple("Replay").field(&kind).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full, StreamBody};

    type Chunks = StreamBody<
        futures_util::stream::Iter<
            std::vec::IntoIter<Result<Frame<Bytes>, std::convert::Infallible>>,
        >,
    >;

    fn chunks(parts: &[&'static [u8]]) -> Chunks {
        let frames: Vec<_> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p))))
            .collect();
        StreamBody::new(futures_util::stream::iter(frames))
    }

    #[tokio::test]
    async fn replays_streamed_chunks_byte_identical_without_copying() {
        let source = Bytes::from_static(b"0123456789");
        let (body, replay) = ReplayBody::with_handle(
            StreamBody::new(futures_util::stream::iter(vec![
                Ok::<_, std::convert::Infallible>(Frame::data(source.slice(0..4))),
                Ok(Frame::data(source.slice(4..10))),
            ])),
            1024,
            false,
        );
        let first = body.collect().await.unwrap().to_bytes();
        assert_eq!(&first[..], b"0123456789");
        assert_eq!(replay.check(), Ok(()));
        let mut again = replay.body(1);
        let a = again.frame().await.unwrap().unwrap().into_data().unwrap();
        // The replayed chunk points into the caller's own buffer: no copy was made.
        assert_eq!(a.as_ptr(), source.as_ptr());
        let b = again.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(b.as_ptr(), source[4..].as_ptr());
        assert!(again.frame().await.is_none());
    }

    #[tokio::test]
    async fn trailers_are_replayed() {
        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", "abc".parse().unwrap());
        let frames = vec![
            Ok::<_, std::convert::Infallible>(Frame::data(Bytes::from_static(b"body"))),
            Ok(Frame::trailers(trailers.clone())),
        ];
        let (body, replay) = ReplayBody::with_handle(
            StreamBody::new(futures_util::stream::iter(frames)),
            1024,
            false,
        );
        let first = body.collect().await.unwrap();
        assert_eq!(first.trailers(), Some(&trailers));
        let again = replay.body(1).collect().await.unwrap();
        assert_eq!(again.trailers(), Some(&trailers));
        assert_eq!(again.to_bytes(), Bytes::from_static(b"body"));
    }

    #[tokio::test]
    async fn over_the_cap_while_streaming_is_sent_whole_and_not_replayed() {
        let (body, replay) =
            ReplayBody::with_handle(chunks(&[b"aaaa", b"bbbb", b"cccc"]), 6, false);
        let sent = body.collect().await.unwrap().to_bytes();
        assert_eq!(&sent[..], b"aaaabbbbcccc");
        assert_eq!(replay.check(), Err(NotReplayable::TooLarge));
        if let Replay::Shared(shared) = &replay {
            let state = lock(shared);
            assert!(state.chunks.len() == 0 && state.chunks.rest.capacity() == 0);
        } else {
            panic!("expected a recording");
        }
    }

    #[tokio::test]
    async fn size_hint_over_the_cap_is_never_buffered() {
        let (body, replay) =
            ReplayBody::with_handle(Full::new(Bytes::from(vec![7u8; 100])), 99, false);
        assert!(matches!(replay, Replay::Never));
        assert_eq!(body.size_hint().exact(), Some(100));
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 100);
    }

    #[tokio::test]
    async fn empty_body_needs_no_buffer() {
        let (body, replay) =
            ReplayBody::with_handle(http_body_util::Empty::<Bytes>::new(), 10, false);
        assert!(matches!(replay, Replay::Empty));
        assert!(body.is_end_stream());
        let again = replay.body(1);
        assert!(again.is_end_stream());
        assert_eq!(again.size_hint().exact(), Some(0));
    }

    #[tokio::test]
    async fn an_unread_dropped_body_is_resumed_from_the_original() {
        let (body, replay) = ReplayBody::with_handle(chunks(&[b"ab", b"cd"]), 1024, false);
        drop(body); // e.g. the connection was refused before anything was written
        assert_eq!(replay.check(), Ok(()));
        let again = replay.body(1).collect().await.unwrap().to_bytes();
        assert_eq!(&again[..], b"abcd");
    }

    #[tokio::test]
    async fn a_partly_sent_body_is_replayed_then_continued() {
        let (mut body, replay) =
            ReplayBody::with_handle(chunks(&[b"ab", b"cd", b"ef"]), 1024, false);
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"ab");
        // Still held by the transport: cannot replay yet.
        assert_eq!(replay.check(), Err(NotReplayable::InFlight));
        // Dropped unfinished (the server answered early, or the connection failed): the
        // next attempt replays what was sent and reads the rest from the original.
        drop(body);
        assert_eq!(replay.check(), Ok(()));
        let again = replay.body(1).collect().await.unwrap().to_bytes();
        assert_eq!(&again[..], b"abcdef");
        // And a third attempt sees the whole recording.
        assert_eq!(replay.check(), Ok(()));
        let third = replay.body(1).collect().await.unwrap().to_bytes();
        assert_eq!(&third[..], b"abcdef");
    }

    #[tokio::test]
    async fn caller_body_error_is_passed_through_and_not_replayed() {
        let frames = vec![
            Ok(Frame::data(Bytes::from_static(b"x"))),
            Err(std::io::Error::other("disk gone")),
        ];
        let (body, replay) = ReplayBody::with_handle(
            StreamBody::new(futures_util::stream::iter(frames)),
            1024,
            false,
        );
        let err = body.collect().await.unwrap_err();
        assert_eq!(err.to_string(), "disk gone");
        assert!(replay.body_failed());
        assert_eq!(replay.check(), Err(NotReplayable::BodyError));
    }

    #[tokio::test]
    async fn replays_keep_the_exact_size_hint() {
        let (body, replay) =
            ReplayBody::with_handle(Full::new(Bytes::from_static(b"hello")), 64, false);
        assert_eq!(body.size_hint().exact(), Some(5));
        let _ = body.collect().await.unwrap();
        let again = replay.body(1);
        assert_eq!(again.size_hint().exact(), Some(5));
        assert!(!again.is_end_stream());
        let bytes = again.collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"hello");
    }

    /// A transport that reads at most `limit` bytes of an attempt's body, then answers and
    /// drops the body; the rest of the body never leaves.
    async fn read_at_most<B: Body<Data = Bytes> + Unpin>(body: &mut B, limit: usize) -> Vec<u8>
    where
        B::Error: std::fmt::Debug,
    {
        let mut sent = Vec::new();
        while sent.len() < limit {
            match body.frame().await {
                Some(frame) => {
                    if let Ok(data) = frame.unwrap().into_data() {
                        sent.extend_from_slice(&data);
                    }
                }
                None => break,
            }
        }
        sent
    }

    #[tokio::test]
    async fn an_attempt_cut_short_is_followed_by_one_that_sends_it_all() {
        // "abc" then "def": attempt 1 is read whole, attempt 2 is cut short after 3 bytes
        // (an early answer), attempt 3 replays it all.
        let (mut first, replay) = ReplayBody::with_handle(chunks(&[b"abc", b"def"]), 1024, false);
        assert_eq!(read_at_most(&mut first, usize::MAX).await, b"abcdef");
        drop(first);
        assert_eq!(replay.check(), Ok(()));
        let mut second = replay.body(1);
        assert_eq!(read_at_most(&mut second, 3).await, b"abc");
        drop(second);
        assert_eq!(replay.check(), Ok(()));
        let mut third = replay.body(1);
        assert_eq!(read_at_most(&mut third, usize::MAX).await, b"abcdef");
        // A body made by `try_replay` replays the same.
        let extra = third.try_replay().unwrap();
        assert_eq!(&extra.collect().await.unwrap().to_bytes()[..], b"abcdef");
    }

    #[tokio::test]
    async fn an_early_answer_before_the_body_left_is_followed_by_the_whole_body() {
        // Attempt 1 sent 2 of 6 bytes when its answer came; the rest is still in the
        // original, and the next attempt sends the recorded prefix and then the rest.
        let (mut first, replay) =
            ReplayBody::with_handle(chunks(&[b"ab", b"cd", b"ef"]), 1024, false);
        assert_eq!(read_at_most(&mut first, 2).await, b"ab");
        assert_eq!(replay.check(), Err(NotReplayable::InFlight));
        drop(first);
        assert_eq!(replay.check(), Ok(()));
        let again = replay.body(1).collect().await.unwrap().to_bytes();
        assert_eq!(&again[..], b"abcdef");
        // Read whole by the retry: complete from now on.
        assert!(lock(replay_state(&replay)).complete);
    }

    #[tokio::test]
    async fn a_continuation_past_the_cap_is_sent_whole_and_not_replayed_again() {
        // 4 bytes read, then an early answer; the retry reads on past the 6-byte cap.
        let (mut first, replay) =
            ReplayBody::with_handle(chunks(&[b"aaaa", b"bbbb", b"cccc"]), 6, false);
        assert_eq!(read_at_most(&mut first, 4).await, b"aaaa");
        drop(first);
        assert_eq!(replay.check(), Ok(()));
        let again = replay.body(1).collect().await.unwrap().to_bytes();
        assert_eq!(&again[..], b"aaaabbbbcccc");
        assert_eq!(replay.check(), Err(NotReplayable::TooLarge));
    }

    #[tokio::test]
    async fn a_replay_told_it_ended_stops_at_the_end() {
        let (first, replay) = ReplayBody::with_handle(chunks(&[b"ab"]), 1024, false);
        drop(first.collect().await.unwrap());
        let mut second = replay.body(1);
        assert_eq!(read_at_most(&mut second, 2).await, b"ab");
        assert!(second.is_end_stream());
        assert!(second.frame().await.is_none());
    }

    fn replay_state<B>(replay: &Replay<B>) -> &Mutex<Recording<B>> {
        match replay {
            Replay::Shared(shared) => shared,
            _ => panic!("expected a recording"),
        }
    }

    /// A streaming body fed by a channel, with a size hint that says at most `upper` bytes.
    struct Fed {
        rx: tokio::sync::mpsc::UnboundedReceiver<Bytes>,
        upper: u64,
    }

    impl Body for Fed {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.rx
                .poll_recv(cx)
                .map(|chunk| chunk.map(|chunk| Ok(Frame::data(chunk))))
        }
        fn size_hint(&self) -> SizeHint {
            let mut hint = SizeHint::new();
            hint.set_upper(self.upper);
            hint
        }
    }

    fn fed(upper: u64) -> (tokio::sync::mpsc::UnboundedSender<Bytes>, Fed) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        (tx, Fed { rx, upper })
    }

    /// Counts the wakes of a waker.
    #[derive(Default)]
    struct Wakes(std::sync::atomic::AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl Wakes {
        fn count(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    fn poll<B: Body<Data = Bytes> + Unpin>(
        body: &mut B,
        wakes: &Arc<Wakes>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let waker = Waker::from(Arc::clone(wakes));
        Pin::new(body).poll_frame(&mut Context::from_waker(&waker))
    }

    fn data<E: std::fmt::Debug>(polled: Poll<Option<Result<Frame<Bytes>, E>>>) -> Bytes {
        match polled {
            Poll::Ready(Some(Ok(frame))) => frame.into_data().unwrap(),
            other => panic!(
                "expected a data frame, got {:?}",
                other.map(|f| f.is_some())
            ),
        }
    }

    #[tokio::test]
    async fn a_hedge_reads_a_body_of_known_size_its_first_attempt_never_started() {
        let source = Bytes::from_static(b"hello world");
        let (first, replay) = ReplayBody::with_handle(Full::new(source.clone()), 64, true);
        // The first attempt is stuck before its transport polls the body: the hedge may
        // go at once, and reads the caller's body itself.
        assert_eq!(replay.check(), Ok(()));
        let waker = Waker::from(Arc::new(Wakes::default()));
        assert!(
            replay
                .poll_hedge(&mut Context::from_waker(&waker))
                .is_ready()
        );
        let hedge = replay.body(1).collect().await.unwrap().to_bytes();
        assert_eq!(hedge, source);
        // The first attempt, when it starts, replays the recording: the same bytes, the
        // same buffer.
        let mut first = first;
        let sent = first.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(sent.as_ptr(), source.as_ptr());
        assert!(first.frame().await.is_none());
    }

    #[tokio::test]
    async fn attempts_sharing_a_streaming_body_each_send_every_chunk_once_in_order() {
        let (tx, body) = fed(64);
        let (mut first, replay) = ReplayBody::with_handle(body, 64, true);
        let mut hedge = replay.body(1);
        let (a, b) = (Arc::new(Wakes::default()), Arc::new(Wakes::default()));
        // Both wait for the first chunk; the one that polled last holds the original's
        // waker, yet both are woken when it comes.
        assert!(poll(&mut first, &a).is_pending());
        assert!(poll(&mut hedge, &b).is_pending());
        tx.send(Bytes::from_static(b"one;")).unwrap();
        assert_eq!((a.count(), b.count()), (1, 1));
        // The hedge reads it from the original; the first attempt replays it.
        assert_eq!(data(poll(&mut hedge, &b)), Bytes::from_static(b"one;"));
        assert_eq!(data(poll(&mut first, &a)), Bytes::from_static(b"one;"));
        // The first attempt now reads the second chunk, and the hedge replays it.
        assert!(poll(&mut first, &a).is_pending());
        assert!(poll(&mut hedge, &b).is_pending());
        tx.send(Bytes::from_static(b"two;")).unwrap();
        assert_eq!(data(poll(&mut first, &a)), Bytes::from_static(b"two;"));
        assert!(
            b.count() >= 2,
            "the hedge is woken by the chunk the other read"
        );
        assert_eq!(data(poll(&mut hedge, &b)), Bytes::from_static(b"two;"));
        drop(tx);
        assert!(matches!(poll(&mut hedge, &b), Poll::Ready(None)));
        assert!(matches!(poll(&mut first, &a), Poll::Ready(None)));
        // A third attempt replays the whole of it.
        let third = replay.body(1).collect().await.unwrap().to_bytes();
        assert_eq!(&third[..], b"one;two;");
    }

    #[tokio::test]
    async fn a_reader_dropped_while_waiting_leaves_the_other_able_to_read() {
        let (tx, body) = fed(64);
        let (mut first, replay) = ReplayBody::with_handle(body, 64, true);
        let mut hedge = replay.body(1);
        let (a, b) = (Arc::new(Wakes::default()), Arc::new(Wakes::default()));
        assert!(poll(&mut hedge, &b).is_pending());
        assert!(poll(&mut first, &a).is_pending());
        // The attempt that polled last is dropped (its stream was reset): the chunk still
        // wakes the one left.
        drop(first);
        tx.send(Bytes::from_static(b"xyz")).unwrap();
        assert_eq!(b.count(), 1);
        assert_eq!(data(poll(&mut hedge, &b)), Bytes::from_static(b"xyz"));
        drop(tx);
        assert!(matches!(poll(&mut hedge, &b), Poll::Ready(None)));
    }

    #[tokio::test]
    async fn a_body_outside_a_hedge_is_read_by_the_attempt_that_holds_it() {
        // Not concurrent: the first attempt holds the original, and a hedge would wait.
        let (tx, body) = fed(u64::MAX);
        let (first, replay) = ReplayBody::with_handle(body, 64, false);
        assert!(!replay.shares());
        assert_eq!(replay.check(), Err(NotReplayable::InFlight));
        let hedge_wakes = Arc::new(Wakes::default());
        let waker = Waker::from(Arc::clone(&hedge_wakes));
        assert!(
            replay
                .poll_hedge(&mut Context::from_waker(&waker))
                .is_pending()
        );
        tx.send(Bytes::from_static(b"data")).unwrap();
        drop(tx);
        let sent = first.collect().await.unwrap().to_bytes();
        assert_eq!(&sent[..], b"data");
        assert!(hedge_wakes.count() >= 1);
        assert_eq!(replay.check(), Ok(()));
    }

    #[tokio::test]
    async fn a_shared_body_past_the_cap_is_read_on_by_the_attempt_that_passed_it() {
        // No size known, 8 bytes against a cap of 6.
        let (tx, body) = fed(u64::MAX);
        let (mut first, replay) = ReplayBody::with_handle(body, 6, true);
        assert!(replay.shares());
        let mut hedge = replay.body(1);
        let (a, b) = (Arc::new(Wakes::default()), Arc::new(Wakes::default()));
        let driver = Arc::new(Wakes::default());
        let driver_waker = Waker::from(Arc::clone(&driver));
        assert_eq!(replay.poll_sole(&Context::from_waker(&driver_waker)), None);
        tx.send(Bytes::from_static(b"abcd")).unwrap();
        tx.send(Bytes::from_static(b"efgh")).unwrap();
        drop(tx);
        // The hedge reads the first chunk, the first attempt replays it.
        assert_eq!(data(poll(&mut hedge, &b)), Bytes::from_static(b"abcd"));
        assert_eq!(data(poll(&mut first, &a)), Bytes::from_static(b"abcd"));
        // The first attempt reads past the cap: it goes on alone, to the end.
        assert_eq!(data(poll(&mut first, &a)), Bytes::from_static(b"efgh"));
        assert_eq!(driver.count(), 1, "the driver is told");
        assert_eq!(
            replay.poll_sole(&Context::from_waker(&driver_waker)),
            Some(0)
        );
        assert!(matches!(poll(&mut first, &a), Poll::Ready(None)));
        assert_eq!(replay.check(), Err(NotReplayable::TooLarge));
        // The hedge cannot follow: it is never given a truncated body, and waits to be
        // dropped.
        assert!(!hedge.is_end_stream());
        assert!(poll(&mut hedge, &b).is_pending());
    }

    #[tokio::test]
    async fn a_shared_body_that_fails_is_reported_by_the_attempt_that_met_it_alone() {
        let frames = vec![
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Err(std::io::Error::other("disk gone")),
        ];
        let (mut first, replay) = ReplayBody::with_handle(
            StreamBody::new(futures_util::stream::iter(frames)),
            64,
            true,
        );
        let mut hedge = replay.body(1);
        let (a, b) = (Arc::new(Wakes::default()), Arc::new(Wakes::default()));
        assert_eq!(data(poll(&mut hedge, &b)), Bytes::from_static(b"ab"));
        assert_eq!(data(poll(&mut first, &a)), Bytes::from_static(b"ab"));
        // The first attempt meets the error: it alone reports it.
        assert!(matches!(poll(&mut first, &a), Poll::Ready(Some(Err(_)))));
        let driver = Waker::from(Arc::new(Wakes::default()));
        assert_eq!(replay.poll_sole(&Context::from_waker(&driver)), Some(0));
        assert!(replay.body_failed());
        // The hedge can neither go on nor end: its driver drops it.
        assert!(!hedge.is_end_stream());
        assert!(poll(&mut hedge, &b).is_pending());
    }
}
