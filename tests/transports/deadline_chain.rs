//! Deadline propagation along a chain of real hyper servers on 127.0.0.1: the caller ->
//! A -> B -> C chain of `examples/deadline_chain.rs` (included below, so that the example
//! prints what this test bounds), over HTTP/1 and HTTP/2, with and without propagation.
//!
//! The bounds, and why they do not flake on a loaded two-core machine:
//!
//! - without propagation C works its whole 600 ms from when it is called, which is after
//!   the caller's call, so it works at least 400 ms past the caller's 200 ms deadline:
//!   timers never fire early, so that holds however slow the machine;
//! - with it, C's deadline is the caller's, late by at most the time the request took to
//!   reach C (each hop reads a relative time on arrival) and 1 ms of rounding up at each
//!   of the two hops that write what is left (the caller writes exactly 200): arithmetic
//!   on the instants each side read, not a race;
//! - and C's work past the caller's deadline is at most that lateness and the delay of
//!   one timer's wake-up. The target on an idle machine is the transit time and 5 ms (the
//!   example prints about 2 to 4 ms); the bound here allows 100 ms for a wake-up on a
//!   machine loaded by the rest of the suite, still a quarter of the 400 ms without.

use std::time::Duration;

#[allow(dead_code)] // the example's `main` and its printing are not used here
#[path = "../../examples/deadline_chain.rs"]
mod chain;

use chain::{C_WORK, CALLER_DEADLINE, run};

async fn both_protocols(spawned: bool) {
    for h2 in [false, true] {
        let (without, with) = match spawned {
            false => (run(h2, false).await.unwrap(), run(h2, true).await.unwrap()),
            true => {
                let without = tokio::spawn(run(h2, false)).await.unwrap().unwrap();
                let with = tokio::spawn(run(h2, true)).await.unwrap().unwrap();
                (without, with)
            }
        };
        let protocol = if h2 { "HTTP/2" } else { "HTTP/1" };
        assert!(
            without.worked >= C_WORK && without.after_deadline >= C_WORK - CALLER_DEADLINE,
            "{protocol}: without propagation C works its whole time: {without:?}"
        );
        assert!(
            with.c_deadline_late <= with.transit + Duration::from_millis(2),
            "{protocol}: C's deadline is the caller's, late by the transit and the rounding: {with:?}"
        );
        assert!(
            with.after_deadline <= with.transit + Duration::from_millis(100),
            "{protocol}: C stops with the caller's deadline: {with:?}"
        );
        assert!(
            with.worked < C_WORK,
            "{protocol}: C's work was cut short: {with:?}"
        );
    }
}

on_both_runtimes! {
    a_chain_of_servers_stops_working_with_the_caller_s_deadline => both_protocols,
}
