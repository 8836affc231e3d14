"""OpenAI's dialect (and this server's own routes in its shape): routes.py, beside their request and response types
(schemas.py)."""
