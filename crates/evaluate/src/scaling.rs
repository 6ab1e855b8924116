//! The scaling model: a workload's time as a function of the number of hosts, their link speed
//! and the cores they get, fitted on the measured candidates to predict clusters this machine
//! cannot emulate.
//!
//! Ernest's features (Venkataraman et al., NSDI 2016) for a fixed input: a serial part (1),
//! work split over the machines, a tree-shaped exchange (log m) and an all-to-one part (m),
//! plus one for this workload's data crossing the links (1/(m x Gbit/s)). The split work is
//! divided by C, the cores the hosts could actually get (their cgroup limits together, at most
//! the machine's cores), not by m: emulated hosts share the machine, so two large hosts and two
//! small ones are not the same point, nor are eight half-core hosts faster than the machine.
//! The coefficients are non-negative (non-negative least squares), so every term can only add
//! time, as it does. Assumptions, stated in the report: the input stays the same, the hosts of
//! one cluster are alike, and time splits into these terms.

use crate::Error;
use ndarray::{Array1, Array2};
use serde::Serialize;

/// One measured (or predicted) configuration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    pub hosts: u32,
    pub gbit: f64,
    /// Cores of each host, as configured.
    pub host_cores: f64,
    /// Cores the hosts could get together: `hosts x host_cores`, at most the machine's.
    pub cores: f64,
    pub seconds: f64,
}

impl Point {
    /// A cluster of `hosts` hosts of `host_cores` cores each on a machine of `machine_cores`
    /// (infinite for real hosts, each with its own).
    pub fn new(hosts: u32, gbit: f64, host_cores: f64, machine_cores: f64, seconds: f64) -> Self {
        Self {
            hosts,
            gbit,
            host_cores,
            cores: (f64::from(hosts) * host_cores).min(machine_cores),
            seconds,
        }
    }
}

pub const FEATURES: [&str; 6] = ["1", "1/C", "m/C", "log m", "m", "1/(m x Gbit/s)"];

/// Points needed to fit; leave-one-out needs one more.
pub const MIN_POINTS: usize = 3;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scaling {
    /// Seconds per unit of each of [`FEATURES`].
    pub coefficients: Vec<f64>,
}

/// `m` hosts with `cores` cores together and `gbit` links. `m/C` is the work every host does
/// whatever the cluster's size (starting its processes, its connections, its part of a
/// barrier), at the speed of the cores one host gets: the run waits for the slowest host.
fn features(m: f64, gbit: f64, cores: f64) -> [f64; 6] {
    [1.0, 1.0 / cores, m / cores, m.ln(), m, 1.0 / (m * gbit)]
}

impl Scaling {
    pub fn fit(points: &[Point]) -> Result<Self, Error> {
        if points.len() < MIN_POINTS {
            return Err(Error::Scaling(format!(
                "{} measured configurations; the model needs {MIN_POINTS}",
                points.len()
            )));
        }
        let usable = |x: f64| x.is_finite() && x > 0.0;
        if let Some(p) = points
            .iter()
            .find(|p| p.hosts == 0 || !usable(p.gbit) || !usable(p.cores) || !p.seconds.is_finite())
        {
            return Err(Error::Scaling(format!(
                "a point the model cannot use: {p:?}"
            )));
        }
        let a = Array2::from_shape_fn((points.len(), FEATURES.len()), |(i, j)| {
            let p = &points[i];
            features(f64::from(p.hosts), p.gbit, p.cores)[j]
        });
        let b = Array1::from_iter(points.iter().map(|p| p.seconds));
        let (x, _) = nnls::nnls(a.view(), b.view());
        Ok(Self {
            coefficients: x.to_vec(),
        })
    }

    /// The time at point `p` (its `seconds` aside).
    pub fn predict(&self, p: &Point) -> f64 {
        self.predict_at(f64::from(p.hosts), p.gbit, p.cores)
    }

    /// [`Self::predict`] between whole hosts too (to draw the model as a curve); `cores` is
    /// the cluster's.
    pub fn predict_at(&self, m: f64, gbit: f64, cores: f64) -> f64 {
        features(m, gbit, cores)
            .iter()
            .zip(&self.coefficients)
            .map(|(f, c)| f * c)
            .sum()
    }
}

/// Each point predicted by the model fitted on all the others: how well the model does on
/// configurations it did not see.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub point: Point,
    pub predicted: f64,
    /// |predicted - measured| / measured.
    pub error: f64,
}

pub fn leave_one_out(points: &[Point]) -> Result<Vec<Check>, Error> {
    (0..points.len())
        .map(|i| {
            let rest: Vec<Point> = points
                .iter()
                .enumerate()
                .filter(|(j, _)| *j != i)
                .map(|(_, p)| *p)
                .collect();
            let model = Scaling::fit(&rest)?;
            let p = points[i];
            let predicted = model.predict(&p);
            Ok(Check {
                point: p,
                predicted,
                error: (predicted - p.seconds).abs() / p.seconds.max(1e-9),
            })
        })
        .collect()
}

/// What the scaling model says of an evaluation: the model, how it did on each measured
/// point it was not fitted on, and its predictions; or why there is none.
#[derive(Debug, Clone, Serialize)]
pub struct Extrapolation {
    pub model: Option<Scaling>,
    pub checks: Vec<Check>,
    pub predictions: Vec<Point>,
    /// Why the model or its check is missing, when it is.
    pub note: Option<String>,
}

impl Extrapolation {
    /// The model fitted on `measured`, checked leaving each out, predicting `targets` (their
    /// `seconds` are filled in).
    pub fn of(measured: &[Point], targets: &[Point]) -> Self {
        let model = match Scaling::fit(measured) {
            Ok(m) => m,
            Err(e) => {
                return Self {
                    model: None,
                    checks: Vec::new(),
                    predictions: Vec::new(),
                    note: Some(e.to_string()),
                }
            }
        };
        let (checks, note) = match leave_one_out(measured) {
            Ok(c) => (c, None),
            Err(e) => (Vec::new(), Some(format!("not checked: {e}"))),
        };
        let predictions = targets
            .iter()
            .map(|t| Point {
                seconds: model.predict(t),
                ..*t
            })
            .collect();
        Self {
            model: Some(model),
            checks,
            predictions,
            note,
        }
    }

    /// The largest error on a point left out, if the model was checked.
    pub fn worst_error(&self) -> Option<f64> {
        self.checks.iter().map(|c| c.error).max_by(f64::total_cmp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A workload of the model's shape: serial, split over the cores, per host, exchange.
    fn truth(p: &Point) -> f64 {
        let m = f64::from(p.hosts);
        2.0 + 40.0 / p.cores + 1.5 * m / p.cores + 0.5 * m.ln() + 8.0 / (m * p.gbit)
    }

    fn measured(hosts: u32, gbit: f64, host_cores: f64) -> Point {
        let mut p = Point::new(hosts, gbit, host_cores, 2.0, 0.0);
        p.seconds = truth(&p);
        p
    }

    #[test]
    fn the_cores_are_what_the_hosts_could_get_on_the_machine() {
        // Two large hosts and two small ones are not the same point; eight small hosts get
        // no more than the machine's two cores.
        assert_eq!(Point::new(2, 10.0, 1.0, 2.0, 1.0).cores, 2.0);
        assert_eq!(Point::new(2, 10.0, 0.5, 2.0, 1.0).cores, 1.0);
        assert_eq!(Point::new(8, 10.0, 0.5, 2.0, 1.0).cores, 2.0);
        assert_eq!(Point::new(32, 10.0, 0.5, f64::INFINITY, 1.0).cores, 16.0);
    }

    #[test]
    fn a_workload_of_the_models_shape_is_recovered_and_extrapolated() {
        let points: Vec<Point> = [
            (1, 1.0, 1.0),
            (2, 10.0, 1.0),
            (2, 1.0, 0.5),
            (3, 1.0, 0.5),
            (4, 10.0, 1.0),
            (6, 1.0, 0.25),
            (8, 10.0, 0.5),
            (8, 1.0, 0.125),
        ]
        .iter()
        .map(|&(m, gbit, c)| measured(m, gbit, c))
        .collect();
        let model = Scaling::fit(&points).unwrap();
        // Real hosts, each with its own cores.
        for (hosts, gbit, c) in [(32, 10.0, 1.0), (64, 100.0, 4.0), (16, 1.0, 0.5)] {
            let target = Point::new(hosts, gbit, c, f64::INFINITY, 0.0);
            let (p, t) = (model.predict(&target), truth(&target));
            assert!(
                (p - t).abs() / t < 0.01,
                "{hosts} hosts {gbit} Gbit/s {c} cores: {p} vs {t}"
            );
        }
        for c in leave_one_out(&points).unwrap() {
            assert!(c.error < 0.01, "{c:?}");
        }
    }

    #[test]
    fn too_few_or_unusable_points_are_refused() {
        let p = Point::new(2, 1.0, 1.0, 2.0, 1.0);
        assert!(Scaling::fit(&[p, p]).is_err());
        assert!(Scaling::fit(&[p, p, Point { gbit: 0.0, ..p }]).is_err());
        assert!(Scaling::fit(&[p, p, Point { cores: 0.0, ..p }]).is_err());
        assert!(leave_one_out(&[p, p, p]).is_err());
    }

    proptest! {
        /// Whatever was measured, every term adds time: no coefficient is negative and every
        /// prediction within the measured range is finite and not below zero.
        #[test]
        fn coefficients_are_never_negative(
            seconds in proptest::collection::vec(0.01f64..1000.0, 4..10),
        ) {
            let points: Vec<Point> = seconds
                .iter()
                .enumerate()
                .map(|(i, &s)| {
                    let gbit = if i % 2 == 0 { 1.0 } else { 10.0 };
                    let host_cores = if i % 3 == 0 { 0.5 } else { 1.0 };
                    Point::new(1 + i as u32, gbit, host_cores, 2.0, s)
                })
                .collect();
            let model = Scaling::fit(&points).unwrap();
            prop_assert!(model.coefficients.iter().all(|c| *c >= 0.0));
            for p in &points {
                let v = model.predict(p);
                prop_assert!(v.is_finite() && v >= 0.0);
            }
        }
    }
}
