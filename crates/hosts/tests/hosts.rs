//! Emulated hosts against the real kernel (root): links shaped, limits enforced, nothing
//! left behind. Skipped, saying why, where hosts cannot be made (not root, no namespaces).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tessera_hosts::{Hosts, HostsError, Limits, Link, Spec};

fn start(spec: &Spec) -> Option<Hosts> {
    match Hosts::start(spec) {
        Ok(h) => Some(h),
        Err(HostsError::Unsupported(why)) => {
            eprintln!("skipped: {why}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn spec(hosts: usize, link: Link, limits: Limits) -> Spec {
    Spec {
        hosts,
        limits,
        link,
    }
}

#[test]
fn links_have_their_latency_and_bandwidth() {
    let latency = Duration::from_millis(5);
    let link = Link {
        bandwidth: Some(40_000_000),
        latency,
        loss: 0.0,
    };
    let Some(hosts) = start(&spec(3, link, Limits::default())) else {
        return;
    };
    eprintln!("latency applied by {:?}", hosts.shaping());
    let server = hosts.addr(2);
    let listener = hosts
        .run_in(2, || TcpListener::bind((server, 0)))
        .unwrap()
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    // Echoes single bytes; after a zero byte, reads to the end and answers with one byte.
    let echo = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut b = [0u8; 1];
        loop {
            s.read_exact(&mut b).unwrap();
            if b[0] == 0 {
                break;
            }
            s.write_all(&b).unwrap();
        }
        let mut rest = Vec::new();
        s.read_to_end(&mut rest).unwrap();
        rest.len()
    });
    let mut c = hosts
        .run_in(0, || TcpStream::connect((server, port)))
        .unwrap()
        .unwrap();
    c.set_nodelay(true).unwrap();
    let mut fastest = Duration::MAX;
    for _ in 0..10 {
        let t = Instant::now();
        c.write_all(&[1]).unwrap();
        c.read_exact(&mut [0u8; 1]).unwrap();
        fastest = fastest.min(t.elapsed());
    }
    eprintln!("fastest round trip {fastest:?}");
    assert!(fastest >= 2 * latency, "a round trip took {fastest:?}");
    // 4 MB at 40 Mbit/s: 0.8 s, less what the token buckets hold at the start.
    let t = Instant::now();
    c.write_all(&[0]).unwrap();
    c.write_all(&vec![7u8; 4_000_000]).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    assert_eq!(echo.join().unwrap(), 4_000_000);
    let took = t.elapsed();
    eprintln!("4 MB in {took:?}");
    assert!(took >= Duration::from_millis(600), "4 MB took {took:?}");
    hosts.stop().unwrap();
}

#[test]
fn links_lose_their_share_of_packets() {
    let link = Link {
        bandwidth: None,
        latency: Duration::from_millis(1),
        loss: 0.3,
    };
    let Some(hosts) = start(&spec(2, link, Limits::default())) else {
        return;
    };
    let rx = hosts
        .run_in(1, || UdpSocket::bind((hosts.addr(1), 0)))
        .unwrap()
        .unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let tx = hosts
        .run_in(0, || UdpSocket::bind((hosts.addr(0), 0)))
        .unwrap()
        .unwrap();
    let to = rx.local_addr().unwrap();
    let mut got = 0;
    for i in 0..1000u32 {
        tx.send_to(&i.to_le_bytes(), to).unwrap();
        // Slowly enough that no socket buffer overflows.
        if i % 50 == 49 {
            while rx.recv(&mut [0u8; 8]).is_ok() {
                got += 1;
                rx.set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
            }
        }
    }
    eprintln!("{got} of 1000 datagrams arrived");
    // 700 expected; these bounds are many standard deviations away.
    assert!((500..900).contains(&got), "{got} of 1000 datagrams arrived");
}

/// Cgroup directories under /sys/fs/cgroup whose name starts with `name`.
fn cgroup_dirs(name: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![(std::path::PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(name) {
                found.push(path);
            } else if depth < 4 {
                stack.push((path, depth + 1));
            }
        }
    }
    found
}

#[test]
fn processes_run_in_their_host_and_go_with_it() {
    let Some(hosts) = start(&spec(2, Link::default(), Limits::default())) else {
        return;
    };
    let name = hosts.name().to_string();
    let mut sleeper = hosts
        .command(1, "sleep")
        .arg("600")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let ns = |pid: String| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    assert_ne!(ns(sleeper.id().to_string()), ns("self".into()));
    let cgroups = std::fs::read_to_string(format!("/proc/{}/cgroup", sleeper.id())).unwrap();
    assert!(cgroups.contains(&format!("{name}/h1")), "{cgroups}");
    assert!(!cgroup_dirs(&name).is_empty());
    drop(hosts);
    assert_eq!(sleeper.wait().unwrap().signal(), Some(libc::SIGKILL));
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&list.stdout).contains(&name));
    assert_eq!(cgroup_dirs(&name), Vec::<std::path::PathBuf>::new());
}

#[test]
fn hosts_are_held_to_their_cpu_and_memory() {
    let limits = Limits {
        cpus: Some(0.25),
        memory: Some(64 << 20),
    };
    let Some(hosts) = start(&spec(1, Link::default(), limits)) else {
        return;
    };
    let mut spin = hosts
        .command(0, "sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    spin.kill().unwrap();
    spin.wait().unwrap();
    let cpu = hosts.usage(0).unwrap().cpu;
    assert!(
        cpu > Duration::ZERO && cpu < Duration::from_millis(1200),
        "a quarter CPU for 2 s used {cpu:?}"
    );
    let hog = hosts
        .command(0, "python3")
        .args(["-c", "b = b'x' * (256 << 20)"])
        .status()
        .unwrap();
    assert_eq!(hog.signal(), Some(libc::SIGKILL), "{hog}");
    let peak = hosts.usage(0).unwrap().memory_peak;
    assert!(peak <= 64 << 20, "peak {peak}");
}

#[test]
fn leftovers_of_dead_processes_are_swept() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root");
        return;
    }
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let name = format!("tsr{dead:06x}00");
    for ns in [format!("{name}h0"), format!("{name}s")] {
        let ok = std::process::Command::new("ip")
            .args(["netns", "add", &ns])
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let swept = tessera_hosts::sweep().unwrap();
    assert!(swept.contains(&name), "{swept:?}");
    let list = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&list.stdout).contains(&name));
}
