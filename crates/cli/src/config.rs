//! Configuration: flags (with their `TESSERA_*` environment variables, handled by clap) win
//! over the TOML file named by `--config`/`TESSERA_CONFIG`, which wins over the cluster file
//! that `tessera up` writes, which wins over built-in defaults.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::Path;

/// The configuration file. Unknown keys are errors, so a typo does not silently do nothing.
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Where clients and servers find the manager.
    pub manager: Option<String>,
    pub secret: Option<String>,
    /// The manager's HTTP admin API.
    pub http: Option<String>,
    /// Servers of the cluster (`HOST:PORT`), which a client asks for the partition table
    /// while the manager cannot be reached; `tessera up` keeps them current.
    pub seeds: Option<Vec<String>>,
    #[serde(default)]
    pub cluster: ClusterSection,
    #[serde(default)]
    pub server: ServerSection,
}

/// Settings fixed when a cluster is created (`tessera manager`, `tessera up`).
#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    pub servers: Option<u32>,
    pub partitions: Option<u32>,
    pub stripe_size: Option<String>,
    pub replication: Option<u8>,
}

#[derive(Debug, Default, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub memory: Option<String>,
    /// Stripe buffers to keep pre-faulted (`--prefault`).
    pub prefault: Option<String>,
    pub listen: Option<String>,
    pub label: Option<String>,
}

pub use tessera_client::config::cluster_file;

/// A configuration file; `own` for the cluster file, which Tessera makes private again if
/// someone opened it to other users.
fn read(path: &Path, own: bool) -> Result<FileConfig> {
    Ok(tessera_client::config::read(path, own)?.0)
}

/// The configuration in force: the explicit file (which must exist) over the cluster file.
pub fn load(explicit: Option<&Path>) -> Result<FileConfig> {
    let base = match cluster_file() {
        p if p.exists() => read(&p, true)?,
        _ => FileConfig::default(),
    };
    let Some(path) = explicit else {
        return Ok(base);
    };
    let file = read(path, false)?;
    // Servers are of the manager named beside them.
    let same_cluster = file.manager.is_none() || file.manager == base.manager;
    Ok(FileConfig {
        seeds: file.seeds.or(base.seeds.filter(|_| same_cluster)),
        manager: file.manager.or(base.manager),
        secret: file.secret.or(base.secret),
        http: file.http.or(base.http),
        cluster: file.cluster,
        server: file.server,
    })
}

pub fn size(text: &str) -> Result<u64> {
    parse_size::parse_size(text)
        .map_err(|e| anyhow!("bad size {text:?}: {e} (examples: 4GiB, 512MiB, 1g)"))
}

pub fn addr(text: &str, what: &str) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    text.to_socket_addrs()
        .with_context(|| format!("bad {what} address {text:?} (expected HOST:PORT)"))?
        .next()
        .ok_or_else(|| anyhow!("{what} address {text:?} resolves to nothing"))
}

/// The manager address and secret a client command uses.
pub fn endpoint(
    flag_manager: Option<&str>,
    flag_secret: Option<&str>,
    cfg: &FileConfig,
) -> Result<(SocketAddr, String)> {
    let how =
        "pass --manager/--secret, set TESSERA_MANAGER/TESSERA_SECRET, name a config file with \
               --config or TESSERA_CONFIG, or start a local cluster with `tessera up` (it writes ";
    let Some(manager) = flag_manager
        .map(str::to_string)
        .or_else(|| cfg.manager.clone())
    else {
        bail!("no manager address: {how}{})", cluster_file().display());
    };
    let Some(secret) = flag_secret
        .map(str::to_string)
        .or_else(|| cfg.secret.clone())
    else {
        bail!("no cluster secret: {how}{})", cluster_file().display());
    };
    Ok((addr(&manager, "manager")?, secret))
}

/// The servers a client asks for the table while the manager cannot be reached: those the
/// configuration names beside the manager in use (none for a manager named by flag only).
pub fn seeds(flag_manager: Option<&str>, cfg: &FileConfig) -> Result<Vec<SocketAddr>> {
    if flag_manager.is_some_and(|m| cfg.manager.as_deref() != Some(m)) {
        return Ok(Vec::new());
    }
    let seeds = cfg.seeds.as_deref().unwrap_or_default();
    seeds.iter().map(|s| addr(s, "seed server")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_unknown_keys() {
        let c: FileConfig = toml::from_str(
            "manager = \"10.0.0.1:7070\"\nsecret = \"s\"\n[cluster]\npartitions = 2048\nstripe_size = \"4MiB\"\n[server]\nmemory = \"8GiB\"\n",
        )
        .unwrap();
        assert_eq!(c.cluster.partitions, Some(2048));
        assert_eq!(c.server.memory.as_deref(), Some("8GiB"));
        assert!(toml::from_str::<FileConfig>("managr = \"x\"").is_err());
        assert!(toml::from_str::<FileConfig>("[server]\nmemroy = \"1g\"").is_err());
    }

    #[test]
    fn flags_win_over_the_file() {
        let cfg = FileConfig {
            manager: Some("127.0.0.1:1".into()),
            secret: Some("file".into()),
            ..FileConfig::default()
        };
        let (a, s) = endpoint(Some("127.0.0.1:2"), None, &cfg).unwrap();
        assert_eq!((a.port(), s.as_str()), (2, "file"));
        assert!(endpoint(None, None, &FileConfig::default()).is_err());
    }

    #[test]
    fn seeds_go_with_their_manager() {
        let cfg = FileConfig {
            manager: Some("127.0.0.1:1".into()),
            seeds: Some(vec!["127.0.0.2:9".into()]),
            ..FileConfig::default()
        };
        let port = |m| {
            seeds(m, &cfg)
                .unwrap()
                .iter()
                .map(|a| a.port())
                .collect::<Vec<_>>()
        };
        assert_eq!(port(None), [9]);
        assert_eq!(port(Some("127.0.0.1:1")), [9]);
        assert!(
            port(Some("127.0.0.1:2")).is_empty(),
            "another cluster's servers"
        );
        let bad = FileConfig {
            seeds: Some(vec!["nowhere".into()]),
            ..cfg
        };
        assert!(seeds(None, &bad).is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(size("4GiB").unwrap(), 4 << 30);
        assert_eq!(size("512MiB").unwrap(), 512 << 20);
        assert!(size("lots").is_err());
    }
}
