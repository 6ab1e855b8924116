//! The working directory of an output: its names, what a listing of it says, and files
//! written whole (under a temporary name, then renamed: a reader never finds one half
//! written).

use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};
use tessera_client::{Client, ErrorCode, Inode, Timespec};

/// The paths of one collective output.
#[derive(Debug, Clone)]
pub struct Dir {
    /// The output, `/a/b/name`.
    pub output: Vec<u8>,
    /// `/a/b/.tessera-collective.name`
    pub path: Vec<u8>,
}

impl Dir {
    pub fn of(output: &[u8]) -> Result<Self> {
        let output = output
            .strip_prefix(b"tessera://")
            .or_else(|| output.strip_prefix(b"tessera:"))
            .unwrap_or(output);
        let mut parts: Vec<&[u8]> = output
            .split(|&b| b == b'/')
            .filter(|c| !c.is_empty() && *c != b".")
            .collect();
        let name = parts.pop().filter(|n| *n != b"..").ok_or_else(|| {
            Error::Invalid(format!(
                "{}: a collective output needs a file name",
                String::from_utf8_lossy(output)
            ))
        })?;
        let mut parent = Vec::new();
        for p in parts {
            parent.push(b'/');
            parent.extend_from_slice(p);
        }
        let join = |n: &[u8]| [&parent[..], b"/", n].concat();
        Ok(Self {
            output: join(name),
            path: join(&[&b".tessera-collective."[..], name].concat()),
        })
    }

    pub fn child(&self, name: &str) -> Vec<u8> {
        [&self.path[..], b"/", name.as_bytes()].concat()
    }

    /// The output's path, for messages.
    pub fn show(&self) -> String {
        String::from_utf8_lossy(&self.output).into_owned()
    }

    pub fn show_dir(&self) -> String {
        String::from_utf8_lossy(&self.path).into_owned()
    }

    /// Writes `data` as `name`, whole: under a name of this writer's, then renamed.
    pub async fn put(&self, client: &Client, rank: u32, name: &str, data: &[u8]) -> Result<()> {
        let tmp = self.child(&format!(".{name}.w{rank}.tmp"));
        client.write(&tmp, data).await?;
        client.rename_path(&tmp, self.child(name)).await?;
        Ok(())
    }

    /// The JSON file `name`.
    pub async fn get<T: serde::de::DeserializeOwned>(
        &self,
        client: &Client,
        name: &str,
    ) -> Result<T> {
        let data = client.read(self.child(name)).await?;
        serde_json::from_slice(&data).map_err(|e| Error::Corrupt(format!("{name}: {e}")))
    }

    /// Removes the directory and all it holds; another writer may be removing it too.
    pub async fn remove(&self, client: &Client) -> Result<()> {
        let gone = |e: &tessera_client::Error| e.is(&ErrorCode::NotFound);
        for _ in 0..3 {
            let entries = match client.read_dir(&self.path).await {
                Ok(e) => e,
                Err(e) if gone(&e) => return Ok(()),
                Err(e) => return Err(e.into()),
            };
            for (name, _) in entries {
                let path = [&self.path[..], b"/", &name].concat();
                match client.remove_file(&path).await {
                    Err(e) if !gone(&e) => return Err(e.into()),
                    _ => {}
                }
            }
            match client.remove_dir(&self.path).await {
                // Something was written meanwhile (a late writer's own temporary file).
                Err(e) if e.is(&ErrorCode::NotEmpty) => {}
                Err(e) if !gone(&e) => return Err(e.into()),
                _ => return Ok(()),
            }
        }
        Err(tessera_client::Error::from(ErrorCode::NotEmpty).into())
    }

    /// What the directory holds now; `None` if it is gone.
    pub async fn list(&self, client: &Client) -> Result<Option<Listing>> {
        match client.read_dir(&self.path).await {
            Ok(entries) => Ok(Some(Listing::of(&entries))),
            Err(e) if e.is(&ErrorCode::NotFound) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// What a listing of the working directory says.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Listing {
    /// Heartbeats: each writer's `w<rank>.alive` and when it was last touched.
    pub alive: BTreeMap<u32, Timespec>,
    pub done: BTreeSet<u32>,
    pub aborted: BTreeSet<u32>,
    /// Writers that saw the output in place.
    pub seen: BTreeSet<u32>,
    /// Run files by writer.
    pub runs: BTreeMap<u32, u32>,
    pub coordinators_done: BTreeSet<usize>,
    pub error: bool,
    pub finished: bool,
}

/// The rank (or index) `n` of a name `<prefix><n><suffix>`.
fn numbered(name: &str, prefix: char, suffix: &str) -> Option<u32> {
    name.strip_prefix(prefix)?
        .strip_suffix(suffix)?
        .parse()
        .ok()
}

impl Listing {
    pub fn of(entries: &[(Vec<u8>, Inode)]) -> Self {
        let mut l = Self::default();
        for (name, inode) in entries {
            let Ok(name) = std::str::from_utf8(name) else {
                continue;
            };
            match name {
                "error" => l.error = true,
                "finished" => l.finished = true,
                _ => {}
            }
            if let Some(r) = numbered(name, 'w', ".alive") {
                l.alive.insert(r, inode.mtime);
            } else if let Some(r) = numbered(name, 'w', ".done") {
                l.done.insert(r);
            } else if let Some(r) = numbered(name, 'w', ".seen") {
                l.seen.insert(r);
            } else if let Some(r) = numbered(name, 'w', ".abort") {
                l.aborted.insert(r);
            } else if let Some(i) = numbered(name, 'c', ".done") {
                l.coordinators_done.insert(i as usize);
            } else if let Some((w, k)) = name.split_once(".r") {
                if let (Some(r), Ok(_)) = (numbered(w, 'w', ""), k.parse::<u32>()) {
                    *l.runs.entry(r).or_default() += 1;
                }
            }
        }
        l
    }

    /// Does writer `rank` have anything here?
    pub fn has(&self, rank: u32) -> bool {
        self.alive.contains_key(&rank)
            || self.done.contains(&rank)
            || self.aborted.contains(&rank)
            || self.runs.contains_key(&rank)
    }
}

/// The name of run `k` of writer `rank`.
pub fn run_name(rank: u32, k: u32) -> String {
    format!("w{rank}.r{k}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_client::FileKind;

    #[test]
    fn paths_of_an_output() {
        let d = Dir::of(b"tessera:/a//b/./out.sam").unwrap();
        assert_eq!(d.output, b"/a/b/out.sam");
        assert_eq!(d.path, b"/a/b/.tessera-collective.out.sam");
        assert_eq!(
            d.child("w1.done"),
            b"/a/b/.tessera-collective.out.sam/w1.done"
        );
        assert_eq!(Dir::of(b"x").unwrap().path, b"/.tessera-collective.x");
        assert!(Dir::of(b"/").is_err());
        assert!(Dir::of(b"/a/..").is_err());
    }

    #[test]
    fn listings_are_read_by_name() {
        let inode = |secs| Inode {
            mtime: Timespec { secs, nanos: 0 },
            ..Inode::new(1, FileKind::File, 0o644, 0, 0, 0, Vec::new())
        };
        let names = [
            "w0.alive",
            "w0.r0",
            "w0.r1",
            "w0.done",
            "w12.alive",
            "w3.abort",
            "c2.done",
            "error",
            ".w1.done.w1.tmp",
            "output",
            "wx.alive",
            "w1.rx",
        ];
        let entries: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.as_bytes().to_vec(), inode(i as i64)))
            .collect();
        let l = Listing::of(&entries);
        assert_eq!(l.alive.keys().copied().collect::<Vec<_>>(), [0, 12]);
        assert_eq!(l.alive[&12].secs, 4);
        assert_eq!(l.done.iter().copied().collect::<Vec<_>>(), [0]);
        assert_eq!(l.aborted.iter().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(l.runs.get(&0), Some(&2));
        assert_eq!(l.coordinators_done.iter().copied().collect::<Vec<_>>(), [2]);
        assert!(l.error && !l.finished);
        assert!(l.has(3) && l.has(12) && !l.has(1));
    }
}
