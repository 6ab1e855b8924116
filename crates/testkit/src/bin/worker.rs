//! `tessera-worker`: a Tessera client in its own process, driven by JSON lines on stdin (one
//! reply line per command on stdout). Tests use it to act as separate client processes.
//! It connects on the first command; a connection error is that command's error reply.

use anyhow::{anyhow, Context, Result};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, Write};
use tessera_client::{Client, ClientOptions, Error, File, FileKind, OpenOptions};
use tessera_testkit::{digest, pattern};

struct Session {
    client: Option<Client>,
    files: HashMap<u64, File>,
    next: u64,
}

fn arg<'a>(v: &'a Value, k: &str) -> Result<&'a Value> {
    v.get(k).ok_or_else(|| anyhow!("missing field {k}"))
}
fn num(v: &Value, k: &str) -> Result<u64> {
    arg(v, k)?
        .as_u64()
        .ok_or_else(|| anyhow!("{k} must be a number"))
}
fn text<'a>(v: &'a Value, k: &str) -> Result<&'a str> {
    arg(v, k)?
        .as_str()
        .ok_or_else(|| anyhow!("{k} must be a string"))
}
fn flag(v: &Value, k: &str) -> bool {
    v.get(k).and_then(Value::as_bool).unwrap_or(false)
}

impl Session {
    async fn client(&mut self) -> Result<Client, Error> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let manager = std::env::var("TESSERA_MANAGER")
            .map_err(|_| Error::Invalid("TESSERA_MANAGER is not set".into()))?;
        let manager = manager
            .parse()
            .map_err(|e| Error::Invalid(format!("TESSERA_MANAGER: {e}")))?;
        let secret = std::env::var("TESSERA_SECRET").unwrap_or_default();
        let c = Client::connect(ClientOptions::new(manager, &secret)).await?;
        self.client = Some(c.clone());
        Ok(c)
    }

    fn file(&mut self, v: &Value) -> Result<&mut File> {
        let h = num(v, "handle")?;
        self.files
            .get_mut(&h)
            .ok_or_else(|| anyhow!("no handle {h}"))
    }

    async fn run(&mut self, v: &Value) -> Result<Result<Value, Error>> {
        let c = match self.client().await {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        let cmd = text(v, "cmd")?;
        Ok(match cmd {
            "open" => {
                let opts = OpenOptions {
                    read: !v.get("read").is_some_and(|r| r == false),
                    write: flag(v, "write"),
                    append: flag(v, "append"),
                    truncate: flag(v, "truncate"),
                    create: flag(v, "create"),
                    create_new: flag(v, "create_new"),
                    mode: 0o644,
                    ..OpenOptions::default()
                };
                match c.open(text(v, "path")?, &opts).await {
                    Ok(f) => {
                        self.next += 1;
                        self.files.insert(self.next, f);
                        Ok(json!({"handle": self.next}))
                    }
                    Err(e) => Err(e),
                }
            }
            "write" => {
                let (off, len, seed) =
                    (num(v, "offset")?, num(v, "len")? as usize, num(v, "seed")?);
                let data = pattern(seed, off, len);
                self.file(v)?
                    .write_at(off, &data)
                    .await
                    .map(|n| json!({"written": n}))
            }
            "read" => {
                let (off, len) = (num(v, "offset")?, num(v, "len")? as usize);
                self.file(v)?
                    .read_at(off, len)
                    .await
                    .map(|b| json!({"len": b.len(), "hash": digest(&b)}))
            }
            "truncate" => self
                .file(v)?
                .set_len(num(v, "size")?)
                .await
                .map(|()| json!({})),
            "fsync" => self.file(v)?.flush().await.map(|()| json!({})),
            "close" => {
                let h = num(v, "handle")?;
                let f = self
                    .files
                    .remove(&h)
                    .ok_or_else(|| anyhow!("no handle {h}"))?;
                f.close().await.map(|()| json!({}))
            }
            // Writes a whole file of pattern `seed` in `chunk`-sized writes.
            "write_file" => {
                let (len, seed) = (num(v, "len")?, num(v, "seed")?);
                let chunk = v
                    .get("chunk")
                    .and_then(Value::as_u64)
                    .unwrap_or(1 << 20)
                    .max(1);
                write_file(&c, text(v, "path")?, len, seed, chunk)
                    .await
                    .map(|()| json!({}))
            }
            // Reads a whole file; returns its length and hash.
            "read_file" => match c.open(text(v, "path")?, &OpenOptions::read()).await {
                Ok(mut f) => {
                    let data = f.read_to_end().await;
                    let closed = f.close().await;
                    data.and_then(|d| closed.map(|()| json!({"len": d.len(), "hash": digest(&d)})))
                }
                Err(e) => Err(e),
            },
            "stat" => c.stat(text(v, "path")?).await.map(|i| {
                let kind = match i.kind {
                    FileKind::File => "file",
                    FileKind::Dir => "dir",
                    FileKind::Symlink => "symlink",
                    FileKind::Fifo => "fifo",
                    FileKind::Socket => "socket",
                    FileKind::CharDevice(_) | FileKind::BlockDevice(_) => "device",
                };
                json!({"ino": i.ino, "size": i.size, "kind": kind, "nlink": i.nlink, "mode": i.mode,
                       "mtime": [i.mtime.secs, i.mtime.nanos]})
            }),
            "mkdir" => c.create_dir(text(v, "path")?).await.map(|_| json!({})),
            "rmdir" => c.remove_dir(text(v, "path")?).await.map(|()| json!({})),
            "unlink" => c.remove_file(text(v, "path")?).await.map(|()| json!({})),
            "rename" => c
                .rename_path(text(v, "from")?, text(v, "to")?)
                .await
                .map(|()| json!({})),
            "link" => c
                .hard_link(text(v, "from")?, text(v, "to")?)
                .await
                .map(|_| json!({})),
            "symlink" => c
                .symlink_path(text(v, "target")?, text(v, "path")?)
                .await
                .map(|_| json!({})),
            "readdir" => c.read_dir(text(v, "path")?).await.map(|es| {
                let names: Vec<_> = es.iter().map(|(n, _)| String::from_utf8_lossy(n)).collect();
                json!({ "names": names })
            }),
            "usage" => c
                .usage()
                .await
                .map(|u| json!({"used": u.used, "capacity": u.capacity, "inodes": u.inodes})),
            "status" => c.status().await.map(|st| {
                let nodes: Vec<Value> = st
                    .nodes
                    .iter()
                    .map(|n| {
                        json!({"id": n.id, "addr": n.addr.to_string(), "alive": n.alive,
                               "partitions": n.partitions, "bytes_read": n.stats.bytes_read,
                               "reads": n.stats.reads, "syncing": n.stats.syncing,
                               "stripes": n.stats.stripes, "used": n.stats.used,
                               "capacity": n.stats.capacity, "pooled": n.stats.pooled})
                    })
                    .collect();
                json!({"epoch": st.epoch, "degraded": st.degraded, "lost": st.lost,
                       "incoming": st.incoming, "nodes": nodes})
            }),
            other => return Err(anyhow!("unknown command {other}")),
        })
    }
}

async fn write_file(c: &Client, path: &str, len: u64, seed: u64, chunk: u64) -> Result<(), Error> {
    let mut f = c.open(path, &OpenOptions::create()).await?;
    let mut off = 0;
    let mut result = Ok(());
    while off < len && result.is_ok() {
        let n = chunk.min(len - off);
        result = f
            .write_at(off, &pattern(seed, off, n as usize))
            .await
            .map(|_| ());
        off += n;
    }
    let closed = f.close().await;
    result.and(closed)
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut s = Session {
        client: None,
        files: HashMap::new(),
        next: 0,
    };
    let stdin = std::io::stdin();
    let mut out = std::io::stdout();
    for line in stdin.lock().lines() {
        let line = line.context("reading a command")?;
        if line.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(&line).context("a command must be one JSON object")?;
        let reply = match s.run(&v).await? {
            Ok(mut r) => {
                r["ok"] = json!(true);
                r
            }
            Err(e) => json!({"ok": false, "errno": e.errno(), "error": e.to_string()}),
        };
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    Ok(())
}
