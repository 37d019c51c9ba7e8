//! [`tower_http_retry`]'s retries for [reqwest], with your reqwest call sites as they are.
//! The rules are the core crate's: a POST is sent again only when its server never saw it
//! or it carries an `Idempotency-Key`; backoff with jitter, `Retry-After`, a retry budget,
//! a deadline, and a record of every attempt ([`RetryInfo`](tower_http_retry::RetryInfo))
//! in each response.
//!
//! # In place of reqwest-retry: `RetryMiddleware`
//!
//! With the `middleware` feature, [`RetryMiddleware`] is the layer as a reqwest-middleware
//! `Middleware`: add it where a reqwest-retry user adds `RetryTransientMiddleware`. The
//! requests, the responses and the errors (`reqwest_middleware::Error`, with its
//! `is_timeout()` and `status()`) stay what they were.
//!
#![cfg_attr(feature = "middleware", doc = "```")]
#![cfg_attr(not(feature = "middleware"), doc = "```ignore")]
//! use std::time::Duration;
//! use tower_http_retry::{Backoff, RetryInfo, RetryLayer, RetryPolicy};
//! use tower_http_retry_reqwest::RetryMiddleware;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower::BoxError> {
//! # let addr = serve_503_once().await;
//! // reqwest-retry's `build_with_max_retries(3)`: three retries, four attempts.
//! let policy = RetryPolicy::new()
//!     .max_attempts(4)
//!     .backoff(Backoff::exponential(Duration::from_millis(100), Duration::from_secs(10)));
//! # /*
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//! # */
//! # let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::builder().no_proxy().build()?)
//!     .with(RetryMiddleware::new(RetryLayer::new().policy(policy)))
//!     .build();
//!
//! let response = client.get(format!("http://{addr}/items/1")).send().await?;
//! assert_eq!(response.extensions().get::<RetryInfo>().unwrap().attempts(), 2); // 503, then 200
//! # assert_eq!(response.text().await?, "hello");
//! # Ok(())
//! # }
//! # // A server on 127.0.0.1 that answers 503 once, then 200.
//! # async fn serve_503_once() -> std::net::SocketAddr {
//! #     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! #     let addr = listener.local_addr().unwrap();
//! #     let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
//! #     tokio::spawn(async move {
//! #         while let Ok((stream, _)) = listener.accept().await {
//! #             let calls = calls.clone();
//! #             let service = hyper::service::service_fn(move |_req| {
//! #                 let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//! #                 let status = if n == 0 { 503 } else { 200 };
//! #                 let body = http_body_util::Full::new(bytes::Bytes::from("hello"));
//! #                 async move { http::Response::builder().status(status).body(body) }
//! #             });
//! #             let io = hyper_util::rt::TokioIo::new(stream);
//! #             tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
//! #         }
//! #     });
//! #     addr
//! # }
//! ```
//!
//! Middlewares added before it see one logical request, those after it every attempt. See
//! [`RetryMiddleware`] for what it does with extensions and errors.
//!
//! # Over a `reqwest::Client` as a tower service: `ReqwestService`
//!
//! Without reqwest-middleware, or in a tower stack (timeouts, a circuit breaker, a
//! concurrency limit), the layer wraps a [`ReqwestService`], and reqwest's request builders
//! go through it with [`RequestBuilderExt::send_with`]: `client.get(url).send()` becomes
//! `client.get(url).send_with(&service)`, and the answer is still a `reqwest::Response`.
//! Its error, an [`Error`], gives reqwest's own back in one call ([`Error::as_reqwest`]),
//! so a check such as `e.is_timeout()` keeps working:
//!
//! ```
//! use std::time::Duration;
//! use tower::ServiceBuilder;
//! use tower_http_retry::{RetryInfo, RetryLayer, RetryPolicy};
//! use tower_http_retry_reqwest::{ReqwestService, RequestBuilderExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_http_retry_reqwest::Error> {
//! # let addr = serve_503_once().await;
//! let client = reqwest::Client::builder()
//!     .timeout(Duration::from_secs(2)) // each attempt's limit
//! #   .no_proxy() // the server is on 127.0.0.1
//!     .build()?;
//! let service = ServiceBuilder::new()
//!     .layer(RetryLayer::new().policy(RetryPolicy::new().deadline(Duration::from_secs(10))))
//!     .service(ReqwestService::new(client.clone()));
//!
//! match client.get(format!("http://{addr}/items/1")).send_with(&service).await {
//!     Ok(response) => {
//!         let attempts = response.extensions().get::<RetryInfo>().unwrap().attempts();
//!         assert_eq!((attempts, response.text().await?.as_str()), (2, "hello"));
//!     }
//!     Err(e) if e.as_reqwest().is_some_and(|e| e.is_timeout()) => println!("timed out: {e}"),
//!     Err(e) => return Err(e),
//! }
//! # Ok(())
//! # }
//! # // A server on 127.0.0.1 that answers 503 once, then 200.
//! # async fn serve_503_once() -> std::net::SocketAddr {
//! #     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! #     let addr = listener.local_addr().unwrap();
//! #     let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
//! #     tokio::spawn(async move {
//! #         while let Ok((stream, _)) = listener.accept().await {
//! #             let calls = calls.clone();
//! #             let service = hyper::service::service_fn(move |_req| {
//! #                 let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//! #                 let status = if n == 0 { 503 } else { 200 };
//! #                 let body = http_body_util::Full::new(bytes::Bytes::from("hello"));
//! #                 async move { http::Response::builder().status(status).body(body) }
//! #             });
//! #             let io = hyper_util::rt::TokioIo::new(stream);
//! #             tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
//! #         }
//! #     });
//! #     addr
//! # }
//! ```
//!
//! The tower path is the lighter one: no conversions at a middleware boundary and no boxed
//! future per attempt. A caller that already builds `http::Request`s sends them with
//! `oneshot`, as [`ReqwestService`] shows.
//!
//! ```text
//! RetryLayer  ->  ReqwestService  ->  reqwest::Client (pool, DNS, TLS, redirects)
//! ```
//!
//! # Resumable downloads
//!
//! A layer made resumable ([`RetryLayer::resume`](tower_http_retry::RetryLayer::resume))
//! continues a GET's response body when it breaks, with `Range` from the next byte and
//! `If-Range`, and uses the answer only where it provably continues the same bytes. Over a
//! [`ReqwestService`] its body is a [`ResumeBody`](tower_http_retry::ResumeBody);
//! [`RequestBuilderExt::send_with`] puts it back in a `reqwest::Response`, whose
//! `bytes()`, `chunk()` and `bytes_stream()` go on across a cut (as do
//! those of a [`RetryMiddleware`] made resumable with `resume`):
//!
//! ```
//! use tower::Layer;
//! use tower_http_retry::{ResumeInfo, RetryLayer};
//! use tower_http_retry_reqwest::{ReqwestService, RequestBuilderExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_http_retry_reqwest::Error> {
//! # let addr = serve_cut_once().await;
//! # let client = reqwest::Client::builder().no_proxy().build()?; // the server is on 127.0.0.1
//! # /*
//! let client = reqwest::Client::new();
//! # */
//! let service = RetryLayer::new().resume().layer(ReqwestService::new(client.clone()));
//!
//! // The server cuts the first answer's connection after 6 of its 11 bytes.
//! let response = client.get(format!("http://{addr}/file")).send_with(&service).await?;
//! let info = response.extensions().get::<ResumeInfo>().cloned().unwrap();
//! assert_eq!(response.bytes().await?, "hello world");
//! assert_eq!(info.continuations().len(), 1); // `Range: bytes=6-`, `If-Range: "v1"`
//! # Ok(())
//! # }
//! # // A server on 127.0.0.1 that sends "hello " of "hello world" and closes the
//! # // connection, then answers `Range: bytes=6-` with a 206.
//! # async fn serve_cut_once() -> std::net::SocketAddr {
//! #     use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! #     let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! #     let addr = listener.local_addr().unwrap();
//! #     tokio::spawn(async move {
//! #         while let Ok((mut stream, _)) = listener.accept().await {
//! #             let mut head = Vec::new();
//! #             while !head.ends_with(b"\r\n\r\n") {
//! #                 let mut byte = [0u8];
//! #                 if stream.read(&mut byte).await.unwrap_or(0) == 0 { break; }
//! #                 head.push(byte[0]);
//! #             }
//! #             let ranged = String::from_utf8_lossy(&head).to_ascii_lowercase().contains("range: bytes=6-");
//! #             let answer: &[u8] = match ranged {
//! #                 false => b"HTTP/1.1 200 OK\r\netag: \"v1\"\r\ncontent-length: 11\r\n\r\nhello ",
//! #                 true => b"HTTP/1.1 206 Partial Content\r\netag: \"v1\"\r\ncontent-range: bytes 6-10/11\r\ncontent-length: 5\r\n\r\nworld",
//! #             };
//! #             let _ = stream.write_all(answer).await;
//! #         }
//! #     });
//! #     addr
//! # }
//! ```
//!
//! A body that could not be continued fails reqwest's read with a `reqwest::Error` whose
//! sources hold the layer's [`RetryError`](tower_http_retry::RetryError): `Error::from`
//! finds it, and `info().stop()` says why (the file changed, no validator, the limit, ...).
//!
//! **Compression.** A resumable request asks for `Accept-Encoding: identity` unless the
//! caller set one, since ranges count the bytes as sent. A reqwest built with `gzip` (or
//! `brotli`, `zstd`, `deflate`) decompresses what it knows below the layer, whoever asked,
//! and removes `Content-Encoding` and `Content-Length`: the layer then counts decoded bytes,
//! which no range continues. So a continuation answered with a 206 that has neither field
//! is not used, and the body ends with the layer's error (`StopReason::RangeMismatch`),
//! never spliced: leave `Accept-Encoding` unset on a resumable download (or turn reqwest's
//! decompression off for it, `ClientBuilder::no_gzip`, and read the encoded bytes). A
//! continuation's 206 without `Content-Length` from a server that did not compress (a
//! streamed range) is refused the same way.
//!
//! # On wasm32: reqwest's `fetch` client
//!
//! On `wasm32-unknown-unknown` (a browser, Node), reqwest's client is the platform's
//! `fetch`, and this crate wraps it too: build it with `default-features = false` (the
//! `middleware` feature as you need); the core's `wasm` feature, which it turns on there,
//! gives the layer its JavaScript timer. What changes, because reqwest's wasm types have
//! less in them:
//!
//! - **No `Send`.** The futures of [`ReqwestService`], of `send_with` and of
//!   [`RetryMiddleware`] are not `Send` (the browser's are not), and need not be.
//! - **[`ReqwestService`] answers `http::Response<reqwest::Response>`**: the head is a copy
//!   of reqwest's (status, headers), with the layer's record in its extensions; the body is
//!   reqwest's response, read with its own `text()`, `bytes()`, `json()`. It takes request
//!   bodies whole: the attempt's body is collected, then handed to `fetch`.
//! - **[`RequestBuilderExt::send_with`] returns that `http::Response`**, since reqwest's
//!   wasm response has no extensions to hold the record; the request reaches the service as
//!   an `http::Request<RequestBody>` (one buffer), with the builder's timeout (not its
//!   `fetch` options).
//! - **[`RetryMiddleware`] puts the record in the middleware extensions**
//!   (`ClientWithMiddleware::execute_with_extensions` hands them back).
//! - **Errors.** A failed `fetch` says no more than that it failed: only reqwest's
//!   timeouts are recognised ([`recognize`]); anything else is an error the server may have
//!   seen, retried only for requests that may be repeated.
//! - **No resumable bodies**: `RetryLayer::resume` over a `ReqwestService` and
//!   `RetryMiddleware::resume` are native only (a continuation is read through
//!   `http_body`, which reqwest's wasm response is not).
//!
//! # Things to know
//!
//! - **reqwest's errors are classified like hyper's.** [`ReqwestService`] hands them to the
//!   layer already recognised ([`recognize`]): a connect error (`is_connect`, a connect
//!   timeout too) proves the server never saw the request, so even a POST without a key is
//!   sent again; a timeout (`is_timeout`) is a retryable timeout; anything else is judged by
//!   what it wraps, so a reset or a closed connection underneath is found too. The caller
//!   gets reqwest's own error back.
//! - **Timeouts.** Every attempt is a separate `execute`, so reqwest's
//!   `ClientBuilder::timeout` (and a request's `RequestBuilder::timeout`) bounds each
//!   attempt, and its expiry is retried as a timeout. It also keeps running while the
//!   response body is read, after the layer has returned the response.
//!   [`RetryPolicy::attempt_timeout`](tower_http_retry::RetryPolicy::attempt_timeout) and
//!   [`RetryPolicy::deadline`](tower_http_retry::RetryPolicy::deadline) do the same job inside
//!   the layer, with the time left before the deadline taken into account.
//! - **reqwest's own retries stay out of the way.** reqwest retries HTTP/2 protocol
//!   refusals itself only for bodies it can clone; the body handed to it here is a stream,
//!   so it never sends a copy of its own and the layer's limits and budget hold.
//! - **Redirects.** reqwest follows them (unless its redirect policy says otherwise), but a
//!   307 or 308 for a request with a non-empty body is returned as is, since it cannot
//!   clone the body.
//! - **Features.** reqwest is built without its default features here (no TLS, no
//!   HTTP/2); enable what your application needs on your own reqwest dependency (for
//!   example `reqwest = { version = "0.13", features = ["rustls"] }`) and Cargo builds one
//!   reqwest with both. This crate's `h2` feature (on by default) has the core recognise
//!   HTTP/2's errors under reqwest's (a refused stream, `GOAWAY`, a reset stream); a
//!   reqwest without HTTP/2 can leave it off (`default-features = false`), and h2 leaves
//!   the tree.
//!
#![cfg_attr(feature = "middleware", doc = "[`RetryMiddleware`]: RetryMiddleware")]
#![cfg_attr(
    not(feature = "middleware"),
    doc = "[`RetryMiddleware`]: https://docs.rs/tower-http-retry-reqwest/latest/tower_http_retry_reqwest/struct.RetryMiddleware.html"
)]
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
#![cfg_attr(docsrs, feature(doc_cfg))]

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use ::reqwest::{Client, Url};
use tower_http_retry::Attempt;
use tower_http_retry::classify::{Recognized, RetryReason};

// What differs by target is in one module each: reqwest's native client (hyper's transport)
// or its wasm32 client (`fetch`).
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
mod native;
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
pub use self::native::ResponseFuture;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
mod wasm;
#[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
pub use self::wasm::{RequestBody, ResponseFuture};

mod bridge;
#[cfg(feature = "middleware")]
mod middleware;

pub use self::bridge::{Error, RequestBuilderExt};

// The README's examples compile as doc tests (the first needs the `middleware` feature).
#[cfg(all(doctest, feature = "middleware"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
#[cfg(feature = "middleware")]
#[cfg_attr(docsrs, doc(cfg(feature = "middleware")))]
pub use self::middleware::RetryMiddleware;

/// A [`reqwest::Client`] as a `Service<http::Request<ReplayBody<B>>>`,
/// for [`RetryLayer`](tower_http_retry::RetryLayer) to wrap.
///
/// It returns `http::Response<reqwest::Body>`, and fails with reqwest's own
/// [`reqwest::Error`] inside a [`Recognized`] (what [`recognize`] makes of it, for the
/// layer; the layer's caller gets the `reqwest::Error` itself back): also when the request
/// cannot be converted (`is_builder()`, for example for a URI without a scheme and host),
/// in which case nothing is sent.
///
/// With reqwest's request builders, send through the layer over it with
/// [`RequestBuilderExt::send_with`]. With `http::Request`s, as below: the answer goes back
/// to a `reqwest::Response` with `reqwest::Response::from`, and the layer's error (a
/// `BoxError`) is read with [`Error::from`]: reqwest's own error is
/// [`Error::as_reqwest`], the record [`Error::info`].
///
/// Under a resumable layer (`RetryLayer::new().resume()`), the answer's body is a
/// [`ResumeBody`](tower_http_retry::ResumeBody)`<reqwest::Body>`, which
/// `response.map(reqwest::Body::wrap)` makes reqwest's again (`send_with` does it). Its
/// continuations come here too, marked as such by the layer
/// ([`AttemptKind::Continuation`](tower_http_retry::AttemptKind::Continuation)); a
/// continuation answered 206 with neither `Content-Length` nor `Content-Encoding`, as
/// reqwest's decompression leaves a body it decoded, reaches the layer without its
/// `Content-Range`, so it is not used: see [Resumable downloads](crate#resumable-downloads).
///
/// `B` is the caller's request body type (the layer hands down `ReplayBody<B>`), inferred
/// from the requests sent. Any body works: a `Full<Bytes>`, a `String`, a stream, a
/// `reqwest::Body` (the default), also bodies that are `Send` but not `Sync`
/// (`UnsyncBoxBody`, axum's body).
///
/// On wasm32 it wraps reqwest's `fetch` client: it answers `http::Response<reqwest::Response>`,
/// sends each attempt's body whole, and nothing in it is `Send` (see
/// [On wasm32](crate#on-wasm32-reqwests-fetch-client)).
///
/// # Clone
///
/// Cloning is cheap: a `reqwest::Client` is a handle on one shared connection pool, and
/// every clone of this service uses it, and the parsed URLs of the origins it sent to.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use bytes::Bytes;
/// use http_body_util::{BodyExt, Full};
/// use tower::{ServiceBuilder, ServiceExt};
/// use tower_http_retry_reqwest::{Error, ReqwestService};
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
/// #             async move { http::Response::builder().status(status).body(Full::new(Bytes::from("hello"))) }
/// #         });
/// #         let io = hyper_util::rt::TokioIo::new(stream);
/// #         tokio::spawn(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
/// #     }
/// # });
/// let client = reqwest::Client::builder()
///     .timeout(Duration::from_secs(2)) // each attempt's limit
/// #   .no_proxy() // the server is on 127.0.0.1
///     .build()?;
/// let service = ServiceBuilder::new()
///     .layer(RetryLayer::new().policy(
///         RetryPolicy::new()
///             .backoff(Backoff::exponential(Duration::from_millis(10), Duration::from_secs(1)))
///             .deadline(Duration::from_secs(10)),
///     ))
///     .service(ReqwestService::new(client));
///
/// let request = http::Request::get(format!("http://{addr}/greeting"))
///     .body(Full::new(Bytes::new()))?;
/// let response = service.clone().oneshot(request).await?;
/// assert_eq!(response.status(), 200);
/// assert_eq!(response.extensions().get::<RetryInfo>().unwrap().attempts(), 2); // 503, then 200
///
/// // Back to a `reqwest::Response`, for reqwest's own helpers.
/// let response = reqwest::Response::from(response);
/// assert_eq!(response.url().path(), "/greeting");
/// assert_eq!(response.text().await?, "hello");
///
/// // A failure: reqwest's error and the record, from the layer's `BoxError`.
/// let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?; // nothing listens
/// let request = http::Request::get(format!("http://{closed}/")).body(Full::new(Bytes::new()))?;
/// let error = Error::from(service.oneshot(request).await.unwrap_err());
/// assert!(error.as_reqwest().is_some_and(|e| e.is_connect()));
/// assert_eq!(error.info().map(|info| info.attempts()), Some(3));
/// # Ok(())
/// # }
/// ```
pub struct ReqwestService<
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))] B = ::reqwest::Body,
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))] B = RequestBody,
> {
    client: Client,
    /// The URLs of the origins this service and its clones sent to, shared.
    origins: Arc<Origins>,
    /// The request body type, fixed per service so that `svc.ready().await?.call(req)`
    /// needs no annotation. `fn(B)`: the service holds no `B`, and is `Send` and `Sync`
    /// whatever `B` is.
    _body: PhantomData<fn(B)>,
}

impl<B> ReqwestService<B> {
    /// Sends every request through `client`.
    pub fn new(client: Client) -> Self {
        Self {
            client,
            origins: Arc::default(),
            _body: PhantomData,
        }
    }

    /// The client.
    pub fn get_ref(&self) -> &Client {
        &self.client
    }

    /// The client, mutably.
    pub fn get_mut(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Gives the client back.
    pub fn into_inner(self) -> Client {
        self.client
    }
}

impl<B> Clone for ReqwestService<B> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            origins: Arc::clone(&self.origins),
            _body: PhantomData,
        }
    }
}

impl<B> fmt::Debug for ReqwestService<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReqwestService")
            .field("client", &self.client)
            .finish()
    }
}

impl<B> From<Client> for ReqwestService<B> {
    fn from(client: Client) -> Self {
        Self::new(client)
    }
}

/// The URLs of the first few origins (scheme and authority) a service sent to, each parsed
/// once. reqwest takes a request's URL as a `Url`, and its own conversion from an
/// `http::Request` prints the URI and parses the text again on every call (about 7 000
/// instructions, more than the rest of the layer's work on a request); the URL of a known
/// origin is its parsed origin with the path and query set, which skips the host's parsing
/// and gives the same `Url` (a property test holds the two equal). Slots are filled once
/// and never change, so reading them takes no lock; an origin beyond them is parsed whole,
/// as reqwest would.
#[derive(Default)]
struct Origins([OnceLock<Origin>; 4]);

struct Origin {
    scheme: http::uri::Scheme,
    authority: http::uri::Authority,
    /// `scheme://authority/`, parsed.
    url: Url,
}

impl Origins {
    /// The URL of `uri`, when its origin is known or a slot is free for it.
    fn url(&self, uri: &http::Uri) -> Option<Url> {
        let (scheme, authority) = (uri.scheme()?, uri.authority()?);
        // reqwest sends nothing else: other schemes take its own path, for its error. A
        // path that is not absolute (`*`, which `http` allows as the whole path) is printed
        // against the authority (`http://host*`), so it too is left to reqwest's parse.
        if *scheme != http::uri::Scheme::HTTP && *scheme != http::uri::Scheme::HTTPS
            || !uri.path().starts_with('/')
        {
            return None;
        }
        for slot in &self.0 {
            let origin = match slot.get() {
                Some(origin) => origin,
                None => {
                    let url = Url::parse(&format!("{scheme}://{authority}/")).ok()?;
                    slot.get_or_init(|| Origin {
                        scheme: scheme.clone(),
                        authority: authority.clone(),
                        url,
                    })
                }
            };
            // Compared as written: `Authority`'s own `==` ignores case, which the user
            // information does not.
            if origin.scheme == *scheme && origin.authority.as_str() == authority.as_str() {
                let mut url = origin.url.clone();
                url.set_path(uri.path());
                url.set_query(uri.query());
                return Some(url);
            }
        }
        None
    }
}

/// The attempt as reqwest's request: reqwest's own conversion when the request carries
/// extensions reqwest may read (its timeout, set on a `reqwest::Request` converted to an
/// `http::Request`), or when its origin is not known; otherwise the same request made from
/// its parts, with the origin's URL. reqwest reads nothing else of a request's extensions
/// and sends none of them, so the layer's own `Attempt` is no reason for the long way.
fn to_reqwest(
    origins: &Origins,
    request: http::Request<::reqwest::Body>,
) -> Result<::reqwest::Request, ::reqwest::Error> {
    let extensions = request.extensions();
    let plain =
        extensions.is_empty() || (extensions.len() == 1 && extensions.get::<Attempt>().is_some());
    let url = match plain {
        true => origins.url(request.uri()),
        false => None,
    };
    let Some(url) = url else {
        return ::reqwest::Request::try_from(request);
    };
    let (parts, body) = request.into_parts();
    let mut converted = ::reqwest::Request::new(parts.method, url);
    *converted.headers_mut() = parts.headers;
    *converted.body_mut() = Some(body);
    // reqwest's `fetch` client has no version to set: the browser picks it.
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    {
        *converted.version_mut() = parts.version;
    }
    Ok(converted)
}

/// What a `reqwest::Error` is, as a failure: a connect error (a connect timeout too: the
/// connection never existed, which is the stronger claim) is
/// [`RetryReason::Connect`], a timeout [`RetryReason::Timeout`] (reqwest's own timeout
/// error is a private type: only `is_timeout` can tell), and anything else `None`: judged
/// by what it wraps (a reset, a closed connection, ...). On wasm32, where a failed `fetch`
/// tells no connect error apart, only the timeout.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use tower_http_retry::classify::RetryReason;
///
/// // Port 9 on 127.0.0.1: nothing listens there.
/// let client = reqwest::Client::builder().no_proxy().build().unwrap();
/// let error = client.get("http://127.0.0.1:9/").send().await.unwrap_err();
/// assert_eq!(tower_http_retry_reqwest::recognize(&error), Some(RetryReason::Connect));
/// # }
/// ```
pub fn recognize(error: &::reqwest::Error) -> Option<RetryReason> {
    #[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
    if error.is_connect() {
        return Some(RetryReason::Connect);
    }
    if error.is_timeout() {
        Some(RetryReason::Timeout)
    } else {
        None
    }
}

/// reqwest's error, handed to the layer already recognised.
pub(crate) fn recognized(error: ::reqwest::Error) -> Recognized {
    let reason = recognize(&error);
    Recognized::new(error, reason)
}

// Natively: proptest and tokio do not build for wasm32, whose test is tests/wasm.rs.
#[cfg(all(test, not(all(target_arch = "wasm32", target_os = "unknown"))))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// What reqwest's own conversion makes of `uri`.
    fn parsed(uri: &http::Uri) -> Option<Url> {
        Url::parse(&uri.to_string()).ok()
    }

    #[test]
    fn a_known_origin_gives_the_url_reqwest_would_parse() {
        let origins = Origins::default();
        for text in [
            "http://127.0.0.1:3000/items/7?full=1",
            "http://127.0.0.1:3000/",
            "http://127.0.0.1:3000",
            "http://127.0.0.1:3000/a/../b/./c?",
            "http://127.0.0.1:3000/%7e%41/x%2Fy?q=%20'{}|",
            "https://Example.COM/p",
            "https://example.com:443/p",
            "http://user:Secret@[::1]:8080/p?x",
            "http://User:Secret@[::1]:8080/p?x",
            "http://example.com./dots",
        ] {
            let uri: http::Uri = text.parse().unwrap();
            assert_eq!(Origins::default().url(&uri), parsed(&uri), "{text}");
        }
        // User information is told apart by case, as the URL keeps it.
        for user in ["user", "User"] {
            let uri: http::Uri = format!("http://{user}:pw@[::1]:8080/p").parse().unwrap();
            let url = origins.url(&uri).unwrap();
            assert_eq!(url.username(), user);
        }
        // Four origins are kept; a fifth is parsed whole, by reqwest.
        for host in ["a.example", "b.example"] {
            let uri: http::Uri = format!("http://{host}/x").parse().unwrap();
            assert_eq!(origins.url(&uri), parsed(&uri));
        }
        assert!(origins.0.iter().all(|slot| slot.get().is_some()));
        let fifth: http::Uri = "http://b.example/y".parse().unwrap();
        assert_eq!(
            origins.url(&fifth),
            parsed(&fifth),
            "a kept origin is still found"
        );
        let fifth: http::Uri = "http://fifth.example/".parse().unwrap();
        assert_eq!(origins.url(&fifth), None);
    }

    #[test]
    fn other_schemes_relative_uris_and_the_star_take_reqwests_way() {
        let origins = Origins::default();
        for text in ["ftp://example.com/f", "/relative", "ws://example.com/"] {
            let uri: http::Uri = text.parse().unwrap();
            assert_eq!(origins.url(&uri), None, "{text}");
        }
        // `OPTIONS *` to an origin: printed as `http://127.0.0.1:3000*`, which reqwest
        // refuses (a port that is no number); so does the service.
        let star = http::Uri::builder()
            .scheme("http")
            .authority("127.0.0.1:3000")
            .path_and_query("*")
            .build()
            .unwrap();
        assert_eq!(origins.url(&star), None);
        assert!(origins.0.iter().all(|slot| slot.get().is_none()));
        let mut request = http::Request::new(::reqwest::Body::from(""));
        *request.method_mut() = http::Method::OPTIONS;
        *request.uri_mut() = star;
        assert!(to_reqwest(&origins, request).unwrap_err().is_builder());
    }

    #[test]
    fn a_request_with_extensions_reqwest_may_read_keeps_them() {
        let origins = Origins::default();
        let mut request = http::Request::new(::reqwest::Body::from("x"));
        *request.uri_mut() = "http://127.0.0.1:3000/a".parse().unwrap();
        request.extensions_mut().insert(7u8);
        let converted = to_reqwest(&origins, request).unwrap();
        // The long way: reqwest's conversion, which leaves the origins alone.
        assert!(origins.0[0].get().is_none());
        assert_eq!(converted.url().as_str(), "http://127.0.0.1:3000/a");

        let mut request = http::Request::new(::reqwest::Body::from("x"));
        *request.method_mut() = http::Method::PUT;
        *request.uri_mut() = "http://127.0.0.1:3000/b?c".parse().unwrap();
        *request.version_mut() = http::Version::HTTP_11;
        request.headers_mut().insert("x-a", "1".parse().unwrap());
        request.extensions_mut().insert(Attempt::new(
            2,
            1,
            None,
            tower_http_retry::AttemptKind::Retry,
        ));
        let converted = to_reqwest(&origins, request).unwrap();
        assert!(origins.0[0].get().is_some());
        assert_eq!(converted.method(), http::Method::PUT);
        assert_eq!(converted.url().as_str(), "http://127.0.0.1:3000/b?c");
        assert_eq!(converted.version(), http::Version::HTTP_11);
        assert_eq!(converted.headers()["x-a"], "1");
        assert_eq!(converted.body().and_then(|b| b.as_bytes()), Some(&b"x"[..]));
    }

    fn piece() -> impl Strategy<Value = String> {
        let atoms = prop::sample::select(vec![
            "a", "Z", "0", "-", "_", "~", ".", "..", "/", "//", "%", "%2e", "%2E", "%41", "%zz",
            "!", "$", "&", "'", "(", ")", "*", "+", ",", ";", "=", ":", "@", "?", "[", "]", "{",
            "}", "|", "^", "`", "%00", "%2F",
        ]);
        prop::collection::vec(atoms, 0..8).prop_map(|atoms| atoms.concat())
    }

    proptest! {
        /// Any URI `http::Uri` accepts gets, through a known origin, the URL reqwest's own
        /// conversion would parse, or is left to that conversion.
        #[test]
        fn the_origin_url_equals_the_parsed_one(
            https in any::<bool>(),
            authority in prop::sample::select(vec![
                "127.0.0.1:3000", "localhost", "Example.COM:80", "u:p@h", "[::1]:1", "a.b.",
            ]),
            path in piece(),
            query in prop::option::of(piece()),
        ) {
            let scheme = if https { "https" } else { "http" };
            let query = query.map(|q| format!("?{q}")).unwrap_or_default();
            let text = format!("{scheme}://{authority}/{path}{query}");
            // A URI `http` refuses never reaches the service (proptest fails the test if
            // too many are refused to leave enough cases).
            let uri = text.parse::<http::Uri>();
            prop_assume!(uri.is_ok());
            let uri = uri.unwrap();
            match Origins::default().url(&uri) {
                Some(url) => prop_assert_eq!(Some(url), parsed(&uri), "{}", text),
                // Left to reqwest only where the origin itself does not parse.
                None => prop_assert!(parsed(&uri).is_none(), "{}", text),
            }
        }
    }
}
