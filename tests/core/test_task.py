"""The task interface (compress/tasks) and its first implementation, sequence classification."""

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from compress.core.task import DEFAULT_TASK, TASKS, Metric, Task, get_task
from tests.conftest import ROOT


def test_the_catalogue_is_data_and_imports_an_implementation_on_first_use():
    code = ("import sys, compress.core.task as t\n"
            "assert 'compress.tasks.classification.task' not in sys.modules\n"
            "task = t.get_task()\n"
            "assert 'compress.tasks.classification.task' in sys.modules and task.name == t.DEFAULT_TASK\n"
            "assert 'torch' not in sys.modules and 'sklearn' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)
    assert set(TASKS) == {"sequence-classification", "causal-lm"} and DEFAULT_TASK in TASKS
    with pytest.raises(KeyError, match="unknown task 'summarization'; valid: causal-lm, sequence-classification"):
        get_task("summarization")
    code = ("import sys, compress.core.task as t\n"
            "task = t.get_task('causal-lm')\n"
            "assert task.name == 'causal-lm' and task.metric.name == 'perplexity' and task.metric.direction == 'lower'\n"
            "assert 'torch' not in sys.modules and 'onnxruntime' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)


def test_classification_names_its_metric_and_its_columns():
    task = get_task("sequence-classification")
    assert isinstance(task, Task)
    m = task.metric
    assert (m.name, m.direction, m.unit, m.delta_unit) == ("accuracy", "higher", "%", "points")
    assert [s.name for s in task.secondary] == ["macro_f1"]
    assert task.columns == ("text", "pair", "label") and task.scale == 100.0
    info = task.info()
    assert info.name == "sequence-classification" and info.metric == m and info.throughput_unit == "seq/s"
    assert info.model_dump()["metric"]["name"] == "accuracy"


def test_metric_direction_turns_deltas_into_drops_and_picks_the_losing_bound():
    higher = Metric(name="accuracy", direction="higher", unit="%")
    lower = Metric(name="perplexity", direction="lower")
    assert higher.drop(-2.0) == 2.0 and higher.drop(0.0) == 0.0 and str(higher.drop(-0.0)) == "0.0"
    assert lower.drop(3.0) == 3.0 and lower.drop(-1.0) == -1.0
    assert higher.worst_bound((-1.0, 0.5)) == (-1.0, "lower")
    assert lower.worst_bound((-1.0, 0.5)) == (0.5, "upper")
    assert higher.is_better(2.0, 1.0) and lower.is_better(1.0, 2.0) and not lower.is_better(2.0, 1.0)
    assert sorted([3.0, 1.0, 2.0], key=lower.key) == [3.0, 2.0, 1.0]  # larger key: better
    assert lower.better_words == "better on perplexity" and higher.best_words == "best on accuracy"


def test_classification_scores_predictions_and_gives_correct_per_example():
    task = get_task()
    logits = np.array([[2.0, 1.0], [0.0, 3.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)  # [N=4, C=2]
    targets = np.array([0, 1, 1, 1])
    pred = task.predictions(logits)
    assert pred.tolist() == [0, 1, 0, 1]
    assert task.quality(pred, targets) == 75.0
    scores = task.example_scores(pred, targets)
    assert scores.tolist() == [True, True, False, True]
    assert scores.mean() * task.scale == task.quality(pred, targets)  # the bootstrap unit adds up to the metric
    f1 = task.secondary_scores(pred, targets)["macro_f1"]
    assert f1 == pytest.approx(100 * (2 / 3 + 0.8) / 2)
    task.check(logits)
    logits[2, 1] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite logits for 1 of 4"):
        task.check(logits)


def test_classification_eval_rows_round_trip_and_batches():
    task = get_task()
    split = SimpleNamespace(texts=["a b", "b"], pairs=["x", "y"], labels=np.array([1, 0]))
    rows = task.eval_rows(split)
    assert rows == [{"text": "a b", "label": 1, "pair": "x"}, {"text": "b", "label": 0, "pair": "y"}]
    (texts, pairs), targets = task.read_eval(rows)
    assert texts == split.texts and pairs == split.pairs and targets.tolist() == [1, 0]
    assert task.select((texts, pairs), [1]) == (["b"], ["y"])
    single = task.eval_rows(SimpleNamespace(texts=["a"], pairs=None, labels=[2]))
    assert single == [{"text": "a", "label": 2}] and task.read_eval(single)[0][1] is None

    class Tok:
        pad_token_id = 0

        def __call__(self, texts, pairs, truncation, max_length):
            return {"input_ids": [[1 + len(w) for w in t.split()][:max_length] for t in texts],
                    "attention_mask": [[1] * min(len(t.split()), max_length) for t in texts], "offsets": [[0]] * len(texts)}

    pred = SimpleNamespace(tokenizer=Tok(), input_names=None)
    enc = task.encode(pred, (["a bb", "c"], None), 8)
    assert set(enc[0]) == {"input_ids", "attention_mask"}  # only what a model takes
    assert [task.size(enc, i) for i in range(2)] == [2, 1]
    batch = task.batch(enc, [1, 0])
    assert batch["input_ids"].tolist() == [[2, 0], [2, 3]] and batch["attention_mask"].tolist() == [[1, 0], [1, 1]]
    assert batch["input_ids"].dtype == np.int64
    assert task.run(lambda b: b["input_ids"] * 2, batch).tolist() == [[4, 0], [4, 6]]  # one call per batch
