// `Idempotency-Key`: one stable key per logical request, so a retried write is applied
// once.
//
// A POST that timed out may or may not have been applied. Sending it again is only safe
// when the server can tell the retry from a new request: where keys are turned on (a
// server that de-duplicates on them), the layer stamps a fresh random key on the request
// before the first attempt and sends the very same key on every retry, so a server that
// stores the outcome per key (Stripe's API, and the IETF `Idempotency-Key` header draft)
// applies the work once and answers repeats with the stored result. Keys are off unless
// turned on: most servers ignore the header, and a key they ignore makes a POST retryable
// without making the retry safe.
//
// By default the value is a random UUID v4 written as a structured-field string, quotes
// included (`"8e03978e-40d5-43e8-bc93-6894a57f9324"`), as the IETF draft specifies; some
// APIs (Stripe) document the bare token instead: see [`IdempotencyKey::raw`].

use std::fmt;
use std::sync::Arc;

use http::{HeaderName, HeaderValue, Method};

/// The default header name, `Idempotency-Key`.
pub(crate) const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// A generator of key tokens: `Fn() -> String`.
type MakeKey = dyn Fn() -> String + Send + Sync;

/// The default tokens: random UUID v4, their 122 random bits straight from the operating
/// system's generator (`getrandom`), so that no one can guess another request's key.
struct UuidV4;

impl UuidV4 {
    fn write(quoted: bool) -> HeaderValue {
        let mut bytes = [0u8; 16];
        // Without the operating system's generator there is no key worth sending: a
        // predictable one would let one request's stored outcome answer another's.
        getrandom::fill(&mut bytes).expect("the operating system's random number generator");
        let uuid = uuid::Builder::from_random_bytes(bytes).into_uuid();
        let mut buf = [0u8; 38];
        let start = usize::from(quoted);
        uuid.hyphenated().encode_lower(&mut buf[start..start + 36]);
        let len = if quoted {
            buf[0] = b'"';
            buf[37] = b'"';
            38
        } else {
            36
        };
        // One allocation, and clones of the value (every retry's head) share it.
        let bytes = bytes::Bytes::from_owner(buf).slice(..len);
        HeaderValue::from_maybe_shared(bytes).expect("a UUID is a valid header value")
    }
}

#[derive(Clone)]
enum Generator {
    Uuid,
    Custom(Arc<MakeKey>),
}

/// How the layer stamps idempotency keys on requests, where a policy turns them on
/// ([`RetryPolicy::idempotency_key`](crate::RetryPolicy::idempotency_key): on a route, or
/// on the layer's policy for all). Off unless turned on.
///
/// ```
/// use http::HeaderName;
/// use tower_http_retry::{IdempotencyKey, RetryLayer, RetryPolicy};
///
/// let key = IdempotencyKey::new()
///     .header_name(HeaderName::from_static("x-request-key"))
///     .raw()
///     .generator(|| format!("order-{}", 42));
/// let layer = RetryLayer::new().policy(RetryPolicy::new().idempotency_key(key));
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct IdempotencyKey {
    header: HeaderName,
    quoted: bool,
    methods: Option<Arc<[Method]>>,
    generator: Generator,
}

impl Default for IdempotencyKey {
    fn default() -> Self {
        Self {
            header: IDEMPOTENCY_KEY,
            quoted: true,
            methods: None,
            generator: Generator::Uuid,
        }
    }
}

impl IdempotencyKey {
    /// Keys in `Idempotency-Key`, a random UUID v4 written as a structured-field string
    /// (`"8e03978e-..."`, as the IETF draft specifies), on every non-idempotent method but
    /// `CONNECT`.
    ///
    /// ```
    /// use tower_http_retry::{IdempotencyKey, RetryPolicy};
    ///
    /// let policy = RetryPolicy::new().idempotency_key(IdempotencyKey::new());
    /// # let _ = policy;
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// The header that carries the key (default `Idempotency-Key`).
    ///
    /// ```
    /// use http::HeaderName;
    /// use tower_http_retry::IdempotencyKey;
    ///
    /// // An API that reads its key from a header of its own.
    /// let key = IdempotencyKey::new().header_name(HeaderName::from_static("x-request-key"));
    /// # let _ = key;
    /// ```
    pub fn header_name(mut self, name: HeaderName) -> Self {
        self.header = name;
        self
    }

    /// Writes the bare token (`8e03978e-...`) instead of the quoted default.
    ///
    /// ```
    /// use tower_http_retry::IdempotencyKey;
    ///
    /// // `Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324`, as Stripe documents it.
    /// let key = IdempotencyKey::new().raw();
    /// # let _ = key;
    /// ```
    pub fn raw(mut self) -> Self {
        self.quoted = false;
        self
    }

    /// The methods that get a key. By default every method that is not idempotent, except
    /// `CONNECT`.
    ///
    /// ```
    /// use http::Method;
    /// use tower_http_retry::IdempotencyKey;
    ///
    /// // Keys on POST and PATCH only: this API treats other methods as it documents them.
    /// let key = IdempotencyKey::new().methods([Method::POST, Method::PATCH]);
    /// # let _ = key;
    /// ```
    pub fn methods<I: IntoIterator<Item = Method>>(mut self, methods: I) -> Self {
        self.methods = Some(methods.into_iter().collect());
        self
    }

    /// Replaces the UUID v4 generator with `generator`, whose tokens must be unique per
    /// logical request. The layer quotes them (escaping `"` and `\\`) unless
    /// [`raw`](Self::raw) is set; a token that is not a valid header value is not sent (the
    /// request goes out without a key, and so is not retried unless its method is
    /// idempotent).
    ///
    /// ```
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use tower_http_retry::IdempotencyKey;
    ///
    /// // Keys that name the client and count its requests (a closure `Fn() -> String`).
    /// let next = AtomicU64::new(1);
    /// let key = IdempotencyKey::new()
    ///     .raw()
    ///     .generator(move || format!("billing-{}", next.fetch_add(1, Ordering::Relaxed)));
    /// # let _ = key;
    /// ```
    pub fn generator<G>(mut self, generator: G) -> Self
    where
        G: Fn() -> String + Send + Sync + 'static,
    {
        self.generator = Generator::Custom(Arc::new(generator));
        self
    }

    /// The header that carries the key.
    pub(crate) fn get_header_name(&self) -> &HeaderName {
        &self.header
    }

    /// True when a request with this method gets a key.
    pub(crate) fn applies_to(&self, method: &Method) -> bool {
        match &self.methods {
            Some(methods) => methods.contains(method),
            None => !method.is_idempotent() && method != Method::CONNECT,
        }
    }

    /// A new key, written as configured. `None` when a custom generator made a token that
    /// cannot be sent in a header.
    pub(crate) fn make_value(&self) -> Option<HeaderValue> {
        match &self.generator {
            Generator::Uuid => Some(UuidV4::write(self.quoted)),
            Generator::Custom(generator) => {
                let token = generator();
                let value = if self.quoted {
                    let mut quoted = String::with_capacity(token.len() + 2);
                    quoted.push('"');
                    for c in token.chars() {
                        if c == '"' || c == '\\' {
                            quoted.push('\\');
                        }
                        quoted.push(c);
                    }
                    quoted.push('"');
                    HeaderValue::try_from(quoted)
                } else {
                    HeaderValue::try_from(token)
                };
                value.ok()
            }
        }
    }
}

/// Shows what the layer stamps: the header, the form of its value (`"<UUID v4>"` for the
/// quoted default, `<UUID v4>` with [`IdempotencyKey::raw`], `<custom token>` from a
/// generator) and the methods that get one.
///
/// ```
/// use tower_http_retry::IdempotencyKey;
///
/// assert_eq!(
///     format!("{:?}", IdempotencyKey::default()),
///     r#"IdempotencyKey { header: "idempotency-key", value: "<UUID v4>", methods: every non-idempotent method but CONNECT }"#,
/// );
/// ```
impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = match self.generator {
            Generator::Uuid => "<UUID v4>",
            Generator::Custom(_) => "<custom token>",
        };
        let value = match self.quoted {
            true => format!("\"{token}\""),
            false => token.to_owned(),
        };
        let methods = match &self.methods {
            None => "every non-idempotent method but CONNECT".to_owned(),
            Some(methods) => format!("{:?}", &methods[..]),
        };
        f.debug_struct("IdempotencyKey")
            .field("header", &self.header)
            .field("value", &Text(&value))
            .field("methods", &Text(&methods))
            .finish()
    }
}

/// Text written as it is in a `Debug` struct, without quotes or escapes.
struct Text<'a>(&'a str);

impl fmt::Debug for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_uuid_v4(s: &str) -> bool {
        let u = uuid::Uuid::try_parse(s);
        matches!(u, Ok(u) if u.get_version_num() == 4)
    }

    #[test]
    fn default_is_a_quoted_uuid_v4() {
        let v = IdempotencyKey::default().make_value().unwrap();
        let s = v.to_str().unwrap();
        assert!(
            s.starts_with('"') && s.ends_with('"') && s.len() == 38,
            "{s}"
        );
        assert!(is_uuid_v4(&s[1..37]), "{s}");
    }

    #[test]
    fn raw_is_a_bare_uuid_v4() {
        let v = IdempotencyKey::default().raw().make_value().unwrap();
        assert!(is_uuid_v4(v.to_str().unwrap()));
    }

    #[test]
    fn keys_differ() {
        let k = IdempotencyKey::default();
        let a = k.make_value().unwrap();
        let b = k.make_value().unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn custom_tokens_are_quoted_and_escaped() {
        let k = IdempotencyKey::default().generator(|| r#"a"b\c"#.to_string());
        assert_eq!(k.make_value().unwrap(), r#""a\"b\\c""#);
        let raw = IdempotencyKey::default()
            .raw()
            .generator(|| "tok-1".to_string());
        assert_eq!(raw.make_value().unwrap(), "tok-1");
        let bad = IdempotencyKey::default()
            .raw()
            .generator(|| "line\nbreak".to_string());
        assert_eq!(bad.make_value(), None);
    }

    #[test]
    fn methods_default_to_non_idempotent_without_connect() {
        let k = IdempotencyKey::default();
        assert!(k.applies_to(&Method::POST));
        assert!(k.applies_to(&Method::PATCH));
        assert!(k.applies_to(&Method::from_bytes(b"PURGE").unwrap()));
        for m in [
            Method::GET,
            Method::PUT,
            Method::DELETE,
            Method::HEAD,
            Method::CONNECT,
        ] {
            assert!(!k.applies_to(&m), "{m}");
        }
        let only_patch = k.methods([Method::PATCH]);
        assert!(only_patch.applies_to(&Method::PATCH));
        assert!(!only_patch.applies_to(&Method::POST));
    }

    #[test]
    fn debug_shows_what_is_stamped() {
        assert_eq!(
            format!("{:?}", IdempotencyKey::default()),
            r#"IdempotencyKey { header: "idempotency-key", value: "<UUID v4>", methods: every non-idempotent method but CONNECT }"#
        );
        let custom = IdempotencyKey::default()
            .header_name(HeaderName::from_static("x-request-key"))
            .raw()
            .methods([Method::POST, Method::PATCH])
            .generator(|| "t".to_string());
        assert_eq!(
            format!("{custom:?}"),
            r#"IdempotencyKey { header: "x-request-key", value: <custom token>, methods: [POST, PATCH] }"#
        );
    }
}
