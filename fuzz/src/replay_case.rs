//! What `ReplayBody` promises, checked on one scripted body.
//!
//! Shared by the `replay_body` fuzz target and by `tests/behaviour/proptest_parsers.rs` (which
//! includes this file by path). A [`ReplayCase`] describes a body (its data frames, its
//! trailers or an error, its size hint, when it is not ready) and what to do with it (the
//! cap, how many replays and from which body); [`check`] runs it without any runtime and
//! panics on the first broken promise:
//!
//! - the first pass yields exactly the original frames, whatever the cap;
//! - nothing can be replayed before the body was read to its end (unless it is empty);
//! - afterwards a replay is possible exactly when the body ended without error within the
//!   cap, and every replay (of the first body or of another replay, read one after the
//!   other or in turns) yields exactly what the first pass sent, data frames and trailers;
//! - on every body, `is_end_stream()` never claims an end that is not there, and
//!   `size_hint()` always brackets the data still to come.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tower_http_retry::ReplayBody;

/// The size hint the scripted body reports. Always honest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hint {
    /// No bounds (lower 0, no upper).
    Unknown,
    /// The exact number of data bytes left.
    Exact,
    /// A lower bound: this value, or the total if that is smaller.
    Lower(u64),
    /// An upper bound this many bytes above what is left.
    Upper(u64),
}

/// One body and what to do with it.
#[derive(Debug, Clone)]
pub struct ReplayCase {
    /// The data frames, in order (empty ones included).
    pub chunks: Vec<Bytes>,
    /// Trailers after the data, if any (not sent when the body fails).
    pub trailers: Option<HeaderMap>,
    /// The body fails after this many data frames (at most all of them).
    pub fail_after: Option<usize>,
    /// The replay cap given to `ReplayBody::new`.
    pub cap: usize,
    /// The size hint the body reports.
    pub hint: Hint,
    /// Before its n-th frame, the body answers `Pending` this many times.
    pub stalls: Vec<u8>,
    /// One entry per replay: made from the first body (`None`) or from the replay at this
    /// index, if it is an earlier one (else from the first body).
    pub replays: Vec<Option<usize>>,
    /// Read the replays in turns, one frame each, instead of one after the other.
    pub interleave: bool,
}

/// The error of the scripted body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed;

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the scripted body failed")
    }
}

impl std::error::Error for Failed {}

/// One frame as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A data frame.
    Data(Bytes),
    /// The trailers frame.
    Trailers(HeaderMap),
    /// The body's error.
    Error,
}

#[derive(Debug)]
enum Item {
    Data(Bytes),
    Trailers(HeaderMap),
    Fail,
}

/// A body that plays a script, stalling (and waking itself) where told.
#[derive(Debug)]
pub struct Script {
    items: VecDeque<Item>,
    stalls: VecDeque<u8>,
    stall: u8,
    hint: Hint,
    total: u64,
    sent: u64,
}

impl Script {
    fn new(case: &ReplayCase) -> Self {
        let mut items: VecDeque<Item> = VecDeque::new();
        let data = match case.fail_after {
            Some(n) => &case.chunks[..n.min(case.chunks.len())],
            None => &case.chunks[..],
        };
        items.extend(data.iter().cloned().map(Item::Data));
        match (case.fail_after, &case.trailers) {
            (Some(_), _) => items.push_back(Item::Fail),
            (None, Some(trailers)) => items.push_back(Item::Trailers(trailers.clone())),
            (None, None) => {}
        }
        let mut stalls: VecDeque<u8> = case.stalls.iter().copied().collect();
        let stall = stalls.pop_front().unwrap_or(0);
        Self {
            items,
            stalls,
            stall,
            hint: case.hint,
            total: case.chunks.iter().map(|c| c.len() as u64).sum(),
            sent: 0,
        }
    }

    /// What the body yields, in order.
    fn expected(&self) -> Vec<Seen> {
        self.items
            .iter()
            .map(|item| match item {
                Item::Data(data) => Seen::Data(data.clone()),
                Item::Trailers(trailers) => Seen::Trailers(trailers.clone()),
                Item::Fail => Seen::Error,
            })
            .collect()
    }
}

impl Body for Script {
    type Data = Bytes;
    type Error = Failed;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Failed>>> {
        let this = self.get_mut();
        if this.items.is_empty() {
            return Poll::Ready(None);
        }
        if this.stall > 0 {
            this.stall -= 1;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        this.stall = this.stalls.pop_front().unwrap_or(0);
        Poll::Ready(this.items.pop_front().map(|item| match item {
            Item::Data(data) => {
                this.sent += data.len() as u64;
                Ok(Frame::data(data))
            }
            Item::Trailers(trailers) => Ok(Frame::trailers(trailers)),
            Item::Fail => Err(Failed),
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.items.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        let left = self.total - self.sent;
        let mut hint = SizeHint::new();
        match self.hint {
            Hint::Unknown => {}
            Hint::Exact => hint.set_exact(left),
            Hint::Lower(lower) => hint.set_lower(lower.min(self.total).saturating_sub(self.sent)),
            Hint::Upper(extra) => hint.set_upper(left.saturating_add(extra)),
        }
        hint
    }
}

/// Reads one body frame by frame, checking `is_end_stream` and `size_hint` before each.
struct Reader {
    name: String,
    body: ReplayBody<Script>,
    seen: Vec<Seen>,
    data: u64,
    done: bool,
    /// Polls left before the body is declared stuck.
    polls: usize,
    /// The data bytes this body will yield in all, when its size hint must bracket them.
    total: Option<u64>,
}

impl Reader {
    fn new(name: String, body: ReplayBody<Script>, polls: usize, total: Option<u64>) -> Self {
        Self {
            name,
            body,
            seen: Vec::new(),
            data: 0,
            done: false,
            polls,
            total,
        }
    }

    /// Reads one frame (or the end).
    fn step(&mut self) {
        let name = &self.name;
        let end = self.body.is_end_stream();
        let hint = self.body.size_hint();
        if let Some(total) = self.total {
            let left = total - self.data;
            assert!(
                hint.lower() <= left && hint.upper().is_none_or(|upper| left <= upper),
                "{name}: size hint {hint:?} with {left} bytes left"
            );
        }
        let mut cx = Context::from_waker(Waker::noop());
        let frame = loop {
            assert!(
                self.polls > 0,
                "{name}: still pending after every stall was spent"
            );
            self.polls -= 1;
            if let Poll::Ready(frame) = Pin::new(&mut self.body).poll_frame(&mut cx) {
                break frame;
            }
        };
        if end {
            assert!(
                frame.is_none(),
                "{name}: is_end_stream() said the end, then a frame came"
            );
        }
        match frame {
            None => self.done = true,
            Some(Err(Failed)) => self.seen.push(Seen::Error),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    self.data += data.len() as u64;
                    self.seen.push(Seen::Data(data));
                }
                Err(frame) => match frame.into_trailers() {
                    Ok(trailers) => self.seen.push(Seen::Trailers(trailers)),
                    Err(_) => panic!("{name}: a frame that is neither data nor trailers"),
                },
            },
        }
        assert!(
            self.seen.len() <= 1 << 16,
            "{name}: far more frames than the body has"
        );
    }

    fn read_to_end(&mut self) {
        while !self.done {
            self.step();
        }
    }
}

/// Runs `case` and panics on the first broken promise.
pub fn check(case: &ReplayCase) {
    let script = Script::new(case);
    let expected = script.expected();
    let failing = expected.last() == Some(&Seen::Error);
    let total: u64 = expected
        .iter()
        .map(|seen| match seen {
            Seen::Data(data) => data.len() as u64,
            _ => 0,
        })
        .sum();
    let polls = case.stalls.iter().map(|&s| usize::from(s)).sum::<usize>() + expected.len() + 8;
    let sized = (!failing).then_some(total);

    let first = ReplayBody::new(script, case.cap);
    assert_eq!(
        first.try_replay().is_some(),
        expected.is_empty(),
        "before the first pass only an empty body can be replayed: {case:?}"
    );
    let mut first = Reader::new("first pass".into(), first, polls, sized);
    first.read_to_end();
    assert_eq!(
        first.seen, expected,
        "the first pass must send the original body unchanged: {case:?}"
    );

    let replayable = !failing && total <= case.cap as u64;
    let replay = first.body.try_replay();
    assert_eq!(
        replay.is_some(),
        replayable,
        "replayable exactly when it ended without error within the cap: {case:?}"
    );
    if !replayable {
        return;
    }
    let replay = replay.expect("checked above");

    let mut bodies: Vec<ReplayBody<Script>> = vec![replay];
    for from in &case.replays {
        let source = match from {
            Some(i) if *i < bodies.len() => &bodies[*i],
            _ => &first.body,
        };
        let body = source
            .try_replay()
            .expect("a replay of a replayable body is possible");
        bodies.push(body);
    }
    let mut readers: Vec<Reader> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, body)| Reader::new(format!("replay {i}"), body, expected.len() + 8, Some(total)))
        .collect();
    if case.interleave {
        while readers.iter().any(|reader| !reader.done) {
            for reader in readers.iter_mut().filter(|reader| !reader.done) {
                reader.step();
            }
        }
    } else {
        readers.iter_mut().for_each(Reader::read_to_end);
    }
    for reader in &readers {
        assert_eq!(
            reader.seen, first.seen,
            "{} must send exactly what the first pass sent: {case:?}",
            reader.name
        );
        // A finished replay can itself be replayed.
        let again = reader.body.try_replay();
        assert!(
            again.is_some(),
            "{}: a finished replay must be replayable",
            reader.name
        );
    }
}
