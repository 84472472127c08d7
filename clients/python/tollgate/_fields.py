"""The group settings, as the server declares them: name to (kind, least, greatest, unit).

Generated from the server's declaration of its settings (`tollgate_model::fields`); a test
checks it is current. Do not edit."""

from typing import Dict, Optional, Tuple

FIELDS: Dict[str, Tuple[str, Optional[float], Optional[float], str]] = {
    "reserved": ("number", 0.0, 1e15, "units/s"),
    "limit": ("number", 0.0, 1e15, "units/s"),
    "burst": ("number", 0.0, 1e18, "units"),
    "priority": ("whole", 1.0, 16.0, ""),
    "weight": ("number", 0.0, 1000000.0, ""),
    "budget": ("number", 0.0, 1e18, "units"),
    "budget_period": ("choice", None, None, ""),
    "quotas": ("table", None, None, "units"),
    "ramp": ("table", None, None, ""),
    "dropped": ("choice", None, None, ""),
    "debt_repay_s": ("number", 0.0, 31536000.0, "s"),
    "reads_writes_apart": ("flag", None, None, ""),
    "backend_limit": ("number", 0.0, 1e15, "units/s"),
    "background": ("flag", None, None, ""),
    "shadow": ("flag", None, None, ""),
    "critical_reserve": ("number", 0.0, 9e-1, ""),
    "max_in_flight": ("whole", 1.0, 1000000.0, "requests"),
    "parent": ("name", None, None, ""),
}
