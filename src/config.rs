// The layer's configuration, and the same as the services use it: every policy resolved
// once, when a service is made, against what the layer adds to it (the gates, the key, the
// attempt header).

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::{HeaderName, Request};

use crate::deadline::{DeadlineHeader, RequestDeadline};
use crate::gate::{Gates, RetryBudget};
use crate::hedge::{Hedging, LatencyRecord};
use crate::hook::{AttemptHeader, Hooks};
use crate::idempotency::IdempotencyKey;
use crate::policy::{RetryPolicy, Settings};
use crate::route::RouteMatch;
use crate::time::Clock;
use crate::trace::Log;

/// Default cap on the bytes of a request body kept for replays: 64 KiB.
pub(crate) const DEFAULT_MAX_REPLAY_BYTES: usize = 64 * 1024;

/// Everything a [`RetryLayer`](crate::RetryLayer) is configured with.
#[derive(Clone)]
pub(crate) struct Config {
    /// Beneath the layer's policy: the layer's own budget (the rest of the crate's
    /// defaults are those of a policy that sets nothing).
    pub(crate) base: RetryPolicy,
    pub(crate) policy: RetryPolicy,
    pub(crate) routes: Vec<(RouteMatch, RetryPolicy)>,
    pub(crate) max_replay_bytes: usize,
    pub(crate) attempt_header: Option<HeaderName>,
    /// How the layer logs (nothing without the `tracing` feature).
    pub(crate) log: Log,
    /// Where the layer reads the time and sleeps (`RetryLayer::timer`).
    pub(crate) clock: Clock,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            base: RetryPolicy::new().gate(RetryBudget::default()),
            policy: RetryPolicy::new(),
            routes: Vec::new(),
            max_replay_bytes: DEFAULT_MAX_REPLAY_BYTES,
            attempt_header: None,
            log: Log::default(),
            clock: Clock::default(),
        }
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut f = f.debug_struct("RetryLayer");
        f.field("base", &self.base)
            .field("policy", &self.policy)
            .field("routes", &self.routes)
            .field("max_replay_bytes", &self.max_replay_bytes)
            .field("attempt_header", &self.attempt_header)
            .field("timer", &self.clock);
        #[cfg(feature = "tracing")]
        f.field("retry_log_level", &self.log.retries)
            .field("log_full_uri", &self.log.full_uri);
        #[cfg(feature = "opentelemetry")]
        f.field("otel_full_url", &self.log.otel.full_url);
        f.finish()
    }
}

/// One policy with the layer's additions resolved: all a request needs from the
/// configuration once its policy is chosen.
pub(crate) struct Plan {
    /// The policy laid over everything beneath it, for a request's own policy to be laid
    /// over in turn.
    merged: RetryPolicy,
    pub(crate) policy: Settings,
    /// The gates this policy's retries pass: its own budget and throttle, else the
    /// layer's.
    pub(crate) gates: Gates,
    /// How keys are stamped: the policy's own configuration, else the layer's. A policy
    /// that declares its requests repeatable needs no key for that, so it gets none from
    /// the layer.
    pub(crate) key: Option<IdempotencyKey>,
    /// The header whose presence makes a non-idempotent request under this policy
    /// retryable.
    pub(crate) key_header: HeaderName,
    /// The layer's attempt header, then the policy's own hooks.
    pub(crate) hooks: Hooks,
    /// How the route hedges, if it does: the policy's hedging with more than one attempt.
    pub(crate) hedging: Option<Hedging>,
    /// How the layer logs.
    pub(crate) log: Log,
    /// Whether outcomes are classified by the default table (no custom classifier), under
    /// which every 2xx response is a success, and no gate needs telling of one.
    plain_successes: bool,
    /// Whether a request needs gates of its own: a gate keeps its state per authority
    /// (each request finds its own first), or counts what is in flight.
    pub(crate) own_gates: bool,
    /// Whether a request sent once goes the watched way: a gate hears its outcome (a
    /// throttle, a quota) or paces first attempts, unless it is `never()`; or a gate counts
    /// what is in flight.
    pub(crate) reports_once: bool,
    /// Whether a gate paces first attempts (not under `never()`): each is asked first.
    pub(crate) asks_first: bool,
    /// Whether a retryable request's first attempt goes out of line: a gate paces first
    /// attempts or counts what is in flight.
    pub(crate) watched: bool,
    /// The latencies of the route's attempts, for hedging by percentile: made with the plan
    /// when its policy hedges so, else when a request's own policy first needs it.
    latency: OnceLock<Arc<LatencyRecord>>,
    /// The layer's clock.
    pub(crate) clock: Clock,
}

impl Plan {
    /// The route's latency record, when its policy hedges by percentile (or a request's own
    /// policy reads it).
    pub(crate) fn latency(&self) -> Option<&Arc<LatencyRecord>> {
        self.latency.get()
    }

    /// Whether `result` is a success that the policy returns without further thought: a
    /// 2xx under the default classification (which never retries one), with no gate to
    /// tell.
    pub(crate) fn plain_success<RB, E>(&self, result: &Result<http::Response<RB>, E>) -> bool {
        result
            .as_ref()
            .is_ok_and(|response| self.plain_success_status(response))
    }

    /// The same for a response.
    #[inline]
    pub(crate) fn plain_success_status<RB>(&self, response: &http::Response<RB>) -> bool {
        self.plain_successes && response.status().is_success()
    }

    /// A time limit the request sets itself, which bounds its deadline across all attempts
    /// (the shorter applies): what a hook reads from its headers (gRPC's `grpc-timeout`),
    /// and what is left of a [`RequestDeadline`] in its extensions (a server handler's
    /// deadline, carried on). The clock is read only for the latter.
    #[inline]
    pub(crate) fn time_limit<B>(&self, request: &Request<B>) -> Option<Duration> {
        let said = match self.hooks.is_empty() {
            true => None,
            false => self.hooks.time_limit(request.headers()),
        };
        match request.extensions().get::<RequestDeadline>() {
            None => said,
            Some(RequestDeadline(at)) => {
                let left = at.saturating_duration_since(self.clock.now());
                Some(said.map_or(left, |said| said.min(left)))
            }
        }
    }

    /// The plan of `merged`, a policy laid over everything beneath it.
    pub(crate) fn resolve(merged: RetryPolicy, config: &Config) -> Self {
        let policy = merged.settings();
        let hedging = merged
            .hedging()
            .filter(|_| !policy.never && policy.max_attempts > 1);
        let gates = merged.gate_set().gates();
        // A gate no layer has used yet takes this layer's clock (the first binding wins).
        gates.bind(&config.clock);
        let (key, key_header) = merged.key();
        let mut hooks = Hooks::default();
        if let Some(name) = &config.attempt_header {
            hooks.add(AttemptHeader(name.clone()));
        }
        // The attempt header is the layer's setting, not one of the policy's hooks: a
        // policy's `no_hooks` leaves it on.
        let mut hooks = hooks.then(&merged.hooks().kept());
        // The deadline header is a setting of its own: `no_hooks` leaves it on.
        if let Some(name) = merged.deadline_header_name() {
            hooks.add(DeadlineHeader(name.clone()));
        }
        let latency = OnceLock::new();
        if hedging.as_ref().is_some_and(Hedging::reads_latencies) {
            let _ = latency.set(Arc::new(LatencyRecord::new(config.clock.now())));
        }
        Self {
            latency,
            plain_successes: !policy.has_custom_classifier() && !gates.hears_outcomes(),
            own_gates: gates.needs_own(),
            reports_once: (!policy.never && (gates.hears_outcomes() || gates.asks_first()))
                || gates.hears_flight(),
            asks_first: !policy.never && gates.asks_first(),
            watched: gates.asks_first() || gates.hears_flight(),
            merged,
            policy,
            gates,
            key,
            key_header,
            hooks,
            hedging,
            log: config.log.clone(),
            clock: config.clock.clone(),
        }
    }
}

/// Every plan of a layer, and the choice of one for a request.
pub(crate) struct Plans {
    default: Arc<Plan>,
    routes: Vec<(RouteMatch, Arc<Plan>)>,
    config: Arc<Config>,
}

impl Plans {
    pub(crate) fn new(config: Arc<Config>) -> Self {
        // Each route's policy over the layer's, the layer's over its own budget.
        let layer = config.base.then(&config.policy);
        Self {
            default: Arc::new(Plan::resolve(layer.clone(), &config)),
            routes: config
                .routes
                .iter()
                .map(|(route, policy)| {
                    (
                        route.clone(),
                        Arc::new(Plan::resolve(layer.then(policy), &config)),
                    )
                })
                .collect(),
            config,
        }
    }

    /// The plan for a request: its own policy extension first, then the first matching
    /// route, else the default. Allocates only for a request that carries a policy.
    #[inline]
    pub(crate) fn select<B>(&self, request: &Request<B>) -> Arc<Plan> {
        match request.extensions().get::<RetryPolicy>() {
            Some(policy) => self.own(policy, request),
            None => Arc::clone(self.matched(request)),
        }
    }

    /// The plan of a request that carries its own policy, laid over that of the route the
    /// request matched. A percentile is read from the latencies of that route, not from a
    /// record of its own.
    #[cold]
    #[inline(never)]
    fn own<B>(&self, policy: &RetryPolicy, request: &Request<B>) -> Arc<Plan> {
        let matched = self.matched(request);
        let plan = Plan::resolve(matched.merged.then(policy), &self.config);
        if let Some(own) = plan.latency.get() {
            let shared = matched.latency.get_or_init(|| Arc::clone(own));
            return Arc::new(Plan {
                latency: OnceLock::from(Arc::clone(shared)),
                ..plan
            });
        }
        Arc::new(plan)
    }

    /// The plan of the first route `request` matches, else the default.
    #[inline]
    fn matched<B>(&self, request: &Request<B>) -> &Arc<Plan> {
        let (method, uri, headers) = (request.method(), request.uri(), request.headers());
        self.routes
            .iter()
            .find(|(route, _)| route.matches_parts(method, uri, headers))
            .map_or(&self.default, |(_, plan)| plan)
    }

    pub(crate) fn max_replay_bytes(&self) -> usize {
        self.config.max_replay_bytes
    }
}

impl fmt::Debug for Plans {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.config.fmt(f)
    }
}
