import numpy as np
import pytest

from compress.tasks.classification.data import Data
from compress.core.errors import DataError
from compress.recipe.schema import DataSpec
from tests.conftest import SST2, synthetic_rows, write_tsv


def spec(dataset, **kw) -> DataSpec:
    return DataSpec(dataset=str(dataset), **kw)


def folder(tmp_path, train, dev):
    write_tsv(tmp_path / "train.tsv", train)
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in dev))
    return tmp_path


def test_glue_folder_with_dev_alias_and_subset(tmp_path):
    d = Data(spec(folder(tmp_path, synthetic_rows(50, 0), synthetic_rows(10, 1)), max_train_examples=30), tmp_path)
    assert len(d.train) == 30 and len(d.eval) == 10 and d.num_labels == 2
    calib = d.calibration(20)
    assert not set(calib.texts) - set(d.train_full.texts)
    # calibration comes from examples outside the training subset
    train_ids = {id(t) for t in d.train.texts}
    assert not any(id(t) in train_ids for t in calib.texts)



def test_train_pool_extends_the_subset_but_never_takes_the_calibration_slice(tmp_path, monkeypatch):
    monkeypatch.setattr(Data, "CALIBRATION_RESERVE", 10)
    rows = [(f"sentence number {i}", i % 2) for i in range(100)]
    d = Data(spec(folder(tmp_path, rows, [(f"held out {i}", i % 2) for i in range(5)]), max_train_examples=30), tmp_path)
    everything = d.train_pool(None)
    assert len(everything) == 90  # 100 minus the 10 reserved for calibration
    assert everything.texts[:30] == d.train.texts  # the subset first, in its order
    assert not set(everything.texts) & set(d.calibration(10).texts)
    assert d.train_pool(45).texts == everything.texts[:45]
    assert d.train_pool(20).texts == d.train.texts[:20]

def test_quotes_are_text_in_tsv(tmp_path):
    rows = [('he said "great" film', 1), ("it's 'bad", 0)] * 3
    d = Data(spec(folder(tmp_path, rows, rows + [("a film not trained on", 1)])), tmp_path)
    assert d.eval.texts[0] == 'he said "great" film'


def test_missing_column(tmp_path):
    (tmp_path / "train.tsv").write_text("text\tlabel\nx\t1\n")
    (tmp_path / "dev.tsv").write_text("text\tlabel\nx\t1\n")
    with pytest.raises(DataError, match="missing column 'sentence'"):
        Data(spec(tmp_path), tmp_path)


@pytest.mark.parametrize("label,match", [("pos", "not an integer"), ("1.5", "not an integer"), ("-1", "out of range")])
def test_bad_labels_name_the_row(tmp_path, label, match):
    folder(tmp_path, [("a", 0), ("b", 1), ("c", label)], [("a", 0), ("b", 1)])
    with pytest.raises(DataError, match=match) as exc:
        Data(spec(tmp_path), tmp_path)
    assert "train.tsv" in str(exc.value) and "row 3" in str(exc.value)


def test_label_out_of_declared_range(tmp_path):
    folder(tmp_path, [("a", 0), ("b", 2)], [("a", 0), ("b", 1)])
    with pytest.raises(DataError, match="out of range 0..1"):
        Data(spec(tmp_path, num_labels=2), tmp_path)


def test_empty_split(tmp_path):
    folder(tmp_path, [("a", 0), ("b", 1)], [])
    with pytest.raises(DataError, match="empty"):
        Data(spec(tmp_path), tmp_path)


def test_unparsable_and_undecodable_files(tmp_path):
    (tmp_path / "train.tsv").write_text("sentence\tlabel\na\t1\nb\t0\textra\n")
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\na\t1\n")
    with pytest.raises(DataError, match="train.tsv: cannot parse"):
        Data(spec(tmp_path), tmp_path)
    (tmp_path / "train.tsv").write_bytes(b"sentence\tlabel\n\xff\xfe bad\t1\n")
    with pytest.raises(DataError, match="not UTF-8"):
        Data(spec(tmp_path), tmp_path)


def test_missing_split_file(tmp_path):
    write_tsv(tmp_path / "train.tsv", synthetic_rows(5, 0))
    with pytest.raises(DataError, match="no file for split 'validation'"):
        Data(spec(tmp_path), tmp_path)


def test_hub_id_uses_mirror_or_data_dir_and_offline_error(tmp_path, monkeypatch):
    (tmp_path / "sst2").mkdir()
    folder(tmp_path / "sst2", synthetic_rows(20, 0), synthetic_rows(5, 1))
    via_mirror = Data(spec("stanfordnlp/sst2", mirror="sst2"), tmp_path)
    monkeypatch.setenv("COMPRESS_DATA_DIR", str(tmp_path))
    via_env = Data(spec("stanfordnlp/sst2"), tmp_path / "elsewhere")
    assert via_mirror.fingerprint == via_env.fingerprint
    monkeypatch.setenv("COMPRESS_DATA_DIR", "")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="HF_HUB_OFFLINE"):
        Data(spec("stanfordnlp/sst2"), tmp_path / "elsewhere")


def test_fingerprint_tracks_content_and_selection(tmp_path):
    d1 = Data(spec(folder(tmp_path, synthetic_rows(40, 0), synthetic_rows(5, 1)), max_train_examples=20), tmp_path)
    d2 = Data(spec(tmp_path, max_train_examples=21), tmp_path)
    d3 = Data(spec(tmp_path, max_train_examples=20), tmp_path)
    assert d1.train_fingerprint != d2.train_fingerprint
    assert d1.fingerprint == d3.fingerprint
    assert d1.eval_fingerprint == d2.eval_fingerprint


@pytest.mark.skipif(not SST2.is_dir(), reason="shared SST-2 not present")
def test_real_sst2_matches_its_readme():
    d = Data(spec("stanfordnlp/sst2", mirror=str(SST2)), SST2)
    assert len(d.train_full) == 67349 and len(d.eval) == 872
    assert set(np.unique(d.eval.labels)) == {0, 1}


def test_eval_rows_seen_in_training_are_measured_and_reported(tmp_path):
    train = [(f"training sentence {i}", i % 2) for i in range(40)]
    dev = train[:3] + [(f"held out sentence {i}", i % 2) for i in range(7)]
    d = Data(spec(folder(tmp_path, train, [(t.upper() + "  ", y) for t, y in dev[:3]] + dev[3:])), tmp_path)
    assert d.overlap == {"eval_rows_in_train": 3, "eval_rows": 10, "share": 0.3}  # case and spacing blind
    assert d.describe()["overlap"]["eval_rows_in_train"] == 3
    assert any("3 of 10 eval rows (30.0%)" in n for n in d.notes)


@pytest.mark.parametrize("layout", ["dev_is_a_copy", "one_file"])
def test_an_eval_split_made_of_training_rows_is_an_error(tmp_path, layout):
    rows = synthetic_rows(50, 0)
    if layout == "one_file":
        dataset = write_tsv(tmp_path / "all.tsv", rows)
    else:
        dataset = folder(tmp_path, rows, rows[:20])
    with pytest.raises(DataError, match="every eval row also appears in the training split") as exc:
        Data(spec(dataset), tmp_path)
    assert ("one file serves as both splits" in str(exc.value)) is (layout == "one_file")


@pytest.mark.parametrize("label", ["¹", "--1", "٣", "1_0", "+-1"])
def test_labels_are_ascii_integers(tmp_path, label):
    folder(tmp_path, [("a", 0), ("b", 1), ("c", label)], [("x", 0), ("y", 1)])
    with pytest.raises(DataError, match="row 3.*not an integer"):
        Data(spec(tmp_path), tmp_path)


def test_holdout_carves_whole_sentences_and_every_phrase_of_them(tmp_path):
    # Treebank layout: each sentence, then phrases of it, as rows of their own.
    sentences = [f"film {i} is a truly remarkable piece of work" for i in range(40)]
    rows = []
    for i, s in enumerate(sentences):
        w = s.split()
        rows += [(s, i % 2), (" ".join(w[2:]), i % 2), (" ".join(w[:2]), 1), ("work", 1)]
    from compress.recipe.schema import HoldoutSpec

    dev = [(f"an unseen sentence {i}", i % 2) for i in range(5)]
    d = Data(spec(folder(tmp_path, rows, dev), holdout=HoldoutSpec(calibration=6, check=10)), tmp_path)
    cal, check = d.holdout_calibration, d.holdout_check
    assert len(cal) == 6 and len(check) == 10
    assert set(cal.texts) | set(check.texts) <= set(sentences)  # whole sentences only, never a phrase
    assert not set(cal.texts) & set(check.texts)
    trained = set(d.train_pool(None).texts)
    for s in cal.texts + check.texts:
        w = s.split()
        assert s not in trained and " ".join(w[:2]) not in trained  # no phrase of a held-out sentence
    assert "work" not in trained  # a span of a held-out sentence, however common
    assert d.calibration(4).texts == cal.texts[:4] and len(d.calibration(100)) == 6
    assert d.describe()["holdout_check"] == 10
    # The split as a whole (e.g. trim_vocab's corpus) leaves them out too, and keeps the rest.
    unheld = set(d.train_unheld.texts)
    assert not unheld & (set(cal.texts) | set(check.texts)) and "work" not in unheld
    assert unheld == {t for t, _ in rows} - set(cal.texts) - set(check.texts) - {"work"} - {
        " ".join(s.split()[k]) for s in cal.texts + check.texts for k in (slice(2, None), slice(None, 2))}
    # Whole sentences for augmentation: the rows no other row contains (held-out ones included:
    # a copy is only made of a sentence that is among the training examples).
    assert d.sentences == frozenset(sentences)


def test_holdout_changes_the_training_fingerprint_only_when_set(tmp_path):
    from compress.recipe.schema import HoldoutSpec

    rows = [(f"sentence number {i}", i % 2) for i in range(60)]
    root = folder(tmp_path, rows, [(f"an unseen sentence {i}", i % 2) for i in range(5)])
    plain = Data(spec(root), tmp_path)
    assert plain.holdout_check is None
    held = Data(spec(root, holdout=HoldoutSpec(check=5)), tmp_path)
    assert held.train_fingerprint != plain.train_fingerprint and len(held.holdout_check) == 5
    assert len(held.train) == 55


# --- Labels: class names, label_names, a head used as it is -----------------------------------

def named(tmp_path, train, dev, suffix=".csv"):
    for name, rows in (("train", train), ("dev", dev)):
        (tmp_path / f"{name}{suffix}").write_text("sentence,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return tmp_path


def test_class_names_become_ids_in_sorted_order(tmp_path):
    d = Data(spec(named(tmp_path, [("a", "positive"), ("b", "negative"), ("c", "positive")], [("d", "negative")])),
             tmp_path)
    assert d.num_labels == 2 and d.label_names == ["negative", "positive"]
    assert d.train_full.labels.tolist() == [1, 0, 1] and d.eval.labels.dtype == np.int64
    assert d.id2label == {0: "negative", 1: "positive"} and d.describe()["label_names"] == ["negative", "positive"]


def test_label_names_order_named_labels_and_name_integer_ones(tmp_path):
    rows = [("a", "positive"), ("b", "negative")]
    d = Data(spec(named(tmp_path, rows, [("c", "positive")]), label_names=["positive", "negative"]), tmp_path)
    assert d.train_full.labels.tolist() == [0, 1] and d.label_names == ["positive", "negative"]

    ints = tmp_path / "ints"
    ints.mkdir()
    unnamed = Data(spec(folder(ints, [("a", 0), ("b", 1)], [("c", 1)])), ints)
    sst2 = Data(spec(ints, label_names=["negative", "positive"]), ints)
    assert unnamed.label_names is None and unnamed.id2label is None
    assert sst2.id2label == {0: "negative", 1: "positive"} and sst2.train_full.labels.tolist() == [0, 1]
    assert sst2.train_fingerprint != unnamed.train_fingerprint  # renamed classes: the stages re-run
    with pytest.raises(DataError, match=r"train.tsv: row 2: label 1 is out of range 0..0|two or more"):
        Data(spec(ints, num_labels=1), ints)


def test_a_name_outside_label_names_names_its_file_and_row(tmp_path):
    named(tmp_path, [("a", "positive"), ("b", "negative")], [("c", "positive"), ("d", "neutral")])
    with pytest.raises(DataError) as exc:
        Data(spec(tmp_path, label_names=["negative", "positive"]), tmp_path)
    assert "dev.csv: row 2: label 'neutral' is not one of data.label_names" in str(exc.value)


@pytest.mark.parametrize("labels", ["names", "integers"])
def test_an_eval_label_never_seen_in_training_is_the_eval_files_error(tmp_path, labels):
    """26.17: the eval file and its row are named (the old code blamed train.tsv)."""
    if labels == "names":
        named(tmp_path, [("a", "positive"), ("b", "negative")], [("c", "positive"), ("d", "neutral")], ".tsv")
        for f in ("train.tsv", "dev.tsv"):
            (tmp_path / f).write_text((tmp_path / f).read_text().replace(",", "\t"))
    else:
        folder(tmp_path, [("a", 0), ("b", 1)], [("c", 1), ("d", 2)])
    with pytest.raises(DataError) as exc:
        Data(spec(tmp_path), tmp_path)
    msg = str(exc.value)
    assert msg.startswith(str(tmp_path / "dev.tsv") + ": row 2: label ") and "never appears in the training split" in msg
    assert "\n" not in msg


def test_names_and_integers_do_not_mix(tmp_path):
    named(tmp_path, [("a", "positive"), ("b", "1")], [("c", "positive")])
    with pytest.raises(DataError, match=r"train.csv: row 1: label 'positive' is not an integer \(row 2's is"):
        Data(spec(tmp_path), tmp_path)
    named(tmp_path, [("a", "0"), ("b", "1")], [("c", "positive")])
    with pytest.raises(DataError, match=r"dev.csv: row 1: label 'positive' is a class name, but the training split"):
        Data(spec(tmp_path), tmp_path)


def test_a_head_used_as_is_must_have_the_datas_label_count_and_gives_its_names(tmp_path):
    named(tmp_path, [("a", "positive"), ("b", "negative")], [("c", "NEGATIVE")])
    with pytest.raises(DataError, match="the data has 2 classes but the model's classification head has 3"):
        Data(spec(tmp_path), tmp_path, head=["LABEL_0", "LABEL_1", "LABEL_2"])
    # The head's own names give the ids (case-blind): POSITIVE is id 0 here, not sorted order.
    d = Data(spec(tmp_path), tmp_path, head=["POSITIVE", "NEGATIVE"])
    assert d.train_full.labels.tolist() == [0, 1] and d.eval.labels.tolist() == [1]
    assert d.label_names == ["POSITIVE", "NEGATIVE"]
    with pytest.raises(DataError, match="differ from the model's own id2label"):
        Data(spec(tmp_path, label_names=["negative", "positive"]), tmp_path, head=["POSITIVE", "NEGATIVE"])
    unnamed = Data(spec(tmp_path), tmp_path, head=["LABEL_0", "LABEL_1"])  # names nothing: sorted
    assert unnamed.label_names == ["negative", "positive"]


def test_hub_dataset_config_and_revision_reach_load_dataset(tmp_path, monkeypatch):
    import datasets
    import pandas as pd

    seen = {}

    class Fake:
        features = {"label": datasets.ClassLabel(names=["entailment", "neutral", "contradiction"])}

        def __init__(self, split):
            self.split = split

        def to_pandas(self):  # other rows in each split: an eval split of training rows is refused
            return pd.DataFrame({"premise": [f"{self.split} {t}" for t in "abc"], "hypothesis": ["x", "y", "z"],
                                 "label": [0, 1, 2]})

    def load_dataset(path, name=None, split=None, revision=None):
        seen[split] = (path, name, revision)
        return Fake(split)

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("COMPRESS_DATA_DIR", "")
    s = spec("nyu-mll/glue", config="mnli", revision="abc123", text="premise", text_pair="hypothesis",
             eval_split="validation_matched")
    d = Data(s, tmp_path)
    assert seen == {"train": ("nyu-mll/glue", "mnli", "abc123"), "validation_matched": ("nyu-mll/glue", "mnli", "abc123")}
    assert d.sources["train"] == "hub:nyu-mll/glue/mnli@abc123" and d.describe()["config"] == "mnli"
    assert d.label_names == ["entailment", "neutral", "contradiction"]  # the ClassLabel's names, in its order
    assert d.eval.pairs == ["x", "y", "z"]


def test_a_local_copy_of_a_dataset_configuration(tmp_path, monkeypatch):
    (tmp_path / "glue" / "mnli").mkdir(parents=True)
    (tmp_path / "glue" / "sst2").mkdir(parents=True)
    folder(tmp_path / "glue" / "mnli", [("a", 0), ("b", 1), ("c", 2)], [("d", 2)])
    folder(tmp_path / "glue" / "sst2", [("a", 0), ("b", 1)], [("d", 1)])
    monkeypatch.setenv("COMPRESS_DATA_DIR", str(tmp_path))
    assert Data(spec("nyu-mll/glue", config="mnli"), tmp_path).num_labels == 3
    assert Data(spec("nyu-mll/glue", config="sst2"), tmp_path).num_labels == 2


# --- data.holdout at the edges, and a split file that cannot be read (issue "Hostile inputs,
# third round", items 4 and 8) ------------------------------------------------------------

def _reference_whole_rows(texts):
    """The definition, spelled out (every proper span of every row): for small inputs only."""
    tokens = [" ".join(t.split()) for t in texts]
    spans = set()
    for t in tokens:
        w = t.split()
        for i in range(len(w)):
            for j in range(i + 1, len(w) + 1 - (i == 0)):
                spans.add(" ".join(w[i:j]))
    return [i for i, t in enumerate(tokens) if t and t not in spans]


def test_whole_rows_and_carved_phrases_match_the_definition():
    import random

    from compress.tasks.classification.data import Split, carve_sentences, whole_rows

    rng = random.Random(0)
    words = ["a", "b", "c", "d", "film", "good"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(0, 7))) for _ in range(400)]
    texts += ["a a a a a", "a a", "  a   b  ", "a b"]  # repeats, odd spacing, duplicates
    assert whole_rows(texts).tolist() == _reference_whole_rows(texts)
    split = Split(texts, None, np.zeros(len(texts), dtype=np.int64))
    picked, dropped = carve_sentences(split, 30, seed=3)
    inside = set()
    for i in picked:
        w = texts[i].split()
        inside |= {" ".join(w[a:b]) for a in range(len(w)) for b in range(a + 1, len(w) + 1)}
    assert dropped.tolist() == [i for i, t in enumerate(texts) if " ".join(t.split()) in inside]


def test_the_phrase_search_is_linear_in_the_data():
    """A 3,000-word row has 4.5 million spans, a 100k-row split 100k rows to match: neither
    may stall the run before its first stage (the spans are never spelled out)."""
    import signal
    import time

    from compress.tasks.classification.data import Split, carve_sentences, whole_rows

    def too_slow(*_):
        raise TimeoutError("the phrase search stalled")

    long_row = " ".join(f"w{i % 700}" for i in range(3000))
    many = [f"row {i} says {i % 97} of {i % 13}" for i in range(100_000)]
    old = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(180)  # the test fails rather than hangs the suite
    try:
        start = time.perf_counter()
        texts = [long_row, long_row[: len(long_row) // 2], "w1 w2 w3"] + many
        whole = whole_rows(texts)
        picked, dropped = carve_sentences(Split(texts, None, np.zeros(len(texts), dtype=np.int64)), 500, seed=0)
        seconds = time.perf_counter() - start
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert 0 in whole and 1 not in whole and 2 not in whole  # the half and the three words are spans of the row
    assert len(picked) == 500 and len(dropped) >= 500
    assert seconds < 60, f"{seconds:.1f}s"  # ~2 s unloaded; spelling out the 3,000-word row's spans took minutes and tens of GB


def test_a_holdout_that_takes_too_much_of_the_training_split_is_refused_with_the_counts(tmp_path):
    from compress.recipe.schema import HoldoutSpec

    dev = [(f"an unseen sentence {i}", i % 2) for i in range(5)]
    rows = [(f"sentence number {i}", i % 2) for i in range(20)]
    root = folder(tmp_path, rows, dev)
    with pytest.raises(DataError) as exc:  # all 20 rows: none left to train on
        Data(spec(root, holdout=HoldoutSpec(calibration=10, check=10)), tmp_path)
    assert "takes 20 of the 20 training rows" in str(exc.value) and "leaving none" in str(exc.value)
    with pytest.raises(DataError) as exc:  # 16 of 20 rows: more than the share allowed
        Data(spec(root, holdout=HoldoutSpec(calibration=8, check=8)), tmp_path)
    assert "16 of the 20 training rows (80%)" in str(exc.value) and "data.holdout" in str(exc.value)
    with pytest.raises(DataError) as exc:  # more sentences asked for than the split has
        Data(spec(root, holdout=HoldoutSpec(check=25)), tmp_path)
    assert "asks for 25 whole sentences" in str(exc.value) and "only 20" in str(exc.value)
    assert len(Data(spec(root, holdout=HoldoutSpec(calibration=5, check=5)), tmp_path).train) == 10


@pytest.mark.parametrize("kind", ["loop", "dangling", "folder"])
def test_a_split_file_that_cannot_be_read_says_why(tmp_path, kind):
    folder(tmp_path, synthetic_rows(20, 0), synthetic_rows(5, 1))
    dev = tmp_path / "dev.tsv"
    dev.unlink()
    if kind == "loop":
        dev.symlink_to(dev)
    elif kind == "dangling":
        dev.symlink_to(tmp_path / "gone.tsv")
    else:
        dev.mkdir()
    with pytest.raises(DataError) as exc:
        Data(spec(tmp_path), tmp_path)
    message = str(exc.value)
    assert "no file for split" not in message and "dev.tsv" in message
    assert {"loop": "symlink loop", "dangling": "does not exist", "folder": "not a regular file"}[kind] in message
