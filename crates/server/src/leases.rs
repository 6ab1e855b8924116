//! Client leases on open handles, as NFSv4 and CephFS keep them: every open handle is counted
//! under its client's lease number (`Opens`), clients renew their lease at the servers of their
//! open files ([`Op::LeaseRenew`], an open or close counts too), and the primary of a partition
//! drops the handles of a holder it has not heard from for a lease period ([`Op::InodeRevoke`],
//! replicated as any change), so a client that died no longer keeps unlinked files alive.
//!
//! Pure: the caller gives the clock. A holder is given a whole period from the later of its
//! last renewal here and the moment this node became the partition's primary: a mirror that
//! takes over, or a node given a copy, may not have heard every renewal.
//!
//! [`Op::LeaseRenew`]: tessera_proto::Op::LeaseRenew
//! [`Op::InodeRevoke`]: tessera_proto::Op::InodeRevoke

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;
// tokio's clock, which a simulation pauses and advances (the caller gives it).
use tokio::time::Instant;

/// Holders remembered as expired, so that a late renewal learns its handles were let go.
const EXPIRED_MAX: usize = 4096;

pub(crate) struct Leases {
    period: Duration,
    /// When each holder last renewed here (or opened, or closed).
    renewed: HashMap<u64, Instant>,
    /// Holders whose handles were let go, oldest first, at most [`EXPIRED_MAX`].
    expired: VecDeque<u64>,
    expired_set: HashSet<u64>,
}

impl Leases {
    pub(crate) fn new(period: Duration) -> Self {
        Self {
            period,
            renewed: HashMap::new(),
            expired: VecDeque::new(),
            expired_set: HashSet::new(),
        }
    }

    pub(crate) fn period(&self) -> Duration {
        self.period
    }

    /// `holder` opened, closed or renewed at `now`.
    pub(crate) fn renew(&mut self, holder: u64, now: Instant) {
        let at = self.renewed.entry(holder).or_insert(now);
        *at = (*at).max(now);
    }

    /// Did this node let `holder`'s handles go?
    pub(crate) fn was_expired(&self, holder: u64) -> bool {
        self.expired_set.contains(&holder)
    }

    /// Has `holder`, which has handles open in a partition this node is primary of since
    /// `since`, outlived its lease at `now`? A holder never heard of here counts from now on.
    pub(crate) fn is_expired(&mut self, holder: u64, since: Instant, now: Instant) -> bool {
        let renewed = *self.renewed.entry(holder).or_insert(now);
        now.saturating_duration_since(renewed.max(since)) >= self.period
    }

    /// `holder`'s handles were let go: remembered (a bounded while) to tell it when it renews.
    pub(crate) fn expire(&mut self, holder: u64) {
        self.renewed.remove(&holder);
        if self.expired_set.insert(holder) {
            self.expired.push_back(holder);
            if self.expired.len() > EXPIRED_MAX {
                if let Some(old) = self.expired.pop_front() {
                    self.expired_set.remove(&old);
                }
            }
        }
    }

    /// Forgets the renewals of holders with no handle open here (`holding`) that are a period
    /// old: they would count from their next open or renewal anyway.
    pub(crate) fn prune(&mut self, holding: &HashSet<u64>, now: Instant) {
        let period = self.period;
        self.renewed
            .retain(|h, at| holding.contains(h) || now.saturating_duration_since(*at) < period);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_secs(30);

    #[test]
    fn a_holder_expires_a_period_after_its_last_renewal() {
        let mut l = Leases::new(PERIOD);
        let t0 = Instant::now();
        l.renew(1, t0);
        assert!(!l.is_expired(1, t0, t0 + PERIOD / 2));
        l.renew(1, t0 + PERIOD / 2);
        assert!(!l.is_expired(1, t0, t0 + PERIOD));
        assert!(l.is_expired(1, t0, t0 + PERIOD / 2 + PERIOD));
        l.renew(1, t0);
        assert!(
            l.is_expired(1, t0, t0 + PERIOD / 2 + PERIOD),
            "an older renewal heard late changes nothing"
        );
    }

    #[test]
    fn a_holder_unknown_here_or_on_a_new_primary_gets_a_whole_period() {
        let mut l = Leases::new(PERIOD);
        let t0 = Instant::now();
        assert!(!l.is_expired(2, t0, t0 + PERIOD * 5), "first seen now");
        assert!(!l.is_expired(2, t0, t0 + PERIOD * 5 + PERIOD / 2));
        assert!(l.is_expired(2, t0, t0 + PERIOD * 6));
        l.renew(3, t0);
        let promoted = t0 + PERIOD * 2;
        assert!(!l.is_expired(3, promoted, promoted + PERIOD / 2));
        assert!(l.is_expired(3, promoted, promoted + PERIOD));
    }

    #[test]
    fn expired_holders_are_remembered_boundedly_and_renewals_pruned() {
        let mut l = Leases::new(PERIOD);
        let t0 = Instant::now();
        l.renew(1, t0);
        l.expire(1);
        assert!(l.was_expired(1));
        assert!(!l.was_expired(2));
        for h in 10..10 + EXPIRED_MAX as u64 {
            l.expire(h);
        }
        assert!(!l.was_expired(1), "the oldest is forgotten past the bound");
        assert!(l.was_expired(10 + EXPIRED_MAX as u64 - 1));
        assert_eq!(l.expired.len(), EXPIRED_MAX);
        l.renew(5, t0);
        l.renew(6, t0);
        l.renew(7, t0 + PERIOD);
        l.prune(&HashSet::from([6]), t0 + PERIOD + PERIOD / 2);
        let mut kept: Vec<_> = l.renewed.keys().copied().collect();
        kept.sort_unstable();
        assert_eq!(kept, vec![6, 7]);
    }
}
