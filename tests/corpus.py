"""A corpus of real classifier outputs, built at test time from data scikit-learn ships.

Why: the suite's CIFAR and generated logits are tidier than what real classifiers
write. Each entry here is the out-of-fold output (``StratifiedKFold``, as
``cross_val_predict`` does, one fit per fold for both output forms) of a small real model
on a bundled or generated data set, split into a calibration and an evaluation half:

- data: ``load_breast_cancer`` (K = 2), ``load_iris`` and ``load_wine`` (K = 3),
  ``load_digits`` (K = 10) and ``make_classification`` (K = 12, imbalanced 25:1);
- models and the pathology each brings: logistic regression (logits; binary margin),
  random forest and k-nearest-neighbours (multiples of 1/k: top-1 ties, exact 0 and 1),
  Gaussian naive Bayes (probabilities saturated at 0 and 1, joint log-likelihoods of
  magnitude 1e3-1e4 as logits), gradient boosting (raw scores), SVC with Platt
  probabilities (one-vs-rest margins), an MLP (pre-activation output logits);
- forms: ``kind`` "logits" (margins, where the model has them) or "probs", stored in
  ``float32`` or ``float64`` (a float32 probability row does not sum to 1 exactly); binary
  as two columns, and as one score column (``columns=1``: positive-class probability or
  margin) which only the loaders for one-column input take.

Everything is deterministic (fixed seeds, single-threaded models) and cached per process:
the whole corpus builds in a few seconds. ``pathologies`` are measured on the stored
arrays, so a test can select the entries that carry one.

Hypothesis strategies at the end generate the same pathologies row by row (exact zeros,
top-1 ties, rows off the simplex by float32 / float16 rounding, saturated rows, top-1
exactly 1.0, multiples of 1/m, huge and tied logits) for properties of the numerics and
the graphs.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

#: Pathology tags an entry can carry (measured on its stored scores, both splits).
PATHOLOGIES = (
    "binary",         # K = 2
    "many_classes",   # K >= 10
    "imbalanced",     # largest class over 5x the smallest
    "exact_zero",     # probabilities: some entries exactly 0
    "exact_one",      # probabilities: some top-1 exactly 1.0
    "top1_tie",       # some row's maximum attained at two or more classes
    "saturated",      # probabilities: some row with top-1 above 1 - 1e-9
    "off_simplex",    # probabilities: some row whose float64 sum is not exactly 1
    "huge_logits",    # logits: some |z| above 100
)

SEED = 0
N_FOLDS = 3


@dataclass(frozen=True)
class Source:
    """One (data set, model) pair of the corpus and the output forms it has."""

    dataset: str
    model: str
    has_logits: bool


@dataclass(frozen=True, eq=False)
class Entry:
    """One stored form of one model's out-of-fold outputs.

    ``cal_scores`` / ``eval_scores`` are what a pipeline would write: [n, K] (or [n, 1]
    for ``columns=1``) in ``dtype``; ``*_labels`` are int64. ``cal_probs`` / ``eval_probs``
    are the classifier's own probabilities of the stored scores in float64 (softmax of the
    logits, or the probabilities themselves), the rows CORD must keep the top-1 of.
    """

    name: str
    dataset: str
    model: str
    kind: str
    dtype: str
    columns: int
    n_classes: int
    cal_scores: np.ndarray = field(repr=False)
    cal_labels: np.ndarray = field(repr=False)
    eval_scores: np.ndarray = field(repr=False)
    eval_labels: np.ndarray = field(repr=False)
    pathologies: frozenset = frozenset()

    @property
    def input_kind(self) -> str:
        return self.kind

    @property
    def cal_probs(self) -> np.ndarray:
        return original_probs(self.cal_scores, self.kind)

    @property
    def eval_probs(self) -> np.ndarray:
        return original_probs(self.eval_scores, self.kind)

    def has(self, *tags: str) -> bool:
        return set(tags) <= self.pathologies

    def npz_arrays(self, split: str = "cal") -> dict[str, np.ndarray]:
        """The arrays of a ``.npz`` input file (docs/data-formats.md) for one split."""
        scores, labels = ((self.cal_scores, self.cal_labels) if split == "cal"
                          else (self.eval_scores, self.eval_labels))
        return {self.kind: scores, "labels": labels}


#: The (data set, model) pairs. Every model runs on breast_cancer (binary); the other data
#: sets get the models whose pathology matters there, to keep the build fast.
SOURCES = (
    *(Source("breast_cancer", m, m not in ("rf", "knn"))
      for m in ("logreg", "rf", "knn", "gnb", "gb", "svc", "mlp")),
    Source("iris", "knn", False), Source("iris", "gnb", True), Source("iris", "logreg", True),
    Source("wine", "rf", False), Source("wine", "svc", True), Source("wine", "mlp", True),
    Source("digits", "logreg", True), Source("digits", "knn", False),
    Source("digits", "rf", False), Source("digits", "gnb", True),
    Source("digits", "mlp", True),
    Source("imbalanced12", "logreg", True), Source("imbalanced12", "rf", False),
    Source("imbalanced12", "gb", True), Source("imbalanced12", "knn", False),
)

#: Larger generated data (20,000 rows) through the same model families, for benchmarks
#: that need evaluation splits of thousands of rows (``bench_label_free.py``); no test
#: builds them (3-fold fits on 13,000 rows take a while). SVC is left out: its Platt
#: cross-validation on that many rows costs minutes.
LARGE_SOURCES = (
    *(Source("binary20k", m, m not in ("rf", "knn"))
      for m in ("logreg", "rf", "knn", "gnb", "gb", "mlp")),
    *(Source("imbalanced12-20k", m, m not in ("rf", "knn"))
      for m in ("logreg", "rf", "knn", "gnb", "gb", "mlp")),
)

#: Binary models of rare positives as fraud, churn and cancellation models see them
#: "rarebin<percent>" is 6,000 generated rows with that percentage of positives,
#: so a stratified calibration half holds 30 (1 %) to 90 (3 %) of them. Built on request
#: (:func:`rare_binary`), not part of ``build()``'s default corpus.
RARE_SOURCES = tuple(Source(f"rarebin{p}", m, True) for p in ("1", "2", "2.8", "3")
                     for m in ("logreg", "gb", "logreg_balanced"))

KINDS = ("logits", "probs")
DTYPES = ("float32", "float64")


def _dataset(name: str) -> tuple[np.ndarray, np.ndarray]:
    from sklearn import datasets

    if name in ("imbalanced12", "imbalanced12-20k"):
        x, y = datasets.make_classification(
            n_samples=1800 if name == "imbalanced12" else 20000, n_features=20,
            n_informative=12, n_redundant=2,
            n_classes=12, n_clusters_per_class=1, class_sep=1.0, flip_y=0.03,
            weights=list(np.geomspace(1.0, 1 / 25, 12) / np.geomspace(1.0, 1 / 25, 12).sum()),
            random_state=SEED)
        return x, y.astype(np.int64)
    if name == "rare3":  # 2.8 % positives: the over-predicting case below
        x, y = datasets.make_classification(
            n_samples=12000, n_features=10, n_informative=4, weights=[0.972], flip_y=0.0,
            class_sep=0.7, random_state=SEED)
        return x, y.astype(np.int64)
    if name.startswith("rarebin"):  # RARE_SOURCES
        share = float(name[len("rarebin"):]) / 100
        x, y = datasets.make_classification(
            n_samples=6000, n_features=20, n_informative=6, n_redundant=4, n_classes=2,
            class_sep=1.0, flip_y=0.0, weights=[1 - share, share], random_state=SEED)
        return x, y.astype(np.int64)
    if name == "binary20k":
        x, y = datasets.make_classification(
            n_samples=20000, n_features=20, n_informative=6, n_redundant=4, n_classes=2,
            class_sep=0.7, flip_y=0.05, weights=[0.75, 0.25], random_state=SEED)
        return x, y.astype(np.int64)
    loader = {"breast_cancer": datasets.load_breast_cancer, "iris": datasets.load_iris,
              "wine": datasets.load_wine, "digits": datasets.load_digits}[name]
    x, y = loader(return_X_y=True)
    return x.astype(np.float64), y.astype(np.int64)


def _estimator(model: str):
    from sklearn.ensemble import HistGradientBoostingClassifier, RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.naive_bayes import GaussianNB
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVC

    scaled = {
        "logreg": lambda: LogisticRegression(C=10.0, max_iter=300),
        # weighted to balance the classes: predicts a rare class ten times too often
        "logreg_balanced": lambda: LogisticRegression(class_weight="balanced", max_iter=300),
        "knn": lambda: KNeighborsClassifier(n_neighbors=5),
        "svc": lambda: SVC(probability=True, random_state=SEED),
        "mlp": lambda: MLPClassifier(hidden_layer_sizes=(16,), max_iter=60,
                                     random_state=SEED),
    }
    if model in scaled:
        return make_pipeline(StandardScaler(), scaled[model]())
    if model == "rf":
        return RandomForestClassifier(n_estimators=10, max_depth=None, random_state=SEED,
                                      n_jobs=1)
    if model == "gnb":
        return GaussianNB()
    if model == "gb":
        return HistGradientBoostingClassifier(max_iter=15, max_depth=3, early_stopping=False,
                                              random_state=SEED)
    raise ValueError(f"unknown corpus model {model!r}")


def _mlp_logits(pipeline, x: np.ndarray) -> np.ndarray:
    """The MLP's output-layer pre-activations from its public fitted weights (relu hidden
    layers); one column for a binary MLP, whose output unit is logistic."""
    scaler, mlp = pipeline[0], pipeline[-1]
    h = scaler.transform(x)
    for w, b in zip(mlp.coefs_[:-1], mlp.intercepts_[:-1], strict=True):
        h = np.maximum(h @ w + b, 0.0)
    return h @ mlp.coefs_[-1] + mlp.intercepts_[-1]


def _margins(fitted, model: str, x: np.ndarray) -> np.ndarray:
    """The model's own scores before its probability map: [n, K], or [n] for a binary
    margin (``decision_function`` of the positive class)."""
    if model == "gnb":
        return fitted.predict_joint_log_proba(x)
    if model == "mlp":
        out = _mlp_logits(fitted, x)
        return out[:, 0] if out.shape[1] == 1 else out
    return fitted.decision_function(x)


@functools.cache
def _out_of_fold(dataset: str, model: str, with_logits: bool):
    """(probabilities [n, K] float64, margins [n, K] or [n] or None, labels) out of fold."""
    from sklearn.model_selection import StratifiedKFold
    from threadpoolctl import threadpool_limits

    x, y = _dataset(dataset)
    k = int(y.max()) + 1
    probs = np.zeros((len(y), k))
    margins = None
    folds = StratifiedKFold(N_FOLDS, shuffle=True, random_state=SEED).split(x, y)
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # MLP / logreg convergence at small max_iter
        for train, test in folds:
            fitted = _estimator(model).fit(x[train], y[train])
            probs[test] = fitted.predict_proba(x[test])
            if with_logits:
                m = _margins(fitted, model, x[test])
                if margins is None:
                    margins = np.zeros((len(y),) + m.shape[1:])
                margins[test] = m
    return probs, margins, y


def overpredicting_binary() -> tuple[np.ndarray, np.ndarray]:
    """A hard case for label-free monitoring, out of fold: the positive-class
    probability (one score column, as a pipeline writes it) of a class-balanced logistic
    regression on 12,000 rows of 2.8 % positives, which predicts about 30 % positives,
    95 % of them wrong; and the labels. Not in :data:`SOURCES` (a 12,000-row fit)."""
    probs, _, labels = _out_of_fold("rare3", "logreg_balanced", False)
    return probs[:, 1:], labels


def calibrated_logits(k: int, n: int, seed: int, scale: float = 1.0):
    """Logits z and labels drawn from softmax(z) (an exactly calibrated classifier), the
    logits returned multiplied by ``scale`` (a temperature distortion)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 2.0, (n, k))
    e = np.exp(z - z.max(axis=1, keepdims=True))
    p = e / e.sum(axis=1, keepdims=True)
    y = (p.cumsum(axis=1) > rng.uniform(size=(n, 1))).argmax(axis=1)
    return z * scale, y


def _split(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stratified half / half indices (calibration, evaluation)."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    cal, ev = train_test_split(idx, test_size=0.5, stratify=y, random_state=SEED + 1)
    return np.sort(cal), np.sort(ev)


def two_column_logits(margin: np.ndarray) -> np.ndarray:
    """Binary margin m -> logits [0, m]: softmax gives (1 - sigmoid(m), sigmoid(m))."""
    return np.stack([np.zeros_like(margin), margin], axis=1)


def original_probs(scores: np.ndarray, kind: str) -> np.ndarray:
    """The classifier's probabilities of stored scores, float64 (numpy only)."""
    x = np.asarray(scores, dtype=np.float64)
    if kind == "probs":
        return x
    z = x - x.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def top1(probs: np.ndarray) -> np.ndarray:
    """The paper's tie rule: the smallest index attaining the row maximum."""
    return np.argmax(probs, axis=1)


def measure_pathologies(scores: np.ndarray, labels: np.ndarray, kind: str) -> frozenset:
    """The tags of PATHOLOGIES that ``scores`` (two-or-more columns) carry."""
    x = np.asarray(scores, dtype=np.float64)
    k = x.shape[1]
    counts = np.bincount(labels, minlength=k)
    tags = set()
    if k == 2:
        tags.add("binary")
    if k >= 10:
        tags.add("many_classes")
    if counts.max() > 5 * max(counts.min(), 1):
        tags.add("imbalanced")
    top = x.max(axis=1)
    if ((x == top[:, None]).sum(axis=1) > 1).any():
        tags.add("top1_tie")
    if kind == "probs":
        if (x == 0.0).any():
            tags.add("exact_zero")
        if (top == 1.0).any():
            tags.add("exact_one")
        if (top > 1.0 - 1e-9).any():
            tags.add("saturated")
        if (x.sum(axis=1) != 1.0).any():
            tags.add("off_simplex")
    elif (np.abs(x) > 100.0).any():
        tags.add("huge_logits")
    return frozenset(tags)


def _forms(source: Source):
    """(kind, columns, scores [n, c] float64) of every stored form of one source."""
    probs, margins, y = _out_of_fold(source.dataset, source.model, source.has_logits)
    k = probs.shape[1]
    yield "probs", 2 if k == 2 else k, probs, y
    if k == 2:
        yield "probs", 1, probs[:, 1:], y
    if margins is not None:
        if margins.ndim == 1:
            yield "logits", 2, two_column_logits(margins), y
            yield "logits", 1, margins[:, None], y
        else:
            yield "logits", k, margins, y


@functools.cache
def build(include_one_column: bool = False, sources: tuple[Source, ...] = SOURCES,
          ) -> tuple[Entry, ...]:
    """Every corpus entry of ``sources`` (cached per process). One-column binary forms only
    on request: calibrators and graphs take two or more columns."""
    out = []
    for source in sources:
        for kind, columns, scores, y in _forms(source):
            if columns == 1 and not include_one_column:
                continue
            cal, ev = _split(y)
            for dtype in DTYPES:
                stored = scores.astype(dtype)
                tags = (measure_pathologies(stored, y, kind) if columns > 1 else
                        measure_pathologies(_two_columns(stored, kind), y, kind))
                k = int(y.max()) + 1
                name = f"{source.dataset}-{source.model}-{kind}-{dtype}" + (
                    "-1col" if columns == 1 else "")
                out.append(Entry(name, source.dataset, source.model, kind, dtype,
                                 columns if k == 2 else k, k,
                                 stored[cal], y[cal], stored[ev], y[ev], tags))
    return tuple(out)


def _two_columns(one: np.ndarray, kind: str) -> np.ndarray:
    s = np.asarray(one, dtype=np.float64)[:, 0]
    return two_column_logits(s) if kind == "logits" else np.stack([1.0 - s, s], axis=1)


def entries(*, kind: str | None = None, dtype: str | None = None,
            pathology: str | None = None, include_one_column: bool = False,
            large: bool = False) -> list[Entry]:
    """The entries matching every given filter (of ``LARGE_SOURCES`` when ``large``)."""
    return [e for e in build(include_one_column, LARGE_SOURCES if large else SOURCES)
            if (kind is None or e.kind == kind) and (dtype is None or e.dtype == dtype)
            and (pathology is None or pathology in e.pathologies)]


def entry(name: str) -> Entry:
    """One entry by name, e.g. ``"digits-knn-probs-float32"``."""
    for e in build(include_one_column=True):
        if e.name == name:
            return e
    raise KeyError(f"no corpus entry {name!r}")


def names(**filters) -> list[str]:
    """Entry names (for ``pytest.mark.parametrize`` ids without building at collection)."""
    return [e.name for e in entries(**filters)]


def covering(pathologies=PATHOLOGIES, kinds=KINDS, dtypes=DTYPES) -> list[Entry]:
    """A small set of entries: every model with every kind and dtype it has, on binary and
    on multi-class data, then every pathology with every kind and dtype where the corpus
    has that combination; for each combination not yet covered, its smallest entry
    (rows x K), in build order."""
    chosen: dict[str, Entry] = {}

    def add(have: list[Entry]) -> None:
        if have and not any(e.name in chosen for e in have):
            smallest = min(have, key=lambda e: len(e.cal_labels) * e.n_classes)
            chosen[smallest.name] = smallest

    for model in dict.fromkeys(s.model for s in SOURCES):
        for kind in kinds:
            for dtype in dtypes:
                have = [e for e in entries(kind=kind, dtype=dtype) if e.model == model]
                add([e for e in have if e.n_classes == 2])
                add([e for e in have if e.n_classes > 2])
    for tag in pathologies:
        for kind in kinds:
            for dtype in dtypes:
                add(entries(kind=kind, dtype=dtype, pathology=tag))
    order = {e.name: i for i, e in enumerate(build())}
    return sorted(chosen.values(), key=lambda e: order[e.name])


#: Iteration caps that keep every corpus fit well under a second (a capped fit is still a
#: genuine fitted state; the flows fit with the defaults).
FIT_OPTIONS = {
    "vs": {"max_iter": 60},
    "ms": {"max_iter": 20},
    "svs": {"max_iter": 60},
    "sms": {"max_iter": 20},
    "dir-odir": {"reg_lambdas": (1e-2,), "reg_mus": (1e-2,), "max_iter": 20},
    "mcct-i": {"max_iter": 60},
}


@functools.cache
def fitted(entry_name: str, calibrator: str) -> tuple:
    """(calibrator, CORD) fitted by cord_ops on an entry's calibration split, as the
    recalibration flow fits them (cached per process; convergence warnings silenced)."""
    from cord_ops import CORD
    from cord_ops.calibrators import make_calibrator

    e = entry(entry_name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = make_calibrator(calibrator, input_kind=e.kind,
                              **FIT_OPTIONS.get(calibrator, {}))
        cal.fit(e.cal_scores, e.cal_labels)
        cord = CORD().fit(e.cal_probs, cal.predict_proba(e.cal_scores))
    return cal, cord


# ------------------------------------------------------------------ hypothesis strategies
#: Row kinds of ``probability_rows``; "float16" rows are off the simplex by up to ~1e-3,
#: beyond cord_ops' 1e-4 sum tolerance, so they are opt-in.
ROW_KINDS = ("smooth", "zeros", "tie", "multiples", "float32", "saturated", "one_hot",
             "uniform")
ALL_ROW_KINDS = ROW_KINDS + ("float16",)


def _dyadic_tie(k: int, rng: np.random.Generator) -> np.ndarray:
    """A row whose maximum is attained at 2 or 3 classes, entries multiples of 1/64 (so the
    row sums to 1 exactly), the rest smaller, some of them possibly 0."""
    t = int(rng.integers(2, min(3, k) + 1))
    if t == k:
        return np.full(k, 1.0 / k)
    m = 64
    low = -(-m // k)  # a top count below ceil(m / k) cannot hold the whole row
    for c in range(int(rng.integers(low, m // t + 1)), m // t + 1):
        rest = m - t * c
        if rest <= (k - t) * (c - 1):
            break
    counts = np.zeros(k, dtype=np.int64)
    tied = rng.choice(k, t, replace=False)
    counts[tied] = c
    others = np.setdiff1d(np.arange(k), tied)
    for _ in range(rest):
        room = others[counts[others] < c - 1]
        counts[rng.choice(room)] += 1
    return counts / m


def _row(kind: str, k: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "smooth":
        return rng.dirichlet(np.full(k, 0.7))
    if kind == "zeros":
        p = rng.dirichlet(np.full(k, 0.7))
        keep = np.argmax(p)
        zero = rng.random(k) < 0.5
        zero[keep] = False
        p[zero] = 0.0
        return p / p.sum()
    if kind == "tie":
        return _dyadic_tie(k, rng)
    if kind == "multiples":  # k-NN / random-forest votes over m voters
        m = int(rng.choice([2, 3, 5, 7, 10, 20]))
        return rng.multinomial(m, rng.dirichlet(np.full(k, 0.5))) / m
    if kind == "float32":
        return rng.dirichlet(np.full(k, 0.7)).astype(np.float32).astype(np.float64)
    if kind == "float16":
        return rng.dirichlet(np.full(k, 0.7)).astype(np.float16).astype(np.float64)
    if kind == "saturated":  # naive Bayes: the runner-up 1e-12 .. 1e-300 or exactly 0
        p = np.zeros(k)
        a = int(rng.integers(k))
        p[:] = 10.0 ** rng.uniform(-300, -12, k)
        p[rng.random(k) < 0.3] = 0.0
        p[a] = 0.0
        p[a] = 1.0 - p.sum()  # rounds to exactly 1.0 for tails below 1e-17
        return p
    if kind == "one_hot":
        return np.eye(k)[int(rng.integers(k))]
    if kind == "uniform":
        return np.full(k, 1.0 / k)
    raise ValueError(kind)


@st.composite
def probability_rows(draw, k=None, n_rows=(1, 32), kinds=ROW_KINDS, dtype="float64"):
    """An [n, K] probability array (float64, or ``dtype`` storage upcast back to float64)
    mixing the row kinds ``kinds``; ``k`` an int or None (2..12, binary often)."""
    if k is None:
        k = draw(st.one_of(st.just(2), st.integers(2, 12)))
    n = draw(st.integers(*n_rows))
    row_kinds = draw(st.lists(st.sampled_from(kinds), min_size=n, max_size=n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    rows = np.stack([_row(kind, k, rng) for kind in row_kinds])
    return rows.astype(dtype).astype(np.float64)


#: Row kinds of ``logit_rows``.
LOGIT_KINDS = ("normal", "tie", "near_tie", "huge", "offset", "constant", "binary_margin")


def _logit_row(kind: str, k: int, rng: np.random.Generator) -> np.ndarray:
    z = rng.normal(0.0, 3.0, k)
    if kind == "tie":
        a, c = rng.choice(k, 2, replace=False)
        z[c] = z[a] = z.max() + rng.uniform(0.0, 2.0)
    elif kind == "near_tie":  # one float32 ulp apart
        a, c = rng.choice(k, 2, replace=False)
        z[a] = np.float32(z.max() + 1.0)
        z[c] = np.nextafter(np.float32(z[a]), np.float32(-np.inf))
    elif kind == "huge":  # naive Bayes joint log-likelihoods
        z = -rng.uniform(1e2, 1e4, k)
    elif kind == "offset":
        z = z + 1e4
    elif kind == "constant":
        z = np.full(k, rng.normal(0.0, 5.0))
    elif kind == "binary_margin":  # [0, m] written for a one-score model, K columns
        z = np.zeros(k)
        z[1 % k] = rng.normal(0.0, 8.0)
    return z


@st.composite
def logit_rows(draw, k=None, n_rows=(1, 32), kinds=LOGIT_KINDS, dtype="float32"):
    """An [n, K] logit array in ``dtype`` mixing the row kinds ``kinds``."""
    if k is None:
        k = draw(st.one_of(st.just(2), st.integers(2, 12)))
    n = draw(st.integers(*n_rows))
    row_kinds = draw(st.lists(st.sampled_from(kinds), min_size=n, max_size=n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return np.stack([_logit_row(kind, k, rng) for kind in row_kinds]).astype(dtype)


def summary() -> str:
    """One line per entry: name, K, rows, pathologies (``python tests/corpus.py``)."""
    lines = []
    for e in build(include_one_column=True):
        lines.append(f"{e.name:44s} K={e.n_classes:<3d} cal={len(e.cal_labels):<5d} "
                     f"eval={len(e.eval_labels):<5d} {','.join(sorted(e.pathologies))}")
    return "\n".join(lines)


if __name__ == "__main__":
    import time

    start = time.perf_counter()
    text = summary()
    print(text)
    print(f"{len(build(True))} entries in {time.perf_counter() - start:.2f} s")


def rare_binary(percent: str = "2", model: str = "logreg", kind: str = "probs",
                dtype: str = "float32", columns: int = 1) -> Entry:
    """One stored form of a rare-positives binary model (``RARE_SOURCES``): one score
    column by default, as ``predict_proba(X)[:, 1]`` is logged."""
    source = Source(f"rarebin{percent}", model, True)
    for e in build(True, (source,)):
        if (e.kind, e.dtype, e.columns) == (kind, dtype, columns):
            return e
    raise KeyError(f"no rare-binary form {percent, model, kind, dtype, columns}")
