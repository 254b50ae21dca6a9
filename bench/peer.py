"""What the side-by-side benchmarks share: the peer environment's Python, and the machine's description.

minisbert never imports its peers (sentence-transformers and the libraries it needs), and they are
not installed beside it: they live in an environment of their own. A benchmark runs its peer's side
in a child process of that environment's Python, named by --peer-python or by the environment
variable MINISBERT_PEER_PYTHON, taking turns with minisbert's side in this process, so that both
meet the same load from whatever else the machine runs. Only one side computes at a time.

Speed figures mean little without the CPU they were measured on: `cpu_summary()` gives its model,
core count and the instruction-set flags that decide which kernels torch can use.
"""

import json
import os
import subprocess
from pathlib import Path

from minisbert.common import cpu

PEER_PYTHON_VARIABLE = "MINISBERT_PEER_PYTHON"
# Flags that change which float32 / bfloat16 / int8 kernels a CPU can run.
CPU_FLAGS = ("avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
             "amx_bf16", "amx_int8")


def add_peer_python_option(parser) -> None:
    parser.add_argument("--peer-python", type=Path, default=os.environ.get(PEER_PYTHON_VARIABLE) or None,
                        help="Python of the environment that has sentence-transformers, to run it side by "
                             f"side (default: ${PEER_PYTHON_VARIABLE}; neither: minisbert alone)")


def check_peer_python(parser, python) -> None:
    if python is not None and not (Path(python).is_file() and os.access(python, os.X_OK)):
        parser.error(f"--peer-python {python} is not an executable file; give the peer environment's "
                     "python, e.g. /path/to/venv/bin/python")


def run_peer(python, script, arguments: list) -> dict:
    """Run `python script arguments...` and return the JSON object its last line of output holds."""
    finished = subprocess.run([str(python), str(script), *arguments], capture_output=True, text=True)
    if finished.returncode != 0:
        raise SystemExit(f"the peer run `{python} {script} {' '.join(arguments)}` failed:\n"
                         f"{finished.stderr[-3000:]}")
    return json.loads(finished.stdout.strip().splitlines()[-1])


def cpu_summary() -> str:
    """e.g. 'AMD EPYC (family 25, model 1), 2 cores; flags avx avx2 fma; no avx512f avx512_vnni ...'.
    The family and model tell apart processor generations that share a name and flags (AMD family 23
    is Zen and Zen 2, 25 is Zen 3 and Zen 4), whose kernels' speeds differ."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                name, _, value = line.partition(":")
                if not line.strip():  # the first processor's block ends here
                    break
                fields[name.strip()] = value.strip()
    except OSError:
        return f"{os.cpu_count()} cores; CPU flags unknown (no /proc/cpuinfo)"
    model = fields.get("model name", "unknown CPU")
    if "cpu family" in fields:
        model += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    present = " ".join(f for f in CPU_FLAGS if f in cpu.flags())
    absent = " ".join(f for f in CPU_FLAGS if f not in cpu.flags())
    return f"{model}, {os.cpu_count()} cores; flags {present or '-'}; no {absent or '-'}"
