//! How writers meet in the working directory at the end: waiting for one another (and finding
//! the dead), putting the output in place, recording a failure, leaving, and a reader waiting
//! for the output.

use crate::coordinate::write_output;
use crate::dir::{run_name, Dir, Listing};
use crate::marker::{Abort, Finished, Marker, Part};
use crate::watch::Watch;
use crate::{Error, Result};
use std::time::{Duration, Instant};
use tessera_client::{Client, ErrorCode};
use tracing::warn;

/// The longest pause between two looks at the working directory (a reader waiting for the
/// output); writers pause at most 10 ms per writer, within [`POLL_MIN_MAX`] and this, so that
/// the listings of many writers stay few per second.
const POLL_MAX: Duration = Duration::from_secs(1);
const POLL_MIN_MAX: Duration = Duration::from_millis(50);
/// Reads of an `error` file found absent before giving up on it.
const ERROR_READS: u32 = 40;

/// The longest pause of a writer of `writers` between two looks at the working directory.
fn poll_max(writers: u32) -> Duration {
    (Duration::from_millis(10) * writers).clamp(POLL_MIN_MAX, POLL_MAX)
}

/// Looks at the working directory, less and less often, until `ready` says so (it also names
/// the writers still to be heard from). `None`: the directory is gone (the output is in
/// place). Fails on an `error`, an abort, or a writer waited for that is dead.
pub(crate) async fn wait_until(
    client: &Client,
    dir: &Dir,
    (rank, writers): (u32, u32),
    watch: &mut Watch,
    ready: impl Fn(&Listing) -> (bool, Vec<u32>),
) -> Result<Option<Listing>> {
    let mut pause = Duration::from_millis(5);
    loop {
        let Some(listing) = dir.list(client).await? else {
            return Ok(None);
        };
        if listing.error {
            return Err(Error::Failed(failure(client, dir).await));
        }
        if let Some(&r) = listing.aborted.iter().next() {
            let name = format!("w{r}.abort");
            let why = match dir.get::<Abort>(client, &name).await {
                Ok(a) => format!("writer {r} left without finishing: {}", a.reason),
                Err(_) => format!("writer {r} left without finishing"),
            };
            return Err(Error::Failed(fail(client, dir, rank, &why).await));
        }
        let (done, missing) = ready(&listing);
        if done {
            return Ok(Some(listing));
        }
        if let Some(why) = watch.check(&listing, missing, Instant::now()) {
            return Err(Error::Failed(fail(client, dir, rank, &why).await));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(poll_max(writers));
    }
}

/// Coordinator 0, once every range is written: the output (at least `size` bytes: a
/// fixed-size output whose last keys nobody gave is extended over them) renamed into place,
/// and `finished` written. Returns the output's size.
pub(crate) async fn install(client: &Client, dir: &Dir, rank: u32, done: Finished) -> Result<u64> {
    // Every range may have been empty.
    let mut f = client.open(dir.child("output"), &write_output()).await?;
    if f.len() < done.size {
        f.set_len(done.size).await?;
    }
    let size = f.len();
    f.close().await?;
    client.rename_path(dir.child("output"), &dir.output).await?;
    let finished = Finished { size, ..done };
    let json = serde_json::to_vec(&finished).map_err(|e| Error::Invalid(e.to_string()))?;
    dir.put(client, rank, "finished", &json).await?;
    Ok(size)
}

/// In arrival order, before the output goes in place: the writers' parts must cover it
/// exactly. A reservation a client sent again (its server failed over as it answered) would
/// leave a stretch of zeros no writer wrote; the output is refused rather than installed
/// with it.
pub(crate) async fn check_parts(client: &Client, dir: &Dir, markers: &[Marker]) -> Result<()> {
    let mut parts: Vec<(Part, u32)> = markers
        .iter()
        .flat_map(|m| m.parts.iter().map(move |p| (*p, m.rank)))
        .filter(|(p, _)| p.bytes > 0)
        .collect();
    parts.sort_by_key(|(p, _)| p.offset);
    let size = match client.stat(dir.child("output")).await {
        Ok(i) => i.size,
        Err(e) if e.is(&ErrorCode::NotFound) && parts.is_empty() => 0,
        Err(e) => return Err(e.into()),
    };
    let mut end = 0u64;
    for (p, rank) in &parts {
        if p.offset != end {
            return Err(Error::Failed(gap(end, p.offset, Some(*rank))));
        }
        end = end.checked_add(p.bytes).ok_or_else(|| {
            Error::Corrupt(format!(
                "writer {rank}'s marker: a part past the largest size"
            ))
        })?;
    }
    if size != end {
        return Err(Error::Failed(gap(end, size, None)));
    }
    Ok(())
}

fn gap(from: u64, to: u64, next: Option<u32>) -> String {
    let what = match (to > from, next) {
        (true, _) => {
            format!("bytes {from} to {to} of the output were reserved but no writer wrote them")
        }
        (false, Some(_)) => format!("the writers' parts overlap at byte {to}"),
        (false, None) => format!("the output ends at byte {to}, before its parts' end {from}"),
    };
    let next = next.map_or(String::new(), |r| format!(" (before a part of writer {r})"));
    format!("{what}{next}: a reservation was made twice (a server failed over as it answered); the output is not installed")
}

/// Writer `rank` of `writers` saw the output in place: it says so, and the last to say so
/// removes the working directory (so that none finds it gone before it has seen `finished`).
pub(crate) async fn leave_finished(client: &Client, dir: &Dir, rank: u32, writers: u32) {
    let seen = dir.put(client, rank, &format!("w{rank}.seen"), b"").await;
    let last = match (seen, dir.list(client).await) {
        (Ok(()), Ok(Some(l))) => (0..writers).all(|r| l.seen.contains(&r)),
        _ => false,
    };
    if last {
        if let Err(e) = dir.remove(client).await {
            warn!(
                "{} is in place, but removing {}: {e}",
                dir.show(),
                dir.show_dir()
            );
        }
    }
}

/// What a leaving writer writes: its `abort` and the output's `error`; then its runs go.
pub(crate) async fn leave(
    client: &Client,
    dir: &Dir,
    rank: u32,
    reason: &str,
    runs: u32,
) -> Result<()> {
    let abort = Abort {
        rank,
        reason: reason.to_string(),
    };
    let json = serde_json::to_vec(&abort).map_err(|e| Error::Invalid(e.to_string()))?;
    // The error first: whoever sees the abort marker finds the reason in place already.
    fail(
        client,
        dir,
        rank,
        &format!("writer {rank} left without finishing: {reason}"),
    )
    .await;
    dir.put(client, rank, &format!("w{rank}.abort"), &json)
        .await?;
    remove_runs(client, dir, rank, runs).await;
    Ok(())
}

pub(crate) async fn remove_runs(client: &Client, dir: &Dir, rank: u32, runs: u32) {
    for k in 0..runs {
        let _ = client.remove_file(dir.child(&run_name(rank, k))).await;
    }
}

/// The reason in the output's `error` file. A listing showed it: a read that finds it absent
/// met another writer's `error` replacing it (each writer records what it saw), and looks
/// again.
pub(crate) async fn failure(client: &Client, dir: &Dir) -> String {
    let mut tries = 0;
    loop {
        match client.read(dir.child("error")).await {
            Ok(b) => return String::from_utf8_lossy(&b).trim_end().to_string(),
            Err(e) if e.is(&ErrorCode::NotFound) && tries < ERROR_READS => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Err(e) => return format!("{} holds an error that cannot be read: {e}", dir.show_dir()),
        }
    }
}

/// Records `why` as the output's `error` (unless one is there: then that is the reason) and
/// removes the partial output; returns the reason.
pub(crate) async fn fail(client: &Client, dir: &Dir, rank: u32, why: &str) -> String {
    if let Ok(Some(l)) = dir.list(client).await {
        if l.error {
            return failure(client, dir).await;
        }
    }
    if let Err(e) = dir.put(client, rank, "error", why.as_bytes()).await {
        warn!("{}: recording the error: {e}", dir.show_dir());
    }
    let _ = client.remove_file(dir.child("output")).await;
    why.to_string()
}

/// Waits until the collective output `path` is in place (its size), or fails with the reason
/// its writers left in its working directory; gives up after `timeout` if one is given.
pub async fn wait_output(
    client: &Client,
    path: impl AsRef<[u8]>,
    timeout: Option<Duration>,
) -> Result<u64> {
    let dir = Dir::of(path.as_ref())?;
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match dir.list(client).await? {
            Some(l) if l.error => return Err(Error::Failed(failure(client, &dir).await)),
            Some(l) if !l.finished => {}
            // Gone, or finished: the output is in place.
            _ => match client.stat(&dir.output).await {
                Ok(i) => return Ok(i.size),
                Err(e) if e.is(&ErrorCode::NotFound) => {}
                Err(e) => return Err(e.into()),
            },
        }
        if timeout.is_some_and(|t| start.elapsed() > t) {
            return Err(Error::Failed(format!(
                "{} did not appear within {:?}",
                dir.show(),
                timeout.unwrap_or_default()
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(POLL_MAX);
    }
}
