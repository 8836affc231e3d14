"""The models' library, as everything outside Triton imports it: `from model_library import model_errors` (the
launcher, the bulk client, the bench, the tests; `make setup` installs the project in editable mode).

Inside Triton there is no such package: build/export.py copies these files beside each Python model's model.py
(MODEL_CODE in build/exporting/repository.py), where the model imports them top-level (`import model_errors`).
So these files import each other top-level too (model_common.py imports model_errors) and never `model_library.`:
they must work as copies beside a model. in_process.py (never installed) runs a model's code outside Triton, with
the library's top-level names importable as they are beside a model.
"""
