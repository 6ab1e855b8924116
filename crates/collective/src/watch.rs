//! Is every writer we wait for alive? Each touches its `w<rank>.alive` every second; a
//! watcher takes one whose file has not changed for `timeout` of the watcher's own clock for
//! dead (so clocks of different nodes need not agree). A writer that leaves says so itself
//! (`w<rank>.abort`, read where the directory is watched).

use crate::dir::Listing;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tessera_client::Timespec;

/// How often a writer touches its heartbeat file.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

pub struct Watch {
    timeout: Duration,
    join_timeout: Duration,
    since: Instant,
    /// Each writer's heartbeat as last seen, and when it was first seen so.
    seen: BTreeMap<u32, (Timespec, Instant)>,
}

impl Watch {
    pub fn new(timeout: Duration, join_timeout: Duration, now: Instant) -> Self {
        Self {
            timeout,
            join_timeout,
            since: now,
            seen: BTreeMap::new(),
        }
    }

    /// Why the writers `waiting` for (by rank) will not get there, if one of them will not.
    pub fn check(
        &mut self,
        listing: &Listing,
        waiting: impl IntoIterator<Item = u32>,
        now: Instant,
    ) -> Option<String> {
        for rank in waiting {
            match listing.alive.get(&rank) {
                Some(&beat) => {
                    let (last, at) = self.seen.entry(rank).or_insert((beat, now));
                    if *last != beat {
                        *last = beat;
                        *at = now;
                    } else if now.duration_since(*at) > self.timeout {
                        return Some(format!(
                            "writer {rank} stopped: no heartbeat for {:?} (it died or hangs)",
                            self.timeout
                        ));
                    }
                }
                None if now.duration_since(self.since) > self.join_timeout => {
                    return Some(format!(
                        "writer {rank} never joined (waited {:?})",
                        self.join_timeout
                    ));
                }
                None => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(beats: &[(u32, i64)]) -> Listing {
        Listing {
            alive: beats
                .iter()
                .map(|&(r, s)| (r, Timespec { secs: s, nanos: 0 }))
                .collect(),
            ..Listing::default()
        }
    }

    #[test]
    fn a_heartbeat_that_stops_is_a_dead_writer() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = Watch::new(s(5), s(60), t0);
        assert_eq!(w.check(&listing(&[(0, 1), (1, 1)]), [0, 1], t0), None);
        // Writer 0 beats on, writer 1 stops.
        assert_eq!(
            w.check(&listing(&[(0, 2), (1, 1)]), [0, 1], t0 + s(3)),
            None
        );
        assert_eq!(
            w.check(&listing(&[(0, 7), (1, 1)]), [0, 1], t0 + s(5)),
            None
        );
        let why = w
            .check(&listing(&[(0, 8), (1, 1)]), [0, 1], t0 + s(6))
            .unwrap();
        assert!(why.contains("writer 1 stopped"), "{why}");
        // Only those waited for count.
        assert_eq!(w.check(&listing(&[(0, 9), (1, 1)]), [0], t0 + s(7)), None);
    }

    #[test]
    fn a_writer_that_never_joins_is_named() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = Watch::new(s(5), s(60), t0);
        assert_eq!(w.check(&listing(&[]), [2], t0 + s(59)), None);
        assert!(w
            .check(&listing(&[]), [2], t0 + s(61))
            .unwrap()
            .contains("writer 2 never joined"));
    }
}
