"""Plan composition moved to :mod:`memx_hpc.model.compose` (below both the search and the
calibration) and the routing cost model to :mod:`memx_hpc.model.routed`; this module
re-exports both for code written against the old place."""

from ..model.compose import *  # noqa: F401,F403
from ..model.compose import __all__ as _compose_all
from ..model.routed import RoutedCostModel  # noqa: F401

__all__ = [*_compose_all, "RoutedCostModel"]
