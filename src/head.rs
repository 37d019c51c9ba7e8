// The request head a retry is built from.
//
// Every request that may be retried keeps a copy of its head, because the inner service
// takes the request. Copying an `http::HeaderMap` allocates twice (its index table and its
// entries), on every request, for a copy that is used only when a retry happens. So unless
// a custom classifier needs the head as `http::request::Parts`, the layer keeps the header
// fields as a plain list of (name, value) pairs instead: one allocation, and nothing to
// index. The `HeaderMap` is rebuilt only for a retry.

// The list wins with a real client on loopback and roughly breaks even over a no-op service;
// BENCHMARKS.md has the figures.

use http::{
    Extensions, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version, request,
};

/// The head of a request, as kept for retries.
pub(crate) enum Head {
    /// For a custom classifier, which is given `Parts`. Boxed: `Parts` is half as large
    /// again as the compact form, and every response future would carry the difference.
    Parts(Box<request::Parts>),
    Compact(Compact),
}

pub(crate) struct Compact {
    method: Method,
    uri: Uri,
    version: Version,
    /// Every field in the order `HeaderMap::iter` gives them, repeated names included.
    fields: Vec<(HeaderName, HeaderValue)>,
    extensions: Extensions,
}

impl Head {
    /// A copy of `parts`: as `Parts` when a custom classifier will want them, else compact.
    pub(crate) fn copy(parts: &request::Parts, for_classifier: bool) -> Self {
        if for_classifier {
            return Head::Parts(Box::new(parts.clone()));
        }
        let mut fields = Vec::with_capacity(parts.headers.len());
        for (name, value) in &parts.headers {
            fields.push((name.clone(), value.clone()));
        }
        Head::Compact(Compact {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            version: parts.version,
            fields,
            extensions: parts.extensions.clone(),
        })
    }

    /// The head as `Parts`, when it is kept that way.
    pub(crate) fn as_parts(&self) -> Option<&request::Parts> {
        match self {
            Head::Parts(parts) => Some(parts),
            Head::Compact(_) => None,
        }
    }

    /// The request's method, for the logs.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) fn method(&self) -> &Method {
        match self {
            Head::Parts(parts) => &parts.method,
            Head::Compact(compact) => &compact.method,
        }
    }

    /// The request's URI, for the logs.
    #[cfg_attr(not(feature = "tracing"), allow(dead_code))]
    pub(crate) fn uri(&self) -> &Uri {
        match self {
            Head::Parts(parts) => &parts.uri,
            Head::Compact(compact) => &compact.uri,
        }
    }

    /// The request's `Host` header, if it has one that is text.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn host(&self) -> Option<&str> {
        let value = match self {
            Head::Parts(parts) => parts.headers.get(http::header::HOST),
            Head::Compact(compact) => compact
                .fields
                .iter()
                .find(|(name, _)| name == http::header::HOST)
                .map(|(_, value)| value),
        };
        value.and_then(|value| value.to_str().ok())
    }

    /// A new `Parts` equal to the original head, for the next attempt.
    pub(crate) fn to_parts(&self) -> request::Parts {
        match self {
            Head::Parts(parts) => request::Parts::clone(parts),
            Head::Compact(compact) => {
                let (mut parts, ()) = Request::new(()).into_parts();
                parts.method = compact.method.clone();
                parts.uri = compact.uri.clone();
                parts.version = compact.version;
                let mut headers = HeaderMap::with_capacity(compact.fields.len());
                for (name, value) in &compact.fields {
                    headers.append(name.clone(), value.clone());
                }
                parts.headers = headers;
                parts.extensions = compact.extensions.clone();
                parts
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> request::Parts {
        let mut request = Request::builder()
            .method(Method::PUT)
            .uri("http://example.test/a?b=c")
            .version(Version::HTTP_2)
            .header("accept", "text/plain")
            .header("x-many", "1")
            .header("content-type", "application/json")
            .header("x-many", "2")
            .header("authorization", "secret")
            .header("x-many", "3")
            .body(())
            .unwrap();
        request
            .headers_mut()
            .get_mut("authorization")
            .unwrap()
            .set_sensitive(true);
        request.extensions_mut().insert(7u32);
        request.into_parts().0
    }

    fn fields(headers: &HeaderMap) -> Vec<(String, Vec<u8>, bool)> {
        headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec(), v.is_sensitive()))
            .collect()
    }

    #[test]
    fn a_compact_head_rebuilds_the_same_parts() {
        let original = head();
        for for_classifier in [false, true] {
            let kept = Head::copy(&original, for_classifier);
            assert_eq!(kept.as_parts().is_some(), for_classifier);
            let rebuilt = kept.to_parts();
            assert_eq!(rebuilt.method, original.method);
            assert_eq!(rebuilt.uri, original.uri);
            assert_eq!(rebuilt.version, original.version);
            // Same fields, same order, repeated names in their order, sensitivity kept.
            assert_eq!(fields(&rebuilt.headers), fields(&original.headers));
            assert_eq!(
                rebuilt.headers.get_all("x-many").iter().collect::<Vec<_>>(),
                ["1", "2", "3"]
            );
            assert!(rebuilt.headers["authorization"].is_sensitive());
            assert_eq!(rebuilt.extensions.get::<u32>(), Some(&7));
        }
    }

    #[test]
    fn many_fields_are_all_kept() {
        let mut request = Request::new(());
        for i in 0..40 {
            request
                .headers_mut()
                .append(format!("x-f{i}").parse::<HeaderName>().unwrap(), i.into());
        }
        let (original, ()) = request.into_parts();
        let rebuilt = Head::copy(&original, false).to_parts();
        assert_eq!(fields(&rebuilt.headers), fields(&original.headers));
        assert_eq!(rebuilt.headers.len(), 40);
    }

    #[test]
    fn an_empty_head_stays_empty() {
        let (original, ()) = Request::new(()).into_parts();
        let rebuilt = Head::copy(&original, false).to_parts();
        assert!(rebuilt.headers.is_empty());
        assert_eq!(rebuilt.method, Method::GET);
    }
}
