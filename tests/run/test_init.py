import yaml

from compress.run import init as init_mod
from compress.recipe.schema import load_recipe


def test_init_writes_a_commented_recipe_that_validates(tiny_checkpoint, tiny_data, tmp_path, cli, monkeypatch):
    monkeypatch.setattr(init_mod, "machine", lambda: {"cores": 2, "gpu": False})
    out = tmp_path / "sub" / "starter.yaml"
    code, stdout, err = cli("init", "--model", tiny_checkpoint, "--dataset", tiny_data, "--output", out)
    assert code == 0, err
    text = out.read_text()
    assert text.count("\n  # ") >= 2 and "# " in text.splitlines()[0]  # commented
    code, stdout, err = cli("validate", out)
    assert code == 0, err
    recipe = load_recipe(out)
    ids = [s.id for s in recipe.stages]
    assert ids[:2] == ["baseline", "int8"]  # a checkpoint needs a fine-tuned baseline
    assert recipe.stage("baseline").uses == "finetune"
    assert recipe.budget.baseline == "baseline"
    assert recipe.benchmark.devices == ["cpu"] and recipe.benchmark.threads == 2
    # paths are relative to the recipe's folder, so the recipe can move with its data
    raw = yaml.safe_load(text)
    assert not raw["data"]["dataset"].startswith("/") and raw["name"] == "starter"


def test_optional_stages_only_when_registered(tiny_checkpoint, tiny_data, tmp_path, monkeypatch):
    from compress.core.registry import registry

    STAGES = registry()  # the registry's own dict: a change to it is seen by get_stage

    monkeypatch.setattr(init_mod, "machine", lambda: {"cores": 2, "gpu": False})
    text = init_mod.build(str(tiny_checkpoint), str(tiny_data), "sentence", "label", tmp_path / "a.yaml")
    with_all = {s["uses"] for s in yaml.safe_load(text)["stages"]}
    for name in ("distill", "prune", "export_onnx", "quantize_onnx"):
        assert (name in with_all) == (name in STAGES)
    for name in ("distill", "export_onnx"):
        monkeypatch.delitem(STAGES, name, raising=False)
    text = init_mod.build(str(tiny_checkpoint), str(tiny_data), "sentence", "label", tmp_path / "b.yaml")
    uses = {s["uses"] for s in yaml.safe_load(text)["stages"]}
    assert "distill" not in uses and "export_onnx" not in uses
    assert "quantize_onnx" not in uses  # its input stage is gone
    (tmp_path / "b.yaml").write_text(text)
    load_recipe(tmp_path / "b.yaml")


def test_a_classifier_is_its_own_baseline(tiny_classifier, tiny_data, tmp_path):
    text = init_mod.build(str(tiny_classifier), str(tiny_data), "sentence", "label", tmp_path / "r.yaml",
                          mach={"cores": 2, "gpu": False})
    raw = yaml.safe_load(text)
    assert "finetune" not in {s["uses"] for s in raw["stages"]}
    assert raw["budget"]["baseline"] == "model" and raw["stages"][0]["from"] == "model"


def test_wrong_column_is_a_one_line_error_naming_the_columns(tiny_checkpoint, tiny_data, tmp_path, cli):
    code, out, err = cli("init", "--model", tiny_checkpoint, "--dataset", tiny_data, "--text", "review",
                         "--output", tmp_path / "r.yaml")
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 or "missing column" in " ".join(lines)
    msg = " ".join(lines)
    assert "'review'" in msg and "sentence" in msg and "label" in msg and "--text" in msg
    assert not (tmp_path / "r.yaml").exists()


def test_existing_file_is_not_overwritten(tiny_checkpoint, tiny_data, tmp_path, cli):
    out = tmp_path / "r.yaml"
    out.write_text("keep")
    code, _, err = cli("init", "--model", tiny_checkpoint, "--dataset", tiny_data, "--output", out)
    assert code == 2 and "--force" in err and out.read_text() == "keep"


def test_sizes_follow_the_machine():
    small = init_mod.sizes(67_000, {"cores": 2, "gpu": False})
    big = init_mod.sizes(67_000, {"cores": 32, "gpu": False})
    gpu = init_mod.sizes(67_000, {"cores": 8, "gpu": True})
    assert small["max_train_examples"] < big["max_train_examples"]
    assert gpu["max_train_examples"] is None and gpu["devices"] == ["cpu", "cuda"]
    assert small["threads"] == 2 and big["threads"] <= 32
    assert init_mod.sizes(500, {"cores": 2, "gpu": False})["max_train_examples"] is None  # all of a small set


def test_token_length_estimate():
    assert init_mod.token_length(["a b c"] * 100, None) == 32
    assert init_mod.token_length([" ".join(["w"] * 200)] * 100, None) == 288
    assert init_mod.token_length([" ".join(["w"] * 1000)], None) == 512


def _pairs(folder, first="premise", second="hypothesis"):
    folder.mkdir()
    for name, n in (("train", 40), ("dev", 8)):
        rows = "".join(f"the {name} film {i} was fine\tit was {'good' if i % 2 else 'bad'}\t"
                       f"{'entailment' if i % 2 else 'contradiction'}\n" for i in range(n))
        (folder / f"{name}.tsv").write_text(f"{first}\t{second}\tlabel\n" + rows)
    return folder


def test_init_learns_text_pairs(tiny_checkpoint, tmp_path, cli, monkeypatch):
    monkeypatch.setattr(init_mod, "machine", lambda: {"cores": 2, "gpu": False})
    data = _pairs(tmp_path / "nli")
    out = tmp_path / "nli.yaml"
    code, _, err = cli("init", "--model", tiny_checkpoint, "--dataset", data, "--output", out)
    assert code == 0, err  # premise/hypothesis found without being named
    recipe = load_recipe(out)
    assert (recipe.data.text, recipe.data.text_pair) == ("premise", "hypothesis")
    assert recipe.data.label_names == ["contradiction", "entailment"]

    other = _pairs(tmp_path / "qa", "query", "passage")
    out = tmp_path / "qa.yaml"
    code, _, err = cli("init", "--model", tiny_checkpoint, "--dataset", other, "--output", out,
                       "--text", "query", "--text-pair", "passage")
    assert code == 0, err
    assert load_recipe(out).data.text_pair == "passage"
    code, _, err = cli("init", "--model", tiny_checkpoint, "--dataset", other, "--output", tmp_path / "x.yaml")
    assert code == 2 and "missing column 'sentence'" in err and "--text-pair" in err


def test_a_classifier_with_another_label_count_gets_a_finetune_stage(tiny_classifier, tmp_path):
    data = tmp_path / "three"
    data.mkdir()
    for name in ("train", "dev"):
        (data / f"{name}.tsv").write_text("sentence\tlabel\n" + "".join(
            f"{name} sentence {i}\t{('bad', 'so-so', 'good')[i % 3]}\n" for i in range(30)))
    text = init_mod.build(str(tiny_classifier), str(data), "sentence", "label", tmp_path / "r.yaml",
                          mach={"cores": 2, "gpu": False})
    raw = yaml.safe_load(text)
    assert raw["stages"][0]["uses"] == "finetune" and raw["budget"]["baseline"] == "baseline"
    assert "head has 2 labels, the data 3" in text
