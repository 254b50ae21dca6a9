"""`python -m minisbert.experiments NAME [options]`: run one experiment (`... NAME --help` for its options)."""

import importlib
import sys

from . import EXPERIMENTS
from . import __doc__ as OVERVIEW
from ..training.fit import Interrupted, TrainingFailed


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__ + "\n" + OVERVIEW)
        return
    name, options = argv[0], argv[1:]
    if name not in EXPERIMENTS:
        sys.exit(f"error: unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}")
    experiment = importlib.import_module(f"{__package__}.{EXPERIMENTS[name]}")
    try:
        experiment.main(options)
    except Interrupted as stop:
        print(f"\n{stop}; run the same command again to continue")
        sys.exit(130)
    except (TrainingFailed, ValueError, OSError) as error:  # bad input, a missing file, a full disk: the message says what
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
