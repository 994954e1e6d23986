import numpy as np
import pytest

from compress.data import Data
from compress.errors import DataError
from compress.recipe import DataSpec
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
