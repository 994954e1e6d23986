"""compress: turn a trained transformer (a text classifier or a causal LM) into deployable
compressed variants, benchmark every variant the same way, and pick the one to ship.

The package reads bottom-up: each folder below is a layer, and a module imports only its own
layer or lower ones (tests/test_layers.py checks every import against this order).

    core        errors, output, the stage and task types and their catalogues (as data)
    recipe      the validated recipe; facts read from a model's files without loading it
    data        where models come from, the run folder's stage store, what a stage sees
    formats     loading and calling each artifact format
    techniques  training, distillation, batched prediction, parity, the classifier pipeline
    stages      one module per stage kind: a config, a typed result and run(ctx)
    bench       the typed benchmark job and measurement, the worker process, its cache
    serving     a variant behind Ray Serve, the load LoadGen drives at it, the capacity plan
    decision    rows, budget checks, the quality gate, the selected variant
    reports     report.json's records and every rendering of them
    run         the plan, the executor, `compress init`
    cli         the command line

`tasks/` is a column through those layers, one folder per task: each of its modules sits in
the layer its file name says (compress/tasks/__init__.py), so everything a task owns (its
recipe block, data, scoring, timing) lives in one folder.
"""

__version__ = "0.1.0"

# Bottom -> top: the layer folders of this package (tests/test_layers.py reads them).
LAYERS = ("core", "recipe", "data", "formats", "techniques", "stages", "bench", "serving", "decision", "reports", "run", "cli")
