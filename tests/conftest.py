"""Shared fixtures: small real corpora, prepared once per test session into a temporary directory."""

import importlib.util
import os
import signal
import socket
import sys
from pathlib import Path

import pytest
import torch

from gpt.optimizations import chunked_loss

REPO = Path(__file__).resolve().parent.parent
# Each optimization's tests live beside its name (tests/optimizations/test_<home>.py); the suite's files import one
# another's helpers by module name (`from equivalence import tiny_config`, tests/equivalence.py; `from test_precision
# import check_fp16_tracks_fp32` in tests/test_gpu.py), so both folders are on the path whichever file pytest runs.
for folder in (REPO / "tests", REPO / "tests" / "optimizations"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def share_the_cores_between_workers() -> None:
    """Side by side (pytest-xdist), each worker and the processes it starts take its share of the cores.

    Two workers of two threads each on 2 cores oversubscribe them, and OpenMP's waiting threads spin: the smoke runs of
    test_time_to_loss.py took 111 s beside another worker against 7 s alone. One thread each: a share of the cores."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)  # the stage processes and torchrun ranks the tests start
        torch.set_num_threads(threads)


share_the_cores_between_workers()


def take_sigint_back() -> None:
    """Python's Ctrl-C handler back where the suite was launched with SIGINT ignored, for every process a test starts.

    A background job of a non-interactive shell (`pytest ... &`, `nohup ... &`) starts with SIGINT ignored, and every
    process started from it inherits that: a stage the tests stop then waits out stop_tree's 15-s grace before its
    SIGKILL (gpt/supervision.py). The quick run's cap tests took 16-17 s each so, instead of 1-2, and the suite's
    timing (gpt/suite_time.py) measured how it was launched."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


take_sigint_back()
TEST_TIMEOUT_S = 600


def smoke_stage_argv(data_dir, out, device: str = "cpu") -> list[str]:
    """A stage's command-line arguments for a run on the smoke profile with the tests' data, into `out`."""
    where = ["--device", device, "--data-dir", str(data_dir), "--out", str(out)]
    return ["--profile", "smoke", "--wandb", "disabled", *where]


def free_port() -> int:
    """A TCP port free on this machine now, for a test's own process group."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.hookimpl(tryfirst=True)  # before pytest-timeout reads its settings
def pytest_configure(config):
    """Each test ends after TEST_TIMEOUT_S where pytest-timeout is installed and no --timeout was given.

    Without the plugin (a sealed image with pytest alone) the suite runs the same, unbounded, instead of stopping at
    "unrecognized arguments: --timeout"."""
    if config.pluginmanager.hasplugin("timeout") and config.getoption("timeout", None) is None:
        config.option.timeout = TEST_TIMEOUT_S
    # pytest-xdist's mark (pytest_collection_modifyitems), declared here too for a pytest without it
    config.addinivalue_line("markers", "xdist_group(name): run on one worker with the other tests of its group")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the group marks into the test ids
def pytest_collection_modifyitems(config, items):
    """GPU tests skipped where there is no CUDA GPU; tests that share a module's fixture kept on one worker.

    Tests marked `gpu` (tests/test_gpu.py) need CUDA. Side by side (the README's `-n auto --dist loadgroup`), each
    worker builds the module-scoped fixtures of the tests it is given: spread over two, test_time_to_loss.py's smoke
    runs (about 100 s) were trained twice. Grouped by module, they are built once; the other tests are spread one
    by one."""
    for item in items:
        fixtures = item._fixtureinfo.name2fixturedefs
        if any(name in fixtures and fixtures[name][-1].scope == "module" for name in item.fixturenames):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on a GPU machine")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def traced_not_compiled(monkeypatch):
    """torch.compile traced by Dynamo as usual, its graphs run by AOTAutograd's eager backend: no C++ is compiled.

    For a test whose claim is Dynamo's or the step loop's (graphs, recompiles, skipped frames, marks), not inductor's
    kernels: cold, inductor's C++ took 35-70 s of such a test on 2 cores; test_compile_matches_eager keeps inductor.
    The mode is dropped: "reduce-overhead" is an inductor option (the run's choices still record it)."""
    compile_ = torch.compile

    def traced(model=None, *, mode=None, backend="inductor", options=None, **kwargs):
        return compile_(model, backend="aot_eager", **kwargs)

    monkeypatch.setattr(torch, "compile", traced)


@pytest.fixture(scope="session", autouse=True)
def private_machine_cache(tmp_path_factory):
    """What the tests measure of this machine goes to a cache of its own, never into the user's ~/.cache.

    What they measure: CPU matmul peaks (run_all's smoke calibration measures them in a second) and attention kernels.
    The cache (gpt/machine_cache.py) is theirs here and in every stage process they start."""
    import os

    cache_home = tmp_path_factory.mktemp("xdg_cache")
    old_env = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(cache_home)
    yield
    if old_env is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old_env


# Tests of the chunked loss through PyTorch's own op (F.linear_cross_entropy, PyTorch 2.12 and newer). On an
# older torch the stages compute it with liger-kernel or Cut Cross-Entropy on CUDA (tests/test_gpu.py), else with
# plain PyTorch's chunks (tests/optimizations/test_chunked_loss.py).
TORCH_CHUNKED_LOSS = chunked_loss.installed("torch")
NO_TORCH_CHUNKED_LOSS = f"needs F.linear_cross_entropy of {chunked_loss.torch_op_needed()}"
needs_torch_chunked_loss = pytest.mark.skipif(not TORCH_CHUNKED_LOSS, reason=NO_TORCH_CHUNKED_LOSS)

# Tests of Muon (tests/optimizations/test_muon.py, test_schedule.py) through torch.optim.Muon, PyTorch 2.9 and newer.
HAS_MUON = hasattr(torch.optim, "Muon")
needs_muon = pytest.mark.skipif(
    not HAS_MUON, reason=f"needs torch.optim.Muon (PyTorch 2.9+; this is {torch.__version__})"
)


def load_prepare_module():
    """data/prepare.py is a script, not a package module: load it from its path."""
    spec = importlib.util.spec_from_file_location("prepare", REPO / "data" / "prepare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def shakespeare_excerpt(tmp_path_factory) -> Path:
    """The first 300k characters of the default corpus (real text, small enough to prepare in a second)."""
    prepare = load_prepare_module()
    text, _ = prepare.shakespeare_source()
    path = tmp_path_factory.mktemp("corpus") / "excerpt.txt"
    path.write_text(text[:300_000], encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def char_data(tmp_path_factory, shakespeare_excerpt) -> Path:
    """A prepared character-level data set (the smoke profile's tokenizer)."""
    prepare = load_prepare_module()
    out = tmp_path_factory.mktemp("data") / "excerpt_char"
    return prepare.prepare(source="files", files=[str(shakespeare_excerpt)], tokenizer="char", out=str(out))
