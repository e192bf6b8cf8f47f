"""Imports every kernel family so it registers itself (see registry.py)."""
