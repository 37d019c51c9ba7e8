//! Loom models of the retry budget: every interleaving of a few threads
//! depositing and withdrawing at fixed ticks. Run with
//! `RUSTFLAGS="--cfg tower_http_retry_loom" cargo test --release --test loom_budget`.
#![cfg(tower_http_retry_loom)]

use tower_http_retry::RetryBudget;

use loom::thread;

/// Runs `work` on a new loom thread with its own clone of `budget`.
fn spawn<T: 'static>(
    budget: &RetryBudget,
    work: impl FnOnce(&RetryBudget) -> T + 'static,
) -> thread::JoinHandle<T> {
    let budget = budget.clone();
    thread::spawn(move || work(&budget))
}

/// Three threads race for two tokens: exactly two win, and the bucket ends
/// empty, never overdrawn.
#[test]
fn racing_withdrawals_take_each_token_exactly_once() {
    loom::model(|| {
        let budget = RetryBudget::new(0.0, 0, 2);
        let first = spawn(&budget, |budget| budget.loom_withdraw_at(0));
        let second = spawn(&budget, |budget| budget.loom_withdraw_at(0));
        let third = budget.loom_withdraw_at(0);
        let grants = [first.join().unwrap(), second.join().unwrap(), third]
            .into_iter()
            .filter(|&granted| granted)
            .count();
        assert_eq!(grants, 2);
        assert_eq!(budget.loom_units_at(0), 0);
    });
}

/// Preemption bound for the three-thread model with two calls per thread:
/// exploring it without a bound takes about ten minutes; with this bound a
/// few seconds. `LOOM_MAX_PREEMPTIONS` overrides it.
const PREEMPTION_BOUND: usize = 5;

/// Empties a budget of `max_tokens` tokens at tick 0.
fn drain(budget: &RetryBudget, max_tokens: u32) {
    for _ in 0..max_tokens {
        assert!(budget.loom_withdraw_at(0));
    }
    assert!(!budget.loom_withdraw_at(0));
    assert_eq!(budget.loom_units_at(0), 0);
}

/// Two threads deposit and withdraw at different, out-of-order ticks on an
/// emptied bucket that never reaches its cap; every interleaving is
/// explored. Nothing is overdrawn, no deposit is lost, and the 3 ms of
/// refill are credited exactly once: the final balance is start + deposits +
/// refill - grants.
#[test]
fn two_threads_lose_no_deposit_and_count_time_once() {
    loom::model(|| {
        // 0.5 tokens per deposit, 1 token/s = 1 thousandth per ms, cap 10.
        let budget = RetryBudget::new(0.5, 1, 10);
        drain(&budget, 10);
        let other = spawn(&budget, |budget| {
            budget.loom_deposit_at(2);
            budget.loom_withdraw_at(2)
        });
        budget.loom_deposit_at(1);
        let mine = budget.loom_withdraw_at(3);
        let grants = u64::from(other.join().unwrap()) + u64::from(mine);

        // 2 deposits of 500 and 3 ms at 1 per ms: 1_003 thousandths in all,
        // enough for one retry and not for two.
        assert!(grants <= 1, "overdrawn: {grants} grants from 1.003 tokens");
        assert_eq!(
            budget.loom_units_at(3) + grants * 1_000,
            1_003,
            "a deposit or some refill was lost, or time was counted twice"
        );
    });
}

/// The same with three threads, explored up to [`PREEMPTION_BOUND`]
/// preemptions.
#[test]
fn three_threads_lose_no_deposit_and_count_time_once() {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(PREEMPTION_BOUND);
    }
    builder.check(|| {
        let budget = RetryBudget::new(0.5, 1, 10);
        drain(&budget, 10);
        let first = spawn(&budget, |budget| {
            budget.loom_deposit_at(2);
            budget.loom_withdraw_at(2)
        });
        let second = spawn(&budget, |budget| {
            budget.loom_deposit_at(1);
            budget.loom_withdraw_at(3)
        });
        budget.loom_deposit_at(3);
        let third = budget.loom_withdraw_at(1);
        let grants = [first.join().unwrap(), second.join().unwrap(), third]
            .into_iter()
            .map(u64::from)
            .sum::<u64>();

        // 3 deposits of 500 and 3 ms at 1 per ms: 1_503 thousandths in all.
        assert!(grants <= 1, "overdrawn: {grants} grants from 1.503 tokens");
        assert_eq!(
            budget.loom_units_at(3) + grants * 1_000,
            1_503,
            "a deposit or some refill was lost, or time was counted twice"
        );
    });
}

/// At the cap, a deposit and two withdrawals race on a one-token bucket. The
/// only results a sequential order could give are allowed: the deposit is
/// clipped if it comes first, kept otherwise.
#[test]
fn racing_at_the_cap_matches_some_sequential_order() {
    loom::model(|| {
        let budget = RetryBudget::new(1.0, 0, 1);
        let depositor = spawn(&budget, |budget| budget.loom_deposit_at(0));
        let first = budget.loom_withdraw_at(0);
        let second = budget.loom_withdraw_at(0);
        depositor.join().unwrap();
        let grants = u64::from(first) + u64::from(second);
        let left = budget.loom_units_at(0);
        assert!(
            matches!((grants, left), (2, 0) | (1, 1_000) | (1, 0)),
            "no sequential order gives {grants} grants and {left} thousandths left"
        );
        // The first withdrawal always finds the starting token or the deposit.
        assert!(first);
    });
}

/// Two deposits race with a withdrawal on a full one-token bucket: the
/// balance never rises above the cap, and the withdrawal always finds a
/// token.
#[test]
fn racing_deposits_never_fill_past_the_cap() {
    loom::model(|| {
        let budget = RetryBudget::new(1.0, 0, 1);
        let first = spawn(&budget, |budget| budget.loom_deposit_at(0));
        let second = spawn(&budget, |budget| budget.loom_deposit_at(0));
        let granted = budget.loom_withdraw_at(0);
        first.join().unwrap();
        second.join().unwrap();
        assert!(granted);
        let left = budget.loom_units_at(0);
        // Both deposits before the withdrawal: both clipped, nothing left.
        // Otherwise the bucket ends full, and never fuller.
        assert!(
            left == 0 || left == 1_000,
            "{left} thousandths left in a one-token bucket"
        );
    });
}
