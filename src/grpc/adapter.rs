// Tonic glue: the request body a tonic `Channel` takes, and the layer's errors as the
// `Status` a tonic caller gets.

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::Request;
use tonic::{Code, Status};
use tower::BoxError;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::{AttemptTimedOut, DeadlineExceeded, ServiceNotReady};
use crate::replay::ReplayBody;

/// Puts a [`TonicBody`] under the retry layer: see [`tonic_body_layer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TonicBodyLayer;

/// A layer that gives the service below it (a tonic `Channel`) the request body type it
/// takes.
///
/// The retry layer hands its inner service `http::Request<ReplayBody<B>>`; a tonic
/// `Channel` takes `http::Request<tonic::body::Body>`. This layer, placed between them,
/// wraps each attempt's replay body in a `tonic::body::Body` (one small allocation per
/// attempt, no copy of the body):
///
/// ```
/// # #[cfg(any())] {
/// let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051")
///     .connect_lazy();
/// let stack = tower::ServiceBuilder::new()
///     .layer(tower_http_retry::grpc::status_layer()) // the layer's errors as `Status`
///     .layer(retry_layer)
///     .layer(tower_http_retry::grpc::tonic_body_layer())
///     .service(channel);
/// let mut client = tonic::client::Grpc::new(stack); // or a generated client's `new`
/// # }
/// ```
pub fn tonic_body_layer() -> TonicBodyLayer {
    TonicBodyLayer
}

impl<S> Layer<S> for TonicBodyLayer {
    type Service = TonicBody<S>;

    fn layer(&self, inner: S) -> TonicBody<S> {
        TonicBody { inner }
    }
}

/// A service taking `http::Request<ReplayBody<B>>` and calling `S` (a tonic `Channel`)
/// with `http::Request<tonic::body::Body>`. Made by [`tonic_body_layer`].
///
/// The body's errors (the caller's own request stream failing) reach the channel as
/// tonic's `Status`, as with any body given to `tonic::body::Body::new`.
#[derive(Debug, Clone)]
pub struct TonicBody<S> {
    inner: S,
}

impl<S> TonicBody<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, B> Service<Request<ReplayBody<B>>> for TonicBody<S>
where
    S: Service<Request<tonic::body::Body>>,
    ReplayBody<B>: http_body::Body<Data = Bytes> + Send + 'static,
    <ReplayBody<B> as http_body::Body>::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReplayBody<B>>) -> Self::Future {
        self.inner.call(request.map(tonic::body::Body::new))
    }
}

/// [`into_status`]'s table on a borrowed error: the status has no source.
#[cfg(test)]
pub(crate) fn status_from_error(error: &(dyn StdError + 'static)) -> Status {
    find_status(error).unwrap_or_else(|| Status::unknown(error.to_string()))
}

/// The gRPC status for an error that came out of the retry layer (or anything below
/// it), found by walking its [`source`](StdError::source) chain from the top; the first
/// link recognised decides:
///
/// | link | status |
/// | --- | --- |
/// | a `tonic::Status` | that status, code, message, details and metadata as they are |
/// | [`DeadlineExceeded`] (the layer's overall deadline) | `DEADLINE_EXCEEDED` |
/// | [`AttemptTimedOut`] (one attempt's timeout, the last attempt's) | `UNAVAILABLE` |
/// | [`ServiceNotReady`] (the channel was not ready for a retry within the attempt timeout) | `UNAVAILABLE` |
/// | `tonic::TimeoutExpired` (the `Channel`'s own `grpc-timeout` or `Endpoint::timeout` timer) | `DEADLINE_EXCEEDED` |
/// | `tonic::ConnectError` | `UNAVAILABLE` |
/// | with the `hyper` feature: an `h2::Error` with a reason, a hyper timeout or cancellation | as tonic maps them (`REFUSED_STREAM` is `UNAVAILABLE`, `CANCEL` `CANCELLED`, ...) |
/// | nothing recognised | `UNKNOWN`, with the error's message |
///
/// Two choices differ from what tonic itself would say:
///
/// - A6 has one deadline per RPC, across all attempts; only when it passes is the
///   answer `DEADLINE_EXCEEDED`. A per-attempt timeout is not that deadline: the call
///   still had time, the server did not answer in the time one attempt was given, and
///   trying again may work. That is a transient failure, `UNAVAILABLE`, the code an
///   Envoy-style per-try timeout gives a gRPC client too.
/// - tonic reports its own timer as `CANCELLED` ("Timeout expired"). That timer is the
///   RPC's deadline (the `grpc-timeout` the layer sets to the time left, or the
///   endpoint's timeout), so the caller gets `DEADLINE_EXCEEDED`, as from any other gRPC
///   client whose deadline passed, whichever of the layer's deadline and the channel's
///   timer fired first.
///
///
/// The error is kept as the status's [`source`](StdError::source) (so a caller can
/// downcast it and reach what the layer recorded), and tonic's own `Status::from_error`
/// answers for anything the table does not know. A `Status` passed in is returned as it
/// is.
///
/// Use it where the errors leave the stack, as [`status_layer`] does:
///
/// ```
/// use std::error::Error;
/// use std::time::Duration;
/// use tonic::Code;
/// use tower_http_retry::grpc::into_status;
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// # use tower::{Layer, ServiceExt};
/// # use tower_http_retry::{RetryLayer, RetryPolicy};
/// # let inner = tower::service_fn(|_: http::Request<tower_http_retry::ReplayBody<String>>| {
/// #     std::future::pending::<Result<http::Response<()>, std::convert::Infallible>>()
/// # });
/// # let client = RetryLayer::new()
/// #     .policy(RetryPolicy::default().deadline(Duration::from_secs(1)))
/// #     .layer(inner);
/// # let request = http::Request::post("http://127.0.0.1/a.B/C").body(String::new()).unwrap();
/// // `error` is what the retry layer returned: its deadline passed.
/// let error = client.oneshot(request).await.unwrap_err();
/// let status = into_status(error);
/// assert_eq!(status.code(), Code::DeadlineExceeded);
/// // The layer's error itself, for a caller that wants more than the code.
/// assert!(status.source().is_some());
/// # }
/// ```
pub fn into_status(error: BoxError) -> Status {
    let error = match error.downcast::<Status>() {
        Ok(status) => return *status,
        Err(error) => error,
    };
    match find_status(&*error) {
        Some(mut status) => {
            status.set_source(Arc::from(error));
            status
        }
        None => Status::from_error(error),
    }
}

fn find_status(error: &(dyn StdError + 'static)) -> Option<Status> {
    let mut link = Some(error);
    while let Some(error) = link {
        if let Some(status) = error.downcast_ref::<Status>() {
            return Some(Status::with_details_and_metadata(
                status.code(),
                status.message(),
                Bytes::copy_from_slice(status.details()),
                status.metadata().clone(),
            ));
        }
        if error.is::<DeadlineExceeded>() || error.is::<tonic::TimeoutExpired>() {
            return Some(Status::deadline_exceeded(error.to_string()));
        }
        if error.is::<AttemptTimedOut>()
            || error.is::<ServiceNotReady>()
            || error.is::<tonic::ConnectError>()
        {
            return Some(Status::unavailable(error.to_string()));
        }
        #[cfg(feature = "hyper")]
        if let Some(status) = transport_status(error) {
            return Some(status);
        }
        link = error.source();
    }
    None
}

/// tonic's reading of hyper and h2 errors (its `from_hyper_error` and `code_from_h2`).
#[cfg(feature = "hyper")]
fn transport_status(error: &(dyn StdError + 'static)) -> Option<Status> {
    if let Some(error) = error.downcast_ref::<hyper::Error>() {
        if error.is_timeout() {
            return Some(Status::unavailable(error.to_string()));
        }
        if error.is_canceled() {
            return Some(Status::cancelled(error.to_string()));
        }
        return None;
    }
    let error = error.downcast_ref::<h2::Error>()?;
    let code = match error.reason()? {
        h2::Reason::NO_ERROR
        | h2::Reason::PROTOCOL_ERROR
        | h2::Reason::INTERNAL_ERROR
        | h2::Reason::FLOW_CONTROL_ERROR
        | h2::Reason::SETTINGS_TIMEOUT
        | h2::Reason::COMPRESSION_ERROR
        | h2::Reason::CONNECT_ERROR => Code::Internal,
        h2::Reason::REFUSED_STREAM => Code::Unavailable,
        h2::Reason::CANCEL => Code::Cancelled,
        h2::Reason::ENHANCE_YOUR_CALM => Code::ResourceExhausted,
        h2::Reason::INADEQUATE_SECURITY => Code::PermissionDenied,
        _ => Code::Unknown,
    };
    Some(Status::new(code, format!("h2 protocol error: {error}")))
}

/// Puts an [`IntoStatus`] on top of the stack: see [`status_layer`].
#[derive(Debug, Clone, Copy, Default)]
pub struct StatusLayer;

/// A layer that turns every error of the service below it into a `tonic::Status` with
/// [`into_status`]. Put it above the retry layer, so a tonic client gets the layer's own
/// errors as the right codes (a passed deadline as `DEADLINE_EXCEEDED`, not `UNKNOWN`).
///
/// Without it, tonic's generated clients turn the layer's error with
/// `Status::from_error`, which knows tonic's, hyper's and h2's errors but not this
/// crate's: a passed deadline would reach the caller as `UNKNOWN`, its message the
/// layer's, and the error itself as the status's source.
pub fn status_layer() -> StatusLayer {
    StatusLayer
}

impl<S> Layer<S> for StatusLayer {
    type Service = IntoStatus<S>;

    fn layer(&self, inner: S) -> IntoStatus<S> {
        IntoStatus { inner }
    }
}

/// A service whose errors are the `tonic::Status` that [`into_status`] makes of `S`'s.
/// Made by [`status_layer`].
#[derive(Debug, Clone)]
pub struct IntoStatus<S> {
    inner: S,
}

impl<S> IntoStatus<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, R> Service<R> for IntoStatus<S>
where
    S: Service<R>,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = Status;
    type Future = IntoStatusFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        self.inner
            .poll_ready(cx)
            .map_err(|error| into_status(error.into()))
    }

    fn call(&mut self, request: R) -> Self::Future {
        IntoStatusFuture {
            inner: self.inner.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`IntoStatus`].
    #[derive(Debug)]
    pub struct IntoStatusFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, T, E> Future for IntoStatusFuture<F>
where
    F: Future<Output = Result<T, E>>,
    E: Into<BoxError>,
{
    type Output = Result<T, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let result = ready!(self.project().inner.poll(cx));
        Poll::Ready(result.map_err(|error| into_status(error.into())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::fmt;
    use std::time::Duration;

    use tonic::metadata::MetadataValue;

    /// An error with a source, like the layer's `RetryError` will be.
    #[derive(Debug)]
    struct Wrapper(BoxError);

    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "gave up: {}", self.0)
        }
    }

    impl StdError for Wrapper {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.0)
        }
    }

    fn deadline() -> DeadlineExceeded {
        DeadlineExceeded::new(Duration::from_secs(2), 3)
    }

    fn timed_out() -> AttemptTimedOut {
        AttemptTimedOut::new(Duration::from_millis(500), 2)
    }

    #[test]
    fn the_layers_own_errors() {
        let status = status_from_error(&deadline());
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(
            status.message(),
            "request deadline of 2s exceeded after 3 attempt(s)"
        );
        let status = status_from_error(&timed_out());
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), "attempt 2 timed out after 500ms");
        // A retry the channel was not ready for in time: the server's side is down.
        let not_ready = ServiceNotReady::new(Duration::from_secs(1), 2);
        assert_eq!(status_from_error(&not_ready).code(), Code::Unavailable);
    }

    #[test]
    fn found_anywhere_in_the_chain() {
        let wrapped = Wrapper(Box::new(Wrapper(Box::new(deadline()))));
        assert_eq!(status_from_error(&wrapped).code(), Code::DeadlineExceeded);
        let status = into_status(Box::new(wrapped));
        assert_eq!(status.code(), Code::DeadlineExceeded);
        let source = status.source().expect("the error is kept");
        assert!(source.is::<Wrapper>());
        assert_eq!(
            source.to_string(),
            "gave up: gave up: request deadline of 2s exceeded after 3 attempt(s)"
        );
    }

    #[test]
    fn a_status_is_kept_as_it_is() {
        let mut original =
            Status::with_details(Code::Aborted, "conflict", Bytes::from_static(b"d"));
        original
            .metadata_mut()
            .insert("x-why", MetadataValue::from_static("because"));
        let wrapped = Wrapper(Box::new(original));
        let status = status_from_error(&wrapped);
        assert_eq!(status.code(), Code::Aborted);
        assert_eq!(status.message(), "conflict");
        assert_eq!(status.details(), b"d");
        assert_eq!(status.metadata().get("x-why").unwrap(), "because");

        // A status that is the error itself comes back unchanged, source included.
        let mut with_source = Status::unavailable("down");
        with_source.set_source(Arc::new(deadline()));
        let back = into_status(Box::new(with_source));
        assert_eq!(back.code(), Code::Unavailable);
        assert!(back.source().unwrap().is::<DeadlineExceeded>());
    }

    #[test]
    fn the_first_recognised_link_wins() {
        // A status above the deadline: the status.
        let status = Status::resource_exhausted("slow down");
        struct Above(Status);
        impl fmt::Debug for Above {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("Above")
            }
        }
        impl fmt::Display for Above {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("above")
            }
        }
        impl StdError for Above {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        assert_eq!(
            status_from_error(&Above(status)).code(),
            Code::ResourceExhausted
        );
        let deadline_over_status = Wrapper(Box::new(deadline()));
        assert_eq!(
            status_from_error(&deadline_over_status).code(),
            Code::DeadlineExceeded
        );
    }

    #[test]
    fn tonics_own_errors() {
        let status = status_from_error(&tonic::TimeoutExpired(()));
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert_eq!(status.message(), "Timeout expired");
        let connect = tonic::ConnectError(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        )));
        assert_eq!(status_from_error(&connect).code(), Code::Unavailable);
    }

    #[cfg(feature = "hyper")]
    #[test]
    fn h2_reasons_as_tonic_maps_them() {
        let cases = [
            (h2::Reason::REFUSED_STREAM, Code::Unavailable),
            (h2::Reason::CANCEL, Code::Cancelled),
            (h2::Reason::ENHANCE_YOUR_CALM, Code::ResourceExhausted),
            (h2::Reason::INTERNAL_ERROR, Code::Internal),
            (h2::Reason::INADEQUATE_SECURITY, Code::PermissionDenied),
            (h2::Reason::from(0xff), Code::Unknown),
        ];
        for (reason, code) in cases {
            let error = h2::Error::from(reason);
            assert_eq!(
                status_from_error(&Wrapper(Box::new(error))).code(),
                code,
                "{reason:?}"
            );
        }
    }

    #[test]
    fn anything_else_is_unknown() {
        let error = std::io::Error::other("disk on fire");
        let status = status_from_error(&error);
        assert_eq!(status.code(), Code::Unknown);
        assert_eq!(status.message(), "disk on fire");
        // The owned form defers to tonic, which says the same and keeps the source.
        let status = into_status(Box::new(error));
        assert_eq!(status.code(), Code::Unknown);
        assert!(status.source().unwrap().is::<std::io::Error>());
    }

    #[tokio::test]
    async fn the_status_layer_maps_errors_and_passes_responses() {
        use tower::ServiceExt;

        let failing = tower::service_fn(|fail: bool| async move {
            if fail {
                Err::<&str, BoxError>(Box::new(deadline()))
            } else {
                Ok("fine")
            }
        });
        let service = status_layer().layer(failing);
        assert_eq!(service.clone().oneshot(false).await.unwrap(), "fine");
        let status = service.oneshot(true).await.unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded);
    }

    #[tokio::test]
    async fn the_body_layer_hands_over_the_replayed_bytes() {
        use http_body_util::{BodyExt, Full};
        use tower::ServiceExt;

        let channel = tower::service_fn(|request: Request<tonic::body::Body>| async move {
            let bytes = request.into_body().collect().await?.to_bytes();
            Ok::<_, Status>(bytes)
        });
        let service = tonic_body_layer().layer(channel);
        let body = ReplayBody::new(Full::new(Bytes::from_static(b"\0\0\0\0\x02hi")), 1024);
        let request = Request::post("http://127.0.0.1/a.B/C").body(body).unwrap();
        let bytes = service.oneshot(request).await.unwrap();
        assert_eq!(&bytes[..], b"\0\0\0\0\x02hi");
    }
}
