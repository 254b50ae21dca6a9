"""The records of a study's runs (OUTPUT/run.json, minisbert/experiments/runner.py): which machine
and which code made which models, and the equivalence margin in force when they were made, and the
sentences a report makes of them.

run.json holds the latest record (date, about: the machine, code: the git commit, margin, models:
the entries it made) and, where the run was continued later, the earlier records under "earlier", so
a folder made partly on one machine and partly on another says so, model by model.
"""

import argparse
import math
import re
import subprocess
import time
from pathlib import Path

import torch

from . import verdicts


def new_record(run: dict, settings: argparse.Namespace, device) -> dict:
    """The record of a run that makes models now (its "models" filled in as it makes them), keeping
    `run`'s records (the folder's run.json, {} where there is none) as the earlier ones."""
    record = {"date": time.strftime("%Y-%m-%d"), "about": about_the_run(settings, device), "code": code_version(),
              "margin": verdicts.NDCG_MARGIN, "models": []}
    earlier = history(run)
    if earlier:
        record["earlier"] = earlier
    return record


def code_version() -> dict | None:
    """{"commit": the git commit of the code that runs, "uncommitted_changes": whether files differ
    from it}, or None outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=30)
    try:
        commit, status = git("rev-parse", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    if commit.returncode != 0:
        return None
    return {"commit": commit.stdout.strip(), "uncommitted_changes": bool(status.stdout.strip())}


def history(run: dict) -> list:
    """run.json's records, earliest first, each without the earlier ones ([] where there is none)."""
    if not run:
        return []
    return run.get("earlier", []) + [{key: value for key, value in run.items() if key != "earlier"}]


def made_by(record: dict) -> str:
    models = record.get("models")
    return f"models {', '.join(models)}" if models else "its models not recorded"


def about_line(run: dict) -> str:
    """The report's line on the machines that made the models: one record's line, or each record's
    with the models it made, where a run was continued."""
    records = history(run)
    if not records:
        return "The machine that ran it is not recorded (no run.json)."
    if len(records) == 1:
        return records[0]["about"] + noted(records[0])
    return f"Made in {len(records)} runs, continued with the same settings: " + " ".join(
        f"{record['about']} ({made_by(record)}.){noted(record)}" for record in records)


def noted(record: dict) -> str:
    """" Its record notes: ...": what a record's note says (resumed models, pauses, how it was written)."""
    return f" Its record notes: {record['note'].rstrip('.')}." if record.get("note") else ""


def paused(run: dict) -> bool:
    """Whether run.json's notes name a training time that includes a pause (a stopped process, a resumption)."""
    return any(re.search(r"SIGSTOP|stopped|pause|resumed", record.get("note", "")) for record in history(run))


def margin_record(run: dict) -> str:
    """What run.json says of the equivalence margin: the one in force when each run made its models
    (and the code's commit), or, where a record has none, that those models predate the record and the
    equivalence tests were applied afterwards to their stored scores."""
    records = history(run)
    before = [record for record in records if "margin" not in record]
    if before and len(before) == len(records):
        return (f"This run predates the margin's record: its run.json records no margin, so nothing shows that "
                f"the margin {verdicts.NDCG_MARGIN:g} was chosen before the run, and its equivalence tests were computed "
                "afterwards from the stored per-query scores (--report-only).")
    if before:
        return ("Part of this run predates the margin's record: run.json records no margin for "
                + "; ".join(f"the run of {record.get('date', 'an unrecorded date')} ({made_by(record)})"
                            for record in before)
                + f", so nothing shows that the margin {verdicts.NDCG_MARGIN:g} was chosen before those models were made, and "
                "the equivalence tests were computed afterwards from the stored per-query scores. "
                + _margin_in_force([record for record in records if "margin" in record]))
    return _margin_in_force(records)


def _margin_in_force(records: list) -> str:
    said = []
    for record in records:
        code = record.get("code") or {}
        said.append(f"{record['margin']:g} (code {code.get('commit', 'not recorded')[:12]}"
                    + (", with uncommitted changes" if code.get("uncommitted_changes") else "")
                    + (f"; {made_by(record)}" if len(records) > 1 else "") + ")")
    text = ("The run's run.json records the margin in force when it made its models: " if len(records) == 1
            else "run.json records the margin in force when each later run made its models: ") + "; ".join(said) + "."
    if any(record["margin"] != verdicts.NDCG_MARGIN for record in records):
        text += f" The tests here use the margin {verdicts.NDCG_MARGIN:g}, set after the run."
    return text


def machines(run: dict) -> str:
    """The devices named in run.json's records ("cuda:0" and what follows it up to a comma), else
    their CPUs ("2 CPU cores"), in the order they made models."""
    found = []
    for record in history(run):
        about = record.get("about", "")
        match = re.search(r"device ([^,]+)", about) or re.search(r"(\d+ CPU cores)", about)
        if match and match.group(1) not in found:
            found.append(match.group(1))
    return " and ".join(found) or "not recorded"


def made_on(run: dict, entries) -> dict:
    """{entry: the machine that made it} for each of a study's entries (model folders): the device of
    the record that lists it; a record that lists no models made those that no other record lists."""
    records = history(run) or [{}]
    listed = {model for record in records for model in record.get("models", [])}
    found = {}
    for record in records:
        about = record.get("about", "")
        match = re.search(r"device ([^,]+)", about) or re.search(r"(\d+ CPU cores)", about)
        for model in record.get("models") or [entry for entry in entries if entry not in listed]:
            found[model] = match.group(1) if match else "not recorded"
    return {entry: found.get(entry, "not recorded") for entry in entries}


def machines_sentence(run: dict, entries: list) -> str:
    """Which machine made which networks (made_on), seed by seed, and whether the machine can be tested as
    the cause of a difference: with k seeds on one machine and n - k on another, an exact permutation test
    of that split has C(n, k) arrangements, and its p can fall no lower than 1 / C(n, k)."""
    made = made_on(run, entries)
    seeds = {}  # seed -> the machines of its networks
    for entry, machine in made.items():
        found = re.search(r"-seed(\d+)$", entry)
        if found:
            seeds.setdefault(int(found.group(1)), set()).add(machine)
    kinds = sorted(set(made.values()))
    if len(kinds) < 2:
        return f"Every network here was made on {kinds[0] if kinds else 'a machine not recorded'}."
    said = []
    for machine in kinds:
        whole = sorted(seed for seed, on in seeds.items() if on == {machine})
        others = sorted(entry for entry, on in made.items() if on == machine and not re.search(r"-seed\d+$", entry))
        mixed = sorted(entry for entry, on in made.items() if on == machine and re.search(r"-seed(\d+)$", entry)
                       and len(seeds[int(re.search(r"-seed(\d+)$", entry).group(1))]) > 1)
        parts = ([f"every network of seed{'s' if len(whole) > 1 else ''} {', '.join(map(str, whole))}"] if whole else []) \
            + ([f"of seeds made on several machines, {', '.join(mixed)}"] if mixed else []) \
            + ([f"the entries without seeds ({', '.join(others)})"] if others else [])
        said.append(f"{machine} made {'; '.join(parts)}")
    text = "Machines (run.json), network by network: " + "; ".join(said) + "."
    split = [sum(1 for on in seeds.values() if on == {machine}) for machine in kinds]
    split = [count for count in split if count]
    if len(split) == 2 and all(len(on) == 1 for on in seeds.values()):
        arrangements = math.comb(sum(split), split[0])
        text += (" Two trained models are paired seed by seed, so each pair shares its machine; a model without seeds "
                 "(untrained, or a baseline), evaluated once, is set against every seed, across machines for the seeds "
                 "made on another. The machines differ between seeds, and the networks of one seed and settings differ "
                 "between machines. "
                 + (f"Whether the machine explains a difference cannot be tested here: {split[0]} seeds on one and "
                    f"{split[1]} on the other give an exact permutation test {arrangements} arrangements, so its p "
                    f"can fall no lower than 1/{arrangements} = {1 / arrangements:.2f}; the machines' difference is "
                    "carried, untested, in the seeds' variance, which the two-level interval includes."
                    if 1 / arrangements >= verdicts.ALPHA else
                    "Whether the machine explains a difference is not tested here; the machines' difference is "
                    "carried in the seeds' variance, which the two-level interval includes."))
    elif seeds and any(len(on) > 1 for on in seeds.values()):
        text += (" A seed's networks come from more than one machine, so a test that pairs seed i with seed i pairs "
                 "networks across machines there.")
    return text


def minutes(run: dict, seconds: dict) -> str:
    """Each machine of run.json's records with the range of its networks' training times: `seconds`
    maps a model folder to its training seconds (made_on says which machine made it)."""
    found = {}
    for model, machine in made_on(run, list(seconds)).items():
        found.setdefault(machine, []).append(seconds[model])
    ranges = {machine: (f"{min(times) / 60:.1f}", f"{max(times) / 60:.1f}")
              for machine, times in found.items() if times}
    return "; ".join(f"{machine}: {low if low == high else f'{low} to {high}'} min a network"
                     for machine, (low, high) in ranges.items())


def time_why(run: dict) -> str:
    """The deviations table's reason beside `minutes`: where the times come from, and where run.json's
    notes tell of times that a shared or stopped machine lengthened."""
    noted = any("training time" in record.get("note", "") for record in history(run))
    return "the machines the models were made on (run.json" + (
        "; its notes say which times a shared or stopped machine lengthened)" if noted else ")")


def preset_why(run: dict) -> str:
    """The deviations table's reason for a budget the preset sets: sized for 2 CPU cores, and, where
    run.json records a GPU, kept there."""
    on_gpu = any("device cuda" in record.get("about", "") for record in history(run))
    return "the preset's (made for 2 CPU cores" + (", and kept on the GPU)" if on_gpu else ")")


def about_the_run(settings: argparse.Namespace, device) -> str:
    """One line with the date, the device (a GPU by its name) and the CPU, for the report."""
    cpu, device = "", torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        device = f"{device} ({torch.cuda.get_device_name(device)})"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        text = cpuinfo.read_text()
        flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
        cores = sum(line.startswith("processor") for line in text.splitlines())
        simd = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
        cpu = f", {cores} CPU cores ({' '.join(simd) or 'no AVX2'})"
    return f"Run on {time.strftime('%Y-%m-%d')}, device {device}{cpu}, torch {torch.__version__}."
