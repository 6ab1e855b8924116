//! The `tessera` command as a user runs it: `up` in the background, then the file commands.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod support;

use support::{Up, TESSERA};

fn tessera(home: &Path, args: &[&str]) -> Output {
    Command::new(TESSERA)
        .args(args)
        .env("TESSERA_HOME", home)
        .env_remove("TESSERA_SECRET")
        .env_remove("TESSERA_MANAGER")
        .output()
        .unwrap()
}

fn ok(home: &Path, args: &[&str]) -> String {
    let out = tessera(home, args);
    assert!(
        out.status.success(),
        "tessera {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn fails(home: &Path, args: &[&str], says: &str) {
    let out = tessera(home, args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "tessera {args:?} should fail");
    assert!(
        err.contains(says),
        "tessera {args:?}: expected {says:?} in {err}"
    );
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn up_then_stage_data_in_and_out() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let up = Up::start(home, &["--servers", "3", "--memory", "256MiB"]);
    let cluster_file = home.join("cluster.toml");
    let status = ok(home, &["status"]);
    assert!(
        status.contains("3 servers up") && status.matches(" up ").count() == 3,
        "{status}"
    );

    // A local tree with small and multi-stripe files.
    let src = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(src.path().join("d/e")).unwrap();
    std::fs::write(src.path().join("small.txt"), b"hello tessera\n").unwrap();
    let big: Vec<u8> = (0..3_500_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.path().join("d/e/big.bin"), &big).unwrap();
    let src_arg = src.path().to_str().unwrap();
    ok(home, &["mkdir", "-p", "/in/deep"]);
    ok(home, &["cp", "-r", src_arg, "tessera:/in/tree"]);
    let ls = ok(home, &["ls", "-l", "tessera:/in/tree/d/e"]);
    assert!(ls.contains("3500000") && ls.contains("big.bin"), "{ls}");
    assert_eq!(
        ok(home, &["cat", "tessera:/in/tree/small.txt"]),
        "hello tessera\n"
    );
    assert!(ok(home, &["stat", "/in/tree/small.txt"]).contains("size: 14"));
    let dst = tempfile::tempdir().unwrap();
    let back = dst.path().join("back");
    ok(
        home,
        &["cp", "-r", "tessera:/in/tree", back.to_str().unwrap()],
    );
    assert_eq!(std::fs::read(back.join("d/e/big.bin")).unwrap(), big);
    assert_eq!(
        std::fs::read(back.join("small.txt")).unwrap(),
        b"hello tessera\n"
    );

    // Output closed early, as `| head` does: the command ends without a word.
    for args in [
        &["cat", "tessera:/in/tree/d/e/big.bin"][..],
        &["status", "--partitions"],
    ] {
        let mut child = Command::new(TESSERA)
            .args(args)
            .env("TESSERA_HOME", home)
            .env_remove("TESSERA_SECRET")
            .env_remove("TESSERA_MANAGER")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 1];
        child.stdout.take().unwrap().read_exact(&mut first).unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.is_empty(), "tessera {args:?}, output closed: {err}");
    }

    // Errors are clear and change nothing.
    fails(home, &["cat", "tessera:/nope"], "no such file");
    fails(home, &["rm", "/in"], "is a directory");
    fails(home, &["cp", src_arg, "tessera:/x"], "use -r");
    fails(home, &["--secret", "wrong", "status"], "secret");
    fails(
        home,
        &[
            "server",
            "--memory",
            "lots",
            "--manager",
            "127.0.0.1:1",
            "--secret",
            "s",
        ],
        "bad size",
    );
    ok(home, &["rm", "-r", "/in"]);
    assert_eq!(ok(home, &["ls", "/"]), "");

    drop(up);
    assert!(
        !cluster_file.exists(),
        "the cluster file is removed when up stops"
    );
}

#[test]
fn configuration_mistakes_are_reported() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    fails(home, &["status"], "no manager address");
    let cfg = home.join("bad.toml");
    std::fs::write(&cfg, "managr = \"127.0.0.1:7070\"\n").unwrap();
    fails(
        home,
        &["--config", cfg.to_str().unwrap(), "status"],
        "unknown field",
    );
    fails(
        home,
        &["--manager", "not-an-address", "--secret", "s", "status"],
        "bad manager address",
    );
    // The pre-faulted pool counts within --memory; both are checked before anything starts.
    let server = ["server", "--manager", "127.0.0.1:1", "--secret", "s"];
    let too_much = [&server[..], &["--memory", "64MiB", "--prefault", "1GiB"]].concat();
    fails(home, &too_much, "more than the server's --memory");
    let bad = [&server[..], &["--memory", "64MiB", "--prefault", "lots"]].concat();
    fails(home, &bad, "bad size");
    fails(
        home,
        &["up", "--memory", "64MiB", "--prefault", "65MiB"],
        "more than the server's --memory",
    );
    // A second cluster on the first one's address.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    fails(
        home,
        &["up", "--memory", "64MiB", "--manager", &addr],
        "is a cluster (`tessera up`) running",
    );
}

#[test]
fn the_secret_is_never_in_a_file_others_can_read() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    // A cluster file left from before, that others can read (no secret in it, so nothing
    // reading it has a reason to change it): `up` must not write the secret into it as it is.
    let cluster_file = home.join("cluster.toml");
    std::fs::write(&cluster_file, "manager = \"127.0.0.1:1\"\n").unwrap();
    chmod(&cluster_file, 0o644);
    let _up = Up::start(home, &["--servers", "1", "--memory", "64MiB"]);
    assert!(std::fs::read_to_string(&cluster_file)
        .unwrap()
        .contains("secret"));
    assert_eq!(mode(&cluster_file), 0o600);
    let names: Vec<_> = std::fs::read_dir(home)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names.len(),
        2,
        "only the cluster file and the log: {names:?}"
    );

    // Someone opens it to others: the next command makes it private again, and says so.
    chmod(&cluster_file, 0o644);
    let out = tessera(home, &["status"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let said = format!(
        "{} holds the cluster secret and other users can read it (mode 0644): made it 0600",
        cluster_file.display()
    );
    assert!(
        err.lines().any(|l| l.contains("WARN") && l.contains(&said)),
        "{err}"
    );
    assert_eq!(mode(&cluster_file), 0o600);
}

#[test]
fn a_secret_in_a_file_others_can_read_is_reported() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let cfg = home.join("shared.toml");
    std::fs::write(&cfg, "manager = \"127.0.0.1:1\"\nsecret = \"s\"\n").unwrap();
    chmod(&cfg, 0o644);
    let fix = format!("chmod 600 {}", cfg.display());
    for by_env in [false, true] {
        let mut cmd = Command::new(TESSERA);
        if by_env {
            cmd.env("TESSERA_CONFIG", &cfg);
        } else {
            cmd.arg("--config").arg(&cfg);
        }
        let out = cmd
            .arg("status")
            .env("TESSERA_HOME", home)
            .env_remove("TESSERA_SECRET")
            .env_remove("TESSERA_MANAGER")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let warned: Vec<_> = err.lines().filter(|l| l.contains(&fix)).collect();
        assert!(
            warned.len() == 1 && warned[0].contains("WARN") && warned[0].contains("secret"),
            "{err}"
        );
        assert_eq!(mode(&cfg), 0o644, "the user's own file is theirs to change");
    }
    // Private, or without a secret: nothing to say.
    chmod(&cfg, 0o600);
    let out = tessera(home, &["--config", cfg.to_str().unwrap(), "status"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("WARN"));
}

/// Asserts that the trees at `a` and `b` hold the same names (byte for byte), kinds,
/// permission bits, contents and link targets.
fn same_tree(a: &Path, b: &Path) {
    let names = |d: &Path| {
        let mut v: Vec<OsString> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(a), names(b), "{} and {}", a.display(), b.display());
    assert_eq!(mode(a), mode(b), "{} and {}", a.display(), b.display());
    for n in names(a) {
        let (x, y) = (a.join(&n), b.join(&n));
        let (tx, ty) = (
            std::fs::symlink_metadata(&x).unwrap().file_type(),
            std::fs::symlink_metadata(&y).unwrap().file_type(),
        );
        assert_eq!(tx, ty, "{} and {}", x.display(), y.display());
        if tx.is_symlink() {
            assert_eq!(
                std::fs::read_link(&x).unwrap(),
                std::fs::read_link(&y).unwrap()
            );
        } else if tx.is_dir() {
            same_tree(&x, &y);
        } else {
            assert_eq!(mode(&x), mode(&y), "{} and {}", x.display(), y.display());
            assert_eq!(std::fs::read(&x).unwrap(), std::fs::read(&y).unwrap());
        }
    }
}

#[test]
fn cp_keeps_links_permissions_and_names() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let _up = Up::start(home, &["--servers", "2", "--memory", "128MiB"]);
    let work = tempfile::tempdir().unwrap();
    let tree = work.path().join("tree");
    let odd = OsStr::from_bytes(b"caf\xe9"); // Latin-1, not UTF-8
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    std::fs::write(tree.join("file"), b"data\n").unwrap();
    std::fs::write(tree.join("secret"), b"only mine\n").unwrap();
    chmod(&tree.join("secret"), 0o600);
    std::fs::write(tree.join("sub/tool"), b"#!/bin/sh\n").unwrap();
    chmod(&tree.join("sub/tool"), 0o755);
    chmod(&tree.join("sub"), 0o750);
    chmod(&tree, 0o751);
    std::fs::write(tree.join(odd), b"odd name\n").unwrap();
    symlink("file", tree.join("link")).unwrap();
    symlink("secret", tree.join("secret-link")).unwrap();
    symlink("nowhere/at all", tree.join("dangling")).unwrap();
    symlink(".", tree.join("self")).unwrap();
    symlink("sub", tree.join("dirlink")).unwrap();
    symlink("/an/absolute/target", tree.join("absolute")).unwrap();
    symlink(odd, tree.join("odd-link")).unwrap();
    let arg = |p: &Path| p.as_os_str().to_owned();
    let cp = |args: &[OsString]| {
        let out = Command::new(TESSERA)
            .arg("cp")
            .args(args)
            .env("TESSERA_HOME", home)
            .env_remove("TESSERA_SECRET")
            .env_remove("TESSERA_MANAGER")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let cp_ok = |args: &[OsString]| {
        let (ok, err) = cp(args);
        assert!(ok, "cp {args:?}: {err}");
    };

    // In, within the cluster, and out again: the same tree.
    cp_ok(&["-r".into(), arg(&tree), "tessera:/in".into()]);
    let stat = ok(home, &["stat", "/in/link"]);
    assert!(
        stat.contains("Symlink") && stat.contains("target: file"),
        "{stat}"
    );
    cp_ok(&["-r".into(), "tessera:/in".into(), "tessera:/copy".into()]);
    for from in ["tessera:/in", "tessera:/copy"] {
        let back = work.path().join(&from[9..]);
        cp_ok(&["-r".into(), from.into(), arg(&back)]);
        same_tree(&tree, &back);
    }
    // A name that is not UTF-8 given as an argument.
    let mut one = OsString::from("tessera:/in/");
    one.push(odd);
    cp_ok(&[one, arg(&work.path().join("one"))]);
    assert_eq!(
        std::fs::read(work.path().join("one")).unwrap(),
        b"odd name\n"
    );
    // Copying over the earlier copy (into its directory) replaces its links.
    cp_ok(&["-r".into(), "tessera:/in".into(), arg(work.path())]);
    same_tree(&tree, &work.path().join("in"));

    // Onto or into itself: refused, nothing lost.
    for (args, says) in [
        (
            &["tessera:/in/file", "tessera:/in"][..],
            "are the same file",
        ),
        (&["-r", "tessera:/in", "tessera:/"], "into itself"),
        (&["-r", "tessera:/in", "tessera:/in/inner"], "into itself"),
    ] {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let (ok, err) = cp(&args);
        assert!(!ok && err.contains(says), "cp {args:?}: {err}");
    }
    assert_eq!(ok(home, &["cat", "/in/file"]), "data\n");

    // A link named without -r is followed, as cp does.
    cp_ok(&[arg(&tree.join("secret-link")), "tessera:/followed".into()]);
    let ls = ok(home, &["ls", "-l", "/followed"]);
    assert!(ls.starts_with("-rw------- ") && ls.contains(" 10 "), "{ls}");

    // -L copies what links lead to; a loop or a dangling link is an error, said at once.
    let plain = work.path().join("plain");
    std::fs::create_dir_all(plain.join("sub")).unwrap();
    std::fs::write(plain.join("sub/inner"), b"inner\n").unwrap();
    std::fs::write(plain.join("secret"), b"only mine\n").unwrap();
    chmod(&plain.join("secret"), 0o600);
    symlink("secret", plain.join("secret-link")).unwrap();
    symlink("sub", plain.join("dirlink")).unwrap();
    cp_ok(&["-rL".into(), arg(&plain), "tessera:/deref".into()]);
    let back = work.path().join("deref");
    cp_ok(&["-r".into(), "tessera:/deref".into(), arg(&back)]);
    assert_eq!(mode(&back.join("secret-link")), 0o600);
    assert_eq!(
        std::fs::read(back.join("secret-link")).unwrap(),
        b"only mine\n"
    );
    assert_eq!(
        std::fs::read(back.join("dirlink/inner")).unwrap(),
        b"inner\n"
    );
    assert!(std::fs::symlink_metadata(back.join("dirlink"))
        .unwrap()
        .is_dir());
    // ... and the same within the cluster, out of it.
    cp_ok(&["-r".into(), arg(&plain), "tessera:/plain".into()]);
    let back = work.path().join("plain-deref");
    cp_ok(&["-rL".into(), "tessera:/plain".into(), arg(&back)]);
    assert_eq!(
        std::fs::read(back.join("dirlink/inner")).unwrap(),
        b"inner\n"
    );
    assert!(std::fs::symlink_metadata(back.join("secret-link"))
        .unwrap()
        .is_file());

    symlink(".", plain.join("self")).unwrap();
    cp_ok(&["-r".into(), arg(&plain), "tessera:/looped".into()]);
    for from in [arg(&plain), "tessera:/looped".into()] {
        let (ok, err) = cp(&["-rL".into(), from, "tessera:/loop".into()]);
        assert!(!ok && err.contains("self: a symbolic link loop"), "{err}");
    }
    std::fs::remove_file(plain.join("self")).unwrap();
    symlink("nowhere", plain.join("dangling")).unwrap();
    let (ok, err) = cp(&["-rL".into(), arg(&plain), "tessera:/dangling".into()]);
    assert!(
        !ok && err.contains("dangling: a dangling symbolic link"),
        "{err}"
    );
}
