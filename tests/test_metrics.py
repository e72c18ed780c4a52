"""What a GPU run measures, checked on the CPU where the logic allows.

How peak memory is measured per stage, the timeline and breakdown derived from a CUDA allocator snapshot (a synthetic
one, written as the allocator writes it), the marks that place a step's phases in that trace, and the GPU names of the
MFU table. tests/test_gpu.py checks the same on a real GPU."""

import contextlib
import json

import pytest
import torch

from gpt import flops, machine_cache, peak_memory, protocol
from gpt.allocator_snapshot import MiB
from gpt.flops import GPU_PEAK_TFLOPS, gpu_board, peak_flops
from gpt.ladder import stage_config, stages_of
from gpt.optimizations.compilation import compile_mode
from gpt.peak_memory import StepMarks, memory_method, peak_breakdown, traced_memory
from gpt.timeline_tracker import TimelineMemTracker

CUDA = torch.device("cuda", 0)  # a device object only: nothing here runs on it


# ---- which method measures peak memory -------------------------------------------------------------------


def test_cuda_graph_stages_are_measured_by_reserved_memory_the_others_as_before():
    assert memory_method(torch.device("cpu"), None) == memory_method(torch.device("cpu"), "default") == "memtracker"
    methods = {
        stage: memory_method(CUDA, compile_mode(stage_config(stage, "reference", device="cuda"), CUDA))
        for stage in stages_of("speed") + stages_of("memory")
    }
    # torch.compile comes in at speed_4 and uses CUDA graphs ("reduce-overhead") on CUDA from there on
    graphs = {"speed_4_compile", "speed_5_amp", "speed_6_ddp"}
    assert {s for s, m in methods.items() if m == "cuda_max_reserved"} == graphs
    assert all(m == "cuda_max_allocated" for s, m in methods.items() if s not in graphs)
    assert set(methods.values()) | {"memtracker"} == set(peak_memory.MEMORY_METHODS)


# ---- the allocator's trace ---------------------------------------------------------------------------------


class FakeAllocator:
    """Writes what torch.cuda.memory._snapshot() returns for one device.

    'device_traces': every alloc, free_requested and free_completed since recording started, with the requested size,
    among other actions; 'segments': the blocks at the end, with their size and state. A block is its request rounded up
    to 512 bytes unless `block` says otherwise. Addresses are fresh unless one is reused on purpose."""

    def __init__(self, device=0):
        self.device, self.live, self.trace, self.next, self.allocations = device, {}, [], 1 << 20, 0

    def alloc(self, mib: float, addr: int | None = None, block: int | None = None) -> int:
        if addr is None:
            addr, self.next = self.next, self.next + (1 << 30)
        size = int(mib * MiB)
        self.live[addr] = (size, block or -(-size // 512) * 512)
        self.allocations += 1
        self.trace += [
            {"action": "segment_alloc", "addr": addr, "size": size, "stream": 0, "frames": []},
            {"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": []},
        ]
        return addr

    def free(self, addr: int) -> None:
        size, _ = self.live.pop(addr)
        self.trace += [
            {"action": a, "addr": addr, "size": size, "stream": 0, "frames": []}
            for a in ("free_requested", "free_completed")
        ]

    def start_recording(self) -> None:
        self.trace, self.allocations = [], 0

    def snapshot(self) -> dict:
        blocks = [
            {"address": a, "size": block, "requested_size": size, "state": "active_allocated", "frames": []}
            for a, (size, block) in sorted(self.live.items())
        ]
        blocks.append({"address": self.next, "size": 7 * MiB, "requested_size": 0, "state": "inactive"})
        other_device = {
            "device": self.device + 1,
            "address": 1,
            "total_size": MiB,
            "blocks": [{"address": 1, "size": MiB, "requested_size": MiB, "state": "active_allocated", "frames": []}],
        }
        segment = {
            "device": self.device,
            "address": blocks[0]["address"],
            "blocks": blocks,
            "segment_pool_id": (0, 0),
            "total_size": sum(b["size"] for b in blocks),
        }
        traces = [[] for _ in range(self.device + 2)]
        traces[self.device] = self.trace + [{"action": "snapshot", "addr": 0, "size": 0, "stream": 0}]
        return {"segments": [segment, other_device], "device_traces": traces}


@pytest.mark.parametrize("grad_mib", [4, 10])
def test_timeline_and_breakdown_at_the_peak_from_a_snapshot(grad_mib):
    """The timeline and the breakdown at the peak, from the snapshot of a training step in miniature.

    The step (MiB): parameters, optimizer state and a workspace exist before the trace, one block is freed during it; a
    forward pass makes two activations and a temporary; backward makes a temporary and a gradient in the address an
    activation just gave back. With a 4 MiB gradient the peak is the backward temporary's allocation, with both
    activations alive; with 10 MiB it is the gradient's: the same address then counts as a gradient, because the
    allocation there is the one the optimizer read."""
    a = FakeAllocator(device=1)
    param, state, _workspace, stale = a.alloc(4), a.alloc(8), a.alloc(1), a.alloc(2)
    a.start_recording()
    tensors = [(0, param, "parameters"), (0, state, "optimizer_state")]
    forward = [[a.allocations, None]]
    act1, act2 = a.alloc(3), a.alloc(5)
    a.free(stale)
    a.free(a.alloc(1))  # a temporary inside forward
    forward[0][1] = a.allocations
    scratch = a.alloc(6)
    a.free(act2)
    grad = a.alloc(grad_mib, addr=act2)
    a.free(act1)
    a.free(scratch)
    tensors.append((a.allocations, grad, "gradients"))  # the optimizer's step pre-hook
    a.free(a.alloc(2))  # the optimizer's temporaries
    a.free(grad)  # zero_grad(set_to_none=True)

    traced = traced_memory(a.snapshot(), 1, tensors, forward)
    timeline, breakdown = traced.timeline, peak_breakdown(traced)

    g = grad_mib
    expected = [15, 18, 23, 21, 22, 21, 27, 22, 22 + g, 19 + g, 13 + g, 15 + g, 13 + g, 13]
    assert [t / MiB for t in timeline] == expected
    parts = {"parameters": 4, "buffers": 0, "optimizer_state": 8, "other": 1, "temporaries": 6}
    if grad_mib == 4:  # peak 27: right after the backward temporary
        parts.update(gradients=0, activations=8, total=27)
    else:  # peak 32: right after the gradient, in the address of the 5 MiB activation
        parts.update(gradients=10, activations=3, total=32)
    assert breakdown == parts
    assert sum(v for k, v in breakdown.items() if k != "total") == breakdown["total"] == max(expected)


def test_a_trace_that_frees_what_it_never_saw_allocated():
    """Recording started mid-step: a free of a block made before the trace restores it to the initial level."""
    a = FakeAllocator()
    old = a.alloc(2)
    a.start_recording()
    a.free(old)
    a.alloc(1)
    traced = traced_memory(a.snapshot(), 0)
    timeline, breakdown = traced.timeline, peak_breakdown(traced)
    assert [t / MiB for t in timeline] == [2, 0, 1]
    assert breakdown["total"] == breakdown["other"] == 2


def test_blocks_count_at_the_allocator_size():
    """Blocks count at the allocator's size: the trace has requested sizes, max_memory_allocated counts blocks.

    A block alive at the end counts at its size in the segments (here a 1.5 MiB request in a 2 MiB block, left unsplit),
    one freed within the trace at its request rounded up to 512 bytes (100 bytes -> 512)."""
    a = FakeAllocator()
    a.start_recording()
    kept = a.alloc(1.5, block=2 * MiB)
    a.free(a.alloc(100 / MiB))
    traced = traced_memory(a.snapshot(), 0, [(2, kept, "parameters")])
    timeline, breakdown = traced.timeline, peak_breakdown(traced)
    assert timeline == [0, 2 * MiB, 2 * MiB + 512, 2 * MiB]
    assert breakdown["parameters"] == 2.0 and breakdown["temporaries"] == round(512 / MiB, 2)  # at the peak


def test_step_marks_place_forward_passes_and_gradients():
    """The hooks of StepMarks place the forward passes and the gradients on a real model and optimizer.

    One [start, end] per forward pass (two micro-batches here), the gradients seen as the optimizer steps, nothing for
    CPU tensors (no allocator block)."""
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    count = iter(range(100))
    marks = StepMarks(model, optimizer, lambda: next(count))
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    marks.remove()
    model(torch.randn(2, 4))
    assert marks.forward == [[1, 2], [3, 4]]  # this count moves by one per call
    assert marks.tensors == []  # CPU tensors are not in a CUDA trace


# ---- MFU's table of GPUs -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, board",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("Tesla V100-SXM2-16GB", "V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "V100 PCIe"),
        ("Tesla T4", "T4"),
        # not in the table: no board, so no MFU rather than a neighbour's peak
        ("NVIDIA GH200 480GB", None),
        ("NVIDIA H800", None),
        ("NVIDIA H100", None),
        ("NVIDIA A40", None),
        ("NVIDIA RTX 6000 Ada Generation", None),
        ("NVIDIA L40G", None),
        ("AMD Instinct MI300X", None),
    ],
)
def test_gpu_names_match_their_own_row_only(name, board):
    assert gpu_board(name) == board


def test_unknown_gpu_gets_no_mfu_and_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L40")
    peak, source = peak_flops(CUDA, torch.bfloat16)
    assert peak == GPU_PEAK_TFLOPS["L40"]["bfloat16"] * 1e12 != GPU_PEAK_TFLOPS["L4"]["bfloat16"] * 1e12
    assert source == "data sheet: L40 bfloat16 dense"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GH200 480GB")
    peak, source = peak_flops(CUDA, torch.bfloat16)
    assert peak is None and "no data-sheet peak for 'NVIDIA GH200 480GB'" in source
    assert flops.mfu(1e6, 1e3, peak) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    assert peak_flops(CUDA, torch.bfloat16)[0] is None  # T4 has no bf16 peak on its data sheet


def test_cpu_matmul_benchmark_uses_real_tensors_under_fake_mode(tmp_path, monkeypatch):
    """The CPU matmul benchmark multiplies real tensors, even under FakeTensorMode.

    The memory planner calls mixed_precision, and so the CPU benchmark, under FakeTensorMode: fake matmuls take no time
    (unguarded, n=1024 'ran' at ~1e14 FLOP/s here, 300x the real rate), and the absurd peak would be cached for every
    later stage's MFU. Every tensor the benchmark multiplies must be a real one. (Checked on the tensors, not by
    comparing two timed rates: a busy machine moves a short rate by 45x, seen with two helpers' tests beside the
    suite.)"""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    made, randn = [], torch.randn
    monkeypatch.setattr(torch, "randn", lambda *a, **k: made.append(randn(*a, **k)) or made[-1])
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with FakeTensorMode():
        under_fake = flops.measure_cpu_matmul_flops(torch.float32, n=512, seconds=0.05)
    assert made and not any(isinstance(t, FakeTensor) for t in made)
    assert flops.measure_cpu_matmul_flops(torch.float32, n=512) == under_fake  # what was cached
    made.clear()
    with FakeTensorMode():  # the bf16 rule's measurement (gpt/optimizations/precision.py:cpu_bf16_is_faster)
        flops.measure_cpu_matmul_rates_in_turns((torch.bfloat16, torch.float32), n=512)
    assert made and not any(isinstance(t, FakeTensor) for t in made)


def test_fresh_peak_measurement_replaces_a_stale_cached_figure(tmp_path, monkeypatch):
    """A fresh peak measurement replaces a stale cached figure; a stage run alone keeps reading the cache.

    run_all measures the peaks afresh before its first stage: a figure cached on a busier day (or another VM with the
    same CPU name) must not survive it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(flops, "matmul_rate", lambda dtype, n=2048, seconds=2.0, rounds=1: 7e10)
    flops.measure_cpu_matmul_flops(torch.float32)  # caches 7e10
    path = machine_cache.cache_file(flops.PEAKS_CACHE)
    cache = {k: 1e9 for k in json.loads(path.read_text())}  # a stale, much lower figure
    path.write_text(json.dumps(cache))
    assert flops.measure_cpu_matmul_flops(torch.float32) == 1e9
    threads = torch.get_num_threads()  # the thread counts run_all calibrates: this process's, and 1 (a rank's)
    peaks = flops.calibrate_cpu_peaks([threads, 1], rounds=2)
    assert peaks == {f"{dtype} x{n} threads": 7e10 for n in {threads, 1} for dtype in ("float32", "bfloat16")}
    assert flops.measure_cpu_matmul_flops(torch.float32) == 7e10


def test_matmul_rate_keeps_the_best_round(monkeypatch):
    """A round slowed down by the host must not lower the figure: the best round counts."""
    clock = {"t": 0.0, "round": 0}
    monkeypatch.setattr(flops.time, "sleep", lambda s: clock.update(round=clock["round"] + 1))

    def perf_counter():  # every matmul "takes" 0.5 ms in the second round, 1 ms in the others
        clock["t"] += 0.0005 if clock["round"] == 1 else 0.001
        return clock["t"]

    monkeypatch.setattr(flops.time, "perf_counter", perf_counter)
    best = flops.matmul_rate(torch.float32, n=256, seconds=0.3, rounds=3)
    assert best == pytest.approx(2 * 256**3 / 0.0005)


def test_matmul_rate_leaves_the_cpu_generator_as_it_found_it():
    """Timing the matmul rates draws their inputs from a fork: the generator a run was seeded with does not move.

    Seen failing with its fork_rng taken out."""
    before = torch.random.get_rng_state()
    flops.matmul_rate(torch.float32, n=256, seconds=0.05)
    assert torch.equal(torch.random.get_rng_state(), before)
    flops.matmul_rates_in_turns((torch.bfloat16, torch.float32), n=256, seconds=0.05)  # the bf16 rule's
    assert torch.equal(torch.random.get_rng_state(), before)


def test_timeline_tracker_peak_is_memtrackers_without_the_per_module_cost():
    """TimelineMemTracker's global peak is MemTracker's, without the cost of the per-module peaks.

    TimelineMemTracker skips MemTracker's per-module peaks (O(modules) per op); the global peak snapshot, the only one
    the breakdown reads, must stay MemTracker's own, category by category."""
    from torch.distributed._tools.mem_tracker import MemTracker

    def tracked(tracker_cls):
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            *[
                torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
                for _ in range(4)
            ]
        )
        opt = torch.optim.AdamW(model.parameters())
        for i in range(2):  # the second step, with the optimizer state alive, is tracked
            tracker = tracker_cls()
            tracker.track_external(model, opt)
            with tracker if i else contextlib.nullcontext():
                if i:
                    tracker.reset_mod_stats()
                model(torch.randn(32, 64)).square().mean().backward()
                opt.step()
                opt.zero_grad()
        return tracker

    ours, theirs = tracked(TimelineMemTracker), tracked(MemTracker)
    assert peak_memory.memory_breakdown(ours) == peak_memory.memory_breakdown(theirs)
    assert peak_memory.memory_breakdown(ours)["optimizer_state"] > 0 and peak_memory.memory_breakdown(ours)["total"] > 0
    assert ours.get_tracker_snapshot("peak") == theirs.get_tracker_snapshot("peak")


def test_compile_cache_state_tells_a_compile_from_a_cache_load(monkeypatch):
    """The record tells a compile from a load from the on-disk compile cache.

    compile_s of a stage whose graphs came from the on-disk cache is not a compile time: the record says which it was,
    from dynamo's counters (AOTAutograd's and Inductor's cache hits and misses)."""
    from collections import Counter, defaultdict

    from torch._dynamo import utils

    def state(**counts):
        fake = defaultdict(Counter)
        for key, n in counts.items():
            group, name = key.split("__")
            fake[group][name] = n
        monkeypatch.setattr(utils, "counters", fake)
        return protocol.compile_cache_state()

    assert state() is None
    assert state(aot_autograd__autograd_cache_miss=2, inductor__fxgraph_cache_miss=4) == "cold"
    assert state(aot_autograd__autograd_cache_hit=2, inductor__fxgraph_cache_hit=4) == "warm"
    assert state(aot_autograd__autograd_cache_miss=1, inductor__fxgraph_cache_hit=2) == "partly warm"


@pytest.mark.parametrize("device", [torch.device("cpu"), CUDA])
def test_mfu_of_an_fsdp_bf16_stage_is_against_the_bf16_peak(device, monkeypatch):
    """The MFU of an FSDP bf16 stage is against the bf16 peak, and the record says the dtype it computed in.

    FSDP's mixed precision (lean_*) computes in bf16 with autocast off: its MFU is against the bf16 peak, not the
    float32 one of its autocast dtype (lean_1 read 96.2% of 'its dtype's' peak on this CPU, ~22% of bf16's; on an H100
    bf16's dense peak is ~15x TF32-less fp32's)."""
    from types import SimpleNamespace

    from gpt.optimizations import parallel
    from gpt.optimizations.precision import MixedPrecision

    monkeypatch.setattr(parallel, "bf16_is_fast", lambda device_type: (True, "forced by the test"))
    peaks = {torch.float32: 1e9, torch.bfloat16: 4e9}
    monkeypatch.setattr(protocol, "peak_flops", lambda device, dtype: (peaks[dtype], str(dtype)))
    monkeypatch.setattr(protocol, "fastest_peak_flops", lambda device: (4e9, "bf16"))
    monkeypatch.setattr(protocol, "tokens_per_s", lambda cfg, timed: 1000.0)
    cfg = stage_config("lean_1_fsdp_bf16", "smoke")
    amp = MixedPrecision(torch.float32, device.type, "amp off")
    choices = SimpleNamespace(compute_dtype=parallel.compute_dtype(cfg, device, amp.dtype))  # gpt/run_choices.py's
    trainer = SimpleNamespace(cfg=cfg, device=device, choices=choices, gpt=SimpleNamespace(flops_per_token=lambda: 1e6))
    m = protocol.flops_metrics(trainer, None)
    assert m["peak_flops_per_device"] == 4e9 and m["mfu_pct"] == m["mfu_fastest_pct"]
    assert parallel.compute_dtype(stage_config("memory_4_fsdp", "smoke"), device, torch.float32) == torch.float32
