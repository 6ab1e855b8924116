//! Where servers come from when the cluster grows, and where retired ones go.
//!
//! * `local`: the manager starts `tessera server` processes on this machine, on the next free
//!   loopback address (127.0.0.k), each offering the configured memory; they die with the
//!   manager. The default for `tessera up --elastic`.
//! * a command: the manager runs `sh -c "CMD add"` to get one server (the script starts
//!   `tessera server --manager $TESSERA_MANAGER ...` somewhere: `srun`, a cloud API, ssh...),
//!   and `sh -c "CMD remove"` with `TESSERA_NODE_ID` and `TESSERA_NODE_ADDR` set once a
//!   drained server was retired (the server exits by itself; the script frees the machine).
//!
//! Either way a new server is only counted when it registers.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use tessera_placement::NodeId;
use tracing::{info, warn};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProvisionSpec {
    /// Server processes on this machine, each offering `memory` (e.g. `1GiB`).
    Local { memory: String },
    /// A user's script: `CMD add` gets a server, `CMD remove` releases one.
    Command(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    #[error("this manager has no provisioner: start servers with `tessera server --manager ...`, or run the manager with --provision local|CMD")]
    None,
    #[error("no free loopback address left for a local server")]
    NoAddress,
    #[error("cannot start {what}: {source}")]
    Spawn {
        what: String,
        source: std::io::Error,
    },
}

/// Starts and releases servers; remembers the processes it started, to reap them.
pub struct Provisioner {
    spec: ProvisionSpec,
    manager: SocketAddr,
    secret: String,
    children: Vec<(String, Child)>,
}

impl Provisioner {
    #[must_use]
    pub fn new(spec: ProvisionSpec, manager: SocketAddr, secret: String) -> Self {
        Self {
            spec,
            manager,
            secret,
            children: Vec::new(),
        }
    }

    /// Asks for `n` more servers; `taken` are the addresses of the current members.
    pub fn add(&mut self, n: u32, taken: &[SocketAddr]) -> Result<(), ProvisionError> {
        self.reap();
        for _ in 0..n {
            let child = match &self.spec {
                ProvisionSpec::Local { memory } => {
                    let ip = self.free_ip(taken)?;
                    let exe = std::env::current_exe().map_err(|source| ProvisionError::Spawn {
                        what: "a local server (cannot find the tessera binary)".into(),
                        source,
                    })?;
                    let mut c = Command::new(exe);
                    c.args(["server", "--listen", &format!("{ip}:0")])
                        .args(["--manager", &self.manager.to_string()])
                        .args(["--memory", memory]);
                    (format!("local server on {ip}"), c)
                }
                ProvisionSpec::Command(cmd) => {
                    let mut c = Command::new("sh");
                    c.args(["-c", &format!("{cmd} add")]);
                    (format!("`{cmd} add`"), c)
                }
            };
            let (what, mut cmd) = child;
            cmd.env("TESSERA_MANAGER", self.manager.to_string())
                .env("TESSERA_SECRET", &self.secret)
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            die_with_parent(&mut cmd);
            let proc = cmd.spawn().map_err(|source| ProvisionError::Spawn {
                what: what.clone(),
                source,
            })?;
            info!("provisioned: {what}");
            self.children.push((what, proc));
        }
        Ok(())
    }

    /// A drained server was retired: it exits by itself; a command provisioner frees its
    /// machine.
    pub fn release(&mut self, node: NodeId, addr: SocketAddr) {
        if let ProvisionSpec::Command(cmd) = &self.spec {
            let mut c = Command::new("sh");
            c.args(["-c", &format!("{cmd} remove")])
                .env("TESSERA_NODE_ID", node.to_string())
                .env("TESSERA_NODE_ADDR", addr.to_string())
                .env("TESSERA_MANAGER", self.manager.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            match c.spawn() {
                Ok(p) => self
                    .children
                    .push((format!("`{cmd} remove` for node {node}"), p)),
                Err(e) => warn!(node, "cannot run `{cmd} remove`: {e}"),
            }
        }
        self.reap();
    }

    /// Collects the processes that ended.
    pub fn reap(&mut self) {
        self.children.retain_mut(|(what, c)| match c.try_wait() {
            Ok(Some(status)) => {
                if !status.success() {
                    warn!("{what} ended: {status}");
                }
                false
            }
            Ok(None) => true,
            Err(e) => {
                warn!("{what}: {e}");
                false
            }
        });
    }

    /// The lowest 127.0.0.k (k >= 2) that no member and no server started here uses.
    fn free_ip(&self, taken: &[SocketAddr]) -> Result<Ipv4Addr, ProvisionError> {
        let mut used: BTreeSet<IpAddr> = taken.iter().map(SocketAddr::ip).collect();
        for (what, _) in &self.children {
            if let Some(ip) = what
                .strip_prefix("local server on ")
                .and_then(|s| s.parse().ok())
            {
                used.insert(ip);
            }
        }
        (2..=254u8)
            .map(|k| Ipv4Addr::new(127, 0, 0, k))
            .find(|ip| !used.contains(&IpAddr::V4(*ip)))
            .ok_or(ProvisionError::NoAddress)
    }
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Servers started here stop when the manager does, however it ends.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches only the child being set up.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
}

/// Parses `--provision`: `local` or a command line.
#[must_use]
pub fn parse_spec(s: &str, memory: &str) -> ProvisionSpec {
    if s.trim() == "local" {
        ProvisionSpec::Local {
            memory: memory.to_string(),
        }
    } else {
        ProvisionSpec::Command(s.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_servers_take_free_loopback_addresses() {
        let p = Provisioner::new(
            ProvisionSpec::Local {
                memory: "1GiB".into(),
            },
            "127.0.0.1:7070".parse().unwrap(),
            "s".into(),
        );
        let taken: Vec<SocketAddr> = ["127.0.0.2:5", "127.0.0.3:6", "127.0.0.5:7"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(p.free_ip(&taken).unwrap(), Ipv4Addr::new(127, 0, 0, 4));
        assert_eq!(
            parse_spec("local", "2GiB"),
            ProvisionSpec::Local {
                memory: "2GiB".into()
            }
        );
        assert_eq!(
            parse_spec("./get-node.sh --partition short", "2GiB"),
            ProvisionSpec::Command("./get-node.sh --partition short".into())
        );
    }

    #[test]
    fn a_command_provisioner_runs_add_and_remove() {
        let dir = std::env::temp_dir().join(format!("tessera-prov-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        let cmd = format!(
            "echo \"$TESSERA_MANAGER $TESSERA_NODE_ID\" >> {} ; echo",
            log.display()
        );
        let mut p = Provisioner::new(
            ProvisionSpec::Command(cmd),
            "127.0.0.1:7070".parse().unwrap(),
            "s".into(),
        );
        p.add(2, &[]).unwrap();
        p.release(7, "127.0.0.9:1".parse().unwrap());
        for _ in 0..100 {
            p.reap();
            if p.children.is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let text = std::fs::read_to_string(&log).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines.contains(&"127.0.0.1:7070 7"), "{text}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
