//! Finding the cluster in the command line's order (docs/CLI.md, "Finding the cluster"):
//! arguments, then `TESSERA_MANAGER` / `TESSERA_SECRET`, then the configuration file named by
//! the `config` argument or `TESSERA_CONFIG`, then the cluster file `tessera up` writes
//! (`$TESSERA_HOME/cluster.toml`, by default `~/.tessera/cluster.toml`).
//!
//! Only `manager` and `secret` are read here; the command line checks the rest of the file.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("bad configuration in {path}: {msg}")]
    Parse { path: String, msg: String },
    #[error(
        "no {what}: pass manager=/secret=, set TESSERA_MANAGER/TESSERA_SECRET, name a config \
         file with config= or TESSERA_CONFIG, or start a local cluster with `tessera up` \
         (it writes {file})"
    )]
    Missing { what: &'static str, file: String },
    #[error("bad manager address {0:?} (expected HOST:PORT)")]
    Addr(String),
}

/// The two keys a client needs; other keys of the file are left to the command line.
#[derive(Debug, Default, serde::Deserialize)]
struct Endpoint {
    manager: Option<String>,
    secret: Option<String>,
}

/// `$TESSERA_HOME`, or `~/.tessera` (as the command line).
#[must_use]
pub fn home() -> PathBuf {
    match std::env::var_os("TESSERA_HOME") {
        Some(h) => PathBuf::from(h),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
            .join(".tessera"),
    }
}

/// Where `tessera up` leaves the address and secret of the cluster it runs.
#[must_use]
pub fn cluster_file() -> PathBuf {
    home().join("cluster.toml")
}

fn read(path: &Path) -> Result<Endpoint, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse {
        path: path.display().to_string(),
        msg: e.to_string(),
    })
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The manager address and secret to use: arguments > environment > explicit config file
/// (which must exist) > cluster file.
pub fn resolve(
    manager: Option<String>,
    secret: Option<String>,
    config: Option<PathBuf>,
) -> Result<(SocketAddr, String), ConfigError> {
    let mut manager = manager.or_else(|| env("TESSERA_MANAGER"));
    let mut secret = secret.or_else(|| env("TESSERA_SECRET"));
    let explicit = config.or_else(|| env("TESSERA_CONFIG").map(PathBuf::from));
    if manager.is_none() || secret.is_none() {
        let mut files = Vec::new();
        if let Some(p) = explicit {
            files.push(read(&p)?);
        }
        let cluster = cluster_file();
        if cluster.exists() {
            files.push(read(&cluster)?);
        }
        for f in files {
            manager = manager.or(f.manager);
            secret = secret.or(f.secret);
        }
    }
    let missing = |what| ConfigError::Missing {
        what,
        file: cluster_file().display().to_string(),
    };
    let manager = manager.ok_or_else(|| missing("manager address"))?;
    let secret = secret.ok_or_else(|| missing("cluster secret"))?;
    let addr = manager
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| ConfigError::Addr(manager.clone()))?;
    Ok((addr, secret))
}
