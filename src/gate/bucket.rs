// The one token bucket under every gate: a balance in thousandths of a token, capped,
// optionally refilled with time, changed only by compare-and-swap on one atomic word. The
// ratio budget deposits per request and withdraws per retry; the throttle takes a token per
// failure (never below zero) and gives some back per success. Both are this bucket with
// other amounts.
//
// The state word:
//
//  63              38 37                               0
// +------------------+----------------------------------+
// | balance: 26 bits | last refill tick: 38 bits        |
// +------------------+----------------------------------+
//
// - The balance counts thousandths of a token ("units"), so a bucket holds at most 67 108
//   tokens (`2^26 - 1` units is 67 108.863 tokens).
// - The tick is the number of whole milliseconds since its gate's epoch (`clock.rs`: the
//   instant the gate was bound to a clock), modulo `2^38`; a bucket made later (a
//   partition) is stamped with the tick it was made at.
//   A refill of `m` tokens per second is exactly `m` units per millisecond, so refill is
//   exact integer arithmetic: `elapsed_ms * m` units are credited and the tick moves to the
//   current millisecond, so no time is lost or counted twice. Time spent full is not banked.
// - The bucket holds no clock: its gate's state does, and hands it in (`now_tick`,
//   `read_tick`). A bucket that does not refill never reads the clock: its tick stays 0.
// - Deposits and saturating takes read no clock and leave the tick alone; the next
//   withdrawal credits the refill. A withdrawal reads the clock once, before it loads the
//   word, so with several threads it may carry a tick slightly older than the one another
//   thread has just stored. Such a call credits no refill and leaves the stored tick alone;
//   it is still a valid withdrawal. A tick counts as older when it lies in the half of the
//   38-bit circle behind the stored one, which is why the tick needs far more than 32 bits:
//   with 32 bits that half is only 24.8 days, and a client idle for a month could see its
//   refill stall for weeks. With 38 bits the tick wraps every 8.7 years (harmlessly: elapsed
//   time uses wrapping subtraction), and only a bucket that sees no withdrawal for more than
//   2^37 ms (about 4.36 years) can have its elapsed time misread as "older"; it then gets
//   no refill until the clock has gone round again, but deposits still work.
// - Every access uses `Ordering::Relaxed`: the word publishes no other memory, and every
//   change is a read-modify-write of that one word, so all changes are totally ordered and a
//   successful compare-and-swap proves no other change came in between its load and store.
//
// The loom models at the end of this file check the compare-and-swap loops under every
// interleaving; under `--cfg tower_http_retry_loom` the tests build the bucket on loom's
// atomics (loom is a dev-dependency, so users' lock files never list it).

#[cfg(all(test, tower_http_retry_loom))]
use ::loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(all(test, tower_http_retry_loom)))]
use std::sync::atomic::{AtomicU64, Ordering};

use std::time::Duration;

use super::clock::GateClock;

/// Balance units per token: balances are kept in thousandths of a token.
pub(crate) const UNITS_PER_TOKEN: u64 = 1_000;
/// Width of the tick field (the low bits of the state word).
const TICK_BITS: u32 = 38;
/// Width of the balance field (the high bits of the state word).
pub(crate) const BALANCE_BITS: u32 = u64::BITS - TICK_BITS;
/// Mask of the tick field; ticks are taken modulo `2^TICK_BITS`.
const TICK_MASK: u64 = (1 << TICK_BITS) - 1;
/// Elapsed tick counts at or above this are read as "behind the stored tick".
const TICK_HALF_RANGE: u64 = 1 << (TICK_BITS - 1);
/// Largest balance, in units, that the balance field can hold.
pub(crate) const MAX_BALANCE_UNITS: u64 = (1 << BALANCE_BITS) - 1;

/// Packs a balance (in units) and a tick into one state word.
const fn pack(balance: u64, tick: u64) -> u64 {
    (balance << TICK_BITS) | (tick & TICK_MASK)
}

/// The balance, in units, stored in a state word.
const fn balance_of(state: u64) -> u64 {
    state >> TICK_BITS
}

/// The last refill tick stored in a state word.
const fn tick_of(state: u64) -> u64 {
    state & TICK_MASK
}

/// A lock-free, fixed-point token bucket that starts full.
pub(crate) struct Bucket {
    /// Balance and last refill tick, packed by [`pack`].
    state: AtomicU64,
    /// Units added per elapsed millisecond (tokens per second); 0 for no refill.
    refill_per_ms: u64,
    /// Most units the bucket may hold; at most [`MAX_BALANCE_UNITS`].
    cap_units: u64,
}

/// The tick of `elapsed`: whole milliseconds, modulo `2^38`.
fn tick(elapsed: Duration) -> u64 {
    elapsed
        .as_secs()
        .wrapping_mul(1_000)
        .wrapping_add(u64::from(elapsed.subsec_millis()))
        & TICK_MASK
}

impl Bucket {
    /// A full bucket of `cap_units` (at most [`MAX_BALANCE_UNITS`]), refilled by
    /// `refill_per_ms` units per millisecond, stamped with tick 0.
    pub(crate) fn full(cap_units: u64, refill_per_ms: u64) -> Self {
        Self::with_start_tick(cap_units, refill_per_ms, 0)
    }

    /// A full bucket made now on `clock`: stamped with the tick it reads, if it is bound
    /// (a partition made after the gate's epoch), else with 0 (the epoch comes later).
    pub(crate) fn full_on(cap_units: u64, refill_per_ms: u64, clock: &GateClock) -> Self {
        let start = match refill_per_ms {
            0 => 0,
            _ => tick(clock.birth()),
        };
        Self::with_start_tick(cap_units, refill_per_ms, start)
    }

    /// A full bucket whose state is stamped with `start_tick`.
    fn with_start_tick(cap_units: u64, refill_per_ms: u64, start_tick: u64) -> Self {
        debug_assert!(cap_units <= MAX_BALANCE_UNITS);
        Self {
            state: AtomicU64::new(pack(cap_units, start_tick)),
            refill_per_ms,
            cap_units,
        }
    }

    pub(crate) fn cap_units(&self) -> u64 {
        self.cap_units
    }

    #[cfg(test)]
    pub(crate) fn refill_per_ms(&self) -> u64 {
        self.refill_per_ms
    }

    /// The current tick on `clock` (binding it to the default clock if nothing has); always
    /// 0 for a bucket that does not refill, which so reads no clock.
    #[inline]
    pub(crate) fn now_tick(&self, clock: &GateClock) -> u64 {
        if self.refill_per_ms == 0 {
            return 0;
        }
        tick(clock.elapsed())
    }

    /// The current tick for a read, which binds no clock: 0 while `clock` is unbound (no
    /// time has passed for a gate no layer has used).
    pub(crate) fn read_tick(&self, clock: &GateClock) -> u64 {
        if self.refill_per_ms == 0 {
            return 0;
        }
        clock.elapsed_if_bound().map_or(0, tick)
    }

    /// The state `state` becomes once refilled up to tick `now` (already masked). A tick
    /// that is not ahead of the stored one credits nothing and leaves the state as it is.
    fn refilled(&self, state: u64, now: u64) -> u64 {
        let elapsed = now.wrapping_sub(tick_of(state)) & TICK_MASK;
        if elapsed == 0 || elapsed >= TICK_HALF_RANGE {
            return state;
        }
        let credit = elapsed.saturating_mul(self.refill_per_ms);
        let balance = balance_of(state).saturating_add(credit).min(self.cap_units);
        pack(balance, now)
    }

    /// Applies `change` to the balance (refill aside) until a compare-and-swap lands; the
    /// balance it stored. `change` gets the stored balance and returns the new one.
    fn update(&self, change: impl Fn(u64) -> u64) -> u64 {
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            let balance = change(balance_of(current)).min(self.cap_units);
            let next = pack(balance, tick_of(current));
            if next == current {
                // Nothing changes (full already, or empty already): nothing to write.
                return balance;
            }
            match self.state.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return balance,
                Err(actual) => current = actual,
            }
        }
    }

    /// Adds `units`, up to the cap, without reading the clock or moving the stored tick.
    ///
    /// Refill is credited by the next withdrawal instead, which keeps the bound: deposits
    /// add at most `units` each, refill at most its rate per elapsed second, and the
    /// balance stays capped; a deposit made while earned refill is not yet credited can
    /// only be capped sooner, never later.
    pub(crate) fn deposit(&self, units: u64) {
        self.update(|balance| balance.saturating_add(units));
    }

    /// Takes `units` (never below zero) without crediting refill; the balance left.
    pub(crate) fn take_saturating(&self, units: u64) -> u64 {
        self.update(|balance| balance.saturating_sub(units))
    }

    /// Takes `units` if the bucket, refilled up to tick `now_ms` (taken modulo `2^38`),
    /// holds at least that many; else takes nothing and returns false.
    pub(crate) fn withdraw_at(&self, units: u64, now_ms: u64) -> bool {
        let now = now_ms & TICK_MASK;
        let mut current = self.state.load(Ordering::Relaxed);
        loop {
            let refilled = self.refilled(current, now);
            if balance_of(refilled) < units {
                // Refused. Nothing is stored: the next call credits the same elapsed time
                // from the same stored tick.
                return false;
            }
            let next = refilled - (units << TICK_BITS);
            match self.state.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// [`Bucket::withdraw_at`] now on `clock`.
    pub(crate) fn withdraw(&self, units: u64, clock: &GateClock) -> bool {
        self.withdraw_at(units, self.now_tick(clock))
    }

    /// The balance in units as of tick `now_ms` (taken modulo `2^38`), refill included,
    /// without changing the bucket.
    pub(crate) fn units_at(&self, now_ms: u64) -> u64 {
        let current = self.state.load(Ordering::Relaxed);
        balance_of(self.refilled(current, now_ms & TICK_MASK))
    }

    /// The balance in units now on `clock`, refill included (binding no clock).
    pub(crate) fn units(&self, clock: &GateClock) -> u64 {
        self.units_at(self.read_tick(clock))
    }

    /// [`Bucket::withdraw`] for a bucket that does not refill: no clock.
    pub(crate) fn withdraw_still(&self, units: u64) -> bool {
        debug_assert_eq!(self.refill_per_ms, 0);
        self.withdraw_at(units, 0)
    }

    /// [`Bucket::units`] for a bucket that does not refill: no clock.
    pub(crate) fn units_still(&self) -> u64 {
        debug_assert_eq!(self.refill_per_ms, 0);
        self.units_at(0)
    }
}

#[cfg(all(test, not(tower_http_retry_loom)))]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicUsize;

    use proptest::prelude::*;

    const TOKEN: u64 = UNITS_PER_TOKEN;

    /// The stored (not refilled) balance and tick.
    fn raw(bucket: &Bucket) -> (u64, u64) {
        let state = bucket.state.load(Ordering::Relaxed);
        (balance_of(state), tick_of(state))
    }

    /// Withdraws a token at `now` until refused; returns how many were granted.
    fn drain_at(bucket: &Bucket, now: u64) -> u64 {
        let mut granted = 0;
        while bucket.withdraw_at(TOKEN, now) {
            granted += 1;
            assert!(
                granted <= MAX_BALANCE_UNITS / TOKEN,
                "more grants than it holds"
            );
        }
        granted
    }

    #[test]
    fn starts_full_and_refuses_the_withdrawal_after_the_last_token() {
        let bucket = Bucket::full(5 * TOKEN, 10);
        for i in 0..5 {
            assert!(
                bucket.withdraw_at(TOKEN, 0),
                "withdrawal {i} of 5 was refused"
            );
        }
        assert!(
            !bucket.withdraw_at(TOKEN, 0),
            "the 6th withdrawal was granted"
        );
        assert_eq!(raw(&bucket), (0, 0));
    }

    #[test]
    fn a_thousandth_short_of_a_withdrawal_is_refused() {
        let bucket = Bucket::full(2 * TOKEN, 1);
        assert_eq!(drain_at(&bucket, 0), 2);
        bucket.deposit(999);
        assert!(!bucket.withdraw_at(TOKEN, 0), "granted with 0.999 tokens");
        // 1 token/s is one thousandth per millisecond.
        assert!(bucket.withdraw_at(TOKEN, 1), "refused with 1.000 tokens");
        assert_eq!(raw(&bucket), (0, 1));
        // Any amount: five tokens at once, from a full bucket of five.
        let five = Bucket::full(5 * TOKEN, 0);
        assert!(!five.withdraw_at(5 * TOKEN + 1, 0));
        assert!(five.withdraw_at(5 * TOKEN, 0));
        assert_eq!(five.units_at(0), 0);
    }

    #[test]
    fn deposits_never_fill_past_the_cap() {
        let bucket = Bucket::full(3 * TOKEN, 0);
        for _ in 0..10 {
            bucket.deposit(500);
        }
        assert_eq!(raw(&bucket), (3_000, 0));
        assert_eq!(drain_at(&bucket, 0), 3);
    }

    #[test]
    fn saturating_takes_stop_at_zero_and_say_what_is_left() {
        let bucket = Bucket::full(2 * TOKEN, 0);
        assert_eq!(bucket.take_saturating(TOKEN), 1_000);
        assert_eq!(bucket.take_saturating(600), 400);
        assert_eq!(bucket.take_saturating(TOKEN), 0);
        assert_eq!(bucket.take_saturating(TOKEN), 0);
        bucket.deposit(5_000);
        assert_eq!(bucket.units_at(0), 2_000);
    }

    #[test]
    fn refill_earns_its_rate_per_second_from_explicit_ticks() {
        let bucket = Bucket::full(5 * TOKEN, 10);
        assert_eq!(drain_at(&bucket, 0), 5);
        // 10 tokens/s is 10 units per millisecond: a token every 100 ms.
        assert!(
            !bucket.withdraw_at(TOKEN, 99),
            "granted after 99 ms (0.99 tokens)"
        );
        assert_eq!(raw(&bucket), (0, 0), "a refused withdrawal wrote the state");
        assert!(
            bucket.withdraw_at(TOKEN, 100),
            "refused after 100 ms (1 token)"
        );
        assert_eq!(raw(&bucket), (0, 100));
        assert!(!bucket.withdraw_at(TOKEN, 100));
        assert_eq!(bucket.units_at(250), 1_500);
    }

    #[test]
    fn refill_stops_at_the_cap_and_time_spent_full_is_not_banked() {
        let bucket = Bucket::full(2 * TOKEN, 10);
        assert_eq!(drain_at(&bucket, 0), 2);
        assert_eq!(bucket.units_at(3_600_000), 2_000);
        assert_eq!(drain_at(&bucket, 3_600_000), 2);
        assert_eq!(bucket.units_at(3_600_099), 990);
    }

    #[tokio::test(start_paused = true)]
    async fn refill_follows_the_paused_tokio_clock_and_a_still_bucket_reads_none() {
        // An unbound gate's clock: its first withdrawal binds it to the default clock.
        let clock = GateClock::default();
        let bucket = Bucket::full_on(3 * TOKEN, 10, &clock);
        for _ in 0..3 {
            assert!(bucket.withdraw(TOKEN, &clock));
        }
        assert!(!bucket.withdraw(TOKEN, &clock));
        tokio::time::advance(std::time::Duration::from_millis(99)).await;
        assert!(
            !bucket.withdraw(TOKEN, &clock),
            "granted after 99 ms at 10 tokens/s"
        );
        tokio::time::advance(std::time::Duration::from_millis(1)).await;
        assert!(
            bucket.withdraw(TOKEN, &clock),
            "refused after 100 ms at 10 tokens/s"
        );
        tokio::time::advance(std::time::Duration::from_secs(3_600)).await;
        assert_eq!(bucket.units(&clock), 3_000);
        // Without refill the tick stays 0, however much time passes.
        let still = Bucket::full_on(TOKEN, 0, &clock);
        assert!(still.withdraw(TOKEN, &clock));
        tokio::time::advance(std::time::Duration::from_secs(60)).await;
        assert_eq!(still.now_tick(&clock), 0);
        assert_eq!(raw(&still), (0, 0));
    }

    #[test]
    fn a_bucket_counts_ticks_from_its_gates_binding_and_is_stamped_when_made_later() {
        let manual = crate::time::ManualClock::new();
        let clock = GateClock::default();
        let bucket = Bucket::full_on(2 * TOKEN, 10, &clock);
        // Unbound: no time has passed, and reading binds nothing.
        manual.advance(std::time::Duration::from_secs(10));
        assert_eq!((bucket.read_tick(&clock), bucket.units(&clock)), (0, 2_000));
        clock.bind(&crate::time::Clock::custom(manual.clone()));
        assert!(bucket.withdraw(2 * TOKEN, &clock));
        manual.advance(std::time::Duration::from_millis(150));
        assert_eq!(bucket.now_tick(&clock), 150);
        assert_eq!(bucket.units(&clock), 1_500);
        // A bucket made now starts at the current tick: the 150 ms before it earn nothing.
        let later = Bucket::full_on(2 * TOKEN, 10, &clock);
        assert!(later.withdraw(2 * TOKEN, &clock));
        assert_eq!(raw(&later), (0, 150));
        manual.advance(std::time::Duration::from_millis(50));
        assert_eq!(later.units(&clock), 500);
    }

    #[test]
    fn an_older_tick_credits_nothing_and_does_not_move_the_clock_back() {
        let bucket = Bucket::full(5 * TOKEN, 10);
        assert_eq!(drain_at(&bucket, 0), 5);
        // 150 ms at 10 tokens/s: 1.5 tokens, one taken.
        assert!(bucket.withdraw_at(TOKEN, 150));
        assert_eq!(raw(&bucket), (500, 150));
        // A caller that read the clock before the call above was stored.
        assert!(!bucket.withdraw_at(TOKEN, 140));
        assert_eq!(raw(&bucket), (500, 150));
        // 10 ms after the stored tick, not 20 ms after the older one.
        assert_eq!(bucket.units_at(160), 600);
    }

    #[test]
    fn elapsed_time_is_measured_across_the_wrap_of_the_tick() {
        let start = TICK_MASK - 4;
        let bucket = Bucket::with_start_tick(5 * TOKEN, 10, start);
        assert_eq!(drain_at(&bucket, start), 5);
        // 100 ms later, past the wrap: 1 token.
        let later = start + 100;
        assert!(later > TICK_MASK);
        assert!(bucket.withdraw_at(TOKEN, later));
        assert_eq!(raw(&bucket), (0, 95));
        assert!(!bucket.withdraw_at(TOKEN, later));
    }

    #[test]
    fn an_idle_gap_of_half_the_tick_range_reads_as_an_older_tick() {
        let bucket = Bucket::full(5 * TOKEN, 10);
        assert_eq!(drain_at(&bucket, 0), 5);
        assert_eq!(bucket.units_at(TICK_HALF_RANGE - 1), 5_000);
        assert_eq!(bucket.units_at(TICK_HALF_RANGE), 0);
        assert_eq!(bucket.units_at(TICK_MASK), 0);
    }

    #[test]
    fn the_largest_values_neither_overflow_nor_exceed_the_cap() {
        let cap = MAX_BALANCE_UNITS / TOKEN * TOKEN;
        assert_eq!(cap, 67_108_000);
        let bucket = Bucket::full(cap, u64::from(u32::MAX));
        assert!(bucket.withdraw_at(TOKEN, 0));
        bucket.deposit(1_000_000);
        assert_eq!(raw(&bucket), (cap, 0));
        assert_eq!(bucket.units_at(TICK_HALF_RANGE - 1), cap);
        assert_eq!(drain_at(&bucket, 0), cap / TOKEN);
        bucket.deposit(1_000_000);
        assert_eq!(raw(&bucket), (1_000_000, 0));
        bucket.deposit(u64::MAX);
        assert_eq!(raw(&bucket), (cap, 0));
    }

    /// Runs `step` on four threads at once, each at least `min_steps` times and on until
    /// every thread has done so, checking the cap after every step; sums what the steps
    /// report (grants, deposits).
    fn race<F>(bucket: &Bucket, min_steps: u64, step: F) -> (u64, u64)
    where
        F: Fn(usize, u64, &Bucket) -> (bool, bool) + Sync,
    {
        const THREADS: usize = 4;
        let ready = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..THREADS)
                .map(|index| {
                    let (ready, done, step) = (&ready, &done, &step);
                    scope.spawn(move || {
                        let (mut grants, mut deposits) = (0, 0);
                        // Spin rather than block, so that the threads that are running
                        // when the last one arrives start at once.
                        ready.fetch_add(1, Ordering::Relaxed);
                        while ready.load(Ordering::Relaxed) < THREADS {
                            std::hint::spin_loop();
                        }
                        for i in 0..20 * min_steps {
                            let (granted, deposited) = step(index, i, bucket);
                            grants += u64::from(granted);
                            deposits += u64::from(deposited);
                            let (balance, _) = raw(bucket);
                            assert!(balance <= bucket.cap_units, "balance {balance}");
                            if i + 1 == min_steps {
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                            if i + 1 >= min_steps && done.load(Ordering::Relaxed) == THREADS {
                                break;
                            }
                        }
                        (grants, deposits)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().expect("a racing thread panicked"))
                .fold((0, 0), |(g, d), (g2, d2)| (g + g2, d + d2))
        })
    }

    /// Each racing test runs this many independent races: whether threads really run at
    /// the same time depends on what else the machine is doing, so one race may see
    /// little contention.
    const ROUNDS: usize = 10;

    #[test]
    fn racing_withdrawals_grant_exactly_the_tokens_held() {
        for round in 0..ROUNDS {
            // The largest bucket, so that the threads contend for long. Refill would be
            // fast, but the tick never moves.
            let cap = MAX_BALANCE_UNITS / TOKEN * TOKEN;
            let bucket = Bucket::full(cap, 1_000);
            let (grants, _) = race(&bucket, 20_000, |_, _, bucket| {
                (bucket.withdraw_at(TOKEN, 0), false)
            });
            assert_eq!(grants, cap / TOKEN, "round {round}");
            assert_eq!(raw(&bucket), (0, 0), "round {round}");
        }
    }

    #[test]
    fn racing_deposits_and_withdrawals_lose_nothing_below_the_cap() {
        for round in 0..ROUNDS {
            // At most 4 * 20 * 20_000 deposits of 0.01 token: 16_000 tokens, so the cap
            // of 20_000 is never reached and every deposit must be found in the final
            // balance or in a grant.
            let bucket = Bucket::full(20_000 * TOKEN, 1_000);
            assert_eq!(drain_at(&bucket, 0), 20_000);
            let (grants, deposits) = race(&bucket, 20_000, |index, i, bucket| {
                bucket.deposit(10);
                let granted = (i + index as u64) & 3 != 0 && bucket.withdraw_at(TOKEN, 0);
                (granted, true)
            });
            assert!(deposits >= 80_000);
            assert!(grants > 0);
            let (balance, tick) = raw(&bucket);
            assert_eq!(tick, 0);
            assert_eq!(
                balance + grants * TOKEN,
                deposits * 10,
                "round {round}: {grants} grants and {balance} units left from {deposits} deposits"
            );
        }
    }

    #[test]
    fn racing_near_empty_never_grants_more_than_the_bound() {
        for round in 0..ROUNDS {
            // One token per deposit and as many withdrawals as deposits: the balance stays
            // near zero, where an overdraw would show.
            let bucket = Bucket::full(5 * TOKEN, 1_000);
            let (grants, deposits) = race(&bucket, 20_000, |index, i, bucket| {
                if (i + index as u64) & 1 == 0 {
                    bucket.deposit(TOKEN);
                    (false, true)
                } else {
                    (bucket.withdraw_at(TOKEN, 0), false)
                }
            });
            let (balance, _) = raw(&bucket);
            assert!(
                balance + grants * TOKEN <= 5 * TOKEN + deposits * TOKEN,
                "round {round}: {grants} grants and {balance} units left from 5 tokens and \
                 {deposits} deposits"
            );
        }
    }

    #[test]
    fn racing_saturating_takes_and_deposits_lose_nothing() {
        for round in 0..ROUNDS {
            // From 500 of 1 000 tokens, each step takes one and gives two halves back (net
            // zero): the four threads stay far from both bounds, so nothing is clipped and
            // the balance must end where it started.
            let bucket = Bucket::full(1_000 * TOKEN, 0);
            bucket.take_saturating(500 * TOKEN);
            race(&bucket, 5_000, |index, i, bucket| {
                if (i + index as u64) % 2 == 0 {
                    bucket.take_saturating(TOKEN);
                    bucket.deposit(500);
                    bucket.deposit(500);
                } else {
                    bucket.deposit(500);
                    bucket.deposit(500);
                    bucket.take_saturating(TOKEN);
                }
                (false, false)
            });
            assert_eq!(raw(&bucket), (500 * TOKEN, 0), "round {round}");
        }
    }

    /// One step of a scripted run.
    #[derive(Clone, Debug)]
    enum Step {
        Deposit,
        Withdraw,
        Take,
        Advance(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => Just(Step::Deposit),
            4 => Just(Step::Withdraw),
            1 => Just(Step::Take),
            2 => (0_u64..=300).prop_map(Step::Advance),
            1 => (1_000_u64..=20_000).prop_map(Step::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Drives the explicit-tick API with a random script and checks it against a plain
        /// sequential model, and withdrawals against the bound
        /// `granted <= cap + deposited + rate * elapsed` for every window of a script
        /// without saturating takes, in exact integer units.
        #[test]
        fn scripted_runs_match_the_model_and_never_exceed_the_bound(
            deposit in prop_oneof![0_u64..=2_000, Just(999), Just(1_000), Just(1_001)],
            refill in 0_u64..=50,
            tokens in 1_u64..=20,
            start in prop_oneof![Just(0_u64), (TICK_MASK - 30_000)..=TICK_MASK, 0..=TICK_MASK],
            takes in any::<bool>(),
            steps in proptest::collection::vec(step(), 0..200),
        ) {
            let cap = tokens * TOKEN;
            let bucket = Bucket::with_start_tick(cap, refill, start);
            // Sequential model, on unwrapped time.
            let (mut model_balance, mut model_tick) = (cap, start);
            let mut now = start;
            // After each step: (grants so far, deposits so far, time).
            let mut history = vec![(0_u64, 0_u64, now)];
            let (mut grants, mut deposits) = (0, 0);
            for step in &steps {
                match step {
                    Step::Advance(ms) => now += ms,
                    Step::Deposit => {
                        bucket.deposit(deposit);
                        model_balance = (model_balance + deposit).min(cap);
                        deposits += 1;
                    }
                    Step::Take if takes => {
                        let left = bucket.take_saturating(TOKEN);
                        model_balance = model_balance.saturating_sub(TOKEN);
                        prop_assert_eq!(left, model_balance);
                    }
                    Step::Take => {}
                    Step::Withdraw => {
                        let granted = bucket.withdraw_at(TOKEN, now);
                        let refilled = (model_balance + refill * (now - model_tick)).min(cap);
                        let expected = refilled >= TOKEN;
                        if expected {
                            model_balance = refilled - TOKEN;
                            model_tick = now;
                        }
                        // A refusal stores nothing.
                        prop_assert_eq!(granted, expected);
                        grants += u64::from(granted);
                    }
                }
                let (stored, _) = raw(&bucket);
                prop_assert!(stored <= cap, "stored balance {} above the cap {}", stored, cap);
                let seen = bucket.units_at(now);
                prop_assert_eq!(seen, (model_balance + refill * (now - model_tick)).min(cap));
                history.push((grants, deposits, now));
            }
            for (i, &(g0, d0, t0)) in history.iter().enumerate() {
                for &(g1, d1, t1) in &history[i..] {
                    prop_assert!(
                        (g1 - g0) * TOKEN <= cap + deposit * (d1 - d0) + refill * (t1 - t0),
                        "{} grants in {} ms with {} deposits", g1 - g0, t1 - t0, d1 - d0
                    );
                }
            }
        }
    }
}

/// Loom models of the bucket: every interleaving of a few threads depositing, withdrawing
/// and taking at fixed ticks, on loom's atomics. Run with
/// `RUSTFLAGS="--cfg tower_http_retry_loom" cargo test --release --lib gate::bucket::loom_models`.
#[cfg(all(test, tower_http_retry_loom))]
mod loom_models {
    use super::{Bucket, UNITS_PER_TOKEN as TOKEN};

    use ::loom::sync::Arc;
    use ::loom::thread;

    /// Runs `work` on a new loom thread with the shared `bucket`.
    fn spawn<T: 'static>(
        bucket: &Arc<Bucket>,
        work: impl FnOnce(&Bucket) -> T + 'static,
    ) -> thread::JoinHandle<T> {
        let bucket = Arc::clone(bucket);
        thread::spawn(move || work(&bucket))
    }

    /// Three threads race for two tokens: exactly two win, and the bucket ends empty,
    /// never overdrawn.
    #[test]
    fn racing_withdrawals_take_each_token_exactly_once() {
        ::loom::model(|| {
            let bucket = Arc::new(Bucket::full(2 * TOKEN, 0));
            let first = spawn(&bucket, |bucket| bucket.withdraw_at(TOKEN, 0));
            let second = spawn(&bucket, |bucket| bucket.withdraw_at(TOKEN, 0));
            let third = bucket.withdraw_at(TOKEN, 0);
            let grants = [first.join().unwrap(), second.join().unwrap(), third]
                .into_iter()
                .filter(|&granted| granted)
                .count();
            assert_eq!(grants, 2);
            assert_eq!(bucket.units_at(0), 0);
        });
    }

    /// Preemption bound for the three-thread model with two calls per thread: exploring it
    /// without a bound takes about ten minutes; with this bound a few seconds.
    /// `LOOM_MAX_PREEMPTIONS` overrides it.
    const PREEMPTION_BOUND: usize = 5;

    /// Empties a bucket of `tokens` tokens at tick 0.
    fn drain(bucket: &Bucket, tokens: u64) {
        for _ in 0..tokens {
            assert!(bucket.withdraw_at(TOKEN, 0));
        }
        assert!(!bucket.withdraw_at(TOKEN, 0));
        assert_eq!(bucket.units_at(0), 0);
    }

    /// Two threads deposit (clock-free) and withdraw at different, out-of-order ticks on an
    /// emptied bucket that never reaches its cap; every interleaving is explored. Nothing
    /// is overdrawn, no deposit is lost, and the 3 ms of refill are credited exactly once:
    /// the final balance is start + deposits + refill - grants.
    #[test]
    fn two_threads_lose_no_deposit_and_count_time_once() {
        ::loom::model(|| {
            // 0.5 tokens per deposit, 1 token/s = 1 thousandth per ms, cap 10.
            let bucket = Arc::new(Bucket::full(10 * TOKEN, 1));
            drain(&bucket, 10);
            let other = spawn(&bucket, |bucket| {
                bucket.deposit(500);
                bucket.withdraw_at(TOKEN, 2)
            });
            bucket.deposit(500);
            let mine = bucket.withdraw_at(TOKEN, 3);
            let grants = u64::from(other.join().unwrap()) + u64::from(mine);
            // 2 deposits of 500 and 3 ms at 1 per ms: 1_003 thousandths in all, enough
            // for one withdrawal and not for two.
            assert!(grants <= 1, "overdrawn: {grants} grants from 1.003 tokens");
            assert_eq!(
                bucket.units_at(3) + grants * TOKEN,
                1_003,
                "a deposit or some refill was lost, or time was counted twice"
            );
        });
    }

    /// The same with three threads, explored up to [`PREEMPTION_BOUND`] preemptions.
    #[test]
    fn three_threads_lose_no_deposit_and_count_time_once() {
        let mut builder = ::loom::model::Builder::new();
        if builder.preemption_bound.is_none() {
            builder.preemption_bound = Some(PREEMPTION_BOUND);
        }
        builder.check(|| {
            let bucket = Arc::new(Bucket::full(10 * TOKEN, 1));
            drain(&bucket, 10);
            let first = spawn(&bucket, |bucket| {
                bucket.deposit(500);
                bucket.withdraw_at(TOKEN, 2)
            });
            let second = spawn(&bucket, |bucket| {
                bucket.deposit(500);
                bucket.withdraw_at(TOKEN, 3)
            });
            bucket.deposit(500);
            let third = bucket.withdraw_at(TOKEN, 1);
            let grants = [first.join().unwrap(), second.join().unwrap(), third]
                .into_iter()
                .map(u64::from)
                .sum::<u64>();
            // 3 deposits of 500 and 3 ms at 1 per ms: 1_503 thousandths in all.
            assert!(grants <= 1, "overdrawn: {grants} grants from 1.503 tokens");
            assert_eq!(
                bucket.units_at(3) + grants * TOKEN,
                1_503,
                "a deposit or some refill was lost, or time was counted twice"
            );
        });
    }

    /// At the cap, a deposit and two withdrawals race on a one-token bucket. Only results
    /// some sequential order gives are allowed: the deposit is clipped if it comes first,
    /// kept otherwise.
    #[test]
    fn racing_at_the_cap_matches_some_sequential_order() {
        ::loom::model(|| {
            let bucket = Arc::new(Bucket::full(TOKEN, 0));
            let depositor = spawn(&bucket, |bucket| bucket.deposit(TOKEN));
            let first = bucket.withdraw_at(TOKEN, 0);
            let second = bucket.withdraw_at(TOKEN, 0);
            depositor.join().unwrap();
            let grants = u64::from(first) + u64::from(second);
            let left = bucket.units_at(0);
            assert!(
                matches!((grants, left), (2, 0) | (1, 1_000) | (1, 0)),
                "no sequential order gives {grants} grants and {left} thousandths left"
            );
            // The first withdrawal always finds the starting token or the deposit.
            assert!(first);
        });
    }

    /// Two deposits race with a withdrawal on a full one-token bucket: the balance never
    /// rises above the cap, and the withdrawal always finds a token.
    #[test]
    fn racing_deposits_never_fill_past_the_cap() {
        ::loom::model(|| {
            let bucket = Arc::new(Bucket::full(TOKEN, 0));
            let first = spawn(&bucket, |bucket| bucket.deposit(TOKEN));
            let second = spawn(&bucket, |bucket| bucket.deposit(TOKEN));
            let granted = bucket.withdraw_at(TOKEN, 0);
            first.join().unwrap();
            second.join().unwrap();
            assert!(granted);
            let left = bucket.units_at(0);
            // Both deposits before the withdrawal: both clipped, nothing left. Otherwise
            // the bucket ends full, and never fuller.
            assert!(left == 0 || left == 1_000, "{left} thousandths left");
        });
    }

    /// Two saturating takes (the throttle's failures) race with a deposit (a success) on a
    /// two-token bucket: each take's answer and the final balance match some sequential
    /// order; the balance never goes below zero or above the cap.
    #[test]
    fn saturating_takes_and_a_deposit_match_some_sequential_order() {
        ::loom::model(|| {
            let bucket = Arc::new(Bucket::full(2 * TOKEN, 0));
            let first = spawn(&bucket, |bucket| bucket.take_saturating(1_500));
            let depositor = spawn(&bucket, |bucket| bucket.deposit(500));
            let second = bucket.take_saturating(1_500);
            let first = first.join().unwrap();
            depositor.join().unwrap();
            let left = bucket.units_at(0);
            // The orders: D T T (2000, 500, 0), T D T (500, 1000, 0), T T D (500, 0, 500).
            let allowed = [(500, 0, 0), (0, 500, 0), (500, 0, 500), (0, 500, 500)];
            let (a, b) = (first.max(second), first.min(second));
            assert!(
                allowed
                    .iter()
                    .any(|&(x, y, l)| (x.max(y), x.min(y), l) == (a, b, left)),
                "takes left {first} and {second}, and {left} at the end"
            );
        });
    }

    /// Racing takes on a full bucket: each token is taken exactly once, and the answers are
    /// the balances a sequential order leaves.
    #[test]
    fn racing_saturating_takes_answer_as_some_sequential_order() {
        ::loom::model(|| {
            let bucket = Arc::new(Bucket::full(2 * TOKEN, 0));
            let other = spawn(&bucket, |bucket| bucket.take_saturating(TOKEN));
            let mine = bucket.take_saturating(TOKEN);
            let other = other.join().unwrap();
            let mut answers = [mine, other];
            answers.sort_unstable();
            assert_eq!(answers, [0, TOKEN]);
            assert_eq!(bucket.take_saturating(TOKEN), 0);
        });
    }
}
