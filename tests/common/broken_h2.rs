//! Real h2 and hyper errors of an HTTP/2 connection that failed with an I/O error: a
//! client connection whose reads fail once the request's HEADERS are out. Included by path
//! in the unit tests of the core's classifier and of the gRPC crate.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A client connection whose reads fail with `error` once the client has written a
/// request's `HEADERS` frame (before that they wait); every write is taken.
struct CutAfterHeaders {
    error: Option<io::Error>,
    written: Vec<u8>,
    reader: Option<Waker>,
}

impl CutAfterHeaders {
    fn new(error: io::Error) -> Self {
        Self {
            error: Some(error),
            written: Vec::new(),
            reader: None,
        }
    }

    /// Whether a `HEADERS` frame follows the client's 24-byte preface.
    fn headers_sent(&self) -> bool {
        let mut at = 24;
        while let Some(header) = self.written.get(at..at + 9) {
            if header[3] == 0x1 {
                return true;
            }
            let len = (usize::from(header[0]) << 16)
                | (usize::from(header[1]) << 8)
                | usize::from(header[2]);
            at += 9 + len;
        }
        false
    }
}

impl tokio::io::AsyncRead for CutAfterHeaders {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        _: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.headers_sent() {
            self.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        // The error once, then the end of the stream.
        Poll::Ready(self.error.take().map_or(Ok(()), Err))
    }
}

impl tokio::io::AsyncWrite for CutAfterHeaders {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.written.extend_from_slice(buf);
        if self.headers_sent() {
            if let Some(reader) = self.reader.take() {
                reader.wake();
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The error h2's client gives a GET whose connection fails with `error` once the
/// request is out (h2 makes its I/O errors only itself).
pub(crate) async fn h2_error(error: io::Error) -> h2::Error {
    let (client, connection) = h2::client::handshake(CutAfterHeaders::new(error))
        .await
        .unwrap();
    let mut client = client.ready().await.unwrap();
    let request = http::Request::get("http://h/").body(()).unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    let (_, response) = tokio::join!(connection, response);
    response.unwrap_err()
}

/// The error hyper's HTTP/2 client gives for the same.
pub(crate) async fn hyper_h2_error(error: io::Error) -> hyper::Error {
    let io = hyper_util::rt::TokioIo::new(CutAfterHeaders::new(error));
    let executor = hyper_util::rt::TokioExecutor::new();
    let (mut sender, connection) = hyper::client::conn::http2::handshake(executor, io)
        .await
        .unwrap();
    let body = http_body_util::Empty::<bytes::Bytes>::new();
    let request = http::Request::get("http://h/").body(body).unwrap();
    let (_, response) = tokio::join!(connection, sender.send_request(request));
    response.unwrap_err()
}
