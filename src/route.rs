// Per-route policies: which requests a [`RetryPolicy`](crate::RetryPolicy) applies to.
//
// Routes are tried in the order they were added; the first match wins, else the layer's
// default policy applies. Matching only compares the request's method, host and path with
// what the route holds: it allocates nothing.

use http::{Method, Request};

/// A predicate on requests: method(s), host (exact or `*.suffix`), path prefix. Every part
/// that is set must match.
///
/// ```
/// use tower_http_retry::RouteMatch;
///
/// let payments = RouteMatch::post().host("*.example.com").path_prefix("/v1/payments");
/// let req = http::Request::post("https://api.example.com/v1/payments/42").body(()).unwrap();
/// assert!(payments.matches(&req));
/// ```
#[derive(Debug, Clone, Default)]
pub struct RouteMatch {
    methods: Vec<Method>,
    host: Option<Host>,
    path_prefix: Option<String>,
}

#[derive(Debug, Clone)]
enum Host {
    Exact(String),
    /// `*.example.com` stored as `.example.com`.
    Suffix(String),
}

macro_rules! shorthand {
    ($($name:ident => $method:ident),* $(,)?) => {
        $(
            #[doc = concat!("Matches `", stringify!($method), "` requests.")]
            #[doc = ""]
            #[doc = "```"]
            #[doc = "use tower_http_retry::RouteMatch;"]
            #[doc = ""]
            #[doc = concat!("let route = RouteMatch::", stringify!($name), "();")]
            #[doc = concat!(
                "let request = http::Request::builder().method(\"",
                stringify!($method),
                "\").uri(\"http://h/\").body(()).unwrap();"
            )]
            #[doc = "assert!(route.matches(&request));"]
            #[doc = "```"]
            pub fn $name() -> Self {
                Self::methods([Method::$method])
            }
        )*
    };
}

impl RouteMatch {
    /// Matches every request.
    ///
    /// ```
    /// use tower_http_retry::RouteMatch;
    ///
    /// // Any method and path, on one host.
    /// let route = RouteMatch::any().host("search.internal");
    /// assert!(route.matches(&http::Request::delete("http://search.internal/index").body(()).unwrap()));
    /// ```
    pub fn any() -> Self {
        Self::default()
    }

    /// Matches requests with any of these methods (one, or several; the common ones also
    /// have a shorthand: [`RouteMatch::get`] and its siblings).
    ///
    /// ```
    /// use http::Method;
    /// use tower_http_retry::RouteMatch;
    ///
    /// let writes = RouteMatch::methods([Method::POST, Method::PUT, Method::PATCH]);
    /// assert!(writes.matches(&http::Request::put("http://h/items/1").body(()).unwrap()));
    /// assert!(!writes.matches(&http::Request::get("http://h/items/1").body(()).unwrap()));
    ///
    /// let queries = RouteMatch::methods([Method::from_bytes(b"QUERY").unwrap()]);
    /// let query = http::Request::builder().method("QUERY").uri("http://h/items").body(()).unwrap();
    /// assert!(queries.matches(&query));
    /// ```
    pub fn methods<I: IntoIterator<Item = Method>>(methods: I) -> Self {
        Self {
            methods: methods.into_iter().collect(),
            ..Self::default()
        }
    }

    shorthand! {
        get => GET, post => POST, put => PUT, patch => PATCH, delete => DELETE,
    }

    /// Matches this host exactly (ASCII case-insensitive), or, written `*.example.com`,
    /// every subdomain of `example.com` (not `example.com` itself). The host comes from the
    /// request URI's authority, else from its `Host` header; a port is ignored.
    ///
    /// ```
    /// use tower_http_retry::RouteMatch;
    ///
    /// let route = RouteMatch::any().host("*.example.com");
    /// assert!(route.matches(&http::Request::get("http://api.example.com/").body(()).unwrap()));
    /// ```
    pub fn host(mut self, host: &str) -> Self {
        let host = host.to_ascii_lowercase();
        self.host = Some(match host.strip_prefix('*') {
            Some(suffix) if suffix.starts_with('.') => Host::Suffix(suffix.to_string()),
            _ => Host::Exact(host),
        });
        self
    }

    /// Matches paths that start with `prefix` (`/v1/payments` matches `/v1/payments` and
    /// `/v1/payments/42`, not `/v1/paymentsx`).
    ///
    /// ```
    /// use tower_http_retry::RouteMatch;
    ///
    /// let route = RouteMatch::post().path_prefix("/v1/payments");
    /// assert!(route.matches(&http::Request::post("http://h/v1/payments/42").body(()).unwrap()));
    /// assert!(!route.matches(&http::Request::post("http://h/v1/paymentsX").body(()).unwrap()));
    /// ```
    pub fn path_prefix(mut self, prefix: &str) -> Self {
        self.path_prefix = Some(prefix.trim_end_matches('/').to_string());
        self
    }

    /// True when `request` matches every part that is set.
    ///
    /// ```
    /// use tower_http_retry::RouteMatch;
    ///
    /// let route = RouteMatch::get().path_prefix("/v1/search");
    /// assert!(route.matches(&http::Request::get("http://h/v1/search?q=tower").body(()).unwrap()));
    /// assert!(!route.matches(&http::Request::post("http://h/v1/search").body(()).unwrap()));
    /// ```
    pub fn matches<B>(&self, request: &Request<B>) -> bool {
        self.matches_parts(request.method(), request.uri(), request.headers())
    }

    pub(crate) fn matches_parts(
        &self,
        method: &Method,
        uri: &http::Uri,
        headers: &http::HeaderMap,
    ) -> bool {
        if !self.methods.is_empty() && !self.methods.contains(method) {
            return false;
        }
        if let Some(expected) = &self.host {
            let host = uri.host().or_else(|| {
                headers
                    .get(http::header::HOST)
                    .and_then(|v| v.to_str().ok())
                    .map(strip_port)
            });
            let Some(host) = host else { return false };
            let host = host.strip_suffix('.').unwrap_or(host);
            let ok = match expected {
                Host::Exact(name) => host.eq_ignore_ascii_case(name),
                Host::Suffix(suffix) => {
                    host.len() > suffix.len()
                        && host.is_char_boundary(host.len() - suffix.len())
                        && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
                }
            };
            if !ok {
                return false;
            }
        }
        if let Some(prefix) = &self.path_prefix {
            let path = uri.path();
            let ok = path.starts_with(prefix.as_str())
                && matches!(path.as_bytes().get(prefix.len()), None | Some(b'/'));
            if !ok {
                return false;
            }
        }
        true
    }
}

fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        // An IPv6 literal: keep the brackets, drop the port after them.
        return host
            .split_once(']')
            .map_or(host, |(h, _)| &host[..h.len() + 1]);
    }
    host.rsplit_once(':').map_or(host, |(h, _)| h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: Method, uri: &str) -> Request<()> {
        Request::builder().method(method).uri(uri).body(()).unwrap()
    }

    #[test]
    fn routing_matrix() {
        let route = RouteMatch::methods([Method::POST, Method::PATCH])
            .host("*.example.com")
            .path_prefix("/v1/payments/");
        let cases = [
            (Method::POST, "https://api.example.com/v1/payments", true),
            (Method::PATCH, "https://API.Example.com/v1/payments/9", true),
            (Method::GET, "https://api.example.com/v1/payments", false),
            (Method::POST, "https://example.com/v1/payments", false),
            (Method::POST, "https://api.example.org/v1/payments", false),
            (Method::POST, "https://api.example.com/v1/paymentsx", false),
            (Method::POST, "https://api.example.com/v2/payments", false),
            (Method::POST, "/v1/payments", false),
        ];
        for (m, uri, expected) in cases {
            assert_eq!(route.matches(&req(m.clone(), uri)), expected, "{m} {uri}");
        }
    }

    #[test]
    fn host_header_and_ports() {
        let route = RouteMatch::any().host("svc.internal");
        let mut r = req(Method::GET, "/x");
        assert!(!route.matches(&r));
        r.headers_mut()
            .insert(http::header::HOST, "svc.internal:8080".parse().unwrap());
        assert!(route.matches(&r));
        assert!(route.matches(&req(Method::GET, "http://svc.internal:9/")));
        assert_eq!(strip_port("[::1]:80"), "[::1]");
    }

    #[test]
    fn any_matches_everything() {
        assert!(RouteMatch::any().matches(&req(Method::DELETE, "/")));
        assert!(RouteMatch::get().matches(&req(Method::GET, "http://a/b")));
        assert!(!RouteMatch::get().matches(&req(Method::HEAD, "http://a/b")));
    }
}
