//! Elasticity (issue 5): servers added and removed while clients keep reading and writing,
//! with every read checked against what was written; a migration whose target dies.

use anyhow::Result;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tessera_testkit::{digest, pattern, verify_files, Cluster, ClusterSpec, Worker};

const MIB: u64 = 1 << 20;

fn spec(servers: usize, replication: u8) -> ClusterSpec {
    ClusterSpec {
        servers,
        replication,
        memory: "1GiB".into(),
        partitions: 128,
        manager_args: vec![
            "--dead-after".into(),
            "1s".into(),
            "--provision".into(),
            "local".into(),
            "--node-memory".into(),
            "1GiB".into(),
        ],
        ..ClusterSpec::default()
    }
}

type Files = Mutex<Vec<(String, u64, u64)>>;

/// A client that writes files and reads back random earlier ones until `stop`; every file it
/// was told is written goes to `files`. Any error fails the test.
fn load(cluster: &Cluster, id: u64, stop: &AtomicBool, files: &Files) -> Result<u64> {
    let mut w = cluster.worker()?;
    let mut rng = StdRng::seed_from_u64(id);
    let mut mine: Vec<(String, u64, u64)> = Vec::new();
    let mut ops = 0;
    for k in 0u64.. {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let (path, len, seed) = (
            format!("/load-{id}-{k}"),
            rng.gen_range(1..3 * MIB),
            id * 1000 + k,
        );
        w.ok(
            &json!({"cmd": "write_file", "path": path, "len": len, "seed": seed, "chunk": 300_000}),
        )?;
        mine.push((path, len, seed));
        let (path, len, seed) = &mine[rng.gen_range(0..mine.len())];
        let v = w.ok(&json!({"cmd": "read_file", "path": path}))?;
        anyhow::ensure!(v["len"] == *len, "{path}: {v}");
        anyhow::ensure!(
            v["hash"] == digest(&pattern(*seed, 0, *len as usize)),
            "{path} read back wrong"
        );
        ops += 2;
    }
    files
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .extend(mine);
    Ok(ops)
}

fn verify(w: &mut Worker, files: &Files) -> Result<()> {
    let files = files.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    verify_files(w, &files)
}

fn live(st: &Value) -> Vec<u64> {
    st["nodes"].as_array().map_or(Vec::new(), |n| {
        n.iter()
            .filter(|n| n["alive"] == true)
            .filter_map(|n| n["id"].as_u64())
            .collect()
    })
}

#[test]
fn servers_added_and_removed_under_load_lose_nothing() -> Result<()> {
    let cluster = Cluster::start(&spec(3, 1))?;
    let mut watch = cluster.worker()?;
    let stop = AtomicBool::new(false);
    let files = Files::default();
    std::thread::scope(|s| -> Result<()> {
        let loaders: Vec<_> = (1..=2u64)
            .map(|id| {
                let (cluster, stop, files) = (&cluster, &stop, &files);
                s.spawn(move || load(cluster, id, stop, files))
            })
            .collect();
        let result = (|| -> Result<()> {
            std::thread::sleep(Duration::from_millis(800));
            // `scale` waits until the new servers joined and every copy moved.
            cluster.tessera(&["scale", "--add", "2"])?;
            let st = Cluster::wait_status(&mut watch, Duration::from_secs(5), |_| true)?;
            assert_eq!(live(&st).len(), 5, "{st}");
            assert!(
                st["nodes"]
                    .as_array()
                    .is_some_and(|n| n.iter().all(|n| n["partitions"].as_u64() > Some(0))),
                "{st}"
            );
            let first = live(&st)[0].to_string();
            cluster.tessera(&["scale", "--remove", &first])?;
            let st = Cluster::wait_status(&mut watch, Duration::from_secs(5), |_| true)?;
            assert_eq!(live(&st).len(), 4, "{st}");
            cluster.tessera(&["scale", "--add", "1"])?;
            Ok(())
        })();
        stop.store(true, Ordering::SeqCst);
        for l in loaders {
            let ops = l.join().expect("load thread")?;
            assert!(ops > 0);
        }
        result
    })?;
    let st = Cluster::wait_status(&mut watch, Duration::from_secs(30), |st| {
        live(st).len() == 5 && st["incoming"] == 0
    })?;
    assert_eq!(st["lost"], 0);
    verify(&mut cluster.worker()?, &files)?;
    // Bad requests are refused with a reason, and change nothing.
    assert!(cluster.tessera(&["scale", "--remove", "99"]).is_err());
    assert!(cluster.tessera(&["scale"]).is_err());
    Ok(())
}

/// A server added to the cluster is killed while partitions are being copied to it: without
/// mirrors the copies are abandoned and the old owners keep serving; nothing is lost.
#[test]
fn a_migration_whose_target_dies_is_rolled_back() -> Result<()> {
    for replication in [1, 2] {
        let mut spec = spec(3, replication);
        // The new server copies slowly, so it dies mid-migration.
        spec.server_args = vec![(3, vec!["--sync-rate".into(), "8MiB".into()])];
        let mut cluster = Cluster::start(&spec)?;
        let (mut w, mut watch) = (cluster.worker()?, cluster.worker()?);
        let files = Files::default();
        for k in 0..24u64 {
            let (path, len) = (format!("/m{k}"), 2 * MIB + k);
            w.ok(&json!({"cmd": "write_file", "path": path, "len": len, "seed": k}))?;
            files
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .push((path, len, k));
        }
        let new = cluster.add_server()?;
        let moving = Cluster::wait_status(&mut watch, Duration::from_secs(30), |st| {
            live(st).len() == 4 && st["incoming"].as_u64() > Some(0)
        })?;
        // Some partitions copied (and promoted), most still on their way.
        let epoch = moving["epoch"].as_u64().unwrap_or(0);
        let st = Cluster::wait_status(&mut watch, Duration::from_secs(30), |st| {
            st["epoch"].as_u64() > Some(epoch + 2)
        })?;
        assert!(
            st["incoming"].as_u64() > Some(0),
            "the move ended before the kill: {st}"
        );
        cluster.kill_server(new)?;
        let st = Cluster::wait_status(&mut watch, Duration::from_secs(30), |st| {
            live(st).len() == 3 && st["incoming"] == 0
        })?;
        assert_eq!(
            (st["lost"].clone(), st["degraded"].clone()),
            (json!(0), json!(0)),
            "{st}"
        );
        verify(&mut w, &files)?;
    }
    Ok(())
}

/// The elastic policy: data grows past the high mark, a server is added (and takes its
/// share); the data is deleted, a server is drained and retired; nothing read back is wrong.
#[test]
fn the_policy_follows_memory_use_up_and_down() -> Result<()> {
    let mut spec = spec(2, 1);
    spec.memory = "64MiB".into();
    spec.manager_args = Vec::from(
        [
            "--dead-after",
            "1s",
            "--provision",
            "local",
            "--node-memory",
            "64MiB",
            "--elastic",
            "--scale-high",
            "70%",
            "--scale-low",
            "30%",
            "--scale-step",
            "1",
            "--min-nodes",
            "2",
            "--scale-cooldown",
            "1s",
        ]
        .map(String::from),
    );
    let cluster = Cluster::start(&spec)?;
    let (mut w, mut watch) = (cluster.worker()?, cluster.worker()?);
    let files = Files::default();
    for k in 0..25u64 {
        let (path, len) = (format!("/grow{k}"), 4 * MIB);
        w.ok(&json!({"cmd": "write_file", "path": path, "len": len, "seed": k}))?;
        files
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .push((path, len, k));
    }
    // 100 MiB of 128 MiB: past the high mark.
    let st = Cluster::wait_status(&mut watch, Duration::from_secs(60), |st| {
        live(st).len() == 3 && st["incoming"] == 0
    })?;
    assert!(
        st["nodes"]
            .as_array()
            .is_some_and(|n| n.iter().all(|n| n["partitions"].as_u64() > Some(0))),
        "{st}"
    );
    verify(&mut w, &files)?;
    // Down to 8 MiB of 192 MiB: below the low mark, back to the minimum of two servers.
    let keep: Vec<_> = files
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .drain(..)
        .collect();
    for (i, (path, len, seed)) in keep.into_iter().enumerate() {
        if i < 2 {
            files
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .push((path, len, seed));
        } else {
            w.ok(&json!({"cmd": "unlink", "path": path}))?;
        }
    }
    Cluster::wait_status(&mut watch, Duration::from_secs(60), |st| {
        live(st).len() == 2 && st["incoming"] == 0
    })?;
    verify(&mut w, &files)?;
    Ok(())
}
