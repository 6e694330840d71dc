//! The node's event feed. Every event gets the next sequence number and
//! the newest `KEEP` are kept, so a consumer that handled `seq` asks for
//! what came after it and misses nothing across a gap (a reconnect, a
//! control plane that restarted). Numbers start from the boot clock, so
//! they keep growing across node restarts on one boot.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures_util::stream::BoxStream;
use tokio::sync::watch;
use warren_core::sync::lock;
use warren_node_api::{NodeEvent, Sequenced};

/// Events kept for consumers that fall behind.
const KEEP: usize = 65536;

pub struct Feed {
    kept: Mutex<VecDeque<Sequenced>>,
    /// The newest sequence number handed out.
    last: watch::Sender<u64>,
}

impl Feed {
    pub fn new(first: u64) -> Feed {
        Feed {
            kept: Mutex::new(VecDeque::new()),
            last: watch::Sender::new(first.saturating_sub(1)),
        }
    }

    pub fn push(&self, event: NodeEvent) -> u64 {
        let mut kept = lock(&self.kept);
        let seq = *self.last.borrow() + 1;
        kept.push_back(Sequenced { seq, event });
        if kept.len() > KEEP {
            kept.pop_front();
        }
        self.last.send_replace(seq);
        seq
    }

    /// The kept events after `since`.
    pub fn after(&self, since: u64) -> Vec<Sequenced> {
        let kept = lock(&self.kept);
        // Sequence numbers are consecutive, so the start is an offset.
        let first = kept.front().map_or(0, |e| e.seq);
        let skip = since.saturating_add(1).saturating_sub(first) as usize;
        kept.iter().skip(skip).cloned().collect()
    }

    /// Events after `since`, then new ones as they come; never ends.
    pub fn subscribe(self: &Arc<Self>, since: u64) -> BoxStream<'static, Sequenced> {
        let feed = self.clone();
        let rx = self.last.subscribe();
        let state = (VecDeque::<Sequenced>::new(), since, rx);
        Box::pin(futures_util::stream::unfold(
            state,
            move |(mut pending, mut seen, mut rx)| {
                let feed = feed.clone();
                async move {
                    loop {
                        if let Some(ev) = pending.pop_front() {
                            seen = ev.seq;
                            return Some((ev, (pending, seen, rx)));
                        }
                        // Marked seen before reading, so a push in between
                        // wakes the wait below.
                        rx.borrow_and_update();
                        pending.extend(feed.after(seen));
                        if pending.is_empty() && rx.changed().await.is_err() {
                            return None;
                        }
                    }
                }
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn ev(n: u64) -> NodeEvent {
        NodeEvent::CpuSaturated { busy: n as f64 }
    }

    #[tokio::test]
    async fn a_subscriber_gets_what_came_after_its_mark_then_what_comes() {
        let feed = Arc::new(Feed::new(100));
        for n in 0..5 {
            feed.push(ev(n));
        }
        assert_eq!(feed.after(0).len(), 5);
        assert_eq!(
            feed.after(102).iter().map(|e| e.seq).collect::<Vec<_>>(),
            [103, 104]
        );
        let mut s = feed.subscribe(102);
        assert_eq!(s.next().await.map(|e| e.seq), Some(103));
        assert_eq!(s.next().await.map(|e| e.seq), Some(104));
        let f = feed.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            f.push(ev(9));
        });
        let next = tokio::time::timeout(std::time::Duration::from_secs(2), s.next())
            .await
            .expect("woken by the push");
        assert_eq!(next.map(|e| e.seq), Some(105));
    }
}
