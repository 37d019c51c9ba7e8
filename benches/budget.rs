//! `RetryBudget` against tower's `TpsBudget`: deposit + withdraw pairs on one thread and
//! on two threads sharing one budget, in one criterion group; then a race for overdraw.
//!
//! Each iteration is one pair: `deposit()` then `withdraw()`, as one logical request that
//! failed once and asks for a retry. Both budgets keep 10% of requests as retries with a
//! floor of 10 per second (ours: `RetryBudget::builder().ratio(0.1).min_per_sec(10.0).max_tokens(100.0).build()`; tower's:
//! `TpsBudget::new(10 s, 10, 0.1)`). Every sample gets a fresh budget, so each starts from
//! its initial reserve and soon settles where one withdrawal in ten succeeds.
//!
//! On two threads (`*/2_threads`), each thread runs the same fixed number of pairs
//! (criterion's `iters`) after a barrier, and the sample's time is the slower thread's;
//! criterion's throughput figure is then pairs per second over both threads.
//!
//! Overdraw: every sample counts the withdrawals granted and compares them with what the
//! budget may grant (ours: `C + r * deposits + m * elapsed`; tower's: its reserve plus
//! deposits, in withdrawal units, valid while nothing has expired yet, i.e. for samples
//! shorter than its 10 s window). Then, outside criterion, two threads race to empty a
//! fresh budget of 1000 tokens with no deposits, many times over, and every grant past
//! 1000 (plus what ours refills in the trial's few microseconds) is an overdraw.
//!
//! `ours_per_authority` is the same budget built `per_authority()`, used as the layer uses
//! it: each pair first finds its authority's bucket (16 authorities, in turn), then deposits
//! and withdraws there.
//!
//! Run: `cargo bench --bench budget`.
#![allow(clippy::disallowed_methods)] // measures real time with std's clock

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use tower::retry::budget::{Budget, TpsBudget};
use tower_http_retry::{Gate, RetryBudget};

#[path = "support/mod.rs"]
mod support;
use support::extra_runs;

/// What the bench needs from a budget, so one generic loop drives both.
trait Bucket: Send + Sync + 'static {
    const NAME: &'static str;
    /// A fresh budget for one sample.
    fn fresh() -> Self;
    /// A fresh budget of exactly `tokens` withdrawals and no deposits, for the race.
    fn with_tokens(tokens: u32) -> Self;
    fn put(&self);
    fn take(&self) -> bool;
    /// One logical request that failed once: a deposit, then a withdrawal. `i` is the
    /// request's number on its thread.
    fn pair(&self, i: u64) -> bool {
        let _ = i;
        self.put();
        self.take()
    }
    /// The most withdrawals the budget may grant after `deposits` deposits over
    /// `elapsed`, when it started as `fresh()`; `None` when that cannot be known.
    fn allowed(deposits: u64, elapsed: Duration) -> Option<u64>;
    /// The same for a budget made by `with_tokens`.
    fn allowed_tokens(tokens: u32, elapsed: Duration) -> u64;
}

impl Bucket for RetryBudget {
    const NAME: &'static str = "ours";

    fn fresh() -> Self {
        RetryBudget::builder()
            .ratio(0.1)
            .min_per_sec(10.0)
            .max_tokens(100.0)
            .build()
    }

    fn with_tokens(tokens: u32) -> Self {
        RetryBudget::builder()
            .ratio(0.1)
            .min_per_sec(10.0)
            .max_tokens(f64::from(tokens))
            .build()
    }

    fn put(&self) {
        self.deposit();
    }

    fn take(&self) -> bool {
        self.withdraw()
    }

    fn allowed(deposits: u64, elapsed: Duration) -> Option<u64> {
        // C + r * requests + m * T (the budget's promise), rounded up; the budget counts time in
        // whole milliseconds, so T gets one more.
        let t = elapsed.as_secs_f64() + 0.001;
        let bound = 100.0 + 0.1 * deposits as f64 + 10.0 * t;
        Some(bound.ceil() as u64)
    }

    fn allowed_tokens(tokens: u32, elapsed: Duration) -> u64 {
        let t = elapsed.as_secs_f64() + 0.001;
        (f64::from(tokens) + 10.0 * t).ceil() as u64
    }
}

/// The authorities the per-authority case cycles through.
const AUTHORITIES: usize = 16;

/// Our budget kept per authority, as the layer uses it: each logical request finds its
/// authority's bucket once (the URI's key, a read lock, a reference count), then deposits
/// and withdraws there. Requests cycle through [`AUTHORITIES`] authorities.
struct PerAuthority {
    budget: RetryBudget,
    uris: Vec<http::Uri>,
}

impl PerAuthority {
    fn with(builder: tower_http_retry::GateBuilder<RetryBudget>) -> Self {
        let uris = (0..AUTHORITIES)
            .map(|i| format!("http://server-{i}.test/").parse().unwrap())
            .collect();
        PerAuthority {
            budget: builder.per_authority().build(),
            uris,
        }
    }
}

impl Bucket for PerAuthority {
    const NAME: &'static str = "ours_per_authority";

    fn fresh() -> Self {
        PerAuthority::with(
            RetryBudget::builder()
                .ratio(0.1)
                .min_per_sec(10.0)
                .max_tokens(100.0),
        )
    }

    fn with_tokens(tokens: u32) -> Self {
        PerAuthority::with(
            RetryBudget::builder()
                .ratio(0.1)
                .min_per_sec(10.0)
                .max_tokens(f64::from(tokens)),
        )
    }

    fn put(&self) {
        self.budget.partition(&self.uris[0]).deposit();
    }

    fn take(&self) -> bool {
        self.budget.partition(&self.uris[0]).withdraw()
    }

    fn pair(&self, i: u64) -> bool {
        let bucket = self.budget.partition(&self.uris[i as usize % AUTHORITIES]);
        bucket.deposit();
        bucket.withdraw()
    }

    fn allowed(deposits: u64, elapsed: Duration) -> Option<u64> {
        // Every authority's own C + m * T, and the deposits wherever they went.
        let t = elapsed.as_secs_f64() + 0.001;
        let n = AUTHORITIES as f64;
        Some((n * 100.0 + 0.1 * deposits as f64 + n * 10.0 * t).ceil() as u64)
    }

    fn allowed_tokens(tokens: u32, elapsed: Duration) -> u64 {
        // The race takes from one authority only.
        let t = elapsed.as_secs_f64() + 0.001;
        (f64::from(tokens) + 10.0 * t).ceil() as u64
    }
}

impl Bucket for TpsBudget {
    const NAME: &'static str = "tower";

    fn fresh() -> Self {
        TpsBudget::new(Duration::from_secs(10), 10, 0.1)
    }

    fn with_tokens(tokens: u32) -> Self {
        // A 1 s window: the reserve is `tokens` withdrawals.
        TpsBudget::new(Duration::from_secs(1), tokens, 0.1)
    }

    fn put(&self) {
        self.deposit();
    }

    fn take(&self) -> bool {
        self.withdraw()
    }

    fn allowed(deposits: u64, elapsed: Duration) -> Option<u64> {
        // Reserve: 10 per second * 10 s = 100 withdrawals; each withdrawal costs ten
        // deposits. Nothing expires during the first window.
        (elapsed < Duration::from_secs(10)).then_some(100 + deposits / 10)
    }

    fn allowed_tokens(tokens: u32, _: Duration) -> u64 {
        u64::from(tokens)
    }
}

/// Overdraw seen during the criterion samples of one budget kind.
#[derive(Default)]
struct Tally {
    samples: AtomicU64,
    checked: AtomicU64,
    overdrawn_samples: AtomicU64,
    overdrawn_grants: AtomicU64,
    granted: AtomicU64,
    pairs: AtomicU64,
}

impl Tally {
    fn add(&self, pairs: u64, granted: u64, allowed: Option<u64>) {
        self.samples.fetch_add(1, Ordering::Relaxed);
        self.pairs.fetch_add(pairs, Ordering::Relaxed);
        self.granted.fetch_add(granted, Ordering::Relaxed);
        if let Some(allowed) = allowed {
            self.checked.fetch_add(1, Ordering::Relaxed);
            if granted > allowed {
                self.overdrawn_samples.fetch_add(1, Ordering::Relaxed);
                self.overdrawn_grants
                    .fetch_add(granted - allowed, Ordering::Relaxed);
            }
        }
    }

    fn report(&self, name: &str) {
        let pairs = self.pairs.load(Ordering::Relaxed);
        let granted = self.granted.load(Ordering::Relaxed);
        println!(
            "{name:<16} samples {:>4} (checked {:>4}), pairs {pairs:>11}, withdrawals granted {:>5.2}%, \
             overdrawn samples {}, grants over the bound {}",
            self.samples.load(Ordering::Relaxed),
            self.checked.load(Ordering::Relaxed),
            100.0 * granted as f64 / pairs.max(1) as f64,
            self.overdrawn_samples.load(Ordering::Relaxed),
            self.overdrawn_grants.load(Ordering::Relaxed),
        );
    }
}

/// `iters` pairs on each of `threads` threads sharing one fresh budget; returns the
/// slowest thread's time.
fn run<B: Bucket>(threads: usize, iters: u64, tally: &Tally) -> Duration {
    let created = Instant::now();
    let budget = Arc::new(B::fresh());
    let barrier = Barrier::new(threads);
    let results: Vec<(Duration, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (budget, barrier) = (&budget, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    let mut granted = 0u64;
                    for i in 0..iters {
                        granted += u64::from(budget.pair(i));
                    }
                    (start.elapsed(), granted)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let elapsed = created.elapsed();
    let pairs = iters * threads as u64;
    let granted = results.iter().map(|r| r.1).sum();
    tally.add(pairs, granted, B::allowed(pairs, elapsed));
    results.iter().map(|r| r.0).max().unwrap_or_default()
}

fn pairs(c: &mut Criterion, ours: &Tally, per_authority: &Tally, tower: &Tally) {
    let mut group = c.benchmark_group("budget");
    for threads in [1usize, 2] {
        group.throughput(Throughput::Elements(threads as u64));
        let id = |name: &str| {
            format!(
                "{name}/{threads}_thread{}",
                if threads > 1 { "s" } else { "" }
            )
        };
        group.bench_function(id(RetryBudget::NAME), |b| {
            b.iter_custom(|iters| run::<RetryBudget>(threads, iters, ours))
        });
        group.bench_function(id(PerAuthority::NAME), |b| {
            b.iter_custom(|iters| run::<PerAuthority>(threads, iters, per_authority))
        });
        group.bench_function(id(TpsBudget::NAME), |b| {
            b.iter_custom(|iters| run::<TpsBudget>(threads, iters, tower))
        });
    }
    group.finish();
}

/// Two threads race to empty a fresh budget of `TOKENS` withdrawals, `trials` times.
/// Returns (trials with overdraw, total grants over the bound, largest overdraw).
fn race<B: Bucket>(trials: usize) -> (u32, u64, u64) {
    const TOKENS: u32 = 1000;
    // Each thread may ask for every token; far more would only measure refusals.
    const ATTEMPTS: u32 = 2 * TOKENS;
    let mut overdrawn = (0, 0, 0);
    for _ in 0..trials {
        let created = Instant::now();
        let budget = B::with_tokens(TOKENS);
        let barrier = Barrier::new(2);
        let granted: u64 = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let (budget, barrier) = (&budget, &barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        (0..ATTEMPTS).filter(|_| budget.take()).count() as u64
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("race thread"))
                .sum()
        });
        let allowed = B::allowed_tokens(TOKENS, created.elapsed());
        if granted > allowed {
            overdrawn.0 += 1;
            overdrawn.1 += granted - allowed;
            overdrawn.2 = overdrawn.2.max(granted - allowed);
        }
    }
    overdrawn
}

fn main() {
    let ours = Tally::default();
    let per_authority = Tally::default();
    let tower = Tally::default();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(700))
        .measurement_time(Duration::from_secs(3))
        .sample_size(40)
        .configure_from_args();
    pairs(&mut c, &ours, &per_authority, &tower);
    c.final_summary();

    let trials = extra_runs(2000);
    if trials == 0 {
        return;
    }
    println!("\nOverdraw during the criterion samples (pairs on 1 and 2 threads):");
    ours.report(RetryBudget::NAME);
    per_authority.report(PerAuthority::NAME);
    tower.report(TpsBudget::NAME);

    println!("\nRace: 2 threads empty a budget of 1000 tokens, no deposits, {trials} trials:");
    for (name, (count, over, max)) in [
        (RetryBudget::NAME, race::<RetryBudget>(trials)),
        (PerAuthority::NAME, race::<PerAuthority>(trials)),
        (TpsBudget::NAME, race::<TpsBudget>(trials)),
    ] {
        println!(
            "{name:<16} overdrawn trials {count:>5}, grants over the bound {over:>6}, largest overdraw {max}"
        );
    }
}
