"""Datasets: a hub id (through `datasets`) or local files, checked before any training.

Where the data comes from, in order:
1. `data.dataset` is a local file or folder: it is read directly.
2. `data.mirror`, or a folder named like the dataset (`sst2` for `stanfordnlp/sst2`)
   under one of the COMPRESS_DATA_DIR folders, exists: it is read (no network needed).
3. Otherwise the hub, unless HF_HUB_OFFLINE is set.

Local files are read with pandas rather than `datasets`' csv builder: pandas names the
failing row of a malformed file, and nothing is cached outside the run folder.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from compress.core.errors import DataError

if TYPE_CHECKING:  # pragma: no cover
    from compress.recipe.schema import DataSpec

SUFFIXES = (".tsv", ".csv", ".jsonl", ".json", ".parquet")
_INT = re.compile(r"-?[0-9]+")
# GLUE ships its validation split as `dev`.
SPLIT_ALIASES = {"validation": ("validation", "dev", "val", "valid"), "dev": ("dev", "validation")}


@dataclass
class Split:
    """One split as plain lists: texts [N], optional pairs [N], labels int64 [N]."""

    texts: list[str]
    pairs: list[str] | None
    labels: np.ndarray  # int64 ids; object (str) while still class names, before Data maps them
    names: list[str] | None = None  # class names the source declares (a hub ClassLabel column)

    def __len__(self) -> int:
        return len(self.texts)

    def select(self, idx) -> "Split":
        idx = list(idx)
        return Split(
            [self.texts[i] for i in idx],
            [self.pairs[i] for i in idx] if self.pairs is not None else None,
            self.labels[idx],
        )


def _read_file(path: Path):
    import pandas as pd

    try:
        if path.suffix == ".tsv":
            # GLUE TSVs are not quoted: a quote character is part of the text.
            return pd.read_csv(path, sep="\t", quoting=3, keep_default_na=False, dtype=str, encoding="utf-8")
        if path.suffix == ".csv":
            return pd.read_csv(path, keep_default_na=False, dtype=str, encoding="utf-8")
        # dtype=False: values stay as written, so `true` or `1.5` as a label is an error
        # naming its row rather than a silent 1 or a column turned to floats.
        if path.suffix == ".jsonl":
            return pd.read_json(path, lines=True, encoding="utf-8", dtype=False)
        if path.suffix == ".json":
            try:
                return pd.read_json(path, encoding="utf-8", dtype=False)
            except ValueError:
                return pd.read_json(path, lines=True, encoding="utf-8", dtype=False)
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (bad byte at offset {exc.start}); re-encode the file as UTF-8")
    except Exception as exc:  # pandas' parser errors name the line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
        raise DataError(f"{path}: cannot parse: {first}")
    raise DataError(f"{path}: unsupported file type; use one of {', '.join(SUFFIXES)}")


def _split_file(folder: Path, split: str) -> Path:
    for name in SPLIT_ALIASES.get(split, (split,)):
        for suffix in SUFFIXES:
            candidate = folder / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
            # A loop, a link to nothing or a folder so named: say so, not "no file for split".
            if candidate.is_symlink() and not candidate.exists():
                from compress.recipe.peek import missing_path_reason

                why = missing_path_reason(candidate).replace("a real folder", "a real file")
                raise DataError(f"{folder}: the file for split '{split}' cannot be read: {why}")
            if candidate.exists():
                raise DataError(f"{folder}: the file for split '{split}', {candidate.name}, is not a regular file "
                                f"(a folder or a device); replace it with the split's data file")
    have = sorted(p.name for p in folder.iterdir() if p.suffix in SUFFIXES)
    raise DataError(
        f"{folder}: no file for split '{split}' (looked for {split}.tsv/.csv/.jsonl/.parquet; found: "
        f"{', '.join(have) or 'none'})"
    )


def _local_root(spec: "DataSpec", base_dir: Path) -> Path | None:
    """A local file or folder for the dataset, or None to use the hub."""
    from compress.recipe.peek import expand_user

    direct = expand_user(spec.dataset)
    if not direct.is_absolute():
        direct = base_dir / direct
    if direct.exists():
        return direct.resolve()
    if spec.mirror:
        mirror = expand_user(spec.mirror)
        mirror = mirror if mirror.is_absolute() else base_dir / mirror
        if mirror.is_dir():
            return mirror.resolve()
    leaf = spec.dataset.rstrip("/").split("/")[-1]
    # With a configuration (glue + mnli): `glue/mnli` or `mnli`, never the whole `glue` folder.
    names = [f"{leaf}/{spec.config}", spec.config] if spec.config else [leaf]
    for root in filter(None, os.environ.get("COMPRESS_DATA_DIR", "").split(os.pathsep)):
        for name in names:
            candidate = expand_user(root) / name
            if candidate.is_dir():
                return candidate.resolve()
    from compress.recipe.peek import looks_like_path, missing_path_reason

    if spec.dataset.startswith((".", "/", "~")) or direct.is_symlink() or looks_like_path(spec.dataset):
        raise DataError(f"data.dataset: {missing_path_reason(direct).replace('no such folder', 'no such file or folder')}")
    return None


def _frame_to_split(frame, spec: "DataSpec", where: str) -> Split:
    cols = [spec.text, spec.label] + ([spec.text_pair] if spec.text_pair else [])
    missing = [c for c in cols if c not in frame.columns]
    if missing:
        raise DataError(
            f"{where}: missing column {', '.join(repr(c) for c in missing)} (columns: "
            f"{', '.join(map(str, frame.columns))}); set data.text / data.label to the right names"
        )
    if len(frame) == 0:
        raise DataError(f"{where}: the split is empty")

    def texts(col: str) -> list[str]:
        values = frame[col].tolist()
        for i, v in enumerate(values):
            if not isinstance(v, str):
                raise DataError(f"{where}: row {i + 1}: column '{col}' is not text ({v!r})")
        return values

    raw_labels = frame[spec.label].tolist()
    # A row without a label turns the whole column to floats (NaN): name that row first,
    # not the first row whose 1 became 1.0.
    for i, v in enumerate(raw_labels):
        if v is None or (isinstance(v, float) and v != v):
            raise DataError(f"{where}: row {i + 1}: label is missing")
    # Integers (1, "1") or class names ("positive"): a column holds one kind. Any integer
    # makes it an integer column, so a stray `1.5`, `true` or word is an error naming its row.
    first_int = next((i for i, v in enumerate(raw_labels) if _integer_like(v)), None)
    if first_int is None:
        for i, v in enumerate(raw_labels):
            if not isinstance(v, str) or not v.strip():
                raise DataError(f"{where}: row {i + 1}: label {v!r} is not an integer or a class name")
        labels = np.array([v.strip() for v in raw_labels], dtype=object)
        return Split(texts(spec.text), texts(spec.text_pair) if spec.text_pair else None, labels)
    labels = np.empty(len(raw_labels), dtype=np.int64)
    for i, v in enumerate(raw_labels):
        # ASCII digits only (_integer_like): str.isdigit() accepts '¹' or '٣', which int() then rejects (or reads).
        if not _integer_like(v):
            raise DataError(f"{where}: row {i + 1}: label {v!r} is not an integer (row {first_int + 1}'s is: a "
                            f"column holds integers or class names, not both)")
        if not -(2**31) < int(v) < 2**31:  # would overflow int64 (and no head has that many classes)
            raise DataError(f"{where}: row {i + 1}: label {str(v)[:40]} is out of range")
        labels[i] = int(v)
    return Split(texts(spec.text), texts(spec.text_pair) if spec.text_pair else None, labels)


def _index(names: list[str]) -> dict[str, int]:
    """name -> id, matching exactly or else case-blind (NEGATIVE in a model's id2label is
    `negative` in the data)."""
    index = {str(n): i for i, n in enumerate(names)}
    lower: dict[str, int] = {}
    for i, n in enumerate(names):
        lower.setdefault(str(n).lower(), i)
    if len(lower) == len(names):
        index.update({k: v for k, v in lower.items() if k not in index})
    return index


def _integer_like(v) -> bool:
    return not isinstance(v, bool) and (
        isinstance(v, (int, np.integer)) or (isinstance(v, str) and _INT.fullmatch(v.strip()) is not None))


def _load_split(spec: "DataSpec", root: Path | None, split: str) -> tuple[Split, str]:
    if root is not None:
        path = root if root.is_file() else _split_file(root, split)
        if root.is_file() and split != spec.train_split and split != spec.eval_split:
            raise DataError(f"{root}: a single file has no split '{split}'")
        frame = _read_file(path)
        return _frame_to_split(frame, spec, str(path)), str(path)
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}:
        raise DataError(
            f"data.dataset: '{spec.dataset}' needs the hub but HF_HUB_OFFLINE is set; set "
            f"data.mirror or COMPRESS_DATA_DIR to a local copy, or data.dataset to a local folder"
        )
    try:
        import datasets

        # A dataset with several configurations (glue: mnli, qqp, ...) needs data.config.
        ds = datasets.load_dataset(spec.dataset, spec.config, split=split, revision=spec.revision)
    except Exception as exc:
        raise DataError(
            f"data.dataset: cannot load '{spec.dataset}'{f' config {spec.config!r}' if spec.config else ''} "
            f"split '{split}' from the hub ({exc.__class__.__name__}: {_first_line(exc)}); offline, set "
            f"data.mirror or COMPRESS_DATA_DIR to a local copy"
        ) from exc
    name = spec.dataset + (f"/{spec.config}" if spec.config else "") + (f"@{spec.revision}" if spec.revision else "")
    out = _frame_to_split(ds.to_pandas(), spec, f"{name}[{split}]")
    # A ClassLabel column: integers whose names the dataset declares (glue/mnli: entailment, ...).
    names = getattr(getattr(ds, "features", {}).get(spec.label), "names", None)
    out.names = [str(n) for n in names] if names else None
    return out, f"hub:{name}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else exc.__class__.__name__)[:160]


def unk_share(tokenizer, split: Split) -> tuple[float | None, int]:
    """(share of the split's tokens that are the tokenizer's unknown token, token count);
    the share is None when the tokenizer has no unknown token (byte-level BPE reads anything)."""
    ids = tokenizer(split.texts, split.pairs, add_special_tokens=False)["input_ids"]
    total = sum(len(x) for x in ids)
    unk = tokenizer.unk_token_id
    if unk is None:
        return None, total
    return sum(x.count(unk) for x in ids) / max(total, 1), total


def map_labels(spec: "DataSpec", sources: dict[str, str], train: Split, ev: Split,
               head: list[str] | None) -> tuple[int, list[str] | None]:
    """(num_labels, label names or None for unnamed integers); turns both splits' labels into
    int64 ids in place. Class names become ids in sorted order, or in the order
    data.label_names (or the head) gives; a label that only the eval split has is the eval
    file's error. `head`: the id2label names of a classifier whose head is used as it is."""
    named = _same_label_kind(train, ev, sources)
    names, num_labels = _class_names(spec, train, named, sources)
    if head is not None:
        names = _names_from_head(spec, head, names, num_labels, sources)
    if named:
        given = ("data.label_names" if spec.label_names else
                 "the model's id2label" if head is not None and names == list(head) else None)
        _names_to_ids(names, given, {"train": train, "eval": ev}, sources)
    else:
        _check_id_range(num_labels, inferred=not (names or spec.num_labels), splits={"train": train, "eval": ev},
                        sources=sources)
    if num_labels < 2:
        raise DataError(f"{sources['train']}: only one class in the labels; a classifier needs two or more")
    if not named and not (names or spec.num_labels):
        _check_every_class_present(train, num_labels, sources)
    return num_labels, [str(n) for n in names] if names else None


def _same_label_kind(train: Split, ev: Split, sources: dict[str, str]) -> bool:
    """Whether the labels are class names (else integers), the same kind in both splits."""
    named = train.labels.dtype == object
    if (ev.labels.dtype == object) != named:
        raise DataError(
            f"{sources['eval']}: row 1: label {ev.labels[0]!r} is {'a class name' if not named else 'an integer'}, but "
            f"the training split ({sources['train']}) has {'class names' if named else 'integers'}; use one kind in both"
        )
    return named


def _class_names(spec: "DataSpec", train: Split, named: bool, sources: dict[str, str]) -> tuple[list | None, int]:
    """(the class names in id order or None, the number of classes), from data.label_names,
    the names in the data, the file's own names or data.num_labels, checked against each other."""
    names = list(spec.label_names) if spec.label_names else None
    if named and names is None:
        names = sorted(set(train.labels.tolist()))
    elif not named and names is None:
        names = train.names
    if names:
        num_labels = len(names)
    elif spec.num_labels:
        num_labels = spec.num_labels
    else:
        num_labels = int(train.labels.max()) + 1 if len(train) else 0
    if spec.num_labels and spec.num_labels != num_labels:
        raise DataError(f"{sources['train']}: data.num_labels is {spec.num_labels}, but the labels name {num_labels} "
                        f"classes ({', '.join(names[:6])}); fix data.num_labels or data.label_names")
    return names, num_labels


def _names_from_head(spec: "DataSpec", head: list[str], names: list | None, num_labels: int,
                     sources: dict[str, str]) -> list | None:
    """The names to use with a classifier's own head: its count must be the data's, and
    its own names give the ids (LABEL_0, ... name nothing)."""
    if len(head) != num_labels:
        raise DataError(
            f"{sources['train']}: the data has {num_labels} classes but the model's classification head has "
            f"{len(head)} ({', '.join(head[:6])}); add a finetune stage (it fits a new head) and take the "
            f"baseline from it, or fix data.num_labels / data.label_names"
        )
    if all(re.fullmatch(r"LABEL_\d+", n) for n in head):
        return names
    if spec.label_names and [n.lower() for n in spec.label_names] != [n.lower() for n in head]:
        raise DataError(f"data.label_names ({', '.join(spec.label_names)}) differ from the model's own "
                        f"id2label ({', '.join(head)}); remove data.label_names or fine-tune a new head")
    return list(head)


def _names_to_ids(names: list, given: str | None, splits: dict[str, Split], sources: dict[str, str]) -> None:
    """Class-name labels to int64 ids (exact, then case-blind); a name outside the classes
    is its file's error, naming the row."""
    index = _index(names)
    for part, split in splits.items():
        ids = np.empty(len(split), dtype=np.int64)
        for i, v in enumerate(split.labels):
            j = index.get(v, index.get(v.lower()))
            if j is None:
                why = (f"is not one of {given} ({', '.join(names[:10])})" if given else
                       f"never appears in the training split ({sources['train']})")
                raise DataError(f"{sources[part]}: row {i + 1}: label {v!r} {why}; fix the label or the names")
            ids[i] = j
        split.labels = ids


def _check_id_range(num_labels: int, inferred: bool, splits: dict[str, Split], sources: dict[str, str]) -> None:
    """Integer labels must lie in 0..num_labels-1; `inferred`: the count was read off the
    training labels, so an eval label beyond them is one the training split never has."""
    for part, split in splits.items():
        bad = np.flatnonzero((split.labels < 0) | (split.labels >= num_labels))
        if bad.size:
            v = split.labels[bad[0]]
            why = (f"never appears in the training split ({sources['train']}: 0..{num_labels - 1})"
                   if inferred and part == "eval" and v >= 0 else f"is out of range 0..{num_labels - 1}")
            raise DataError(f"{sources[part]}: row {bad[0] + 1}: label {v} {why}"
                            + ("; fix the label or set data.num_labels" if inferred and part == "eval" else ""))


def _check_every_class_present(train: Split, num_labels: int, sources: dict[str, str]) -> None:
    """A count inferred as max + 1: a stray large label would silently make a huge head."""
    present = set(np.unique(train.labels).tolist())
    if len(present) >= num_labels:
        return
    absent = []  # the first few; at most len(present) + 6 steps, whatever the labels
    for c in range(num_labels):
        if c not in present:
            absent.append(c)
            if len(absent) > 5:
                break
    shown = ", ".join(map(str, absent[:5])) + (", ..." if len(absent) > 5 else "")
    raise DataError(
        f"{sources['train']}: labels should be 0..{num_labels - 1}, but class {shown} never "
        f"appears in the training split; fix the labels or set data.num_labels"
    )


class Data:
    """The recipe's data: the training subset, the eval split, and a calibration slice
    of training examples that were not trained on (never the eval split)."""

    def __init__(self, spec: "DataSpec", base_dir: Path, head: list[str] | None = None):
        """`head`: the id2label names, in id order, of a classifier whose head is used as it is
        (`budget.baseline: model`): its label count must be the data's, and its own names
        give the ids (LABEL_0, ... name nothing)."""
        self.spec = spec
        root = _local_root(spec, base_dir)
        self.train_full, train_src = _load_split(spec, root, spec.train_split)
        self.eval, eval_src = _load_split(spec, root, spec.eval_split)
        self.sources = {"train": train_src, "eval": eval_src}
        if spec.max_eval_examples:
            self.eval = self.eval.select(range(min(spec.max_eval_examples, len(self.eval))))

        self._map_labels(head)
        self._order = self._hold_out()
        n = min(spec.max_train_examples or len(self._order), len(self._order))
        self.train = self.train_full.select(self._order[:n])
        self._fingerprints()
        self._check_overlap()

    def _hold_out(self) -> np.ndarray:
        """Carves the held-out sentences (data.holdout) out of the training split and returns
        the training order: a fixed permutation without them (and every phrase of them).
        Its head is the training subset, its tail the calibration pool, so the two never
        overlap when data allows."""
        spec = self.spec
        order = np.random.default_rng(spec.seed).permutation(len(self.train_full))
        hold = spec.holdout
        self.holdout_calibration = self.holdout_check = None
        if hold.calibration or hold.check:
            asked = hold.calibration + hold.check
            carved, dropped = carve_sentences(self.train_full, asked, spec.seed)
            self._check_holdout(asked, len(carved), len(dropped))
            self.holdout_calibration = self.train_full.select(carved[: hold.calibration])
            self.holdout_check = self.train_full.select(carved[hold.calibration:])
            self.holdout_dropped = len(dropped)
            order = order[~np.isin(order, dropped)]
        return order

    # The most of the training split that data.holdout may take (the sentences and every
    # phrase of them): past it, what is left to train on is no longer the data asked for.
    MAX_HOLDOUT_SHARE = 0.75

    def _check_holdout(self, asked: int, carved: int, dropped: int) -> None:
        """Before any stage: the holdout gets the sentences it asks for and leaves training rows."""
        hold, total, src = self.spec.holdout, len(self.train_full), self.sources["train"]
        what = f"data.holdout asks for {asked} whole sentences (calibration {hold.calibration} + check {hold.check})"
        if carved < asked:
            raise DataError(f"{src}: {what}, but the training split has only {carved} (of {total} rows); lower "
                            f"data.holdout.calibration / data.holdout.check")
        if dropped >= total or dropped > self.MAX_HOLDOUT_SHARE * total:
            left = "none" if dropped >= total else f"{total - dropped}"
            raise DataError(f"{src}: {what}; with every phrase of them that takes {dropped} of the {total} training "
                            f"rows ({dropped / total:.0%}), leaving {left} to train on (at most "
                            f"{self.MAX_HOLDOUT_SHARE:.0%} may be held out); lower data.holdout.calibration / "
                            f"data.holdout.check")

    def _map_labels(self, head: list[str] | None) -> None:
        """Sets num_labels, label_names (None: unnamed integers) and int64 ids in both splits
        (see map_labels)."""
        self.num_labels, self.label_names = map_labels(self.spec, self.sources, self.train_full, self.eval, head)

    @staticmethod
    def _row_keys(split: Split) -> list[str]:
        """Rows compared case- and whitespace-blind (a copy re-saved by another tool still matches)."""
        pairs = split.pairs if split.pairs is not None else [""] * len(split)
        return [" ".join(t.lower().split()) + "\x1f" + " ".join(p.lower().split()) for t, p in zip(split.texts, pairs)]

    def _check_overlap(self) -> None:
        """Eval rows that also appear in the training split score what a model memorised,
        not what it learned: their share is measured and reported (`overlap` in the
        manifest, a note in the report), and an eval split made entirely of training rows
        (one file given for both splits, a dev that is a copy of train) is an error."""
        train = set(self._row_keys(self.train_full))
        shared = sum(k in train for k in self._row_keys(self.eval))
        self.overlap = {"eval_rows_in_train": int(shared), "eval_rows": len(self.eval),
                        "share": round(shared / len(self.eval), 4)}
        self.notes: list[str] = []
        if shared == len(self.eval):
            same = self.sources["train"] == self.sources["eval"]
            raise DataError(
                f"{self.sources['eval']}: every eval row also appears in the training split"
                + (" (one file serves as both splits)" if same else f" ({self.sources['train']})")
                + "; accuracy on it would measure memory, not the model: give a separate eval split "
                "(a folder with train and dev/validation files)"
            )
        if shared:
            self.notes.append(
                f"{shared} of {len(self.eval)} eval rows ({shared / len(self.eval):.1%}) also appear in the training "
                f"split; the accuracy on those measures memory, not generalisation"
            )

    @property
    def id2label(self) -> dict[int, str] | None:
        """{id: class name} for the models' config.json, or None when the classes are unnamed."""
        return dict(enumerate(self.label_names)) if self.label_names else None

    # Examples right after the training subset in the fixed order, kept for calibration
    # (quantization ranges, parity checks, cascade thresholds): `train_pool` never trains on
    # them, so a stage that calibrates never sees examples a model learned.
    CALIBRATION_RESERVE = 2000

    @property
    def _reserve(self) -> int:
        # Whole held-out sentences calibrate instead: no training row need be set aside.
        return 0 if self.holdout_calibration is not None else self.CALIBRATION_RESERVE

    @property
    def train_unheld(self) -> Split:
        """The training split without the rows held out (`data.holdout`: the check and
        calibration sentences and every phrase of them): what a stage may read from the
        training split as a whole, e.g. trim_vocab's corpus. Without a holdout, the whole split."""
        if self.holdout_calibration is None:
            return self.train_full
        return self.train_full.select(np.sort(self._order))

    @property
    def sentences(self) -> frozenset[str]:
        """The whole sentences of the training split (`whole_rows`), as their words joined by
        single spaces: what augmentation copies. Computed on first use (seconds for SST-2)."""
        if getattr(self, "_sentences", None) is None:
            full = self.train_full
            rows = range(len(full)) if full.pairs is not None else whole_rows(full.texts)
            self._sentences = frozenset(" ".join(full.texts[i].split()) for i in rows)
        return self._sentences

    def train_pool(self, n: int | None) -> Split:
        """The training subset, then further examples of the training split in the fixed
        order, n in all (None: as many as there are), skipping the calibration reserve."""
        start = min(len(self.train) + self._reserve, len(self._order))
        pool = np.concatenate([self._order[: len(self.train)], self._order[start:]])
        return self.train_full.select(pool[: len(pool) if n is None else n])

    def calibration(self, n: int) -> Split:
        """n training examples outside the training subset (or from it, if none are left);
        the first CALIBRATION_RESERVE of them are never in `train_pool`. With
        `data.holdout.calibration`, the held-out whole sentences (at most that many)."""
        if self.holdout_calibration is not None:
            return self.holdout_calibration.select(range(min(n, len(self.holdout_calibration))))
        pool = self._order[len(self.train):]
        if len(pool) < n:
            pool = np.concatenate([pool, self._order[: n - len(pool)]])
        return self.train_full.select(pool[:n])

    @staticmethod
    def _hash_split(h, split: Split) -> None:
        for i, t in enumerate(split.texts):
            h.update(t.encode("utf-8", "surrogatepass"))
            if split.pairs is not None:
                h.update(b"\x1f" + split.pairs[i].encode("utf-8", "surrogatepass"))
            h.update(b"\x1e")
        h.update(split.labels.tobytes())

    def _fingerprints(self) -> None:
        # Over the content actually used, so a hub copy and a local mirror agree. Stages
        # depend on the training side only; the benchmark on the eval side.
        h = hashlib.sha256()
        self._hash_split(h, self.train_full)
        h.update(f"{self.spec.seed}/{len(self.train)}/{self.num_labels}".encode())
        hold = self.spec.holdout
        if hold.calibration or hold.check:  # absent otherwise: fingerprints of older runs stay valid
            h.update(f"/holdout {hold.calibration} {hold.check}".encode())
        if self.label_names:  # class names go into every variant's config.json (unnamed: as before)
            h.update(repr(self.label_names).encode())
        self.train_fingerprint = h.hexdigest()
        h = hashlib.sha256()
        self._hash_split(h, self.eval)
        h.update(f"{self.num_labels}".encode())
        if self.label_names:
            h.update(repr(self.label_names).encode())
        self.eval_fingerprint = h.hexdigest()
        self.fingerprint = hashlib.sha256((self.train_fingerprint + self.eval_fingerprint).encode()).hexdigest()

    def describe(self) -> dict:
        held = {}
        if self.holdout_calibration is not None:
            held = {"holdout_calibration": len(self.holdout_calibration), "holdout_check": len(self.holdout_check),
                    "holdout_dropped_rows": self.holdout_dropped}
        return {
            **held,
            "sources": self.sources,
            "train_examples": len(self.train),
            "train_split_examples": len(self.train_full),
            "eval_examples": len(self.eval),
            "num_labels": self.num_labels,
            "label_names": self.label_names,
            "config": self.spec.config,
            "revision": self.spec.revision,
            "eval_unk_share": getattr(self, "eval_unk_share", None),
            "seed": self.spec.seed,
            "fingerprint": self.fingerprint,
            "train_fingerprint": self.train_fingerprint,
            "eval_fingerprint": self.eval_fingerprint,
            "overlap": self.overlap,
        }


class _SpanIndex:
    """Which rows are contiguous word spans of which, without spelling out a single span.

    An Aho-Corasick automaton over the rows' word sequences (every row a pattern), scanned
    over chosen rows: each node's `best` is the longest scanned row in which the node's words
    occur, found by walking each scanned row once and carrying the figure up the failure
    links. Time and memory are linear in the number of words, so a 3,000-word row costs
    3,000 steps rather than its 4.5 million spans (each a string as long as the row)."""

    def __init__(self, texts: list[str]):
        from collections import deque

        vocab: dict[str, int] = {}
        self.words = [[vocab.setdefault(w, len(vocab)) for w in t.split()] for t in texts]
        self.width = width = len(vocab) + 1
        goto: dict[int, int] = {}  # node * width + word -> child
        children: list[list[tuple[int, int]]] = [[]]
        self.node = []  # row -> the node its words end at
        for ws in self.words:
            q = 0
            for w in ws:
                nxt = goto.get(q * width + w)
                if nxt is None:
                    nxt = goto[q * width + w] = len(children)
                    children.append([])
                    children[q].append((w, nxt))
                q = nxt
            self.node.append(q)
        fail = [0] * len(children)
        order: list[int] = []  # breadth first: a node's failure link is always shallower
        queue = deque(v for _, v in children[0])
        while queue:
            u = queue.popleft()
            order.append(u)
            for w, v in children[u]:
                f = fail[u]
                while f and f * width + w not in goto:
                    f = fail[f]
                fail[v] = goto.get(f * width + w, 0)
                queue.append(v)
        self.goto, self.fail, self.order = goto, fail, order

    def longest_container(self, rows) -> list[int]:
        """Per node, the word count of the longest of `rows` (indices) its words occur in (0: none)."""
        goto, fail, width = self.goto, self.fail, self.width
        best = [0] * len(fail)
        for r in rows:
            ws = self.words[r]
            n, q = len(ws), 0
            for w in ws:
                while q and q * width + w not in goto:
                    q = fail[q]
                q = goto.get(q * width + w, 0)
                if best[q] < n:
                    best[q] = n
        for u in reversed(self.order):
            if best[fail[u]] < best[u]:
                best[fail[u]] = best[u]
        return best

    def whole(self) -> np.ndarray:
        """Indices of the indexed rows that are no contiguous span of a longer one [n]."""
        best = self.longest_container(range(len(self.words)))
        return np.array([i for i, ws in enumerate(self.words) if ws and best[self.node[i]] <= len(ws)], dtype=np.int64)


def whole_rows(texts: list[str]) -> np.ndarray:
    """Indices of rows whose words are not a contiguous span of a longer row's [n].

    Treebank data (SST-2) lists each sentence and then every phrase of its parse as rows of
    their own; the sentences are the rows no other row contains. Linear in the words of the
    split (_SpanIndex). Written here because no data library knows phrase-level treebank rows."""
    return _SpanIndex(texts).whole()


def carve_sentences(split: Split, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Picks n whole sentences of a training split, and every row learned from them.

    Treebank data (SST-2) lists each sentence and then every phrase of its parse as rows
    of their own: scoring a model on a sentence whose phrases it trained on measures
    recall, not generalisation. A whole sentence is a row whose tokens are not a
    contiguous span of a longer row's (rows of text pairs are all whole). Returns
    (the picked rows in a seeded order [n'], every row to keep out of training: the
    picked ones and each row whose text is a span of one of them [m]). Linear in the words
    of the split. Written here because no data library knows phrase-level treebank rows.
    """
    rng = np.random.default_rng(seed + 1)  # not the training order's stream
    if split.pairs is not None:
        whole = np.arange(len(split))
        picked = whole[rng.permutation(len(whole))[: min(n, len(whole))]]
        return picked, picked
    index = _SpanIndex(split.texts)
    whole = index.whole()
    picked = whole[rng.permutation(len(whole))[: min(n, len(whole))]]
    inside = index.longest_container(picked.tolist())
    dropped = np.array([i for i, ws in enumerate(index.words) if ws and inside[index.node[i]] > 0], dtype=np.int64)
    return picked, dropped
