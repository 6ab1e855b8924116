//! The model's think time, as a replay spends it (pure): how long a process waits before
//! each of its requests in a data phase.

use tessera_model::Phase;

/// A process's waits in one phase: before its first request, the phase's lead; before each
/// other, a gap from the phase's bins, so that its gaps spread as the traced ones did and add
/// up to as much. Bins are drawn along a Weyl sequence over their cumulative counts:
/// deterministic, and any stretch of requests gets its share of short and long gaps. A
/// model without bins (an older profiler's) waits its median distance.
pub(crate) struct Gaps<'a> {
    phase: &'a Phase,
    total: u64,
    at: f64,
    first: bool,
}

/// The golden ratio's fractional part: the Weyl step that spreads best.
const STEP: f64 = 0.618_033_988_749_895;

impl<'a> Gaps<'a> {
    /// Process `slot`'s waits (processes start at different points of the sequence).
    pub(crate) fn new(phase: &'a Phase, slot: usize) -> Self {
        Gaps {
            phase,
            // Counts come from the model file: summed without overflow.
            total: (phase.think.iter()).fold(0, |n: u64, b| n.saturating_add(b.count)),
            at: (slot as f64 * std::f64::consts::SQRT_2).fract(),
            first: true,
        }
    }

    /// The next wait, in nanoseconds.
    pub(crate) fn next_ns(&mut self) -> u64 {
        if std::mem::take(&mut self.first) {
            return self.phase.lead_ns;
        }
        if self.total == 0 {
            return self.phase.distance_ns;
        }
        self.at = (self.at + STEP).fract();
        // In [0, total): the gap of that rank in the cumulative counts.
        let mut rank = ((self.at * self.total as f64) as u64).min(self.total - 1);
        for b in &self.phase.think {
            if rank < b.count {
                return b.mean_ns;
            }
            rank -= b.count;
        }
        0
    }

    /// The longest wait the phase asks for.
    pub(crate) fn longest_ns(phase: &Phase) -> u64 {
        let bins = phase.think.iter().map(|b| b.mean_ns).max().unwrap_or(0);
        bins.max(phase.lead_ns).max(phase.distance_ns)
    }
}

/// Keeps a process's time between requests at the model's: the traced gaps are the time the
/// mount saw no request, which holds the kernel's work around each request (entering it,
/// waking the mount, returning) as well as the compute. The replay's own requests take that
/// kernel time again: what its requests take beyond the traced mean (as the replay times
/// them, against the model's as the mount timed them) is taken off each wait, and so is any
/// wait that overran (the thread descheduled as it ended).
pub(crate) struct Pace {
    traced_ns: u64,
    io_ns: u64,
    ios: u64,
    overrun: u64,
}

impl Pace {
    pub(crate) fn new(phase: &Phase) -> Self {
        Pace {
            traced_ns: phase.io_time_ns / phase.ops.max(1),
            io_ns: 0,
            ios: 0,
            overrun: 0,
        }
    }

    fn target(&self, want: u64) -> u64 {
        let hidden = match self.ios {
            0 => 0,
            n => (self.io_ns / n).saturating_sub(self.traced_ns),
        };
        want.saturating_sub(hidden)
    }

    /// How long to wait for a gap of `want` ns, counted from the last request's return.
    pub(crate) fn wait_ns(&self, want: u64) -> u64 {
        self.target(want).saturating_sub(self.overrun)
    }

    /// The wait for `want` took `took` ns from the last request's return.
    pub(crate) fn waited(&mut self, want: u64, took: u64) {
        self.overrun = (self.overrun.saturating_add(took)).saturating_sub(self.target(want));
    }

    /// A request took `ns`, as the replay timed it.
    pub(crate) fn request(&mut self, ns: u64) {
        self.io_ns = self.io_ns.saturating_add(ns);
        self.ios += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_model::{synthetic, ThinkBin};

    fn phase(think: Vec<ThinkBin>, lead_ns: u64, distance_ns: u64) -> Phase {
        let mut m = synthetic::file_per_process(1, 4, 10);
        let mut p = m.phases.remove(0);
        (p.think, p.lead_ns, p.distance_ns) = (think, lead_ns, distance_ns);
        p
    }

    #[test]
    fn gaps_keep_the_spread_and_the_total() {
        let bins = vec![
            ThinkBin {
                count: 700,
                mean_ns: 100,
            },
            ThinkBin {
                count: 200,
                mean_ns: 1_000,
            },
            ThinkBin {
                count: 100,
                mean_ns: 50_000,
            },
        ];
        let p = phase(bins.clone(), 7, 0);
        let mut g = Gaps::new(&p, 0);
        assert_eq!(g.next_ns(), 7, "the lead first");
        let gaps: Vec<u64> = (0..1000).map(|_| g.next_ns()).collect();
        let total: u64 = gaps.iter().sum();
        let want: u64 = bins.iter().map(|b| b.count * b.mean_ns).sum();
        assert!(total.abs_diff(want) * 50 < want, "{total} against {want}");
        for b in &bins {
            let n = gaps.iter().filter(|&&x| x == b.mean_ns).count() as u64;
            assert!(n.abs_diff(b.count) <= 2, "{n} gaps of {} ns", b.mean_ns);
        }
        // Any hundred in a row hold some of the long gaps.
        for w in gaps.chunks(100) {
            assert!(w.contains(&50_000), "{w:?}");
        }
        // Other processes start elsewhere in the sequence.
        let mut other = Gaps::new(&p, 1);
        other.next_ns();
        let theirs: Vec<u64> = (0..20).map(|_| other.next_ns()).collect();
        assert_ne!(theirs, gaps[..20]);
    }

    #[test]
    fn pace_takes_off_the_kernel_time_and_overruns() {
        let mut p = phase(Vec::new(), 0, 0);
        (p.io_time_ns, p.ops) = (4 * 10_000, 4);
        let mut pace = Pace::new(&p);
        assert_eq!(pace.wait_ns(100_000), 100_000, "nothing known yet");
        // Requests of 40 us where the mount saw 10: 30 us of each wait is in them.
        pace.request(40_000);
        pace.request(40_000);
        assert_eq!(pace.wait_ns(100_000), 70_000);
        // A wait that ended 20 us late makes the next one shorter, once.
        pace.waited(100_000, 90_000);
        assert_eq!(pace.wait_ns(100_000), 50_000);
        pace.waited(100_000, 50_000);
        assert_eq!(pace.wait_ns(100_000), 70_000);
        // Faster requests than traced take nothing off; a short gap waits nothing.
        pace.request(0);
        pace.request(0);
        pace.request(0);
        pace.request(0);
        pace.request(0);
        pace.request(0);
        assert_eq!(pace.wait_ns(100_000), 100_000);
        pace.waited(100_000, 400_000);
        assert_eq!(pace.wait_ns(200_000), 0);
    }

    #[test]
    fn a_model_without_bins_waits_its_distance() {
        let p = phase(Vec::new(), 0, 5_000);
        let mut g = Gaps::new(&p, 0);
        assert_eq!([g.next_ns(), g.next_ns(), g.next_ns()], [0, 5_000, 5_000]);
        assert_eq!(Gaps::longest_ns(&p), 5_000);
    }
}
