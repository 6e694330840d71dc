//! Watches each sandbox's init through a pidfd: when it dies unexpectedly
//! (killed, OOM) the node reports it instead of leaving a zombie record.

use std::sync::Arc;

use rustix::process::{pidfd_open, waitid, Pid, PidfdFlags, WaitId, WaitIdOptions};
use std::os::fd::AsFd;

use tokio::io::unix::AsyncFd;

use crate::Node;

pub fn watch_init(node: Arc<Node>, id: String, raw: i32) {
    let Some(pid) = Pid::from_raw(raw) else {
        return;
    };
    let Ok(fd) = pidfd_open(pid, PidfdFlags::empty()) else {
        node.init_died(&id, raw);
        return;
    };
    tokio::spawn(async move {
        // SAFETY: the AsyncFd owns the pidfd (an OwnedFd), so the descriptor
        // stays open and unchanged for the AsyncFd's whole life.
        let Ok(afd) = (unsafe { AsyncFd::register(fd) }) else {
            return;
        };
        if afd.readable().await.is_ok() {
            // We are the sandboxes' subreaper, so reap our child here. When
            // init is not our child (adopted after a restart) this is ECHILD.
            let _ = waitid(
                WaitId::PidFd(afd.get_ref().as_fd()),
                WaitIdOptions::EXITED | WaitIdOptions::NOHANG,
            );
            node.init_died(&id, raw);
        }
    });
}
