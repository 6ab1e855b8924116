//! The scaling model: a workload's time as a function of the number of hosts and their link
//! speed, fitted on the measured candidates to predict clusters this machine cannot emulate.
//!
//! Ernest's features (Venkataraman et al., NSDI 2016) for a fixed input: a serial part (1),
//! work split over the hosts (1/m), a tree-shaped exchange (log m) and an all-to-one part (m),
//! plus one for this workload's data crossing the links (1/(m x Gbit/s)). The coefficients are
//! non-negative (non-negative least squares), so every term can only add time, as it does.
//! Assumptions, stated in the report: the input stays the same, hosts are alike, and time
//! splits into these terms; emulated hosts share one machine's cores, so CPU-bound points are
//! slower than real hosts would be.

use crate::Error;
use ndarray::{Array1, Array2};
use serde::Serialize;

/// One measured (or predicted) configuration.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    pub hosts: u32,
    pub gbit: f64,
    pub seconds: f64,
}

pub const FEATURES: [&str; 5] = ["1", "1/m", "log m", "m", "1/(m x Gbit/s)"];

/// Points needed to fit; leave-one-out needs one more.
pub const MIN_POINTS: usize = 3;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Scaling {
    /// Seconds per unit of each of [`FEATURES`].
    pub coefficients: Vec<f64>,
}

fn features(m: f64, gbit: f64) -> [f64; 5] {
    [1.0, 1.0 / m, m.ln(), m, 1.0 / (m * gbit)]
}

impl Scaling {
    pub fn fit(points: &[Point]) -> Result<Self, Error> {
        if points.len() < MIN_POINTS {
            return Err(Error::Scaling(format!(
                "{} measured configurations; the model needs {MIN_POINTS}",
                points.len()
            )));
        }
        if let Some(p) = points
            .iter()
            .find(|p| p.hosts == 0 || p.gbit.is_nan() || p.gbit <= 0.0 || !p.seconds.is_finite())
        {
            return Err(Error::Scaling(format!(
                "a point the model cannot use: {p:?}"
            )));
        }
        let a = Array2::from_shape_fn((points.len(), FEATURES.len()), |(i, j)| {
            features(f64::from(points[i].hosts), points[i].gbit)[j]
        });
        let b = Array1::from_iter(points.iter().map(|p| p.seconds));
        let (x, _) = nnls::nnls(a.view(), b.view());
        Ok(Self {
            coefficients: x.to_vec(),
        })
    }

    pub fn predict(&self, hosts: u32, gbit: f64) -> f64 {
        self.predict_at(f64::from(hosts), gbit)
    }

    /// [`Self::predict`] between whole hosts too (to draw the model as a curve).
    pub fn predict_at(&self, m: f64, gbit: f64) -> f64 {
        features(m, gbit)
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
            let predicted = model.predict(p.hosts, p.gbit);
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
    /// The model fitted on `measured`, checked leaving each out, predicting `targets`
    /// (hosts, Gbit/s).
    pub fn of(measured: &[Point], targets: &[(u32, f64)]) -> Self {
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
            .map(|&(hosts, gbit)| Point {
                hosts,
                gbit,
                seconds: model.predict(hosts, gbit),
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

    fn truth(hosts: u32, gbit: f64) -> f64 {
        2.0 + 40.0 / f64::from(hosts)
            + 0.5 * f64::from(hosts).ln()
            + 8.0 / (f64::from(hosts) * gbit)
    }

    #[test]
    fn a_workload_of_the_models_shape_is_recovered_and_extrapolated() {
        let points: Vec<Point> = [
            (1, 1.0),
            (2, 10.0),
            (3, 1.0),
            (4, 10.0),
            (6, 1.0),
            (8, 10.0),
        ]
        .iter()
        .map(|&(hosts, gbit)| Point {
            hosts,
            gbit,
            seconds: truth(hosts, gbit),
        })
        .collect();
        let model = Scaling::fit(&points).unwrap();
        for (hosts, gbit) in [(32, 10.0), (64, 100.0), (16, 1.0)] {
            let (p, t) = (model.predict(hosts, gbit), truth(hosts, gbit));
            assert!(
                (p - t).abs() / t < 0.01,
                "{hosts} hosts {gbit} Gbit/s: {p} vs {t}"
            );
        }
        for c in leave_one_out(&points).unwrap() {
            assert!(c.error < 0.01, "{c:?}");
        }
    }

    #[test]
    fn too_few_or_unusable_points_are_refused() {
        let p = Point {
            hosts: 2,
            gbit: 1.0,
            seconds: 1.0,
        };
        assert!(Scaling::fit(&[p, p]).is_err());
        assert!(Scaling::fit(&[p, p, Point { gbit: 0.0, ..p }]).is_err());
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
                .map(|(i, &s)| Point { hosts: 1 + i as u32, gbit: if i % 2 == 0 { 1.0 } else { 10.0 }, seconds: s })
                .collect();
            let model = Scaling::fit(&points).unwrap();
            prop_assert!(model.coefficients.iter().all(|c| *c >= 0.0));
            for p in &points {
                let v = model.predict(p.hosts, p.gbit);
                prop_assert!(v.is_finite() && v >= 0.0);
            }
        }
    }
}
