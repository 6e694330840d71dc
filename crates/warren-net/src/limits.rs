//! Token buckets for the proxy's limits: new connections per second (a
//! non-blocking check) and bytes per second (awaited, so a busy tunnel is
//! slowed rather than cut). Hand-written: `governor` cannot await a byte
//! budget larger than its burst, and this is a dozen lines.

use std::sync::Mutex;
use std::time::{Duration, Instant};
use warren_core::sync::lock;

pub(crate) struct Bucket {
    rate: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    /// `rate` tokens per second, at most `burst` saved up.
    pub(crate) fn new(rate: f64, burst: f64) -> Bucket {
        Bucket {
            rate,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    fn refill(&self, s: &mut (f64, Instant)) {
        let now = Instant::now();
        s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * self.rate).min(self.burst);
        s.1 = now;
    }

    /// Takes one token if there is one.
    pub(crate) fn try_take(&self) -> bool {
        let mut s = lock(&self.state);
        self.refill(&mut s);
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }

    /// Takes `n` tokens, waiting as long as the debt takes to repay.
    pub(crate) async fn take(&self, n: usize) {
        let wait = {
            let mut s = lock(&self.state);
            self.refill(&mut s);
            s.0 -= n as f64;
            if s.0 < 0.0 {
                Duration::from_secs_f64(-s.0 / self.rate)
            } else {
                Duration::ZERO
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate() {
        let b = Bucket::new(10.0, 3.0);
        assert!(b.try_take() && b.try_take() && b.try_take());
        assert!(!b.try_take());
        std::thread::sleep(Duration::from_millis(120));
        assert!(b.try_take());
    }

    #[tokio::test]
    async fn byte_budgets_wait_off_their_debt() {
        let b = Bucket::new(1000.0, 100.0);
        let t = Instant::now();
        b.take(100).await;
        b.take(200).await;
        let waited = t.elapsed();
        assert!(waited >= Duration::from_millis(180), "{waited:?}");
    }
}
