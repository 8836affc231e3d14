"""The models' library, one package imported the same way everywhere: `from model_library import model_errors`.

Inside Triton, build/export.py installs this package whole (but in_process.py) into each Python model's version
folder (LIBRARY in exporter/repository.py), which Triton's stub puts on sys.path: a mounted repository runs
with nothing beside it. Outside Triton (the launcher, the bulk client, the bench, the tests) it is the checkout's
folder (`make setup` installs the project in editable mode). So no model edits sys.path, and a process holds one
module object per file.
"""
