//! `tessera collect` as shell pipelines use it: writer processes fed SAM-like lines on their
//! standard input make one output, checked against a reference sort.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::{Up, TESSERA};

fn tessera(home: &Path) -> Command {
    let mut c = Command::new(TESSERA);
    c.env("TESSERA_HOME", home)
        .env_remove("TESSERA_SECRET")
        .env_remove("TESSERA_MANAGER")
        .env_remove("TESSERA_CONFIG");
    c
}

fn ok(home: &Path, args: &[&str]) -> Vec<u8> {
    let out = tessera(home).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "tessera {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Writer `rank`'s lines: a header, then `n` alignments on three references, positions with
/// many ties.
fn sam(rank: usize, n: usize) -> Vec<String> {
    let mut x = (rank as u64 + 1) * 0x2545_F491_4F6C_DD1D;
    let mut lines = vec![format!("@HD\tVN:1.6\tfrom:{rank}")];
    for i in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let chr = ["chr1", "chr2", "chr10"][(x % 3) as usize];
        let pos = (x >> 8) % 400;
        lines.push(format!(
            "r{rank}.{i}\t0\t{chr}\t{pos}\t60\t50M\t*\t0\t0\tACGT\tIIII"
        ));
    }
    lines
}

/// The lines of all writers, stably sorted by field 3 (text) then field 4 (a number; none
/// first), writer after writer; or just writer after writer.
fn reference(all: &[Vec<String>], sorted: bool) -> Vec<u8> {
    let mut flat: Vec<&String> = all.iter().flatten().collect();
    if sorted {
        flat.sort_by_key(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            let chr = f.get(2).copied().unwrap_or("").as_bytes().to_vec();
            (chr, f.get(3).and_then(|p| p.parse::<u64>().ok()))
        });
    }
    flat.iter()
        .flat_map(|l| format!("{l}\n").into_bytes())
        .collect()
}

/// Starts one `tessera collect` writer per element of `all`, feeds it its lines, and returns
/// their outputs.
fn collect(home: &Path, output: &str, all: &[Vec<String>], extra: &[&str]) -> Vec<Output> {
    let n = all.len().to_string();
    let children: Vec<Child> = all
        .iter()
        .enumerate()
        .map(|(rank, lines)| {
            let mut child = tessera(home)
                .args([
                    "collect",
                    output,
                    "--writers",
                    &n,
                    "--rank",
                    &rank.to_string(),
                ])
                .args(extra)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = child.stdin.take().unwrap();
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            std::thread::spawn(move || stdin.write_all(text.as_bytes()));
            child
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn writer_processes_make_the_reference_sort_for_every_strategy() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let _up = Up::start(home, &["--servers", "3", "--memory", "256MiB"]);
    ok(home, &["mkdir", "/out"]);
    let all: Vec<_> = (0..4).map(|r| sam(r, 3000 + 700 * r)).collect();
    let total = all.iter().map(Vec::len).sum::<usize>() as u64;
    for s in ["least-loaded", "least", "most", "least-rr", "most-rr"] {
        let path = format!("/out/{s}.sam");
        let args = [
            "--key",
            "3,4n",
            "--strategy",
            s,
            "--threshold",
            "64KiB",
            "--coordinators-per-node",
            "2",
            "--json",
        ];
        for out in collect(home, &path, &all, &args) {
            let j = json(&out);
            assert_eq!(j["records"], total, "{j}");
            assert_eq!(j["coordinators"].as_array().unwrap().len(), 2, "{j}");
        }
        assert!(
            ok(home, &["cat", &path]) == reference(&all, true),
            "{s}: not the reference sort"
        );
    }
    // Without --key: each writer's lines, writer after writer.
    for out in collect(
        home,
        "/out/plain",
        &all,
        &["--threshold", "100KiB", "--json"],
    ) {
        json(&out);
    }
    assert!(ok(home, &["cat", "/out/plain"]) == reference(&all, false));
    let listing = String::from_utf8(ok(home, &["ls", "/out"])).unwrap();
    assert!(!listing.contains("tessera-collective"), "{listing}");
}

#[test]
fn top_keeps_the_first_lines_and_the_threshold_sets_the_runs() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let _up = Up::start(home, &["--servers", "2", "--memory", "256MiB"]);
    let all: Vec<_> = (0..3).map(|r| sam(r, 2000)).collect();
    let outs = collect(
        home,
        "/top.sam",
        &all,
        &[
            "--key",
            "3,4n",
            "--top",
            "1234",
            "--threshold",
            "32KiB",
            "--json",
        ],
    );
    for out in &outs {
        let j = json(out);
        assert_eq!(j["records"], 1234);
        // 2001 lines of about 50 bytes, and 16 bytes each beside them: a run per 32 KiB.
        let runs = j["runs"].as_u64().unwrap();
        assert!((3..=5).contains(&runs), "{j}");
    }
    let want: Vec<u8> = reference(&all, true)
        .split_inclusive(|&b| b == b'\n')
        .take(1234)
        .flatten()
        .copied()
        .collect();
    assert!(ok(home, &["cat", "/top.sam"]) == want);
}

#[test]
fn a_killed_writer_fails_the_others_and_no_output_appears() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let _up = Up::start(home, &["--servers", "2", "--memory", "256MiB"]);
    let spawn = |rank: &str| {
        tessera(home)
            .args(["collect", "/k.sam", "--writers", "3", "--rank", rank])
            .args(["--key", "3,4n", "--timeout", "2s", "--threshold", "16KiB"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut victim = spawn("1");
    let text: String = sam(1, 1000).iter().map(|l| format!("{l}\n")).collect();
    victim
        .stdin
        .as_mut()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    // Once it has joined and spilled a run, it dies mid-way (its standard input still open).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ls = tessera(home)
            .args(["ls", "/.tessera-collective.k.sam"])
            .output()
            .unwrap();
        let ls = String::from_utf8_lossy(&ls.stdout).into_owned();
        if ls.contains("w1.alive") && ls.contains("w1.r0") {
            break;
        }
        assert!(Instant::now() < deadline, "writer 1 never got going: {ls}");
        std::thread::sleep(Duration::from_millis(50));
    }
    victim.kill().unwrap();
    victim.wait().unwrap();
    let others: Vec<Child> = ["0", "2"]
        .iter()
        .map(|r| {
            let mut c = spawn(r);
            let text: String = sam(0, 500).iter().map(|l| format!("{l}\n")).collect();
            let mut stdin = c.stdin.take().unwrap();
            stdin.write_all(text.as_bytes()).unwrap();
            c
        })
        .collect();
    for c in others {
        let out = c.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a writer succeeded without writer 1");
        assert!(err.contains("writer 1 stopped"), "{err}");
    }
    let stat = tessera(home).args(["stat", "/k.sam"]).output().unwrap();
    assert!(!stat.status.success(), "an output appeared");
    // A reader waiting for the output is told why.
    let wait = tessera(home)
        .args(["collect", "/k.sam", "--wait"])
        .output()
        .unwrap();
    assert!(!wait.status.success());
    assert!(String::from_utf8_lossy(&wait.stderr).contains("writer 1 stopped"));
}
