//! Warnings about what peers do, rate-limited: a flood of bad connections must not write a
//! log line each (thousands a second), nor a process out of file descriptors one per retry.
//!
//! ```text
//! static REFUSED: RateLimit = RateLimit::new("refused connections");
//! if REFUSED.hit() {
//!     warn!(%peer, "refused connection: {e}");
//! }
//! ```
//!
//! logs the first refusal of a period in full, and at the period's end, if more came:
//! `refused connections: 1999 more in the last 10 s`.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How often one kind of warning is logged in full.
pub const WARN_PERIOD: Duration = Duration::from_secs(10);

/// One kind of warning: the first event of a period is logged in full (`hit` says so), the
/// others only counted, and their count logged in one line when the period ends.
pub struct RateLimit {
    what: &'static str,
    period: Duration,
    state: Mutex<State>,
}

struct State {
    /// When the current period began (with the event logged in full).
    began: Option<Instant>,
    /// Events of this period not logged.
    held: u64,
    /// A task will log `held` at the period's end.
    summing: bool,
}

impl RateLimit {
    /// `what` names the events in the summary line ("refused connections").
    #[must_use]
    pub const fn new(what: &'static str) -> Self {
        Self::with_period(what, WARN_PERIOD)
    }

    #[must_use]
    pub const fn with_period(what: &'static str, period: Duration) -> Self {
        Self {
            what,
            period,
            state: Mutex::new(State {
                began: None,
                held: 0,
                summing: false,
            }),
        }
    }

    /// Counts one event; true if the caller should log it in full now.
    pub fn hit(&'static self) -> bool {
        let now = Instant::now();
        let mut s = self.lock();
        if s.began.is_none_or(|b| now.duration_since(b) >= self.period) {
            // Held events not summed up yet (no runtime to run the summing task).
            self.log_held(&mut s, now);
            s.began = Some(now);
            return true;
        }
        s.held += 1;
        if !s.summing {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                s.summing = true;
                let end = s.began.map_or(now, |b| b + self.period);
                rt.spawn(async move {
                    tokio::time::sleep_until(end).await;
                    let mut s = self.lock();
                    s.summing = false;
                    self.log_held(&mut s, Instant::now());
                });
            }
        }
        false
    }

    fn log_held(&self, s: &mut State, now: Instant) {
        let held = std::mem::take(&mut s.held);
        if let (Some(began), true) = (s.began, held > 0) {
            let secs = now.duration_since(began).as_secs_f64().round();
            tracing::warn!("{}: {held} more in the last {secs} s", self.what);
        }
    }

    /// Events counted but not logged yet.
    #[cfg(test)]
    fn held(&self) -> u64 {
        self.lock().held
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the counts inconsistent.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_event_per_period_is_logged_and_the_rest_counted() {
        static LIMIT: RateLimit = RateLimit::new("test events");
        assert!(LIMIT.hit(), "the first event is logged");
        for _ in 0..1999 {
            assert!(!LIMIT.hit(), "the rest of the period is counted");
        }
        assert_eq!(LIMIT.held(), 1999);
        // The period ends: the count is logged (and reset) without another event.
        tokio::time::sleep(WARN_PERIOD + Duration::from_millis(1)).await;
        assert_eq!(LIMIT.held(), 0);
        assert!(LIMIT.hit(), "a new period logs its first event");
        assert!(!LIMIT.hit());
        tokio::time::sleep(WARN_PERIOD / 2).await;
        assert!(!LIMIT.hit(), "still the same period");
        assert_eq!(LIMIT.held(), 2);
        tokio::time::sleep(WARN_PERIOD).await;
        assert_eq!(LIMIT.held(), 0);
    }

    #[test]
    fn without_a_runtime_the_count_waits_for_the_next_period() {
        static LIMIT: RateLimit = RateLimit::with_period("test events", Duration::from_millis(50));
        assert!(LIMIT.hit());
        assert!(!LIMIT.hit());
        assert!(!LIMIT.hit());
        assert_eq!(LIMIT.held(), 2);
        std::thread::sleep(Duration::from_millis(60));
        assert!(LIMIT.hit(), "the next period's first event is logged");
        assert_eq!(LIMIT.held(), 0, "with the count of the period before");
    }
}
