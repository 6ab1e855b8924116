//! Runs simulation seeds: `TESSERA_SIM_SEEDS` of them from `TESSERA_SIM_START` (a few by
//! default, as CI runs), or replays one, `TESSERA_SIM_SEED=N`, printing its schedule.

use std::time::Instant;
use tessera_sim::{run, Options, Outcome};

/// Seeds a plain `cargo test` runs, besides [`REGRESSIONS`].
const CI_SEEDS: u64 = 100;
/// Seeds that found a bug (docs/SEMANTICS.md, "Found by the simulation"), run by a plain
/// `cargo test` too: a receiver started a copy again just after the manager promoted it,
/// clearing the new replica (14 to 270); a slow node applied a write after a table promoting
/// a copy (130 to 769).
const REGRESSIONS: [u64; 11] = [14, 46, 69, 105, 153, 229, 270, 130, 233, 345, 769];

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn simulate(seed: u64, verbose: bool) -> Outcome {
    let restarts = std::env::var_os("TESSERA_SIM_MANAGER_RESTARTS").is_some();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let opts = Options {
        verbose,
        manager_restarts: restarts,
        ..Options::default()
    };
    rt.block_on(run(seed, opts))
}

#[test]
fn seeds_keep_every_invariant() {
    if let Some(seed) = env("TESSERA_SIM_SEED") {
        let out = simulate(seed, true);
        for line in &out.log {
            println!("{line}");
        }
        println!("seed {seed}: schedule hash {:016x}", out.hash);
        assert!(out.failure.is_none(), "seed {seed}: {:?}", out.failure);
        return;
    }
    let (start, count) = (env("TESSERA_SIM_START"), env("TESSERA_SIM_SEEDS"));
    let ci = start.is_none() && count.is_none();
    let (start, count) = (start.unwrap_or(0), count.unwrap_or(CI_SEEDS));
    let end = start + count;
    let regressions = REGRESSIONS
        .into_iter()
        .filter(|s| ci && !(start..end).contains(s));
    let began = Instant::now();
    let mut failed = Vec::new();
    let (mut runs, mut deliveries, mut acked, mut reads) = (0u64, 0, 0, 0);
    for seed in (start..end).chain(regressions) {
        runs += 1;
        let out = simulate(seed, false);
        deliveries += out.deliveries;
        acked += out.acked;
        reads += out.reads;
        if let Some(why) = &out.failure {
            println!("FAILED seed {seed}: {why}");
            println!("  replay: TESSERA_SIM_SEED={seed} cargo test -p tessera-sim --test seeds -- --nocapture");
            for line in out.log.iter().rev().take(15).rev() {
                println!("  {line}");
            }
            failed.push(seed);
        }
    }
    let secs = began.elapsed().as_secs_f64();
    println!(
        "{runs} seeds ({count} from {start}) in {secs:.1} s: {:.2} seeds/s ({deliveries} \
         messages, {acked} writes acknowledged, {reads} reads checked); failing: {failed:?}",
        runs as f64 / secs
    );
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
}

/// A seed replays exactly: the same schedule, event for event.
#[test]
fn a_seed_replays_the_same_schedule() {
    let (a, b) = (simulate(7, false), simulate(7, false));
    assert_eq!(a.log, b.log);
    assert_eq!(a.hash, b.hash);
}
