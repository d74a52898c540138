"""What a command line names, loaded: the application's Registry and the shard map.

`--app module:attribute` and `--shards`/`--shards-file` are read here for both
front ends: the `shardq` command, and `shardq serve`'s worker processes, which
rebuild them from the configuration the parent left in the environment. So the
web layer reads them without importing the CLI.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from shardq.shards.config import ENV_POOLER, ENV_SHARDS, ShardMap, load_shard_map
from shardq.shards.errors import ConfigError

if TYPE_CHECKING:
    from shardq.workflow.registry import Registry

ENV_APP = "SHARDQ_APP"
EXAMPLES_APP = "shardq.bin.examples:registry"


def shard_map_of(shards: str | None, shards_file: Path | None) -> ShardMap:
    """The map of `--shards-file` (which wins, with its own [pool] settings), else of
    `--shards`, else of the environment; with `--shards`, the pool sizes and the
    pooler come from the environment."""
    if shards_file is not None:
        return load_shard_map(shards_file)
    if shards:
        return ShardMap.from_env({**_pool_env(), ENV_SHARDS: shards})
    return ShardMap.from_env()


def _pool_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k.startswith("SHARDQ_POOL_") or k == ENV_POOLER}


def load_registry(app: str | None) -> Registry:
    """Import `module:attribute` and return the Registry it names.

    The current directory comes first on the module path, as with `python -m`: the
    console script would otherwise not find the `myapp.py` beside the user.
    """
    import importlib
    import traceback

    from shardq.workflow.registry import Registry

    if not app:
        raise ConfigError(
            f"no workflow registry: pass --app module:attribute or set {ENV_APP} "
            f"(e.g. --app myapp:registry; the demo's workflows are --app {EXAMPLES_APP})"
        )
    module_name, _, attribute = app.partition(":")
    attribute = attribute or "registry"
    if not all(part.isidentifier() for part in [*module_name.split("."), attribute]):
        raise ConfigError(
            f"--app {app!r} is not module:attribute (a dotted Python module name, a colon "
            "and the name of its Registry, e.g. myapp:registry)"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--app {app}: cannot import {module_name}: {exc}") from None
    except Exception as exc:
        # The application's own code failed at import; its traceback would bury the cause.
        frames = traceback.extract_tb(exc.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        if isinstance(exc, SyntaxError):
            where = ""  # its message already names the file and line
        raise ConfigError(
            f"--app {app}: importing {module_name} raised {type(exc).__name__}: {exc}{where}"
        ) from None
    registry = getattr(module, attribute, None)
    if not isinstance(registry, Registry):
        raise ConfigError(f"--app {app}: {attribute} is not a shardq Registry")
    return registry
