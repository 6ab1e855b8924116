//! The configuration file and where settings come from.
//!
//! Precedence, highest first: command-line flags, their `TESSERA_*` environment variables
//! (clap handles both), the TOML file named by `--config`/`TESSERA_CONFIG`, the cluster file
//! that `tessera up` writes (client commands and `tessera server` only), built-in defaults.

use anyhow::{anyhow, bail, Context, Result};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The configuration file. Unknown keys are errors, so a typo does not silently do nothing.
#[derive(Debug, Default, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Where clients and servers find the manager: `manager = "HOST:PORT"`, or a `[manager]`
    /// section (its `address` is the same setting).
    #[serde(default)]
    pub manager: ManagerSection,
    /// The cluster secret.
    pub secret: Option<String>,
    /// The manager's HTTP admin API.
    pub http: Option<String>,
    #[serde(default)]
    pub up: UpSection,
    #[serde(default)]
    pub server: ServerSection,
}

/// `[up]`: the flags of `tessera up`.
#[derive(Debug, Default, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UpSection {
    pub servers: Option<u32>,
    pub memory: Option<String>,
    pub manager: Option<String>,
    pub http: Option<String>,
    pub partitions: Option<u32>,
    #[serde(alias = "stripe-size")]
    pub stripe_size: Option<String>,
    pub replication: Option<u8>,
}

/// `[server]`: the flags of `tessera server`.
#[derive(Debug, Default, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub listen: Option<String>,
    pub advertise: Option<String>,
    pub memory: Option<String>,
    pub label: Option<String>,
}

/// `[manager]`: the flags of `tessera manager`, plus `address`, where the others find it.
#[derive(Debug, Default, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ManagerSection {
    pub address: Option<String>,
    pub listen: Option<String>,
    pub http: Option<String>,
    pub expect: Option<u32>,
    pub partitions: Option<u32>,
    #[serde(alias = "stripe-size")]
    pub stripe_size: Option<String>,
    pub replication: Option<u8>,
}

/// TOML cannot hold both `manager = "HOST:PORT"` and a `[manager]` table, so the key accepts
/// either: a string is the section's `address`.
impl<'de> Deserialize<'de> for ManagerSection {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ManagerSection;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an address (\"HOST:PORT\") or a [manager] section")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ManagerSection, E> {
                Ok(ManagerSection {
                    address: Some(v.to_string()),
                    ..ManagerSection::default()
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ManagerSection, A::Error> {
                Section::deserialize(de::value::MapAccessDeserializer::new(map)).map(Into::into)
            }
        }
        d.deserialize_any(V)
    }
}

/// The table form of [`ManagerSection`] (a separate type: the derive would recurse).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    address: Option<String>,
    listen: Option<String>,
    http: Option<String>,
    expect: Option<u32>,
    partitions: Option<u32>,
    #[serde(alias = "stripe-size")]
    stripe_size: Option<String>,
    replication: Option<u8>,
}

impl From<Section> for ManagerSection {
    fn from(s: Section) -> Self {
        Self {
            address: s.address,
            listen: s.listen,
            http: s.http,
            expect: s.expect,
            partitions: s.partitions,
            stripe_size: s.stripe_size,
            replication: s.replication,
        }
    }
}

/// `$TESSERA_HOME`, or `~/.tessera`.
pub fn home() -> PathBuf {
    match std::env::var_os("TESSERA_HOME").filter(|h| !h.is_empty()) {
        Some(h) => PathBuf::from(h),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
            .join(".tessera"),
    }
}

/// Where `tessera up` leaves the address and secret of the cluster it runs.
pub fn cluster_file() -> PathBuf {
    home().join("cluster.toml")
}

/// Reads and checks one configuration file.
pub fn read(path: &Path) -> Result<FileConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    parse(&text).with_context(|| format!("bad configuration file {}", path.display()))
}

fn parse(text: &str) -> Result<FileConfig> {
    // The TOML error names the line and the key; keep it on one line for the one-line report.
    toml::from_str(text).map_err(|e| anyhow!("{}", e.to_string().trim().replace('\n', " ")))
}

/// Where a setting came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A flag or its environment variable.
    Flag(&'static str),
    File(PathBuf),
    ClusterFile(PathBuf),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Self::Flag(what) => f.write_str(what),
            Self::File(p) => write!(f, "the configuration file {}", p.display()),
            Self::ClusterFile(p) => write!(f, "the cluster file {}", p.display()),
        }
    }
}

/// Everything read from files: the `--config` file, and (when a command can use it) the
/// cluster file of a local `tessera up`.
#[derive(Debug, Default)]
pub struct Config {
    pub file: FileConfig,
    pub path: Option<PathBuf>,
}

impl Config {
    /// Reads the file named by `--config`/`TESSERA_CONFIG` (which must exist), if any.
    pub fn load(explicit: Option<&Path>) -> Result<Self> {
        Ok(match explicit {
            Some(p) => Self {
                file: read(p)?,
                path: Some(p.to_path_buf()),
            },
            None => Self::default(),
        })
    }

    fn file_source(&self) -> Source {
        Source::File(self.path.clone().unwrap_or_default())
    }
}

/// The cluster file, if there is one. A broken one is reported, since only `up` writes it.
pub fn cluster() -> Result<Option<(PathBuf, FileConfig)>> {
    let path = cluster_file();
    if !path.exists() {
        return Ok(None);
    }
    let file = read(&path)?;
    Ok(Some((path, file)))
}

/// How a client (or a server) reaches the cluster.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub manager: SocketAddr,
    pub manager_from: Source,
    pub secret: String,
    pub secret_from: Source,
}

const HOW: &str = "pass --manager and --secret, set TESSERA_MANAGER and TESSERA_SECRET, name a \
                   configuration file with --config or TESSERA_CONFIG, or start a local cluster \
                   with `tessera up`, which writes";

/// The manager address and secret, by precedence: flags and environment, the configuration
/// file, the cluster file of `tessera up`; `default_manager` if nothing names one.
pub fn endpoint(
    flag_manager: Option<&str>,
    flag_secret: Option<&str>,
    cfg: &Config,
    cluster: Option<&(PathBuf, FileConfig)>,
    default_manager: Option<&str>,
) -> Result<Endpoint> {
    let from_cluster = |f: fn(&FileConfig) -> Option<&String>| {
        cluster.and_then(|(p, c)| f(c).map(|v| (v.clone(), Source::ClusterFile(p.clone()))))
    };
    let manager = flag_manager
        .map(|m| (m.to_string(), Source::Flag("--manager / TESSERA_MANAGER")))
        .or_else(|| {
            cfg.file
                .manager
                .address
                .clone()
                .map(|m| (m, cfg.file_source()))
        })
        .or_else(|| from_cluster(|c| c.manager.address.as_ref()))
        .or_else(|| default_manager.map(|m| (m.to_string(), Source::Flag("the default"))));
    let Some((manager, manager_from)) = manager else {
        bail!(
            "no cluster to talk to (no manager address): {HOW} {}",
            cluster_file().display()
        );
    };
    let secret = flag_secret
        .map(|s| (s.to_string(), Source::Flag("--secret / TESSERA_SECRET")))
        .or_else(|| cfg.file.secret.clone().map(|s| (s, cfg.file_source())))
        .or_else(|| from_cluster(|c| c.secret.as_ref()));
    let Some((secret, secret_from)) = secret else {
        bail!(
            "no cluster secret for the manager at {manager}: {HOW} {}",
            cluster_file().display()
        );
    };
    let manager = addr(&manager, "manager").with_context(|| format!("from {manager_from}"))?;
    Ok(Endpoint {
        manager,
        manager_from,
        secret,
        secret_from,
    })
}

/// A size such as `4GiB`, `512MiB`, `1g` or `1048576`. Units are binary, as usual for memory:
/// `1g`, `1GB` and `1GiB` are all 2^30 bytes.
pub fn size(text: &str) -> Result<u64> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(text.trim())
        .map_err(|e| anyhow!("bad size {text:?}: {e} (examples: 4GiB, 512MiB, 1g)"))
}

/// A socket address, `HOST:PORT`; host names are resolved.
pub fn addr(text: &str, what: &str) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    if let Ok(a) = text.parse() {
        return Ok(a);
    }
    if !text.contains(':') {
        bail!("bad {what} address {text:?}: expected HOST:PORT, e.g. 127.0.0.1:7070");
    }
    text.to_socket_addrs()
        .map_err(|e| anyhow!("bad {what} address {text:?}: {e} (expected HOST:PORT)"))?
        .next()
        .ok_or_else(|| anyhow!("bad {what} address {text:?}: the name resolves to nothing"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config {
            file: parse(text).unwrap(),
            path: Some("/etc/tessera.toml".into()),
        }
    }

    #[test]
    fn the_manager_key_is_an_address_or_a_section() {
        let c = parse("manager = \"10.0.0.1:7070\"\nsecret = \"s\"\n").unwrap();
        assert_eq!(c.manager.address.as_deref(), Some("10.0.0.1:7070"));
        let c = parse(
            "secret = \"s\"\n[manager]\naddress = \"node1:7070\"\nlisten = \"0.0.0.0:7070\"\n\
             expect = 4\nstripe-size = \"4MiB\"\n[server]\nmemory = \"8GiB\"\n\
             [up]\nservers = 2\nreplication = 2\n",
        )
        .unwrap();
        assert_eq!(c.manager.address.as_deref(), Some("node1:7070"));
        assert_eq!(c.manager.expect, Some(4));
        assert_eq!(c.manager.stripe_size.as_deref(), Some("4MiB"));
        assert_eq!(c.server.memory.as_deref(), Some("8GiB"));
        assert_eq!((c.up.servers, c.up.replication), (Some(2), Some(2)));
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_errors() {
        for bad in [
            "managr = \"x\"",
            "[server]\nmemroy = \"1g\"",
            "[manager]\nlisten = \"a:1\"\nexpcet = 3",
            "[up]\nservers = \"four\"",
            "manager = 7070",
            "[cluster]\npartitions = 1",
        ] {
            let e = parse(bad).unwrap_err().to_string();
            assert!(!e.contains('\n'), "one line: {e}");
            assert!(
                e.contains("unknown field") || e.contains("invalid type"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn flags_win_over_the_file_which_wins_over_the_cluster_file() {
        let file = cfg("manager = \"127.0.0.1:1\"\nsecret = \"file\"\n");
        let cluster = (
            PathBuf::from("/home/u/.tessera/cluster.toml"),
            parse("manager = \"127.0.0.1:3\"\nsecret = \"cluster\"\n").unwrap(),
        );
        let e = endpoint(Some("127.0.0.1:2"), None, &file, Some(&cluster), None).unwrap();
        assert_eq!((e.manager.port(), e.secret.as_str()), (2, "file"));
        assert!(matches!(e.manager_from, Source::Flag(_)));
        assert!(matches!(e.secret_from, Source::File(_)));

        let e = endpoint(None, Some("flag"), &file, Some(&cluster), None).unwrap();
        assert_eq!((e.manager.port(), e.secret.as_str()), (1, "flag"));

        let e = endpoint(None, None, &Config::default(), Some(&cluster), None).unwrap();
        assert_eq!((e.manager.port(), e.secret.as_str()), (3, "cluster"));
        assert!(e.secret_from.to_string().contains("cluster file"));

        let e = endpoint(None, Some("s"), &Config::default(), None, Some("127.0.0.1:7070"));
        assert_eq!(e.unwrap().manager.port(), 7070);
    }

    #[test]
    fn missing_settings_name_every_way_to_give_them() {
        let e = endpoint(None, None, &Config::default(), None, None).unwrap_err();
        let e = e.to_string();
        for way in ["--manager", "TESSERA_MANAGER", "--config", "tessera up"] {
            assert!(e.contains(way), "{e}");
        }
        let e = endpoint(Some("127.0.0.1:1"), None, &Config::default(), None, None);
        let e = e.unwrap_err().to_string();
        assert!(e.contains("no cluster secret") && e.contains("TESSERA_SECRET"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(size("4GiB").unwrap(), 4 << 30);
        assert_eq!(size("512MiB").unwrap(), 512 << 20);
        assert_eq!(size("1g").unwrap(), 1 << 30);
        assert_eq!(size("2MB").unwrap(), 2 << 20);
        assert_eq!(size("1048576").unwrap(), 1 << 20);
        for bad in ["lots", "", "-1GiB", "4 GiBB"] {
            let e = size(bad).unwrap_err().to_string();
            assert!(e.contains("bad size"), "{e}");
        }
    }

    #[test]
    fn addresses() {
        assert_eq!(addr("127.0.0.1:7070", "x").unwrap().port(), 7070);
        assert_eq!(addr("localhost:7070", "x").unwrap().port(), 7070);
        for bad in ["7070", "127.0.0.1", "127.0.0.1:99999", "not-an-address"] {
            let e = addr(bad, "manager").unwrap_err().to_string();
            assert!(e.contains("bad manager address"), "{e}");
        }
    }
}
