//! A client keeps working across a partition-table change: real storage servers, a scripted
//! manager whose table epoch the test advances, and a client that must refresh and retry.

use tessera_client::{Client, ClientOptions, OpenOptions};
use tessera_proto::ClusterConfig;

mod support;

const SECRET: &str = "epochs";
const CONFIG: ClusterConfig = ClusterConfig::new(64, 1 << 20, 1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_follows_a_new_epoch_without_errors() {
    let (manager, maddr, _servers) = support::start(CONFIG, SECRET, 2).await;
    manager.publish_assigned(1);
    let first = manager.table();
    support::create_root(&first, SECRET).await;

    let client = Client::connect(ClientOptions::new(maddr, SECRET))
        .await
        .unwrap();
    assert_eq!(client.epoch(), 1);
    let data: Vec<u8> = (0..5_000_000u32).map(|i| (i % 253) as u8).collect();
    client.write("/before", &data).await.unwrap();

    // A new epoch: the servers learn it from their heartbeats, the client only from a server
    // telling it that its table is stale.
    manager.publish_assigned(2);
    manager.fetched_by(2).await;
    assert_eq!(
        client.read("/before").await.unwrap(),
        data,
        "read across the epoch change"
    );
    assert_eq!(client.epoch(), 2, "the client refreshed its table");
    let mut f = client.open("/after", &OpenOptions::create()).await.unwrap();
    f.write_at(0, &data).await.unwrap();
    manager.publish_assigned(3);
    manager.fetched_by(2).await;
    f.write_at(data.len() as u64, b"tail").await.unwrap();
    f.close().await.unwrap();
    let mut want = data.clone();
    want.extend_from_slice(b"tail");
    assert_eq!(
        client.read("/after").await.unwrap(),
        want,
        "writes in flight across a change are re-sent in order"
    );
    assert_eq!(client.epoch(), 3);
}
