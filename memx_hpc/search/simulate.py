"""The 1F1B pipeline schedule moved to :mod:`memx_hpc.model.schedule` (the composition
below the search uses it); re-exported here for code written against the old place."""

from ..model.schedule import *  # noqa: F401,F403
from ..model.schedule import __all__  # noqa: F401
