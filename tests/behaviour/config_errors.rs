//! Bad configuration is refused at construction: every `try_` constructor returns an error
//! that says what is wrong, and its panicking twin panics with that very message.

use std::any::Any;
use std::panic::{UnwindSafe, catch_unwind};
use std::time::Duration;

use http::HeaderName;
use tower_http_retry::{
    Backoff, IdempotencyKey, InvalidConfig, RetryBudget, RetryLayer, RetryPolicy, Throttle,
};

/// The message of a panic raised by `f`, which must panic.
fn panic_message<R>(f: impl FnOnce() -> R + UnwindSafe) -> String {
    let payload: Box<dyn Any + Send> = match catch_unwind(f) {
        Ok(_) => panic!("expected a panic"),
        Err(payload) => payload,
    };
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(message) => (*message).to_string(),
            Err(_) => panic!("the panic carried no message"),
        },
    }
}

/// Asserts that `message` mentions every one of `needles` (each a list of accepted
/// spellings, compared without regard to case).
fn assert_mentions(message: &str, needles: &[&[&str]]) {
    let lower = message.to_lowercase();
    for spellings in needles {
        assert!(
            spellings.iter().any(|s| lower.contains(&s.to_lowercase())),
            "{message:?} should mention one of {spellings:?}"
        );
    }
}

const BAD_HEADER_NAMES: [&str; 5] = ["bad name", "bad\nname", "", "bad:name", "naïve"];

// ---- Backoff::try_exponential ----

#[test]
fn a_backoff_base_above_its_cap_is_refused() {
    let err: InvalidConfig =
        Backoff::try_exponential(Duration::from_secs(2), Duration::from_secs(1)).unwrap_err();
    let message = err.to_string();
    assert_mentions(&message, &[&["base"], &["cap"], &["2s"], &["1s"]]);

    let err = Backoff::try_exponential(Duration::MAX, Duration::ZERO).unwrap_err();
    assert_mentions(&err.to_string(), &[&["base"], &["cap"]]);
}

#[test]
fn a_backoff_base_equal_to_its_cap_is_accepted() {
    let backoff = Backoff::try_exponential(Duration::from_secs(1), Duration::from_secs(1)).unwrap();
    assert_eq!(backoff.ceiling(5), Duration::from_secs(1));
    assert!(Backoff::try_exponential(Duration::ZERO, Duration::ZERO).is_ok());
}

#[test]
#[should_panic(expected = "backoff base (2s) is greater than its cap (1s)")]
fn backoff_exponential_panics_on_a_base_above_its_cap() {
    let _ = Backoff::exponential(Duration::from_secs(2), Duration::from_secs(1));
}

// ---- Backoff::try_multiplier ----

#[test]
fn a_backoff_multiplier_that_is_not_a_positive_number_is_refused() {
    for bad in [f64::NAN, 0.0, -0.0, -2.0, f64::INFINITY, f64::NEG_INFINITY] {
        let err: InvalidConfig = Backoff::default().try_multiplier(bad).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("invalid retry configuration: backoff multiplier is "),
            "{bad}: {err}"
        );
        assert_mentions(&err.to_string(), &[&["multiplier"], &["greater than zero"]]);
        let panicked = panic_message(move || Backoff::default().multiplier(bad));
        assert_eq!(panicked, err.to_string(), "{bad}");
    }
    // Below 1 is allowed, as gRPC service configs allow it: the ceilings shrink.
    let shrinking = Backoff::default().try_multiplier(0.5).unwrap();
    assert!(shrinking.ceiling(3) < shrinking.ceiling(2));
}

// ---- RetryPolicy::try_max_attempts ----

#[test]
fn zero_attempts_are_refused() {
    let err: InvalidConfig = RetryPolicy::default().try_max_attempts(0).unwrap_err();
    assert_mentions(
        &err.to_string(),
        &[&["max_attempts", "attempts"], &["at least 1"]],
    );
    assert_eq!(
        format!("{:?}", RetryPolicy::default().try_max_attempts(1).unwrap()),
        "RetryPolicy { max_attempts: 1 }"
    );
}

#[test]
#[should_panic(expected = "max_attempts must be at least 1")]
fn max_attempts_panics_on_zero() {
    let _ = RetryPolicy::default().max_attempts(0);
}

// ---- header names: `IdempotencyKey::header_name`, `RetryLayer::attempt_header` ----

/// Both take an `http::HeaderName`: a bad name is refused where it is made, before either
/// sees it, and a good one is taken as it is.
#[test]
fn invalid_header_names_cannot_reach_the_layer() {
    for name in BAD_HEADER_NAMES {
        assert!(
            HeaderName::from_bytes(name.as_bytes()).is_err(),
            "{name:?} was accepted"
        );
    }
    let key = IdempotencyKey::default().header_name(HeaderName::from_static("x-request-key"));
    assert!(
        format!("{key:?}").contains(r#"header: "x-request-key""#),
        "{key:?}"
    );
    let layer = RetryLayer::new().attempt_header(HeaderName::from_static("retry-attempt"));
    assert!(
        format!("{layer:?}").contains(r#"attempt_header: Some("retry-attempt")"#),
        "{layer:?}"
    );
}

// ---- RetryBudget::builder().try_build() ----

/// A bad budget, and what its message must mention: the parameter and the value.
struct BadBudget {
    what: &'static str,
    ratio: f64,
    min_per_sec: f64,
    max_tokens: f64,
    mentions: &'static [&'static [&'static str]],
}

const BAD_BUDGETS: [BadBudget; 5] = [
    BadBudget {
        what: "NaN ratio",
        ratio: f64::NAN,
        min_per_sec: 10.0,
        max_tokens: 100.0,
        mentions: &[&["ratio"], &["nan"]],
    },
    BadBudget {
        what: "infinite ratio",
        ratio: f64::INFINITY,
        min_per_sec: 10.0,
        max_tokens: 100.0,
        mentions: &[&["ratio"], &["inf"]],
    },
    BadBudget {
        what: "negative infinite ratio",
        ratio: f64::NEG_INFINITY,
        min_per_sec: 10.0,
        max_tokens: 100.0,
        mentions: &[&["ratio"], &["inf"]],
    },
    BadBudget {
        what: "negative ratio",
        ratio: -0.5,
        min_per_sec: 10.0,
        max_tokens: 100.0,
        mentions: &[&["ratio"], &["-0.5", "negative"]],
    },
    BadBudget {
        what: "zero max tokens",
        ratio: 0.1,
        min_per_sec: 10.0,
        max_tokens: 0.0,
        mentions: &[&["max_tokens", "max tokens"], &["0", "zero"]],
    },
];

#[test]
fn bad_budgets_are_refused_with_a_message_that_names_the_value() {
    for bad in &BAD_BUDGETS {
        let what = bad.what;
        let err = match RetryBudget::builder()
            .ratio(bad.ratio)
            .min_per_sec(bad.min_per_sec)
            .max_tokens(bad.max_tokens)
            .try_build()
        {
            Ok(_) => panic!("a budget with a {what} was accepted"),
            Err(err) => err,
        };
        let message = err.to_string();
        assert_mentions(&message, bad.mentions);
        // It is a proper error, usable with `?` into a `BoxError`.
        let boxed: Box<dyn std::error::Error + Send + Sync> = Box::new(err);
        assert_eq!(boxed.to_string(), message, "{what}");
    }
}

#[test]
fn sound_budgets_are_accepted() {
    for (ratio, min_per_sec, max_tokens) in [
        (0.1, 10.0, 100.0),
        (0.0, 10.0, 100.0),
        (1.0, 0.0, 1.0),
        (1.0, 1_000.0, 10_000.0),
    ] {
        assert!(
            RetryBudget::builder()
                .ratio(ratio)
                .min_per_sec(min_per_sec)
                .max_tokens(max_tokens)
                .try_build()
                .is_ok(),
            "({ratio}, {min_per_sec}, {max_tokens}) was refused"
        );
    }
}

#[test]
#[should_panic(expected = "ratio")]
fn budget_build_panics_on_a_nan_ratio() {
    let _ = RetryBudget::builder()
        .ratio(f64::NAN)
        .min_per_sec(10.0)
        .max_tokens(100.0)
        .build();
}

#[test]
#[should_panic(expected = "ratio")]
fn budget_build_panics_on_an_infinite_ratio() {
    let _ = RetryBudget::builder()
        .ratio(f64::INFINITY)
        .min_per_sec(10.0)
        .max_tokens(100.0)
        .build();
}

#[test]
#[should_panic(expected = "ratio")]
fn budget_build_panics_on_a_negative_ratio() {
    let _ = RetryBudget::builder()
        .ratio(-0.5)
        .min_per_sec(10.0)
        .max_tokens(100.0)
        .build();
}

#[test]
#[should_panic(expected = "max")]
fn budget_build_panics_on_zero_max_tokens() {
    let _ = RetryBudget::builder()
        .ratio(0.1)
        .min_per_sec(10.0)
        .max_tokens(0.0)
        .build();
}

// ---- the panicking twins say exactly what the `try_` versions say ----

#[test]
fn every_panic_message_is_the_error_message() {
    let (two, one) = (Duration::from_secs(2), Duration::from_secs(1));
    assert_eq!(
        panic_message(|| Backoff::exponential(two, one)),
        Backoff::try_exponential(two, one).unwrap_err().to_string()
    );
    assert_eq!(
        panic_message(|| RetryPolicy::default().max_attempts(0)),
        RetryPolicy::default()
            .try_max_attempts(0)
            .unwrap_err()
            .to_string()
    );
    for bad in &BAD_BUDGETS {
        let (ratio, min_per_sec, max_tokens) = (bad.ratio, bad.min_per_sec, bad.max_tokens);
        assert_eq!(
            panic_message(move || RetryBudget::builder()
                .ratio(ratio)
                .min_per_sec(min_per_sec)
                .max_tokens(max_tokens)
                .build()),
            RetryBudget::builder()
                .ratio(ratio)
                .min_per_sec(min_per_sec)
                .max_tokens(max_tokens)
                .try_build()
                .err()
                .unwrap()
                .to_string(),
            "{}",
            bad.what
        );
    }
}

// ---- Throttle::builder().try_build() ----

fn throttle_error(max_tokens: f64, token_ratio: f64) -> InvalidConfig {
    match Throttle::builder()
        .max_tokens(max_tokens)
        .token_ratio(token_ratio)
        .try_build()
    {
        Ok(_) => panic!("a throttle of ({max_tokens}, {token_ratio}) was accepted"),
        Err(error) => error,
    }
}

#[test]
fn bad_throttles_are_refused_with_a_message_that_names_the_value() {
    // Each message names the value and the range it is out of: more than 0 (in
    // thousandths), at most 1000.
    for (bad, range) in [
        (0.0, "it must be at least 0.001"),
        (-1.0, "it must be a finite number from 0 to 1000"),
        (f64::NAN, "it must be a finite number from 0 to 1000"),
        (f64::INFINITY, "it must be a finite number from 0 to 1000"),
        (
            f64::NEG_INFINITY,
            "it must be a finite number from 0 to 1000",
        ),
        (1000.5, "it must be at most 1000"),
    ] {
        let error = throttle_error(bad, 0.1);
        let text = error.to_string();
        assert!(text.starts_with("invalid retry throttle: "), "{text}");
        assert!(
            text.contains(&format!("max_tokens is {bad}; {range}")),
            "{bad}: {text}"
        );
    }
    assert!(
        throttle_error(0.0001, 0.1)
            .to_string()
            .contains("at least 0.001")
    );
    for bad in [0.0, -0.5, f64::NAN, f64::INFINITY] {
        let text = throttle_error(10.0, bad).to_string();
        assert!(
            text.contains(&format!("token_ratio is {bad};")),
            "{bad}: {text}"
        );
    }
    assert!(
        throttle_error(10.0, 0.0004)
            .to_string()
            .contains("at least 0.001")
    );
}

#[test]
fn throttle_build_panics_with_the_same_message() {
    let expected = throttle_error(-1.0, 0.1).to_string();
    let message = panic_message(|| {
        Throttle::builder()
            .max_tokens(-1.0)
            .token_ratio(0.1)
            .build()
    });
    assert_eq!(message, expected);
}

#[test]
fn throttles_at_the_edges_of_the_range_are_accepted() {
    for (max_tokens, token_ratio) in [(1000.0, 0.001), (0.001, 0.001), (10.0, 1000.0)] {
        let throttle = Throttle::builder()
            .max_tokens(max_tokens)
            .token_ratio(token_ratio)
            .try_build()
            .unwrap_or_else(|error| panic!("({max_tokens}, {token_ratio}): {error}"));
        // It starts full.
        assert_eq!(throttle.tokens(), max_tokens);
    }
}

/// Every builder that documents a panic reports it at the caller's line, not inside the
/// crate (`#[track_caller]`), so the panic message points at the setting to fix.
#[test]
fn a_builder_panics_at_the_callers_line() {
    use std::cell::RefCell;

    thread_local! {
        static WHERE: RefCell<Option<String>> = const { RefCell::new(None) };
    }
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        let place = info.location().map(|l| l.file().to_string());
        WHERE.with(|w| *w.borrow_mut() = place);
    }));
    type Case = Box<dyn Fn() + UnwindSafe>;
    let cases: Vec<(&str, Case)> = vec![
        (
            "max_attempts(0)",
            Box::new(|| drop(RetryPolicy::default().max_attempts(0))),
        ),
        (
            "Backoff::exponential",
            Box::new(|| {
                let _ = Backoff::exponential(Duration::from_secs(2), Duration::from_secs(1));
            }),
        ),
        (
            "Backoff::multiplier",
            Box::new(|| {
                let _ = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(2))
                    .multiplier(-1.0);
            }),
        ),
        (
            "RetryBudget build",
            Box::new(|| drop(RetryBudget::builder().max_tokens(0.0).build())),
        ),
        (
            "Throttle build",
            Box::new(|| drop(Throttle::builder().max_tokens(-1.0).build())),
        ),
        (
            "RetryQuota build",
            Box::new(|| {
                drop(
                    tower_http_retry::RetryQuota::builder()
                        .max_tokens(f64::from(u32::MAX))
                        .build(),
                )
            }),
        ),
    ];
    let mut places = Vec::new();
    for (name, case) in cases {
        WHERE.with(|w| *w.borrow_mut() = None);
        assert!(catch_unwind(case).is_err(), "{name} panics");
        places.push((name, WHERE.with(|w| w.borrow().clone())));
    }
    std::panic::set_hook(previous);
    for (name, place) in places {
        let place = place.unwrap_or_default();
        assert!(
            place.ends_with("config_errors.rs"),
            "{name} panicked at {place}"
        );
    }
}
