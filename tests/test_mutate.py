"""tests/mutate.py, the mutation-testing script: which mutants it makes and where it makes none; that a report
keeps the rooms not run again and what was written into it by hand; and (slow) that its documented commands
run, the first shortened to the second (one room, two mutants), without touching the working tree."""

import hashlib
import subprocess
import sys

import pytest

from . import mutate
from .conftest import REPO

SOURCE = '''"""A docstring is never mutated: 1 + 2."""


def f(x: int = 3) -> float:
    if x < 0 and x != -1:
        raise ValueError(f"bad value {x + 1}")
    return x * 2.0
'''


def test_each_operator_number_and_minus_is_mutated_once_and_messages_and_annotations_never():
    mutants, left_out = mutate.mutants_of("example.py", SOURCE)
    assert [(m.line, m.change) for m in mutants] == [
        (4, "3 -> 4"),  # a default value is behaviour
        (5, "< -> <="),
        (5, "0 -> 1"),
        (5, "and -> or"),
        (5, "!= -> =="),
        (5, "-1 -> 1"),
        (5, "1 -> 0"),
        (7, "* -> /"),
        (7, "2.0 -> 2.02"),
    ]
    assert left_out == 2  # the message's x + 1: its + and its 1
    for mutant in mutants:
        changed = [(old, new) for old, new in zip(SOURCE.splitlines(), mutant.source.splitlines()) if old != new]
        assert len(changed) == 1 and changed[0][0].strip() == mutant.code  # one line changed, the one named


def test_a_report_keeps_other_rooms_and_what_was_written_into_it(tmp_path):
    mutant = mutate.mutants_of("example.py", SOURCE)[0][0]
    survived, caught = mutate.Outcome(mutant, "survived", "", 1.0), mutate.Outcome(mutant, "caught", "test_x", 1.0)
    survivor = mutate.RoomResult("losses", ["tests/training/test_losses.py"], 9, 2, [survived], 60.0)
    report = tmp_path / "MUTANTS.md"
    mutate.write_report(report, [survivor], "python tests/mutate.py --room losses", mutate.datetime.now())
    assert mutate.NOT_CHANGED in report.read_text()
    # Unexplained, a survivor counts against both rates.
    assert "| losses | tests/training/test_losses.py | 1 (9) | 0 | 0 | 1 | 0% | 0 | 0% | 1 |" in report.read_text()
    written = "equivalent: no caller \\| relies on it"  # a | in a table cell is written \|
    notes = "\n## Notes\n\nWritten by hand.\n"
    report.write_text(report.read_text().replace(mutate.NOT_CHANGED, written) + notes)
    # Another room run alone: the first room's results stay, and so does what was written about them.
    other_room = mutate.RoomResult("optim", ["tests/training/test_optim.py"], 5, 0, [caught], 6.0)
    mutate.write_report(report, [other_room], "python tests/mutate.py --room optim", mutate.datetime.now())
    text = report.read_text()
    assert written in text and text.endswith(notes)
    # Shown equivalent (its reason starts so), a survivor is left out of the rate of the rest.
    assert "| losses | tests/training/test_losses.py | 1 (9) | 0 | 0 | 1 | 0% | 1 | - | 1 |" in text
    assert "| optim | tests/training/test_optim.py | 1 (5) | 1 | 0 | 0 | 100% | 0 | 100% | 2 |" in text
    assert "| **all** | | 2 | 1 | 0 | 1 | **50%** | 1 | **100%** | |" in text


@pytest.mark.slow  # three pytest runs of the losses room: 16 s on an idle 2-core machine, 30 s on a busy one
def test_the_documented_command_runs_on_one_room_and_leaves_the_working_tree_alone(tmp_path):
    usage = [line.strip() for line in mutate.__doc__.splitlines() if line.strip().startswith("python ")]
    assert usage == ["python tests/mutate.py --limit 20 --report tests/MUTANTS.md",
                     "python tests/mutate.py --room losses --limit 2"]
    source = REPO / "minisbert" / "training" / "losses.py"
    before = hashlib.sha256(source.read_bytes()).hexdigest()
    report = tmp_path / "MUTANTS.md"
    # The first command shortened to the second, with the report written where this test looks.
    finished = subprocess.run([sys.executable, str(REPO / "tests" / "mutate.py"), "--room", "losses", "--limit", "2",
                               "--report", str(report)], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert hashlib.sha256(source.read_bytes()).hexdigest() == before
    summary = [line for line in finished.stdout.splitlines() if line.startswith("losses ")]
    assert len(summary) == 1 and "/2 caught" in summary[0], finished.stdout
    assert "| losses | tests/training/test_losses.py | 2 (" in report.read_text()
