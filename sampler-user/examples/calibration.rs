//! Re-checks the estimators: simulates many recordings of known allocation patterns with the
//! kernel's own geometric draw and prints bias and interval coverage of every estimator.
//!
//! `cargo run --release -p sampler-user --example calibration [RUNS] [INTERVAL]`

use sampler_user::stats::simulate::{calibrate, Pattern};

fn main() {
    let mut args = std::env::args().skip(1);
    let runs: u32 = args.next().and_then(|a| a.parse().ok()).unwrap_or(2000);
    let interval: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(4096);
    println!("{runs} simulated recordings per pattern, mean interval {interval} B, 95% bounds");
    println!(
        "{:<16} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "pattern", "samples", "HT bias", "trials", "coverage", "objects", "live bias", "live cov"
    );
    for (i, pattern) in Pattern::ALL.into_iter().enumerate() {
        let c = calibrate(pattern, interval, 200, runs, 0.95, 100 + i as u64);
        println!(
            "{:<16} {:>8.1} {:>+8.2}% {:>+8.2}% {:>8.1}% {:>8.1}% {:>+8.2}% {:>8.1}%",
            format!("{pattern:?}"),
            c.mean_samples,
            (c.weighted_bias - 1.0) * 100.0,
            (c.trials_bias - 1.0) * 100.0,
            c.coverage * 100.0,
            c.objects_coverage * 100.0,
            (c.live_bias - 1.0) * 100.0,
            c.live_coverage * 100.0,
        );
    }
}
