"""What the command lines (train.py, evaluate.py) share about their flags."""

import argparse


def given_flags(parser: argparse.ArgumentParser, argv) -> dict:
    """The flags named on the command line, with their values. argparse fills in a default only for
    a name its namespace does not hold yet, so every name is first set to a marker meaning "not given"."""
    not_given = object()
    names = vars(parser.parse_args([]))
    parsed = vars(parser.parse_args(argv, argparse.Namespace(**dict.fromkeys(names, not_given))))
    return {name: value for name, value in parsed.items() if value is not not_given}
