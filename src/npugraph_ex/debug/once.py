"""Log a message once per distinct key, so fallbacks and skips are reported without flooding."""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from typing import Any

SEEN: set[Hashable] = set()
SEEN_LOCK = threading.Lock()


def log_once(logger: logging.Logger, level: int, key: Hashable, message: str, *args: Any) -> bool:
    """Log ``message % args`` the first time ``key`` is seen; True when it was logged."""
    with SEEN_LOCK:
        if key in SEEN:
            return False
        SEEN.add(key)
    logger.log(level, message, *args)
    return True
