//! A small pool of spawner processes, so creates on different cores do not
//! queue behind each other.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use crate::proto::SpawnerRequest;
use crate::spawner::{Created, SpawnerClient};
use crate::RuntimeError;
use warren_core::sync::lock;

pub struct SpawnerPool {
    exe: PathBuf,
    args: Vec<String>,
    idle: Arc<Mutex<Vec<SpawnerClient>>>,
    permits: Arc<Semaphore>,
}

impl SpawnerPool {
    pub fn new(exe: &Path, args: &[String], size: usize) -> Result<SpawnerPool, RuntimeError> {
        let mut idle = Vec::with_capacity(size);
        for _ in 0..size {
            idle.push(SpawnerClient::start(exe, args)?);
        }
        Ok(SpawnerPool {
            exe: exe.to_path_buf(),
            args: args.to_vec(),
            idle: Arc::new(Mutex::new(idle)),
            permits: Arc::new(Semaphore::new(size)),
        })
    }

    /// Stops every idle spawner and waits for each to exit: a spawner reaps
    /// the inits it started (its children) as it exits, so a node that
    /// stops after destroying its sandboxes leaves no zombie of one behind
    /// for the host's init to reap later. Creates are refused from now on.
    pub fn close(&self) {
        self.permits.close();
        let idle = std::mem::take(&mut *lock(&self.idle));
        // Each one's Drop closes its socket and waits for it.
        drop(idle);
    }

    /// The sandbox's init pid and the spawner's phases (name, microseconds).
    pub async fn create(&self, request: SpawnerRequest) -> Result<Created, RuntimeError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| RuntimeError::Create("spawner pool closed".into()))?;
        let idle = self.idle.clone();
        let (exe, args) = (self.exe.clone(), self.args.clone());
        tokio::task::spawn_blocking(move || {
            let taken = lock(&idle).pop();
            let mut client = match taken {
                Some(mut c) => {
                    if c.is_alive() {
                        c
                    } else {
                        SpawnerClient::start(&exe, &args)?
                    }
                }
                None => SpawnerClient::start(&exe, &args)?,
            };
            let result = client.create(&request);
            // A spawner that broke mid-request is replaced on next use.
            {
                let mut idle = lock(&idle);
                idle.push(client);
            }
            result
        })
        .await
        .map_err(RuntimeError::task("spawner task"))?
    }
}
