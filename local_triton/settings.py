"""The launcher's settings (environment variables: launch.py's docstring lists them) and its keys: plain API_KEY /
ADMIN_API_KEY values never reach tritonserver's environment, only files that name them (keys_to_files)."""
import os
import secrets
import tempfile

from model_library.triton_server import secret  # the proxy's reading of the keys, the same function

PROJECT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The serving repository: what build/export.py writes (the models' code and configs from model_source/, their
# artifacts) and what Triton serves, git-ignored. The one place its folder is named and joined to a checkout: every
# tool's default; export joins it to its own checkout's folder (it may run from a copy: serving_repository(project)).
SERVING_REPOSITORY_NAME = "model_repository"
# The models' source (tracked): one folder per Triton model, its code and config templates; export reads it
MODEL_SOURCE_NAME = "model_source"


def serving_repository(project=PROJECT):
    return os.path.join(project, SERVING_REPOSITORY_NAME)


def model_source(project=PROJECT):
    return os.path.join(project, MODEL_SOURCE_NAME)


SERVING_REPOSITORY = serving_repository()
MODEL_SOURCE = model_source()


def setting(name, default, env=None):
    value = (os.environ if env is None else env).get(name, "")
    return value if value != "" else default


KEY_VARIABLES = ("API_KEY", "ADMIN_API_KEY")


def keys_to_files(env):
    """Plain API_KEY / ADMIN_API_KEY in `env` -> API_KEY_FILE / ADMIN_API_KEY_FILE, in place. Every Python stub
    inherits tritonserver's environment (the tokenizer's, the supervisor's...: /proc/<pid>/environ), so the values
    go into files only the owner reads (0600, in a new 0700 directory from mkdtemp) that only the proxy opens. A
    *_FILE setting without its plain variable is kept. Returns the directory (for its owner to remove), or None."""
    plain = {name: env.pop(name) for name in KEY_VARIABLES if name in env}
    plain = {name: value for name, value in plain.items() if value}  # set but empty: unset, as secret() reads it
    if not plain:
        return None
    directory = tempfile.mkdtemp(prefix="triton-embed-keys-")
    for name, value in plain.items():
        path = os.path.join(directory, name.lower())
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8") as handle:
            handle.write(value)
        env[f"{name}_FILE"] = path
    return directory


def admin_key_for(env=None):
    # Without a configured key the restricted APIs still need one: a random key only the launcher knows.
    return secret("ADMIN_API_KEY", env) or secrets.token_hex(16)
