//! The gRPC crate's tests: the gRPC glue and A6's retry rules over a tonic `Channel`
//! against a real tonic server,
//! against a second implementation (Python's grpcio, gRPC's C core), differentially against
//! C-core's own client, behind a real nginx, and service configs against C-core's verdicts.
//!
//! grpcio and nginx come from PyPI and Debian (`.ci/run` installs both). Without them the
//! tests that need them fail under `CI=true`, and elsewhere say on the terminal that they
//! skipped. See TESTING.md for what each module covers.

/// The test doubles shared with the core's test binaries (the repository's tests/common),
/// and the two gRPC servers only these tests use: a tonic one, and grpcio's (common/).
mod common {
    #[path = "../../../tests/common/mod.rs"]
    mod shared;
    pub use shared::*;

    pub mod grpc;
    pub mod grpcio;
}

mod a6;
mod differential;
mod glue;
mod grpcio;
#[cfg(feature = "opentelemetry")]
mod otel;
mod proxy;
mod service_config;
