//! Resumable response bodies: a 64 MiB download from an in-process hyper server on
//! 127.0.0.1, over HTTP/1 and over HTTP/2, by a bare hyper-util client, under the layer
//! without resumption and under the layer with it; and the same download cut five times on
//! the way, continued by the layer.
//!
//! The server serves one representation of 64 MiB (a strong ETag, `Content-Length`,
//! `Range: bytes=N-` honoured when `If-Range` carries the ETag, 416 past the end), from one
//! buffer in memory, in 64 KiB frames (slices of the buffer: nothing copied on the server's
//! side). Its bytes are 8-byte little-endian words, word `k` a function of `k` alone, so
//! every byte says where it belongs and a body spliced at a wrong offset shows. It counts
//! the requests that carry a `Range`, and the body bytes it hands to its connections.
//!
//! The two servers (HTTP/1, and prior-knowledge cleartext HTTP/2) run on a thread and a
//! current-thread tokio runtime of their own, as another process would; the client runs on
//! a current-thread runtime driven from the bench thread (`block_on`), so that the client's
//! side of a download is that thread's alone and its CPU time can be read
//! (`CLOCK_THREAD_CPUTIME_ID`). Each download gets a fresh client, so a connection of its
//! own: with clients kept for the whole run, their long-lived connections kept biases of
//! their own (one HTTP/2 connection read the same 64 MiB with 0.64 of another's CPU time,
//! round after round), which rotating the order cannot average out. A download is timed from
//! the call to its body's last frame. Each frame is checked where it lands (its first and
//! last byte and the first whole word in it against what they must be: a few comparisons a
//! frame, nothing buffered); each case's first download, untimed and not counted, compares
//! every byte with the source.
//!
//! (a) No fault:
//!
//! | case | client |
//! | --- | --- |
//! | `bare` | the hyper-util legacy client alone |
//! | `layer` | `RetryLayer::new()` over it (the body passes through as `Incoming`) |
//! | `resume` | `RetryLayer::new().resume()` over it (the body is a `ResumeBody`, resumable) |
//! | `resume_idle` | the same with `body_idle_timeout(30 s)` (a timer re-armed on every frame) |
//!
//! downloaded in interleaved rounds (each case once a round, the order rotating); printed:
//! each case's median throughput, frames, CPU time (the client's thread, and the whole
//! process), and its throughput and client CPU time against bare's as the medians of the
//! per-round ratios (with the quartiles of those ratios).
//!
//! (b) Five cuts a download: the cut proxy the tests use (`tests/common/cut_proxy.rs`,
//! included here as it is; it runs on a thread of its own) in front of the server, closing
//! each connection (an orderly close: the client reads what it was given, then the end of
//! the stream early) after a seeded number of the server's bytes between 10.75 and
//! 12.75 MiB. Five connections bring at most 63.75 MiB and a sixth at least what is left,
//! so every download is cut exactly five times, whatever the seed, and continued five
//! times. The policy: no gates (a continuation is paid from the budget otherwise, and this
//! bench makes one every few milliseconds), a backoff of zero (the default, exponential from
//! 100 ms with full jitter, would wait 3.1 s in all over five continuations on average: a
//! wait the policy chooses, not a cost of the machinery), at most 10 continuations. Cases,
//! in the same interleaved rounds:
//!
//! | case | what |
//! | --- | --- |
//! | `bare` | as in (a), straight to the server: the reference the issue names |
//! | `bare_proxied` | the bare client through a proxy that cuts nothing |
//! | `resume_proxied` | the resumable client through a proxy that cuts nothing |
//! | `resume_5_cuts` | the resumable client through the cutting proxy |
//!
//! printed: the median time of each; the sum of its five longest pauses between frames (at
//! a cut, from the last byte of one connection to the first of the next); the body bytes
//! the server handed to its connections (at a cut, what sat in the socket buffers between
//! it and the proxy is sent again); the process's CPU time; the medians of the per-round
//! ratios of the cut download's time to bare's clean time, to the proxied clean resumable
//! download's, and of the proxied bare download's to bare's (the proxy's own cost). The
//! continuations are counted twice (the layer's record, `ResumeInfo`, and the server's
//! count of requests with a `Range`) and checked to be 5 on every download, the proxy's
//! cuts 5 a download, and each continuation's first frame to start at the byte its range
//! asked for. The pause at each cut is printed too, and its part until the continuation
//! reached the server.
//!
//! Memory: a global allocator counts the bytes live on the heap (all threads: server,
//! proxy and client) and their peak; each download resets the peak to what was live at its
//! start, and its growth is printed per case (median and largest). The bench fails if a
//! resumable download's peak ever grows by 8 MiB or more (an eighth of the body): the
//! machinery hands chunks through, it does not hold the body.
//!
//! Run: `cargo bench --bench resume` (under a minute on a quiet machine, up to two on a
//! loaded one: 80 rounds of (a), 20 of (b); `RESUME_ROUNDS` sets the rounds of (a), at most
//! 1000, and (b) runs a quarter as many). A download that takes over 30 s fails the bench.
//! `RESUME_PROFILE=<h1|h2>/<case of (a)>` runs only that case's download,
//! `RESUME_PROFILE_N` times (1 by default), for callgrind.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, Uri, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tower::{Layer, Service, ServiceExt};
use tower_http_retry::{Backoff, ResumeInfo, RetryLayer, RetryPolicy};

#[path = "support/mod.rs"]
mod support;
use support::{extra_runs, median};
#[allow(dead_code)]
#[path = "../tests/common/cut_proxy.rs"]
mod cut_proxy;
use cut_proxy::{CutMode, CutPlan, CutProxy};

/// The body's length.
const SIZE: usize = 64 << 20;
/// The server's frames.
const FRAME: usize = 64 << 10;
/// The strong ETag of the one representation.
const ETAG: &str = "\"resume-bench-64m\"";
/// A server stops accepting after this many connections (a full run opens about 520 to
/// each; [`MAX_ROUNDS`] rounds about 6 300).
const MAX_CONNECTIONS: usize = 10_000;
/// At most this many rounds of (a), whatever `RESUME_ROUNDS` says.
const MAX_ROUNDS: usize = 1000;
/// A download that takes longer fails the bench (one takes 25 to 250 ms here).
const DOWNLOAD_LIMIT: Duration = Duration::from_secs(30);
/// Rounds of (a), unless `RESUME_ROUNDS` says otherwise; (b) runs a quarter as many.
const ROUNDS: usize = 80;
/// Where a cut connection is cut: 10.75 to 12.75 MiB of the server's bytes.
const CUT_FROM: u64 = (43 << 20) / 4;
const CUT_TO: u64 = (51 << 20) / 4;
/// Cuts a download, by construction of `CUT_FROM..CUT_TO`.
const CUTS: usize = 5;
/// A resumable download whose heap grows by this much has held its body.
const PEAK_LIMIT: usize = SIZE / 8;

// ---------------------------------------------------------------------------------------
// Heap in use, and its peak.

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let live = LIVE.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(live, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the arguments it was given; the counting
// is two atomics, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        grew(new_size);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller upholds `GlobalAlloc::realloc`'s contract, which `System` shares.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation is).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Starts a peak: returns the bytes live now.
fn peak_from_now() -> usize {
    let live = LIVE.load(Ordering::Relaxed);
    PEAK.store(live, Ordering::Relaxed);
    live
}

// ---------------------------------------------------------------------------------------
// The content, and the server.

/// Word `k` of the content: `k` alone decides it.
fn word(k: usize) -> [u8; 8] {
    ((k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0x0123_4567_89AB_CDEF).to_le_bytes()
}

fn content() -> Bytes {
    (0..SIZE / 8).flat_map(word).collect::<Vec<u8>>().into()
}

/// The byte at `offset`.
fn byte_at(offset: usize) -> u8 {
    word(offset / 8)[offset % 8]
}

/// A few comparisons: `data`, at `offset`, is where it belongs (its first and last byte,
/// and its first whole word).
fn spot_check(offset: usize, data: &[u8]) {
    let Some(&last) = data.last() else { return };
    assert_eq!(data[0], byte_at(offset), "the byte at {offset}");
    assert_eq!(
        last,
        byte_at(offset + data.len() - 1),
        "a frame's last byte"
    );
    let first = offset.next_multiple_of(8);
    if first + 8 <= offset + data.len() {
        let at = first - offset;
        assert_eq!(data[at..at + 8], word(first / 8), "the word at {first}");
    }
}

/// The body of one answer: `rest` in frames of [`FRAME`] bytes, each a slice of the
/// content.
struct Frames {
    rest: Bytes,
    /// The server's count of bytes its bodies gave their connections.
    sent: Arc<AtomicU64>,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.rest.is_empty() {
            return Poll::Ready(None);
        }
        let n = self.rest.len().min(FRAME);
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
        Poll::Ready(Some(Ok(Frame::data(self.rest.split_to(n)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.rest.len() as u64)
    }
}

/// `N` of `Range: bytes=N-`, honoured only under an `If-Range` with the ETag.
fn range_start(request: &Request<Incoming>) -> Option<usize> {
    let range = request.headers().get(header::RANGE)?.to_str().ok()?;
    let if_range = request.headers().get(header::IF_RANGE)?;
    if if_range != ETAG {
        return None;
    }
    range
        .strip_prefix("bytes=")?
        .strip_suffix('-')?
        .parse()
        .ok()
}

fn answer(
    content: &Bytes,
    sent: &Arc<AtomicU64>,
    starts: &Mutex<Vec<(usize, Instant)>>,
    request: &Request<Incoming>,
) -> Response<Frames> {
    let start = range_start(request);
    if let Some(from) = start {
        starts
            .lock()
            .expect("not poisoned")
            .push((from, Instant::now()));
    }
    let (status, from) = match start {
        Some(from) if from >= SIZE => {
            let mut response = Response::new(Frames {
                rest: Bytes::new(),
                sent: Arc::clone(sent),
            });
            *response.status_mut() = StatusCode::RANGE_NOT_SATISFIABLE;
            let range = format!("bytes */{SIZE}");
            response.headers_mut().insert(
                header::CONTENT_RANGE,
                HeaderValue::try_from(range).expect("a header value"),
            );
            return response;
        }
        Some(from) => (StatusCode::PARTIAL_CONTENT, from),
        None => (StatusCode::OK, 0),
    };
    let mut response = Response::new(Frames {
        rest: content.slice(from..),
        sent: Arc::clone(sent),
    });
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::ETAG, HeaderValue::from_static(ETAG));
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(SIZE - from));
    if status == StatusCode::PARTIAL_CONTENT {
        let range = format!("bytes {from}-{}/{SIZE}", SIZE - 1);
        headers.insert(
            header::CONTENT_RANGE,
            HeaderValue::try_from(range).expect("a header value"),
        );
    }
    response
}

/// The protocol between a client and its server.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Proto {
    /// HTTP/1.1.
    H1,
    /// Prior-knowledge cleartext HTTP/2.
    H2,
}

impl Proto {
    fn name(self) -> &'static str {
        match self {
            Proto::H1 => "HTTP/1",
            Proto::H2 => "HTTP/2",
        }
    }
}

/// A running server.
struct Server {
    addr: SocketAddr,
    /// Requests that carried a `Range`.
    ranges: Arc<AtomicU64>,
    /// Body bytes handed to the connections.
    sent: Arc<AtomicU64>,
    /// Where each honoured range started and when its request arrived, until a download
    /// takes them.
    starts: Arc<Mutex<Vec<(usize, Instant)>>>,
}

/// Starts the two servers (HTTP/1, HTTP/2) on a thread and a runtime of their own, as
/// another process would be: the client's side of a download is then the bench thread's
/// alone.
fn start_servers(content: &Bytes) -> [Server; 2] {
    let (started, servers) = std::sync::mpsc::channel();
    let content = content.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        runtime.block_on(async move {
            let h1 = serve(Proto::H1, content.clone()).await;
            let h2 = serve(Proto::H2, content).await;
            started.send([h1, h2]).expect("the bench waits");
            // Serves until the process ends.
            std::future::pending::<()>().await;
        });
    });
    servers.recv().expect("the servers started")
}

/// Starts a server speaking `proto` on 127.0.0.1 on the current runtime.
async fn serve(proto: Proto, content: Bytes) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let addr = listener.local_addr().expect("local address");
    let ranges = Arc::new(AtomicU64::new(0));
    let sent = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&ranges);
    let sent_by_all = Arc::clone(&sent);
    let starts = Arc::new(Mutex::new(Vec::new()));
    let starts_of_all = Arc::clone(&starts);
    tokio::spawn(async move {
        for _ in 0..MAX_CONNECTIONS {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let _ = stream.set_nodelay(true);
            let content = content.clone();
            let counted = Arc::clone(&counted);
            let sent = Arc::clone(&sent_by_all);
            let starts = Arc::clone(&starts_of_all);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    if request.headers().contains_key(header::RANGE) {
                        counted.fetch_add(1, Ordering::Relaxed);
                    }
                    let response = answer(&content, &sent, &starts, &request);
                    async move { Ok::<_, Infallible>(response) }
                });
                let io = TokioIo::new(stream);
                let _ = match proto {
                    Proto::H1 => {
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await
                    }
                    Proto::H2 => {
                        hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, service)
                            .await
                    }
                };
            });
        }
    });
    Server {
        addr,
        ranges,
        sent,
        starts,
    }
}

// ---------------------------------------------------------------------------------------
// Clients and downloads.

/// A hyper-util legacy client, `TCP_NODELAY`; over HTTP/2 prior-knowledge cleartext, one
/// connection. Must be called inside the runtime.
fn client<B>(proto: Proto) -> Client<HttpConnector, B>
where
    B: Body + Send,
    B::Data: Send,
{
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .http2_only(proto == Proto::H2)
        .build(connector)
}

/// How a download's bytes are checked.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Each frame where it lands ([`spot_check`]), while timed.
    Spot,
    /// Every byte against the content.
    Full,
}

/// What one download did.
struct Got {
    secs: f64,
    /// Continuations in the layer's record (`None`: the response is not resumable).
    continuations: Option<usize>,
    /// The waits before them.
    waited: Duration,
    /// Requests with a `Range` the server received.
    ranges: u64,
    /// Body bytes the server handed to its connections (at a cut, what the proxy never
    /// forwarded is in it).
    sent: u64,
    /// How much the heap grew at most, over what was live at the start.
    peak: usize,
    /// Data frames the client read.
    frames: usize,
    /// The longest pauses between two frames (or between the head and the first), in
    /// seconds, longest first: at a cut, the time from the last byte of one connection to
    /// the first of its continuation.
    pauses: [f64; CUTS],
    /// The pause before each continuation's first frame, in seconds: from the last frame
    /// of the connection that was cut to the first of the next, and the part of it until
    /// the continuation's request reached the server.
    cut_pauses: Vec<(f64, f64)>,
    /// CPU time of the client's thread over the download.
    cpu: f64,
    /// CPU time of the whole process (client, server, proxy) over the download.
    cpu_all: f64,
}

/// A CPU-time clock, in seconds.
fn cpu_clock(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid `timespec` for the call to write.
    let rc = unsafe { libc::clock_gettime(clock, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// The CPU time of the calling thread (the client's: its runtime is driven from it).
fn thread_cpu() -> f64 {
    cpu_clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The CPU time of the whole process (client, server, proxy).
fn process_cpu() -> f64 {
    cpu_clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// Downloads the content through `svc`, checks it, and times it.
async fn download<S, RB>(svc: S, server: &Server, url: &Uri, check: Check, content: &Bytes) -> Got
where
    S: Service<Request<Empty<Bytes>>, Response = Response<RB>>,
    S::Error: std::fmt::Debug,
    RB: Body<Data = Bytes> + Unpin,
    RB::Error: std::fmt::Debug,
{
    let ranges = server.ranges.load(Ordering::Relaxed);
    let sent = server.sent.load(Ordering::Relaxed);
    let request = Request::get(url.clone())
        .body(Empty::new())
        .expect("a valid request");
    // Where each frame started, when the one before it came, and when it came (an HTTP/2
    // download reads 4096 frames), allocated before the peak starts.
    let mut gaps: Vec<(usize, Instant, Instant)> = Vec::with_capacity(2 * SIZE / (16 << 10));
    let (cpu, cpu_all) = (thread_cpu(), process_cpu());
    let base = peak_from_now();
    let start = Instant::now();
    let response = svc.oneshot(request).await.expect("an answer");
    assert_eq!(response.status(), StatusCode::OK);
    let info = response.extensions().get::<ResumeInfo>().cloned();
    let mut body = response.into_body();
    let mut at = 0;
    let mut frames = 0;
    let mut pauses = [0.0; CUTS];
    let mut last = Instant::now();
    while let Some(frame) = body.frame().await {
        let now = Instant::now();
        let pause = (now - last).as_secs_f64();
        gaps.push((at, last, now));
        last = now;
        if pause > pauses[CUTS - 1] {
            pauses[CUTS - 1] = pause;
            pauses.sort_by(|a, b| b.total_cmp(a));
        }
        let frame = frame.expect("the body, whole");
        let Ok(data) = frame.into_data() else {
            continue;
        };
        frames += 1;
        match check {
            Check::Spot => spot_check(at, &data),
            Check::Full => assert!(
                content.get(at..at + data.len()) == Some(&data[..]),
                "the bytes at {at}"
            ),
        }
        at += data.len();
    }
    let secs = start.elapsed().as_secs_f64();
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let (cpu, cpu_all) = (thread_cpu() - cpu, process_cpu() - cpu_all);
    assert_eq!(at, SIZE, "the whole body");
    let records = info.map(|info| info.continuations());
    let starts = std::mem::take(&mut *server.starts.lock().expect("not poisoned"));
    // The first frame after each continuation reached the server is the continuation's
    // first, and it starts at the byte its range asked for: nothing had twice, nothing
    // skipped.
    let cut_pauses = starts
        .iter()
        .map(|(start, asked)| {
            let gap = gaps.iter().find(|(_, _, came)| came >= asked);
            let (at, before, first) = gap.expect("a frame after the continuation");
            assert_eq!(at, start, "a continuation's first frame");
            let asked = asked.saturating_duration_since(*before);
            ((*first - *before).as_secs_f64(), asked.as_secs_f64())
        })
        .collect();
    Got {
        secs,
        continuations: records.as_ref().map(Vec::len),
        waited: records.iter().flatten().map(|r| r.wait).sum(),
        ranges: server.ranges.load(Ordering::Relaxed) - ranges,
        sent: server.sent.load(Ordering::Relaxed) - sent,
        peak,
        frames,
        pauses,
        cut_pauses,
        cpu,
        cpu_all,
    }
}

/// One client under test: a download through it.
struct Case<'a> {
    name: &'static str,
    download: Box<dyn Fn(Check) -> Got + 'a>,
}

/// A case whose client `make` gives, for each download (a clone of one client, or a
/// fresh one).
fn case<'a, S, RB>(
    name: &'static str,
    runtime: &'a Runtime,
    server: &'a Server,
    url: Uri,
    content: &'a Bytes,
    make: impl Fn() -> S + 'a,
) -> Case<'a>
where
    S: Service<Request<Empty<Bytes>>, Response = Response<RB>> + 'a,
    S::Error: std::fmt::Debug,
    RB: Body<Data = Bytes> + Unpin,
    RB::Error: std::fmt::Debug,
{
    Case {
        name,
        download: Box::new(move |check| {
            let svc = {
                let _guard = runtime.enter();
                make()
            };
            let download = download(svc, server, &url, check, content);
            let limited = async { tokio::time::timeout(DOWNLOAD_LIMIT, download).await };
            runtime
                .block_on(limited)
                .expect("a download within the limit")
        }),
    }
}

/// Each case's downloads, in round order.
struct Runs {
    names: Vec<&'static str>,
    got: Vec<Vec<Got>>,
}

impl Runs {
    fn of(&self, i: usize, field: fn(&Got) -> f64) -> Vec<f64> {
        self.got[i].iter().map(field).collect()
    }

    fn secs(&self, i: usize) -> Vec<f64> {
        self.of(i, |g| g.secs)
    }

    /// The median, first and third quartiles over the rounds of `f(a's, b's)`, of the
    /// `field` of the downloads.
    fn per_round(
        &self,
        a: usize,
        b: usize,
        field: fn(&Got) -> f64,
        f: impl Fn(f64, f64) -> f64,
    ) -> [f64; 3] {
        let (a, b) = (self.of(a, field), self.of(b, field));
        let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| f(*x, y)).collect();
        quartiles(&mut r)
    }

    /// The median and the largest heap growth of case `i`'s downloads, in KiB.
    fn peaks(&self, i: usize) -> (f64, f64) {
        let mut kib = self.of(i, |g| g.peak as f64 / 1024.0);
        (median(&mut kib), kib.iter().copied().fold(0.0, f64::max))
    }
}

fn quartiles(values: &mut [f64]) -> [f64; 3] {
    let m = median(values);
    let n = values.len();
    let (lower, upper) = values.split_at_mut(n / 2);
    let upper = if n % 2 == 1 { &mut upper[1..] } else { upper };
    let q1 = if lower.is_empty() { m } else { median(lower) };
    let q3 = if upper.is_empty() { m } else { median(upper) };
    [m, q1, q3]
}

/// One full check of each case (untimed, not counted), then `rounds` rounds of one
/// download per case, the order rotating.
fn interleaved(cases: &[Case<'_>], rounds: usize) -> Runs {
    for case in cases {
        let got = (case.download)(Check::Full);
        println!(
            "  {:<16} checked whole: {:.1} ms, heap +{} KiB",
            case.name,
            got.secs * 1e3,
            got.peak / 1024
        );
    }
    let n = cases.len();
    let mut got: Vec<Vec<Got>> = (0..n).map(|_| Vec::with_capacity(rounds)).collect();
    for round in 0..rounds {
        for k in 0..n {
            let i = (round + k) % n;
            got[i].push((cases[i].download)(Check::Spot));
        }
    }
    Runs {
        names: cases.iter().map(|c| c.name).collect(),
        got,
    }
}

const MIB: f64 = (1 << 20) as f64;

/// The cases of (a), each download through a fresh client (a connection of its own).
fn clean_cases<'a>(
    runtime: &'a Runtime,
    proto: Proto,
    server: &'a Server,
    content: &'a Bytes,
) -> Vec<Case<'a>> {
    let url: Uri = format!("http://{}/file", server.addr)
        .parse()
        .expect("a URI");
    let layer = RetryLayer::new();
    let resume = RetryLayer::new().resume();
    let resume_idle = RetryLayer::new()
        .policy(RetryPolicy::new().body_idle_timeout(Duration::from_secs(30)))
        .resume();
    vec![
        case("bare", runtime, server, url.clone(), content, move || {
            client::<Empty<Bytes>>(proto)
        }),
        case("layer", runtime, server, url.clone(), content, move || {
            layer.layer(client(proto))
        }),
        case("resume", runtime, server, url.clone(), content, move || {
            resume.layer(client(proto))
        }),
        case("resume_idle", runtime, server, url, content, move || {
            resume_idle.layer(client(proto))
        }),
    ]
}

/// What (a) prints in the summary, for `layer`, `resume` and `resume_idle`: throughput /
/// bare and the client's CPU time / bare, medians of the per-round ratios and their quartiles.
struct Clean {
    throughput: Vec<[f64; 3]>,
    cpu: Vec<[f64; 3]>,
}

/// (a): the clean download through each client.
fn clean(
    runtime: &Runtime,
    proto: Proto,
    server: &Server,
    content: &Bytes,
    rounds: usize,
) -> Clean {
    let cases = clean_cases(runtime, proto, server, content);
    println!("(a) {}, no fault, {rounds} rounds:", proto.name());
    let runs = interleaved(&cases, rounds);
    let mut clean = Clean {
        throughput: Vec::new(),
        cpu: Vec::new(),
    };
    for (i, name) in runs.names.iter().enumerate() {
        let mbps = SIZE as f64 / MIB / median(&mut runs.secs(i));
        let cpu = median(&mut runs.of(i, |g| g.cpu)) * 1e3;
        let cpu_all = median(&mut runs.of(i, |g| g.cpu_all)) * 1e3;
        let frames = median(&mut runs.of(i, |g| g.frames as f64));
        let (peak, most) = runs.peaks(i);
        let mut line = format!(
            "  {name:<16} {mbps:>6.0} MiB/s, {frames:.0} frames, CPU client {cpu:>5.1} ms, all {cpu_all:>5.1} ms, heap +{peak:.0} KiB (at most +{most:.0})"
        );
        if i > 0 {
            let t = runs.per_round(i, 0, |g| g.secs, |x, bare| bare / x);
            let c = runs.per_round(i, 0, |g| g.cpu, |x, bare| x / bare);
            line += &format!(
                "; / bare: throughput {:.3} ({:.3}-{:.3}), client CPU {:.3} ({:.3}-{:.3})",
                t[0], t[1], t[2], c[0], c[1], c[2]
            );
            clean.throughput.push(t);
            clean.cpu.push(c);
        }
        println!("{line}");
        for got in &runs.got[i] {
            if got.continuations.is_some() {
                assert_eq!(got.continuations, Some(0), "a clean download continued");
                assert!(got.peak < PEAK_LIMIT, "a resumable download held its body");
            }
            assert_eq!(got.ranges, 0);
        }
    }
    clean
}

/// What (b) prints in the summary.
struct Cuts {
    /// Median times, ms: bare, bare proxied, resume proxied, resume with 5 cuts.
    ms: [f64; 4],
    /// Cut time / bare's clean time; / the proxied clean resumable download's; the
    /// proxied bare download's / bare's.
    to_bare: [f64; 3],
    to_proxied: [f64; 3],
    proxy: [f64; 3],
    /// Median sum of the five longest pauses of a cut download and of a proxied clean
    /// resumable one, ms.
    pauses: [f64; 2],
    /// The median and the longest pause at a cut, ms.
    cut_pause: (f64, f64),
    /// Median body bytes the server sent for a cut download, MiB.
    sent: f64,
    /// Median and largest heap growth of a cut download, KiB.
    peak: (f64, f64),
}

/// (b): five cuts a download.
fn cut(runtime: &Runtime, proto: Proto, server: &Server, content: &Bytes, rounds: usize) -> Cuts {
    let direct: Uri = format!("http://{}/file", server.addr)
        .parse()
        .expect("a URI");
    let clean_proxy = CutProxy::start(server.addr, CutPlan::never());
    let cutting = CutProxy::start(
        server.addr,
        CutPlan {
            seed: 39,
            fraction: 1.0,
            min_offset: CUT_FROM,
            max_offset: CUT_TO,
            mode: CutMode::Close,
            upstream_recv_buffer: None,
        },
    );
    let clean_url: Uri = clean_proxy.url("/file").parse().expect("a URI");
    let cut_url: Uri = cutting.url("/file").parse().expect("a URI");
    let policy = RetryPolicy::new()
        .no_gates()
        .backoff(Backoff::exponential(Duration::ZERO, Duration::ZERO))
        .max_continuations(10);
    let resumable = RetryLayer::new().policy(policy).resume();
    let cases = [
        case("bare", runtime, server, direct, content, || {
            client::<Empty<Bytes>>(proto)
        }),
        case(
            "bare_proxied",
            runtime,
            server,
            clean_url.clone(),
            content,
            || client::<Empty<Bytes>>(proto),
        ),
        case(
            "resume_proxied",
            runtime,
            server,
            clean_url,
            content,
            || resumable.layer(client(proto)),
        ),
        case("resume_5_cuts", runtime, server, cut_url, content, || {
            resumable.layer(client(proto))
        }),
    ];
    println!(
        "(b) {}, {CUTS} cuts a download, {rounds} rounds:",
        proto.name()
    );
    let runs = interleaved(&cases, rounds);
    let mut ms = [0.0; 4];
    for (i, name) in runs.names.iter().enumerate() {
        ms[i] = median(&mut runs.secs(i)) * 1e3;
        let (peak, most) = runs.peaks(i);
        let pauses = median(&mut runs.of(i, |g| g.pauses.iter().sum::<f64>())) * 1e3;
        let sent = median(&mut runs.of(i, |g| g.sent as f64)) / MIB;
        let cpu_all = median(&mut runs.of(i, |g| g.cpu_all)) * 1e3;
        println!(
            "  {name:<16} {:>7.1} ms, its {CUTS} longest pauses {pauses:.1} ms, server sent {sent:.1} MiB, CPU all {cpu_all:.1} ms, heap +{peak:.0} KiB (at most +{most:.0})",
            ms[i]
        );
    }
    let cut_case = 3;
    for got in &runs.got[cut_case] {
        assert_eq!(
            got.continuations,
            Some(CUTS),
            "continuations of a cut download"
        );
        assert_eq!(got.ranges, CUTS as u64, "ranges the server was asked for");
        assert!(got.peak < PEAK_LIMIT, "a resumable download held its body");
    }
    // Every download through the cutting proxy (and its full check) was cut five times.
    let downloads = rounds + 1;
    assert_eq!(cutting.cuts().len(), CUTS * downloads, "the proxy's cuts");
    assert!(clean_proxy.cuts().is_empty());
    let waited: Duration = runs.got[cut_case].iter().map(|g| g.waited).sum();
    let to_bare = runs.per_round(cut_case, 0, |g| g.secs, |cut, bare| cut / bare);
    let to_proxied = runs.per_round(cut_case, 2, |g| g.secs, |cut, clean| cut / clean);
    let proxy = runs.per_round(1, 0, |g| g.secs, |proxied, bare| proxied / bare);
    println!(
        "  5 cuts / bare {}, / resume_proxied {}; bare_proxied / bare {}; {CUTS} continuations \
         and {CUTS} ranges asked every download, {} cuts by the proxy, waits {:.1} ms in all",
        ratio(to_bare),
        ratio(to_proxied),
        ratio(proxy),
        cutting.cuts().len(),
        waited.as_secs_f64() * 1e3,
    );
    let pauses_of = |part: fn(&(f64, f64)) -> f64| -> Vec<f64> {
        let got = runs.got[cut_case].iter();
        got.flat_map(|g| g.cut_pauses.iter().map(part))
            .map(|p| p * 1e3)
            .collect()
    };
    let mut cut_pauses = pauses_of(|p| p.0);
    let mut asked = pauses_of(|p| p.1);
    let cut_pause = (
        median(&mut cut_pauses),
        cut_pauses.iter().copied().fold(0.0, f64::max),
    );
    println!(
        "  the pause at a cut (the last frame of one connection to the first of the next): \
         median {:.2} ms, at most {:.2} ms, over {} cuts; of it until the continuation \
         reached the server: median {:.2} ms",
        cut_pause.0,
        cut_pause.1,
        cut_pauses.len(),
        median(&mut asked),
    );
    let pauses = |i| median(&mut runs.of(i, |g| g.pauses.iter().sum::<f64>())) * 1e3;
    Cuts {
        ms,
        to_bare,
        to_proxied,
        proxy,
        pauses: [pauses(cut_case), pauses(2)],
        cut_pause,
        sent: median(&mut runs.of(cut_case, |g| g.sent as f64)) / MIB,
        peak: runs.peaks(cut_case),
    }
}

/// A median and its quartiles, `m (q1-q3)`.
fn ratio(r: [f64; 3]) -> String {
    format!("{:.3} ({:.3}-{:.3})", r[0], r[1], r[2])
}

/// `RESUME_PROFILE=<h1|h2>/<case of (a)>`: only that case's download,
/// `RESUME_PROFILE_N` times (1 by default), for callgrind.
fn profile(runtime: &Runtime, content: &Bytes, which: &str) {
    let (proto, name) = match which.split_once('/') {
        Some(("h1", name)) => (Proto::H1, name),
        Some(("h2", name)) => (Proto::H2, name),
        _ => panic!("RESUME_PROFILE=<h1|h2>/<case>, not {which}"),
    };
    let n: usize = std::env::var("RESUME_PROFILE_N")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    let [h1, h2] = start_servers(content);
    let server = if proto == Proto::H1 { h1 } else { h2 };
    let cases = clean_cases(runtime, proto, &server, content);
    let case = cases
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no case {name}"));
    for _ in 0..n {
        (case.download)(Check::Spot);
    }
    println!("{which}: {n} downloads");
}

fn main() {
    let full = std::env::var("RESUME_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS)
        .min(MAX_ROUNDS);
    let rounds = extra_runs(full);
    if rounds == 0 {
        return;
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let content = content();
    if let Ok(which) = std::env::var("RESUME_PROFILE") {
        profile(&runtime, &content, &which);
        return;
    }
    let cut_rounds = rounds.div_ceil(4);
    let protos = [Proto::H1, Proto::H2];
    let servers = start_servers(&content);
    let mut cleans = Vec::new();
    let mut cuts = Vec::new();
    for (proto, server) in protos.iter().zip(&servers) {
        cleans.push(clean(&runtime, *proto, server, &content, rounds));
        cuts.push(cut(&runtime, *proto, server, &content, cut_rounds));
    }
    println!();
    println!("summary (a), / bare, medians of the per-round ratios (quartiles):");
    println!(
        "  {:<16} {:>20} {:>20} {:>20}",
        "", "layer", "resume", "resume_idle"
    );
    for (proto, clean) in protos.iter().zip(&cleans) {
        for (what, ratios) in [
            ("throughput", &clean.throughput),
            ("client CPU", &clean.cpu),
        ] {
            print!("  {:<16}", format!("{} {what}", proto.name()));
            for r in ratios {
                print!(" {:>20}", ratio(*r));
            }
            println!();
        }
    }
    println!();
    println!(
        "summary (b), {CUTS} cuts a download: median ms; medians of the per-round ratios \
         (quartiles); the {CUTS} longest pauses, cut and clean (ms); the pause at a cut, median \
         (largest), ms; MiB the server sent; heap:"
    );
    println!(
        "  {:<8} {:>6} {:>12} {:>14} {:>13} {:>20} {:>20} {:>20} {:>11} {:>11} {:>7} {:>13}",
        "",
        "bare",
        "bare_proxied",
        "resume_proxied",
        "resume_5_cuts",
        "5 cuts / bare",
        "5 cuts / proxied",
        "proxied / bare",
        "pauses",
        "at a cut",
        "sent",
        "KiB (max)"
    );
    for (proto, c) in protos.iter().zip(&cuts) {
        println!(
            "  {:<8} {:>6.1} {:>12.1} {:>14.1} {:>13.1} {:>20} {:>20} {:>20} {:>11} {:>11} {:>7.1} {:>13}",
            proto.name(),
            c.ms[0],
            c.ms[1],
            c.ms[2],
            c.ms[3],
            ratio(c.to_bare),
            ratio(c.to_proxied),
            ratio(c.proxy),
            format!("{:.1}, {:.1}", c.pauses[0], c.pauses[1]),
            format!("{:.2} ({:.1})", c.cut_pause.0, c.cut_pause.1),
            c.sent,
            format!("{:.0} ({:.0})", c.peak.0, c.peak.1),
        );
    }
}
