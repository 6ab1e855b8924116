//! Files are placed with their names (one request to create, one to look up); directories
//! hash. Real storage servers and a scripted manager.

use tessera_client::{Client, ClientOptions, Error, ErrorCode, OpenOptions};
use tessera_placement::{meta_partition, PLACED_INO};
use tessera_proto::ClusterConfig;

mod support;

const SECRET: &str = "placement";
const CONFIG: ClusterConfig = ClusterConfig::new(64, 1 << 20, 1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_live_with_their_names_and_survive_renames_and_links() {
    let (manager, maddr, _servers) = support::start(CONFIG, SECRET, 3).await;
    let table = manager.publish_assigned(1);
    support::create_root(&table, SECRET).await;
    let c = Client::connect(ClientOptions::new(maddr, SECRET))
        .await
        .unwrap();
    let p = CONFIG.partitions;

    let mut dirs = Vec::new();
    for d in 0..8 {
        let dir = c.create_dir(&format!("/d{d}")).await.unwrap();
        assert_eq!(dir.ino & PLACED_INO, 0, "directories hash");
        dirs.push(dir);
    }
    let spread: std::collections::HashSet<_> =
        dirs.iter().map(|d| meta_partition(d.ino, p)).collect();
    assert!(spread.len() > 1, "eight directories in one partition");

    for (d, dir) in dirs.iter().enumerate() {
        let path = format!("/d{d}/f");
        c.write(&path, path.as_bytes()).await.unwrap();
        let f = c.stat(&path).await.unwrap();
        assert_ne!(f.ino & PLACED_INO, 0);
        assert_eq!(meta_partition(f.ino, p), meta_partition(dir.ino, p));
        assert_eq!(f.size, path.len() as u64);
        c.symlink_path("f", &format!("/d{d}/s")).await.unwrap();
        assert_eq!(c.read(&format!("/d{d}/s")).await.unwrap(), path.as_bytes());
        // Create of a taken name: refused when exclusive (the file untouched), else opens it.
        let opts = OpenOptions::read();
        match c.create(dir.ino, b"f", 0o644, true, &opts).await {
            Err(e) => assert!(e.is(&ErrorCode::Exists), "{e}"),
            Ok(_) => panic!("exclusive create of {path} succeeded"),
        }
        let again = c.create(dir.ino, b"f", 0o644, false, &opts).await.unwrap();
        assert_eq!(again.ino(), f.ino);
        again.close().await.unwrap();
        assert_eq!(c.stat(&path).await.unwrap(), f);
    }

    // Moved and linked into other directories, files keep their partition and are found
    // from the new names (entry there, inode back home).
    c.rename_path("/d0/f", "/d1/moved").await.unwrap();
    c.hard_link("/d2/f", "/d3/link").await.unwrap();
    assert_eq!(c.read("/d1/moved").await.unwrap(), b"/d0/f");
    assert_eq!(c.read("/d3/link").await.unwrap(), b"/d2/f");
    assert_eq!(c.stat("/d3/link").await.unwrap().nlink, 2);
    assert!(matches!(
        c.stat("/d0/f").await,
        Err(Error::Fs(ErrorCode::NotFound))
    ));
    c.remove_file("/d2/f").await.unwrap();
    assert_eq!(c.read("/d3/link").await.unwrap(), b"/d2/f");
    assert_eq!(c.stat("/d3/link").await.unwrap().nlink, 1);
}
