"""Worker checks: float64-referenced accuracy, the reference loader, guard failures, timing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ci_fxcache.worker import phase
from ci_fxcache.worker.accuracy import compare, fp64_judgement
from ci_fxcache.worker.tolerances import tolerance

F16 = tolerance("float16")


def _truth(seed: int, n: int = 4096) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g, dtype=torch.float64) * 30


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), noise=st.floats(1e-3, 1.0), closer=st.floats(0.0, 1.0))
def test_a_compiled_result_closer_to_float64_than_eager_is_never_wrong(
    seed: int, noise: float, closer: float
) -> None:
    truth = _truth(seed)
    g = torch.Generator().manual_seed(seed + 1)
    error = torch.randn(truth.shape, generator=g, dtype=torch.float64) * noise
    eager = (truth + error).half()
    compiled = (truth + error * closer).half()  # at most as far from the truth as eager
    passes, _ = fp64_judgement([compiled], [eager], [truth], F16, low_precision=True)
    assert passes


def test_a_compiled_result_much_further_from_float64_than_eager_is_wrong() -> None:
    truth = _truth(0)
    eager = truth.half()
    compiled = (truth + 0.5).half()  # off by far more than eager's rounding
    assert not compare([compiled], [eager], F16)["close"]
    passes, measured = fp64_judgement([compiled], [eager], [truth], F16, low_precision=True)
    assert not passes and "RMSE vs fp64 compiled" in measured


def test_within_tolerance_of_eager_passes_and_eager_overflow_is_not_held_against_compiled() -> None:
    truth = _truth(1, 8)
    eager = truth.half()
    assert fp64_judgement([eager.clone()], [eager], [truth], F16, True)[0]
    broken = eager.clone()
    broken[0] = float("nan")
    assert fp64_judgement([truth.half()], [broken], [truth], F16, True)[0]
    assert not fp64_judgement([broken], [truth.half() + 1], [truth], F16, True)[0]


class _Payload:
    """Unpickling this runs `Path(marker).touch()`: what a hostile reference.pt would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (Path.touch, (str(self.marker),))  # type: ignore[return-value]


def test_a_pickle_payload_in_reference_pt_cannot_execute(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    reference = tmp_path / "reference.pt"
    torch.save({"outputs": [torch.ones(2)], "evil": _Payload(marker)}, reference)
    with pytest.raises(RuntimeError, match="not a plain tensor file"):
        phase.load_reference(reference)
    assert not marker.exists()
    # the payload is real: a loader that trusts the file runs it
    with reference.open("rb") as f:
        torch.load(f, weights_only=False)
    assert marker.exists()


def test_a_plain_reference_loads(tmp_path: Path) -> None:
    reference = tmp_path / "reference.pt"
    data = {
        "inputs": (torch.ones(2), 3),
        "dynamic_inputs": None,
        "state": {"w": torch.zeros(1)},
        "outputs": [torch.ones(2)],
        "dynamic_outputs": None,
    }
    torch.save(data, reference)
    loaded = phase.load_reference(reference)
    assert torch.equal(loaded["outputs"][0], torch.ones(2)) and loaded["inputs"][1] == 3


def test_guard_failure_lines_are_extracted() -> None:
    message = (
        "RuntimeError: Detected recompile when torch.compile stance is 'fail_on_recompile'. "
        "filename: 'w.py', function name: 'fn', line number: 33\n"
        "    triggered by the following guard failure(s):\n"
        "    - 0/0: tensor 'x' size mismatch at index 0. expected 64, actual 40\n"
        "    - User stack trace:\n"
        '    -   File "w.py", line 33, in fn\n'
    )
    assert (
        phase.guard_failure(message)
        == "0/0: tensor 'x' size mismatch at index 0. expected 64, actual 40"
    )
    assert phase.guard_failure("RuntimeError: boom\nmore") == "RuntimeError: boom"


def test_timer_marks_wait_for_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: synced.append(1))
    spec = {"phase": "cold", "dir": ".", "combo": {"device": "cuda"}}
    run = phase.PhaseRun(spec, None, None, {}, F16)  # type: ignore[arg-type]
    run.mark("first call done")
    assert synced == [1] and "first call done" in run.timeline
    run.spec = {**spec, "combo": {"device": "cpu"}}
    run.mark("second shape done")
    assert synced == [1]


def test_training_loss_has_a_real_gradient_through_a_final_layernorm() -> None:
    # The sum of a LayerNorm's output does not depend on its input: a loss built from plain
    # sums would leave every gradient before the LayerNorm at rounding noise (about 1e-8).
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
    x = torch.randn(4, 8)
    outs = phase.run_model(model, (x,), "cpu", True, False, [])
    out, input_grad, weight_grad = outs[0], outs[1], outs[2]
    assert out.shape == (4, 8)
    assert input_grad.abs().max() > 1e-2
    assert weight_grad.abs().max() > 1e-2
    # the same call gives the same loss (and so the same gradients) every time
    again = phase.run_model(model, (x,), "cpu", True, False, [])
    assert all(torch.equal(a, b) for a, b in zip(outs, again, strict=True))


def test_a_gradient_that_is_zero_in_exact_arithmetic_is_not_judged_on_its_noise() -> None:
    # The conv bias gradient before BatchNorm is zero in exact arithmetic: eager and compiled
    # float32 both return rounding noise (figures from the built-in conv workload, training).
    f32 = tolerance("float32")
    truth = torch.zeros(8, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    eager = (torch.randn(8, generator=gen) * 4.65e-7).float()
    compiled = (torch.randn(8, generator=gen) * 5.57e-6).float()
    compiled[0] = 2e-5  # beyond float32 atol (1e-5) of eager
    assert fp64_judgement([compiled], [eager], [truth], f32, low_precision=False)[0]
    # a real error of the same tensor is still caught
    wrong = compiled + 1e-3
    passes, measured = fp64_judgement([wrong], [eager], [truth], f32, low_precision=False)
    assert not passes and "RMSE vs fp64" in measured


class _Builder:
    """Stands in for Inductor's CppBuilder: a command line naming its source and target."""

    def __init__(self, source: Path, target: Path) -> None:
        self.source, self.target = source, target

    def get_command_line(self) -> str:
        return f"g++ {self.source} -O3 -shared -fPIC -o {self.target}"


def _phase_cache(root: Path, code: str) -> tuple[Path, Path]:
    (root / "ab").mkdir(parents=True)
    source = root / "ab" / "cabc.cpp"
    source.write_text(code)
    return source, root / "ab" / "cabc.so"


def test_the_build_memo_serves_only_the_same_command_on_the_same_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memo = phase.BuildMemo(tmp_path / "memo")
    first_src, first_so = _phase_cache(tmp_path / "cold", "int f() { return 1; }")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cold"))
    first_so.write_bytes(b"library built by the cold phase")
    memo.keep(_Builder(first_src, first_so), str(first_so))
    # another phase, its own cache dir, the same source: copied, not compiled
    src, so = _phase_cache(tmp_path / "hot", "int f() { return 1; }")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "hot"))
    assert memo.serve(_Builder(src, so), str(so))
    assert so.read_bytes() == b"library built by the cold phase"
    # tampered source (a cache that carries other code): built, never served
    src2, so2 = _phase_cache(tmp_path / "tampered", "int f() { return 2; }")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "tampered"))
    assert not memo.serve(_Builder(src2, so2), str(so2)) and not so2.exists()

    # other flags: another library
    class Debug(_Builder):
        def get_command_line(self) -> str:
            return super().get_command_line().replace("-O3", "-O0")

    src3, so3 = _phase_cache(tmp_path / "debug", "int f() { return 1; }")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "debug"))
    assert not memo.serve(Debug(src3, so3), str(so3))
    # a memo entry that cannot be copied (a directory where the library was): built instead
    broken_src, broken_so = _phase_cache(tmp_path / "broken", "int f() { return 3; }")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "broken"))
    key = memo.key(_Builder(broken_src, broken_so), str(broken_so))
    (tmp_path / "memo" / f"{key}.so").mkdir()
    assert not memo.serve(_Builder(broken_src, broken_so), str(broken_so))
    # a build outside the phase's cache dir is left alone
    assert (
        memo.key(_Builder(src3, tmp_path / "elsewhere.so"), str(tmp_path / "elsewhere.so")) is None
    )


def test_a_phase_error_is_one_line_that_keeps_the_failed_guard() -> None:
    """torch 2.15's message when a loaded aot artifact's guards reject a call (its first line
    alone says nothing about which guard)."""
    message = (
        "GuardManager check failed, reason: GuardDebugInfo(\nresult=0,\nverbose_code_parts=["
        "'_has_dynamo_dim_marking is present on runtime tensor but was absent at compile time'],"
        "\nnum_guards_executed=6,\nuser_stack=None)\n"
    )
    line = phase.error_line(RuntimeError(message))
    assert "\n" not in line and line.startswith("RuntimeError: GuardManager check failed")
    assert "_has_dynamo_dim_marking is present on runtime tensor" in line
    assert len(phase.error_line(ValueError("x" * 900))) == 500
