"""The C++ extension's sources build for Arm (aarch64), and its NEON path gives the scalar path's bits.

No Arm machine runs here, so Debian's cross compiler (`g++-aarch64-linux-gnu`) checks each source against this
torch's headers (they are the same on every architecture), and the 8-bit-activation products' paths, which need
no torch (`i8_blocks.h`), build into a small test binary (`tests/cpp/i8_paths_check.cpp`) that runs under
`qemu-aarch64` (Debian's `qemu-user`): the NEON dot-product path against the scalar one, bit for bit, for every
weight form; and the fused pass's portable steps and tree attention (`portable_ops.inc`, what Arm runs, its
loops vectorized with NEON by the compiler) into another (`tests/cpp/portable_check.cpp`), built for this machine
and for aarch64 as the extension builds them, whose outputs must be the same bits. `.ci/run` installs both. On Arm
with the dot product `auto` runs the fused exact pass from these. What this checks is the build and the bits,
not a speed: no Arm machine has run it.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from torch.utils import cpp_extension

CROSS = "aarch64-linux-gnu-g++"
QEMU = "qemu-aarch64"
CSRC = Path(__file__).resolve().parent.parent / "src" / "specdec" / "kernels" / "csrc"
CHECK = Path(__file__).resolve().parent / "cpp" / "i8_paths_check.cpp"
PORTABLE = Path(__file__).resolve().parent / "cpp" / "portable_check.cpp"
EXTENSION_FLAGS = ["-std=c++20", "-O3", "-ffp-contract=off"]  # `q4_kernel._CFLAGS`' arithmetic flags

pytestmark = [
    pytest.mark.slow,  # ~60 s of compiling on 2 cores
    pytest.mark.skipif(shutil.which(CROSS) is None, reason=f"no {CROSS} (Debian's g++-aarch64-linux-gnu)"),
]


def _includes() -> list[str]:
    return [f"-I{path}" for path in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]


def _compile(source: Path) -> subprocess.CompletedProcess:
    command = [CROSS, "-std=c++20", "-fsyntax-only", "-fopenmp", f"-I{CSRC}", *_includes(), str(source)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_every_source_compiles_for_aarch64():
    sources = sorted(CSRC.glob("*.cpp"))
    assert len(sources) >= 11
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(_compile, sources))
    failed = {s.name: r.stderr[-2000:] for s, r in zip(sources, results, strict=True) if r.returncode}
    assert not failed, failed


def test_an_unguarded_intrinsic_is_caught(tmp_path):
    """The control: the same compile fails on an AVX-512 intrinsic outside SPECDEC_X86."""
    source = tmp_path / "unguarded.cpp"
    source.write_text('#include "kernels.h"\nfloat first() { return _mm512_cvtss_f32(_mm512_setzero_ps()); }\n')
    result = _compile(source)
    assert result.returncode != 0 and "_mm512" in result.stderr, result.stderr[-500:]


def _check_binary(folder: Path, neon: Path = CSRC / "q4_gemm_i8_neon.cpp") -> Path:
    binary = folder / "i8_paths_check"
    sources = [CHECK, CSRC / "q4_gemm_i8_scalar.cpp", neon]
    command = [CROSS, "-std=c++20", "-O2", "-static", "-ffp-contract=off", f"-I{CSRC}", *_includes(),
               *map(str, sources), "-o", str(binary)]  # fmt: skip
    built = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    return binary


@pytest.mark.skipif(shutil.which(QEMU) is None, reason=f"no {QEMU} (Debian's qemu-user)")
def test_the_neon_products_give_the_scalar_paths_bits(tmp_path):
    ran = subprocess.run([QEMU, "-cpu", "max", str(_check_binary(tmp_path))], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert ran.returncode == 0 and ran.stdout.startswith("ok "), ran.stdout + ran.stderr
    assert int(ran.stdout.split()[1]) >= 48  # six weight forms, four row counts, random and extreme values
    older = subprocess.run([QEMU, "-cpu", "cortex-a53", str(tmp_path / "i8_paths_check")], capture_output=True,
                           text=True, timeout=300)  # fmt: skip
    assert older.returncode == 2, older.stdout  # no dot-product instructions: the path says it does not run


@pytest.mark.skipif(shutil.which(QEMU) is None, reason=f"no {QEMU} (Debian's qemu-user)")
def test_a_neon_path_that_drops_the_minimum_is_caught(tmp_path):
    """The control: the check fails for a NEON path without the 4-bit blocks' minimum term."""
    source = (CSRC / "q4_gemm_i8_neon.cpp").read_text()
    planted = source.replace("if (Bits == 4 || p.wide_min) acc[r][c] = vfmaq_f32", "if (false) acc[r][c] = vfmaq_f32")
    assert planted != source
    (tmp_path / "planted.cpp").write_text(planted)
    binary = _check_binary(tmp_path, tmp_path / "planted.cpp")
    ran = subprocess.run([QEMU, "-cpu", "max", str(binary)], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 1 and "neon differs from scalar" in ran.stdout, ran.stdout


def _portable_outputs(folder: Path, arm: bool, flags: list[str]) -> str:
    """`portable_check`'s printout, built for aarch64 (run under qemu) or for this machine, with `flags`."""
    binary = folder / ("portable_arm" if arm else "portable_here")
    compiler = [CROSS, "-static"] if arm else ["g++"]
    command = [*compiler, *flags, f"-I{CSRC}", *_includes(), str(PORTABLE), "-o", str(binary)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    ran = subprocess.run([QEMU, "-cpu", "max", str(binary)] if arm else [str(binary)], capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 0 and "refused" not in ran.stdout and "differ" not in ran.stdout, ran.stdout + ran.stderr
    return ran.stdout


@pytest.mark.skipif(shutil.which(QEMU) is None or shutil.which("g++") is None, reason=f"no {QEMU} or g++")
def test_the_portable_steps_give_this_machines_bits_on_arm(tmp_path):
    """RMS norm, the residual add, rotary, SiLU-gate and tree attention (1-1500 keys, heads of 64 and 128; three query
    heads together give each head's bits alone) give the
    same bf16 bits built for aarch64 as for x86-64, with the extension's flags; the control: built with
    -ffast-math for Arm (sums reordered, the exp approximated), some outputs change."""
    here = _portable_outputs(tmp_path, False, EXTENSION_FLAGS)
    assert len(here.splitlines()) == 19  # 3 sizes x 3 steps, 2 rotary, 2 head sizes x 4 key counts
    assert _portable_outputs(tmp_path, True, EXTENSION_FLAGS) == here
    assert _portable_outputs(tmp_path, True, ["-std=c++20", "-O3", "-ffast-math"]) != here

