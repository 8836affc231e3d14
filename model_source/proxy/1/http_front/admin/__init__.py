"""The admin routes (load, unload; the seed API's CLIP admin routes): routes.py, beside their request and response
types (schemas.py)."""
