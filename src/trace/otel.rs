// OpenTelemetry (the `opentelemetry` feature): one CLIENT span per attempt, named and
// filled as the HTTP semantic conventions (v1.44.0) describe HTTP client spans, made as a
// `tracing` span with tracing-opentelemetry's special fields (`otel.name`, `otel.kind`,
// `otel.status_code`), and the attempt's `traceparent` written into that attempt's request
// through the global text-map propagator.
//
// The attempt's span lives beside the attempt's future (`Slot`, in the driver's states and
// in each hedge's flight) and ends when the attempt's response head (or its error) arrives;
// a hedge the layer cancels ends with it, its status unset. Without the feature `Slot` is
// an empty type whose methods do nothing.

use std::fmt;
use std::sync::OnceLock;

use http::{HeaderMap, Request, Response, Uri};
use opentelemetry::propagation::Injector;
use tower::BoxError;
use tracing::Level;
use tracing::field::Empty;

use super::{Log, Trace};
use crate::classify::RetryReason;
use crate::hook::AttemptKind;
use crate::info::AttemptOutcome;

/// The tracing name of every attempt's span (OpenTelemetry sees `otel.name`): what a
/// `tracing` filter matches to drop them, with the target `tower_http_retry`.
pub(crate) const SPAN_NAME: &str = "http_attempt";

/// The environment variable that replaces the list of known methods (comma-separated), as
/// the conventions name it.
const KNOWN_METHODS_ENV: &str = "OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS";

/// The methods the conventions know (RFC 9110, PATCH, QUERY); any other is `_OTHER`.
const DEFAULT_METHODS: [&str; 10] = [
    "CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE", "QUERY",
];

/// The query parameters whose values the conventions redact in `url.full`
/// (case-sensitively).
const REDACTED_PARAMETERS: [&str; 5] = [
    "X-Amz-Signature",
    "X-Amz-Credential",
    "X-Amz-Security-Token",
    "sig",
    "X-Goog-Signature",
];

/// The layer's OpenTelemetry settings, part of its [`Log`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Settings {
    /// `url.full` with its query string (values of secret parameters redacted).
    pub(crate) full_url: bool,
    known: &'static Known,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            full_url: false,
            known: Known::get(),
        }
    }
}

/// The known methods: the conventions' list, or the environment's.
#[derive(Debug, PartialEq, Eq)]
struct Known(Option<Vec<String>>);

impl Known {
    /// Read once in the process, when the first layer is built.
    fn get() -> &'static Known {
        static KNOWN: OnceLock<Known> = OnceLock::new();
        KNOWN.get_or_init(|| {
            Known(std::env::var(KNOWN_METHODS_ENV).ok().map(|list| {
                list.split(',')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(String::from)
                    .collect()
            }))
        })
    }

    fn knows(&self, method: &str) -> bool {
        match &self.0 {
            None => DEFAULT_METHODS.contains(&method),
            Some(list) => list.iter().any(|m| m == method),
        }
    }
}

/// `http.request.method`: the method if the conventions' list (or the environment's) knows
/// it, else `_OTHER`; the spans and the metrics name a method alike.
pub(crate) fn known_method(method: &http::Method) -> &str {
    match Known::get().knows(method.as_str()) {
        true => method.as_str(),
        false => "_OTHER",
    }
}

/// The span of one attempt in flight, if it has one.
pub(crate) struct Slot(Option<tracing::Span>);

/// The attempt's span entered while its future is polled: spans the inner service makes
/// are its children, and an instrumented inner client propagates it.
pub(crate) type Entered<'a> = Option<tracing::span::Entered<'a>>;

impl Slot {
    /// No span (yet).
    pub(crate) fn none() -> Slot {
        Slot(None)
    }

    /// The span of attempt `number`, sent for `kind`, as a child of the request's span
    /// (else of the current span); its `traceparent` is written into the request.
    pub(crate) fn start<B>(
        trace: &Trace,
        log: &Log,
        number: u32,
        kind: AttemptKind,
        request: &mut Request<B>,
    ) -> Slot {
        let span = make(
            trace.span(),
            &log.otel,
            number,
            kind,
            request.method(),
            request.uri(),
            request.headers(),
        );
        inject(&span, request.headers_mut());
        Slot(Some(span))
    }

    /// As [`Self::start`], for a request's head.
    pub(crate) fn start_parts(
        trace: &Trace,
        log: &Log,
        number: u32,
        kind: AttemptKind,
        head: &mut http::request::Parts,
    ) -> Slot {
        let span = make(
            trace.span(),
            &log.otel,
            number,
            kind,
            &head.method,
            &head.uri,
            &head.headers,
        );
        inject(&span, &mut head.headers);
        Slot(Some(span))
    }

    /// The span of a resumable body's continuation, `head` numbered by its `Attempt`
    /// extension: sent while the caller reads the body, after the request's span ended, so
    /// a child of the current span.
    pub(crate) fn continuation(log: &Log, head: &mut http::request::Parts) -> Slot {
        let Some(&attempt) = head.extensions.get::<crate::hook::Attempt>() else {
            return Slot(None);
        };
        let none = tracing::Span::none();
        let (method, uri) = (&head.method, &head.uri);
        let span = make(
            &none,
            &log.otel,
            attempt.number,
            attempt.kind,
            method,
            uri,
            &head.headers,
        );
        inject(&span, &mut head.headers);
        Slot(Some(span))
    }

    pub(crate) fn enter(&self) -> Entered<'_> {
        self.0.as_ref().map(tracing::Span::enter)
    }

    /// The request's deadline passed with the attempt in flight: the layer dropped it.
    pub(crate) fn abandoned(&mut self) {
        if let Some(span) = self.0.take() {
            timed_out(&span);
        }
    }

    /// The attempt ended with `outcome`: its span records it and ends.
    pub(crate) fn end<RB>(
        &mut self,
        outcome: AttemptOutcome,
        result: &Result<Response<RB>, BoxError>,
    ) {
        let Some(span) = self.0.take() else {
            return;
        };
        match (outcome, result) {
            (AttemptOutcome::Response(status), Ok(response)) => {
                span.record("http.response.status_code", i64::from(status.as_u16()));
                if let Some(version) = version(response.version()) {
                    span.record("network.protocol.version", version);
                }
                // A client's 4xx and 5xx are errors; the status code is the error's type.
                if status.as_u16() >= 400 {
                    span.record("error.type", status.as_str());
                    span.record("otel.status_code", "error");
                }
            }
            (AttemptOutcome::TimedOut | AttemptOutcome::Abandoned, _) => timed_out(&span),
            (AttemptOutcome::Error, Err(error)) => {
                span.record("error.type", error_type(error));
                span.record("otel.status_code", "error");
            }
            // Cancelled by the layer (a hedge that lost), or nothing recorded: unset.
            _ => {}
        }
    }
}

fn timed_out(span: &tracing::Span) {
    span.record("error.type", "timeout");
    span.record("otel.status_code", "error");
}

/// The `error.type` of an attempt that got no response: a transport failure as the
/// default classification recognises it, else `_OTHER`.
pub(crate) fn error_type(error: &BoxError) -> &'static str {
    match crate::classify::classify_error(&**error).reason() {
        Some(
            reason @ (RetryReason::Connect
            | RetryReason::RefusedStream
            | RetryReason::NotSent
            | RetryReason::GoAway
            | RetryReason::ConnectionClosed
            | RetryReason::Timeout),
        ) => reason.as_str(),
        _ => "_OTHER",
    }
}

fn version(version: http::Version) -> Option<&'static str> {
    match version {
        http::Version::HTTP_10 => Some("1.0"),
        http::Version::HTTP_11 => Some("1.1"),
        http::Version::HTTP_2 => Some("2"),
        http::Version::HTTP_3 => Some("3"),
        _ => None,
    }
}

fn kind_name(kind: AttemptKind) -> Option<&'static str> {
    match kind {
        AttemptKind::Retry => Some("retry"),
        AttemptKind::Transparent => Some("transparent"),
        AttemptKind::Hedge => Some("hedge"),
        AttemptKind::Continuation => Some("continuation"),
        _ => None,
    }
}

/// One attempt's span, its required attributes set at creation (samplers see them).
macro_rules! attempt_span {
    ($($parent:ident)?, $name:expr, $method:expr, $original:expr, $address:expr, $port:expr,
     $url:expr, $resends:expr, $kind:expr) => {
        tracing::span!(
            target: "tower_http_retry",
            $(parent: $parent,)?
            Level::INFO,
            SPAN_NAME,
            otel.name = $name,
            otel.kind = "client",
            otel.status_code = Empty,
            "http.request.method" = $method,
            "http.request.method_original" = $original,
            "server.address" = $address,
            "server.port" = $port,
            "url.full" = %$url,
            "http.request.resend_count" = $resends,
            "tower_http_retry.attempt.kind" = $kind,
            "http.response.status_code" = Empty,
            "network.protocol.version" = Empty,
            "error.type" = Empty,
        )
    };
}

fn make(
    parent: &tracing::Span,
    settings: &Settings,
    number: u32,
    kind: AttemptKind,
    given: &http::Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> tracing::Span {
    let known = settings.known.knows(given.as_str());
    let (name, method, original) = match known {
        true => (given.as_str(), given.as_str(), None),
        false => ("HTTP", "_OTHER", Some(given.as_str())),
    };
    let host = headers
        .get(http::header::HOST)
        .and_then(|h| h.to_str().ok());
    let target = Target::of(uri, host);
    let address = target.address();
    // An integer attribute must be an `i64` to be exported as one.
    let port = i64::from(target.port());
    let url = FullUrl {
        target: &target,
        uri,
        full: settings.full_url,
    };
    let resends = (number > 1).then(|| i64::from(number - 1));
    let kind = kind_name(kind);
    // The request's span when it is on; else the current span, as for any span.
    match parent.is_disabled() {
        true => attempt_span!(, name, method, original, address, port, url, resends, kind),
        false => attempt_span!(
            parent, name, method, original, address, port, url, resends, kind
        ),
    }
}

/// Where a request goes: the URI's scheme and authority, else the `Host` header's.
pub(crate) struct Target<'a> {
    scheme: &'a str,
    /// The authority, user info and all, as written.
    authority: &'a str,
    host: &'a str,
    port: Option<u16>,
}

impl<'a> Target<'a> {
    /// Where a request for `uri` goes, `host` its `Host` header's value, if any.
    pub(crate) fn of(uri: &'a Uri, host: Option<&'a str>) -> Self {
        // A path-only URI (HTTP/1 origin form) names no scheme: plain HTTP.
        let scheme = uri.scheme_str().unwrap_or("http");
        let authority = uri
            .authority()
            .map(|a| (a.as_str(), a.host(), a.port_u16()));
        let (authority, host, port) = authority
            .or_else(|| {
                let host = host?;
                // `host` outlives the parse: take the parts back out of it.
                let parsed: http::uri::Authority = host.parse().ok()?;
                let start = host.find(parsed.host())?;
                Some((
                    host,
                    &host[start..start + parsed.host().len()],
                    parsed.port_u16(),
                ))
            })
            .unwrap_or(("", "", None));
        Target {
            scheme,
            authority,
            host,
            port,
        }
    }

    /// `server.address`: the host, an IPv6 address without its brackets.
    pub(crate) fn address(&self) -> &'a str {
        self.host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(self.host)
    }

    /// `server.port`: the port, else the scheme's.
    pub(crate) fn port(&self) -> u16 {
        self.port.unwrap_or(match self.scheme {
            "https" | "wss" => 443,
            _ => 80,
        })
    }
}

/// `url.full`: the absolute URL without user info and, unless whole, without its query
/// string; whole, with the secret parameters' values and any user info `REDACTED`.
struct FullUrl<'a> {
    target: &'a Target<'a>,
    uri: &'a Uri,
    full: bool,
}

impl fmt::Display for FullUrl<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = self.target;
        write!(f, "{}://", target.scheme)?;
        if self.full && target.authority.contains('@') {
            f.write_str("REDACTED:REDACTED@")?;
        }
        f.write_str(target.host)?;
        if let Some(port) = target.port {
            write!(f, ":{port}")?;
        }
        f.write_str(self.uri.path())?;
        match self.uri.query() {
            Some(query) if self.full => {
                f.write_str("?")?;
                for (i, pair) in query.split('&').enumerate() {
                    if i > 0 {
                        f.write_str("&")?;
                    }
                    match pair.split_once('=') {
                        Some((key, _)) if REDACTED_PARAMETERS.contains(&key) => {
                            write!(f, "{key}=REDACTED")?
                        }
                        _ => f.write_str(pair)?,
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// Writes the attempt's context into its request with the global propagator: the span is
/// entered, and tracing-opentelemetry (its context activation, on by default) makes its
/// context the current one. A header already there is replaced, never repeated.
fn inject(span: &tracing::Span, headers: &mut HeaderMap) {
    span.in_scope(|| {
        opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.inject(&mut Headers(headers));
        });
    });
}

/// The propagator's view of a request's headers.
struct Headers<'a>(&'a mut HeaderMap);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(uri: &str, host: Option<&str>, full: bool) -> (String, String, u16) {
        let uri: Uri = uri.parse().unwrap();
        let mut headers = HeaderMap::new();
        if let Some(host) = host {
            headers.insert(http::header::HOST, host.parse().unwrap());
        }
        let host = headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok());
        let target = Target::of(&uri, host);
        let url = FullUrl {
            target: &target,
            uri: &uri,
            full,
        };
        (url.to_string(), target.address().to_owned(), target.port())
    }

    #[test]
    fn url_full_is_absolute_without_user_info_and_query_unless_whole() {
        let cases = [
            (
                "https://u:p@api.example/v1/items?token=abc",
                None,
                "https://api.example/v1/items",
                "https://REDACTED:REDACTED@api.example/v1/items?token=abc",
                "api.example",
                443,
            ),
            (
                "http://h:8080/a?sig=s&b=1&X-Amz-Signature=x&X-Amz-Credential=c&X-Amz-Security-Token=t&X-Goog-Signature=g&Sig=kept",
                None,
                "http://h:8080/a",
                "http://h:8080/a?sig=REDACTED&b=1&X-Amz-Signature=REDACTED&X-Amz-Credential=REDACTED&X-Amz-Security-Token=REDACTED&X-Goog-Signature=REDACTED&Sig=kept",
                "h",
                8080,
            ),
            (
                "/only/a/path?q=1",
                Some("[::1]:3000"),
                "http://[::1]:3000/only/a/path",
                "http://[::1]:3000/only/a/path?q=1",
                "::1",
                3000,
            ),
            ("http://h", None, "http://h/", "http://h/", "h", 80),
        ];
        for (uri, host, short, whole, address, port) in cases {
            assert_eq!(
                url(uri, host, false),
                (short.into(), address.into(), port),
                "{uri}"
            );
            assert_eq!(url(uri, host, true).0, whole, "{uri}");
        }
    }

    #[test]
    fn methods_outside_the_list_are_other() {
        let known = Known(None);
        assert!(known.knows("GET") && known.knows("QUERY") && !known.knows("PURGE"));
        assert!(!known.knows("get"));
        let set = Known(Some(vec!["GET".into(), "PURGE".into()]));
        assert!(set.knows("PURGE") && !set.knows("POST"));
    }
}
