//! Why jitter and budgets: the storm figures, reproduced with the real layer.
//!
//! (a) Jitter spread: 1000 clients fail at t = 0 and retry with base 100 ms and cap 10 s.
//!     Without jitter every retry round lands in one 50 ms window; full jitter spreads
//!     retry 1 over about 4 windows and retry 4 over about 50; decorrelated is the widest.
//! (b) Amplification during a total outage with sustained traffic: calls reaching the
//!     bottom per logical request, for one retrying layer and three nested ones, without and
//!     with the default retry budget (10% of requests + 10 per second).
//! (c) The other half of the trade-off, a partial outage: 20,000 requests at 1,000 per second,
//!     each attempt failing on its own with probability 5%, 20%, 50% or 100%; for no retries,
//!     3 attempts alone and 3 attempts with the default budget, the share of requests that
//!     succeed (goodput), the attempts at the server per request (load) and the retries the
//!     budget refused, each beside the arithmetic it should match.
//!     A row for the `Throttle` with gRPC A6's example settings (10 tokens, 0.1 per
//!     success) and no budget.
//! (d) The same through three nested retrying layers, each with its own budget or throttle.
//! (e) One client of two servers, one of them down: shared and per-authority gates.
//! (f) A throttling storm: 100 clients, each working through 50 requests one after another,
//!     against a server that admits 500 a second and answers 429 above it (with and without
//!     `Retry-After`); per policy (backoff only, a ratio budget, the AWS quotas, the adaptive
//!     limiter, client-side throttling, the limiter with a budget): 429s per successful
//!     request, goodput, time to finish the batch and the server's peak load.
//!
//! Everything runs under paused time: minutes of simulated traffic take a moment.
//! Run with `cargo run --example storm`.
//!
//! `cargo run --release --example storm -- loopback` prints instead table (f) measured in
//! real time against a hyper server on 127.0.0.1 (`loopback.rs`, about 2.5 minutes), each
//! row beside the simulation's.

mod loopback;
mod rate;
mod sim;

use tower_http_retry::Jitter;

const CLIENTS: usize = 1000;
const RETRIES: u32 = 4;
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

fn sparkline(round: &sim::Round, width: usize) -> String {
    let Some(&last) = round.windows.keys().next_back() else {
        return String::new();
    };
    let windows = last as usize + 1;
    let per_char = windows.div_ceil(width).max(1);
    let mut columns = vec![0u32; windows.div_ceil(per_char)];
    for (&w, &n) in &round.windows {
        columns[w as usize / per_char] += n;
    }
    let top = columns.iter().copied().max().unwrap_or(1).max(1);
    columns
        .iter()
        .map(|&n| {
            if n == 0 {
                ' '
            } else {
                BARS[(n as usize * (BARS.len() - 1)).div_ceil(top as usize)]
            }
        })
        .collect()
}

fn main() {
    match std::env::args().nth(1).as_deref() {
        None => {}
        Some("loopback") => return loopback_table(),
        Some(other) => panic!("unknown mode {other:?}: none, or `loopback`"),
    }
    println!(
        "(a) jitter spread: {CLIENTS} clients fail at t = 0; base 100 ms, cap 10 s; 50 ms windows\n"
    );
    println!(
        "{:<13} {:>16} {:>16} {:>16} {:>16}",
        "jitter", "retry 1", "retry 2", "retry 3", "retry 4"
    );
    println!(
        "{:<13} {:>16} {:>16} {:>16} {:>16}",
        "", "windows / peak", "windows / peak", "windows / peak", "windows / peak"
    );
    let kinds = [
        ("none", Jitter::None),
        ("full", Jitter::Full),
        ("equal", Jitter::Equal),
        ("decorrelated", Jitter::Decorrelated),
    ];
    let mut all = Vec::new();
    for (name, jitter) in kinds {
        let rounds = sim::paused(sim::jitter_spread(jitter, CLIENTS, RETRIES, 2024));
        let cells: Vec<String> = rounds
            .iter()
            .map(|r| format!("{:>5} / {:<5}", r.occupied(), r.peak()))
            .collect();
        println!(
            "{name:<13} {:>16} {:>16} {:>16} {:>16}",
            cells[0], cells[1], cells[2], cells[3]
        );
        all.push((name, rounds));
    }
    println!(
        "\ncalls per 50 ms window from t = 0 (one character per window, or per group of windows when wide):"
    );
    for (name, rounds) in &all {
        println!("\n  {name}");
        for (i, round) in rounds.iter().enumerate() {
            let last = round.windows.keys().next_back().copied().unwrap_or(0);
            println!(
                "    retry {}: |{}| up to {:.2} s",
                i + 1,
                sparkline(round, 100),
                (last + 1) as f64 * sim::WINDOW.as_secs_f64()
            );
        }
    }

    println!(
        "\n(b) amplification in a total outage: calls reaching the bottom per logical request"
    );
    println!("    (20,000 requests at 1,000 per second, 3 attempts per layer, default backoff)\n");
    println!("{:<22} {:>12} {:>16}", "", "no budget", "default budget");
    for layers in [1, 3] {
        let without = sim::paused(sim::amplification(layers, false, 20_000, 1000));
        let with = sim::paused(sim::amplification(layers, true, 20_000, 1000));
        let label = if layers == 1 {
            "one retrying layer"
        } else {
            "three nested layers"
        };
        println!("{label:<22} {:>11.2}x {:>15.2}x", without, with);
    }
    // Hedges are paid for as retries are: in an outage each failure sends the next one.
    let hedged = |retries| sim::paused(sim::amplification_of(1, retries, 20_000, 1000));
    println!(
        "{:<22} {:>11.2}x {:>15.2}x",
        "one hedging layer",
        hedged(sim::Retries::HedgedNoBudget),
        hedged(sim::Retries::HedgedBudget)
    );
    println!(
        "\nWith a budget, each layer adds retries of about 10% of the requests it sees, plus its"
    );
    println!("bucket's 100 starting tokens and 10 per second: about 1.1x for one layer and");
    println!(
        "1.1^3 = 1.33x for three, instead of multiplying the load by the attempts at every layer."
    );

    partial_outage_table(1);
    partial_outage_table(3);
    two_servers_table();
    throttling_storm_table();
}

/// Table (f): the throttling storm.
fn throttling_storm_table() {
    println!(
        "\n(f) throttling storm: {} clients x {} requests, one after another, against a server that",
        rate::CLIENTS,
        rate::PER_CLIENT
    );
    println!(
        "    admits {} a second (token bucket, burst {}) and answers 429 above it; {} ms per admitted",
        rate::RATE,
        rate::BURST,
        rate::SERVICE_TIME.as_millis()
    );
    println!(
        "    request, {} ms per 429; {} attempts, default backoff (100 ms base, 10 s cap, full jitter)",
        rate::REJECT_TIME.as_millis(),
        rate::ATTEMPTS
    );
    println!(
        "    unless said; every client its own gates. 429s/ok: 429s received per successful request;"
    );
    println!(
        "    ok: share of the batch that succeeded; goodput: successes per second; peak: the most"
    );
    println!(
        "    arrivals at the server in {} ms, per second; local: requests refused before sending.",
        rate::LOAD_WINDOW.as_millis()
    );
    let runs = rate::table(2026);
    for retry_after in [false, true] {
        println!(
            "\n  {}",
            if retry_after {
                "429 with Retry-After: 1"
            } else {
                "429 without Retry-After"
            }
        );
        println!(
            "  {:<30} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>7}",
            "policy", "429s/ok", "ok", "goodput", "time", "peak", "load", "local"
        );
        let backoff = runs
            .iter()
            .find(|r| r.retry_after == retry_after && r.policy == rate::Policy::BackoffOnly)
            .expect("a backoff-only row");
        for run in runs.iter().filter(|r| r.retry_after == retry_after) {
            println!(
                "  {:<30} {:>8.3} {:>8} {:>7.1}/s {:>8.1}s {:>7.0}/s {:>7.2}x {:>7}",
                run.policy.label(),
                run.throttled_per_success(),
                percent(run.success_share()),
                run.goodput(),
                run.elapsed.as_secs_f64(),
                run.peak_load(),
                run.load(),
                run.refused_locally,
            );
        }
        for run in runs
            .iter()
            .filter(|r| r.retry_after == retry_after && r.policy == rate::Policy::Adaptive)
        {
            println!(
                "  adaptive limiter against backoff only: {:.1}% fewer 429s per success, success share {:+.2} points,",
                (1.0 - run.throttled_per_success() / backoff.throttled_per_success()) * 100.0,
                (run.success_share() - backoff.success_share()) * 100.0,
            );
            println!(
                "  successes per second {:.2}x; attempts admitted in each second: {:?}",
                run.goodput() / backoff.goodput(),
                run.admitted_per_second
            );
            println!(
                "  the server's use of its rate: seconds 0-2 {}, from second 3 on {} (backoff only: {}, {})",
                percent(run.utilisation(0, 3)),
                percent(run.utilisation(3, run.admitted_per_second.len() - 1)),
                percent(backoff.utilisation(0, 3)),
                percent(backoff.utilisation(3, backoff.admitted_per_second.len() - 1)),
            );
        }
    }
}

/// Table (f) on loopback, each row beside the simulation's.
fn loopback_table() {
    println!(
        "(f) on loopback: {} clients x {} requests, one after another, each client its own layer and",
        loopback::CLIENTS,
        loopback::PER_CLIENT
    );
    println!(
        "    gates over a hyper-util client of its own, against a hyper server on 127.0.0.1 that admits"
    );
    println!(
        "    {} a second (token bucket, burst {}) and answers 429 above it; {} ms per admitted request,",
        loopback::RATE,
        loopback::BURST,
        loopback::SERVICE_TIME.as_millis()
    );
    println!(
        "    {} ms per 429 (tokio's sleeps: a millisecond or so more); real time, one runtime of 2 workers.",
        loopback::REJECT_TIME.as_millis()
    );
    println!(
        "    peak: the most arrivals in a 100 ms window, per second; peak 1 s: the most in any 10"
    );
    println!(
        "    consecutive windows; sim: the simulation's 429s/ok and time for the same row (seed 2026)."
    );
    let seed = 2026;
    let simulated = rate::table(seed);
    let rows = loopback::table(seed);
    for retry_after in [false, true] {
        println!(
            "\n  {}",
            if retry_after {
                "429 with Retry-After: 1"
            } else {
                "429 without Retry-After"
            }
        );
        println!(
            "  {:<28} {:>8} {:>8} {:>9} {:>7} {:>8} {:>7} {:>6} {:>6} {:>14}",
            "policy", "429s/ok", "ok", "goodput", "time", "peak", "peak 1s", "load", "local", "sim"
        );
        let backoff = rows
            .iter()
            .find(|r| r.run.retry_after == retry_after && r.run.policy == rate::Policy::BackoffOnly)
            .expect("a backoff-only row");
        for row in rows.iter().filter(|r| r.run.retry_after == retry_after) {
            let run = &row.run;
            let sim = simulated
                .iter()
                .find(|s| s.retry_after == retry_after && s.policy == run.policy)
                .expect("a simulated row for every policy");
            println!(
                "  {:<28} {:>8.3} {:>8} {:>7.1}/s {:>6.1}s {:>6.0}/s {:>7} {:>5.2}x {:>6} {:>6.3} {:>5.1}s",
                run.policy.label(),
                run.throttled_per_success(),
                percent(run.success_share()),
                run.goodput(),
                run.elapsed.as_secs_f64(),
                run.peak_load(),
                row.peak_second,
                run.load(),
                run.refused_locally,
                sim.throttled_per_success(),
                sim.elapsed.as_secs_f64(),
            );
            if row.errors > 0 || row.unfinished > 0 {
                println!(
                    "  {:<28} {} requests failed on the connection, {} unfinished at the time limit",
                    "", row.errors, row.unfinished
                );
            }
        }
        for row in rows.iter().filter(|r| {
            r.run.retry_after == retry_after
                && matches!(
                    r.run.policy,
                    rate::Policy::Adaptive | rate::Policy::AdaptiveBudget
                )
        }) {
            let run = &row.run;
            println!(
                "  {} against backoff only: {:.1}% fewer 429s per success, success share {:+.2} points,",
                run.policy.label(),
                (1.0 - run.throttled_per_success() / backoff.run.throttled_per_success()) * 100.0,
                (run.success_share() - backoff.run.success_share()) * 100.0,
            );
            println!(
                "    successes per second {:.2}x; attempts admitted in each second: {:?}",
                run.goodput() / backoff.run.goodput(),
                run.admitted_per_second
            );
            println!(
                "    the server's use of its rate: seconds 0-2 {}, from second 3 on {} (backoff only: {}, {})",
                percent(run.utilisation(0, 3)),
                percent(run.utilisation(3, run.admitted_per_second.len() - 1)),
                percent(backoff.run.utilisation(0, 3)),
                percent(
                    backoff
                        .run
                        .utilisation(3, backoff.run.admitted_per_second.len() - 1)
                ),
            );
        }
        println!(
            "  backoff only: attempts admitted in each second: {:?}",
            backoff.run.admitted_per_second
        );
        let sim_of = |policy| {
            simulated
                .iter()
                .find(|s| s.retry_after == retry_after && s.policy == policy)
                .expect("a simulated row for every policy")
        };
        for policy in [rate::Policy::BackoffOnly, rate::Policy::Adaptive] {
            println!(
                "  simulated, {}: attempts admitted in each second: {:?}",
                policy.label(),
                sim_of(policy).admitted_per_second
            );
        }
        println!(
            "  arrivals per 100 ms in the first 3 s, backoff only: loopback {:?}",
            &backoff.run.arrivals[..30.min(backoff.run.arrivals.len())]
        );
        let sim_backoff = sim_of(rate::Policy::BackoffOnly);
        println!(
            "  simulated {:?}",
            &sim_backoff.arrivals[..30.min(sim_backoff.arrivals.len())]
        );
        println!(
            "  measured, backoff only: the server took {:.2} ms over an admitted request ({} asked), {:.2} ms",
            backoff.served_in.0.as_secs_f64() * 1e3,
            loopback::SERVICE_TIME.as_millis(),
            backoff.served_in.1.as_secs_f64() * 1e3,
        );
        println!(
            "  over a 429 ({} asked); a request admitted at once took {:.2} ms at the client (simulated: {} ms)",
            loopback::REJECT_TIME.as_millis(),
            backoff.first_try.as_secs_f64() * 1e3,
            loopback::SERVICE_TIME.as_millis(),
        );
        for row in rows.iter().filter(|r| {
            r.run.retry_after == retry_after
                && matches!(
                    r.run.policy,
                    rate::Policy::Adaptive | rate::Policy::AdaptiveBudget
                )
        }) {
            let tenth = |r: &rate::Run| {
                let [slow, rest] = r.slowest_tenth();
                format!(
                    "{:.1} 429s each, the last at {:.1} s (the others: {:.1}, at {:.1} s)",
                    slow.0, slow.1, rest.0, rest.1
                )
            };
            println!(
                "  {}, the last tenth of the clients to finish: {}",
                row.run.policy.label(),
                tenth(&row.run)
            );
            println!("    simulated: {}", tenth(sim_of(row.run.policy)));
        }
        println!(
            "  when the clients had finished their share (half / 90% / all), loopback (simulated):"
        );
        for row in rows.iter().filter(|r| r.run.retry_after == retry_after) {
            let (run, sim) = (&row.run, sim_of(row.run.policy));
            let done = |r: &rate::Run| {
                format!(
                    "{:.1} / {:.1} / {:.1} s",
                    r.clients_done_by(0.5).as_secs_f64(),
                    r.clients_done_by(0.9).as_secs_f64(),
                    r.clients_done_by(1.0).as_secs_f64()
                )
            };
            println!(
                "    {:<28} {:>20} ({})",
                run.policy.label(),
                done(run),
                done(sim)
            );
        }
    }
}

/// Table (e): one client of two servers, one of them down.
fn two_servers_table() {
    println!(
        "\n(e) one client, two servers: one in a total outage, the other failing 5% on its own"
    );
    println!(
        "    {} requests at {} per second, alternating between the servers; 3 attempts, the same",
        thousands(sim::PARTIAL_REQUESTS as f64),
        thousands(f64::from(sim::PARTIAL_PER_SECOND)),
    );
    println!("    backoff. The healthy server's goodput; in brackets, the arithmetic below.\n");
    println!(
        "{:<32} {:>22} {:>22}",
        "", "healthy server goodput", "its retries refused"
    );
    let mut runs = Vec::new();
    for gates in sim::Shared::ALL {
        let run = sim::paused(sim::two_servers(gates, 2026));
        println!(
            "{:<32} {:>22} {:>22}",
            gates.name(),
            format!(
                "{} ({})",
                percent(run.healthy_goodput),
                percent(run.expected_goodput())
            ),
            thousands(run.healthy_refused as f64)
        );
        runs.push(run);
    }
    let seconds = runs[0].elapsed.as_secs_f64();
    println!(
        "\nThe arithmetic. The outage wants 2 retries per request, the healthy server p + p^2 = {:.4}.",
        sim::HEALTHY_FAILURE_RATE + sim::HEALTHY_FAILURE_RATE.powi(2)
    );
    println!(
        "One budget holds C + r N + m T = {} + {} x {} + {} x {seconds:.1} s for both: the outage takes",
        sim::MAX_TOKENS,
        sim::RATIO,
        thousands(sim::PARTIAL_REQUESTS as f64),
        sim::MIN_PER_SEC
    );
    println!(
        "nearly all of it, and the healthy server's failures mostly go unretried (goodput near 1 - p)."
    );
    println!(
        "Per authority, the healthy server has C + r N/2 + m T to itself, more than it needs: 1 - p^3."
    );
    println!(
        "The AWS quota ({} tokens, {} per retry after a 503, 1 back per first-try success, a success's",
        sim::QUOTA_MAX_TOKENS,
        sim::QUOTA_COST
    );
    println!(
        "last retry refunded) earns only from successes: shared, the outage spends what the healthy"
    );
    println!(
        "server earns; per authority, the healthy server's retries cost about what its successes return."
    );
}

fn percent(share: f64) -> String {
    format!("{:.2}%", share * 100.0)
}

/// Tables (c) and (d): goodput, load and refused retries at each failure rate, each figure
/// beside the arithmetic it should match.
fn partial_outage_table(layers: usize) {
    let rows = sim::partial_outage(layers);
    let (tag, what) = if layers == 1 {
        ("(c)", "one retrying layer")
    } else {
        (
            "(d)",
            "three nested retrying layers, each its own client (own budget, own throttle)",
        )
    };
    let seconds = sim::PARTIAL_REQUESTS as f64 / f64::from(sim::PARTIAL_PER_SECOND);
    println!("\n{tag} partial outage, {what}");
    println!(
        "    {} requests at {} per second for {seconds} s; each attempt fails (503) on its own with",
        thousands(sim::PARTIAL_REQUESTS as f64),
        thousands(f64::from(sim::PARTIAL_PER_SECOND)),
    );
    println!(
        "    probability p (seeded); 3 attempts per layer, backoff {:?} base, {:?} cap, full jitter.",
        sim::PARTIAL_BASE,
        sim::PARTIAL_CAP
    );
    println!(
        "    goodput: share of requests that succeed; load: attempts at the server per request;"
    );
    println!(
        "    refused: retries the budgets or throttles refused. In brackets: the arithmetic below."
    );
    println!(
        "    A6's Throttle: the same 3 attempts and backoff under Throttle::builder().max_tokens({}).token_ratio({}).build()",
        sim::THROTTLE_MAX_TOKENS,
        sim::THROTTLE_RATIO
    );
    println!("    (gRPC A6's example) and no budget (A6 has none), against the same 503s.");
    println!();
    println!(
        "{:>6}  {:<28} {:>18} {:>18} {:>18}",
        "p", "retries", "goodput", "load", "refused"
    );
    let mut last = None;
    for row in &rows {
        let (m, e) = (&row.measured, &row.expected);
        let p = if last == Some(row.storm.failure_rate) {
            String::new()
        } else {
            format!("{:.0}%", row.storm.failure_rate * 100.0)
        };
        if last.is_some() && !p.is_empty() {
            println!();
        }
        last = Some(row.storm.failure_rate);
        let refused = if row.storm.retries.refuses() {
            format!(
                "{} ({})",
                thousands(m.refused() as f64),
                thousands(e.refused)
            )
        } else {
            "-".to_string()
        };
        println!(
            "{p:>6}  {:<28} {:>18} {:>18} {:>18}",
            row.storm.retries.label(),
            format!("{} ({})", percent(m.goodput()), percent(e.goodput)),
            format!("{:.3}x ({:.3}x)", m.load(), e.load),
            refused,
        );
    }

    let budget = |p: f64| {
        rows.iter()
            .find(|r| r.storm.failure_rate == p && r.storm.retries == sim::Retries::DefaultBudget)
            .expect("a budget row at every rate")
    };
    let ceiling = budget(1.0).expected.allowance[0];
    let per_request = ceiling / sim::PARTIAL_REQUESTS as f64;
    println!("\nThe arithmetic:");
    println!("- no retries: goodput 1 - p, load 1.");
    if layers == 1 {
        println!("- 3 attempts, no budget: goodput 1 - p^3, load 1 + p + p^2 (3x at 100%).");
        println!(
            "- the default budget (r = {}, m = {}/s, C = {}) grants at most C + r * requests + m * T",
            sim::RATIO,
            sim::MIN_PER_SEC,
            sim::MAX_TOKENS
        );
        println!(
            "  = {} + {} * {} + {} * {seconds} = about {} retries, {per_request:.3} per request. While the",
            sim::MAX_TOKENS,
            sim::RATIO,
            thousands(sim::PARTIAL_REQUESTS as f64),
            sim::MIN_PER_SEC,
            thousands(ceiling),
        );
        println!(
            "  retries wanted, p + p^2 per request, stay under that (5%: 0.0525) it refuses none;"
        );
        println!(
            "  above it (20%: 0.24) load is 1 + {per_request:.3} and goodput (1 - p) * {:.3}: every",
            1.0 + per_request
        );
        println!("  attempt succeeds with chance 1 - p, and each success ends one request.");
        println!(
            "- refused: if every retry is granted with the same chance q, where q p + (q p)^2 = {per_request:.3},"
        );
        println!("  about requests * (1 - q) * p * (1 + q p).");
        throttle_arithmetic(layers, &rows);
        println!(
            "\nThe budget costs nothing in a 5% blip and caps the load near {:.2}x from 20% on, at",
            1.0 + per_request
        );
        println!("the price of the requests that the retries it refuses would have rescued.");
    } else {
        println!(
            "- each layer meets the failure rate the layer below leaves: 1 - that layer's goodput."
        );
        println!(
            "- 3 attempts, no budget: goodput 1 - p^27, load (1 + p + p^2)(1 + p^3 + p^6)(1 + p^9 + p^18)"
        );
        println!("  (27x at 100%).");
        println!(
            "- budgets: each layer's own ceiling, C + r * (requests that layer sees) + m * T, in the"
        );
        println!(
            "  one-layer arithmetic; the requests a layer sees are the load of the layers above."
        );
        throttle_arithmetic(layers, &rows);
        let nested = &budget(0.2).measured;
        println!(
            "\nAt 20% the bottom budget refuses {} retries, and the two layers above send {} retries",
            thousands(nested.layers[2].refused as f64),
            thousands((nested.retries_at(0) + nested.retries_at(1)) as f64),
        );
        println!(
            "of their own, each reaching the server: load {:.2}x, as without budgets. At 100% the budgets",
            nested.load(),
        );
        println!(
            "hold {:.2}x instead of 27x, but not one layer's {:.2}x. Budgets bound each layer; only",
            budget(1.0).measured.load(),
            1.0 + per_request,
        );
        println!("retrying at one layer bounds the path.");
    }
}

/// The throttle rows' arithmetic (A6: a failed attempt takes 1 token, a success adds the
/// ratio, a retry passes only while more than half the tokens are left after its failure).
fn throttle_arithmetic(layers: usize, rows: &[sim::Row]) {
    let throttle = |p: f64| {
        rows.iter()
            .find(|r| r.storm.failure_rate == p && r.storm.retries == sim::Retries::Throttle)
            .expect("a throttle row at every rate")
    };
    let (max, ratio) = (sim::THROTTLE_MAX_TOKENS, sim::THROTTLE_RATIO);
    println!(
        "- A6's Throttle ({max} tokens, {ratio} per success, retries while more than {} are left):",
        max / 2.0
    );
    println!(
        "  every attempt, first or retry, granted or refused, moves the count by {ratio} (1 - p) - p"
    );
    println!(
        "  on average, however many retries pass. Below p = {ratio} / (1 + {ratio}) = 1/11 ({:.1}%) the count",
        sim::throttle_knee() * 100.0
    );
    println!(
        "  stays near full and every retry passes: attempts only (5%: +{:.3} per attempt). Above it",
        sim::throttle_drift(0.05)
    );
    println!(
        "  ({:.2} at 20%) the count falls past {} within a few dozen attempts, then towards 0, and no",
        sim::throttle_drift(0.2),
        max / 2.0
    );
    println!(
        "  retry passes: goodput 1 - p, load 1, and every failed first attempt is refused: p * requests"
    );
    if layers == 1 {
        println!("  (left out: the handful of retries granted at the start, 4 at 100%).");
        let full = &throttle(1.0).measured;
        println!(
            "\nAt 100% exactly {} retries pass ({} attempts for {} requests): the count goes 10, 9, .., 6,",
            full.attempts - full.requests,
            thousands(full.attempts as f64),
            thousands(full.requests as f64),
        );
        println!(
            "and the fifth failure leaves 5. At 5% the count dips to 5 now and then: {} refused.",
            throttle(0.05).measured.refused()
        );
        println!(
            "A6's throttle is a switch, not a ceiling: it passes every retry below 1 failure in 11 and"
        );
        println!(
            "none above, where the budget still rescues {} of the requests at 20%.",
            thousands(
                (rows
                    .iter()
                    .find(|r| {
                        r.storm.failure_rate == 0.2
                            && r.storm.retries == sim::Retries::DefaultBudget
                    })
                    .expect("a budget row")
                    .measured
                    .succeeded
                    - rows
                        .iter()
                        .find(|r| {
                            r.storm.failure_rate == 0.2 && r.storm.retries == sim::Retries::Off
                        })
                        .expect("a row without retries")
                        .measured
                        .succeeded) as f64
            )
        );
    } else {
        println!(
            "  per layer, each meeting the failure rate the layer below leaves: above 1/11, about p at"
        );
        println!("  every layer, so 3 p * requests refused in all.");
        let full = &throttle(1.0).measured;
        println!(
            "\nEach layer has its own throttle, and each shuts: at 100% exactly {} retries pass in all",
            full.attempts - full.requests
        );
        println!(
            "(4 per layer), load {:.4}x. Unlike budgets, throttles do not multiply through nesting,",
            full.load()
        );
        println!("because above 1/11 no layer retries; below it they retry as attempts alone do.");
    }
}

/// `12345.6` as `12,346`.
fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}
