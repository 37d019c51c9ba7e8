//! The layer over real transports on 127.0.0.1, one test binary: a hyper-util client
//! end to end, the races of real HTTP/1 and HTTP/2 connections (`real_transports`), the
//! layered client driven from spawned tasks, a seeded chaos server, and a load against a
//! real nginx.
//!
//! See TESTING.md for what each module covers.

#[path = "../common/mod.rs"]
mod common;

mod chaos;
mod end_to_end;
mod hedging;
mod nginx;
mod real_transports;
mod spawn;
