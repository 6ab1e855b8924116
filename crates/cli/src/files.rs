//! File commands on cluster paths: `ls`, `stat`, `rm`, `mkdir`, `cat` (`cp` is in
//! [`crate::copy`]). A cluster path starts with `tessera:` or not.

use crate::up::human;
use anyhow::{bail, Context, Result};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use tessera_client::{Client, FileKind, Inode, OpenOptions, Timespec};
use tokio::io::AsyncWriteExt;

#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// Long listing: kind and mode, size, modification time.
    #[arg(short, long)]
    long: bool,
    #[arg(default_value = "/")]
    paths: Vec<OsString>,
}

#[derive(clap::Args, Debug)]
pub struct StatArgs {
    #[arg(long)]
    json: bool,
    #[arg(required = true)]
    paths: Vec<OsString>,
}

#[derive(clap::Args, Debug)]
pub struct RmArgs {
    /// Remove directories and their contents.
    #[arg(short, long)]
    recursive: bool,
    #[arg(required = true)]
    paths: Vec<OsString>,
}

#[derive(clap::Args, Debug)]
pub struct MkdirArgs {
    /// Create parents as needed; an existing directory is fine.
    #[arg(short, long)]
    parents: bool,
    #[arg(required = true)]
    paths: Vec<OsString>,
}

#[derive(clap::Args, Debug)]
pub struct CatArgs {
    #[arg(required = true)]
    paths: Vec<OsString>,
}

/// One end of a copy.
/// A cluster path, from the root, as bytes.
pub(crate) fn remote(p: &OsStr) -> Vec<u8> {
    let p = p.as_bytes();
    let p = p.strip_prefix(b"tessera:").unwrap_or(p);
    let start = p.iter().position(|&b| b != b'/').unwrap_or(p.len());
    [&b"/"[..], &p[start..]].concat()
}

/// A cluster path as it is shown (names that are not UTF-8 with replacement characters).
pub(crate) fn shown(p: &[u8]) -> String {
    format!("tessera:{}", String::from_utf8_lossy(p))
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
    utc_secs(t.secs)
}

/// Seconds since 1970 as `YYYY-MM-DD HH:MM:SS`, in UTC.
pub(crate) fn utc_secs(secs: i64) -> String {
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
        let inode = c.stat(&path).await.with_context(|| shown(&path))?;
        let mut entries = if inode.kind == FileKind::Dir {
            c.read_dir(&path).await.with_context(|| shown(&path))?
        } else {
            let name = path.rsplit(|&b| b == b'/').next().unwrap_or_default();
            vec![(name.to_vec(), inode)]
        };
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        if args.paths.len() > 1 {
            println!("{}:", shown(&path));
        }
        for (name, i) in entries {
            let name = String::from_utf8_lossy(&name);
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
        let i = c.lstat(&path).await.with_context(|| shown(&path))?;
        if args.json {
            println!("{}", serde_json::to_string(&i)?);
            continue;
        }
        println!("  path: {}", shown(&path));
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
        let i = c.lstat(&path).await.with_context(|| shown(&path))?;
        let done = match (i.kind, args.recursive) {
            (FileKind::Dir, false) => bail!("{} is a directory (use -r)", shown(&path)),
            (FileKind::Dir, true) => c.remove_all(&path).await,
            _ => c.remove_file(&path).await,
        };
        done.with_context(|| format!("removing {}", shown(&path)))?;
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
        made.with_context(|| format!("creating {}", shown(&path)))?;
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
            .with_context(|| shown(&path))?;
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
