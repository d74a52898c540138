"""A shards file is read strictly: UTF-8 only, no unknown keys, pool sizes that are integers."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardq.shards.config import ShardMap
from shardq.shards.errors import ConfigError

SHARD = '[[shards]]\nurl = "postgresql://h/db"\n'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (f"{SHARD}bucket = [0, 4095]\n", "shard entry 0: unknown key 'bucket' (did you mean "
                                         "'buckets'?)"),
        (f"[pool]\nmax_sise = 3\n{SHARD}", "[pool]: unknown key 'max_sise' (did you mean "
                                           "'max_size'?)"),
        (f"shard = 1\n{SHARD}", "unknown key 'shard'"),
        (f'{SHARD}max_size = "lots"\n', "shard shard-0: max_size must be an integer, got 'lots'"),
        (f"[pool]\nmin_size = true\n{SHARD}", "[pool]: min_size must be an integer, got True"),
        (f"{SHARD}name = 3\n", "shard entry 0: name must be a non-empty string"),
        ("a = " + "[" * 3000 + "]" * 3000 + "\n", "nested too deeply"),
    ],
)
def test_shards_file_mistakes_are_named(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "shards.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        ShardMap.from_toml(path)
    assert message in str(info.value)


def test_shards_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "shards.toml"
    path.write_bytes(SHARD.encode() + b'name = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte \d+: invalid"):
        ShardMap.from_toml(path)
