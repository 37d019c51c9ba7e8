//! The layer over real transports on 127.0.0.1, one test binary: a hyper-util client
//! end to end, the races of real HTTP/1 and HTTP/2 connections (`real_transports`), the
//! layered client driven from spawned tasks, a seeded chaos server, a load against a real
//! nginx, and a real nginx answering 503 before it read the body.
//!
//! See TESTING.md for what each module covers.

#[path = "../common/mod.rs"]
mod common;

/// Tests of the resumable bodies, each a scenario `fn(spawned: bool)` run on both runtime
/// flavours, awaited and then spawned.
macro_rules! on_both_runtimes {
    ($($name:ident => $scenario:ident,)*) => {
        mod current_thread {
            $(
                #[tokio::test(flavor = "current_thread")]
                async fn $name() {
                    super::$scenario(false).await;
                    super::$scenario(true).await;
                }
            )*
        }
        mod multi_thread {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$scenario(false).await;
                    super::$scenario(true).await;
                }
            )*
        }
    };
}

mod chaos;
mod cut_proxy;
mod deadline_chain;
mod early_answer;
mod end_to_end;
mod h2_io;
mod hedge_safety;
mod hedging;
mod nginx;
mod real_transports;
mod refused_stream;
mod resume;
mod resume_encoding;
mod resume_nginx;
mod shared_body;
mod spawn;
