//! Collective outputs through the library against real clusters (testkit): writers as tasks of
//! one process, each with its own client, as threads of an application would be.

use anyhow::{ensure, Result};
use std::time::Duration;
use tessera_client::{Client, ClientOptions, OpenOptions};
use tessera_collective::{
    wait_output, Collective, Error, Fixed, Options, Order, Outcome, Strategy,
};
use tessera_testkit::{Cluster, ClusterSpec};

const MIB: usize = 1 << 20;

async fn client(c: &Cluster) -> Result<Client> {
    Ok(Client::connect(ClientOptions::new(c.manager, &c.secret)).await?)
}

/// Writer `rank`'s records: `n` of `len` bytes, keys from a seeded sequence (few distinct
/// ones when `keys` is small, so ties abound).
fn records(rank: u32, n: usize, len: usize, keys: u64) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut x = u64::from(rank).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % keys).to_be_bytes().to_vec();
            let head = format!("w{rank} #{i} k{} ", x % keys);
            let mut rec = head.into_bytes();
            rec.resize(len - 1, b'.');
            rec.push(b'\n');
            (key, rec)
        })
        .collect()
}

/// The output of `all` writers' records: stably sorted by key (ties by rank, then append
/// order) when sorted, else in rank order; the first `top`.
fn reference(all: &[Vec<(Vec<u8>, Vec<u8>)>], sorted: bool, top: Option<u64>) -> Vec<u8> {
    let mut flat: Vec<&(Vec<u8>, Vec<u8>)> = all.iter().flatten().collect();
    if sorted {
        flat.sort_by(|a, b| a.0.cmp(&b.0));
    }
    let keep = top.map_or(flat.len(), |k| flat.len().min(k as usize));
    flat[..keep].iter().flat_map(|(_, r)| r.clone()).collect()
}

/// Runs `writers` writers of `path` as tasks, each appending its records; their outcomes.
async fn collect(
    clients: &[Client],
    path: &str,
    all: &[Vec<(Vec<u8>, Vec<u8>)>],
    opts: &Options,
) -> Vec<Result<Outcome, Error>> {
    let tasks: Vec<_> = all
        .iter()
        .enumerate()
        .map(|(rank, recs)| {
            let client = clients[rank % clients.len()].clone();
            let (path, recs) = (path.to_string(), recs.clone());
            let opts = Options {
                rank: rank as u32,
                ..opts.clone()
            };
            tokio::spawn(async move {
                let sorted = opts.sorted;
                let mut w = Collective::join(&client, &path, opts).await?;
                for (k, r) in &recs {
                    w.append(r, sorted.then_some(&k[..])).await?;
                }
                w.finalise().await
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("writer task"));
    }
    out
}

fn small_cluster() -> Result<Cluster> {
    Cluster::start(&ClusterSpec {
        servers: 3,
        memory: "512MiB".into(),
        ..ClusterSpec::default()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_strategy_and_unsorted_output_give_the_reference_order() -> Result<()> {
    let cluster = small_cluster()?;
    let c = client(&cluster).await?;
    c.create_dir("/out").await?;
    let clients = [c.clone(), client(&cluster).await?];
    let all: Vec<_> = (0..5)
        .map(|r| records(r, 3000 + 500 * r as usize, 100, 50))
        .collect();
    for (n, strategy) in Strategy::ALL.into_iter().enumerate() {
        let path = format!("/out/s{n}.txt");
        let opts = Options {
            sorted: true,
            strategy,
            // One node: three coordinators, so that ranges meet inside stripes.
            coordinators_per_node: 3,
            threshold: 100_000,
            ..Options::new(5, 0)
        };
        for out in collect(&clients, &path, &all, &opts).await {
            let out = out?;
            ensure!(out.coordinators.len() == 3, "{out:?}");
            ensure!(out.records == all.iter().map(Vec::len).sum::<usize>() as u64);
        }
        let got = c.read(&path).await?;
        ensure!(
            got == reference(&all, true, None),
            "{strategy}: not the reference sort"
        );
        ensure!(
            c.read_dir("/out").await?.len() == n + 1,
            "a working directory is left"
        );
    }
    // Unsorted: the writers' records, writer after writer.
    let opts = Options {
        threshold: 64_000,
        coordinators_per_node: 2,
        ..Options::new(5, 0)
    };
    for out in collect(&clients, "/out/plain", &all, &opts).await {
        out?;
    }
    ensure!(c.read("/out/plain").await? == reference(&all, false, None));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn top_keeps_the_first_records_and_threshold_sets_the_runs() -> Result<()> {
    let cluster = small_cluster()?;
    let c = client(&cluster).await?;
    let all: Vec<_> = (0..4).map(|r| records(r, 1000, 100, 1 << 40)).collect();
    for top in [0, 1, 777, 3999, 4000, 10_000] {
        let opts = Options {
            sorted: true,
            top: Some(top),
            coordinators_per_node: 3,
            threshold: 20_000,
            ..Options::new(4, 0)
        };
        let path = format!("/top{top}");
        for out in collect(std::slice::from_ref(&c), &path, &all, &opts).await {
            ensure!(out?.records == top.min(4000));
        }
        ensure!(
            c.read(&path).await? == reference(&all, true, Some(top)),
            "top {top}"
        );
    }

    // Writers with nothing to write make an empty output.
    let none = vec![Vec::new(); 3];
    let opts = Options {
        sorted: true,
        ..Options::new(3, 0)
    };
    for out in collect(std::slice::from_ref(&c), "/empty", &none, &opts).await {
        ensure!(out?.size == 0);
    }
    ensure!(c.stat("/empty").await?.size == 0);

    // A run goes out each time the buffer reaches the threshold (records, keys, and 16 bytes
    // of bookkeeping each), in the background; wait() and test() see it written.
    let (threshold, cost): (usize, usize) = (10_000, 8 + 100 + 16);
    let per_run = threshold.div_ceil(cost);
    let mut w = Collective::join(
        &c,
        "/runs",
        Options {
            sorted: true,
            threshold,
            ..Options::new(1, 0)
        },
    )
    .await?;
    for (i, (k, r)) in all[0].iter().enumerate() {
        w.append(r, Some(k)).await?;
        if i + 1 == per_run {
            w.wait().await?;
            ensure!(w.test());
            let names = c.read_dir("/.tessera-collective.runs").await?;
            ensure!(
                names.iter().any(|(n, _)| n == b"w0.r0"),
                "no run after the threshold"
            );
        }
    }
    let out = w.finalise().await?;
    ensure!(out.runs as usize == 1000usize.div_ceil(per_run), "{out:?}");
    ensure!(c.read("/runs").await? == reference(&all[..1], true, None));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runs_beyond_the_memory_are_merged_in_passes() -> Result<()> {
    let cluster = small_cluster()?;
    let c = client(&cluster).await?;
    // 6 writers of 20 runs each: 120 runs, more than a 1 MiB coordinator merges at once.
    let all: Vec<_> = (0..6).map(|r| records(r, 4000, 50, 1000)).collect();
    let opts = Options {
        sorted: true,
        threshold: 200 * (50 + 8 + 16),
        memory: MIB,
        coordinators_per_node: 2,
        ..Options::new(6, 0)
    };
    for out in collect(std::slice::from_ref(&c), "/passes", &all, &opts).await {
        let out = out?;
        ensure!(
            out.runs == 20 && out.passes.is_none_or(|p| p > 1),
            "{out:?}"
        );
    }
    ensure!(c.read("/passes").await? == reference(&all, true, None));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writer_that_leaves_fails_the_others_and_no_output_appears() -> Result<()> {
    let cluster = small_cluster()?;
    let c = client(&cluster).await?;
    let all: Vec<_> = (0..3).map(|r| records(r, 2000, 100, 100)).collect();
    let opts = Options {
        sorted: true,
        threshold: 50_000,
        ..Options::new(3, 0)
    };
    for how in ["abort", "drop"] {
        let path = format!("/left-{how}");
        let mut tasks = Vec::new();
        for (rank, recs) in all.iter().enumerate() {
            let (c, path, recs) = (c.clone(), path.clone(), recs.clone());
            let opts = Options {
                rank: rank as u32,
                ..opts.clone()
            };
            let how = how.to_string();
            tasks.push(tokio::spawn(async move {
                let mut w = Collective::join(&c, &path, opts).await?;
                for (i, (k, r)) in recs.iter().enumerate() {
                    w.append(r, Some(k)).await?;
                    if rank == 1 && i == 1000 {
                        if how == "abort" {
                            w.abort("the application gave up").await?;
                        } else {
                            drop(w);
                        }
                        return Ok(None);
                    }
                }
                w.finalise().await.map(Some)
            }));
        }
        for (rank, t) in tasks.into_iter().enumerate() {
            match t.await? {
                Ok(None) if rank == 1 => {}
                Err(Error::Failed(why)) => {
                    ensure!(why.contains("writer 1 left"), "{why}");
                }
                other => anyhow::bail!("writer {rank}: {other:?}"),
            }
        }
        ensure!(c.stat(&path).await.is_err(), "an output appeared");
        // A reader waiting for it is told why.
        match wait_output(&c, &path, Some(Duration::from_secs(60))).await {
            Err(Error::Failed(why)) => ensure!(why.contains("writer 1 left"), "{why}"),
            other => anyhow::bail!("wait_output: {other:?}"),
        }
        // Joining again is refused until the working directory is removed.
        let again = Collective::join(&c, &path, Options::new(3, 0)).await;
        ensure!(matches!(again, Err(Error::Failed(_))));
        c.remove_all(format!("/.tessera-collective.left-{how}"))
            .await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_output_larger_than_a_server_is_merged_from_spilled_runs() -> Result<()> {
    // 150 MiB of records over servers of 96 MiB: runs and output hold twice that meanwhile.
    let cluster = Cluster::start(&ClusterSpec {
        servers: 6,
        memory: "96MiB".into(),
        ..ClusterSpec::default()
    })?;
    let c = client(&cluster).await?;
    let per = 150 * MIB / 100 / 4;
    let all: Vec<_> = (0..4).map(|r| records(r, per, 100, 1 << 32)).collect();
    let opts = Options {
        sorted: true,
        threshold: 8 * MIB,
        memory: 16 * MIB,
        coordinators_per_node: 2,
        ..Options::new(4, 0)
    };
    for out in collect(std::slice::from_ref(&c), "/big", &all, &opts).await {
        let out = out?;
        ensure!(
            out.size == (4 * per * 100) as u64 && out.runs > 1,
            "{out:?}"
        );
    }
    ensure!(c.read("/big").await? == reference(&all, true, None));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mirrors_hold_the_output_after_a_server_is_killed_at_finalisation() -> Result<()> {
    let mut cluster = Cluster::start(&ClusterSpec {
        servers: 4,
        replication: 2,
        memory: "512MiB".into(),
        manager_args: vec!["--dead-after".into(), "1s".into()],
        ..ClusterSpec::default()
    })?;
    let c = client(&cluster).await?;
    let all: Vec<_> = (0..4).map(|r| records(r, 60_000, 100, 1 << 20)).collect();
    let opts = Options {
        sorted: true,
        threshold: 2 * MIB,
        coordinators_per_node: 2,
        ..Options::new(4, 0)
    };
    let writers = {
        let (c, all) = (c.clone(), all.clone());
        tokio::spawn(async move { collect(&[c], "/mirrored", &all, &opts).await })
    };
    // Kill a server once every writer finalises (their markers are in).
    let dir = "/.tessera-collective.mirrored";
    let mut markers = 0;
    while markers < 4 && !writers.is_finished() {
        tokio::time::sleep(Duration::from_millis(20)).await;
        markers = match c.read_dir(dir).await {
            Ok(l) => l.iter().filter(|(n, _)| n.ends_with(b".done")).count(),
            Err(_) => markers,
        };
    }
    cluster.kill_server(1)?;
    for out in writers.await? {
        out?;
    }
    ensure!(c.read("/mirrored").await? == reference(&all, true, None));
    Ok(())
}

/// Four writers' records of different sizes and counts, one writer with none.
fn uneven_writers() -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    [3000, 700, 0, 1500]
        .iter()
        .enumerate()
        .map(|(r, &n)| records(r as u32, n, 90 + 7 * r, 1 << 20))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unsorted_output_is_each_writers_records_at_its_offset() -> Result<()> {
    let cluster = small_cluster()?;
    let c = client(&cluster).await?;
    // Writer 0 spills many runs, writer 1 none (all buffered), writer 2 nothing at all,
    // writer 3 a run and a buffer: every writer's part goes in at its offset, rank after
    // rank.
    let all = uneven_writers();
    let total: usize = all.iter().map(Vec::len).sum();
    for top in [
        None,
        Some(0),
        Some(1),
        Some(2500),
        Some(3700),
        Some(4000),
        Some(9999),
    ] {
        let path = format!("/plain-{top:?}");
        let outs: Vec<_> = (0..4u32)
            .map(|rank| {
                let c = c.clone();
                let recs = all[rank as usize].clone();
                let path = path.clone();
                let threshold = [50_000, 1 << 30, 1000, 200_000][rank as usize];
                tokio::spawn(async move {
                    let opts = Options {
                        threshold,
                        top,
                        rank,
                        ..Options::new(4, 0)
                    };
                    let mut w = Collective::join(&c, &path, opts).await?;
                    for (_, r) in &recs {
                        w.append(r, None).await?;
                    }
                    w.finalise().await
                })
            })
            .collect();
        for (rank, t) in outs.into_iter().enumerate() {
            let out = t.await??;
            ensure!(out.records == top.map_or(total, |k| total.min(k as usize)) as u64);
            ensure!(out.coordinators == [0, 1, 2, 3], "{out:?}");
            ensure!(
                out.coordinator == Some(rank) && out.passes.is_none(),
                "{out:?}"
            );
            if rank == 0 && top.is_none() {
                ensure!(out.runs > 3, "{out:?}");
            }
        }
        ensure!(
            c.read(&path).await? == reference(&all, false, top),
            "top {top:?}: not the writers' records rank after rank"
        );
    }
    Ok(())
}

/// Runs writers of `path` in arrival order (`thresholds` one each) as tasks; before they
/// finalise, `before` runs (all have appended). Their outcomes.
async fn arrive(
    c: &Client,
    path: &str,
    all: &[Vec<(Vec<u8>, Vec<u8>)>],
    thresholds: &[usize],
    before: impl std::future::Future<Output = Result<()>>,
) -> Result<Vec<Result<Outcome, Error>>> {
    let n = all.len() as u32;
    let mut writers = Vec::new();
    for (rank, recs) in all.iter().enumerate() {
        let opts = Options {
            order: Order::Arrival,
            threshold: thresholds[rank],
            ..Options::new(n, rank as u32)
        };
        let mut w = Collective::join(c, path, opts).await?;
        for (_, r) in recs {
            w.append(r, None).await?;
        }
        w.wait().await?;
        writers.push(w);
    }
    before.await?;
    let tasks: Vec<_> = writers
        .into_iter()
        .map(|mut w| tokio::spawn(async move { w.finalise().await }))
        .collect();
    let mut outs = Vec::new();
    for t in tasks {
        outs.push(t.await?);
    }
    Ok(outs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn arrival_order_writes_every_buffer_once_and_keeps_each_writers_order() -> Result<()> {
    let cluster = small_cluster()?;
    let c = client(&cluster).await?;
    // Writer 0 writes many buffers, writer 1 one at finalisation, writer 2 nothing.
    let all = uneven_writers();
    let thresholds = [50_000, 1 << 30, 1000, 20_000];
    let outs = arrive(&c, "/arrived", &all, &thresholds, async { Ok(()) }).await?;
    let total: usize = all.iter().map(Vec::len).sum();
    for (rank, out) in outs.into_iter().enumerate() {
        let out = out?;
        ensure!(
            out.records == total as u64 && out.coordinators.is_empty(),
            "{out:?}"
        );
        ensure!(out.coordinator.is_none() && out.merge.is_none(), "{out:?}");
        ensure!(out.runs >= [6, 1, 0, 6][rank], "{out:?}");
    }
    let got = c.read("/arrived").await?;
    let mut lines: Vec<&[u8]> = got.split_inclusive(|&b| b == b'\n').collect();
    for (rank, recs) in all.iter().enumerate() {
        let tag = format!("w{rank} #");
        let mine: Vec<&[u8]> = lines
            .iter()
            .copied()
            .filter(|l| l.starts_with(tag.as_bytes()))
            .collect();
        let want: Vec<&[u8]> = recs.iter().map(|(_, r)| &r[..]).collect();
        ensure!(
            mine == want,
            "writer {rank}'s records are not all there, in its order"
        );
    }
    lines.sort_unstable();
    let mut want: Vec<&[u8]> = all.iter().flatten().map(|(_, r)| &r[..]).collect();
    want.sort_unstable();
    ensure!(lines == want, "records that no writer gave");
    ensure!(
        c.read_dir("/").await?.len() == 1,
        "a working directory is left"
    );

    // A reservation nobody writes (as a reservation sent twice would leave): refused.
    let intruder = async {
        let mut f = c
            .open(
                "/.tessera-collective.gap/output",
                &OpenOptions {
                    write: true,
                    ..OpenOptions::default()
                },
            )
            .await?;
        f.reserve(1000).await?;
        f.close().await?;
        Ok(())
    };
    let outs = arrive(&c, "/gap", &all, &thresholds, intruder).await?;
    for out in outs {
        let err = out
            .expect_err("an output with a stretch nobody wrote")
            .to_string();
        ensure!(err.contains("reserved but no writer wrote them"), "{err}");
    }
    ensure!(c.stat("/gap").await.is_err(), "the output was installed");

    // Records pushed together are counted one by one and stay together; only in arrival
    // order.
    let opts = Options {
        order: Order::Arrival,
        threshold: 4096,
        ..Options::new(1, 0)
    };
    let mut w = Collective::join(&c, "/together", opts).await?;
    let mut want = Vec::new();
    for i in 0..300u32 {
        let batch: Vec<u8> = (0..i % 7)
            .flat_map(|j| format!("batch {i} record {j}\n").into_bytes())
            .collect();
        if w.push_records(&batch, u64::from(i % 7))? {
            w.flush().await?;
        }
        want.extend_from_slice(&batch);
    }
    let out = w.finalise().await?;
    let records: u64 = (0..300u64).map(|i| i % 7).sum();
    ensure!(
        out.records == records && out.size == want.len() as u64,
        "{out:?}"
    );
    ensure!(
        c.read("/together").await? == want,
        "records pushed together differ"
    );
    let mut w = Collective::join(&c, "/by-rank", Options::new(1, 0)).await?;
    let err = w.push_records(b"a\nb\n", 2).err();
    ensure!(
        matches!(err, Some(Error::Invalid(_))),
        "rank order: {err:?}"
    );
    w.abort("refused").await?;

    for (what, opts) in [
        (
            "top",
            Options {
                top: Some(3),
                ..Options::new(2, 0)
            },
        ),
        (
            "sorted",
            Options {
                sorted: true,
                ..Options::new(2, 0)
            },
        ),
    ] {
        let opts = Options {
            order: Order::Arrival,
            ..opts
        };
        let err = Collective::join(&c, "/refused", opts).await.err();
        ensure!(
            matches!(err, Some(Error::Invalid(_))),
            "arrival order with {what}: {err:?}"
        );
    }
    Ok(())
}

/// Fixed-size record of `key`: its key in text, padded to `size` bytes.
fn fixed_record(key: u64, size: usize) -> Vec<u8> {
    let mut r = format!("key {key} ").into_bytes();
    r.resize(size - 1, b'#');
    r.push(b'\n');
    r
}

fn fixed_opts(rank: u32, writers: u32, size: u64, keys: std::ops::Range<u64>) -> Options {
    Options {
        fixed: Some(Fixed {
            record_size: size,
            keys,
        }),
        threshold: 4000,
        rank,
        ..Options::new(writers, 0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fixed_size_records_are_placed_by_key_and_gaps_read_as_zeros() -> Result<()> {
    let cluster = small_cluster()?;
    let c = client(&cluster).await?;
    // 3 writers, keys 1000..6000 of 24-byte records: writer r gives the keys k with
    // k % 4 == r, in a shuffled order, and writer 0 also a block of consecutive keys of
    // its own; keys with k % 4 == 3 (but that block) are nobody's.
    let (size, keys) = (24usize, 1000u64..6000);
    let given = |r: u64| -> Vec<u64> {
        let mut ks: Vec<u64> = keys.clone().filter(|k| k % 4 == r).collect();
        if r == 0 {
            ks.extend((3000..3400).filter(|k| k % 4 == 3));
        }
        let mut x = r + 7;
        for i in (1..ks.len()).rev() {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            ks.swap(i, (x >> 33) as usize % (i + 1));
        }
        ks
    };
    let tasks: Vec<_> = (0..3u32)
        .map(|rank| {
            let c = c.clone();
            let ks = given(u64::from(rank));
            let keys = keys.clone();
            tokio::spawn(async move {
                let mut w =
                    Collective::join(&c, "/fixed", fixed_opts(rank, 3, size as u64, keys)).await?;
                for k in ks {
                    w.put(k, &fixed_record(k, size)).await?;
                }
                w.finalise().await
            })
        })
        .collect();
    let placed: u64 = (0..3).map(|r| given(r).len() as u64).sum();
    for t in tasks {
        let out = t.await??;
        ensure!(
            out.size == 5000 * size as u64 && out.records == placed,
            "{out:?}"
        );
    }
    let got = c.read("/fixed").await?;
    ensure!(got.len() == 5000 * size, "{} bytes", got.len());
    for k in keys.clone() {
        let slot = &got[(k - keys.start) as usize * size..][..size];
        let owned = k % 4 != 3 || (3000..3400).contains(&k);
        if owned {
            ensure!(slot == fixed_record(k, size), "key {k}: {slot:?}");
        } else {
            ensure!(
                slot.iter().all(|&b| b == 0),
                "key {k}, nobody's, is not zeros"
            );
        }
    }
    ensure!(
        c.read_dir("/").await?.len() == 1,
        "a working directory is left"
    );

    // Bad records and keys are refused, and the writer goes on.
    let mut w = Collective::join(&c, "/fixed-bad", fixed_opts(0, 1, 8, 10..20)).await?;
    for (k, r, why) in [
        (9, &b"12345678"[..], "outside the key range 10:20"),
        (20, b"12345678", "outside the key range"),
        (10, b"1234567", "a record of 7 bytes"),
    ] {
        match w.put(k, r).await {
            Err(Error::Invalid(m)) => ensure!(m.contains(why), "{m}"),
            other => anyhow::bail!("key {k}: {other:?}"),
        }
    }
    ensure!(matches!(w.push(b"x", None), Err(Error::Invalid(_))));
    w.put(19, b"nineteen").await?;
    ensure!(w.finalise().await?.size == 80);
    ensure!(c.read("/fixed-bad").await?[72..] == *b"nineteen");
    // Records of any size take no key.
    let mut w = Collective::join(&c, "/any", Options::new(1, 0)).await?;
    ensure!(matches!(w.put(1, b"x").await, Err(Error::Invalid(_))));
    w.abort("done").await?;

    // Options that make no sense are refused before anything is written.
    let bad = [
        fixed_opts(0, 1, 0, 0..10),
        fixed_opts(0, 1, (4 << 30) + 1, 0..10),
        fixed_opts(0, 1, 8, 10..10),
        fixed_opts(0, 1, 1 << 20, 0..u64::MAX),
        Options {
            sorted: true,
            ..fixed_opts(0, 1, 8, 0..10)
        },
        Options {
            top: Some(3),
            ..fixed_opts(0, 1, 8, 0..10)
        },
    ];
    for opts in bad {
        match Collective::join(&c, "/never", opts.clone()).await {
            Err(Error::Invalid(_)) => {}
            other => anyhow::bail!("{opts:?}: {:?}", other.map(|_| ())),
        }
    }
    ensure!(c.stat("/.tessera-collective.never").await.is_err());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_given_twice_fails_every_writer_naming_it() -> Result<()> {
    let cluster = small_cluster()?;
    let c = client(&cluster).await?;
    // Keys 0..400,000 of 4 bytes: several chunks of keys, checked by several writers. Writer
    // r gives the blocks of 1000 keys b with b % 3 == r; in "across", writer 2 also gives
    // 250,000 (writer 1's); in "within", writer 2 gives 299,999 twice.
    for case in ["across", "within"] {
        let path = format!("/dup-{case}");
        let tasks: Vec<_> = (0..3u64)
            .map(|rank| {
                let (c, path) = (c.clone(), path.clone());
                tokio::spawn(async move {
                    let opts = Options {
                        threshold: 64 << 10,
                        ..fixed_opts(rank as u32, 3, 4, 0..400_000)
                    };
                    let mut w = Collective::join(&c, &path, opts).await?;
                    let mut keys: Vec<u64> = (0..400)
                        .filter(|b| b % 3 == rank)
                        .flat_map(|b| b * 1000..(b + 1) * 1000)
                        .collect();
                    match (case, rank) {
                        ("across", 2) => keys.push(250_000),
                        ("within", 2) => keys.push(299_999),
                        _ => {}
                    }
                    for k in keys {
                        w.put(k, &(k as u32).to_be_bytes()).await?;
                    }
                    w.finalise().await
                })
            })
            .collect();
        let want = if case == "across" {
            "key 250000 given twice (by writers 1 and 2)"
        } else {
            "key 299999 given twice (both times by writer 2)"
        };
        for (rank, t) in tasks.into_iter().enumerate() {
            match t.await? {
                Err(Error::Failed(why)) => ensure!(why.contains(want), "{case} {rank}: {why}"),
                other => anyhow::bail!("{case}, writer {rank}: {:?}", other.map(|o| o.size)),
            }
        }
        ensure!(c.stat(&path).await.is_err(), "{case}: an output appeared");
        match wait_output(&c, &path, Some(Duration::from_secs(60))).await {
            Err(Error::Failed(why)) => ensure!(why.contains(want), "{why}"),
            other => anyhow::bail!("wait_output: {other:?}"),
        }
    }
    Ok(())
}
