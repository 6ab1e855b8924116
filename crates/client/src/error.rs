use tessera_proto::{ErrorCode, RpcError};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of the client library. [`Error::errno`] gives the POSIX code a file system reports.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A file-system error answered by a server (ENOENT, EEXIST, ENOSPC, ...).
    #[error("{0}")]
    Fs(ErrorCode),
    /// A server or the manager could not be reached or stopped answering.
    #[error("{0}")]
    Unavailable(String),
    /// The cluster refused us (wrong secret, protocol version).
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Invalid(String),
    #[error("permission denied: {0}")]
    Permission(String),
    #[error("too many levels of symbolic links")]
    Loop,
    #[error("file handle is not open for {0}")]
    BadHandle(&'static str),
}

impl Error {
    #[must_use]
    pub fn errno(&self) -> i32 {
        match self {
            Self::Fs(c) => c.errno(),
            Self::Unavailable(_) => libc::EIO,
            Self::Refused(_) => libc::EACCES,
            Self::Invalid(_) => libc::EINVAL,
            Self::Permission(_) => libc::EPERM,
            Self::Loop => libc::ELOOP,
            Self::BadHandle(_) => libc::EBADF,
        }
    }

    /// Is this the server's `code`?
    #[must_use]
    pub fn is(&self, code: &ErrorCode) -> bool {
        matches!(self, Self::Fs(c) if std::mem::discriminant(c) == std::mem::discriminant(code))
    }

    pub(crate) fn not_found() -> Self {
        Self::Fs(ErrorCode::NotFound)
    }
}

impl From<ErrorCode> for Error {
    fn from(c: ErrorCode) -> Self {
        Self::Fs(c)
    }
}

impl From<RpcError> for Error {
    fn from(e: RpcError) -> Self {
        match e {
            RpcError::Auth { .. } | RpcError::Refused { .. } => Self::Refused(e.to_string()),
            RpcError::Encode(m) => Self::Invalid(m),
            _ => Self::Unavailable(e.to_string()),
        }
    }
}
