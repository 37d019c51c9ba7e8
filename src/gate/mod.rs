// Gates: what may stop a retry the policy allows. Every gate is told of each logical
// request and of each outcome (a success, a failure of some kind, or neither), and is asked
// before each retry; each kind is the one token bucket of `bucket.rs` with its own amounts.
//
// - `RetryBudget` (request-driven, the SRE book's): a request deposits `ratio`, a retry
//   withdraws one token or is refused, the bucket refills `min_per_sec` per second.
// - `Throttle` (failure-driven, gRPC's A6): a failure takes a token, a success gives
//   `token_ratio` back, and no retry is allowed while half or less is left.
// - `RetryQuota` (cost-weighted, the AWS SDKs' standard mode): a retry costs tokens by the
//   failure it follows, a success refunds its request's last retry, or, on a first try,
//   adds a reward.
//
// A request carries a `Ticket` from its first retry on: what its last retry took from each
// gate, so that a gate that refunds on success (a cost-weighted quota) can give back
// exactly that.

mod bucket;
mod budget;
mod partition;
mod quota;
mod throttle;

pub use self::budget::{BudgetBuilder, RetryBudget};
pub use self::quota::{QuotaBuilder, RetryQuota};
pub use self::throttle::{Throttle, ThrottleBuilder};

use crate::classify::{Classification, FailureKind};

/// What one outcome was, for the gates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heard {
    Success,
    Failure(FailureKind),
    /// Final, but neither a success nor a failure (a 404, an unrecognised error).
    Neither,
}

impl Heard {
    pub(crate) fn of(verdict: Classification) -> Self {
        match verdict {
            Classification::Success => Heard::Success,
            Classification::Done => Heard::Neither,
            other => match other.reason() {
                Some(reason) => Heard::Failure(reason.kind()),
                None => Heard::Neither,
            },
        }
    }
}

/// Why a gate refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The budget had no token for the retry.
    Budget,
    /// The throttle is at half or below.
    Throttle,
    /// The quota had not the retry's cost.
    Quota,
}

/// What a request's retries took from its gates: the budget's and the quota's units of its
/// last retry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Ticket {
    pub(crate) last_withdrawal: u64,
    /// What the quota took for the last retry that it paid for, refunded on success (a
    /// retry may cost nothing); `None` before one, and for transparent retries.
    pub(crate) quota_units: Option<u64>,
}

/// The gates of one policy, resolved against the layer's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gates {
    pub(crate) budget: Option<RetryBudget>,
    pub(crate) throttle: Option<Throttle>,
    pub(crate) quota: Option<RetryQuota>,
}

impl Gates {
    /// Whether a gate keeps its state per authority, so that each request must find its
    /// own partitions first ([`Gates::for_request`]).
    pub(crate) fn partitioned(&self) -> bool {
        self.budget
            .as_ref()
            .is_some_and(RetryBudget::is_per_authority)
            || self
                .throttle
                .as_ref()
                .is_some_and(Throttle::is_per_authority)
            || self
                .quota
                .as_ref()
                .is_some_and(RetryQuota::is_per_authority)
    }

    /// The gates of one request to the server `uri` (or, in origin form, the `Host` header)
    /// names: each per-authority gate's partition for that authority, the others as they
    /// are. Found once per logical request.
    pub(crate) fn for_request(&self, uri: &http::Uri, headers: &http::HeaderMap) -> Gates {
        let key = partition::AuthorityKey::of(uri, headers);
        Gates {
            budget: self.budget.as_ref().map(|b| b.partition_of(key.clone())),
            throttle: self.throttle.as_ref().map(|t| t.partition_of(key.clone())),
            quota: self.quota.as_ref().map(|q| q.partition_of(key)),
        }
    }

    /// A logical request starts: it is the client's traffic, retried or not.
    pub(crate) fn on_request(&self) {
        if let Some(budget) = &self.budget {
            budget.deposit();
        }
    }

    /// Whether any gate wants to hear of outcomes, successes included (else an outcome
    /// needs no telling): a throttle or a quota. The ratio budget hears requests only.
    pub(crate) fn hears_outcomes(&self) -> bool {
        self.throttle.is_some() || self.quota.is_some()
    }

    /// Tells every gate of an outcome that was not a transparent retry's (the server never
    /// saw that one), once per outcome. `Err` when a gate refuses any retry after it.
    /// `ticket` is what this request's retries took so far (none before a first retry).
    pub(crate) fn on_outcome(&self, heard: Heard, ticket: Option<&Ticket>) -> Result<(), Refusal> {
        // The ratio budget counts requests, not outcomes. The quota refunds a success's
        // last retry, or rewards a first-try success.
        if let (Heard::Success, Some(quota)) = (heard, &self.quota) {
            match ticket.and_then(|ticket| ticket.quota_units) {
                None => quota.reward(),
                Some(units) => quota.refund(units),
            }
        }
        match (heard, &self.throttle) {
            (Heard::Success, Some(throttle)) => throttle.record_success(),
            (Heard::Failure(_), Some(throttle)) if !throttle.record_failure() => {
                return Err(Refusal::Throttle);
            }
            _ => {}
        }
        Ok(())
    }

    /// Asks for a retry that everything else allows, last. A transparent retry is paid
    /// for by the budget like any other (the budget bounds every retry the layer sends),
    /// and is outside the throttle.
    /// `kind` is the failure the retry follows (a cost-weighted gate would charge by it).
    pub(crate) fn ask_retry(&self, kind: FailureKind, ticket: &mut Ticket) -> Result<(), Refusal> {
        let quota = match &self.quota {
            Some(quota) => match quota.withdraw(kind) {
                Some(units) => Some((quota, units)),
                None => return Err(Refusal::Quota),
            },
            None => None,
        };
        if let Err(refused) = self.ask_transparent_retry(ticket) {
            // The budget said no: the quota's cost is given back, nothing was sent.
            if let Some((quota, units)) = quota {
                quota.refund(units);
            }
            return Err(refused);
        }
        if let Some((_, units)) = quota {
            ticket.quota_units = Some(units);
        }
        Ok(())
    }

    /// Asks for a hedge: the throttle is only checked (a hedge is no failure, and the
    /// throttle hears each attempt's own failure), then the quota and the budget pay for it
    /// as for a retry after a failure of `kind`.
    pub(crate) fn ask_hedge(&self, kind: FailureKind, ticket: &mut Ticket) -> Result<(), Refusal> {
        if self
            .throttle
            .as_ref()
            .is_some_and(|throttle| !throttle.allows_retry())
        {
            return Err(Refusal::Throttle);
        }
        self.ask_retry(kind, ticket)
    }

    /// Asks for a transparent retry (of a request the server provably never saw): the
    /// budget pays for it, as for any retry the layer sends; the throttle and the quota,
    /// which weigh the server's failures, have no part in it.
    pub(crate) fn ask_transparent_retry(&self, ticket: &mut Ticket) -> Result<(), Refusal> {
        if let Some(budget) = &self.budget {
            if !budget.withdraw() {
                return Err(Refusal::Budget);
            }
            ticket.last_withdrawal = bucket::UNITS_PER_TOKEN;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::RetryReason;
    use http::StatusCode;

    const S503: RetryReason = RetryReason::Status(StatusCode::SERVICE_UNAVAILABLE);

    #[test]
    fn outcomes_are_heard_by_their_verdict() {
        assert_eq!(Heard::of(Classification::Success), Heard::Success);
        assert_eq!(Heard::of(Classification::Done), Heard::Neither);
        let transient = Heard::Failure(FailureKind::Transient);
        assert_eq!(Heard::of(Classification::Retry(S503)), transient);
        assert_eq!(Heard::of(Classification::RetryOnce(S503)), transient);
        assert_eq!(Heard::of(Classification::Stop(S503)), transient);
        let too_many = RetryReason::Status(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            Heard::of(Classification::Retry(too_many)),
            Heard::Failure(FailureKind::Throttling)
        );
        assert_eq!(
            Heard::of(Classification::Retry(RetryReason::Custom("x"))),
            Heard::Failure(FailureKind::Other)
        );
    }

    #[test]
    fn the_budget_is_paid_on_request_and_on_retry_and_hears_no_outcome() {
        let gates = Gates {
            budget: Some(
                RetryBudget::builder()
                    .ratio(0.5)
                    .min_per_sec(0)
                    .max_tokens(1)
                    .build(),
            ),
            throttle: None,
            quota: None,
        };
        assert!(!gates.hears_outcomes());
        let mut ticket = Ticket::default();
        assert_eq!(gates.ask_retry(FailureKind::Transient, &mut ticket), Ok(()));
        assert_eq!(ticket.last_withdrawal, 1_000);
        assert_eq!(
            gates.ask_retry(FailureKind::Transient, &mut ticket),
            Err(Refusal::Budget)
        );
        for heard in [Heard::Success, Heard::Failure(FailureKind::Transient)] {
            assert_eq!(gates.on_outcome(heard, Some(&ticket)), Ok(()));
        }
        gates.on_request();
        gates.on_request();
        assert_eq!(gates.ask_retry(FailureKind::Transient, &mut ticket), Ok(()));
        // No gates: everything passes.
        let none = Gates::default();
        none.on_request();
        assert_eq!(
            none.ask_retry(FailureKind::Other, &mut Ticket::default()),
            Ok(())
        );
        assert_eq!(
            none.on_outcome(Heard::Failure(FailureKind::Other), None),
            Ok(())
        );
    }

    #[test]
    fn the_throttle_hears_failures_and_successes_and_is_not_asked() {
        let throttle = Throttle::builder().max_tokens(4.0).token_ratio(1.0).build();
        let gates = Gates {
            budget: None,
            throttle: Some(throttle.clone()),
            quota: None,
        };
        assert!(gates.hears_outcomes());
        let failure = Heard::Failure(FailureKind::Transient);
        // 3 tokens left: above half.
        assert_eq!(gates.on_outcome(failure, None), Ok(()));
        // 2 left: not above half.
        assert_eq!(gates.on_outcome(failure, None), Err(Refusal::Throttle));
        assert_eq!(gates.on_outcome(Heard::Neither, None), Ok(()));
        assert_eq!(throttle.tokens(), 2.0);
        assert_eq!(gates.on_outcome(Heard::Success, None), Ok(()));
        assert_eq!(throttle.tokens(), 3.0);
        // Asking spends nothing of it: its answer came with the failure.
        assert_eq!(
            gates.ask_retry(FailureKind::Transient, &mut Ticket::default()),
            Ok(())
        );
        assert_eq!(throttle.tokens(), 3.0);
    }
}
