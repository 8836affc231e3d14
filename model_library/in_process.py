"""Running the Python models' own code outside Triton (unit tests and benchmarks): import_python_model (a model's
model.py with a stand-in triton_python_backend_utils) and model_module (a module of a model's folder, e.g. the
proxy's http_front.app).

The one place outside the model folders that edits sys.path (beside_a_model). Inside Triton, a model's folder of the
serving repository holds its code and export's copies of this library, and its model.py puts that folder on sys.path:
its modules import the library top-level (`import model_errors`), the proxy its package (`from http_front import
app`). Outside Triton the same code needs the same names: the model's folder in model_source/ (which holds no copies
of the library) and this library's folder. Everything else imports the project's packages (`from model_library
import model_errors`: the editable install, pyproject.toml).

Not installed into the serving repository (export installs model_common.py, model_errors.py, model_outputs.py,
request_rules.py, tracing.py and triton_server.py beside the models)."""
import contextlib
import importlib
import importlib.util
import os
import sys
import types

MODEL_LIBRARY = os.path.dirname(os.path.abspath(__file__))
MODEL_SOURCE = os.path.join(os.path.dirname(MODEL_LIBRARY), "model_source")


def beside_a_model(folder=None):
    """sys.path as a model's code sees it inside Triton: `folder` (a model's code folder, e.g. model_source/proxy/1)
    and this library ahead of everything else, as the model's own insert puts its folder first in Triton."""
    for path in (MODEL_LIBRARY, folder):
        if path and path not in sys.path:
            sys.path.insert(0, path)


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


def import_python_model(path, module_name, **fake_attributes):
    """A Python model's code (the file at `path`) imported with a stand-in triton_python_backend_utils holding
    `fake_attributes`, which leaves sys.modules again afterwards (benchmarks and unit tests run the models' own code
    in-process)."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.__dict__.update(fake_attributes)
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = fake
    # the models' library (export installs it beside model.py), found here for the checkout's code; model_common
    # imported afresh, so that it binds this fake
    beside_a_model()
    sys.modules.pop("model_common", None)
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        with no_bytecode():
            spec.loader.exec_module(module)
    finally:
        sys.modules.pop("model_common", None)
        if saved is None:
            del sys.modules["triton_python_backend_utils"]
        else:
            sys.modules["triton_python_backend_utils"] = saved
    return module
