//! A writer's one buffer being written in the background (a run spilled, records placed): at
//! most one task at a time, whose result (the buffer given back) `wait` takes.

use crate::{Error, Result};
use std::future::Future;
use tokio::task::JoinHandle;

pub(crate) struct InFlight<T> {
    task: Option<JoinHandle<Result<T>>>,
    /// What the task does, for the error if it panics or is cancelled.
    what: &'static str,
}

impl<T: Send + 'static> InFlight<T> {
    pub fn new(what: &'static str) -> Self {
        Self { task: None, what }
    }

    /// Starts `work`; the caller waited for the task before.
    pub fn start(&mut self, work: impl Future<Output = Result<T>> + Send + 'static) {
        debug_assert!(self.task.is_none(), "{} twice at once", self.what);
        self.task = Some(tokio::spawn(work));
    }

    /// The task's result once it ends; `None` if none was in flight.
    pub async fn wait(&mut self) -> Result<Option<T>> {
        let Some(task) = self.task.take() else {
            return Ok(None);
        };
        let done = task
            .await
            .map_err(|e| Error::Failed(format!("{}: {e}", self.what)))??;
        Ok(Some(done))
    }

    /// Nothing in flight, or it has ended.
    pub fn test(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    pub fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}
