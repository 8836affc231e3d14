"""The server's own routes (probes, /metrics), in no API's dialect: routes.py."""
