//! Driving a future on a `ManualClock` by hand, with no runtime: shared by the behaviour
//! tests and the wasm32 tests (tests/wasm.rs includes this file alone, by path).

use std::future::Future;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tower_http_retry::{ManualClock, Timer};

/// Polls `future` to its end on this thread, moving `clock` on by a millisecond whenever it
/// waits (at most ten thousand times): how long it took on the clock, and its output.
pub fn drive<F: Future>(clock: &ManualClock, future: F) -> (Duration, F::Output) {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    let start = clock.now();
    for _ in 0..10_000 {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return (clock.now() - start, output);
        }
        clock.advance(Duration::from_millis(1));
    }
    panic!("the request did not end within 10 s on the clock");
}
