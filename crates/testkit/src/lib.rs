//! Test support for Tessera: real clusters of `tessera` processes on 127.0.0.x or on emulated
//! hosts (`tessera-hosts`), clients in separate processes (`tessera-worker`), and
//! deterministic data patterns checkable against an in-memory model.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_hosts::Hosts;
use tessera_proto::{
    BufferPool, ErrorCode, NodeId, Op, Request, Response, RpcClient, RpcConfig, Secret, TableInfo,
};

/// Path of a binary built from this workspace (next to the test executable's `deps/`).
pub fn bin(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe
        .parent()
        .and_then(|d| {
            if d.ends_with("deps") {
                d.parent()
            } else {
                Some(d)
            }
        })
        .context("test executable has no parent directory")?;
    let path = dir.join(name);
    if !path.exists() {
        bail!(
            "{} is missing: build it first with `cargo build --workspace --bins`",
            path.display()
        );
    }
    Ok(path)
}

/// A free TCP port on the loopback address `ip` (bound and released; good enough for tests).
pub fn free_port(ip: &str) -> Result<u16> {
    Ok(TcpListener::bind((ip, 0))?.local_addr()?.port())
}

/// Bytes of the deterministic pattern `seed` at file positions `offset..offset+len`: every byte
/// depends on the seed and its absolute position, so overlapping writes remain checkable.
#[must_use]
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut pos = offset;
    while out.len() < len {
        let word = splitmix(seed ^ (pos / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes();
        let start = (pos % 8) as usize;
        let take = (8 - start).min(len - out.len());
        out.extend_from_slice(&word[start..start + take]);
        pos += take as u64;
    }
    out
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The hash the worker reports for data it read.
#[must_use]
pub fn digest(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

/// How to shape a test cluster.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub servers: usize,
    pub memory: String,
    pub stripe_size: String,
    pub partitions: u32,
    pub replication: u8,
    /// Extra flags for the manager (say `--dead-after 1s`).
    pub manager_args: Vec<String>,
    /// Extra flags for server `i`, by index (say `--fault-delay 20ms` for a slow one).
    pub server_args: Vec<(usize, Vec<String>)>,
    /// Open files the manager and the servers may have (`RLIMIT_NOFILE`, soft and hard):
    /// a common default, where the test process's may be far higher.
    pub max_open_files: Option<u64>,
    /// Emulated hosts to run on: the manager on host 0, server `i` on host `1 + i % (n - 1)`
    /// (all on host 0 if there is one), clients where the test says. `None`: this machine's
    /// loopback, the manager on 127.0.0.1 and server `i` on 127.0.0.(i+2).
    pub hosts: Option<tessera_hosts::Spec>,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        Self {
            servers: 3,
            memory: "1GiB".into(),
            stripe_size: "1MiB".into(),
            partitions: 256,
            replication: 1,
            manager_args: Vec::new(),
            server_args: Vec::new(),
            max_open_files: None,
            hosts: None,
        }
    }
}

/// A manager and storage servers, each a real `tessera` process; killed when dropped (and
/// the emulated hosts they ran on removed).
pub struct Cluster {
    pub manager: SocketAddr,
    pub secret: String,
    spec: ClusterSpec,
    manager_proc: Child,
    pub servers: Vec<Child>,
    hosts: Option<Hosts>,
}

fn quiet(mut c: Command) -> Command {
    c.stdin(Stdio::null()).stdout(Stdio::null());
    if std::env::var_os("TESSERA_TEST_LOGS").is_none() {
        c.stderr(Stdio::null());
    }
    c
}

/// Limits the open files of the process `c` starts.
fn limit_open_files(c: &mut Command, max: Option<u64>) {
    use std::os::unix::process::CommandExt;
    let Some(max) = max else { return };
    let lim = libc::rlimit {
        rlim_cur: max,
        rlim_max: max,
    };
    // SAFETY: `setrlimit` is async-signal-safe and touches nothing of the parent's.
    unsafe {
        c.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}

/// Memory a process holds that the kernel cannot take back at will, in bytes: its resident
/// pages less those it freed lazily (`MADV_FREE`, which the kernel reclaims without asking).
pub fn held_memory(pid: u32) -> Result<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let field = |name: &str| {
        rollup
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .with_context(|| format!("no {name} for process {pid}"))
    };
    Ok(field("Rss:")?.saturating_sub(field("LazyFree:")?) << 10)
}

impl Cluster {
    /// Starts a cluster and waits until a client can use it.
    pub fn start(spec: &ClusterSpec) -> Result<Self> {
        let hosts = spec.hosts.as_ref().map(Hosts::start).transpose()?;
        let manager: SocketAddr = match &hosts {
            // A namespace of its own: every port is free.
            Some(h) => (h.addr(0), 7070).into(),
            None => (
                "127.0.0.1".parse::<std::net::IpAddr>()?,
                free_port("127.0.0.1")?,
            )
                .into(),
        };
        let secret = format!("test-{:016x}", rand::random::<u64>());
        let mut m = quiet(place(hosts.as_ref(), 0, &bin("tessera")?));
        m.args([
            "manager",
            "--listen",
            &manager.to_string(),
            "--expect",
            &spec.servers.to_string(),
        ])
        .args([
            "--partitions",
            &spec.partitions.to_string(),
            "--stripe-size",
            &spec.stripe_size,
            "--replication",
            &spec.replication.to_string(),
        ])
        .args(&spec.manager_args)
        .env("TESSERA_SECRET", &secret);
        limit_open_files(&mut m, spec.max_open_files);
        let manager_proc = m.spawn().context("starting the manager")?;
        let mut cluster = Self {
            manager,
            secret,
            spec: spec.clone(),
            manager_proc,
            servers: Vec::new(),
            hosts,
        };
        for i in 0..spec.servers {
            let s = cluster.spawn_server(i)?;
            cluster.servers.push(s);
        }
        cluster.wait_ready()?;
        Ok(cluster)
    }

    /// The emulated hosts the cluster runs on, if it does.
    #[must_use]
    pub fn hosts(&self) -> Option<&Hosts> {
        self.hosts.as_ref()
    }

    /// The host server `i` runs on (see [`ClusterSpec::hosts`]).
    #[must_use]
    pub fn server_host(&self, i: usize) -> usize {
        match self.hosts.as_ref().map(Hosts::len) {
            Some(n) if n > 1 => 1 + i % (n - 1),
            _ => 0,
        }
    }

    /// A command that runs `program` on `host` (this machine without emulated hosts).
    pub fn command(&self, host: usize, program: &std::path::Path) -> Command {
        place(self.hosts.as_ref(), host, program)
    }

    /// Server `i` listens on 127.0.0.(i+2), or on its host's every address (announcing the
    /// one it reaches the manager from), on a port of its own choosing.
    fn spawn_server(&self, i: usize) -> Result<Child> {
        let host = self.server_host(i);
        let listen = match &self.hosts {
            Some(_) => "0.0.0.0:0".to_string(),
            None => format!("127.0.0.{}:0", i + 2),
        };
        let mut s = quiet(self.command(host, &bin("tessera")?));
        s.args([
            "server",
            "--listen",
            &listen,
            "--manager",
            &self.manager.to_string(),
        ])
        .args(["--memory", &self.spec.memory])
        .args(
            self.spec
                .server_args
                .iter()
                .filter(|(k, _)| *k == i)
                .flat_map(|(_, a)| a),
        )
        .env("TESSERA_SECRET", &self.secret);
        limit_open_files(&mut s, self.spec.max_open_files);
        s.spawn().context("starting a server")
    }

    /// Starts one more server (index `servers.len()`, on the next loopback address or host);
    /// returns its index.
    pub fn add_server(&mut self) -> Result<usize> {
        let i = self.servers.len();
        let s = self.spawn_server(i)?;
        self.servers.push(s);
        Ok(i)
    }

    /// Runs `tessera ARGS` against this cluster and returns its standard output; a failure is
    /// an error carrying its standard error.
    pub fn tessera(&self, args: &[&str]) -> Result<String> {
        let out = self
            .command(0, &bin("tessera")?)
            .args(args)
            .env("TESSERA_MANAGER", self.manager.to_string())
            .env("TESSERA_SECRET", &self.secret)
            .stdin(Stdio::null())
            .output()
            .context("running tessera")?;
        if !out.status.success() {
            bail!(
                "tessera {} failed ({}): {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Starts server `i` again after it was killed (a new process, with empty memory: it
    /// joins as a new node).
    pub fn restart_server(&mut self, i: usize) -> Result<()> {
        self.servers[i] = self.spawn_server(i)?;
        Ok(())
    }

    /// Polls the manager's status through worker `w` until `done` holds for it, for at most
    /// `within`; returns the last status. (A worker connected before a failure: a new client
    /// cannot connect while the root directory's partition is lost.)
    pub fn wait_status(
        w: &mut Worker,
        within: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let deadline = Instant::now() + within;
        loop {
            let st = w.ok(&json!({"cmd": "status"}))?;
            if done(&st) {
                return Ok(st);
            }
            if Instant::now() > deadline {
                bail!("status did not settle within {within:?}: {st}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut w = self.worker()?;
            match w.call(&json!({"cmd": "stat", "path": "/"})) {
                Ok(v) if v["ok"] == true => return Ok(()),
                _ if Instant::now() > deadline => bail!("cluster did not become ready within 60 s"),
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
            if let Some(status) = self.manager_proc.try_wait()? {
                bail!("the manager exited early: {status}");
            }
        }
    }

    /// A client in a separate process, connected to this cluster (on host 0).
    pub fn worker(&self) -> Result<Worker> {
        self.worker_on(0)
    }

    /// A client in a separate process on `host`, connected to this cluster.
    pub fn worker_on(&self, host: usize) -> Result<Worker> {
        Worker::start(
            self.command(host, &bin("tessera-worker")?),
            self.manager,
            &self.secret,
        )
    }

    /// Mounts the cluster on `dir` with `tessera mount ARGS` in its own process; waits until the
    /// mount is there. The mount is undone when the returned guard is dropped.
    pub fn mount(&self, dir: &std::path::Path, args: &[&str]) -> Result<Mount> {
        self.mount_on(0, dir, args)
    }

    /// [`Cluster::mount`] by a process on `host` (the mount is seen from the whole machine).
    pub fn mount_on(&self, host: usize, dir: &std::path::Path, args: &[&str]) -> Result<Mount> {
        use std::os::unix::fs::MetadataExt;
        anyhow::ensure!(
            std::path::Path::new("/dev/fuse").exists(),
            "FUSE tests need /dev/fuse (and root)"
        );
        std::fs::create_dir_all(dir)?;
        let before = std::fs::metadata(dir)?.dev();
        let mut cmd = quiet(self.command(host, &bin("tessera")?));
        // Its log beside the directory, for a test to show when the mount misbehaves.
        let log = dir.with_extension("mount.log");
        if std::env::var_os("TESSERA_TEST_LOGS").is_none() {
            cmd.stderr(std::fs::File::create(&log)?);
        }
        cmd.args(["mount", &dir.to_string_lossy()])
            .args(args)
            .env("TESSERA_MANAGER", self.manager.to_string())
            .env("TESSERA_SECRET", &self.secret);
        let mut child = cmd.spawn().context("starting tessera mount")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::fs::metadata(dir).map(|m| m.dev()).unwrap_or(before) == before {
            if let Some(status) = child.try_wait()? {
                bail!("tessera mount exited: {status}");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("{} was not mounted within 30 s", dir.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let connection = libc::minor(std::fs::metadata(dir)?.dev());
        Ok(Mount {
            child,
            dir: dir.to_path_buf(),
            connection,
            log,
        })
    }

    /// The cluster as its manager reports it (nodes with their addresses, the table's state).
    pub async fn status(&self) -> Result<tessera_proto::ClusterStatus> {
        use tessera_proto::{BufferPool, Request, Response, RpcClient, RpcConfig, Secret};
        // This process is not on the hosts' network: ask a worker there.
        anyhow::ensure!(
            self.hosts.is_none(),
            "Cluster::status from outside the emulated hosts"
        );
        let cfg = RpcConfig::new(
            Secret::new(&self.secret),
            Arc::new(BufferPool::new(1 << 20, 4)),
        );
        let manager = RpcClient::connect(self.manager, &cfg).await?;
        match manager.call(&Request::GetStatus, Bytes::new()).await?.0 {
            Response::Status(status) => Ok(status),
            other => bail!("the manager answered {other:?} to GetStatus"),
        }
    }

    /// Kills server `i` (SIGKILL, as a crash would).
    pub fn kill_server(&mut self, i: usize) -> Result<()> {
        self.servers[i].kill()?;
        self.servers[i].wait()?;
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for c in self
            .servers
            .iter_mut()
            .chain(std::iter::once(&mut self.manager_proc))
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A running `tessera mount`; unmounts (SIGTERM, as Ctrl-C would) when dropped.
pub struct Mount {
    child: Child,
    pub dir: PathBuf,
    /// Its FUSE connection (`/sys/fs/fuse/connections/N`).
    connection: u32,
    /// Where its standard error goes (unless `TESSERA_TEST_LOGS` is set).
    log: PathBuf,
}

impl Mount {
    /// What the mount process has written to its standard error so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `signal` to the mount's process (SIGINT is Ctrl-C), unless it has ended.
    pub fn signal(&mut self, signal: i32) {
        if self.ended().map_or(true, |s| s.is_none()) {
            // SAFETY: signalling our own child, not reaped yet (so its pid is still its own).
            unsafe { libc::kill(self.child.id() as i32, signal) };
        }
    }

    /// The process's exit status, if it has ended.
    pub fn ended(&mut self) -> Result<Option<std::process::ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits for the process to end by itself, for at most `within`.
    pub fn wait_end(&mut self, within: Duration) -> Result<std::process::ExitStatus> {
        let mut ended = Ok(None);
        wait_until(within, || {
            ended = self.child.try_wait();
            !matches!(ended, Ok(None))
        })
        .context("tessera mount still runs")?;
        ended?.context("tessera mount still runs")
    }

    /// Kills the process (SIGKILL, as a crash would), which leaves a dead mount behind. A
    /// process stuck on a request to its own mount cannot die until the connection is aborted:
    /// that is done, so the test goes on, and reported as an error.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        if self.wait_end(Duration::from_secs(20)).is_ok() {
            return Ok(());
        }
        let abort = format!("/sys/fs/fuse/connections/{}/abort", self.connection);
        std::fs::write(&abort, "1").with_context(|| format!("aborting through {abort}"))?;
        self.child.wait()?;
        bail!("the killed mount process did not end until its FUSE connection was aborted")
    }
}

/// Polls `done` until it holds, for at most `within`.
pub fn wait_until(within: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + within;
    while !done() {
        anyhow::ensure!(Instant::now() < deadline, "not done within {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Is `dir` a mount point, also a dead one ("transport endpoint is not connected")?
pub fn mounted(dir: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let parent = dir.parent().and_then(|p| std::fs::metadata(p).ok());
    match std::fs::metadata(dir) {
        Ok(m) => parent.is_some_and(|p| p.dev() != m.dev()),
        Err(e) => e.raw_os_error() == Some(libc::ENOTCONN),
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        self.signal(libc::SIGTERM);
        if self.wait_end(Duration::from_secs(10)).is_err() {
            let _ = self.kill();
        }
        if mounted(&self.dir) {
            let _ = Command::new(bin("tessera").unwrap_or_default())
                .arg("umount")
                .arg(&self.dir)
                .status();
        }
    }
}

/// `program` run on `host` of `hosts`, or here.
fn place(hosts: Option<&Hosts>, host: usize, program: &std::path::Path) -> Command {
    match hosts {
        Some(h) => h.command(host, program),
        None => Command::new(program),
    }
}

/// A `tessera-worker` process: send it JSON commands, get JSON replies.
pub struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    pub fn spawn(manager: SocketAddr, secret: &str) -> Result<Self> {
        Self::start(Command::new(bin("tessera-worker")?), manager, secret)
    }

    /// Starts `cmd`, which runs `tessera-worker`, as a client of `manager`.
    fn start(mut cmd: Command, manager: SocketAddr, secret: &str) -> Result<Self> {
        cmd.env("TESSERA_MANAGER", manager.to_string())
            .env("TESSERA_SECRET", secret)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        if std::env::var_os("TESSERA_TEST_LOGS").is_none() {
            cmd.stderr(Stdio::null());
        }
        let mut child = cmd.spawn().context("starting tessera-worker")?;
        let stdin = child.stdin.take().context("worker stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("worker stdout")?);
        Ok(Self {
            child,
            stdin,
            stdout,
        })
    }

    /// Sends `signal` to the worker process (say `SIGSTOP`, to play a client that hangs).
    pub fn signal(&self, signal: i32) {
        // SAFETY: a plain kill(2) of our own child, which is not reaped before `Drop`.
        unsafe {
            libc::kill(self.child.id() as i32, signal);
        }
    }

    /// Sends one command and returns its reply (`{"ok": true, ...}` or `{"ok": false, "errno": N, "error": "..."}`).
    pub fn call(&mut self, cmd: &Value) -> Result<Value> {
        writeln!(self.stdin, "{cmd}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("worker exited while running {cmd}");
        }
        Ok(serde_json::from_str(&line)?)
    }

    /// Like `call`, but a failed command is an error.
    pub fn ok(&mut self, cmd: &Value) -> Result<Value> {
        let v = self.call(cmd)?;
        if v["ok"] != true {
            bail!("{cmd} failed: {v}");
        }
        Ok(v)
    }

    /// Like `call`, but the command must fail with `errno`.
    pub fn fails(&mut self, cmd: &Value, errno: i32) -> Result<()> {
        let v = self.call(cmd)?;
        if v["ok"] != false || v["errno"] != errno {
            bail!("{cmd}: expected errno {errno}, got {v}");
        }
        Ok(())
    }
}

/// Reads each `(path, len, seed)` back through `w` and checks it against its pattern.
pub fn verify_files(w: &mut Worker, files: &[(String, u64, u64)]) -> Result<()> {
    for (path, len, seed) in files {
        let v = w.ok(&json!({"cmd": "read_file", "path": path}))?;
        anyhow::ensure!(
            v["len"] == *len,
            "{path}: length {} instead of {len}",
            v["len"]
        );
        anyhow::ensure!(
            v["hash"] == digest(&pattern(*seed, 0, *len as usize)),
            "{path}: the bytes read back differ from those written"
        );
    }
    Ok(())
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Raw requests to the servers, as a client holding the cluster secret may send them: for
/// protocol-level tests of what the servers accept. Each goes to the primary of its partition
/// under the manager's current table.
pub struct Raw {
    rpc: RpcConfig,
    manager: SocketAddr,
    info: TableInfo,
    conns: HashMap<NodeId, RpcClient>,
}

impl Raw {
    pub async fn connect(manager: SocketAddr, secret: &str) -> Result<Self> {
        let rpc = RpcConfig::new(Secret::new(secret), Arc::new(BufferPool::new(1 << 20, 4)));
        let info = Self::table(manager, &rpc).await?;
        Ok(Self {
            rpc,
            manager,
            info,
            conns: HashMap::new(),
        })
    }

    async fn table(manager: SocketAddr, rpc: &RpcConfig) -> Result<TableInfo> {
        let conn = RpcClient::connect(manager, rpc).await?;
        match conn.call(&Request::GetTable, Bytes::new()).await?.0 {
            Response::Table(info) => Ok(info),
            other => bail!("no table from the manager: {other:?}"),
        }
    }

    /// The partition table requests are routed with.
    #[must_use]
    pub fn info(&self) -> &TableInfo {
        &self.info
    }

    async fn conn(&mut self, node: NodeId) -> Result<&RpcClient> {
        if self.conns.get(&node).is_none_or(RpcClient::is_closed) {
            let addr = self
                .info
                .nodes
                .iter()
                .find(|n| n.id == node)
                .context("a replica without an address")?
                .addr;
            self.conns
                .insert(node, RpcClient::connect(addr, &self.rpc).await?);
        }
        Ok(&self.conns[&node])
    }

    /// The answers to `op` of the primary of its partition, or of every replica (primary
    /// first), once the table has settled enough for them all to take it.
    async fn send(&mut self, op: &Op, every: bool) -> Result<Vec<Response>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        'again: loop {
            let p = op
                .partition(self.info.config.partitions)
                .context("a node-wide operation")?;
            let mut nodes = self.info.table.replicas(p).to_vec();
            nodes.truncate(if every { nodes.len() } else { 1 });
            let mut answers = Vec::new();
            for node in &nodes {
                let req = Request::Op {
                    epoch: self.info.table.epoch(),
                    op: op.clone(),
                };
                let resp = self.conn(*node).await?.call(&req, Bytes::new()).await?.0;
                if let Response::Error(ErrorCode::StaleEpoch { .. } | ErrorCode::NotReady(_)) = resp
                {
                    if Instant::now() > deadline {
                        bail!("the table did not settle: {resp:?}");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    self.info = Self::table(self.manager, &self.rpc).await?;
                    continue 'again;
                }
                answers.push(resp);
            }
            return Ok(answers);
        }
    }

    /// Sends `op` to the primary of its partition; its answer.
    pub async fn call(&mut self, op: &Op) -> Result<Response> {
        self.send(op, false)
            .await?
            .pop()
            .context("the partition has no replica")
    }

    /// Sends a read to every replica of its partition: their answers, primary first.
    pub async fn everywhere(&mut self, op: &Op) -> Result<Vec<Response>> {
        self.send(op, true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_position_not_on_how_it_is_cut() {
        let whole = pattern(7, 3, 100);
        let mut parts = pattern(7, 3, 37);
        parts.extend(pattern(7, 40, 63));
        assert_eq!(whole, parts);
        assert_ne!(pattern(7, 0, 64), pattern(8, 0, 64));
    }
}
