"""Voyage's dialect: routes.py, beside their request and response types (schemas.py)."""
