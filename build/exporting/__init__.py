"""build/export.py's parts (import with build/ on sys.path: `build` itself is pypa's package name)."""
