//! A sandbox's lifetime: its maximum age (TTL) and an optional heartbeat
//! lease. Both run on the monotonic clock, so stepping the wall clock neither
//! kills a sandbox early nor keeps one alive. The node reports an expiry
//! to the control plane, which destroys or holds the sandbox as its reclaim
//! policy says; one nobody answered within [`ACT_ALONE_AFTER`] (a control
//! plane cut off, stopped or failing) the node acts on alone, so lifetimes
//! hold through a partition.

use std::time::Duration;

use tokio::time::Instant;
use warren_core::state::reason;

/// Milliseconds on CLOCK_BOOTTIME: monotonic, counts suspend, shared by
/// every process on the host, so a restarted daemon can resume deadlines.
pub fn boot_ms() -> i64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    t.tv_sec * 1000 + t.tv_nsec / 1_000_000
}

/// How long an expiry may go unanswered before the node acts on it alone:
/// the time after which the control plane calls a silent node unreachable.
pub const ACT_ALONE_AFTER: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct Lifetime {
    ttl_at: Instant,
    lease: Option<Duration>,
    lease_at: Option<Instant>,
    /// When an expiry was reported, and why (it is reported once).
    fired: Option<(Instant, &'static str)>,
    /// Whether the node has acted on that expiry on its own.
    acted: bool,
}

impl Lifetime {
    pub fn new(ttl: Duration, lease: Option<Duration>) -> Lifetime {
        let now = Instant::now();
        Lifetime {
            ttl_at: now + ttl,
            lease,
            lease_at: lease.map(|l| now + l),
            fired: None,
            acted: false,
        }
    }

    /// A heartbeat (or any API call on the sandbox) renews the lease.
    pub fn renew(&mut self) {
        if let Some(lease) = self.lease {
            self.lease_at = Some(Instant::now() + lease);
        }
    }

    /// The sandbox may live `ttl` from now.
    pub fn set_ttl(&mut self, ttl: Duration) {
        self.ttl_at = Instant::now() + ttl;
        self.fired = None;
        self.acted = false;
    }

    /// A fresh lifetime with no lease, e.g. for a kept sandbox's expiry.
    pub fn restart(&mut self, ttl: Duration) {
        *self = Lifetime::new(ttl, None);
    }

    pub fn ttl_remaining(&self) -> Duration {
        self.ttl_at.saturating_duration_since(Instant::now())
    }

    pub fn lease_remaining(&self) -> Option<Duration> {
        self.lease_at
            .map(|at| at.saturating_duration_since(Instant::now()))
    }

    /// The reason this lifetime is over, the first time it is asked after it ended.
    pub fn take_expiry(&mut self, now: Instant) -> Option<&'static str> {
        if self.fired.is_some() {
            return None;
        }
        let why = if now >= self.ttl_at {
            reason::TTL_EXPIRED
        } else if self.lease_at.is_some_and(|at| now >= at) {
            reason::LEASE_EXPIRED
        } else {
            return None;
        };
        self.fired = Some((now, why));
        Some(why)
    }

    /// The reason of an expiry reported at least `grace` ago that nobody
    /// answered (the control plane would have destroyed or held the
    /// sandbox, which ends or restarts this lifetime): the node then acts
    /// on it alone, once.
    pub fn take_unanswered(&mut self, now: Instant, grace: Duration) -> Option<&'static str> {
        match self.fired {
            Some((at, why)) if !self.acted && now >= at + grace => {
                self.acted = true;
                Some(why)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn ttl_and_lease_fire_once_and_renew_postpones() {
        let mut l = Lifetime::new(Duration::from_secs(10), Some(Duration::from_secs(3)));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(l.take_expiry(Instant::now()), None);
        l.renew();
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(l.take_expiry(Instant::now()), None);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(l.take_expiry(Instant::now()), Some(reason::LEASE_EXPIRED));
        assert_eq!(l.take_expiry(Instant::now()), None);
        let mut t = Lifetime::new(Duration::from_secs(5), None);
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(t.take_expiry(Instant::now()), Some(reason::TTL_EXPIRED));
        t.set_ttl(Duration::from_secs(1));
        assert_eq!(t.take_expiry(Instant::now()), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_expiry_is_the_nodes_to_act_on_once() {
        let grace = Duration::from_secs(5);
        let mut l = Lifetime::new(Duration::from_secs(1), None);
        assert_eq!(
            l.take_unanswered(Instant::now(), grace),
            None,
            "not expired"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(l.take_expiry(Instant::now()), Some(reason::TTL_EXPIRED));
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(
            l.take_unanswered(Instant::now(), grace),
            None,
            "within the grace"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            l.take_unanswered(Instant::now(), grace),
            Some(reason::TTL_EXPIRED)
        );
        assert_eq!(l.take_unanswered(Instant::now(), grace), None, "once");
        // Answered (a hold restarts the lifetime): nothing to act on.
        l.restart(Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(l.take_unanswered(Instant::now(), grace), None);
    }
}
