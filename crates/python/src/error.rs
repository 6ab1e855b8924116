//! Client errors as Python's built-in exceptions: `OSError(errno, message, path)` lets Python
//! choose the subclass (FileNotFoundError, FileExistsError, IsADirectoryError,
//! NotADirectoryError, PermissionError...), and ENOSPC stays an `OSError` with `errno` set.

use pyo3::exceptions::{PyConnectionError, PyOSError, PyValueError};
use pyo3::PyErr;
use tessera_client::Error;

/// The Python exception for `e`, naming `path` when there is one.
pub fn to_py(e: &Error, path: Option<&str>) -> PyErr {
    match e {
        Error::Unavailable(m) => PyConnectionError::new_err(m.clone()),
        Error::BadHandle(_) => PyValueError::new_err(e.to_string()),
        _ => {
            let msg = match e {
                Error::Fs(_) => std::io::Error::from_raw_os_error(e.errno()).to_string(),
                _ => e.to_string(),
            };
            // "No such file or directory (os error 2)" -> "No such file or directory"
            let msg = match msg.find(" (os error") {
                Some(i) => msg[..i].to_string(),
                None => msg,
            };
            match path {
                Some(p) => PyOSError::new_err((e.errno(), msg, p.to_string())),
                None => PyOSError::new_err((e.errno(), msg)),
            }
        }
    }
}

/// `to_py` as a `map_err` argument.
pub fn at(path: &str) -> impl Fn(Error) -> PyErr + '_ {
    move |e| to_py(&e, Some(path))
}
