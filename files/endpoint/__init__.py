"""Helpers the endpoint deploy sends to heads (deploys/endpoint.py)."""
