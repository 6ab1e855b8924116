//! Sequential reads smaller than a stripe, or not aligned to one, take a stripe piece by
//! piece: each stripe is fetched once. Real storage servers and a scripted
//! manager.

use bytes::Bytes;
use tessera_client::{Client, ClientOptions, OpenOptions};
use tessera_proto::{ClusterConfig, Op, Request, Response, RpcClient};

mod support;

const SECRET: &str = "reads";
const STRIPE: u64 = 1 << 20;
const CONFIG: ClusterConfig = ClusterConfig::new(32, STRIPE as u32, 1);

/// Stripe reads the servers answered so far.
async fn stripe_reads(servers: &[tessera_server::RunningServer]) -> u64 {
    let rpc = support::rpc(SECRET);
    let mut reads = 0;
    for s in servers {
        let c = RpcClient::connect(s.addr(), &rpc).await.unwrap();
        let req = Request::Op {
            epoch: 1,
            op: Op::NodeStats,
        };
        match c.call(&req, Bytes::new()).await.unwrap().0 {
            Response::Stats(st) => reads += st.reads,
            other => panic!("stats: {other:?}"),
        }
    }
    reads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_and_unaligned_sequential_reads_fetch_each_stripe_once() {
    let (manager, maddr, servers) = support::start(CONFIG, SECRET, 3).await;
    let table = manager.publish_assigned(1);
    // Every server answers the statistics below only once it has a table.
    manager.fetched_by(3).await;
    support::create_root(&table, SECRET).await;
    let c = Client::connect(ClientOptions::new(maddr, SECRET))
        .await
        .unwrap();
    let len = 5 * STRIPE + STRIPE / 2;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
    c.write("/f", &data).await.unwrap();

    // Piece sizes as programs use them: small buffers, and 1 MiB reads off by a page.
    for piece in [64 << 10, 300_001, STRIPE as usize - 4096] {
        let before = stripe_reads(&servers).await;
        let mut f = c.open("/f", &OpenOptions::read()).await.unwrap();
        let mut at = 0u64;
        while at < len {
            let got = f.read_at(at, piece).await.unwrap();
            let want = &data[at as usize..(at + piece as u64).min(len) as usize];
            assert_eq!(&got[..], want, "{piece}-byte read at {at}");
            at += got.len() as u64;
        }
        f.close().await.unwrap();
        let fetched = stripe_reads(&servers).await - before;
        // Each stripe once, however many reads take it: the first read asks for the rest of
        // its stripe too, and the others are read ahead.
        assert_eq!(fetched, 6, "stripe pieces fetched by {piece}-byte reads");
    }

    // A stripe kept from a read that started mid-stripe holds only the rest of it: a read
    // going back before that range fetches its bytes (they once read back as a hole). With a
    // read-ahead of one stripe, stripe 4 is fetched only from the read at `at + 100` on.
    let short = Client::connect(ClientOptions {
        readahead: 1,
        ..ClientOptions::new(maddr, SECRET)
    })
    .await
    .unwrap();
    let mut f = short.open("/f", &OpenOptions::read()).await.unwrap();
    let at = 4 * STRIPE + 5000;
    for (offset, n) in [
        (0, 100),
        (at, 100),
        (at + 100, 100),
        (4 * STRIPE + 100, 8000),
    ] {
        let got = f.read_at(offset, n).await.unwrap();
        let want = &data[offset as usize..offset as usize + n];
        assert_eq!(&got[..], want, "{n}-byte read at {offset}");
    }
    f.close().await.unwrap();

    // A write through the handle drops what was read ahead: the next read sees it.
    let opts = OpenOptions {
        write: true,
        ..OpenOptions::read()
    };
    let mut f = c.open("/f", &opts).await.unwrap();
    assert_eq!(&f.read_at(0, 1000).await.unwrap()[..], &data[..1000]);
    f.write_at(2000, b"new bytes").await.unwrap();
    assert_eq!(&f.read_at(1000, 1009).await.unwrap()[1000..], b"new bytes");
    f.close().await.unwrap();
}
