//! `File::write_bytes`: a caller's buffer written without a copy, between ordinary writes,
//! over stripe boundaries; the buffer is the caller's again once the handle is closed. Real
//! storage servers and a scripted manager.

use bytes::Bytes;
use tessera_client::OpenOptions;
use tessera_proto::ClusterConfig;

mod support;

const SECRET: &str = "owned";
const STRIPE: u64 = 1 << 20;
const CONFIG: ClusterConfig = ClusterConfig::new(32, STRIPE as u32, 1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_written_as_it_is_lands_in_order_and_comes_back() {
    let (_manager, _servers, c) = support::ready(CONFIG, SECRET, 3).await;
    let len = 3 * STRIPE as usize + STRIPE as usize / 2;
    let body: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
    let data = Bytes::from(body.clone());
    let keep = data.clone();

    let mut f = c.open("/w", &OpenOptions::create()).await.unwrap();
    // A small write still gathered in the handle goes out first; the buffer starts mid-stripe
    // and ends mid-stripe.
    f.write_at(0, b"head").await.unwrap();
    assert_eq!(f.write_bytes(4, data).await.unwrap(), len);
    f.write_at(4 + len as u64, b"tail").await.unwrap();
    assert_eq!(f.write_bytes(0, Bytes::new()).await.unwrap(), 0);
    f.close().await.unwrap();

    let mut want = b"head".to_vec();
    want.extend_from_slice(&body);
    want.extend_from_slice(b"tail");
    assert!(c.read("/w").await.unwrap() == want, "not the bytes written");
    assert!(
        keep.try_into_mut().is_ok(),
        "the buffer is still held once its writes are stored (kept in the client's pool?)"
    );
}
