"""No export serves weights its checkpoint does not hold. A folder whose weights do not fit the class transformers
loads for it (its state dict named for the checkpoint's own code, a renamed or missing tensor) loads anyway, the
missing weights randomly initialized, and the reference check cannot see it: the reference loads the same class
from the same folder. So every transformers load of the export is recorded with transformers' own loading report
(missing, unexpected and mismatched keys, after its rules: tied weights, position-id buffers, the keys a class says
to ignore), whoever loads it (the families' code, sentence-transformers, FlagEmbedding), and before anything is
traced the graph is checked: a weight it reads that was not loaded stops the export in one line naming those weights
and the checkpoint's weights the class had no place for.

Which missing weights are read is decided by the graph itself, not by names: the parameters its outputs depend on
(autograd, on a sample batch), plus those it holds copies of (`copied_weights`: the yes/no reranker's two rows of
the LM head). A weight the served outputs never use may be missing (a BERT pooler that sentence-transformers never
applies); a missing buffer is the model's own code's (rotary frequencies, position ids), never the checkpoint's.
Unexpected weights alone (the MLM head of a checkpoint served as an encoder) are not refused: the class computes
what it computes without them, as the checkpoint's own class does."""
import weakref

from . import fail

SHOWN = 3  # weights named in the one-line refusal, then a count
_LOADS = []  # (the model (weak), the folder, its LoadStateDictInfo): every transformers load since record()


def record():
    """Keep the loading report of every transformers model loaded from now on. transformers 5 hands each
    from_pretrained's report to modeling_utils.log_state_dict_report, which logs it as a table and raises, with a
    traceback, on a size mismatch, a load error or a failed conversion: wrapped here, those stop the export in one
    line, and the table is not logged (check() says in one line what of it matters)."""
    import logging

    from transformers import modeling_utils

    report = getattr(modeling_utils, "log_state_dict_report", None)
    if report is None:
        fail("this transformers has no loading report (modeling_utils.log_state_dict_report): the export cannot "
             "tell whether a checkpoint's weights were all loaded")
    if getattr(report, "recording", False):
        return
    quiet = logging.getLogger(f"{__name__}.load_report")
    quiet.setLevel(logging.ERROR)  # the report's table is a warning

    def recorded(model, pretrained_model_name_or_path, ignore_mismatched_sizes, loading_info, logger=None):
        _LOADS.append((weakref.ref(model), str(pretrained_model_name_or_path), loading_info))
        name = type(model).__name__
        problems = loading_info.error_msgs or [f"{key}: {error}" for key, error in
                                               (loading_info.conversion_errors or {}).items()]
        if problems:
            fail(f"{name} cannot load {pretrained_model_name_or_path}: "
                 f"{' '.join(' '.join(problems).split())[:300]}")
        if loading_info.mismatched_keys and not ignore_mismatched_sizes:
            shown = sorted(loading_info.mismatched_keys)[:SHOWN]
            fail(f"{name} cannot load {pretrained_model_name_or_path}: {len(loading_info.mismatched_keys)} "
                 f"weight(s) of another shape in the checkpoint ("
                 f"{', '.join(f'{key} {tuple(theirs)} for {tuple(ours)}' for key, theirs, ours in shown)}): its "
                 f"config.json does not describe its weights")
        return report(model=model, pretrained_model_name_or_path=pretrained_model_name_or_path,
                      ignore_mismatched_sizes=ignore_mismatched_sizes, loading_info=loading_info, logger=quiet)

    recorded.recording = True
    modeling_utils.log_state_dict_report = recorded


def sample(tokenizer, pairs=False):
    """For check(): what makes a two-row batch (input_ids, attention_mask) of texts, or of (query, passage) pairs
    (made only when a weight is missing)."""
    texts = (["export sample", "a query"], ["a passage", "a second, longer export passage"]) if pairs else \
        (["export sample", "a second, longer export sample"],)

    def make():
        batch = tokenizer(*texts, padding=True, return_tensors="pt")
        return batch["input_ids"], batch["attention_mask"]

    return make


def named(keys):
    keys = sorted(keys)
    more = f" and {len(keys) - SHOWN} more" if len(keys) > SHOWN else ""
    return f"{', '.join(keys[:SHOWN])}{more}"


def check(*runs):
    """runs: (module, make inputs) pairs, the graph's modules with what makes a sample batch for each (a function of
    no arguments). Stops the export if their outputs read (or they copied) a parameter of a recorded model that its
    checkpoint did not hold."""
    import torch

    unloaded = {}  # id(parameter): (parameter, model class, folder, key, report)
    for model_ref, folder, info in _LOADS:
        model = model_ref()
        if model is None:
            continue
        for key in info.missing_and_mismatched():
            try:
                parameter = model.get_parameter(key)
            except AttributeError:  # a buffer: the model's code makes it, the checkpoint never held its values
                continue
            unloaded.setdefault(id(parameter), (parameter, type(model).__name__, folder, key, info))
    if not unloaded:
        return
    parameters = [entry[0] for entry in unloaded.values()]
    copied = {id(p) for module, _ in runs for part in module.modules() for p in getattr(part, "copied_weights", ())}
    wanted = [p.requires_grad for p in parameters]
    try:
        for parameter in parameters:
            parameter.requires_grad_(True)
        with torch.enable_grad():
            total = None
            for module, make_inputs in runs:
                outputs = module(*make_inputs())
                for output in outputs if isinstance(outputs, (tuple, list)) else (outputs,):
                    if torch.is_tensor(output) and output.is_floating_point() and output.requires_grad:
                        total = output.float().sum() if total is None else total + output.float().sum()
            grads = (torch.autograd.grad(total, parameters, allow_unused=True) if total is not None
                     else [None] * len(parameters))
    finally:
        for parameter, flag in zip(parameters, wanted):
            parameter.requires_grad_(flag)
    read = [unloaded[id(p)] for p, grad in zip(parameters, grads) if grad is not None or id(p) in copied]
    if not read:
        return
    _, name, folder, _, info = read[0]
    keys = [key for _, other, _, key, _ in read if other == name]
    unexpected = (f"; the checkpoint holds {len(info.unexpected_keys)} weight(s) {name} has no place for "
                  f"({named(info.unexpected_keys)})") if info.unexpected_keys else ""
    fail(f"{name} loads {folder} without {len(keys)} weight(s) the served graph reads ({named(keys)}): they would "
         f"be served randomly initialized{unexpected}. Its weights are not this class's (named for the "
         f"checkpoint's own code, or renamed): nothing exported")
