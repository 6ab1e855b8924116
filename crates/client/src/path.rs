//! Path-level operations over the inode-level ones, and the short-lived directory cache that
//! keeps path walks from asking the same directory servers again and again.

use crate::options::OpenOptions;
use crate::trace::{self, Answer, Call, NOFOLLOW, PARENTS};
use crate::{Client, Error, File, Result};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tessera_placement::{Ino, ROOT_INO};
use tessera_proto::{DirEntry, ErrorCode, FileKind, Inode, Name, SetAttr, Timespec};
use tessera_trace::Op;

/// Symbolic links followed in one path walk before ELOOP (Linux's limit).
const MAX_LINKS: u32 = 40;
const DIR_CACHE_MAX: usize = 65_536;

/// Remembers (directory, name) -> subdirectory for a short time. Only directories are cached:
/// they are renamed rarely, and a stale entry can only misroute a walk for `ttl`, like NFS's
/// directory attribute cache. Local renames and removals forget their entries at once.
pub(crate) struct DirCache {
    ttl: Duration,
    map: Mutex<HashMap<(Ino, Name), (DirEntry, Instant)>>,
}

impl DirCache {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            map: Mutex::default(),
        }
    }

    fn get(&self, dir: Ino, name: &[u8]) -> Option<DirEntry> {
        if self.ttl.is_zero() {
            return None;
        }
        let map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(&(dir, name.to_vec()))
            .filter(|(_, t)| t.elapsed() < self.ttl)
            .map(|(e, _)| *e)
    }

    fn put(&self, dir: Ino, name: &[u8], e: DirEntry) {
        if self.ttl.is_zero() || e.kind != FileKind::Dir {
            return;
        }
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if map.len() >= DIR_CACHE_MAX {
            map.clear();
        }
        map.insert((dir, name.to_vec()), (e, Instant::now()));
    }

    pub fn forget(&self, dir: Ino, name: &[u8]) {
        self.map
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(dir, name.to_vec()));
    }
}

/// Splits a path into components; `tessera:` / `tessera://` prefixes and empty and `.`
/// components are dropped. Paths are taken from the root of the file system, and are bytes,
/// as names are: any name a directory holds can be written.
fn components(path: &[u8]) -> VecDeque<Name> {
    let path = path
        .strip_prefix(b"tessera://")
        .or_else(|| path.strip_prefix(b"tessera:"))
        .unwrap_or(path);
    split(path)
}

/// A path's components, as a symbolic link's target is read (no prefix is special).
fn split(path: &[u8]) -> VecDeque<Name> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(<[u8]>::to_vec)
        .collect()
}

impl Client {
    async fn lookup_cached(&self, dir: Ino, name: &[u8]) -> Result<DirEntry> {
        if let Some(e) = self.dirs.get(dir, name) {
            return Ok(e);
        }
        let e = self.lookup_entry(dir, name).await?;
        self.dirs.put(dir, name, e);
        Ok(e)
    }

    /// Walks `comps` from `start`. Returns the directory holding the last component, its name,
    /// and its entry if it exists. Symbolic links are followed in the middle of the path, and at
    /// the end when `follow_last`.
    async fn walk(
        &self,
        mut comps: VecDeque<Name>,
        follow_last: bool,
    ) -> Result<(Ino, Option<(Name, Option<DirEntry>)>)> {
        let mut dir = ROOT_INO;
        let mut links = 0;
        while let Some(c) = comps.pop_front() {
            if c == b".." {
                dir = self.getattr(dir).await?.parent;
                continue;
            }
            let entry = match self.lookup_cached(dir, &c).await {
                Ok(e) => e,
                Err(e) if e.is(&ErrorCode::NotFound) && comps.is_empty() => {
                    return Ok((dir, Some((c, None))))
                }
                Err(e) => return Err(e),
            };
            let last = comps.is_empty();
            if entry.kind == FileKind::Symlink && (!last || follow_last) {
                links += 1;
                if links > MAX_LINKS {
                    return Err(Error::Loop);
                }
                let target = self.readlink(entry.ino).await?;
                if target.starts_with(b"/") {
                    dir = ROOT_INO;
                }
                for t in split(&target).into_iter().rev() {
                    comps.push_front(t);
                }
                if comps.is_empty() {
                    return Ok((dir, None)); // a link to "/" (or to its own directory)
                }
                continue;
            }
            if last {
                return Ok((dir, Some((c, Some(entry)))));
            }
            if entry.kind != FileKind::Dir {
                return Err(ErrorCode::NotDir.into());
            }
            dir = entry.ino;
        }
        Ok((dir, None))
    }

    /// Runs the path call `run`, recorded as `call` describes it if this client traces.
    async fn traced<'a, T: Answer>(
        &self,
        call: impl FnOnce() -> Call<'a>,
        run: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        let span = trace::begin(self.trace.as_ref());
        let out = run.await;
        if let Some(span) = span {
            span.end(&call(), &out);
        }
        out
    }

    fn call<'a>(&self, op: Op, path: &'a [u8]) -> Call<'a> {
        Call::new(op, path, self.opts.uid)
    }

    /// The inode at `path`, following symbolic links.
    pub async fn stat(&self, path: impl AsRef<[u8]>) -> Result<Inode> {
        let path = path.as_ref();
        self.traced(|| self.call(Op::Getattr, path), self.stat_inner(path, true))
            .await
    }

    /// The inode at `path`; a final symbolic link is not followed.
    pub async fn lstat(&self, path: impl AsRef<[u8]>) -> Result<Inode> {
        let path = path.as_ref();
        let call = || Call {
            flags: NOFOLLOW,
            ..self.call(Op::Getattr, path)
        };
        self.traced(call, self.stat_inner(path, false)).await
    }

    async fn stat_inner(&self, path: &[u8], follow: bool) -> Result<Inode> {
        match self.walk(components(path), follow).await? {
            (dir, None) => self.getattr(dir).await,
            (_, Some((_, Some(e)))) => self.getattr(e.ino).await,
            (_, Some((_, None))) => Err(Error::not_found()),
        }
    }

    /// The parent directory and final name of `path`, which must name something below the root.
    async fn parent_of(&self, path: &[u8]) -> Result<(Ino, Name, Option<DirEntry>)> {
        match self.walk(components(path), false).await? {
            (dir, Some((name, entry))) => Ok((dir, name, entry)),
            (_, None) => Err(Error::Invalid(format!(
                "{}: the root cannot be used here",
                String::from_utf8_lossy(path)
            ))),
        }
    }

    /// Opens the file at `path`; recorded as a create if it may create it.
    pub async fn open(&self, path: impl AsRef<[u8]>, opts: &OpenOptions) -> Result<File> {
        let path = path.as_ref();
        let op = if opts.create || opts.create_new {
            Op::Create
        } else {
            Op::Open
        };
        let call = || Call {
            flags: opts.flags(),
            ..self.call(op, path)
        };
        let mut out = self.traced(call, self.open_untraced(path, opts)).await;
        if let (Some(t), Ok(f)) = (&self.trace, &mut out) {
            f.trace(Arc::clone(t), path);
        }
        out
    }

    async fn open_untraced(&self, path: &[u8], opts: &OpenOptions) -> Result<File> {
        let (dir, name, entry) = match self.walk(components(path), true).await? {
            (dir, Some((name, entry))) => (dir, name, entry),
            (dir, None) => return self.open_ino(dir, opts).await,
        };
        match entry {
            Some(_) if opts.create_new => Err(ErrorCode::Exists.into()),
            Some(e) => self.open_ino(e.ino, opts).await,
            None if opts.create || opts.create_new => {
                self.create(
                    dir,
                    &name,
                    opts.mode & !self.opts.umask,
                    opts.create_new,
                    opts,
                )
                .await
            }
            None => Err(Error::not_found()),
        }
    }

    /// Creates a directory; its parent must exist.
    pub async fn create_dir(&self, path: impl AsRef<[u8]>) -> Result<Inode> {
        let path = path.as_ref();
        let mode = 0o777 & !self.opts.umask;
        let call = || Call {
            flags: mode,
            ..self.call(Op::Mkdir, path)
        };
        self.traced(call, async {
            match self.parent_of(path).await? {
                (_, _, Some(_)) => Err(ErrorCode::Exists.into()),
                (dir, name, None) => self.mkdir(dir, &name, mode).await,
            }
        })
        .await
    }

    /// Creates a directory and any missing parents; an existing directory is fine.
    pub async fn create_dir_all(&self, path: impl AsRef<[u8]>) -> Result<Inode> {
        let path = path.as_ref();
        let call = || Call {
            flags: 0o777 & !self.opts.umask | PARENTS,
            ..self.call(Op::Mkdir, path)
        };
        self.traced(call, self.create_dir_all_untraced(path)).await
    }

    async fn create_dir_all_untraced(&self, path: &[u8]) -> Result<Inode> {
        let mut dir = self.getattr(ROOT_INO).await?;
        for c in components(path) {
            dir = match self.lookup_cached(dir.ino, &c).await {
                Ok(e) if e.kind == FileKind::Dir => self.getattr(e.ino).await?,
                Ok(_) => return Err(ErrorCode::NotDir.into()),
                Err(e) if e.is(&ErrorCode::NotFound) => {
                    match self.mkdir(dir.ino, &c, 0o777 & !self.opts.umask).await {
                        Ok(i) => i,
                        Err(e) if e.is(&ErrorCode::Exists) => self.lookup(dir.ino, &c).await?,
                        Err(e) => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
        }
        Ok(dir)
    }

    /// Entries of the directory at `path`, with their attributes.
    pub async fn read_dir(&self, path: impl AsRef<[u8]>) -> Result<Vec<(Name, Inode)>> {
        let path = path.as_ref();
        self.traced(
            || self.call(Op::Readdir, path),
            self.read_dir_untraced(path),
        )
        .await
    }

    async fn read_dir_untraced(&self, path: &[u8]) -> Result<Vec<(Name, Inode)>> {
        let dir = self.stat_inner(path, true).await?;
        if dir.kind != FileKind::Dir {
            return Err(ErrorCode::NotDir.into());
        }
        let entries = self.readdir_all(dir.ino).await?;
        // Files placed with their names came with the listing; the others are asked for.
        let attrs = futures::future::join_all(entries.iter().map(|(_, e, inode)| async move {
            match inode {
                Some(i) => Ok(i.clone()),
                None => self.getattr(e.ino).await,
            }
        }))
        .await;
        let mut out = Vec::with_capacity(entries.len());
        for ((name, _, _), attr) in entries.into_iter().zip(attrs) {
            match attr {
                Ok(a) => out.push((name, a)),
                // Removed while we listed: leave it out, as a later listing would.
                Err(e) if e.is(&ErrorCode::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    pub async fn remove_file(&self, path: impl AsRef<[u8]>) -> Result<()> {
        let path = path.as_ref();
        self.traced(|| self.call(Op::Unlink, path), async {
            let (dir, name, _) = self.parent_of(path).await?;
            self.unlink(dir, &name).await
        })
        .await
    }

    pub async fn remove_dir(&self, path: impl AsRef<[u8]>) -> Result<()> {
        let path = path.as_ref();
        self.traced(|| self.call(Op::Rmdir, path), async {
            let (dir, name, _) = self.parent_of(path).await?;
            self.rmdir(dir, &name).await
        })
        .await
    }

    /// Removes `path` and, for a directory, everything below it (recorded as one unlink, or
    /// one rmdir of a tree).
    pub async fn remove_all(&self, path: impl AsRef<[u8]>) -> Result<()> {
        let path = path.as_ref();
        let tree = AtomicBool::new(false);
        let call = || Call {
            flags: PARENTS,
            ..self.call(
                if tree.load(Ordering::Relaxed) {
                    Op::Rmdir
                } else {
                    Op::Unlink
                },
                path,
            )
        };
        self.traced(call, async {
            let (dir, name, entry) = self.parent_of(path).await?;
            let entry = entry.ok_or_else(Error::not_found)?;
            if entry.kind == FileKind::Dir {
                tree.store(true, Ordering::Relaxed);
                self.empty_tree(entry.ino).await?;
                self.rmdir(dir, &name).await
            } else {
                self.unlink(dir, &name).await
            }
        })
        .await
    }

    /// Empties a directory tree, deepest directories first (an explicit stack: trees may be
    /// deep). Entries of one directory are removed concurrently.
    async fn empty_tree(&self, dir: Ino) -> Result<()> {
        let mut stack = vec![(dir, false)];
        while let Some((d, children_emptied)) = stack.pop() {
            let entries = self.readdir_all(d).await?;
            if !children_emptied {
                stack.push((d, true));
                stack.extend(
                    entries
                        .iter()
                        .filter(|(_, e, _)| e.kind == FileKind::Dir)
                        .map(|(_, e, _)| (e.ino, false)),
                );
                continue;
            }
            futures::future::try_join_all(entries.iter().map(|(n, e, _)| async move {
                if e.kind == FileKind::Dir {
                    self.rmdir(d, n).await
                } else {
                    self.unlink(d, n).await
                }
            }))
            .await?;
        }
        Ok(())
    }

    pub async fn rename_path(&self, from: impl AsRef<[u8]>, to: impl AsRef<[u8]>) -> Result<()> {
        let (from, to) = (from.as_ref(), to.as_ref());
        let call = || Call {
            target: Some(to),
            ..self.call(Op::Rename, from)
        };
        self.traced(call, async {
            let (src_dir, src_name, _) = self.parent_of(from).await?;
            let (dst_dir, dst_name, _) = self.parent_of(to).await?;
            self.rename(src_dir, &src_name, dst_dir, &dst_name, false)
                .await
                .map(drop)
        })
        .await
    }

    /// A symbolic link at `link` whose target is `target`, byte for byte.
    pub async fn symlink_path(
        &self,
        target: impl AsRef<[u8]>,
        link: impl AsRef<[u8]>,
    ) -> Result<Inode> {
        let (target, link) = (target.as_ref(), link.as_ref());
        let call = || Call {
            target: Some(target),
            ..self.call(Op::Symlink, link)
        };
        self.traced(call, async {
            let (dir, name, _) = self.parent_of(link).await?;
            self.symlink(dir, &name, target).await
        })
        .await
    }

    pub async fn hard_link(
        &self,
        existing: impl AsRef<[u8]>,
        link: impl AsRef<[u8]>,
    ) -> Result<Inode> {
        let (existing, link) = (existing.as_ref(), link.as_ref());
        let call = || Call {
            target: Some(link),
            ..self.call(Op::Link, existing)
        };
        self.traced(call, async {
            let src = self.stat_inner(existing, false).await?;
            let (dir, name, _) = self.parent_of(link).await?;
            self.link(src.ino, dir, &name).await
        })
        .await
    }

    /// The target of the symbolic link at `path`, byte for byte.
    pub async fn read_link(&self, path: impl AsRef<[u8]>) -> Result<Vec<u8>> {
        let path = path.as_ref();
        self.traced(|| self.call(Op::Readlink, path), async {
            let inode = self.stat_inner(path, false).await?;
            self.readlink(inode.ino).await
        })
        .await
    }

    /// Changes the permission bits at `path`.
    pub async fn set_mode(&self, path: impl AsRef<[u8]>, mode: u32) -> Result<Inode> {
        let path = path.as_ref();
        let call = || Call {
            flags: mode & 0o7777,
            ..self.call(Op::Setattr, path)
        };
        self.traced(call, async {
            let inode = self.stat_inner(path, true).await?;
            let attr = SetAttr {
                mode: Some(mode & 0o7777),
                ctime: Timespec::now(),
                ..SetAttr::default()
            };
            self.setattr(inode.ino, attr).await
        })
        .await
    }

    /// The whole content of the file at `path`.
    pub async fn read(&self, path: impl AsRef<[u8]>) -> Result<Vec<u8>> {
        let mut f = self.open(path, &OpenOptions::read()).await?;
        let out = f.read_to_end().await;
        let closed = f.close().await;
        let out = out?;
        closed?;
        Ok(out)
    }

    /// Creates or replaces the file at `path` with `data`.
    pub async fn write(&self, path: impl AsRef<[u8]>, data: &[u8]) -> Result<()> {
        let mut f = self.open(path, &OpenOptions::create()).await?;
        let written = f.write_at(0, data).await;
        let closed = f.close().await;
        written?;
        closed
    }
}

#[cfg(test)]
mod tests {
    use super::{components, split};

    #[test]
    fn path_components() {
        let c = |p: &str| {
            components(p.as_bytes())
                .into_iter()
                .map(|n| String::from_utf8(n).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(c("/a//b/./c/"), ["a", "b", "c"]);
        assert_eq!(c("tessera://x/y"), ["x", "y"]);
        assert_eq!(c("tessera:/x"), ["x"]);
        assert_eq!(c("/"), Vec::<String>::new());
        assert_eq!(c("a/../b"), ["a", "..", "b"]);
        assert_eq!(split(b"tessera:x/\xff"), [&b"tessera:x"[..], b"\xff"]);
    }
}
