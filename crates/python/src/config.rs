//! Finding the cluster in the command line's order (docs/CLI.md, "Finding the cluster"):
//! arguments, then `TESSERA_MANAGER` / `TESSERA_SECRET`, then the configuration file named by
//! the `config` argument or `TESSERA_CONFIG`, then the cluster file `tessera up` writes
//! (`$TESSERA_HOME/cluster.toml`, by default `~/.tessera/cluster.toml`).
//!
//! Only `manager` and `secret` are read here; the command line checks the rest of the file.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
pub use tessera_client::config::cluster_file;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    File(#[from] tessera_client::config::ConfigError),
    #[error(
        "no {what}: pass manager=/secret=, set TESSERA_MANAGER/TESSERA_SECRET, name a config \
         file with config= or TESSERA_CONFIG, or start a local cluster with `tessera up` \
         (it writes {file})"
    )]
    Missing { what: &'static str, file: String },
    #[error("bad manager address {0:?} (expected HOST:PORT)")]
    Addr(String),
    #[error("bad seed server address {0:?} in the cluster file (expected IP:PORT)")]
    Seed(String),
}

/// The keys a client needs; other keys of the file are left to the command line.
#[derive(Debug, Default, serde::Deserialize)]
struct Endpoint {
    manager: Option<String>,
    secret: Option<String>,
    /// Servers to ask for the table while the manager is away.
    seeds: Option<Vec<String>>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where the cluster is.
pub struct Found {
    pub addr: SocketAddr,
    pub secret: String,
    /// Servers of the same cluster, named beside its manager in a file.
    pub seeds: Vec<SocketAddr>,
    /// Files read whose secret other users could read, said of each.
    pub warnings: Vec<String>,
}

/// The manager address and secret to use: arguments > environment > explicit config file
/// (which must exist) > cluster file.
pub fn resolve(
    manager: Option<String>,
    secret: Option<String>,
    config: Option<PathBuf>,
) -> Result<Found, ConfigError> {
    let mut manager = manager.or_else(|| env("TESSERA_MANAGER"));
    let mut secret = secret.or_else(|| env("TESSERA_SECRET"));
    let explicit = config.or_else(|| env("TESSERA_CONFIG").map(PathBuf::from));
    let mut warnings = Vec::new();
    let mut seeds = Vec::new();
    if manager.is_none() || secret.is_none() {
        let mut files = Vec::new();
        if let Some(p) = explicit {
            files.push((p, false));
        }
        let cluster = cluster_file();
        if cluster.exists() {
            files.push((cluster, true));
        }
        for (path, own) in files {
            let (f, warning) = tessera_client::config::read::<Endpoint>(&path, own)?;
            warnings.extend(warning);
            // A file's servers are those of the manager it names.
            if f.manager.is_some()
                && (manager.is_none() || manager == f.manager)
                && seeds.is_empty()
            {
                seeds = f.seeds.unwrap_or_default();
            }
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
    let seeds = seeds
        .iter()
        .map(|s| s.parse().map_err(|_| ConfigError::Seed(s.clone())))
        .collect::<Result<_, _>>()?;
    Ok(Found {
        addr,
        secret,
        seeds,
        warnings,
    })
}
