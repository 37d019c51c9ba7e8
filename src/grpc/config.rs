// Reading a standard gRPC service config: per-method retry policies and retry
// throttling (A6 "Integration with Service Config").

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value};
use tonic::Code;

use crate::backoff::Backoff;
use crate::error::InvalidConfig;
use crate::gate::Throttle;
use crate::policy::RetryPolicy;
use crate::route::RouteMatch;

/// A6's client-side cap on `maxAttempts`: higher values are taken as this.
pub(crate) const MAX_ATTEMPTS_CAP: u32 = 5;

/// Largest seconds value of a protobuf `Duration` (10 000 years).
const MAX_DURATION_SECONDS: u64 = 315_576_000_000;

/// Reads a gRPC service config (the JSON form of `grpc.service_config.ServiceConfig`) for
/// what retries need: every `methodConfig` entry's names, `retryPolicy` and `timeout`, and
/// `retryThrottling`. Other fields (`loadBalancingConfig`, `waitForReady`, message size
/// limits, ...) are ignored.
///
/// The rules, A6's and grpc-go's:
///
/// - `name[]` entries: `{"service": "pkg.Svc", "method": "Get"}` is one method,
///   `{"service": "pkg.Svc"}` every method of a service, `{}` (or an empty service)
///   the default for every method. A method without a service is refused, and so is
///   the same name given twice. An entry with no `name` applies to nothing and is
///   skipped.
/// - `retryPolicy`: `maxAttempts` an integer of at least 2, taken as 5 when higher (A6's
///   client-side cap); `initialBackoff` and `maxBackoff` protobuf JSON durations (`"0.1s"`,
///   `".5s"`, `"2s"`) greater than zero; `backoffMultiplier` a number greater than zero;
///   `retryableStatusCodes` a non-empty list of code names (`"UNAVAILABLE"`) or numbers
///   (`14`), `OK` excepted (it is not a failure). An entry without one is not retried.
///   `hedgingPolicy` is not supported: an entry with only that is not retried, and an entry
///   with both is refused, as A6 allows only one.
/// - `timeout`: a duration, the method's deadline across all attempts.
/// - `retryThrottling`: `maxTokens` in `(0, 1000]` and `tokenRatio` greater than 0
///   become a [`Throttle`], shared by every method (A6 throttles per server).
///
/// # Errors
///
/// [`InvalidServiceConfig`] for text that is not JSON, or for a field that is missing,
/// of the wrong type or out of range; its [`field`](InvalidServiceConfig::field) says which
/// one, as a path like `methodConfig[0].retryPolicy.maxAttempts`.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tower_http_retry::grpc::service_config;
///
/// let config = service_config(r#"{
///   "methodConfig": [{
///     "name": [{"service": "shop.Cart"}, {"service": "shop.Stock", "method": "Get"}],
///     "retryPolicy": {
///       "maxAttempts": 4,
///       "initialBackoff": "0.1s",
///       "maxBackoff": "1s",
///       "backoffMultiplier": 2,
///       "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]
///     }
///   }],
///   "retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}
/// }"#).unwrap();
///
/// let entry = &config.methods()[0];
/// let retry = entry.retry().unwrap();
/// assert_eq!(retry.max_attempts, 4);
/// assert_eq!(retry.initial_backoff, Duration::from_millis(100));
/// assert!(retry.retries(Code::Unavailable));
/// assert!(entry.names()[1].matches("/shop.Stock/Get"));
/// assert!(!entry.names().iter().any(|name| name.matches("/shop.Stock/Put")));
/// assert_eq!(config.throttle().unwrap().max_tokens(), 10.0);
///
/// let error = service_config(r#"{"methodConfig": [{"name": [{}],
///     "retryPolicy": {"maxAttempts": 1}}]}"#).unwrap_err();
/// assert_eq!(error.field(), "methodConfig[0].retryPolicy.maxAttempts");
/// ```
pub fn service_config(json: &str) -> Result<ServiceConfig, InvalidServiceConfig> {
    let value: Value = serde_json::from_str(json)
        .map_err(|e| InvalidServiceConfig::new("", format!("not valid JSON: {e}")))?;
    let top = as_object(&value, "")?;

    let mut methods = Vec::new();
    // Each path, with where it was first named.
    let mut seen: HashMap<String, String> = HashMap::new();
    if let Some(list) = present(top, "methodConfig") {
        let list = as_array(list, "methodConfig")?;
        for (i, entry) in list.iter().enumerate() {
            let at = format!("methodConfig[{i}]");
            let entry = as_object(entry, &at)?;
            let names = match present(entry, "name") {
                Some(names) => parse_names(names, &at, &mut seen)?,
                None => Vec::new(),
            };
            let retry = match (
                present(entry, "retryPolicy"),
                present(entry, "hedgingPolicy"),
            ) {
                (Some(_), Some(_)) => {
                    return Err(InvalidServiceConfig::new(
                        &at,
                        "has both retryPolicy and hedgingPolicy; only one may be set",
                    ));
                }
                (Some(policy), None) => {
                    Some(parse_retry_policy(policy, &format!("{at}.retryPolicy"))?)
                }
                (None, _) => None,
            };
            let timeout = match present(entry, "timeout") {
                Some(timeout) => Some(parse_duration_field(timeout, &format!("{at}.timeout"))?),
                None => None,
            };
            if !names.is_empty() {
                methods.push(MethodConfig {
                    names,
                    retry,
                    timeout,
                });
            }
        }
    }

    let throttle = match present(top, "retryThrottling") {
        Some(throttling) => Some(parse_throttling(throttling)?),
        None => None,
    };
    Ok(ServiceConfig { methods, throttle })
}

/// What [`service_config`] read: the method configs that name something, and the
/// optional throttle. [`RetryLayer::from_service_config`] makes the layer it describes.
///
/// [`RetryLayer::from_service_config`]: crate::RetryLayer::from_service_config
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    methods: Vec<MethodConfig>,
    throttle: Option<Throttle>,
}

impl ServiceConfig {
    /// The `methodConfig` entries that name at least one method, in their order.
    pub fn methods(&self) -> &[MethodConfig] {
        &self.methods
    }

    /// The throttle made from `retryThrottling`, if the config had one. Every call
    /// returns the same shared handle.
    pub fn throttle(&self) -> Option<&Throttle> {
        self.throttle.as_ref()
    }

    /// The method config that applies to a request path (`/package.Service/Method`), by
    /// gRPC's precedence: the entry naming the method, else the one naming its service,
    /// else the default one. The tests' reading of the precedence, against which the
    /// order of [`ServiceConfig::routes`] is checked.
    #[cfg(test)]
    pub(crate) fn method_for_path(&self, path: &str) -> Option<&MethodConfig> {
        let (service, _method) = split_path(path)?;
        let mut by_service = None;
        let mut by_default = None;
        for config in &self.methods {
            for name in &config.names {
                match name {
                    MethodName::Method { .. } if name.matches(path) => return Some(config),
                    MethodName::Service { service: s } if s == service => {
                        by_service.get_or_insert(config);
                    }
                    MethodName::Default => {
                        by_default.get_or_insert(config);
                    }
                    _ => {}
                }
            }
        }
        by_service.or(by_default)
    }

    /// The retry parameters for a request path: those of [`Self::method_for_path`]'s
    /// config, `None` when it has no retry policy (a more specific entry without one
    /// turns retries off for its methods) or when no entry applies.
    #[cfg(test)]
    pub(crate) fn retry_for_path(&self, path: &str) -> Option<&RetryParams> {
        self.method_for_path(path)?.retry.as_ref()
    }

    /// Every name with its method config, as crate routes, most specific first: the
    /// single methods, then the services, then the default. Routes are tried in order
    /// and the first match wins, so adding them in this order to a layer gives gRPC's
    /// precedence. Every route matches `POST` only (every gRPC call is a POST).
    ///
    /// ```
    /// use tower_http_retry::grpc::service_config;
    ///
    /// let config = service_config(r#"{"methodConfig": [
    ///   {"name": [{}], "timeout": "5s"},
    ///   {"name": [{"service": "a.B", "method": "C"}], "timeout": "1s"}
    /// ]}"#).unwrap();
    /// let routes = config.routes();
    /// let call = http::Request::post("http://h/a.B/C").body(()).unwrap();
    /// assert!(routes[0].0.matches(&call));
    /// assert_eq!(routes[0].1.timeout(), Some(std::time::Duration::from_secs(1)));
    /// ```
    pub fn routes(&self) -> Vec<(RouteMatch, &MethodConfig)> {
        let mut named: Vec<(u8, &MethodName, &MethodConfig)> = self
            .methods
            .iter()
            .flat_map(|config| config.names.iter().map(move |name| (name, config)))
            .map(|(name, config)| {
                let rank = match name {
                    MethodName::Method { .. } => 0,
                    MethodName::Service { .. } => 1,
                    MethodName::Default => 2,
                };
                (rank, name, config)
            })
            .collect();
        // Stable: within a rank, the config's order.
        named.sort_by_key(|(rank, _, _)| *rank);
        named
            .into_iter()
            .map(|(_, name, config)| (name.route_match(), config))
            .collect()
    }
}

/// The `/service/method` parts of a gRPC request path.
fn split_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix('/')?;
    let (service, method) = rest.split_once('/')?;
    Some((service, method))
}

/// One `methodConfig` entry: the names it applies to, its retry policy and timeout.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodConfig {
    names: Vec<MethodName>,
    retry: Option<RetryParams>,
    timeout: Option<Duration>,
}

impl MethodConfig {
    /// The names this entry applies to (never empty).
    pub fn names(&self) -> &[MethodName] {
        &self.names
    }

    /// Its `retryPolicy`, if it had one.
    pub fn retry(&self) -> Option<&RetryParams> {
        self.retry.as_ref()
    }

    /// Its `timeout`: the deadline of an RPC across all its attempts.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The crate's policy for this entry's methods, as gRPC's clients apply the entry:
    ///
    /// - with a `retryPolicy`: a gRPC policy ([`RetryPolicy::grpc_codes`]) retrying its
    ///   `retryableStatusCodes`, with its `maxAttempts` (at most 5) and A6's backoff: retry
    ///   `n` waits uniform in `[0, min(maxBackoff, initialBackoff *
    ///   backoffMultiplier^(n-1))]`, [`Backoff`] with the `backoffMultiplier` and
    ///   [`Jitter::Full`](crate::Jitter::Full);
    /// - without one: a gRPC policy that retries no status code and makes one attempt
    ///   (gRPC's classification still applies, and so does A6's transparent retry of a
    ///   stream refused before it left, which no retry configuration turns off);
    /// - its `timeout`, if any, is the policy's [`deadline`](RetryPolicy::deadline): one
    ///   deadline for the RPC across all its attempts and waits, sent to the server as
    ///   `grpc-timeout` (the time left) on every attempt. As with gRPC's own clients, a
    ///   shorter `grpc-timeout` of the caller's (tonic's `Request::set_timeout`) applies
    ///   instead.
    ///
    /// Everything else is [`RetryPolicy::default`]'s (no attempt timeout, no budget of its
    /// own). [`RetryLayer::from_service_config`](crate::RetryLayer::from_service_config)
    /// builds a whole layer from these; call this to adjust one entry's policy first (an
    /// attempt timeout, say) and add the routes yourself.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tonic::Code;
    /// use tower_http_retry::grpc::service_config;
    ///
    /// let config = service_config(r#"{"methodConfig": [{
    ///   "name": [{"service": "shop.Cart"}],
    ///   "timeout": "2s",
    ///   "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
    ///                   "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE"]}
    /// }]}"#).unwrap();
    /// let policy = config.methods()[0].policy();
    /// assert_eq!(policy.get_max_attempts(), 4);
    /// assert_eq!(policy.get_deadline(), Some(Duration::from_secs(2)));
    /// assert_eq!(policy.get_backoff().ceiling(1), Duration::from_millis(100));
    /// assert_eq!(policy.get_backoff().ceiling(2), Duration::from_millis(150));
    /// assert!(policy.has_transparent_retry());
    /// ```
    pub fn policy(&self) -> RetryPolicy {
        let policy = match &self.retry {
            Some(retry) => RetryPolicy::default()
                .max_attempts(retry.max_attempts)
                .backoff(retry.backoff())
                .grpc_codes(retry.retryable_status_codes.iter().copied()),
            None => RetryPolicy::default().max_attempts(1).grpc_codes([]),
        };
        match self.timeout {
            Some(timeout) => policy.deadline(timeout),
            None => policy,
        }
    }
}

/// What a `methodConfig` name applies to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MethodName {
    /// One method: the path `/service/method`.
    Method {
        /// The fully qualified service, such as `package.Service`.
        service: String,
        /// The method, such as `Get`.
        method: String,
    },
    /// Every method of a service: paths starting with `/service/`.
    Service {
        /// The fully qualified service.
        service: String,
    },
    /// Every method (an empty name): the default.
    Default,
}

impl MethodName {
    /// The path (`/package.Service/Method`), the path prefix (`/package.Service/`), or
    /// the empty string for the default, as grpc-go keys its method configs.
    pub fn path(&self) -> String {
        match self {
            MethodName::Method { service, method } => format!("/{service}/{method}"),
            MethodName::Service { service } => format!("/{service}/"),
            MethodName::Default => String::new(),
        }
    }

    /// True when a request to `path` is named by this (without precedence: see
    /// [`ServiceConfig::routes`]).
    pub fn matches(&self, path: &str) -> bool {
        match (self, split_path(path)) {
            (MethodName::Method { service, method }, Some((s, m))) => s == service && m == method,
            (MethodName::Service { service }, Some((s, _))) => s == service,
            (MethodName::Default, _) => true,
            _ => false,
        }
    }

    /// A crate route for these requests: `POST` with the path prefix `/service/method`
    /// or `/service` (a prefix matches whole segments only), or any `POST` for the
    /// default.
    pub fn route_match(&self) -> RouteMatch {
        match self {
            MethodName::Method { service, method } => {
                RouteMatch::post().path_prefix(&format!("/{service}/{method}"))
            }
            MethodName::Service { service } => {
                RouteMatch::post().path_prefix(&format!("/{service}"))
            }
            MethodName::Default => RouteMatch::post(),
        }
    }
}

/// A `retryPolicy`, as plain data.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct RetryParams {
    /// Attempts in all, the first included: 2 to 5 (A6 caps a larger `maxAttempts` at 5).
    pub max_attempts: u32,
    /// The first retry's backoff ceiling. Greater than zero.
    pub initial_backoff: Duration,
    /// No backoff ceiling exceeds this. Greater than zero.
    pub max_backoff: Duration,
    /// Each further retry's ceiling is this many times the last. Greater than zero.
    pub backoff_multiplier: f64,
    /// The codes to retry, without duplicates, in the config's order. Never empty, never
    /// `OK`.
    pub retryable_status_codes: Vec<Code>,
}

impl RetryParams {
    /// True when `code` is one of the retryable codes.
    pub fn retries(&self, code: Code) -> bool {
        self.retryable_status_codes.contains(&code)
    }

    /// A6's backoff for these parameters: retry `n` (1 for the first, counted from the
    /// last pushback) waits uniform in `[0, min(maxBackoff, initialBackoff *
    /// backoffMultiplier^(n-1))]`, the crate's [`Backoff::from_initial`] with the
    /// multiplier and [`Jitter::Full`](crate::Jitter::Full) (or
    /// [`Jitter::Proportional`](crate::Jitter::Proportional), A6 as amended in 2024, with
    /// [`Backoff::jitter`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry::grpc::service_config;
    ///
    /// let config = service_config(r#"{"methodConfig": [{"name": [{}], "retryPolicy": {
    ///     "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
    ///     "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#).unwrap();
    /// let backoff = config.methods()[0].retry().unwrap().backoff();
    /// assert_eq!(backoff.ceiling(1), Duration::from_millis(100));
    /// assert_eq!(backoff.ceiling(3), Duration::from_millis(225));
    /// ```
    pub fn backoff(&self) -> Backoff {
        // The multiplier was checked when the config was read: finite and above zero.
        Backoff::from_initial(self.initial_backoff, self.max_backoff)
            .try_multiplier(self.backoff_multiplier)
            .unwrap_or_else(|_| Backoff::from_initial(self.initial_backoff, self.max_backoff))
    }
}

/// A service config that [`service_config`] refused: which field, and why.
///
/// ```
/// use tower_http_retry::grpc::service_config;
///
/// let error = service_config(r#"{"retryThrottling": {"maxTokens": 10}}"#).unwrap_err();
/// assert_eq!(error.field(), "retryThrottling.tokenRatio");
/// assert_eq!(
///     error.to_string(),
///     "invalid gRPC service config: retryThrottling.tokenRatio: is missing; it is required",
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidServiceConfig {
    field: String,
    message: String,
}

impl InvalidServiceConfig {
    fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.to_string(),
            message: message.into(),
        }
    }

    /// The field at fault, as a path such as `methodConfig[2].name[0].method`; empty when
    /// the whole text is at fault (not JSON, or not an object).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong with it.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for InvalidServiceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("invalid gRPC service config: ")?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

impl StdError for InvalidServiceConfig {}

impl From<InvalidServiceConfig> for InvalidConfig {
    fn from(error: InvalidServiceConfig) -> Self {
        InvalidConfig::new(crate::error::ConfigKind::Protocol, error.to_string())
    }
}

/// The field, unless absent or `null` (protobuf JSON reads `null` as the default).
fn present<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get(key).filter(|v| !v.is_null())
}

fn required<'a>(
    object: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a Value, InvalidServiceConfig> {
    present(object, key).ok_or_else(|| InvalidServiceConfig::new(at, "is missing; it is required"))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(value: &Value, at: &str, expected: &str) -> InvalidServiceConfig {
    InvalidServiceConfig::new(at, format!("is {}; it must be {expected}", kind(value)))
}

fn as_object<'a>(
    value: &'a Value,
    at: &str,
) -> Result<&'a Map<String, Value>, InvalidServiceConfig> {
    value
        .as_object()
        .ok_or_else(|| wrong_type(value, at, "an object"))
}

fn as_array<'a>(value: &'a Value, at: &str) -> Result<&'a Vec<Value>, InvalidServiceConfig> {
    value
        .as_array()
        .ok_or_else(|| wrong_type(value, at, "an array"))
}

fn as_string<'a>(value: &'a Value, at: &str) -> Result<&'a str, InvalidServiceConfig> {
    value
        .as_str()
        .ok_or_else(|| wrong_type(value, at, "a string"))
}

fn as_number(value: &Value, at: &str) -> Result<f64, InvalidServiceConfig> {
    value
        .as_f64()
        .ok_or_else(|| wrong_type(value, at, "a number"))
}

fn parse_names(
    names: &Value,
    at: &str,
    seen: &mut HashMap<String, String>,
) -> Result<Vec<MethodName>, InvalidServiceConfig> {
    let list = as_array(names, &format!("{at}.name"))?;
    let mut out = Vec::with_capacity(list.len());
    for (j, name) in list.iter().enumerate() {
        let here = format!("{at}.name[{j}]");
        let object = as_object(name, &here)?;
        let text = |key: &str| -> Result<&str, InvalidServiceConfig> {
            match present(object, key) {
                Some(value) => as_string(value, &format!("{here}.{key}")),
                None => Ok(""),
            }
        };
        let (service, method) = (text("service")?, text("method")?);
        // A path is `/service/method`: a `/` inside either name could match no call (and
        // a route built from it would match calls it does not name).
        for (key, value) in [("service", service), ("method", method)] {
            if value.contains('/') {
                return Err(InvalidServiceConfig::new(
                    &format!("{here}.{key}"),
                    format!("is {value:?}; a gRPC {key} name has no '/'"),
                ));
            }
        }
        let parsed = match (service, method) {
            ("", "") => MethodName::Default,
            ("", _) => {
                return Err(InvalidServiceConfig::new(
                    &format!("{here}.method"),
                    format!("is {method:?} with an empty service; a method needs its service"),
                ));
            }
            (service, "") => MethodName::Service {
                service: service.to_string(),
            },
            (service, method) => MethodName::Method {
                service: service.to_string(),
                method: method.to_string(),
            },
        };
        let key = parsed.path();
        if let Some(first) = seen.get(&key) {
            let what = if key.is_empty() {
                "the default name".to_string()
            } else {
                format!("{key:?}")
            };
            return Err(InvalidServiceConfig::new(
                &here,
                format!("names {what} again (first named at {first})"),
            ));
        }
        seen.insert(key, here);
        out.push(parsed);
    }
    Ok(out)
}

fn parse_retry_policy(policy: &Value, at: &str) -> Result<RetryParams, InvalidServiceConfig> {
    let policy = as_object(policy, at)?;
    let field = |key: &str| format!("{at}.{key}");

    let max_attempts = {
        let at = field("maxAttempts");
        let value = required(policy, "maxAttempts", &at)?;
        let n = as_number(value, &at)?;
        if n.fract() != 0.0 {
            return Err(InvalidServiceConfig::new(
                &at,
                format!("is {n}; it must be a whole number"),
            ));
        }
        if n < 2.0 {
            return Err(InvalidServiceConfig::new(
                &at,
                format!("is {n}; it must be at least 2 (the first attempt and a retry)"),
            ));
        }
        // A6: higher values are taken as the client's cap.
        if n >= f64::from(MAX_ATTEMPTS_CAP) {
            MAX_ATTEMPTS_CAP
        } else {
            n as u32
        }
    };

    let positive_duration = |key: &str| -> Result<Duration, InvalidServiceConfig> {
        let at = field(key);
        let duration = parse_duration_field(required(policy, key, &at)?, &at)?;
        if duration.is_zero() {
            return Err(InvalidServiceConfig::new(
                &at,
                "is zero; it must be greater than zero",
            ));
        }
        Ok(duration)
    };
    let initial_backoff = positive_duration("initialBackoff")?;
    let max_backoff = positive_duration("maxBackoff")?;

    let backoff_multiplier = {
        let at = field("backoffMultiplier");
        let m = as_number(required(policy, "backoffMultiplier", &at)?, &at)?;
        if !(m > 0.0 && m.is_finite()) {
            return Err(InvalidServiceConfig::new(
                &at,
                format!("is {m}; it must be greater than zero"),
            ));
        }
        m
    };

    let retryable_status_codes = {
        let at = field("retryableStatusCodes");
        let list = as_array(required(policy, "retryableStatusCodes", &at)?, &at)?;
        if list.is_empty() {
            return Err(InvalidServiceConfig::new(
                &at,
                "is empty; it must list at least one status code",
            ));
        }
        let mut codes = Vec::with_capacity(list.len());
        for (k, value) in list.iter().enumerate() {
            let code = parse_code(value, &format!("{at}[{k}]"))?;
            if !codes.contains(&code) {
                codes.push(code);
            }
        }
        codes
    };

    Ok(RetryParams {
        max_attempts,
        initial_backoff,
        max_backoff,
        backoff_multiplier,
        retryable_status_codes,
    })
}

/// The status code names of the gRPC status code document, by number.
const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The gRPC name of a status code (`UNAVAILABLE` for [`Code::Unavailable`]), as service
/// configs spell them.
pub(crate) fn code_name(code: Code) -> &'static str {
    CODE_NAMES[code as usize]
}

fn parse_code(value: &Value, at: &str) -> Result<Code, InvalidServiceConfig> {
    let number = match value {
        Value::String(name) => match CODE_NAMES.iter().position(|n| n == name) {
            Some(n) => n,
            None => {
                let hint = CODE_NAMES
                    .iter()
                    .find(|n| n.eq_ignore_ascii_case(name))
                    .map(|n| format!(" (names are upper case: {n})"))
                    .unwrap_or_default();
                return Err(InvalidServiceConfig::new(
                    at,
                    format!("is {name:?}, which is not a status code name{hint}"),
                ));
            }
        },
        Value::Number(n) => match n.as_u64().filter(|&n| n <= 16) {
            Some(n) => n as usize,
            None => {
                return Err(InvalidServiceConfig::new(
                    at,
                    format!("is {n}; a status code number is a whole number from 0 to 16"),
                ));
            }
        },
        other => return Err(wrong_type(other, at, "a status code name or number")),
    };
    if number == 0 {
        return Err(InvalidServiceConfig::new(
            at,
            "is OK, which is not a failure and cannot be retried",
        ));
    }
    Ok(Code::from_i32(number as i32))
}

fn parse_duration_field(value: &Value, at: &str) -> Result<Duration, InvalidServiceConfig> {
    let text = as_string(value, at)?;
    match parse_proto_duration(text) {
        Ok((false, duration)) => Ok(duration),
        Ok((true, _)) => Err(InvalidServiceConfig::new(
            at,
            format!("is {text:?}, which is negative"),
        )),
        Err(why) => Err(InvalidServiceConfig::new(
            at,
            format!(
                "is {text:?}, which is not a duration ({why}); write seconds with an \"s\", such as \"0.1s\" or \"2s\""
            ),
        )),
    }
}

/// Parses the protobuf JSON form of a `Duration`: an optional `-`, seconds, an optional
/// fraction of up to 9 digits, and `s` (`"1.5s"`, `".1s"`, `"-2s"`). Returns whether it is
/// negative, and its size.
pub(crate) fn parse_proto_duration(text: &str) -> Result<(bool, Duration), &'static str> {
    let body = text.strip_suffix('s').ok_or("no \"s\" at the end")?;
    let (negative, body) = match body.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, body),
    };
    let (whole, fraction) = match body.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (body, ""),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err("no digits");
    }
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(fraction) {
        return Err("only digits and one \".\" may come before the \"s\"");
    }
    if fraction.len() > 9 {
        return Err("more than 9 digits after the \".\"");
    }
    let seconds = if whole.is_empty() {
        0
    } else {
        whole
            .parse::<u64>()
            .ok()
            .filter(|&s| s <= MAX_DURATION_SECONDS)
            .ok_or("more than 315576000000 seconds")?
    };
    let nanos = if fraction.is_empty() {
        0
    } else {
        let scale = 10u32.pow(9 - fraction.len() as u32);
        fraction.parse::<u32>().map_err(|_| "bad fraction")? * scale
    };
    Ok((negative, Duration::new(seconds, nanos)))
}

fn parse_throttling(value: &Value) -> Result<Throttle, InvalidServiceConfig> {
    let at = "retryThrottling";
    let object = as_object(value, at)?;
    let max_at = format!("{at}.maxTokens");
    let max_tokens = as_number(required(object, "maxTokens", &max_at)?, &max_at)?;
    let ratio_at = format!("{at}.tokenRatio");
    let token_ratio = as_number(required(object, "tokenRatio", &ratio_at)?, &ratio_at)?;
    if !(max_tokens > 0.0 && max_tokens <= 1000.0) {
        return Err(InvalidServiceConfig::new(
            &max_at,
            format!("is {max_tokens}; it must be greater than 0 and at most 1000"),
        ));
    }
    if token_ratio.is_nan() || token_ratio <= 0.0 {
        return Err(InvalidServiceConfig::new(
            &ratio_at,
            format!("is {token_ratio}; it must be greater than 0"),
        ));
    }
    Throttle::builder()
        .max_tokens(max_tokens)
        .token_ratio(token_ratio)
        .try_build()
        .map_err(|error| {
            // Left: the values below a thousandth.
            let field = if error.to_string().contains("max_tokens") {
                max_at
            } else {
                ratio_at
            };
            InvalidServiceConfig::new(&field, error.to_string())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    fn refused(json: &str) -> InvalidServiceConfig {
        service_config(json).expect_err("this config must be refused")
    }

    fn policy(fields: &str) -> String {
        let base = [
            ("maxAttempts", "3"),
            ("initialBackoff", "\"0.1s\""),
            ("maxBackoff", "\"1s\""),
            ("backoffMultiplier", "2"),
            ("retryableStatusCodes", "[\"UNAVAILABLE\"]"),
        ];
        let overrides: Vec<(&str, &str)> = fields
            .split(';')
            .filter(|f| !f.is_empty())
            .map(|f| f.split_once('=').unwrap())
            .collect();
        let mut parts = Vec::new();
        for (key, value) in base {
            match overrides.iter().find(|(k, _)| *k == key) {
                Some((_, "-")) => {}
                Some((_, v)) => parts.push(format!("\"{key}\": {v}")),
                None => parts.push(format!("\"{key}\": {value}")),
            }
        }
        format!(
            r#"{{"methodConfig": [{{"name": [{{"service": "a.B"}}], "retryPolicy": {{{}}}}}]}}"#,
            parts.join(", ")
        )
    }

    fn params(fields: &str) -> RetryParams {
        let config = service_config(&policy(fields)).expect("valid");
        config.methods()[0].retry().unwrap().clone()
    }

    fn refusal(fields: &str) -> (String, String) {
        let error = refused(&policy(fields));
        (error.field().to_string(), error.to_string())
    }

    #[test]
    fn reads_a_full_policy() {
        let retry = params("retryableStatusCodes=[\"UNAVAILABLE\", 8, \"ABORTED\", 14]");
        assert_eq!(
            retry,
            RetryParams {
                max_attempts: 3,
                initial_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(1),
                backoff_multiplier: 2.0,
                retryable_status_codes: vec![
                    Code::Unavailable,
                    Code::ResourceExhausted,
                    Code::Aborted
                ],
            }
        );
        assert!(retry.retries(Code::Aborted));
        assert!(!retry.retries(Code::Internal));
        assert_eq!(retry.backoff().ceiling(3), Duration::from_millis(400));
    }

    #[test]
    fn max_attempts_is_capped_at_five_and_must_be_two_or_more() {
        assert_eq!(params("maxAttempts=5").max_attempts, 5);
        assert_eq!(params("maxAttempts=6").max_attempts, 5);
        assert_eq!(params("maxAttempts=1e300").max_attempts, 5);
        assert_eq!(params("maxAttempts=2.0").max_attempts, 2);
        let field = "methodConfig[0].retryPolicy.maxAttempts";
        for (value, says) in [
            ("1", "is 1; it must be at least 2"),
            ("0", "is 0; it must be at least 2"),
            ("-3", "is -3; it must be at least 2"),
            ("2.5", "is 2.5; it must be a whole number"),
            ("\"3\"", "is a string; it must be a number"),
            ("-", "is missing; it is required"),
            ("null", "is missing; it is required"),
        ] {
            let (at, text) = refusal(&format!("maxAttempts={value}"));
            assert_eq!(at, field, "{value}");
            assert!(text.contains(says), "{value}: {text}");
            assert!(text.starts_with(&format!("invalid gRPC service config: {field}: ")));
        }
    }

    #[test]
    fn backoffs_are_positive_protobuf_durations() {
        assert_eq!(
            params("initialBackoff=\".5s\"").initial_backoff,
            Duration::from_millis(500)
        );
        assert_eq!(
            params("maxBackoff=\"1.000000001s\"").max_backoff,
            Duration::new(1, 1)
        );
        assert_eq!(
            params("maxBackoff=\"30s\"").max_backoff,
            Duration::from_secs(30)
        );
        for (key, value, says) in [
            ("initialBackoff", "\"0s\"", "is zero"),
            ("initialBackoff", "\"0.0s\"", "is zero"),
            ("maxBackoff", "\"-1s\"", "which is negative"),
            ("initialBackoff", "\"100ms\"", "not a duration"),
            ("initialBackoff", "\"0.1\"", "no \"s\" at the end"),
            ("maxBackoff", "\"s\"", "no digits"),
            ("maxBackoff", "\"1.2.3s\"", "only digits"),
            ("maxBackoff", "\"1.0000000001s\"", "more than 9 digits"),
            (
                "maxBackoff",
                "\"315576000001s\"",
                "more than 315576000000 seconds",
            ),
            ("maxBackoff", "0.1", "is a number; it must be a string"),
            ("initialBackoff", "-", "is missing"),
        ] {
            let (at, text) = refusal(&format!("{key}={value}"));
            assert_eq!(at, format!("methodConfig[0].retryPolicy.{key}"), "{value}");
            assert!(text.contains(says), "{value}: {text}");
        }
    }

    #[test]
    fn the_multiplier_is_a_positive_number() {
        assert_eq!(params("backoffMultiplier=1.5").backoff_multiplier, 1.5);
        for (value, says) in [
            ("0", "is 0; it must be greater than zero"),
            ("-1", "is -1; it must be greater than zero"),
            ("\"2\"", "is a string"),
            ("-", "is missing"),
        ] {
            let (at, text) = refusal(&format!("backoffMultiplier={value}"));
            assert_eq!(at, "methodConfig[0].retryPolicy.backoffMultiplier");
            assert!(text.contains(says), "{value}: {text}");
        }
    }

    #[test]
    fn codes_are_names_or_numbers_never_ok() {
        let all: Vec<String> = CODE_NAMES[1..].iter().map(|n| format!("\"{n}\"")).collect();
        let retry = params(&format!("retryableStatusCodes=[{}]", all.join(",")));
        assert_eq!(retry.retryable_status_codes.len(), 16);
        for code in &retry.retryable_status_codes {
            assert_eq!(Code::from_i32(*code as i32), *code);
            assert_eq!(CODE_NAMES[*code as usize], code_name(*code));
        }
        for (value, at, says) in [
            ("[]", "", "is empty"),
            ("\"UNAVAILABLE\"", "", "is a string; it must be an array"),
            ("[\"OK\"]", "[0]", "is OK, which is not a failure"),
            ("[14, 0]", "[1]", "is OK"),
            (
                "[\"unavailable\"]",
                "[0]",
                "names are upper case: UNAVAILABLE",
            ),
            (
                "[\"GONE\"]",
                "[0]",
                "\"GONE\", which is not a status code name",
            ),
            ("[17]", "[0]", "from 0 to 16"),
            ("[-1]", "[0]", "from 0 to 16"),
            ("[1.5]", "[0]", "from 0 to 16"),
            ("[true]", "[0]", "is a boolean"),
        ] {
            let (field, text) = refusal(&format!("retryableStatusCodes={value}"));
            assert_eq!(
                field,
                format!("methodConfig[0].retryPolicy.retryableStatusCodes{at}"),
                "{value}"
            );
            assert!(text.contains(says), "{value}: {text}");
        }
    }

    #[test]
    fn names_give_paths_and_precedence() {
        let config = service_config(
            r#"{"methodConfig": [
                {"name": [{}], "retryPolicy": {"maxAttempts": 2, "initialBackoff": "1s",
                    "maxBackoff": "1s", "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"]}},
                {"name": [{"service": "a.B"}], "retryPolicy": {"maxAttempts": 3,
                    "initialBackoff": "1s", "maxBackoff": "1s", "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"]}},
                {"name": [{"service": "a.B", "method": "Quiet"}]},
                {"name": [{"service": "a.B", "method": "Loud"}, {"service": "c.D", "method": ""}],
                    "retryPolicy": {"maxAttempts": 4, "initialBackoff": "1s",
                    "maxBackoff": "1s", "backoffMultiplier": 1,
                    "retryableStatusCodes": ["UNAVAILABLE"]}}
            ]}"#,
        )
        .unwrap();
        let attempts = |path: &str| config.retry_for_path(path).map(|r| r.max_attempts);
        assert_eq!(attempts("/a.B/Loud"), Some(4));
        assert_eq!(attempts("/a.B/Other"), Some(3));
        assert_eq!(
            attempts("/a.B/Quiet"),
            None,
            "a method entry without a policy"
        );
        assert_eq!(attempts("/c.D/Any"), Some(4));
        assert_eq!(attempts("/x.Y/Z"), Some(2));
        assert_eq!(attempts("not a path"), None);

        let paths: Vec<String> = config
            .methods()
            .iter()
            .flat_map(|m| m.names().iter().map(MethodName::path))
            .collect();
        assert_eq!(paths, ["", "/a.B/", "/a.B/Quiet", "/a.B/Loud", "/c.D/"]);

        // Routes: methods first, then services, then the default.
        let routes = config.routes();
        let order: Vec<Option<u32>> = routes
            .iter()
            .map(|(_, m)| m.retry().map(|r| r.max_attempts))
            .collect();
        assert_eq!(order, [None, Some(4), Some(3), Some(4), Some(2)]);
        let first_match = |path: &str| {
            let request = http::Request::post(format!("http://h{path}"))
                .body(())
                .unwrap();
            routes
                .iter()
                .find(|(route, _)| route.matches(&request))
                .map(|(_, m)| m.retry().map(|r| r.max_attempts))
        };
        for path in [
            "/a.B/Loud",
            "/a.B/Other",
            "/a.B/Quiet",
            "/c.D/Any",
            "/x.Y/Z",
        ] {
            assert_eq!(
                first_match(path),
                Some(attempts(path)),
                "the routes disagree with the precedence on {path}"
            );
        }
        // A service's prefix does not match a longer service name.
        assert_eq!(first_match("/a.Bx/Loud"), Some(Some(2)));
        let get = http::Request::get("http://h/a.B/Loud").body(()).unwrap();
        assert!(!routes[0].0.matches(&get), "gRPC routes match POST only");
    }

    #[test]
    fn an_entry_without_names_is_still_checked_but_applies_to_nothing() {
        let error = refused(r#"{"methodConfig": [{"retryPolicy": {"maxAttempts": 5}}]}"#);
        assert_eq!(error.field(), "methodConfig[0].retryPolicy.initialBackoff");
        let config =
            service_config(r#"{"methodConfig": [{"name": [], "timeout": "1s"}]}"#).unwrap();
        assert!(config.methods().is_empty());
    }

    #[test]
    fn name_errors() {
        let cases = [
            (
                r#"{"methodConfig": [{"name": [{"service": "test.Raw/Unary"}]}]}"#,
                "methodConfig[0].name[0].service",
                "a gRPC service name has no '/'",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "test.Raw/"}]}]}"#,
                "methodConfig[0].name[0].service",
                "a gRPC service name has no '/'",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "a.B", "method": "C/D"}]}]}"#,
                "methodConfig[0].name[0].method",
                "a gRPC method name has no '/'",
            ),
            (
                r#"{"methodConfig": [{"name": [{"method": "Get"}]}]}"#,
                "methodConfig[0].name[0].method",
                "a method needs its service",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "a.B"}]}, {"name": [{"service": "a.B", "method": ""}]}]}"#,
                "methodConfig[1].name[0]",
                "names \"/a.B/\" again (first named at methodConfig[0].name[0])",
            ),
            (
                r#"{"methodConfig": [{"name": [{}, {"service": ""}]}]}"#,
                "methodConfig[0].name[1]",
                "names the default name again",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": 3}]}]}"#,
                "methodConfig[0].name[0].service",
                "is a number; it must be a string",
            ),
            (
                r#"{"methodConfig": [{"name": {"service": "a.B"}}]}"#,
                "methodConfig[0].name",
                "is an object; it must be an array",
            ),
            (
                r#"{"methodConfig": {"name": []}}"#,
                "methodConfig",
                "it must be an array",
            ),
            (
                r#"{"methodConfig": [3]}"#,
                "methodConfig[0]",
                "is a number; it must be an object",
            ),
            (
                r#"{"methodConfig": [{"name": [{}], "retryPolicy": {}, "hedgingPolicy": {}}]}"#,
                "methodConfig[0]",
                "only one may be set",
            ),
            (
                r#"{"methodConfig": [{"name": [{}], "timeout": "-1s"}]}"#,
                "methodConfig[0].timeout",
                "negative",
            ),
        ];
        for (json, field, says) in cases {
            let error = refused(json);
            assert_eq!(error.field(), field, "{json}");
            assert!(error.message().contains(says), "{json}: {error}");
        }
    }

    #[test]
    fn whole_text_errors_have_no_field() {
        for (json, says) in [
            ("", "not valid JSON"),
            ("{", "not valid JSON"),
            ("[]", "is an array; it must be an object"),
            ("null", "is null; it must be an object"),
        ] {
            let error = refused(json);
            assert_eq!(error.field(), "");
            assert!(error.to_string().contains(says), "{json:?}: {error}");
            assert!(!error.to_string().contains(": : "));
        }
    }

    #[test]
    fn other_fields_are_ignored_and_hedging_alone_is_not_retried() {
        let config = service_config(
            r#"{"loadBalancingConfig": [{"round_robin": {}}], "methodConfig": [
                {"name": [{"service": "a.B"}], "waitForReady": true, "timeout": "2.5s",
                 "maxRequestMessageBytes": 1024,
                 "hedgingPolicy": {"maxAttempts": 3, "hedgingDelay": "0s",
                                   "nonFatalStatusCodes": ["UNAVAILABLE"]}}
            ], "healthCheckConfig": {"serviceName": ""}}"#,
        )
        .unwrap();
        let method = config.method_for_path("/a.B/C").unwrap();
        assert_eq!(method.retry(), None);
        assert_eq!(method.timeout(), Some(Duration::from_millis(2500)));
        assert!(config.throttle().is_none());
        assert!(service_config("{}").unwrap().methods().is_empty());
        assert!(
            service_config(r#"{"methodConfig": null, "retryThrottling": null}"#)
                .unwrap()
                .throttle()
                .is_none()
        );
    }

    #[test]
    fn throttling() {
        let config =
            service_config(r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#).unwrap();
        let throttle = config.throttle().unwrap();
        assert_eq!((throttle.max_tokens(), throttle.token_ratio()), (10.0, 0.1));
        // Clones of the config share the throttle.
        assert!(config.clone().throttle().unwrap().same_as(throttle));

        for (json, field, says) in [
            (
                r#"{"maxTokens": 0, "tokenRatio": 0.1}"#,
                "maxTokens",
                "is 0; it must be greater than 0 and at most 1000",
            ),
            (
                r#"{"maxTokens": 1001, "tokenRatio": 0.1}"#,
                "maxTokens",
                "at most 1000",
            ),
            (
                r#"{"maxTokens": 0.0001, "tokenRatio": 0.1}"#,
                "maxTokens",
                "at least 0.001",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": 0}"#,
                "tokenRatio",
                "is 0; it must be greater than 0",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": -1}"#,
                "tokenRatio",
                "greater than 0",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": 0.0001}"#,
                "tokenRatio",
                "at least 0.001",
            ),
            (
                r#"{"maxTokens": "10", "tokenRatio": 0.1}"#,
                "maxTokens",
                "is a string",
            ),
            (r#"{"tokenRatio": 0.1}"#, "maxTokens", "is missing"),
            (r#"[]"#, "", "is an array; it must be an object"),
        ] {
            let error = refused(&format!(r#"{{"retryThrottling": {json}}}"#));
            let expected = if field.is_empty() {
                "retryThrottling".to_string()
            } else {
                format!("retryThrottling.{field}")
            };
            assert_eq!(error.field(), expected, "{json}");
            assert!(error.message().contains(says), "{json}: {error}");
        }
    }

    #[test]
    fn each_entry_becomes_a_grpc_policy() {
        let config = service_config(
            r#"{"methodConfig": [
                {"name": [{"service": "a.B"}], "timeout": "1.5s", "retryPolicy": {
                    "maxAttempts": 9, "initialBackoff": "0.2s", "maxBackoff": "0.5s",
                    "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE", 8]}},
                {"name": [{}]}
            ]}"#,
        )
        .unwrap();
        let method = &config.methods()[0];
        let retried = method.policy();
        assert_eq!(retried.get_max_attempts(), MAX_ATTEMPTS_CAP);
        assert_eq!(retried.get_deadline(), Some(Duration::from_millis(1500)));
        // In code order.
        assert_eq!(
            super::super::retried_codes(&retried),
            [Code::ResourceExhausted, Code::Unavailable]
        );
        assert!(retried.is_assumed_idempotent());
        let backoff = retried.get_backoff();
        assert_eq!(backoff.get_jitter(), crate::Jitter::Full);
        assert_eq!(backoff.get_multiplier(), 1.5);
        let ceilings: Vec<_> = (1..=4).map(|n| backoff.ceiling(n)).collect();
        assert_eq!(
            ceilings,
            [200, 300, 450, 500].map(Duration::from_millis),
            "A6: initialBackoff * 1.5^(n-1), capped"
        );
        assert_eq!(backoff, &method.retry().unwrap().backoff());

        let plain = config.methods()[1].policy();
        assert_eq!(plain.get_max_attempts(), 1);
        assert!(super::super::retried_codes(&plain).is_empty());
        assert_eq!(plain.get_deadline(), None);
        assert!(!plain.is_never(), "A6's transparent retry still applies");
    }

    #[test]
    fn converts_into_the_crates_config_error() {
        let error: InvalidConfig = refused("[]").into();
        assert_eq!(
            error.to_string(),
            "invalid retry configuration: invalid gRPC service config: is an array; it must be an object"
        );
    }

    #[test]
    fn proto_durations() {
        let ok = |text: &str, d: Duration| assert_eq!(parse_proto_duration(text), Ok((false, d)));
        ok("0s", Duration::ZERO);
        ok("1s", Duration::from_secs(1));
        ok(".1s", Duration::from_millis(100));
        ok("1.s", Duration::from_secs(1));
        ok("0.000000001s", Duration::from_nanos(1));
        ok("315576000000s", Duration::from_secs(315_576_000_000));
        assert_eq!(
            parse_proto_duration("-1.5s"),
            Ok((true, Duration::from_millis(1500)))
        );
        for bad in [
            "", "s", ".s", "-s", "1", "1m", "1.5.5s", "+1s", " 1s", "1 s", "1e3s", "١s",
        ] {
            assert!(parse_proto_duration(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn never_panics_on_any_text(text in ".{0,80}") {
            let _ = service_config(&text);
            let _ = parse_proto_duration(&text);
        }

        #[test]
        fn never_panics_on_json_shaped_text(
            attempts in prop_oneof![Just("2".to_string()), any::<f64>().prop_map(|f| f.to_string()), ".{0,6}"],
            backoff in "-?[0-9]{0,13}(\\.[0-9]{0,11})?s?",
            code in prop_oneof![Just("\"UNAVAILABLE\"".to_string()), any::<i64>().prop_map(|i| i.to_string())],
            tokens in any::<f64>(),
        ) {
            let json = format!(
                r#"{{"methodConfig": [{{"name": [{{}}], "retryPolicy": {{"maxAttempts": {attempts},
                   "initialBackoff": "{backoff}", "maxBackoff": "{backoff}", "backoffMultiplier": 2,
                   "retryableStatusCodes": [{code}]}}}}],
                   "retryThrottling": {{"maxTokens": {tokens}, "tokenRatio": 0.5}}}}"#
            );
            if let Ok(config) = service_config(&json) {
                let retry = config.retry_for_path("/a.B/C").unwrap();
                prop_assert!((2..=5).contains(&retry.max_attempts));
                prop_assert!(!retry.initial_backoff.is_zero());
                prop_assert!(!retry.retryable_status_codes.is_empty());
            }
        }

        /// Durations written the way grpc-go writes them read back exactly.
        #[test]
        fn proto_durations_round_trip(secs in 0u64..=315_576_000_000, nanos in 0u32..1_000_000_000) {
            let text = format!("{secs}.{nanos:09}s");
            prop_assert_eq!(parse_proto_duration(&text), Ok((false, Duration::new(secs, nanos))));
        }
    }
}
