//! `tessera up`: a whole cluster on this machine, as child processes of this one: a manager and
//! N servers on 127.0.0.2, .3, ... Ctrl-C (or SIGTERM) stops all of it.
//!
//! `up` outlives its children: one that dies is reported and, unless `--respawn false`,
//! started again, later each time it dies again soon. A server joins as a new node and
//! receives its share (with mirrors the cluster loses nothing meanwhile; without, the files
//! with stripes on the dead server fail with EIO); the dead mount is detached and mounted
//! anew; a new manager on the same address recovers the cluster from the tables its servers
//! hold, while reads and writes go on without it. Only Ctrl-C or SIGTERM stops `up`.

use crate::config::{self, FileConfig};
use crate::Cli;
use anyhow::{bail, Context, Result};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tessera_client::Client;
use tokio::process::{Child, Command};

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Storage servers to start (default 4).
    #[arg(long)]
    servers: Option<u32>,
    /// Memory per server (default: half of the available memory, shared among the servers).
    #[arg(long)]
    memory: Option<String>,
    /// Memory per server kept as pre-faulted stripe buffers, filled while idle (`tessera
    /// server --prefault`; at most --memory).
    #[arg(long)]
    prefault: Option<String>,
    /// Address of the HTTP admin API (default 127.0.0.1:7071).
    #[arg(long)]
    http: Option<String>,
    #[command(flatten)]
    shape: crate::ClusterArgs,
    /// Also mount the cluster on this directory (FUSE); unmounted when `up` stops.
    #[arg(long)]
    mount: Option<std::path::PathBuf>,
    /// Let all users use the mount (the kernel still checks each file's permissions).
    #[arg(long, requires = "mount")]
    allow_other: bool,
    /// Trace every operation on the mount into a new file in this directory
    /// (docs/TRACING.md).
    #[arg(long, requires = "mount")]
    trace: Option<std::path::PathBuf>,
    /// With --elastic, servers the policy adds are local processes offering --memory each.
    #[command(flatten)]
    elastic: crate::ElasticArgs,
    /// Start a server or the mount again when it dies (false: report it and go on without).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    respawn: bool,
    /// A manager whose process runs but has not answered for this long (hung, stopped) is
    /// killed, and started again if --respawn (e.g. 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    manager_timeout: Duration,
}

/// The first restart of a process that died waits this long, each further one twice as long
/// as the last, up to [`RESPAWN_MAX`]; a process that ran [`RESPAWN_RESET`] starts over.
const RESPAWN_FIRST: Duration = Duration::from_secs(1);
const RESPAWN_MAX: Duration = Duration::from_secs(60);
const RESPAWN_RESET: Duration = Duration::from_secs(60);

/// How long to wait before starting again a process that died after `failures` deaths in a
/// row.
fn respawn_delay(failures: u32) -> Duration {
    RESPAWN_FIRST
        .saturating_mul(1 << failures.min(6))
        .min(RESPAWN_MAX)
}

/// Half of MemAvailable, split among `servers`, in whole MiB.
fn default_memory(servers: u32) -> Result<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no MemAvailable in /proc/meminfo: pass --memory")?;
    let per = kib * 1024 / 2 / u64::from(servers.max(1));
    Ok((per >> 20) << 20)
}

fn child(args: &[String], secret: &str) -> Result<Child> {
    let exe = std::env::current_exe().context("finding the tessera executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env("TESSERA_SECRET", secret)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe; it asks the kernel to stop the child if we die, so a
    // killed `up` never leaves servers behind.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn()
        .with_context(|| format!("starting tessera {}", args.join(" ")))
}

/// What a child of `up` is, which decides what its death means.
#[derive(Clone, Debug, PartialEq)]
enum Role {
    Manager,
    Server,
    Mount(std::path::PathBuf),
}

/// A process `up` started, and how to start it again.
struct Member {
    name: String,
    role: Role,
    args: Vec<String>,
    /// `None` while it waits to be started again.
    child: Option<Child>,
    started: Instant,
    /// Deaths in a row, each soon after its start: how long the next restart waits.
    failures: u32,
    restart_at: Option<Instant>,
}

struct Children {
    members: Vec<Member>,
    secret: String,
}

impl Children {
    fn new(secret: &str) -> Self {
        Self {
            members: Vec::new(),
            secret: secret.into(),
        }
    }

    fn start(&mut self, name: String, role: Role, args: Vec<String>) -> Result<()> {
        let child = child(&args, &self.secret)?;
        self.members.push(Member {
            name,
            role,
            args,
            child: Some(child),
            started: Instant::now(),
            failures: 0,
            restart_at: None,
        });
        Ok(())
    }

    /// SIGTERM to all, then SIGKILL to whatever still runs after 5 s.
    async fn stop(&mut self) {
        for c in self.members.iter().filter_map(|m| m.child.as_ref()) {
            if let Some(pid) = c.id() {
                // SAFETY: kill(2) on our own child's pid.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            }
        }
        for m in &mut self.members {
            let Some(c) = m.child.as_mut() else { continue };
            if tokio::time::timeout(Duration::from_secs(5), c.wait())
                .await
                .is_err()
            {
                eprintln!("{} did not stop in 5 s; killing it", m.name);
                let _ = c.kill().await;
            }
        }
    }

    /// The first child to fail while the cluster starts, named.
    async fn first_exit(&mut self) -> String {
        loop {
            for m in &mut self.members {
                if let Some(Ok(Some(status))) = m.child.as_mut().map(Child::try_wait) {
                    return format!("{} exited ({status})", m.name);
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Watches the children of a running cluster, for ever. A server that exits cleanly was
    /// drained and retired by the manager (scale-in): it is let go. Any other death is
    /// reported, and the process started again if `respawn`. A manager that has not
    /// answered (`heard`) for `patience` is killed, to die and be started again.
    async fn supervise(&mut self, respawn: bool, heard: &Heard, patience: Duration) {
        loop {
            let now = Instant::now();
            if let Some(m) = self.members.iter_mut().find(|m| m.role == Role::Manager) {
                let silent = now.duration_since(heard.last().max(m.started));
                if let Some(c) = m.child.as_mut().filter(|_| silent >= patience) {
                    let why = format!("the manager has not answered for {silent:.0?}; killing it");
                    tracing::warn!("{why}");
                    eprintln!("{why}");
                    let _ = c.start_kill();
                    // Its death is seen below, once the kernel has reaped it.
                    heard.now();
                }
            }
            let mut retired = Vec::new();
            for (i, m) in self.members.iter_mut().enumerate() {
                let Some(Ok(Some(status))) = m.child.as_mut().map(Child::try_wait) else {
                    continue;
                };
                m.child = None;
                match &m.role {
                    Role::Manager => {}
                    Role::Server if status.success() => {
                        eprintln!("{} was retired (scale-in)", m.name);
                        retired.push(i);
                        continue;
                    }
                    Role::Server => {}
                    Role::Mount(dir) => {
                        // What is left is a dead mount ("transport endpoint is not
                        // connected"): detached, the directory can be mounted again.
                        if let Err(e) = tessera_fuse::unmount(dir) {
                            tracing::debug!("detaching the dead mount {}: {e}", dir.display());
                        }
                    }
                }
                if now.duration_since(m.started) >= RESPAWN_RESET {
                    m.failures = 0;
                }
                let why = format!("{} exited ({status})", m.name);
                if respawn {
                    let delay = respawn_delay(m.failures);
                    m.failures += 1;
                    m.restart_at = Some(now + delay);
                    tracing::warn!("{why}; starting it again in {delay:?}");
                    eprintln!("{why}; starting it again in {delay:?}");
                } else {
                    tracing::warn!("{why}; the cluster goes on without it");
                    eprintln!("{why}; the cluster goes on without it");
                }
            }
            for i in retired.into_iter().rev() {
                self.members.remove(i);
            }
            for m in &mut self.members {
                if m.restart_at.is_some_and(|at| at <= now) {
                    m.restart_at = None;
                    match child(&m.args, &self.secret) {
                        Ok(c) => {
                            eprintln!("{} started again", m.name);
                            m.child = Some(c);
                            m.started = now;
                        }
                        Err(e) => {
                            m.restart_at = Some(now + respawn_delay(m.failures));
                            m.failures += 1;
                            eprintln!("{}: {e:#}", m.name);
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

pub async fn run(cli: &Cli, args: &UpArgs, cfg: &FileConfig) -> Result<()> {
    let servers = args.servers.or(cfg.cluster.servers).unwrap_or(4);
    if servers == 0 || servers > 250 {
        bail!("--servers must be 1 to 250 (one loopback address each)");
    }
    let memory = match args.memory.as_ref().or(cfg.server.memory.as_ref()) {
        Some(m) => config::size(m)?,
        None => default_memory(servers)?,
    };
    if memory < 16 << 20 {
        bail!("each server needs at least 16 MiB (got {memory} bytes)");
    }
    let prefault = args.prefault.as_ref().or(cfg.server.prefault.as_ref());
    let prefault = crate::prefault_size(prefault, memory)?;
    let manager = cli
        .manager
        .clone()
        .or_else(|| cfg.manager.clone())
        .unwrap_or_else(|| crate::DEFAULT_MANAGER.into());
    let manager_addr = config::addr(&manager, "manager")?;
    let http = args
        .http
        .clone()
        .or_else(|| cfg.http.clone())
        .unwrap_or_else(|| "127.0.0.1:7071".into());
    let secret = cli
        .secret
        .clone()
        .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
    let mut margs = vec![
        "manager".into(),
        "--listen".into(),
        manager.clone(),
        "--http".into(),
        http.clone(),
    ];
    margs.extend(["--expect".into(), servers.to_string()]);
    // Resolved (and checked) here, so a bad setting fails before anything starts.
    let shape = args.shape.resolve(cfg)?;
    margs.extend(["--partitions".into(), shape.partitions.to_string()]);
    margs.extend(["--stripe-size".into(), shape.stripe_size.to_string()]);
    margs.extend(["--replication".into(), shape.replication.to_string()]);
    margs.extend(["--open-lease".into(), format!("{}ms", shape.open_lease_ms)]);
    if let Some(d) = args.shape.dead_after {
        margs.extend(["--dead-after".into(), format!("{}ms", d.as_millis())]);
    }
    // Checked here too, so a bad policy fails before anything starts.
    args.elastic.policy(shape.replication)?;
    // Local servers can always be added by hand (`tessera scale --add`).
    margs.extend(["--provision".into(), "local".into()]);
    margs.extend(["--node-memory".into(), memory.to_string()]);
    if args.elastic.elastic {
        margs.extend(args.elastic.to_args());
    }

    // A cluster already there would answer this one's clients, refusing its secret: say so
    // before anything starts.
    for (addr, what, flag) in [
        (&manager, "manager", "--manager"),
        (&http, "status", "--http"),
    ] {
        match std::net::TcpListener::bind(config::addr(addr, what)?) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => bail!(
                "the {what} address {addr} is taken: is a cluster (`tessera up`) running there \
                 already? Stop it (Ctrl-C where it runs), or give {flag} another address"
            ),
            Err(e) => bail!("cannot listen on the {what} address {addr} ({flag}): {e}"),
        }
    }
    let mut children = Children::new(&secret);
    children.start("manager".into(), Role::Manager, margs)?;
    for i in 0..servers {
        let mut sargs: Vec<String> = vec![
            "server".into(),
            "--listen".into(),
            format!("127.0.0.{}:0", i + 2),
            "--manager".into(),
            manager.clone(),
            "--memory".into(),
            memory.to_string(),
            "--label".into(),
            format!("local-{}", i + 1),
        ];
        if prefault > 0 {
            sargs.extend(["--prefault".into(), prefault.to_string()]);
        }
        children.start(format!("server {}", i + 1), Role::Server, sargs)?;
    }

    let mut opts = cli.client_options(manager_addr, &secret);
    opts.ready_timeout = Duration::from_secs(60);
    let ready = tokio::select! {
        r = Client::connect(opts) => r.context("waiting for the cluster to become ready"),
        why = children.first_exit() => Err(anyhow::anyhow!("{why} while the cluster was starting")),
    };
    let client = match ready {
        Ok(c) => c,
        Err(e) => {
            children.stop().await;
            return Err(e);
        }
    };
    if let Some(dir) = &args.mount {
        let mut margs = vec![
            "--manager".into(),
            manager.clone(),
            "mount".into(),
            dir.to_string_lossy().into_owned(),
        ];
        if args.allow_other {
            margs.push("--allow-other".into());
        }
        if let Some(trace) = &args.trace {
            let trace = std::path::absolute(trace).context("the trace directory")?;
            margs.push("--trace".into());
            margs.push(trace.to_string_lossy().into_owned());
        }
        children.start("the mount".into(), Role::Mount(dir.clone()), margs)?;
        wait_mounted(dir, &mut children).await?;
    }
    let file = config::cluster_file();
    let listed = ClusterFile {
        path: file.clone(),
        manager: manager.clone(),
        http: http.clone(),
        secret: secret.clone(),
    };
    let mut seeds = live_servers(&client).await?;
    listed.write(&seeds)?;
    let usage = client.usage().await?;
    println!(
        "Tessera is up: {servers} servers, {} of memory",
        human(usage.capacity)
    );
    println!("  manager    {manager}");
    println!("  status     http://{http}/status  (Authorization: Bearer <secret>)");
    println!(
        "  cluster    {} (address and secret for the other commands)",
        file.display()
    );
    println!("Try: tessera status; tessera cp -r ./data tessera:/data. Ctrl-C stops the cluster.");

    let heard = Heard::new();
    let outcome = tokio::select! {
        r = crate::shutdown_signal() => r,
        () = children.supervise(args.respawn, &heard, args.manager_timeout) => Ok(()),
        r = listed.keep(&client, &heard, &mut seeds) => r,
    };
    eprintln!("stopping the cluster");
    children.stop().await;
    let _ = std::fs::remove_file(&file);
    outcome.context("the cluster was stopped")
}

/// Waits until the mount child has mounted `dir` (its device differs from its parent's).
async fn wait_mounted(dir: &std::path::Path, children: &mut Children) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let parent = dir.parent().unwrap_or(dir);
    let parent_dev = std::fs::metadata(parent)
        .with_context(|| format!("{}", parent.display()))?
        .dev();
    for _ in 0..300 {
        if std::fs::metadata(dir).is_ok_and(|m| m.dev() != parent_dev) {
            return Ok(());
        }
        let exited = (children.members.last_mut())
            .and_then(|m| m.child.as_mut())
            .and_then(|c| c.try_wait().ok().flatten());
        if let Some(status) = exited {
            children.stop().await;
            bail!(
                "the mount exited ({status}) before {} was mounted",
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    children.stop().await;
    bail!("{} was not mounted within 30 s", dir.display())
}

/// When the manager last answered `up`.
struct Heard(std::sync::Mutex<Instant>);

impl Heard {
    fn new() -> Self {
        Self(std::sync::Mutex::new(Instant::now()))
    }

    fn now(&self) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }

    fn last(&self) -> Instant {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// How often `up` asks the manager for the servers, which also tells whether it answers.
const SEEDS_EVERY: Duration = Duration::from_secs(1);

/// The addresses of the live servers, in order.
async fn live_servers(client: &Client) -> Result<Vec<String>> {
    let status = client.status().await?;
    let mut live: Vec<String> = (status.nodes.iter())
        .filter(|n| n.alive)
        .map(|n| n.addr.to_string())
        .collect();
    live.sort();
    Ok(live)
}

/// The cluster file: where the other commands, mounts and Python find this cluster.
struct ClusterFile {
    path: std::path::PathBuf,
    manager: String,
    http: String,
    secret: String,
}

impl ClusterFile {
    /// Asks the manager for the live servers every [`SEEDS_EVERY`], for ever, noting in
    /// `heard` when it answers, and lists them in the file whenever they change (`seeds`:
    /// those listed), so that a new client can start from them while the manager is away.
    async fn keep(&self, client: &Client, heard: &Heard, seeds: &mut Vec<String>) -> Result<()> {
        loop {
            tokio::time::sleep(SEEDS_EVERY).await;
            let Ok(Ok(live)) = tokio::time::timeout(SEEDS_EVERY, live_servers(client)).await else {
                continue;
            };
            heard.now();
            if !live.is_empty() && live != *seeds {
                self.write(&live)?;
                *seeds = live;
            }
        }
    }

    /// Writes the file so that no other user can read the secret at any moment: a new file
    /// made 0600 (never an existing one, whatever its mode), filled, synced and renamed into
    /// place.
    fn write(&self, seeds: &[String]) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let path = &self.path;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .with_context(|| format!("creating {}", dir.display()))?;
        let cfg = FileConfig {
            manager: Some(self.manager.clone()),
            secret: Some(self.secret.clone()),
            http: Some(self.http.clone()),
            seeds: Some(seeds.to_vec()),
            ..FileConfig::default()
        };
        let text = format!(
            "# Written by `tessera up`; removed when it stops.\n{}",
            toml::to_string(&cfg)?
        );
        let tmp = dir.join(format!(
            ".cluster.toml.{}.{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(text.as_bytes())?;
                f.sync_all()
            })
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("writing {}", path.display()));
        }
        // The rename itself lasts once the directory is synced.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing {}", dir.display()))
    }
}

/// Bytes as a short human-readable figure.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
