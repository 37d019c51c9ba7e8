//! The `grpc` feature, one test binary (`required-features = ["grpc"]`): the gRPC glue and
//! A6's retry rules over a tonic `Channel` against a real tonic server, against a second
//! implementation (Python's grpcio, gRPC's C core), differentially against C-core's own
//! client, behind a real nginx, and service configs against C-core's verdicts.
//!
//! grpcio and nginx come from PyPI and Debian (`.ci/run` installs both). Without them the
//! tests that need them fail under `CI=true`, and elsewhere say on the terminal that they
//! skipped. See TESTING.md for what each module covers.

#[path = "../common/mod.rs"]
mod common;

mod a6;
mod differential;
mod glue;
mod grpcio;
mod proxy;
mod service_config;
