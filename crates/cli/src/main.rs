//! `tessera`: run and use a Tessera cluster.

mod bench;
mod collect;
mod config;
mod copy;
mod evaluate;
mod files;
mod fsck;
mod latency;
mod mount;
mod profile;
mod replay;
mod report;
mod scale;
mod status;
mod stream;
mod trace;
#[cfg(feature = "parquet")]
mod trace_parquet;
mod up;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;
use tessera_client::{Client, ClientOptions, WriteAck};
use tessera_proto::{ClusterConfig, Secret};

#[derive(Parser, Debug)]
#[command(
    name = "tessera",
    version,
    about = "An elastic in-memory file system for scientific workflows"
)]
struct Cli {
    /// Configuration file (TOML); see docs/CLI.md.
    #[arg(long, global = true, env = "TESSERA_CONFIG")]
    config: Option<PathBuf>,
    /// Address of the manager (HOST:PORT).
    #[arg(long, global = true, env = "TESSERA_MANAGER")]
    manager: Option<String>,
    /// The cluster secret every member and client must know.
    #[arg(long, global = true, env = "TESSERA_SECRET", hide_env_values = true)]
    secret: Option<String>,
    /// With mirrors, when a write counts as done: when `all` replicas have it (default), or
    /// the `primary` (mirrors follow, flushed by fsync and close; see docs/SEMANTICS.md).
    #[arg(long, global = true, env = "TESSERA_WRITE_ACK", value_enum)]
    write_ack: Option<WriteAckArg>,
    /// Keep this node's CPUs from halting while the command runs (PM QoS, needs root): wake-ups
    /// between processes get several times cheaper, at the price of idle CPU time; see
    /// docs/CLI.md.
    #[arg(long, global = true, env = "TESSERA_LOW_LATENCY")]
    low_latency: bool,
    /// More log output (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy)]
enum WriteAckArg {
    All,
    Primary,
}

impl Cli {
    /// Client options for this invocation's cluster.
    fn client_options(&self, manager: std::net::SocketAddr, secret: &str) -> ClientOptions {
        let mut opts = ClientOptions::new(manager, secret);
        opts.write_ack = match self.write_ack {
            Some(WriteAckArg::Primary) => WriteAck::Primary,
            Some(WriteAckArg::All) | None => WriteAck::All,
        };
        opts
    }
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Start a whole cluster on this machine (manager and servers on 127.0.0.x) until Ctrl-C.
    Up(up::UpArgs),
    /// Run the manager in the foreground.
    Manager(ManagerArgs),
    /// Run a storage server in the foreground.
    Server(ServerArgs),
    /// Mount the cluster on a directory (FUSE) until Ctrl-C.
    Mount(mount::MountArgs),
    /// Unmount a Tessera mount (also one whose process died).
    Umount(mount::UmountArgs),
    /// Nodes, partitions and memory at a glance.
    Status(status::StatusArgs),
    /// Copy files and trees in, out and within the cluster (cluster paths start with `tessera:`).
    Cp(copy::CpArgs),
    /// List directories.
    Ls(files::LsArgs),
    /// Show a file's attributes.
    Stat(files::StatArgs),
    /// Remove files (and trees with -r).
    Rm(files::RmArgs),
    /// Create directories.
    Mkdir(files::MkdirArgs),
    /// Print files to standard output.
    Cat(files::CatArgs),
    /// Be one of N writers of one output made of standard input's lines (sorted with --key):
    /// a collective output (docs/SEMANTICS.md).
    Collect(collect::CollectArgs),
    /// Find inodes no name reaches (left by clients that died mid-operation) and, with
    /// --repair, reclaim them.
    Fsck(fsck::FsckArgs),
    /// Measure throughput and metadata rates through the client library.
    Bench(bench::BenchArgs),
    /// Plot memory allocated and used over time (HTML with an SVG chart, or --json).
    Report(report::ReportArgs),
    /// Build the I/O model of a trace (application, files, phases) as JSON (docs/MODEL.md).
    Profile(profile::ProfileArgs),
    /// Run an I/O model against a directory and measure it, check the replay against the
    /// original trace, or export the model for IOR, fio or mdtest; see docs/MODEL.md.
    Replay(replay::ReplayArgs),
    /// Rank cluster configurations for a workload: each built as emulated hosts, the workload
    /// run and measured there, compared by time and cost (docs/EVALUATE.md; needs root).
    Evaluate(evaluate::EvaluateArgs),
    /// Grow or shrink a running cluster (servers from the manager's provisioner; removed
    /// servers are drained first).
    Scale(scale::ScaleArgs),
    /// I/O traces of a mount: start and stop tracing, summarise a trace, export it (Chrome
    /// trace JSON for Perfetto, fio iolog); see docs/TRACING.md.
    Trace(trace::TraceArgs),
}

#[derive(clap::Args, Debug)]
struct ManagerArgs {
    /// Address for servers and clients.
    #[arg(long)]
    listen: Option<String>,
    /// Address of the HTTP admin API (/status, /table, /metrics).
    #[arg(long)]
    http: Option<String>,
    /// Servers that must join before the partition table is built.
    #[arg(long)]
    expect: Option<u32>,
    #[command(flatten)]
    shape: ClusterArgs,
    /// Where new servers come from for `tessera scale --add` and the elastic policy: `local`
    /// (server processes on this machine, on the next free 127.0.0.k) or a command, run as
    /// `CMD add` to get a server and `CMD remove` to release one (docs/CLI.md).
    #[arg(long)]
    provision: Option<String>,
    /// Memory each server started by `--provision local` offers.
    #[arg(long, default_value = "1GiB")]
    node_memory: String,
    #[command(flatten)]
    elastic: ElasticArgs,
}

/// The shape of a new cluster, shared by `manager` and `up`.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// Partitions, fixed for the cluster's life; bounds how far it scales out (default 1024).
    #[arg(long)]
    partitions: Option<u32>,
    /// Stripe size, a multiple of 1 MiB (default 1MiB).
    #[arg(long)]
    stripe_size: Option<String>,
    /// Copies of every partition (default 1).
    #[arg(long)]
    replication: Option<u8>,
    /// Silence after which a server is declared dead and its partitions are rebuilt elsewhere
    /// (e.g. 2s, 500ms; default 2s). Servers heartbeat every 500 ms.
    #[arg(long, value_parser = parse_duration)]
    dead_after: Option<Duration>,
    /// How long the open files of a client that stopped renewing its lease (it died or was cut
    /// off) stay open (e.g. 30s, at least 300ms; default 30s): then they are closed for it,
    /// and deleted if they were unlinked. Clients renew every third of it.
    #[arg(long, value_parser = parse_duration)]
    open_lease: Option<Duration>,
}

/// The elastic policy, shared by `manager` and `up`.
#[derive(clap::Args, Debug, Clone)]
pub struct ElasticArgs {
    /// Grow the cluster when memory use passes --scale-high and shrink it below --scale-low
    /// (servers come from --provision; `up --elastic` starts local ones).
    #[arg(long)]
    elastic: bool,
    /// Memory use above which servers are added (e.g. 90% or 0.9).
    #[arg(long, default_value = "90%")]
    scale_high: String,
    /// Memory use below which servers are drained and removed.
    #[arg(long, default_value = "50%")]
    scale_low: String,
    /// Servers added or removed at a time: a count (2) or a share of the current ones (25%).
    #[arg(long, default_value = "25%")]
    scale_step: String,
    /// Fewest servers the policy keeps (at least the replication factor).
    #[arg(long)]
    min_nodes: Option<usize>,
    /// Most servers the policy runs.
    #[arg(long)]
    max_nodes: Option<usize>,
    /// Pause after each decision before the next (default 10s).
    #[arg(long, value_parser = parse_duration)]
    scale_cooldown: Option<Duration>,
}

impl ElasticArgs {
    /// The policy, checked, if `--elastic`.
    pub fn policy(&self, replication: u8) -> Result<Option<tessera_manager::policy::PolicyConfig>> {
        use tessera_manager::policy::{parse_mark, PolicyConfig, Step};
        if !self.elastic {
            return Ok(None);
        }
        let d = PolicyConfig::default();
        let cfg = PolicyConfig {
            high: parse_mark(&self.scale_high).context("--scale-high")?,
            low: parse_mark(&self.scale_low).context("--scale-low")?,
            step: self.scale_step.parse::<Step>().context("--scale-step")?,
            min_nodes: self.min_nodes.unwrap_or(1).max(usize::from(replication)),
            max_nodes: self.max_nodes.unwrap_or(d.max_nodes),
            cooldown: self.scale_cooldown.unwrap_or(d.cooldown),
        };
        cfg.validate().context("elastic policy")?;
        Ok(Some(cfg))
    }

    /// The same flags, for a manager that `up` starts.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "--elastic".into(),
            "--scale-high".into(),
            self.scale_high.clone(),
            "--scale-low".into(),
            self.scale_low.clone(),
            "--scale-step".into(),
            self.scale_step.clone(),
        ];
        if let Some(n) = self.min_nodes {
            a.extend(["--min-nodes".into(), n.to_string()]);
        }
        if let Some(n) = self.max_nodes {
            a.extend(["--max-nodes".into(), n.to_string()]);
        }
        if let Some(d) = self.scale_cooldown {
            a.extend(["--scale-cooldown".into(), format!("{}ms", d.as_millis())]);
        }
        a
    }
}

/// Default for `--dead-after`: four missed heartbeats.
pub const DEFAULT_DEAD_AFTER: Duration = Duration::from_secs(2);

/// A duration such as `2s`, `1.5s`, `500ms` or `1m`; a bare number is seconds.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (try 2s or 500ms)"))?;
    let secs = match unit.trim() {
        "" | "s" => v,
        "ms" => v / 1000.0,
        "m" | "min" => v * 60.0,
        other => return Err(format!("unknown unit {other:?} in {s:?} (use ms, s or m)")),
    };
    let d = Duration::try_from_secs_f64(secs).map_err(|e| format!("{s:?}: {e}"))?;
    if d.is_zero() {
        return Err("the duration must not be zero".into());
    }
    Ok(d)
}

impl ClusterArgs {
    /// Flags over the `[cluster]` section over defaults; the stripe size is checked here.
    pub fn resolve(&self, cfg: &config::FileConfig) -> Result<ClusterConfig> {
        let stripe = self
            .stripe_size
            .clone()
            .or_else(|| cfg.cluster.stripe_size.clone())
            .unwrap_or_else(|| "1MiB".into());
        let stripe_size = tessera_placement::validate_stripe_size(config::size(&stripe)?)
            .map_err(anyhow::Error::msg)?;
        let mut config = ClusterConfig::new(
            self.partitions
                .or(cfg.cluster.partitions)
                .unwrap_or(tessera_placement::DEFAULT_PARTITIONS),
            stripe_size,
            self.replication.or(cfg.cluster.replication).unwrap_or(1),
        );
        if let Some(lease) = self.open_lease {
            config.open_lease_ms = u32::try_from(lease.as_millis()).unwrap_or(u32::MAX);
        }
        config.validate().map_err(anyhow::Error::msg)?;
        Ok(config)
    }
}

#[derive(clap::Args, Debug)]
struct ServerArgs {
    /// Address to serve on (port 0 picks one; default: the address this machine reaches the
    /// manager from). On 0.0.0.0 the server is announced under that address.
    #[arg(long)]
    listen: Option<String>,
    /// Memory this server offers (e.g. 4GiB).
    #[arg(long)]
    memory: Option<String>,
    /// A free-form label (a rack, a failure domain).
    #[arg(long)]
    label: Option<String>,
    /// Rate at which this server receives partition copies (rebuilds, migrations), so that
    /// foreground I/O goes on (e.g. 256MiB per second; 0 for no limit; default 512MiB).
    #[arg(long)]
    sync_rate: Option<String>,
    /// Fault injection: every stripe request waits this long first (e.g. 20ms), to play a slow
    /// or overloaded node in tests and benchmarks.
    #[arg(long, value_parser = parse_duration)]
    fault_delay: Option<Duration>,
    /// Keep this much memory (e.g. 1GiB; at most --memory) as stripe buffers pre-faulted while
    /// the server is idle, so writes of new data skip the kernel's page faults and zeroing. For
    /// nodes given to the job: the server holds it from the start, counted within --memory.
    #[arg(long)]
    prefault: Option<String>,
}

pub const DEFAULT_MANAGER: &str = "127.0.0.1:7070";

// Stripe buffers are large and fresh memory is expensive to touch (3-8x a warm write on these
// machines). mimalloc asks for transparent huge pages on its segments (`madvise(MADV_HUGEPAGE)`,
// its default `allow_thp`; MIMALLOC_ALLOW_THP=0 turns that off): one page fault per 2 MiB
// instead of one per 4 KiB. Measured against glibc's allocator: first-touch 4 GiB write 0.93 ->
// 1.64 GB/s. Its explicit large pages (`allow_large_os_pages`, hugetlbfs) stay off: they are
// pinned, so the memory of removed files could not be given back, and a node's reserved huge
// pages belong to its applications.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

async fn run_manager(cli: &Cli, args: &ManagerArgs, cfg: &config::FileConfig) -> Result<()> {
    let secret = cli
        .secret
        .clone()
        .or_else(|| cfg.secret.clone())
        .context("the manager needs a cluster secret: --secret or TESSERA_SECRET")?;
    let listen = args
        .listen
        .clone()
        .or_else(|| cli.manager.clone())
        .or_else(|| cfg.manager.clone())
        .unwrap_or_else(|| DEFAULT_MANAGER.into());
    let http = args.http.clone().or_else(|| cfg.http.clone());
    let config = args.shape.resolve(cfg)?;
    let opts = tessera_manager::ManagerOptions {
        listen: config::addr(&listen, "listen")?,
        http: http
            .as_deref()
            .map(|h| config::addr(h, "http"))
            .transpose()?,
        secret: Secret::new(&secret),
        http_token: secret,
        expect_servers: args.expect.or(cfg.cluster.servers).unwrap_or(1),
        config,
        policy: args.elastic.policy(config.replication)?,
        heartbeat_timeout: args.shape.dead_after.unwrap_or(DEFAULT_DEAD_AFTER),
        root_mode: 0o755,
        provision: match args.provision.as_deref() {
            Some(p) => {
                config::size(&args.node_memory).context("--node-memory")?;
                Some(tessera_manager::provision::parse_spec(p, &args.node_memory))
            }
            None => None,
        },
    };
    let running = tessera_manager::start(opts).await?;
    eprintln!("manager listening on {}", running.rpc_addr());
    tokio::select! {
        () = running.wait() => Ok(()),
        r = shutdown_signal() => r,
    }
}

async fn run_server(cli: &Cli, args: &ServerArgs, cfg: &config::FileConfig) -> Result<()> {
    let secret = cli
        .secret
        .clone()
        .or_else(|| cfg.secret.clone())
        .context("the server needs the cluster secret: --secret or TESSERA_SECRET")?;
    let manager = cli
        .manager
        .clone()
        .or_else(|| cfg.manager.clone())
        .unwrap_or_else(|| DEFAULT_MANAGER.into());
    let manager = config::addr(&manager, "manager")?;
    let listen = match args.listen.as_ref().or(cfg.server.listen.as_ref()) {
        Some(listen) => config::addr(listen, "listen")?,
        // The address the manager is reached from: loopback for a local one.
        None => std::net::SocketAddr::new(
            tessera_server::route_to(manager)
                .with_context(|| format!("no route to the manager at {manager}"))?,
            0,
        ),
    };
    let memory = args
        .memory
        .clone()
        .or_else(|| cfg.server.memory.clone())
        .context("how much memory should this server offer? --memory 4GiB")?;
    let memory = config::size(&memory)?;
    let prefault = args.prefault.as_ref().or(cfg.server.prefault.as_ref());
    let prefault = prefault_size(prefault, memory)?;
    let mut opts =
        tessera_server::ServerOptions::new(listen, manager, Secret::new(&secret), memory);
    opts.prefault = prefault;
    opts.label = args.label.clone().or_else(|| cfg.server.label.clone());
    if let Some(rate) = &args.sync_rate {
        opts.sync_rate = config::size(rate)?;
    }
    if let Some(delay) = args.fault_delay {
        opts.fault_delay = delay;
    }
    let running = tessera_server::start(opts).await?;
    eprintln!("server {} listening on {}", running.node(), running.addr());
    let ended = tokio::select! {
        ended = running.wait() => ended,
        r = shutdown_signal() => return r,
    };
    match ended {
        tessera_server::Ended::Retired => Ok(()),
        tessera_server::Ended::Forgotten => rejoin(),
        tessera_server::Ended::Failed => bail!("the server stopped serving"),
    }
}

/// The bytes of `--prefault SIZE` (0 without) for a server offering `memory`: the pool counts
/// within it, so a larger one is refused.
fn prefault_size(text: Option<&String>, memory: u64) -> Result<u64> {
    let Some(text) = text else { return Ok(0) };
    let size = config::size(text).context("--prefault")?;
    if size > memory {
        bail!(
            "--prefault {text} is more than the server's --memory ({}): the pre-faulted buffers count within it",
            up::human(memory)
        );
    }
    Ok(size)
}

/// A server the manager forgot (stopped or cut off too long: its partitions were rebuilt
/// elsewhere) starts over as this same command, in this same process: what it held is stale,
/// and everything it had (memory, connections still serving the old table) goes at once.
/// It registers as a new node and receives its share again.
fn rejoin() -> Result<()> {
    use std::os::unix::process::CommandExt;
    eprintln!("the manager forgot this server: starting over as a new node");
    let exe = std::env::current_exe().context("finding the tessera executable")?;
    let e = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .exec();
    Err(anyhow::anyhow!(e).context("starting over"))
}

/// Resolves on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() -> Result<()> {
    StopSignals::new()?.recv().await;
    Ok(())
}

/// Ctrl-C and SIGTERM, heard from creation on: a signal that comes between two `recv`s is
/// kept for the next one, so a second Ctrl-C is not lost.
pub struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    pub fn new() -> Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// A client for the commands that use a running cluster.
async fn client(cli: &Cli, cfg: &config::FileConfig) -> Result<Client> {
    let (manager, secret) = config::endpoint(cli.manager.as_deref(), cli.secret.as_deref(), cfg)?;
    let mut opts = cli.client_options(manager, &secret);
    opts.ready_timeout = Duration::from_secs(10);
    opts.seeds = config::seeds(cli.manager.as_deref(), cfg)?;
    Client::connect(opts)
        .await
        .with_context(|| format!("connecting to the cluster at {manager}"))
}

async fn run(cli: Cli) -> Result<()> {
    let cfg = config::load(cli.config.as_deref())?;
    let _held = cli
        .low_latency
        .then(latency::LowLatency::hold)
        .transpose()?;
    match &cli.cmd {
        Cmd::Up(a) => up::run(&cli, a, &cfg).await,
        Cmd::Manager(a) => run_manager(&cli, a, &cfg).await,
        Cmd::Server(a) => run_server(&cli, a, &cfg).await,
        Cmd::Mount(a) => mount::run(client(&cli, &cfg).await?, a).await,
        Cmd::Umount(a) => mount::umount(a),
        Cmd::Status(a) => {
            // Straight to the manager: status works while the cluster is not (yet) usable.
            let (manager, secret) =
                config::endpoint(cli.manager.as_deref(), cli.secret.as_deref(), &cfg)?;
            status::run(manager, &secret, a, &cfg).await
        }
        Cmd::Cp(a) => copy::cp(&client(&cli, &cfg).await?, a).await,
        Cmd::Ls(a) => files::ls(&client(&cli, &cfg).await?, a).await,
        Cmd::Stat(a) => files::stat(&client(&cli, &cfg).await?, a).await,
        Cmd::Rm(a) => files::rm(&client(&cli, &cfg).await?, a).await,
        Cmd::Mkdir(a) => files::mkdir(&client(&cli, &cfg).await?, a).await,
        Cmd::Cat(a) => files::cat(&client(&cli, &cfg).await?, a).await,
        Cmd::Collect(a) => collect::run(&client(&cli, &cfg).await?, a).await,
        Cmd::Fsck(a) => fsck::run(&client(&cli, &cfg).await?, a).await,
        Cmd::Bench(a) => bench::run(client(&cli, &cfg).await?, a.clone()).await,
        Cmd::Report(a) => report::run(cli.secret.as_deref(), &cfg, a).await,
        Cmd::Trace(a) => trace::run(a),
        Cmd::Profile(a) => profile::run(a),
        Cmd::Replay(a) => replay::run(a),
        Cmd::Evaluate(a) => evaluate::run(a).await,
        Cmd::Scale(a) => {
            let (manager, secret) =
                config::endpoint(cli.manager.as_deref(), cli.secret.as_deref(), &cfg)?;
            scale::run(manager, &secret, a).await
        }
    }
}

/// `tessera status | head`: printing to a pipe whose reader is gone makes `println!` panic.
/// End quietly instead, with the status a SIGPIPE gives, as other Unix tools do. SIGPIPE
/// itself stays ignored (Rust's default): a server closing a socket must be an error the
/// client handles, not the end of the process.
fn end_quietly_when_output_closes() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or_default();
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(128 + libc::SIGPIPE);
        }
        default(info);
    }));
}

/// How often freed memory is offered back to the system.
const RETURN_FREED_EVERY: Duration = Duration::from_secs(1);

/// `mi_option_purge_decommits` (mimalloc.h, the same in its v2 and v3): whether a purge
/// decommits freed memory (`MADV_DONTNEED`) or resets it (`MADV_FREE`).
const MI_OPTION_PURGE_DECOMMITS: libmimalloc_sys::mi_option_t = 5;

/// Gives the memory of deleted files back to the system. mimalloc returns freed pages only
/// when it next runs, at least a second (`purge_delay`) after the free: a server whose files
/// were just removed, and that then sat idle, kept all their memory (1.1 GiB per server
/// after a 4 GiB file, measured), out of reach of the applications on its node.
///
/// It returns them lazily (`MADV_FREE`), not at once (`MADV_DONTNEED`): the kernel takes such
/// pages back whenever anyone on the node needs memory, without I/O, and until it does, a
/// write that follows a remove reuses them as they are. Decommitted pages have to be faulted
/// in and zeroed again, the main cost of storing new data: rewrites after a remove ran 2-3x
/// faster (BENCHMARKS.md). MIMALLOC_PURGE_DECOMMITS=1 restores the eager return.
fn return_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DECOMMITS").is_none() {
        // SAFETY: called before any other thread exists (the option is read unlocked).
        unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DECOMMITS, 0) };
    }
    let spawned = std::thread::Builder::new()
        .name("tessera-free".into())
        .spawn(|| loop {
            std::thread::sleep(RETURN_FREED_EVERY);
            // SAFETY: only the allocator's own state is read and changed.
            unsafe { libmimalloc_sys::mi_collect(false) };
        });
    if let Err(e) = spawned {
        tracing::warn!("freed memory stays with the allocator until it next runs: {e}");
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    end_quietly_when_output_closes();
    let level = match cli.verbose {
        0 => "warn,tessera_server=info,tessera_manager=info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Colour only for a person at a terminal: a log file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
    return_freed_memory();
    // The bounds on connections that have not authenticated (docs/CLI.md) stay well under it.
    if let Err(e) = tessera_proto::admit::raise_open_file_limit() {
        tracing::debug!("the limit on open files stays as it was: {e}");
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tessera: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
