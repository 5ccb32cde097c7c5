"""The kernel bench's host-side pieces that run without a GPU (the timing itself needs one)."""
import os

import pytest

from snapmla import bench


def test_with_env_sets_the_variable_for_the_call_and_puts_the_environment_back():
    seen = []
    call = bench.with_env(lambda t: seen.append((t, os.environ.get("SNAPMLA_FP8_TILE"))) or t, "SNAPMLA_FP8_TILE", "vregs")
    old = os.environ.pop("SNAPMLA_FP8_TILE", None)
    try:
        assert call(3) == 3
        assert seen == [(3, "vregs")]
        assert "SNAPMLA_FP8_TILE" not in os.environ
        os.environ["SNAPMLA_FP8_TILE"] = "rows64"
        call(4)
        assert seen[-1] == (4, "vregs")
        assert os.environ["SNAPMLA_FP8_TILE"] == "rows64"
    finally:
        os.environ.pop("SNAPMLA_FP8_TILE", None)
        if old is not None:
            os.environ["SNAPMLA_FP8_TILE"] = old


def test_with_env_restores_the_environment_when_the_call_raises():
    def boom(t):
        raise RuntimeError("x")
    old = os.environ.pop("SNAPMLA_FP8_TILE", None)
    try:
        try:
            bench.with_env(boom, "SNAPMLA_FP8_TILE", "vregs")(0)
        except RuntimeError:
            pass
        assert "SNAPMLA_FP8_TILE" not in os.environ
    finally:
        if old is not None:
            os.environ["SNAPMLA_FP8_TILE"] = old


def test_with_env_settings_applies_every_setting_together_and_rejects_a_bad_one():
    names = ("SNAPMLA_COMBINE_FUSED", "SNAPMLA_PARTIALS")
    old = {n: os.environ.pop(n, None) for n in names}
    try:
        seen = []
        call = bench.with_env_settings(lambda t: seen.append(tuple(os.environ.get(n) for n in names)) or t,
                                       "SNAPMLA_COMBINE_FUSED=1,SNAPMLA_PARTIALS=staged")
        assert call(5) == 5
        assert seen == [("1", "staged")]
        assert all(n not in os.environ for n in names)
        bench.with_env_settings(lambda t: seen.append(os.environ.get("SNAPMLA_PARTIALS")), "SNAPMLA_PARTIALS=")(0)
        assert seen[-1] == ""
        for bad in ["SNAPMLA_PARTIALS", "A=1,,B=2", "=x"]:
            with __import__("pytest").raises(SystemExit, match="NAME=VALUE"):
                bench.with_env_settings(lambda t: t, bad)
    finally:
        for n, v in old.items():
            os.environ.pop(n, None)
            if v is not None:
                os.environ[n] = v


def test_env_settings_sets_every_variable_inside_and_restores_them():
    names = ("SNAPMLA_COMBINE_FUSED", "SNAPMLA_PLAN_FILL")
    old = {n: os.environ.pop(n, None) for n in names}
    try:
        os.environ["SNAPMLA_PLAN_FILL"] = "0"
        with bench.env_settings((("SNAPMLA_COMBINE_FUSED", "1"), ("SNAPMLA_PLAN_FILL", "1"))):
            assert [os.environ.get(n) for n in names] == ["1", "1"]
        assert "SNAPMLA_COMBINE_FUSED" not in os.environ and os.environ["SNAPMLA_PLAN_FILL"] == "0"
    finally:
        for n, v in old.items():
            os.environ.pop(n, None)
            if v is not None:
                os.environ[n] = v


def test_variants_are_the_lab_options_asked_for():
    args = bench.argparse.Namespace(vregs=False, carried=True)
    assert bench.variants(args) == ["carried"]
    args.vregs = True
    assert bench.variants(args) == ["vregs", "carried"]
    args.carried_wide = True
    assert bench.env_variants(args)[2] == ("carried_wide", (("SNAPMLA_FP8_P_SCALE", "carried_wide"),))
    args.plan_fill = True
    assert bench.env_variants(args)[-1] == ("fill", (("SNAPMLA_PLAN_FILL", "1"),))
    assert bench.variants(bench.argparse.Namespace()) == []


def test_env_variants_read_the_label_and_its_settings():
    args = bench.argparse.Namespace(vregs=False, carried=True, env=["wave:SNAPMLA_COMBINE_WAVE=workers"])
    assert bench.env_variants(args) == [("carried", (("SNAPMLA_FP8_P_SCALE", "carried"),)),
                                        ("wave", (("SNAPMLA_COMBINE_WAVE", "workers"),))]
    assert bench.variants(args) == ["carried", "wave"]
    assert bench.parse_env_variant("pdl:SNAPMLA_COMBINE_PDL=") == ("pdl", (("SNAPMLA_COMBINE_PDL", ""),))
    assert bench.parse_env_variant("ff:SNAPMLA_COMBINE_FUSED=1,SNAPMLA_PLAN_FILL=1") == (
        "ff", (("SNAPMLA_COMBINE_FUSED", "1"), ("SNAPMLA_PLAN_FILL", "1")))
    for bad in ["SNAPMLA_COMBINE_WAVE=workers", "wave:SNAPMLA_COMBINE_WAVE", "1x:A=b", "wave:=b", "ff:A=1,B"]:
        with __import__("pytest").raises(SystemExit, match="--env"):
            bench.parse_env_variant(bad)


def test_sweep_summary_reports_each_variant_against_the_default_and_the_peers():
    rows = [{"b": b, "h": 128, "s_q": 1, "s_k": 8192, "fp8_us": 10.0 * b, "fp8_wave_us": 9.0 * b,
             "fp8_wave_over_fp8": 0.9, "fp8_speedup_vs_flashmla_bf16": 0.95, "fp8_speedup_vs_pr54_fp8": 1.1,
             "bf16_over_flashmla_bf16": 1.2, "fp8_wave_speedup_vs_flashmla_bf16": 1.05 if b > 1 else 0.99,
             "fp8_wave_speedup_vs_pr54_fp8": 1.2} for b in (1, 16, 256)]
    lines = bench.sweep_summary(rows, True, ["wave"])
    assert lines[0].startswith("- variant wave: time / decode_fp8's median 0.900")
    assert "worst 0.99x (b=1 h=128" in lines[0] and "1 of 3 below 1.0x" in lines[0]
    assert any("3 of 3 cases below 1.0x" in line for line in lines)
    assert lines[-1].startswith("- h=128, s_k=8192: decode_fp8 time per cached token at b >= 16 within +0.0%")


def test_sweep_summary_splits_a_planner_variant_by_whether_its_plan_changed():
    rows = [{"b": b, "h": 16, "s_q": 1, "s_k": 8192, "fp8_us": 10.0 * b, "fp8_ax_us": 10.0 * b * r,
             "fp8_ax_over_fp8": r, "fp8_ax_plan_changed": changed, "bf16_ax_over_bf16": r,
             "bf16_ax_plan_changed": changed}
            for b, r, changed in ((1, 1.02, False), (2, 0.85, True), (4, 0.95, True), (16, 0.98, False),
                                  (256, 1.0, False))]
    lines = bench.sweep_summary(rows, False, ["ax"], ["ax"])
    assert lines[0].endswith("[changed plans 2: median 0.900 (0.850-0.950); unchanged 3: median 1.000 (0.980-1.020)]")
    assert lines[1].startswith("- variant ax: time / decode_fp8's median 0.980")
    assert "[changed plans 2: median 0.900 (0.850-0.950); unchanged 3:" in lines[1]
    for r in rows:
        r["fp8_ax_plan_changed"] = False
    assert "changed plans 0: none; unchanged 5: median 0.980" in bench.sweep_summary(rows, False, ["ax"])[0]
    del rows[0]["fp8_ax_plan_changed"]  # rows of an older file: no split
    assert "[" not in bench.sweep_summary(rows, False, ["ax"])[0]


def test_same_plan_compares_every_entry():
    torch = __import__("pytest").importorskip("torch")
    import snapmla
    lens = torch.tensor([8192, 8192], dtype=torch.int32)
    a = snapmla.plan_splits(lens, 132, query_rows=16)
    assert bench.same_plan(torch, a, snapmla.plan_splits(lens.clone(), 132, query_rows=16))
    with bench.env_settings((("SNAPMLA_PLAN_WORKERS", "blocks"),)):
        b = snapmla.plan_splits(lens, 132, query_rows=16)
    assert not bench.same_plan(torch, a, b)  # 86 busy workers against 128


def test_bf16_variants_are_the_env_variants_when_asked():
    args = bench.argparse.Namespace(vregs=True, env=["folded:SNAPMLA_SCORE_STEP=folded"], env_bf16=False)
    assert bench.bf16_variants(args) == []
    args.env_bf16 = True
    assert bench.bf16_variants(args) == ["folded"]  # --vregs is decode_fp8's alone
    assert bench.variants(args) == ["vregs", "folded"]


def test_bf16_env_variants_time_decode_bf16_alone():
    args = bench.argparse.Namespace(vregs=False, env=["folded:SNAPMLA_SCORE_STEP=folded"], env_bf16=True,
                                    bf16_env=["bnarrow:SNAPMLA_BF16_TILE=narrow"])
    assert bench.variants(args) == ["folded"]  # decode_fp8 is not timed under a --bf16-env variant
    assert bench.bf16_env_variants(args) == [("folded", (("SNAPMLA_SCORE_STEP", "folded"),)),
                                             ("bnarrow", (("SNAPMLA_BF16_TILE", "narrow"),))]
    args.env_bf16 = False
    assert bench.bf16_variants(args) == ["bnarrow"]
    args.env_bf16, args.bf16_env = True, ["folded:SNAPMLA_BF16_TILE=narrow"]
    with __import__("pytest").raises(SystemExit, match="given twice"):
        bench.bf16_variants(args)


def test_sweep_summary_reports_a_bf16_variant_against_decode_bf16_and_flashmla():
    rows = [{"b": b, "h": 128, "s_q": 1, "s_k": 8192, "fp8_us": 10.0 * b, "fp8_speedup_vs_flashmla_bf16": 1.05,
             "fp8_speedup_vs_pr54_fp8": 1.1, "bf16_over_flashmla_bf16": 1.3, "bf16_folded_over_bf16": 0.9,
             "bf16_folded_over_flashmla_bf16": 1.17 if b == 16 else 1.05} for b in (1, 16, 256)]
    lines = bench.sweep_summary(rows, True, [], ["folded"])
    assert lines[0].startswith("- variant folded on decode_bf16: time / decode_bf16's median 0.900")
    assert "worst 1.17, 1 of 3 above 1.1" in lines[0]


def test_parse_case_reads_uniform_lengths():
    assert bench.parse_case("128,128,1,U") == (128, 128, 1, "U")
    assert bench.parse_case("32,128,2,65536") == (32, 128, 2, 65536)


def test_fixed_split_plan_cuts_every_sequence_at_multiples_of_split_blocks():
    torch = __import__("pytest").importorskip("torch")
    import snapmla
    lens = torch.tensor([2000, 0, 130, 64, 5000], dtype=torch.int32)
    plan = bench.fixed_split_plan(snapmla, lens, lens.clone(), 24, 128, 3)
    offsets = plan.split_offsets.tolist()
    blocks = [(int(n) + 63) // 64 for n in lens]
    assert [offsets[i + 1] - offsets[i] for i in range(len(blocks))] == [max(1, (n + 2) // 3) for n in blocks]
    begins = plan.split_begin.tolist()
    for i, n in enumerate(blocks):
        assert begins[offsets[i]:offsets[i + 1]] == [64 * 3 * j for j in range(max(1, (n + 2) // 3))]


def test_write_json_writes_the_metadata_and_rows_a_cut_run_leaves(tmp_path):
    import json
    meta = {"gpu": "x", "commit": "abc"}
    rows = [{"b": 1, "fp8_us": 2.0}]
    bench.write_json(str(tmp_path / "out"), "h200.partial.json", meta, rows)
    got = json.loads((tmp_path / "out" / "h200.partial.json").read_text())
    assert got == {"gpu": "x", "commit": "abc", "results": rows}
    rows.append({"b": 2, "fp8_us": 3.0})
    bench.write_json(str(tmp_path / "out"), "h200.partial.json", meta, rows)
    assert len(json.loads((tmp_path / "out" / "h200.partial.json").read_text())["results"]) == 2


def test_floor_bandwidth_follows_the_gpu_unless_given():
    assert bench.copy_bandwidth("NVIDIA H200") == (4.3, "measured on the NVIDIA H200")
    assert bench.copy_bandwidth("NVIDIA H100 80GB HBM3") == (3.0, "measured on the NVIDIA H100 80GB HBM3")
    assert bench.copy_bandwidth("NVIDIA H100 80GB HBM3", 2.5) == (2.5, "--bw")
    for other in ("NVIDIA GH200 480GB", "NVIDIA H100 PCIe"):  # not measured: the H200's, and a note
        bw, source = bench.copy_bandwidth(other)
        assert bw == 4.3 and "give --bw" in source
    # The memory-bound floor scales with the bandwidth: h = 16, 32K x 16 sequences.
    args = type("Args", (), {"fp8_tflops": 1240.0, "bf16_tflops": 685.0})()
    args.bw = 4.3
    fast = bench.floor_us(16, 16, 1, 16 * 32768, args)
    args.bw = 3.0
    assert bench.floor_us(16, 16, 1, 16 * 32768, args) == pytest.approx(fast * 4.3 / 3.0)


def test_results_page_states_the_floor_rates():
    floor = {"bw_tb_s": 3.0, "bw_source": "measured on the NVIDIA H100 80GB HBM3", "fp8_tflops": 1240.0,
             "bf16_tflops": 685.0}
    meta = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-12-05", "commit": "abc1234", "calls": 10, "rounds": 3,
            "floor": floor}
    page = bench.markdown(meta, [], False)
    assert "Floor: 3.0 TB/s (measured on the NVIDIA H100 80GB HBM3), 1240.0 FP8 and 685.0 BF16 TFLOP/s." in page
    assert "Floor: not recorded." in bench.markdown({**meta, "floor": {}}, [], False)
