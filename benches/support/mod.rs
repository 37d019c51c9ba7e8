//! Pieces the benches and `tests/alloc.rs` share: the tower `Retry` policy they compare
//! against, and how much of a bench's extra (non-criterion) part to run.
#![allow(dead_code)]

use std::future::{Ready, ready};
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use tower::retry::budget::{Budget, TpsBudget};

/// A `tower::retry::Policy` doing what ours does on the success path: the request is
/// cloned up front (`clone_request`; the `Full<Bytes>` body clone is a reference count,
/// once the first clone of a `Vec`-backed `Bytes` has allocated its shared header), every
/// logical request deposits once into a `TpsBudget`, and 408, 429, 502, 503, 504 and errors
/// are retried at most twice, each retry withdrawn from the budget. It adds no idempotency
/// key.
#[derive(Clone)]
pub struct TowerPolicy {
    budget: Arc<TpsBudget>,
    outcomes: u32,
}

impl TowerPolicy {
    pub fn new() -> Self {
        Self {
            budget: Arc::new(TpsBudget::new(Duration::from_secs(10), 10, 0.1)),
            outcomes: 0,
        }
    }
}

impl<B: Clone, RB, E> tower::retry::Policy<Request<B>, Response<RB>, E> for TowerPolicy {
    type Future = Ready<()>;

    fn retry(
        &mut self,
        _: &mut Request<B>,
        result: &mut Result<Response<RB>, E>,
    ) -> Option<Self::Future> {
        self.outcomes += 1;
        if self.outcomes == 1 {
            self.budget.deposit();
        }
        let retryable = match result {
            Ok(response) => matches!(response.status().as_u16(), 408 | 429 | 502 | 503 | 504),
            Err(_) => true,
        };
        (retryable && self.outcomes <= 2 && self.budget.withdraw()).then(|| ready(()))
    }

    fn clone_request(&mut self, request: &Request<B>) -> Option<Request<B>> {
        let mut copy = Request::new(request.body().clone());
        *copy.method_mut() = request.method().clone();
        *copy.uri_mut() = request.uri().clone();
        *copy.version_mut() = request.version();
        *copy.headers_mut() = request.headers().clone();
        *copy.extensions_mut() = request.extensions().clone();
        Some(copy)
    }
}

/// How much of the extra, non-criterion part to run: all of it under `cargo bench`, a
/// single quick pass under `cargo test --benches` or criterion's `--test`, none for
/// `--list` or `--profile-time`.
pub fn extra_runs(full: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    if has("--list") || has("--profile-time") {
        0
    } else if has("--bench") && !has("--test") {
        full
    } else {
        1
    }
}
