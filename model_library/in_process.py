"""Running the Python models' own code outside Triton (unit tests and benchmarks): import_python_model.

Not installed into the model repository (export installs model_common.py and model_errors.py beside the models)."""
import importlib.util
import os
import sys
import types

MODEL_LIBRARY = os.path.dirname(os.path.abspath(__file__))


def import_python_model(path, module_name, **fake_attributes):
    """A Python model's code (the file at `path`) imported with a stand-in triton_python_backend_utils holding
    `fake_attributes`, which leaves sys.modules again afterwards (benchmarks and unit tests run the models' own code
    in-process)."""
    fake = types.ModuleType("triton_python_backend_utils")
    fake.__dict__.update(fake_attributes)
    saved = sys.modules.get("triton_python_backend_utils")
    sys.modules["triton_python_backend_utils"] = fake
    # the models' library (export installs it beside model.py): found here for the checkout's code, and imported
    # afresh, so that it binds this fake
    sys.modules.pop("model_common", None)
    sys.path.append(MODEL_LIBRARY)
    try:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(MODEL_LIBRARY)
        sys.modules.pop("model_common", None)
        if saved is None:
            del sys.modules["triton_python_backend_utils"]
        else:
            sys.modules["triton_python_backend_utils"] = saved
    return module
