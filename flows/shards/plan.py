"""What a run on Parquet shards will read, known before any cluster is contacted: the
shards of a folder or glob and their footers (:func:`describe_shards`: one score layout and
K, a ``labels`` column, rows in every shard), and the recalibration flow's view of them
(:func:`plan_shards`): a seeded per-row calibration/evaluation split inside every shard,
whose sizes follow from the footers' row counts (``reduce.split_rows``). Fits on the
calibration rows, metrics over every evaluation row and a bounded sample of those rows
for what needs rows on the driver follow on a session (docs/scale.md, "cord-ops
recalibrate on shards")."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from cord_ops import data
from cord_ops.reduce import split_rows
from flows.files import expand_inputs


def shard_kind(files, input_kind: str = "auto") -> str:
    """The score layout all shards share; raises naming the first shard that differs or
    lacks the label column (step 1)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    kinds = {}
    for path in files:
        try:
            names = pq.read_schema(path).names
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{path}: not a readable Parquet file ({exc})") from None
        kind, _ = data.score_columns(names, str(path), input_kind)
        if data.LABEL_COLUMN not in names:
            raise ValueError(f"{path}: missing column '{data.LABEL_COLUMN}' (columns: "
                             f"{sorted(names)})")
        first = next(iter(kinds.items()), None)
        if first is not None and first[1] != kind:
            raise ValueError(f"{path}: holds '{kind}' scores but {first[0]} holds "
                             f"'{first[1]}'; expected one layout across shards")
        kinds[path] = kind
    return next(iter(kinds.values()))



@dataclass(frozen=True)
class ShardSet:
    """Parquet shards named by one folder or glob, described from their footers.

    ``sha256`` is filled by :func:`open_shard_session` (it needs every byte): the SHA-256 of the
    lines ``<path relative to root> <file's sha256>``, one per shard, in sorted order.
    Provides the attributes of ``data.Dataset`` that provenance tags read (``path``,
    ``sha256``, ``n``, ``n_classes``, ``input_kind``).
    """

    path: str
    root: str
    files: tuple[str, ...]
    rows: tuple[int, ...]
    input_kind: str
    n_classes: int
    sha256: str = ""

    @property
    def n(self) -> int:
        return int(sum(self.rows))

    def relative(self, file: str) -> str:
        return Path(file).relative_to(self.root).as_posix()

    def key(self, file: str) -> int:
        """The shard's seed component: from its path relative to the root, so a shard
        keeps its rows' split when other shards are added or the folder moves."""
        return int.from_bytes(hashlib.sha256(self.relative(file).encode()).digest()[:8],
                              "little")


def _list_width(path, column: str, arrow_type) -> int:
    """Scores per row of a list score column: the fixed size, or the length of the first
    row; 1 for a plain numeric column (a binary model's one score column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if pa.types.is_floating(arrow_type) or pa.types.is_integer(arrow_type):
        return 1
    if pa.types.is_fixed_size_list(arrow_type):
        return int(arrow_type.list_size)
    batch = next(pq.ParquetFile(path).iter_batches(batch_size=1, columns=[column]), None)
    return 0 if batch is None or batch.num_rows == 0 else len(batch.column(0)[0])


def describe_shards(spec, input_kind: str = "auto") -> ShardSet:
    """The shards of ``spec`` (a folder, a glob or one file) from their footers: one score
    layout and K across shards, a label column, at least one row each; raises ValueError
    naming the first shard that breaks that (nothing is read beyond footers and one row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    single = Path(str(spec))
    if single.is_file():  # one file is one shard (e.g. --eval-data holdout.parquet)
        root, files = single.absolute().parent, [single.absolute()]
    else:
        root, files = expand_inputs(spec)
    kind = shard_kind(files, input_kind)
    rows, width, first = [], None, None
    for path in files:
        try:
            meta = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{path}: not a readable Parquet file ({exc})") from None
        n = int(meta.metadata.num_rows)
        if n == 0:
            raise ValueError(f"{path}: has no rows; expected at least one")
        schema = meta.schema_arrow
        _, columns = data.score_columns(schema.names, str(path), kind)
        k = (len(columns) if len(columns) > 1
             else _list_width(path, columns[0], schema.field(columns[0]).type))
        k = 2 if k == 1 else k  # one score column: a binary model (data.table_scores)
        if width is None:
            width, first = k, path
        elif k != width:
            raise ValueError(f"{path}: holds {k} classes but {first} holds {width}; "
                             "expected one K across shards")
        rows.append(n)
    if width < 2:
        raise ValueError(f"{first}: holds {width} classes; expected K >= 2")
    return ShardSet(str(spec), str(root), tuple(str(f) for f in files), tuple(rows), kind,
                    int(width))


@dataclass(frozen=True)
class ShardPlan:
    """What a recalibration on shards will read: ``data`` and optionally separate
    ``evaluation`` shards, the split's seed and calibration fraction (1.0 when
    ``evaluation`` is given), and the exact split sizes, known from the footers."""

    data: ShardSet
    evaluation: ShardSet | None
    seed: int
    fraction: float
    n_calibration: int
    n_evaluation: int

    @property
    def n_classes(self) -> int:
        return self.data.n_classes

    @property
    def input_kind(self) -> str:
        return self.data.input_kind


def plan_shards(spec, eval_spec=None, input_kind: str = "auto", seed: int = 0,
                fraction: float = 0.5) -> ShardPlan:
    """Describe the shards (:func:`describe_shards`) and count the split's rows by drawing
    each shard's split (``reduce.split_rows``) from its footer's row count."""
    shards = describe_shards(spec, input_kind)
    evaluation = None
    if eval_spec is not None:
        evaluation = describe_shards(eval_spec, shards.input_kind)
        if evaluation.n_classes != shards.n_classes:
            raise ValueError(f"{eval_spec}: has {evaluation.n_classes} classes but {spec} "
                             f"has {shards.n_classes}")
        fraction = 1.0
    n_cal = sum(int(split_rows(n, seed, fraction, shards.key(f))[0].sum())
                for f, n in zip(shards.files, shards.rows, strict=True))
    n_eval = shards.n - n_cal + (0 if evaluation is None else evaluation.n)
    return ShardPlan(shards, evaluation, int(seed), float(fraction), n_cal, n_eval)

