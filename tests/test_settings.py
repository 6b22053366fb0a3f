"""Settings: the record, its validators, the environment, and the pool's constructor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import numpy as np
import pytest
import torch

from bucketpool import BucketPool, _settings
from bucketpool._settings import (
    CONF_VARIABLE,
    DEBUG_VARIABLE,
    DEFAULT_IDLE_TRIM_ACQUIRES,
    DEFAULT_MAX_CACHED_BYTES,
    DEFAULT_MAX_CACHED_PER_BUCKET,
    ENVIRONMENT_KEYS,
    Settings,
    resolve_settings,
)

ROOT = Path(__file__).resolve().parent.parent


def conf(text: str) -> dict[str, str]:
    return {CONF_VARIABLE: text}


# --- the record ---------------------------------------------------------------------------


def test_defaults_without_environment() -> None:
    settings = resolve_settings({}, environ={})
    assert settings == Settings()
    assert settings == Settings(
        dtype=torch.int64,
        device=torch.device("cpu"),
        pin_memory=False,
        min_capacity=16,
        max_capacity=1 << 24,
        max_cached_bytes=DEFAULT_MAX_CACHED_BYTES,
        max_cached_per_bucket=DEFAULT_MAX_CACHED_PER_BUCKET,
        idle_trim_acquires=DEFAULT_IDLE_TRIM_ACQUIRES,
        debug="off",
        trace=False,
    )


def test_settings_are_frozen() -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Settings().debug = "strict"  # type: ignore[misc]


def test_device_strings_are_converted() -> None:
    assert Settings(device="cpu").device == torch.device("cpu")
    assert Settings(dtype=torch.uint64).dtype is torch.uint64


def test_numpy_integers_are_stored_as_plain_ints() -> None:
    settings = Settings(
        min_capacity=np.int64(4),
        max_capacity=np.uint32(1024),
        max_cached_bytes=np.int64(7),
        max_cached_per_bucket=np.int16(3),
        idle_trim_acquires=np.uint8(0),
    )
    assert settings == Settings(
        min_capacity=4,
        max_capacity=1024,
        max_cached_bytes=7,
        max_cached_per_bucket=3,
        idle_trim_acquires=0,
    )
    for name in ENVIRONMENT_KEYS[:5]:
        assert type(getattr(settings, name)) is int
    resolved = resolve_settings({"max_cached_bytes": np.int64(5)}, environ={})
    assert type(resolved.max_cached_bytes) is int


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"dtype": torch.int32}, TypeError, r"dtype must be torch.int64 or torch.uint64 .*int32"),
        ({"device": "meta"}, ValueError, r"device must be the CPU, got device='meta'.*'cpu'"),
        ({"device": "nonsense"}, ValueError, r"device='nonsense' is not a torch device"),
        ({"device": 3}, TypeError, r"device must be a torch.device or a string"),
        ({"pin_memory": 1}, TypeError, r"pin_memory must be True or False, not int"),
        ({"min_capacity": 24}, ValueError, r"min_capacity must be a power of two .*16 and 32"),
        ({"max_capacity": True}, TypeError, r"max_capacity must be a power-of-two int, not bool"),
        ({"max_cached_bytes": 1.5}, TypeError, r"max_cached_bytes must be an int .*float"),
        ({"max_cached_bytes": np.True_}, TypeError, r"max_cached_bytes must be an int"),
        ({"max_cached_per_bucket": True}, TypeError, r"max_cached_per_bucket must be an int"),
        ({"idle_trim_acquires": -3}, ValueError, r"idle_trim_acquires must be >= 0, got .*=-3"),
        ({"debug": "verbose"}, ValueError, r"debug='verbose' is not a debug level; use one of"),
        ({"trace": "true"}, TypeError, r"trace must be True or False, not str"),
        ({"min_capacity": 64, "max_capacity": 32}, ValueError,
         r"min_capacity=64 is above max_capacity=32; make min_capacity <= max_capacity"),
    ],
)  # fmt: skip
def test_validators_name_the_setting_and_value(
    change: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Settings(**change)  # type: ignore[arg-type]


def test_max_capacity_must_fit_in_physical_memory() -> None:
    with pytest.raises(ValueError, match=r"max_capacity=\d+ is too large.*use at most"):
        Settings(max_capacity=1 << 100)


def test_max_capacity_limit_is_the_machines_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 1 << 18}  # 1 GiB

    def sysconf(name: str) -> int:
        return pages[name]

    monkeypatch.setattr(os, "sysconf", sysconf)
    assert Settings(max_capacity=1 << 25).max_capacity == 1 << 25  # 768 MiB per triple
    with pytest.raises(ValueError, match="too large") as info:
        Settings(max_capacity=1 << 26)
    assert str(info.value) == (
        f"max_capacity={1 << 26} is too large: one triple of that capacity takes "
        f"{24 << 26} bytes, more than this machine's {1 << 30} bytes of memory; use at most "
        f"max_capacity={1 << 25}"
    )


def test_max_capacity_limit_falls_back_without_sysconf(monkeypatch: pytest.MonkeyPatch) -> None:
    def sysconf(name: str) -> int:
        raise ValueError(name)

    monkeypatch.setattr(os, "sysconf", sysconf)
    assert Settings(max_capacity=1 << 30).max_capacity == 1 << 30
    with pytest.raises(ValueError, match=f"more than this machine's {1 << 40} bytes"):
        Settings(max_capacity=1 << 36)


def test_pin_memory_needs_an_accelerator() -> None:
    try:
        torch.empty(1, pin_memory=True)
    except RuntimeError:
        with pytest.raises(RuntimeError, match=r"pin_memory=True needs .*use pin_memory=False"):
            Settings(pin_memory=True)
    else:
        assert Settings(pin_memory=True).pin_memory


# --- resolving: arguments, BUCKETPOOL_DEBUG, BUCKETPOOL_CONF, defaults --------------------


def test_conf_sets_every_key() -> None:
    text = (
        "min_capacity=4, max_capacity=0x400, max_cached_bytes=1_000,"
        "max_cached_per_bucket=3,idle_trim_acquires=0,debug=STRICT,trace=True,"
    )
    assert resolve_settings({}, environ=conf(text)) == Settings(
        min_capacity=4,
        max_capacity=1024,
        max_cached_bytes=1000,
        max_cached_per_bucket=3,
        idle_trim_acquires=0,
        debug="strict",
        trace=True,
    )


def test_explicit_arguments_win_and_none_means_unset() -> None:
    environ = conf("max_cached_bytes=100,debug=checks")
    settings = resolve_settings({"max_cached_bytes": 7, "debug": None}, environ=environ)
    assert settings.max_cached_bytes == 7
    assert settings.debug == "checks"


def test_debug_variable_wins_over_conf() -> None:
    environ = {CONF_VARIABLE: "debug=checks", DEBUG_VARIABLE: "strict"}
    assert resolve_settings({}, environ=environ).debug == "strict"
    assert resolve_settings({"debug": "off"}, environ=environ).debug == "off"
    # The overridden value is not even parsed.
    environ = {CONF_VARIABLE: "debug=loud", DEBUG_VARIABLE: "checks"}
    assert resolve_settings({}, environ=environ).debug == "checks"


@pytest.mark.parametrize(
    ("explicit", "environ"),
    [
        ({"debug": "off"}, {DEBUG_VARIABLE: "1"}),
        ({"debug": "checks"}, {DEBUG_VARIABLE: "yes", CONF_VARIABLE: "debug=loud"}),
        ({"trace": True}, conf("trace=yes")),
        ({"max_cached_bytes": 5}, conf("max_cached_bytes=lots")),
        ({"max_capacity": 1 << 10}, conf("max_capacity=-1")),
    ],
)
def test_a_bad_environment_value_for_an_explicit_setting_is_ignored(
    explicit: dict[str, object], environ: dict[str, str], recwarn: pytest.WarningsRecorder
) -> None:
    settings = resolve_settings(explicit, environ=environ)
    for key, value in explicit.items():
        assert getattr(settings, key) == value
    assert len(recwarn) == 0


@pytest.mark.parametrize(("raw", "value"), [("true", True), ("TRUE", True), ("False", False)])
def test_booleans_are_true_or_false_in_any_case(raw: str, value: bool) -> None:
    assert resolve_settings({}, environ=conf(f"trace={raw}")).trace is value


@pytest.mark.parametrize("raw", ["yes", "no", "1", "0", "on", "off", "t", ""])
def test_other_booleans_are_refused(raw: str) -> None:
    with pytest.raises(ValueError, match=f"item trace='{raw}' is not a boolean; write true or"):
        resolve_settings({}, environ=conf(f"trace={raw}"))


@pytest.mark.parametrize("raw", ["\uff11\uff10\uff12\uff14", "\u0661\u0660", "1\u0660"])
def test_integers_are_ascii_python_literals(raw: str) -> None:
    # int() takes the digits of other scripts (fullwidth, Arabic-Indic): a literal does not.
    assert int(raw) >= 0
    with pytest.raises(ValueError, match=r"is not an integer; write e\.g\. max_cached_bytes=1024"):
        resolve_settings({}, environ=conf(f"max_cached_bytes={raw}"))


def test_a_duplicate_key_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"duplicate key 'max_cached_bytes' \(already "):
        resolve_settings({}, environ=conf("max_cached_bytes=1,trace=true,max_cached_bytes=2"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("max_cache_bytes=1", r"unknown key 'max_cache_bytes'; known keys: min_capacity,"),
        ("dtype=uint64", r"unknown key 'dtype'"),
        ("max_cached_bytes", r"item 'max_cached_bytes' is not key=value"),
        ("max_cached_bytes=lots", r"item max_cached_bytes='lots' is not an integer; write e.g."),
        ("max_cached_bytes=-1", r"max_cached_bytes must be >= 0, got max_cached_bytes=-1"),
        ("debug=loud", r"unknown debug level; use one of off, checks, strict"),
        ("min_capacity=24", r"min_capacity must be a power of two >= 1, got 24"),
        ("max_capacity=0x10000000000000", r"max_capacity=\d+ is too large"),
        ("min_capacity=64,max_capacity=32",
         r"^BUCKETPOOL_CONF item min_capacity='64' and BUCKETPOOL_CONF item max_capacity='32':"
         r" min_capacity=64 is above max_capacity=32"),
    ],
)  # fmt: skip
def test_bad_conf_names_the_variable_and_value(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_settings({}, environ=conf(text))


def test_bad_debug_variable() -> None:
    with pytest.raises(ValueError, match=r"^BUCKETPOOL_DEBUG='yes': unknown debug level"):
        resolve_settings({}, environ={DEBUG_VARIABLE: "yes"})


def test_errors_say_where_the_value_came_from() -> None:
    with pytest.raises(ValueError, match=r"^BUCKETPOOL_CONF item max_cached_bytes='-5': "):
        resolve_settings({}, environ=conf("max_cached_bytes=-5"))
    with pytest.raises(ValueError, match=r"^argument min_capacity=3: min_capacity must be a"):
        resolve_settings({"min_capacity": 3}, environ={})
    with pytest.raises(TypeError, match=r"^argument trace=1: trace must be True or False"):
        resolve_settings({"trace": 1}, environ={})
    with pytest.raises(ValueError, match=r"^argument min_capacity=1073741824 and default max_"):
        resolve_settings({"min_capacity": 1 << 30, "max_capacity": None}, environ={})


def test_constructor_only_settings_are_arguments() -> None:
    settings = resolve_settings(
        {"dtype": torch.uint64, "device": "cpu", "pin_memory": False}, environ={}
    )
    assert (settings.dtype, settings.device) == (torch.uint64, torch.device("cpu"))
    with pytest.raises(TypeError, match=r"^unknown setting 'colour'; settings: dtype, device"):
        resolve_settings({"colour": "blue"}, environ={})


def test_the_environment_is_read_at_each_call_in_a_fresh_process() -> None:
    code = (
        "import json, os\n"
        "from bucketpool._settings import resolve_settings\n"
        "print(json.dumps(resolve_settings({}).max_cached_bytes))\n"
        "os.environ['BUCKETPOOL_CONF'] = 'max_cached_bytes=3,debug=checks'\n"
        "s = resolve_settings({'debug': 'off'})\n"
        "print(json.dumps([s.max_cached_bytes, s.debug, s.min_capacity, s.trace]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUCKETPOOL_")}
    env.update(
        {CONF_VARIABLE: "min_capacity=64,trace=TRUE", DEBUG_VARIABLE: "1", "PYTHONPATH": str(ROOT)}
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    # BUCKETPOOL_DEBUG=1 is invalid, but debug is given explicitly in the second call only.
    assert done.returncode == 1
    assert "ValueError: BUCKETPOOL_DEBUG='1': unknown debug level" in done.stderr
    env[DEBUG_VARIABLE] = "strict"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [
        DEFAULT_MAX_CACHED_BYTES,
        [3, "off", 16, False],
    ]


def test_module_constants() -> None:
    assert _settings.DEBUG_LEVELS == ("off", "checks", "strict")
    assert (CONF_VARIABLE, DEBUG_VARIABLE) == ("BUCKETPOOL_CONF", "BUCKETPOOL_DEBUG")
    assert set(ENVIRONMENT_KEYS) == set(attrs.fields_dict(Settings)) - {
        "dtype",
        "device",
        "pin_memory",
    }


# --- the pool's constructor and its settings ------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64, torch.uint8])
def test_bad_dtype(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match=r"dtype must be torch.int64 or torch.uint64 \(XPU"):
        BucketPool(dtype=dtype)


@pytest.mark.parametrize("device", ["cuda", "meta", torch.device("cuda:1")])
def test_non_host_device(device: str | torch.device) -> None:
    with pytest.raises(ValueError, match=r"device must be the CPU.*use device='cpu'"):
        BucketPool(device=device)


def test_unknown_device() -> None:
    with pytest.raises(ValueError, match="is not a torch device"):
        BucketPool(device="floppy")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without an accelerator")
def test_pinning_without_accelerator_fails_at_construction() -> None:
    with pytest.raises(RuntimeError, match="pin_memory=True needs an accelerator"):
        BucketPool(pin_memory=True)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"min_capacity": 3}, ValueError, "min_capacity must be a power of two"),
        ({"max_capacity": 1000}, ValueError, "max_capacity must be a power of two"),
        (
            {"min_capacity": 64, "max_capacity": 32},
            ValueError,
            "min_capacity=64 is above max_capacity=32",
        ),
        ({"max_cached_bytes": -1}, ValueError, "max_cached_bytes must be >= 0"),
        ({"max_cached_per_bucket": -2}, ValueError, "max_cached_per_bucket must be >= 0"),
        ({"idle_trim_acquires": 1.5}, TypeError, "idle_trim_acquires must be an int"),
        ({"debug": "loud"}, ValueError, "is not a debug level; use one of off, checks, strict"),
        ({"pin_memory": 1}, TypeError, "pin_memory must be True or False"),
    ],
)
def test_bad_options(options: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        BucketPool(**options)  # type: ignore[arg-type]


def test_min_capacity_sets_the_smallest_bucket() -> None:
    pool = BucketPool(min_capacity=256)
    handle = pool.acquire(0)
    assert handle.capacity == 256
    assert handle.buffers.src_ptrs.numel() == 0
    handle.release()
    assert pool.bucket_capacity(300) == 512


def test_positional_options_are_refused() -> None:
    with pytest.raises(TypeError):
        BucketPool(torch.int64)  # type: ignore[call-arg]


def test_settings_are_read_only_and_resolved() -> None:
    pool = BucketPool(max_capacity=1024, debug="checks")
    settings = pool.settings
    assert (settings.max_capacity, settings.debug, settings.dtype) == (
        1024,
        "checks",
        torch.int64,
    )
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        settings.max_capacity = 2048  # type: ignore[misc]
    with pytest.raises(AttributeError):
        pool.settings = settings  # type: ignore[misc]
    assert not hasattr(pool, "max_capacity")


def test_a_capacity_below_one_says_what_to_use() -> None:
    with pytest.raises(ValueError, match=r"min_capacity must be a power of two >= 1, got 0; use 1"):
        BucketPool(min_capacity=0)
