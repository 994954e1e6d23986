"""`compress load` and the load step of `compress run`: the run's variant served in each
configuration and measured with LoadGen (compress/serving/measure.py), the capacity and
cost plan made from the figures (compress/serving/plan.py), and both written into the run
folder (serving/serving.json, report.json's `serving` block, report.md, report.html).

With `budget.objective: min_monthly_cost` the decision is made on the plan: a stand-in
decision on $/1K picks the variant to serve, the served variants' rows get their $/month
at the SLO (`usd_per_month`), and the decision is made again on that figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from compress.core.console import log as default_log
from compress.core.errors import CompressError
from compress.core.files import real_folder, write_file

if TYPE_CHECKING:  # pragma: no cover
    from compress.decision.decide import Decision, Row
    from compress.recipe.schema import Recipe
    from compress.reports.report_json import Report
    from compress.serving.measure import Served
    from compress.serving.records import ServingReport

STAND_IN = "min_cost"  # the objective that picks the variant to serve when the real one needs the load


def served_variants(recipe: "Recipe", variant: str, rows: "list[Row]") -> "Served":
    """The variant to serve, the run's cascade and the baseline's ONNX export (each only
    where the run measured it)."""
    from compress.serving.measure import Served

    ok = {r.id for r in rows if r.ok}
    cascade = next((s.id for s in recipe.stages if s.uses == "cascade" and s.id in ok), None)
    reference = next((s.id for s in recipe.stages if s.uses == "export_onnx" and s.source == recipe.budget.baseline
                      and s.id in ok), None)
    return Served(variant=variant, cascade=cascade, reference=reference)


def stand_in_policy(policy):
    """The policy that picks the variant to serve: min_monthly_cost needs the load first."""
    if policy.budget.objective != "min_monthly_cost":
        return policy
    return policy.model_copy(update={"budget": policy.budget.model_copy(update={"objective": STAND_IN})})


def measure_and_plan(recipe: "Recipe", run_dir: Path, texts: list[str], served: "Served",
                     log: Callable[[str], None] = default_log) -> "ServingReport":
    """Serves and measures every configuration on the recipe's traffic, makes the plan,
    writes serving/serving.json; returns the block for report.json."""
    from compress.serving.load import queries_for
    from compress.serving.measure import SERVING_DIR, SERVING_JSON, measure
    from compress.serving.plan import cost_plan, describe
    from compress.serving.records import ServingReport
    from compress.serving.traffic import traffic_from_spec

    spec = recipe.serving
    if spec is None:
        raise CompressError(f"{recipe.path or 'the recipe'}: no `serving:` block, so nothing to load; add one "
                            f"(recipes/bert_sentiment.yaml has an example)")
    traffic = traffic_from_spec(spec.traffic, texts, recipe.base_dir)
    log(traffic.describe(queries_for(spec.load.start_qps, spec.load)) + " (in the first run)")
    serving = measure(run_dir, spec, served, traffic, log=log)
    serving.plan = cost_plan(serving.configs, spec.traffic, spec.pricing)
    t = serving.traffic
    if t.duplicate_share_sent is not None:
        log(f"load: {t.requests} requests per configuration, {t.duplicate_share_sent:.1%} of them repeats"
            + (f" ({t.duplicate_share_theory:.1%} expected)" if t.duplicate_share_theory is not None else ""))
    for c in serving.configs:
        if c.server is not None and c.server.cache_hit_rate is not None:
            log(f"load: {c.name}: cache hit rate {c.server.cache_hit_rate:.1%} against "
                f"{c.duplicate_share_sent or 0:.1%} repeats sent")
    for line in describe(serving.plan):
        log(line)
    # Validated again from a full dump: report.json is written without unset fields, and
    # lists filled after construction would count as unset.
    serving = ServingReport.model_validate(serving.model_dump(mode="json"))
    write_file(real_folder(run_dir / SERVING_DIR) / SERVING_JSON, serving.model_dump_json(indent=1))
    return serving


def attach(rows: "list[Row]", serving: "ServingReport", device: str) -> None:
    """Each served variant's row on the deciding device gets its plan's $/month (and a row
    not served this time loses a figure from an earlier load)."""
    for r in rows:
        if r.device == device:
            cost = serving.monthly_cost(r.id)
            if cost is not None or r.usd_per_month is not None:
                r.usd_per_month = cost


def load_run(recipe: "Recipe", run_dir: Path, variant: str | None = None,
             log: Callable[[str], None] = default_log) -> "Report":
    """`compress load RUN_DIR`: the finished run's selected variant (or `variant`) under load;
    report.json gains its `serving` block (schema 7) and the reports are rendered again."""
    from compress.decision.decide import Policy, decide
    from compress.reports.render import write_reports
    from compress.reports.report_json import SCHEMA_VERSION, read_report
    from compress.tasks.classification.data import Data

    report = read_report(run_dir)
    if recipe.data is None:
        raise CompressError("compress load serves classifiers: the recipe has no `data` block to draw texts from")
    policy = Policy(budget=report.budget, benchmark=recipe.benchmark, task=recipe.task)
    chosen = variant or report.decision.selected
    if chosen is None and report.budget.objective == "min_monthly_cost":
        chosen = decide([r.model_copy() for r in report.rows], stand_in_policy(policy), report.devices).selected
    if chosen is None:
        raise CompressError(f"{run_dir}: the run selected no variant (none met the budget); give --variant ID to "
                            f"load one anyway")
    if not any(r.id == chosen and r.ok for r in report.rows):
        known = ", ".join(sorted({r.id for r in report.rows if r.ok}))
        raise CompressError(f"--variant: no measured variant '{chosen}' in {run_dir} (known: {known})")
    data = Data(recipe.data, recipe.base_dir)
    if data.eval.pairs is not None:
        raise CompressError("compress load sends one text a request; this recipe's data are text pairs")
    serving = measure_and_plan(recipe, run_dir, data.eval.texts, served_variants(recipe, chosen, report.rows), log)
    attach(report.rows, serving, report.decision.device)
    report.serving = serving
    report.schema_version = SCHEMA_VERSION
    if report.budget.objective == "min_monthly_cost":
        report.decision = redecide(report.rows, policy, report.devices, len(data.eval))
    write_reports(report, run_dir)
    return report


def redecide(rows: "list[Row]", policy, devices: list[str], eval_examples: int | None) -> "Decision":
    from compress.decision.decide import decide

    d = decide(rows, policy, devices, eval_examples=eval_examples)
    d.notes.append("min_monthly_cost: decided on each served variant's $/month at the serving SLO (report.json "
                   "`serving.plan`); variants not served under load have no such figure")
    return d
