"""The C++ extension's sources compile for Arm (aarch64): every x86 intrinsic sits behind `SPECDEC_X86`.

No Arm machine runs here, so Debian's cross compiler (`g++-aarch64-linux-gnu`, which `.ci/run` installs)
checks each source against this torch's headers (they are the same on every architecture). On Arm the
extension then carries the scalar paths only and `auto` keeps transformers' pass (no NEON path yet:
`tree_attention_available()` is false there), so this checks that the build no longer fails, not a speed.
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
CSRC = Path(__file__).resolve().parent.parent / "src" / "specdec" / "backends" / "torch" / "csrc"

pytestmark = [
    pytest.mark.slow,  # ~60 s of compiling on 2 cores
    pytest.mark.skipif(shutil.which(CROSS) is None, reason=f"no {CROSS} (Debian's g++-aarch64-linux-gnu)"),
]


def _compile(source: Path) -> subprocess.CompletedProcess:
    includes = [f"-I{path}" for path in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    command = [CROSS, "-std=c++20", "-fsyntax-only", "-fopenmp", f"-I{CSRC}", *includes, str(source)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_every_source_compiles_for_aarch64():
    sources = sorted(CSRC.glob("*.cpp"))
    assert len(sources) >= 9
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
