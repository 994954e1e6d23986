"""Cascades: a small variant answers the inputs it is confident about, a large one the rest.

Folder layout (written by the `cascade` stage):
    cascade.json   {"small": MEMBER, "large": MEMBER, "threshold": t, "calibration": {...}}
                   MEMBER = {"stage": id, "format": fmt, "path": p}; p is relative to the
                   run folder (the cascade folder's parent) for stage outputs, so the run
                   folder can move, or absolute for the recipe's own model.

The small model runs on the whole batch; the rows whose top softmax probability is below
the threshold run again through the large model, and its logits replace the small one's.

The members may have different tokenizers (a trimmed vocabulary in front of the full one).
The batch the cascade is called with is tokenized with the small member's tokenizer, as
every variant's batch is tokenized with its own, outside the timed call; when the large
member's tokenizer differs, the batch also carries the raw texts (`text`, `text_pair`:
object arrays [B], see `takes_text`) and the cascade tokenizes the routed rows for the
large member inside its call, so the benchmark's latency includes that extra cost.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from compress.formats import CPU_ONLY, Predictor, load_predictor, model_inputs

SPEC_FILE = "cascade.json"
TEXT_KEYS = ("text", "text_pair")  # raw inputs [B] in a batch, beside the token arrays


def member_path(member: dict, cascade_folder: Path) -> Path:
    p = Path(member["path"])
    return p if p.is_absolute() else cascade_folder.parent / p


def top_probability(logits: np.ndarray) -> np.ndarray:
    """Largest softmax probability per row: logits [B, C] -> [B], in float64 so that
    confident rows do not all round to exactly 1.0."""
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).max(axis=-1)


def _member_inputs(pred: Predictor, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The token arrays of `batch` that the member takes (never the raw texts)."""
    return model_inputs(batch, pred.input_names)


def same_tokenizer(a, b) -> bool:
    """Whether two tokenizers map text to the same ids (None: a test double, taken as equal)."""
    if a is None or b is None or a is b:
        return True
    return type(a) is type(b) and a.get_vocab() == b.get_vocab()


class CascadePredictor(Predictor):
    """Runs `small` on the batch, then `large` on the rows with top probability < threshold."""

    def __init__(self, path: Path, small: Predictor, large: Predictor, threshold: float,
                 max_length: int | None = None, large_source: tuple[str, Path] | None = None):
        super().__init__(path)
        self.small, self.large, self.threshold = small, large, float(threshold)
        # (format, folder) of the large member, so that the benchmark can time it alone beside
        # the cascade (bench_worker); None for a cascade built from loaded predictors.
        self.large_source = large_source
        self.max_length = max_length  # where the large member's own tokenization cuts
        self.tokenizer = small.tokenizer  # callers tokenize the batch for the small member
        self.device = small.device
        # takes_text: the large member tokenizes differently, so the batch must carry the texts.
        self.takes_text = not same_tokenizer(small.tokenizer, large.tokenizer)
        names = (small.input_names, large.input_names)
        if self.takes_text:  # the token arrays are the small member's only
            self.input_names = small.input_names
        else:  # inputs the cascade takes: everything when a member takes whatever it is given
            self.input_names = None if None in names else tuple(dict.fromkeys((*names[0], *names[1])))
        devices = {getattr(m, "effective_device", m.device) for m in (small, large)}
        if len(devices) == 1:
            self.effective_device = devices.pop()
        else:
            self.effective_device = "+".join(sorted(devices))
        self.notes = [f"small: {n}" for n in small.notes] + [f"large: {n}" for n in large.notes]
        self.notes.append("throughput at batch sizes above 1 is a stream: the routed inputs queue until a full "
                          "batch of them is ready for the large member, as a server under load runs it, so a "
                          "routed input waits for the batches after it; at batch 1 it goes on at once")
        if self.takes_text:
            self.notes.append("the members have different tokenizers: the large one's tokenization of the "
                              "inputs sent to it is timed, inside the cascade's call")
        self.reset_counts()

    def reset_counts(self) -> None:
        self._seen = 0
        self._routed = 0
        self._pending: list[np.ndarray] = []  # stream: logits [B, C] per submitted batch
        self._queue: list[tuple[int, int, dict]] = []  # stream: (batch no, row, the row's large inputs)

    @property
    def routed_share(self) -> float | None:
        """Share of the rows seen since reset_counts() that went on to the large model."""
        return self._routed / self._seen if self._seen else None

    def route(self, small_logits: np.ndarray) -> np.ndarray:
        """Rows [B] bool that go on to the large model."""
        return top_probability(small_logits) < self.threshold

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        logits = np.array(self.small(_member_inputs(self.small, batch)), dtype=np.float32)  # [B, C]
        rows = np.flatnonzero(self.route(logits))
        self._seen += logits.shape[0]
        self._routed += rows.size
        if rows.size:
            logits[rows] = self.large(self._large_inputs(batch, rows))
        return logits

    def submit(self, batch: dict[str, np.ndarray], queue_size: int) -> None:
        """Stream mode: the small member answers `batch` now; its routed rows join the queue,
        which the large member takes `queue_size` rows at a time. `drain()` returns the logits."""
        logits = np.array(self.small(_member_inputs(self.small, batch)), dtype=np.float32)  # [B, C]
        rows = np.flatnonzero(self.route(logits))
        self._seen += logits.shape[0]
        self._routed += rows.size
        no = len(self._pending)
        self._pending.append(logits)
        for r in rows:
            self._queue.append((no, int(r), self._row_inputs(batch, int(r))))
        while len(self._queue) >= queue_size:
            self._flush(queue_size)

    def drain(self) -> list[np.ndarray]:
        """Stream mode: runs what is still queued, then hands back the logits [B, C] of every
        batch submitted since the last drain, in order."""
        if self._queue:
            self._flush(len(self._queue))
        out, self._pending = self._pending, []
        return out

    def _row_inputs(self, batch: dict[str, np.ndarray], r: int) -> dict:
        """One routed row, kept until its queue runs: its texts (the large member tokenizes
        them) or its token arrays without the batch's padding."""
        if self.takes_text:
            if "text" not in batch:
                raise ValueError("this cascade's members have different tokenizers: its batch must carry the raw "
                                 "texts under 'text' (object array [B]) beside the token arrays")
            return {k: batch[k][r] for k in TEXT_KEYS if k in batch}
        width = int(batch["attention_mask"][r].sum()) if "attention_mask" in batch else None
        return {k: v[r, :width] for k, v in batch.items() if k not in TEXT_KEYS}

    def _flush(self, n: int) -> None:
        """Runs the first `n` queued rows through the large member as one batch."""
        take, self._queue = self._queue[:n], self._queue[n:]
        if self.takes_text:
            texts = np.array([q[2]["text"] for q in take], dtype=object)
            sub = {"text": texts}
            if "text_pair" in take[0][2]:
                sub["text_pair"] = np.array([q[2]["text_pair"] for q in take], dtype=object)
            inputs = self._large_inputs(sub, np.arange(len(take)))
        else:  # pad the rows to the longest: ids with the pad id, masks and segment ids with 0
            pad = getattr(self.large.tokenizer, "pad_token_id", None) or 0
            width = max(len(next(iter(q[2].values()))) for q in take)
            inputs = {}
            for k in take[0][2]:
                arr = np.full((len(take), width), pad if k == "input_ids" else 0, dtype=take[0][2][k].dtype)
                for i, q in enumerate(take):
                    arr[i, : len(q[2][k])] = q[2][k]
                inputs[k] = arr
            inputs = _member_inputs(self.large, inputs)
        out = np.asarray(self.large(inputs), dtype=np.float32)  # [n, C]
        for (no, r, _), row in zip(take, out):
            self._pending[no][r] = row

    def _large_inputs(self, batch: dict[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
        """The routed rows as the large member takes them: re-tokenized from the texts with
        its own tokenizer, or (one tokenizer) the small member's arrays cut to the longest row."""
        if self.takes_text:
            if "text" not in batch:
                raise ValueError("this cascade's members have different tokenizers: its batch must carry the raw "
                                 "texts under 'text' (object array [B]) beside the token arrays")
            texts = [str(t) for t in batch["text"][rows]]
            pairs = [str(t) for t in batch["text_pair"][rows]] if "text_pair" in batch else None
            kw = {"truncation": True, "max_length": self.max_length} if self.max_length else {}
            enc = self.large.tokenizer(texts, pairs, padding=True, return_tensors="np", **kw)
            return {k: np.asarray(v, dtype=np.int64) for k, v in _member_inputs(self.large, enc).items()}
        sub = {k: v[rows] for k, v in batch.items() if k not in TEXT_KEYS}
        if "attention_mask" in sub:  # drop the columns that are padding in every routed row
            width = int(sub["attention_mask"].sum(axis=1).max())
            sub = {k: v[:, :width] for k, v in sub.items()}
        return _member_inputs(self.large, sub)

    def sync(self) -> None:
        self.small.sync()
        self.large.sync()

    def num_params(self) -> int:
        return self.small.num_params() + self.large.num_params()

    def model_files(self) -> list[Path]:
        files = {p.resolve(): p for m in (self.small, self.large) for p in m.model_files()}
        return list(files.values())

    def memory_bytes(self) -> int | None:
        small, large = self.small.memory_bytes(), self.large.memory_bytes()
        return None if small is None or large is None else small + large


def read_spec(path: Path) -> dict:
    return json.loads((path / SPEC_FILE).read_text())


def load(path: Path, device: str, threads: int, options: dict) -> CascadePredictor:
    spec = read_spec(path)
    members = []
    for role in ("small", "large"):
        m = spec[role]
        where = member_path(m, path)
        if not where.exists():
            raise FileNotFoundError(f"cascade {role} member '{m.get('stage')}' is missing at {where}; re-run its stage")
        # A CPU-only member (torch INT8) runs on the CPU in a cascade benchmarked on a GPU;
        # the predictor then reports the mixed placement (effective_device "cpu+cuda").
        # spin_wait off: the members take turns on the same cores, and an ONNX Runtime session
        # keeps its threads spinning after each call, competing with the other member's threads
        # (on a 2-core CPU the cascade's batch-32 throughput was below its large member's alone).
        members.append(load_predictor(m["format"], where, "cpu" if m["format"] in CPU_ONLY else device, threads,
                                      {**options, "spin_wait": False}))
    return CascadePredictor(path, members[0], members[1], spec["threshold"], options.get("max_length"),
                            large_source=(spec["large"]["format"], member_path(spec["large"], path)))
