// Reading a standard gRPC service config: per-method retry policies and retry
// throttling (A6 "Integration with Service Config"), accepted and refused as gRPC's C
// core reads them.

use crate::GrpcPolicyExt;
use std::collections::{HashMap, HashSet};
use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use serde_core::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use tonic::Code;

use tower_http_retry::Backoff;
use tower_http_retry::Hedging;
use tower_http_retry::RetryPolicy;
use tower_http_retry::RouteMatch;
use tower_http_retry::Throttle;

/// A6's client-side cap on `maxAttempts`: higher values are taken as this.
pub(crate) const MAX_ATTEMPTS_CAP: u32 = 5;

/// Largest seconds value of a protobuf `Duration` (10 000 years).
const MAX_DURATION_SECONDS: i64 = 315_576_000_000;

/// The most tokens the crate's [`Throttle`] holds.
const MAX_THROTTLE_TOKENS: u32 = 1_000;

/// Reads a gRPC service config (the JSON form of `grpc.service_config.ServiceConfig`) for
/// what retries need: every `methodConfig` entry's names, `retryPolicy` and `timeout`, and
/// `retryThrottling`. Other fields (`loadBalancingConfig`, `waitForReady`, message size
/// limits, ...) are not read, and not checked.
///
/// What it reads, it accepts and refuses as gRPC's C core (grpc-core, under grpcio and
/// gRPC C++) does, except where A6 says otherwise and for the few number and JSON forms
/// listed at the end:
///
/// - The text: standard JSON, read by serde_json. A key given twice in one object is
///   refused, as C-core refuses it.
/// - `methodConfig`: a list of objects (`null` is refused). Each entry's fields are
///   checked even when it has no `name`, though such an entry applies to nothing.
/// - `name[]` entries: `{"service": "pkg.Svc", "method": "Get"}` is one method,
///   `{"service": "pkg.Svc"}` (or an empty `method`) every method of a service, `{}` or an
///   empty `service` the default for every method. A `method` without a `service` is
///   refused, and so is the same name given twice anywhere in the config.
/// - `retryPolicy`: `maxAttempts` a whole number of at least 2, taken as 5 when higher (A6's
///   client-side cap); `initialBackoff` and `maxBackoff` durations greater than zero;
///   `backoffMultiplier` a number greater than zero; `retryableStatusCodes` a non-empty
///   list of upper-case code names (`"UNAVAILABLE"`). Numbers are read from JSON numbers
///   or from strings holding them (`"3"`), as protobuf's JSON mapping allows; a whole
///   number is one written without a fraction or an exponent (`2.0` is refused). Status code
///   numbers (`14`) are refused, as C-core and A6 ("specified as strings") have it; `"OK"`
///   is accepted and has no effect, since a success is never retried.
/// - Durations: protobuf's JSON form as C-core reads it: whole seconds, an optional
///   fraction of at most 9 digits, then `s` (`"0.1s"`, `"2s"`; `".5s"` and `"1.s"` are
///   refused). C-core keeps durations to the millisecond, so a finer part is dropped,
///   and a backoff of less than a millisecond is zero.
/// - `timeout`: a duration, the method's deadline across all attempts. Zero means no
///   timeout, as in C-core.
/// - `retryThrottling`: `maxTokens` a whole number greater than 0, `tokenRatio` a number
///   greater than 0 read to three decimal places. They become a [`Throttle`] kept per
///   authority, one count per server as A6 has it, shared by every method. The crate's throttle holds at most 1000
///   tokens, so a higher `maxTokens`, which C-core takes, is refused.
/// - `hedgingPolicy`, as A6 specifies it (C-core and grpc-go ignore the field; A6 is the
///   reference): `maxAttempts` as above; `hedgingDelay` an optional duration of zero or
///   more, none meaning zero (every attempt at once); `nonFatalStatusCodes` an optional
///   list of code names, read as `retryableStatusCodes` is. An entry with both it and a
///   `retryPolicy` is refused, since A6 allows only one of them.
///
/// Where A6 and C-core part, A6 wins: C-core takes a negative backoff (`"0.-5s"`) and a
/// `backoffMultiplier` of `"NaN"`, which A6's "greater than zero" refuses.
///
/// C-core reads each JSON number from its text, field by field; here serde_json gives its
/// value (a whole number or a float). So a `tokenRatio` with an exponent (`1e-1`), which
/// C-core refuses, is taken at its value. And C-core's looser forms are refused here: a
/// number in a string in C's hex form (`"0x1.8"`); a JSON number too large for a double
/// (`1e400`); C-core's non-standard JSON numbers (`-`, `-01`) and more than 127 levels of
/// nesting, even in fields not read.
///
/// # Errors
///
/// [`InvalidServiceConfig`] for text that is not JSON, or for a field that is missing,
/// of the wrong type or out of range; its [`field`](InvalidServiceConfig::field) says which
/// one, as a path like `methodConfig[0].retryPolicy.maxAttempts`. When several fields are
/// wrong, the first one found is reported.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use tonic::Code;
/// use tower_http_retry_grpc::service_config;
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
/// let throttling = config.retry_throttling().unwrap();
/// assert_eq!((throttling.max_tokens, throttling.token_ratio), (10, 0.1));
///
/// let error = service_config(r#"{"methodConfig": [{"name": [{}],
///     "retryPolicy": {"maxAttempts": 1}}]}"#).unwrap_err();
/// assert_eq!(error.field(), "methodConfig[0].retryPolicy.maxAttempts");
/// ```
pub fn service_config(json: &str) -> Result<ServiceConfig, InvalidServiceConfig> {
    let value = read_json(json)
        .map_err(|why| InvalidServiceConfig::new("", format!("not valid JSON: {why}")))?;
    let top = as_object(&value, "")?;

    let mut methods = Vec::new();
    // Each path, with where it was first named.
    let mut seen: HashMap<String, String> = HashMap::new();
    // Unlike the fields below, a `null` list is refused, as C-core does.
    if let Some(list) = field(top, "methodConfig") {
        let list = as_array(list, "methodConfig")?;
        for (i, entry) in list.iter().enumerate() {
            let at = format!("methodConfig[{i}]");
            let entry = as_object(entry, &at)?;
            let names = match present(entry, "name") {
                Some(names) => parse_names(names, &at, &mut seen)?,
                None => Vec::new(),
            };
            let (retry, hedging) = match (
                present(entry, "retryPolicy"),
                present(entry, "hedgingPolicy"),
            ) {
                (Some(_), Some(_)) => {
                    return Err(InvalidServiceConfig::new(
                        &at,
                        "has both retryPolicy and hedgingPolicy; only one may be set",
                    ));
                }
                (Some(policy), None) => (
                    Some(parse_retry_policy(policy, &format!("{at}.retryPolicy"))?),
                    None,
                ),
                (None, Some(policy)) => (
                    None,
                    Some(parse_hedging_policy(
                        policy,
                        &format!("{at}.hedgingPolicy"),
                    )?),
                ),
                (None, None) => (None, None),
            };
            let timeout = match present(entry, "timeout") {
                Some(timeout) => parse_timeout(timeout, &format!("{at}.timeout"))?,
                None => None,
            };
            if !names.is_empty() {
                methods.push(MethodConfig {
                    names,
                    retry,
                    hedging,
                    timeout,
                });
            }
        }
    }

    let (throttling, throttle) = match present(top, "retryThrottling") {
        Some(throttling) => {
            let (params, throttle) = parse_throttling(throttling)?;
            (Some(params), Some(throttle))
        }
        None => (None, None),
    };
    Ok(ServiceConfig {
        methods,
        throttling,
        throttle,
    })
}

/// What [`service_config`] read: the method configs that name something, and the
/// optional throttle. [`RetryLayer::from_service_config`](crate::GrpcLayerExt::from_service_config) makes the layer it describes.
///
/// [`RetryLayer::from_service_config`]: crate::GrpcLayerExt::from_service_config
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    methods: Vec<MethodConfig>,
    throttling: Option<ThrottlingParams>,
    throttle: Option<Throttle>,
}

impl ServiceConfig {
    /// The `methodConfig` entries that name at least one method, in their order.
    pub fn methods(&self) -> &[MethodConfig] {
        &self.methods
    }

    /// The throttle made from `retryThrottling`, if the config had one: per authority (one
    /// count per server, [`Gate::partition`](tower_http_retry::Gate::partition) finds one).
    /// Every call returns the same shared handle: give it to a policy with
    /// [`RetryPolicy::gate`].
    pub fn throttle(&self) -> Option<&Throttle> {
        self.throttle.as_ref()
    }

    /// The `retryThrottling` the config had, as read: what [`ServiceConfig::throttle`] was
    /// built from.
    ///
    /// ```
    /// use tower_http_retry_grpc::service_config;
    ///
    /// let config = service_config(r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1239}}"#)?;
    /// let throttling = config.retry_throttling().unwrap();
    /// // The ratio to three decimal places, as C-core reads it.
    /// assert_eq!((throttling.max_tokens, throttling.token_ratio), (10, 0.123));
    /// # Ok::<_, tower_http_retry_grpc::InvalidServiceConfig>(())
    /// ```
    pub fn retry_throttling(&self) -> Option<&ThrottlingParams> {
        self.throttling.as_ref()
    }

    /// The method config that applies to a request path (`/package.Service/Method`), by
    /// gRPC's precedence, looked up as C-core does: the entry whose name is the whole path,
    /// else the one whose name is the path up to its last `/` (the service), else the
    /// default one. The tests' reading of the precedence, against which the order of
    /// [`ServiceConfig::routes`] is checked.
    #[cfg(test)]
    pub(crate) fn method_for_path(&self, path: &str) -> Option<&MethodConfig> {
        let named = |key: &str| {
            self.methods
                .iter()
                .find(|config| config.names.iter().any(|name| name.path() == key))
        };
        let keyed = self
            .methods
            .iter()
            .any(|config| config.names.iter().any(|name| *name != MethodName::Default));
        if !keyed {
            return named("");
        }
        if let Some(config) = named(path).filter(|_| !path.is_empty()) {
            return Some(config);
        }
        // C-core finds nothing for a path without a `/`, not even the default.
        let wildcard = service_prefix(path)?;
        named(wildcard).or_else(|| named(""))
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
    /// use tower_http_retry_grpc::service_config;
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

/// A request path up to and including its last `/`: `/package.Service/` for
/// `/package.Service/Method`, the key under which a service's entry is found.
fn service_prefix(path: &str) -> Option<&str> {
    path.rfind('/').map(|slash| &path[..=slash])
}

/// One `methodConfig` entry: the names it applies to, its retry policy and timeout.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodConfig {
    names: Vec<MethodName>,
    retry: Option<RetryParams>,
    hedging: Option<HedgingParams>,
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

    /// Its `hedgingPolicy`, if it had one (never together with a `retryPolicy`).
    pub fn hedging(&self) -> Option<&HedgingParams> {
        self.hedging.as_ref()
    }

    /// Its `timeout`: the deadline of an RPC across all its attempts. `None` when the
    /// config had none, or a zero one (C-core's "no timeout"); zero when the config's was
    /// negative (`"0.-5s"`, which C-core reads as a deadline already past).
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// The crate's policy for this entry's methods, as gRPC's clients apply the entry:
    ///
    /// - with a `retryPolicy`: a gRPC policy ([`RetryPolicy::grpc_codes`](crate::GrpcPolicyExt::grpc_codes)) retrying its
    ///   `retryableStatusCodes`, with its `maxAttempts` (at most 5) and A6's backoff: retry
    ///   `n` waits uniform in `[0, min(maxBackoff, initialBackoff *
    ///   backoffMultiplier^(n-1))]`, [`Backoff`] with the `backoffMultiplier` and
    ///   [`Jitter::Full`](tower_http_retry::Jitter::Full);
    /// - without one: a gRPC policy that retries no status code and makes one attempt
    ///   (gRPC's classification still applies, and so does A6's transparent retry of a
    ///   stream refused before it left, which no retry configuration turns off);
    /// - its `timeout`, if any, is the policy's [`deadline`](RetryPolicy::deadline): one
    ///   deadline for the RPC across all its attempts and waits, sent to the server as
    ///   `grpc-timeout` (the time left) on every attempt. As with gRPC's own clients, a
    ///   shorter `grpc-timeout` of the caller's (tonic's `Request::set_timeout`) applies
    ///   instead.
    ///
    /// A policy records only what it sets, and is laid over the policy beneath it (a
    /// route's over the layer's): this one sets the above, and no hedging for an entry with
    /// a `retryPolicy` (A6 allows a method a retry or a hedging policy, not both). Nothing
    /// else: the gates (the layer's budget, the config's throttle), the attempt timeout
    /// and, for an entry without a `timeout`, the deadline come from beneath; a policy that
    /// sets nothing of them gets none under [`RetryLayer::from_service_config`](crate::GrpcLayerExt::from_service_config),
    /// which builds a whole layer from these. Call this to adjust one entry's policy first
    /// (an attempt timeout, say) and add the routes yourself.
    ///
    /// ```
    /// use tower_http_retry_grpc::service_config;
    ///
    /// let config = service_config(r#"{"methodConfig": [{
    ///   "name": [{"service": "shop.Cart"}],
    ///   "timeout": "2s",
    ///   "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
    ///                   "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE"]}
    /// }]}"#).unwrap();
    /// let policy = config.methods()[0].policy();
    /// // 4 attempts, A6's backoff, a 2 s deadline, gRPC's rules, no hedging.
    /// let backoff = config.methods()[0].retry().unwrap().backoff();
    /// assert_eq!(backoff.ceiling(1), std::time::Duration::from_millis(100));
    /// assert_eq!(backoff.ceiling(2), std::time::Duration::from_millis(150));
    /// let shown = format!("{policy:?}");
    /// assert!(shown.starts_with("RetryPolicy { max_attempts: 4, "), "{shown}");
    /// assert!(shown.contains(&format!("backoff: {backoff:?}")), "{shown}");
    /// assert!(shown.contains("deadline: Some(2s)"), "{shown}");
    /// assert!(shown.contains("transparent_retry: true, hedging: None"), "{shown}");
    /// ```
    pub fn policy(&self) -> RetryPolicy {
        let policy = match (&self.retry, &self.hedging) {
            (Some(retry), _) => RetryPolicy::new()
                .max_attempts(retry.max_attempts)
                .backoff(retry.backoff())
                .grpc_codes(retry.retryable_status_codes.iter().copied())
                .hedge(None),
            (None, Some(hedging)) => RetryPolicy::new()
                .max_attempts(hedging.max_attempts)
                .grpc_codes(hedging.non_fatal_status_codes.iter().copied())
                .hedge(Hedging::after(hedging.hedging_delay)),
            (None, None) => RetryPolicy::new().max_attempts(1).grpc_codes([]),
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
    /// the empty string for the default, as C-core and grpc-go key their method configs.
    pub fn path(&self) -> String {
        match self {
            MethodName::Method { service, method } => format!("/{service}/{method}"),
            MethodName::Service { service } => format!("/{service}/"),
            MethodName::Default => String::new(),
        }
    }

    /// True when a request to `path` is named by this (without precedence: see
    /// [`ServiceConfig::routes`]). As in C-core, a method's name matches its whole path,
    /// and a service's name the paths whose part up to the last `/` is `/service/`.
    pub fn matches(&self, path: &str) -> bool {
        match self {
            MethodName::Default => true,
            named => {
                let key = named.path();
                path == key || service_prefix(path) == Some(key.as_str())
            }
        }
    }

    /// A crate route for these requests: `POST` with the path prefix `/service/method`
    /// or `/service` (a prefix matches whole segments only), or any `POST` for the
    /// default. A gRPC call's path has exactly two segments, and for those the route
    /// matches what [`MethodName::matches`] does.
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

/// A `hedgingPolicy`, as plain data.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct HedgingParams {
    /// Attempts in all, the first included: 2 to 5 (A6 caps a larger `maxAttempts` at 5).
    pub max_attempts: u32,
    /// The delay between one attempt and the next hedge while none has answered; zero
    /// (also when the config had none) sends every attempt at once.
    pub hedging_delay: Duration,
    /// The codes after which the next hedge goes at once instead of the call failing,
    /// without duplicates, in the config's order; never `OK`. Any other code is returned
    /// and cancels the attempts in flight.
    pub non_fatal_status_codes: Vec<Code>,
}

/// A `retryThrottling`, as plain data ([`ServiceConfig::retry_throttling`]).
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct ThrottlingParams {
    /// The most tokens, and the count at the start: 1 to 1000 (the crate's throttle holds
    /// at most 1000).
    pub max_tokens: u32,
    /// Tokens each success gives back, read to three decimal places as C-core reads it
    /// (`0.1239` is 0.123); at least 0.001.
    pub token_ratio: f64,
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
    /// Each further retry's ceiling is this many times the last. Greater than zero, and
    /// infinite when the config said so (`"inf"`): every retry after the first then waits
    /// up to `max_backoff`.
    pub backoff_multiplier: f64,
    /// The codes to retry, without duplicates, in the config's order. Never `OK` (a
    /// success is never retried, so a listed `OK` is dropped), and empty only when `OK`
    /// was all the config listed.
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
    /// multiplier and [`Jitter::Full`](tower_http_retry::Jitter::Full) (or
    /// [`Jitter::Proportional`](tower_http_retry::Jitter::Proportional), A6 as amended in 2024, with
    /// [`Backoff::jitter`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_http_retry_grpc::service_config;
    ///
    /// let config = service_config(r#"{"methodConfig": [{"name": [{}], "retryPolicy": {
    ///     "maxAttempts": 3, "initialBackoff": "0.1s", "maxBackoff": "1s",
    ///     "backoffMultiplier": 1.5, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#).unwrap();
    /// let backoff = config.methods()[0].retry().unwrap().backoff();
    /// assert_eq!(backoff.ceiling(1), Duration::from_millis(100));
    /// assert_eq!(backoff.ceiling(3), Duration::from_millis(225));
    /// ```
    pub fn backoff(&self) -> Backoff {
        // The multiplier was checked when the config was read: above zero. An infinite one
        // is taken as the largest finite one, which reaches the cap just the same.
        Backoff::from_initial(self.initial_backoff, self.max_backoff)
            .try_multiplier(self.backoff_multiplier.min(f64::MAX))
            .unwrap_or_else(|_| Backoff::from_initial(self.initial_backoff, self.max_backoff))
    }
}

/// A service config that [`service_config`] refused: which field, and why.
///
/// ```
/// use tower_http_retry_grpc::service_config;
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

/// A JSON value as serde_json reads it, objects kept as their fields in order.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Number(Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

/// A JSON number as serde_json reports it: a whole number when written without a fraction
/// or an exponent and within 64 bits, else a float (`2.0`, `1e3`, `-0`, or a whole number
/// too large). C-core reads a number from its text; the integer-or-float distinction is
/// what is left of the text here. serde_json's float reading is a fast one: a long or
/// extreme number (`1e-50`) may come out a unit in the last place off.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Number {
    Unsigned(u64),
    Negative(i64),
    Float(f64),
}

impl Number {
    fn as_f64(self) -> f64 {
        match self {
            Number::Unsigned(n) => n as f64,
            Number::Negative(n) => n as f64,
            Number::Float(f) => f,
        }
    }

    /// The value in decimal, without an exponent (a float in the shortest form that reads
    /// back to it).
    fn decimal(self) -> String {
        match self {
            Number::Unsigned(n) => n.to_string(),
            Number::Negative(n) => n.to_string(),
            Number::Float(f) => f.to_string(),
        }
    }
}

impl fmt::Display for Number {
    /// For messages: a float keeps a `.` or an exponent (`2.0`, `1e300`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::Unsigned(n) => write!(f, "{n}"),
            Number::Negative(n) => write!(f, "{n}"),
            Number::Float(x) => write!(f, "{x:?}"),
        }
    }
}

/// Reads JSON text with serde_json. A key given twice in one object is refused, as C-core
/// refuses it (serde_json's own maps would keep the last one), and a NUL character ends the
/// text, as it does for C-core. serde_json allows 127 levels of arrays and objects, C-core
/// 255.
fn read_json(text: &str) -> Result<Json, String> {
    let text = text.split('\0').next().unwrap_or("");
    let mut reader = serde_json::Deserializer::from_str(text);
    let value = Json::deserialize(&mut reader).map_err(|error| error.to_string())?;
    reader.end().map_err(|error| error.to_string())?;
    Ok(value)
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Json, E> {
        Ok(Json::Null)
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Json, E> {
        Ok(Json::Bool(b))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Json, E> {
        Ok(Json::Number(Number::Unsigned(n)))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Json, E> {
        Ok(Json::Number(match u64::try_from(n) {
            Ok(n) => Number::Unsigned(n),
            Err(_) => Number::Negative(n),
        }))
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Json, E> {
        Ok(Json::Number(Number::Float(f)))
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Json, E> {
        Ok(Json::String(s.to_string()))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Json, E> {
        Ok(Json::String(s))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut fields = Vec::new();
        let mut keys = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !keys.insert(key.clone()) {
                return Err(de::Error::custom(format_args!(
                    "the key {key:?} is given twice in one object"
                )));
            }
            fields.push((key, map.next_value()?));
        }
        Ok(Json::Object(fields))
    }
}

type Object = [(String, Json)];

/// The field, unless absent or `null`. C-core reads `null` as absent for most fields.
fn present<'a>(object: &'a Object, key: &str) -> Option<&'a Json> {
    field(object, key).filter(|v| **v != Json::Null)
}

/// The field as given, `null` included: for the fields whose `null` C-core refuses.
fn field<'a>(object: &'a Object, key: &str) -> Option<&'a Json> {
    object.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn required<'a>(object: &'a Object, key: &str, at: &str) -> Result<&'a Json, InvalidServiceConfig> {
    present(object, key).ok_or_else(|| missing(at))
}

fn missing(at: &str) -> InvalidServiceConfig {
    InvalidServiceConfig::new(at, "is missing; it is required")
}

fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

fn wrong_type(value: &Json, at: &str, expected: &str) -> InvalidServiceConfig {
    InvalidServiceConfig::new(at, format!("is {}; it must be {expected}", kind(value)))
}

fn as_object<'a>(value: &'a Json, at: &str) -> Result<&'a Object, InvalidServiceConfig> {
    match value {
        Json::Object(fields) => Ok(fields),
        other => Err(wrong_type(other, at, "an object")),
    }
}

fn as_array<'a>(value: &'a Json, at: &str) -> Result<&'a [Json], InvalidServiceConfig> {
    match value {
        Json::Array(items) => Ok(items),
        other => Err(wrong_type(other, at, "an array")),
    }
}

fn as_string<'a>(value: &'a Json, at: &str) -> Result<&'a str, InvalidServiceConfig> {
    match value {
        Json::String(text) => Ok(text),
        other => Err(wrong_type(other, at, "a string")),
    }
}

/// A numeric field: a JSON number, or a string holding one (protobuf's JSON mapping allows
/// numbers in strings, and C-core reads them from their text).
enum Numeric<'a> {
    Number(Number),
    Text(&'a str),
}

fn numeric<'a>(value: &'a Json, at: &str) -> Result<Numeric<'a>, InvalidServiceConfig> {
    match value {
        Json::Number(number) => Ok(Numeric::Number(*number)),
        Json::String(text) => Ok(Numeric::Text(text)),
        other => Err(wrong_type(other, at, "a number")),
    }
}

/// A numeric field's value, for messages: `2.5`, or `"2.5"` when a string.
fn shown(value: &Json) -> String {
    match value {
        Json::String(text) => format!("{text:?}"),
        Json::Number(number) => number.to_string(),
        other => kind(other).to_string(),
    }
}

fn parse_names(
    names: &Json,
    at: &str,
    seen: &mut HashMap<String, String>,
) -> Result<Vec<MethodName>, InvalidServiceConfig> {
    let list = as_array(names, &format!("{at}.name"))?;
    let mut out = Vec::with_capacity(list.len());
    for (j, name) in list.iter().enumerate() {
        let here = format!("{at}.name[{j}]");
        let object = as_object(name, &here)?;
        let text = |key: &str| -> Result<Option<&str>, InvalidServiceConfig> {
            present(object, key)
                .map(|value| as_string(value, &format!("{here}.{key}")))
                .transpose()
        };
        let (service, method) = (text("service")?, text("method")?);
        // As C-core has it: a method, even an empty one, needs a service field, though an
        // empty service makes the entry the default whatever the method.
        let parsed = match (service, method) {
            (None, Some(method)) => {
                return Err(InvalidServiceConfig::new(
                    &format!("{here}.method"),
                    format!("is {method:?} with no service; a method needs its service"),
                ));
            }
            (None | Some(""), _) => MethodName::Default,
            (Some(service), None | Some("")) => MethodName::Service {
                service: service.to_string(),
            },
            (Some(service), Some(method)) => MethodName::Method {
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

fn parse_retry_policy(policy: &Json, at: &str) -> Result<RetryParams, InvalidServiceConfig> {
    let policy = as_object(policy, at)?;
    let path_of = |key: &str| format!("{at}.{key}");

    let max_attempts = parse_max_attempts(policy, &path_of("maxAttempts"))?;

    let positive_duration = |key: &str| -> Result<Duration, InvalidServiceConfig> {
        let at = path_of(key);
        let value = required(policy, key, &at)?;
        let text = as_string(value, &at)?;
        let millis = parse_duration_field(text, &at)?;
        if millis == 0 {
            return Err(InvalidServiceConfig::new(
                &at,
                format!(
                    "is {text:?}, which is zero to the millisecond (as C-core keeps durations); \
                     it must be greater than zero"
                ),
            ));
        }
        // C-core takes a negative one; A6 wants it greater than zero.
        let millis = u64::try_from(millis).map_err(|_| {
            InvalidServiceConfig::new(
                &at,
                format!("is {text:?}, which is negative; it must be greater than zero"),
            )
        })?;
        Ok(Duration::from_millis(millis))
    };
    let initial_backoff = positive_duration("initialBackoff")?;
    let max_backoff = positive_duration("maxBackoff")?;

    let backoff_multiplier = {
        let at = path_of("backoffMultiplier");
        let value = required(policy, "backoffMultiplier", &at)?;
        let m = match numeric(value, &at)? {
            Numeric::Number(number) => Some(number.as_f64()),
            Numeric::Text(text) => read_trimmed::<f64>(text.as_bytes()),
        };
        let m = m.ok_or_else(|| {
            InvalidServiceConfig::new(&at, format!("is {}, which is not a number", shown(value)))
        })?;
        // C-core keeps a `float`: whether that is above zero decides, so a value too small
        // for one is zero. It takes NaN, which A6's "greater than zero" does not.
        let kept = m as f32;
        if kept.is_nan() || kept <= 0.0 {
            return Err(InvalidServiceConfig::new(
                &at,
                format!("is {}; it must be greater than zero", shown(value)),
            ));
        }
        m
    };

    let retryable_status_codes = {
        let at = path_of("retryableStatusCodes");
        // C-core refuses a `null` list, and a missing one as an empty one.
        let list = as_array(
            field(policy, "retryableStatusCodes").ok_or_else(|| missing(&at))?,
            &at,
        )?;
        if list.is_empty() {
            return Err(InvalidServiceConfig::new(
                &at,
                "is empty; it must list at least one status code",
            ));
        }
        let mut codes = Vec::with_capacity(list.len());
        for (k, value) in list.iter().enumerate() {
            let code = parse_code(value, &format!("{at}[{k}]"))?;
            if code != Code::Ok && !codes.contains(&code) {
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

/// A policy's `maxAttempts`: a whole number of at least 2, above 5 taken as 5.
fn parse_max_attempts(policy: &Object, at: &str) -> Result<u32, InvalidServiceConfig> {
    let value = required(policy, "maxAttempts", at)?;
    // C-core reads an integer from the number's text, so `2.0` and `2e0` are refused:
    // serde_json reports those as floats.
    let n = match numeric(value, at)? {
        Numeric::Number(Number::Unsigned(n)) => i32::try_from(n).ok(),
        Numeric::Number(Number::Negative(n)) => i32::try_from(n).ok(),
        Numeric::Number(Number::Float(_)) => None,
        Numeric::Text(text) => read_trimmed::<i32>(text.as_bytes()),
    };
    let n = n.ok_or_else(|| {
        InvalidServiceConfig::new(
            at,
            format!("is {}; it must be a whole number", shown(value)),
        )
    })?;
    if n < 2 {
        return Err(InvalidServiceConfig::new(
            at,
            format!("is {n}; it must be at least 2 (the first attempt and a retry)"),
        ));
    }
    // A6: higher values are taken as the client's cap.
    Ok(u32::try_from(n).map_or(MAX_ATTEMPTS_CAP, |n| n.min(MAX_ATTEMPTS_CAP)))
}

/// A `hedgingPolicy`, as A6 specifies it (C-core and grpc-go do not hedge, so A6 is the
/// only reference): `maxAttempts` as a retry policy's; `hedgingDelay` an optional duration
/// of zero or more (none means zero: every attempt at once); `nonFatalStatusCodes` an
/// optional list of status code names, as `retryableStatusCodes` is read.
fn parse_hedging_policy(policy: &Json, at: &str) -> Result<HedgingParams, InvalidServiceConfig> {
    let policy = as_object(policy, at)?;
    let path_of = |key: &str| format!("{at}.{key}");
    let max_attempts = parse_max_attempts(policy, &path_of("maxAttempts"))?;
    let hedging_delay = match present(policy, "hedgingDelay") {
        None => Duration::ZERO,
        Some(value) => {
            let at = path_of("hedgingDelay");
            let text = as_string(value, &at)?;
            let millis = parse_duration_field(text, &at)?;
            let millis = u64::try_from(millis).map_err(|_| {
                InvalidServiceConfig::new(
                    &at,
                    format!("is {text:?}, which is negative; it must be zero or more"),
                )
            })?;
            Duration::from_millis(millis)
        }
    };
    let mut non_fatal_status_codes = Vec::new();
    if let Some(list) = present(policy, "nonFatalStatusCodes") {
        let at = path_of("nonFatalStatusCodes");
        for (k, value) in as_array(list, &at)?.iter().enumerate() {
            let code = parse_code(value, &format!("{at}[{k}]"))?;
            if code != Code::Ok && !non_fatal_status_codes.contains(&code) {
                non_fatal_status_codes.push(code);
            }
        }
    }
    Ok(HedgingParams {
        max_attempts,
        hedging_delay,
        non_fatal_status_codes,
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

/// A status code name, exactly as C-core matches it (upper case, nothing around it).
fn parse_code(value: &Json, at: &str) -> Result<Code, InvalidServiceConfig> {
    let name = match value {
        Json::String(name) => name,
        Json::Number(n) => {
            return Err(InvalidServiceConfig::new(
                at,
                format!(
                    "is {n}; status codes are given by name, such as \"UNAVAILABLE\", not by number"
                ),
            ));
        }
        other => return Err(wrong_type(other, at, "a status code name")),
    };
    match CODE_NAMES.iter().position(|n| n == name) {
        Some(number) => Ok(Code::from_i32(number as i32)),
        None => {
            let hint = CODE_NAMES
                .iter()
                .find(|n| n.eq_ignore_ascii_case(name.trim()))
                .map(|n| format!(" (write it as {n})"))
                .unwrap_or_default();
            Err(InvalidServiceConfig::new(
                at,
                format!("is {name:?}, which is not a status code name{hint}"),
            ))
        }
    }
}

/// A `timeout`: `None` for zero, which C-core takes as no timeout, and zero for a
/// negative one (a deadline already past when the call starts).
fn parse_timeout(value: &Json, at: &str) -> Result<Option<Duration>, InvalidServiceConfig> {
    let millis = parse_duration_field(as_string(value, at)?, at)?;
    Ok(match u64::try_from(millis) {
        Ok(0) => None,
        Ok(millis) => Some(Duration::from_millis(millis)),
        Err(_) => Some(Duration::ZERO),
    })
}

/// A duration field's milliseconds, or why it is not a duration.
fn parse_duration_field(text: &str, at: &str) -> Result<i64, InvalidServiceConfig> {
    parse_grpc_duration(text).map_err(|why| {
        InvalidServiceConfig::new(
            at,
            format!(
                "is {text:?}, which is not a duration ({why}); write seconds with an \"s\", \
                 such as \"0.1s\" or \"2s\""
            ),
        )
    })
}

/// Reads the protobuf JSON form of a `Duration` as C-core does, to its milliseconds: an
/// `s` at the very end; before it, with ASCII spaces around allowed, whole seconds from 0
/// to 315576000000 and an optional `.` and fraction of at most 9 characters. The seconds
/// and the fraction are each read as C-core reads an integer, so each may have a sign
/// (`"+1s"`, and `"1.-5s"`, which is 1 s less 0.05 s). The fraction's part below a
/// millisecond is dropped, toward zero. The result is negative only for a negative
/// fraction on zero seconds (`"0.-5s"`).
pub(crate) fn parse_grpc_duration(text: &str) -> Result<i64, &'static str> {
    let body = text.strip_suffix('s').ok_or("no \"s\" at the end")?;
    let body = strip_ascii_space(body.as_bytes());
    let (seconds, nanos) = match body.iter().position(|&b| b == b'.') {
        Some(dot) => {
            let fraction = &body[dot + 1..];
            let value = read_trimmed::<i32>(fraction).ok_or("no number after the \".\"")?;
            if fraction.len() > 9 {
                return Err("more than 9 digits after the \".\"");
            }
            let scale = 10i64.pow(9 - fraction.len() as u32);
            (&body[..dot], i64::from(value) * scale)
        }
        None => (body, 0),
    };
    let seconds = read_trimmed::<i64>(seconds).ok_or("no whole number of seconds")?;
    if seconds < 0 {
        return Err("negative seconds");
    }
    if seconds > MAX_DURATION_SECONDS {
        return Err("more than 315576000000 seconds");
    }
    Ok(seconds * 1000 + nanos / 1_000_000)
}

/// The ASCII spaces C-core's number reading skips: space, tab, line feed, vertical tab,
/// form feed and carriage return.
fn strip_ascii_space(text: &[u8]) -> &[u8] {
    let space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r');
    let start = text.iter().position(|b| !space(b)).unwrap_or(text.len());
    let end = text
        .iter()
        .rposition(|b| !space(b))
        .map_or(start, |i| i + 1);
    &text[start..end]
}

/// A number in text as C-core reads one (absl's `SimpleAtoi` and `SimpleAtof`), through
/// Rust's own parsing: ASCII spaces around it, then an optional sign and decimal digits
/// (for an unsigned type, no `-`; for a float, also an optional `.` and `e` exponent, or
/// `inf`, `infinity` or `nan` in any case). C-core's float reading takes C's hex floats
/// (`0x1.8`) and `nan(...)` besides; those are refused here.
fn read_trimmed<T: std::str::FromStr>(text: &[u8]) -> Option<T> {
    std::str::from_utf8(strip_ascii_space(text))
        .ok()?
        .parse()
        .ok()
}

fn parse_throttling(value: &Json) -> Result<(ThrottlingParams, Throttle), InvalidServiceConfig> {
    let at = "retryThrottling";
    let object = as_object(value, at)?;

    let max_at = format!("{at}.maxTokens");
    // C-core refuses a `null` here rather than taking it as missing.
    let value = field(object, "maxTokens").ok_or_else(|| missing(&max_at))?;
    let max_tokens = match numeric(value, &max_at)? {
        Numeric::Number(Number::Unsigned(n)) => u32::try_from(n).ok(),
        Numeric::Number(Number::Negative(_) | Number::Float(_)) => None,
        Numeric::Text(text) => read_trimmed::<u32>(text.as_bytes()),
    };
    let max_tokens = max_tokens.ok_or_else(|| {
        InvalidServiceConfig::new(
            &max_at,
            format!(
                "is {}; it must be a whole number from 1 to {MAX_THROTTLE_TOKENS}",
                shown(value)
            ),
        )
    })?;
    if max_tokens == 0 {
        return Err(InvalidServiceConfig::new(
            &max_at,
            "is 0; it must be greater than 0",
        ));
    }
    if max_tokens > MAX_THROTTLE_TOKENS {
        return Err(InvalidServiceConfig::new(
            &max_at,
            format!(
                "is {max_tokens}; this crate's throttle holds at most {MAX_THROTTLE_TOKENS} \
                 tokens (C-core takes up to 4294967295)"
            ),
        ));
    }

    let ratio_at = format!("{at}.tokenRatio");
    let value = field(object, "tokenRatio").ok_or_else(|| missing(&ratio_at))?;
    // C-core reads the ratio from the number's text; the value written in decimal stands in
    // for it, so an exponent (`1e-1`), which C-core refuses, is taken.
    let millis = match numeric(value, &ratio_at)? {
        Numeric::Number(number) => token_ratio_millis(number.decimal().as_bytes()),
        Numeric::Text(text) => token_ratio_millis(text.as_bytes()),
    };
    let millis = millis.ok_or_else(|| {
        InvalidServiceConfig::new(
            &ratio_at,
            format!(
                "is {}; it must be a decimal number greater than 0, such as 0.1",
                shown(value)
            ),
        )
    })?;
    if millis == 0 {
        return Err(InvalidServiceConfig::new(
            &ratio_at,
            format!(
                "is {}, which is 0 to three decimal places; it must be greater than 0",
                shown(value)
            ),
        ));
    }

    let params = ThrottlingParams {
        max_tokens,
        token_ratio: millis as f64 / 1000.0,
    };
    // A6 keeps the throttle's state per server name: one count per authority.
    let throttle = Throttle::builder()
        .max_tokens(f64::from(params.max_tokens))
        .token_ratio(params.token_ratio)
        .per_authority()
        .try_build()
        .map_err(|error| InvalidServiceConfig::new(at, error.to_string()))?;
    Ok((params, throttle))
}

/// A `tokenRatio`'s thousandths, read from its text as C-core reads it: whole tokens, then
/// optionally a `.` and decimals, of which only the first three count, each part read as
/// C-core reads an unsigned integer (so no exponent, and no sign but `+`).
///
/// C-core itself reads a ratio written without a `.` as thousandths (`1` as 0.001); this
/// reads it as whole tokens, as A6 means it. Both take and refuse the same texts.
fn token_ratio_millis(text: &[u8]) -> Option<u64> {
    let (whole, thousandths) = match text.iter().position(|&b| b == b'.') {
        Some(dot) => {
            let decimals = &text[dot + 1..];
            let decimals = &decimals[..decimals.len().min(3)];
            let scale = 10u64.pow(3 - decimals.len() as u32);
            (
                &text[..dot],
                u64::from(read_trimmed::<u32>(decimals)?) * scale,
            )
        }
        None => (text, 0),
    };
    Some(u64::from(read_trimmed::<u32>(whole)?) * 1000 + thousandths)
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;
    use tower::ServiceExt;

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            ".{0,8}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
                prop::collection::btree_map(".{0,4}", inner, 0..4)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn refused(json: &str) -> InvalidServiceConfig {
        service_config(json).expect_err("this config must be refused")
    }

    /// Tells `throttle` of one failure, the way it hears one: a call under a one-attempt
    /// gRPC policy that has it, answered Trailers-Only `UNAVAILABLE`. The path alone, as a
    /// tonic client sends it: the count of requests without an authority.
    fn fail_once_under(throttle: &Throttle) {
        use tower::Layer;
        let layer = tower_http_retry::RetryLayer::new().policy(
            RetryPolicy::new()
                .max_attempts(1)
                .grpc_codes([Code::Unavailable])
                .gate(throttle.clone()),
        );
        let service = layer.layer(tower::service_fn(
            |_: http::Request<tower_http_retry::ReplayBody<String>>| async {
                let response = http::Response::builder()
                    .header("grpc-status", "14")
                    .body(())
                    .unwrap();
                Ok::<_, std::convert::Infallible>(response)
            },
        ));
        let request = http::Request::post("/a.B/C").body(String::new()).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let response = runtime.block_on(service.oneshot(request)).unwrap();
        assert_eq!(response.headers()["grpc-status"], "14");
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
        let retry = params(
            "retryableStatusCodes=[\"UNAVAILABLE\", \"RESOURCE_EXHAUSTED\", \"ABORTED\", \"UNAVAILABLE\"]",
        );
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
        assert_eq!(params("maxAttempts=2147483647").max_attempts, 5);
        // In a string, with C-core's spaces and sign.
        assert_eq!(params("maxAttempts=\"3\"").max_attempts, 3);
        assert_eq!(params("maxAttempts=\" +4 \"").max_attempts, 4);
        let field = "methodConfig[0].retryPolicy.maxAttempts";
        for (value, says) in [
            ("1", "is 1; it must be at least 2"),
            ("0", "is 0; it must be at least 2"),
            ("-3", "is -3; it must be at least 2"),
            ("2.5", "is 2.5; it must be a whole number"),
            ("2.0", "is 2.0; it must be a whole number"),
            ("1e300", "is 1e300; it must be a whole number"),
            ("2147483648", "is 2147483648; it must be a whole number"),
            ("\"3.0\"", "is \"3.0\"; it must be a whole number"),
            ("\"0x3\"", "is \"0x3\"; it must be a whole number"),
            ("true", "is a boolean; it must be a number"),
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
            params("initialBackoff=\"0.5s\"").initial_backoff,
            Duration::from_millis(500)
        );
        // C-core keeps milliseconds.
        assert_eq!(
            params("maxBackoff=\"1.000000001s\"").max_backoff,
            Duration::from_secs(1)
        );
        assert_eq!(
            params("maxBackoff=\"0.0019s\"").max_backoff,
            Duration::from_millis(1)
        );
        // Its spaces and signs.
        assert_eq!(
            params("initialBackoff=\" +2 s\"").initial_backoff,
            Duration::from_secs(2)
        );
        assert_eq!(
            params("initialBackoff=\"1.-5s\"").initial_backoff,
            Duration::from_millis(950)
        );
        assert_eq!(
            params("maxBackoff=\"30s\"").max_backoff,
            Duration::from_secs(30)
        );
        for (key, value, says) in [
            ("initialBackoff", "\"0s\"", "is zero"),
            ("initialBackoff", "\"0.0s\"", "is zero"),
            ("initialBackoff", "\"0.0009s\"", "zero to the millisecond"),
            ("maxBackoff", "\"-1s\"", "negative seconds"),
            ("maxBackoff", "\"0.-5s\"", "which is negative"),
            ("initialBackoff", "\"100ms\"", "not a duration"),
            ("initialBackoff", "\"0.1\"", "no \"s\" at the end"),
            ("initialBackoff", "\"1S\"", "no \"s\" at the end"),
            ("initialBackoff", "\"1s \"", "no \"s\" at the end"),
            ("maxBackoff", "\"s\"", "no whole number of seconds"),
            ("maxBackoff", "\".5s\"", "no whole number of seconds"),
            ("maxBackoff", "\"1e3s\"", "no whole number of seconds"),
            ("maxBackoff", "\"1.s\"", "no number after the \".\""),
            ("maxBackoff", "\"1.2.3s\"", "no number after the \".\""),
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
        assert_eq!(params("backoffMultiplier=\" 2\"").backoff_multiplier, 2.0);
        assert_eq!(params("backoffMultiplier=1E1").backoff_multiplier, 10.0);
        assert_eq!(params("backoffMultiplier=\"+.5\"").backoff_multiplier, 0.5);
        // Too large for C-core's `float`, and taken: infinite, or as large as it says.
        assert_eq!(params("backoffMultiplier=1e39").backoff_multiplier, 1e39);
        let endless = params("backoffMultiplier=\"inf\"");
        assert_eq!(endless.backoff_multiplier, f64::INFINITY);
        assert_eq!(endless.backoff().ceiling(2), endless.max_backoff);
        for (value, says) in [
            ("0", "is 0; it must be greater than zero"),
            ("-1", "is -1; it must be greater than zero"),
            ("\"-inf\"", "is \"-inf\"; it must be greater than zero"),
            // Zero as a `float`. (serde_json reads it as 9.999999999999999e-51: its float
            // reading may be a unit in the last place off.)
            ("1e-50", "it must be greater than zero"),
            // C-core takes NaN; A6 wants a value greater than zero.
            ("\"nan\"", "is \"nan\"; it must be greater than zero"),
            ("\"2x\"", "is \"2x\", which is not a number"),
            // C-core's reading takes C's hex floats; Rust's does not.
            ("\"0x1.8\"", "is \"0x1.8\", which is not a number"),
            ("\"nan(1)\"", "which is not a number"),
            ("\"++2\"", "which is not a number"),
            ("true", "is a boolean; it must be a number"),
            ("-", "is missing"),
        ] {
            let (at, text) = refusal(&format!("backoffMultiplier={value}"));
            assert_eq!(at, "methodConfig[0].retryPolicy.backoffMultiplier");
            assert!(text.contains(says), "{value}: {text}");
        }
    }

    #[test]
    fn codes_are_upper_case_names_and_ok_is_dropped() {
        let all: Vec<String> = CODE_NAMES.iter().map(|n| format!("\"{n}\"")).collect();
        let retry = params(&format!("retryableStatusCodes=[{}]", all.join(",")));
        assert_eq!(retry.retryable_status_codes.len(), 16, "all but OK");
        for code in &retry.retryable_status_codes {
            assert_eq!(Code::from_i32(*code as i32), *code);
            assert_eq!(CODE_NAMES[*code as usize], code_name(*code));
        }
        // C-core takes a list of only OK; it retries nothing.
        let nothing = params("retryableStatusCodes=[\"OK\"]");
        assert!(nothing.retryable_status_codes.is_empty());
        assert!(!nothing.retries(Code::Ok));
        for (value, at, says) in [
            ("[]", "", "is empty"),
            ("\"UNAVAILABLE\"", "", "is a string; it must be an array"),
            ("null", "", "is null; it must be an array"),
            ("-", "", "is missing"),
            ("[14]", "[0]", "is 14; status codes are given by name"),
            ("[\"UNAVAILABLE\", 0]", "[1]", "not by number"),
            (
                "[\"14\"]",
                "[0]",
                "is \"14\", which is not a status code name",
            ),
            (
                "[\"unavailable\"]",
                "[0]",
                "which is not a status code name (write it as UNAVAILABLE)",
            ),
            ("[\" UNAVAILABLE\"]", "[0]", "(write it as UNAVAILABLE)"),
            (
                "[\"GONE\"]",
                "[0]",
                "\"GONE\", which is not a status code name",
            ),
            (
                "[true]",
                "[0]",
                "is a boolean; it must be a status code name",
            ),
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
                r#"{"methodConfig": [{"name": [{"method": "Get"}]}]}"#,
                "methodConfig[0].name[0].method",
                "a method needs its service",
            ),
            (
                r#"{"methodConfig": [{"name": [{"method": ""}]}]}"#,
                "methodConfig[0].name[0].method",
                "a method needs its service",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": null, "method": "Get"}]}]}"#,
                "methodConfig[0].name[0].method",
                "a method needs its service",
            ),
            (
                r#"{"methodConfig": [{"name": [{"service": "", "method": "Get"}]}, {"name": [{}]}]}"#,
                "methodConfig[1].name[0]",
                "names the default name again (first named at methodConfig[0].name[0])",
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
                r#"{"methodConfig": null}"#,
                "methodConfig",
                "is null; it must be an array",
            ),
            (
                r#"{"methodConfig": [null]}"#,
                "methodConfig[0]",
                "is null; it must be an object",
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
    fn names_are_keyed_and_looked_up_as_c_core_does() {
        // An empty service makes the default, whatever the method; a `/` is just a
        // character of the name.
        let config = service_config(
            r#"{"methodConfig": [
                {"name": [{"service": "", "method": "Ignored"}], "timeout": "1s"},
                {"name": [{"service": "a/B"}], "timeout": "2s"},
                {"name": [{"service": "c.D", "method": "E/F"}], "timeout": "3s"},
                {"name": [{"service": "g.H", "method": null}], "timeout": "4s"}
            ]}"#,
        )
        .unwrap();
        let timeout = |path: &str| config.method_for_path(path).and_then(MethodConfig::timeout);
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(config.methods()[0].names(), [MethodName::Default]);
        assert_eq!(timeout("/x.Y/Z"), secs(1));
        assert_eq!(timeout("/a/B/C"), secs(2));
        assert_eq!(timeout("/c.D/E/F"), secs(3));
        assert_eq!(timeout("/c.D/E"), secs(1));
        assert_eq!(timeout("/g.H/I"), secs(4));
        // C-core looks up the whole path, then the path to its last `/`.
        assert_eq!(timeout("/g.H/I/J"), secs(1));
        assert!(config.methods()[1].names()[0].matches("/a/B/C"));
        assert!(!config.methods()[1].names()[0].matches("/a/B/C/D"));
        // A service's names are keyed as paths: a name may repeat another in another form.
        let error = refused(
            r#"{"methodConfig": [{"name": [{"service": "a/B"}]},
                {"name": [{"service": "a", "method": "B/"}]}]}"#,
        );
        assert_eq!(error.field(), "methodConfig[1].name[0]");
        assert!(error.message().contains("names \"/a/B/\" again"), "{error}");
    }

    #[test]
    fn whole_text_errors_have_no_field() {
        for (json, says) in [
            ("", "not valid JSON"),
            ("{", "not valid JSON"),
            (
                "{} x",
                "not valid JSON: trailing characters at line 1 column 4",
            ),
            (
                r#"{"retryThrottling": {}, "retryThrottling": {}}"#,
                "not valid JSON: the key \"retryThrottling\" is given twice in one object at line 1 column 41",
            ),
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
    fn other_fields_are_ignored_and_a_hedging_policy_hedges() {
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
        let hedging = method.hedging().unwrap();
        assert_eq!(hedging.max_attempts, 3);
        assert_eq!(hedging.hedging_delay, Duration::ZERO);
        let policy = format!("{:?}", method.policy());
        // 3 attempts, hedged at once, within the timeout; gRPC methods may be repeated:
        // the policy hedges every call.
        assert!(
            policy.starts_with("RetryPolicy { max_attempts: 3, "),
            "{policy}"
        );
        assert!(
            policy.contains(&format!(
                "hedging: Some({:?})",
                tower_http_retry::Hedging::after(Duration::ZERO)
            )),
            "{policy}"
        );
        assert!(policy.contains("assume_idempotent: true"), "{policy}");
        assert!(policy.contains("deadline: Some(2.5s)"), "{policy}");
        // Nothing else: no backoff of its own (a hedge never backs off), no gates.
        assert!(!policy.contains("backoff"), "{policy}");
        assert!(!policy.contains("gates"), "{policy}");
        assert!(config.throttle().is_none());
        assert!(config.retry_throttling().is_none());
        assert!(service_config("{}").unwrap().methods().is_empty());
        assert!(
            service_config(r#"{"methodConfig": [], "retryThrottling": null}"#)
                .unwrap()
                .throttle()
                .is_none()
        );
        // C-core ignores a hedging policy of any shape; A6 specifies it.
        for (json, field, says) in [
            (
                r#""hedgingPolicy": 3"#,
                "hedgingPolicy",
                "must be an object",
            ),
            (
                r#""hedgingPolicy": {}"#,
                "hedgingPolicy.maxAttempts",
                "is missing",
            ),
            (
                r#""hedgingPolicy": {"maxAttempts": 1}"#,
                "hedgingPolicy.maxAttempts",
                "at least 2",
            ),
            (
                r#""hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": "0.-5s"}"#,
                "hedgingPolicy.hedgingDelay",
                "negative",
            ),
            (
                r#""hedgingPolicy": {"maxAttempts": 2, "hedgingDelay": 1}"#,
                "hedgingPolicy.hedgingDelay",
                "",
            ),
            (
                r#""hedgingPolicy": {"maxAttempts": 2, "nonFatalStatusCodes": [14]}"#,
                "hedgingPolicy.nonFatalStatusCodes[0]",
                "by name",
            ),
            (
                r#""hedgingPolicy": {"maxAttempts": 2, "nonFatalStatusCodes": ["unavailable"]}"#,
                "hedgingPolicy.nonFatalStatusCodes[0]",
                "write it as UNAVAILABLE",
            ),
        ] {
            let text = format!(r#"{{"methodConfig": [{{"name": [{{}}], {json}}}]}}"#);
            let error = service_config(&text).unwrap_err();
            assert_eq!(error.field(), format!("methodConfig[0].{field}"), "{json}");
            assert!(error.to_string().contains(says), "{json}: {error}");
        }
    }

    #[test]
    fn throttling() {
        let config =
            service_config(r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}}"#).unwrap();
        let throttling = config.retry_throttling().unwrap();
        assert_eq!((throttling.max_tokens, throttling.token_ratio), (10, 0.1));
        // The throttle is built from them, per authority.
        let throttle = config.throttle().unwrap();
        let shown = format!("{throttle:?}");
        assert!(
            shown.contains("tokens: 10.0, max_tokens: 10.0, token_ratio: 0.1"),
            "{shown}"
        );
        assert!(shown.contains("max_authorities"), "per authority: {shown}");
        // Clones of the config share the throttle: a failure heard by one is the other's.
        fail_once_under(config.clone().throttle().unwrap());
        assert_eq!(throttle.tokens(), 9.0);

        // Values as C-core reads them: whole tokens, a ratio to three decimal places, either
        // in a string.
        for (json, tokens, ratio) in [
            (r#"{"maxTokens": "1000", "tokenRatio": " 0.5"}"#, 1000, 0.5),
            (r#"{"maxTokens": 1, "tokenRatio": 0.1239}"#, 1, 0.123),
            // From the value, not the text: C-core refuses `1e-1`, and reads `0.100e1` as
            // 0.1 (its first three decimals).
            (r#"{"maxTokens": 10, "tokenRatio": 1e-1}"#, 10, 0.1),
            (r#"{"maxTokens": 10, "tokenRatio": 0.100e1}"#, 10, 1.0),
            (r#"{"maxTokens": 10, "tokenRatio": 0.1239999}"#, 10, 0.123),
            (r#"{"maxTokens": 10, "tokenRatio": 1}"#, 10, 1.0),
            (r#"{"maxTokens": 10, "tokenRatio": 1.5}"#, 10, 1.5),
        ] {
            let config = service_config(&format!(r#"{{"retryThrottling": {json}}}"#)).unwrap();
            let throttling = config.retry_throttling().unwrap();
            assert_eq!(
                (throttling.max_tokens, throttling.token_ratio),
                (tokens, ratio),
                "{json}"
            );
            let shown = format!("{:?}", config.throttle().unwrap());
            let built = format!(
                "max_tokens: {:?}, token_ratio: {ratio:?}",
                f64::from(tokens)
            );
            assert!(shown.contains(&built), "{json}: {shown}");
        }

        for (json, field, says) in [
            (
                r#"{"maxTokens": 0, "tokenRatio": 0.1}"#,
                "maxTokens",
                "is 0; it must be greater than 0",
            ),
            (
                r#"{"maxTokens": 1001, "tokenRatio": 0.1}"#,
                "maxTokens",
                "is 1001; this crate's throttle holds at most 1000 tokens",
            ),
            (
                r#"{"maxTokens": 10.5, "tokenRatio": 0.1}"#,
                "maxTokens",
                "is 10.5; it must be a whole number",
            ),
            (
                r#"{"maxTokens": -1, "tokenRatio": 0.1}"#,
                "maxTokens",
                "is -1; it must be a whole number",
            ),
            (
                r#"{"maxTokens": null, "tokenRatio": 0.1}"#,
                "maxTokens",
                "is null; it must be a number",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": 0}"#,
                "tokenRatio",
                "is 0, which is 0 to three decimal places; it must be greater than 0",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": -1}"#,
                "tokenRatio",
                "greater than 0",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": 0.0001}"#,
                "tokenRatio",
                "is 0.0001, which is 0 to three decimal places",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": -0}"#,
                "tokenRatio",
                "is -0.0; it must be a decimal number greater than 0",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": 5e9}"#,
                "tokenRatio",
                "is 5000000000.0; it must be a decimal number greater than 0",
            ),
            (
                r#"{"maxTokens": -0, "tokenRatio": 0.1}"#,
                "maxTokens",
                "is -0.0; it must be a whole number",
            ),
            (
                r#"{"maxTokens": 1e1, "tokenRatio": 0.1}"#,
                "maxTokens",
                "is 10.0; it must be a whole number",
            ),
            (
                r#"{"maxTokens": 10, "tokenRatio": null}"#,
                "tokenRatio",
                "is null; it must be a number",
            ),
            (
                r#"{"maxTokens": true, "tokenRatio": 0.1}"#,
                "maxTokens",
                "is a boolean",
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
                    "backoffMultiplier": 1.5,
                    "retryableStatusCodes": ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]}},
                {"name": [{}]}
            ]}"#,
        )
        .unwrap();
        let method = &config.methods()[0];
        let retried = method.policy();
        // In code order.
        assert_eq!(
            super::super::retried_codes(&retried),
            [Code::ResourceExhausted, Code::Unavailable]
        );
        let backoff = method.retry().unwrap().backoff();
        assert_eq!(
            backoff,
            Backoff::from_initial(Duration::from_millis(200), Duration::from_millis(500))
                .multiplier(1.5)
                .jitter(tower_http_retry::Jitter::Full)
        );
        let ceilings: Vec<_> = (1..=4).map(|n| backoff.ceiling(n)).collect();
        assert_eq!(
            ceilings,
            [200, 300, 450, 500].map(Duration::from_millis),
            "A6: initialBackoff * 1.5^(n-1), capped"
        );
        // What the policy sets, and nothing more: 5 attempts (A6's cap), that backoff, the
        // timeout as the deadline, gRPC's classifier and metadata hook, repeatable calls
        // with no key, the transparent retry, no hedging.
        assert_eq!(
            format!("{retried:?}"),
            format!(
                "RetryPolicy {{ max_attempts: {MAX_ATTEMPTS_CAP}, backoff: {backoff:?}, \
                 deadline: Some(1.5s), classifier: custom, assume_idempotent: true, \
                 idempotency_key: None, hooks: Hooks {{ count: 1 }}, transparent_retry: true, \
                 hedging: None }}"
            )
        );

        let plain = config.methods()[1].policy();
        assert!(super::super::retried_codes(&plain).is_empty());
        // One attempt, no deadline, and A6's transparent retry still applies (it is no
        // `never()`).
        assert_eq!(
            format!("{plain:?}"),
            "RetryPolicy { max_attempts: 1, classifier: custom, assume_idempotent: true, \
             idempotency_key: None, hooks: Hooks { count: 1 }, transparent_retry: true }"
        );
    }

    #[test]
    fn durations_as_c_core_reads_them() {
        let ok =
            |text: &str, millis: i64| assert_eq!(parse_grpc_duration(text), Ok(millis), "{text:?}");
        ok("0s", 0);
        ok("1s", 1000);
        ok("0.1s", 100);
        ok("01.5s", 1500);
        ok("0.000999999s", 0);
        ok("1.000000001s", 1000);
        ok("315576000000s", 315_576_000_000_000);
        ok("315576000000.999999999s", 315_576_000_000_999);
        // Spaces around the number, and a sign on either part.
        ok(" 1s", 1000);
        ok("1 s", 1000);
        ok("\x0b1s", 1000);
        ok("+1s", 1000);
        ok("1 .5s", 1500);
        // The sign counts as a digit of the fraction: "+5" is 5 hundredths.
        ok("1.+5s", 1050);
        ok("1.-5s", 950);
        ok("-0.5s", 500);
        ok("0.-5s", -50);
        for (bad, why) in [
            ("", "no \"s\" at the end"),
            ("1", "no \"s\" at the end"),
            ("1S", "no \"s\" at the end"),
            ("1s ", "no \"s\" at the end"),
            ("s", "no whole number of seconds"),
            (".1s", "no whole number of seconds"),
            ("1e3s", "no whole number of seconds"),
            ("0x1s", "no whole number of seconds"),
            ("+-1s", "no whole number of seconds"),
            ("- 1s", "no whole number of seconds"),
            ("\u{a0}1s", "no whole number of seconds"),
            ("١s", "no whole number of seconds"),
            ("1.s", "no number after the \".\""),
            ("1.5.5s", "no number after the \".\""),
            ("1. s", "no number after the \".\""),
            ("1.0000000000s", "more than 9 digits after the \".\""),
            ("1.+999999999s", "more than 9 digits after the \".\""),
            ("-1s", "negative seconds"),
            ("315576000001s", "more than 315576000000 seconds"),
            ("9223372036854775808s", "no whole number of seconds"),
        ] {
            assert_eq!(parse_grpc_duration(bad), Err(why), "{bad:?}");
        }
    }

    #[test]
    fn numbers_as_c_core_reads_them() {
        assert_eq!(read_trimmed::<i32>(b" +42\t\x0b"), Some(42));
        assert_eq!(read_trimmed::<i32>(b"-0"), Some(0));
        assert_eq!(read_trimmed::<i32>(b"2147483648"), None);
        assert_eq!(read_trimmed::<i32>(b"-2147483648"), Some(i32::MIN));
        assert_eq!(read_trimmed::<i64>(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(read_trimmed::<u32>(b"4294967295"), Some(u32::MAX));
        for bad in [
            &b""[..],
            b"+",
            b"-",
            b"- 1",
            b"1 2",
            b"+-1",
            b"0x1",
            b"1.0",
            b"1e1",
            b"\xc2\xa01",
        ] {
            assert_eq!(read_trimmed::<i64>(bad), None, "{bad:?}");
        }
        assert_eq!(read_trimmed::<u32>(b"-0"), None);
        assert_eq!(read_trimmed::<u32>(b"4294967296"), None);

        let float = read_trimmed::<f64>;
        assert_eq!(float(b" +.5 "), Some(0.5));
        assert_eq!(float(b"1."), Some(1.0));
        assert_eq!(float(b"1E5"), Some(1e5));
        assert_eq!(float(b"1e400"), Some(f64::INFINITY));
        assert_eq!(float(b"Infinity"), Some(f64::INFINITY));
        assert_eq!(float(b"-INF"), Some(f64::NEG_INFINITY));
        for nan in [&b"nan"[..], b"-NaN"] {
            assert!(float(nan).is_some_and(f64::is_nan), "{nan:?}");
        }
        for bad in [
            &b""[..],
            b".",
            b"e5",
            b"1e",
            b"1e+",
            b"1p3",
            b"0x1p3",
            b"0x1.8",
            b"++2",
            b"+-2",
            b"infinit",
            b"nanx",
            b"nan(abc)",
            b"1,5",
        ] {
            assert_eq!(float(bad), None, "{bad:?}");
        }

        assert_eq!(token_ratio_millis(b"0.1"), Some(100));
        assert_eq!(token_ratio_millis(b"0.1239"), Some(123));
        assert_eq!(token_ratio_millis(b"0.+12"), Some(12));
        assert_eq!(token_ratio_millis(b" 2"), Some(2000));
        for bad in [&b"-0.5"[..], b".5", b"1.", b"1e-1", b"0.1e1", b"0.-1"] {
            assert_eq!(token_ratio_millis(bad), None, "{bad:?}");
        }
        // A JSON number's stand-in text: its value in decimal, never with an exponent.
        assert_eq!(Number::Float(1e-1).decimal(), "0.1");
        assert_eq!(Number::Float(1e21).decimal(), "1000000000000000000000");
        assert_eq!(Number::Float(-0.0).decimal(), "-0");
        assert_eq!(Number::Float(2.0).to_string(), "2.0");
        assert_eq!(Number::Float(1e300).to_string(), "1e300");
    }

    #[test]
    fn json_through_serde_json() {
        let float = |f: f64| Json::Number(Number::Float(f));
        assert_eq!(
            read_json(
                r#" {"a": [1, -2, 2.0, -0.5e+3, "x\u00e9\ud83d\ude00\n", true, null], "b": {}} "#
            ),
            Ok(Json::Object(vec![
                (
                    "a".to_string(),
                    Json::Array(vec![
                        Json::Number(Number::Unsigned(1)),
                        Json::Number(Number::Negative(-2)),
                        float(2.0),
                        float(-500.0),
                        Json::String("x\u{e9}\u{1f600}\n".to_string()),
                        Json::Bool(true),
                        Json::Null,
                    ])
                ),
                ("b".to_string(), Json::Object(vec![])),
            ]))
        );
        // Whole numbers beyond 64 bits, `-0` and exponents are floats.
        for (text, value) in [
            (
                "18446744073709551615",
                Json::Number(Number::Unsigned(u64::MAX)),
            ),
            ("18446744073709551616", float(18446744073709551616.0)),
            (
                "-9223372036854775808",
                Json::Number(Number::Negative(i64::MIN)),
            ),
            ("-0", float(-0.0)),
            ("1e2", float(100.0)),
        ] {
            assert_eq!(read_json(text), Ok(value), "{text}");
        }
        // The text ends at a NUL, as for C-core.
        assert_eq!(read_json("{}\0 junk"), Ok(Json::Object(vec![])));
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(read_json(&nested(127)).is_ok());
        assert!(
            read_json(&nested(128))
                .unwrap_err()
                .contains("recursion limit exceeded")
        );
        for bad in [
            "",
            " ",
            "{",
            "}",
            "01",
            "-",
            "-01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "+1",
            "1e400",
            "1 2",
            "[1,]",
            "{\"a\": 1,}",
            "{\"a\" 1}",
            "{a: 1}",
            "tru",
            "truex",
            "\"\t\"",
            "\"\\x\"",
            "\"\\u12\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"abc",
            "\u{feff}{}",
            "[1}",
        ] {
            assert!(read_json(bad).is_err(), "{bad:?}");
        }
        // A key twice, at any depth, even with the same value.
        for twice in [
            r#"{"a": 1, "a": 1}"#,
            r#"{"a": 1, "b": {"c": [], "c": null}}"#,
            r#"[{"x": {}, "y": 0, "x": 2}]"#,
        ] {
            let error = read_json(twice).unwrap_err();
            assert!(
                error.contains("is given twice in one object"),
                "{twice}: {error}"
            );
        }
        assert!(read_json(r#"{"a": {"a": 1}, "b": {"a": 2}}"#).is_ok());
    }

    proptest! {
        #[test]
        fn never_panics_on_any_text(text in ".{0,80}") {
            let _ = service_config(&text);
            let _ = parse_grpc_duration(&text);
            let _ = read_trimmed::<f64>(text.as_bytes());
            let _ = token_ratio_millis(text.as_bytes());
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

        /// Durations written the way grpc-go writes them read back to the millisecond.
        #[test]
        fn proto_durations_round_trip(secs in 0i64..=315_576_000_000, nanos in 0i64..1_000_000_000) {
            let text = format!("{secs}.{nanos:09}s");
            prop_assert_eq!(parse_grpc_duration(&text), Ok(secs * 1000 + nanos / 1_000_000));
        }

        /// JSON reads as serde_json's own `Value` has it (which keeps no key twice).
        #[test]
        fn standard_json_reads_as_serde_json_does(value in json_value()) {
            fn convert(value: &serde_json::Value) -> Json {
                match value {
                    serde_json::Value::Null => Json::Null,
                    serde_json::Value::Bool(b) => Json::Bool(*b),
                    serde_json::Value::Number(n) => Json::Number(match (n.as_u64(), n.as_i64()) {
                        (Some(n), _) => Number::Unsigned(n),
                        (None, Some(n)) => Number::Negative(n),
                        (None, None) => Number::Float(n.as_f64().unwrap()),
                    }),
                    serde_json::Value::String(s) => Json::String(s.clone()),
                    serde_json::Value::Array(items) => Json::Array(items.iter().map(convert).collect()),
                    serde_json::Value::Object(fields) => Json::Object(
                        fields.iter().map(|(k, v)| (k.clone(), convert(v))).collect(),
                    ),
                }
            }
            let text = serde_json::to_string_pretty(&value).unwrap();
            // Against serde_json's own reading of the text.
            let read: serde_json::Value = serde_json::from_str(&text).unwrap();
            prop_assert_eq!(read_json(&text), Ok(convert(&read)));
        }
    }
}
