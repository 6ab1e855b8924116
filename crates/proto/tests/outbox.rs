//! A client connection queues at most `OUTBOX_MAX` bytes for its writer: past that, a sender
//! waits until the peer has taken some (backpressure).

use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tessera_proto::auth::server_handshake;
use tessera_proto::{BufferPool, Request, RpcClient, RpcConfig, Secret, OUTBOX_MAX};
use tokio::net::TcpListener;

/// Polls `f` once: `Pending` if it has to wait.
async fn poll_once<F: Future>(f: Pin<&mut F>) -> Poll<F::Output> {
    let mut f = Some(f);
    std::future::poll_fn(|cx| Poll::Ready(f.take().map(|f| f.poll(cx))))
        .await
        .unwrap_or(Poll::Pending)
}

#[tokio::test]
async fn a_sender_waits_at_the_bound_until_the_peer_reads() {
    let secret = Secret::new("outbox");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_secret = secret.clone();
    // A peer that proves itself, then reads nothing until told.
    let peer = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        server_handshake(&mut stream, &server_secret).await.unwrap();
        stream
    });
    let cfg = RpcConfig::new(secret, Arc::new(BufferPool::new(1 << 20, 4)));
    let client = RpcClient::connect(addr, &cfg).await.unwrap();
    let mut stream = peer.await.unwrap();

    // Stripe-sized frames go to the writer task's queue, which cannot run between these polls
    // (one thread): each is queued at once until the queue is full.
    let payload = Bytes::from(vec![7u8; 1 << 20]);
    let mut queued = 0;
    let mut waiters = Vec::new();
    let blocked = loop {
        let mut send = Box::pin(client.send(&Request::GetTable, payload.clone()));
        match poll_once(send.as_mut()).await {
            Poll::Ready(w) => waiters.push(w.unwrap()),
            Poll::Pending => break send,
        }
        queued += payload.len();
        assert!(queued <= 2 * OUTBOX_MAX, "no send ever waited");
    };
    assert!(
        queued >= OUTBOX_MAX,
        "a send waited with {queued} bytes queued"
    );
    // The peer reads: the writer drains the queue, and the waiting send goes out.
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut stream, &mut tokio::io::sink()).await;
    });
    tokio::time::timeout(Duration::from_secs(60), blocked)
        .await
        .expect("the send went on once the peer read")
        .unwrap();
}
