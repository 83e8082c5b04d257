"""cord_ops.data: every bad .npz input gets an error naming file, array, row and expectation;
the paper's split; atomic round trips; the bundled digits dataset; the real shared files."""

from __future__ import annotations

import hashlib
import json
import re
import zipfile

import numpy as np
import pytest
from conftest import SHARED_DATA, requires_shared, shared_files
from hypothesis import given, settings
from hypothesis import strategies as st

from cord_ops import data, metrics
from cord_ops.validation import PROBABILITY_SUM_ATOL

LOGITS = np.array([[2.0, 0.5, -1.0], [0.1, 0.2, 0.3], [-3.0, 4.0, 0.0], [1.0, 1.0, 1.0]])
PROBS = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8], [0.25, 0.5, 0.25], [1.0, 0.0, 0.0]])
LABELS = np.array([0, 2, 1, 0])


def _write(path, **arrays):
    np.savez(path, **arrays)
    return path


def _expect_error(path, message_regex, exc=ValueError):
    """load_npz(path) must raise, with the message starting with the file path."""
    with pytest.raises(exc) as info:
        data.load_npz(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert re.search(message_regex, message), message


# ---------------------------------------------------------------- bad inputs, one per case


def test_missing_labels(tmp_path):
    _expect_error(_write(tmp_path / "f.npz", logits=LOGITS), r"missing array 'labels'")


def test_missing_scores(tmp_path):
    _expect_error(_write(tmp_path / "f.npz", labels=LABELS),
                  r"holds neither of 'logits' and 'probs'.*expected exactly one")


def test_both_logits_and_probs(tmp_path):
    _expect_error(_write(tmp_path / "f.npz", logits=LOGITS, probs=PROBS, labels=LABELS),
                  r"holds both of 'logits' and 'probs'.*expected exactly one")


def test_object_array(tmp_path):
    ragged = np.empty(4, dtype=object)
    ragged[:] = [[1.0, 2.0], [3.0], [4.0, 5.0], [6.0]]
    _expect_error(_write(tmp_path / "f.npz", logits=ragged, labels=LABELS),
                  r"array 'logits' is an object \(pickled\) array; expected a numeric array")


def test_object_labels(tmp_path):
    _expect_error(_write(tmp_path / "f.npz", logits=LOGITS, labels=LABELS.astype(object)),
                  r"array 'labels' is an object \(pickled\) array")


def test_string_scores(tmp_path):
    _expect_error(_write(tmp_path / "f.npz", logits=LOGITS.astype(str), labels=LABELS),
                  r"logits: expected a real numeric array", TypeError)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_logits(tmp_path, bad):
    logits = LOGITS.copy()
    logits[2, 1] = bad
    _expect_error(_write(tmp_path / "f.npz", logits=logits, labels=LABELS),
                  r"logits: row 2 contains NaN or inf; expected finite values")


def test_non_finite_probs(tmp_path):
    probs = PROBS.copy()
    probs[3, 0] = np.nan
    _expect_error(_write(tmp_path / "f.npz", probs=probs, labels=LABELS),
                  r"probs: row 3 contains NaN or inf")


@pytest.mark.parametrize("shape", [(4, 3, 1), (4, 1, 1)])
def test_wrong_rank(tmp_path, shape):
    _expect_error(_write(tmp_path / "f.npz", logits=np.zeros(shape), labels=LABELS),
                  r"logits: expected a 2-D array \(n, K\)")


def test_single_column_is_a_binary_margin_not_one_class(tmp_path):
    # one score column is a binary model's (tests/core/test_stored_scores.py)
    loaded = data.load_npz(_write(tmp_path / "f.npz", logits=np.ones((4, 1)),
                                  labels=np.zeros(4, int)))
    assert loaded.n_classes == 2 and np.array_equal(loaded.scores, [[0.0, 1.0]] * 4)


def test_no_rows(tmp_path):
    _expect_error(_write(tmp_path / "f.npz", logits=np.zeros((0, 3)), labels=np.zeros(0, int)),
                  r"logits: expected at least one row")


def test_row_count_mismatch(tmp_path):
    _expect_error(_write(tmp_path / "f.npz", logits=LOGITS, labels=LABELS[:3]),
                  r"labels: expected 4 labels \(one per row\), got 3")


def test_labels_wrong_rank(tmp_path):
    _expect_error(_write(tmp_path / "f.npz", logits=LOGITS, labels=LABELS[:, None]),
                  r"labels: expected a 1-D array")


def test_negative_probability(tmp_path):
    probs = PROBS.copy()
    probs[1] = [-0.1, 0.3, 0.8]
    _expect_error(_write(tmp_path / "f.npz", probs=probs, labels=LABELS),
                  r"probs: row 1 has a negative entry.*expected probabilities >= 0")


def test_unnormalised_probabilities(tmp_path):
    off = PROBS.copy()
    off[2, 0] += 3 * PROBABILITY_SUM_ATOL
    _expect_error(_write(tmp_path / "f.npz", probs=off, labels=LABELS),
                  r"probs: row 2 sums to .*; expected rows summing to 1 within 0\.0001")
    # logits passed as probabilities are caught the same way
    _expect_error(_write(tmp_path / "g.npz", probs=np.abs(LOGITS), labels=LABELS),
                  r"probs: row 0 sums to")


def test_probabilities_within_tolerance_load(tmp_path):
    near = PROBS.copy()
    near[2, 0] += 0.5 * PROBABILITY_SUM_ATOL
    loaded = data.load_npz(_write(tmp_path / "f.npz", probs=near, labels=LABELS))
    # renormalised once at load; the worst row's error is kept
    np.testing.assert_array_equal(loaded.scores, near / near.sum(axis=1, keepdims=True))
    assert (loaded.sum_error_row, loaded.sum_error) == (2, abs(near[2].sum() - 1))


@pytest.mark.parametrize("bad_label", [3, -1])
def test_label_out_of_range(tmp_path, bad_label):
    labels = LABELS.copy()
    labels[1] = bad_label
    _expect_error(_write(tmp_path / "f.npz", logits=LOGITS, labels=labels),
                  r"labels: row 1 is .*; expected a class in \[0, 3\)")


def test_non_integer_label(tmp_path):
    _expect_error(_write(tmp_path / "f.npz", logits=LOGITS, labels=np.array([0, 1.5, 1, 0])),
                  r"labels: row 1 is .*1\.5.*; expected an integer class label")


def test_nan_label(tmp_path):
    _expect_error(_write(tmp_path / "f.npz", logits=LOGITS, labels=np.array([0, 1, np.nan, 0])),
                  r"labels: row 2 is .*nan.*; expected an integer class label")


def test_integral_float_labels_load(tmp_path):
    loaded = data.load_npz(_write(tmp_path / "f.npz", logits=LOGITS,
                                  labels=LABELS.astype(np.float32)))
    assert loaded.labels.dtype == np.int64
    np.testing.assert_array_equal(loaded.labels, LABELS)


def test_corrupt_bytes(tmp_path):
    path = tmp_path / "f.npz"
    path.write_bytes(b"this is not an npz archive at all")
    # Says what the file is not, never numpy's advice to enable pickle.
    _expect_error(path, r"not an \.npz archive .*expected 'logits' or 'probs' and 'labels'$")


def test_truncated_archive(tmp_path):
    path = _write(tmp_path / "f.npz", logits=LOGITS, labels=LABELS)
    path.write_bytes(path.read_bytes()[:-40])
    # Without its end-of-archive record the zip is not recognised as one at all.
    _expect_error(path, r"not an \.npz archive \(numpy\.savez's zip")


def test_member_failing_its_checksum(tmp_path):
    path = _write(tmp_path / "f.npz", logits=LOGITS, labels=LABELS)
    raw = bytearray(path.read_bytes())
    # flip one byte of the stored float data: the zip structure stays valid, the CRC fails
    at = raw.index(LOGITS.tobytes()) + 5
    raw[at] ^= 0xFF
    path.write_bytes(bytes(raw))
    _expect_error(path, r"array 'logits' is corrupt \(Bad CRC-32")


def test_corrupt_member(tmp_path):
    # a valid zip whose 'logits.npy' member is not an .npy file
    path = tmp_path / "f.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("logits.npy", b"garbage")
        archive.writestr("labels.npy", b"garbage")
    _expect_error(path, r"array 'logits' is corrupt \(member is not in \.npy format\)")


def test_single_npy_file(tmp_path):
    path = tmp_path / "f.npz"
    with open(path, "wb") as handle:
        np.save(handle, LOGITS)
    _expect_error(path, r"holds a single \.npy array; expected an \.npz archive")


def test_missing_file(tmp_path):
    _expect_error(tmp_path / "absent.npz", r"no such file", FileNotFoundError)


def test_input_kind_must_match_file(tmp_path):
    path = _write(tmp_path / "f.npz", logits=LOGITS, labels=LABELS)
    with pytest.raises(ValueError, match=r"input_kind='probs' but the file holds 'logits'"):
        data.load_npz(path, input_kind="probs")
    with pytest.raises(ValueError, match=r"input_kind: expected one of"):
        data.load_npz(path, input_kind="scores")
    assert data.load_npz(path, input_kind="logits").input_kind == "logits"


# ---------------------------------------------------------------- loading and saving


@pytest.mark.parametrize(("kind", "scores"), [("logits", LOGITS), ("probs", PROBS)])
def test_round_trip(tmp_path, kind, scores):
    path = data.save_npz(tmp_path / "out.npz", scores.astype(np.float32), LABELS, kind)
    loaded = data.load_npz(path)
    assert loaded.input_kind == kind
    assert loaded.path == str(path)
    assert loaded.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert loaded.scores.dtype == np.float64 and loaded.labels.dtype == np.int64
    stored = scores.astype(np.float32).astype(np.float64)
    if kind == "probs":  # float32 rows are renormalised once, by save_npz's validation
        stored = stored / stored.sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(loaded.scores, stored)
    np.testing.assert_array_equal(loaded.labels, LABELS)
    assert (loaded.n, loaded.n_classes) == (4, 3)
    with pytest.raises(ValueError, match="read-only"):
        loaded.scores[0, 0] = 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]


def test_probabilities_view():
    dataset = data.Dataset(LOGITS, LABELS, "logits", None, "")
    probs = dataset.probabilities()
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-15)
    np.testing.assert_allclose(np.log(probs[:, 0] / probs[:, 1]), LOGITS[:, 0] - LOGITS[:, 1],
                               atol=1e-12)
    assert data.Dataset(PROBS, LABELS, "probs", None, "").probabilities() is not PROBS


def test_save_validates_before_writing(tmp_path):
    target = tmp_path / "out.npz"
    with pytest.raises(ValueError, match=r"^probs: row 0 sums to"):
        data.save_npz(target, np.abs(LOGITS), LABELS, "probs")
    with pytest.raises(ValueError, match=r"^labels: row 0 is"):
        data.save_npz(target, LOGITS, LABELS + 5, "logits")
    with pytest.raises(ValueError, match=r"input_kind"):
        data.save_npz(target, LOGITS, LABELS, "auto")
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    target = data.save_npz(tmp_path / "out.npz", LOGITS, LABELS, "logits")
    before = target.read_bytes()

    def fail_midway(handle, **arrays):
        handle.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(data.np, "savez", fail_midway)
    with pytest.raises(OSError, match="disk full"):
        data.save_npz(target, PROBS, LABELS, "probs")
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["out.npz"]


def test_save_replaces_existing_file(tmp_path):
    target = data.save_npz(tmp_path / "out.npz", LOGITS, LABELS, "logits")
    data.save_npz(target, PROBS, LABELS, "probs")
    assert data.load_npz(target).input_kind == "probs"


# ---------------------------------------------------------------- split


@settings(max_examples=60, deadline=None)
@given(n=st.integers(2, 500), seed=st.integers(0, 2**32 - 1), fraction=st.floats(0.05, 0.95))
def test_split_is_the_papers_protocol(n, seed, fraction):
    n_cal = round(fraction * n)
    if not 0 < n_cal < n:
        with pytest.raises(ValueError, match="empty split"):
            data.split_indices(n, seed, fraction)
        return
    cal, evaluation = data.split_indices(n, seed, fraction)
    again = data.split_indices(n, seed, fraction)
    np.testing.assert_array_equal(cal, again[0])
    np.testing.assert_array_equal(evaluation, again[1])
    assert cal.size == n_cal and evaluation.size == n - n_cal
    assert np.intersect1d(cal, evaluation).size == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([cal, evaluation])), np.arange(n))
    # the permutation's first round(fraction n) entries, in permutation order
    perm = np.random.default_rng(seed).permutation(n)
    np.testing.assert_array_equal(np.concatenate([cal, evaluation]), perm)


def test_split_depends_on_seed():
    first, _ = data.split_indices(1000, 0)
    second, _ = data.split_indices(1000, 1)
    assert not np.array_equal(np.sort(first), np.sort(second))
    assert first.size == 500


@pytest.mark.parametrize(("args", "message"), [
    ((1, 0), "n: expected an integer >= 2"),
    ((10, -1), "seed: expected a non-negative integer"),
    ((10, 0, 1.0), r"fraction: expected a calibration fraction in \(0, 1\)"),
    ((10, 0, 0.01), "empty split"),
])
def test_split_arguments_are_checked(args, message):
    with pytest.raises(ValueError, match=message):
        data.split_indices(*args)


def test_split_dataset(tmp_path):
    path = data.save_npz(tmp_path / "f.npz", LOGITS, LABELS, "logits")
    dataset = data.load_npz(path)
    cal, evaluation = data.split(dataset, seed=3)
    cal_idx, eval_idx = data.split_indices(4, 3)
    np.testing.assert_array_equal(cal.scores, LOGITS[cal_idx])
    np.testing.assert_array_equal(evaluation.labels, LABELS[eval_idx])
    for part in (cal, evaluation):
        assert (part.input_kind, part.path, part.sha256) == ("logits", str(path), dataset.sha256)
        assert not part.scores.flags.writeable


# ---------------------------------------------------------------- bundled digits dataset


def test_digits_dataset_is_deterministic_real_and_overconfident():
    first = data.digits_dataset(seed=0)
    second = data.digits_dataset(seed=0)
    np.testing.assert_array_equal(first.scores, second.scores)
    assert first.sha256 == second.sha256
    assert (first.n, first.n_classes, first.input_kind, first.path) == (899, 10, "logits", None)
    probs = first.probabilities()
    accuracy = metrics.accuracy(probs, first.labels)
    assert accuracy > 0.9
    # overconfident: mean top-1 confidence clearly above accuracy
    assert probs.max(axis=1).mean() - accuracy > 0.02
    assert metrics.ece(probs, first.labels) > 0.02
    # a temperature above 1 lowers the NLL: the logits are too large
    assert metrics.nll(data.Dataset(first.scores / 2, first.labels, "logits", None, "")
                       .probabilities(), first.labels) < metrics.nll(probs, first.labels)
    other = data.digits_dataset(seed=1)
    assert other.sha256 != first.sha256


# ---------------------------------------------------------------- real shared data


@requires_shared
@pytest.mark.shared_data
def test_shared_files_load():
    manifest = json.loads((SHARED_DATA / "manifest.json").read_text())
    for path in shared_files():
        dataset = data.load_npz(path)
        facts = manifest[path.stem]
        assert dataset.input_kind == "logits"
        assert (dataset.n, dataset.n_classes) == (facts["n"], facts["K"])
        assert metrics.accuracy(dataset.probabilities(), dataset.labels) == pytest.approx(
            facts["top1_accuracy"], abs=1e-4)
