//! `tessera evaluate CONFIGS.toml`: each candidate cluster built as emulated hosts (a server
//! on every host; the manager on host 0; the mount and the workload on host 0, or with
//! `--every-host` on every host at once), the workload run there several times and measured,
//! then ranked by time and by cost (docs/EVALUATE.md).

use anyhow::{bail, Context, Result};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_evaluate::{rank, Candidate, Plan, Run, Verdict};
use tessera_hosts::{Hosts, Limits, Link, Spec};
use tessera_proto::ClusterStatus;

#[derive(clap::Args, Debug, Clone)]
pub struct EvaluateArgs {
    /// The candidates, their price table and the runs (TOML; docs/EVALUATE.md).
    configs: PathBuf,
    /// A shell command run in a fresh directory on the mount (`$TESSERA_DIR`), as the workload.
    #[arg(long, conflicts_with = "model", required_unless_present = "model")]
    workload: Option<String>,
    /// Run the workload on every host at once, each through its own mount, in the same
    /// directory (`$TESSERA_HOST` of `$TESSERA_HOSTS` tells each which it is); a run lasts until
    /// the last host ends.
    #[arg(long)]
    every_host: bool,
    /// Silence after which a candidate's manager declares a server dead: long, as hosts share
    /// this machine's cores and one starved of them may not heartbeat for seconds.
    #[arg(long, value_parser = crate::parse_duration, default_value = "30s")]
    dead_after: Duration,
    /// An I/O model (`tessera profile`) replayed on the mount, as the workload.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The report (HTML) goes here.
    #[arg(short, long, default_value = "evaluation.html")]
    output: PathBuf,
    /// Also write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Memory a host has beyond its server's: the processes themselves and, where they run, the mount
/// and the workload.
const HOST_OVERHEAD: u64 = 768 << 20;
const MANAGER_PORT: u16 = 7070;
/// How long a cluster of emulated hosts may take to come up.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// Evaluates until done, or until Ctrl-C or SIGTERM: then the run in progress is stopped and
/// the emulated hosts and the mount are taken down before returning.
pub async fn run(args: &EvaluateArgs) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let mut signals = crate::StopSignals::new()?;
    let (args, flag) = (args.clone(), Arc::clone(&stop));
    let mut work = tokio::task::spawn_blocking(move || evaluate(&args, &Stop(flag)));
    tokio::select! {
        r = &mut work => return r.context("the evaluation")?,
        () = signals.recv() => {}
    }
    stop.store(true, Ordering::SeqCst);
    eprintln!("interrupted: taking the emulated hosts down");
    work.await.context("the evaluation")??;
    bail!("interrupted")
}

/// Set on Ctrl-C: every wait checks it.
struct Stop(Arc<AtomicBool>);

impl Stop {
    fn check(&self) -> Result<()> {
        if self.0.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        Ok(())
    }
}

fn evaluate(args: &EvaluateArgs, stop: &Stop) -> Result<()> {
    if args.every_host && args.workload.is_none() {
        bail!(
            "--every-host runs a shell command on every host: give it with --workload CMD (a \
             model replays on host 0 only)"
        );
    }
    let text = std::fs::read_to_string(&args.configs)
        .with_context(|| format!("reading {}", args.configs.display()))?;
    let plan = Plan::parse(&text)?;
    let workload = match (&args.workload, &args.model) {
        (Some(cmd), _) => Workload::Command(cmd.clone()),
        (None, Some(model)) => Workload::Model(
            std::fs::canonicalize(model).with_context(|| format!("{}", model.display()))?,
        ),
        (None, None) => bail!("give the workload: --workload CMD or --model MODEL"),
    };
    let mut runs = Vec::with_capacity(plan.candidates.len());
    for c in &plan.candidates {
        eprintln!(
            "{}: {} hosts, {} cores and {} each, {} bit/s links, {:?} latency",
            c.name,
            c.hosts,
            c.cores,
            crate::up::human(c.memory),
            c.bandwidth_bps,
            c.latency
        );
        let cluster = Emulated::start(c, args, stop)?;
        let mut measured = Vec::with_capacity(plan.runs as usize);
        for k in 0..plan.runs {
            let r = cluster
                .measure(&workload, k, stop)
                .with_context(|| format!("{}: run {}", c.name, k + 1))?;
            eprintln!("  run {}: {:.2} s", k + 1, r.seconds);
            measured.push(r);
        }
        // Kept only when something failed.
        let _ = std::fs::remove_file(cluster.log());
        drop(cluster);
        runs.push(measured);
    }
    let machine_cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let verdict = rank(&plan, &runs, machine_cores);
    print(&verdict);
    let html = tessera_report::evaluate_report(
        &verdict,
        "Tessera: configurations evaluated",
        &format!("{} with {}", args.configs.display(), workload.describe()),
    );
    std::fs::write(&args.output, html)
        .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!("report: {}", args.output.display());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&verdict)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

enum Workload {
    Command(String),
    Model(PathBuf),
}

impl Workload {
    fn describe(&self) -> String {
        match self {
            Workload::Command(c) => format!("the workload `{c}`"),
            Workload::Model(m) => format!("the model {}", m.display()),
        }
    }
}

fn print(v: &Verdict) {
    println!(
        "{:<16} {:>5} {:>9} {:>15} {:>10} {:>12}  bound",
        "configuration", "hosts", "time (s)", "min-max", "perf/$", "cloud/run"
    );
    for o in &v.outcomes {
        println!(
            "{:<16} {:>5} {:>9.2} {:>7.2}-{:<7.2} {:>10.2} {:>12.4}  {}",
            o.name,
            o.hosts,
            o.seconds.median,
            o.seconds.min,
            o.seconds.max,
            o.perf_per_dollar,
            o.cloud_cost,
            o.bound.words()
        );
    }
    println!("{}", v.recommendation);
    match v.scaling.worst_error() {
        Some(e) => println!(
            "Scaling model: worst error {:.0} % on a configuration left out of its fit.",
            e * 100.0
        ),
        None => println!(
            "{}",
            v.scaling
                .note
                .as_deref()
                .unwrap_or("Scaling model: not checked")
        ),
    }
}

/// A candidate cluster on emulated hosts, mounted on host 0 or on every host.
struct Emulated {
    hosts: Hosts,
    manager: String,
    secret: String,
    procs: Vec<Child>,
    /// Holds the mount points, `h0` to `hN` (host i's mount).
    base: PathBuf,
    mounts: Vec<PathBuf>,
}

impl Emulated {
    fn start(c: &Candidate, args: &EvaluateArgs, stop: &Stop) -> Result<Self> {
        let hosts = Hosts::start(&Spec {
            hosts: c.hosts as usize,
            limits: Limits {
                cpus: Some(c.cores),
                memory: Some(c.memory + HOST_OVERHEAD),
            },
            link: Link {
                bandwidth: Some(c.bandwidth_bps),
                latency: c.latency,
                loss: c.loss / 100.0,
            },
        })
        .context("making the emulated hosts (root is needed)")?;
        let manager = format!("{}:{MANAGER_PORT}", hosts.addr(0));
        let base = std::env::temp_dir().join(format!(
            "tessera-evaluate-{}-{}",
            std::process::id(),
            c.name
        ));
        let clients = if args.every_host { c.hosts as usize } else { 1 };
        let mut e = Self {
            manager,
            secret: format!("evaluate-{:016x}", rand::random::<u64>()),
            procs: Vec::new(),
            mounts: (0..clients).map(|i| base.join(format!("h{i}"))).collect(),
            base,
            hosts,
        };
        let manager = e.manager.clone();
        let dead_after = format!("{}ms", args.dead_after.as_millis());
        let (stripe, memory) = (c.stripe.to_string(), c.memory.to_string());
        let (expect, replication) = (c.hosts.to_string(), c.replication.to_string());
        e.spawn(
            0,
            &[
                "manager",
                "--listen",
                &manager,
                "--expect",
                &expect,
                "--stripe-size",
                &stripe,
                "--replication",
                &replication,
                "--dead-after",
                &dead_after,
            ],
        )?;
        for i in 0..c.hosts as usize {
            e.spawn(
                i,
                &[
                    "server",
                    "--listen",
                    "0.0.0.0:0",
                    "--manager",
                    &manager,
                    "--memory",
                    &memory,
                ],
            )?;
        }
        e.wait_ready(c.hosts, stop)?;
        for i in 0..e.mounts.len() {
            std::fs::create_dir_all(&e.mounts[i])?;
            let mount = e.mounts[i].to_string_lossy().into_owned();
            e.spawn(i, &["mount", &mount])?;
        }
        for i in 0..e.mounts.len() {
            e.wait_mounted(i, stop)?;
        }
        Ok(e)
    }

    /// Starts `tessera ARGS` on host `i`, kept until [`Self::stop`]; what it says goes to
    /// [`Self::log`].
    fn spawn(&mut self, i: usize, args: &[&str]) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())?;
        let child = self
            .tessera(i)?
            .args(args)
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting tessera {}", args[0]))?;
        self.procs.push(child);
        Ok(())
    }

    /// The log of every process of the cluster, kept after a failure.
    fn log(&self) -> PathBuf {
        self.base.with_extension("log")
    }

    /// `program` on host `i`, told where the cluster is.
    fn on_host(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = self.hosts.command(i, program);
        c.env("TESSERA_MANAGER", &self.manager)
            .env("TESSERA_SECRET", &self.secret)
            .stdin(Stdio::null());
        c
    }

    fn tessera(&self, i: usize) -> Result<Command> {
        Ok(self.on_host(i, std::env::current_exe()?))
    }

    fn status(&self) -> Result<ClusterStatus> {
        let out = self.tessera(0)?.args(["status", "--json"]).output()?;
        if !out.status.success() {
            bail!(
                "tessera status: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        serde_json::from_slice(&out.stdout).context("tessera status --json")
    }

    fn wait_ready(&self, servers: u32, stop: &Stop) -> Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            stop.check()?;
            if let Ok(s) = self.status() {
                let alive = s.nodes.iter().filter(|n| n.alive).count();
                if s.epoch.is_some() && alive == servers as usize {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the cluster on emulated hosts was not ready within {READY_WITHIN:?} (its \
                     log: {})",
                    self.log().display()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_mounted(&self, i: usize, stop: &Stop) -> Result<()> {
        use std::os::unix::fs::MetadataExt;
        let mount = &self.mounts[i];
        let parent = std::fs::metadata(&self.base)?.dev();
        let deadline = Instant::now() + READY_WITHIN;
        while std::fs::metadata(mount)?.dev() == parent {
            stop.check()?;
            if Instant::now() > deadline {
                bail!(
                    "{} (host {i}) was not mounted within {READY_WITHIN:?} (the cluster's \
                     log: {})",
                    mount.display(),
                    self.log().display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The counters once the servers' heartbeats reported all the workload did: the same in
    /// two samples a heartbeat and more apart (at most a few seconds).
    fn settled(&self) -> Result<Counters> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut last = Counters::take(self)?;
        loop {
            std::thread::sleep(Duration::from_millis(700));
            let now = Counters::take(self)?;
            if (now.bytes, now.ops) == (last.bytes, last.ops) || Instant::now() > deadline {
                return Ok(now);
            }
            last = now;
        }
    }

    /// Runs the workload once in a fresh directory (on every mount at once, or on host 0's)
    /// and measures it; the directory is removed after.
    fn measure(&self, w: &Workload, k: u32, stop: &Stop) -> Result<Run> {
        let run = format!("run-{k}");
        std::fs::create_dir_all(self.mounts[0].join(&run))?;
        let mut cmds = Vec::with_capacity(self.mounts.len());
        match w {
            Workload::Command(c) => {
                for (i, mount) in self.mounts.iter().enumerate() {
                    let dir = mount.join(&run);
                    let mut cmd = self.on_host(i, "sh");
                    cmd.args(["-c", c])
                        .current_dir(&dir)
                        .env("TESSERA_DIR", &dir)
                        .env("TESSERA_MOUNT", mount)
                        .env("TESSERA_HOST", i.to_string())
                        .env("TESSERA_HOSTS", self.mounts.len().to_string());
                    cmds.push(cmd);
                }
            }
            Workload::Model(m) => {
                let mut cmd = self.tessera(0)?;
                cmd.arg("replay")
                    .arg(m)
                    .arg("--dir")
                    .arg(self.mounts[0].join(&run))
                    .stdout(Stdio::null());
                cmds.push(cmd);
            }
        }
        let before = Counters::take(self)?;
        let t = Instant::now();
        let mut running = Workers::default();
        for (i, cmd) in cmds.iter_mut().enumerate() {
            // Its own process group: stopping it stops what it started too.
            cmd.process_group(0);
            let child = cmd
                .spawn()
                .with_context(|| format!("starting the workload on host {i}"))?;
            running.0.push((i, child));
        }
        let mut host_seconds = vec![0.0; cmds.len()];
        let mut peak = 0;
        while !running.0.is_empty() {
            stop.check()?;
            let mut j = 0;
            while j < running.0.len() {
                let (i, child) = &mut running.0[j];
                match child.try_wait()? {
                    None => j += 1,
                    Some(s) if s.success() => {
                        host_seconds[*i] = t.elapsed().as_secs_f64();
                        running.0.swap_remove(j);
                    }
                    Some(s) => {
                        let i = *i;
                        // Dropping the others stops them.
                        bail!("the workload failed on host {i}: {s}");
                    }
                }
            }
            if let Ok(s) = self.status() {
                peak = peak.max(s.nodes.iter().map(|n| n.stats.used).sum());
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let seconds = t.elapsed().as_secs_f64();
        let after = self.settled()?;
        peak = peak.max(after.used);
        let dir = self.mounts[0].join(&run);
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        let (busiest_cpu_seconds, busiest_link_bytes) = after.busiest(&before);
        Ok(Run {
            busiest_cpu_seconds,
            busiest_link_bytes,
            seconds,
            bytes: after.bytes - before.bytes.min(after.bytes),
            ops: after.ops - before.ops.min(after.ops),
            memory_peak: peak,
            cpu_seconds: (after.cpu - before.cpu).max(0.0),
            iowait_seconds: (after.iowait - before.iowait).max(0.0),
            link_bytes: after.link_bytes - before.link_bytes.min(after.link_bytes),
            host_seconds: if cmds.len() > 1 {
                host_seconds
            } else {
                Vec::new()
            },
        })
    }
}

/// The workload's processes still running, by host; dropped (a failure elsewhere, Ctrl-C),
/// each is killed with everything it started.
#[derive(Default)]
struct Workers(Vec<(usize, Child)>);

impl Drop for Workers {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            // SAFETY: a signal to the process group of a child of ours (its id).
            unsafe { libc::killpg(child.id() as i32, libc::SIGKILL) };
            let _ = child.wait();
        }
    }
}

/// Unmounts and stops the cluster, also after a failure (the hosts go after it).
impl Drop for Emulated {
    fn drop(&mut self) {
        for m in &self.mounts {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        for p in &mut self.procs {
            // SIGINT: the mount and the servers end cleanly.
            // SAFETY: a plain signal to a child of ours.
            unsafe { libc::kill(p.id() as i32, libc::SIGINT) };
        }
        for p in &mut self.procs {
            let _ = p.wait();
        }
        for m in &self.mounts {
            let _ = std::fs::remove_dir(m);
        }
        let _ = std::fs::remove_dir(&self.base);
    }
}

/// What the measures are differences of.
struct Counters {
    bytes: u64,
    ops: u64,
    /// Bytes the servers hold.
    used: u64,
    /// Seconds of CPU of every host.
    cpu: f64,
    /// Seconds the machine's CPUs waited for I/O.
    iowait: f64,
    /// Bytes every host sent on its link.
    link_bytes: u64,
    /// Per host: CPU seconds, and bytes through its link (received, sent).
    per_host: Vec<(f64, u64, u64)>,
}

impl Counters {
    fn take(e: &Emulated) -> Result<Self> {
        let s = e.status()?;
        let (mut bytes, mut ops, mut used) = (0, 0, 0);
        for n in &s.nodes {
            used += n.stats.used;
            bytes += n.stats.bytes_read + n.stats.bytes_written;
            ops += n.stats.reads + n.stats.writes + n.stats.meta_ops;
        }
        let mut per_host = Vec::with_capacity(e.hosts.len());
        for i in 0..e.hosts.len() {
            let (rx, tx) = e.hosts.run_in(i, link_bytes)??;
            per_host.push((e.hosts.usage(i)?.cpu.as_secs_f64(), rx, tx));
        }
        let cpu = per_host.iter().map(|h| h.0).sum();
        let link_bytes = per_host.iter().map(|h| h.2).sum();
        Ok(Self {
            bytes,
            ops,
            used,
            cpu,
            iowait: iowait_seconds()?,
            link_bytes,
            per_host,
        })
    }

    /// The busiest host's CPU seconds and its link's bytes both ways, since `before`. Both
    /// ways: a workload's writes and reads come in turn, each one way, so a link is as busy
    /// as the two directions together.
    fn busiest(&self, before: &Self) -> (f64, u64) {
        let deltas = self.per_host.iter().zip(&before.per_host);
        let cpu = deltas.clone().map(|(a, b)| a.0 - b.0).fold(0.0, f64::max);
        let link = deltas
            .map(|(a, b)| a.1.saturating_sub(b.1) + a.2.saturating_sub(b.2))
            .max()
            .unwrap_or(0);
        (cpu, link)
    }
}

/// Bytes received and sent on `eth0` of the network this thread is in.
fn link_bytes() -> Result<(u64, u64)> {
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev")?;
    dev.lines()
        .find_map(|l| {
            let (name, rest) = l.split_once(':')?;
            if name.trim() != "eth0" {
                return None;
            }
            // Received bytes first; 8 receive fields, then sent bytes.
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(8)?.parse().ok()?))
        })
        .context("no eth0 in the host's /proc/net/dev")
}

/// The machine's I/O wait so far (`/proc/stat`, all CPUs), seconds.
fn iowait_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let ticks: f64 = stat
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(5)?.parse().ok())
        .context("no iowait in /proc/stat")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks / hz.max(1.0))
}
