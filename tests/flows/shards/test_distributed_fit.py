"""Recalibration over Parquet shards on a real `dask scheduler` with two `dask worker`
processes: the distributed fits equal the in-memory ones (calibrator within the optimiser's
tolerance, CORD's eta* to the last bit), eta* does not depend on the number of shards, and
bad input is refused naming the file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from servers import dask_cluster

from cord_ops import CORD, data, metrics
from cord_ops.calibrators import make_calibrator
from cord_ops.softmax import softmax
from flows.shards.fit import fit_shards

pytestmark = pytest.mark.slow

N, K = 6000, 12


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """`dask scheduler` + two `dask worker` processes; yields (client, [worker PIDs])."""
    from distributed import Client

    with dask_cluster(tmp_path_factory.mktemp("dask")) as (address, pids), \
            Client(address, timeout=30) as client:
        yield client, pids


@pytest.fixture(scope="module")
def logits():
    rng = np.random.default_rng(11)
    z = rng.normal(size=(N, K)) * 3.0
    shifted = softmax(0.45 * z + rng.normal(size=K) + 0.8 * rng.normal(size=(N, K)))
    y = (shifted.cumsum(axis=1) > rng.random((N, 1))).argmax(axis=1)
    return z, y


def write_shards(folder: Path, z, y, n_shards: int) -> Path:
    folder.mkdir(parents=True)
    for i, rows in enumerate(np.array_split(np.arange(z.shape[0]), n_shards)):
        data.save_parquet(folder / f"part-{i:02d}.parquet", z[rows], y[rows], "logits")
    return folder


@pytest.mark.parametrize("name", ["ts", "vs"])
def test_distributed_fit_equals_in_memory(cluster, logits, tmp_path, name):
    client, pids = cluster
    z, y = logits
    shards = write_shards(tmp_path / "shards", z, y, 7)
    fit = fit_shards(str(shards / "*.parquet"), name, client=client, gather=True)
    ref = make_calibrator(name).fit(z, y)
    q, q_ref = fit.calibrator.predict_proba(z), ref.predict_proba(z)
    assert abs(metrics.nll(q, y) - metrics.nll(q_ref, y)) <= 1e-9 * metrics.nll(q_ref, y)
    if name == "ts":
        assert abs(fit.calibrator.beta_ - ref.beta_) <= 1e-10 * ref.beta_
    else:
        np.testing.assert_allclose(fit.calibrator.weights_, ref.weights_, atol=1e-4)
    # CORD on the distributed calibrator's output: the same eta* as the in-memory fit
    p0 = softmax(z)
    whole = CORD().fit(p0, q)
    assert fit.cord.eta_.hex() == whole.eta_.hex()
    assert (fit.n, fit.n_classes, len(fit.shards)) == (N, K, 7)
    repaired = whole.transform(p0, q)
    got = fit.metrics["repaired"]
    assert got["nll"] == pytest.approx(metrics.nll(repaired, y), rel=1e-13)
    assert got["brier"] == pytest.approx(metrics.brier(repaired, y), rel=1e-13)
    assert got["ece"] == pytest.approx(metrics.ece(repaired, y), abs=1e-13)
    assert got["tpcr"] == 0.0
    assert fit.metrics["calibrated"]["tpcr"] == metrics.tpcr(p0, q)
    # the work ran in both worker processes
    logs = client.run(os.getpid)
    assert sorted(logs.values()) == sorted(pids)


def test_eta_has_the_same_bits_for_1_2_and_7_shards(cluster, logits, tmp_path):
    client, _ = cluster
    z, y = logits
    vs = make_calibrator("vs").fit(z[:3000], y[:3000])  # fixed calibrator: only CORD varies
    etas = set()
    for n_shards in (1, 2, 7):
        shards = write_shards(tmp_path / f"s{n_shards}", z, y, n_shards)
        fit = fit_shards(str(shards), vs, client=client)
        etas.add((fit.cord.eta_.hex(), fit.cord.mu_.hex()))
    assert len(etas) == 1
    eta = float.fromhex(etas.pop()[0])
    whole = CORD().fit(softmax(z), vs.predict_proba(z))
    assert whole.eta_ != 0.0
    # exact means vs numpy's pairwise means: the same root to a few ulps of mu / slope
    assert abs(eta - whole.eta_) <= 1e-10 * abs(whole.eta_)
    # TS: exact sums, but the Halley start comes from a sample whose keys follow the shard
    # layout, and the confirmation pass accepts a beta once its exact Newton step is at most
    # 1e-12 relative: so a beta within that of the in-memory fit, not the same bits.
    in_memory = make_calibrator("ts").fit(z, y).beta_
    for n_shards in (1, 7):
        fit = fit_shards(str(tmp_path / f"s{n_shards}"), "ts", client=client)
        assert abs(fit.calibrator.beta_ - in_memory) <= 4e-12 * in_memory


def test_bad_input_is_refused_naming_the_file(cluster, logits, tmp_path):
    client, _ = cluster
    z, y = logits
    with pytest.raises(ValueError, match=r"'isotonic' cannot be fitted.*ts, vs"):
        fit_shards(str(tmp_path / "none"), "isotonic", client=client)
    shards = write_shards(tmp_path / "mixed", z, y, 2)
    data.save_parquet(shards / "part-99.parquet", softmax(z[:10]), y[:10], "probs")
    with pytest.raises(ValueError, match=r"part-99.parquet: holds 'probs' scores"):
        fit_shards(str(shards), "ts", client=client)
    bad = write_shards(tmp_path / "nan", z, y, 2)
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(bad / "part-01.parquet")
    values = z[3000:].copy()
    values[5, 2] = np.nan
    table = table.set_column(0, "logits", pa.array(list(values)))
    pq.write_table(table, bad / "part-01.parquet")
    with pytest.raises(ValueError, match=r"part-01.parquet.*row 5"):
        fit_shards(str(bad), "ts", client=client)


def test_an_unfitted_calibrator_is_refused_before_any_shard_is_read(tmp_path):
    """A calibrator object must come fitted (only CORD is fitted here): refused by name
    before the shards are looked for (the folder does not exist) or a cluster starts."""
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError, match=r"^vs: this calibrator is not fitted yet"):
        fit_shards(str(tmp_path / "absent"), make_calibrator("vs"), n_workers=1)


def test_local_cluster_when_no_address(logits, tmp_path):
    """Without a client or an address, fit_shards starts (and closes) its own two-worker
    local cluster; the fit is the one the external cluster gives."""
    z, y = logits
    shards = write_shards(tmp_path / "local", z[:2000], y[:2000], 3)
    fit = fit_shards(str(shards), "ts", n_workers=2)
    ref = make_calibrator("ts").fit(z[:2000], y[:2000])
    assert abs(fit.calibrator.beta_ - ref.beta_) <= 1e-10 * ref.beta_
    assert fit.cord.eta_ == CORD().fit(softmax(z[:2000]), ref.predict_proba(z[:2000])).eta_


def test_a_beta_the_cord_pass_does_not_confirm_is_fitted_on(cluster, logits, tmp_path):
    """A TS fit stops one pass early and CORD's pass confirms it; a beta that pass does
    not confirm (here one 1e-7 off, as if the fit had settled too soon) is fitted on to
    the in-memory optimum and CORD is fitted again on the new one."""
    from cord_ops.calibrators import calibrator_from_dict
    from flows.shards.fit import fit_calibrator_on, fit_cord_on
    from flows.shards.plan import plan_shards
    from flows.shards.session import open_shard_session

    client, _ = cluster
    z, y = logits
    shards = write_shards(tmp_path / "shards", z, y, 3)
    ref = make_calibrator("ts").fit(z, y)
    with open_shard_session(plan_shards(str(shards), None, "auto", 0, 1.0),
                      client=client) as session:
        settled = fit_calibrator_on(session, "ts")
        assert session.unconfirmed == settled.to_dict()
        cord, confirmed, _ = fit_cord_on(session, settled)
        assert confirmed is settled and session.unconfirmed is None
        off = calibrator_from_dict({**settled.to_dict(),
                                    "params": {"beta": settled.beta_ * (1 + 1e-7)}})
        session.unconfirmed = off.to_dict()
        cord_off, refit, _ = fit_cord_on(session, off)
    assert refit is not off
    for fitted in (settled, refit):
        assert abs(fitted.beta_ - ref.beta_) <= 1e-10 * ref.beta_
    assert cord_off.eta_ == CORD().fit(softmax(z), refit.predict_proba(z)).eta_


def test_local_clusters_serve_numpy_temporaries_from_the_arena(tmp_path):
    """Workers this package starts get WORKER_ENV before they spawn (Dask's own
    MALLOC_TRIM_THRESHOLD_ would otherwise send every block temporary to mmap)."""
    from distributed import Client

    from flows.shards.session import WORKER_ENV, local_cluster

    with local_cluster(2) as local, Client(local) as client:
        found = client.run(lambda: {key: os.environ.get(key) for key in WORKER_ENV})
        # Its port is open to every local account: only a client holding the cluster's
        # own certificates may connect (and so run functions as this user).
        assert local.scheduler_address.startswith("tls://127.0.0.1:")
        with pytest.raises(TypeError, match="ssl_context"):
            Client(local.scheduler_address, timeout=5)
        plain = local.scheduler_address.replace("tls://", "tcp://")
        with pytest.raises(OSError):
            Client(plain, timeout=5)
    assert len(found) == 2
    assert all(env == {key: str(value) for key, value in WORKER_ENV.items()}
               for env in found.values())
