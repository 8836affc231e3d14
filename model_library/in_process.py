"""Running the Python models' own code outside Triton (unit tests and benchmarks): import_python_model (a model's
model.py with a stand-in triton_python_backend_utils) and model_module (a module of a model's folder, e.g. the
proxy's http_front.app).

Inside Triton, a model's version folder is on sys.path (the stub puts it there): its own modules import top-level
(`import grouping`, `from http_front import app`) and the library as a package (`from model_library import
model_errors`, export's copy beside them). Outside Triton the library is the checkout's package, and beside_a_model
puts the model's source folder on sys.path as the stub does; the one place that edits sys.path.

Never installed into the serving repository."""
import contextlib
import importlib
import importlib.util
import os
import sys
import types

MODEL_LIBRARY = os.path.dirname(os.path.abspath(__file__))
MODEL_SOURCE = os.path.join(os.path.dirname(MODEL_LIBRARY), "model_source")
COMMON = "model_library.model_common"


def beside_a_model(folder):
    """sys.path as a model's code sees it inside Triton: `folder` (a model's code folder, e.g. model_source/proxy/1)
    on it, so its own modules import top-level."""
    if folder not in sys.path:
        sys.path.append(folder)


@contextlib.contextmanager
def no_bytecode():
    """Imports that write no __pycache__ beside the source: model_source/ holds only tracked files."""
    before, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        yield
    finally:
        sys.dont_write_bytecode = before


def model_module(model, name):
    """Module `name` of model_source/<model>/1 (`model_module("proxy", "http_front.app")`), imported as the model
    imports it inside Triton, with its folder's modules and the library importable beside it (beside_a_model)."""
    beside_a_model(os.path.join(MODEL_SOURCE, model, "1"))
    with no_bytecode():
        return importlib.import_module(name)


def forget_model_common():
    """The next `from model_library import model_common` imports it afresh (binding the stand-in of the moment): out
    of sys.modules and off the package, where `from ... import` would find it first."""
    sys.modules.pop(COMMON, None)
    package = sys.modules.get("model_library")
    if package is not None and hasattr(package, "model_common"):
        delattr(package, "model_common")


def import_python_model(path, module_name, **fake_attributes):
    """A Python model's code (the file at `path`) imported with a stand-in triton_python_backend_utils holding
    `fake_attributes`, which leaves sys.modules again afterwards (benchmarks and unit tests run the models' own code
    in-process)."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.__dict__.update(fake_attributes)
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = fake
    # model_common imported afresh, so that it binds this fake
    beside_a_model(os.path.dirname(os.path.abspath(path)))
    forget_model_common()
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        with no_bytecode():
            spec.loader.exec_module(module)
    finally:
        forget_model_common()
        if saved is None:
            del sys.modules["triton_python_backend_utils"]
        else:
            sys.modules["triton_python_backend_utils"] = saved
    return module
