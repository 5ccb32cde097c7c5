"""The kernel bench's host-side pieces that run without a GPU (the timing itself needs one)."""
import os

from snapmla import bench


def test_with_tile_sets_the_tile_for_the_call_and_puts_the_environment_back():
    seen = []
    call = bench.with_tile(lambda t: seen.append((t, os.environ.get("SNAPMLA_FP8_TILE"))) or t, "vregs")
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


def test_with_tile_restores_the_environment_when_the_call_raises():
    def boom(t):
        raise RuntimeError("x")
    old = os.environ.pop("SNAPMLA_FP8_TILE", None)
    try:
        try:
            bench.with_tile(boom, "vregs")(0)
        except RuntimeError:
            pass
        assert "SNAPMLA_FP8_TILE" not in os.environ
    finally:
        if old is not None:
            os.environ["SNAPMLA_FP8_TILE"] = old


def test_parse_case_reads_uniform_lengths():
    assert bench.parse_case("128,128,1,U") == (128, 128, 1, "U")
    assert bench.parse_case("32,128,2,65536") == (32, 128, 2, 65536)
