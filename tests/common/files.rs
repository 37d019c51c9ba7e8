//! A file server for the resumable-body tests: one representation, served whole or by a
//! `Range` (with `If-Range` honoured), whose bodies are cut or stalled on a script. The
//! same answers in process (`FileServer` is a tower service) and over a real hyper HTTP/1
//! or HTTP/2 server on 127.0.0.1 (`serve_files`).
#![allow(clippy::disallowed_methods)] // tokio's paused clock and sleeps, or real time

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode, header};
use http_body::Frame;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

pub type FileBody = BoxBody<Bytes, io::Error>;

/// What one answer's body does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Sent whole.
    Whole,
    /// Fails (a connection reset) after this many bytes of this answer.
    After(usize),
    /// Sends this many bytes, then nothing, forever.
    Stall(usize),
    /// Sends this many bytes, then fails 50 ms later (so that a transport has sent them,
    /// and the head, before the failure: an HTTP/2 server resets the stream).
    Later(usize),
}

/// The file and how it is served.
#[derive(Debug, Clone)]
pub struct File {
    pub content: Bytes,
    pub etag: Option<&'static str>,
    pub last_modified: Option<&'static str>,
    pub date: Option<&'static str>,
    /// Range ignored: every answer is a 200 of the whole.
    pub ignore_range: bool,
    /// Each 206 carries at most this many bytes.
    pub short: Option<usize>,
    /// No Content-Length.
    pub chunked: bool,
    /// Each 206 starts this many bytes away from the range asked for (negative: before).
    pub shift: i64,
    /// The `Content-Encoding` of every answer (the bytes are served as they are).
    pub encoding: Option<&'static str>,
    /// A gzip representation (its bytes and its ETag), served, ranges counted in its bytes,
    /// to a request whose `Accept-Encoding` names gzip; `content` to any other.
    pub gzip: Option<(Bytes, &'static str)>,
}

impl File {
    /// `len` bytes (a repeating pattern, so that a splice shows), with a strong ETag.
    pub fn new(len: usize) -> Self {
        File {
            content: (0..len).map(|i| (i % 251) as u8).collect::<Vec<_>>().into(),
            etag: Some("\"v1\""),
            last_modified: None,
            date: None,
            ignore_range: false,
            short: None,
            chunked: false,
            shift: 0,
            encoding: None,
            gzip: None,
        }
    }
}

/// A file server whose answers follow a script of cuts, recording each request's head.
#[derive(Clone)]
pub struct FileServer {
    state: Arc<Mutex<State>>,
}

struct State {
    file: File,
    cuts: VecDeque<Cut>,
    seen: Vec<HeaderMap>,
    /// Swapped in after this many answers (a file replaced mid-download).
    replaced: Option<(usize, File)>,
}

impl FileServer {
    pub fn new(file: File, cuts: &[Cut]) -> Self {
        FileServer {
            state: Arc::new(Mutex::new(State {
                file,
                cuts: cuts.iter().copied().collect(),
                seen: Vec::new(),
                replaced: None,
            })),
        }
    }

    /// The file becomes `file` after `answers` answers.
    pub fn replace_after(self, answers: usize, file: File) -> Self {
        self.state.lock().unwrap().replaced = Some((answers, file));
        self
    }

    /// The request heads seen so far.
    pub fn seen(&self) -> Vec<HeaderMap> {
        self.state.lock().unwrap().seen.clone()
    }

    /// The `Range` of each request seen (`None` for none).
    pub fn ranges(&self) -> Vec<Option<String>> {
        self.seen()
            .iter()
            .map(|h| {
                h.get(header::RANGE)
                    .map(|v| v.to_str().unwrap().to_string())
            })
            .collect()
    }

    pub fn content(&self) -> Bytes {
        self.state.lock().unwrap().file.content.clone()
    }

    /// The answer to a request with these headers.
    pub fn answer(&self, headers: &HeaderMap) -> Response<FileBody> {
        let mut state = self.state.lock().unwrap();
        state.seen.push(headers.clone());
        if let Some((after, _)) = &state.replaced {
            if state.seen.len() > *after {
                let (_, file) = state.replaced.take().unwrap();
                state.file = file;
            }
        }
        let cut = state.cuts.pop_front().unwrap_or(Cut::Whole);
        let mut file = state.file.clone();
        drop(state);
        let gzip_asked = headers
            .get(header::ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("gzip"));
        if let (Some((bytes, etag)), true) = (file.gzip.take(), gzip_asked) {
            file.content = bytes;
            file.etag = Some(etag);
            file.encoding = Some("gzip");
        }
        let len = file.content.len() as u64;
        let mut range = headers
            .get(header::RANGE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes="))
            .and_then(|v| v.split_once('-'))
            .and_then(|(a, b)| Some((a.parse::<u64>().ok()?, b.parse::<u64>().ok())));
        if let Some(validator) = headers.get(header::IF_RANGE) {
            let current = file.etag.or(file.last_modified);
            if current.is_none_or(|c| c.as_bytes() != validator.as_bytes()) {
                range = None;
            }
        }
        if file.ignore_range {
            range = None;
        }
        let mut builder = Response::builder();
        for (name, value) in [
            (header::ETAG, file.etag),
            (header::LAST_MODIFIED, file.last_modified),
            (header::DATE, file.date),
            (header::CONTENT_ENCODING, file.encoding),
        ] {
            if let Some(value) = value {
                builder = builder.header(name, value);
            }
        }
        let (status, slice) = match range {
            None => (StatusCode::OK, file.content.clone()),
            Some((first, _)) if first >= len => {
                return builder
                    .status(StatusCode::RANGE_NOT_SATISFIABLE)
                    .header(header::CONTENT_RANGE, format!("bytes */{len}"))
                    .body(body(Bytes::new(), Cut::Whole))
                    .unwrap();
            }
            Some((first, last)) => {
                let first = first.saturating_add_signed(file.shift);
                let mut last = last.unwrap_or(len - 1).min(len - 1);
                if let Some(short) = file.short {
                    last = last.min(first + short as u64 - 1);
                }
                builder =
                    builder.header(header::CONTENT_RANGE, format!("bytes {first}-{last}/{len}"));
                (
                    StatusCode::PARTIAL_CONTENT,
                    file.content.slice(first as usize..=last as usize),
                )
            }
        };
        if !file.chunked {
            builder = builder.header(header::CONTENT_LENGTH, slice.len());
        }
        builder.status(status).body(body(slice, cut)).unwrap()
    }
}

/// The server as a tower service, in process.
impl<B> tower::Service<Request<B>> for FileServer {
    type Response = Response<FileBody>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Response<FileBody>, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        std::future::ready(Ok(self.answer(request.headers())))
    }
}

/// `data` in frames of 100 bytes, cut as `cut` says.
fn body(data: Bytes, cut: Cut) -> FileBody {
    let (sent, end) = match cut {
        Cut::Whole => (data.len(), None),
        Cut::After(n) | Cut::Later(n) => (n.min(data.len()), Some(true)),
        Cut::Stall(n) => (n.min(data.len()), Some(false)),
    };
    let mut frames: Vec<Result<Frame<Bytes>, io::Error>> = data
        .slice(..sent)
        .chunks(100)
        .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk))))
        .collect();
    if end == Some(true) && !matches!(cut, Cut::Later(_)) {
        frames.push(Err(io::ErrorKind::ConnectionReset.into()));
    }
    let frames = futures_util::stream::iter(frames);
    use futures_util::StreamExt;
    if let Cut::Later(_) = cut {
        let fail = futures_util::stream::once(async {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            Err(io::Error::from(io::ErrorKind::ConnectionReset))
        });
        return BodyExt::boxed(StreamBody::new(frames.chain(fail)));
    }
    match end {
        Some(false) => BodyExt::boxed(StreamBody::new(
            frames.chain(futures_util::stream::pending()),
        )),
        _ => BodyExt::boxed(StreamBody::new(frames)),
    }
}

/// A hyper HTTP/1 server on 127.0.0.1 answering with `files`; a cut body aborts its
/// connection.
pub struct Served {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Served {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `files` over HTTP/1.1, or prior-knowledge HTTP/2 (`h2`; a cut body resets its
/// stream: `RST_STREAM(INTERNAL_ERROR)`).
pub async fn serve_files(files: FileServer, h2: bool) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let files = files.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                    let response = files.answer(request.headers());
                    async move { Ok::<_, io::Error>(response) }
                });
                let io = TokioIo::new(stream);
                let _ = match h2 {
                    true => {
                        hyper::server::conn::http2::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        )
                        .serve_connection(io, service)
                        .await
                    }
                    false => {
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await
                    }
                };
            });
        }
    });
    Served { addr, task }
}
