//! Oracles for the fuzz targets: decoded cases and the properties checked on them.
//!
//! The same files are compiled into `tests/behaviour/proptest_parsers.rs`, so every property the
//! fuzzer checks is also checked by `cargo test`, on inputs drawn by proptest.

pub mod hints_case;
pub mod replay_case;
pub mod retry_after_case;
