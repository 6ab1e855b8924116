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

/// Is `out` every line of `all` once, each writer's lines in their order?
fn arrived(out: &[u8], all: &[Vec<String>]) {
    let got: Vec<&str> = std::str::from_utf8(out).unwrap().lines().collect();
    let mut sorted_got = got.clone();
    sorted_got.sort_unstable();
    let mut want: Vec<&str> = all.iter().flatten().map(String::as_str).collect();
    want.sort_unstable();
    assert!(sorted_got == want, "not every line once");
    for lines in all {
        let set: std::collections::HashSet<&str> = lines.iter().map(String::as_str).collect();
        let mine: Vec<&str> = got.iter().copied().filter(|l| set.contains(l)).collect();
        assert!(mine == *lines, "a writer's lines out of its order");
    }
}

/// Starts writer `rank` of `n` of `tessera collect` into `output` with `args`, fed `input`.
fn writer(
    home: &Path,
    output: &str,
    n: usize,
    rank: usize,
    args: &[&str],
    input: Vec<u8>,
) -> Child {
    let mut child = tessera(home)
        .args(["collect", output, "--writers", &n.to_string()])
        .args(["--rank", &rank.to_string()])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    std::thread::spawn(move || stdin.write_all(&input));
    child
}

/// Starts one `tessera collect` writer per element of `all`, feeds it its lines, and returns
/// their outputs.
fn collect(home: &Path, output: &str, all: &[Vec<String>], extra: &[&str]) -> Vec<Output> {
    let children: Vec<Child> = all
        .iter()
        .enumerate()
        .map(|(rank, lines)| {
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            writer(home, output, all.len(), rank, extra, text.into_bytes())
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
    // In arrival order: every line once, each writer's in its order.
    for out in collect(
        home,
        "/out/arrival",
        &all,
        &["--order", "arrival", "--threshold", "40KiB", "--json"],
    ) {
        let j = json(&out);
        assert_eq!(j["records"], total, "{j}");
        assert_eq!(j["coordinators"].as_array().unwrap().len(), 0, "{j}");
    }
    arrived(&ok(home, &["cat", "/out/arrival"]), &all);
    let listing = String::from_utf8(ok(home, &["ls", "/out"])).unwrap();
    assert!(!listing.contains("tessera-collective"), "{listing}");
}

/// Lines longer and shorter than a read of standard input, one of them over a whole read,
/// the last without its newline: each comes out whole, in arrival order (lines taken
/// together) and sorted (line by line).
#[test]
fn lines_across_reads_of_the_input_come_out_whole() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let _up = Up::start(home, &["--servers", "2", "--memory", "256MiB"]);
    ok(home, &["mkdir", "/out"]);
    let n = 2000;
    let lines: Vec<String> = (0..n)
        .map(|i| {
            let filler = if i == 700 { 1_500_000 } else { i * 7919 % 3000 };
            format!("k{:05}\t{}", n - i, "x".repeat(filler))
        })
        .collect();
    let mut input = lines.join("\n").into_bytes();
    assert!(input.len() > 4 << 20);
    let whole: Vec<u8> = lines
        .iter()
        .flat_map(|l| format!("{l}\n").into_bytes())
        .collect();
    let out = writer(
        home,
        "/out/arr",
        1,
        0,
        &["--order", "arrival", "--json"],
        input.clone(),
    )
    .wait_with_output()
    .unwrap();
    assert_eq!(json(&out)["records"], n, "arrival order");
    assert!(
        ok(home, &["cat", "/out/arr"]) == whole,
        "arrival order: not the lines"
    );
    input.push(b'\n');
    let out = writer(home, "/out/sorted", 1, 0, &["--key", "1", "--json"], input)
        .wait_with_output()
        .unwrap();
    assert_eq!(json(&out)["records"], n, "sorted");
    let reversed: Vec<u8> = lines
        .iter()
        .rev()
        .flat_map(|l| format!("{l}\n").into_bytes())
        .collect();
    assert!(
        ok(home, &["cat", "/out/sorted"]) == reversed,
        "sorted: not the lines by key"
    );
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

/// The output of `child`, or a failure if it is still running after `secs` seconds.
fn finish(child: Child, secs: u64) -> Output {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(out) => out.unwrap(),
        Err(_) => panic!("a writer still runs after {secs} s: it hangs"),
    }
}

/// Writer 1 of 3 (fed `text`, its standard input left open) dies once `ready` is in the
/// working directory; writers 0 and 2 (fed `others`) must fail naming it, in bounded time.
fn a_killed_writer_fails_the_others(
    home: &Path,
    output: &str,
    extra: &[&str],
    text: &[u8],
    others: &[u8],
    ready: &str,
) {
    let spawn = |rank: &str| {
        tessera(home)
            .args(["collect", output, "--writers", "3", "--rank", rank])
            .args(["--timeout", "2s"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut victim = spawn("1");
    victim.stdin.as_mut().unwrap().write_all(text).unwrap();
    // Once it has joined and written something, it dies mid-way (its standard input open).
    let name = output.trim_start_matches('/');
    let dir = format!("/.tessera-collective.{name}");
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let ls = tessera(home).args(["ls", &dir]).output().unwrap();
        let ls = String::from_utf8_lossy(&ls.stdout).into_owned();
        if ls.contains("w1.alive") && ls.contains(ready) {
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
            let mut stdin = c.stdin.take().unwrap();
            stdin.write_all(others).unwrap();
            c
        })
        .collect();
    for c in others {
        let out = finish(c, 120);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a writer succeeded without writer 1");
        assert!(err.contains("writer 1 stopped"), "{err}");
    }
    let stat = tessera(home).args(["stat", output]).output().unwrap();
    assert!(!stat.status.success(), "an output appeared");
    // A reader waiting for the output is told why.
    let wait = tessera(home)
        .args(["collect", output, "--wait"])
        .spawn_output();
    assert!(!wait.status.success());
    assert!(String::from_utf8_lossy(&wait.stderr).contains("writer 1 stopped"));
}

trait SpawnOutput {
    fn spawn_output(&mut self) -> Output;
}

impl SpawnOutput for Command {
    /// `output()`, failing the test if it runs for more than two minutes.
    fn spawn_output(&mut self) -> Output {
        let child = self
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        finish(child, 120)
    }
}

fn lines(all: &[String]) -> Vec<u8> {
    all.iter()
        .flat_map(|l| format!("{l}\n").into_bytes())
        .collect()
}

#[test]
fn a_killed_writer_fails_the_others_and_no_output_appears() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let _up = Up::start(home, &["--servers", "2", "--memory", "256MiB"]);
    let sorted = ["--key", "3,4n", "--threshold", "16KiB"];
    let (victim, others) = (lines(&sam(1, 1000)), lines(&sam(0, 500)));
    a_killed_writer_fails_the_others(home, "/k.sam", &sorted, &victim, &others, "w1.r0");
    // Without keys: the same, though nobody merges.
    let plain = ["--threshold", "16KiB"];
    a_killed_writer_fails_the_others(home, "/k.txt", &plain, &victim, &others, "w1.r0");
    // In arrival order: writer 1 has written some into the output.
    let arrival = ["--order", "arrival", "--threshold", "16KiB"];
    a_killed_writer_fails_the_others(home, "/k.arr", &arrival, &victim, &others, "output");
    // Fixed-size records: writer 1 has written some in place.
    let fixed = [
        "--record-size",
        "32",
        "--key-range",
        "0:3000",
        "--threshold",
        "4KiB",
    ];
    let (victim, others) = (records(1..1000, 32), records(0..0, 32));
    a_killed_writer_fails_the_others(home, "/k.bin", &fixed, &victim, &others, "output");
}

/// Fixed-size records of `size` bytes for `keys`: the key, a word, padding, a newline.
fn records(keys: impl IntoIterator<Item = u64>, size: usize) -> Vec<u8> {
    keys.into_iter().flat_map(|k| record(k, size)).collect()
}

fn record(key: u64, size: usize) -> Vec<u8> {
    let mut r = format!("{key:>7} rec{key} ").into_bytes();
    r.resize(size - 1, b'.');
    r.push(b'\n');
    r
}

/// Starts `tessera collect` writers of fixed-size records, writer r fed `given[r]`'s records
/// in that order, and waits for them.
fn put_fixed(home: &Path, output: &str, given: &[Vec<u64>], args: &[&str]) -> Vec<Output> {
    let args: Vec<&str> = std::iter::once("--json")
        .chain(args.iter().copied())
        .collect();
    let children: Vec<Child> = given
        .iter()
        .enumerate()
        .map(|(r, keys)| {
            let text = records(keys.iter().copied(), 100);
            writer(home, output, given.len(), r, &args, text)
        })
        .collect();
    children.into_iter().map(|c| finish(c, 300)).collect()
}

#[test]
fn interleaved_and_shuffled_fixed_size_records_come_out_in_key_order() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let _up = Up::start(
        home,
        &["--servers", "3", "--memory", "256MiB", "--replication", "2"],
    );
    // 40,000 records of 100 bytes (4 MB, stripes of 1 MiB whose ends cut records), 4 writer
    // processes, buffers of 256 KiB: every flush scatters records over every stripe.
    let (n, writers) = (40_000u64, 4usize);
    let interleaved: Vec<Vec<u64>> = (0..writers as u64)
        .map(|r| (0..n).filter(|k| k % writers as u64 == r).collect())
        .collect();
    // Every key to a writer at random, each writer's in a random order.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |below: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % below
    };
    let mut keys: Vec<u64> = (0..n).collect();
    for i in (1..keys.len()).rev() {
        keys.swap(i, next(i as u64 + 1) as usize);
    }
    let mut shuffled = vec![Vec::new(); writers];
    for k in keys {
        shuffled[next(writers as u64) as usize].push(k);
    }
    let want = records(0..n, 100);
    let range = format!("0:{n}");
    let args = [
        "--record-size",
        "100",
        "--key-range",
        &range,
        "--threshold",
        "256KiB",
    ];
    for (name, given) in [("/inter.bin", &interleaved), ("/shuffled.bin", &shuffled)] {
        for out in put_fixed(home, name, given, &args) {
            let j = json(&out);
            assert_eq!(j["size"], n * 100, "{name}: {j}");
        }
        let got = ok(home, &["cat", name]);
        assert!(got == want, "{name}: not the records in key order");
    }
}

#[test]
fn fixed_size_records_go_in_place_by_key() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let _up = Up::start(home, &["--servers", "3", "--memory", "256MiB"]);
    // Keys 100..5100 of 40-byte records; writer r gives the keys k with k % 5 == r (out of
    // order: descending for writer 1), and nobody those with k % 5 == 3 or 4.
    let (size, lo, hi) = (40usize, 100u64, 5100u64);
    let given = |r: u64| -> Vec<u64> {
        let ks: Vec<u64> = (lo..hi).filter(|k| k % 5 == r).collect();
        if r == 1 {
            ks.into_iter().rev().collect()
        } else {
            ks
        }
    };
    let range = format!("{lo}:{hi}");
    let args = |rank: u64| {
        vec![
            "collect".to_string(),
            "/fixed.txt".into(),
            "--writers".into(),
            "3".into(),
            "--rank".into(),
            rank.to_string(),
            "--record-size".into(),
            size.to_string(),
            "--key-range".into(),
            range.clone(),
            "--threshold".into(),
            "8KiB".into(),
            "--json".into(),
        ]
    };
    let children: Vec<Child> = (0..3)
        .map(|r| {
            let mut c = tessera(home)
                .args(args(r))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let mut stdin = c.stdin.take().unwrap();
            let text = records(given(r), size);
            std::thread::spawn(move || stdin.write_all(&text));
            c
        })
        .collect();
    for c in children {
        let j = json(&finish(c, 300));
        assert_eq!(j["size"], (hi - lo) * size as u64, "{j}");
        assert_eq!(j["records"], 3000, "{j}");
    }
    let got = ok(home, &["cat", "/fixed.txt"]);
    let want: Vec<u8> = (lo..hi)
        .flat_map(|k| {
            if k % 5 < 3 {
                record(k, size)
            } else {
                vec![0; size]
            }
        })
        .collect();
    assert!(
        got == want,
        "not the records in place by key, zeros between"
    );

    // A key two writers give fails both, naming it.
    let dup = [records([7, 9, 11], 16), records([8, 9, 10], 16)];
    let children: Vec<Child> = dup
        .iter()
        .enumerate()
        .map(|(r, text)| {
            let mut c = tessera(home)
                .args([
                    "collect",
                    "/dup.bin",
                    "--writers",
                    "2",
                    "--rank",
                    &r.to_string(),
                ])
                .args(["--record-size", "16", "--key-range", "0:20"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            c.stdin.take().unwrap().write_all(text).unwrap();
            c
        })
        .collect();
    for c in children {
        let out = finish(c, 120);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("key 9 given twice (by writers 0 and 1)"),
            "{err}"
        );
    }
    let stat = tessera(home).args(["stat", "/dup.bin"]).output().unwrap();
    assert!(!stat.status.success(), "an output appeared");

    // Nonsense is refused in plain words, before anything is joined.
    for (flags, why) in [
        (
            vec!["--record-size", "5GiB", "--key-range", "0:10"],
            "at most 4 GiB",
        ),
        (
            vec!["--record-size", "lots", "--key-range", "0:10"],
            "bad size",
        ),
        (
            vec!["--record-size", "0", "--key-range", "0:10"],
            "at least one byte",
        ),
        (
            vec!["--record-size", "8", "--key-range", "10:10"],
            "is empty",
        ),
        (
            vec!["--record-size", "8", "--key-range", "ten"],
            "bad key range",
        ),
        (vec!["--record-size", "8"], "--key-range"),
        (
            vec!["--record-size", "8", "--key-range", "0:10", "--key", "1,2"],
            "one field",
        ),
        (
            vec!["--record-size", "8", "--key-range", "0:10", "--top", "3"],
            "--top",
        ),
    ] {
        let out = tessera(home)
            .args(["collect", "/never", "--writers", "1", "--rank", "0"])
            .args(&flags)
            .stdin(Stdio::null())
            .spawn_output();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flags:?} was taken");
        assert!(err.contains(why), "{flags:?}: {err}");
    }
    // A record cut short at the end of the input fails the writer.
    let mut c = tessera(home)
        .args(["collect", "/short.bin", "--writers", "1", "--rank", "0"])
        .args(["--record-size", "16", "--key-range", "0:10"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut text = records([1, 2], 16);
    text.truncate(20);
    c.stdin.take().unwrap().write_all(&text).unwrap();
    let out = finish(c, 120);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a whole record of 16 bytes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listing = String::from_utf8(ok(home, &["ls", "/"])).unwrap();
    assert!(!listing.contains("never"), "{listing}");
}
