"""pandas and Dask round trips through tessera:// (CSV and Parquet)."""

from __future__ import annotations

from typing import Any, Dict

import pytest

from tessera import LocalCluster

pd = pytest.importorskip("pandas")
pytest.importorskip("pyarrow")


def frame(n: int = 1000, seed: int = 0) -> Any:
    return pd.DataFrame(
        {
            "id": range(seed, seed + n),
            "x": [i * 0.5 for i in range(n)],
            "name": [f"r{i % 17}" for i in range(n)],
        }
    )


def opts(cluster: LocalCluster) -> Dict[str, Any]:
    return {"manager": cluster.manager, "secret": cluster.secret}


def test_pandas_csv_and_parquet(cluster: LocalCluster, base: str) -> None:
    df = frame()
    so = opts(cluster)
    url = f"tessera:/{base}/df"
    df.to_csv(url + ".csv", index=False, storage_options=so)
    back = pd.read_csv(url + ".csv", storage_options=so)
    pd.testing.assert_frame_equal(df, back)
    df.to_parquet(url + ".parquet", storage_options=so)
    back = pd.read_parquet(url + ".parquet", storage_options=so)
    pd.testing.assert_frame_equal(df, back)
    back = pd.read_parquet(url + ".parquet", columns=["x"], storage_options=so)
    pd.testing.assert_frame_equal(df[["x"]], back)
    df.to_csv(url + ".csv.gz", index=False, storage_options=so)
    pd.testing.assert_frame_equal(df, pd.read_csv(url + ".csv.gz", storage_options=so))


def test_dask_csv_glob_and_parquet(cluster: LocalCluster, base: str) -> None:
    dd = pytest.importorskip("dask.dataframe")
    so = opts(cluster)
    parts = [frame(500, seed=k * 500) for k in range(4)]
    fs = cluster.fs()
    fs.mkdir(f"{base}/csv")
    for k, p in enumerate(parts):
        p.to_csv(f"tessera:/{base}/csv/part-{k}.csv", index=False, storage_options=so)
    ddf = dd.read_csv(f"tessera:/{base}/csv/*.csv", storage_options=so, blocksize=4096)
    assert ddf.npartitions >= 4
    got = ddf.compute().sort_values("id").reset_index(drop=True)
    want = pd.concat(parts).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)
    ddf.to_parquet(f"tessera:/{base}/pq", storage_options=so)
    assert fs.glob(f"{base}/pq/*.parquet")
    back = dd.read_parquet(f"tessera:/{base}/pq", storage_options=so).compute()
    back = back.sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(back, want, check_dtype=False)
    assert ddf["x"].sum().compute() == want["x"].sum()
