//! The budget's bound through the public API under paused tokio time:
//! retries granted <= max_tokens + ratio * requests + min_per_sec * elapsed.

use std::time::Duration;

use proptest::prelude::*;
use tower::retry::budget::Budget as _;
use tower_http_retry::RetryBudget;

#[derive(Debug, Clone)]
enum Step {
    Deposit,
    Withdraw,
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Deposit),
        4 => Just(Step::Withdraw),
        1 => (1u64..2_000).prop_map(Step::Advance),
    ]
}

/// Runs `steps` on a paused clock and checks the bound after every step, in exact
/// milli-token arithmetic.
fn check(
    ratio_milli: u32,
    per_sec: u32,
    max_tokens: u32,
    steps: &[Step],
) -> Result<u64, TestCaseError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let budget = RetryBudget::builder()
            .ratio(f64::from(ratio_milli) / 1000.0)
            .min_per_sec(f64::from(per_sec))
            .max_tokens(f64::from(max_tokens))
            .build();
        let (mut deposits, mut granted, mut elapsed_ms) = (0u64, 0u64, 0u64);
        for step in steps {
            match step {
                Step::Deposit => {
                    budget.deposit();
                    deposits += 1;
                }
                Step::Withdraw => granted += u64::from(budget.withdraw()),
                Step::Advance(ms) => {
                    tokio::time::advance(Duration::from_millis(*ms)).await;
                    elapsed_ms += ms;
                }
            }
            let bound = u64::from(max_tokens) * 1000
                + u64::from(ratio_milli) * deposits
                + u64::from(per_sec) * elapsed_ms;
            prop_assert!(
                granted * 1000 <= bound,
                "granted {granted} over bound {bound} milli-tokens"
            );
            prop_assert!(budget.tokens() <= f64::from(max_tokens));
        }
        Ok(granted)
    })
}

#[test]
fn a_scripted_outage_is_held_to_the_bound() {
    // 100 tokens, then 1,000 requests each wanting 3 retries, over 10 simulated seconds.
    let mut steps = Vec::new();
    for _ in 0..100 {
        for _ in 0..10 {
            steps.push(Step::Deposit);
            steps.extend([Step::Withdraw, Step::Withdraw, Step::Withdraw]);
        }
        steps.push(Step::Advance(100));
    }
    let granted = check(100, 10, 100, &steps).unwrap();
    // At most the full bucket + 10% of 1,000 requests + 10/s for 10 s. A little less in
    // fact: the first deposits land in a full bucket, and the last 100 ms of refill come
    // after the last withdrawal.
    assert!((290..=300).contains(&granted), "{granted}");
    // Without the budget the same outage would have sent 3,000 retries.
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_sequences_never_exceed_the_bound(
        ratio_milli in 0u32..=1000,
        per_sec in 0u32..50,
        max_tokens in 1u32..200,
        steps in proptest::collection::vec(step(), 1..400),
    ) {
        check(ratio_milli, per_sec, max_tokens, &steps)?;
    }
}
