// Request bodies that can be sent again.
//
// [`ReplayBody`] passes the caller's body through frame by frame and keeps a cheap
// [`Bytes`] handle of every data frame it sent (a reference count, not a copy, for
// `Bytes`-backed data), and the trailers, up to a cap. A retry first replays those frames
// and then, if the original body was not finished, goes on reading it where the previous
// attempt stopped. So a retry sends exactly the bytes the first attempt sent, and the
// first attempt always sends the whole original body, whatever the cap.
//
// A body is not replayed when:
// - its `size_hint` lower bound is above the cap (it is never buffered), or it grew past
//   the cap while streaming (the buffer is freed at once);
// - the caller's body returned an error;
// - a response arrived before the attempt that got it had sent the whole body (the server
//   may have acted on a part of it). This is judged per attempt: an earlier attempt that
//   sent it all proves nothing about a later one that a transport cut short.
//
// An attempt's body counts as completely sent when its end was reached: the end of the
// stream, a trailers frame (nothing follows one), `is_end_stream` saying so, an exact size
// hint met, or the request's own `Content-Length` met (hyper stops reading there without a
// last poll).
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
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

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
    /// Known to be empty.
    Empty,
    /// Recording (first attempt) or replaying (later ones).
    Shared(Cursor<B>),
}

/// One attempt's view of the shared recording.
struct Cursor<B> {
    shared: Arc<Mutex<Recording<B>>>,
    /// The attempt this body belongs to (0 for the first), or `None` for a body made by
    /// [`ReplayBody::try_replay`], which belongs to no attempt of the layer's.
    attempt: Option<u32>,
    /// The original body, once this attempt has taken it over.
    rest: Option<B>,
    /// Next recorded chunk to replay.
    pos: usize,
    trailers_sent: bool,
    /// This attempt's body returned its end: every later poll ends too, without a lock.
    ended: bool,
    /// Data bytes this attempt has produced, for `size_hint`.
    sent: u64,
    /// The original's size hint before anything was read (a copy: it never changes).
    hint: SizeHint,
}

pub(crate) struct Recording<B> {
    /// The original body while no attempt is reading it.
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
    /// The attempts whose body was sent whole: a response to any other came early.
    whole: Attempts,
    /// Attempt bodies not yet dropped; one of them may be holding `rest`.
    alive: usize,
    /// The original's size hint before anything was read.
    hint: SizeHint,
    /// The body's length if known before anything was read.
    expected: Option<u64>,
    /// The retry loop, waiting for an attempt body to be dropped or to finish.
    waker: Option<Waker>,
}

impl<B> Recording<B> {
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
}

/// A set of attempt numbers (0 for the first), without allocation below 64.
#[derive(Default)]
struct Attempts {
    low: u64,
    high: Vec<u64>,
}

impl Attempts {
    #[inline]
    fn insert(&mut self, attempt: usize) {
        match attempt.checked_sub(64) {
            None => self.low |= 1 << attempt,
            Some(above) => {
                let (word, bit) = (above / 64, above % 64);
                if self.high.len() <= word {
                    self.high.resize(word + 1, 0);
                }
                self.high[word] |= 1 << bit;
            }
        }
    }

    fn contains(&self, attempt: usize) -> bool {
        match attempt.checked_sub(64) {
            None => self.low & (1 << attempt) != 0,
            Some(above) => self
                .high
                .get(above / 64)
                .is_some_and(|word| word & (1 << (above % 64)) != 0),
        }
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
    /// A response arrived before the body was completely sent.
    EarlyResponse,
    /// An earlier attempt's transport still holds the unfinished original.
    InFlight,
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
        Self::with_handle(body, max_replay_bytes, None).0
    }

    /// Wraps `body` and returns the retry loop's handle on it. `declared_len` is the
    /// request's `Content-Length`, if it has a valid one.
    pub(crate) fn with_handle(body: B, cap: usize, declared_len: Option<u64>) -> (Self, Replay<B>) {
        if body.is_end_stream() {
            // Nothing to send, now or later: no frames, no trailers.
            return (Self::empty(), Replay::Empty);
        }
        let hint = body.size_hint();
        if hint.lower() > cap as u64 {
            return (Self::passthrough(body), Replay::Never);
        }
        let shared = Arc::new(Mutex::new(Recording {
            // The first attempt's body holds the original from the start, so reading it
            // takes no lock until there is something to record.
            rest: None,
            chunks: Chunks::default(),
            trailers: None,
            len: 0,
            cap,
            complete: false,
            overflowed: false,
            errored: false,
            whole: Attempts::default(),
            // The first attempt's body, made below without taking the lock.
            alive: 1,
            hint,
            expected: hint.exact().or(declared_len),
            waker: None,
        }));
        let mut cursor = Cursor::new(Arc::clone(&shared), Some(0), hint);
        cursor.rest = Some(body);
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

    /// A body that sends again what this one sent, if that is still possible.
    ///
    /// Possible when this body was empty, or is within the cap and has either been read to
    /// its end or been dropped (any other attempt body made from the same original too).
    /// Always `None` for a body over the cap or one whose original failed.
    pub fn try_replay(&self) -> Option<Self> {
        match &self.inner {
            Inner::Passthrough(_) => None,
            Inner::Empty => Some(Self::empty()),
            Inner::Shared(cursor) => {
                let state = lock(&cursor.shared);
                // This body is alive: only a finished recording can be replayed beside it.
                let ok = state.complete && !state.overflowed && !state.errored;
                drop(state);
                ok.then(|| Self {
                    inner: Inner::Shared(Cursor::attach(&cursor.shared, None)),
                })
            }
        }
    }

    fn empty() -> Self {
        Self {
            inner: Inner::Empty,
        }
    }
}

impl<B> Replay<B> {
    /// Checks that the next attempt can send the body again, after attempt `attempt` (0
    /// for the first) ended. `responded` says whether that attempt produced a response (as
    /// opposed to an error).
    pub(crate) fn check(&self, attempt: usize, responded: bool) -> Result<(), NotReplayable> {
        match self {
            Replay::Never => Err(NotReplayable::TooLarge),
            Replay::Empty => Ok(()),
            Replay::Shared(shared) => lock(shared).check(attempt, responded),
        }
    }

    /// Ready once the check no longer says [`NotReplayable::InFlight`], with its result;
    /// until then the drop (or the end) of the attempt body holding the original wakes
    /// `cx`.
    pub(crate) fn poll_released(
        &self,
        cx: &mut Context<'_>,
        attempt: usize,
        responded: bool,
    ) -> Poll<Result<(), NotReplayable>> {
        match self {
            Replay::Shared(shared) => {
                let mut state = lock(shared);
                match state.check(attempt, responded) {
                    Err(NotReplayable::InFlight) => {
                        state.register(cx);
                        Poll::Pending
                    }
                    other => Poll::Ready(other),
                }
            }
            _ => Poll::Ready(self.check(attempt, responded)),
        }
    }

    /// Ready when another attempt may start sending the body beside those in flight (a
    /// hedge): at once for an empty body, once the recording is complete, or once no
    /// attempt body holds the original (the hedge takes it over). Until then the end of the
    /// recording, its overflow or failure, or the drop of the body holding the original
    /// wakes `cx`. `Err` when it can never be sent again.
    pub(crate) fn poll_hedge(&self, cx: &mut Context<'_>) -> Poll<Result<(), NotReplayable>> {
        match self {
            Replay::Never => Poll::Ready(Err(NotReplayable::TooLarge)),
            Replay::Empty => Poll::Ready(Ok(())),
            Replay::Shared(shared) => {
                let mut state = lock(shared);
                if state.errored {
                    Poll::Ready(Err(NotReplayable::BodyError))
                } else if state.overflowed {
                    Poll::Ready(Err(NotReplayable::TooLarge))
                } else if state.complete || (state.alive == 0 && state.rest.is_some()) {
                    Poll::Ready(Ok(()))
                } else {
                    state.register(cx);
                    Poll::Pending
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

    /// The body of attempt `attempt` (1 for the first retry). Call [`Replay::check`] first.
    pub(crate) fn body(&self, attempt: u32) -> ReplayBody<B> {
        match self {
            Replay::Never | Replay::Empty => ReplayBody {
                inner: Inner::Empty,
            },
            Replay::Shared(shared) => ReplayBody {
                inner: Inner::Shared(Cursor::attach(shared, Some(attempt))),
            },
        }
    }
}

impl<B> Recording<B> {
    fn check(&self, attempt: usize, responded: bool) -> Result<(), NotReplayable> {
        if self.errored {
            Err(NotReplayable::BodyError)
        } else if self.overflowed {
            Err(NotReplayable::TooLarge)
        } else if responded && !self.whole.contains(attempt) {
            Err(NotReplayable::EarlyResponse)
        } else if self.complete {
            Ok(())
        } else if self.alive > 0 {
            Err(NotReplayable::InFlight)
        } else {
            Ok(())
        }
    }
}

impl<B> Cursor<B> {
    /// Another attempt's view of the recording.
    fn attach(shared: &Arc<Mutex<Recording<B>>>, attempt: Option<u32>) -> Self {
        let hint = {
            let mut state = lock(shared);
            state.alive += 1;
            state.hint
        };
        Self::new(Arc::clone(shared), attempt, hint)
    }

    /// A view already counted in `alive`.
    fn new(shared: Arc<Mutex<Recording<B>>>, attempt: Option<u32>, hint: SizeHint) -> Self {
        Self {
            shared,
            attempt,
            rest: None,
            pos: 0,
            trailers_sent: false,
            ended: false,
            sent: 0,
            hint,
        }
    }
}

impl<B> Drop for Cursor<B> {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        state.alive -= 1;
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
        if self.ended {
            return Poll::Ready(None);
        }
        if self.rest.is_none() {
            let mut state = lock(&self.shared);
            if let Some(chunk) = state.chunks.get(self.pos).filter(|_| !state.overflowed) {
                let chunk = chunk.clone();
                self.pos += 1;
                self.sent += chunk.len() as u64;
                if state.expected == Some(self.sent) {
                    self.sent_whole(&mut state);
                }
                return Poll::Ready(Some(Ok(Frame::data(chunk))));
            }
            if state.complete {
                // The end, or the trailers that end it.
                self.sent_whole(&mut state);
                if !self.trailers_sent {
                    self.trailers_sent = true;
                    if let Some(trailers) = &state.trailers {
                        return Poll::Ready(Some(Ok(Frame::trailers(HeaderMap::clone(trailers)))));
                    }
                }
                self.ended = true;
                return Poll::Ready(None);
            }
            match state.rest.take() {
                Some(rest) => self.rest = Some(rest),
                None => {
                    // Not reachable when `Replay::check` passed: someone else is reading the
                    // original. Ending here would truncate the body, so wait instead; the
                    // attempt is abandoned by its timeout or its transport.
                    debug_assert!(false, "replay started while the original is in use");
                    return Poll::Pending;
                }
            }
        }
        let Some(rest) = self.rest.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match std::task::ready!(Pin::new(&mut *rest).poll_frame(cx)) {
            None => {
                let mut state = lock(&self.shared);
                state.complete = true;
                self.sent_whole(&mut state);
                state.notify();
                drop(state);
                self.rest = None;
                self.ended = true;
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
        if let Some(data) = frame.data_ref() {
            self.sent += data.len() as u64;
            if state.expected == Some(self.sent) && !end {
                // Every byte of the known length (an exact size hint, else the request's
                // `Content-Length`): over HTTP/1 hyper stops reading at the length and
                // drops the body without a last poll.
                self.sent_whole(&mut state);
            }
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
        if end {
            state.complete = true;
            self.sent_whole(&mut state);
            state.notify();
            drop(state);
            self.rest = None;
            // Nothing follows the frame the original ended with.
            self.ended = true;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    /// Marks this attempt's body as sent whole (a transport that stops here has all of it).
    #[inline]
    fn sent_whole(&self, state: &mut Recording<B>) {
        if let Some(attempt) = self.attempt {
            state.whole.insert(attempt as usize);
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.ended {
            return true;
        }
        // A transport told the body has ended stops polling it: it was sent whole.
        if let Some(rest) = &self.rest {
            // Holding the original means every recorded chunk was sent already (the
            // recording is this body's own, and not complete): what is left is the
            // original's.
            if !rest.is_end_stream() {
                return false;
            }
            self.sent_whole(&mut lock(&self.shared));
            return true;
        }
        let mut state = lock(&self.shared);
        if !state.overflowed && self.pos < state.chunks.len() {
            return false;
        }
        let end = if state.complete {
            self.trailers_sent || state.trailers.is_none()
        } else {
            state.rest.as_ref().is_some_and(|rest| rest.is_end_stream())
        };
        if end {
            self.sent_whole(&mut state);
        }
        end
    }

    fn size_hint(&self) -> SizeHint {
        let hint = self.hint;
        let mut left = SizeHint::new();
        left.set_lower(hint.lower().saturating_sub(self.sent));
        if let Some(upper) = hint.upper() {
            left.set_upper(upper.saturating_sub(self.sent));
        }
        left
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
            Inner::Empty => Poll::Ready(None),
            Inner::Shared(cursor) => cursor.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Passthrough(body) => body.is_end_stream(),
            Inner::Empty => true,
            Inner::Shared(cursor) => cursor.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Passthrough(body) => body.size_hint(),
            Inner::Empty => SizeHint::with_exact(0),
            Inner::Shared(cursor) => cursor.size_hint(),
        }
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.inner {
            Inner::Passthrough(_) => "passthrough",
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
            None,
        );
        let first = body.collect().await.unwrap().to_bytes();
        assert_eq!(&first[..], b"0123456789");
        assert_eq!(replay.check(0, true), Ok(()));
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
            None,
        );
        let first = body.collect().await.unwrap();
        assert_eq!(first.trailers(), Some(&trailers));
        let again = replay.body(1).collect().await.unwrap();
        assert_eq!(again.trailers(), Some(&trailers));
        assert_eq!(again.to_bytes(), Bytes::from_static(b"body"));
    }

    #[tokio::test]
    async fn over_the_cap_while_streaming_is_sent_whole_and_not_replayed() {
        let (body, replay) = ReplayBody::with_handle(chunks(&[b"aaaa", b"bbbb", b"cccc"]), 6, None);
        let sent = body.collect().await.unwrap().to_bytes();
        assert_eq!(&sent[..], b"aaaabbbbcccc");
        assert_eq!(replay.check(0, false), Err(NotReplayable::TooLarge));
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
            ReplayBody::with_handle(Full::new(Bytes::from(vec![7u8; 100])), 99, None);
        assert!(matches!(replay, Replay::Never));
        assert_eq!(body.size_hint().exact(), Some(100));
        assert_eq!(body.collect().await.unwrap().to_bytes().len(), 100);
    }

    #[tokio::test]
    async fn empty_body_needs_no_buffer() {
        let (body, replay) =
            ReplayBody::with_handle(http_body_util::Empty::<Bytes>::new(), 10, None);
        assert!(matches!(replay, Replay::Empty));
        assert!(body.is_end_stream());
        let again = replay.body(1);
        assert!(again.is_end_stream());
        assert_eq!(again.size_hint().exact(), Some(0));
    }

    #[tokio::test]
    async fn an_unread_dropped_body_is_resumed_from_the_original() {
        let (body, replay) = ReplayBody::with_handle(chunks(&[b"ab", b"cd"]), 1024, None);
        drop(body); // e.g. the connection was refused before anything was written
        assert_eq!(replay.check(0, false), Ok(()));
        let again = replay.body(1).collect().await.unwrap().to_bytes();
        assert_eq!(&again[..], b"abcd");
    }

    #[tokio::test]
    async fn a_partly_sent_body_is_replayed_then_continued() {
        let (mut body, replay) =
            ReplayBody::with_handle(chunks(&[b"ab", b"cd", b"ef"]), 1024, None);
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"ab");
        // Still held by the transport: cannot replay yet.
        assert_eq!(replay.check(0, false), Err(NotReplayable::InFlight));
        // A response before the body was fully sent is never replayed.
        assert_eq!(replay.check(0, true), Err(NotReplayable::EarlyResponse));
        drop(body);
        assert_eq!(replay.check(0, false), Ok(()));
        let again = replay.body(1).collect().await.unwrap().to_bytes();
        assert_eq!(&again[..], b"abcdef");
        // And a third attempt sees the whole recording.
        assert_eq!(replay.check(1, true), Ok(()));
        let third = replay.body(2).collect().await.unwrap().to_bytes();
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
            None,
        );
        let err = body.collect().await.unwrap_err();
        assert_eq!(err.to_string(), "disk gone");
        assert!(replay.body_failed());
        assert_eq!(replay.check(0, false), Err(NotReplayable::BodyError));
    }

    /// A body of known length that never says it ended: the transport stops at the length
    /// and drops it, as hyper does over HTTP/1 with `Content-Length`.
    struct KnownLength(Vec<Bytes>, u64);

    impl Body for KnownLength {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.0.is_empty() {
                return Poll::Ready(None);
            }
            let chunk = self.0.remove(0);
            self.1 -= chunk.len() as u64;
            Poll::Ready(Some(Ok(Frame::data(chunk))))
        }
        fn size_hint(&self) -> SizeHint {
            SizeHint::with_exact(self.1)
        }
    }

    #[tokio::test]
    async fn a_known_length_body_dropped_after_its_last_byte_was_fully_sent() {
        let body = KnownLength(
            vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cd")],
            4,
        );
        let (mut first, replay) = ReplayBody::with_handle(body, 1024, None);
        first.frame().await.unwrap().unwrap();
        // Half of it: a response now would be early.
        assert_eq!(replay.check(0, true), Err(NotReplayable::EarlyResponse));
        first.frame().await.unwrap().unwrap();
        assert!(!first.is_end_stream(), "the original never says it ended");
        drop(first);
        assert_eq!(replay.check(0, true), Ok(()));
        let again = replay.body(1).collect().await.unwrap().to_bytes();
        assert_eq!(&again[..], b"abcd");
    }

    #[tokio::test]
    async fn replays_keep_the_exact_size_hint() {
        let (body, replay) =
            ReplayBody::with_handle(Full::new(Bytes::from_static(b"hello")), 64, None);
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
    async fn an_early_response_is_judged_for_the_attempt_that_got_it() {
        // "abc" then "def", with and without the request's `Content-Length`.
        for declared in [Some(6), None] {
            let (mut first, replay) =
                ReplayBody::with_handle(chunks(&[b"abc", b"def"]), 1024, declared);
            // Attempt 1 is read whole: a response to it was not early.
            assert_eq!(read_at_most(&mut first, usize::MAX).await, b"abcdef");
            drop(first);
            assert_eq!(replay.check(0, true), Ok(()));
            // Attempt 2 is cut short after 3 bytes, answered, and dropped: early.
            let mut second = replay.body(1);
            assert_eq!(read_at_most(&mut second, 3).await, b"abc");
            drop(second);
            assert_eq!(
                replay.check(1, true),
                Err(NotReplayable::EarlyResponse),
                "{declared:?}"
            );
            // An error instead of a response proves nothing either way: it may be sent again.
            assert_eq!(replay.check(1, false), Ok(()));
            // Attempt 3, read whole, gets its response in time.
            let mut third = replay.body(2);
            assert_eq!(read_at_most(&mut third, usize::MAX).await, b"abcdef");
            assert_eq!(replay.check(2, true), Ok(()));
            // A body made by `try_replay` is nobody's attempt: reading it whole vouches for
            // no attempt of the layer's.
            let extra = third.try_replay().unwrap();
            assert_eq!(&extra.collect().await.unwrap().to_bytes()[..], b"abcdef");
            assert_eq!(replay.check(3, true), Err(NotReplayable::EarlyResponse));
        }
    }

    #[tokio::test]
    async fn a_replay_stopped_at_its_length_or_told_it_ended_was_sent_whole() {
        // With the length known, a transport that stops at the last byte without polling
        // again has sent it all.
        let (first, replay) = ReplayBody::with_handle(chunks(&[b"ab", b"cd"]), 1024, Some(4));
        drop(first.collect().await.unwrap());
        let mut second = replay.body(1);
        assert_eq!(read_at_most(&mut second, 4).await, b"abcd");
        drop(second);
        assert_eq!(replay.check(1, true), Ok(()));
        // Without a length, `is_end_stream` saying so is what a transport stops at.
        let (first, replay) = ReplayBody::with_handle(chunks(&[b"ab"]), 1024, None);
        drop(first.collect().await.unwrap());
        let mut second = replay.body(1);
        assert_eq!(read_at_most(&mut second, 2).await, b"ab");
        assert!(second.is_end_stream());
        drop(second);
        assert_eq!(replay.check(1, true), Ok(()));
    }

    #[test]
    fn attempt_sets_hold_any_number() {
        let mut set = Attempts::default();
        for attempt in [0, 5, 63, 64, 130, 1_000] {
            assert!(!set.contains(attempt));
            set.insert(attempt);
            assert!(set.contains(attempt));
        }
        assert!(!set.contains(1) && !set.contains(65) && !set.contains(999));
    }
}
