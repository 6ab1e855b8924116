//! The connection handshake: protocol version check and mutual proof of the cluster secret.
//!
//! ```text
//! client -> server  Hello     MAGIC, version u16, client nonce [32]
//! server -> client  Challenge MAGIC, version u16, server nonce [32]
//! client -> server  Proof     mac("client", server nonce, client nonce) [32]
//! server -> client  Verdict   1 + mac("server", client nonce, server nonce) [32], or 0 and close
//! ```
//!
//! The mac is BLAKE3 keyed with a key derived from the secret, so the secret never crosses the
//! wire and a recorded handshake cannot be replayed (both nonces are fresh).

use crate::{MAGIC, PROTOCOL_VERSION};
use rand::RngCore;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long a client waits for a server to complete the handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a server waits for a connecting peer to complete its part: a real client sends
/// each step as soon as it can, so this only has to outlast a loaded machine, while a
/// connection that never speaks is closed soon.
pub const ACCEPT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The cluster secret; only its derived key is kept.
#[derive(Clone)]
pub struct Secret {
    key: [u8; 32],
}

impl Secret {
    #[must_use]
    pub fn new(secret: &str) -> Self {
        Self {
            key: blake3::derive_key("tessera cluster secret v1", secret.as_bytes()),
        }
    }

    fn mac(&self, role: &[u8], a: &[u8; 32], b: &[u8; 32]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(role);
        h.update(a);
        h.update(b);
        h.finalize()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("handshake failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("peer is not a Tessera node (bad magic bytes)")]
    BadMagic,
    #[error("protocol version mismatch: we speak {ours}, the peer speaks {theirs}")]
    Version { ours: u16, theirs: u16 },
    #[error("wrong cluster secret: the peer refused us")]
    Refused,
    #[error("wrong cluster secret: the peer could not prove it knows it")]
    BadPeerProof,
    #[error("handshake timed out")]
    Timeout,
}

fn nonce() -> [u8; 32] {
    let mut n = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut n);
    n
}

async fn read_hello<S: AsyncRead + Unpin>(s: &mut S) -> Result<(u16, [u8; 32]), AuthError> {
    let mut buf = [0u8; 38];
    s.read_exact(&mut buf).await?;
    if buf[..4] != MAGIC {
        return Err(AuthError::BadMagic);
    }
    let version = u16::from_le_bytes([buf[4], buf[5]]);
    Ok((version, buf[6..].try_into().expect("32 bytes")))
}

fn hello(nonce: &[u8; 32]) -> [u8; 38] {
    let mut buf = [0u8; 38];
    buf[..4].copy_from_slice(&MAGIC);
    buf[4..6].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    buf[6..].copy_from_slice(nonce);
    buf
}

async fn with_timeout<T>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, AuthError>>,
) -> Result<T, AuthError> {
    tokio::time::timeout(limit, f)
        .await
        .map_err(|_| AuthError::Timeout)?
}

/// Client side of the handshake.
pub async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &Secret,
) -> Result<(), AuthError> {
    with_timeout(HANDSHAKE_TIMEOUT, async {
        let ours = nonce();
        s.write_all(&hello(&ours)).await?;
        let (version, theirs) = read_hello(s).await?;
        if version != PROTOCOL_VERSION {
            return Err(AuthError::Version {
                ours: PROTOCOL_VERSION,
                theirs: version,
            });
        }
        s.write_all(secret.mac(b"client", &theirs, &ours).as_bytes())
            .await?;
        let mut verdict = [0u8; 1];
        s.read_exact(&mut verdict)
            .await
            .map_err(|_| AuthError::Refused)?;
        if verdict[0] != 1 {
            return Err(AuthError::Refused);
        }
        let mut proof = [0u8; 32];
        s.read_exact(&mut proof).await?;
        if blake3::Hash::from(proof) != secret.mac(b"server", &ours, &theirs) {
            return Err(AuthError::BadPeerProof);
        }
        Ok(())
    })
    .await
}

/// Server side of the handshake. On a wrong secret the client is told so before the error
/// returns, and the caller closes the connection.
pub async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: &Secret,
) -> Result<(), AuthError> {
    with_timeout(ACCEPT_HANDSHAKE_TIMEOUT, async {
        let (version, theirs) = read_hello(s).await?;
        let ours = nonce();
        s.write_all(&hello(&ours)).await?;
        if version != PROTOCOL_VERSION {
            return Err(AuthError::Version {
                ours: PROTOCOL_VERSION,
                theirs: version,
            });
        }
        let mut proof = [0u8; 32];
        s.read_exact(&mut proof).await?;
        // blake3::Hash compares in constant time.
        if blake3::Hash::from(proof) != secret.mac(b"client", &ours, &theirs) {
            s.write_all(&[0]).await?;
            return Err(AuthError::BadPeerProof);
        }
        let mut verdict = [0u8; 33];
        verdict[0] = 1;
        verdict[1..].copy_from_slice(secret.mac(b"server", &theirs, &ours).as_bytes());
        s.write_all(&verdict).await?;
        Ok(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pair(client: &str, server: &str) -> (Result<(), AuthError>, Result<(), AuthError>) {
        let (mut a, mut b) = tokio::io::duplex(1024);
        let (c, s) = (Secret::new(client), Secret::new(server));
        tokio::join!(client_handshake(&mut a, &c), server_handshake(&mut b, &s))
    }

    #[tokio::test]
    async fn same_secret_passes() {
        let (c, s) = pair("s3cret", "s3cret").await;
        assert!(c.is_ok() && s.is_ok(), "{c:?} {s:?}");
    }

    #[tokio::test]
    async fn wrong_secret_is_refused_on_both_sides() {
        let (c, s) = pair("guess", "s3cret").await;
        assert!(matches!(c, Err(AuthError::Refused)), "{c:?}");
        assert!(matches!(s, Err(AuthError::BadPeerProof)), "{s:?}");
    }

    #[tokio::test]
    async fn garbage_is_not_a_peer() {
        let (mut a, mut b) = tokio::io::duplex(1024);
        a.write_all(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n0123456789")
            .await
            .unwrap();
        let s = server_handshake(&mut b, &Secret::new("x")).await;
        assert!(matches!(s, Err(AuthError::BadMagic)), "{s:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn silent_peer_times_out() {
        let (_a, mut b) = tokio::io::duplex(1024);
        let s = server_handshake(&mut b, &Secret::new("x")).await;
        assert!(matches!(s, Err(AuthError::Timeout)), "{s:?}");
    }
}
