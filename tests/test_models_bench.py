"""benchmarks/models_bench.py on the CPU: ``--dry`` (tiny configs of the three
models, a few steps, the NumPy backend) writes the ``models`` rows of the
suite's CSV, with the profiler's position-encoding + q/k-norm time split into
forward and backward; its written-out configs are the published ones as
transformers and cuprope read them."""
import copy
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch", reason="needs torch: pip install torch")
pytest.importorskip("transformers", reason="transformers is a test-only dependency")

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import models_bench  # noqa: E402
import suite_rows  # noqa: E402
from hf_configs import CONFIGS as PUBLISHED  # noqa: E402


def test_dry_run_writes_the_models_rows(tmp_path):
    out, into = tmp_path / "models.csv", tmp_path / "suite.csv"
    suite_rows.write(suite_rows.finish([suite_rows.make("rotation", "qk_fwd", "c", "fp32",
                                                        "cuprope", 1.0)], "CPU (dry run)", "x"),
                     into)
    assert models_bench.main(["--dry", "--models", "qwen3-0.6b", "--out", str(out),
                              "--into", str(into)]) == 0
    rows = suite_rows.read(out)
    assert {r["family"] for r in rows} == {"models"}
    got = {(r["op"], r["impl"]) for r in rows}
    for impl in ("hf", "cuprope"):
        for op in ("train step", "train pos+norm", "prefill", "decode step", "decode pos+norm"):
            assert (op, impl) in got
    assert {("train step", "hf-compile"), ("train step", "cuprope-compile")} <= got
    assert all(r["us"] > 0 for r in rows)
    pn = [r for r in rows if r["op"] == "train pos+norm"]
    for r in pn:  # forward and backward both found by the profiler
        fwd, bwd = (float(x.split(" µs")[0].split()[-1]) for x in r["note"].split(", ")[:2])
        assert fwd > 0 and bwd > 0, r["note"]
    assert [r for r in rows if r["impl"] == "hf"][0]["ratio_to"] == "cuprope"
    merged = suite_rows.read(into)
    assert {r["family"] for r in merged} == {"rotation", "models"}


@pytest.mark.parametrize("name,published", [("llama-3.2-1b", "Llama-3.2-1B"),
                                            ("gemma-3-1b", "gemma-3-1b-it")])
def test_configs_agree_with_the_published_ones_in_tests(name, published):
    mine, theirs = models_bench.CONFIGS[name], PUBLISHED[published]
    for k, v in theirs.items():
        if isinstance(v, dict):  # transformers adds keys to a rope dict it is handed
            assert {j: v[j] for j in mine[k]} == mine[k], k
        elif k in mine:
            assert mine[k] == v, k


@pytest.mark.parametrize("name", list(models_bench.CONFIGS))
def test_configs_build_and_read(name):
    """transformers builds each config; cuprope reads its RoPE for every layer."""
    from transformers import AutoConfig

    from cuprope.schemes.hf_config import rope_config_from_hf
    cfg = copy.deepcopy(models_bench.CONFIGS[name])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    for i in range(config.num_hidden_layers):
        assert rope_config_from_hf(config, layer_idx=i) is not None


def test_unlinked_cuprope_kernels_count_once():
    """cuprope kernels the profiler linked to no range or backward node are
    added once; those linked (to a range or a child of one) are not added
    again; other kernels never."""
    from types import SimpleNamespace as NS

    import torch
    import models_profile as mp
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    k_linked = NS(name="void cuprope::rope_kernel<x>", duration=5.0)
    child = NS(kernels=[k_linked], cpu_children=[])
    top = NS(kernels=[NS(name="elementwise_kernel", duration=7.0)], cpu_children=[child])
    events = [NS(device_type=cuda, name=k_linked.name, device_time=5.0),
              NS(device_type=cuda, name="void cuprope::qknorm_rows_kernel<y>", device_time=3.0),
              NS(device_type=cuda, name="elementwise_kernel", device_time=7.0),
              NS(device_type=cpu, name="aten::add", device_time=0.0)]
    assert mp.unlinked_ours(events, [top]) == 3.0
    assert mp.unlinked_ours(events, []) == 8.0
