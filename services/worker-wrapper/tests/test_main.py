"""`python -m taskplat.worker_wrapper` refuses bad settings and bad operators files in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from taskplat.worker_wrapper.operators import (
    OperatorsFileError,
    default_operators_file,
    load_operators,
)
from taskplat.worker_wrapper.settings import WrapperSettings

GOOD_ENV = {
    "TASKPLAT_WORKER_TOKEN": "a-worker-token-0123456789",
    "TASKPLAT_WORKER_DISPATCHER_URL": "http://127.0.0.1:9",
}


def run_main(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "taskplat.worker_wrapper"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def assert_one_line_refusal(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("taskplat-worker-wrapper: ")
    for needle in needles:
        assert needle in lines[0]


def test_missing_settings_exit_non_zero_in_one_line() -> None:
    result = run_main({})
    assert_one_line_refusal(result, "TASKPLAT_WORKER_TOKEN", "TASKPLAT_WORKER_DISPATCHER_URL")


def test_invalid_setting_names_its_variable() -> None:
    result = run_main({**GOOD_ENV, "TASKPLAT_WORKER_CONCURRENCY": "zero"})
    assert_one_line_refusal(result, "TASKPLAT_WORKER_CONCURRENCY")


def test_stall_limit_must_exceed_the_long_poll_wait() -> None:
    result = run_main(
        {
            **GOOD_ENV,
            "TASKPLAT_WORKER_WAIT_TIME_SECONDS": "20",
            "TASKPLAT_WORKER_STALL_SECONDS": "10",
        }
    )
    assert_one_line_refusal(result, "stall_seconds must exceed wait_time_seconds")


def test_a_deletion_may_linger_at_most_half_the_receive_visibility() -> None:
    result = run_main({**GOOD_ENV, "TASKPLAT_WORKER_DELETE_LINGER_SECONDS": "0.6"})
    assert_one_line_refusal(
        result, "delete_linger_seconds must be at most half of receive_visibility_timeout_seconds"
    )


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"TASKPLAT_WORKER_CLAIM_AHEAD": "true"}, "claim_ahead applies only with poll_dispatcher"),
        (
            {"TASKPLAT_WORKER_CLAIM_WITH_COMPLETIONS": "true", "TASKPLAT_WORKER_BATCH_CALLS": "0"},
            "claim_with_completions needs poll_dispatcher and batch_calls",
        ),
        (
            {
                "TASKPLAT_WORKER_CLAIM_WITH_COMPLETIONS": "true",
                "TASKPLAT_WORKER_POLL_DISPATCHER": "false",
            },
            "claim_with_completions needs poll_dispatcher and batch_calls",
        ),
        (
            {"TASKPLAT_WORKER_PARALLEL_CALLS": "2", "TASKPLAT_WORKER_BATCH_CALLS": "false"},
            "parallel_calls apply only with batch_calls",
        ),
    ],
    ids=["claim-ahead-beside-waiting-claim", "along-unbatched", "along-no-waiting", "unbatched"],
)
def test_a_flag_for_a_way_of_getting_work_not_taken_is_refused(
    env: dict[str, str], needle: str
) -> None:
    assert_one_line_refusal(run_main({**GOOD_ENV, **env}), needle)


def test_the_flags_of_the_way_taken_are_accepted() -> None:
    required = {"worker_token": "a-worker-token-0123456789", "dispatcher_url": "http://127.0.0.1:9"}
    settings = WrapperSettings.model_validate(
        {**required, "poll_dispatcher": False, "claim_ahead": True, "parallel_calls": 2}
    )
    assert settings.claim_ahead and not settings.poll_dispatcher
    # Defaults that do not apply are no error: claim_ahead is on by default, beside the waiting
    # claim (which takes its place), and so are the batching tunables without batch_calls.
    assert WrapperSettings.model_validate(required).poll_dispatcher
    assert not WrapperSettings.model_validate({**required, "batch_calls": False}).batch_calls


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("operators: [unclosed", "not valid YAML"),
        ("operators:\n  x:\n    command: [a]\n    colour: red\n", "operators.x.colour"),
        ("operators:\n  x:\n    command: []\n", "operators.x.command"),
        ("operators:\n  x:\n    command: [a]\n    env: [TASKPLAT_WORKER_TOKEN]\n", "never passed"),
        ("operators:\n  x:\n    command: [a]\n    pool_size: 2\n", "pooled operators only"),
        ("operators:\n  x:\n    command: [a]\n    mode: forked\n", "operators.x.mode"),
        ("just a string\n", "(root)"),
    ],
)
def test_bad_operators_file_exits_non_zero_in_one_line(
    tmp_path: Path, content: str, needle: str
) -> None:
    path = tmp_path / "operators.yaml"
    path.write_text(content, encoding="utf-8")
    result = run_main({**GOOD_ENV, "TASKPLAT_WORKER_OPERATORS_FILE": str(path)})
    assert_one_line_refusal(result, str(path), needle)


def test_missing_operators_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(OperatorsFileError, match="cannot read operators file"):
        load_operators(missing)


def test_the_shipped_operators_file_configures_the_examples() -> None:
    specs = load_operators(default_operators_file())
    assert specs["echo"].mode == "pooled"
    assert specs["sleep"].mode == "per-task" and specs["fail"].mode == "per-task"
    assert specs["echo"].argv()[0] == sys.executable


def test_the_wrapper_imports_no_database_code() -> None:
    modules = [
        "taskplat.worker_wrapper.__main__",
        "taskplat.worker_wrapper.worker",
        "taskplat.worker_wrapper.sdk",
        "taskplat.worker_wrapper.examples.echo",
    ]
    probe = (
        "import importlib, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "bad = sorted(m for m in sys.modules if m.startswith(('psycopg', 'taskplat.common.db')))\n"
        "print(','.join(bad))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.strip() == ""


def test_the_event_loop_setting_picks_the_loop() -> None:
    """`asyncio` never takes uvloop; `auto` and `uvloop` take it where it is installed and the
    kernel marks descriptors close-on-exec in one call (as here: Linux 5.11+)."""
    import uvloop

    from taskplat.worker_wrapper.event_loop import loop_factory
    from taskplat.worker_wrapper.process import cloexec_all_supported

    assert loop_factory("asyncio") is None
    assert cloexec_all_supported()
    assert loop_factory("auto") is uvloop.new_event_loop
    assert loop_factory("uvloop") is uvloop.new_event_loop


def test_here_in_a_command_is_the_operators_files_directory(tmp_path: Path) -> None:
    folder = tmp_path / "team"
    folder.mkdir()
    path = folder / "operators.yaml"
    path.write_text('operators:\n  count:\n    command: ["{python}", "{here}/count.py"]\n')
    (spec,) = load_operators(path).values()
    assert spec.argv("/usr/bin/python3") == ["/usr/bin/python3", f"{folder.resolve()}/count.py"]
