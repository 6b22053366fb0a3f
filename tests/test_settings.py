from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bucketpool._settings import (
    DEFAULT_IDLE_TRIM_ACQUIRES,
    DEFAULT_MAX_CACHED_BYTES,
    DEFAULT_MAX_CACHED_PER_BUCKET,
    Settings,
    resolve_settings,
)

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_without_environment() -> None:
    settings = resolve_settings({}, environ={})
    assert settings == Settings(
        min_capacity=16,
        max_capacity=1 << 24,
        max_cached_bytes=DEFAULT_MAX_CACHED_BYTES,
        max_cached_per_bucket=DEFAULT_MAX_CACHED_PER_BUCKET,
        idle_trim_acquires=DEFAULT_IDLE_TRIM_ACQUIRES,
        debug="off",
        trace=False,
    )


def test_conf_sets_every_key() -> None:
    conf = (
        "min_capacity=4, max_capacity=0x400, max_cached_bytes=1_000,"
        "max_cached_per_bucket=3,idle_trim_acquires=0,debug=STRICT,trace=yes,"
    )
    settings = resolve_settings({}, environ={"BUCKETPOOL_CONF": conf})
    assert settings == Settings(
        min_capacity=4,
        max_capacity=1024,
        max_cached_bytes=1000,
        max_cached_per_bucket=3,
        idle_trim_acquires=0,
        debug="strict",
        trace=True,
    )


def test_explicit_arguments_win_and_none_means_unset() -> None:
    environ = {"BUCKETPOOL_CONF": "max_cached_bytes=100,debug=checks"}
    settings = resolve_settings({"max_cached_bytes": 7, "debug": None}, environ=environ)
    assert settings.max_cached_bytes == 7
    assert settings.debug == "checks"


def test_debug_variable_wins_over_conf() -> None:
    environ = {"BUCKETPOOL_CONF": "debug=checks", "BUCKETPOOL_DEBUG": "strict"}
    assert resolve_settings({}, environ=environ).debug == "strict"
    assert resolve_settings({"debug": "off"}, environ=environ).debug == "off"


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ("max_cache_bytes=1", r"unknown key 'max_cache_bytes'; known keys: min_capacity,"),
        ("max_cached_bytes", r"item 'max_cached_bytes' is not key=value"),
        ("max_cached_bytes=lots", r"'lots' is not an integer"),
        ("max_cached_bytes=-1", r"max_cached_bytes must be >= 0, got -1"),
        ("debug=loud", r"unknown debug level; valid levels: off, checks, strict"),
        ("trace=maybe", r"'maybe' is not a boolean"),
        ("min_capacity=24", r"min_capacity must be a power of two >= 1, got 24"),
        ("min_capacity=64,max_capacity=32", r"min_capacity=64 is above max_capacity=32"),
    ],
)
def test_bad_conf_names_the_item(conf: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_settings({}, environ={"BUCKETPOOL_CONF": conf})


def test_bad_debug_variable() -> None:
    with pytest.raises(ValueError, match=r"BUCKETPOOL_DEBUG='yes': unknown debug level"):
        resolve_settings({}, environ={"BUCKETPOOL_DEBUG": "yes"})


@pytest.mark.parametrize(
    ("explicit", "message"),
    [
        ({"max_cached_bytes": 1.5}, r"max_cached_bytes must be an int, got 1.5"),
        ({"max_cached_per_bucket": True}, r"max_cached_per_bucket must be an int, got True"),
        ({"idle_trim_acquires": -3}, r"idle_trim_acquires must be >= 0, got -3"),
        ({"debug": "verbose"}, r"unknown debug level 'verbose'; valid levels: off, checks"),
        ({"trace": 1}, r"trace must be a bool, got 1"),
    ],
)
def test_bad_explicit_values(explicit: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_settings(explicit, environ={})


def _pool_settings_in_subprocess(
    environ: dict[str, str], code: str
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUCKETPOOL_")}
    env.update(environ)
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )


REPORT = (
    "import json, bucketpool.compat as c; p = c.DescriptorBufferPool().pool; "
    "print(json.dumps([p.max_cached_bytes, p.debug, p.min_capacity]))"
)


def test_conf_reaches_a_compat_pool_in_a_fresh_process() -> None:
    done = _pool_settings_in_subprocess(
        {"BUCKETPOOL_CONF": "max_cached_bytes=67108864,debug=checks,min_capacity=64"}, REPORT
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [67108864, "checks", 64]


def test_bad_conf_fails_pool_creation_in_a_fresh_process() -> None:
    done = _pool_settings_in_subprocess({"BUCKETPOOL_CONF": "colour=blue"}, REPORT)
    assert done.returncode == 1
    assert "ValueError: BUCKETPOOL_CONF item 'colour=blue': unknown key 'colour'" in done.stderr


def test_explicit_argument_beats_environment_in_a_fresh_process() -> None:
    code = (
        "import bucketpool; p = bucketpool.BucketPool(max_cached_bytes=5, debug='off'); "
        "print(p.max_cached_bytes, p.debug)"
    )
    done = _pool_settings_in_subprocess(
        {"BUCKETPOOL_CONF": "max_cached_bytes=99", "BUCKETPOOL_DEBUG": "strict"}, code
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5", "off"]


def test_errors_say_where_the_value_came_from() -> None:
    with pytest.raises(ValueError, match=r"^BUCKETPOOL_CONF max_cached_bytes=-5: .* got -5$"):
        resolve_settings({}, environ={"BUCKETPOOL_CONF": "max_cached_bytes=-5"})
    with pytest.raises(ValueError, match=r"^argument min_capacity=3: min_capacity must be a power"):
        resolve_settings({"min_capacity": 3}, environ={})
