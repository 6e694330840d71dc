//! The daemon's own life: recovering after a start (the API waits for it,
//! `/healthz` does not), and stopping (creates refused, streams ended).

use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use warren_core::{ApiError, ErrorCode};

pub struct Lifecycle {
    /// (sandboxes recovered, sandboxes to recover, done)
    progress: watch::Sender<(usize, usize, bool)>,
    stopping: CancellationToken,
    /// Creates under way, whose record may not be written yet: a clean
    /// stop lists the sandboxes it destroys only once these are done.
    creates: watch::Sender<usize>,
}

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle {
            progress: watch::Sender::new((0, 0, false)),
            stopping: CancellationToken::new(),
            creates: watch::Sender::new(0),
        }
    }
}

/// How long an API call waits for recovery before it is told to retry.
const READY_WAIT: Duration = Duration::from_secs(60);

impl Lifecycle {
    pub fn recovering(&self, done: usize, total: usize) {
        self.progress.send_replace((done, total, false));
    }

    pub fn set_ready(&self) {
        self.progress.send_modify(|p| p.2 = true);
    }

    pub fn is_ready(&self) -> bool {
        self.progress.borrow().2
    }

    /// `ok`, or what recovery is doing.
    pub fn status(&self) -> String {
        let (done, total, ready) = *self.progress.borrow();
        if ready {
            "ok".into()
        } else {
            format!("recovering: {done} of {total} sandboxes taken over")
        }
    }

    /// Waits until recovery is over; how many open records it went through.
    pub async fn recovered(&self) -> usize {
        let mut rx = self.progress.subscribe();
        let total = match rx.wait_for(|p| p.2).await {
            Ok(p) => p.1,
            Err(_) => 0,
        };
        total
    }

    /// Waits until recovery is over; an error (503) when it takes too long.
    pub async fn wait_ready(&self) -> Result<(), ApiError> {
        let mut rx = self.progress.subscribe();
        let ready = tokio::time::timeout(READY_WAIT, rx.wait_for(|p| p.2))
            .await
            .is_ok_and(|r| r.is_ok());
        if ready {
            Ok(())
        } else {
            Err(self.unavailable(format!(
                "the daemon is still {}; retry shortly",
                self.status()
            )))
        }
    }

    /// Begins a stop: creates are refused and streams end.
    pub fn stop(&self) {
        self.stopping.cancel();
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.is_cancelled()
    }

    /// Completes when the daemon begins to stop.
    pub fn stopped(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.stopping.clone().cancelled_owned()
    }

    /// Counts a create that is about to make a sandbox until the guard
    /// drops; refused once the daemon is stopping. Counted first and
    /// checked second, so a stop either sees it counted or it sees the stop.
    pub fn begin_create(&self) -> Result<CreateUnderWay<'_>, ApiError> {
        self.creates.send_modify(|n| *n += 1);
        let under_way = CreateUnderWay(&self.creates);
        self.refuse_if_stopping()?;
        Ok(under_way)
    }

    /// Waits, at most `limit`, until no create is under way; false if one
    /// still is.
    pub async fn creates_done(&self, limit: Duration) -> bool {
        let mut rx = self.creates.subscribe();
        tokio::time::timeout(limit, rx.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    pub fn refuse_if_stopping(&self) -> Result<(), ApiError> {
        if self.is_stopping() {
            return Err(self
                .unavailable("the daemon is shutting down; no new sandboxes are started".into()));
        }
        Ok(())
    }

    fn unavailable(&self, message: String) -> ApiError {
        ApiError {
            code: ErrorCode::Unavailable,
            message,
            retry_after_ms: Some(1000),
        }
    }
}

/// A create counted by [`Lifecycle::begin_create`].
pub struct CreateUnderWay<'a>(&'a watch::Sender<usize>);

impl Drop for CreateUnderWay<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}
