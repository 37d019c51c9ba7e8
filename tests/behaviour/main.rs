//! The layer's rules, one test binary: the retry loop against scripted services under
//! paused time (each module below is one subject), the configuration it refuses, the
//! budget's bound, the storm figures' shapes, the fuzz oracles as property tests, and the
//! core's architecture. A few cases check a rule against a real hyper server on 127.0.0.1
//! (`idempotency`, `hints`, `edge_cases`, `concurrency`).
//!
//! One binary, not one a file: each test binary links tokio, hyper and the crate again.
//! See TESTING.md for what each module covers.

#[path = "../common/mod.rs"]
mod common;

// The fuzz crate's oracles (`fuzz/src/`), fed by proptest in `proptest_parsers`. They stand
// at the root because they name each other through `crate::`, as in the fuzz crate.
#[path = "../../fuzz/src/hints_case.rs"]
mod hints_case;
#[path = "../../fuzz/src/replay_case.rs"]
mod replay_case;
#[path = "../../fuzz/src/retry_after_case.rs"]
mod retry_after_case;

mod adaptive;
mod architecture;
mod budget_bound;
mod cancellation;
mod circuit_breaker;
mod client_throttle;
mod concurrency;
mod config_errors;
mod edge_cases;
mod hedging;
mod hints;
mod idempotency;
mod logs;
mod partitions;
mod proptest_parsers;
mod quota;
mod record;
mod resume;
mod retry_delay;
mod retry_loop;
mod routes;
mod storm;
mod time_limits;
mod timer;
mod timer_gates;
