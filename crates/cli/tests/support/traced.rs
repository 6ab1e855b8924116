//! Traced mounts for the tests: `tessera mount --trace` in the background, and the trace it
//! leaves, read whole once its writer has finished it.

use super::TESSERA;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tessera_trace::{Gap, Item, Reader, Record};

/// What a trace file holds.
pub struct Trace {
    pub records: Vec<Record>,
    pub gaps: Vec<Gap>,
    /// (records, dropped) from the end marker, if the writer stopped.
    pub end: Option<(u64, u64)>,
}

pub fn read(path: &Path) -> Trace {
    let mut t = Trace {
        records: Vec::new(),
        gaps: Vec::new(),
        end: None,
    };
    for item in Reader::open(path).expect("a trace") {
        match item.expect("readable") {
            Item::Record(r) => t.records.push(r),
            Item::Gap(g) => t.gaps.push(g),
            Item::End { records, dropped } => t.end = Some((records, dropped)),
        }
    }
    t
}

/// The one trace file in `dir`.
pub fn trace_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the trace directory")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ttrace"))
        .collect();
    assert_eq!(files.len(), 1, "one trace in {}: {files:?}", dir.display());
    files.into_iter().next().unwrap_or_default()
}

/// Stops tracing on `mnt` (`tessera trace stop`) and reads the trace once its writer has
/// finished it.
pub fn stop_and_read(home: &Path, mnt: &Path, dir: &Path) -> Trace {
    let out = Command::new(TESSERA)
        .args(["trace", "stop"])
        .arg(mnt)
        .env("TESSERA_HOME", home)
        .output()
        .expect("tessera trace stop");
    assert!(out.status.success(), "trace stop: {out:?}");
    let path = trace_file(dir);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let t = read(&path);
        if t.end.is_some() {
            return t;
        }
        assert!(Instant::now() < deadline, "the trace was not finished");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `tessera mount DIR ARGS` in the background against `up`'s cluster; stopped (Ctrl-C) when
/// dropped.
pub struct Mount(pub Child);

impl Mount {
    pub fn start(home: &Path, mnt: &Path, args: &[&str]) -> Mount {
        let dev = || std::fs::metadata(mnt).map(|m| std::os::unix::fs::MetadataExt::dev(&m));
        let before = dev().expect("the mount point");
        let child = Command::new(TESSERA)
            .arg("mount")
            .arg(mnt)
            .args(args)
            .env("TESSERA_HOME", home)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(home.join("mount.log")).expect("mount.log"))
            .spawn()
            .expect("tessera mount");
        let mut m = Mount(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while dev().ok() == Some(before) {
            if let Some(status) = m.0.try_wait().expect("the mount's status") {
                let log = std::fs::read_to_string(home.join("mount.log")).unwrap_or_default();
                panic!("tessera mount exited ({status}):\n{log}");
            }
            assert!(Instant::now() < deadline, "not mounted within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let _ = self.0.wait();
    }
}
