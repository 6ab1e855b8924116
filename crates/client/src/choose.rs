//! Which replica serves a read, and whether a read is split over two: pure functions of what
//! this client measured per node (CEFT-PVFS's "read from the least loaded mirror, skip a hot
//! spot", with the load measured where it is felt: in the client).

use std::time::Duration;

/// What the client knows about the node holding one replica.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct Load {
    /// Requests from this client to the node not answered yet.
    pub outstanding: u32,
    /// Recent service time (EWMA, microseconds per 64 KiB read); `None` when unknown (never
    /// measured, or not for a while): such a node is tried, which measures it again.
    pub latency: Option<f64>,
}

/// A replica whose latency is more than this many times the best replica's is a hot spot...
pub(crate) const HOT_FACTOR: f64 = 4.0;
/// ...provided it is also this many microseconds (per 64 KiB) slower: jitter on answers of a
/// few tens of microseconds is not a hot spot.
pub(crate) const HOT_MARGIN_US: f64 = 50.0;
/// Reads at least this long are split over two replicas when two are usable.
pub(crate) const SPLIT_MIN: u32 = 256 << 10;
/// Split points are multiples of this (page-aligned halves).
const SPLIT_ALIGN: u32 = 4 << 10;

/// The replicas (indices into `loads`) in the order to try them, and how many of the first are
/// usable: not hot spots. Usable ones come first, by fewest outstanding requests, then lowest
/// latency (unknown counts as lowest, so it gets measured), then list order (primary first);
/// hot spots follow in the same order, as a last resort when every usable replica failed.
pub(crate) fn rank(loads: &[Load]) -> (Vec<usize>, usize) {
    let best = loads
        .iter()
        .filter_map(|l| l.latency)
        .min_by(f64::total_cmp);
    let hot = |l: &Load| match (l.latency, best) {
        (Some(lat), Some(best)) => lat > best * HOT_FACTOR && lat > best + HOT_MARGIN_US,
        _ => false,
    };
    let mut order: Vec<usize> = (0..loads.len()).collect();
    order.sort_by(|&a, &b| {
        let (la, lb) = (&loads[a], &loads[b]);
        hot(la)
            .cmp(&hot(lb))
            .then(la.outstanding.cmp(&lb.outstanding))
            .then(
                la.latency
                    .unwrap_or(0.0)
                    .total_cmp(&lb.latency.unwrap_or(0.0)),
            )
            .then(a.cmp(&b))
    });
    let usable = loads.iter().filter(|l| !hot(l)).count();
    (order, usable)
}

/// Where to cut a read of `len` bytes between the two best replicas, or `None` to read it
/// from one. Only reads of at least [`SPLIT_MIN`] with two usable replicas that both have
/// nothing outstanding from this client are split: a lone large read then gets two servers at
/// once (CEFT-PVFS's double read parallelism), while a stream that keeps reads in flight
/// already has every server busy and would only pay twice the requests and the join's copy
/// (measured in BENCHMARKS.md). The cut is at the middle when the two are equally fast (or not
/// measured); otherwise each gets a share proportional to its speed, between 1/4 and 3/4, so
/// the two halves finish together instead of the joined read waiting on the slower replica.
pub(crate) fn split_at(len: u32, usable: usize, first: Load, second: Load) -> Option<u32> {
    if usable < 2 || len < SPLIT_MIN || first.outstanding > 0 || second.outstanding > 0 {
        return None;
    }
    let share = match (first.latency, second.latency) {
        (Some(a), Some(b)) if a + b > 0.0 => (b / (a + b)).clamp(0.25, 0.75),
        _ => 0.5,
    };
    let at = (f64::from(len) * share) as u32 / SPLIT_ALIGN * SPLIT_ALIGN;
    (at > 0 && at < len).then_some(at)
}

/// A read unanswered this many times longer than the best replica's recent service time
/// (for its length) is late: it is sent to another replica too ("hedged"), and whichever
/// answers first is used. Never sooner than [`HEDGE_MIN`]: queueing behind the client's own
/// read-ahead takes a few service times on a healthy node.
pub(crate) const HEDGE_FACTOR: f64 = 4.0;
pub(crate) const HEDGE_MIN: Duration = Duration::from_millis(2);
/// With no recent measurement of any replica, a read is late after this.
pub(crate) const HEDGE_UNKNOWN: Duration = Duration::from_millis(20);

/// When a read of `len` bytes becomes late, given the best replica's latency (microseconds per
/// [`LATENCY_UNIT`](crate::route) bytes, the unit [`Load::latency`] is in).
pub(crate) fn hedge_after(len: u32, best: Option<f64>, unit: u32) -> Duration {
    let Some(best) = best else {
        return HEDGE_UNKNOWN;
    };
    let units = f64::from(len.max(unit)) / f64::from(unit.max(1));
    Duration::try_from_secs_f64(best * units * HEDGE_FACTOR / 1e6)
        .unwrap_or(HEDGE_UNKNOWN)
        .max(HEDGE_MIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(outstanding: u32, latency: Option<f64>) -> Load {
        Load {
            outstanding,
            latency,
        }
    }

    #[test]
    fn least_outstanding_wins() {
        let loads = [
            load(3, Some(100.0)),
            load(1, Some(150.0)),
            load(2, Some(50.0)),
        ];
        assert_eq!(rank(&loads), (vec![1, 2, 0], 3));
    }

    #[test]
    fn latency_breaks_ties_then_list_order() {
        let loads = [
            load(1, Some(300.0)),
            load(1, Some(100.0)),
            load(1, Some(100.0)),
        ];
        assert_eq!(rank(&loads).0, vec![1, 2, 0]);
        // Unmeasured nodes are tried first, so they get measured.
        let loads = [load(0, Some(100.0)), load(0, None)];
        assert_eq!(rank(&loads), (vec![1, 0], 2));
        // All equal: the primary.
        assert_eq!(rank(&[load(0, None), load(0, None)]).0, vec![0, 1]);
    }

    #[test]
    fn hot_spot_is_skipped_while_another_is_usable() {
        // Node 0 is idle but 10x slower than node 1, which has requests queued.
        let loads = [load(0, Some(5_000.0)), load(4, Some(500.0))];
        assert_eq!(rank(&loads), (vec![1, 0], 1));
        // 3x slower is not a hot spot: the least outstanding wins.
        let loads = [load(0, Some(1_500.0)), load(4, Some(500.0))];
        assert_eq!(rank(&loads), (vec![0, 1], 2));
        // 5x, but only 40 µs slower: jitter, not a hot spot.
        let loads = [load(0, Some(50.0)), load(2, Some(10.0))];
        assert_eq!(rank(&loads).1, 2);
        // Two hot spots among three: the fast one first, the hot ones after it, least
        // outstanding first.
        let loads = [
            load(1, Some(8_000.0)),
            load(5, Some(1_000.0)),
            load(0, Some(9_000.0)),
        ];
        assert_eq!(rank(&loads), (vec![1, 2, 0], 1));
    }

    #[test]
    fn only_one_replica() {
        assert_eq!(rank(&[load(9, Some(1e6))]), (vec![0], 1));
        assert_eq!(rank(&[]), (vec![], 0));
        assert_eq!(split_at(1 << 20, 1, load(0, None), load(0, None)), None);
    }

    #[test]
    fn hedge_timing() {
        let unit = 64 << 10;
        assert_eq!(hedge_after(1 << 20, None, unit), HEDGE_UNKNOWN);
        // 100 us per 64 KiB: a 1 MiB read takes 1.6 ms; late after four times that.
        assert_eq!(
            hedge_after(1 << 20, Some(100.0), unit),
            Duration::from_micros(6400)
        );
        // Small or fast reads wait at least the floor.
        assert_eq!(hedge_after(4096, Some(10.0), unit), HEDGE_MIN);
    }

    #[test]
    fn split_decision() {
        let mib = 1 << 20;
        // Large enough with two usable replicas: halves when equally fast or unmeasured.
        assert_eq!(
            split_at(mib, 2, load(0, None), load(0, None)),
            Some(mib / 2)
        );
        assert_eq!(
            split_at(mib, 3, load(0, Some(200.0)), load(0, Some(200.0))),
            Some(mib / 2)
        );
        assert_eq!(
            split_at(SPLIT_MIN, 2, load(0, None), load(0, None)),
            Some(SPLIT_MIN / 2)
        );
        // Too small, or one usable replica: one piece.
        assert_eq!(
            split_at(SPLIT_MIN - 1, 2, load(0, None), load(0, None)),
            None
        );
        assert_eq!(split_at(mib, 1, load(0, None), load(0, None)), None);
        // A slower second replica gets the smaller share, at least a quarter, page-aligned.
        assert_eq!(
            split_at(mib, 2, load(0, Some(100.0)), load(0, Some(300.0))),
            Some(mib * 3 / 4)
        );
        assert_eq!(
            split_at(mib, 2, load(0, Some(100.0)), load(0, Some(10_000.0))),
            Some(mib * 3 / 4)
        );
        let at = split_at(mib, 2, load(0, Some(100.0)), load(0, Some(150.0))).unwrap();
        assert!(at.is_multiple_of(SPLIT_ALIGN));
        assert!(at > mib / 2 && at < mib * 3 / 4);
        // A replica already busy with this client's reads: no split.
        assert_eq!(split_at(mib, 2, load(1, None), load(0, None)), None);
        assert_eq!(split_at(mib, 2, load(0, None), load(3, None)), None);
        let odd = split_at(300_001, 2, load(0, None), load(0, None)).unwrap();
        assert!(odd.is_multiple_of(SPLIT_ALIGN) && odd > 0 && odd < 300_001);
    }
}
