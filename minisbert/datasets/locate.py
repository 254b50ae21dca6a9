"""Where a dataset is found: a folder the user names, data/<name>/, a mirror, or a download.

Three datasets are known by name (`SOURCES`): `scifact` (BEIR layout, beir.py), `stsb` and `sick`
(sts.py). `resolve_dataset` looks for one in this order:

1. a folder the caller names (`--data FOLDER`): the dataset's folder itself, or a folder holding
   `<name>/`; if it holds neither, that is an error and nothing else is tried;
2. `data/<name>/` in this repository;
3. `$MINISBERT_DATA_MIRROR/<name>/` (the tests point it at a shared copy);
4. where a network exists, a download from the dataset's source (or `$MINISBERT_DOWNLOAD_URL`)
   into `data/<name>/`: every file through common/download.py, archives unpacked, digests and CRCs
   checked, every line read, all in a folder beside `data/<name>/` that is renamed to it only once
   everything checked out, so an interrupted download never looks like a dataset.

A folder holds a dataset when it has the files of one of its layouts; for a folder the user names,
one file is enough (a split missing from it is reported when that split is read).

What a `--data` value names is decided in one place, `what_data`, which train.py, evaluate.py,
evaluation/benchmark.py (the dev score), training/training_data.py and the studies all call: STS-B or SICK (by name or
folder), a question,answer CSV, a folder holding Quora's duplicate-question file, or any other
folder or named dataset (a BEIR layout, pairs.tsv, triplets.tsv, MS MARCO files).
Checked in tests/datasets/test_datasets.py (downloads against a local HTTP server).
"""

import gzip
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

from ..common.download import download as fetch_file, verify_sha256
from ..common.fileio import home_folder, make_staging_dir
from .beir import RetrievalData, load_beir
from .pairs import ScoredPair
from .qa_csv import qa_csv_folder
from .quora import QUORA_FILE
from .sts import STSB_SPLITS, SICK_FILES, read_sick, read_stsb

REPO_DATA = home_folder("data")
MIRROR_ENV = "MINISBERT_DATA_MIRROR"  # a folder holding scifact/, stsb/, sick/
DOWNLOAD_URL_ENV = "MINISBERT_DOWNLOAD_URL"  # replaces every source's base URL (a local mirror, tests)


@dataclass(frozen=True)
class Source:
    """Where a named dataset comes from and how to recognise and check it.

    files:   names fetched from `base_url + "/" + name`; .zip files are unpacked.
    sha256:  expected SHA-256 of a fetched file (checked before unpacking) or of a file inside the
             dataset folder after unpacking (a path relative to it).
    layouts: a folder holds the dataset if every file of one of these layouts is in it.
    """
    base_url: str
    files: tuple[str, ...]
    sha256: dict[str, str]
    layouts: tuple[tuple[str, ...], ...]


SOURCES = {
    # BEIR's archive. BEIR publishes its MD5, 5f7d1de60b170fc8027bb7898e2efca1; the SHA-256 below
    # is that archive's (2,816,079 bytes) as two independent public projects record it.
    "scifact": Source(
        base_url="https://public.ukp.informatik.tu-darmstadt.de/thakur/BEIR/datasets",
        files=("scifact.zip",),
        sha256={"scifact.zip": "536e14446a0ba56ed1398ab1055f39fe852686ecad24a6306c80c490fa8e0165"},
        layouts=(("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"),)),
    # sentence-transformers' repackaging of the STS benchmark. Nobody publishes a digest for it, so
    # it is checked for integrity only: gzip's CRC-32 must hold and the reader must accept every
    # line (as for every dataset). The original release's sts-*.csv, when present, are preferred.
    "stsb": Source(
        base_url="https://sbert.net/datasets",
        files=("stsbenchmark.tsv.gz",),
        sha256={},
        layouts=(tuple(f"sts-{split}.csv" for split in STSB_SPLITS), ("stsbenchmark.tsv.gz",))),
    # The SemEval-2014 task 1 release. No digests are published for the zips, so the unpacked files
    # are checked against the SHA-256 of copies taken from this release; should the host ever serve
    # other bytes, the download fails with both digests.
    "sick": Source(
        base_url="http://alt.qcri.org/semeval2014/task1/data/uploads",
        files=("sick_train.zip", "sick_trial.zip", "sick_test_annotated.zip"),
        sha256={"SICK_train.txt": "266cf8047149bd1d68138dd30439f3122bff30069740ac6705bb6197d9f1b48e",
                "SICK_trial.txt": "5a88cfb62f8c6bd2a3cce0f2421ba2cb8c2be5ab4a800f6f01e2c64aafb7db56",
                "SICK_test_annotated.txt": "2b8aa806658d6fc23c6824c83776c2d4fee7556000817b5ec0f982861413b7d0"},
        layouts=(tuple(SICK_FILES.values()),)),
}
STS_DATASETS = ("stsb", "sick")


class DatasetNotFoundError(FileNotFoundError):
    """A named dataset is in none of the places looked in and could not be downloaded."""


def holds_dataset(folder: str | Path, name: str) -> bool:
    """Whether `folder` has every file of one of dataset `name`'s layouts."""
    return any(all((Path(folder) / f).is_file() for f in layout) for layout in _source(name).layouts)


def find_dataset_in(folder: str | Path, name: str) -> Path | None:
    """`folder` itself if it has a file of one of dataset `name`'s layouts, else `folder/name` if
    that has one, else None."""
    files = {f for layout in _source(name).layouts for f in layout}
    for candidate in (Path(folder), Path(folder) / name):
        if any((candidate / f).is_file() for f in files):
            return candidate
    return None


def resolve_dataset(name: str, folder: str | Path | None = None, *, data_root: str | Path = REPO_DATA,
                    download: bool = True, base_url: str | None = None) -> Path:
    """The folder holding dataset `name`, looked for in the order of the module docstring; raises
    DatasetNotFoundError naming every place looked in and how to get the data."""
    source = _source(name)
    if folder is not None:
        found = find_dataset_in(folder, name)
        if found is None:
            expected = ", ".join(sorted({f for layout in source.layouts for f in layout}))
            raise DatasetNotFoundError(f"dataset {name!r} is not in {folder} nor in {Path(folder) / name}: "
                                       f"expected one of the files {expected}")
        return found
    local = Path(data_root) / name
    if holds_dataset(local, name):
        return local
    looked = [str(local)]
    mirror = os.environ.get(MIRROR_ENV)
    if mirror and holds_dataset(Path(mirror) / name, name):
        return Path(mirror) / name
    looked.append(str(Path(mirror) / name) if mirror else f"${MIRROR_ENV} (not set)")
    url = _base_url(source, base_url)
    if download:
        try:
            return download_dataset(name, data_root=data_root, base_url=base_url)
        except (ConnectionError, FileNotFoundError) as error:
            looked.append(f"download from {url} failed ({error})")
    else:
        looked.append("download (not attempted)")
    raise DatasetNotFoundError(
        f"dataset {name!r} not found. Looked in: {'; '.join(looked)}. To get it, set {MIRROR_ENV} to a "
        f"folder that holds {name}/, or pass --data FOLDER, or download "
        f"{', '.join(url + '/' + f for f in source.files)} and unpack it into {local}.")


def download_dataset(name: str, data_root: str | Path = REPO_DATA, base_url: str | None = None) -> Path:
    """Fetch dataset `name` into `<data_root>/<name>` and return that folder. A digest mismatch
    raises ValueError with both digests; nothing is left behind but a complete dataset."""
    source = _source(name)
    url = _base_url(source, base_url)
    target = Path(data_root) / name
    if target.exists():
        raise FileExistsError(f"{target} exists but does not hold {name} ({' + '.join(source.layouts[0])}); "
                              "remove it and try again")
    staging = make_staging_dir(target)
    try:
        for file_name in source.files:
            path = fetch_file(f"{url}/{file_name}", staging / file_name, source.sha256.get(file_name))
            if file_name.endswith(".zip"):
                _unzip(path, staging)
            elif file_name.endswith(".gz"):
                with gzip.open(path, "rb") as packed:  # reading to the end checks CRC-32 and length
                    while packed.read(1 << 20):
                        pass
        found = next((f for f in (staging, staging / name) if holds_dataset(f, name)), None)
        if found is None:
            raise ValueError(f"the files from {url} did not contain {name} ({' + '.join(source.layouts[0])})")
        for relative, expected in source.sha256.items():
            if relative not in source.files:
                verify_sha256(found / relative, expected, relative)
        _READ_EVERYTHING[name](found)  # a line the reader rejects fails the download, not a later run
        os.replace(found, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_scifact(split: str = "test", folder: str | Path | None = None, download: bool = True) -> RetrievalData:
    """SciFact (BEIR): test = 300 queries / 339 judgments, train = 809 / 919, 5,183 documents."""
    return load_beir(resolve_dataset("scifact", folder, download=download), split)


def load_stsb(split: str = "test", folder: str | Path | None = None, download: bool = True) -> list[ScoredPair]:
    """STS benchmark: train 5,749, dev 1,500, test 1,379 pairs, gold 0..5."""
    return read_stsb(resolve_dataset("stsb", folder, download=download), split)


def load_sick(split: str = "all", folder: str | Path | None = None, download: bool = True) -> list[ScoredPair]:
    """SICK: train 4,500, trial 500, test 4,927, all 9,927 pairs, relatedness 1..5."""
    return read_sick(resolve_dataset("sick", folder, download=download), split)


_READ_EVERYTHING = {
    "scifact": lambda folder: [load_beir(folder, split.stem) for split in (folder / "qrels").glob("*.tsv")],
    "stsb": lambda folder: [read_stsb(folder, split) for split in STSB_SPLITS],
    "sick": lambda folder: read_sick(folder, "all"),
}


# ----------------------------------------------------------------------------- what --data means

STS, QA_CSV, QUORA, FOLDER = "STS-B or SICK", "question,answer CSV", "Quora duplicate questions", "folder"


@dataclass(frozen=True)
class DataSource:
    """What a `--data` value names (`what_data`): its kind, and where its files are."""
    data: str  # the value as given
    kind: str  # STS, QA_CSV, QUORA or FOLDER
    sts: str | None = None  # "stsb" or "sick" when kind is STS

    def folder(self) -> Path:
        """The folder the value stands for, a named dataset found (or downloaded) by `resolve_dataset`."""
        return dataset_folder(self.data)

    def retrieval_folder(self, cache_dir: Path) -> Path:
        """The folder in the BEIR layout (corpus.jsonl, queries.jsonl, qrels/): a CSV converted into
        one under `cache_dir` (once per content), the folder itself, or, when it holds the files of
        none, its scifact/ subfolder (data/ and a mirror keep the BEIR dataset there)."""
        if self.kind == QA_CSV:
            return qa_csv_folder(self.data, cache_dir)
        folder = self.folder()
        return find_dataset_in(folder, "scifact") or folder


def what_data(data: str) -> DataSource:
    """What a `--data` value names, decided here alone, reading and downloading nothing:
    STS-B or SICK (`sts_name`: the name, or a folder holding either, itself or as stsb/, sick/),
    a question,answer CSV (a name ending in .csv), a folder holding Quora's
    quora_duplicate_questions.tsv, or else a folder (a path, a folder under data/, or a named
    dataset such as scifact) whose files say what it holds."""
    sts = sts_name(data)
    if sts:
        return DataSource(data, STS, sts)
    if data.lower().endswith(".csv"):
        return DataSource(data, QA_CSV)
    folder = _as_folder(data)
    if folder is not None and (folder / QUORA_FILE).is_file():
        return DataSource(data, QUORA)
    return DataSource(data, FOLDER)


def dataset_folder(data: str) -> Path:
    """The folder a `--data` value stands for: a path to a folder; a folder under data/
    ("example"); or a named dataset, found by `resolve_dataset`."""
    folder = _as_folder(data)
    if folder is not None:
        return folder
    if data not in SOURCES:
        raise ValueError(f"--data {data!r} is neither a folder nor a named dataset ({', '.join(SOURCES)}, "
                         "or a folder under data/ such as example)")
    return resolve_dataset(data)


def sts_name(data: str) -> str | None:
    """"stsb" or "sick" when a `--data` value is that name or a folder holding that dataset (itself
    or as `<name>/`), else None. Reads and downloads nothing."""
    if data in STS_DATASETS:
        return data
    folder = _as_folder(data)
    if folder is None:
        return None
    held = {name: found for name in STS_DATASETS if (found := find_dataset_in(folder, name)) is not None}
    if len(held) > 1:
        raise ValueError(f"{folder} holds both STS-B ({held['stsb']}) and SICK ({held['sick']}); "
                         "pass the folder of the one you mean as --data")
    return next(iter(held), None)


def load_sts(data: str, split: str) -> list[ScoredPair]:
    """The pairs of one split of STS-B or SICK, `data` being a name or folder that `sts_name` knows."""
    name = sts_name(data)
    if name is None:
        raise ValueError(f"--data {data!r} is neither stsb, sick, nor a folder holding the files of either")
    folder = resolve_dataset(name, None if data == name else _as_folder(data))
    return (read_stsb if name == "stsb" else read_sick)(folder, split)


def _as_folder(data: str) -> Path | None:
    for folder in (Path(data), REPO_DATA / data):
        if folder.is_dir():
            return folder
    return None


def _source(name: str) -> Source:
    if name not in SOURCES:
        raise ValueError(f"unknown dataset {name!r}; named datasets are {sorted(SOURCES)}")
    return SOURCES[name]


def _base_url(source: Source, base_url: str | None) -> str:
    return (base_url or os.environ.get(DOWNLOAD_URL_ENV) or source.base_url).rstrip("/")


def _unzip(path: Path, into: Path) -> None:
    # zipfile strips absolute paths and ".." from member names, so members stay inside `into`.
    with zipfile.ZipFile(path) as archive:
        broken = archive.testzip()
        if broken is not None:
            raise ValueError(f"{path.name}: member {broken} fails its CRC check")
        archive.extractall(into)
    path.unlink()
