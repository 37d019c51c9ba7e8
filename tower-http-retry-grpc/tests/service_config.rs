//! `grpc::service_config` against gRPC's C core: a table of service configs, each with the
//! verdict C-core gives it, written in. Every row is read here, and must be accepted or
//! refused as C-core does, except the few rows that say why this crate differs (where A6
//! says otherwise, the crate cannot hold the value, or serde_json's reading of the JSON, or
//! Rust's of a number in a string, takes other texts than C-core's).
//!
//! The verdicts were found by feeding each config to Python's grpcio (C-core underneath)
//! with `tests/grpcio/config_verdict.py`, and the table itself needs neither. When grpcio is
//! installed, `c_core_still_agrees` runs the script over the whole table again and checks
//! that C-core's verdicts, and its reasons for refusing, are still the ones written here.
//! grpcio comes from PyPI (`.ci/run` installs it: `python3 -m pip install grpcio==1.85.3`).
//! The interpreter is `python3`, or the one `PYTHON3` names. Without grpcio that test fails
//! under `CI=true`, and elsewhere says loudly that it skipped.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use tonic::Code;
use tower_http_retry_grpc::{MethodName, ServiceConfig, service_config};

use common::grpcio::python;

/// What C-core does with a config: takes it, or refuses it with a message containing the
/// text given (its `field:... error:...` part, usually).
#[derive(Debug, Clone, Copy)]
enum CCore {
    Accepts,
    Refuses(&'static str),
}

/// How this crate's reading compares with C-core's.
#[derive(Debug, Clone, Copy)]
enum Ours {
    /// The same verdict; when refused, the field the error names.
    Same(&'static str),
    /// The other verdict, for the reason given; when refused here, the field.
    Differs {
        why: &'static str,
        field: &'static str,
    },
}

struct Row {
    /// What the row is about.
    what: &'static str,
    json: String,
    c_core: CCore,
    ours: Ours,
    /// Checks of what was read, for some accepted rows.
    check: Option<fn(&ServiceConfig)>,
}

fn row(what: &'static str, json: impl Into<String>, c_core: CCore, ours: Ours) -> Row {
    Row {
        what,
        json: json.into(),
        c_core,
        ours,
        check: None,
    }
}

fn accepted(what: &'static str, json: impl Into<String>) -> Row {
    row(what, json, CCore::Accepts, Ours::Same(""))
}

fn refused(
    what: &'static str,
    json: impl Into<String>,
    field: &'static str,
    says: &'static str,
) -> Row {
    row(what, json, CCore::Refuses(says), Ours::Same(field))
}

/// The `tokenRatio` the config was read with.
fn token_ratio(config: &ServiceConfig) -> f64 {
    config
        .retry_throttling()
        .expect("retryThrottling")
        .token_ratio
}

impl Row {
    fn checked(mut self, check: fn(&ServiceConfig)) -> Row {
        self.check = Some(check);
        self
    }

    /// Whether C-core takes the config.
    fn c_core_accepts(&self) -> bool {
        matches!(self.c_core, CCore::Accepts)
    }

    /// Whether this crate takes it.
    fn we_accept(&self) -> bool {
        match self.ours {
            Ours::Same(_) => self.c_core_accepts(),
            Ours::Differs { .. } => !self.c_core_accepts(),
        }
    }

    /// The field this crate's error names, when it refuses.
    fn our_field(&self) -> &'static str {
        match self.ours {
            Ours::Same(field) | Ours::Differs { field, .. } => field,
        }
    }
}

/// A config with one method entry (for the service `a.B`) whose retry policy is a valid
/// one changed by `changes`: `("field", "json")` sets a field, `("field", "-")` drops it.
fn policy(changes: &[(&str, &str)]) -> String {
    let base = [
        ("maxAttempts", "3"),
        ("initialBackoff", "\"0.1s\""),
        ("maxBackoff", "\"1s\""),
        ("backoffMultiplier", "2"),
        ("retryableStatusCodes", "[\"UNAVAILABLE\"]"),
    ];
    let mut fields: Vec<String> = Vec::new();
    for (key, value) in base {
        match changes.iter().find(|(k, _)| *k == key) {
            Some((_, "-")) => {}
            Some((_, v)) => fields.push(format!("\"{key}\": {v}")),
            None => fields.push(format!("\"{key}\": {value}")),
        }
    }
    for (key, value) in changes {
        if !base.iter().any(|(k, _)| k == key) {
            fields.push(format!("\"{key}\": {value}"));
        }
    }
    format!(
        r#"{{"methodConfig": [{{"name": [{{"service": "a.B"}}], "retryPolicy": {{{}}}}}]}}"#,
        fields.join(", ")
    )
}

fn one(key: &str, value: &str) -> String {
    policy(&[(key, value)])
}

/// A config with only `retryThrottling`, given as its fields.
fn throttling(fields: &str) -> String {
    format!(r#"{{"retryThrottling": {{{fields}}}}}"#)
}

/// A config whose `methodConfig` is `entries` (the JSON inside the list).
fn methods(entries: &str) -> String {
    format!(r#"{{"methodConfig": [{entries}]}}"#)
}

/// The retry policy read for the single entry.
fn retry(config: &ServiceConfig) -> &tower_http_retry_grpc::RetryParams {
    config.methods()[0].retry().expect("a retry policy")
}

fn table() -> Vec<Row> {
    let ib = "methodConfig[0].retryPolicy.initialBackoff";
    let mb = "methodConfig[0].retryPolicy.maxBackoff";
    let ma = "methodConfig[0].retryPolicy.maxAttempts";
    let bm = "methodConfig[0].retryPolicy.backoffMultiplier";
    let codes = "methodConfig[0].retryPolicy.retryableStatusCodes";
    let tokens = "retryThrottling.maxTokens";
    let ratio = "retryThrottling.tokenRatio";
    vec![
        // Durations.
        accepted(
            "a duration with a fraction",
            one("initialBackoff", "\"0.5s\""),
        )
        .checked(|c| {
            assert_eq!(retry(c).initial_backoff, Duration::from_millis(500));
        }),
        refused(
            "a fraction with no whole seconds",
            one("initialBackoff", "\".5s\""),
            ib,
            "retryPolicy.initialBackoff error:Not a duration (not a number of seconds)",
        ),
        accepted("whole seconds", one("maxBackoff", "\"30s\"")).checked(|c| {
            assert_eq!(retry(c).max_backoff, Duration::from_secs(30));
        }),
        accepted(
            "nanoseconds, which C-core drops below the millisecond",
            one("maxBackoff", "\"1.000000001s\""),
        )
        .checked(|c| assert_eq!(retry(c).max_backoff, Duration::from_secs(1))),
        refused(
            "negative seconds",
            one("maxBackoff", "\"-1s\""),
            mb,
            "retryPolicy.maxBackoff error:seconds must be in the range [0, 315576000000]",
        ),
        refused(
            "no s",
            one("initialBackoff", "\"1\""),
            ib,
            "retryPolicy.initialBackoff error:Not a duration (no s suffix)",
        ),
        refused(
            "an upper-case S",
            one("initialBackoff", "\"1S\""),
            ib,
            "retryPolicy.initialBackoff error:Not a duration (no s suffix)",
        ),
        refused(
            "a decimal with no s",
            one("initialBackoff", "\"1.5\""),
            ib,
            "retryPolicy.initialBackoff error:Not a duration (no s suffix)",
        ),
        accepted(
            "a space before the number",
            one("initialBackoff", "\" 1s\""),
        )
        .checked(|c| {
            assert_eq!(retry(c).initial_backoff, Duration::from_secs(1));
        }),
        refused(
            "a space after the s",
            one("initialBackoff", "\"1s \""),
            ib,
            "retryPolicy.initialBackoff error:Not a duration (no s suffix)",
        ),
        refused(
            "an exponent",
            one("initialBackoff", "\"1e3s\""),
            ib,
            "retryPolicy.initialBackoff error:Not a duration (not a number of seconds)",
        ),
        accepted("a plus sign", one("initialBackoff", "\"+1s\"")).checked(|c| {
            assert_eq!(retry(c).initial_backoff, Duration::from_secs(1));
        }),
        accepted(
            "the largest duration",
            one("maxBackoff", "\"315576000000s\""),
        )
        .checked(|c| {
            assert_eq!(retry(c).max_backoff, Duration::from_secs(315_576_000_000));
        }),
        refused(
            "a duration too large",
            one("maxBackoff", "\"315576000001s\""),
            mb,
            "retryPolicy.maxBackoff error:seconds must be in the range [0, 315576000000]",
        ),
        refused(
            "10 fractional digits",
            one("maxBackoff", "\"1.0000000001s\""),
            mb,
            "retryPolicy.maxBackoff error:Not a duration (too many digits after decimal)",
        ),
        refused(
            "a dot with no fraction",
            one("maxBackoff", "\"1.s\""),
            mb,
            "retryPolicy.maxBackoff error:Not a duration (not a number of nanoseconds)",
        ),
        refused(
            "a zero initialBackoff",
            one("initialBackoff", "\"0s\""),
            ib,
            "retryPolicy.initialBackoff error:must be greater than 0",
        ),
        refused(
            "a zero maxBackoff",
            one("maxBackoff", "\"0.0s\""),
            mb,
            "retryPolicy.maxBackoff error:must be greater than 0",
        ),
        refused(
            "a backoff below a millisecond, zero to C-core",
            one("initialBackoff", "\"0.0009s\""),
            ib,
            "retryPolicy.initialBackoff error:must be greater than 0",
        ),
        accepted("a millisecond", one("initialBackoff", "\"0.001s\"")).checked(|c| {
            assert_eq!(retry(c).initial_backoff, Duration::from_millis(1));
        }),
        row(
            "a negative fraction on zero seconds",
            one("initialBackoff", "\"0.-5s\""),
            CCore::Accepts,
            Ours::Differs {
                why: "C-core reads it as -50 ms and takes it, since it only refuses zero; \
                      A6 wants a backoff greater than zero",
                field: ib,
            },
        ),
        refused(
            "a duration as a number",
            one("initialBackoff", "1"),
            ib,
            "retryPolicy.initialBackoff error:is not a string",
        ),
        refused(
            "no initialBackoff",
            one("initialBackoff", "-"),
            ib,
            "retryPolicy.initialBackoff error:field not present",
        ),
        // maxAttempts.
        refused(
            "maxAttempts 0",
            one("maxAttempts", "0"),
            ma,
            "retryPolicy.maxAttempts error:must be at least 2",
        ),
        refused(
            "maxAttempts 1",
            one("maxAttempts", "1"),
            ma,
            "retryPolicy.maxAttempts error:must be at least 2",
        ),
        accepted("maxAttempts 2", one("maxAttempts", "2"))
            .checked(|c| assert_eq!(retry(c).max_attempts, 2)),
        accepted("maxAttempts 5", one("maxAttempts", "5"))
            .checked(|c| assert_eq!(retry(c).max_attempts, 5)),
        accepted("maxAttempts 6, clamped to 5", one("maxAttempts", "6"))
            .checked(|c| assert_eq!(retry(c).max_attempts, 5)),
        accepted("the largest maxAttempts", one("maxAttempts", "2147483647"))
            .checked(|c| assert_eq!(retry(c).max_attempts, 5)),
        refused(
            "maxAttempts beyond a 32-bit integer",
            one("maxAttempts", "2147483648"),
            ma,
            "retryPolicy.maxAttempts error:failed to parse number",
        ),
        refused(
            "a fractional maxAttempts",
            one("maxAttempts", "1.5"),
            ma,
            "retryPolicy.maxAttempts error:failed to parse number",
        ),
        refused(
            "maxAttempts 2.0",
            one("maxAttempts", "2.0"),
            ma,
            "retryPolicy.maxAttempts error:failed to parse number",
        ),
        accepted("maxAttempts in a string", one("maxAttempts", "\"3\""))
            .checked(|c| assert_eq!(retry(c).max_attempts, 3)),
        refused(
            "a negative maxAttempts",
            one("maxAttempts", "-1"),
            ma,
            "retryPolicy.maxAttempts error:must be at least 2",
        ),
        refused(
            "a boolean maxAttempts",
            one("maxAttempts", "true"),
            ma,
            "retryPolicy.maxAttempts error:is not a number",
        ),
        refused(
            "no maxAttempts",
            one("maxAttempts", "-"),
            ma,
            "retryPolicy.maxAttempts error:field not present",
        ),
        // backoffMultiplier.
        refused(
            "a zero multiplier",
            one("backoffMultiplier", "0"),
            bm,
            "retryPolicy.backoffMultiplier error:must be greater than 0",
        ),
        refused(
            "a negative multiplier",
            one("backoffMultiplier", "-1"),
            bm,
            "retryPolicy.backoffMultiplier error:must be greater than 0",
        ),
        accepted("a multiplier of 1", one("backoffMultiplier", "1"))
            .checked(|c| assert_eq!(retry(c).backoff_multiplier, 1.0)),
        accepted(
            "a multiplier in a string",
            one("backoffMultiplier", "\"1.5\""),
        )
        .checked(|c| assert_eq!(retry(c).backoff_multiplier, 1.5)),
        refused(
            "a multiplier that is not a number",
            one("backoffMultiplier", "\"2x\""),
            bm,
            "retryPolicy.backoffMultiplier error:failed to parse floating-point number",
        ),
        refused(
            "a multiplier too small for a float",
            one("backoffMultiplier", "1e-50"),
            bm,
            "retryPolicy.backoffMultiplier error:must be greater than 0",
        ),
        accepted(
            "an infinite multiplier",
            one("backoffMultiplier", "\"inf\""),
        )
        .checked(|c| assert_eq!(retry(c).backoff_multiplier, f64::INFINITY)),
        row(
            "a hex multiplier in a string",
            one("backoffMultiplier", "\"0x1.8\""),
            CCore::Accepts,
            Ours::Differs {
                why: "C-core reads a number in a string with C's float reading, hex forms \
                      included; Rust's float reading, used here, has no hex forms, and refusing \
                      them is the safer side",
                field: bm,
            },
        ),
        row(
            "a multiplier too large for a double",
            one("backoffMultiplier", "1e400"),
            CCore::Accepts,
            Ours::Differs {
                why: "C-core takes it as infinite; serde_json refuses a number beyond a \
                      double's range, in any field, as not JSON",
                field: "",
            },
        ),
        row(
            "a NaN multiplier",
            one("backoffMultiplier", "\"nan\""),
            CCore::Accepts,
            Ours::Differs {
                why: "C-core only refuses a multiplier at or below zero, and NaN is neither; \
                      A6 wants one greater than zero",
                field: bm,
            },
        ),
        refused(
            "no backoffMultiplier",
            one("backoffMultiplier", "-"),
            bm,
            "retryPolicy.backoffMultiplier error:field not present",
        ),
        // retryableStatusCodes.
        accepted(
            "names, repeated",
            one(
                "retryableStatusCodes",
                "[\"UNAVAILABLE\", \"ABORTED\", \"UNAVAILABLE\"]",
            ),
        )
        .checked(|c| {
            assert_eq!(
                retry(c).retryable_status_codes,
                [Code::Unavailable, Code::Aborted]
            );
        }),
        refused(
            "a code number",
            one("retryableStatusCodes", "[14]"),
            "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
            "retryPolicy.retryableStatusCodes[0] error:is not a string",
        ),
        refused(
            "a lower-case name",
            one("retryableStatusCodes", "[\"unavailable\"]"),
            "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
            "retryPolicy.retryableStatusCodes[0] error:failed to parse status code",
        ),
        refused(
            "an unknown name",
            one("retryableStatusCodes", "[\"GONE\"]"),
            "methodConfig[0].retryPolicy.retryableStatusCodes[0]",
            "retryPolicy.retryableStatusCodes[0] error:failed to parse status code",
        ),
        accepted(
            "only OK, which retries nothing",
            one("retryableStatusCodes", "[\"OK\"]"),
        )
        .checked(|c| assert!(retry(c).retryable_status_codes.is_empty())),
        refused(
            "an empty list",
            one("retryableStatusCodes", "[]"),
            codes,
            "retryPolicy.retryableStatusCodes error:must be non-empty",
        ),
        refused(
            "no list",
            one("retryableStatusCodes", "-"),
            codes,
            "retryPolicy.retryableStatusCodes error:must be non-empty",
        ),
        refused(
            "a name for a list",
            one("retryableStatusCodes", "\"UNAVAILABLE\""),
            codes,
            "retryPolicy.retryableStatusCodes error:is not an array",
        ),
        // The retry policy as a whole.
        refused(
            "an empty retry policy",
            methods(r#"{"name": [{}], "retryPolicy": {}}"#),
            ma,
            "retryPolicy.maxAttempts error:field not present",
        ),
        refused(
            "a retry policy that is not an object",
            methods(r#"{"name": [{}], "retryPolicy": 3}"#),
            "methodConfig[0].retryPolicy",
            "field:methodConfig[0].retryPolicy error:is not an object",
        ),
        accepted(
            "a null retry policy",
            methods(r#"{"name": [{}], "retryPolicy": null}"#),
        )
        .checked(|c| assert!(c.methods()[0].retry().is_none())),
        accepted(
            "unknown fields in a retry policy",
            policy(&[("perAttemptRecvTimeout", "\"x\""), ("extra", "1")]),
        ),
        // C-core does not hedge and ignores the field whatever it holds; A6 specifies it.
        accepted(
            "A6's hedging policy",
            methods(
                r#"{"name": [{}], "hedgingPolicy": {"maxAttempts": 7, "hedgingDelay": "0.5s",
                    "nonFatalStatusCodes": ["UNAVAILABLE", "UNAVAILABLE"]}}"#,
            ),
        )
        .checked(|c| {
            assert!(c.methods()[0].retry().is_none());
            let hedging = c.methods()[0].hedging().unwrap();
            assert_eq!(hedging.max_attempts, 5);
            assert_eq!(hedging.hedging_delay, Duration::from_millis(500));
            assert_eq!(hedging.non_fatal_status_codes, [tonic::Code::Unavailable]);
        }),
        accepted(
            "a hedging policy without a delay or codes",
            methods(r#"{"name": [{}], "hedgingPolicy": {"maxAttempts": 2}}"#),
        )
        .checked(|c| {
            let hedging = c.methods()[0].hedging().unwrap();
            assert_eq!(hedging.hedging_delay, Duration::ZERO);
            assert!(hedging.non_fatal_status_codes.is_empty());
        }),
        row(
            "a hedging policy that is not an object",
            methods(r#"{"name": [{}], "hedgingPolicy": 3}"#),
            CCore::Accepts,
            Ours::Differs {
                why: "C-core ignores hedgingPolicy; A6 specifies it, and a number is no policy",
                field: "methodConfig[0].hedgingPolicy",
            },
        ),
        row(
            "both a retry and a hedging policy",
            policy(&[]).replace(r#""retryPolicy""#, r#""hedgingPolicy": {}, "retryPolicy""#),
            CCore::Accepts,
            Ours::Differs {
                why: "C-core ignores hedgingPolicy; A6 allows only one of the two",
                field: "methodConfig[0]",
            },
        ),
        // retryThrottling.
        accepted(
            "A6's throttling",
            throttling(r#""maxTokens": 10, "tokenRatio": 0.1"#),
        )
        .checked(|c| {
            let throttling = c.retry_throttling().unwrap();
            assert_eq!((throttling.max_tokens, throttling.token_ratio), (10, 0.1));
            assert!(c.throttle().is_some());
        }),
        refused(
            "no tokens",
            throttling(r#""maxTokens": 0, "tokenRatio": 0.1"#),
            tokens,
            "field:retryThrottling.maxTokens error:must be greater than 0",
        ),
        accepted(
            "1000 tokens",
            throttling(r#""maxTokens": 1000, "tokenRatio": 0.1"#),
        ),
        row(
            "1001 tokens",
            throttling(r#""maxTokens": 1001, "tokenRatio": 0.1"#),
            CCore::Accepts,
            Ours::Differs {
                why: "the crate's throttle holds at most 1000 tokens; C-core and A6 set no \
                      limit but the field's 32 bits",
                field: tokens,
            },
        ),
        refused(
            "negative tokens",
            throttling(r#""maxTokens": -1, "tokenRatio": 0.1"#),
            tokens,
            "field:retryThrottling.maxTokens error:failed to parse non-negative number",
        ),
        refused(
            "fractional tokens",
            throttling(r#""maxTokens": 10.5, "tokenRatio": 0.1"#),
            tokens,
            "field:retryThrottling.maxTokens error:failed to parse non-negative number",
        ),
        accepted(
            "tokens in a string",
            throttling(r#""maxTokens": "10", "tokenRatio": 0.1"#),
        ),
        refused(
            "no maxTokens",
            throttling(r#""tokenRatio": 0.1"#),
            tokens,
            "field:retryThrottling.maxTokens error:field not present",
        ),
        refused(
            "a zero ratio",
            throttling(r#""maxTokens": 10, "tokenRatio": 0"#),
            ratio,
            "field:retryThrottling.tokenRatio error:must be greater than 0",
        ),
        refused(
            "a ratio below a thousandth",
            throttling(r#""maxTokens": 10, "tokenRatio": 0.0001"#),
            ratio,
            "field:retryThrottling.tokenRatio error:must be greater than 0",
        ),
        accepted(
            "a ratio with many decimals, read to three",
            throttling(r#""maxTokens": 10, "tokenRatio": 0.1239999"#),
        )
        .checked(|c| assert_eq!(token_ratio(c), 0.123)),
        refused(
            "a negative ratio",
            throttling(r#""maxTokens": 10, "tokenRatio": -0.5"#),
            ratio,
            "field:retryThrottling.tokenRatio error:could not parse as a number",
        ),
        accepted(
            "a ratio above 1",
            throttling(r#""maxTokens": 10, "tokenRatio": 1.5"#),
        )
        .checked(|c| assert_eq!(token_ratio(c), 1.5)),
        row(
            "a ratio with an exponent",
            throttling(r#""maxTokens": 10, "tokenRatio": 1e-1"#),
            CCore::Refuses("field:retryThrottling.tokenRatio error:could not parse as a number"),
            Ours::Differs {
                why: "serde_json gives the number's value, not its text: C-core reads the ratio \
                      from the text, to three decimals, so it refuses an exponent after fewer \
                      (and takes 1.797e308 as 1.797); here the value is read, 0.1",
                field: "",
            },
        )
        .checked(|c| assert_eq!(token_ratio(c), 0.1)),
        accepted(
            "a ratio in a string",
            throttling(r#""maxTokens": 10, "tokenRatio": "0.5""#),
        )
        .checked(|c| assert_eq!(token_ratio(c), 0.5)),
        refused(
            "a null ratio",
            throttling(r#""maxTokens": 10, "tokenRatio": null"#),
            ratio,
            "field:retryThrottling.tokenRatio error:is not a number",
        ),
        refused(
            "throttling that is not an object",
            r#"{"retryThrottling": []}"#,
            "retryThrottling",
            "field:retryThrottling error:is not an object",
        ),
        accepted("null throttling", r#"{"retryThrottling": null}"#)
            .checked(|c| assert!(c.throttle().is_none() && c.retry_throttling().is_none())),
        // timeout.
        accepted("a timeout", methods(r#"{"name": [{}], "timeout": "2.5s"}"#)).checked(|c| {
            assert_eq!(c.methods()[0].timeout(), Some(Duration::from_millis(2500)));
        }),
        accepted(
            "a zero timeout, which is none to C-core",
            methods(r#"{"name": [{}], "timeout": "0s"}"#),
        )
        .checked(|c| assert_eq!(c.methods()[0].timeout(), None)),
        refused(
            "a timeout with no whole seconds",
            methods(r#"{"name": [{}], "timeout": ".5s"}"#),
            "methodConfig[0].timeout",
            "field:methodConfig[0].timeout error:Not a duration (not a number of seconds)",
        ),
        refused(
            "a negative timeout",
            methods(r#"{"name": [{}], "timeout": "-1s"}"#),
            "methodConfig[0].timeout",
            "field:methodConfig[0].timeout error:seconds must be in the range",
        ),
        refused(
            "a timeout as a number",
            methods(r#"{"name": [{}], "timeout": 1}"#),
            "methodConfig[0].timeout",
            "field:methodConfig[0].timeout error:is not a string",
        ),
        // Names.
        accepted(
            "a service, and a method",
            methods(r#"{"name": [{"service": "a.B"}, {"service": "c.D", "method": "E"}]}"#),
        )
        .checked(|c| {
            let names = c.methods()[0].names();
            assert_eq!(
                names[0],
                MethodName::Service {
                    service: "a.B".into()
                }
            );
            assert!(names[1].matches("/c.D/E") && !names[1].matches("/c.D/F"));
        }),
        refused(
            "a method without a service",
            methods(r#"{"name": [{"method": "E"}]}"#),
            "methodConfig[0].name[0].method",
            "field:methodConfig[0].name[0] error:method name populated without service name",
        ),
        accepted(
            "a method with an empty service, which is the default",
            methods(r#"{"name": [{"service": "", "method": "E"}]}"#),
        )
        .checked(|c| assert_eq!(c.methods()[0].names(), [MethodName::Default])),
        accepted("an empty name, the default", methods(r#"{"name": [{}]}"#)),
        accepted(
            "a name with a slash",
            methods(r#"{"name": [{"service": "a/B"}]}"#),
        ),
        refused(
            "the same service twice",
            methods(
                r#"{"name": [{"service": "a.B"}]}, {"name": [{"service": "a.B", "method": ""}]}"#,
            ),
            "methodConfig[1].name[0]",
            "field:methodConfig[1].name[0] error:multiple method configs for path /a.B/",
        ),
        refused(
            "the same method twice in one entry",
            methods(
                r#"{"name": [{"service": "a.B", "method": "C"}, {"service": "a.B", "method": "C"}]}"#,
            ),
            "methodConfig[0].name[1]",
            "field:methodConfig[0].name[1] error:multiple method configs for path /a.B/C",
        ),
        refused(
            "the default twice",
            methods(r#"{"name": [{}]}, {"name": [{"service": ""}]}"#),
            "methodConfig[1].name[0]",
            "field:methodConfig[1].name[0] error:duplicate default method config",
        ),
        refused(
            "a service that is not a string",
            methods(r#"{"name": [{"service": 3}]}"#),
            "methodConfig[0].name[0].service",
            "field:methodConfig[0].name[0].service error:is not a string",
        ),
        refused(
            "names that are not a list",
            methods(r#"{"name": {"service": "a.B"}}"#),
            "methodConfig[0].name",
            "field:methodConfig[0].name error:is not an array",
        ),
        refused(
            "an entry without names, still checked",
            methods(r#"{"timeout": "x"}"#),
            "methodConfig[0].timeout",
            "field:methodConfig[0].timeout error:Not a duration (no s suffix)",
        ),
        // The config as a whole.
        refused(
            "a list for a config",
            "[]",
            "",
            "errors validating service config: [field: error:is not an object]",
        ),
        refused(
            "methodConfig that is not a list",
            r#"{"methodConfig": {}}"#,
            "methodConfig",
            "field:methodConfig error:is not an array",
        ),
        refused(
            "a null methodConfig",
            r#"{"methodConfig": null}"#,
            "methodConfig",
            "field:methodConfig error:is not an array",
        ),
        refused(
            "an entry that is not an object",
            r#"{"methodConfig": [3]}"#,
            "methodConfig[0]",
            "field:methodConfig[0] error:is not an object",
        ),
        accepted(
            "unknown fields",
            r#"{"unknownField": 1, "methodConfig": [{"other": []}]}"#,
        ),
        refused(
            "a key twice",
            r#"{"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}, "retryThrottling": null}"#,
            "",
            "JSON parsing failed: [duplicate key \"retryThrottling\"",
        ),
        refused(
            "text that is not JSON",
            r#"{"methodConfig": [}"#,
            "",
            "JSON parsing failed: [JSON parse error",
        ),
        row(
            "a number that is not standard JSON, in a field that is not read",
            r#"{"unknownField": -01}"#,
            CCore::Accepts,
            Ours::Differs {
                why: "C-core's JSON reader takes a few non-standard numbers (`-`, `-01`, `1e+`); \
                      serde_json reads standard JSON",
                field: "",
            },
        ),
        row(
            "200 levels of nesting, in a field that is not read",
            format!(
                r#"{{"unknownField": {}{}}}"#,
                "[".repeat(199),
                "]".repeat(199)
            ),
            CCore::Accepts,
            Ours::Differs {
                why: "C-core's JSON reader allows 255 levels of arrays and objects, serde_json \
                      127",
                field: "",
            },
        ),
        row(
            "a wrongly typed field that is not read",
            methods(r#"{"name": [{}], "waitForReady": 3}"#),
            CCore::Refuses("field:methodConfig[0].waitForReady error:is not a boolean"),
            Ours::Differs {
                why: "waitForReady, like the load balancing and message size fields, is not \
                      read here, and not checked",
                field: "",
            },
        ),
    ]
}

#[test]
fn each_row_is_read_as_c_core_reads_it() {
    let rows = table();
    assert!(rows.len() >= 50, "{} rows", rows.len());
    let mut wrong = Vec::new();
    for row in &rows {
        match (service_config(&row.json), row.we_accept()) {
            (Ok(config), true) => {
                if let Some(check) = row.check {
                    check(&config);
                }
            }
            (Err(error), false) => {
                if error.field() != row.our_field() {
                    wrong.push(format!(
                        "{}: refused for field {:?}, not {:?}: {error}",
                        row.what,
                        error.field(),
                        row.our_field()
                    ));
                }
            }
            (Ok(_), false) => wrong.push(format!("{}: accepted, but should be refused", row.what)),
            (Err(error), true) => wrong.push(format!("{}: refused: {error}", row.what)),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn rows_that_differ_say_why_and_stay_few() {
    let rows = table();
    let differ: Vec<_> = rows
        .iter()
        .filter_map(|row| match row.ours {
            Ours::Differs { why, .. } => Some((row.what, why)),
            Ours::Same(_) => None,
        })
        .collect();
    assert!(differ.iter().all(|(_, why)| !why.is_empty()));
    // Six where A6, the crate's throttle or the fields it does not read decide (one of them
    // a hedging policy, which C-core ignores); five from reading the JSON with serde_json,
    // and numbers in strings with Rust's own parsing.
    assert!(differ.len() <= 11, "{differ:?}");
    // Each row's text is its own.
    let mut texts: Vec<&str> = rows.iter().map(|row| row.json.as_str()).collect();
    texts.sort_unstable();
    texts.dedup();
    assert_eq!(texts.len(), rows.len(), "two rows hold the same config");
}

/// C-core's verdict on each config, from `tests/grpcio/config_verdict.py`: whether it
/// takes it, and its message.
fn c_core_verdicts(python: &str, configs: &[&str]) -> Vec<(bool, String)> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/grpcio/config_verdict.py"
    );
    let mut child = Command::new(python)
        .arg(script)
        .env("GRPC_VERBOSITY", "NONE")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start tests/grpcio/config_verdict.py");
    let input = serde_json::to_vec(configs).unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let output = child.wait_with_output().expect("config_verdict.py runs");
    assert!(output.status.success(), "config_verdict.py failed");
    let verdicts: Vec<serde_json::Value> =
        serde_json::from_slice(&output.stdout).expect("config_verdict.py prints JSON");
    assert_eq!(verdicts.len(), configs.len(), "one verdict per config");
    verdicts
        .iter()
        .map(|v| {
            (
                v["accepted"].as_bool().expect("accepted is a boolean"),
                v["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn c_core_still_agrees() {
    let Some(python) = python("c_core_still_agrees") else {
        return;
    };
    let rows = table();
    let configs: Vec<&str> = rows.iter().map(|row| row.json.as_str()).collect();
    let verdicts = c_core_verdicts(python, &configs);
    let mut wrong = Vec::new();
    for (row, (accepts, message)) in rows.iter().zip(&verdicts) {
        match (row.c_core, accepts) {
            (CCore::Accepts, true) => {}
            (CCore::Refuses(says), false) if message.contains(says) => {}
            (CCore::Refuses(says), false) => wrong.push(format!(
                "{}: C-core refuses it, but says {message:?}, not {says:?}",
                row.what
            )),
            (CCore::Accepts, false) => {
                wrong.push(format!("{}: C-core refuses it now: {message}", row.what))
            }
            (CCore::Refuses(_), true) => {
                wrong.push(format!("{}: C-core accepts it now ({message})", row.what))
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
