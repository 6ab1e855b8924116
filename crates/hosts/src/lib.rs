//! Emulated hosts on one machine, for tests and for comparing cluster configurations.
//!
//! Each host is a network namespace with one interface, `eth0`, at `10.99.0.(i+1)/24`, cabled
//! by a veth pair to a bridge that lives in a namespace of its own: nothing of it is in the
//! machine's own network, and a host has no route but its subnet, so no packet leaves the
//! namespaces made here. Every link is shaped: its bandwidth by `tbf` on both ends (a host's
//! NIC, each way); its latency and loss once per packet, with `netem` where the host sends or,
//! on a kernel without `netem`, with this crate's delay line where it receives (an NFQUEUE of
//! the packets coming in, held for the latency). Each host has a cgroup (v2, or v1 where the
//! controllers are there) that bounds its CPU and memory and tells what it used.
//!
//! Processes run in a host through [`Hosts::command`] (its network and cgroup, the machine's
//! file system: a FUSE mount made in a host is seen by everyone). Dropping [`Hosts`] kills
//! them and removes every namespace, link, qdisc, rule and cgroup it made; what a process
//! killed before its drop left behind is removed by the next [`Hosts::start`] on the machine
//! ([`sweep`]).

mod cgroup;
mod delay;

use std::ffi::{CString, OsStr};
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Names of everything an instance makes start with this, then its process id and a counter
/// (hex, fixed width), so that parallel instances never collide and leftovers name their
/// owner.
const PREFIX: &str = "tsr";
const NAME_LEN: usize = PREFIX.len() + 8;
/// Most hosts an instance has (addresses .1 to .250 of its subnet).
pub const MAX_HOSTS: usize = 250;

/// A host's link to the switch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Link {
    /// Bits per second a host sends and receives at (each way), if bounded.
    pub bandwidth: Option<u64>,
    /// One-way delay from a host to any other (a round trip takes twice that).
    pub latency: Duration,
    /// Share of the packets a host sends that are lost (0 to 1, below 1).
    pub loss: f64,
}

/// What each host may use.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// CPUs' worth of time (`0.5`: half a CPU), if bounded.
    pub cpus: Option<f64>,
    /// Bytes of memory, if bounded; a host that needs more has processes killed (OOM).
    pub memory: Option<u64>,
}

/// A set of emulated hosts: how many, each one's limits, and their links.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub hosts: usize,
    pub limits: Limits,
    pub link: Link,
}

#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// This machine or user cannot make hosts at all (not root, no network namespaces).
    #[error("emulated hosts are not available here: {0}")]
    Unsupported(String),
    #[error("bad emulated hosts: {0}")]
    Invalid(String),
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("cgroups: {0}")]
    Cgroup(String),
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HostsError {
    let what = what.into();
    move |source| HostsError::Io { what, source }
}

/// How latency and loss are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shaping {
    /// No latency nor loss asked for (bandwidth alone is `tbf`'s).
    None,
    /// The kernel's `netem` qdisc.
    Netem,
    /// This crate's delay line: incoming packets queued to it (NFQUEUE) and released after
    /// the latency, where the kernel has no `netem`.
    DelayLine,
}

/// Resources a host used so far (its cgroup's counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of all its processes.
    pub cpu: Duration,
    /// Memory charged to it now, and at most since it was made, in bytes.
    pub memory: u64,
    pub memory_peak: u64,
}

/// Emulated hosts; everything they are made of is removed when dropped.
pub struct Hosts {
    name: String,
    hosts: usize,
    /// Each host's `/run/netns` file and `cgroup.procs` files, for [`Hosts::command`].
    entries: Vec<(CString, Vec<CString>)>,
    cgroups: Option<cgroup::Cgroups>,
    delay: Option<delay::DelayLine>,
    shaping: Shaping,
}

impl Hosts {
    /// Makes the hosts, their links and cgroups; first removes what dead instances left.
    pub fn start(spec: &Spec) -> Result<Self, HostsError> {
        check(spec)?;
        sweep()?;
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed) & 0xff;
        let mut hosts = Self {
            name: format!("{PREFIX}{:06x}{n:02x}", std::process::id()),
            hosts: 0,
            entries: Vec::new(),
            cgroups: None,
            delay: None,
            shaping: Shaping::None,
        };
        // Whatever fails from here on, dropping `hosts` removes what was made.
        hosts.build(spec)?;
        Ok(hosts)
    }

    fn build(&mut self, spec: &Spec) -> Result<(), HostsError> {
        let switch = self.switch();
        ip(&["netns", "add", &switch]).map_err(|e| match e {
            HostsError::Command { stderr, .. } => {
                HostsError::Unsupported(format!("cannot make a network namespace: {stderr}"))
            }
            e => e,
        })?;
        for i in 0..spec.hosts {
            ip(&["netns", "add", &self.netns(i)])?;
            self.hosts = i + 1;
        }
        let mut cables =
            String::from("link set lo up\nlink add br0 type bridge\nlink set br0 up\n");
        for i in 0..spec.hosts {
            let host = self.netns(i);
            cables.push_str(&format!(
                "link add v{i} type veth peer name eth0 netns {host}\nlink set v{i} master br0 up\n"
            ));
        }
        batch("ip", &switch, &cables)?;
        for i in 0..spec.hosts {
            let host = format!(
                "link set lo up\naddr add {}/24 dev eth0\nlink set eth0 up\n",
                self.addr(i)
            );
            batch("ip", &self.netns(i), &host)?;
        }
        self.shape(&spec.link)?;
        let cgroups = cgroup::Cgroups::create(&self.name, spec.hosts, &spec.limits)?;
        self.entries = (0..spec.hosts)
            .map(|i| {
                let netns = c_path(format!("/run/netns/{}", self.netns(i)))?;
                let procs = cgroups
                    .procs(i)
                    .into_iter()
                    .map(c_path)
                    .collect::<Result<_, _>>()?;
                Ok((netns, procs))
            })
            .collect::<Result<_, HostsError>>()?;
        self.cgroups = Some(cgroups);
        Ok(())
    }

    /// Bandwidth on both ends of every link; latency and loss where hosts send.
    fn shape(&mut self, link: &Link) -> Result<(), HostsError> {
        let tbf = link.bandwidth.map(|bits| {
            let bytes = bits / 8;
            // A bucket of a millisecond's worth (at least a few of the largest packets veth
            // passes) and a queue of ten more.
            let burst = (bytes / 1000).max(256 << 10);
            format!(
                "tbf rate {bits}bit burst {burst} limit {}",
                burst + bytes / 100
            )
        });
        let delayed = !link.latency.is_zero() || link.loss > 0.0;
        if delayed {
            let netem = format!(
                "qdisc add dev eth0 root handle 1: netem delay {}us loss {}% limit 100000",
                link.latency.as_micros(),
                link.loss * 100.0
            );
            self.shaping = match batch("tc", &self.netns(0), &netem) {
                Ok(()) => Shaping::Netem,
                Err(HostsError::Command { stderr, .. }) if stderr.contains("unknown") => {
                    Shaping::DelayLine
                }
                Err(e) => return Err(e),
            };
        }
        for i in 0..self.hosts {
            let mut host = String::new();
            if self.shaping == Shaping::Netem {
                if i > 0 {
                    host.push_str(&format!(
                        "qdisc add dev eth0 root handle 1: netem delay {}us loss {}% limit 100000\n",
                        link.latency.as_micros(),
                        link.loss * 100.0
                    ));
                }
                if let Some(tbf) = &tbf {
                    host.push_str(&format!("qdisc add dev eth0 parent 1:1 handle 10: {tbf}\n"));
                }
            } else if let Some(tbf) = &tbf {
                host.push_str(&format!("qdisc add dev eth0 root {tbf}\n"));
            }
            if !host.is_empty() {
                batch("tc", &self.netns(i), &host)?;
            }
            if let Some(tbf) = &tbf {
                batch(
                    "tc",
                    &self.switch(),
                    &format!("qdisc add dev v{i} root {tbf}\n"),
                )?;
            }
        }
        if self.shaping == Shaping::DelayLine {
            let netns = (0..self.hosts)
                .map(|i| PathBuf::from(format!("/run/netns/{}", self.netns(i))))
                .collect();
            self.delay = Some(delay::DelayLine::start(netns, link.latency, link.loss)?);
            // Bound first: `--queue-bypass` lets packets through while nothing listens.
            for i in 0..self.hosts {
                run(
                    "ip",
                    &[
                        "netns",
                        "exec",
                        &self.netns(i),
                        "iptables",
                        "-w",
                        "-A",
                        "INPUT",
                        "-i",
                        "eth0",
                        "-j",
                        "NFQUEUE",
                        "--queue-num",
                        "0",
                        "--queue-bypass",
                    ],
                    None,
                )?;
            }
        }
        Ok(())
    }

    /// How many hosts there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.hosts
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.hosts == 0
    }

    /// This instance's name, the start of the names of everything it made.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How latency and loss are applied on this machine.
    #[must_use]
    pub fn shaping(&self) -> Shaping {
        self.shaping
    }

    /// Host `i`'s address.
    #[must_use]
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        // `check` bounds the hosts to MAX_HOSTS.
        Ipv4Addr::new(10, 99, 0, (i + 1) as u8)
    }

    /// Host `i`'s network namespace (`ip netns exec NAME ...` runs a command in its network).
    #[must_use]
    pub fn netns(&self, i: usize) -> String {
        format!("{}h{i}", self.name)
    }

    fn switch(&self) -> String {
        format!("{}s", self.name)
    }

    /// A command that runs `program` in host `i`: in its network namespace and its cgroup
    /// (so also its children), with the machine's file system. Panics if there is no host `i`.
    #[must_use]
    pub fn command(&self, i: usize, program: impl AsRef<OsStr>) -> Command {
        let (netns, procs) = self.entries[i].clone();
        let mut c = Command::new(program);
        // SAFETY: `enter` makes only async-signal-safe system calls, on memory the closure
        // owns.
        unsafe { c.pre_exec(move || enter(&netns, &procs)) };
        c
    }

    /// Runs `f` on a thread of this process that is in host `i`'s network (sockets it makes
    /// are the host's), and returns what it returns.
    pub fn run_in<T: Send>(&self, i: usize, f: impl FnOnce() -> T + Send) -> Result<T, HostsError> {
        let netns = &self.entries[i].0;
        std::thread::scope(|s| {
            s.spawn(|| {
                enter_netns(netns).map_err(io_error(format!("entering {}", self.netns(i))))?;
                Ok(f())
            })
            .join()
            .map_err(|_| HostsError::Invalid("the function run in a host panicked".into()))?
        })
    }

    /// Kills every process of host `i` (SIGKILL, as a crash); returns how many there were. A
    /// FUSE mount served from the host is left dead, for its owner to unmount.
    pub fn kill(&self, i: usize) -> Result<usize, HostsError> {
        kill_netns(&self.netns(i))
    }

    /// Cuts host `i`'s cable (`up` false) or plugs it back.
    pub fn set_link(&self, i: usize, up: bool) -> Result<(), HostsError> {
        let state = if up { "up" } else { "down" };
        batch("ip", &self.switch(), &format!("link set v{i} {state}\n"))
    }

    /// What host `i` used so far.
    pub fn usage(&self, i: usize) -> Result<Usage, HostsError> {
        self.cgroups
            .as_ref()
            .ok_or_else(|| HostsError::Cgroup("not made".into()))?
            .usage(i)
    }

    /// Removes everything, reporting the first thing that could not be removed (dropping does
    /// the same, silently).
    pub fn stop(mut self) -> Result<(), HostsError> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<(), HostsError> {
        // The delay line's sockets hold the namespaces and packets: first.
        self.delay = None;
        let mut first = Ok(());
        let mut keep = |r: Result<(), HostsError>| {
            if first.is_ok() {
                first = r;
            }
        };
        for i in 0..self.hosts {
            keep(kill_netns(&self.netns(i)).map(drop));
        }
        for i in 0..self.hosts {
            keep(ip(&["netns", "delete", &self.netns(i)]));
        }
        self.hosts = 0;
        if std::path::Path::new(&format!("/run/netns/{}", self.switch())).exists() {
            keep(ip(&["netns", "delete", &self.switch()]));
        }
        if let Some(cgroups) = self.cgroups.take() {
            keep(cgroups.remove());
        }
        first
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

fn check(spec: &Spec) -> Result<(), HostsError> {
    let bad = |what: String| Err(HostsError::Invalid(what));
    if spec.hosts == 0 || spec.hosts > MAX_HOSTS {
        return bad(format!("{} hosts (1 to {MAX_HOSTS})", spec.hosts));
    }
    if !(0.0..1.0).contains(&spec.link.loss) {
        return bad(format!("loss {} (0 to 1, below 1)", spec.link.loss));
    }
    if spec.link.bandwidth == Some(0) {
        return bad("a bandwidth of 0".into());
    }
    if let Some(cpus) = spec.limits.cpus {
        if !(cpus >= 0.01 && cpus.is_finite()) {
            return bad(format!("{cpus} CPUs (at least 0.01)"));
        }
    }
    if spec.limits.memory.is_some_and(|m| m < 1 << 20) {
        return bad("less than 1 MiB of memory".into());
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(HostsError::Unsupported(
            "making network namespaces and cgroups needs root".into(),
        ));
    }
    if !std::path::Path::new("/proc/self/ns/net").exists() {
        return Err(HostsError::Unsupported(
            "the kernel has no network namespaces".into(),
        ));
    }
    Ok(())
}

fn c_path(path: impl Into<Vec<u8>>) -> Result<CString, HostsError> {
    CString::new(path).map_err(|e| HostsError::Invalid(format!("a path with a NUL byte: {e}")))
}

/// In a child before exec: into the host's cgroups, then its network.
fn enter(netns: &CString, procs: &[CString]) -> std::io::Result<()> {
    for p in procs {
        // SAFETY: open/write/close on a valid C string and a one-byte buffer.
        unsafe {
            let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // "0": the writing process.
            let written = libc::write(fd, b"0".as_ptr().cast(), 1);
            let err = std::io::Error::last_os_error();
            libc::close(fd);
            if written != 1 {
                return Err(err);
            }
        }
    }
    enter_netns(netns)
}

/// Moves the calling thread into the network namespace at `path`.
fn enter_netns(path: &CString) -> std::io::Result<()> {
    // SAFETY: open/setns/close on a valid C string; setns changes only this thread.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let r = libc::setns(fd, libc::CLONE_NEWNET);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if r != 0 {
            return Err(err);
        }
    }
    Ok(())
}

/// Runs a command; its standard output, or an error with its standard error.
fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, HostsError> {
    use std::io::Write;
    let cmd = format!("{program} {}", args.join(" "));
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                HostsError::Unsupported(format!("`{program}` is not installed"))
            }
            _ => HostsError::Io {
                what: format!("running {cmd}"),
                source: e,
            },
        })?;
    if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
        input
            .write_all(text.as_bytes())
            .map_err(io_error(format!("writing to {cmd}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(io_error(format!("running {cmd}")))?;
    if !out.status.success() {
        return Err(HostsError::Command {
            cmd: match stdin {
                Some(text) => format!("{cmd} <<< {}", text.trim_end().replace('\n', "; ")),
                None => cmd,
            },
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn ip(args: &[&str]) -> Result<(), HostsError> {
    run("ip", args, None).map(drop)
}

/// Runs `program -n NETNS -batch -` (`ip` or `tc`) with `lines`.
fn batch(program: &str, netns: &str, lines: &str) -> Result<(), HostsError> {
    run(program, &["-n", netns, "-batch", "-"], Some(lines)).map(drop)
}

/// Kills the processes in a network namespace until none is left.
fn kill_netns(netns: &str) -> Result<usize, HostsError> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut killed = 0;
    loop {
        let pids: Vec<i32> = run("ip", &["netns", "pids", netns], None)?
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() {
            return Ok(killed);
        }
        if Instant::now() > deadline {
            return Err(HostsError::Invalid(format!(
                "processes {pids:?} of {netns} outlive SIGKILL"
            )));
        }
        for pid in pids {
            // SAFETY: kill(2) has no memory preconditions.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The process that made `name` (one of this crate's), if it is one of its names.
fn owner(name: &str) -> Option<u32> {
    let tail = name.strip_prefix(PREFIX)?;
    let (pid, rest) = (tail.get(..6)?, tail.get(6..8)?);
    u8::from_str_radix(rest, 16).ok()?;
    u32::from_str_radix(pid, 16).ok()
}

/// Whether `name` is of an instance whose process has ended.
fn orphaned(name: &str) -> bool {
    owner(name).is_some_and(|pid| {
        // SAFETY: kill with signal 0 only checks that the process exists.
        pid != std::process::id()
            && unsafe { libc::kill(pid as i32, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    })
}

/// Removes what instances whose process ended left behind (killed before they could clean
/// up): their processes, namespaces and cgroups. Returns the instances swept.
pub fn sweep() -> Result<Vec<String>, HostsError> {
    let mut swept: Vec<String> = Vec::new();
    let list = run("ip", &["netns", "list"], None)?;
    let mut namespaces: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| orphaned(n))
        .collect();
    // Hosts before the switch: a host's name is longer than its switch's.
    namespaces.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for ns in namespaces {
        kill_netns(ns)?;
        ip(&["netns", "delete", ns])?;
        let instance = ns[..NAME_LEN].to_string();
        if !swept.contains(&instance) {
            swept.push(instance);
        }
    }
    for instance in cgroup::sweep(orphaned)? {
        if !swept.contains(&instance) {
            swept.push(instance);
        }
    }
    Ok(swept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tell_their_owner() {
        assert_eq!(owner("tsr00302a05h3"), Some(0x302a));
        assert_eq!(owner("tsr00302a05s"), Some(0x302a));
        assert_eq!(owner("tsr00302a05"), Some(0x302a));
        assert_eq!(owner("tsr00302a0"), None);
        assert_eq!(owner("tsrzz302a05"), None);
        assert_eq!(owner("eth0"), None);
        assert!(!orphaned(&format!("{PREFIX}{:06x}00", std::process::id())));
    }

    #[test]
    fn bad_specs_are_refused() {
        let spec = |hosts, loss, cpus| Spec {
            hosts,
            limits: Limits { cpus, memory: None },
            link: Link {
                loss,
                ..Link::default()
            },
        };
        assert!(check(&spec(0, 0.0, None)).is_err());
        assert!(check(&spec(MAX_HOSTS + 1, 0.0, None)).is_err());
        assert!(check(&spec(2, 1.0, None)).is_err());
        assert!(check(&spec(2, 0.0, Some(0.0))).is_err());
        assert!(check(&spec(2, 0.0, Some(f64::NAN))).is_err());
    }
}
