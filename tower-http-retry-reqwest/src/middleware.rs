// The retry loop as a reqwest-middleware `Middleware` (feature `middleware`).
//
// reqwest-middleware's `Next` may be run more than once, one run after the other, so a
// middleware can drive a retry loop; but the `reqwest::Request` it hands over can be
// cloned only when its body is a buffer (`try_clone` gives `None` for a stream), and
// nothing in it knows backoff, budgets, idempotency keys or `Retry-After`. So
// [`RetryMiddleware`] does not loop itself: it turns the request into an
// `http::Request`, runs this crate's [`Retry`](tower_http_retry::Retry) service over a small
// `Service` that calls `Next` once per attempt, and turns the answer back. Every decision
// (classification, keys, replay of streaming bodies, budget, deadline, `Retry-After`,
// [`RetryInfo`](tower_http_retry::RetryInfo)) is the layer's own, made once, in one loop.
//
// The resumable mode (`RetryMiddleware<Resume>`, native only) has its own service under the
// layer: see resume.rs.
//
// On wasm32 (reqwest's `fetch` client) the futures are not `Send`, reqwest-middleware's
// trait is `?Send`, a request body is a buffer (handed to the layer as a `Full<Bytes>`, and
// to `fetch` whole), and reqwest's response has no extensions: the record goes into the
// middleware's extensions instead.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Extensions;
use reqwest_middleware::{Middleware, Next};
use tower::{BoxError, Layer};
use tower_http_retry::{
    AttemptTimedOut, DeadlineExceeded, ReplayBody, Retry, RetryLayer, RetryPolicy,
};
use tower_service::Service;

use super::ReqwestService;

#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
mod resume;

/// The request body the layer is handed: reqwest's own natively, a buffer on wasm32.
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
type Sent = ::reqwest::Body;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
type Sent = crate::RequestBody;

/// A boxed future, `Send` except on wasm32, where reqwest-middleware declares its trait
/// `?Send` (the browser's futures are not `Send`).
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
type Boxed<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// A reqwest-middleware [`Middleware`] that runs a [`RetryLayer`]'s retry loop.
///
/// Middlewares added before it see one logical request; those added after it (and the
/// client) see every attempt. It sends each attempt down the chain with a copy of the
/// extensions it was given, and hands the last attempt's back, so a middleware below never
/// sees what an earlier attempt left there.
///
/// - A [`RetryPolicy`] in the middleware extensions (`RequestBuilder::with_extension`)
///   is laid over the policy of the route the request matched (the layer's, where no
///   route matched), for that request alone, as one in the request's own extensions is:
///   it changes what it sets and keeps the rest (`RetryPolicy::never()` sends the
///   request once).
/// - The response carries the [`RetryInfo`](tower_http_retry::RetryInfo) in its extensions, and its
///   final URL.
/// - Errors come back as the chain below returned them (a `reqwest::Error` as
///   `reqwest_middleware::Error::Reqwest`, a middleware's error as it raised it); the
///   layer's own ([`DeadlineExceeded`], [`AttemptTimedOut`],
///   [`ServiceNotReady`](tower_http_retry::ServiceNotReady)) as `reqwest_middleware::Error::Middleware`. The classifier sees the error a middleware
///   below raised, not its `anyhow` wrapper: an `io::Error` of kind `ConnectionReset` from
///   a middleware is retried like one from the transport.
/// - Request bodies are handed down as streams (replayed by the layer), so
///   `Request::try_clone` gives `None` below this middleware: another retrying middleware
///   below it (reqwest-retry) refuses them. One retry loop per call path is the point.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tower_http_retry_reqwest::RetryMiddleware;
/// use tower_http_retry::{Backoff, RetryInfo, RetryLayer, RetryPolicy};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower::BoxError> {
/// # // A server on 127.0.0.1 that answers 503 once, then 200.
/// # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
/// # let addr = listener.local_addr()?;
/// # let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
/// # tokio::spawn(async move {
/// #     while let Ok((stream, _)) = listener.accept().await {
/// #         let calls = calls.clone();
/// #         let service = hyper::service::service_fn(move |_req| {
/// #             let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
/// #             let status = if n == 0 { 503 } else { 200 };
/// #             let body = http_body_util::Full::new(bytes::Bytes::from("hello"));
/// #             async move { http::Response::builder().status(status).body(body) }
/// #         });
/// #         let io = hyper_util::rt::TokioIo::new(stream);
/// #         tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
/// #     }
/// # });
/// let layer = RetryLayer::new().policy(
///     RetryPolicy::new()
///         .backoff(Backoff::exponential(Duration::from_millis(10), Duration::from_secs(1)))
///         .deadline(Duration::from_secs(10)),
/// );
/// # let client = reqwest::Client::builder().no_proxy().build()?; // the server is on 127.0.0.1
/// # /*
/// let client = reqwest::Client::new();
/// # */
/// let client = reqwest_middleware::ClientBuilder::new(client)
///     .with(RetryMiddleware::new(layer))
///     .build();
///
/// let response = client.get(format!("http://{addr}/greeting")).send().await?;
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.extensions().get::<RetryInfo>().unwrap().attempts(), 2); // 503, then 200
/// assert_eq!(response.text().await?, "hello");
/// # Ok(())
/// # }
/// ```
///
/// # Clone
///
/// The layer's policies are resolved once, when the layer first makes a service: every
/// request, and every clone of the middleware, uses them, and shares the layer's budget, as
/// the clones of one service made by the layer do.
///
/// # On wasm32
///
/// Over reqwest's `fetch` client (wasm32-unknown-unknown, in a browser or Node) it runs the
/// same loop, with these differences: reqwest's response there has no extensions, so the
/// [`RetryInfo`](tower_http_retry::RetryInfo) goes into the middleware extensions, which the
/// caller reads with `ClientWithMiddleware::execute_with_extensions` (also when the request
/// failed); a request body is a buffer, sent again whole (a multipart form, which is not
/// one, is sent once down the chain, without the layer); and there is no `resume`.
///
/// # Resumable bodies
///
/// [`resume`](RetryMiddleware::resume) (not on wasm32) makes it a `RetryMiddleware<`[`Resume`](tower_http_retry::Resume)`>`, whose
/// responses' bodies are continued when they break, as
/// [`RetryLayer::resume`](tower_http_retry::RetryLayer::resume) describes: `bytes()`,
/// `chunk()` and `bytes_stream()` go on across a cut connection.
pub struct RetryMiddleware<M = ()> {
    layer: RetryLayer<M>,
    /// Sends the continuations of a resumable middleware's bodies.
    client: Option<ReqwestService>,
}

impl<M> Clone for RetryMiddleware<M> {
    fn clone(&self) -> Self {
        Self {
            layer: self.layer.clone(),
            client: self.client.clone(),
        }
    }
}

impl<M> fmt::Debug for RetryMiddleware<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryMiddleware")
            .field("layer", &self.layer)
            .field("resume", &self.client.is_some())
            .finish()
    }
}

impl RetryMiddleware {
    /// Runs `layer`'s retry loop around the rest of the middleware chain. For bodies
    /// continued when they break, add [`resume`](RetryMiddleware::resume).
    pub fn new(layer: RetryLayer) -> Self {
        Self {
            layer,
            client: None,
        }
    }

    /// This middleware, with response bodies continued when they break: a GET's body that
    /// fails or stalls after its head arrived is asked for again from the next byte
    /// (`Range` and `If-Range`), and the answer's bytes are used only if they provably
    /// continue the same representation, as
    /// [`RetryLayer::resume`](tower_http_retry::RetryLayer::resume) describes (the
    /// policies' `resume`, `max_continuations` and `body_idle_timeout` choose, per route and
    /// per request). The response stays a `reqwest::Response`: `bytes()`, `chunk()`,
    /// `bytes_stream()` go on across a cut, with a
    /// [`ResumeInfo`](tower_http_retry::ResumeInfo) in its extensions; a body that could
    /// not be continued fails with a `reqwest::Error` whose source chain holds the
    /// layer's [`RetryError`](tower_http_retry::RetryError) ([`Error::from`](crate::Error)
    /// finds its record: `info().stop()` says why).
    ///
    /// `client`, the client under the middleware chain, sends the continuations. They are
    /// sent while the body is read, after this middleware has returned, and reqwest-middleware
    /// lends the rest of its chain to a middleware only while it runs: so the
    /// continuations go straight to `client`, past the middlewares added after this one.
    /// They carry the request's head as this middleware saw it (the headers of the
    /// middlewares added before it, with `Range` and `If-Range`): a middleware that must
    /// see or sign every request on the wire belongs before it. The head's retries go down
    /// the chain, as without `resume`.
    ///
    /// Encodings: a resumable request asks for `Accept-Encoding: identity` unless the
    /// caller set one. A reqwest with `gzip` (or `brotli`, `zstd`, `deflate`) decompresses
    /// what it knows and removes `Content-Encoding` and `Content-Length`, so the layer
    /// counts decoded bytes; a continuation answered with a 206 that has neither field is
    /// not used (the body ends with a `RetryError`, `StopReason::RangeMismatch`), never
    /// spliced. Leave `Accept-Encoding` unset on resumable downloads, or turn reqwest's
    /// decompression off for them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::{ResumeInfo, RetryLayer, RetryPolicy};
    /// use tower_http_retry_reqwest::RetryMiddleware;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower::BoxError> {
    /// # let addr = serve_cut_once().await;
    /// # let reqwest_client = reqwest::Client::builder().no_proxy().build()?; // the server is on 127.0.0.1
    /// # /*
    /// let reqwest_client = reqwest::Client::new();
    /// # */
    /// let layer = RetryLayer::new().policy(RetryPolicy::new().max_continuations(10));
    /// let client = reqwest_middleware::ClientBuilder::new(reqwest_client.clone())
    ///     .with(RetryMiddleware::new(layer).resume(reqwest_client))
    ///     .build();
    ///
    /// // The server cuts the first answer's connection after 6 of its 11 bytes.
    /// let response = client.get(format!("http://{addr}/file")).send().await?;
    /// let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
    /// assert_eq!(response.bytes().await?, "hello world");
    /// assert_eq!(info.continuations().len(), 1); // `Range: bytes=6-`
    /// # Ok(())
    /// # }
    /// # // A server on 127.0.0.1 that sends "hello " of "hello world" and closes the
    /// # // connection, then answers `Range: bytes=6-` with a 206.
    /// # async fn serve_cut_once() -> std::net::SocketAddr {
    /// #     use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// #     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    /// #     let addr = listener.local_addr().unwrap();
    /// #     tokio::spawn(async move {
    /// #         while let Ok((mut stream, _)) = listener.accept().await {
    /// #             let mut head = Vec::new();
    /// #             while !head.ends_with(b"\r\n\r\n") {
    /// #                 let mut byte = [0u8];
    /// #                 if stream.read(&mut byte).await.unwrap_or(0) == 0 { break; }
    /// #                 head.push(byte[0]);
    /// #             }
    /// #             let ranged = String::from_utf8_lossy(&head).to_ascii_lowercase().contains("range: bytes=6-");
    /// #             let answer: &[u8] = match ranged {
    /// #                 false => b"HTTP/1.1 200 OK\r\netag: \"v1\"\r\ncontent-length: 11\r\n\r\nhello ",
    /// #                 true => b"HTTP/1.1 206 Partial Content\r\netag: \"v1\"\r\ncontent-range: bytes 6-10/11\r\ncontent-length: 5\r\n\r\nworld",
    /// #             };
    /// #             let _ = stream.write_all(answer).await;
    /// #             // Closed here: the first body is cut short.
    /// #         }
    /// #     });
    /// #     addr
    /// # }
    /// ```
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    pub fn resume(self, client: ::reqwest::Client) -> RetryMiddleware<tower_http_retry::Resume> {
        RetryMiddleware {
            layer: self.layer.resume(),
            client: Some(ReqwestService::new(client)),
        }
    }
}

impl<M> RetryMiddleware<M> {
    /// The layer.
    pub fn get_ref(&self) -> &RetryLayer<M> {
        &self.layer
    }
}

impl RetryMiddleware {
    async fn run<'a>(
        &'a self,
        request: ::reqwest::Request,
        extensions: &'a mut Extensions,
        next: Next<'a>,
    ) -> reqwest_middleware::Result<::reqwest::Response> {
        let url = request.url().clone();
        let timeout = request.timeout().copied();
        // A multipart form on wasm32 has no buffer to send again: once, past the layer.
        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        if request.body().is_some_and(|body| body.as_bytes().is_none()) {
            return next.run(request, extensions).await;
        }
        let mut request = to_http(request)?;
        if let Some(policy) = extensions.get::<RetryPolicy>() {
            request.extensions_mut().insert(policy.clone());
        }
        let last = Mutex::new(None);
        let chain = Chain {
            next,
            extensions: extensions.clone(),
            last: &last,
            url: &url,
            timeout,
        };
        let mut service: Retry<Chain<'_>> = Layer::layer(&self.layer, chain);
        // The chain is always ready: `poll_ready` only asks it. Called without `oneshot`,
        // whose state machine would move the request and the response future again.
        let result = match std::future::poll_fn(|cx| service.poll_ready(cx)).await {
            Ok(()) => service.call(request).await,
            Err(error) => Err(error),
        };
        if let Some(last) = last.into_inner().unwrap_or_else(PoisonError::into_inner) {
            *extensions = last;
        }
        // reqwest's wasm response has no extensions: the record goes to the middleware's.
        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        {
            let info = match &result {
                Ok(response) => response.extensions().get::<tower_http_retry::RetryInfo>(),
                Err(error) => error
                    .downcast_ref::<tower_http_retry::RetryError>()
                    .map(tower_http_retry::RetryError::info),
            };
            if let Some(info) = info {
                extensions.insert(info.clone());
            }
        }
        match result {
            Ok(response) => Ok(uncarry(response)),
            Err(error) => Err(from_box(error)),
        }
    }
}

impl From<RetryLayer> for RetryMiddleware {
    fn from(layer: RetryLayer) -> Self {
        Self::new(layer)
    }
}

/// The future of `Middleware::handle`, as `async_trait` makes it.
type Handled<'a> = Boxed<'a, reqwest_middleware::Result<::reqwest::Response>>;

/// `Middleware` for each mode, written out as `async_trait` expands it, to need no macro
/// crate of our own: the one body calls the mode's `run`.
macro_rules! middleware {
    ($($mode:ty),*) => {$(
        impl Middleware for $mode {
            fn handle<'life0, 'life1, 'life2, 'async_trait>(
                &'life0 self,
                req: ::reqwest::Request,
                extensions: &'life1 mut Extensions,
                next: Next<'life2>,
            ) -> Handled<'async_trait>
            where
                'life0: 'async_trait,
                'life1: 'async_trait,
                'life2: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(self.run(req, extensions, next))
            }
        }
    )*};
}

middleware!(RetryMiddleware);
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
middleware!(RetryMiddleware<tower_http_retry::Resume>);

/// reqwest's request as an `http::Request`, its parts moved over one by one (reqwest's own
/// conversion goes through `http::request::Builder`, which moves them more). What reqwest
/// keeps in a request's extensions, its timeout, is carried by the chain beside it.
fn to_http(mut request: ::reqwest::Request) -> Result<http::Request<Sent>, ::reqwest::Error> {
    let Ok(uri) = http::Uri::try_from(request.url().as_str()) else {
        // A URL that is no URI: reqwest's conversion, for its error.
        #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
        return http::Request::try_from(request);
        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        return http::Request::try_from(request).map(|request| request.map(|_| Sent::default()));
    };
    let body = request.body_mut().take();
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    let body = body.unwrap_or_else(|| ::reqwest::Body::from(bytes::Bytes::new()));
    // Checked by the caller: a wasm32 body here is a buffer.
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    let body = body
        .and_then(|body| body.as_bytes().map(bytes::Bytes::copy_from_slice))
        .map(Sent::new)
        .unwrap_or_default();
    let mut converted = http::Request::new(body);
    *converted.method_mut() = std::mem::take(request.method_mut());
    *converted.uri_mut() = uri;
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    {
        *converted.version_mut() = request.version();
    }
    *converted.headers_mut() = std::mem::take(request.headers_mut());
    Ok(converted)
}

/// The rest of the middleware chain as the service the layer wraps: one `Next::run` per
/// call.
#[derive(Clone)]
struct Chain<'a> {
    next: Next<'a>,
    /// The extensions the middleware was given; every attempt starts from a copy.
    extensions: Extensions,
    /// The last attempt's extensions, for the caller (a local of the middleware's call,
    /// which outlives every attempt).
    last: &'a Mutex<Option<Extensions>>,
    /// The request's URL as reqwest parsed it, for every attempt: the layer never changes
    /// a request's URI (its hooks write headers), and parsing the URI again would cost more
    /// than the rest of an attempt's conversions.
    url: &'a ::reqwest::Url,
    /// The request's own timeout (`RequestBuilder::timeout`), the one setting reqwest
    /// keeps in a request's extensions.
    timeout: Option<Duration>,
}

/// The attempt as a `reqwest::Request`, with the URL reqwest parsed and the request's own
/// timeout.
fn to_reqwest(
    url: &::reqwest::Url,
    timeout: Option<Duration>,
    request: http::Request<::reqwest::Body>,
) -> ::reqwest::Request {
    let (parts, body) = request.into_parts();
    let mut attempt = ::reqwest::Request::new(parts.method, url.clone());
    *attempt.headers_mut() = parts.headers;
    *attempt.body_mut() = Some(body);
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    {
        *attempt.version_mut() = parts.version;
    }
    *attempt.timeout_mut() = timeout;
    attempt
}

/// An attempt down the chain.
type Attempt<'a> = Boxed<'a, Result<http::Response<Carried>, BoxError>>;

impl<'a> Service<http::Request<ReplayBody<Sent>>> for Chain<'a> {
    type Response = http::Response<Carried>;
    type Error = BoxError;
    type Future = Attempt<'a>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<ReplayBody<Sent>>) -> Self::Future {
        let (url, timeout) = (self.url, self.timeout);
        #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
        let request = to_reqwest(
            url,
            timeout,
            request.map(|body| ::reqwest::Body::wrap(crate::native::SyncBody::new(body))),
        );
        let next = self.next.clone();
        let mut extensions = self.extensions.clone();
        let last = self.last;
        Box::pin(async move {
            // `fetch` takes the body whole: collected from the layer's replay buffer.
            #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
            let request = {
                use http_body_util::BodyExt;
                let (parts, body) = request.into_parts();
                let body = body.collect().await?.to_bytes();
                let body = ::reqwest::Body::from(body);
                to_reqwest(url, timeout, http::Request::from_parts(parts, body))
            };
            let result = next.run(request, &mut extensions).await;
            *last.lock().unwrap_or_else(PoisonError::into_inner) = Some(extensions);
            match result {
                Ok(response) => Ok(carry(response)),
                // Unwrapped and recognised, so the classifier takes reqwest's own reading.
                Err(reqwest_middleware::Error::Reqwest(error)) => {
                    Err(super::recognized(error).into())
                }
                Err(error) => Err(FromBelow(error).into()),
            }
        })
    }
}

/// reqwest's response, carried through the layer whole: the layer reads the status, the
/// headers and the extensions from the `http::Response` around it, and never its body.
/// Converting to an `http::Response<reqwest::Body>` and back would box the body twice
/// (each hop's `Body::wrap`, polled through both on every read), copy the final URL and
/// add an extension for it.
struct Carried(::reqwest::Response);

/// The head moved out of reqwest's response (nothing is copied), the response kept whole.
fn carry(mut response: ::reqwest::Response) -> http::Response<Carried> {
    let mut head = http::Response::new(());
    *head.status_mut() = response.status();
    *head.headers_mut() = std::mem::take(response.headers_mut());
    // reqwest's wasm response has neither.
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    {
        *head.version_mut() = response.version();
        *head.extensions_mut() = std::mem::take(response.extensions_mut());
    }
    head.map(|()| Carried(response))
}

/// reqwest's response with its head back, and what the layer added to it (the
/// `RetryInfo`).
fn uncarry(response: http::Response<Carried>) -> ::reqwest::Response {
    let (head, Carried(mut response)) = response.into_parts();
    *response.headers_mut() = head.headers;
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    {
        *response.extensions_mut() = head.extensions;
    }
    response
}

/// What the layer returned, as reqwest-middleware carries errors.
fn from_box(error: BoxError) -> reqwest_middleware::Error {
    // The record has no place in reqwest-middleware's error: the last error goes back as
    // it was raised.
    let error = match error.downcast::<tower_http_retry::RetryError>() {
        Ok(error) => error.into_source(),
        Err(error) => error,
    };
    let error = match error.downcast::<::reqwest::Error>() {
        Ok(error) => return reqwest_middleware::Error::Reqwest(*error),
        Err(error) => error,
    };
    let error = match error.downcast::<FromBelow>() {
        Ok(error) => return error.0,
        Err(error) => error,
    };
    let error = match error.downcast::<DeadlineExceeded>() {
        Ok(error) => return reqwest_middleware::Error::middleware(*error),
        Err(error) => error,
    };
    match error.downcast::<AttemptTimedOut>() {
        Ok(error) => reqwest_middleware::Error::middleware(*error),
        Err(error) => reqwest_middleware::Error::middleware(Passed(error)),
    }
}

/// A middleware's error from below, kept whole so that it comes back to the caller
/// unchanged. Its source is the error the middleware raised (not the `anyhow` wrapper,
/// which hides it from a walk down the chain), so the classifier sees that error.
#[derive(Debug)]
struct FromBelow(reqwest_middleware::Error);

impl fmt::Display for FromBelow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a middleware below the retry middleware failed")
    }
}

impl StdError for FromBelow {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.0 {
            reqwest_middleware::Error::Middleware(error) => Some(&**error),
            reqwest_middleware::Error::Reqwest(error) => Some(error),
        }
    }
}

/// Any other error the layer returned, carried as a middleware error; its source is that
/// error, so `anyhow::Error::chain` finds it.
#[derive(Debug)]
struct Passed(BoxError);

impl fmt::Display for Passed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl StdError for Passed {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.0)
    }
}
