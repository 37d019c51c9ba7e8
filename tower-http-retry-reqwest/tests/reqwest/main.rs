//! The reqwest crate's tests, one binary: `ReqwestService`, the request-builder bridge
//! (`send_with`) and `RetryMiddleware` (feature `middleware`) against a real hyper server on
//! 127.0.0.1, in real time, on both runtimes. Native only: tokio, hyper and the test server do
//! not build for wasm32 (tests/wasm.rs runs there).
#![cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]

#[path = "../../../tests/common/mod.rs"]
mod common;

/// `on_both_runtimes!(a, b)`: tests `current_thread::a` and `multi_thread::a` (two
/// workers), ... each running the module's `async fn a()`. Defined before the modules, so
/// that both see it.
macro_rules! on_both_runtimes {
    ($($name:ident),* $(,)?) => {
        mod current_thread {
            $(
                #[tokio::test(flavor = "current_thread")]
                async fn $name() {
                    super::$name().await
                }
            )*
        }
        mod multi_thread {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name().await
                }
            )*
        }
    };
}

mod bridge;
mod middleware;
mod resume;
mod service;
