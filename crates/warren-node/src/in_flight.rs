//! Creates under way, by sandbox id. A destroy of a sandbox that is still
//! being made waits for its create to end and then removes what it made:
//! otherwise the two race, and the create finishes a sandbox nobody holds
//! a record of (a control plane that gave up on a create, or a new leader
//! finishing an old one's interrupted create, asks for exactly that).

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;
use warren_core::sync::lock;

#[derive(Default)]
pub(crate) struct InFlight(Mutex<HashMap<String, watch::Sender<()>>>);

/// One create under way; it ends when this is dropped.
pub(crate) struct Making<'a> {
    set: &'a InFlight,
    id: String,
}

impl InFlight {
    /// Marks a create of `id` as under way; None when one already is.
    pub(crate) fn begin(&self, id: &str) -> Option<Making<'_>> {
        let mut map = lock(&self.0);
        if map.contains_key(id) {
            return None;
        }
        map.insert(id.to_string(), watch::Sender::new(()));
        Some(Making {
            set: self,
            id: id.to_string(),
        })
    }

    /// Returns once no create of `id` is under way.
    pub(crate) async fn settled(&self, id: &str) {
        let under_way = lock(&self.0).get(id).map(watch::Sender::subscribe);
        if let Some(mut rx) = under_way {
            // Dropping the sender (the create's end) is the only change.
            let _ = rx.changed().await;
        }
    }
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        lock(&self.set.0).remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_destroy_waits_for_the_create_of_the_same_id_only() {
        let set = Arc::new(InFlight::default());
        let making = set.begin("a").expect("first create");
        assert!(set.begin("a").is_none(), "a second create of the same id");
        tokio::time::timeout(Duration::from_secs(1), set.settled("b"))
            .await
            .expect("nothing under way for b");
        let waiter = tokio::spawn({
            let set = set.clone();
            async move { set.settled("a").await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "settled before the create ended");
        drop(making);
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("settled once the create ended")
            .expect("join");
        assert!(set.begin("a").is_some(), "the id is free again");
    }
}
