"""The decode kernels' main loops in SASS, without a GPU: each instantiation's instruction count
and the count of chosen opcodes in its consumer loop (the smallest loop holding the kernel's PV
wgmma), so that a lab variant's code can be weighed against the default's before the H200 times
it (docs/kernels.md quotes these for the role index).

    python lab/sass_loops.py [decode_fp8 decode_bf16 decode_fp8_narrow] [--ops R2UR,S2R,...] [--root TREE]

Each kernel source is compiled as the build's `sass` tests compile it (nvcc -cubin for
sm_90a, -O3) and disassembled with cuobjdump, which needs nvdisasm beside it or on
NVDISASM_PATH. Neither ships with every CUDA install: `pip install nvidia-cuda-cuobjdump
nvidia-cuda-nvdisasm` provides both (their bin/ folder under nvidia/cu13/ in site-packages);
--cuobjdump / --nvdisasm-dir point at others. The loop is found from the backward branches:
the smallest [target, branch] range that holds the key opcode.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The PV wgmma that every iteration of each kernel's consumer loop issues (the first that a loop
# of the instantiation holds: the V^T-register tile's PV is QGMMA m64n64).
LOOP_KEY = {"decode_fp8": ("QGMMA.64x256", "QGMMA"), "decode_bf16": ("HGMMA.64x256",),
            "decode_fp8_narrow": ("QGMMA",)}
DEFAULT_OPS = "S2R,R2UR,UIADD3,UMOV,IMAD.MOV.U32,FMUL,MUFU.EX2,BAR.SYNC.DEFER_BLOCKING,SHFL.BFLY"


def find_tool(name, explicit):
    if explicit:
        return explicit
    found = shutil.which(name)
    if found:
        return found
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        hits = glob.glob(os.path.join(site, "nvidia", "cu*", "bin", name))
        if hits:
            return hits[0]
    raise SystemExit(f"{name} not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, or pass its path")


def disassemble(kernel, root, workdir, cuobjdump, nvdisasm_dir, nvcc):
    source = os.path.join(root, "src", "kernels", "sm90", kernel + ".cu")
    cubin = os.path.join(workdir, kernel + ".cubin")
    subprocess.run([nvcc, "-cubin", "-o", cubin, "-std=c++20", "-O3", "-DNDEBUG", "-DSNAPMLA_HAVE_CUDA=1",
                    "--expt-relaxed-constexpr", "-gencode", "arch=compute_90a,code=sm_90a",
                    "-I" + os.path.join(root, "include"), "-I" + os.path.join(root, "src"), source], check=True)
    env = dict(os.environ, NVDISASM_PATH=nvdisasm_dir)
    return subprocess.run([cuobjdump, "-sass", cubin], check=True, capture_output=True, text=True, env=env).stdout


def functions(sass):
    """{mangled name: [(address, instruction)]} of a cuobjdump -sass listing."""
    out, current = {}, None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m and current is not None:
            current.append((int(m.group(1), 16), m.group(2)))
    return out


def opcode(instruction):
    words = instruction.split()
    return words[1] if words[0].startswith("@") else words[0]


def smallest_loop(instructions, keys):
    for key in keys:
        loop = smallest_loop_with(instructions, key)
        if loop:
            return loop
    return []


def smallest_loop_with(instructions, key):
    best = None
    for address, text in instructions:
        if "BRA" not in text:
            continue
        m = re.search(r"0x([0-9a-f]+)", text.split("BRA", 1)[1])
        if not m or int(m.group(1), 16) >= address:
            continue
        body = [x for x in instructions if int(m.group(1), 16) <= x[0] <= address]
        if any(key in t for _, t in body) and (best is None or len(body) < len(best)):
            best = body
    return best or []


def demangled(name):
    try:
        return subprocess.run(["c++filt", name], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return name


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernels", nargs="*", default=list(LOOP_KEY))
    ap.add_argument("--ops", default=DEFAULT_OPS, help="comma-separated opcodes to count in each loop")
    ap.add_argument("--cuobjdump")
    ap.add_argument("--nvdisasm-dir")
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    ap.add_argument("--root", default=ROOT, help="the source tree (a draft's copy; default: this checkout)")
    args = ap.parse_args(argv)
    cuobjdump = find_tool("cuobjdump", args.cuobjdump)
    nvdisasm_dir = args.nvdisasm_dir or os.path.dirname(find_tool("nvdisasm", None))
    ops = [o for o in args.ops.split(",") if o]
    with tempfile.TemporaryDirectory() as work:
        for kernel in args.kernels:
            if kernel not in LOOP_KEY:
                raise SystemExit(f"unknown kernel {kernel}: expected one of {', '.join(LOOP_KEY)}")
            for name, instructions in functions(disassemble(kernel, args.root, work, cuobjdump, nvdisasm_dir, args.nvcc)).items():
                loop = smallest_loop(instructions, LOOP_KEY[kernel])
                counts = collections.Counter(opcode(t) for _, t in loop)
                label = re.sub(r"\(snapmla::cuda::DecodeParams.*", "", demangled(name))
                label = label.replace("snapmla::cuda::(anonymous namespace)::", "").replace("snapmla::cuda::", "")
                print(f"{label}: {len(instructions)} instructions, loop {len(loop)}")
                print("    " + ", ".join(f"{o} {counts[o]}" for o in ops))
    return 0


if __name__ == "__main__":
    sys.exit(main())
