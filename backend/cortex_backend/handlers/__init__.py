"""HTTP handlers, one module per area; `app.py` maps each route template to its handler."""
