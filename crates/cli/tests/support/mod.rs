//! What the command-line tests share: `tessera up` in the background, as a user starts it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

// Not every test binary uses it.
#[allow(dead_code)]
pub mod traced;

pub const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    l.local_addr().expect("its address").port()
}

/// `tessera up` in the background; stopped with SIGINT (Ctrl-C) when dropped.
pub struct Up(pub Child);

impl Drop for Up {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        let _ = self.0.wait();
    }
}

impl Up {
    /// `tessera up ARGS` on a free manager port, its log in `home`/up.log; returns once it has
    /// written its cluster file (and so mounted, with `--mount`).
    pub fn start<S: AsRef<std::ffi::OsStr>>(home: &Path, args: &[S]) -> Self {
        let manager = format!("127.0.0.1:{}", free_port());
        let child = Command::new(TESSERA)
            .arg("up")
            .args(args)
            .args(["--manager", &manager])
            .args(["--http", &format!("127.0.0.1:{}", free_port())])
            .env("TESSERA_HOME", home)
            .env_remove("TESSERA_SECRET")
            .env_remove("TESSERA_MANAGER")
            .env_remove("TESSERA_CONFIG")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(home.join("up.log")).expect("up.log"))
            .spawn()
            .expect("tessera up");
        let mut up = Up(child);
        let cluster_file = home.join("cluster.toml");
        let deadline = Instant::now() + Duration::from_secs(60);
        // A file left from before may be there already: wait for this cluster's.
        while !std::fs::read_to_string(&cluster_file).is_ok_and(|t| t.contains(&manager)) {
            let log = || std::fs::read_to_string(home.join("up.log")).unwrap_or_default();
            if let Some(status) = up.0.try_wait().expect("up's status") {
                panic!("tessera up exited ({status}):\n{}", log());
            }
            assert!(
                Instant::now() < deadline,
                "tessera up did not become ready:\n{}",
                log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        up
    }
}
