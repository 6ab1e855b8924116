//! From measured runs to a verdict: each candidate's time and spread, throughput, how busy
//! its resources were, what it costs under both cost models, and which candidate to pick for
//! speed, for work per purchase dollar and for the cheapest run in a cloud, with why.

use crate::plan::{Candidate, Plan};
use crate::scaling::{Extrapolation, Point};
use serde::Serialize;

/// One measured run of the workload on a candidate.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Run {
    /// Wall time of the workload.
    pub seconds: f64,
    /// Bytes the workload read and wrote through Tessera.
    pub bytes: u64,
    /// File-system operations the workload made.
    pub ops: u64,
    /// Largest memory the servers held together during the run.
    pub memory_peak: u64,
    /// CPU time of every emulated host (servers and clients), seconds.
    pub cpu_seconds: f64,
    /// CPU time the machine spent waiting for I/O during the run, seconds.
    pub iowait_seconds: f64,
    /// Bytes that crossed the emulated links (sent by every host).
    pub link_bytes: u64,
    /// CPU time of the busiest host, seconds.
    #[serde(default)]
    pub busiest_cpu_seconds: f64,
    /// Bytes through the busiest link, both directions together.
    #[serde(default)]
    pub busiest_link_bytes: u64,
    /// When the workload ran on every host: how long it took on each (the run lasts until
    /// the last one ends).
    #[serde(default)]
    pub host_seconds: Vec<f64>,
}

/// What limits a candidate, from how busy each resource was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bound {
    Network,
    Cpu,
    Memory,
    /// No resource was near its limit: round trips (latency) or the workload itself.
    Latency,
}

impl Bound {
    pub fn words(self) -> &'static str {
        match self {
            Bound::Network => "network-bound",
            Bound::Cpu => "CPU-bound",
            Bound::Memory => "memory-bound",
            Bound::Latency => "latency-bound (no resource near its limit)",
        }
    }
}

/// A resource this busy (fraction of its capacity) is what bounds the candidate.
const BUSY: f64 = 0.6;

/// Median, smallest and largest of some runs' figure.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    fn of(mut v: Vec<f64>) -> Self {
        assert!(!v.is_empty(), "a spread of no runs");
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Self {
            median,
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// One candidate's results.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub name: String,
    pub hosts: u32,
    pub seconds: Spread,
    /// Bytes per second through Tessera (median run).
    pub throughput: f64,
    pub ops_per_second: f64,
    pub memory_peak: u64,
    /// Fractions of capacity of the busiest host's CPU, of the busiest link and of the
    /// servers' memory: the busiest one bounds the whole.
    pub cpu_busy: f64,
    pub link_busy: f64,
    pub memory_busy: f64,
    pub iowait_seconds: f64,
    pub bound: Bound,
    /// PGA: 1 / (time x cluster cost), relative to the baseline's (higher is better).
    pub perf_per_dollar: f64,
    pub purchase_cost: f64,
    /// Price of one run in a cloud: hourly price x hosts x time.
    pub cloud_cost: f64,
    pub runs: Vec<Run>,
}

/// The whole evaluation.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub baseline: String,
    pub outcomes: Vec<Outcome>,
    /// Names, and why, of the fastest candidate, the best per purchase dollar and the cheapest
    /// run in a cloud.
    pub fastest: String,
    pub best_per_dollar: String,
    pub cheapest_cloud: String,
    pub recommendation: String,
    /// The scaling model on the candidates' median times.
    pub scaling: Extrapolation,
}

fn outcome(c: &Candidate, runs: &[Run]) -> Outcome {
    assert!(!runs.is_empty(), "{}: no runs", c.name);
    let seconds = Spread::of(runs.iter().map(|r| r.seconds.max(1e-9)).collect());
    let median_of = |f: &dyn Fn(&Run) -> f64| Spread::of(runs.iter().map(f).collect()).median;
    let t = seconds.median;
    let hosts = f64::from(c.hosts);
    let cpu_busy = median_of(&|r| r.busiest_cpu_seconds / (r.seconds.max(1e-9) * c.cores));
    let link_busy = median_of(&|r| {
        r.busiest_link_bytes as f64 * 8.0 / (r.seconds.max(1e-9) * c.bandwidth_bps as f64)
    });
    let memory_peak = runs.iter().map(|r| r.memory_peak).max().unwrap_or(0);
    let memory_busy = memory_peak as f64 / (hosts * c.memory as f64);
    let bound = [
        (link_busy, Bound::Network),
        (cpu_busy, Bound::Cpu),
        (memory_busy, Bound::Memory),
    ]
    .into_iter()
    .filter(|(busy, _)| *busy >= BUSY)
    .max_by(|a, b| a.0.total_cmp(&b.0))
    .map_or(Bound::Latency, |(_, b)| b);
    Outcome {
        name: c.name.clone(),
        hosts: c.hosts,
        seconds,
        throughput: median_of(&|r| r.bytes as f64 / r.seconds.max(1e-9)),
        ops_per_second: median_of(&|r| r.ops as f64 / r.seconds.max(1e-9)),
        memory_peak,
        cpu_busy,
        link_busy,
        memory_busy,
        iowait_seconds: median_of(&|r| r.iowait_seconds),
        bound,
        perf_per_dollar: 1.0 / (t * c.purchase_cost()),
        purchase_cost: c.purchase_cost(),
        cloud_cost: c.hourly_cost() * t / 3600.0,
        runs: runs.to_vec(),
    }
}

/// Ranks the candidates of `plan` from their runs (`runs[i]` belongs to candidate i), measured
/// on a machine of `machine_cores` cores shared by the emulated hosts.
pub fn rank(plan: &Plan, runs: &[Vec<Run>], machine_cores: f64) -> Verdict {
    assert_eq!(
        plan.candidates.len(),
        runs.len(),
        "runs for every candidate"
    );
    let mut outcomes: Vec<Outcome> = plan
        .candidates
        .iter()
        .zip(runs)
        .map(|(c, r)| outcome(c, r))
        .collect();
    let base = outcomes[plan.baseline].perf_per_dollar;
    for o in &mut outcomes {
        o.perf_per_dollar /= base;
    }
    let best = |key: &dyn Fn(&Outcome) -> f64| -> &Outcome {
        outcomes
            .iter()
            .min_by(|a, b| key(a).total_cmp(&key(b)))
            .expect("at least one candidate")
    };
    let fastest = best(&|o| o.seconds.median);
    let per_dollar = best(&|o| -o.perf_per_dollar);
    let cloud = best(&|o| o.cloud_cost);
    let recommendation = format!(
        "Fastest: {} ({:.2} s, {}). Most work per purchase dollar: {} ({:.2}x the baseline {}, \
         {}). Cheapest run in a cloud: {} ({:.4} per run).",
        fastest.name,
        fastest.seconds.median,
        fastest.bound.words(),
        per_dollar.name,
        per_dollar.perf_per_dollar,
        plan.candidates[plan.baseline].name,
        per_dollar.bound.words(),
        cloud.name,
        cloud.cloud_cost,
    );
    let measured: Vec<Point> = plan
        .candidates
        .iter()
        .zip(&outcomes)
        .map(|(c, o)| {
            let gbit = c.bandwidth_bps as f64 / 1e9;
            Point::new(c.hosts, gbit, c.cores, machine_cores, o.seconds.median)
        })
        .collect();
    // Real hosts: each has its own cores.
    let targets: Vec<Point> = plan
        .predict
        .iter()
        .map(|t| {
            let gbit = t.bandwidth_bps as f64 / 1e9;
            Point::new(t.hosts, gbit, t.cores, f64::INFINITY, 0.0)
        })
        .collect();
    Verdict {
        scaling: Extrapolation::of(&measured, &targets),
        baseline: plan.candidates[plan.baseline].name.clone(),
        fastest: fastest.name.clone(),
        best_per_dollar: per_dollar.name.clone(),
        cheapest_cloud: cloud.name.clone(),
        recommendation,
        outcomes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAN: &str = r#"
baseline = "medium"
[prices.cheap]
purchase = 1000
hourly = 0.05
[prices.dear]
purchase = 4000
hourly = 0.40
[[config]]
name = "medium"
hosts = 4
host = "dear"
memory = "1GiB"
bandwidth = "10Gbit"
[[config]]
name = "dense"
hosts = 8
host = "cheap"
memory = "1GiB"
cores = 0.5
bandwidth = "1Gbit"
"#;

    fn plan() -> Plan {
        Plan::parse(PLAN).unwrap()
    }

    fn run(seconds: f64) -> Run {
        Run {
            seconds,
            bytes: 1 << 30,
            ops: 1000,
            ..Run::default()
        }
    }

    #[test]
    fn the_cost_models_follow_pga_and_the_cloud_price() {
        let p = plan();
        // medium: 16000 of hosts, 10 s; dense: 8000, 15 s.
        let v = rank(
            &p,
            &[vec![run(10.0), run(12.0), run(9.0)], vec![run(15.0)]],
            2.0,
        );
        let (medium, dense) = (&v.outcomes[0], &v.outcomes[1]);
        assert_eq!(
            medium.seconds,
            Spread {
                median: 10.0,
                min: 9.0,
                max: 12.0
            }
        );
        assert!((medium.perf_per_dollar - 1.0).abs() < 1e-12);
        // (10 x 16000) / (15 x 8000)
        assert!((dense.perf_per_dollar - 160.0 / 120.0).abs() < 1e-12);
        assert!((medium.cloud_cost - 1.6 * 10.0 / 3600.0).abs() < 1e-12);
        assert!((dense.cloud_cost - 0.4 * 15.0 / 3600.0).abs() < 1e-12);
        assert_eq!(v.fastest, "medium");
        assert_eq!(v.best_per_dollar, "dense");
        assert_eq!(v.cheapest_cloud, "dense");
        assert!(
            v.recommendation.contains("Fastest: medium"),
            "{}",
            v.recommendation
        );
        assert!((medium.throughput - (1u64 << 30) as f64 / 10.0).abs() < 1e-6);
    }

    #[test]
    fn the_busiest_resource_names_the_bound() {
        let p = plan();
        let busy_link = Run {
            // 1 Gbit/s x 10 s = 1.25 GB; 1 GB through the busiest link: 80 %.
            busiest_link_bytes: 1_000_000_000,
            busiest_cpu_seconds: 2.0,
            ..run(10.0)
        };
        let busy_cpu = Run {
            // 1 core x 10 s; 9 s of CPU on the busiest host.
            busiest_cpu_seconds: 9.0,
            ..run(10.0)
        };
        let v = rank(&p, &[vec![busy_cpu], vec![busy_link]], 2.0);
        assert_eq!(v.outcomes[0].bound, Bound::Cpu);
        assert_eq!(v.outcomes[1].bound, Bound::Network);
        let idle = rank(&p, &[vec![run(1.0)], vec![run(1.0)]], 2.0);
        assert_eq!(idle.outcomes[0].bound, Bound::Latency);
    }

    #[test]
    fn the_scaling_model_sees_the_cores_the_hosts_could_get() {
        let text = format!(
            "{}{}",
            PLAN,
            r#"
[[config]]
name = "pair-dear"
hosts = 2
host = "dear"
memory = "1GiB"
bandwidth = "10Gbit"
[[config]]
name = "pair-cheap"
hosts = 2
host = "cheap"
memory = "1GiB"
cores = 0.5
bandwidth = "10Gbit"
"#
        );
        let p = Plan::parse(&text).unwrap();
        let runs = vec![
            vec![run(10.0)],
            vec![run(15.0)],
            vec![run(9.0)],
            vec![run(12.0)],
        ];
        let cores = |machine: f64| -> Vec<f64> {
            let v = rank(&p, &runs, machine);
            v.scaling.checks.iter().map(|c| c.point.cores).collect()
        };
        // medium 4 x 1, dense 8 x 0.5, pair-dear 2 x 1, pair-cheap 2 x 0.5: on two cores the
        // first three get the same two; on sixteen each gets its own.
        assert_eq!(cores(2.0), [2.0, 2.0, 2.0, 1.0]);
        assert_eq!(cores(16.0), [4.0, 4.0, 2.0, 1.0]);
    }
}
