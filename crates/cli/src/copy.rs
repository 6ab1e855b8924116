//! `tessera cp`: staging trees in and out of the cluster and within it, in parallel, with a
//! progress bar. Paths are bytes on both sides, as names are in the cluster and in Linux: a
//! name that is not UTF-8 is copied as it is. Links are copied as links unless `-L`.

use crate::files::{remote, shown};
use crate::up::human;
use anyhow::{bail, Context, Result};
use futures::stream::{self, StreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use tessera_client::{Client, FileKind, Inode, OpenOptions, SetAttr, Timespec};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args, Debug)]
pub struct CpArgs {
    /// Copy directories and everything in them; symbolic links in them are copied as links.
    #[arg(short, long)]
    recursive: bool,
    /// Follow symbolic links: copy what they lead to, not the links.
    #[arg(short = 'L', long)]
    dereference: bool,
    /// Files copied at once.
    #[arg(short = 'j', long, default_value_t = 8)]
    jobs: usize,
    /// Sources, then the destination; cluster paths start with `tessera:`.
    #[arg(required = true, num_args = 2..)]
    paths: Vec<OsString>,
}

#[derive(Debug, Clone)]
enum Loc {
    Local(PathBuf),
    Remote(Vec<u8>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    File,
    Dir,
    Link,
    /// Pipes, sockets, devices: not copied.
    Special,
}

/// What a copy needs to know of a file.
#[derive(Debug, Clone, Copy)]
struct Meta {
    kind: Kind,
    size: u64,
    /// Permission bits (with set-id and sticky).
    mode: u32,
    /// Device and inode: a directory met again below itself is a loop.
    id: (u64, u64),
}

impl Meta {
    fn local(m: &std::fs::Metadata) -> Self {
        let t = m.file_type();
        let kind = if t.is_file() {
            Kind::File
        } else if t.is_dir() {
            Kind::Dir
        } else if t.is_symlink() {
            Kind::Link
        } else {
            Kind::Special
        };
        Self {
            kind,
            size: m.len(),
            mode: m.mode() & 0o7777,
            id: (m.dev(), m.ino()),
        }
    }

    fn remote(i: &Inode) -> Self {
        let kind = match i.kind {
            FileKind::File => Kind::File,
            FileKind::Dir => Kind::Dir,
            FileKind::Symlink => Kind::Link,
            _ => Kind::Special,
        };
        Self {
            kind,
            size: i.size,
            mode: i.mode & 0o7777,
            id: (0, i.ino),
        }
    }
}

impl Loc {
    fn parse(s: &OsStr) -> Self {
        match s.as_bytes().strip_prefix(b"tessera:") {
            Some(_) => Self::Remote(remote(s)),
            None => Self::Local(PathBuf::from(s)),
        }
    }

    fn join(&self, name: &[u8]) -> Self {
        match self {
            Self::Local(p) => Self::Local(p.join(OsStr::from_bytes(name))),
            Self::Remote(p) => {
                let mut joined = trim_end_slashes(p).to_vec();
                joined.push(b'/');
                joined.extend_from_slice(name);
                Self::Remote(joined)
            }
        }
    }

    fn name(&self) -> Option<Vec<u8>> {
        match self {
            Self::Local(p) => p.file_name().map(|n| n.as_bytes().to_vec()),
            Self::Remote(p) => trim_end_slashes(p)
                .rsplit(|&b| b == b'/')
                .next()
                .filter(|n| !n.is_empty())
                .map(<[u8]>::to_vec),
        }
    }

    fn show(&self) -> String {
        match self {
            Self::Local(p) => p.display().to_string(),
            Self::Remote(p) => shown(p),
        }
    }

    /// What is at this place, or None if nothing is; `follow`: what a symbolic link there
    /// leads to.
    async fn probe(&self, c: &Client, follow: bool) -> Result<Option<Meta>> {
        match self {
            Self::Local(p) => {
                let m = if follow {
                    tokio::fs::metadata(p).await
                } else {
                    tokio::fs::symlink_metadata(p).await
                };
                match m {
                    Ok(m) => Ok(Some(Meta::local(&m))),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(e).with_context(|| self.show()),
                }
            }
            Self::Remote(p) => {
                let i = if follow {
                    c.stat(p).await
                } else {
                    c.lstat(p).await
                };
                match i {
                    Ok(i) => Ok(Some(Meta::remote(&i))),
                    Err(e) if e.errno() == libc::ENOENT => Ok(None),
                    Err(e) => Err(e).with_context(|| self.show()),
                }
            }
        }
    }
}

fn trim_end_slashes(p: &[u8]) -> &[u8] {
    let end = p.iter().rposition(|&b| b != b'/').map_or(0, |i| i + 1);
    &p[..end]
}

/// A file or symbolic link to copy.
struct Job {
    src: Loc,
    dst: Loc,
    meta: Meta,
}

#[derive(Default)]
struct Plan {
    jobs: Vec<Job>,
    /// Directories made (or copied into), with the permission bits they get once filled.
    dirs: Vec<(Loc, u32)>,
    /// Bytes of the files.
    total: u64,
}

impl Plan {
    fn add(&mut self, src: Loc, dst: Loc, meta: Meta) {
        match meta.kind {
            Kind::Special => eprintln!(
                "skipping {}: not a file, directory or symbolic link",
                src.show()
            ),
            _ => {
                if meta.kind == Kind::File {
                    self.total += meta.size;
                }
                self.jobs.push(Job { src, dst, meta });
            }
        }
    }
}

/// Expands sources into jobs, making the destination directories on the way. Symbolic links
/// are copied as links, except with -L, and except a source named without -r (as cp does).
async fn plan(c: &Client, args: &CpArgs) -> Result<Plan> {
    let (dst, srcs) = args
        .paths
        .split_last()
        .context("cp needs a source and a destination")?;
    let dst = Loc::parse(dst);
    let dst_is_dir = matches!(dst.probe(c, true).await?, Some(m) if m.kind == Kind::Dir);
    if srcs.len() > 1 && !dst_is_dir {
        bail!(
            "copying several sources needs an existing directory as the destination: {}",
            dst.show()
        );
    }
    let mut plan = Plan::default();
    for s in srcs {
        let src = Loc::parse(s);
        let follow = args.dereference || !args.recursive;
        let Some(meta) = src.probe(c, follow).await? else {
            bail!("{}: no such file or directory", src.show());
        };
        let target = match (dst_is_dir, src.name()) {
            (true, Some(n)) => dst.join(&n),
            _ => dst.clone(),
        };
        // Ids compare only on one side: a copy onto or into its own source would destroy it
        // or never end.
        let one_side = matches!(
            (&src, &target),
            (Loc::Local(_), Loc::Local(_)) | (Loc::Remote(_), Loc::Remote(_))
        );
        if meta.kind != Kind::Dir {
            if one_side && matches!(target.probe(c, true).await?, Some(m) if m.id == meta.id) {
                bail!("{} and {} are the same file", src.show(), target.show());
            }
            plan.add(src, target, meta);
            continue;
        }
        if !args.recursive {
            bail!("{} is a directory (use -r)", src.show());
        }
        // Depth first, each directory with the ones above it, which it must not be (only a
        // followed link can lead back up); a directory is made before what goes in it.
        let mut dirs = vec![(src, target, meta, Vec::new())];
        let mut made = std::collections::HashSet::new();
        while let Some((from, to, meta, mut above)) = dirs.pop() {
            if above.contains(&meta.id) {
                bail!(
                    "{}: a symbolic link loop (this directory is inside itself)",
                    from.show()
                );
            }
            above.push(meta.id);
            let id = make_dir(c, &to).await?;
            if one_side && (id == meta.id || made.contains(&meta.id)) {
                bail!("cannot copy {} into itself ({})", from.show(), to.show());
            }
            made.insert(id);
            plan.dirs.push((to.clone(), meta.mode));
            for (name, meta) in list(c, &from, args.dereference).await? {
                let (from, to) = (from.join(&name), to.join(&name));
                if meta.kind == Kind::Dir {
                    dirs.push((from, to, meta, above.clone()));
                } else {
                    plan.add(from, to, meta);
                }
            }
        }
    }
    Ok(plan)
}

/// Makes directory `d` (its parents as needed), private until its permissions are set after
/// its contents are in; an existing directory is fine. Returns its device and inode.
async fn make_dir(c: &Client, d: &Loc) -> Result<(u64, u64)> {
    match d {
        Loc::Local(p) => {
            if let Some(parent) = p.parent() {
                tokio::fs::create_dir_all(parent)
                    .await
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            match tokio::fs::DirBuilder::new().mode(0o700).create(p).await {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(e).with_context(|| format!("creating {}", p.display()))
                }
                _ => {}
            }
        }
        Loc::Remote(p) => {
            let path = trim_end_slashes(p);
            let (parent, name) = match path.iter().rposition(|&b| b == b'/') {
                Some(i) => (&path[..i], &path[i + 1..]),
                None => (&b""[..], path),
            };
            let made = if name.is_empty() || name == b"." || name == b".." {
                c.create_dir_all(p).await.map(drop)
            } else {
                let parent = c.create_dir_all(parent).await.with_context(|| d.show())?;
                c.mkdir(parent.ino, name, 0o700).await.map(drop)
            };
            match made {
                Err(e) if e.errno() != libc::EEXIST => {
                    return Err(e).with_context(|| format!("creating {}", d.show()))
                }
                _ => {}
            }
        }
    }
    match d.probe(c, true).await? {
        Some(m) if m.kind == Kind::Dir => Ok(m.id),
        _ => bail!("{} exists and is not a directory", d.show()),
    }
}

/// Entries of a directory; `follow`: what symbolic links lead to.
async fn list(c: &Client, d: &Loc, follow: bool) -> Result<Vec<(Vec<u8>, Meta)>> {
    let mut out = Vec::new();
    match d {
        Loc::Local(p) => {
            let mut rd = tokio::fs::read_dir(p)
                .await
                .with_context(|| format!("listing {}", p.display()))?;
            while let Some(e) = rd
                .next_entry()
                .await
                .with_context(|| format!("listing {}", p.display()))?
            {
                let m = e
                    .metadata()
                    .await
                    .with_context(|| e.path().display().to_string())?;
                out.push((e.file_name().into_vec(), Meta::local(&m)));
            }
        }
        Loc::Remote(p) => {
            for (name, i) in c.read_dir(p).await.with_context(|| d.show())? {
                out.push((name, Meta::remote(&i)));
            }
        }
    }
    if follow {
        for (name, meta) in &mut out {
            if meta.kind == Kind::Link {
                let link = d.join(name);
                *meta = link.probe(c, true).await?.with_context(|| {
                    format!("{}: a dangling symbolic link (with -L)", link.show())
                })?;
            }
        }
    }
    Ok(out)
}

/// Makes the symbolic link `dst` with the target of `src`, byte for byte; something already at
/// `dst` that is not a directory is replaced, as cp does.
async fn copy_link(c: &Client, src: &Loc, dst: &Loc) -> Result<()> {
    let target: Vec<u8> = match src {
        Loc::Local(p) => tokio::fs::read_link(p)
            .await
            .with_context(|| format!("reading the link {}", p.display()))?
            .into_os_string()
            .into_vec(),
        Loc::Remote(p) => c.read_link(p).await.with_context(|| src.show())?,
    };
    match dst.probe(c, false).await? {
        Some(m) if m.kind == Kind::Dir => {
            bail!("cannot replace the directory {} with a link", dst.show())
        }
        Some(_) => match dst {
            Loc::Local(p) => tokio::fs::remove_file(p).await?,
            Loc::Remote(p) => c.remove_file(p).await?,
        },
        None => {}
    }
    match dst {
        Loc::Local(p) => tokio::fs::symlink(OsStr::from_bytes(&target), p).await?,
        Loc::Remote(p) => drop(c.symlink_path(&target, p).await?),
    }
    Ok(())
}

/// Sets the permission bits of a remote file or directory.
async fn set_remote_mode(c: &Client, ino: u64, mode: u32) -> tessera_client::Result<()> {
    let attr = SetAttr {
        mode: Some(mode),
        ctime: Timespec::now(),
        ..SetAttr::default()
    };
    c.setattr(ino, attr).await.map(drop)
}

/// A destination file, open for writing, whose permission bits are the source's by the end and
/// at no moment wider than the source's: a new file is made with them (less the special bits
/// until it is written), an existing one loses the extra bits first.
enum Out {
    Local(tokio::fs::File),
    Remote(Box<tessera_client::File>),
}

impl Out {
    async fn open(c: &Client, dst: &Loc, mode: u32) -> Result<Self> {
        let out = match dst {
            Loc::Local(p) => Self::Local(
                tokio::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(mode & 0o777)
                    .open(p)
                    .await?,
            ),
            Loc::Remote(p) => {
                let opts = OpenOptions {
                    mode: mode & 0o777,
                    ..OpenOptions::create()
                };
                Self::Remote(Box::new(c.open(p, &opts).await?))
            }
        };
        let now = out.mode().await?;
        if now & !mode != 0 {
            out.set_mode(c, now & mode).await?;
        }
        Ok(out)
    }

    async fn mode(&self) -> Result<u32> {
        Ok(match self {
            Self::Local(f) => f.metadata().await?.mode() & 0o7777,
            Self::Remote(f) => f.attr().mode & 0o7777,
        })
    }

    async fn set_mode(&self, c: &Client, mode: u32) -> Result<()> {
        match self {
            Self::Local(f) => {
                f.set_permissions(std::fs::Permissions::from_mode(mode))
                    .await?
            }
            Self::Remote(f) => set_remote_mode(c, f.ino(), mode).await?,
        }
        Ok(())
    }

    /// Writes `data` at `off`, where the last write ended.
    async fn write_at(&mut self, off: u64, data: &[u8]) -> Result<()> {
        match self {
            Self::Local(f) => f.write_all(data).await?,
            Self::Remote(f) => drop(f.write_at(off, data).await?),
        }
        Ok(())
    }

    /// Everything written, then the source's permission bits.
    async fn finish(self, c: &Client, mode: u32) -> Result<()> {
        match self {
            Self::Local(mut f) => {
                f.flush().await?;
                f.set_permissions(std::fs::Permissions::from_mode(mode))
                    .await?;
            }
            Self::Remote(f) => {
                let (ino, made) = (f.ino(), f.attr().mode & 0o7777);
                f.close().await?;
                if made != mode {
                    set_remote_mode(c, ino, mode).await?;
                }
            }
        }
        Ok(())
    }
}

/// Copies one file in stripe-sized pieces, never holding it whole in memory, or one link.
async fn copy_one(c: &Client, job: &Job, pb: &ProgressBar) -> Result<()> {
    let what = || format!("copying {} to {}", job.src.show(), job.dst.show());
    if job.meta.kind == Kind::Link {
        return copy_link(c, &job.src, &job.dst).await.with_context(what);
    }
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
    let mut out = Out::open(c, &job.dst, job.meta.mode)
        .await
        .with_context(|| format!("creating {}", job.dst.show()))?;
    let mut buf = vec![0u8; chunk];
    let mut off = 0u64;
    let copied: Result<()> = async {
        loop {
            let data: bytes::Bytes = if let Some(f) = local_in.as_mut() {
                let n = f.read(&mut buf).await.with_context(what)?;
                bytes::Bytes::copy_from_slice(&buf[..n])
            } else if let Some(f) = remote_in.as_mut() {
                f.read_at(off, chunk).await.with_context(what)?
            } else {
                unreachable!("a source is local or remote")
            };
            if data.is_empty() {
                return Ok(());
            }
            out.write_at(off, &data).await.with_context(what)?;
            off += data.len() as u64;
            pb.inc(data.len() as u64);
        }
    }
    .await;
    // Closed also after a failure, not dropped: a dropped handle finishes in the background,
    // which this process exiting cuts short, leaving the file open on the servers and the
    // size of what was stored unpublished.
    let read = match remote_in {
        Some(f) => f.close().await.with_context(what),
        None => Ok(()),
    };
    let written = out.finish(c, job.meta.mode).await.with_context(what);
    copied.and(read).and(written)
}

/// Gives each directory made or copied into the permission bits of its source, the deepest
/// first: one that forbids writing is so only once filled.
async fn set_dir_modes(c: &Client, dirs: &[(Loc, u32)]) -> Result<()> {
    for (d, mode) in dirs.iter().rev() {
        let what = || format!("setting the permissions of {}", d.show());
        match d {
            Loc::Local(p) => tokio::fs::set_permissions(p, std::fs::Permissions::from_mode(*mode))
                .await
                .with_context(what)?,
            Loc::Remote(p) => {
                let i = c.stat(p).await.with_context(what)?;
                set_remote_mode(c, i.ino, *mode).await.with_context(what)?;
            }
        }
    }
    Ok(())
}

pub async fn cp(c: &Client, args: &CpArgs) -> Result<()> {
    let plan = plan(c, args).await?;
    let pb = ProgressBar::with_draw_target(Some(plan.total), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(
            "{bytes}/{total_bytes} [{bar:40}] {bytes_per_sec} {pos:>} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let links = plan
        .jobs
        .iter()
        .filter(|j| j.meta.kind == Kind::Link)
        .count();
    let files = plan.jobs.len() - links;
    let start = std::time::Instant::now();
    // Every copy runs to its end, also after one failed: one cut off would leave its file
    // open on the servers (a dropped handle), and its space held after a removal.
    let copied: Vec<Result<()>> = stream::iter(plan.jobs.iter().map(|j| copy_one(c, j, &pb)))
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
    set_dir_modes(c, &plan.dirs).await?;
    let secs = start.elapsed().as_secs_f64();
    let links = match links {
        0 => String::new(),
        n => format!(" and {n} symbolic links"),
    };
    eprintln!(
        "copied {files} files{links}, {} in {secs:.2} s ({}/s)",
        human(plan.total),
        human((plan.total as f64 / secs.max(1e-9)) as u64)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations() {
        let parse = |s: &str| Loc::parse(OsStr::new(s));
        assert!(matches!(parse("tessera:/a/b"), Loc::Remote(p) if p == b"/a/b"));
        assert!(matches!(parse("tessera:a"), Loc::Remote(p) if p == b"/a"));
        assert!(matches!(parse("./x"), Loc::Local(_)));
        assert_eq!(parse("tessera:/a/").join(b"b").show(), "tessera:/a/b");
        assert_eq!(parse("tessera:/a/b/").name().as_deref(), Some(&b"b"[..]));
        let odd = Loc::parse(OsStr::from_bytes(b"tessera:/a/\xff"));
        assert!(matches!(&odd, Loc::Remote(p) if p == b"/a/\xff"));
        assert!(matches!(odd.join(b"\xfe"), Loc::Remote(p) if p == b"/a/\xff/\xfe"));
    }
}
