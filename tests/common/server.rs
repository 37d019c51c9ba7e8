//! A real hyper server on 127.0.0.1 and a real hyper-util client, for end-to-end tests.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower_http_retry::ReplayBody;

/// What the handler decides for one request.
pub enum Action {
    Respond(Response<Full<Bytes>>),
    /// Close the connection without answering.
    Close,
}

/// A request as the server saw it, body read in full.
#[derive(Debug, Clone)]
pub struct Hit {
    pub index: usize,
    pub method: http::Method,
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

pub struct Server {
    pub addr: SocketAddr,
    hits: Arc<std::sync::Mutex<Vec<Hit>>>,
    count: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }
    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }
}

/// Serves HTTP/1.1 on 127.0.0.1 with `handler`, which sees every request (body read) and
/// the number of requests before it.
pub async fn serve<F, Fut>(handler: F) -> Server
where
    F: Fn(Hit) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Action> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on(listener, handler)
}

/// A server that answers the first `failing` requests with `status` and every later one
/// with `then`.
pub async fn serve_failing_first(failing: usize, status: u16, then: u16) -> Server {
    serve(move |hit| async move {
        if hit.index < failing {
            respond(status)
        } else {
            respond(then)
        }
    })
    .await
}

pub fn serve_on<F, Fut>(listener: TcpListener, handler: F) -> Server
where
    F: Fn(Hit) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Action> + Send + 'static,
{
    serve_on_with(listener, false, handler)
}

/// As [`serve`], over prior-knowledge HTTP/2: `Action::Close` resets the stream
/// (hyper's server answers a failed handler with `RST_STREAM(INTERNAL_ERROR)`).
pub async fn serve_h2<F, Fut>(handler: F) -> Server
where
    F: Fn(Hit) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Action> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    serve_on_with(listener, true, handler)
}

fn serve_on_with<F, Fut>(listener: TcpListener, h2: bool, handler: F) -> Server
where
    F: Fn(Hit) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Action> + Send + 'static,
{
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(std::sync::Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let (h, c) = (Arc::clone(&hits), Arc::clone(&count));
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (handler, hits, count) = (handler.clone(), Arc::clone(&h), Arc::clone(&c));
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let (handler, hits, count) =
                        (handler.clone(), Arc::clone(&hits), Arc::clone(&count));
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = match body.collect().await {
                            Ok(collected) => collected.to_bytes(),
                            Err(e) => return Err(std::io::Error::other(e.to_string())),
                        };
                        let hit = Hit {
                            index: count.fetch_add(1, Ordering::SeqCst),
                            method: parts.method,
                            path: parts.uri.path().to_string(),
                            headers: parts.headers,
                            body,
                        };
                        hits.lock().unwrap().push(hit.clone());
                        match handler(hit).await {
                            Action::Respond(response) => Ok::<_, std::io::Error>(response),
                            Action::Close => Err(std::io::Error::other(
                                "closing the connection without an answer",
                            )),
                        }
                    }
                });
                let io = TokioIo::new(stream);
                let _ = if h2 {
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(io, service)
                        .await
                } else {
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .await
                };
            });
        }
    });
    Server {
        addr,
        hits,
        count,
        task,
    }
}

pub fn respond(code: u16) -> Action {
    Action::Respond(
        Response::builder()
            .status(code)
            .body(Full::new(Bytes::from(format!("status {code}"))))
            .unwrap(),
    )
}

pub fn respond_with(code: u16, headers: &[(&str, &str)]) -> Action {
    let mut b = Response::builder().status(code);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    Action::Respond(
        b.body(Full::new(Bytes::from(format!("status {code}"))))
            .unwrap(),
    )
}

pub type TestClient = Client<HttpConnector, ReplayBody<Full<Bytes>>>;

/// A plain hyper-util legacy client over HTTP/1.
pub fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

/// A hyper-util legacy client speaking prior-knowledge HTTP/2, one connection multiplexed.
pub fn client_h2() -> TestClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

#[allow(dead_code)]
fn _assert_infallible(_: Infallible) {}
