//! Why jitter and budgets: the storm figures, reproduced with the real layer.
//!
//! (a) Jitter spread: 1000 clients fail at t = 0 and retry with base 100 ms and cap 10 s.
//!     Without jitter every retry round lands in one 50 ms window; full jitter spreads
//!     retry 1 over about 4 windows and retry 4 over about 50; decorrelated is the widest.
//! (b) Amplification during a total outage with sustained traffic: calls reaching the
//!     bottom per logical request, for one retrying layer and three nested ones, without and
//!     with the default retry budget (10% of requests + 10 per second).
//!
//! Everything runs under paused time: minutes of simulated traffic take a moment.
//! Run with `cargo run --example storm`.

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
    println!(
        "\nWith a budget, each layer adds retries of about 10% of the requests it sees, plus its"
    );
    println!("bucket's 100 starting tokens and 10 per second: about 1.1x for one layer and");
    println!(
        "1.1^3 = 1.33x for three, instead of multiplying the load by the attempts at every layer."
    );
}
