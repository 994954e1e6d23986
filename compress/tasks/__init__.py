"""Tasks, one folder each: everything a task owns, from its recipe block to its scoring.

A task folder is a column through the layers of compress/ (see compress/__init__.py): each
module in it sits in the layer that its file name maps to below, so that the recipe can
read a task's records and the benchmark its scoring without a lower layer importing a
higher one. The interface every task implements, and the catalogue of tasks, are in
compress/core/task.py.

    classification/  data.py (the recipe's `data` block read: splits, labels, held-out
                     sentences), task.py (accuracy, the batched forward pass timed)
    causal_lm/       records.py (the `lm` block and the typed measurement records),
                     gguf.py (GGUF files found and converted), data.py (the eval files),
                     task.py (perplexity, log-likelihoods, generation), timing.py,
                     memory_plan.py, export.py (ONNX export and weight-only quantization),
                     gguf_quant.py (GGUF variants through llama.cpp's quantizer),
                     roofline.py (decode and prefill against the machine's limits)
"""

# module file name in a task folder -> the layer (a folder name in compress.LAYERS) it sits in
COLUMN: dict[str, str] = {
    "records": "recipe",      # pydantic records only: the recipe and the reports read them
    "gguf": "recipe",         # model-file facts read at validation (peek) and by sources
    "data": "data",           # the task's eval and training files, read and checked
    "task": "techniques",     # the Task object: scoring and the timed workload
    "timing": "techniques",
    "memory_plan": "techniques",
    "export": "techniques",   # used by stages
    "gguf_quant": "techniques",
    "roofline": "techniques",  # the machine's limits measured; each row's fraction of them  # llama.cpp's quantizer, the importance matrix, the type mix (stages)
}
