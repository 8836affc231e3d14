"""The launcher (`python -m local_triton.launch`, `make serve`, the image's CMD): tritonserver started, restarted,
drained and stopped around the model repository. launch.py's docstring lists its modules and settings."""
