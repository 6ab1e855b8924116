//! File commands: `cp` (staging in and out, in parallel, with a progress bar), `ls`, `stat`,
//! `rm`, `mkdir`, `cat`. A cluster path starts with `tessera:`; `ls` and friends take cluster
//! paths with or without it.

use crate::up::human;
use anyhow::{bail, Context, Result};
use futures::stream::{self, StreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::path::PathBuf;
use tessera_client::{Client, FileKind, Inode, OpenOptions, Timespec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args, Debug)]
pub struct CpArgs {
    /// Copy directories and everything in them.
    #[arg(short, long)]
    recursive: bool,
    /// Files copied at once.
    #[arg(short = 'j', long, default_value_t = 8)]
    jobs: usize,
    /// Sources, then the destination; cluster paths start with `tessera:`.
    #[arg(required = true, num_args = 2..)]
    paths: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// Long listing: kind and mode, size, modification time.
    #[arg(short, long)]
    long: bool,
    #[arg(default_value = "/")]
    paths: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct StatArgs {
    #[arg(long)]
    json: bool,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct RmArgs {
    /// Remove directories and their contents.
    #[arg(short, long)]
    recursive: bool,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct MkdirArgs {
    /// Create parents as needed; an existing directory is fine.
    #[arg(short, long)]
    parents: bool,
    #[arg(required = true)]
    paths: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct CatArgs {
    #[arg(required = true)]
    paths: Vec<String>,
}

/// One end of a copy.
#[derive(Debug, Clone)]
enum Loc {
    Local(PathBuf),
    Remote(String),
}

impl Loc {
    fn parse(s: &str) -> Self {
        match s.strip_prefix("tessera:") {
            Some(rest) => Self::Remote(format!("/{}", rest.trim_start_matches('/'))),
            None => Self::Local(PathBuf::from(s)),
        }
    }

    fn join(&self, name: &str) -> Self {
        match self {
            Self::Local(p) => Self::Local(p.join(name)),
            Self::Remote(p) => Self::Remote(format!("{}/{name}", p.trim_end_matches('/'))),
        }
    }

    fn name(&self) -> Option<String> {
        match self {
            Self::Local(p) => p.file_name().map(|n| n.to_string_lossy().into_owned()),
            Self::Remote(p) => p
                .trim_end_matches('/')
                .rsplit('/')
                .next()
                .filter(|n| !n.is_empty())
                .map(str::to_string),
        }
    }

    fn show(&self) -> String {
        match self {
            Self::Local(p) => p.display().to_string(),
            Self::Remote(p) => format!("tessera:{p}"),
        }
    }

    /// (is a directory, size, permission bits), or None if it does not exist.
    async fn probe(&self, c: &Client) -> Result<Option<(bool, u64, u32)>> {
        match self {
            Self::Local(p) => match tokio::fs::metadata(p).await {
                Ok(m) => {
                    use std::os::unix::fs::PermissionsExt;
                    Ok(Some((m.is_dir(), m.len(), m.permissions().mode() & 0o7777)))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e).with_context(|| format!("{}", p.display())),
            },
            Self::Remote(p) => match c.stat(p).await {
                Ok(i) => Ok(Some((i.kind == FileKind::Dir, i.size, i.mode))),
                Err(e) if e.errno() == libc::ENOENT => Ok(None),
                Err(e) => Err(e).with_context(|| self.show()),
            },
        }
    }
}

struct Job {
    src: Loc,
    dst: Loc,
    mode: u32,
}

/// Expands sources into file jobs (creating destination directories on the way).
async fn plan(c: &Client, args: &CpArgs) -> Result<(Vec<Job>, u64)> {
    let (dst, srcs) = args
        .paths
        .split_last()
        .context("cp needs a source and a destination")?;
    let dst = Loc::parse(dst);
    let dst_is_dir = matches!(dst.probe(c).await?, Some((true, _, _)));
    if srcs.len() > 1 && !dst_is_dir {
        bail!(
            "copying several sources needs an existing directory as the destination: {}",
            dst.show()
        );
    }
    let (mut jobs, mut total) = (Vec::new(), 0u64);
    for s in srcs {
        let src = Loc::parse(s);
        let Some((is_dir, size, mode)) = src.probe(c).await? else {
            bail!("{}: no such file or directory", src.show());
        };
        let target = match (dst_is_dir, src.name()) {
            (true, Some(n)) => dst.join(&n),
            _ => dst.clone(),
        };
        if !is_dir {
            total += size;
            jobs.push(Job {
                src,
                dst: target,
                mode,
            });
            continue;
        }
        if !args.recursive {
            bail!("{} is a directory (use -r)", src.show());
        }
        // Walk the tree breadth-first: directories are created before their files are copied.
        let mut dirs = vec![(src, target)];
        while let Some((from, to)) = dirs.pop() {
            make_dir(c, &to).await?;
            for (name, is_dir, size, mode) in list(c, &from).await? {
                if is_dir {
                    dirs.push((from.join(&name), to.join(&name)));
                } else {
                    total += size;
                    jobs.push(Job {
                        src: from.join(&name),
                        dst: to.join(&name),
                        mode,
                    });
                }
            }
        }
    }
    Ok((jobs, total))
}

async fn make_dir(c: &Client, d: &Loc) -> Result<()> {
    match d {
        Loc::Local(p) => tokio::fs::create_dir_all(p)
            .await
            .with_context(|| format!("creating {}", p.display())),
        Loc::Remote(p) => c
            .create_dir_all(p)
            .await
            .map(drop)
            .with_context(|| d.show()),
    }
}

/// Entries of a directory: (name, is a directory, size, mode).
async fn list(c: &Client, d: &Loc) -> Result<Vec<(String, bool, u64, u32)>> {
    match d {
        Loc::Local(p) => {
            use std::os::unix::fs::PermissionsExt;
            let mut out = Vec::new();
            let mut rd = tokio::fs::read_dir(p)
                .await
                .with_context(|| format!("listing {}", p.display()))?;
            while let Some(e) = rd.next_entry().await? {
                let m = tokio::fs::metadata(e.path()).await?;
                out.push((
                    e.file_name().to_string_lossy().into_owned(),
                    m.is_dir(),
                    m.len(),
                    m.permissions().mode() & 0o7777,
                ));
            }
            Ok(out)
        }
        Loc::Remote(p) => Ok(c
            .read_dir(p)
            .await
            .with_context(|| d.show())?
            .into_iter()
            .map(|(n, i)| (n, i.kind == FileKind::Dir, i.size, i.mode))
            .collect()),
    }
}

/// Copies one file in stripe-sized pieces, never holding it whole in memory.
async fn copy_one(c: &Client, job: &Job, pb: &ProgressBar) -> Result<()> {
    let chunk = c.stripe_size() as usize;
    let mut local_in = match &job.src {
        Loc::Local(p) => Some(
            tokio::fs::File::open(p)
                .await
                .with_context(|| format!("opening {}", p.display()))?,
        ),
        Loc::Remote(_) => None,
    };
    let mut remote_in = match &job.src {
        Loc::Remote(p) => Some(
            c.open(p, &OpenOptions::read())
                .await
                .with_context(|| job.src.show())?,
        ),
        Loc::Local(_) => None,
    };
    let mut local_out = match &job.dst {
        Loc::Local(p) => Some(
            tokio::fs::File::create(p)
                .await
                .with_context(|| format!("creating {}", p.display()))?,
        ),
        Loc::Remote(_) => None,
    };
    let mut remote_out = match &job.dst {
        Loc::Remote(p) => {
            let opts = OpenOptions {
                mode: job.mode,
                ..OpenOptions::create()
            };
            Some(c.open(p, &opts).await.with_context(|| job.dst.show())?)
        }
        Loc::Local(_) => None,
    };
    let mut buf = vec![0u8; chunk];
    let mut off = 0u64;
    let copied: Result<()> = async {
        loop {
            let data: bytes::Bytes = if let Some(f) = local_in.as_mut() {
                let n = f.read(&mut buf).await?;
                bytes::Bytes::copy_from_slice(&buf[..n])
            } else if let Some(f) = remote_in.as_mut() {
                f.read_at(off, chunk)
                    .await
                    .with_context(|| job.src.show())?
            } else {
                unreachable!("a source is local or remote")
            };
            if data.is_empty() {
                return Ok(());
            }
            if let Some(f) = local_out.as_mut() {
                f.write_all(&data).await?;
            } else if let Some(f) = remote_out.as_mut() {
                f.write_at(off, &data)
                    .await
                    .with_context(|| job.dst.show())?;
            }
            off += data.len() as u64;
            pb.inc(data.len() as u64);
        }
    }
    .await;
    // Closed also after a failure, not dropped: a dropped handle finishes in the background,
    // which this process exiting cuts short, leaving the file open on the servers and the
    // size of what was stored unpublished.
    let read = match remote_in {
        Some(f) => f.close().await.with_context(|| job.src.show()),
        None => Ok(()),
    };
    let written = match remote_out {
        Some(f) => f.close().await.with_context(|| job.dst.show()),
        None => Ok(()),
    };
    copied.and(read).and(written)?;
    if let (Some(mut f), Loc::Local(p)) = (local_out, &job.dst) {
        use std::os::unix::fs::PermissionsExt;
        f.flush().await?;
        tokio::fs::set_permissions(p, std::fs::Permissions::from_mode(job.mode)).await?;
    }
    Ok(())
}

pub async fn cp(c: &Client, args: &CpArgs) -> Result<()> {
    let (jobs, total) = plan(c, args).await?;
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(
            "{bytes}/{total_bytes} [{bar:40}] {bytes_per_sec} {pos:>} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let files = jobs.len();
    let start = std::time::Instant::now();
    // Every copy runs to its end, also after one failed: one cut off would leave its file
    // open on the servers (a dropped handle), and its space held after a removal.
    let copied: Vec<Result<()>> = stream::iter(jobs.iter().map(|j| copy_one(c, j, &pb)))
        .buffer_unordered(args.jobs.max(1))
        .collect()
        .await;
    pb.finish_and_clear();
    let mut failed = copied.into_iter().filter_map(Result::err);
    if let Some(first) = failed.next() {
        for e in failed {
            eprintln!("tessera: {e:#}");
        }
        return Err(first);
    }
    let secs = start.elapsed().as_secs_f64();
    eprintln!(
        "copied {files} files, {} in {secs:.2} s ({}/s)",
        human(total),
        human((total as f64 / secs.max(1e-9)) as u64)
    );
    Ok(())
}

fn remote(p: &str) -> String {
    let p = p.strip_prefix("tessera:").unwrap_or(p);
    format!("/{}", p.trim_start_matches('/'))
}

fn mode_string(i: &Inode) -> String {
    let kind = match i.kind {
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::File => '-',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDevice(_) => 'c',
        FileKind::BlockDevice(_) => 'b',
    };
    let bits: String = (0..9)
        .rev()
        .map(|b| {
            if i.mode & (1 << b) != 0 {
                ['x', 'w', 'r'][b % 3]
            } else {
                '-'
            }
        })
        .collect();
    format!("{kind}{bits}")
}

fn time(t: Timespec) -> String {
    let secs = t.secs;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm), in UTC.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

pub async fn ls(c: &Client, args: &LsArgs) -> Result<()> {
    for p in &args.paths {
        let path = remote(p);
        let inode = c
            .stat(&path)
            .await
            .with_context(|| format!("tessera:{path}"))?;
        let mut entries = if inode.kind == FileKind::Dir {
            c.read_dir(&path)
                .await
                .with_context(|| format!("tessera:{path}"))?
        } else {
            vec![(path.rsplit('/').next().unwrap_or("").to_string(), inode)]
        };
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        if args.paths.len() > 1 {
            println!("tessera:{path}:");
        }
        for (name, i) in entries {
            if args.long {
                println!(
                    "{} {:>3} {:>12} {} {name}",
                    mode_string(&i),
                    i.nlink,
                    i.size,
                    time(i.mtime)
                );
            } else {
                println!("{name}");
            }
        }
    }
    Ok(())
}

pub async fn stat(c: &Client, args: &StatArgs) -> Result<()> {
    for p in &args.paths {
        let path = remote(p);
        let i = c
            .lstat(&path)
            .await
            .with_context(|| format!("tessera:{path}"))?;
        if args.json {
            println!("{}", serde_json::to_string(&i)?);
            continue;
        }
        println!("  path: tessera:{path}");
        println!(
            "  kind: {:?}   inode: {}   links: {}",
            i.kind, i.ino, i.nlink
        );
        println!("  size: {} ({})", i.size, human(i.size));
        println!(
            "  mode: {:04o} ({})   uid: {}   gid: {}",
            i.mode,
            mode_string(&i),
            i.uid,
            i.gid
        );
        println!("access: {}.{:09} UTC", time(i.atime), i.atime.nanos);
        println!("modify: {}.{:09} UTC", time(i.mtime), i.mtime.nanos);
        println!("change: {}.{:09} UTC", time(i.ctime), i.ctime.nanos);
        if i.kind == FileKind::Symlink {
            println!("target: {}", String::from_utf8_lossy(&i.target));
        }
    }
    Ok(())
}

pub async fn rm(c: &Client, args: &RmArgs) -> Result<()> {
    for p in &args.paths {
        let path = remote(p);
        let i = c
            .lstat(&path)
            .await
            .with_context(|| format!("tessera:{path}"))?;
        let done = match (i.kind, args.recursive) {
            (FileKind::Dir, false) => bail!("tessera:{path} is a directory (use -r)"),
            (FileKind::Dir, true) => c.remove_all(&path).await,
            _ => c.remove_file(&path).await,
        };
        done.with_context(|| format!("removing tessera:{path}"))?;
    }
    Ok(())
}

pub async fn mkdir(c: &Client, args: &MkdirArgs) -> Result<()> {
    for p in &args.paths {
        let path = remote(p);
        let made = if args.parents {
            c.create_dir_all(&path).await
        } else {
            c.create_dir(&path).await
        };
        made.with_context(|| format!("creating tessera:{path}"))?;
    }
    Ok(())
}

pub async fn cat(c: &Client, args: &CatArgs) -> Result<()> {
    let mut out = tokio::io::stdout();
    for p in &args.paths {
        let path = remote(p);
        let mut f = c
            .open(&path, &OpenOptions::read())
            .await
            .with_context(|| format!("tessera:{path}"))?;
        let mut off = 0;
        loop {
            let data = f.read_at(off, c.stripe_size() as usize).await?;
            if data.is_empty() {
                break;
            }
            off += data.len() as u64;
            if let Err(e) = out.write_all(&data).await {
                // A closed pipe (`| head`) is not an error worth reporting.
                if e.kind() == std::io::ErrorKind::BrokenPipe {
                    return Ok(());
                }
                return Err(e.into());
            }
        }
        f.close().await?;
    }
    out.flush().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        assert!(matches!(Loc::parse("tessera:/a/b"), Loc::Remote(p) if p == "/a/b"));
        assert!(matches!(Loc::parse("tessera:a"), Loc::Remote(p) if p == "/a"));
        assert!(matches!(Loc::parse("./x"), Loc::Local(_)));
        assert_eq!(Loc::parse("tessera:/a/").join("b").show(), "tessera:/a/b");
        assert_eq!(Loc::parse("tessera:/a/b/").name().as_deref(), Some("b"));
    }

    #[test]
    fn dates() {
        assert_eq!(time(Timespec { secs: 0, nanos: 0 }), "1970-01-01 00:00:00");
        assert_eq!(
            time(Timespec {
                secs: 1_795_000_000,
                nanos: 0
            }),
            "2026-11-18 11:06:40"
        );
    }
}
