//! The candidates file (`CONFIGS.toml`): the configurations to build, the price table they
//! refer to, how many runs each gets, and the baseline that performance per dollar is
//! relative to. Parsed and checked here, before any host is made.

use crate::Error;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Bounds that keep a candidate buildable on one machine; past them the file is refused.
pub const HOSTS_MAX: u32 = 64;
pub const RUNS_MAX: u32 = 100;
pub const MEMORY_MAX: u64 = 1 << 40;
pub const LATENCY_MAX: Duration = Duration::from_secs(10);

/// One row of the price table: a kind of host.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Purchase cost of one host (PGA's cluster cost is the sum over its hosts).
    pub purchase: f64,
    /// Price of one host for an hour in a cloud.
    pub hourly: f64,
}

/// One candidate cluster, as written in the file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    name: String,
    hosts: u32,
    host: String,
    memory: String,
    #[serde(default = "one")]
    cores: f64,
    bandwidth: String,
    #[serde(default = "zero_latency")]
    latency: String,
    #[serde(default)]
    loss: f64,
    #[serde(default = "default_stripe")]
    stripe: String,
    #[serde(default = "one_u8")]
    replication: u8,
}

fn one() -> f64 {
    1.0
}
fn one_u8() -> u8 {
    1
}
fn zero_latency() -> String {
    "0us".into()
}
fn default_stripe() -> String {
    "1MiB".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    #[serde(default = "three")]
    runs: u32,
    baseline: Option<String>,
    prices: BTreeMap<String, Price>,
    config: Vec<RawConfig>,
    #[serde(default)]
    predict: Vec<RawTarget>,
}

/// A cluster to predict with the scaling model, not to build.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTarget {
    hosts: u32,
    bandwidth: String,
    #[serde(default = "one")]
    cores: f64,
}

/// A cluster the scaling model predicts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    pub hosts: u32,
    pub bandwidth_bps: u64,
    /// Cores of each host.
    pub cores: f64,
}

fn three() -> u32 {
    3
}

/// A candidate cluster, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub name: String,
    /// Emulated hosts, one Tessera server on each.
    pub hosts: u32,
    /// The price table's row for its hosts.
    pub kind: String,
    pub price: Price,
    /// Memory of each host's server, bytes.
    pub memory: u64,
    /// CPU of each host (1.0 = one core), enforced as a cgroup quota.
    pub cores: f64,
    /// Each host's link, bits per second.
    pub bandwidth_bps: u64,
    /// One-way delay added on each host's link.
    pub latency: Duration,
    /// Packets lost on each link, percent.
    pub loss: f64,
    pub stripe: u64,
    pub replication: u8,
}

impl Candidate {
    /// PGA's cluster cost: the purchase cost of all its hosts.
    pub fn purchase_cost(&self) -> f64 {
        self.price.purchase * f64::from(self.hosts)
    }

    /// What the cluster costs per hour in a cloud.
    pub fn hourly_cost(&self) -> f64 {
        self.price.hourly * f64::from(self.hosts)
    }
}

/// The whole file, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub runs: u32,
    /// Index into `candidates` of the baseline (the first when the file names none).
    pub baseline: usize,
    pub candidates: Vec<Candidate>,
    /// Clusters past what this machine emulates, for the scaling model.
    pub predict: Vec<Target>,
}

impl Plan {
    pub fn parse(text: &str) -> Result<Self, Error> {
        let raw: RawPlan = toml::from_str(text).map_err(|e| Error::Plan(e.to_string()))?;
        if raw.config.is_empty() {
            return Err(Error::Plan("no [[config]] to evaluate".into()));
        }
        if raw.runs == 0 || raw.runs > RUNS_MAX {
            return Err(Error::Plan(format!(
                "runs = {}: give 1 to {RUNS_MAX}",
                raw.runs
            )));
        }
        for (kind, p) in &raw.prices {
            if !(p.purchase.is_finite()
                && p.purchase > 0.0
                && p.hourly.is_finite()
                && p.hourly > 0.0)
            {
                return Err(Error::Plan(format!(
                    "prices.{kind}: purchase and hourly must be positive numbers"
                )));
            }
        }
        let mut candidates: Vec<Candidate> = Vec::with_capacity(raw.config.len());
        for c in raw.config {
            let candidate = check(c, &raw.prices)?;
            if candidates.iter().any(|o| o.name == candidate.name) {
                return Err(Error::Plan(format!(
                    "two configurations are named {:?}",
                    candidate.name
                )));
            }
            candidates.push(candidate);
        }
        let baseline = match raw.baseline {
            None => 0,
            Some(b) => candidates
                .iter()
                .position(|c| c.name == b)
                .ok_or_else(|| Error::Plan(format!("baseline {b:?} is not a configuration")))?,
        };
        let predict = raw
            .predict
            .iter()
            .map(|t| {
                let bad = |what: String| Error::Plan(format!("predict: {what}"));
                if t.hosts == 0 {
                    return Err(bad("hosts = 0".into()));
                }
                if !(t.cores.is_finite() && t.cores > 0.0) {
                    return Err(bad(format!("cores = {}: give a positive number", t.cores)));
                }
                Ok(Target {
                    hosts: t.hosts,
                    bandwidth_bps: bandwidth(&t.bandwidth).map_err(bad)?,
                    cores: t.cores,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            runs: raw.runs,
            baseline,
            candidates,
            predict,
        })
    }
}

fn check(c: RawConfig, prices: &BTreeMap<String, Price>) -> Result<Candidate, Error> {
    let bad = |what: String| Error::Plan(format!("config {:?}: {what}", c.name));
    if c.name.is_empty()
        || !c
            .name
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
    {
        return Err(bad("a name is letters, digits, '-', '_' or '.'".into()));
    }
    if c.hosts == 0 || c.hosts > HOSTS_MAX {
        return Err(bad(format!("hosts = {}: give 1 to {HOSTS_MAX}", c.hosts)));
    }
    let price = prices
        .get(&c.host)
        .cloned()
        .ok_or_else(|| bad(format!("host {:?} is not in [prices]", c.host)))?;
    let memory = parse_size::parse_size(&c.memory)
        .map_err(|e| bad(format!("memory {:?}: {e}", c.memory)))?;
    let stripe = parse_size::parse_size(&c.stripe)
        .map_err(|e| bad(format!("stripe {:?}: {e}", c.stripe)))?;
    if memory == 0 || memory > MEMORY_MAX {
        return Err(bad(format!(
            "memory {:?}: between 1 byte and 1TiB",
            c.memory
        )));
    }
    if stripe == 0 || stripe % (1 << 20) != 0 || stripe > 64 << 20 {
        return Err(bad(format!(
            "stripe {:?}: a multiple of 1MiB, at most 64MiB",
            c.stripe
        )));
    }
    if !(c.cores.is_finite() && c.cores > 0.0) {
        return Err(bad(format!("cores = {}: give a positive number", c.cores)));
    }
    if !(0.0..100.0).contains(&c.loss) {
        return Err(bad(format!("loss = {}: a percentage below 100", c.loss)));
    }
    if c.replication == 0 || u32::from(c.replication) > c.hosts {
        return Err(bad(format!(
            "replication = {}: between 1 and the number of hosts",
            c.replication
        )));
    }
    let bandwidth_bps = bandwidth(&c.bandwidth).map_err(bad)?;
    let latency = quantity(&c.latency, LATENCY).map_err(bad)?;
    if latency > LATENCY_MAX.as_secs_f64() {
        return Err(bad(format!(
            "latency {:?}: at most {LATENCY_MAX:?}",
            c.latency
        )));
    }
    Ok(Candidate {
        name: c.name,
        hosts: c.hosts,
        kind: c.host,
        price,
        memory,
        cores: c.cores,
        bandwidth_bps,
        latency: Duration::from_secs_f64(latency),
        loss: c.loss,
        stripe,
        replication: c.replication,
    })
}

const BANDWIDTH: &[(&str, f64)] = &[
    ("bit", 1.0),
    ("kbit", 1e3),
    ("mbit", 1e6),
    ("gbit", 1e9),
    ("tbit", 1e12),
];
const LATENCY: &[(&str, f64)] = &[("ns", 1e-9), ("us", 1e-6), ("ms", 1e-3), ("s", 1.0)];

/// Bits per second, at least 1 kbit/s.
fn bandwidth(s: &str) -> Result<u64, String> {
    let v = quantity(s, BANDWIDTH)?;
    if v < 1000.0 {
        return Err(format!("bandwidth {s:?} is below 1kbit"));
    }
    Ok(v as u64)
}

/// A number and one of `units` (case-insensitive), as `tc` writes them: `10Gbit`, `100us`.
fn quantity(s: &str, units: &[(&str, f64)]) -> Result<f64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.parse().map_err(|_| format!("{s:?} has no number"))?;
    let unit = unit.trim().to_ascii_lowercase();
    let scale = units
        .iter()
        .find(|(u, _)| *u == unit)
        .map(|(_, f)| *f)
        .ok_or_else(|| {
            let names: Vec<_> = units.iter().map(|(u, _)| *u).collect();
            format!("{s:?}: the unit is one of {}", names.join(", "))
        })?;
    let v = v * scale;
    if !v.is_finite() {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
runs = 2
baseline = "big"
[prices.small]
purchase = 2000
hourly = 0.1
[prices.large]
purchase = 9000
hourly = 0.5
[[config]]
name = "small-4"
hosts = 4
host = "small"
memory = "1GiB"
cores = 0.5
bandwidth = "1Gbit"
latency = "100us"
[[config]]
name = "big"
hosts = 2
host = "large"
memory = "4GiB"
bandwidth = "10gbit"
latency = "0.5ms"
loss = 0.1
stripe = "4MiB"
replication = 2
[[predict]]
hosts = 32
bandwidth = "100Gbit"
"#;

    #[test]
    fn a_good_file_parses_with_its_defaults() {
        let p = Plan::parse(GOOD).unwrap();
        assert_eq!(p.runs, 2);
        assert_eq!(p.baseline, 1);
        let small = &p.candidates[0];
        assert_eq!(small.bandwidth_bps, 1_000_000_000);
        assert_eq!(small.latency, Duration::from_micros(100));
        assert_eq!((small.stripe, small.replication), (1 << 20, 1));
        assert_eq!(small.purchase_cost(), 8000.0);
        assert!((small.hourly_cost() - 0.4).abs() < 1e-12);
        let big = &p.candidates[1];
        assert_eq!(big.latency, Duration::from_micros(500));
        assert_eq!(big.cores, 1.0);
        assert_eq!(big.memory, 4 << 30);
        assert_eq!(
            p.predict,
            [Target {
                hosts: 32,
                bandwidth_bps: 100_000_000_000,
                cores: 1.0
            }]
        );
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let cases = [
            (GOOD.replace("hosts = 2", "hosts = 0"), "hosts = 0"),
            (
                GOOD.replace("host = \"large\"", "host = \"huge\""),
                "not in [prices]",
            ),
            (
                GOOD.replace("\"10gbit\"", "\"10 furlongs\""),
                "unit is one of",
            ),
            (GOOD.replace("\"0.5ms\"", "\"fast\""), "has no number"),
            (
                GOOD.replace("\"0.5ms\"", &format!("\"{}s\"", "9".repeat(300))),
                "at most 10s",
            ),
            (GOOD.replace("\"4GiB\"", "\"16EiB\""), "memory"),
            (
                GOOD.replace("replication = 2", "replication = 3"),
                "replication = 3",
            ),
            (
                GOOD.replace("baseline = \"big\"", "baseline = \"x\""),
                "baseline \"x\"",
            ),
            (
                GOOD.replace("name = \"big\"", "name = \"small-4\""),
                "two configurations",
            ),
            (GOOD.replace("purchase = 9000", "purchase = -1"), "positive"),
            (GOOD.replace("runs = 2", "runs = 0"), "runs = 0"),
            (GOOD.replace("cores = 0.5", "cores = 0"), "cores = 0"),
            (GOOD.replace("loss = 0.1", "loss = 100"), "loss = 100"),
            (GOOD.replace("\"4MiB\"", "\"256KiB\""), "a multiple of 1MiB"),
            (
                GOOD.replace("name = \"big\"", "name = \"a b\""),
                "a name is",
            ),
            (
                GOOD.replace("stripe = \"4MiB\"", "strip = \"4MiB\""),
                "unknown field",
            ),
            (GOOD.replace("\"100Gbit\"", "\"10\""), "predict:"),
            (
                GOOD.replace("\"100Gbit\"", "\"100Gbit\"\ncores = -1"),
                "predict: cores = -1",
            ),
        ];
        for (text, want) in cases {
            let e = Plan::parse(&text).unwrap_err().to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }
}
