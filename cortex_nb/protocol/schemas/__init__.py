"""Typed request and response bodies of the REST API, one module per area.

The backend validates what clients send and renders what it answers with these classes, the client
reads answers with them, `protocol.openapi` publishes them as `GET /v1/openapi.json`, and the panel's
TypeScript interfaces are generated from them.
"""
