//! Batch calls: many jobs run as tasks on the runtime at once, and their outcomes handed
//! back to Python item by item.

use crate::error::to_py;
use crate::runtime;
use futures::stream::{self, StreamExt};
use pyo3::prelude::*;
use pyo3::types::PyList;
use tessera_client::Error;

/// Runs `jobs` as tasks on the runtime, `concurrency` at a time (each on any worker thread, so
/// a batch uses every core); the results come back in the order of `jobs`.
pub(crate) fn run_all<T, F>(
    jobs: impl Iterator<Item = F>,
    concurrency: usize,
) -> Vec<Result<T, Error>>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T, Error>> + Send + 'static,
{
    let tasks = jobs.map(|job| {
        let task = runtime().spawn(job);
        async move {
            task.await
                .unwrap_or_else(|e| Err(Error::Unavailable(format!("task failed: {e}"))))
        }
    });
    runtime().block_on(stream::iter(tasks).buffered(concurrency.max(1)).collect())
}

/// A `None` or the exception of every item of a batch, in order.
pub(crate) fn outcomes<'py>(
    py: Python<'py>,
    results: Vec<Result<(), Error>>,
    names: &[String],
) -> PyResult<Bound<'py, PyList>> {
    let items: Vec<Py<PyAny>> = results
        .into_iter()
        .zip(names)
        .map(|(r, n)| match r {
            Ok(()) => py.None(),
            Err(e) => to_py(&e, Some(n)).into_value(py).into_any(),
        })
        .collect();
    PyList::new(py, items)
}
