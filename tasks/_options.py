"""Task options shared by every step that touches private rows."""

from __future__ import annotations

from typing import Any

from prefect.cache_policies import NO_CACHE

# Never pickle a task's return value to a result store, never reuse a cached one: returns
# may hold private rows, and a cached mechanism output would hide a second data access.
PRIVATE: dict[str, Any] = {"persist_result": False, "cache_policy": NO_CACHE}
