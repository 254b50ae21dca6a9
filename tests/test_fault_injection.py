"""Nothing damaged is taken in: every kind of file minisbert writes, damaged on disk, is refused with a
message naming it, or read back as it was written.

"Correct" means, for each file kind (a prepared corpus, a saved model's weights, its Dense layer's
weights, its configuration and tokenizer files, a training checkpoint, the machine facts file; the
evaluation cache has its own test in tests/evaluation/test_evaluate.py): seeded single-bit flips anywhere in the file,
truncations at every structural boundary (the safetensors header's length, its JSON header, each
tensor's first byte; a zip's entries) and at seeded places, and edits of values (a tensor entry made
another number, a count made a string) give, each one, either a ValueError whose message names the
file, or a read whose result is exactly (torch.equal) what the undamaged file gives. A machine facts
file only speeds things up: a damaged one is set aside with a warning naming it, and the facts are
measured again; the results of the work are the same.

The checks that make this hold: a SHA-256 of the tensors in each safetensors file's own metadata
(minisbert/common/fileio.py), and of a saved model's other files in its weights' metadata (minisbert/encoding/weights.py), the checkpoint's own zip checks and its values' checks
(minisbert/training/checkpoints.py), the facts file's shape and values (minisbert/common/machine.py).
"""

import json
import random
import struct
import warnings
from pathlib import Path

import pytest
import torch

from minisbert.training.checkpoints import append_log, load_checkpoint, read_log, save_checkpoint
from minisbert.common import machine
from minisbert.common.fileio import DIGEST_KEY, read_json, write_json
from minisbert.encoding.model import SentenceModel
from minisbert.search import load_corpus, prepare_corpus
from minisbert.encoding.st_directory import read_dense

from .conftest import reference

FLIPS = 48  # seeded single-bit flips per file kind
CUTS = 8  # seeded truncations per file kind, beside the structural ones


def safetensors_boundaries(data: bytes) -> list:
    """Offsets where a safetensors file's structure changes: after the 8-byte header length, inside
    and at the end of the JSON header, at each tensor's first and last byte."""
    header_length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + header_length])
    start = 8 + header_length
    cuts = {0, 4, 8, 8 + header_length // 2, start}
    for name, entry in header.items():
        if name != "__metadata__":
            first, last = entry["data_offsets"]
            cuts |= {start + first, start + last - 1}
    return sorted(cut for cut in cuts if cut < len(data))


def damaged_copies(path: Path, boundaries: list, seed: str, flips: int = FLIPS):
    """(what was done, bytes) for each damage: bit flips, cuts at the boundaries and at random places."""
    data = path.read_bytes()
    draw = random.Random(seed)
    for _ in range(flips):
        position, bit = draw.randrange(len(data)), draw.randrange(8)
        damaged = bytearray(data)
        damaged[position] ^= 1 << bit
        yield f"bit {bit} of byte {position} flipped", bytes(damaged)
    for cut in boundaries + [draw.randrange(1, len(data)) for _ in range(CUTS if flips == FLIPS else 1)]:
        yield f"cut at byte {cut} of {len(data)}", data[:cut]


def check_each_damage(path: Path, boundaries: list, read, seed: str, flips: int = FLIPS, exception=None):
    """Each damaged copy of `path`, written in its place, is refused naming it or reads as the original;
    or, where `exception(got)` names one (a string), reads as that one known exception."""
    original_bytes = path.read_bytes()
    expected = read()
    outcomes = {"refused": 0, "same": 0}
    try:
        for what, damaged in damaged_copies(path, boundaries, seed, flips):
            path.write_bytes(damaged)
            try:
                got = read()
            except ValueError as error:
                assert str(path) in str(error), f"{what}: the error does not name the file: {error}"
                outcomes["refused"] += 1
                continue
            known = None if same(got, expected) or exception is None else exception(got)
            assert same(got, expected) or known, f"{what}: read without a word, and the result changed"
            outcomes[known or "same"] = outcomes.get(known or "same", 0) + 1
    finally:
        path.write_bytes(original_bytes)
    assert outcomes["refused"] > 0, outcomes  # the damage was seen at all
    return outcomes


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(same, a, b))
    return a == b


def test_a_damaged_prepared_corpus_is_refused_or_reads_as_saved(tmp_path):
    generator = torch.Generator().manual_seed(0)
    for score in ("cosine", "dot"):
        path = tmp_path / f"{score}.safetensors"
        prepare_corpus(torch.randn(40, 16, generator=generator), score=score, screen=False).save(path)

        def read():
            corpus = load_corpus(path, screen=False)
            return {"rows": corpus.rows, "norms": corpus.norms, "score": corpus.score}

        check_each_damage(path, safetensors_boundaries(path.read_bytes()), read, score)


def test_an_edited_prepared_corpus_is_refused(tmp_path):
    """An edit that keeps the file well formed (one entry made another number) is still refused."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = tmp_path / "corpus.safetensors"
    prepare_corpus(torch.randn(40, 16, generator=torch.Generator().manual_seed(1)), score="dot").save(path)
    with safe_open(str(path), framework="pt") as opened:
        metadata, tensors = opened.metadata(), {name: opened.get_tensor(name) for name in opened.keys()}
    tensors["rows"][3, 5] = -tensors["rows"][3, 5]  # a sign bit: the norms still agree
    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(ValueError, match=str(path)):
        load_corpus(path)


def test_damaged_model_weights_are_refused_or_read_as_saved(tmp_path):
    folder, _, info = reference("tiny_st_dense")
    model = SentenceModel.from_dir(folder, device="cpu")
    model.save(tmp_path / "model")
    weights = tmp_path / "model" / "model.safetensors"
    check_each_damage(weights, safetensors_boundaries(weights.read_bytes()),
                      lambda: SentenceModel.from_dir(tmp_path / "model", device="cpu").state_dict(), "weights")
    dense = tmp_path / "model" / "2_Dense" / "model.safetensors"
    check_each_damage(dense, safetensors_boundaries(dense.read_bytes()),
                      lambda: read_dense(dense.parent).state_dict(), "dense")


def test_a_saved_models_other_files_damaged_are_refused_or_read_as_saved(tmp_path):
    """config.json, the tokenizer's files, the sentence-transformers layout's JSON files: their SHA-256
    is kept in the weights' metadata, so a digit flipped in a config (a layer norm's eps, a pooling
    mode, a length) is refused, not computed with."""
    folder, _, info = reference("tiny_st_dense")
    SentenceModel.from_dir(folder, device="cpu").save(tmp_path / "model")

    def read():
        model = SentenceModel.from_dir(tmp_path / "model", device="cpu")
        return {"embeddings": model.encode(info["sentences"], convert_to_tensor=True), **model.state_dict()}

    names = sorted(path for path in (tmp_path / "model").rglob("*") if path.is_file() and path.suffix != ".safetensors")
    assert {"config.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"} <= \
        {path.relative_to(tmp_path / "model").as_posix() for path in names}
    for path in names:
        data = path.read_bytes()
        check_each_damage(path, sorted({0, len(data) // 2, len(data) - 1}), read, path.name, flips=6)


def test_a_damaged_or_edited_checkpoint_is_refused_or_reads_as_saved(tmp_path):
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    optimizer.step()
    state = {"identity": {"loss": "mnrl"}, "model": model.state_dict(), "classifier": {},
             "optimizer": optimizer.state_dict(), "scheduler": {"step": 1}, "scaler": {}, "rng": [torch.get_rng_state()],
             "step": 1, "epoch": 0, "next_batch": 1, "best": None, "training_seconds": 0.5}
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, state)
    data = path.read_bytes()
    boundaries = sorted({0, 22, len(data) // 2, len(data) - 22, len(data) - 1})  # zip: local headers, central directory
    check_each_damage(path, boundaries, lambda: load_checkpoint(path), "checkpoint")
    for key, value in [("step", "12"), ("epoch", -1), ("training_seconds", float("nan")), ("model", [])]:
        save_checkpoint(path, {**state, key: value})
        with pytest.raises(ValueError, match=rf"{path}.*{key}"):
            load_checkpoint(path)
    broken = {name: tensor.clone() for name, tensor in state["model"].items()}
    broken["weight"][0, 0] = float("inf")
    save_checkpoint(path, {**state, "model": broken})
    with pytest.raises(ValueError, match=rf"{path}.*model\['weight'\].*not finite"):
        load_checkpoint(path)


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", '{"machine": 3}', ""])
def test_a_damaged_machine_facts_file_is_set_aside_with_a_warning(content, timed_probes):
    """A facts file only speeds things up: whatever is in it, a fact is measured again, not a crash."""
    timed_probes.write_text(content)
    machine.forget()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert machine.fact("a fact", lambda: 7, kind=int) == 7
    assert content in ('{"machine": 3}', "") or any(str(timed_probes) in str(w.message) for w in caught)
    assert json.loads(timed_probes.read_text())["a fact"] == 7


def test_a_fact_this_version_cannot_use_is_measured_again_with_a_warning_naming_the_file(timed_probes):
    """A facts file left by another version (a kernel this one lacks) or edited by hand."""
    assert machine.fact("a kernel", lambda: "torch", choices=["torch", "onednn"]) == "torch"
    facts = json.loads(timed_probes.read_text())
    facts.pop(DIGEST_KEY)  # written by a version that kept no digest, whose values this one checks
    timed_probes.write_text(json.dumps({**facts, "a kernel": "mkl", "a flag": "yes"}))
    machine.forget()
    with pytest.warns(UserWarning, match=rf"{timed_probes}.*'mkl'"):
        assert machine.fact("a kernel", lambda: "onednn", choices=["torch", "onednn"]) == "onednn"
    with pytest.warns(UserWarning, match=rf"{timed_probes}.*'yes'"):
        assert machine.fact("a flag", lambda: True, kind=bool) is True
    assert json.loads(timed_probes.read_text())["a kernel"] == "onednn"


def test_an_edited_machine_facts_file_is_set_aside_with_a_warning_naming_it(timed_probes):
    """A value edited by hand, even one this version can use, no longer matches the file's digest."""
    assert machine.fact("a kernel", lambda: "torch", choices=["torch", "onednn"]) == "torch"
    timed_probes.write_text(timed_probes.read_text().replace('"torch"', '"onednn"'))
    machine.forget()
    with pytest.warns(UserWarning, match=rf"{timed_probes}.*not the one written"):
        assert machine.fact("a kernel", lambda: "torch", choices=["torch", "onednn"]) == "torch"


@pytest.mark.parametrize("kind", ["record", "log"])
def test_a_damaged_record_or_log_line_is_refused_or_reads_as_written(kind, tmp_path):
    """A JSON record minisbert reads back (a study's settings.json, run.json, result.json and
    results.json, a run's summary.json: `write_json(..., digest=True)`) and a training log's lines
    carry their SHA-256. Each seeded bit flip and cut is refused naming the file, or reads back as
    written, with one exception the format leaves: a flip inside the digest's own key name makes a
    record without a digest, which reads as an unchecked one with that renamed key (as a record
    written before digests were kept reads)."""
    record = {"experiment": "siamese-vs-triplet", "seeds": [1, 2, 3], "ndcg@10": 0.6512, "notes": None}
    path = tmp_path / ("run.json" if kind == "record" else "log.jsonl")
    if kind == "record":
        write_json(path, record, digest=True)
        read = lambda: read_json(path)  # noqa: E731
    else:
        for step in (1, 2):
            append_log(path, {**record, "step": step})
        read = lambda: read_log(path)  # noqa: E731

    def renamed_digest_key(got) -> str | None:
        entries = got if isinstance(got, list) else [got]
        extra = len(record) + 1 + (kind == "log")  # the record's keys, the step of a log line, a renamed key
        return "digest key renamed" if any(len(entry) == extra for entry in entries) else None

    outcomes = check_each_damage(path, [], read, f"json {kind}", exception=renamed_digest_key)
    assert outcomes["refused"] > FLIPS // 2, outcomes
