//! `tessera evaluate` as users run it: two candidate clusters built as emulated hosts (root
//! and network namespaces; skipped, saying why, without them), a small model replayed on each
//! and a shell workload, on host 0 or on every host at once (the shuffle of
//! scripts/workloads), the report and the JSON checked; bad candidates files refused.

use std::path::Path;
use std::process::{Command, Output};
use tessera_model::synthetic;

const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");

fn evaluate(dir: &Path, args: &[&str]) -> Output {
    Command::new(TESSERA)
        .arg("evaluate")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("tessera runs")
}

const CONFIGS: &str = r#"
runs = 2
baseline = "two-fast"
[prices.node]
purchase = 3000
hourly = 0.25
[[config]]
name = "two-fast"
hosts = 2
host = "node"
memory = "256MiB"
bandwidth = "10Gbit"
latency = "100us"
[[config]]
name = "three-slow"
hosts = 3
host = "node"
memory = "256MiB"
cores = 0.5
bandwidth = "200Mbit"
latency = "1ms"
stripe = "2MiB"
"#;

fn emulated_hosts_available() -> bool {
    // SAFETY: no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let fuse = Path::new("/dev/fuse").exists();
    if !(root && fuse) {
        eprintln!("SKIPPED: evaluating needs root (network namespaces) and /dev/fuse");
    }
    root && fuse
}

#[test]
fn two_configurations_are_built_measured_and_ranked() {
    if !emulated_hosts_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("configs.toml"), CONFIGS).unwrap();
    // 4 processes, each writing and reading back its own 8 MiB file.
    let model = synthetic::file_per_process(4, 32, 256 << 10);
    std::fs::write(dir.path().join("model.json"), model.to_json()).unwrap();
    let out = evaluate(
        dir.path(),
        &[
            "configs.toml",
            "--model",
            "model.json",
            "--json",
            "v.json",
            "-o",
            "v.html",
        ],
    );
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(said.contains("Fastest:"), "{said}");
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("v.json")).unwrap()).unwrap();
    let outcomes = v["outcomes"].as_array().unwrap();
    assert_eq!(outcomes.len(), 2);
    for o in outcomes {
        let runs = o["runs"].as_array().unwrap();
        assert_eq!(runs.len(), 2, "{o}");
        for r in runs {
            // The model's bytes went through the servers, across the links.
            assert!(r["bytes"].as_u64().unwrap() >= 32 << 20, "{r}");
            assert!(r["link_bytes"].as_u64().unwrap() > 0, "{r}");
            assert!(r["cpu_seconds"].as_f64().unwrap() > 0.0, "{r}");
            assert!(r["memory_peak"].as_u64().unwrap() > 0, "{r}");
        }
    }
    // 200 Mbit/s links move the same bytes more slowly than 10 Gbit/s ones.
    let t = |i: usize| outcomes[i]["seconds"]["median"].as_f64().unwrap();
    assert!(
        t(1) > t(0),
        "three slow hosts {} s, two fast {} s",
        t(1),
        t(0)
    );
    assert_eq!(v["fastest"], "two-fast");
    let html = std::fs::read_to_string(dir.path().join("v.html")).unwrap();
    assert!(html.contains("three-slow") && html.contains("<svg"));

    // A shell command as the workload, run in its own directory on the mount.
    let one = CONFIGS.replace("runs = 2", "runs = 1");
    std::fs::write(dir.path().join("one.toml"), one).unwrap();
    let out = evaluate(
        dir.path(),
        &[
            "one.toml",
            "--workload",
            "head -c 4000000 /dev/urandom > a && cp a b && cmp a b && test \"$PWD\" = \"$TESSERA_DIR\"",
            "-o",
            "w.html",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// Every host's lines, `TESSERA_*` as its workload saw them.
fn seen(dir: &Path, hosts: usize) -> Vec<Vec<String>> {
    (0..hosts)
        .map(|i| {
            let f = dir.join(format!("env-{hosts}-{i}"));
            let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{f:?}: {e}"));
            text.lines().map(str::to_string).collect()
        })
        .collect()
}

#[test]
fn every_host_runs_the_shuffle_and_the_last_one_ends_the_run() {
    if !emulated_hosts_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().display().to_string();
    let configs = r#"
runs = 1
[prices.node]
purchase = 3000
hourly = 0.25
[[config]]
name = "two"
hosts = 2
host = "node"
memory = "256MiB"
bandwidth = "1Gbit"
latency = "100us"
[[config]]
name = "three"
hosts = 3
host = "node"
memory = "256MiB"
bandwidth = "1Gbit"
latency = "100us"
"#;
    std::fs::write(dir.path().join("configs.toml"), configs).unwrap();
    let shuffle = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/workloads/shuffle.sh");
    // Each host notes what it was told (outside the mount) and shuffles; the last host then
    // waits for all the others to be done (polling, no fixed sleep) before it ends.
    let workload = format!(
        "set -e; f={out}/env-$TESSERA_HOSTS-$TESSERA_HOST; \
         printf '%s\\n' \"$TESSERA_HOST\" \"$TESSERA_HOSTS\" \"$TESSERA_DIR\" \"$TESSERA_MOUNT\" \
         \"$TESSERA_MANAGER\" \"$TESSERA_SECRET\" \"$PWD\" > $f.tmp; mv $f.tmp $f; \
         SHUFFLE_MB=6 SHUFFLE_TIMEOUT=300 sh {shuffle}; touch {out}/done-$TESSERA_HOSTS-$TESSERA_HOST; \
         if [ $TESSERA_HOST -eq $((TESSERA_HOSTS - 1)) ]; then \
           i=0; while [ $i -lt 3000 ] && [ $(ls {out} | grep -c \"^done-$TESSERA_HOSTS-\") -lt $TESSERA_HOSTS ]; \
           do sleep 0.1; i=$((i + 1)); done; touch {out}/last-$TESSERA_HOSTS; fi",
        shuffle = shuffle.display()
    );
    let o = evaluate(
        dir.path(),
        &[
            "configs.toml",
            "--every-host",
            "--workload",
            &workload,
            "--json",
            "v.json",
            "-o",
            "v.html",
        ],
    );
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let v = json(&dir.path().join("v.json"));
    for (k, hosts) in [(0, 2usize), (1, 3)] {
        let run = &v["outcomes"][k]["runs"][0];
        let each: Vec<f64> = run["host_seconds"]
            .as_array()
            .unwrap_or_else(|| panic!("{run}"))
            .iter()
            .map(|t| t.as_f64().unwrap())
            .collect();
        assert_eq!(each.len(), hosts, "{run}");
        let seconds = run["seconds"].as_f64().unwrap();
        for t in &each {
            assert!(*t > 0.0 && *t <= seconds, "{run}");
        }
        // The last host ended the run: it ended after every other host was done.
        assert!(dir.path().join(format!("last-{hosts}")).exists());
        // Every host's bytes went through the servers: the shuffle wrote and read 6 MiB.
        assert!(run["bytes"].as_u64().unwrap() >= 2 * (6 << 20), "{run}");
        let seen = seen(dir.path(), hosts);
        for (i, lines) in seen.iter().enumerate() {
            let [host, count, run_dir, mount, manager, secret, pwd] = &lines[..] else {
                panic!("host {i}: {lines:?}");
            };
            assert_eq!(host, &i.to_string());
            assert_eq!(count, &hosts.to_string());
            // One run directory, each host through its own mount.
            assert_eq!(run_dir, &format!("{mount}/run-0"));
            assert_eq!(pwd, run_dir);
            assert!(!manager.is_empty() && !secret.is_empty(), "{lines:?}");
            assert_eq!(manager, &seen[0][4]);
            for other in &seen[..i] {
                assert_ne!(mount, &other[3], "two hosts share a mount");
            }
        }
    }

    // One host failing stops the others (they would wait an hour) and is named.
    let failing = "if [ $TESSERA_HOST -eq 1 ]; then exit 3; fi; sleep 3600";
    let o = evaluate(
        dir.path(),
        &["configs.toml", "--every-host", "--workload", failing],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("the workload failed on host 1"), "{err}");
}

#[test]
fn bad_candidates_files_and_flags_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        CONFIGS.replace(
            "host = \"node\"\nmemory = \"256MiB\"\ncores",
            "host = \"gpu\"\nmemory = \"256MiB\"\ncores",
        ),
    )
    .unwrap();
    let out = evaluate(dir.path(), &["bad.toml", "--workload", "true"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("host \"gpu\" is not in [prices]"), "{err}");
    let out = evaluate(dir.path(), &["missing.toml", "--workload", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
    let out = evaluate(dir.path(), &["bad.toml"]);
    assert!(!out.status.success(), "no workload given");
}

#[test]
fn every_host_without_a_workload_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("configs.toml"), CONFIGS).unwrap();
    let out = evaluate(
        dir.path(),
        &["configs.toml", "--every-host", "--model", "model.json"],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--every-host runs a shell command on every host: give it with --workload"),
        "{err}"
    );
    let out = evaluate(dir.path(), &["configs.toml", "--every-host"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--workload"),
        "no workload given"
    );
}

#[test]
fn ctrl_c_takes_the_hosts_and_the_mount_down() {
    if !emulated_hosts_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("configs.toml"), CONFIGS).unwrap();
    let mut child = Command::new(TESSERA)
        .args([
            "evaluate",
            "configs.toml",
            "--workload",
            "touch started; sleep 60",
        ])
        .current_dir(dir.path())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mounts = || {
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .filter(|l| l.contains(&format!("tessera-evaluate-{pid}-")))
            .count()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while mounts() == 0 {
        assert!(std::time::Instant::now() < deadline, "never mounted");
        assert!(child.try_wait().unwrap().is_none(), "evaluate ended early");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // The workload is running on the mount: interrupt, as Ctrl-C does to the command.
    std::thread::sleep(std::time::Duration::from_secs(1));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("interrupted"), "{err}");
    assert_eq!(mounts(), 0, "a mount is left");
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&netns.stdout);
    assert!(
        !left.contains(&format!("tsr{pid:06x}")),
        "namespaces are left: {left}"
    );
}
