//! The cluster across emulated hosts (issue 35): four network namespaces behind a switch,
//! links of 10 Gbit/s and 100 µs, each host's CPU and memory bounded; the manager on host 0,
//! servers on the next ones, clients and a mount on the others, all talking over the links.
//! Needs root: skipped, saying why, where hosts cannot be made.

use anyhow::Result;
use serde_json::{json, Value};
use std::time::Duration;
use tessera_hosts::{HostsError, Limits, Link, Spec};
use tessera_testkit::{pattern, verify_files, Cluster, ClusterSpec, Worker};

const MIB: u64 = 1 << 20;

fn spec(servers: usize, replication: u8) -> ClusterSpec {
    ClusterSpec {
        servers,
        replication,
        memory: "256MiB".into(),
        partitions: 64,
        manager_args: vec!["--dead-after".into(), "1s".into()],
        hosts: Some(Spec {
            hosts: 4,
            limits: Limits {
                cpus: Some(1.0),
                memory: Some(1 << 30),
            },
            link: Link {
                bandwidth: Some(10_000_000_000),
                latency: Duration::from_micros(100),
                loss: 0.0,
            },
        }),
        ..ClusterSpec::default()
    }
}

/// The cluster, or `None` (with the reason printed) where emulated hosts cannot be made.
fn start(spec: &ClusterSpec) -> Result<Option<Cluster>> {
    match Cluster::start(spec) {
        Ok(c) => Ok(Some(c)),
        Err(e) => match e.downcast_ref::<HostsError>() {
            Some(HostsError::Unsupported(why)) => {
                eprintln!("skipped: {why}");
                Ok(None)
            }
            _ => Err(e),
        },
    }
}

fn write_files(w: &mut Worker, dir: &str, n: u64, seed: u64) -> Result<Vec<(String, u64, u64)>> {
    w.ok(&json!({"cmd": "mkdir", "path": dir}))?;
    (0..n)
        .map(|k| {
            let (path, len) = (format!("{dir}/f{k}"), MIB + 4099 * k);
            w.ok(
                &json!({"cmd": "write_file", "path": path, "len": len, "seed": seed + k,
                         "chunk": 256 << 10}),
            )?;
            Ok((path, len, seed + k))
        })
        .collect()
}

fn alive(st: &Value) -> Vec<&Value> {
    st["nodes"]
        .as_array()
        .map(|n| n.iter().filter(|n| n["alive"] == true).collect())
        .unwrap_or_default()
}

fn settled(st: &Value) -> bool {
    st["degraded"] == 0 && st["incoming"] == 0 && st["lost"] == 0
}

#[test]
fn data_written_on_one_host_reads_back_on_another() -> Result<()> {
    let Some(cluster) = start(&spec(2, 1))? else {
        return Ok(());
    };
    let hosts = cluster.hosts().expect("on hosts");
    let files = write_files(&mut cluster.worker_on(3)?, "/rt", 6, 10)?;
    let mut reader = cluster.worker_on(0)?;
    verify_files(&mut reader, &files)?;
    // Servers announce the address of their host, which the clients reached them at.
    let st = reader.ok(&json!({"cmd": "status"}))?;
    let mut addrs: Vec<String> = alive(&st)
        .iter()
        .filter_map(|n| n["addr"].as_str().and_then(|a| a.split(':').next()))
        .map(str::to_string)
        .collect();
    addrs.sort();
    let expect: Vec<String> = [1, 2].map(|h| hosts.addr(h).to_string()).to_vec();
    assert_eq!(addrs, expect, "{st}");
    // Every host did work in its own cgroup.
    for h in 0..4 {
        assert!(hosts.usage(h)?.cpu > Duration::ZERO, "host {h}");
    }
    Ok(())
}

#[test]
fn mirrors_keep_the_data_of_a_killed_host() -> Result<()> {
    let Some(cluster) = start(&spec(3, 2))? else {
        return Ok(());
    };
    let hosts = cluster.hosts().expect("on hosts");
    let mut w = cluster.worker_on(0)?;
    let files = write_files(&mut w, "/m", 8, 20)?;
    // Host 2 crashes, its server with it.
    assert_eq!(hosts.kill(2)?, 1);
    verify_files(&mut w, &files)?;
    // Its copies are rebuilt on the two survivors.
    Cluster::wait_status(&mut w, Duration::from_secs(90), |st| {
        alive(st).len() == 2 && settled(st)
    })?;
    verify_files(&mut cluster.worker_on(0)?, &files)?;
    Ok(())
}

#[test]
fn servers_scale_out_to_a_new_host_and_in() -> Result<()> {
    let Some(mut cluster) = start(&spec(2, 1))? else {
        return Ok(());
    };
    let mut w = cluster.worker_on(0)?;
    let files = write_files(&mut w, "/s", 8, 30)?;
    // Out: a server on host 3 joins and takes its share.
    let added = cluster.add_server()?;
    assert_eq!(cluster.server_host(added), 3);
    let st = Cluster::wait_status(&mut w, Duration::from_secs(90), |st| {
        alive(st).len() == 3
            && settled(st)
            && alive(st).iter().all(|n| n["partitions"].as_u64() > Some(0))
    })?;
    verify_files(&mut w, &files)?;
    // In: the server on host 1 is drained and retired.
    let host1 = cluster.hosts().expect("on hosts").addr(1).to_string();
    let first = alive(&st)
        .into_iter()
        .find(|n| n["addr"].as_str().is_some_and(|a| a.starts_with(&host1)))
        .and_then(|n| n["id"].as_u64())
        .expect("a server on host 1");
    cluster.tessera(&["scale", "--remove", &first.to_string()])?;
    Cluster::wait_status(&mut w, Duration::from_secs(90), |st| {
        alive(st).len() == 2 && settled(st)
    })?;
    verify_files(&mut cluster.worker_on(3)?, &files)?;
    Ok(())
}

#[test]
fn a_mount_on_a_client_host() -> Result<()> {
    let Some(cluster) = start(&spec(2, 1))? else {
        return Ok(());
    };
    let dir = std::env::temp_dir().join(format!("tessera-hosts-{}", std::process::id()));
    let mount = cluster.mount_on(3, &dir.join("m"), &[])?;
    // Through the mount (served from host 3) to a client on host 0, and back.
    let data = pattern(40, 0, (3 * MIB + 5) as usize);
    std::fs::write(mount.dir.join("in"), &data)?;
    let mut w = cluster.worker_on(0)?;
    verify_files(&mut w, &[("/in".into(), data.len() as u64, 40)])?;
    let files = write_files(&mut w, "/out", 3, 50)?;
    for (path, len, seed) in &files {
        let read = std::fs::read(mount.dir.join(path.trim_start_matches('/')))?;
        assert!(read == pattern(*seed, 0, *len as usize), "{path} differs");
    }
    drop(mount);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
