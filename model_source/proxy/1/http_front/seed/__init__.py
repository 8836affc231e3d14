"""The seed API's dialect (the routes of the service this project replaced): routes.py, beside their request and
response types (schemas.py)."""
