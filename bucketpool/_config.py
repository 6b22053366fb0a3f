"""Transitional alias of `bucketpool._settings`, until ``_pool.py`` imports that module."""

from __future__ import annotations

from bucketpool._settings import DebugLevel, Settings, resolve_settings

__all__ = ["DebugLevel", "Settings", "resolve_settings"]
