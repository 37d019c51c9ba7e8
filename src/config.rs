//! The layer's configuration as the services use it: every policy resolved once, when a
//! service is made, against what the layer adds to it (the budget, the key).

use std::sync::Arc;

use http::{HeaderName, Request};

use crate::budget::RetryBudget;
use crate::idempotency::IdempotencyKey;
use crate::policy::{PolicyKey, RetryPolicy};
use crate::route::RouteMatch;

/// What the layer sets beside its policies.
#[derive(Clone)]
pub(crate) struct Defaults {
    pub(crate) budget: Option<RetryBudget>,
    pub(crate) key: Option<IdempotencyKey>,
    /// The header whose presence makes a non-idempotent request retryable.
    pub(crate) key_header: HeaderName,
    pub(crate) max_replay_bytes: usize,
    pub(crate) attempt_header: Option<HeaderName>,
    #[cfg(feature = "grpc")]
    pub(crate) throttle: Option<crate::grpc::Throttle>,
}

/// One policy with the layer's additions resolved: all a request needs from the
/// configuration once its policy is chosen.
pub(crate) struct Plan {
    pub(crate) policy: RetryPolicy,
    /// The budget that pays for this policy's retries: its own, else the layer's.
    pub(crate) budget: Option<RetryBudget>,
    /// How keys are stamped: the policy's own configuration, else the layer's. A policy
    /// that declares its requests repeatable needs no key for that, so it gets none from
    /// the layer.
    pub(crate) key: Option<IdempotencyKey>,
    /// The header whose presence makes a non-idempotent request under this policy
    /// retryable.
    pub(crate) key_header: HeaderName,
    pub(crate) attempt_header: Option<HeaderName>,
    /// Whether outcomes are classified by the default table (no custom classifier, not
    /// gRPC), under which every 2xx response is final.
    default_classification: bool,
    /// The gRPC retry throttle for a gRPC policy: its own, else the layer's.
    #[cfg(feature = "grpc")]
    pub(crate) throttle: Option<crate::grpc::Throttle>,
}

impl Plan {
    /// Whether `result` is a success that the policy returns without further thought: a
    /// 2xx under the default classification (which never retries one).
    pub(crate) fn plain_success<RB, E>(&self, result: &Result<http::Response<RB>, E>) -> bool {
        self.default_classification
            && result
                .as_ref()
                .is_ok_and(|response| response.status().is_success())
    }

    pub(crate) fn resolve(policy: RetryPolicy, defaults: &Defaults) -> Self {
        let budget = policy.budget.clone().or_else(|| defaults.budget.clone());
        let (key, key_header) = match &policy.key {
            PolicyKey::Own(key) => (Some(key.clone()), key.header().clone()),
            PolicyKey::Off => (None, defaults.key_header.clone()),
            PolicyKey::Layer if policy.assume_idempotent => (None, defaults.key_header.clone()),
            PolicyKey::Layer => (defaults.key.clone(), defaults.key_header.clone()),
        };
        #[cfg(feature = "grpc")]
        let throttle = match policy.grpc_codes {
            Some(_) => policy
                .throttle
                .clone()
                .or_else(|| defaults.throttle.clone()),
            None => None,
        };
        let default_classification = !policy.has_custom_classifier();
        #[cfg(feature = "grpc")]
        let default_classification = default_classification && policy.grpc_codes.is_none();
        Self {
            default_classification,
            policy,
            budget,
            key,
            key_header,
            attempt_header: defaults.attempt_header.clone(),
            #[cfg(feature = "grpc")]
            throttle,
        }
    }
}

/// Every plan of a layer, and the choice of one for a request.
pub(crate) struct Plans {
    default: Arc<Plan>,
    routes: Vec<(RouteMatch, Arc<Plan>)>,
    defaults: Defaults,
}

impl Plans {
    pub(crate) fn new(
        policy: &RetryPolicy,
        routes: &[(RouteMatch, RetryPolicy)],
        defaults: &Defaults,
    ) -> Self {
        Self {
            default: Arc::new(Plan::resolve(policy.clone(), defaults)),
            routes: routes
                .iter()
                .map(|(route, policy)| {
                    (
                        route.clone(),
                        Arc::new(Plan::resolve(policy.clone(), defaults)),
                    )
                })
                .collect(),
            defaults: defaults.clone(),
        }
    }

    /// The plan for a request: its own policy extension first, then the first matching
    /// route, else the default. Allocates only for a request that carries a policy.
    pub(crate) fn select<B>(&self, request: &Request<B>) -> Arc<Plan> {
        if let Some(policy) = request.extensions().get::<RetryPolicy>() {
            return Arc::new(Plan::resolve(policy.clone(), &self.defaults));
        }
        let (method, uri, headers) = (request.method(), request.uri(), request.headers());
        let plan = self
            .routes
            .iter()
            .find(|(route, _)| route.matches_parts(method, uri, headers))
            .map_or(&self.default, |(_, plan)| plan);
        Arc::clone(plan)
    }

    pub(crate) fn max_replay_bytes(&self) -> usize {
        self.defaults.max_replay_bytes
    }
}

impl std::fmt::Debug for Plans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plans")
            .field("default", &self.default.policy)
            .field(
                "routes",
                &self
                    .routes
                    .iter()
                    .map(|(route, plan)| (route, &plan.policy))
                    .collect::<Vec<_>>(),
            )
            .field("budget", &self.defaults.budget)
            .field("max_replay_bytes", &self.defaults.max_replay_bytes)
            .finish()
    }
}
