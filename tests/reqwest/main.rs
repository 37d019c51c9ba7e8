//! The `reqwest` and `reqwest-middleware` features, one test binary
//! (`required-features = ["reqwest"]`): `ReqwestService` and `RetryMiddleware` against a
//! real hyper server on 127.0.0.1, in real time, on both runtimes.

#[path = "../common/mod.rs"]
mod common;

mod middleware;
mod service;
