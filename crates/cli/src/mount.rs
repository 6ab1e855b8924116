//! `tessera mount` and `tessera umount`.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;
use tessera_client::Client;

#[derive(clap::Args, Debug, Clone)]
pub struct MountArgs {
    /// Directory to mount the cluster on.
    pub dir: PathBuf,
    /// Requests served at once (FUSE worker threads).
    #[arg(long, default_value_t = 8)]
    pub threads: usize,
    /// Let other users use the mount (permissions are still enforced).
    #[arg(long)]
    pub allow_other: bool,
    /// Bypass the kernel page cache.
    #[arg(long)]
    pub direct_io: bool,
    /// Let the kernel gather small writes (faster small writes; see docs/SEMANTICS.md).
    #[arg(long)]
    pub writeback_cache: bool,
    /// Seconds the kernel may cache attributes and names: `stat` may show another node's
    /// changes this late; opens always revalidate (close-to-open). 0 disables the cache.
    #[arg(long, default_value_t = 1.0)]
    pub attr_cache: f64,
    /// Seconds the kernel may cache a name or attributes the servers promised to report
    /// changes to (a change on another node drops them at once). 0 disables the promises.
    #[arg(long, default_value_t = 60.0)]
    pub lease: f64,
    /// Trace every operation into a new file in this directory (docs/TRACING.md); `tessera
    /// trace stop` stops it, `tessera trace start` starts it again.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Memory the trace buffers records in before they are written (twice this is used);
    /// records that find it full are counted as lost, never waited for.
    #[arg(long, default_value = "16MiB")]
    pub trace_buffer: String,
    /// A test hook: the trace writer sleeps this many seconds before each write, as on a
    /// stalled disk.
    #[arg(long, hide = true, default_value_t = 0.0)]
    pub trace_stall: f64,
}

#[derive(clap::Args, Debug)]
pub struct UmountArgs {
    /// A Tessera mount point, also one whose process died.
    pub dir: PathBuf,
}

/// Mounts in the foreground until Ctrl-C/SIGTERM or an unmount from outside.
pub async fn run(client: Client, args: &MountArgs) -> Result<()> {
    let meta = std::fs::metadata(&args.dir)
        .with_context(|| format!("mount point {}", args.dir.display()))?;
    anyhow::ensure!(
        meta.is_dir(),
        "mount point {} is not a directory",
        args.dir.display()
    );
    let trace = tessera_fuse::TraceOptions {
        dir: match &args.trace {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("trace directory {}", dir.display()))?;
                Some(std::path::absolute(dir).context("the trace directory")?)
            }
            None => None,
        },
        writer: tessera_trace::Options {
            buffer_bytes: parse_size::parse_size(&args.trace_buffer)
                .ok()
                .and_then(|n| usize::try_from(n).ok())
                .with_context(|| format!("bad --trace-buffer {:?}", args.trace_buffer))?,
            stall: Duration::try_from_secs_f64(args.trace_stall)
                .context("--trace-stall must be a number of seconds")?,
            ..tessera_trace::Options::default()
        },
    };
    let opts = tessera_fuse::MountOptions {
        threads: args.threads,
        allow_other: args.allow_other,
        direct_io: args.direct_io,
        writeback_cache: args.writeback_cache,
        attr_ttl: Duration::try_from_secs_f64(args.attr_cache)
            .context("--attr-cache must be a number of seconds")?,
        lease: Duration::try_from_secs_f64(args.lease)
            .context("--lease must be a number of seconds")?,
        trace,
    };
    // Resolved now: once mounted, resolving the path would stat the mount, which this process
    // serves (see `tessera_fuse::mountinfo`).
    let canonical = args
        .dir
        .canonicalize()
        .with_context(|| format!("mount point {}", args.dir.display()))?;
    // Heard from before the mount exists: a signal must never kill a process that has mounted.
    let mut stop = crate::StopSignals::new()?;
    let session = tessera_fuse::mount(client, tokio::runtime::Handle::current(), &args.dir, &opts)
        .with_context(|| {
            format!(
                "mounting on {} (is /dev/fuse there, and are you root or in the fuse group?)",
                args.dir.display()
            )
        })?;
    eprintln!("tessera mounted on {}", args.dir.display());
    if let Some(dir) = &opts.trace.dir {
        eprintln!("tracing every operation into {}", dir.display());
    }
    // Ours is the topmost mount there now; gone once no mount there has its device.
    let ours = tessera_fuse::mountinfo::devices_on(&canonical).pop();
    let gone = async {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = tessera_fuse::mountinfo::devices_on(&canonical);
            if ours.map_or(now.is_empty(), |d| !now.contains(&d)) {
                return;
            }
        }
    };
    tokio::select! {
        () = stop.recv() => {}
        () = gone => eprintln!("{} was unmounted", args.dir.display()),
        // Its connection was cut (`/sys/fs/fuse/connections/N/abort`): the dead mount goes too.
        () = ended(&session.guard) => eprintln!("{}: the kernel ended the session", args.dir.display()),
    }
    // A plain unmount fails while a file is open (EBUSY), and a process that exits then leaves
    // a dead mount behind ("transport endpoint is not connected") for everyone using the
    // directory. Detached, the mount leaves the namespace at once and the kernel ends the
    // session when the last open file is closed; until then those files are still served.
    if let Err(e) = tessera_fuse::unmount(&args.dir) {
        // EINVAL: already detached from outside (`tessera umount`, `umount -l`).
        if e.raw_os_error() != Some(libc::EINVAL) {
            tracing::warn!("detaching {}: {e}", args.dir.display());
        }
    }
    if tokio::time::timeout(BUSY_AFTER, ended(&session.guard))
        .await
        .is_err()
    {
        eprintln!(
            "{}: still in use (open files, or a working directory in it); serving those \
             until they are let go (Ctrl-C again to stop now: they then fail)",
            args.dir.display()
        );
        tokio::select! {
            () = stop.recv() => {}
            () = ended(&session.guard) => {}
        }
    }
    // The session has ended (its threads sent the last closes), or a second Ctrl-C stops it:
    // the process ends next, which ends the session. It is not dropped: fuser 0.18 unmounts
    // the directory again at drop (it takes a severed connection for a live one), which fails
    // on the detached directory, and could take down a mount made there since. Its thread is
    // taken out of it to hear how the session ended.
    let session = std::mem::ManuallyDrop::new(session);
    if !session.guard.is_finished() {
        // A second Ctrl-C: the files still open there fail from now on.
        return Ok(());
    }
    // SAFETY: the session is never dropped, so its thread handle is moved out exactly once.
    let thread = unsafe { std::ptr::read(&session.guard) };
    match thread.join() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(anyhow::anyhow!(e).context("the FUSE session ended with an error")),
        Err(_) => anyhow::bail!("the FUSE session's thread panicked"),
    }
}

/// Resolves when the FUSE session's threads have ended.
async fn ended(session: &std::thread::JoinHandle<std::io::Result<()>>) {
    while !session.is_finished() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How long a detached mount with nothing open takes to end its session; longer means files are
/// still open on it.
const BUSY_AFTER: Duration = Duration::from_millis(500);

pub fn umount(args: &UmountArgs) -> Result<()> {
    tessera_fuse::unmount(&args.dir).with_context(|| format!("unmounting {}", args.dir.display()))
}
