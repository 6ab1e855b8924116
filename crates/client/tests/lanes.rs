//! Requests go out on a lane only when the caller asks for it: through a client handle on the
//! lane (`Client::on_lane`), run by the lane's thread in `Lane::block_on`. Real storage servers
//! and a scripted manager.

use tessera_client::{Client, ClientOptions, Lane, OpenOptions};
use tessera_placement::ROOT_INO;
use tessera_proto::ClusterConfig;

mod support;

const SECRET: &str = "lanes";
const CONFIG: ClusterConfig = ClusterConfig::new(16, 1 << 20, 1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_handle_on_the_lane_uses_it_and_only_in_block_on() {
    let (manager, maddr, _servers) = support::start(CONFIG, SECRET, 2).await;
    manager.publish_assigned(1);
    support::create_root(&manager.table(), SECRET).await;
    let client = Client::connect(ClientOptions::new(maddr, SECRET))
        .await
        .unwrap();
    client.write("/f", b"on a lane or not").await.unwrap();
    let lane = Lane::new();

    // A handle on the lane, run elsewhere (a task on the runtime): the shared connections.
    let on_lane = client.on_lane(&lane);
    let attr = tokio::spawn(async move { on_lane.getattr(ROOT_INO).await }).await;
    assert!(attr.is_ok_and(|a| a.is_ok()));
    assert_eq!(lane.connections(), 0, "not run in block_on");

    let rt = tokio::runtime::Handle::current();
    let read = tokio::task::spawn_blocking(move || {
        // A plain handle, and a file opened through one, in block_on: the shared connections.
        let plain = lane.block_on(&rt, client.getattr(ROOT_INO));
        assert!(plain.is_ok(), "{plain:?}");
        let read = lane.block_on(&rt, async {
            let mut f = client.open("/f", &OpenOptions::read()).await?;
            let read = f.read_at(0, 100).await;
            f.close().await?;
            read
        });
        assert_eq!(
            lane.connections(),
            0,
            "a plain handle does not use the lane"
        );
        // The handle on the lane in block_on: the lane.
        let attr = lane.block_on(&rt, client.on_lane(&lane).getattr(ROOT_INO));
        assert!(attr.is_ok(), "{attr:?}");
        assert_eq!(lane.connections(), 1, "the request went out on the lane");
        read
    })
    .await
    .unwrap();
    assert_eq!(&read.unwrap()[..], b"on a lane or not");
}
