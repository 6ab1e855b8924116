//! A cgroup per host: v2 where its `cpu` and `memory` controllers are on, else v1 (its `cpu`,
//! `cpuacct` and `memory` hierarchies, as on hybrid machines). An instance's cgroups sit under
//! this process's own (v1; v2 when it may hold children with controllers, else the root), in
//! a directory named after the instance, a subdirectory `h<i>` per host.

use crate::{io_error, HostsError, Limits, Usage};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// CFS period the CPU quota is given in.
const PERIOD_US: u64 = 100_000;

#[derive(Debug, Clone)]
enum Layout {
    V2 {
        parent: PathBuf,
    },
    V1 {
        cpu: PathBuf,
        cpuacct: PathBuf,
        memory: PathBuf,
    },
}

impl Layout {
    /// The directories instances are made in (one per hierarchy).
    fn parents(&self) -> Vec<PathBuf> {
        match self {
            Layout::V2 { parent } => vec![parent.clone()],
            Layout::V1 {
                cpu,
                cpuacct,
                memory,
            } => {
                let mut dirs = vec![cpu.clone(), cpuacct.clone(), memory.clone()];
                dirs.dedup();
                dirs
            }
        }
    }
}

/// An instance's cgroups.
pub(crate) struct Cgroups {
    layout: Layout,
    name: String,
    hosts: usize,
}

fn read(path: &Path) -> Result<String, HostsError> {
    std::fs::read_to_string(path).map_err(io_error(format!("reading {}", path.display())))
}

fn write(path: &Path, value: &str) -> Result<(), HostsError> {
    std::fs::write(path, value)
        .map_err(io_error(format!("writing {value:?} to {}", path.display())))
}

/// A v1 hierarchy's mount point and options (its controllers among them).
type V1Mount = (PathBuf, Vec<String>);

/// Mount points of cgroup file systems: the v2 one, the v1 ones.
fn mounts() -> Result<(Option<PathBuf>, Vec<V1Mount>), HostsError> {
    let info = read(Path::new("/proc/self/mountinfo"))?;
    let mut v2 = None;
    let mut v1 = Vec::new();
    for line in info.lines() {
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let Some(point) = before.split(' ').nth(4) else {
            continue;
        };
        let mut fields = after.split(' ');
        match (fields.next(), fields.nth(1)) {
            (Some("cgroup2"), _) => v2 = Some(PathBuf::from(point)),
            (Some("cgroup"), Some(opts)) => v1.push((
                PathBuf::from(point),
                opts.split(',').map(str::to_string).collect(),
            )),
            _ => {}
        }
    }
    Ok((v2, v1))
}

/// This process's cgroup in the hierarchy whose controllers (from /proc/self/cgroup) satisfy
/// `which`.
fn own(which: impl Fn(&str) -> bool) -> Result<Option<String>, HostsError> {
    Ok(read(Path::new("/proc/self/cgroup"))?.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        which(controllers).then(|| path.trim_start_matches('/').to_string())
    }))
}

fn layout() -> Result<Layout, HostsError> {
    let (v2, v1) = mounts()?;
    if let Some(root) = v2 {
        let on = read(&root.join("cgroup.controllers")).unwrap_or_default();
        let on: Vec<&str> = on.split_whitespace().collect();
        if on.contains(&"cpu") && on.contains(&"memory") {
            let own = own(str::is_empty)?.unwrap_or_default();
            // A cgroup holding processes cannot give controllers to children (but the root).
            let here = root.join(&own);
            let parent = if write(&here.join("cgroup.subtree_control"), "+cpu +memory").is_ok() {
                here
            } else {
                write(&root.join("cgroup.subtree_control"), "+cpu +memory")?;
                root
            };
            return Ok(Layout::V2 { parent });
        }
    }
    let hierarchy = |controller: &str| -> Result<PathBuf, HostsError> {
        let (point, _) = v1
            .iter()
            .find(|(_, opts)| opts.iter().any(|o| o == controller))
            .ok_or_else(|| {
                HostsError::Cgroup(format!(
                    "no {controller} controller (neither cgroup v2 with cpu and memory nor v1)"
                ))
            })?;
        let own = own(|c| c.split(',').any(|c| c == controller))?.unwrap_or_default();
        Ok(point.join(own))
    };
    Ok(Layout::V1 {
        cpu: hierarchy("cpu")?,
        cpuacct: hierarchy("cpuacct")?,
        memory: hierarchy("memory")?,
    })
}

impl Cgroups {
    pub(crate) fn create(name: &str, hosts: usize, limits: &Limits) -> Result<Self, HostsError> {
        let cgroups = Self {
            layout: layout()?,
            name: name.to_string(),
            hosts,
        };
        if let Err(e) = cgroups.make(limits) {
            // What was made goes (`remove` passes over what was not).
            let _ = cgroups.remove();
            return Err(e);
        }
        Ok(cgroups)
    }

    fn make(&self, limits: &Limits) -> Result<(), HostsError> {
        let mkdir = |dir: &PathBuf| {
            std::fs::create_dir(dir).map_err(io_error(format!("making {}", dir.display())))
        };
        for dir in self.instance_dirs() {
            mkdir(&dir)?;
            if let Layout::V2 { .. } = self.layout {
                write(&dir.join("cgroup.subtree_control"), "+cpu +memory")?;
            }
        }
        for i in 0..self.hosts {
            self.host_dirs(i).iter().try_for_each(mkdir)?;
            self.limit(i, limits)?;
        }
        Ok(())
    }

    fn instance_dirs(&self) -> Vec<PathBuf> {
        self.layout
            .parents()
            .into_iter()
            .map(|p| p.join(&self.name))
            .collect()
    }

    fn host_dirs(&self, i: usize) -> Vec<PathBuf> {
        self.instance_dirs()
            .into_iter()
            .map(|d| d.join(format!("h{i}")))
            .collect()
    }

    /// Host `i`'s directory in the hierarchy `parent` (one of the layout's).
    fn host_dir(&self, parent: &Path, i: usize) -> PathBuf {
        parent.join(&self.name).join(format!("h{i}"))
    }

    fn limit(&self, i: usize, limits: &Limits) -> Result<(), HostsError> {
        let quota = limits
            .cpus
            .map(|c| ((c * PERIOD_US as f64) as u64).max(1000));
        match &self.layout {
            Layout::V2 { parent } => {
                let dir = self.host_dir(parent, i);
                if let Some(q) = quota {
                    write(&dir.join("cpu.max"), &format!("{q} {PERIOD_US}"))?;
                }
                if let Some(m) = limits.memory {
                    write(&dir.join("memory.max"), &m.to_string())?;
                }
            }
            Layout::V1 { .. } => {
                if let Some(q) = quota {
                    let cpu = self.cpu_dir(i);
                    write(&cpu.join("cpu.cfs_period_us"), &PERIOD_US.to_string())?;
                    write(&cpu.join("cpu.cfs_quota_us"), &q.to_string())?;
                }
                if let Some(m) = limits.memory {
                    write(
                        &self.memory_dir(i).join("memory.limit_in_bytes"),
                        &m.to_string(),
                    )?;
                }
            }
        }
        Ok(())
    }

    fn cpu_dir(&self, i: usize) -> PathBuf {
        match &self.layout {
            Layout::V2 { parent } | Layout::V1 { cpu: parent, .. } => self.host_dir(parent, i),
        }
    }

    fn memory_dir(&self, i: usize) -> PathBuf {
        match &self.layout {
            Layout::V2 { parent } | Layout::V1 { memory: parent, .. } => self.host_dir(parent, i),
        }
    }

    /// The `cgroup.procs` files a process of host `i` joins.
    pub(crate) fn procs(&self, i: usize) -> Vec<String> {
        self.host_dirs(i)
            .into_iter()
            .map(|d| d.join("cgroup.procs").to_string_lossy().into_owned())
            .collect()
    }

    pub(crate) fn usage(&self, i: usize) -> Result<Usage, HostsError> {
        let number = |path: PathBuf| -> Result<u64, HostsError> {
            let text = read(&path)?;
            text.trim()
                .parse()
                .map_err(|e| HostsError::Cgroup(format!("{}: {text:?}: {e}", path.display())))
        };
        match &self.layout {
            Layout::V2 { .. } => {
                let dir = self.cpu_dir(i);
                let stat = read(&dir.join("cpu.stat"))?;
                let usec = stat
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or_else(|| HostsError::Cgroup(format!("no usage_usec in {stat:?}")))?;
                Ok(Usage {
                    cpu: Duration::from_micros(usec),
                    memory: number(dir.join("memory.current"))?,
                    memory_peak: number(dir.join("memory.peak"))?,
                })
            }
            Layout::V1 { cpuacct, .. } => {
                let acct = self.host_dir(cpuacct, i);
                let memory = self.memory_dir(i);
                Ok(Usage {
                    cpu: Duration::from_nanos(number(acct.join("cpuacct.usage"))?),
                    memory: number(memory.join("memory.usage_in_bytes"))?,
                    memory_peak: number(memory.join("memory.max_usage_in_bytes"))?,
                })
            }
        }
    }

    /// Kills what is left in the hosts' cgroups and removes them.
    pub(crate) fn remove(&self) -> Result<(), HostsError> {
        let mut dirs: Vec<PathBuf> = (0..self.hosts).flat_map(|i| self.host_dirs(i)).collect();
        dirs.extend(self.instance_dirs());
        remove_dirs(&dirs)
    }
}

/// Removes cgroup directories, children first, killing their processes.
fn remove_dirs(dirs: &[PathBuf]) -> Result<(), HostsError> {
    for dir in dirs {
        if !dir.exists() {
            continue;
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            for pid in read(&dir.join("cgroup.procs"))?.split_whitespace() {
                if let Ok(pid) = pid.parse::<i32>() {
                    // SAFETY: kill(2) has no memory preconditions.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
            match std::fs::remove_dir(dir) {
                Ok(()) => break,
                // Killed processes leave their cgroup a little after the signal.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(io_error(format!("removing {}", dir.display()))(e)),
            }
        }
    }
    Ok(())
}

/// Removes the cgroups of instances `orphaned` says are dead; their names.
pub(crate) fn sweep(orphaned: impl Fn(&str) -> bool) -> Result<Vec<String>, HostsError> {
    let Ok(layout) = layout() else {
        return Ok(Vec::new());
    };
    let mut swept = Vec::new();
    for parent in layout.parents() {
        let Ok(entries) = std::fs::read_dir(&parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !orphaned(&name) {
                continue;
            }
            let instance = entry.path();
            let mut dirs: Vec<PathBuf> = std::fs::read_dir(&instance)
                .map_err(io_error(format!("listing {}", instance.display())))?
                .flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.path())
                .collect();
            dirs.push(instance);
            remove_dirs(&dirs)?;
            swept.push(name);
        }
    }
    Ok(swept)
}
